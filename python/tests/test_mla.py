"""flashsel.sparse_mla_prefill / sparse_mla_decode (the CPU float64 reference)
against an independent NumPy float64 implementation of FlashMLA's semantics
written here, and the semantic cases of docs/semantics.md ("Sparse MLA
attention"): empty rows, invalid tails, topk_length (given, random, derived),
a valid index after invalid ones, sinks, duplicates, every head count, NaN in
unreferenced KV rows, the paged fp8 (656-byte) and bf16 caches, every e4m3
code, output kinds, and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashsel

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
INVALID = [INT_MIN, -123456, -1, 114514, 1919810, 2147480000, INT_MAX]  # and s_kv, per case

# FlashMLA's tolerances (out; lse and max_logits), checked as its
# kernelkit.check_is_allclose does.
OUT_TOL = dict(abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
LSE_TOL = dict(abs_tol=1e-6, rel_tol=2.01 / 65536, cos_diff_tol=1e-7)


# ---------------------------------------------------------------------------
# The independent reference (float64, NumPy)
# ---------------------------------------------------------------------------


def ref_rows(q, keys_per_row, scale, sink=None):
    """q float64 [R, h_q, d_qk]; keys_per_row: R arrays [n_r, d_qk] (the
    attended entries). Returns out [R, h_q, 512], max_logits [R, h_q], lse [R, h_q]."""
    rows, h_q, _ = q.shape
    out = np.zeros((rows, h_q, 512))
    mx = np.full((rows, h_q), -np.inf)
    lse = np.full((rows, h_q), np.inf)
    for r, keys in enumerate(keys_per_row):
        if len(keys) == 0:
            continue
        p = scale * (q[r] @ keys.T)  # [h_q, n]
        m = p.max(axis=1)
        l = m + np.log(np.exp(p - m[:, None]).sum(axis=1))
        o = np.exp(p - l[:, None]) @ keys[:, :512]
        if sink is not None:
            o *= (1.0 / (1.0 + np.exp(sink.astype(np.float64) - l)))[:, None]
        out[r], mx[r], lse[r] = o, m, l
    return out, mx, lse


def ref_prefill(q, kv, indices, scale, sink=None, lengths=None):
    """FlashMLA's definition: entries < 0, >= s_kv or past topk_length contribute nothing."""
    q = np.asarray(q, np.float64)
    kv = np.asarray(kv, np.float64).reshape(kv.shape[0], -1)
    idx = np.asarray(indices).reshape(q.shape[0], -1)
    s_kv, topk = kv.shape[0], idx.shape[1]
    keys = []
    for r in range(q.shape[0]):
        n = topk if lengths is None else int(lengths[r])
        row = idx[r, :n]
        row = row[(row >= 0) & (row < s_kv)]
        keys.append(kv[row])
    return ref_rows(q, keys, float(np.float32(scale)), sink)


def check_close(ans, ref, abs_tol, rel_tol, cos_diff_tol):
    """FlashMLA's kernelkit.check_is_allclose, in float64."""
    ans = np.array(ans, np.float64)
    ref = np.array(ref, np.float64)
    assert ans.shape == ref.shape
    for pick in (lambda a: a == np.inf, lambda a: a == -np.inf, np.isnan):
        ma, mr = pick(ans), pick(ref)
        np.testing.assert_array_equal(ma, mr, err_msg="anomaly positions differ")
        ans[ma], ref[mr] = 0.0, 0.0
    err = np.abs(ans - ref)
    ok = (err < abs_tol) | (err / (np.abs(ref) + 1e-6) < rel_tol)
    assert ok.all(), f"{(~ok).sum()} elements off; worst abs err {err.max()}"
    rr = (ref * ref).sum()
    cos = 0.0 if rr < 1e-12 else 1 - 2 * (ans * ref).sum() / ((ans * ans).sum() + rr)
    assert abs(cos) <= cos_diff_tol, cos


def bf16(x):
    return np.asarray(x, np.float32).astype(BF16)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def prefill_case(s_q, s_kv, h_q, d_qk, topk, seed, dtype=BF16):
    rng = np.random.default_rng(seed)
    q = randn(rng, s_q, h_q, d_qk).astype(dtype)
    kv = randn(rng, s_kv, 1, d_qk).astype(dtype)
    idx = rng.integers(0, max(s_kv, 1), (s_q, 1, topk)).astype(np.int32)
    return q, kv, idx, rng


def assert_bits_equal(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.ascontiguousarray(x).view(np.uint8), np.ascontiguousarray(y).view(np.uint8))


