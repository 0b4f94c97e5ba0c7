"""flashsel.topk on CUDA torch tensors: bit-for-bit parity with the CPU engine,
streams, CUDA graphs, strides, errors.

Skipped (reported as skipped) where torch is not importable or sees no CUDA
device. Where both are present but the flashsel CUDA engine cannot start,
the tests fail with the engine's reason: that is a real defect on a GPU
machine, not a reason to skip."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import flashsel
from _ref import make

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

DEV = torch.device("cuda", torch.cuda.current_device())
TDTYPES = [torch.float32, torch.bfloat16, torch.float16]
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@pytest.fixture(scope="module", autouse=True)
def engine():
    b = flashsel.backends()["cuda"]
    if not b["available"]:
        pytest.fail(f"torch sees a GPU but the flashsel CUDA engine is unavailable: {b['reason']}")
    return b


def cpu_ref(x, k, lengths=None, order="score", nan="lowest"):
    """The CPU engine on a host copy: the bytes every backend must return."""
    lens = None if lengths is None else lengths.cpu()
    return flashsel.topk(x.cpu(), k, lengths=lens, order=order, nan=nan, return_values=True)


def assert_bits_equal(got, want, ctx=""):
    gi, gv = got
    wi, wv = want
    assert gi.device.type == "cuda" and gi.dtype == torch.int32, ctx
    assert torch.equal(gi.cpu(), wi), f"indices differ {ctx}"
    iv = INT_VIEW[wv.dtype]
    assert gv.dtype == wv.dtype, ctx
    assert torch.equal(gv.cpu().contiguous().view(iv), wv.contiguous().view(iv)), f"value bits differ {ctx}"


def data(kind, rows, cols, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(make(kind, rows, cols, np.float32, rng)).to(dtype).to(DEV)


SHAPES = [
    # rows, cols, k
    (1, 1, 1),
    (3, 100, 7),
    (2, 50, 80),  # k > cols
    (1, 65_536, 2048),
    (1, 262_144, 512),
    (1, 1_048_576, 2048),
    (64, 131_072, 2048),
    (128, 32_768, 512),
    (1000, 4096, 64),
]


@pytest.mark.parametrize("dtype", TDTYPES, ids=str)
@pytest.mark.parametrize("rows,cols,k", SHAPES)
def test_parity_shapes(dtype, rows, cols, k):
    for kind in ["normal", "relu"]:
        x = data(kind, rows, cols, dtype, seed=rows + cols)
        assert_bits_equal(flashsel.topk(x, k, return_values=True), cpu_ref(x, k), f"{kind} {rows}x{cols} k={k}")


@pytest.mark.parametrize("dtype", TDTYPES, ids=str)
@pytest.mark.parametrize("kind", ["normal", "relu", "equal", "few", "nan5", "inf", "zeros", "ascending", "allnan"])
def test_parity_adversarial(dtype, kind):
    x = data(kind, 6, 5000, dtype, seed=1)
    for k, order, nan in itertools.product([1, 100, 5000, 6000], ["score", "index"], ["lowest", "largest"]):
        got = flashsel.topk(x, k, order=order, nan=nan, return_values=True)
        assert_bits_equal(got, cpu_ref(x, k, None, order, nan), f"{kind} k={k} {order} {nan}")


@pytest.mark.parametrize("ldtype", [torch.int32, torch.int64], ids=str)
def test_lengths(ldtype):
    cols, k = 4096, 64
    lens = torch.tensor([0, 1, k - 1, k, k + 1, cols, 1000, 3000], dtype=ldtype, device=DEV)
    x = data("relu", len(lens), cols, torch.bfloat16, seed=2)
    for order in ["score", "index"]:
        got = flashsel.topk(x, k, lengths=lens, order=order, return_values=True)
        assert_bits_equal(got, cpu_ref(x, k, lens, order), f"lengths {order}")


def test_row_stride_honoured_not_copied():
    big = data("few", 40, 3000, torch.float32, seed=3)
    view = big[::4, 100:2100]  # strided rows, read in place
    assert not view.is_contiguous()
    assert_bits_equal(flashsel.topk(view, 300, return_values=True), cpu_ref(view, 300))
    with pytest.raises(ValueError, match="column stride"):
        flashsel.topk(big[:, ::2], 10)
    with pytest.raises(ValueError, match="column stride"):
        flashsel.topk(big.t(), 10)


def test_one_dim_and_empty():
    x = data("normal", 1, 10_000, torch.float16, seed=4)[0]
    idx, val = flashsel.topk(x, 33, return_values=True)
    assert idx.shape == (33,) and val.shape == (33,)
    wi, wv = cpu_ref(x, 33)
    assert torch.equal(idx.cpu(), wi)
    idx, val = flashsel.topk(torch.empty(0, 10, device=DEV), 3, return_values=True)
    assert idx.shape == (0, 3)
    idx, val = flashsel.topk(torch.empty(2, 0, device=DEV), 3, return_values=True)
    assert torch.equal(idx.cpu(), torch.full((2, 3), -1, dtype=torch.int32))
    assert torch.isneginf(val).all()


def test_non_default_stream():
    x = data("normal", 16, 100_000, torch.float32, seed=5)
    want = cpu_ref(x, 1000)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = flashsel.topk(x, 1000, return_values=True)
    s.synchronize()
    assert_bits_equal(got, want, "side stream")


def test_no_host_sync():
    x = data("normal", 8, 50_000, torch.bfloat16, seed=6)
    lens = torch.full((8,), 40_000, dtype=torch.int64, device=DEV)
    flashsel.topk(x, 100, lengths=lens)  # engine created, kernels loaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = flashsel.topk(x, 100, lengths=lens, return_values=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_bits_equal(got, cpu_ref(x, 100, lens))


@pytest.mark.parametrize("rows,cols,k", [(1, 262_144, 2048), (32, 65_536, 512)])
def test_graph_capture_replay_on_new_data(rows, cols, k):
    static_x = data("normal", rows, cols, torch.float32, seed=7)
    static_len = torch.full((rows,), cols, dtype=torch.int32, device=DEV)
    # Warm up outside the capture, on a side stream as torch recommends.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashsel.topk(static_x, k, lengths=static_len, return_values=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_idx, out_val = flashsel.topk(static_x, k, lengths=static_len, return_values=True)
    for seed, kind in enumerate(["normal", "relu", "few"]):
        new = data(kind, rows, cols, torch.float32, seed=100 + seed)
        static_x.copy_(new)
        static_len.copy_(torch.randint(0, cols + 1, (rows,), device=DEV, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        assert_bits_equal((out_idx, out_val), cpu_ref(new, k, static_len), f"replay {kind}")


def test_errors():
    x = torch.zeros(3, 8, device=DEV)
    with pytest.raises(ValueError, match="lengths must be a torch tensor on the same device"):
        flashsel.topk(x, 2, lengths=[1, 2, 3])
    with pytest.raises(ValueError, match="lengths is on cpu but scores are on cuda"):
        flashsel.topk(x, 2, lengths=torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="int32 or int64"):
        flashsel.topk(x, 2, lengths=torch.ones(3, device=DEV))
    with pytest.raises(ValueError, match="lengths has 2 entries but scores has 3 rows"):
        flashsel.topk(x, 2, lengths=torch.ones(2, dtype=torch.int32, device=DEV))
    with pytest.raises(TypeError, match="float64"):
        flashsel.topk(x.double(), 2)
    with pytest.raises(ValueError, match="k must be at least 1"):
        flashsel.topk(x, 0)
    with pytest.raises(ValueError, match="rows \\* k"):
        flashsel.topk(x, 2**30)
    with pytest.raises(ValueError, match="invalid order"):
        flashsel.topk(x, 2, order="desc")


# ---------------------------------------------------------------------------
# The conventions shared with the CLI (tests/test_conventions.py for NumPy)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["int", "np.int64", "0-d int32", "0-d int64"])
def test_scalar_lengths_apply_to_every_row(form):
    rows, cols, k = 6, 3000, 40
    x = data("relu", rows, cols, torch.float16, seed=8)
    scalar = {
        "int": 1234,
        "np.int64": np.int64(1234),
        "0-d int32": torch.tensor(1234, dtype=torch.int32, device=DEV),
        "0-d int64": torch.tensor(1234, dtype=torch.int64, device=DEV),
    }[form]
    want = cpu_ref(x, k, torch.full((rows,), 1234, dtype=torch.int32))
    flashsel.topk(x, k, lengths=scalar)  # engine created, kernels loaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a scalar is filled or expanded on the device
    try:
        got = flashsel.topk(x, k, lengths=scalar, return_values=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_bits_equal(got, want, form)


def test_scalar_lengths_errors():
    x = torch.zeros(3, 8, device=DEV)
    with pytest.raises(ValueError, match="lengths = 9 is outside 0..=8"):
        flashsel.topk(x, 2, lengths=9)
    with pytest.raises(ValueError, match="lengths is on cpu but scores are on cuda"):
        flashsel.topk(x, 2, lengths=torch.tensor(3))
    with pytest.raises(TypeError, match="lengths must be int32 or int64"):
        flashsel.topk(x, 2, lengths=True)


def test_one_dimensional_scores_give_k_outputs():
    x = data("few", 1, 5000, torch.float32, seed=9)[0]
    for k in [1, 64, 5000, 6000]:
        got = flashsel.topk(x, k, return_values=True)
        assert got[0].shape == (k,) and got[1].shape == (k,), k
        wi, wv = cpu_ref(x, k)
        assert torch.equal(got[0].cpu(), wi) and torch.equal(got[1].cpu(), wv)


def test_int16_tensors_are_refused_with_a_hint():
    for dtype in [torch.int16] + ([torch.uint16] if hasattr(torch, "uint16") else []):
        x = torch.zeros(3, 8, dtype=dtype, device=DEV)
        with pytest.raises(TypeError, match="x.view\\(torch.bfloat16\\)"):
            flashsel.topk(x, 2)
    with pytest.raises(TypeError, match="torch.float32, torch.float16 or torch.bfloat16"):
        flashsel.topk(torch.zeros(3, 8, dtype=torch.int32, device=DEV), 2)


def test_int64_lengths_past_int32_are_out_of_range_rows():
    # docs/semantics.md (Errors): int64 device lengths are clamped into
    # [-1, 2^31 - 1] before the kernel sees them, so 2^32 + 5 is a row out of
    # range (all padding), never one wrapped into 5 columns.
    x = data("normal", 4, 1000, torch.float32, seed=8)
    lens = torch.tensor([2**32 + 5, 5, -(2**32) + 5, 1000], dtype=torch.int64, device=DEV)
    gi, gv = flashsel.topk(x, 10, lengths=lens, return_values=True)
    wi, wv = cpu_ref(x, 10, torch.tensor([0, 5, 0, 1000], dtype=torch.int32))
    assert torch.equal(gi[[0, 2]].cpu(), torch.full((2, 10), -1, dtype=torch.int32))
    assert torch.equal(gi[[1, 3]].cpu(), wi[[1, 3]])
    assert torch.equal(gv[[1, 3]].cpu().view(torch.int32), wv[[1, 3]].view(torch.int32))
