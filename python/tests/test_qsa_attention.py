"""flashsel.qsa_attention on the CPU (the Rust float64 reference, rounded
once) against an independent NumPy float64 implementation of
docs/semantics.md's "QSA sparse attention" written here: a hand-computed
example, empty rows (out 0, lse -inf), grouped heads, every d, lengths
(given, derived: the same bits), duplicates, paged caches (shuffled and
strided pages: the same bits as one contiguous sequence), bfloat16 inputs,
NumPy and CPU torch tensors (the same bits), and every error path.

With torch installed, also the torch operator ``flashsel::qsa_attention``
on CPU tensors: its schema, that the public function routes tensors
through it, torch.library.opcheck, the fake (meta) implementation (shapes,
dtypes, the eager error messages, CUDA metadata accepted) and
torch.compile(fullgraph=True) giving the same bytes as eager."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import flashsel

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a CI requirement
    ml_dtypes = BF16 = None

try:
    import torch
except ImportError:
    torch = None

needs_bf16 = pytest.mark.skipif(BF16 is None, reason="ml_dtypes is not installed")
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

INT_MIN, INT_MAX = -(2**31), 2**31 - 1


# ---------------------------------------------------------------------------
# The independent reference (float64, NumPy)
# ---------------------------------------------------------------------------


def f64(x):
    """Exact float64 values of float32, ml_dtypes.bfloat16 or uint16 bf16 bits."""
    x = np.asarray(x)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def ref_qsa(q, k, v, indices, scale=None, lengths=None):
    """docs/semantics.md's definition: q [rows, h_q, d]; k, v [tokens, h_kv, d]
    or [pages, page_size, h_kv, d] (slot s: token s % page_size of page s //
    page_size); entries < 0, >= slots or past lengths[r] are not attended;
    head h reads KV head h // (h_q // h_kv). Returns (out, lse) float64."""
    q, k, v = f64(q), f64(k), f64(v)
    if k.ndim == 3:
        k, v = k[None], v[None]
    pages, page_size, h_kv, d = k.shape
    kf = k.reshape(pages * page_size, h_kv, d)
    vf = v.reshape(pages * page_size, h_kv, d)
    rows, h_q, _ = q.shape
    idx = np.asarray(indices).reshape(rows, -1).astype(np.int64)
    s = float(np.float32(1.0 / math.sqrt(d) if scale is None else scale))
    out = np.zeros((rows, h_q, d))
    lse = np.full((rows, h_q), -np.inf)
    for r in range(rows):
        n = idx.shape[1] if lengths is None else int(lengths[r])
        row = idx[r, :n]
        row = row[(row >= 0) & (row < pages * page_size)]
        if len(row) == 0:
            continue
        for h in range(h_q):
            g = h // (h_q // h_kv)
            logits = s * (kf[row, g] @ q[r, h])
            m = logits.max()
            e = np.exp(logits - m)
            lse[r, h] = m + np.log(e.sum())
            out[r, h] = (e / e.sum()) @ vf[row, g]
    return out, lse


def derived_lengths(indices, slots):
    return np.array(
        [max([p + 1 for p, x in enumerate(row) if 0 <= x < slots], default=0) for row in np.asarray(indices)],
        np.int32,
    )


def check_f32(got, want):
    """A float32 result is the float64 one rounded once (the reference's and
    this file's summation orders differ only in the last f64 bits)."""
    got = np.asarray(got)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin].astype(np.float64), want[fin], rtol=1.5e-7, atol=1e-12)


def check_bf16(got, want):
    """bf16 out: the float64 value rounded once to bfloat16."""
    np.testing.assert_allclose(f64(got), want, rtol=2.0**-8, atol=1e-12)


