"""flashsel's torch operators, torch.ops.flashsel.topk and .qsa_select:
registration (lazy, never without torch), torch.library.opcheck, the fake
(meta) implementations, and torch.compile(fullgraph=True) giving the same
bytes as eager on the CPU; on CUDA the same under torch.compile, plus CUDA
graph capture and replay on new data.

Skipped where torch is not importable; the CUDA tests where torch sees no
CUDA device (reported as skipped, with the reason)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import flashsel
from _ref import make

torch = pytest.importorskip("torch")

from flashsel import _api, _torch_ops  # noqa: E402 - after the skip; registers the operators

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="torch sees no CUDA device")
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
TOPK = torch.ops.flashsel.topk.default
QSA = torch.ops.flashsel.qsa_select.default


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (no recompile limit carried over)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def data(kind, rows, cols, dtype, device="cpu", seed=0):
    rng = np.random.default_rng(seed)
    return torch.from_numpy(make(kind, rows, cols, np.float32, rng)).to(dtype).to(device)


def as_bits(t):
    return t.contiguous().view(INT_VIEW[t.dtype]) if t.dtype in INT_VIEW else t


def assert_same_bytes(got, want, ctx=""):
    """Indices, or (indices, values): the same dtype, shape, device and bits."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want), ctx
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, f"{ctx}: {g.dtype} {g.shape}"
        assert torch.equal(as_bits(g).cpu(), as_bits(w).cpu()), f"bytes differ {ctx}"


def compiled(fn, **kw):
    return torch.compile(fn, fullgraph=True, **kw)


# ---------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------


def test_operators_are_registered_with_their_schemas():
    assert hasattr(torch.ops.flashsel, "topk") and hasattr(torch.ops.flashsel, "qsa_select")
    topk = str(TOPK._schema)
    assert topk.startswith("flashsel::topk(Tensor scores, SymInt k, Tensor? lengths, Tensor? starts, str order")
    assert "-> (Tensor indices, Tensor values)" in topk
    qsa = str(QSA._schema)
    assert qsa.startswith("flashsel::qsa_select(Tensor scores, Tensor positions, SymInt ratio, SymInt k_blocks")
    assert "-> (Tensor ids, Tensor counts)" in qsa
    assert torch.Tag.pt2_compliant_tag in TOPK.tags and torch.Tag.pt2_compliant_tag in QSA.tags


