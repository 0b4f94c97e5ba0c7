"""The conventions the Python package shares with the `flashsel select` CLI
(docs/python.md, "Inputs"), on NumPy arrays: output shapes, scalar lengths,
bfloat16 as raw 16-bit patterns, byte order, the dtypes refused, k = 0; and
the package's public surface."""

from __future__ import annotations

import numpy as np
import pytest

import flashsel
from _ref import BF16, make, ref_topk

X = np.arange(24, dtype=np.float32).reshape(3, 8) % 5  # ties, so the tie rule matters


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    """The float32 value of each bfloat16 bit pattern (exact: bf16 is f32's top half)."""
    return (b.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns of float32 values (truncated; exact for the test data)."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


# ---------------------------------------------------------------------------
# Public surface
# ---------------------------------------------------------------------------


def test_dir_shows_only_the_public_names():
    assert dir(flashsel) == [
        "__version__",
        "backends",
        "dsa_indexer",
        "dsa_scores",
        "qsa_attention",
        "qsa_indexer",
        "qsa_scores",
        "qsa_select",
        "sparse_mla_decode",
        "sparse_mla_prefill",
        "topk",
    ]
    assert sorted(flashsel.__all__) == dir(flashsel)
    star: dict = {}
    exec("from flashsel import *", star)
    assert sorted(k for k in star if k != "__builtins__") == dir(flashsel)
    # Everything else in the namespace (the implementation module, the native
    # extension) is private by name: no imported module or helper leaks out.
    # (Public submodules, once imported, are attributes of the package:
    # `flashsel.distributed` is one, imported by its own tests' collection.)
    public_submodules = {"distributed"}
    leaked = sorted(
        n for n in vars(flashsel) if not n.startswith("_") and n not in flashsel.__all__ and n not in public_submodules
    )
    assert leaked == []
    for n in public_submodules & set(vars(flashsel)):
        assert type(vars(flashsel)[n]).__name__ == "module" and vars(flashsel)[n].__name__ == f"flashsel.{n}", n
    for name in ["np", "numpy", "sys", "torch", "typing", "Any", "Literal", "operator", "threading"]:
        assert not hasattr(flashsel, name), name


# ---------------------------------------------------------------------------
# Output shapes: [k] for 1-D scores, [rows, k] for 2-D
# ---------------------------------------------------------------------------


def test_one_dimensional_scores_give_k_outputs():
    row = X[1]
    for k in [1, 3, 8, 11]:  # 11 > cols: padded
        idx, val = flashsel.topk(row, k, return_values=True)
        assert idx.shape == (k,) and val.shape == (k,), k
        want_idx, want_val = ref_topk(row[None, :], k)
        np.testing.assert_array_equal(idx, want_idx[0])
        np.testing.assert_array_equal(val, want_val[0])
    idx = flashsel.topk(X, 3)
    assert idx.shape == (3, 3)


# ---------------------------------------------------------------------------
# lengths: one per row, or a scalar for every row; int32 or int64
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scalar",
    [5, np.int64(5), np.int32(5), np.array(5), np.array(5, np.int32), np.array(5, ">i8")],
    ids=["int", "np.int64", "np.int32", "0-d int64", "0-d int32", "0-d >i8"],
)
def test_scalar_lengths_apply_to_every_row(scalar):
    want = flashsel.topk(X, 4, lengths=[5, 5, 5], return_values=True)
    got = flashsel.topk(X, 4, lengths=scalar, return_values=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert np.all(got[0] < 5)


def test_scalar_lengths_edges():
    np.testing.assert_array_equal(flashsel.topk(X, 2, lengths=0), np.full((3, 2), -1, np.int32))
    np.testing.assert_array_equal(flashsel.topk(X, 2, lengths=8), flashsel.topk(X, 2))
    assert flashsel.topk(np.zeros((0, 8), np.float32), 2, lengths=3).shape == (0, 2)
    with pytest.raises(ValueError, match="lengths = 9 is outside 0..=8"):
        flashsel.topk(X, 2, lengths=9)
    with pytest.raises(ValueError, match="lengths = -1 is outside 0..=8"):
        flashsel.topk(X, 2, lengths=np.array(-1))
    with pytest.raises(ValueError, match="lengths = 9 is outside 0..=8"):
        flashsel.topk(np.zeros((0, 8), np.float32), 2, lengths=9)  # checked with no row to apply it to


@pytest.mark.parametrize("dtype", ["<i4", "<i8", ">i4", ">i8"])
def test_lengths_int32_int64_either_byte_order(dtype):
    lens = np.array([0, 3, 8], dtype)
    want = flashsel.topk(X, 4, lengths=[0, 3, 8])
    np.testing.assert_array_equal(flashsel.topk(X, 4, lengths=lens), want)


@pytest.mark.parametrize("dtype", ["u1", "i1", "u2", "i2", "u4", "u8", "f4", "?"])
def test_lengths_of_other_dtypes_are_refused(dtype):
    with pytest.raises(TypeError, match=f"lengths must be int32 or int64.*got dtype {np.dtype(dtype)}"):
        flashsel.topk(X, 2, lengths=np.array([1, 1, 1], dtype))
    with pytest.raises(TypeError, match="lengths must be int32 or int64"):
        flashsel.topk(X, 2, lengths=np.array(1, dtype))


def test_lengths_shape_errors_say_what_was_expected():
    with pytest.raises(ValueError, match="lengths has 2 entries but scores has 3 rows"):
        flashsel.topk(X, 2, lengths=[1, 2])
    with pytest.raises(ValueError, match="lengths has 2 entries but scores has 1 row\\b"):
        flashsel.topk(X[0], 2, lengths=[1, 2])
    with pytest.raises(ValueError, match="lengths must be a scalar or 1-D with one entry per row, got shape \\(3, 1\\)"):
        flashsel.topk(X, 2, lengths=np.ones((3, 1), np.int64))
    with pytest.raises(TypeError, match="lengths must be int32 or int64"):
        flashsel.topk(X, 2, lengths=2.0)
    with pytest.raises(TypeError, match="lengths must be int32 or int64"):
        flashsel.topk(X, 2, lengths=True)


# ---------------------------------------------------------------------------
# bfloat16 as raw bits: uint16 / int16 arrays
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bits_dtype", [np.uint16, np.int16], ids=["uint16", "int16"])
@pytest.mark.parametrize("kind", ["normal", "few", "nan5", "inf", "zeros"])
def test_uint16_int16_arrays_are_bf16_bit_patterns(bits_dtype, kind):
    rng = np.random.default_rng(20)
    x32 = bf16_bits_to_f32(f32_to_bf16_bits(make(kind, 4, 300, np.float32, rng)))  # bf16-exact
    raw = f32_to_bf16_bits(x32).view(bits_dtype)
    lengths = [300, 0, 7, 150]
    for order, nan in [("score", "lowest"), ("index", "largest")]:
        idx, val = flashsel.topk(raw, 40, lengths=lengths, order=order, nan=nan, return_values=True)
        want_idx, _ = ref_topk(x32, 40, lengths, order, nan)
        np.testing.assert_array_equal(idx, want_idx)
        assert val.dtype == np.dtype(bits_dtype), "values come back in the input's integer dtype"
        sel = np.take_along_axis(raw, np.maximum(want_idx, 0), axis=1)
        pad = np.array(0xFF80, np.uint16).view(bits_dtype)  # bf16 -inf
        np.testing.assert_array_equal(val, np.where(want_idx < 0, pad, sel))


@pytest.mark.skipif(BF16 is None, reason="ml_dtypes is not installed")
def test_bf16_bits_match_ml_dtypes_bfloat16():
    rng = np.random.default_rng(21)
    x = make("relu", 3, 500, np.float32, rng).astype(BF16)
    want_idx, want_val = flashsel.topk(x, 64, return_values=True)
    idx, val = flashsel.topk(x.view(np.uint16), 64, return_values=True)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(val, want_val.view(np.uint16))


# ---------------------------------------------------------------------------
# Byte order: big-endian arrays are converted; results are native
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f4", "f2", "u2", "i2"])
def test_big_endian_scores_are_converted(dtype):
    rng = np.random.default_rng(22)
    base = make("few", 3, 200, np.float32, rng)
    native = f32_to_bf16_bits(base).view(dtype) if dtype in ("u2", "i2") else base.astype(dtype)
    big = native.astype(np.dtype(dtype).newbyteorder(">"))
    assert not big.dtype.isnative
    lengths = np.array([200, 50, 1], ">i4")
    want = flashsel.topk(native, 30, lengths=[200, 50, 1], return_values=True)
    got = flashsel.topk(big, 30, lengths=lengths, return_values=True)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].dtype == native.dtype and got[1].dtype.isnative
    np.testing.assert_array_equal(got[1].view(np.uint8), want[1].view(np.uint8))
    # A strided big-endian view too (the conversion copies only the view).
    wide = np.zeros((6, 250), big.dtype)
    wide[::2, 10:210] = big
    got = flashsel.topk(wide[::2, 10:210], 30, return_values=True)
    want = flashsel.topk(native, 30, return_values=True)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1].view(np.uint8), want[1].view(np.uint8))