def check_against_ref(got, want, exact_f32=False):
    out, mx, lse = got
    w_out, w_mx, w_lse = want
    check_close(out.astype(np.float32), w_out, **OUT_TOL)
    check_close(mx, w_mx, **LSE_TOL)
    check_close(lse, w_lse, **LSE_TOL)
    if exact_f32:  # float32 outputs are the float64 result rounded once
        np.testing.assert_allclose(out, w_out, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------
# Prefill
# ---------------------------------------------------------------------------


def test_hand_computed_example():
    q = np.zeros((1, 1, 512), np.float32)
    q[0, 0, 0] = 1.0
    kv = np.zeros((3, 1, 512), np.float32)
    kv[0, 0, :2] = [1.0, 2.0]  # key a: logit 1
    kv[1, 0, 1] = 4.0  # key b: logit 0
    kv[2] = np.nan  # never attended
    idx = np.array([[[0, -1, 1]]], np.int32)
    out, mx, lse = flashsel.sparse_mla_prefill(q, kv, idx, 1.0)
    e = math.e
    assert out.dtype == np.float32 and out.shape == (1, 1, 512)
    assert mx.dtype == lse.dtype == np.float32 and mx.shape == lse.shape == (1, 1)
    assert mx[0, 0] == 1.0
    assert lse[0, 0] == np.float32(math.log(e + 1))
    assert out[0, 0, 0] == np.float32(e / (e + 1)) and out[0, 0, 1] == np.float32((2 * e + 4) / (e + 1))
    assert not out[0, 0, 2:].any()
    out, mx2, lse2 = flashsel.sparse_mla_prefill(q, kv, idx, 1.0, attn_sink=np.zeros(1, np.float32))
    assert out[0, 0, 0] == np.float32(e / (e + 2)) and (mx2, lse2) == (mx, lse)


@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "bf16-bits"])
def test_random_cases_match_the_numpy_reference(d_qk, dtype):
    s_q, s_kv, h_q, topk = 7, 150, 4, 48
    np_dtype = np.float32 if dtype == "f32" else BF16
    q, kv, idx, rng = prefill_case(s_q, s_kv, h_q, d_qk, topk, 1, np_dtype)
    idx[0, 0, 5] = -1
    idx[1, 0, 10:] = s_kv  # tail
    idx[2, 0, :] = -1  # empty
    sink = rng.standard_normal(h_q).astype(np.float32)
    lens = rng.integers(0, topk + 1, s_q).astype(np.int32)
    scale = d_qk**-0.5
    qa, kva = (q.view(np.uint16), kv.view(np.uint16)) if dtype == "bf16-bits" else (q, kv)
    for kw in [{}, {"attn_sink": sink}, {"topk_length": lens}, {"attn_sink": sink, "topk_length": lens}]:
        got = flashsel.sparse_mla_prefill(qa, kva, idx, scale, **kw)
        assert got[0].dtype == qa.dtype and got[0].shape == (s_q, h_q, 512)
        out = got[0].view(BF16) if dtype == "bf16-bits" else got[0]
        want = ref_prefill(q, kv, idx, scale, kw.get("attn_sink"), kw.get("topk_length"))
        check_against_ref((out, got[1], got[2]), want, exact_f32=dtype == "f32")
        np.testing.assert_allclose(got[2], want[2], rtol=1e-6)


def test_bf16_out_is_the_float64_result_rounded_once():
    q, kv, idx, _ = prefill_case(3, 40, 2, 512, 16, 2)
    out_bf, mx, lse = flashsel.sparse_mla_prefill(q, kv, idx, 0.05)
    out32, mx32, lse32 = flashsel.sparse_mla_prefill(q.astype(np.float32), kv.astype(np.float32), idx, 0.05)
    np.testing.assert_array_equal(mx, mx32)
    np.testing.assert_array_equal(lse, lse32)
    # bf16(f64) and bf16(f32(f64)) agree except at rare double-rounding ties.
    assert (out_bf.astype(np.float32) != out32.astype(BF16).astype(np.float32)).mean() < 1e-3


def test_empty_rows():
    q, kv, idx, _ = prefill_case(4, 32, 3, 576, 8, 3)
    idx[0] = -1
    idx[1] = [[32, 114514, INT_MIN, -5, INT_MAX, 33, -1, 40]]
    lens = np.array([8, 8, 0, 8], np.int32)
    for sink in [None, np.array([0.5, np.inf, -np.inf], np.float32)]:
        out, mx, lse = flashsel.sparse_mla_prefill(q, kv, idx, 0.1, attn_sink=sink, topk_length=lens)
        for r in (0, 1, 2):
            assert not out[r].astype(np.float32).any()
            assert (lse[r] == np.inf).all() and (mx[r] == -np.inf).all()
        assert np.isfinite(lse[3]).all()