def _child(code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split()


def test_registration_is_lazy_and_needs_no_torch():
    # Without torch (an import of it fails), flashsel imports and runs on NumPy.
    out = _child(
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, flashsel\n"
        "print(flashsel.topk(np.arange(5, dtype=np.float32), 2).tolist() == [4, 3])\n"
        "print('flashsel._torch_ops' in sys.modules)"
    )
    assert out == ["True", "False"]
    # flashsel first: the operators come with the first call on a tensor.
    out = _child(
        "import sys, flashsel, torch\n"
        "print(hasattr(torch.ops.flashsel, 'topk'))\n"
        "print(flashsel.topk(torch.arange(5.0), 2).tolist() == [4, 3])\n"
        "print(hasattr(torch.ops.flashsel, 'topk'), hasattr(torch.ops.flashsel, 'qsa_select'))"
    )
    assert out == ["False", "True", "True", "True"]
    # torch first: importing flashsel registers them.
    out = _child("import torch, flashsel\nprint(hasattr(torch.ops.flashsel, 'topk'))")
    assert out == ["True"]


# ---------------------------------------------------------------------------
# opcheck and the fake implementations
# ---------------------------------------------------------------------------


def _topk_samples(device):
    x = data("normal", 4, 300, torch.float32, device, seed=1)
    h = data("relu", 3, 64, torch.bfloat16, device, seed=2)
    f16 = data("few", 2, 50, torch.float16, device, seed=3)
    lens = torch.tensor([0, 1, 17, 300], dtype=torch.int32, device=device)
    yield "f32", (x, 8, None, None, "score", "lowest", True)
    yield "f32 no values", (x, 8, None, None, "score", "lowest", False)
    yield "lengths int32 index", (x, 8, lens, None, "index", "largest", True)
    yield "lengths int64", (x, 8, lens.long(), None, "score", "lowest", True)
    yield "lengths 0-d", (x, 8, torch.tensor(5, device=device), None, "score", "lowest", True)
    yield "length int", (x, 8, None, None, "index", "lowest", True, 77)
    yield "bf16 k > cols", (h, 100, None, None, "score", "largest", True)
    yield "f16 strided rows", (data("nan5", 6, 80, torch.float16, device)[::2, 5:55], 7, None, None, "score", "lowest", True)
    yield "f16 1-D", (f16[1], 9, None, None, "score", "lowest", True)
    yield "no rows", (torch.zeros(0, 10, device=device), 3, None, None, "score", "lowest", True)
    st = torch.tensor([0, 5, 17, 100], dtype=torch.int32, device=device)
    ends = torch.tensor([17, 50, 117, 300], dtype=torch.int32, device=device)
    yield "starts", (x, 8, ends, st, "score", "lowest", True)
    yield "start int", (x, 8, None, None, "index", "lowest", True, 200, 10)
    table = torch.arange(3 * 5, dtype=torch.int32, device=device).flip(0).reshape(3, 5)
    seqs = torch.tensor([2, 0, 1, 1], dtype=torch.int32, device=device)
    yield "slots", (x, 8, ends, st, "index", "lowest", True, None, None, table, 64, seqs)


def _qsa_samples(device):
    s = data("normal", 5, 200, torch.float32, device, seed=4)
    pos = torch.tensor([0, 10, 163, 500, 799], device=device)
    table = torch.arange(26, dtype=torch.int32, device=device).reshape(2, 13)
    seqs = torch.tensor([0, 1, 0, 1, 1], dtype=torch.int32, device=device)
    yield "index", (s, pos, 4, 40, "index", "lowest", None, 64, None)
    yield "score int32 positions", (s, pos.int(), 4, 40, "score", "largest", None, 64, None)
    yield "bf16 paged", (s.bfloat16(), pos, 4, 40, "index", "lowest", table, 64, seqs)
    yield "f16 ratio 8", (s.half(), pos, 8, 16, "score", "lowest", None, 64, None)


TOPK_CPU = list(_topk_samples("cpu"))
QSA_CPU = list(_qsa_samples("cpu"))


@pytest.mark.parametrize("args", [a for _, a in TOPK_CPU], ids=[n for n, _ in TOPK_CPU])
def test_opcheck_topk(args):
    torch.library.opcheck(TOPK, args)


@pytest.mark.parametrize("args", [a for _, a in QSA_CPU], ids=[n for n, _ in QSA_CPU])
def test_opcheck_qsa_select(args):
    torch.library.opcheck(QSA, args)


def test_outputs_never_require_grad():
    # Not differentiable: autograd passes through the operators (opcheck's
    # autograd registration check), eager and compiled.
    x = data("normal", 3, 100, torch.float32).requires_grad_()
    torch.library.opcheck(TOPK, (x, 4, None, None, "score", "lowest", True))
    torch.library.opcheck(QSA, (x, torch.tensor([3, 50, 399]), 4, 8, "index", "lowest", None, 64, None))
    idx, val = flashsel.topk(x, 4, return_values=True)
    assert not idx.requires_grad and not val.requires_grad
    idx, val = compiled(lambda s: flashsel.topk(s * 2.0, 4, return_values=True))(x)
    assert not val.requires_grad
    assert_same_bytes((idx, val), flashsel.topk(x.detach() * 2.0, 4, return_values=True))
    ids, counts = flashsel.qsa_select(x, torch.tensor([3, 50, 399]), k_blocks=8)
    assert not ids.requires_grad and not counts.requires_grad


def test_fake_implementations_give_the_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(6, 1000, dtype=torch.bfloat16)
        idx, val = TOPK(x, 64, None, None, "score", "lowest", True)
        assert (idx.shape, idx.dtype, val.shape, val.dtype) == ((6, 64), torch.int32, (6, 64), torch.bfloat16)
        idx, val = TOPK(x[0], 64, None, None, "score", "lowest", False)
        assert idx.shape == (64,) and val.shape == (0,) and val.dtype == torch.bfloat16
        ids, counts = QSA(x, torch.empty(6, dtype=torch.int64), 4, 512, "index", "lowest", None, 64, None)
        assert ids.shape == (6, 512 * 4 + 3) and counts.shape == (6,) and ids.dtype == counts.dtype == torch.int32
    # Meta tensors take the same implementation (the public functions refuse them).
    idx, val = TOPK(torch.empty(3, 10, device="meta"), 4, None, None, "index", "lowest", True)
    assert idx.device.type == "meta" and idx.shape == (3, 4) and val.shape == (3, 4)


def test_fake_implementations_check_metadata_with_the_eager_messages():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def a(x, k, lengths=None, order="score", length=None):
        return (x, k, lengths, None, order, "lowest", False, length)

    x = torch.zeros(3, 8)
    cases = [
        (a(x.double(), 2), TypeError, "float64"),
        (a(x, 0), ValueError, "k must be at least 1 \\(got 0\\)"),
        (a(x[:, ::2], 2), ValueError, "column stride 2"),
        (a(torch.zeros(2, 3, 4), 2), ValueError, "scores must be 1-D \\[cols\\] or 2-D"),
        (a(x, 2, torch.ones(3)), TypeError, "lengths must be int32 or int64"),
        (a(x, 2, torch.ones(2, dtype=torch.int64)), ValueError, "lengths has 2 entries but scores has 3 rows"),
        (a(x, 2, torch.ones(3, 1, dtype=torch.int64)), ValueError, "lengths must be a scalar or 1-D"),
        (a(x, 2, length=9), ValueError, "lengths = 9 is outside 0..=8"),
        (a(x, 2, order="desc"), ValueError, "invalid order"),
        (a(x, 2**30), ValueError, "rows \\* k"),
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            TOPK(*args)  # eager (the real implementation)
        with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
            TOPK(*args)  # the fake implementation
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ValueError, match="scores must be 2-D"):
        QSA(torch.zeros(3), torch.zeros(3, dtype=torch.int64), 4, 8, "index", "lowest", None, 64, None)
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(TypeError, match="positions must hold int32"):
        QSA(torch.zeros(3, 8), torch.zeros(3), 4, 8, "index", "lowest", None, 64, None)
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ValueError, match="come together"):
        QSA(torch.zeros(3, 8), torch.zeros(3, dtype=torch.int64), 4, 8, "index", "lowest", torch.zeros(1, 2, dtype=torch.int32), 64, None)


