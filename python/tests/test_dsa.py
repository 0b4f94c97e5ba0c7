"""flashsel.dsa_scores and flashsel.dsa_indexer on the CPU engine: a
hand-computed example, an independent NumPy float64 implementation of
docs/semantics.md's "DSA indexer scores" written here (the CPU engine within
the stated error bound of it, on every q / k dtype pair of float32,
bfloat16 and fp8 e4m3, with and without the key scale), the NaN bits, empty
ranges, no keys and no rows, the indexer as the bytes of
``flashsel.topk(scores, starts=..., lengths=ends)`` (both orders, both NaN
policies, ties, ``return_values``, a page table), NumPy arrays, the bit
forms of bf16 / e4m3 and CPU torch tensors giving the same bits, and every
error path.

With torch installed, also the torch operators ``flashsel::dsa_scores`` and
``flashsel::dsa_indexer`` on CPU tensors: their schemas, that the public
functions route tensors through them, torch.library.opcheck, the fake
(meta) implementations (shapes, dtypes, the eager error messages, CUDA
metadata accepted) and torch.compile(fullgraph=True) giving the same bytes
as eager."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import flashsel

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
    FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
except ImportError:  # pragma: no cover - ml_dtypes is a CI requirement
    ml_dtypes = BF16 = FP8 = None

try:
    import torch
except ImportError:
    torch = None

needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

NAN_BITS = 0x7FC00000
DTYPES = ["f32", "bf16", "fp8"]


# ---------------------------------------------------------------------------
# The independent reference (float64, NumPy) and test data
# ---------------------------------------------------------------------------


def decode(x):
    """Exact float64 values of float32, bf16 bit patterns (uint16 / int16) or
    e4m3 bit patterns (uint8), decoded here (not by ml_dtypes)."""
    x = np.asarray(x)
    if x.dtype.kind == "f" and x.dtype.itemsize == 4:
        return x.astype(np.float64)
    if x.dtype.itemsize == 2:
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert x.dtype.itemsize == 1
    b = x.view(np.uint8).astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 0x7
    val = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    return np.where((e == 15) & (m == 7), np.nan, sign * val)


def ref_dsa(q, k, weights, starts, ends, k_scale=None):
    """docs/semantics.md: score[t, s] = k_scale[s] * sum_h w[t, h] *
    relu(q[t, h] . k[s]) for starts[t] <= s < ends[t], -inf elsewhere.
    Returns (scores, M) float64, M the bound's magnitude |k_scale[s]| *
    sum_h |w[t, h]| * sum_j |q[t, h, j] k[s, j]|."""
    qf, kf = decode(q), decode(k).reshape(decode(k).shape[0], -1)
    w = np.asarray(weights, np.float64)
    ks = np.ones(kf.shape[0]) if k_scale is None else np.asarray(k_scale, np.float64)
    rows, n = qf.shape[0], kf.shape[0]
    out = np.full((rows, n), -np.inf)
    mag = np.zeros((rows, n))
    for t in range(rows):
        a, b = int(starts[t]), int(ends[t])
        if a == b:
            continue
        dots = qf[t] @ kf[a:b].T  # [H, b - a]
        relu = np.where(np.isnan(dots), np.nan, np.maximum(dots, 0.0))
        out[t, a:b] = ks[a:b] * (w[t] @ relu)
        mag[t, a:b] = np.abs(ks[a:b]) * (np.abs(w[t]) @ (np.abs(qf[t]) @ np.abs(kf[a:b]).T))
    return out, mag


def check_bound(got, q, k, weights, starts, ends, k_scale=None):
    """The CPU engine's scores against the float64 reference: -inf outside
    the ranges, NaN (as 0x7fc00000) where it is NaN, else within the stated
    bound (d + H + 2) 2^-24 M + (d + 2) H 2^-149 W."""
    got = np.asarray(got)
    assert got.dtype == np.float32
    want, mag = ref_dsa(q, k, weights, starts, ends, k_scale)
    nan = np.isnan(want)
    assert (got.view(np.uint32)[nan] == NAN_BITS).all()
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want) & ~nan)
    fin = np.isfinite(want)
    _, heads, d = np.shape(q)
    ks = 1.0 if k_scale is None else np.maximum(1.0, np.abs(np.asarray(k_scale, np.float64)))[None, :]
    wmax = np.maximum(1.0, np.abs(np.asarray(weights, np.float64)).max(axis=1, initial=0.0))[:, None] * ks
    bound = (d + heads + 2) * 2.0**-24 * mag + (d + 2) * heads * 2.0**-149 * wmax
    err, bound = np.abs(got[fin].astype(np.float64) - want[fin]), bound[fin]
    assert (err <= bound * 1.001).all(), f"worst {np.max(err / np.maximum(bound, 1e-300))} of the bound"
    # And loosely relative, for a human reading a failure.
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4 * (mag[fin].max(initial=0.0) + 1e-30))


def elems(rng, shape, kind, scale=1.0):
    """Random values of `kind` as an array the API takes: float32, bf16 bit
    patterns (uint16) or e4m3 bit patterns (uint8, NaN patterns excluded)."""
    if kind == "f32":
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    if kind == "bf16":
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    b = rng.integers(0, 256, shape).astype(np.uint8)
    b[(b & 0x7F) == 0x7F] = 0x38  # 1.0 instead of NaN
    # Mostly small magnitudes (exponents <= 8), so sums stay moderate.
    return np.where((b >> 3) & 0xF > 8, b & 0x87, b).astype(np.uint8)


def ranges(rng, rows, n):
    """Per-row [start, end): random, empty, the whole range, one key, ends
    at N."""
    s = rng.integers(0, n + 1, rows)
    e = rng.integers(0, n + 1, rows)
    s, e = np.minimum(s, e), np.maximum(s, e)
    fixed = [(0, n), (n // 3, n // 3), (0, 0), (n, n), (n - 1, n), (0, 1)]
    for i, (a, b) in enumerate(fixed[: rows // 2]):
        s[i], e[i] = a, b
    return s.astype(np.int32), e.astype(np.int32)


def case(rows=6, heads=4, d=64, n=150, qk=("f32", "f32"), seed=0, scale=False):
    rng = np.random.default_rng(seed)
    q = elems(rng, (rows, heads, d), qk[0])
    k = elems(rng, (n, d), qk[1])
    w = rng.standard_normal((rows, heads)).astype(np.float32)
    st, en = ranges(rng, rows, n)
    ks = rng.uniform(0.1, 4.0, n).astype(np.float32) if scale else None
    return q, k, w, st, en, ks


def assert_same_bits(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(w).view(np.uint8))


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


def test_hand_computed_example():
    # Two heads of 64: head 0 = e0, head 1 = -e0; key 1 = 2 e0 (dots 2, -2),
    # key 2 = -3 e0 (dots -3, 3); weights [0.5, 2.0]; k_scale [1, 1, 4];
    # range [1, 3): key 0 is -inf, key 1 0.5 * 2 = 1, key 2 4 * (2 * 3) = 24.
    q = np.zeros((1, 2, 64), np.float32)
    q[0, 0, 0], q[0, 1, 0] = 1.0, -1.0
    k = np.zeros((3, 64), np.float32)
    k[1, 0], k[2, 0] = 2.0, -3.0
    w = np.array([[0.5, 2.0]], np.float32)
    ks = np.array([1.0, 1.0, 4.0], np.float32)
    s = flashsel.dsa_scores(q, k, w, [1], [3], k_scale=ks)
    assert s.dtype == np.float32 and s.shape == (1, 3)
    np.testing.assert_array_equal(s, [[-np.inf, 1.0, 24.0]])
    # Without the scale key 2 is 6; the one-head key form [N, 1, d] is the same.
    np.testing.assert_array_equal(flashsel.dsa_scores(q, k[:, None], w, [1], [3]), [[-np.inf, 1.0, 6.0]])
    ids, vals = flashsel.dsa_indexer(q, k, w, [1], [3], topk=4, k_scale=ks, return_values=True)
    np.testing.assert_array_equal(ids, [[1, 2, -1, -1]])
    np.testing.assert_array_equal(vals, [[1.0, 24.0, -np.inf, -np.inf]])
    np.testing.assert_array_equal(flashsel.dsa_indexer(q, k, w, [1], [3], topk=1, k_scale=ks), [[2]])
    np.testing.assert_array_equal(flashsel.dsa_indexer(q, k, w, [1], [3], topk=2, k_scale=ks, order="score"), [[2, 1]])
    check_bound(s, q, k, w, [1], [3], ks)


@pytest.mark.parametrize("qd", DTYPES)
@pytest.mark.parametrize("kd", DTYPES)
@pytest.mark.parametrize("scale", [False, True], ids=["no_scale", "k_scale"])
def test_every_dtype_pair_within_the_bound_of_float64(qd, kd, scale):
    seed = 10 * DTYPES.index(qd) + 2 * DTYPES.index(kd) + scale
    q, k, w, st, en, ks = case(rows=7, heads=5, d=64, n=130, qk=(qd, kd), seed=seed, scale=scale)
    got = flashsel.dsa_scores(q, k, w, st, en, k_scale=ks)
    assert got.shape == (7, 130)
    check_bound(got, q, k, w, st, en, ks)


@pytest.mark.parametrize(("heads", "d"), [(1, 64), (64, 128), (3, 256), (128, 64)])
def test_heads_and_widths(heads, d):
    q, k, w, st, en, ks = case(rows=4, heads=heads, d=d, n=90, qk=("bf16", "fp8"), seed=heads + d, scale=True)
    check_bound(flashsel.dsa_scores(q, k, w, st, en, k_scale=ks), q, k, w, st, en, ks)


def test_rows_do_not_depend_on_the_batch():
    q, k, w, st, en, ks = case(rows=9, heads=8, d=128, n=300, qk=("f32", "bf16"), seed=3, scale=True)
    whole = flashsel.dsa_scores(q, k, w, st, en, k_scale=ks)
    for t in (0, 4, 8):
        one = flashsel.dsa_scores(q[t : t + 1], k, w[t : t + 1], st[t : t + 1], en[t : t + 1], k_scale=ks)
        assert_same_bits(one[0], whole[t])


def test_nan_inputs_give_the_quiet_nan():
    q, k, w, _, _, _ = case(rows=3, heads=2, d=64, n=20, seed=4)
    k[5, 3] = np.nan
    q[2, 1, 7] = np.nan
    st, en = np.array([0, 6, 0], np.int32), np.array([20, 20, 4], np.int32)
    s = flashsel.dsa_scores(q, k, w, st, en)
    bits = s.view(np.uint32)
    assert bits[0, 5] == NAN_BITS and np.isfinite(s[0, :5]).all() and np.isfinite(s[0, 6:]).all()
    assert np.isfinite(s[1, 6:]).all() and (s[1, :6] == -np.inf).all()
    assert (bits[2, :4] == NAN_BITS).all() and (s[2, 4:] == -np.inf).all()
    check_bound(s, q, k, w, st, en)
    # An e4m3 NaN pattern is a NaN key.
    k8 = elems(np.random.default_rng(5), (20, 64), "fp8")
    k8[3, 0] = 0xFF
    s = flashsel.dsa_scores(q[:2], k8, w[:2], [0, 4], [20, 20])
    assert s.view(np.uint32)[0, 3] == NAN_BITS and np.isfinite(s[1, 4:]).all()


def test_empty_ranges_no_keys_no_rows():
    q, k, w, _, _, _ = case(rows=3, heads=2, d=64, n=40, seed=6)
    st = en = np.array([0, 17, 40], np.int32)
    s = flashsel.dsa_scores(q, k, w, st, en)
    assert s.shape == (3, 40) and (s == -np.inf).all()
    ids, vals = flashsel.dsa_indexer(q, k, w, st, en, topk=5, return_values=True)
    assert ids.shape == (3, 5) and (ids == -1).all() and (vals == -np.inf).all()
    # No keys at all.
    z = np.zeros(3, np.int32)
    assert flashsel.dsa_scores(q, k[:0], w, z, z).shape == (3, 0)
    assert (flashsel.dsa_indexer(q, k[:0], w, z, z, topk=4) == -1).all()
    # No rows (a list of no ranges is fine).
    assert flashsel.dsa_scores(q[:0], k, w[:0], [], []).shape == (0, 40)
    ids, vals = flashsel.dsa_indexer(q[:0], k, w[:0], [], [], return_values=True)
    assert ids.shape == (0, 2048) and vals.shape == (0, 2048)


# ---------------------------------------------------------------------------
# Input forms: the same bits
# ---------------------------------------------------------------------------


@needs_ml_dtypes
def test_ml_dtypes_and_bit_patterns_are_the_same_input():
    q, k, w, st, en, ks = case(rows=4, heads=3, d=128, n=70, qk=("bf16", "fp8"), seed=7, scale=True)
    want = flashsel.dsa_scores(q, k, w, st, en, k_scale=ks)
    forms = [
        (q.view(BF16), k.view(FP8)),
        (q.view(np.int16), k),
        (q.astype(">u2"), k),  # big-endian bit patterns: converted
        (q.view(BF16), k.view(FP8)[:, None, :]),
    ]
    for qq, kk in forms:
        assert_same_bits(flashsel.dsa_scores(qq, kk, w, st, en, k_scale=ks), want)
    # float32 values of bf16 inputs give the same scores (the inputs are decoded exactly).
    q32 = q.view(BF16).astype(np.float32)
    k32 = k.view(FP8).astype(np.float32)
    assert_same_bits(flashsel.dsa_scores(q32, k32, w, st, en, k_scale=ks), want)
    # Big-endian float32 weights and scales, int64 ranges, lists.
    got = flashsel.dsa_scores(q, k, w.astype(">f4"), st.astype(np.int64), en.tolist(), k_scale=ks.astype(">f4"))
    assert_same_bits(got, want)


def test_a_strided_q_is_copied_and_gives_the_same_bits():
    q, k, w, st, en, _ = case(rows=5, heads=4, d=64, n=60, seed=8)
    wide = np.zeros((5, 8, 64), np.float32)
    wide[:, ::2] = q
    assert_same_bits(flashsel.dsa_scores(wide[:, ::2], k, w, st, en), flashsel.dsa_scores(q, k, w, st, en))
    ww = np.zeros((5, 8), np.float32)
    ww[:, 1::2] = w
    assert_same_bits(flashsel.dsa_scores(q, k, ww[:, 1::2], st, en), flashsel.dsa_scores(q, k, w, st, en))


# ---------------------------------------------------------------------------
# The indexer: topk's bytes over the scores
# ---------------------------------------------------------------------------


def ties_case(rows, heads, d, n, seed):
    """Small integers everywhere: most scores tie exactly."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-1, 3, (rows, heads, d)).astype(np.float32)
    k = rng.integers(-2, 3, (4, d)).astype(np.float32)[rng.integers(0, 4, n)]
    w = rng.integers(0, 3, (rows, heads)).astype(np.float32)
    st, en = ranges(rng, rows, n)
    return q, k, w, st, en