@pytest.mark.parametrize("bad", INVALID + ["s_kv", "s_kv+1"])
def test_invalid_tails_are_ignored_and_never_read(bad):
    s_q, s_kv, topk, valid = 4, 70, 24, 9
    q, kv, idx, _ = prefill_case(s_q, s_kv, 2, 576, topk, 4)
    b = {"s_kv": s_kv, "s_kv+1": s_kv + 1}.get(bad, bad)
    idx[:, :, valid:] = b
    kv = kv.astype(np.float32)
    used = np.zeros(s_kv, bool)
    used[idx[:, 0, :valid].ravel()] = True
    kv[~used] = np.nan  # every unreferenced row poisoned
    kv = kv.astype(BF16)
    got = flashsel.sparse_mla_prefill(q, kv, idx, 0.04)
    assert np.isfinite(got[0].astype(np.float32)).all()
    short = flashsel.sparse_mla_prefill(q, kv, np.ascontiguousarray(idx[:, :, :valid]), 0.04)
    assert_bits_equal(got, short)
    check_against_ref(got, ref_prefill(q, kv, idx, 0.04))


def test_random_topk_length_and_nan_past_it():
    s_q, s_kv, topk = 9, 100, 40
    q, kv, idx, rng = prefill_case(s_q, s_kv, 3, 512, topk, 5)
    lens = rng.integers(0, topk + 1, s_q).astype(np.int32)
    kvf = kv.astype(np.float32)
    used = np.zeros(s_kv, bool)
    for r in range(s_q):
        used[idx[r, 0, : lens[r]]] = True
    kvf[~used] = np.nan  # rows only past a length: valid indices there must not be read
    kv = kvf.astype(BF16)
    got = flashsel.sparse_mla_prefill(q, kv, idx, 0.05, topk_length=lens)
    assert np.isfinite(got[0].astype(np.float32)).all() and not np.isnan(got[2]).any()
    masked = idx.copy()
    for r in range(s_q):
        masked[r, 0, lens[r] :] = -1
    assert_bits_equal(got, flashsel.sparse_mla_prefill(q, kv, masked, 0.05))
    check_against_ref(got, ref_prefill(q, kv, idx, 0.05, lengths=lens))
    # int64 lengths are accepted; a Python list too.
    assert_bits_equal(got, flashsel.sparse_mla_prefill(q, kv, idx, 0.05, topk_length=lens.astype(np.int64)))
    assert_bits_equal(got, flashsel.sparse_mla_prefill(q, kv, idx, 0.05, topk_length=lens.tolist()))


def derived_lengths(idx, bound):
    """One past the last in-range index of each row (0 if none): seed 000's rule."""
    rows = idx.reshape(idx.shape[0], -1)
    ok = (rows >= 0) & (rows < bound)
    last = np.where(ok.any(axis=1), rows.shape[1] - np.argmax(ok[:, ::-1], axis=1), 0)
    return last.astype(np.int32)


def test_derived_topk_length_is_bit_identical_to_passing_it():
    s_q, s_kv, topk = 32, 300, 128
    q, kv, idx, rng = prefill_case(s_q, s_kv, 4, 576, topk, 6)
    layouts = {"valid": idx.copy()}
    ramp = idx.copy()
    for r in range(s_q):  # seed 000's ramp: ceil((topk - 1) * r / (s_q - 1)) + 1 valid, then -1
        ramp[r, 0, math.ceil((topk - 1) * r / (s_q - 1)) + 1 :] = -1
    layouts["ramp-padded"] = ramp
    scattered = idx.copy()
    u = rng.random(scattered.shape)
    scattered[u < 0.25] = -1
    scattered[(u >= 0.25) & (u < 0.5)] = s_kv + 7
    layouts["scattered"] = scattered
    layouts["all invalid"] = np.full_like(idx, -1)
    tails = idx.copy()
    for r in range(s_q):
        n = rng.integers(0, topk)
        tails[r, 0, n:] = [INVALID[p % 7] if p % 8 != 7 else s_kv for p in range(topk - n)]
    layouts["tails"] = tails
    sink = np.array([0.3, -np.inf, np.inf, -2.0], np.float32)
    for name, ix in layouts.items():
        lens = derived_lengths(ix, s_kv)
        for s in (None, sink):
            a = flashsel.sparse_mla_prefill(q, kv, ix, 0.04, attn_sink=s)
            b = flashsel.sparse_mla_prefill(q, kv, ix, 0.04, attn_sink=s, topk_length=lens)
            assert_bits_equal(a, b)
        check_against_ref(a, ref_prefill(q, kv, ix, 0.04, sink))


def test_a_valid_index_after_invalid_ones_is_attended():
    q, kv, _, _ = prefill_case(1, 30, 2, 512, 6, 7)
    got = flashsel.sparse_mla_prefill(q, kv, np.array([[[-1, 30, INT_MIN, 12, -1, -1]]], np.int32), 0.1)
    alone = flashsel.sparse_mla_prefill(q, kv, np.array([[[12]]], np.int32), 0.1)
    assert_bits_equal(got, alone)
    assert np.isfinite(got[2]).all()


