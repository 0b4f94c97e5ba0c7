"""flashsel.topk on the CPU engine: NumPy in, NumPy out, checked bit for bit
against the reference in _ref.py (written from the contract, not the library)."""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import pydoc
import subprocess
import sys
import zlib

import numpy as np
import pytest

import flashsel
from _ref import BF16, KINDS, assert_same, bits, make, ref_topk

DTYPES = [np.dtype(np.float32), np.dtype(np.float16)] + ([BF16] if BF16 is not None else [])
# The parametrised tests list bfloat16 always: without ml_dtypes it is reported as skipped.
DTYPE_PARAMS = [
    pytest.param(np.dtype(np.float32), id="float32"),
    pytest.param(np.dtype(np.float16), id="float16"),
    pytest.param(BF16, id="bfloat16", marks=pytest.mark.skipif(BF16 is None, reason="ml_dtypes is not installed")),
]


def check(x2, k, lengths=None, order="score", nan="lowest", ctx=""):
    idx, val = flashsel.topk(x2, k, lengths=lengths, order=order, nan=nan, return_values=True)
    assert isinstance(idx, np.ndarray) and idx.dtype == np.int32 and idx.shape == (x2.shape[0], k)
    assert val.dtype == x2.dtype and val.shape == (x2.shape[0], k)
    want_idx, want_val = ref_topk(x2, k, lengths, order, nan)
    assert_same(idx, val, want_idx, want_val, ctx)
    # Without values: the same indices.
    idx2 = flashsel.topk(x2, k, lengths=lengths, order=order, nan=nan)
    np.testing.assert_array_equal(idx2, want_idx)


# ---------------------------------------------------------------------------
# Contract on random and adversarial inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("order", ["score", "index"])
@pytest.mark.parametrize("nan", ["lowest", "largest"])
def test_kinds_orders_nans(dtype, kind, order, nan):
    rng = np.random.default_rng(zlib.crc32(f"{dtype} {kind} {order} {nan}".encode()))
    for rows, cols, k in [(3, 97, 10), (2, 1000, 1), (2, 1000, 64), (1, 300, 300), (2, 50, 80), (1, 1, 1)]:
        x = make(kind, rows, cols, dtype, rng)
        check(x, k, order=order, nan=nan, ctx=f"{kind} {rows}x{cols} k={k}")


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("kind", ["normal", "relu", "few", "nan5"])
def test_lengths_edges(dtype, kind):
    """Lengths 0, 1, k-1, k, k+1 and cols in one batch, both orders and NaN policies."""
    rng = np.random.default_rng(7)
    cols, k = 200, 16
    lens = [0, 1, k - 1, k, k + 1, cols, cols - 1, 37]
    x = make(kind, len(lens), cols, dtype, rng)
    for order, nan in itertools.product(["score", "index"], ["lowest", "largest"]):
        for lengths in (lens, np.array(lens, np.int64), np.array(lens, np.int32), np.array(lens, ">i4")):
            check(x, k, lengths=lengths, order=order, nan=nan, ctx=f"lengths={lens}")


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_k_edges(dtype):
    rng = np.random.default_rng(3)
    cols = 33
    x = make("few", 4, cols, dtype, rng)
    for k in [1, 2, cols - 1, cols, cols + 1, 3 * cols]:
        check(x, k, ctx=f"k={k}")
        check(x, k, order="index", ctx=f"k={k}")


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_long_rows(dtype):
    """Rows long enough for the engine's within-row split (>= 64 Ki candidates)."""
    rng = np.random.default_rng(11)
    for kind in ["normal", "relu", "ascending", "few"]:
        x = make(kind, 1, 70_000, dtype, rng)
        for k in [1, 100, 2048]:
            check(x, k, ctx=f"{kind} k={k}")
    x = make("relu", 2, 140_000, dtype, rng)
    check(x, 512, lengths=[140_000, 65_537], ctx="2 long rows with lengths")


def test_many_rows_random_shapes():
    rng = np.random.default_rng(2024)
    for _ in range(40):
        rows = int(rng.integers(1, 9))
        cols = int(rng.integers(1, 3000))
        k = int(rng.integers(1, cols + 10))
        kind = KINDS[int(rng.integers(len(KINDS)))]
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        x = make(kind, rows, cols, dtype, rng)
        lengths = rng.integers(0, cols + 1, rows) if rng.random() < 0.5 else None
        order = ["score", "index"][int(rng.integers(2))]
        nan = ["lowest", "largest"][int(rng.integers(2))]
        check(x, k, lengths=lengths, order=order, nan=nan, ctx=f"{kind} {dtype} {rows}x{cols} k={k}")