@pytest.mark.parametrize("order", ["score", "index"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
@pytest.mark.parametrize("topk", [1, 7, 64, 500])
def test_indexer_is_topk_of_the_scores(order, nan, topk):
    q, k, w, st, en = ties_case(rows=8, heads=3, d=64, n=400, seed=topk)
    k[[5, 77, 300]] = np.nan  # NaN scores in some ranges
    ks = np.random.default_rng(9).uniform(0.5, 2, 400).astype(np.float32)
    scores = flashsel.dsa_scores(q, k, w, st, en, k_scale=ks)
    want = flashsel.topk(scores, topk, starts=st, lengths=en, order=order, nan=nan, return_values=True)
    got = flashsel.dsa_indexer(q, k, w, st, en, topk=topk, k_scale=ks, order=order, nan=nan, return_values=True)
    assert_same_bits(got, want)
    ids = flashsel.dsa_indexer(q, k, w, st, en, topk=topk, k_scale=ks, order=order, nan=nan)
    assert_same_bits(ids, want[0])
    assert ids.shape == (8, topk) and ids.dtype == np.int32
    # min(topk, ends - starts) ids per row, inside the row's range.
    valid = ids >= 0
    np.testing.assert_array_equal(valid.sum(axis=1), np.minimum(topk, en - st))
    assert ((ids >= st[:, None]) & (ids < en[:, None]) | ~valid).all()


@pytest.mark.parametrize("qk", [("fp8", "fp8"), ("bf16", "f32"), ("f32", "fp8")])
def test_indexer_on_random_data(qk):
    q, k, w, st, en, ks = case(rows=6, heads=8, d=128, n=3000, qk=qk, seed=11, scale=True)
    scores = flashsel.dsa_scores(q, k, w, st, en, k_scale=ks)
    got = flashsel.dsa_indexer(q, k, w, st, en, k_scale=ks, return_values=True)  # topk 2048, index order
    assert got[0].shape == (6, 2048)
    assert_same_bits(got, flashsel.topk(scores, 2048, starts=st, lengths=en, order="index", return_values=True))


def test_indexer_with_a_page_table_writes_slots():
    q, k, w, st, en = ties_case(rows=6, heads=2, d=64, n=256, seed=12)
    page_size = 16
    rng = np.random.default_rng(13)
    table = rng.permutation(64).astype(np.int32).reshape(4, 16)  # 4 sequences of 16 pages of 16
    seqs = np.array([3, 0, 1, 1, 2, 0], np.int32)
    kw = dict(page_table=table, page_size=page_size, seq_ids=seqs)
    scores = flashsel.dsa_scores(q, k, w, st, en)
    for order in ("index", "score"):
        want = flashsel.topk(scores, 40, starts=st, lengths=en, order=order, return_values=True, **kw)
        got = flashsel.dsa_indexer(q, k, w, st, en, topk=40, order=order, return_values=True, **kw)
        assert_same_bits(got, want)
        # The slots of the token ids.
        tok = flashsel.dsa_indexer(q, k, w, st, en, topk=40, order=order)
        slot = table[seqs[:, None], np.maximum(tok, 0) // page_size] * page_size + np.maximum(tok, 0) % page_size
        np.testing.assert_array_equal(got[0], np.where(tok < 0, -1, slot))


# ---------------------------------------------------------------------------
# The paged key cache (DeepGEMM fp8_paged_mqa_logits' layout)
# ---------------------------------------------------------------------------


def cache_forms(cache, ps, d):
    """Every shape the API takes for a [P, ps * (d + 4)] byte cache."""
    forms = {"4d": cache.reshape(-1, ps, 1, d + 4), "3d": cache.reshape(-1, ps, d + 4), "2d": cache,
             "flat": cache.reshape(-1)}  # fmt: skip
    if FP8 is not None:
        forms["4d_fp8"] = cache.view(FP8).reshape(-1, ps, 1, d + 4)
    return forms


def paged_case(rows=9, heads=4, d=64, ps=16, max_pages=6, share=2, qd="bf16", seed=0, nan_keys=()):
    """Two sequences of max_pages pages of ps tokens (N = max_pages * ps),
    each held contiguously (e4m3 keys k[seq] [N, d] and scales sc[seq] [N])
    and in one paged cache [P, ps * (d + 4)] in DeepGEMM's layout: sequence
    1 shares sequence 0's first `share` pages, the physical pages are in a
    shuffled order, and one page (never in the table) holds NaN codes and
    NaN scales; `nan_keys`: tokens of sequence 0 with a NaN code. Returns
    (q, w, starts, ends, seq_ids, ks, scs, cache, table)."""
    rng = np.random.default_rng(seed)
    n = max_pages * ps
    ks = [elems(rng, (n, d), "fp8") for _ in range(2)]
    scs = [rng.uniform(0.1, 4.0, n).astype(np.float32) for _ in range(2)]
    ks[0][list(nan_keys), 1] = 0x7F
    ks[1][: share * ps] = ks[0][: share * ps]
    scs[1][: share * ps] = scs[0][: share * ps]
    pages = 2 * max_pages - share + 1
    perm = rng.permutation(pages).astype(np.int32)
    table = np.empty((2, max_pages), np.int32)
    table[0] = perm[:max_pages]
    table[1, :share] = perm[:share]
    table[1, share:] = perm[max_pages : 2 * max_pages - share]
    cache = np.full((pages, ps * (d + 4)), 0x7F, np.uint8)  # e4m3 NaN codes
    cache[perm[-1], ps * d :] = np.full(ps, np.nan, "<f4").view(np.uint8)  # the unused page's scales
    for seq in range(2):
        for i in range(max_pages):
            p = table[seq, i]
            cache[p, : ps * d] = ks[seq][i * ps : (i + 1) * ps].reshape(-1)
            cache[p, ps * d :] = scs[seq][i * ps : (i + 1) * ps].astype("<f4").view(np.uint8)
    q = elems(rng, (rows, heads, d), qd)
    w = rng.standard_normal((rows, heads)).astype(np.float32)
    st, en = ranges(rng, rows, n)
    seqs = (np.arange(rows) % 2).astype(np.int32)
    rng.shuffle(seqs)
    return q, w, st, en, seqs, ks, scs, cache, table


def by_sequence(fn, q, w, st, en, seqs, ks, scs, **kw):
    """`fn` (dsa_scores / dsa_indexer) on the keys held contiguously: each
    sequence's rows against its own keys and scales, put back in row order."""
    outs = []
    for seq in range(2):
        r = np.flatnonzero(seqs == seq)
        extra = {a: (v[r] if a == "seq_ids" else v) for a, v in kw.items()}
        outs.append((r, fn(q[r], ks[seq], w[r], st[r], en[r], k_scale=scs[seq], **extra)))
    first = outs[0][1]
    tup = isinstance(first, tuple)
    res = [np.empty((len(q), *x.shape[1:]), x.dtype) for x in (first if tup else (first,))]
    for r, out in outs:
        for dst, x in zip(res, out if tup else (out,)):
            dst[r] = x
    return tuple(res) if tup else res[0]


def slots_of(ids, table, seqs, ps):
    """Token ids to the cache's slots (-1 stays -1)."""
    t = np.maximum(ids, 0)
    return np.where(ids < 0, -1, table[seqs[:, None], t // ps] * ps + t % ps).astype(np.int32)


@pytest.mark.parametrize("qd", DTYPES)
@pytest.mark.parametrize(("heads", "d", "ps"), [(4, 64, 16), (8, 128, 64), (3, 256, 5)])
def test_paged_scores_are_the_contiguous_bits(qd, heads, d, ps):
    q, w, st, en, seqs, ks, scs, cache, table = paged_case(heads=heads, d=d, ps=ps, qd=qd, seed=heads + ps)
    want = by_sequence(flashsel.dsa_scores, q, w, st, en, seqs, ks, scs)
    assert want.shape == (9, table.shape[1] * ps)
    kw = dict(page_table=table, page_size=ps, seq_ids=seqs)
    for name, k in cache_forms(cache, ps, d).items():
        got = flashsel.dsa_scores(q, k, w, st, en, **kw)
        assert_same_bits(got, want)
    # And within the stated bound of the float64 reference (per sequence).
    for seq in range(2):
        r = seqs == seq
        check_bound(want[r], q[r], ks[seq], w[r], st[r], en[r], scs[seq])


@pytest.mark.parametrize("order", ["index", "score"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
def test_paged_indexer_ids_and_slots(order, nan):
    ps = 16
    # NaN keys 3 and 40 (in both sequences: their first two pages are shared) and 100.
    q, w, st, en, seqs, ks, scs, cache, table = paged_case(rows=12, heads=5, d=128, ps=ps, max_pages=8, seed=3,
                                                           nan_keys=(3, 40, 100))  # fmt: skip
    opts = dict(topk=30, order=order, nan=nan, return_values=True)
    pkw = dict(page_table=table, page_size=ps, seq_ids=seqs)
    tokens = by_sequence(flashsel.dsa_indexer, q, w, st, en, seqs, ks, scs, **opts)
    # The contiguous keys with the same table write the same slots.
    want_slots = by_sequence(flashsel.dsa_indexer, q, w, st, en, seqs, ks, scs, **opts, **pkw)
    np.testing.assert_array_equal(want_slots[0], slots_of(tokens[0], table, seqs, ps))
    for k in cache_forms(cache, ps, 128).values():
        assert_same_bits(flashsel.dsa_indexer(q, k, w, st, en, **opts, **pkw, slots=False), tokens)
        assert_same_bits(flashsel.dsa_indexer(q, k, w, st, en, **opts, **pkw), want_slots)
        assert_same_bits(flashsel.dsa_indexer(q, k, w, st, en, **opts, **pkw, slots=True), want_slots)
    # The indexer is topk of the paged scores.
    scores = flashsel.dsa_scores(q, cache, w, st, en, **pkw)
    assert_same_bits(tokens, flashsel.topk(scores, 30, starts=st, lengths=en, order=order, nan=nan,
                                           return_values=True))  # fmt: skip
    assert (scores.view(np.uint32)[np.isnan(scores)] == NAN_BITS).all() and np.isnan(scores).any()
    ids = flashsel.dsa_indexer(q, cache, w, st, en, topk=30, order=order, nan=nan, **pkw)
    assert ids.dtype == np.int32 and ids.shape == (12, 30)
    np.testing.assert_array_equal(ids, want_slots[0])


def test_paged_rows_read_only_their_pages():
    # Table entries no row's range reaches may be -1 (unmapped) or past the
    # cache; one sequence's rows never read the other's pages.
    ps, d = 8, 64
    q, w, _, _, _, ks, scs, cache, table = paged_case(rows=4, d=d, ps=ps, max_pages=6, seed=5)
    table = table.copy()
    table[0, 4:] = -1
    table[1, 5] = 10_000
    st = np.array([0, 3, 0, 17], np.int32)
    en = np.array([32, 30, 40, 39], np.int32)
    seqs = np.array([0, 0, 1, 1], np.int32)
    kw = dict(page_table=table, page_size=ps, seq_ids=seqs)
    got = flashsel.dsa_scores(q, cache, w, st, en, **kw)
    want = by_sequence(flashsel.dsa_scores, q, w, st, en, seqs, ks, scs)
    assert_same_bits(got, want)
    ids = flashsel.dsa_indexer(q, cache, w, st, en, topk=50, **kw)
    tok = by_sequence(flashsel.dsa_indexer, q, w, st, en, seqs, ks, scs, topk=50)
    np.testing.assert_array_equal(ids, slots_of(tok, np.where(table < 0, 0, table), seqs, ps))


def test_paged_empty_ranges_and_no_rows():
    q, w, _, _, _, _, _, cache, table = paged_case(rows=3, ps=16, seed=6)
    z = np.array([0, 40, 96], np.int32)
    seqs = np.array([0, 1, 0], np.int32)
    kw = dict(page_table=table, page_size=16, seq_ids=seqs)
    s = flashsel.dsa_scores(q, cache, w, z, z, **kw)
    assert s.shape == (3, 96) and (s == -np.inf).all()
    ids, vals = flashsel.dsa_indexer(q, cache, w, z, z, topk=5, return_values=True, **kw)
    assert (ids == -1).all() and (vals == -np.inf).all()
    e = np.zeros(0, np.int32)
    ekw = dict(page_table=table, page_size=16, seq_ids=e)
    assert flashsel.dsa_scores(q[:0], cache, w[:0], e, e, **ekw).shape == (0, 96)
    assert flashsel.dsa_indexer(q[:0], cache, w[:0], e, e, topk=7, **ekw).shape == (0, 7)


def _paged_bad_cases():
    ps, d = 16, 64
    q, w, st, en, seqs, ks, scs, cache, table = paged_case(rows=3, d=d, ps=ps, max_pages=4, seed=7)
    st, en = np.array([0, 5, 0], np.int32), np.array([64, 20, 10], np.int32)
    seqs = np.array([0, 1, 1], np.int32)
    kw = {"page_table": table, "page_size": ps, "seq_ids": seqs}
    c4 = cache.reshape(-1, ps, 1, d + 4)
    k0 = ks[0]

    def edit(t, at, v):
        t = t.copy()
        t[at] = v
        return t

    return [
        # (k, kwargs, starts, ends, which: "both" / "scores" / "indexer", exception, message)
        (c4, {**kw, "k_scale": scs[0]}, st, en, "both",
         ValueError, "k_scale must be None with a paged key cache: the cache holds the keys' scales"),
        (c4, {**kw, "page_size": 8}, st, en, "both",
         ValueError, r"k is a paged key cache of pages of 16 tokens \(shape \(7, 16, 1, 68\)\) but page_size = 8: "
                     r"pass page_size=16"),
        (cache.reshape(-1, ps, d + 4), {**kw, "page_size": 32}, st, en, "both",
         ValueError, "pages of 16 tokens"),
        (c4.astype(np.float32), kw, st, en, "both",
         TypeError, r"must hold bytes \(uint8 or float8_e4m3fn\), got float32"),
        (c4.view(np.int8), kw, st, en, "both", TypeError, "must hold bytes"),
        (cache[:, :-4], kw, st, en, "both",
         ValueError, r"must be bytes \[pages, page_size, 1, d \+ 4\] = \[P, 16, 1, 68\], \[P, 16, 68\], "
                     r"\[pages, page_size \* \(d \+ 4\)\] = \[P, 1088\] or flat \[P \* 1088\], got shape \(7, 1084\)"),
        (np.zeros((7, 16, 2, 68), np.uint8), kw, st, en, "both", ValueError, "must be bytes"),
        (cache.reshape(-1)[:-5], kw, st, en, "both",
         ValueError, r"the paged key cache holds 7611 bytes, not a whole number of pages of 1088 \(16 tokens of 64 "
                     r"e4m3 bytes and an f32 scale\)"),
        (cache[:0], kw, st, en, "both", ValueError, r"k: the paged key cache has no pages \(shape \(0, 1088\)\)"),
        (c4[::2], kw, st, en, "both", ValueError, r"k must be C-contiguous \(the paged key cache is read in place"),
        (c4, {**kw, "page_table": table.astype(np.int64)}, st, en, "both",
         TypeError, r"page_table must be int32 \[sequences, max_pages\], got int64"),
        (c4, {**kw, "seq_ids": [0, 1]}, st, en, "both", ValueError, "seq_ids must be 1-D with 3 entries"),
        (c4, {"page_table": table, "page_size": ps}, st, en, "both",
         ValueError, "page_table and seq_ids come together"),
        (c4, {**kw, "page_size": 0}, st, en, "both", ValueError, "page_size must be in 1"),
        (c4, {}, st, en, "both",
         ValueError, r"k must be \[keys, d\] \(or \[keys, 1, d\]: one key head\), got shape \(7, 16, 1, 68\); "
                     r"a paged key cache \(bytes \[pages, page_size, 1, d \+ 4\]\) needs page_table= and seq_ids="),
        (cache, {"page_size": ps}, st, en, "both", ValueError, "needs page_table= and seq_ids="),
        # Values (the engine's checks): ranges, the table, the cache.
        (c4, kw, st, [65, 20, 10], "both",
         ValueError, r'invalid key range: "\[0, 65\) at row 0" \(expected 0 <= starts\[t\] <= ends\[t\] <= keys\)'),
        (c4, {**kw, "seq_ids": [0, 2, 1]}, st, en, "both",
         ValueError, r"seq_ids\[1\] = 2 is outside 0..2 \(the page table's sequences\)"),
        (c4, {**kw, "page_table": edit(table, (1, 1), -1)}, st, en, "both",
         ValueError, r'invalid page_table entry: "page_table\[1, 1\] = -1 \(row 1, token 16\)"'),
        (c4, {**kw, "page_table": edit(table, (0, 3), 7)}, st, en, "both",
         ValueError, "row 0: token 48 is on page 7 but the key cache has 7 pages"),
        # The form and slots.
        (k0, kw, st, en, "scores",
         ValueError, r"dsa_scores takes page_table and seq_ids only with a paged key cache, but k is contiguous keys "
                     r"\[keys, d\] \(shape \(64, 64\)\): leave them out"),
        (k0, {**kw, "slots": False}, st, en, "indexer",
         ValueError, "slots=False with contiguous keys: the page table would go unused"),
        (c4, {"slots": True}, st, en, "indexer",
         ValueError, "slots=True writes the ids as KV slots through page_table: pass page_table and seq_ids"),
        (c4, {**kw, "slots": 1}, st, en, "indexer", TypeError, "slots must be a bool or None, got int"),
    ]  # fmt: skip


@pytest.mark.parametrize("i", range(len(_paged_bad_cases())))
def test_paged_errors(i):
    k, kw, st, en, which, exc, msg = _paged_bad_cases()[i]
    q, w, *_ = paged_case(rows=3, d=64, ps=16, max_pages=4, seed=7)
    if which in ("both", "scores"):
        with pytest.raises(exc, match=msg):
            flashsel.dsa_scores(q, k, w, st, en, **kw)
    if which in ("both", "indexer"):
        with pytest.raises(exc, match=msg):
            flashsel.dsa_indexer(q, k, w, st, en, topk=8, **kw)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def _bad_cases():
    q, k, w, st, en, ks = case(rows=3, heads=2, d=64, n=50, seed=14, scale=True)
    f = np.float32
    tbl = np.array([[0, 1], [2, 3]], np.int32)
    pt = {"page_table": tbl, "seq_ids": [0, 1, 0], "page_size": 32}
    big = np.zeros((50, 128), f)
    return [
        # (q, k, weights, starts, ends, kwargs, indexer only, exception, message)
        (q.tolist(), k, w, st, en, {}, False,
         TypeError, "q must be a numpy.ndarray or a torch.Tensor, got builtins.list"),
        (q.astype(np.float16), k, w, st, en, {}, False, TypeError, "unsupported q dtype float16: dsa_scores takes"),
        (q, k.astype(np.float64), w, st, en, {}, False, TypeError, "unsupported k dtype float64"),
        (q, k.astype(np.int32), w, st, en, {}, False, TypeError, "unsupported k dtype int32"),
        (q, np.ma.masked_array(k), w, st, en, {}, False, TypeError, "k must be a numpy.ndarray"),
        (q[0], k, w, st, en, {}, False,
         ValueError, r"q must be 3-D \[queries, heads, d\], got shape \(2, 64\); for one query pass q\[None\]"),
        (q, k[None], w, st, en, {}, False, ValueError, r"k must be \[keys, d\] \(or \[keys, 1, d\]"),
        (q, np.zeros((50, 2, 64), f), w, st, en, {}, False, ValueError, r"k must be \[keys, d\]"),
        (q, k[:, :32].copy(), w, st, en, {}, False, ValueError, "k has d = 32 but q has d = 64"),
        (q, big[:, :64], w, st, en, {}, False, ValueError, "k must be C-contiguous"),
        (q[:, :, :32].copy(), k[:, :32].copy(), w, st, en, {}, False,
         ValueError, r'invalid head dim \(d, the last dimension of q and k\): "32"'),
        (np.zeros((3, 129, 64), f), k, np.zeros((3, 129), f), st, en, {}, False,
         ValueError, r'invalid heads \(H, q\'s second dimension\): "129" \(expected 1..=128\)'),
        (q[:, :0], k, w[:, :0], st, en, {}, False, ValueError, 'invalid heads .*"0"'),
        (q, k, w.astype(np.float64), st, en, {}, False, TypeError, "weights must be float32, got float64"),
        (q, k, w.tolist(), st, en, {}, False,
         TypeError, "weights must be a float32 numpy.ndarray or torch.Tensor, got list"),
        (q, k, w[:, :1], st, en, {}, False,
         ValueError, r"weights must be \[queries, heads\] = \[3, 2\], got shape \(3, 1\)"),
        (q, k, w, st, en, {"k_scale": ks.astype(np.float64)}, False, TypeError, "k_scale must be float32, got float64"),
        (q, k, w, st, en, {"k_scale": ks[:10]}, False,
         ValueError, r"k_scale must be \[keys\] = \[50\], got shape \(10,\)"),
        (q, k, w, st.astype(np.float32), en, {}, False,
         TypeError, "starts must hold int32 or int64 values, got float32"),
        (q, k, w, st, en.astype(np.uint32), {}, False, TypeError, "ends must hold int32 or int64 values, got uint32"),
        (q, k, w, st[:2], en, {}, False,
         ValueError, r"starts must be 1-D with 3 entries \(one per row\), got shape \(2,\)"),
        (q, k, w, st, en[None], {}, False, ValueError, r"ends must be 1-D with 3 entries"),
        (q, k, w, np.array([0, 2**40, 0]), en, {}, False, ValueError, "starts: a value does not fit int32"),
        (q, k, w, [0, 3, 0], [1, 2, 0], {}, False,
         ValueError, r'invalid key range: "\[3, 2\) at row 1" \(expected 0 <= starts\[t\] <= ends\[t\] <= keys\)'),
        (q, k, w, [0, 0, 0], [1, 51, 0], {}, False, ValueError, r'invalid key range: "\[0, 51\) at row 1"'),
        (q, k, w, [0, 0, -1], [1, 5, 0], {}, False, ValueError, r'invalid key range: "\[-1, 0\) at row 2"'),
        (q, k, w, st, en, {"k_scale": 2.0}, False, TypeError, "k_scale must be a float32 numpy.ndarray"),
        # The indexer's options.
        (q, k, w, st, en, {"topk": 0}, True, ValueError, r"topk must be in 1 .. 2\*\*31 - 1 \(got 0\)"),
        (q, k, w, st, en, {"topk": 2**31}, True, ValueError, "topk must be in 1"),
        (q, k, w, st, en, {"topk": True}, True, TypeError, "topk must be an integer, got bool"),
        (q, k, w, st, en, {"topk": 2.0}, True, TypeError, "topk must be an integer, got float"),
        (q, k, w, st, en, {"topk": 2**30}, True, ValueError, r"rows \* k = 3221225472 does not fit in i32"),
        (q, k, w, st, en, {"order": "best"}, True, ValueError, r"invalid order: 'best' \(expected score\|index\)"),
        (q, k, w, st, en, {"nan": 1}, True, TypeError, "nan must be a str"),
        (q, k, w, st, en, {"page_size": 0}, True, ValueError, "page_size must be in 1"),
        (q, k, w, st, en, {"page_table": tbl}, True, ValueError, "page_table and seq_ids come together"),
        (q, k, w, st, en, {"seq_ids": [0, 0, 0]}, True, ValueError, "page_table and seq_ids come together"),
        (q, k, w, st, en, {**pt, "page_table": tbl.astype(np.int64)}, True,
         TypeError, r"page_table must be int32 \[sequences, max_pages\], got int64"),
        (q, k, w, st, en, {**pt, "page_table": tbl[:, :0]}, True,
         ValueError, "page_table must have at least one sequence and one page"),
        (q, k, w, st, en, {**pt, "seq_ids": [0, 1]}, True, ValueError, r"seq_ids must be 1-D with 3 entries"),
        (q, k, w, [0, 0, 0], [50, 5, 5], {**pt, "seq_ids": [0, 2, 0]}, True,
         ValueError, r"seq_ids\[1\] = 2 is outside 0..2"),
        (q, k, w, [0, 0, 0], [50, 5, 5], {**pt, "page_size": 16}, True,
         ValueError, "token 32 is on page 2 but page_table has 2 pages a sequence"),
        (q, k, w, [0, 0, 0], [50, 5, 5], {**pt, "page_table": np.array([[0, -1], [2, 3]], np.int32)}, True,
         ValueError, r"page_table\[0, 1\] = -1"),
    ]  # fmt: skip


@pytest.mark.parametrize("i", range(len(_bad_cases())))
def test_errors(i):
    q, k, w, st, en, kw, indexer_only, exc, msg = _bad_cases()[i]
    if not indexer_only:
        with pytest.raises(exc, match=msg):
            flashsel.dsa_scores(q, k, w, st, en, **kw)
    with pytest.raises(exc, match=msg):
        flashsel.dsa_indexer(q, k, w, st, en, **kw)


def test_keyword_only_options():
    q, k, w, st, en, ks = case(scale=True)
    with pytest.raises(TypeError):
        flashsel.dsa_scores(q, k, w, st, en, ks)  # k_scale is keyword-only
    with pytest.raises(TypeError):
        flashsel.dsa_indexer(q, k, w, st, en, 16)  # topk is keyword-only


# ---------------------------------------------------------------------------
# torch: CPU tensors, the operators flashsel::dsa_scores and flashsel::dsa_indexer
# ---------------------------------------------------------------------------


@pytest.fixture
def ops():
    from flashsel import _torch_ops  # noqa: F401 - registers the operators

    torch._dynamo.reset()
    yield torch.ops.flashsel.dsa_scores.default, torch.ops.flashsel.dsa_indexer.default
    torch._dynamo.reset()


def to_torch(x, kind):
    """A NumPy input of `kind` ("f32", "bf16" bits, "fp8" bits) as a tensor."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    if kind == "bf16":
        return t.view(torch.bfloat16)
    if kind == "fp8":
        return t.view(torch.float8_e4m3fn)
    return t


def tcase(rows=5, heads=4, d=64, n=120, qk=("f32", "f32"), seed=0, scale=False, int64=False):
    q, k, w, st, en, ks = case(rows, heads, d, n, qk, seed, scale)
    it = torch.int64 if int64 else torch.int32
    tks = None if ks is None else torch.from_numpy(ks)
    np_args = (q, k, w, st, en, ks)
    targs = (to_torch(q, qk[0]), to_torch(k, qk[1]), torch.from_numpy(w), torch.from_numpy(st).to(it),
             torch.from_numpy(en).to(it), tks)  # fmt: skip
    return np_args, targs


def tbits(t):
    t = t.contiguous()
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def assert_same_tensors(got, want, ctx=""):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want), ctx
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device, f"{ctx}: {g.dtype} {g.shape}"
        assert torch.equal(tbits(g), tbits(w)), f"bytes differ {ctx}"


@needs_torch
@pytest.mark.parametrize("qd", DTYPES)
@pytest.mark.parametrize("kd", DTYPES)
def test_torch_cpu_tensors_match_numpy_bit_for_bit(ops, qd, kd):
    np_args, t_args = tcase(qk=(qd, kd), seed=15, scale=kd == "fp8", int64=qd == "bf16")
    (q, k, w, st, en, ks), (tq, tk, tw, tst, ten, tks) = np_args, t_args
    s = flashsel.dsa_scores(tq, tk, tw, tst, ten, k_scale=tks)
    assert isinstance(s, torch.Tensor) and s.dtype == torch.float32
    assert_same_bits(s.numpy(), flashsel.dsa_scores(q, k, w, st, en, k_scale=ks))
    got = flashsel.dsa_indexer(tq, tk, tw, tst, ten, topk=50, k_scale=tks, order="score", return_values=True)
    want = flashsel.dsa_indexer(q, k, w, st, en, topk=50, k_scale=ks, order="score", return_values=True)
    assert_same_bits(tuple(x.numpy() for x in got), want)
    ids = flashsel.dsa_indexer(tq, tk[:, None], tw, tst, ten, topk=50, k_scale=tks)
    assert_same_bits(ids.numpy(), flashsel.dsa_indexer(q, k, w, st, en, topk=50, k_scale=ks))


@needs_torch
def test_torch_page_table_and_host_forms(ops):
    (q, k, w, st, en, _), (tq, tk, tw, tst, ten, _) = tcase(n=128, seed=16)
    table = np.arange(8, dtype=np.int32)[::-1].reshape(2, 4).copy()
    seqs = np.array([1, 0, 0, 1, 1], np.int32)
    want = flashsel.dsa_indexer(q, k, w, st, en, topk=9, page_table=table, page_size=32, seq_ids=seqs)
    got = flashsel.dsa_indexer(tq, tk, tw, tst, ten, topk=9, page_table=torch.from_numpy(table), page_size=32,
                               seq_ids=torch.from_numpy(seqs))  # fmt: skip
    assert_same_bits(got.numpy(), want)
    assert_same_bits(flashsel.topk(flashsel.dsa_scores(tq, tk, tw, tst, ten), 9, starts=tst, lengths=ten,
                                   order="index", page_table=torch.from_numpy(table), page_size=32,
                                   seq_ids=torch.from_numpy(seqs)).numpy(), want)  # fmt: skip
    # Host forms beside a tensor q run the eager path: the same bytes.
    got = flashsel.dsa_indexer(tq, tk, w, st.tolist(), en, topk=9, page_table=table, page_size=32, seq_ids=seqs)
    assert isinstance(got, torch.Tensor)
    assert_same_bits(got.numpy(), want)
    assert_same_bits(flashsel.dsa_scores(tq, k, tw, st, ten).numpy(), flashsel.dsa_scores(q, k, w, st, en))


@needs_torch
def test_torch_operator_schemas(ops):
    s = str(ops[0]._schema)
    assert s == (
        "flashsel::dsa_scores(Tensor q, Tensor k, Tensor weights, Tensor starts, Tensor ends, "
        "Tensor? k_scale=None, Tensor? page_table=None, SymInt page_size=64, Tensor? seq_ids=None) -> Tensor"
    ), s
    s = str(ops[1]._schema)
    assert s == (
        "flashsel::dsa_indexer(Tensor q, Tensor k, Tensor weights, Tensor starts, Tensor ends, SymInt topk=2048, "
        'Tensor? k_scale=None, str order="index", str nan="lowest", bool return_values=False, '
        "Tensor? page_table=None, SymInt page_size=64, Tensor? seq_ids=None, bool? slots=None) "
        "-> (Tensor ids, Tensor values)"
    ), s
    for op in ops:
        assert torch.Tag.pt2_compliant_tag in op.tags


@needs_torch
def test_torch_registration_comes_with_the_first_tensor_call():
    code = (
        "import flashsel, torch\n"
        "print(hasattr(torch.ops.flashsel, 'dsa_indexer'))\n"
        "q = torch.zeros(1, 2, 64); k = torch.zeros(4, 64); w = torch.zeros(1, 2)\n"
        "r = torch.zeros(1, dtype=torch.int32)\n"
        "print(tuple(flashsel.dsa_indexer(q, k, w, r, r + 4, topk=8).shape) == (1, 8))\n"
        "print(hasattr(torch.ops.flashsel, 'dsa_scores'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["False", "True", "True"]


@needs_torch
def test_torch_public_functions_call_the_operators(ops):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    _, (q, k, w, st, en, ks) = tcase(scale=True)
    with Calls() as c:
        s = flashsel.dsa_scores(q, k, w, st, en, k_scale=ks)
        ids = flashsel.dsa_indexer(q, k, w, st, en, topk=10, k_scale=ks)
    assert "flashsel.dsa_scores.default" in c.names and "flashsel.dsa_indexer.default" in c.names
    assert_same_tensors(s, ops[0](q, k, w, st, en, ks))
    assert_same_tensors(ids, ops[1](q, k, w, st, en, 10, ks)[0])
    assert ops[1](q, k, w, st, en, 10, ks)[1].shape == (0,)


def _samples():
    out = []
    (_, (q, k, w, st, en, ks)) = tcase(qk=("bf16", "fp8"), scale=True, seed=17)
    out.append(((q, k, w, st, en, ks), (q, k, w, st, en, 30, ks, "score", "largest", True)))
    (_, (q, k, w, st, en, _)) = tcase(heads=8, d=128, qk=("f32", "bf16"), int64=True, seed=18)
    out.append(((q, k, w, st, en), (q, k, w, st, en, 2048)))
    (_, (q, k, w, st, en, _)) = tcase(heads=1, d=256, n=64, qk=("fp8", "f32"), seed=19)
    table = torch.tensor([[1, 0], [3, 2]], dtype=torch.int32)
    seqs = torch.tensor([0, 1, 1, 0, 1], dtype=torch.int32)
    out.append(((q, k[:, None], w, st, en), (q, k, w, st, en, 7, None, "index", "lowest", False, table, 32, seqs)))
    # The paged key cache (uint8, DeepGEMM's shape), slots and token ids.
    q, w, st, en, seqs, _, _, cache, table = (torch.from_numpy(x) if isinstance(x, np.ndarray) else x
                                              for x in paged_case(rows=5, heads=3, d=64, ps=16, seed=20))  # fmt: skip
    c4 = cache.reshape(-1, 16, 1, 68)
    q = q.view(torch.bfloat16)
    out.append(((q, c4, w, st, en, None, table, 16, seqs),
                (q, c4, w, st, en, 9, None, "score", "lowest", True, table, 16, seqs, False)))  # fmt: skip
    out.append(((q, cache, w, st.long(), en.long(), None, table, 16, seqs),
                (q, cache.reshape(-1), w, st, en, 2048, None, "index", "lowest", False, table, 16, seqs)))  # fmt: skip
    return out


@needs_torch
@pytest.mark.parametrize("i", range(5))
def test_torch_opcheck(ops, i):
    s_args, i_args = _samples()[i]
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in s_args):
        # test_schema multiplies the inputs, which torch does not do for fp8 on the CPU.
        utils = utils[1:]
    torch.library.opcheck(ops[0], s_args, test_utils=utils)
    torch.library.opcheck(ops[1], i_args, test_utils=utils)


@needs_torch
def test_torch_fake_outputs_and_meta(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    for op_args in _samples():
        for op, args in zip(ops, op_args):
            want = op(*args)
            with FakeTensorMode() as mode:
                got = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            assert [(g.shape, g.dtype, g.stride()) for g in got] == [(w.shape, w.dtype, w.stride()) for w in want]
    _, (q, k, w, st, en, _) = tcase()
    m = lambda *ts: [t.to("meta") for t in ts]  # noqa: E731
    s = ops[0](*m(q, k, w, st, en))
    assert s.device.type == "meta" and s.shape == (5, 120) and s.dtype == torch.float32
    ids, vals = ops[1](*m(q, k, w, st, en), 33, None, "index", "lowest", True)
    assert ids.device.type == "meta" and ids.shape == (5, 33) and ids.dtype == torch.int32 and vals.shape == (5, 33)


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e), str(e)
    return None


TORCH_BAD = 27


def _torch_bad():
    """(which, args): "both" are the scores' arguments (the indexer's with
    topk 16 inserted), "indexer" the indexer's."""
    _, (q, k, w, st, en, ks) = tcase(rows=3, n=50, scale=True)
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt)  # noqa: E731
    tbl = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    seqs = torch.tensor([0, 1, 0], dtype=torch.int32)
    both = [
        (q[0], k, w, st, en),
        (q.half(), k, w, st, en),
        (q, k.double(), w, st, en),
        (q, k.view(torch.uint8), w, st, en),
        (q, k[None], w, st, en),
        (q, z(50, 2, 64), w, st, en),
        (q, k[:, :32], w, st, en),
        (q, z(50, 128)[:, :64], w, st, en),
        (q[..., :32], z(50, 32), w, st, en),
        (z(3, 129, 64), k, z(3, 129), st, en),
        (q, k, w.double(), st, en),
        (q, k, w[:, :1], st, en),
        (q, k, w, st, en, ks.double()),
        (q, k, w, st, en, ks[:10]),
        (q, k, w, st.float(), en),
        (q, k, w, st[:2], en),
        (q, k, w, st, en.reshape(1, 3)),
    ]
    indexer = [
        (0,),
        (2**30,),
        (10, None, "best"),
        (10, None, "index", "most"),
        (10, None, "index", "lowest", False, tbl),
        (10, None, "index", "lowest", False, None, 64, seqs),
        (10, None, "index", "lowest", False, tbl.long(), 64, seqs),
        (10, None, "index", "lowest", False, tbl[:0], 64, seqs),
        (10, None, "index", "lowest", False, tbl, 64, seqs[:2]),
        (10, None, "index", "lowest", False, tbl, 0, seqs),
    ]
    return [("both", a) for a in both] + [("indexer", (q, k, w, st, en, *a)) for a in indexer]


@needs_torch
@pytest.mark.parametrize("j", range(TORCH_BAD))
def test_torch_fake_errors_match_eager(ops, j):
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = _torch_bad()
    assert len(cases) == TORCH_BAD
    which, args = cases[j]
    calls = [(ops[1], args)] if which == "indexer" else [(ops[0], args), (ops[1], (*args[:5], 16, *args[5:]))]
    for op, a in calls:
        want = _error(lambda: op(*a))
        assert want is not None, "the eager call must fail"

        def fake():
            with FakeTensorMode() as mode:
                op(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in a])

        assert _error(fake) == want, op


@needs_torch
def test_torch_value_errors_come_when_the_operator_runs(ops):
    _, (q, k, w, st, en, _) = tcase(rows=3, n=50)
    bad = torch.tensor([0, 3, 0], dtype=torch.int32), torch.tensor([1, 2, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\[3, 2\) at row 1"):
        flashsel.dsa_scores(q, k, w, *bad)
    f = torch.compile(lambda a, s, e: flashsel.dsa_indexer(a, k, w, s, e, topk=4), fullgraph=True)
    with pytest.raises(ValueError, match=r"\[3, 2\) at row 1"):
        f(q, *bad)
    with pytest.raises(ValueError, match="starts: a value does not fit int32"):
        flashsel.dsa_scores(q, k, w, torch.tensor([0, 2**40, 0]), en.long())


@needs_torch
def test_torch_fake_accepts_cuda_metadata(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, (q, k, w, st, en, ks) = tcase(scale=True)

    def on_cuda(*ts):
        return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in ts]

    with FakeTensorMode():
        args = on_cuda(q, k, w, st, en, ks)
        s = ops[0](*args)
        assert s.device.type == "cuda" and s.shape == (5, 120)
        ids, _ = ops[1](*args[:5], 12, args[5])
        assert ids.device.type == "cuda" and ids.shape == (5, 12)
        # Ranges in host memory are copied over; the keys must be on q's device.
        host = torch.empty(5, dtype=torch.int32)
        assert ops[0](*args[:3], host, host).shape == (5, 120)
        with pytest.raises(ValueError, match="the DSA indexer on CUDA takes q, k, weights and k_scale on one device"):
            ops[0](args[0], torch.empty(k.shape), *args[2:5])


@needs_torch
def test_torch_outputs_never_require_grad(ops):
    _, (q, k, w, st, en, _) = tcase()
    q.requires_grad_(True)
    w.requires_grad_(True)
    assert not flashsel.dsa_scores(q, k, w, st, en).requires_grad
    for o in flashsel.dsa_indexer(q, k, w, st, en, topk=5, return_values=True):
        assert not o.requires_grad


@needs_torch
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"qk": ("bf16", "fp8"), "scale": True},
        {"heads": 64, "d": 128, "qk": ("fp8", "fp8"), "int64": True, "scale": True},
        {"heads": 3, "d": 256, "qk": ("f32", "bf16")},
    ],
)
def test_torch_compile_matches_eager(ops, kw):
    _, (q, k, w, st, en, ks) = tcase(**kw)

    def f(q, k, w, st, en, ks):
        s = flashsel.dsa_scores(q, k, w, st, en, k_scale=ks)
        ids, vals = flashsel.dsa_indexer(q, k, w, st, en, topk=17, k_scale=ks, order="score", return_values=True)
        return s, ids, vals, flashsel.dsa_indexer(q, k, w, st, en, topk=9, k_scale=ks)

    want = f(q, k, w, st, en, ks)
    assert_same_tensors(torch.compile(f, fullgraph=True)(q, k, w, st, en, ks), want, "compiled")


@needs_torch
def test_torch_compile_dynamic_shapes_paged_and_in_a_larger_graph(ops):
    table = torch.tensor([[5, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5]], dtype=torch.int32)

    def f(q, k, w, st, en, seqs):
        # Exact operations around the operators.
        s = flashsel.dsa_scores(q * 2.0, k, w, st, en)
        ids = flashsel.dsa_indexer(q, k, w * 0.5, st, en, topk=12, page_table=table, page_size=32, seq_ids=seqs)
        return torch.where(torch.isinf(s), 0.0, s), ids + 1

    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    for dyn in (None, True):
        cf = torch.compile(f, fullgraph=True, dynamic=dyn)
        for rows, n in [(3, 150), (5, 192), (2, 100)]:
            _, (q, k, w, st, en, _) = tcase(rows=rows, n=n, seed=rows)
            seqs = torch.tensor([r % 2 for r in range(rows)], dtype=torch.int32)
            args = (q, k, w, st, en, seqs)
            assert_same_tensors(cf(*args), f(*args), f"dynamic={dyn} {rows} {n}")
    torch.compile(f, fullgraph=True, backend=backend)(*args)
    assert "flashsel.dsa_scores.default" in seen and "flashsel.dsa_indexer.default" in seen


@needs_torch
def test_torch_compile_errors_carry_the_eager_message(ops):
    _, (q, k, w, st, en, _) = tcase()
    with pytest.raises(Exception, match="weights must be float32, got float64"):
        torch.compile(lambda a, b: flashsel.dsa_scores(a, k, b, st, en), fullgraph=True)(q, w.double())
    with pytest.raises(Exception, match="invalid heads"):
        torch.compile(lambda a, b: flashsel.dsa_indexer(a, k, b, st, en), fullgraph=True)(
            torch.zeros(5, 129, 64), torch.zeros(5, 129)
        )


# ---------------------------------------------------------------------------
# torch: the paged key cache
# ---------------------------------------------------------------------------


def tpaged(**kw):
    """paged_case as CPU tensors (q as its torch dtype, the cache uint8
    [P, ps, 1, d + 4]), and the NumPy arrays."""
    qd = kw.get("qd", "bf16")
    np_args = paged_case(**kw)
    q, w, st, en, seqs, ks, scs, cache, table = np_args
    ps, d = kw.get("ps", 16), q.shape[2]
    t = (to_torch(q, qd), torch.from_numpy(w), torch.from_numpy(st), torch.from_numpy(en), torch.from_numpy(seqs),
         torch.from_numpy(cache).reshape(-1, ps, 1, d + 4), torch.from_numpy(table))  # fmt: skip
    return np_args, t


@needs_torch
@pytest.mark.parametrize("qd", DTYPES)
def test_torch_paged_matches_numpy(ops, qd):
    (q, w, st, en, seqs, _, _, cache, table), (tq, tw, tst, ten, tseqs, tc, ttable) = tpaged(qd=qd, seed=21)
    kw = dict(page_table=table, page_size=16, seq_ids=seqs)
    tkw = dict(page_table=ttable, page_size=16, seq_ids=tseqs)
    want = flashsel.dsa_scores(q, cache, w, st, en, **kw)
    for k in (tc, tc.view(torch.float8_e4m3fn), tc.reshape(tc.shape[0], -1)):
        s = flashsel.dsa_scores(tq, k, tw, tst, ten, **tkw)
        assert isinstance(s, torch.Tensor) and s.shape == (9, 96)
        assert_same_bits(s.numpy(), want)
    for slots in (None, True, False):
        want = flashsel.dsa_indexer(q, cache, w, st, en, topk=20, return_values=True, slots=slots, **kw)
        got = flashsel.dsa_indexer(tq, tc, tw, tst.long(), ten, topk=20, return_values=True, slots=slots, **tkw)
        assert_same_bits(tuple(x.numpy() for x in got), want)
    # Host page arguments beside a tensor q run the eager path: the same bytes.
    got = flashsel.dsa_indexer(tq, tc, tw, tst, ten, topk=20, **kw)
    assert isinstance(got, torch.Tensor)
    assert_same_bits(got.numpy(), flashsel.dsa_indexer(q, cache, w, st, en, topk=20, **kw))


@needs_torch
def test_torch_paged_calls_the_operators(ops):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append((str(func), args))
            return func(*args, **(kwargs or {}))

    _, (q, w, st, en, seqs, c, table) = tpaged(seed=22)
    with Calls() as m:
        flashsel.dsa_scores(q, c, w, st, en, page_table=table, page_size=16, seq_ids=seqs)
        flashsel.dsa_indexer(q, c, w, st, en, topk=10, page_table=table, page_size=16, seq_ids=seqs, slots=False)
    names = [n for n, _ in m.calls]
    assert "flashsel.dsa_scores.default" in names and "flashsel.dsa_indexer.default" in names
    args = dict(m.calls)["flashsel.dsa_indexer.default"]
    assert args[-1] is False and args[-2] is seqs and args[-3] == 16 and args[-4] is table


def _torch_paged_bad():
    """(op index, args) of paged requests each operator refuses, with the
    eager message."""
    _, (q, w, st, en, seqs, c, table) = tpaged(rows=3, seed=23)
    pk = (table, 16, seqs)
    k = torch.zeros(96, 64, dtype=torch.float8_e4m3fn)
    return [
        (0, (q, c, w, st, en, torch.ones(96), *pk)),
        (0, (q, c, w, st, en, None, table, 8, seqs)),
        (0, (q, c.float(), w, st, en, None, *pk)),
        (0, (q, c.view(torch.int8), w, st, en, None, *pk)),
        (0, (q, c[..., :-1], w, st, en, None, *pk)),
        (0, (q, c.reshape(-1)[:-3], w, st, en, None, *pk)),
        (0, (q, c[:0], w, st, en, None, *pk)),
        (0, (q, c[::2], w, st, en, None, *pk)),
        (0, (q, c, w, st, en, None, table.long(), 16, seqs)),
        (0, (q, c, w, st, en, None, table, 16, seqs[:2])),
        (0, (q, c, w, st, en, None, table, 16, None)),
        (0, (q, c, w, st, en, None, table, 0, seqs)),
        (0, (q, c, w, st, en)),
        (0, (q, k, w, st, en, None, *pk)),
        (1, (q, c, w, st, en, 8, torch.ones(96), "index", "lowest", False, *pk)),
        (1, (q, c, w, st, en, 8, None, "index", "lowest", False, table, 32, seqs)),
        (1, (q, k, w, st, en, 8, None, "index", "lowest", False, *pk, False)),
        (1, (q, c, w, st, en, 8, None, "index", "lowest", False, None, 16, None, True)),
        (1, (q, c.reshape(-1)[:-3], w, st, en, 8, None, "index", "lowest", False, *pk, False)),
    ]


TORCH_PAGED_BAD = 19


@needs_torch
@pytest.mark.parametrize("j", range(TORCH_PAGED_BAD))
def test_torch_paged_fake_errors_match_eager(ops, j):
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = _torch_paged_bad()
    assert len(cases) == TORCH_PAGED_BAD
    i, a = cases[j]
    want = _error(lambda: ops[i](*a))
    assert want is not None, "the eager call must fail"
    assert want[0] in (TypeError, ValueError), want

    def fake():
        with FakeTensorMode() as mode:
            ops[i](*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in a])

    assert _error(fake) == want


@needs_torch
def test_torch_paged_value_errors_come_when_the_operator_runs(ops):
    _, (q, w, st, en, seqs, c, table) = tpaged(rows=3, seed=24)
    bad = table.clone()
    bad[seqs[0], 0] = 50  # past the cache's 11 pages
    st[0] = 0
    with pytest.raises(ValueError, match="row 0: token 0 is on page 50 but the key cache has 11 pages"):
        flashsel.dsa_scores(q, c, w, st, en, page_table=bad, page_size=16, seq_ids=seqs)
    f = torch.compile(lambda t: flashsel.dsa_indexer(q, c, w, st, en, topk=4, page_table=t, page_size=16,
                                                     seq_ids=seqs), fullgraph=True)  # fmt: skip
    with pytest.raises(ValueError, match="row 0: token 0 is on page 50"):
        f(bad)


@needs_torch
def test_torch_paged_fake_accepts_cuda_metadata(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, (q, w, st, en, seqs, c, table) = tpaged(seed=25)

    def on_cuda(*ts):
        return [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in ts]

    with FakeTensorMode():
        q, w, st, en, seqs, c, table = on_cuda(q, w, st, en, seqs, c, table)
        s = ops[0](q, c, w, st, en, None, table, 16, seqs)
        assert s.device.type == "cuda" and s.shape == (9, 96)
        ids, _ = ops[1](q, c, w, st, en, 12, None, "index", "lowest", False, table, 16, seqs, False)
        assert ids.device.type == "cuda" and ids.shape == (9, 12)
        with pytest.raises(ValueError, match="the DSA indexer on CUDA takes q, k, weights and k_scale on one device"):
            ops[0](q, torch.empty(c.shape, dtype=torch.uint8), w, st, en, None, table, 16, seqs)


@needs_torch
def test_torch_compile_paged_matches_eager(ops):
    def f(q, c, w, st, en, table, seqs):
        s = flashsel.dsa_scores(q, c, w, st, en, page_table=table, page_size=16, seq_ids=seqs)
        ids, vals = flashsel.dsa_indexer(q, c, w, st, en, topk=17, order="score", return_values=True,
                                         page_table=table, page_size=16, seq_ids=seqs)  # fmt: skip
        tok = flashsel.dsa_indexer(q, c, w, st, en, topk=9, page_table=table, page_size=16, seq_ids=seqs,
                                   slots=False)  # fmt: skip
        return torch.where(torch.isinf(s), 0.0, s), ids, vals, tok + 1

    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    for dyn in (None, True):
        cf = torch.compile(f, fullgraph=True, dynamic=dyn)
        for rows, max_pages, seed in [(3, 6, 26), (5, 8, 27), (4, 5, 28)]:
            _, (q, w, st, en, seqs, c, table) = tpaged(rows=rows, max_pages=max_pages, seed=seed)
            args = (q, c, w, st, en, table, seqs)
            assert_same_tensors(cf(*args), f(*args), f"dynamic={dyn} {rows} {max_pages}")
    torch.compile(f, fullgraph=True, backend=backend)(*args)
    assert "flashsel.dsa_scores.default" in seen and "flashsel.dsa_indexer.default" in seen