def test_sinks_scale_out_only():
    q, kv, idx, _ = prefill_case(5, 60, 4, 512, 16, 8)
    idx[4] = -1
    plain = flashsel.sparse_mla_prefill(q.astype(np.float32), kv.astype(np.float32), idx, 0.05)
    sink = np.array([np.inf, -np.inf, 1.5, -40.0], np.float32)
    out, mx, lse = flashsel.sparse_mla_prefill(q.astype(np.float32), kv.astype(np.float32), idx, 0.05, attn_sink=sink)
    np.testing.assert_array_equal(mx, plain[1])
    np.testing.assert_array_equal(lse, plain[2])
    assert not out[:, 0].any()  # +inf: 0
    np.testing.assert_array_equal(out[:, 1], plain[0][:, 1])  # -inf: unchanged
    assert not out[4].any()  # an empty row stays 0
    f = 1.0 / (1.0 + np.exp(sink[2:].astype(np.float64) - plain[2][:4, 2:].astype(np.float64)))
    np.testing.assert_allclose(out[:4, 2:], plain[0][:4, 2:] * f[..., None], rtol=1e-6, atol=1e-9)


def test_duplicates_are_attended_once_per_occurrence():
    q, kv, _, _ = prefill_case(1, 20, 2, 576, 3, 9)
    f = np.float32
    one = flashsel.sparse_mla_prefill(q, kv, np.array([[[4]]], np.int32), 0.1)
    two = flashsel.sparse_mla_prefill(q, kv, np.array([[[4, 4]]], np.int32), 0.1)
    np.testing.assert_allclose(two[2], one[2] + f(math.log(2)), rtol=1e-6)
    np.testing.assert_array_equal(two[1], one[1])
    three = flashsel.sparse_mla_prefill(q, kv, np.array([[[4, 4, 9]]], np.int32), 0.1)
    check_against_ref(three, ref_prefill(q, kv, np.array([[[4, 4, 9]]]), 0.1))


@pytest.mark.parametrize("h_q", [1, 8, 16, 24, 64, 128])
def test_every_head_count(h_q):
    q, kv, idx, rng = prefill_case(3, 64, h_q, 576, 16, 10 + h_q)
    idx[0, 0, -1] = -1
    sink = rng.standard_normal(h_q).astype(np.float32)
    got = flashsel.sparse_mla_prefill(q, kv, idx, 576**-0.5, attn_sink=sink)
    check_against_ref(got, ref_prefill(q, kv, idx, 576**-0.5, sink))
    # Head h alone gives the same bits.
    h = h_q // 2
    alone = flashsel.sparse_mla_prefill(
        np.ascontiguousarray(q[:, h : h + 1]), kv, idx, 576**-0.5, attn_sink=sink[h : h + 1]
    )
    np.testing.assert_array_equal(alone[0].view(np.uint16)[:, 0], got[0].view(np.uint16)[:, h])
    np.testing.assert_array_equal(alone[2][:, 0], got[2][:, h])


def test_s_kv_smaller_than_topk_and_views():
    q, kv, idx, rng = prefill_case(3, 5, 2, 512, 16, 11)
    idx = rng.integers(-2, 9, idx.shape).astype(np.int32)
    got = flashsel.sparse_mla_prefill(q, kv, idx, 0.1)
    check_against_ref(got, ref_prefill(q, kv, idx, 0.1))
    # Non-contiguous views (copied) and 2-D kv / indices give the same bits.
    wide_q = np.zeros((3, 4, 512), BF16)
    wide_q[:, ::2] = q
    big = np.zeros((10, 1, 600), BF16)
    big[::2, :, :512] = kv
    got2 = flashsel.sparse_mla_prefill(wide_q[:, ::2], big[::2, :, :512], idx[:, 0, :], 0.1)
    assert_bits_equal(got, got2)
    be = flashsel.sparse_mla_prefill(q.astype(np.float32).astype(">f4"), kv.astype(np.float32), idx, 0.1)
    assert_bits_equal(be, flashsel.sparse_mla_prefill(q.astype(np.float32), kv.astype(np.float32), idx, 0.1))