# ---------------------------------------------------------------------------
# Dtypes refused, k = 0
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f8", "i4", "u4", "i8", "u1", "i1", "?", "c8", ">f8", "V2", "U1", "O"])
def test_other_dtypes_are_refused_naming_the_accepted_ones(dtype):
    x = np.zeros((2, 4), dtype)
    with pytest.raises(TypeError) as e:
        flashsel.topk(x, 2)
    msg = str(e.value)
    assert f"unsupported scores dtype {x.dtype}" in msg
    for accepted in ["float32", "float16", "bfloat16", "uint16", "int16"]:
        assert accepted in msg, (accepted, msg)


def test_k_zero_is_a_value_error():
    for x in (X, X[0], np.zeros((0, 8), np.float32)):
        with pytest.raises(ValueError, match="k must be at least 1 \\(got 0\\)"):
            flashsel.topk(x, 0)
    with pytest.raises(ValueError, match="k must be at least 1"):
        flashsel.topk(X, np.int64(0))


def test_scores_shape_errors_give_a_hint():
    with pytest.raises(ValueError, match="got shape \\(2, 3, 4\\).*reshape\\(-1, 4\\)"):
        flashsel.topk(np.zeros((2, 3, 4), np.float32), 1)
    with pytest.raises(TypeError, match="got builtins.list.*np.asarray"):
        flashsel.topk([1.0, 2.0], 1)
