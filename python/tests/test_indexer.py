"""flashsel.qsa_scores on the CPU engine: a NumPy float64 reference and the
stated error bound, the documented float32 summation order bit for bit,
-inf past each query's keys, bf16 and fp8 e4m3 inputs (ml_dtypes and raw
bits), paged keys against contiguous ones, the errors, and
qsa_select(qsa_scores(...))."""

from __future__ import annotations

import numpy as np
import pytest

import flashsel

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
    FP8 = np.dtype(ml_dtypes.float8_e4m3fn) if hasattr(ml_dtypes, "float8_e4m3fn") else None
except ImportError:
    ml_dtypes = BF16 = FP8 = None

needs_bf16 = pytest.mark.skipif(BF16 is None, reason="ml_dtypes is not installed")
needs_fp8 = pytest.mark.skipif(FP8 is None, reason="ml_dtypes.float8_e4m3fn is not available")


# ---------------------------------------------------------------------------
# Decoding and references, written from the contract (docs/semantics.md)
# ---------------------------------------------------------------------------


def bf16_bits_to_f32(b):
    return (np.asarray(b).astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round to nearest even (finite values)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def e4m3_by_hand(b: int) -> float:
    """The e4m3 (float8_e4m3fn) value of the code b, from the format's definition."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 15 and m == 7:
        return float("nan")
    if e == 0:
        return sign * m / 8 * 2.0**-6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


E4M3 = np.array([e4m3_by_hand(b) for b in range(256)], np.float64)


def f32_to_e4m3_bits(x):
    """Nearest e4m3 code of each value (|x| <= 448; ties to the lower code, test data only)."""
    finite = np.array([b for b in range(256) if not np.isnan(E4M3[b])])
    vals = E4M3[finite]
    i = np.abs(np.asarray(x, np.float64)[..., None] - vals).argmin(-1)
    return finite[i].astype(np.uint8)


def widen(x, kind):
    """The exact float64 values of raw inputs of `kind` ("f32", "bf16" bits, "fp8" bits)."""
    if kind == "f32":
        return np.asarray(x, np.float64)
    if kind == "bf16":
        return bf16_bits_to_f32(x).astype(np.float64)
    return E4M3[np.asarray(x)]


def visible(positions, ratio):
    return (np.asarray(positions, np.int64) + 1) // ratio


def ref_scores(q64, k64, positions, ratio):
    """float64 scores [T, NB] of the formula, -inf past V (k64: [NB, d])."""
    t_, h_, d = q64.shape
    nb = k64.shape[0]
    dots = np.einsum("thd,bd->tbh", q64, k64)
    s = np.where(np.isnan(dots), dots, np.maximum(dots, 0.0)).sum(-1) / np.sqrt(d)
    v = visible(positions, ratio)
    return np.where(np.arange(nb)[None, :] < v[:, None], s, -np.inf)


def magnitudes(q64, k64):
    """M[t, b] = sum over h, j of |q k| / sqrt(d)."""
    return np.einsum("thd,bd->tb", np.abs(q64), np.abs(k64)) / np.sqrt(q64.shape[2])


def bound(d, h, m):
    """The stated bound (docs/semantics.md)."""
    return (d + h + 2) * 2.0**-24 * m + (d * h + 1) * 2.0**-149


def documented_order(q32, k32, positions, ratio):
    """The CPU engine's float32 arithmetic, step by step in NumPy float32:
    8 lanes (lane l adds the products of j = l, l + 8, ... in order), the
    lane tree, relu, heads left to right, one multiplication by
    float32(1 / sqrt(d)); the canonical NaN; -inf past V."""
    t_, h_, d = q32.shape
    nb = k32.shape[0]
    out = np.full((t_, nb), -np.inf, np.float32)
    c = np.float32(1.0 / np.sqrt(d))
    kl = k32.reshape(nb, d // 8, 8)
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(t_):
            s = np.zeros(nb, np.float32)
            for h in range(h_):
                prod = q32[t, h].reshape(d // 8, 8)[None] * kl  # [nb, d/8, 8], each product rounded
                a = np.zeros((nb, 8), np.float32)
                for j in range(d // 8):
                    a = a + prod[:, j]
                dot = ((a[:, 0] + a[:, 1]) + (a[:, 2] + a[:, 3])) + ((a[:, 4] + a[:, 5]) + (a[:, 6] + a[:, 7]))
                relu = np.where((dot > 0) | np.isnan(dot), dot, np.float32(0))
                s = s + relu
            row = s * c
            row = np.where(np.isnan(row), np.float32(np.nan), row)
            v = int(visible([positions[t]], ratio)[0])
            out[t, :v] = row[:v]
    return out


def random_case(rng, t, h, d, nb, ratio=4, kscale=1.0):
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    k = (rng.standard_normal((nb, d)) * kscale).astype(np.float32)
    last = nb * ratio + ratio - 2  # the last position with V = NB
    pos = np.concatenate([[0, max(ratio - 2, 0), last], rng.integers(0, last + 1, max(t - 3, 0))])[:t]
    return q, k, pos.astype(np.int64)


def raw_keys(k32, kind):
    """Keys as a raw array of `kind` (bf16 and fp8 as bit patterns)."""
    if kind == "f32":
        return k32
    return f32_to_bf16_bits(k32) if kind == "bf16" else f32_to_e4m3_bits(k32)


def raw_inputs(q32, k32, q_kind, k_kind):
    """q and kbar as raw arrays of the kinds."""
    return (q32 if q_kind == "f32" else f32_to_bf16_bits(q32)), raw_keys(k32, k_kind)


def check(q, k, pos, ratio, q_kind, k_kind, got=None):
    q64, k64 = widen(q, q_kind), widen(k, k_kind)
    if got is None:
        got = flashsel.qsa_scores(q, k, pos, ratio=ratio)
    assert got.dtype == np.float32 and got.shape == (q.shape[0], k.shape[0])
    want = ref_scores(q64, k64, pos, ratio)
    v = visible(pos, ratio)
    past = np.arange(k.shape[0])[None, :] >= v[:, None]
    assert np.all(got[past] == -np.inf)
    with np.errstate(invalid="ignore"):  # -inf - -inf past V
        err = np.abs(got.astype(np.float64) - want)
    b = bound(q.shape[2], q.shape[1], magnitudes(q64, k64))
    bad = ~past & ~(err <= b)
    assert not bad.any(), f"{bad.sum()} entries over the bound, worst {np.max(np.where(past, 0, err / b))}"
    doc = documented_order(q64.astype(np.float32), k64.astype(np.float32), pos, ratio)
    np.testing.assert_array_equal(got.view(np.uint32), doc.view(np.uint32))
    return got


# ---------------------------------------------------------------------------
# Exactness
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("h", [1, 4, 7, 16])
def test_f32_within_the_bound_and_in_the_documented_order(d, h):
    rng = np.random.default_rng(d * 100 + h)
    q, k, pos = random_case(rng, 6, h, d, 41)
    check(q, k, pos, 4, "f32", "f32")


@pytest.mark.parametrize("q_kind", ["f32", "bf16"])
@pytest.mark.parametrize("k_kind", ["f32", "bf16", "fp8"])
def test_every_dtype_pair(q_kind, k_kind):
    rng = np.random.default_rng(7)
    q32, k32, pos = random_case(rng, 5, 4, 128, 60, kscale=8.0 if k_kind == "fp8" else 1.0)
    q, k = raw_inputs(q32, k32, q_kind, k_kind)
    check(q, k, pos, 4, q_kind, k_kind)


def test_cancellation_at_the_relu_boundary():
    # Keys whose dot with head 0 of query 0 is about zero (the last element
    # cancels the rest): the sign of a tiny dot decides relu.
    rng = np.random.default_rng(8)
    q, k, pos = random_case(rng, 3, 4, 128, 50)
    q64 = q.astype(np.float64)
    partial = k[:, :-1].astype(np.float64) @ q64[0, 0, :-1]
    k[:, -1] = (-partial / q64[0, 0, -1]).astype(np.float32)
    got = check(q, k, pos, 4, "f32", "f32")
    assert np.isfinite(got[0, : visible(pos[:1], 4)[0]]).all()


def test_other_ratios():
    rng = np.random.default_rng(9)
    for ratio in [1, 3, 8]:
        q, k, pos = random_case(rng, 5, 2, 64, 20, ratio=ratio)
        check(q, k, pos, ratio, "f32", "f32")


def test_rounding_q_to_bf16_is_outside_the_bound():
    # What the contract forbids fails the same test: an f32 q scored as bf16.
    rng = np.random.default_rng(10)
    q, k, pos = random_case(rng, 4, 4, 128, 64)
    pos[:] = 64 * 4 - 1
    rounded = flashsel.qsa_scores(f32_to_bf16_bits(q), k, pos)
    err = np.abs(rounded - ref_scores(q.astype(np.float64), k.astype(np.float64), pos, 4))
    over = err > bound(128, 4, magnitudes(q.astype(np.float64), k.astype(np.float64)))
    assert over.mean() > 0.5


def test_minus_inf_past_the_keys_and_unread_blocks():
    rng = np.random.default_rng(11)
    q = rng.standard_normal((4, 2, 64)).astype(np.float32)
    k = rng.standard_normal((10, 64)).astype(np.float32)
    k[3:] = np.nan  # never read by a query that sees 3 blocks
    got = flashsel.qsa_scores(q, k, [0, 2, 3, 14])  # V = 0, 0, 1, 3
    for t, v in enumerate([0, 0, 1, 3]):
        assert np.isfinite(got[t, :v]).all() and (got[t, :v] >= 0).all()
        assert (got[t, v:] == -np.inf).all()
    got = flashsel.qsa_scores(q[:1], k, [39])  # sees all 10: NaN keys give the canonical NaN
    assert np.isfinite(got[0, :3]).all()
    assert (got[0, 3:].view(np.uint32) == 0x7FC00000).all()


def test_the_same_bytes_alone_and_in_a_batch():
    rng = np.random.default_rng(12)
    q, k, pos = random_case(rng, 9, 4, 128, 700)
    all_rows = flashsel.qsa_scores(q, k, pos)
    for t in [0, 4, 8]:
        alone = flashsel.qsa_scores(q[t : t + 1], k, pos[t : t + 1])
        np.testing.assert_array_equal(alone[0].view(np.uint32), all_rows[t].view(np.uint32))
    np.testing.assert_array_equal(flashsel.qsa_scores(q, k, pos).view(np.uint32), all_rows.view(np.uint32))


# ---------------------------------------------------------------------------
# dtypes: bf16 (ml_dtypes or bits), fp8 e4m3 (ml_dtypes or bits), byte order
# ---------------------------------------------------------------------------


@needs_bf16
def test_ml_dtypes_bfloat16_is_its_bit_patterns():
    rng = np.random.default_rng(13)
    q32, k32, pos = random_case(rng, 4, 4, 128, 30)
    qb, kb = q32.astype(BF16), k32.astype(BF16)
    want = flashsel.qsa_scores(qb.view(np.uint16), kb.view(np.uint16), pos)
    for q, k in [(qb, kb), (qb.view(np.int16), kb), (qb, kb.view(np.int16))]:
        np.testing.assert_array_equal(flashsel.qsa_scores(q, k, pos).view(np.uint32), want.view(np.uint32))
    check(qb.view(np.uint16), kb.view(np.uint16), pos, 4, "bf16", "bf16", got=want)


def test_every_e4m3_code_against_a_hand_decoder():
    # d = 64: score = relu(8 * k) * 0.125 = relu(k), exactly; -8 gives relu(-k).
    codes = np.arange(256, dtype=np.uint8)
    k = np.zeros((256, 64), np.uint8)
    k[:, 0] = codes
    q = np.zeros((2, 1, 64), np.float32)
    q[0, 0, 0], q[1, 0, 0] = 8.0, -8.0
    got = flashsel.qsa_scores(q, k, [256 * 4 - 1] * 2)
    value = np.where(got[0] > 0, got[0], -got[1]).astype(np.float64)  # the decoded value
    nan = np.isnan(E4M3)
    assert np.isnan(got[0][nan]).all() and np.isnan(got[1][nan]).all()
    assert nan.sum() == 2 and list(np.flatnonzero(nan)) == [0x7F, 0xFF]
    np.testing.assert_array_equal(value[~nan] + 0.0, E4M3[~nan] + 0.0)  # +0.0: zeros compare equal
    assert E4M3[0x7E] == 448 and E4M3[0x01] == 2.0**-9


@needs_fp8
def test_ml_dtypes_float8_e4m3fn_matches_the_decoder_and_its_bits():
    codes = np.arange(256, dtype=np.uint8)
    ml = codes.view(FP8).astype(np.float64)
    nan = np.isnan(E4M3)
    assert np.array_equal(np.isnan(ml), nan)
    np.testing.assert_array_equal(ml[~nan], E4M3[~nan])
    rng = np.random.default_rng(14)
    q32, k32, pos = random_case(rng, 4, 4, 128, 30, kscale=8.0)
    k8 = k32.astype(FP8)
    got = flashsel.qsa_scores(q32, k8, pos)
    np.testing.assert_array_equal(got.view(np.uint32), flashsel.qsa_scores(q32, k8.view(np.uint8), pos).view(np.uint32))
    check(q32, k8.view(np.uint8), pos, 4, "f32", "fp8", got=got)


def test_big_endian_and_strided_q():
    rng = np.random.default_rng(15)
    q, k, pos = random_case(rng, 4, 4, 64, 25)
    want = flashsel.qsa_scores(q, k, pos)
    got = flashsel.qsa_scores(q.astype(">f4"), k.astype(">f4"), pos.astype(">i8"))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    wide = np.zeros((4, 8, 64), np.float32)
    wide[:, ::2] = q  # a strided view: q is copied
    np.testing.assert_array_equal(flashsel.qsa_scores(wide[:, ::2], k, pos).view(np.uint32), want.view(np.uint32))
    got = flashsel.qsa_scores(q, k, pos.astype(np.int32).tolist())
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------------------
# Paged keys
# ---------------------------------------------------------------------------


def paged(seqs_keys, page_size, ratio, rng, spare=3):
    """A paged cache holding each sequence's [NB, d] keys through a random
    table (entries past a sequence's blocks are -1), plus spare pages."""
    bpp = page_size // ratio
    nb, d = seqs_keys[0].shape
    used = -(-nb // bpp)
    max_pages = used + 2
    n_pages = len(seqs_keys) * used + spare
    perm = rng.permutation(n_pages)
    table = np.full((len(seqs_keys), max_pages), -1, np.int32)
    cache = np.zeros((n_pages, bpp, d), seqs_keys[0].dtype)
    for s, keys in enumerate(seqs_keys):
        table[s, :used] = perm[s * used : (s + 1) * used]
        for b in range(nb):
            cache[table[s, b // bpp], b % bpp] = keys[b]
    return cache, table, max_pages * bpp


@pytest.mark.parametrize("k_kind", ["f32", "bf16", "fp8"])
def test_paged_keys_give_the_bytes_of_contiguous_ones(k_kind):
    rng = np.random.default_rng(16)
    ratio, page_size, nb = 4, 64, 45
    seq_keys = []
    for _ in range(3):
        _, k32, _ = random_case(rng, 1, 1, 128, nb, kscale=8.0 if k_kind == "fp8" else 1.0)
        seq_keys.append(raw_keys(k32, k_kind))
    cache, table, cols = paged(seq_keys, page_size, ratio, rng)
    q, _, pos = random_case(rng, 9, 4, 128, nb)
    seq_ids = np.arange(9, dtype=np.int32) % 3
    got = flashsel.qsa_scores(q, cache, pos, page_table=table, seq_ids=seq_ids)
    assert got.shape == (9, cols)
    for t in range(9):
        want = flashsel.qsa_scores(q[t : t + 1], seq_keys[seq_ids[t]], pos[t : t + 1])
        np.testing.assert_array_equal(got[t, :nb].view(np.uint32), want[0].view(np.uint32))
        assert (got[t, nb:] == -np.inf).all()


def test_paged_with_another_page_size():
    rng = np.random.default_rng(17)
    _, k, _ = random_case(rng, 1, 1, 64, 30)
    cache, table, cols = paged([k], 12, 3, rng)  # 4 blocks a page
    q, _, pos = random_case(rng, 5, 2, 64, 30, ratio=3)
    got = flashsel.qsa_scores(q, cache, pos, ratio=3, page_table=table, page_size=12, seq_ids=[0] * 5)
    np.testing.assert_array_equal(got[:, :30], flashsel.qsa_scores(q, k, pos, ratio=3))


# ---------------------------------------------------------------------------
# Into qsa_select
# ---------------------------------------------------------------------------


def test_qsa_select_of_qsa_scores_runs():
    rng = np.random.default_rng(18)
    q, k, _ = random_case(rng, 3, 4, 128, 700)
    pos = np.array([2798, 2050, 100], np.int64)  # V = 699 (top 512 + a tail of 3), 512 (all), 25
    scores = flashsel.qsa_scores(q, k, pos)
    ids, counts = flashsel.qsa_select(scores, pos)
    assert counts.tolist() == [2051, 2051, 101]
    # Row 0's blocks are the top 512 of its scores (no ties in random data).
    blocks = np.unique(ids[0, :2048] // 4)
    np.testing.assert_array_equal(blocks, np.sort(np.argsort(-scores[0, :699], kind="stable")[:512]))


def test_qsa_select_of_paged_qsa_scores_runs():
    rng = np.random.default_rng(19)
    ratio, page_size = 4, 64
    keys = [random_case(rng, 1, 1, 128, 200)[1] for _ in range(2)]
    cache, table, cols = paged(keys, page_size, ratio, rng)
    q, _, _ = random_case(rng, 4, 4, 128, 200)
    pos = np.array([799, 500, 3, 798], np.int64)
    seq_ids = np.array([0, 1, 1, 0], np.int32)
    scores = flashsel.qsa_scores(q, cache, pos, page_table=table, seq_ids=seq_ids)
    ids, counts = flashsel.qsa_select(scores, pos, k_blocks=64, page_table=table, seq_ids=seq_ids)
    assert counts.tolist() == [256, 256 + 1, 4, 256 + 3]
    assert ids.shape == (4, 64 * 4 + 3)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

Q = np.zeros((2, 4, 128), np.float32)
K = np.zeros((10, 128), np.float32)
POS = np.array([3, 39], np.int64)


def test_shapes_heads_and_d():
    assert flashsel.qsa_scores(Q, K, POS).shape == (2, 10)
    with pytest.raises(ValueError, match=r"q must be 3-D \[queries, heads, d\], got shape \(4, 128\); for one query"):
        flashsel.qsa_scores(Q[0], K, POS)
    with pytest.raises(ValueError, match=r"kbar must be 2-D \[blocks, d\]"):
        flashsel.qsa_scores(Q, K[None], POS)
    with pytest.raises(ValueError, match="kbar has d = 64 but q has d = 128"):
        flashsel.qsa_scores(Q, K[:, :64].copy(), POS)
    with pytest.raises(ValueError, match=r"heads.*\"17\".*1\.\.=16"):
        flashsel.qsa_scores(np.zeros((2, 17, 128), np.float32), K, POS)
    with pytest.raises(ValueError, match=r"heads.*\"0\""):
        flashsel.qsa_scores(np.zeros((2, 0, 128), np.float32), K, POS)
    with pytest.raises(ValueError, match=r"head dim.*\"96\".*64, 128 or 256"):
        flashsel.qsa_scores(np.zeros((2, 4, 96), np.float32), np.zeros((10, 96), np.float32), POS)
    with pytest.raises(ValueError, match="must be C-contiguous"):
        flashsel.qsa_scores(Q, np.zeros((128, 10), np.float32).T, POS)
    assert flashsel.qsa_scores(Q[:0], K, POS[:0]).shape == (0, 10)


def test_positions():
    with pytest.raises(ValueError, match=r"positions\[1\] = 40 sees 10 blocks"):
        flashsel.qsa_scores(Q, K[:9], [3, 40])
    with pytest.raises(ValueError, match=r"positions\[1\] = 43 sees 11 blocks of 4 tokens but the keys hold 10"):
        flashsel.qsa_scores(Q, K, [3, 43])
    with pytest.raises(ValueError, match=r"positions\[0\] = -1"):
        flashsel.qsa_scores(Q, K, [-1, 3])
    with pytest.raises(ValueError, match="positions must be 1-D with 2 entries"):
        flashsel.qsa_scores(Q, K, [3])
    with pytest.raises(TypeError, match="positions must hold int32 or int64"):
        flashsel.qsa_scores(Q, K, np.array([3.0, 4.0]))


def test_dtypes_and_types():
    with pytest.raises(TypeError, match="unsupported q dtype float16"):
        flashsel.qsa_scores(Q.astype(np.float16), K, POS)
    with pytest.raises(TypeError, match="unsupported q dtype uint8"):
        flashsel.qsa_scores(Q.view(np.uint8).reshape(2, 4, 512)[:, :, :128].copy(), K, POS)
    with pytest.raises(TypeError, match="unsupported kbar dtype float16"):
        flashsel.qsa_scores(Q, K.astype(np.float16), POS)
    with pytest.raises(TypeError, match="unsupported kbar dtype int8"):
        flashsel.qsa_scores(Q, K.astype(np.int8), POS)
    with pytest.raises(TypeError, match="unsupported kbar dtype float64"):
        flashsel.qsa_scores(Q, K.astype(np.float64), POS)
    with pytest.raises(TypeError, match="q must be a numpy.ndarray or a torch.Tensor"):
        flashsel.qsa_scores(Q.tolist(), K, POS)
    with pytest.raises(TypeError, match="ratio must be an integer"):
        flashsel.qsa_scores(Q, K, POS, ratio=4.0)
    with pytest.raises(ValueError, match="ratio must be in 1"):
        flashsel.qsa_scores(Q, K, POS, ratio=0)


def test_page_table_errors():
    cache = np.zeros((3, 16, 128), np.float32)  # 3 pages of 16 blocks (64 tokens)
    table = np.array([[2, 0, -1], [1, 7, 0]], np.int32)
    ok = dict(page_table=table, seq_ids=[0, 1])
    assert flashsel.qsa_scores(Q, cache, [127, 63], **ok).shape == (2, 48)
    with pytest.raises(ValueError, match=r"page_table\[1, 1\] = 7 \(row 1, blocks 16\.\.17\) is outside the key cache's pages 0\.\.3"):
        flashsel.qsa_scores(Q, cache, [127, 67], **ok)
    with pytest.raises(ValueError, match=r"page_table\[0, 2\] = -1"):
        flashsel.qsa_scores(Q, cache, [191, 0], **ok)
    with pytest.raises(ValueError, match=r"sees 49 blocks of 4 tokens but the keys hold 48"):
        flashsel.qsa_scores(Q, cache, [195, 0], **ok)
    with pytest.raises(ValueError, match=r"seq_ids\[1\] = 2 is outside 0\.\.2"):
        flashsel.qsa_scores(Q, cache, [3, 3], page_table=table, seq_ids=[0, 2])
    with pytest.raises(ValueError, match="seq_ids must be 1-D with 2 entries"):
        flashsel.qsa_scores(Q, cache, [3, 3], page_table=table, seq_ids=[0])
    with pytest.raises(ValueError, match="come together"):
        flashsel.qsa_scores(Q, cache, [3, 3], page_table=table)
    with pytest.raises(ValueError, match="come together"):
        flashsel.qsa_scores(Q, K, POS, seq_ids=[0, 0])
    with pytest.raises(ValueError, match=r"with page_table, kbar must be 3-D"):
        flashsel.qsa_scores(Q, K, POS, **ok)
    with pytest.raises(ValueError, match=r"kbar holds 16 blocks a page but page_size // ratio = 32 // 4 = 8"):
        flashsel.qsa_scores(Q, cache, [3, 3], page_size=32, **ok)
    with pytest.raises(ValueError, match="page_size = 62 is not a multiple of ratio = 4"):
        flashsel.qsa_scores(Q, cache, [3, 3], page_size=62, **ok)
    with pytest.raises(TypeError, match="page_table must be int32"):
        flashsel.qsa_scores(Q, cache, [3, 3], page_table=table.astype(np.int64), seq_ids=[0, 1])


# ---------------------------------------------------------------------------
# torch (CPU tensors; CUDA is not built yet)
# ---------------------------------------------------------------------------


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(20)
    q32, k32, pos = random_case(rng, 4, 4, 128, 40)
    want = flashsel.qsa_scores(q32, k32, pos)
    got = flashsel.qsa_scores(torch.from_numpy(q32), torch.from_numpy(k32), torch.from_numpy(pos))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    qb, kb = torch.from_numpy(q32).bfloat16(), torch.from_numpy(k32).bfloat16()
    got = flashsel.qsa_scores(qb, kb, pos)
    want = flashsel.qsa_scores(qb.view(torch.int16).numpy(), kb.view(torch.int16).numpy(), pos)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    if hasattr(torch, "float8_e4m3fn"):
        k8 = torch.from_numpy(k32 * 8).to(torch.float8_e4m3fn)
        got = flashsel.qsa_scores(qb, k8, pos)
        want = flashsel.qsa_scores(qb.view(torch.int16).numpy(), k8.view(torch.uint8).numpy(), pos)
        np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    with pytest.raises(TypeError, match="pass x.view\\(torch.bfloat16\\)"):
        flashsel.qsa_scores(qb.view(torch.int16), kb, pos)
    with pytest.raises(TypeError, match="unsupported q dtype torch.float16"):
        flashsel.qsa_scores(qb.half(), kb, pos)


def test_cuda_tensors_beside_host_q_are_refused():
    # A CUDA q runs on the GPU (test_cuda_indexer.py); CUDA keys or positions
    # beside host q are a ValueError, never read through the host.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    k = torch.zeros((4, 128), device="cuda")
    with pytest.raises(ValueError, match="kbar is on cuda:\\d but q is in host memory"):
        flashsel.qsa_scores(np.zeros((1, 4, 128), np.float32), k, [3])
    with pytest.raises(ValueError, match="positions is on cuda:\\d but q is in host memory"):
        flashsel.qsa_indexer(torch.zeros((1, 4, 128)), k.cpu(), torch.tensor([3], device="cuda"))


# ---------------------------------------------------------------------------
# qsa_indexer: qsa_select(qsa_scores(...)) without the scores
# ---------------------------------------------------------------------------


def composed(q, k, pos, **kw):
    """The reference composition: the scores, then the selection."""
    skw = {n: kw[n] for n in ("ratio", "page_table", "page_size", "seq_ids") if n in kw}
    scores = flashsel.qsa_scores(q, k, pos, **skw)
    return flashsel.qsa_select(scores, pos, **kw)


def assert_same(q, k, pos, **kw):
    ids, counts = flashsel.qsa_indexer(q, k, pos, **kw)
    want_ids, want_counts = composed(q, k, pos, **kw)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
    np.testing.assert_array_equal(np.asarray(counts), np.asarray(want_counts))
    return ids, counts


@pytest.mark.parametrize("order", ["index", "score"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
@pytest.mark.parametrize(("q_kind", "k_kind"), [("f32", "f32"), ("bf16", "bf16"), ("f32", "fp8"), ("bf16", "f32")])
def test_qsa_indexer_is_qsa_select_of_qsa_scores(order, nan, q_kind, k_kind):
    rng = np.random.default_rng(30)
    q32, k32, pos = random_case(rng, 11, 4, 128, 90, kscale=8.0 if k_kind == "fp8" else 1.0)
    pos[3:6] = [16 * 4 - 1, 16 * 4 + 2, 17 * 4 - 1]  # V = k_blocks, k_blocks, k_blocks + 1
    q, k = raw_inputs(q32, k32, q_kind, k_kind)
    ids, counts = assert_same(q, k, pos, k_blocks=16, order=order, nan=nan)
    assert ids.dtype == np.int32 and ids.shape == (11, 16 * 4 + 3) and counts.dtype == np.int32


@pytest.mark.parametrize("order", ["index", "score"])
def test_qsa_indexer_on_near_ties_and_nan(order):
    rng = np.random.default_rng(31)
    d, nb = 64, 120
    # Few distinct values and repeated key rows: most scores tie exactly.
    q = rng.integers(-1, 3, (9, 3, d)).astype(np.float32)
    base = rng.integers(-2, 3, (3, d)).astype(np.float32)
    k = base[np.arange(nb) % 3]
    last = nb * 4 + 2
    pos = np.concatenate([[last, 40, 43, 44], rng.integers(0, last + 1, 5)]).astype(np.int64)
    for nan in ("lowest", "largest"):
        assert_same(q, k, pos, k_blocks=10, order=order, nan=nan)
    # Keys one bf16 step apart in one coordinate: scores that differ in the last bits.
    bits = np.tile(f32_to_bf16_bits(rng.standard_normal(d).astype(np.float32)), (nb, 1))
    bits[np.arange(nb), np.arange(nb) % d] += (np.arange(nb) % 3).astype(np.uint16)
    assert_same(rng.standard_normal((9, 3, d)).astype(np.float32), bits, pos, k_blocks=10, order=order)
    # NaN rows and NaN blocks.
    qn = rng.standard_normal((9, 3, d)).astype(np.float32)
    qn[1] = np.nan
    qn[2, 0, 5] = np.nan
    kn = rng.standard_normal((nb, d)).astype(np.float32)
    kn[::5, 1] = np.nan
    kn[2::7, 0] = np.inf
    for nan in ("lowest", "largest"):
        assert_same(qn, kn, pos, k_blocks=10, order=order, nan=nan)


def test_qsa_indexer_paged_gives_slots_through_the_same_table():
    rng = np.random.default_rng(32)
    ratio, page_size = 4, 64
    keys = [random_case(rng, 1, 1, 128, 200)[1] for _ in range(2)]
    cache, table, cols = paged(keys, page_size, ratio, rng)
    q, _, _ = random_case(rng, 4, 4, 128, 200)
    pos = np.array([799, 500, 3, 798], np.int64)
    seq_ids = np.array([0, 1, 1, 0], np.int32)
    for order in ("index", "score"):
        ids, counts = assert_same(q, cache, pos, k_blocks=64, order=order, page_table=table, seq_ids=seq_ids)
        assert counts.tolist() == [256, 256 + 1, 4, 256 + 3]
        # The slots of the token ids each sequence's own keys give.
        for t in range(4):
            tok, _ = flashsel.qsa_indexer(q[t : t + 1], keys[seq_ids[t]], pos[t : t + 1], k_blocks=64, order=order)
            n = counts[t]
            want = table[seq_ids[t], tok[0, :n] // page_size] * page_size + tok[0, :n] % page_size
            np.testing.assert_array_equal(ids[t, :n], want)
            assert (ids[t, n:] == -1).all()


def test_qsa_indexer_defaults_and_errors():
    rng = np.random.default_rng(33)
    q, k, _ = random_case(rng, 3, 4, 128, 700)
    pos = np.array([2798, 2050, 100], np.int64)
    ids, counts = assert_same(q, k, pos)
    assert counts.tolist() == [2051, 2051, 101] and ids.shape == (3, 2051)
    with pytest.raises(ValueError, match="sees 11 blocks"):
        flashsel.qsa_indexer(Q, K, np.array([3, 44]), k_blocks=2)
    with pytest.raises(ValueError, match="head dim"):
        flashsel.qsa_indexer(np.zeros((2, 4, 96), np.float32), np.zeros((10, 96), np.float32), POS)
    with pytest.raises(ValueError, match="k_blocks"):
        flashsel.qsa_indexer(Q, K, POS, k_blocks=0)
    with pytest.raises(ValueError, match="order"):
        flashsel.qsa_indexer(Q, K, POS, order="best")
    with pytest.raises(ValueError, match="nan"):
        flashsel.qsa_indexer(Q, K, POS, nan="high")
    with pytest.raises(TypeError, match="unsupported q dtype"):
        flashsel.qsa_indexer(Q.astype(np.float16), K, POS)
    with pytest.raises(ValueError, match="page_table and seq_ids"):
        flashsel.qsa_indexer(Q, K, POS, page_table=np.zeros((1, 4), np.int32))


def test_qsa_indexer_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(34)
    q32, k32, pos = random_case(rng, 6, 4, 128, 60)
    want_ids, want_counts = composed(q32, k32, pos, k_blocks=8, order="score")
    ids, counts = flashsel.qsa_indexer(torch.from_numpy(q32), torch.from_numpy(k32), torch.from_numpy(pos), k_blocks=8, order="score")
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int32 and counts.dtype == torch.int32
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_array_equal(counts.numpy(), want_counts)
    qb, kb = torch.from_numpy(q32).bfloat16(), torch.from_numpy(k32).bfloat16()
    ids, counts = flashsel.qsa_indexer(qb, kb, pos, k_blocks=8)
    want_ids, want_counts = composed(qb, kb, torch.from_numpy(pos), k_blocks=8)
    np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())
    np.testing.assert_array_equal(counts.numpy(), want_counts.numpy())
    if hasattr(torch, "float8_e4m3fn"):
        k8 = torch.from_numpy(k32 * 8).to(torch.float8_e4m3fn)
        ids, _ = flashsel.qsa_indexer(qb, k8, pos, k_blocks=8)
        want_ids, _ = composed(qb, k8, torch.from_numpy(pos), k_blocks=8)
        np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())