def test_prefill_errors():
    q, kv, idx, _ = prefill_case(2, 8, 4, 512, 4, 12)
    with pytest.raises(ValueError, match="invalid h_q"):
        flashsel.sparse_mla_prefill(np.zeros((2, 129, 512), BF16), kv, idx, 0.1)
    with pytest.raises(ValueError, match="invalid h_q"):
        flashsel.sparse_mla_prefill(np.zeros((2, 0, 512), BF16), kv, idx, 0.1)
    with pytest.raises(ValueError, match="invalid d_qk"):
        flashsel.sparse_mla_prefill(np.zeros((2, 4, 256), BF16), np.zeros((8, 1, 256), BF16), idx, 0.1)
    with pytest.raises(ValueError, match="invalid d_v"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1, d_v=256)
    with pytest.raises(ValueError, match="one KV head"):
        flashsel.sparse_mla_prefill(q, np.zeros((8, 2, 512), BF16), idx, 0.1)
    with pytest.raises(ValueError, match="kv has d_qk = 576 but q has d_qk = 512"):
        flashsel.sparse_mla_prefill(q, np.zeros((8, 1, 576), BF16), idx, 0.1)
    with pytest.raises(ValueError, match="q must be 3-D"):
        flashsel.sparse_mla_prefill(q[0], kv, idx, 0.1)
    with pytest.raises(ValueError, match="indices must be"):
        flashsel.sparse_mla_prefill(q, kv, idx[:1], 0.1)
    with pytest.raises(ValueError, match="invalid topk"):
        flashsel.sparse_mla_prefill(q, kv, np.zeros((2, 1, 0), np.int32), 0.1)
    with pytest.raises(TypeError, match="indices must be int32"):
        flashsel.sparse_mla_prefill(q, kv, idx.astype(np.int64), 0.1)
    with pytest.raises(TypeError, match="same dtype"):
        flashsel.sparse_mla_prefill(q, kv.astype(np.float32), idx, 0.1)
    with pytest.raises(TypeError, match="unsupported dtype float16"):
        flashsel.sparse_mla_prefill(q.astype(np.float16), kv.astype(np.float16), idx, 0.1)
    with pytest.raises(TypeError, match="numpy.ndarray or a torch.Tensor"):
        flashsel.sparse_mla_prefill(q.tolist(), kv, idx, 0.1)
    with pytest.raises(ValueError, match="5 at row 1 \\(topk = 4\\)"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1, topk_length=[1, 5])
    with pytest.raises(ValueError, match="-1 at row 0"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1, topk_length=np.array([-1, 0], np.int32))
    with pytest.raises(ValueError, match="topk_length must be \\[s_q\\]"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1, topk_length=[1])
    with pytest.raises(ValueError, match="fit int32"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1, topk_length=np.array([1, 2**40]))
    with pytest.raises(ValueError, match="attn_sink must be \\[h_q\\]"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1, attn_sink=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="sm_scale must be finite"):
        flashsel.sparse_mla_prefill(q, kv, idx, float("nan"))
    with pytest.raises(TypeError, match="sm_scale must be a float"):
        flashsel.sparse_mla_prefill(q, kv, idx, "x")


# ---------------------------------------------------------------------------
# Decode
# ---------------------------------------------------------------------------


def quantize_fp8(tokens):
    """FlashMLA's tests/quant.py (V3.2 layout), in NumPy: [n, 576] f32 -> [n, 656] uint8."""
    n = tokens.shape[0]
    out = np.zeros((n, 656), np.uint8)
    for t in range(4):
        tile = tokens[:, t * 128 : (t + 1) * 128]
        inv = np.maximum(np.abs(tile).max(axis=1) / 448.0, 1e-4).astype(np.float32)
        scale = np.power(2.0, np.ceil(np.log2(inv))).astype(np.float32)
        out[:, 512 + 4 * t : 516 + 4 * t] = scale.view(np.uint8).reshape(n, 4)
        out[:, t * 128 : (t + 1) * 128] = (tile / scale[:, None]).astype(FP8).view(np.uint8)
    out[:, 528:] = tokens[:, 512:].astype(BF16).view(np.uint8).reshape(n, 128)
    return out


def dequantize_fp8(tok):
    """[..., 656] uint8 -> [..., 576] float64, with ml_dtypes' e4m3."""
    tok = np.ascontiguousarray(tok)
    nope = tok[..., :512].view(FP8).astype(np.float64)
    scales = tok[..., 512:528].copy().view(np.float32).astype(np.float64)
    rope = tok[..., 528:656].copy().view(BF16).astype(np.float64)
    return np.concatenate([nope * np.repeat(scales, 128, axis=-1), rope], axis=-1)