def assert_same_bits(a, b):
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8))


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def index_rows(rng, rows, width, tokens, *, invalid=True):
    """Random token ids (duplicates allowed) with interior invalid entries of
    every kind, invalid tails, and the last row with nothing valid."""
    idx = rng.integers(0, max(tokens, 1), (rows, width)).astype(np.int64)
    if invalid:
        bad = np.array([INT_MIN, -123456, -1, tokens, tokens + 7, INT_MAX])
        mask = rng.random((rows, width)) < 0.2
        idx[mask] = bad[rng.integers(0, len(bad), int(mask.sum()))]
        for r in range(rows):
            tail = int(rng.integers(0, width // 2 + 1))
            if tail:
                idx[r, width - tail :] = bad[r % len(bad)]
        idx[-1] = -1
    return idx.astype(np.int32)


def case(rows=5, tokens=40, h_q=4, h_kv=2, d=64, width=16, seed=0):
    rng = np.random.default_rng(seed)
    q = randn(rng, rows, h_q, d)
    k = randn(rng, tokens, h_kv, d)
    v = randn(rng, tokens, h_kv, d)
    return q, k, v, index_rows(rng, rows, width, tokens), rng


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


def test_hand_computed_example():
    # One head, d 64, scale 1: q = e0; key 0 = 0 (logit 0), key 1 = ln3 e0
    # (logit ln 3); v0 = 4 e0, v1 = 8 e1; token 2 NaN (never attended).
    # indices [0, -1, 1, 7] over 3 tokens: entries 0 and 1 attended, so
    # lse = ln(1 + 3) = ln 4 and out = (1 * 4 e0 + 3 * 8 e1) / 4 = e0 + 6 e1.
    q = np.zeros((1, 1, 64), np.float32)
    q[0, 0, 0] = 1.0
    k = np.zeros((3, 1, 64), np.float32)
    k[1, 0, 0] = math.log(3)
    v = np.zeros((3, 1, 64), np.float32)
    v[0, 0, 0] = 4.0
    v[1, 0, 1] = 8.0
    k[2] = v[2] = np.nan
    idx = np.array([[0, -1, 1, 7]], np.int32)
    out, lse = flashsel.qsa_attention(q, k, v, idx, scale=1.0)
    assert out.dtype == np.float32 and out.shape == (1, 1, 64)
    assert lse.dtype == np.float32 and lse.shape == (1, 1)
    # ln 3 as float32 is not ln 3: the exact result of the float32 inputs.
    l1 = float(np.float32(math.log(3)))
    assert lse[0, 0] == np.float32(math.log1p(math.exp(l1)))
    assert abs(lse[0, 0] - math.log(4)) < 1e-6
    p1 = math.exp(l1) / (1 + math.exp(l1))
    assert out[0, 0, 0] == np.float32(4 * (1 - p1)) and out[0, 0, 1] == np.float32(8 * p1)
    np.testing.assert_allclose(out[0, 0, :2], [1.0, 6.0], rtol=1e-6)
    assert not out[0, 0, 2:].any()
    check_f32(out, ref_qsa(q, k, v, idx, 1.0)[0])


def test_empty_rows_give_zero_and_minus_inf():
    q, k, v, _, _ = case(rows=4, tokens=10, h_q=2, h_kv=1)
    idx = np.array([[-1, -1, -1], [10, INT_MAX, INT_MIN], [0, 1, 2], [3, -1, 4]], np.int32)
    lens = np.array([3, 3, 0, 3], np.int32)
    out, lse = flashsel.qsa_attention(q, k, v, idx, lengths=lens)
    assert not out[:3].any() and (lse[:3] == -np.inf).all()
    assert np.isfinite(lse[3]).all() and out[3].any()
    # A sequence of no tokens: every row is empty.
    e = np.zeros((0, 1, 64), np.float32)
    out, lse = flashsel.qsa_attention(q, e, e, idx)
    assert out.shape == (4, 2, 64) and not out.any() and (lse == -np.inf).all()
    # A paged cache of no pages, and no query rows at all.
    p = np.zeros((0, 16, 1, 64), np.float32)
    out, lse = flashsel.qsa_attention(q, p, p, idx)
    assert not out.any() and (lse == -np.inf).all()
    out, lse = flashsel.qsa_attention(q[:0], k, v, idx[:0])
    assert out.shape == (0, 2, 64) and lse.shape == (0, 2)


@pytest.mark.parametrize(
    "rows,tokens,h_q,h_kv,d,width",
    [
        (5, 40, 4, 2, 64, 16),  # grouped heads: heads 0-1 read KV head 0, 2-3 KV head 1
        (3, 100, 24, 2, 256, 40),  # QSA's heads
        (4, 70, 12, 1, 128, 33),  # a tensor-parallel shard
        (2, 30, 8, 8, 64, 7),  # MHA
        (2, 20, 128, 4, 64, 5),  # the most heads
        (3, 9, 1, 1, 128, 1),  # one head, width 1
    ],
)
def test_matches_the_independent_reference(rows, tokens, h_q, h_kv, d, width):
    q, k, v, idx, rng = case(rows, tokens, h_q, h_kv, d, width, seed=h_q * 7 + d)
    out, lse = flashsel.qsa_attention(q, k, v, idx)
    want_out, want_lse = ref_qsa(q, k, v, idx)
    check_f32(out, want_out)
    check_f32(lse, want_lse)
    # Random explicit lengths.
    lens = rng.integers(0, width + 1, rows).astype(np.int32)
    out, lse = flashsel.qsa_attention(q, k, v, idx, scale=0.3, lengths=lens)
    want_out, want_lse = ref_qsa(q, k, v, idx, 0.3, lens)
    check_f32(out, want_out)
    check_f32(lse, want_lse)


def test_grouped_heads_read_their_kv_head():
    # h_q 4, h_kv 2: heads 0 and 1 see KV head 0, heads 2 and 3 KV head 1.
    q, k, v, idx, _ = case(rows=3, tokens=12, h_q=4, h_kv=2, d=64, width=6, seed=3)
    out, lse = flashsel.qsa_attention(q, k, v, idx)
    for g in range(2):
        o1, l1 = flashsel.qsa_attention(q[:, 2 * g : 2 * g + 2].copy(), k[:, g : g + 1].copy(),
                                        v[:, g : g + 1].copy(), idx)
        assert_same_bits((out[:, 2 * g : 2 * g + 2], lse[:, 2 * g : 2 * g + 2]), (o1, l1))
    check_f32(out, ref_qsa(q, k, v, idx)[0])


def test_derived_lengths_equal_explicit_lengths():
    q, k, v, idx, _ = case(rows=6, tokens=50, h_q=4, h_kv=1, d=128, width=24, seed=11)
    lens = derived_lengths(idx, 50)
    assert lens[-1] == 0 and (lens < 24).any()
    assert_same_bits(flashsel.qsa_attention(q, k, v, idx), flashsel.qsa_attention(q, k, v, idx, lengths=lens))
    # int64 lengths are the same as int32.
    assert_same_bits(
        flashsel.qsa_attention(q, k, v, idx, lengths=lens.astype(np.int64)),
        flashsel.qsa_attention(q, k, v, idx, lengths=lens),
    )


def test_lengths_cut_valid_entries_and_duplicates_count_each_time():
    q, k, v, _, _ = case(rows=2, tokens=8, h_q=2, h_kv=1)
    idx = np.array([[1, 1, 2, 3], [5, 6, 7, 0]], np.int32)
    out, lse = flashsel.qsa_attention(q, k, v, idx, lengths=np.array([3, 2], np.int32))
    want = ref_qsa(q, k, v, idx, lengths=[3, 2])
    check_f32(out, want[0])
    check_f32(lse, want[1])
    # Row 0 attends token 1 twice and token 2 once: not the same as once each.
    once = flashsel.qsa_attention(q[:1], k, v, np.array([[1, 2]], np.int32))
    assert not np.array_equal(out[:1], once[0])


def test_scale_default_and_float32():
    q, k, v, idx, _ = case(d=128, seed=4)
    s = float(np.float32(1 / math.sqrt(128)))
    assert_same_bits(flashsel.qsa_attention(q, k, v, idx), flashsel.qsa_attention(q, k, v, idx, scale=s))
    # The scale is taken as float32.
    assert_same_bits(
        flashsel.qsa_attention(q, k, v, idx, scale=0.1),
        flashsel.qsa_attention(q, k, v, idx, scale=float(np.float32(0.1))),
    )
    assert_same_bits(
        flashsel.qsa_attention(q, k, v, idx, scale=np.float32(0.25)), flashsel.qsa_attention(q, k, v, idx, scale=0.25)
    )


def test_nan_in_an_attended_key_makes_the_head_nan():
    q, k, v, _, _ = case(rows=2, tokens=6, h_q=2, h_kv=2)
    k[3, 0, 5] = np.nan
    idx = np.array([[0, 3], [0, 1]], np.int32)
    out, lse = flashsel.qsa_attention(q, k, v, idx)
    assert np.isnan(lse[0, 0]) and np.isnan(out[0, 0]).all()
    assert np.isfinite(lse[0, 1]) and np.isfinite(lse[1]).all() and np.isfinite(out[1]).all()


def paged(k, v, page_size, rng, *, extra_pages=3, token_pad=0, page_pad=0):
    """k, v [tokens, h_kv, d] as a paged cache of shuffled pages, NaN in the
    unused pages and in the padding (``token_pad`` elements after each
    token, ``page_pad`` after each page): (k_cache, v_cache, the slot of
    each token, the number of slots)."""
    tokens, h_kv, d = k.shape
    pages = -(-tokens // page_size) + extra_pages
    perm = rng.permutation(pages)
    token_stride = h_kv * d + token_pad
    page_stride = page_size * token_stride + page_pad
    caches = []
    for x in (k, v):
        buf = np.full(pages * page_stride, np.nan, np.float32)
        view = np.lib.stride_tricks.as_strided(
            buf, shape=(pages, page_size, h_kv, d), strides=(page_stride * 4, token_stride * 4, d * 4, 4)
        )
        for t in range(tokens):
            view[perm[t // page_size], t % page_size] = x[t]
        caches.append(view)
    slot = np.array([perm[t // page_size] * page_size + t % page_size for t in range(tokens)], np.int64)
    return caches[0], caches[1], slot, pages * page_size


@pytest.mark.parametrize("page_size,token_pad,page_pad", [(16, 0, 0), (7, 2, 0), (1, 0, 0), (5, 0, 96), (64, 3, 5)])
def test_paged_cache_equals_one_sequence(page_size, token_pad, page_pad):
    q, k, v, idx, rng = case(rows=6, tokens=45, h_q=4, h_kv=2, d=64, width=20, seed=page_size)
    kc, vc, slot, slots = paged(k, v, page_size, rng, token_pad=token_pad, page_pad=page_pad)
    assert not kc.flags.c_contiguous or (token_pad == 0 and page_pad == 0)
    # Token ids -> slots; invalid entries stay invalid in both (-1, or past
    # every slot).
    pidx = np.where((idx >= 0) & (idx < 45), slot[np.clip(idx, 0, 44)], np.where(idx >= 0, slots + 5, idx))
    pidx = pidx.astype(np.int32)
    lens = derived_lengths(idx, 45)
    want = flashsel.qsa_attention(q, k, v, idx)
    assert_same_bits(flashsel.qsa_attention(q, kc, vc, pidx), want)
    assert_same_bits(flashsel.qsa_attention(q, kc, vc, pidx, lengths=lens), want)
    want_out, want_lse = ref_qsa(q, kc, vc, pidx)
    check_f32(want[0], want_out)
    check_f32(want[1], want_lse)


def test_strided_sequence_is_read_in_place():
    # [tokens, h_kv, d] rows of a wider buffer: the token stride passed on.
    q, k, v, idx, _ = case(rows=4, tokens=30, h_q=4, h_kv=2, d=64, width=12, seed=8)
    kb = np.full((30, 3, 64), np.nan, np.float32)
    vb = np.full((30, 3, 64), np.nan, np.float32)
    kb[:, :2], vb[:, :2] = k, v
    assert_same_bits(flashsel.qsa_attention(q, kb[:, :2], vb[:, :2], idx), flashsel.qsa_attention(q, k, v, idx))


@needs_bf16
@pytest.mark.parametrize("q_bf16,kv_bf16", [(True, True), (True, False), (False, True)])
def test_bf16_inputs(q_bf16, kv_bf16):
    q, k, v, idx, _ = case(rows=4, tokens=30, h_q=8, h_kv=2, d=128, width=12, seed=21)
    if q_bf16:
        q = q.astype(BF16)
    if kv_bf16:
        k, v = k.astype(BF16), v.astype(BF16)
    out, lse = flashsel.qsa_attention(q, k, v, idx)
    want_out, want_lse = ref_qsa(q, k, v, idx)
    assert out.dtype == (BF16 if q_bf16 else np.float32) and lse.dtype == np.float32
    (check_bf16 if q_bf16 else check_f32)(out, want_out)
    check_f32(lse, want_lse)


@needs_bf16
def test_bf16_bits_as_uint16_and_int16():
    q, k, v, idx, _ = case(rows=3, tokens=20, h_q=2, h_kv=1, d=64, width=8, seed=5)
    qb, kb, vb = q.astype(BF16), k.astype(BF16), v.astype(BF16)
    want = flashsel.qsa_attention(qb, kb, vb, idx)
    for dt in (np.uint16, np.int16):
        out, lse = flashsel.qsa_attention(qb.view(dt), kb.view(dt), vb.view(dt), idx)
        assert out.dtype == dt  # bits in, bits out
        assert_same_bits((out.view(BF16), lse), want)
    # Big-endian float32 is converted.
    assert_same_bits(flashsel.qsa_attention(q.astype(">f4"), k, v, idx), flashsel.qsa_attention(q, k, v, idx))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def _bad_cases():
    q, k, v, idx, _ = case(rows=3, tokens=20, h_q=4, h_kv=2, d=64, width=8)
    big = np.zeros((20, 2, 128), np.float32)
    wide = np.zeros((20, 3, 64), np.float32)
    f = np.float32
    return [
        # (q, k, v, indices, kwargs, exception, message)
        (q[0], k, v, idx, {}, ValueError, r"q must be 3-D \[rows, h_q, d\]"),
        (q.astype(np.float64), k, v, idx, {}, TypeError, "q: unsupported dtype float64"),
        (q.astype(np.float16), k, v, idx, {}, TypeError, "q: unsupported dtype float16"),
        (q.tolist(), k, v, idx, {}, TypeError, "q must be a numpy.ndarray or a torch.Tensor"),
        (q, k.tolist(), v, idx, {}, TypeError, "k must be a numpy.ndarray"),
        (q, k.astype(np.int32), v, idx, {}, TypeError, "k: unsupported dtype int32"),
        (q, k, v.astype(np.float64), idx, {}, TypeError, "v: unsupported dtype float64"),
        (q, k[:, 0], v[:, 0], idx, {}, ValueError, r"k must be \[tokens, h_kv, d\] or a paged cache"),
        (q, k[None, None], v[None, None], idx, {}, ValueError, "k must be"),
        (q, k, v[:10], idx, {}, ValueError, "v must have k's shape"),
        (q, k[:, :, :32].copy(), v[:, :, :32].copy(), idx, {}, ValueError, "k and v have d = 32 but q has d = 64"),
        (q[:, :, :32].copy(), k[:, :, :32].copy(), v[:, :, :32].copy(), idx, {}, ValueError, 'invalid d: "32"'),
        (np.zeros((3, 4, 512), f), np.zeros((20, 2, 512), f), np.zeros((20, 2, 512), f), idx, {}, ValueError,
         "invalid d"),
        (q[:, :3].copy(), k, v, idx, {}, ValueError, r'invalid h_kv: "2" \(expected a divisor of h_q'),
        (np.zeros((3, 129, 64), f), np.zeros((20, 1, 64), f), np.zeros((20, 1, 64), f), idx, {}, ValueError,
         'invalid h_q: "129"'),
        (q[:, :0], k, v, idx, {}, ValueError, 'invalid h_q: "0"'),
        (q, k[:, :0], v[:, :0], idx, {}, ValueError, 'invalid h_kv: "0"'),
        (q, k, v, idx.astype(np.int64), {}, TypeError, "indices must be int32, got dtype int64"),
        (q, k, v, idx.tolist(), {}, TypeError, "indices must be int32"),
        (q, k, v, idx[0], {}, ValueError, r"indices must be \[rows, width\] with rows = 3"),
        (q, k, v, idx[:2], {}, ValueError, r"indices must be \[rows, width\] with rows = 3"),
        (q, k, v, idx[:, :0], {}, ValueError, 'invalid width: "0"'),
        (q, k, v, idx, {"lengths": np.array([1, 9, 0], np.int32)}, ValueError, "9 at row 1 \\(width = 8\\)"),
        (q, k, v, idx, {"lengths": np.array([1, -1, 0], np.int32)}, ValueError, "-1 at row 1"),
        (q, k, v, idx, {"lengths": np.array([1, 2], np.int32)}, ValueError, r"lengths must be \[rows\] = \[3\]"),
        (q, k, v, idx, {"lengths": np.array([[1, 2, 3]], np.int32)}, ValueError, r"lengths must be \[rows\]"),
        (q, k, v, idx, {"lengths": np.array([1.0, 2.0, 3.0])}, TypeError, "lengths must be int32 or int64"),
        (q, k, v, idx, {"lengths": np.array([1, 2**40, 3])}, ValueError, "lengths: values must fit int32"),
        (q, k, v, idx, {"scale": "x"}, TypeError, "scale must be a float, got str"),
        (q, k, v, idx, {"scale": float("nan")}, ValueError, "scale must be finite"),
        (q, k, v, idx, {"scale": float("inf")}, ValueError, "scale must be finite"),
        (q, k, v, idx, {"scale": 1e39}, ValueError, 'invalid scale: "inf"'),  # finite, but not as float32
        # k and v of different dtypes or strides; unpacked heads; negative strides.
        (q, k, v.astype(BF16) if BF16 is not None else v.astype(np.uint16), idx, {}, TypeError,
         "k and v must have the same dtype, got float32 and bfloat16"),
        (q, k, wide[:, :2], idx, {}, ValueError,
         r"k and v must have the same strides, got \(128, 64, 1\) and \(192, 64, 1\) elements"),
        (q, big[:, :, :64], big[:, :, :64], idx, {}, ValueError,
         r"k: the last two dimensions \[h_kv, d\] must be packed \(strides \(128, 1\) elements, expected \(64, 1\)\)"),
        (q, k, v[:, :, ::-1], idx, {}, ValueError, "v: the last two dimensions"),
        (q, k[::-1], v[::-1], idx, {}, ValueError, "k: negative strides"),
        (q, np.zeros((2, 0, 2, 64), f), np.zeros((2, 0, 2, 64), f), idx, {}, ValueError, 'invalid page_size: "0"'),
        # Overlapping tokens or pages (a stride of 0).
        (q, np.broadcast_to(k[:1], k.shape), np.broadcast_to(v[:1], v.shape), idx, {}, ValueError,
         "token stride 0 is shorter than a token"),
        (q, np.broadcast_to(k[None, :4], (5, 4, 2, 64)), np.broadcast_to(v[None, :4], (5, 4, 2, 64)), idx, {},
         ValueError, "page stride 0 is shorter than a page"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_cases())))
def test_errors(i):
    q, k, v, idx, kw, exc, msg = _bad_cases()[i]
    with pytest.raises(exc, match=msg):
        flashsel.qsa_attention(q, k, v, idx, **kw)


def test_keyword_only_options():
    q, k, v, idx, _ = case()
    with pytest.raises(TypeError):
        flashsel.qsa_attention(q, k, v, idx, 0.1)  # scale is keyword-only


# ---------------------------------------------------------------------------
# torch: CPU tensors, the operator flashsel::qsa_attention
# ---------------------------------------------------------------------------


@pytest.fixture
def op():
    from flashsel import _torch_ops  # noqa: F401 - registers the operators

    torch._dynamo.reset()
    yield torch.ops.flashsel.qsa_attention.default
    torch._dynamo.reset()


def tcase(rows=4, tokens=40, h_q=4, h_kv=2, d=64, width=16, seed=0, dtype=None, kv_dtype=None, lengths=None):
    q, k, v, idx, rng = case(rows, tokens, h_q, h_kv, d, width, seed)
    tq, tk, tv = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
    if dtype is not None:
        tq = tq.to(dtype)
    if kv_dtype is not None:
        tk, tv = tk.to(kv_dtype), tv.to(kv_dtype)
    lens = None
    if lengths is not None:
        lens = torch.from_numpy(rng.integers(0, width + 1, rows)).to(lengths)
    return tq, tk, tv, torch.from_numpy(idx), lens


def tbits(t):
    t = t.contiguous()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_same_tensors(got, want, ctx=""):
    assert len(got) == len(want), ctx
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, f"{ctx}: {g.dtype} {g.shape}"
        assert torch.equal(tbits(g), tbits(w)), f"bytes differ {ctx}"


@needs_torch
def test_torch_cpu_tensors_match_numpy_bit_for_bit(op):
    for dtype, kv_dtype, lengths in [
        (None, None, None),
        (None, None, torch.int32),
        (torch.bfloat16, torch.bfloat16, torch.int64),
        (None, torch.bfloat16, None),
        (torch.bfloat16, None, torch.int32),
    ]:
        q, k, v, idx, lens = tcase(dtype=dtype, kv_dtype=kv_dtype, lengths=lengths, seed=3)
        out, lse = flashsel.qsa_attention(q, k, v, idx, scale=0.2, lengths=lens)
        assert out.dtype == q.dtype and lse.dtype == torch.float32 and out.shape == (4, 4, 64)

        def np_of(t):
            if t is None:
                return None
            return t.view(torch.int16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()

        if BF16 is None and torch.bfloat16 in (dtype, kv_dtype):
            continue
        want = flashsel.qsa_attention(np_of(q), np_of(k), np_of(v), idx.numpy(), scale=0.2, lengths=np_of(lens))
        got = (np_of(out), lse.numpy())
        assert_same_bits(got, want)


@needs_torch
def test_torch_paged_strided_cache(op):
    # A paged torch cache, pages a strided slice of a wider buffer.
    q, k, v, idx, _ = tcase(tokens=48, seed=9)
    kb = torch.full((6, 9, 2, 64), float("nan"))
    vb = torch.full((6, 9, 2, 64), float("nan"))
    kb[:, :8] = k.reshape(6, 8, 2, 64)
    vb[:, :8] = v.reshape(6, 8, 2, 64)
    # slot = page * 8 + offset == token id here (pages in order).
    assert_same_tensors(flashsel.qsa_attention(q, kb[:, :8], vb[:, :8], idx), flashsel.qsa_attention(q, k, v, idx))


@needs_torch
def test_torch_operator_schema(op):
    s = str(op._schema)
    assert s == (
        "flashsel::qsa_attention(Tensor q, Tensor k, Tensor v, Tensor indices, float? scale=None, "
        "Tensor? lengths=None) -> (Tensor out, Tensor lse)"
    ), s
    assert torch.Tag.pt2_compliant_tag in op.tags


@needs_torch
def test_torch_registration_comes_with_the_first_tensor_call():
    code = (
        "import flashsel, torch\n"
        "print(hasattr(torch.ops.flashsel, 'qsa_attention'))\n"
        "q = torch.zeros(1, 2, 64); k = torch.zeros(4, 1, 64); i = torch.zeros(1, 8, dtype=torch.int32)\n"
        "print(tuple(flashsel.qsa_attention(q, k, k, i)[0].shape) == (1, 2, 64))\n"
        "print(hasattr(torch.ops.flashsel, 'qsa_attention'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["False", "True", "True"]


@needs_torch
def test_torch_public_function_calls_the_operator(op):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v, idx, lens = tcase(lengths=torch.int32)
    with Calls() as c:
        got = flashsel.qsa_attention(q, k, v, idx, scale=0.1, lengths=lens)
    assert "flashsel.qsa_attention.default" in c.names
    assert_same_tensors(got, op(q, k, v, idx, 0.1, lens))
    # Host forms beside a tensor q run the eager path: the same bytes.
    assert_same_tensors(flashsel.qsa_attention(q, k, v, idx, scale=np.float32(0.1), lengths=lens.tolist()),
                        got)
    assert_same_tensors(flashsel.qsa_attention(q, k, v, idx.numpy(), scale=0.1, lengths=lens), got)
    with pytest.raises(TypeError, match="scale must be a float"):
        flashsel.qsa_attention(q, k, v, idx, scale="x")


def _samples():
    out = []
    for kw in [
        {"dtype": torch.bfloat16, "kv_dtype": torch.bfloat16, "lengths": torch.int32},
        {"h_q": 8, "h_kv": 1, "d": 128, "lengths": torch.int64},
        {"dtype": torch.bfloat16, "h_q": 2, "h_kv": 2, "d": 256, "width": 40},
    ]:
        q, k, v, idx, lens = tcase(**kw)
        out.append((q, k, v, idx, 0.1, lens))
    q, k, v, idx, _ = tcase(tokens=32)
    out.append((q, k.reshape(4, 8, 2, 64), v.reshape(4, 8, 2, 64), idx))  # paged, defaults
    return out


@needs_torch
@pytest.mark.parametrize("i", range(4))
def test_torch_opcheck(op, i):
    torch.library.opcheck(op, _samples()[i])


@needs_torch
def test_torch_fake_outputs_and_meta(op):
    from torch._subclasses.fake_tensor import FakeTensorMode

    for args in _samples():
        want = op(*args)
        with FakeTensorMode() as mode:
            got = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        assert [(g.shape, g.dtype, g.stride()) for g in got] == [(w.shape, w.dtype, w.stride()) for w in want]
        rows, h_q, d = args[0].shape
        assert got[0].shape == (rows, h_q, d) and got[0].dtype == args[0].dtype
        assert got[1].shape == (rows, h_q) and got[1].dtype == torch.float32
    q, k, v, idx, _ = tcase()
    out, lse = op(q.to("meta"), k.to("meta"), v.to("meta"), idx.to("meta"))
    assert out.device.type == "meta" and out.shape == (4, 4, 64) and lse.shape == (4, 4)


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e), str(e)
    return None


def _torch_bad():
    q, k, v, idx, _ = tcase(rows=3, tokens=20, h_q=4, h_kv=2, d=64, width=8)
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt)  # noqa: E731
    return [
        (q[0], k, v, idx),
        (q.half(), k, v, idx),
        (q, k.double(), v.double(), idx),
        (q, k, v.to(torch.bfloat16), idx),
        (q, k[:, 0], v[:, 0], idx),
        (q, k, v[:10], idx),
        (q, k[..., :32], v[..., :32], idx),
        (z(3, 4, 32), z(20, 2, 32), z(20, 2, 32), idx),
        (q[:, :3], k, v, idx),
        (z(3, 129, 64), z(20, 1, 64), z(20, 1, 64), idx),
        (q, k, v, idx.long()),
        (q, k, v, idx[0]),
        (q, k, v, idx[:, :0]),
        (q, k, v, idx, None, torch.zeros(2, dtype=torch.int32)),
        (q, k, v, idx, None, torch.zeros(3, dtype=torch.float32)),
        (q, k, v, idx, float("nan")),
        (q, k, v, idx, 1e39),
        (q, k, z(20, 3, 64)[:, :2], idx),
        (q, z(20, 2, 128)[..., :64], z(20, 2, 128)[..., :64], idx),
        (q, z(2, 0, 2, 64), z(2, 0, 2, 64), idx),
        (q, k[:1].expand(20, 2, 64), v[:1].expand(20, 2, 64), idx),
    ]


@needs_torch
@pytest.mark.parametrize("i", range(21))
def test_torch_fake_errors_match_eager(op, i):
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _torch_bad()[i]
    want = _error(lambda: op(*args))
    assert want is not None, "the eager call must fail"

    def fake():
        with FakeTensorMode() as mode:
            op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])

    assert _error(fake) == want


@needs_torch
def test_torch_value_errors_come_when_the_operator_runs(op):
    q, k, v, idx, _ = tcase(rows=3, width=8)
    lens = torch.tensor([1, 9, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match="9 at row 1"):
        flashsel.qsa_attention(q, k, v, idx, lengths=lens)
    f = torch.compile(lambda a, n: flashsel.qsa_attention(a, k, v, idx, lengths=n), fullgraph=True)
    with pytest.raises(ValueError, match="9 at row 1"):
        f(q, lens)


@needs_torch
def test_torch_fake_accepts_cuda_metadata(op):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, idx, lens = tcase(lengths=torch.int32)

    def on_cuda(*ts):
        return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in ts]

    with FakeTensorMode():
        args = on_cuda(q, k, v, idx, lens)
        out, lse = op(*args[:4], None, args[4])
        assert out.device.type == "cuda" and out.shape == (4, 4, 64) and lse.shape == (4, 4)
        with pytest.raises(ValueError, match="every tensor on one device"):
            op(args[0], torch.empty(k.shape), *args[2:4])


@needs_torch
def test_torch_outputs_never_require_grad(op):
    q, k, v, idx, _ = tcase()
    q.requires_grad_(True)
    for o in flashsel.qsa_attention(q, k, v, idx):
        assert not o.requires_grad


@needs_torch
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"dtype": "bfloat16", "kv_dtype": "bfloat16", "lengths": "int32"},
        {"h_q": 24, "h_kv": 2, "d": 256, "width": 40, "lengths": "int64"},
        {"kv_dtype": "bfloat16", "h_q": 12, "h_kv": 1, "d": 128},
    ],
)
def test_torch_compile_matches_eager(op, kw):
    kw = {n: getattr(torch, x) if isinstance(x, str) else x for n, x in kw.items()}
    q, k, v, idx, lens = tcase(**kw)

    def f(q, k, v, idx, lens):
        return flashsel.qsa_attention(q, k, v, idx, lengths=lens)

    want = f(q, k, v, idx, lens)
    assert (want[1][-1] == float("-inf")).all()  # the row with no valid index
    assert_same_tensors(torch.compile(f, fullgraph=True)(q, k, v, idx, lens), want, "compiled")


@needs_torch
def test_torch_compile_dynamic_shapes_paged_and_in_a_larger_graph(op):
    def f(q, kc, vc, idx, scale):
        # Exact operations around the operator (a reduction's order would
        # differ between inductor and eager).
        out, lse = flashsel.qsa_attention(q * 0.5, kc[:, :8], vc[:, :8], idx, scale=scale)
        return out * 2.0, torch.where(torch.isinf(lse), 0.0, lse)

    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    for dyn in (None, True):
        cf = torch.compile(f, fullgraph=True, dynamic=dyn)
        for rows, width, scale in [(3, 16, 0.1), (5, 24, 0.2), (2, 9, 0.05)]:
            q, _, _, idx, _ = tcase(rows=rows, tokens=48, width=width, seed=rows)
            kc = torch.randn(6, 10, 2, 64)
            vc = torch.randn(6, 10, 2, 64)
            args = (q, kc, vc, idx, scale)
            assert_same_tensors(cf(*args), f(*args), f"dynamic={dyn} {rows} {width}")
    torch.compile(f, fullgraph=True, backend=backend)(*args)
    assert "flashsel.qsa_attention.default" in seen


@needs_torch
def test_torch_compile_errors_carry_the_eager_message(op):
    q, k, v, idx, _ = tcase()
    with pytest.raises(Exception, match="indices must be torch.int32"):
        torch.compile(lambda a, i: flashsel.qsa_attention(a, k, v, i), fullgraph=True)(q, idx.long())
    with pytest.raises(Exception, match="invalid h_kv"):
        torch.compile(lambda a: flashsel.qsa_attention(a, k, v, idx), fullgraph=True)(q[:, :3])
