"""flashsel.topk on CPU torch tensors (skipped where torch is not importable).

CPU tensors take the same engine as NumPy arrays, through zero-copy views;
these tests check that tensors come back, bit for bit equal to the reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import flashsel
from _ref import KINDS, make, ref_topk

torch = pytest.importorskip("torch")

TDTYPES = [torch.float32, torch.float16, torch.bfloat16]
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def to_np_f32(t):
    return t.float().numpy()


def ref_for(t, k, lengths=None, order="score", nan="lowest"):
    """Reference on the float32 widening of `t` (exact for f16/bf16): the
    indices, and the values bits taken from `t` itself."""
    x = to_np_f32(t.reshape(-1, t.shape[-1]) if t.dim() == 1 else t)
    idx, _ = ref_topk(x, k, lengths, order, nan)
    idx_t = torch.from_numpy(idx)
    pad = idx_t < 0
    vals = t.reshape(idx_t.shape[0], -1).gather(1, idx_t.clamp(min=0).long())
    vals = torch.where(pad, torch.tensor(float("-inf"), dtype=t.dtype), vals)
    return idx_t, vals


def assert_same_t(got_idx, got_val, want_idx, want_val):
    assert got_idx.dtype == torch.int32
    assert torch.equal(got_idx, want_idx)
    assert got_val.dtype == want_val.dtype
    iv = INT_VIEW[got_val.dtype]
    assert torch.equal(got_val.contiguous().view(iv), want_val.contiguous().view(iv))


@pytest.mark.parametrize("dtype", TDTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_parity(dtype, kind):
    rng = np.random.default_rng(12)
    x = torch.from_numpy(make(kind, 4, 777, np.float32, rng)).to(dtype)
    for k, order, nan in itertools.product([1, 50, 800], ["score", "index"], ["lowest", "largest"]):
        idx, val = flashsel.topk(x, k, order=order, nan=nan, return_values=True)
        assert isinstance(idx, torch.Tensor) and idx.device.type == "cpu"
        assert_same_t(idx, val, *ref_for(x, k, None, order, nan))


@pytest.mark.parametrize("dtype", TDTYPES, ids=str)
def test_lengths_forms_and_strides(dtype):
    rng = np.random.default_rng(13)
    big = torch.from_numpy(make("relu", 10, 600, np.float32, rng)).to(dtype)
    view = big[::2, 50:550]  # strided rows, read in place
    lens = [0, 1, 31, 32, 500]
    for lengths in (lens, torch.tensor(lens), torch.tensor(lens, dtype=torch.int32), np.array(lens)):
        idx, val = flashsel.topk(view, 32, lengths=lengths, return_values=True)
        assert_same_t(idx, val, *ref_for(view, 32, lens))


def test_one_dim_requires_grad_and_empty():
    x = torch.randn(300, requires_grad=True)
    idx = flashsel.topk(x, 5)
    assert idx.shape == (5,)
    assert torch.equal(idx.long(), torch.topk(x.detach(), 5).indices)
    idx, val = flashsel.topk(torch.zeros(0, 4), 2, return_values=True)
    assert idx.shape == (0, 2) and val.shape == (0, 2)


def test_errors():
    x = torch.zeros(3, 8)
    with pytest.raises(TypeError, match="float64"):
        flashsel.topk(x.double(), 2)
    with pytest.raises(TypeError, match="int64"):
        flashsel.topk(x.long(), 2)
    with pytest.raises(ValueError, match="column stride 2"):
        flashsel.topk(x[:, ::2], 2)
    with pytest.raises(ValueError, match="column stride"):
        flashsel.topk(x.t(), 2)
    with pytest.raises(TypeError, match="lengths must be int32 or int64"):
        flashsel.topk(x, 2, lengths=torch.ones(3))
    with pytest.raises(ValueError, match="lengths\\[0\\] = 9 is outside 0..=8"):
        flashsel.topk(x, 2, lengths=torch.tensor([9, 0, 0]))
    with pytest.raises(TypeError, match="layout"):
        flashsel.topk(x.to_sparse(), 2)
    with pytest.raises(ValueError, match="device"):
        flashsel.topk(torch.zeros(3, 8, device="meta"), 2)
    with pytest.raises(ValueError, match="k must be at least 1 \\(got 0\\)"):
        flashsel.topk(x, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_cuda_lengths_for_cpu_scores_are_refused():
    x = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="lengths is on cuda"):
        flashsel.topk(x, 2, lengths=torch.ones(3, dtype=torch.int32, device="cuda"))


# ---------------------------------------------------------------------------
# The conventions shared with the CLI (tests/test_conventions.py for NumPy)
# ---------------------------------------------------------------------------


def test_one_dimensional_scores_give_k_outputs():
    x = torch.arange(10, dtype=torch.float32) % 4
    for k in [1, 4, 10, 13]:
        idx, val = flashsel.topk(x, k, return_values=True)
        assert idx.shape == (k,) and val.shape == (k,), k
        assert_same_t(idx, val, *(t[0] for t in ref_for(x[None, :], k)))


@pytest.mark.parametrize(
    "scalar",
    [5, torch.tensor(5), torch.tensor(5, dtype=torch.int32), np.int64(5), np.array(5, np.int32)],
    ids=["int", "0-d int64 tensor", "0-d int32 tensor", "np.int64", "0-d int32 array"],
)
def test_scalar_lengths_apply_to_every_row(scalar):
    rng = np.random.default_rng(14)
    x = torch.from_numpy(make("few", 4, 60, np.float32, rng)).to(torch.bfloat16)
    idx, val = flashsel.topk(x, 8, lengths=scalar, return_values=True)
    assert_same_t(idx, val, *ref_for(x, 8, [5, 5, 5, 5]))


def test_lengths_errors():
    x = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="lengths = 9 is outside 0..=8"):
        flashsel.topk(x, 2, lengths=torch.tensor(9))
    with pytest.raises(TypeError, match="lengths must be int32 or int64.*got torch.int16"):
        flashsel.topk(x, 2, lengths=torch.ones(3, dtype=torch.int16))
    with pytest.raises(ValueError, match="lengths has 2 entries but scores has 3 rows"):
        flashsel.topk(x, 2, lengths=torch.ones(2, dtype=torch.int64))


INT16_DTYPES = [torch.int16] + ([torch.uint16] if hasattr(torch, "uint16") else [])


@pytest.mark.parametrize("dtype", INT16_DTYPES, ids=str)
def test_int16_tensors_are_refused_with_a_hint(dtype):
    x = torch.zeros(3, 8, dtype=dtype)
    with pytest.raises(TypeError, match="unsupported scores dtype.*x.view\\(torch.bfloat16\\)"):
        flashsel.topk(x, 2)
    # The hint works: the same bits as bfloat16.
    assert flashsel.topk(x.view(torch.bfloat16), 2).shape == (3, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool], ids=str)
def test_other_dtypes_are_refused_naming_the_accepted_ones(dtype):
    with pytest.raises(TypeError, match="torch.float32, torch.float16 or torch.bfloat16"):
        flashsel.topk(torch.zeros(3, 8, dtype=dtype), 2)