# ---------------------------------------------------------------------------
# torch.compile(fullgraph=True) on the CPU: the same bytes as eager
# ---------------------------------------------------------------------------


def _topk_configs():
    """(name, scores, kwargs): shapes, dtypes, lengths forms, orders."""
    yield "f32 4x1000 k8", data("normal", 4, 1000, torch.float32), dict(k=8)
    yield "f32 1x5000 k64 values", data("relu", 1, 5000, torch.float32, seed=1), dict(k=64, return_values=True)
    yield "bf16 k > cols", data("equal", 3, 100, torch.bfloat16, seed=2), dict(k=150, return_values=True)
    yield "f16 1-D", data("nan5", 1, 777, torch.float16, seed=3)[0], dict(k=5, return_values=True, nan="largest")
    yield "lengths int32 index", data("few", 5, 600, torch.float32, seed=4), dict(
        k=32, lengths=torch.tensor([0, 1, 31, 32, 600], dtype=torch.int32), order="index", return_values=True
    )
    yield "lengths int64", data("normal", 5, 600, torch.bfloat16, seed=5), dict(
        k=32, lengths=torch.tensor([600, 300, 3, 0, 33]), return_values=True
    )
    yield "lengths 0-d", data("normal", 3, 400, torch.float32, seed=6), dict(k=10, lengths=torch.tensor(100))
    yield "lengths int", data("ascending", 3, 400, torch.float32, seed=7), dict(k=10, lengths=123, order="index")
    yield "starts", data("normal", 4, 500, torch.float32, seed=8), dict(
        k=16, starts=torch.tensor([0, 10, 250, 490]), lengths=torch.tensor([500, 400, 260, 500]), return_values=True
    )
    yield "start int", data("normal", 4, 500, torch.float16, seed=9), dict(k=16, starts=100, lengths=300)
    yield "no rows", torch.zeros(0, 10), dict(k=3, return_values=True)


