"""The test suite's own reference for the flashsel contract, written from the
spec (not from the library): sort each row's candidates by (key descending,
column ascending), where the key orders floats as floats, makes -0.0 equal to
+0.0, and puts every NaN below -inf (nan="lowest") or above +inf
(nan="largest"). Take the first k, put them in output order, pad with -1 and
-inf."""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bf16 NumPy tests are skipped
    ml_dtypes = None
    BF16 = None

UINT = {4: np.uint32, 2: np.uint16}


def ref_topk(x2: np.ndarray, k: int, lengths=None, order: str = "score", nan: str = "lowest"):
    """(indices int32 [rows, k], values [rows, k] in x2.dtype)."""
    rows, cols = x2.shape
    with np.errstate(invalid="ignore"):  # NaN payloads
        f = x2.astype(np.float64)  # exact for f32, f16 and bf16
    idx = np.full((rows, k), -1, dtype=np.int32)
    val = np.full((rows, k), -np.inf, dtype=np.float64).astype(x2.dtype)
    for r in range(rows):
        n = cols if lengths is None else int(lengths[r])
        v = f[r, :n]
        isnan = np.isnan(v)
        cls = np.where(isnan, 0 if nan == "lowest" else 2, 1)
        mag = np.where(isnan | (v == 0), 0.0, v)  # -0.0 -> +0.0, NaN -> class only
        # np.lexsort: the last key is the primary one.
        best = np.lexsort((np.arange(n), -mag, -cls))[:k]
        if order == "index":
            best = np.sort(best)
        idx[r, : len(best)] = best
        val[r, : len(best)] = x2[r, best]
    return idx, val


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bits of a float array, for bit-for-bit comparison."""
    return np.ascontiguousarray(a).view(UINT[a.dtype.itemsize])


def assert_same(got_idx, got_val, want_idx, want_val, ctx=""):
    np.testing.assert_array_equal(got_idx, want_idx, err_msg=f"indices differ {ctx}")
    if want_val is not None:
        assert got_val.dtype == want_val.dtype, ctx
        np.testing.assert_array_equal(bits(got_val), bits(want_val), err_msg=f"value bits differ {ctx}")


# --------------------------------------------------------------------------
# Data: random and adversarial rows, built in float32 and cast.
# --------------------------------------------------------------------------

KINDS = [
    "normal",
    "relu",  # ReLU output: a plateau of +0.0 (and some -0.0) ties
    "equal",  # every score the same
    "few",  # four distinct values: ties everywhere
    "nan5",  # NaN every 5th element (mixed signs and payloads for f32)
    "inf",  # +-inf sprinkled, some NaN
    "zeros",  # only +0.0 and -0.0
    "ascending",  # worst case for a streaming threshold
    "descending",
    "allnan",
    "neginf",  # all -inf with a few NaN
    "tiny",  # denormals and their negatives
]


def make(kind: str, rows: int, cols: int, dtype, rng: np.random.Generator) -> np.ndarray:
    shape = (rows, cols)
    if kind == "normal":
        x = rng.standard_normal(shape, dtype=np.float32)
    elif kind == "relu":
        x = np.maximum(rng.standard_normal(shape, dtype=np.float32), 0)
        x[rng.random(shape) < 0.1] = -0.0
    elif kind == "equal":
        x = np.full(shape, 0.75, np.float32)
    elif kind == "few":
        x = rng.integers(-2, 2, shape).astype(np.float32)
    elif kind == "nan5":
        x = rng.standard_normal(shape, dtype=np.float32)
        x[:, ::5] = np.nan
        x[:, 3::10] = -np.nan
    elif kind == "inf":
        x = rng.standard_normal(shape, dtype=np.float32)
        r = rng.random(shape)
        x[r < 0.05] = np.inf
        x[(r >= 0.05) & (r < 0.1)] = -np.inf
        x[(r >= 0.1) & (r < 0.12)] = np.nan
    elif kind == "zeros":
        x = np.where(rng.random(shape) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
    elif kind == "ascending":
        x = np.tile(np.arange(cols, dtype=np.float32), (rows, 1))
    elif kind == "descending":
        x = np.tile(np.arange(cols, 0, -1, dtype=np.float32), (rows, 1))
    elif kind == "allnan":
        x = np.full(shape, np.nan, np.float32)
    elif kind == "neginf":
        x = np.full(shape, -np.inf, np.float32)
        x[:, ::7] = np.nan
    elif kind == "tiny":
        x = (rng.integers(-3, 4, shape) * 1e-45).astype(np.float32)
    else:
        raise ValueError(kind)
    with np.errstate(over="ignore"):  # "ascending" past the f16 range is +inf
        out = x.astype(dtype)
    if dtype == np.float32 and kind == "nan5":
        # NaNs with other payloads and signs must all be one key.
        u = out.view(np.uint32)
        u[:, 5::20] = 0x7F800001  # signalling NaN
        u[:, 10::20] = 0xFFC00123
    return out