def test_doc_example():
    x = np.array([0.5, 2.0, -1.0, 2.0, np.nan, 0.0, -0.0], np.float32)
    np.testing.assert_array_equal(flashsel.topk(x, 4), [1, 3, 0, 5])
    np.testing.assert_array_equal(flashsel.topk(x, 4, order="index"), [0, 1, 3, 5])
    np.testing.assert_array_equal(flashsel.topk(x, 4, nan="largest"), [4, 1, 3, 0])
    idx, val = flashsel.topk(x, 4, lengths=2, return_values=True)
    np.testing.assert_array_equal(idx, [1, 0, -1, -1])
    np.testing.assert_array_equal(val, [2.0, 0.5, -np.inf, -np.inf])


# ---------------------------------------------------------------------------
# Shapes, strides, output kinds
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_one_dimensional(dtype):
    rng = np.random.default_rng(5)
    x = make("relu", 1, 500, dtype, rng)[0]
    idx, val = flashsel.topk(x, 20, return_values=True)
    assert idx.shape == (20,) and val.shape == (20,) and val.dtype == dtype
    want_idx, want_val = ref_topk(x[None, :], 20)
    assert_same(idx, val, want_idx[0], want_val[0])
    # A scalar or one-element length for one row.
    for lengths in (7, [7], np.int64(7)):
        idx = flashsel.topk(x, 20, lengths=lengths)
        np.testing.assert_array_equal(idx, ref_topk(x[None, :], 20, [7])[0][0])


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_row_strided_views_are_read_in_place(dtype, monkeypatch):
    """A view of every other row and a column window of a wider matrix is read
    with its row stride: the extension gets a view of the caller's memory, not
    a copy, and the answer matches the reference on the same view."""
    rng = np.random.default_rng(9)
    big = make("few", 12, 400, dtype, rng)
    view = big[::2, 13:313]
    assert not view.flags.c_contiguous

    seen = {}
    real = flashsel._native.select_cpu

    def spy(scores, *args):
        seen["shares"] = np.shares_memory(scores, big)
        seen["strides"] = scores.strides
        return real(scores, *args)

    monkeypatch.setattr(flashsel._native, "select_cpu", spy)
    for order, nan in itertools.product(["score", "index"], ["lowest", "largest"]):
        check(view, 25, lengths=rng.integers(0, 301, 6), order=order, nan=nan)
    assert seen["shares"] and seen["strides"][0] == 2 * 400 * big.itemsize

    # Rows of a 3-D tensor's slice, and a single row out of the middle.
    cube = make("normal", 4, 3 * 50, dtype, rng).reshape(4, 3, 50)
    check(cube[:, 1, :], 10)
    check(big[5:6, 100:], 10)


def test_empty_inputs():
    x = np.zeros((0, 10), np.float32)
    idx, val = flashsel.topk(x, 3, return_values=True)
    assert idx.shape == (0, 3) and val.shape == (0, 3)
    idx = flashsel.topk(x, 3, lengths=[])
    assert idx.shape == (0, 3)
    x = np.zeros((2, 0), np.float16)
    idx, val = flashsel.topk(x, 3, return_values=True)
    np.testing.assert_array_equal(idx, -np.ones((2, 3), np.int32))
    assert np.all(np.isneginf(val.astype(np.float32)))
    idx = flashsel.topk(np.zeros(0, np.float32), 2, lengths=0)
    np.testing.assert_array_equal(idx, [-1, -1])


def test_readonly_and_fortran_inputs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 64), dtype=np.float32)
    x.setflags(write=False)
    check(x, 8)
    # A Fortran-ordered matrix has strided columns: refused, not copied.
    with pytest.raises(ValueError, match="contiguous"):
        flashsel.topk(np.asfortranarray(x), 8)
    # ...but a Fortran array with one row is just a contiguous row.
    check(np.asfortranarray(x[:1]), 8)


def test_threads():
    """Concurrent calls (the GIL is released while selecting) stay exact."""
    rng = np.random.default_rng(4)
    xs = [make(kind, 3, 20_000, np.float32, rng) for kind in ["normal", "relu", "few", "nan5"] * 3]

    def one(x):
        return flashsel.topk(x, 300, return_values=True)

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(one, xs))
    for x, (idx, val) in zip(xs, results):
        assert_same(idx, val, *ref_topk(x, 300))


# ---------------------------------------------------------------------------
# Errors: a clear exception, never a crash
# ---------------------------------------------------------------------------

X = np.zeros((3, 8), np.float32)