TOPK_CONFIGS = list(_topk_configs())


@pytest.mark.parametrize("x,kw", [(x, kw) for _, x, kw in TOPK_CONFIGS], ids=[n for n, _, _ in TOPK_CONFIGS])
def test_compile_topk_matches_eager(x, kw):
    def f(s):
        return flashsel.topk(s, **kw)

    assert_same_bytes(compiled(f)(x), f(x), "compiled")


def test_compile_topk_inside_a_larger_graph():
    # A view, a cast and arithmetic around the operator; the lengths come from
    # a tensor computed in the graph.
    def f(big, pos):
        s = big[::2, 100:1100].float() * 2.0 + 1.0
        lens = (pos + 1).clamp(max=s.shape[1])
        idx, val = flashsel.topk(s, 64, lengths=lens, order="index", return_values=True)
        return idx.long() + 1, val.sum(dim=1)

    big = data("relu", 12, 1200, torch.bfloat16, seed=10)
    pos = torch.tensor([5, 63, 64, 500, 998, 999])
    assert_same_bytes(compiled(f)(big, pos), f(big, pos), "larger graph")


def test_compile_topk_over_several_shapes():
    # One compiled function over shapes and k: recompiles, then dynamic shapes.
    def f(s, lens, k: int):
        return flashsel.topk(s, k, lengths=lens, return_values=True)

    cf = compiled(f)
    for rows, cols, k in [(2, 100, 5), (3, 200, 5), (5, 333, 5), (4, 1000, 17), (7, 50, 60), (1, 2000, 100)]:
        x = data("normal", rows, cols, torch.float32, seed=rows * cols)
        lens = torch.randint(0, cols + 1, (rows,), generator=torch.Generator().manual_seed(cols))
        assert_same_bytes(cf(x, lens, k), f(x, lens, k), f"{rows}x{cols} k={k}")


def test_compile_dynamic_shapes():
    def f(s, lens):
        return flashsel.topk(s, 12, lengths=lens, order="index", return_values=True)

    cf = compiled(f, dynamic=True)
    for rows, cols in [(2, 100), (9, 3000), (1, 64), (6, 12)]:
        x = data("few", rows, cols, torch.bfloat16, seed=rows + cols)
        lens = torch.full((rows,), cols // 2, dtype=torch.int32)
        assert_same_bytes(cf(x, lens), f(x, lens), f"dynamic {rows}x{cols}")


def test_compiled_graph_holds_the_operator():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(s, pos):
        idx = flashsel.topk(s, 4, lengths=7)
        ids, counts = flashsel.qsa_select(s, pos, k_blocks=2)
        return idx, ids, counts

    x = data("normal", 3, 64, torch.float32)
    pos = torch.tensor([3, 40, 200])
    out = torch.compile(f, fullgraph=True, backend=backend)(x, pos)
    assert_same_bytes(out, f(x, pos))
    assert len(graphs) == 1
    targets = {n.target for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert torch.ops.flashsel.topk.default in targets or torch.ops.flashsel.topk in targets
    assert torch.ops.flashsel.qsa_select.default in targets or torch.ops.flashsel.qsa_select in targets


def _qsa_configs():
    s = data("normal", 6, 300, torch.float32, seed=11)
    pos = torch.tensor([0, 2, 3, 163, 700, 1199])
    table = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]], dtype=torch.int32)
    yield "index", s, pos, dict(k_blocks=40)
    yield "score largest", s, pos.int(), dict(k_blocks=40, order="score", nan="largest")
    yield "bf16 ratio 8", s.bfloat16(), pos, dict(ratio=8, k_blocks=16)
    yield "f16 paged", s.half(), pos, dict(k_blocks=40, page_table=table, page_size=64, seq_ids=torch.zeros(6, dtype=torch.int32))
    yield "all blocks", s, torch.tensor([0, 1, 5, 10, 20, 30]), dict(k_blocks=512)