def decode_case(b, s_q, h_q, topk, page_size, seed, fmt="fp8", d_qk=576):
    """Sequences of seq_len tokens on shuffled pages of a strided cache
    ([pages, page_size + 1, 1, W][:, :page_size], as FlashMLA's tests
    allocate it), unused pages and tokens NaN; logical positions -> slots."""
    rng = np.random.default_rng(seed)
    seq_len = topk + 5
    per_seq = -(-seq_len // page_size)
    num_pages = b * per_seq + 2
    table = rng.permutation(num_pages)[: b * per_seq].reshape(b, per_seq)
    tokens = randn(rng, b, seq_len, d_qk)
    width = 656 if fmt == "fp8" else d_qk
    if fmt == "fp8":
        base = np.full((num_pages, page_size + 1, 1, width), 0x7F, np.uint8)  # 0x7f: e4m3 NaN
        enc = quantize_fp8(tokens.reshape(-1, d_qk)).reshape(b, seq_len, width)
    else:
        dt = np.float32 if fmt == "f32" else BF16
        base = np.full((num_pages, page_size + 1, 1, width), np.nan, np.float32).astype(dt)
        enc = tokens.astype(dt)
    cache = base[:, :page_size]
    for s in range(b):
        for t in range(seq_len):
            cache[table[s, t // page_size], t % page_size, 0] = enc[s, t]
    pos = rng.integers(0, seq_len, (b, s_q, topk))
    pos[rng.random(pos.shape) < 0.1] = -1
    slots = np.where(pos < 0, -1, table[np.arange(b)[:, None, None], np.maximum(pos, 0) // page_size] * page_size + pos % page_size)
    q = randn(rng, b, s_q, h_q, d_qk).astype(BF16)
    return q, cache, slots.astype(np.int32), rng


def ref_decode(q, cache, slots, scale, sink=None, lengths=None, fmt="fp8"):
    """out [b, s_q, h_q, 512] and lse [b, h_q, s_q] from the definition."""
    b, s_q, h_q, d_qk = q.shape
    pages, page_size = cache.shape[:2]
    flat = cache.reshape(pages * page_size, -1)
    keys_all = dequantize_fp8(flat) if fmt == "fp8" else flat.astype(np.float64)
    topk = slots.shape[2]
    if lengths is not None and lengths.ndim == 1:
        lengths = np.repeat(lengths[:, None], s_q, axis=1)
    keys = []
    for i in range(b):
        for s in range(s_q):
            n = topk if lengths is None else int(lengths[i, s])
            row = slots[i, s, :n]
            row = row[(row >= 0) & (row < pages * page_size)]
            keys.append(keys_all[row])
    out, _, lse = ref_rows(q.astype(np.float64).reshape(b * s_q, h_q, d_qk), keys, float(np.float32(scale)), sink)
    return out.reshape(b, s_q, h_q, 512), lse.reshape(b, s_q, h_q).transpose(0, 2, 1)


@pytest.mark.parametrize("fmt", ["fp8", "bf16", "f32"])
@pytest.mark.parametrize("b,s_q,h_q,topk,page_size", [(3, 2, 16, 24, 8), (2, 1, 1, 64, 64), (2, 3, 24, 40, 5)])
def test_decode_paged_caches_match_the_reference(fmt, b, s_q, h_q, topk, page_size):
    q, cache, slots, rng = decode_case(b, s_q, h_q, topk, page_size, topk + h_q, fmt)
    assert not cache.flags.c_contiguous  # strided pages, read in place
    sink = rng.standard_normal(h_q).astype(np.float32)
    sink[0] = np.inf
    for kw in [{}, {"attn_sink": sink}]:
        out, lse = flashsel.sparse_mla_decode(q, cache, slots, **kw)
        assert out.dtype == BF16 and out.shape == (b, s_q, h_q, 512)
        assert lse.dtype == np.float32 and lse.shape == (b, h_q, s_q)
        assert np.isfinite(out.astype(np.float32)).all(), "NaN pages and tokens are never read"
        w_out, w_lse = ref_decode(q, cache, slots, 576**-0.5, kw.get("attn_sink"), fmt=fmt)
        check_close(out.astype(np.float32), w_out, **OUT_TOL)
        check_close(lse, w_lse, **LSE_TOL)
        np.testing.assert_allclose(lse, w_lse, rtol=1e-6)


def test_decode_equals_prefill_over_the_dequantized_sequence():
    q, cache, slots, _ = decode_case(1, 2, 8, 32, 16, 1)
    pages, page_size = cache.shape[:2]
    kv = dequantize_fp8(cache.reshape(pages * page_size, 656)).astype(np.float32)  # exact
    kv = np.nan_to_num(kv)[:, None, :]  # the unused tokens (never read) made finite
    out, lse = flashsel.sparse_mla_decode(q.astype(np.float32), cache, slots, 0.07)
    p_out, _, p_lse = flashsel.sparse_mla_prefill(q[0].astype(np.float32), kv, slots[0][:, None, :], 0.07)
    np.testing.assert_array_equal(out[0], p_out)
    np.testing.assert_array_equal(lse[0], p_lse.T)


def test_decode_topk_length_per_request_per_row_and_derived():
    b, s_q, topk = 3, 2, 32
    q, cache, slots, rng = decode_case(b, s_q, 8, topk, 16, 2, "bf16", 512)
    n_slots = cache.shape[0] * cache.shape[1]
    for i in range(b):
        for s in range(s_q):
            n = rng.integers(0, topk + 1)
            slots[i, s, n:] = [n_slots + p if p % 2 == 0 else INVALID[p % 7] for p in range(topk - n)]
    derived = derived_lengths(slots.reshape(b * s_q, topk), n_slots).reshape(b, s_q)
    a = flashsel.sparse_mla_decode(q, cache, slots)
    assert_bits_equal(a, flashsel.sparse_mla_decode(q, cache, slots, topk_length=derived))
    w = ref_decode(q, cache, slots, 512**-0.5, fmt="bf16")
    check_close(a[0].astype(np.float32), w[0], **OUT_TOL)
    per_req = np.array([5, 0, 32], np.int32)
    r = flashsel.sparse_mla_decode(q, cache, slots, topk_length=per_req)
    assert_bits_equal(r, flashsel.sparse_mla_decode(q, cache, slots, topk_length=np.repeat(per_req[:, None], s_q, 1)))
    assert (r[1][1] == np.inf).all() and not r[0][1].astype(np.float32).any()
    w = ref_decode(q, cache, slots, 512**-0.5, lengths=per_req, fmt="bf16")
    check_close(r[1], w[1], **LSE_TOL)


def test_every_e4m3_code_decodes_as_ml_dtypes_does():
    # Token 0 holds the 254 finite codes (twice; the NaN codes 0x7f and 0xff
    # replaced by 0), scales 1; q one-hot per head, so the lse of row s, head h
    # is exactly the value at dim 128 s + h. Tokens 1 and 2 hold one NaN code
    # each: any row attending them gets a NaN logit (0 * NaN), so NaN lse/out.
    codes = (np.arange(512) % 256).astype(np.uint8)
    finite = np.where((codes & 0x7F) == 0x7F, 0, codes).astype(np.uint8)
    tok = np.zeros((1, 3, 1, 656), np.uint8)
    tok[0, :, 0, 512:528] = np.ones(4, np.float32).view(np.uint8)
    tok[0, 0, 0, :512] = finite
    tok[0, 1, 0, 300] = 0x7F
    tok[0, 2, 0, 5] = 0xFF
    q = np.zeros((1, 4, 128, 576), np.float32)
    for s in range(4):
        q[0, s, np.arange(128), 128 * s + np.arange(128)] = 1.0
    _, lse = flashsel.sparse_mla_decode(q, tok, np.zeros((1, 4, 1), np.int32), 1.0)
    got = lse[0].T.reshape(512)  # [s, h] -> dim 128 s + h
    want = finite.view(FP8).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert len(set(want.tolist())) == 253  # 254 finite codes, +0.0 and -0.0 equal
    # ml_dtypes' float8_e4m3fn cache is the same bytes.
    _, lse2 = flashsel.sparse_mla_decode(q, tok.view(FP8), np.zeros((1, 4, 1), np.int32), 1.0, is_fp8_kvcache=True)
    np.testing.assert_array_equal(lse, lse2)
    for slot in (1, 2):
        out, lse = flashsel.sparse_mla_decode(q, tok, np.full((1, 4, 1), slot, np.int32), 1.0)
        assert np.isnan(lse).all() and np.isnan(out.astype(np.float32)).all()
    # Scales multiply exactly: 2^-3 on tile 2.
    tok[0, 0, 0, 520:524] = np.array([0.125], np.float32).view(np.uint8)
    _, lse = flashsel.sparse_mla_decode(q, tok, np.zeros((1, 4, 1), np.int32), 1.0)
    np.testing.assert_array_equal(lse[0].T.reshape(512), want * np.repeat([1, 1, 0.125, 1], 128).astype(np.float32))


def test_decode_errors():
    q, cache, slots, _ = decode_case(2, 1, 4, 8, 4, 3)
    with pytest.raises(ValueError, match="656 bytes a token"):
        flashsel.sparse_mla_decode(q, np.ascontiguousarray(cache[..., :600]), slots)
    with pytest.raises(ValueError, match="576 with the 656-byte fp8 cache"):
        flashsel.sparse_mla_decode(np.zeros((2, 1, 4, 512), BF16), cache, slots)
    with pytest.raises(ValueError, match="is_fp8_kvcache=False"):
        flashsel.sparse_mla_decode(q, cache, slots, is_fp8_kvcache=False)
    with pytest.raises(ValueError, match="q must be 4-D"):
        flashsel.sparse_mla_decode(q[0], cache, slots)
    with pytest.raises(ValueError, match="indices must be \\[b, s_q, topk\\]"):
        flashsel.sparse_mla_decode(q, cache, slots[:1])
    with pytest.raises(ValueError, match="topk_length must be \\[b\\]"):
        flashsel.sparse_mla_decode(q, cache, slots, topk_length=[1, 2, 3])
    with pytest.raises(ValueError, match="9 at row 1"):
        flashsel.sparse_mla_decode(q, cache, slots, topk_length=[1, 9])
    with pytest.raises(ValueError, match="one KV head"):
        flashsel.sparse_mla_decode(q, np.zeros((2, 4, 2, 656), np.uint8), slots)
    with pytest.raises(TypeError, match="k_cache: unsupported dtype float16"):
        flashsel.sparse_mla_decode(q, np.zeros((2, 4, 1, 576), np.float16), slots)
    with pytest.raises(ValueError, match="d_qk = 576 values a token"):
        flashsel.sparse_mla_decode(q, np.zeros((2, 4, 1, 512), BF16), slots)
    # An empty cache: every slot is out of range.
    out, lse = flashsel.sparse_mla_decode(q, np.zeros((0, 4, 1, 656), np.uint8), slots)
    assert (lse == np.inf).all() and not out.astype(np.float32).any()


# ---------------------------------------------------------------------------
# The public surface, torch CPU tensors, CUDA
# ---------------------------------------------------------------------------


def test_public_names():
    for name in ("sparse_mla_prefill", "sparse_mla_decode"):
        assert name in flashsel.__all__ and name in dir(flashsel)
        assert getattr(flashsel, name).__module__ == "flashsel"


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    q, kv, idx, _ = prefill_case(3, 40, 4, 576, 16, 13)
    idx[1, 0, 5:] = -1
    want = flashsel.sparse_mla_prefill(q, kv, idx, 0.05, attn_sink=np.ones(4, np.float32))
    tq = torch.from_numpy(q.view(np.int16)).view(torch.bfloat16)
    tkv = torch.from_numpy(kv.view(np.int16)).view(torch.bfloat16)
    got = flashsel.sparse_mla_prefill(tq, tkv, torch.from_numpy(idx), 0.05, attn_sink=torch.ones(4))
    assert got[0].dtype == torch.bfloat16 and tuple(got[0].shape) == (3, 4, 512)
    assert got[1].dtype == got[2].dtype == torch.float32
    np.testing.assert_array_equal(got[0].view(torch.int16).numpy().view(np.uint16), want[0].view(np.uint16))
    np.testing.assert_array_equal(got[2].numpy(), want[2])
    # A non-contiguous kv view, float32.
    big = torch.zeros(80, 1, 600)
    big[::2, :, :576] = torch.from_numpy(kv.astype(np.float32))
    got32 = flashsel.sparse_mla_prefill(tq.float(), big[::2, :, :576], torch.from_numpy(idx), 0.05)
    want32 = flashsel.sparse_mla_prefill(q.astype(np.float32), kv.astype(np.float32), idx, 0.05)
    np.testing.assert_array_equal(got32[0].numpy(), want32[0])
    # Decode with a strided fp8 tensor cache (uint8 and float8_e4m3fn).
    dq, cache, slots, _ = decode_case(2, 2, 8, 16, 8, 14)
    want_d = flashsel.sparse_mla_decode(dq, cache, slots)
    tcache = torch.from_numpy(cache.base)[:, : cache.shape[1]]  # the strided pages, as a tensor view
    tdq = torch.from_numpy(dq.view(np.int16)).view(torch.bfloat16)
    for c in (tcache, tcache.view(torch.float8_e4m3fn)):
        out, lse = flashsel.sparse_mla_decode(tdq, c, torch.from_numpy(slots))
        assert out.dtype == torch.bfloat16 and tuple(lse.shape) == (2, 8, 2)
        np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), want_d[0].view(np.uint16))
        np.testing.assert_array_equal(lse.numpy(), want_d[1])
    with pytest.raises(TypeError, match="indices must be torch.int32"):
        flashsel.sparse_mla_prefill(tq, tkv, torch.from_numpy(idx).long(), 0.05)
    with pytest.raises(TypeError, match="unsupported dtype torch.float16"):
        flashsel.sparse_mla_prefill(tq.half(), tkv.half(), torch.from_numpy(idx), 0.05)


def test_cuda_tensors_on_several_devices_are_refused():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q = torch.zeros(1, 64, 512, dtype=torch.bfloat16, device="cuda")
    kv = torch.zeros(8, 1, 512, dtype=torch.bfloat16)
    idx = torch.zeros(1, 1, 64, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="every tensor on one device"):
        flashsel.sparse_mla_prefill(q, kv, idx, 0.1)
    with pytest.raises(ValueError, match="every tensor on one device"):
        flashsel.sparse_mla_decode(q[None], torch.zeros(1, 64, 1, 656, dtype=torch.uint8), idx[None, 0])