ERRORS = [
    # (call, exception, message fragment)
    (lambda: flashsel.topk([1.0, 2.0], 1), TypeError, "numpy.ndarray or a torch.Tensor"),
    (lambda: flashsel.topk(X.astype(np.float64), 1), TypeError, "float64"),
    (lambda: flashsel.topk(X.astype(np.int32), 1), TypeError, "int32"),
    (lambda: flashsel.topk(X.astype(np.complex64), 1), TypeError, "complex64"),
    (lambda: flashsel.topk(X, 1.0), TypeError, "k must be an integer"),
    (lambda: flashsel.topk(X, True), TypeError, "bool"),
    (lambda: flashsel.topk(X, "2"), TypeError, "k must be an integer"),
    (lambda: flashsel.topk(X, 0), ValueError, "k must be at least 1"),
    (lambda: flashsel.topk(X, -3), ValueError, "k must be at least 1"),
    (lambda: flashsel.topk(X, 2**31), ValueError, "does not fit in i32"),
    (lambda: flashsel.topk(X, 2**80), ValueError, "does not fit in i32"),
    (lambda: flashsel.topk(X, 2**30), ValueError, "rows \\* k"),
    (lambda: flashsel.topk(np.zeros((2, 2, 2), np.float32), 1), ValueError, "1-D \\[cols\\] or 2-D"),
    (lambda: flashsel.topk(np.float32(1.0), 1), TypeError, "numpy.ndarray"),
    (lambda: flashsel.topk(np.zeros((), np.float32), 1), ValueError, "1-D \\[cols\\] or 2-D"),
    (lambda: flashsel.topk(X, 2, order="values"), ValueError, "invalid order: 'values' \\(expected score\\|index\\)"),
    (lambda: flashsel.topk(X, 2, order=None), TypeError, "order must be a str"),
    (lambda: flashsel.topk(X, 2, nan="smallest"), ValueError, "invalid nan: 'smallest' \\(expected lowest\\|largest\\)"),
    (lambda: flashsel.topk(X, 2, nan=0), TypeError, "nan must be a str"),
    (lambda: flashsel.topk(X, 2, lengths=[1, 2]), ValueError, "lengths has 2 entries but scores has 3 rows"),
    (lambda: flashsel.topk(X, 2, lengths=[1, 2, 3, 4]), ValueError, "lengths has 4 entries but scores has 3 rows"),
    (lambda: flashsel.topk(X, 2, lengths=[[1, 2, 3]]), ValueError, "lengths must be a scalar or 1-D"),
    (lambda: flashsel.topk(X, 2, lengths=9), ValueError, "lengths = 9 is outside 0..=8"),
    (lambda: flashsel.topk(X, 2, lengths=[1, -1, 2]), ValueError, "lengths\\[1\\] = -1 is outside 0..=8"),
    (lambda: flashsel.topk(X, 2, lengths=[1, 2, 9]), ValueError, "lengths\\[2\\] = 9 is outside 0..=8"),
    (lambda: flashsel.topk(X, 2, lengths=np.array([1, 2**40, 3])), ValueError, "lengths\\[1\\] = 1099511627776"),
    (lambda: flashsel.topk(X, 2, lengths=[1.0, 2.0, 3.0]), TypeError, "lengths must be int32 or int64"),
    (lambda: flashsel.topk(X, 2, lengths=[True, False, True]), TypeError, "lengths must be int32 or int64"),
    (lambda: flashsel.topk(X, 2, lengths=["a", "b", "c"]), TypeError, "lengths must be int32 or int64"),
    (lambda: flashsel.topk(X, 2, lengths=np.array([1, 2, 3], np.uint16)), TypeError, "got dtype uint16"),
    (lambda: flashsel.topk(X[:, ::2], 2), ValueError, "column stride 2"),
    (lambda: flashsel.topk(X[0, ::3], 2), ValueError, "column stride 3"),
    (lambda: flashsel.topk(X[::-1], 2), ValueError, "row stride -32 bytes"),
    (lambda: flashsel.topk(np.broadcast_to(X[0], (3, 8)), 2), ValueError, "row stride 0 bytes"),
    (lambda: flashsel.topk(X.T, 2), ValueError, "contiguous"),
    (lambda: flashsel.topk(np.ma.masked_array(X), 2), TypeError, "masked arrays"),
    (lambda: flashsel.topk(X.astype(">f8"), 2), TypeError, ">f8"),
    (
        lambda: flashsel.topk(np.frombuffer(b"\0" * 33, np.float32, count=8, offset=1).reshape(2, 4), 2),
        ValueError,
        "aligned",
    ),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors(i):
    call, exc, msg = ERRORS[i]
    with pytest.raises(exc, match=msg):
        call()


def test_native_checks_are_a_second_line():
    """The extension re-checks what the Python layer checks, so a bad call
    straight into it raises too."""
    n = flashsel._native
    out = np.empty((3, 2), np.int32)
    with pytest.raises(ValueError, match="contiguous"):
        n.select_cpu(X[:, ::2], "f32", 2, "score", "lowest", None, out, None)
    with pytest.raises(ValueError, match="out_indices holds 6 elements, expected 3 x 4"):
        n.select_cpu(X, "f32", 4, "score", "lowest", None, out, None)
    with pytest.raises(ValueError, match="lengths\\[0\\] = 9"):
        n.select_cpu(X, "f32", 2, "score", "lowest", np.array([9, 1, 1], np.int32), out, None)
    with pytest.raises(ValueError, match="out_values"):
        n.select_cpu(X, "f32", 2, "score", "lowest", None, out, np.empty((3, 3), np.float32))
    with pytest.raises(TypeError):
        n.select_cpu(X, "f16", 2, "score", "lowest", None, out, None)  # f16 travels as uint16
    with pytest.raises(ValueError, match="unsupported dtype"):
        n.select_cpu(X, "f64", 2, "score", "lowest", None, out, None)
    with pytest.raises(ValueError, match="invalid order"):
        n.check_spec("f32", 3, 8, 8, 2, "up", "lowest")
    with pytest.raises(ValueError, match="row stride 4 is shorter than cols = 8"):
        n.check_spec("f32", 3, 8, 4, 2, "score", "lowest")


OOM_CHILD = """
import resource, sys
import numpy as np, flashsel
page = resource.getpagesize()
in_use = int(open("/proc/self/statm").read().split()[0]) * page
# Room for the input (128 MiB) and the index output (64 MiB), not for the
# engine's scratch of 16 bytes per selected entry (256 MiB).
resource.setrlimit(resource.RLIMIT_AS, (in_use + (400 << 20), resource.RLIM_INFINITY))
try:
    idx = flashsel.topk(np.zeros(1 << 25, np.float32), 1 << 24)
    print("selected", idx.shape)
except MemoryError as e:
    print("MemoryError:", e)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/statm are Linux's")
def test_out_of_memory_is_a_memory_error_not_an_abort():
    """A request whose memory cannot be had raises MemoryError (or fits) and
    leaves the interpreter running: never an abort (in a child process with a
    capped address space)."""
    env = dict(os.environ, RAYON_NUM_THREADS="1", MALLOC_ARENA_MAX="1")  # fixed overheads, any machine
    r = subprocess.run([sys.executable, "-c", OOM_CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.startswith(("MemoryError:", "selected (16777216,)")), r.stdout + r.stderr


@pytest.mark.skipif(BF16 is None, reason="ml_dtypes is not installed")
def test_bf16_padding_bits():
    x = np.array([[1.0, 2.0]], BF16)
    idx, val = flashsel.topk(x, 4, return_values=True)
    np.testing.assert_array_equal(idx, [[1, 0, -1, -1]])
    np.testing.assert_array_equal(bits(val), [[0x4000, 0x3F80, 0xFF80, 0xFF80]])


# ---------------------------------------------------------------------------
# Module surface
# ---------------------------------------------------------------------------


def test_version_and_help():
    assert isinstance(flashsel.__version__, str) and flashsel.__version__.count(".") == 2
    text = " ".join(pydoc.render_doc(flashsel.topk, renderer=pydoc.plaintext).split())
    for needle in ["order", "score", "index", "lower column index", "NaN", "-inf", "-1", "lengths", "ValueError"]:
        assert needle in text, needle
    assert "ties" in (flashsel.__doc__ or "").lower()


def test_backends_report():
    b = flashsel.backends()
    assert b["cpu"]["available"] is True
    cuda = b["cuda"]
    assert isinstance(cuda["available"], bool)
    if not cuda["available"]:
        assert isinstance(cuda["reason"], str) and cuda["reason"]


def test_native_cuda_entry_points_without_a_gpu():
    """Where no CUDA engine can start, the device entry points raise with the
    reason before touching any pointer (here: bogus ones)."""
    n = flashsel._native
    why = n.cuda_engine_error(0)
    if why is None:
        pytest.skip("a CUDA engine starts here: tests/test_cuda.py covers it")
    assert isinstance(why, str) and why
    with pytest.raises(RuntimeError, match="unavailable"):
        n.cuda_workspace_bytes(0, "f32", 1, 10, 10, 2, "score", "lowest", False)
    with pytest.raises(RuntimeError, match="unavailable"):
        n.cuda_select(0, "f32", 1, 10, 10, 2, "score", "lowest", 8, None, 8, None, 256, 0, 0)
    with pytest.raises(ValueError, match="k must be at least 1"):
        n.cuda_select(0, "f32", 1, 10, 10, 0, "score", "lowest", 8, None, 8, None, 256, 0, 0)
    with pytest.raises(ValueError, match="null device pointer"):
        n.cuda_select(0, "f32", 1, 10, 10, 2, "score", "lowest", 0, None, 8, None, 256, 0, 0)