QSA_CONFIGS = list(_qsa_configs())


@pytest.mark.parametrize("s,pos,kw", [c[1:] for c in QSA_CONFIGS], ids=[c[0] for c in QSA_CONFIGS])
def test_compile_qsa_select_matches_eager(s, pos, kw):
    def f(scores, positions):
        return flashsel.qsa_select(scores, positions, **kw)

    got = compiled(f)(s, pos)
    want = f(s, pos)
    assert_same_bytes(got, want, "compiled")
    # And eager equals the NumPy path (the operator changes nothing).
    host = s.view(torch.int16).numpy() if s.dtype == torch.bfloat16 else s.numpy()
    np_kw = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ids, counts = flashsel.qsa_select(host, pos.numpy(), **np_kw)
    np.testing.assert_array_equal(want[0].numpy(), ids)
    np.testing.assert_array_equal(want[1].numpy(), counts)


def test_compile_errors():
    x = torch.zeros(3, 8)
    # Metadata errors: at compile time, with the eager message (torch wraps them).
    with pytest.raises(Exception, match="lengths must be int32 or int64"):
        compiled(lambda s: flashsel.topk(s, 2, lengths=torch.ones(3)))(x)
    with pytest.raises(Exception, match="lengths = 9 is outside 0..=8"):
        compiled(lambda s: flashsel.topk(s, 2, lengths=9))(x)
    with pytest.raises(Exception, match="column stride 2"):
        compiled(lambda s: flashsel.topk(s[:, ::2], 2))(x)
    # Value errors: when the graph runs, as the eager exception.
    with pytest.raises(ValueError, match="lengths\\[0\\] = 9 is outside 0..=8"):
        compiled(lambda s, n: flashsel.topk(s, 2, lengths=n))(x, torch.tensor([9, 0, 0]))
    with pytest.raises(ValueError, match="positions\\[0\\] = 11 sees 3 blocks of 4 tokens but the scores hold 2"):
        compiled(lambda s, p: flashsel.qsa_select(s, p, k_blocks=1))(torch.zeros(1, 2), torch.tensor([11]))


def test_eager_host_forms_still_work():
    # Lists and NumPy arrays are host forms for eager calls (under
    # torch.compile pass tensors, or Python ints for lengths and starts).
    x = data("normal", 3, 50, torch.float32)
    want = flashsel.topk(x, 4, lengths=torch.tensor([10, 20, 50]), starts=torch.tensor([0, 5, 0]))
    for lengths, starts in [([10, 20, 50], [0, 5, 0]), (np.array([10, 20, 50], np.int32), np.array([0, 5, 0]))]:
        assert torch.equal(flashsel.topk(x, 4, lengths=lengths, starts=starts), want)
    assert torch.equal(flashsel.topk(x, 4, lengths=np.int64(20)), flashsel.topk(x, 4, lengths=20))
    ids, counts = flashsel.qsa_select(x, [3, 40, 199], k_blocks=2, page_table=np.arange(4, dtype=np.int32)[None], seq_ids=[0, 0, 0])
    want = flashsel.qsa_select(
        x, torch.tensor([3, 40, 199]), k_blocks=2, page_table=torch.arange(4, dtype=torch.int32)[None], seq_ids=torch.zeros(3, dtype=torch.int32)
    )
    assert torch.equal(ids, want[0]) and torch.equal(counts, want[1])


# ---------------------------------------------------------------------------
# CUDA: torch.compile and CUDA graphs
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_engine():
    if not HAS_CUDA:
        pytest.skip("torch sees no CUDA device")
    b = flashsel.backends()["cuda"]
    if not b["available"]:
        pytest.fail(f"torch sees a GPU but the flashsel CUDA engine is unavailable: {b['reason']}")
    return torch.device("cuda", torch.cuda.current_device())


@needs_cuda
def test_cuda_opcheck(cuda_engine):
    for name, args in _topk_samples(cuda_engine):
        print("topk sample:", name)  # shown when one fails
        torch.library.opcheck(TOPK, args)
    for name, args in _qsa_samples(cuda_engine):
        print("qsa_select sample:", name)
        torch.library.opcheck(QSA, args)


@needs_cuda
@pytest.mark.parametrize("name", [n for n, _, _ in TOPK_CONFIGS])
def test_cuda_compile_topk_matches_eager_and_the_cpu(cuda_engine, name):
    _, x, kw = next(c for c in TOPK_CONFIGS if c[0] == name)
    dev_kw = {k: (v.to(cuda_engine) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    xd = x.to(cuda_engine)

    def f(s):
        return flashsel.topk(s, **dev_kw)

    want = f(xd)
    assert_same_bytes(compiled(f)(xd), want, "compiled")
    assert_same_bytes(_to_cpu(want), flashsel.topk(x, **kw), "the CPU engine")


@needs_cuda
def test_cuda_compile_inside_a_larger_graph(cuda_engine):
    def f(big, pos):
        s = big[::2, 100:1100].float() * 2.0 + 1.0
        lens = (pos + 1).clamp(max=s.shape[1])
        idx, val = flashsel.topk(s, 64, lengths=lens, order="index", return_values=True)
        return idx.long() + 1, val.sum(dim=1)

    big = data("relu", 12, 1200, torch.bfloat16, cuda_engine, seed=10)
    pos = torch.tensor([5, 63, 64, 500, 998, 999], device=cuda_engine)
    got = compiled(f)(big, pos)
    want = f(big, pos)
    assert torch.equal(got[0], want[0]) and torch.allclose(got[1], want[1])


def _to_cpu(out):
    return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()


def _replays_equal_eager(run, refill, ctx):
    """Captures run() into a CUDA graph after a warm-up on a side stream, then
    for three new inputs (refill(i) writes them into the static tensors)
    replays it and compares with an eager call on the same inputs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # engine created, kernels compiled, workspace size cached
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()
    for i in range(3):
        refill(i)
        g.replay()
        torch.cuda.synchronize()
        assert_same_bytes(tuple(t.clone() for t in out), run(), f"{ctx} replay {i}")


@needs_cuda
@pytest.mark.parametrize("rows,cols,k", [(1, 262_144, 2048), (32, 65_536, 512), (5, 3000, 40)])
def test_cuda_graph_capture_replay_of_topk(cuda_engine, rows, cols, k):
    x = data("normal", rows, cols, torch.float32, cuda_engine, seed=7)
    lens = torch.full((rows,), cols, dtype=torch.int32, device=cuda_engine)

    def refill(i):
        x.copy_(data(["relu", "few", "normal"][i], rows, cols, torch.float32, cuda_engine, seed=100 + i))
        lens.copy_(torch.randint(0, cols + 1, (rows,), device=cuda_engine, dtype=torch.int32))

    _replays_equal_eager(lambda: flashsel.topk(x, k, lengths=lens, return_values=True), refill, "lengths")
    # An int length (filled on the device inside the graph) and no values.
    _replays_equal_eager(lambda: (flashsel.topk(x, k, lengths=cols // 2, order="index"),), refill, "int length")


@needs_cuda
def test_cuda_graph_capture_of_a_compiled_function(cuda_engine):
    rows, cols, k = 8, 20_000, 100
    x = data("normal", rows, cols, torch.bfloat16, cuda_engine, seed=8)
    lens = torch.full((rows,), cols, dtype=torch.int64, device=cuda_engine)

    def f(s, n):
        idx, val = flashsel.topk(s * 1.0, k, lengths=n, return_values=True)
        return idx, val

    cf = compiled(f)

    def refill(i):
        x.copy_(data(["relu", "equal", "nan5"][i], rows, cols, torch.bfloat16, cuda_engine, seed=200 + i))
        lens.copy_(torch.randint(0, cols + 1, (rows,), device=cuda_engine))

    _replays_equal_eager(lambda: cf(x, lens), refill, "compiled")


@needs_cuda
def test_cuda_compile_reduce_overhead(cuda_engine):
    # torch.compile's own CUDA graphs (mode="reduce-overhead").
    rows, cols, k = 4, 50_000, 256

    def f(s, n):
        return flashsel.topk(s, k, lengths=n, return_values=True)

    cf = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    for i, kind in enumerate(["normal", "relu", "few", "equal", "normal"]):
        x = data(kind, rows, cols, torch.float32, cuda_engine, seed=300 + i)
        n = torch.randint(0, cols + 1, (rows,), device=cuda_engine, dtype=torch.int32)
        torch.compiler.cudagraph_mark_step_begin()
        got = tuple(t.clone() for t in cf(x, n))
        assert_same_bytes(got, f(x, n), f"reduce-overhead call {i}")


@needs_cuda
def test_cuda_qsa_select(cuda_engine):
    s = data("normal", 6, 300, torch.float32, cuda_engine, seed=11)
    pos = torch.tensor([0, 2, 3, 163, 700, 1199], device=cuda_engine)
    want = flashsel.qsa_select(s, pos, k_blocks=40)

    def f(scores, positions):
        return flashsel.qsa_select(scores, positions, k_blocks=40)

    assert_same_bytes(compiled(f)(s, pos), want, "compiled")
    cpu = flashsel.qsa_select(s.cpu(), pos.cpu(), k_blocks=40)
    assert_same_bytes(_to_cpu(want), cpu, "the CPU engine")

    def refill(i):
        s.copy_(data(["relu", "few", "equal"][i], 6, 300, torch.float32, cuda_engine, seed=400 + i))
        pos.copy_(torch.randint(0, 1200, (6,), device=cuda_engine))

    _replays_equal_eager(lambda: f(s, pos), refill, "qsa_select")
    _replays_equal_eager(lambda: compiled(f)(s, pos), refill, "compiled qsa_select")


def test_topk_host_page_tables_are_checked_not_cast():
    # A host page table or sequence ids beside a tensor: the host engine's
    # checks (4-byte integers, one sequence id per row), never a silent cast.
    x = data("normal", 3, 100, torch.float32)
    with pytest.raises(TypeError, match="page_table must be int32"):
        flashsel.topk(x, 5, page_table=np.zeros((1, 2), np.float32), seq_ids=[0, 0, 0])
    with pytest.raises(TypeError, match="seq_ids must hold int32 or int64"):
        flashsel.topk(x, 5, page_table=np.zeros((1, 2), np.int32), seq_ids=[0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="seq_ids must be 1-D with 3 entries"):
        flashsel.topk(x, 5, page_table=np.zeros((1, 2), np.int32), seq_ids=[0, 0])
    table = np.arange(2, dtype=np.int32).reshape(1, 2)
    got = flashsel.topk(x, 5, page_table=table, seq_ids=[0, 0, 0], order="index")
    want = flashsel.topk(x.numpy(), 5, page_table=table, seq_ids=[0, 0, 0], order="index")
    assert torch.equal(got, torch.from_numpy(want))
