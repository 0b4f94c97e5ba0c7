"""The implementation behind the public ``flashsel`` names (private: import
from ``flashsel``). Checks the caller's arrays and tensors, allocates the
outputs with the caller's library and calls the native extension."""

import operator
import sys
import threading
from typing import Any, Literal

import numpy as np

from . import _native

_ORDERS = ("score", "index")
_NANS = ("lowest", "largest")
_I32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def topk(
    scores: Any,
    k: int,
    *,
    lengths: Any = None,
    order: Literal["score", "index"] = "score",
    nan: Literal["lowest", "largest"] = "lowest",
    return_values: bool = False,
    starts: Any = None,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> Any:
    """Exact, deterministic top-k of each row of ``scores``.

    Parameters
    ----------
    scores
        A NumPy array or a torch tensor on the CPU or a CUDA device, of shape
        ``[rows, cols]`` or ``[cols]`` (one row). NumPy dtypes: float32,
        float16, ``ml_dtypes.bfloat16``, or uint16 / int16 holding bfloat16
        bit patterns (as the CLI reads ``<u2`` / ``<i2`` .npy files), in either
        byte order (big-endian arrays are converted, a copy). torch dtypes:
        float32, float16, bfloat16 (an int16 tensor of bf16 bits is refused:
        pass ``x.view(torch.bfloat16)``). Any other dtype raises
        ``TypeError``; nothing is cast implicitly. Rows may be strided
        (a row-slice or column-slice view of a larger matrix is read in place,
        not copied), but the elements of a row must be contiguous
        (column stride 1); anything else raises ``ValueError``: pass
        ``np.ascontiguousarray(x)`` / ``x.contiguous()`` yourself if a copy is
        what you want.
    k
        How many to select per row, ``k >= 1``. ``k`` may exceed ``cols``: the
        rest of the row is padding.
    lengths
        Optional candidate counts: row ``i`` selects among columns
        ``0 .. lengths[i]``, each ``0 <= lengths[i] <= cols``. Either one entry
        per row (1-D) or a scalar (a Python int, a 0-d array or tensor) that
        applies to every row. Arrays and tensors must be int32 or int64 (NumPy:
        either byte order); a sequence of Python ints is fine. For host inputs:
        a sequence, a NumPy array or a CPU tensor, checked. For CUDA inputs: a
        Python int (checked), or an int32 / int64 tensor on the same device
        (int64 is converted on the device); a tensor's values are not checked
        on the host, as that would need a synchronisation: a row whose length
        is outside ``0..=cols`` comes out as all padding.
    order
        ``"score"`` (best first, the default) or ``"index"`` (ascending
        column index, the same set).
    nan
        ``"lowest"`` (default: NaN below ``-inf``) or ``"largest"`` (NaN above
        ``+inf``, like ``torch.topk``).
    starts
        Per-row range starts (DSA's ``ks``): row ``i``
        selects among columns ``starts[i] .. lengths[i]`` (half-open, ends
        default to ``cols``); indices stay absolute column numbers. A query at
        position ``t`` that may attend to its own key passes ``lengths[i] = t +
        1``. One int32/int64 entry per row, or a scalar for every row; each in
        ``0..=end``; for CUDA inputs as ``lengths`` (a tensor's values are
        not checked: a row whose range is out of bounds comes out as all
        padding).
    return_values
        Also return the selected scores, bit for bit in the input dtype
        (native byte order; ``-inf`` where padded, i.e. ``0xFF80`` for bf16
        bit patterns).

    Returns
    -------
    indices, or (indices, values)
        The same kind as ``scores`` (NumPy array, or torch tensor on the same
        device): int32 indices ``[rows, k]`` (``[k]`` for 1-D input), ``-1``
        where padded; values in the input dtype (uint16 / int16 bit patterns
        come back as the same integer dtype).

    Ordering contract
    -----------------
    Larger scores rank higher; ``-0.0 == +0.0``; ties go to the lower column
    index; NaN ranks below ``-inf`` (``nan="lowest"``) or above ``+inf``
    (``nan="largest"``). Every backend returns the same bytes.

    CUDA
    ----
    The selection is launched on ``torch.cuda.current_stream(scores.device)``
    and returns without waiting; outputs and workspace come from torch's
    allocator on that stream, and nothing waits on the host, so the call can
    be captured in a CUDA graph. The first call on a device creates its engine
    and compiles its kernels (seconds, once per process): make it before
    capturing, or call :func:`backends`, which does the same.

    Raises
    ------
    TypeError
        ``scores`` or ``lengths`` of an unsupported type or dtype.
    ValueError
        Bad shape, ``k``, ``lengths``, option or strides; device mismatch.
    RuntimeError
        The CUDA engine cannot run (see :func:`backends`) or the driver failed.
    """
    k = _check_k(k)
    order = _check_option("order", order, _ORDERS)
    nan = _check_option("nan", nan, _NANS)
    return_values = bool(return_values)
    page_size = _check_k(page_size)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(scores, torch.Tensor):
        if scores.layout != torch.strided:
            raise TypeError(f"scores must be a dense (strided) tensor, got layout {scores.layout}")
        if scores.device.type not in ("cpu", "cuda"):
            raise ValueError(f"scores is on device {scores.device}; flashsel runs on the CPU and on CUDA devices")
        # Through the torch operator flashsel::topk (torch.compile, CUDA graphs):
        # _topk_torch_cpu or _topk_cuda by device.
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.topk(scores, k, lengths, order, nan, return_values, starts, page_table, page_size, seq_ids)
    if isinstance(scores, np.ma.MaskedArray):
        raise TypeError("masked arrays are not supported: pass the data with masked scores filled (or use lengths)")
    if isinstance(scores, np.ndarray):
        return _topk_numpy(scores, k, lengths, order, nan, return_values, starts, (page_table, page_size, seq_ids))
    raise TypeError(
        f"scores must be a numpy.ndarray or a torch.Tensor, got {type(scores).__module__}.{type(scores).__qualname__}"
        " (for a list of floats: np.asarray(x, dtype=np.float32))"
    )


def backends() -> dict[str, dict[str, Any]]:
    """What can run here, and why not.

    Returns a dict with one entry per backend::

        {"cpu":  {"available": True, "reason": None, ...},
         "cuda": {"available": bool, "reason": str | None, "devices": [...]}}

    ``cuda`` is available when torch is importable, sees a CUDA device and the
    flashsel CUDA engine can be created on it; otherwise ``reason`` says which
    of these failed. This imports torch if it is installed, and creates (and
    caches) the engine of each visible device.
    """
    out: dict[str, dict[str, Any]] = {
        "cpu": {
            "available": True,
            "reason": None,
            "inputs": f"numpy.ndarray ({_NUMPY_ACCEPTED}); CPU torch.Tensor ({_TORCH_ACCEPTED})",
        }
    }
    cuda: dict[str, Any] = {"available": False, "reason": None, "devices": []}
    out["cuda"] = cuda
    try:
        import torch  # noqa: PLC0415 - optional dependency
    except Exception as e:  # ImportError, or a broken install
        cuda["reason"] = f"torch is not importable ({type(e).__name__}: {e}); the CUDA path takes CUDA torch tensors"
        return out
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as e:
        cuda["reason"] = f"torch.cuda failed: {type(e).__name__}: {e}"
        return out
    if n == 0:
        cuda["reason"] = f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
        return out
    reasons = []
    for i in range(n):
        err = _native.cuda_engine_error(i)
        cuda["devices"].append(
            {"index": i, "name": torch.cuda.get_device_name(i), "available": err is None, "reason": err}
        )
        if err is not None:
            reasons.append(f"cuda:{i}: {err}")
    cuda["available"] = any(d["available"] for d in cuda["devices"])
    cuda["reason"] = "; ".join(reasons) if reasons else None
    return out


# ---------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------


def _check_k(k: Any) -> int:
    if isinstance(k, bool):
        raise TypeError("k must be an integer, got bool")
    try:
        k = operator.index(k)
    except TypeError:
        raise TypeError(f"k must be an integer, got {type(k).__name__}") from None
    if k <= 0:
        raise ValueError(f"k must be at least 1 (got {k})")
    if k > _I32_MAX:
        raise ValueError(f"k = {k} does not fit in i32 (max {_I32_MAX})")
    return k


def _check_option(what: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, one of {'|'.join(allowed)}; got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"invalid {what}: {value!r} (expected {'|'.join(allowed)})")
    return value


def _as_2d_shape(shape: tuple[int, ...]) -> tuple[int, int, bool]:
    """(rows, cols, was_1d) for a 1-D or 2-D shape."""
    if len(shape) == 1:
        return 1, shape[0], True
    if len(shape) == 2:
        return shape[0], shape[1], False
    hint = f"; for a batch of rows, pass x.reshape(-1, {shape[-1]})" if len(shape) > 2 else ""
    raise ValueError(f"scores must be 1-D [cols] or 2-D [rows, cols], got shape {tuple(shape)}{hint}")


def _rows_phrase(rows: int) -> str:
    return "1 row" if rows == 1 else f"{rows} rows"


def _check_length_value(value: int, cols: int, where: str = "") -> None:
    if not 0 <= value <= cols:
        raise ValueError(f"lengths{where} = {value} is outside 0..={cols}")


def _lengths_dtype_error(got: Any) -> TypeError:
    return TypeError(
        f"lengths must be int32 or int64 (a scalar for every row, or one entry per row), got {got}; "
        "cast explicitly, e.g. lengths.astype(np.int64)"
    )


def _is_int32_or_int64(dtype: np.dtype) -> bool:
    return dtype.kind == "i" and dtype.itemsize in (4, 8)


def _scalar_length(lengths: Any, cols: int) -> int | None:
    """The value of a host scalar length (a Python int, a NumPy integer scalar
    or 0-d array), checked to be in 0..=cols; None when `lengths` is not one."""
    if isinstance(lengths, (bool, np.bool_)):
        raise _lengths_dtype_error("bool")
    if isinstance(lengths, int):
        _check_length_value(lengths, cols)
        return lengths
    if isinstance(lengths, (np.ndarray, np.generic)) and lengths.ndim == 0:
        if not _is_int32_or_int64(lengths.dtype):
            raise _lengths_dtype_error(f"dtype {lengths.dtype}")
        value = int(lengths)
        _check_length_value(value, cols)
        return value
    return None


def _host_lengths(lengths: Any, rows: int, cols: int) -> np.ndarray | None:
    """Host lengths (a scalar for every row, or one entry per row) as a
    contiguous int32 array of `rows` entries, each checked to be in 0..=cols."""
    if lengths is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(lengths, torch.Tensor):
        if lengths.device.type != "cpu":
            raise ValueError(f"lengths is on {lengths.device} but scores are in host memory; pass CPU lengths")
        if lengths.dtype not in (torch.int32, torch.int64):
            raise _lengths_dtype_error(lengths.dtype)
        lengths = lengths.detach().numpy()
    scalar = _scalar_length(lengths, cols)
    if scalar is not None:
        return np.full(rows, scalar, dtype=np.int32)
    arr = np.asarray(lengths)
    if arr.size == 0 and arr.ndim == 1 and not isinstance(lengths, np.ndarray):
        arr = arr.astype(np.int64)  # [] for zero rows
    if not _is_int32_or_int64(arr.dtype):
        raise _lengths_dtype_error(f"dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a scalar or 1-D with one entry per row, got shape {arr.shape}")
    if arr.shape[0] != rows:
        raise ValueError(f"lengths has {arr.shape[0]} entries but scores has {_rows_phrase(rows)}")
    if arr.size:
        bad = np.flatnonzero((arr < 0) | (arr > cols))
        if bad.size:
            i = int(bad[0])
            _check_length_value(int(arr[i]), cols, f"[{i}]")
    return np.ascontiguousarray(arr, dtype=np.int32)  # also converts big-endian arrays


# ---------------------------------------------------------------------------
# Host paths
# ---------------------------------------------------------------------------

_NUMPY_ACCEPTED = (
    "float32, float16, bfloat16 (ml_dtypes.bfloat16), or uint16 / int16 holding bfloat16 bit patterns, "
    "in either byte order"
)
_TORCH_ACCEPTED = "torch.float32, torch.float16 or torch.bfloat16"

# NumPy dtype (native byte order) -> (contract dtype name, the dtype its bits travel as)
_NP_KINDS = {
    np.dtype(np.float32): ("f32", np.dtype(np.float32)),
    np.dtype(np.float16): ("f16", np.dtype(np.uint16)),
    np.dtype(np.uint16): ("bf16", np.dtype(np.uint16)),  # bf16 bit patterns, as the CLI's <u2
    np.dtype(np.int16): ("bf16", np.dtype(np.uint16)),  # bf16 bit patterns, as the CLI's <i2
}


def _numpy_kind(dtype: np.dtype) -> tuple[str, np.dtype, np.dtype]:
    """(contract dtype name, bits dtype, native-byte-order dtype) of a score
    dtype in either byte order, or TypeError naming the accepted ones."""
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    kind = _NP_KINDS.get(native)
    if kind is not None:
        return kind[0], kind[1], native
    if native.name == "bfloat16" and native.itemsize == 2:  # ml_dtypes.bfloat16
        return "bf16", np.dtype(np.uint16), native
    raise TypeError(
        f"unsupported scores dtype {dtype}: flashsel takes {_NUMPY_ACCEPTED}; "
        "cast explicitly, e.g. x.astype(np.float32)"
    )


def _host_select(
    bits: np.ndarray,
    name: str,
    k: int,
    lengths: np.ndarray | None,
    order: str,
    nan: str,
    out_indices: np.ndarray,
    out_value_bits: np.ndarray | None,
    starts: np.ndarray | None = None,
    pages: tuple[Any, int, Any] | None = None,
) -> None:
    table, page_size, seqs = _host_pages(pages, out_indices.shape[0])
    _native.select_cpu(bits, name, k, order, nan, lengths, out_indices, out_value_bits, starts, table, page_size, seqs)


def _host_pages(pages: tuple[Any, int, Any] | None, rows: int) -> tuple[Any, int, Any]:
    """(page_table, page_size, seq_ids) as native int32 arrays for the host
    engine, or (None, 64, None)."""
    if pages is None or pages[0] is None:
        return None, 64, None
    page_table, page_size, seq_ids = pages
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(page_table, torch.Tensor):
        page_table = page_table.detach().cpu().numpy()
    if torch is not None and isinstance(seq_ids, torch.Tensor):
        seq_ids = seq_ids.detach().cpu().numpy()
    return _host_table(page_table), page_size, _int_vector("seq_ids", seq_ids, rows, np.int32)


def _host_table(page_table: Any) -> np.ndarray:
    """A host page table as a native C-contiguous int32 ``[sequences,
    max_pages]`` array (4-byte integers only: nothing else is cast)."""
    t = np.asarray(page_table)
    if t.ndim != 2 or t.dtype.kind not in "iu" or t.dtype.itemsize != 4:
        raise TypeError(f"page_table must be int32 [sequences, max_pages], got {t.dtype} {t.shape}")
    return np.ascontiguousarray(t, dtype=np.int32)


def _host_starts(starts: Any, rows: int) -> np.ndarray | None:
    """Per-row range starts as native int32 (a scalar applies to every row);
    the range check against each row's end is the engine's."""
    if starts is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(starts, torch.Tensor):
        starts = starts.detach().cpu().numpy()
    a = np.asarray(starts)
    if a.ndim == 0:
        a = np.full(rows, a, dtype=a.dtype)
    return _int_vector("starts", a, rows, np.int32)


def _host_row_stride(strides: tuple[int, int], rows: int, cols: int, itemsize: int) -> int:
    """Row stride in elements of a host view; raises on non-unit column stride."""
    if rows == 0 or cols == 0:
        return cols  # nothing is read (NumPy reports zero strides for empty arrays)
    if cols > 1 and strides[1] != itemsize:
        raise ValueError(
            f"scores: elements within a row must be contiguous (column stride {strides[1] // itemsize} elements); "
            "flashsel reads strided rows in place but not strided columns: pass np.ascontiguousarray(x) "
            "or x.contiguous() if a copy is what you want"
        )
    if rows <= 1 or cols == 0:
        return cols
    if strides[0] <= 0 or strides[0] % itemsize:
        raise ValueError(
            f"scores: row stride {strides[0]} bytes is not a positive multiple of the element size {itemsize}"
        )
    return strides[0] // itemsize


def _topk_numpy(
    scores: np.ndarray,
    k: int,
    lengths: Any,
    order: str,
    nan: str,
    return_values: bool,
    starts: Any = None,
    pages: tuple[Any, int, Any] | None = None,
) -> Any:
    name, bits_dtype, native = _numpy_kind(scores.dtype)
    rows, cols, was_1d = _as_2d_shape(scores.shape)
    s2 = scores[None, :] if was_1d else scores  # a view, never a copy
    row_stride = _host_row_stride(s2.strides, rows, cols, scores.itemsize)
    _native.check_spec(name, rows, cols, row_stride, k, order, nan)
    lens = _host_lengths(lengths, rows, cols)
    st = _host_starts(starts, rows)
    if not s2.flags.aligned:
        raise ValueError("scores: the data is not aligned to its element size; pass an aligned copy")
    if s2.dtype != native:
        s2 = np.ascontiguousarray(s2, dtype=native)  # big-endian input: a native copy, after the checks
    out_idx = np.empty((rows, k), dtype=np.int32)
    out_val = np.empty((rows, k), dtype=native) if return_values else None
    _host_select(
        s2.view(bits_dtype),
        name,
        k,
        lens,
        order,
        nan,
        out_idx,
        None if out_val is None else out_val.view(bits_dtype),
        st,
        pages,
    )
    return _result(out_idx, out_val, was_1d, return_values)


def _torch_dtype_name(torch: Any, dtype: Any) -> str:
    """The native dtype name of a torch score dtype, or TypeError."""
    names = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
    name = names.get(dtype)
    if name is not None:
        return name
    if dtype in (torch.int16, getattr(torch, "uint16", torch.int16)):
        raise TypeError(
            f"unsupported scores dtype {dtype}: torch tensors of bfloat16 bit patterns are not read as bf16 "
            "(only NumPy uint16/int16 arrays are); torch has bfloat16: pass x.view(torch.bfloat16)"
        )
    raise TypeError(
        f"unsupported scores dtype {dtype}: flashsel takes {_TORCH_ACCEPTED}; cast explicitly, e.g. x.float()"
    )


def _result(out_idx: Any, out_val: Any, was_1d: bool, return_values: bool) -> Any:
    """Drops the row axis of a 1-D call; indices, or (indices, values)."""
    if was_1d:
        out_idx = out_idx[0]
        out_val = None if out_val is None else out_val[0]
    return (out_idx, out_val) if return_values else out_idx


def _topk_torch_cpu(
    torch: Any,
    scores: Any,
    k: int,
    lengths: Any,
    order: str,
    nan: str,
    return_values: bool,
    starts: Any = None,
    pages: tuple[Any, int, Any] | None = None,
) -> Any:
    name = _torch_dtype_name(torch, scores.dtype)
    rows, cols, was_1d = _as_2d_shape(tuple(scores.shape))
    s2 = scores.detach().unsqueeze(0) if was_1d else scores.detach()  # views, never copies
    itemsize = scores.element_size()
    strides = (s2.stride(0) * itemsize, s2.stride(1) * itemsize)
    row_stride = _host_row_stride(strides, rows, cols, itemsize)
    _native.check_spec(name, rows, cols, row_stride, k, order, nan)
    lens = _host_lengths(lengths, rows, cols)
    st = _host_starts(starts, rows)

    def bits(t: Any) -> np.ndarray:
        # Zero-copy NumPy views of the tensor's memory (strides preserved).
        if name == "f32":
            return t.numpy()
        return t.view(torch.int16).numpy().view(np.uint16)

    out_idx = torch.empty((rows, k), dtype=torch.int32)
    out_val = torch.empty((rows, k), dtype=scores.dtype) if return_values else None
    _host_select(
        bits(s2),
        name,
        k,
        lens,
        order,
        nan,
        out_idx.numpy(),
        None if out_val is None else bits(out_val),
        st,
        pages,
    )
    return _result(out_idx, out_val, was_1d, return_values)


# ---------------------------------------------------------------------------
# CUDA path
# ---------------------------------------------------------------------------

_engine_lock = threading.Lock()
_engine_ok: set[int] = set()

# Workspace bytes of each CUDA geometry seen, so that a repeated call (a
# decode loop) does not ask the engine again. Keyed by (device, dtype, rows,
# cols, row_stride, k, order, nan, has_lengths); cleared when it grows past
# _WS_CACHE_MAX entries.
_ws_cache: dict[tuple[Any, ...], int] = {}
_WS_CACHE_MAX = 4096


def _workspace_bytes(key: tuple[Any, ...]) -> int:
    """Workspace bytes of a geometry (already checked by check_spec)."""
    nbytes = _ws_cache.get(key)
    if nbytes is None:
        ordinal, name, rows, cols, row_stride, k, order, nan, has_lengths = key
        nbytes = _native.cuda_workspace_bytes(ordinal, name, rows, cols, row_stride, k, order, nan, has_lengths)
        if len(_ws_cache) >= _WS_CACHE_MAX:
            _ws_cache.clear()
        _ws_cache[key] = nbytes
    return nbytes


def _raw_stream(torch: Any, ordinal: int) -> int:
    """The device's current stream handle. torch's private
    ``_cuda_getCurrentRawStream`` (the one Triton uses) takes ~0.1 us, the
    public ``current_stream().cuda_stream`` ~3 us (measured on the H200
    host); the public one is the fallback."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(ordinal))
    return int(torch.cuda.current_stream(ordinal).cuda_stream)


def _ensure_engine(device: int) -> None:
    """Creates the device's engine once (the native side caches it)."""
    if device in _engine_ok:
        return
    with _engine_lock:
        if device in _engine_ok:
            return
        err = _native.cuda_engine_error(device)
        if err is not None:
            raise RuntimeError(f"flashsel CUDA engine unavailable on cuda:{device}: {err}")
        _engine_ok.add(device)


def _cuda_lengths(torch: Any, lengths: Any, device: Any, rows: int, cols: int) -> Any:
    """Lengths of a CUDA call as a contiguous int32 tensor of `rows` entries on
    `device`, made without a host synchronisation: a host scalar (checked) is
    filled on the device; a tensor's values stay unchecked (see topk)."""
    scalar = _scalar_length(lengths, cols)
    if scalar is not None:
        return torch.full((rows,), scalar, dtype=torch.int32, device=device)
    if not isinstance(lengths, torch.Tensor):
        raise ValueError(
            f"scores are on {device} so lengths must be a torch tensor on the same device or a Python int, "
            f"got {type(lengths).__name__}"
        )
    if lengths.device != device:
        raise ValueError(f"lengths is on {lengths.device} but scores are on {device}")
    if lengths.dtype not in (torch.int32, torch.int64):
        raise _lengths_dtype_error(lengths.dtype)
    if lengths.dim() == 0:
        lengths = lengths.reshape(1).expand(rows)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be a scalar or 1-D with one entry per row, got shape {tuple(lengths.shape)}")
    if lengths.shape[0] != rows:
        raise ValueError(f"lengths has {lengths.shape[0]} entries but scores has {_rows_phrase(rows)}")
    return _clamped_int32(torch, lengths)  # on the device, no host sync


def _cuda_starts(torch: Any, starts: Any, device: Any, rows: int) -> Any:
    """Range starts of a CUDA call as a contiguous int32 tensor on `device`:
    a host scalar is filled on the device; a CUDA tensor is used as it is
    (int64 clamped into int32: an out-of-range start gives an all-padding
    row, never a wrapped one); host data is checked to fit int32."""
    if isinstance(starts, (int, np.integer)) and not isinstance(starts, bool):
        if starts < 0 or starts >= 2**31:
            raise ValueError(f"starts = {starts} must be in 0 .. 2**31 - 1")
        return torch.full((rows,), int(starts), dtype=torch.int32, device=device)
    if isinstance(starts, torch.Tensor) and starts.dim() == 0:
        starts = starts.reshape(1).expand(rows)
    return _device_int32(torch, "starts", starts, rows, device)


def _topk_cuda(
    torch: Any,
    scores: Any,
    k: int,
    lengths: Any,
    order: str,
    nan: str,
    return_values: bool,
    starts: Any = None,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> Any:
    name = _torch_dtype_name(torch, scores.dtype)
    rows, cols, was_1d = _as_2d_shape(tuple(scores.shape))
    s2 = scores.detach()
    if was_1d:
        s2 = s2.unsqueeze(0)
    if rows > 0 and cols > 1 and s2.stride(1) != 1:
        raise ValueError(
            f"scores: elements within a row must be contiguous (column stride {s2.stride(1)} elements); "
            "flashsel reads strided rows in place but not strided columns: pass x.contiguous() "
            "if a copy is what you want"
        )
    if rows <= 1 or cols == 0:
        row_stride = cols  # nothing else is read
    else:
        row_stride = s2.stride(0)
        if row_stride < cols:
            raise ValueError(f"scores: row stride {row_stride} is shorter than cols = {cols} (overlapping rows)")
    _native.check_spec(name, rows, cols, row_stride, k, order, nan)

    ordinal = scores.get_device()
    lens = None if lengths is None else _cuda_lengths(torch, lengths, scores.device, rows, cols)
    sts = None if starts is None else _cuda_starts(torch, starts, scores.device, rows)
    pages, keep = _device_pages(torch, page_table, page_size, seq_ids, rows, scores.device)

    out_idx = torch.empty((rows, k), dtype=torch.int32, device=ordinal)
    out_val = torch.empty((rows, k), dtype=scores.dtype, device=ordinal) if return_values else None
    if rows > 0 and cols == 0:
        out_idx.fill_(-1)
        if out_val is not None:
            out_val.fill_(float("-inf"))
    elif rows > 0:
        _ensure_engine(ordinal)
        nbytes = _workspace_bytes((ordinal, name, rows, cols, row_stride, k, order, nan, lens is not None))
        ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=ordinal)
        stream = _raw_stream(torch, ordinal)
        _native.cuda_select(
            ordinal,
            name,
            rows,
            cols,
            row_stride,
            k,
            order,
            nan,
            s2.data_ptr(),
            None if lens is None else lens.data_ptr(),
            out_idx.data_ptr(),
            None if out_val is None else out_val.data_ptr(),
            ws.data_ptr(),
            nbytes,
            stream,
            None if sts is None else sts.data_ptr(),
            pages,
        )
        del keep
        # `ws` and `lens` go back to torch's caching allocator here; their
        # reuse is ordered after this launch on the same stream.
    return _result(out_idx, out_val, was_1d, return_values)


# ---------------------------------------------------------------------------
# QSA block selection (the CPU engine; CUDA tensors through _qsa_cuda)
# ---------------------------------------------------------------------------


def _int_vector(what: str, x: Any, n: int, dtype: Any) -> np.ndarray:
    """A 1-D integer vector of n entries (int32 or int64 input, either byte
    order; a list of ints is fine) as a native array of `dtype`."""
    a = np.asarray(x)
    if a.dtype.kind not in "iu" or not _is_int32_or_int64(a.dtype.newbyteorder("=")):
        raise TypeError(f"{what} must hold int32 or int64 values, got {a.dtype}")
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(f"{what} must be 1-D with {n} entries (one per row), got shape {a.shape}")
    if dtype == np.int32 and a.dtype.itemsize == 8 and n and (a.min() < -(2**31) or a.max() >= 2**31):
        raise ValueError(f"{what}: a value does not fit int32")
    return np.ascontiguousarray(a, dtype=dtype)


def qsa_select(
    scores: Any,
    positions: Any,
    *,
    ratio: int = 4,
    k_blocks: int = 512,
    order: Literal["score", "index"] = "index",
    nan: Literal["lowest", "largest"] = "lowest",
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> Any:
    """QSA block selection: the token ids (or KV slots) each query attends to.

    Row ``i`` is the query at absolute position ``t = positions[i]``; it sees
    ``V = (t + 1) // ratio`` complete blocks. ``V <= k_blocks``: blocks
    ``0..V-1`` (no score is read); else the exact top ``k_blocks`` of the row's
    scores ``[0, V)`` (ties to the lower block, NaN by ``nan``, as
    :func:`topk`). Each block ``b`` gives tokens ``ratio*b .. ratio*b+ratio-1``,
    then the tail ``ratio*V .. t``, then ``-1`` up to ``k_blocks * ratio +
    ratio - 1`` (2051). ``order="index"``: ids ascending; ``"score"``: blocks
    best first, the tail last. With ``page_table`` (int32 ``[B, max_pages]``)
    and ``seq_ids`` (int32 ``[T]``) every valid id becomes the slot
    ``page_table[seq, tok // page_size] * page_size + tok % page_size``.

    ``scores``: ``[T, NB]`` block scores, a NumPy array (float32, float16,
    bfloat16 or its uint16/int16 bit patterns) or a torch tensor on the CPU
    (the CPU engine) or a CUDA device (the CUDA engine: one launch on the
    current stream, no host synchronisation, capturable in a CUDA graph;
    ``positions``, ``page_table`` and ``seq_ids`` should then be CUDA
    tensors on the scores' device, as host data is copied over, and their
    device values are not checked: an out-of-range row is all ``-1``, count
    0). ``positions``: ``[T]`` int32 or int64. Returns ``(ids, counts)``:
    int32 ``[T, width]`` and int32 ``[T]`` (NumPy arrays, or tensors on the
    scores' device for tensor input), the same bytes on both engines.

    Raises ``TypeError`` for unsupported types, ``ValueError`` for bad shapes
    or options and, for host data, a position whose ``V`` exceeds ``NB``, a
    negative position, or a token whose page the table lacks.
    """
    order = _check_option("order", order, _ORDERS)
    nan = _check_option("nan", nan, _NANS)
    ratio = _check_k(ratio)
    k_blocks = _check_k(k_blocks)
    page_size = _check_k(page_size)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(scores, torch.Tensor):
        if scores.device.type not in ("cpu", "cuda"):
            raise ValueError(f"scores is on device {scores.device}; flashsel runs on the CPU and on CUDA devices")
        # Through the torch operator flashsel::qsa_select (torch.compile, CUDA
        # graphs), which runs _qsa_torch.
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.qsa_select(scores, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)
    if isinstance(scores, np.ndarray) and not isinstance(scores, np.ma.MaskedArray):
        name, bits_dtype, native = _numpy_kind(scores.dtype)
        host = scores if scores.dtype == native else np.ascontiguousarray(scores, dtype=native)
        host = host.view(bits_dtype)
    else:
        raise TypeError(f"scores must be a numpy.ndarray or a torch.Tensor, got {type(scores).__qualname__}")
    if host.ndim != 2:
        raise ValueError(f"scores must be 2-D [queries, blocks], got shape {host.shape}")
    if not host.flags.aligned:
        raise ValueError("scores: the data is not aligned to its element size; pass an aligned copy")
    rows = host.shape[0]
    pos = _int_vector("positions", positions, rows, np.int64)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
    table, page_size, seqs = _host_pages((page_table, page_size, seq_ids), rows)
    ids, counts = _native.qsa_select_cpu(host, name, pos, ratio, k_blocks, order, nan, table, page_size, seqs)
    return ids, counts


def _qsa_torch(
    scores: Any,
    positions: Any,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: Any,
    page_size: int,
    seq_ids: Any,
) -> Any:
    """qsa_select on torch tensors (the real implementation of the
    ``flashsel::qsa_select`` operator): CUDA tensors go to :func:`_qsa_cuda`;
    CPU tensors to the CPU engine through zero-copy NumPy views (the NumPy
    path of :func:`qsa_select`), returning CPU tensors."""
    torch = sys.modules["torch"]
    if scores.device.type == "cuda":
        return _qsa_cuda(scores, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)
    if scores.device.type != "cpu":
        raise ValueError(f"scores is on device {scores.device}; flashsel runs on the CPU and on CUDA devices")
    name = _torch_dtype_name(torch, scores.dtype)
    s = scores.detach()
    host = s.view(torch.int16).numpy().view(np.uint16) if name == "bf16" else s.numpy()  # bf16: as bit patterns
    # The NumPy path reads the CPU tensors positions, page_table and seq_ids
    # through np.asarray (zero-copy).
    ids, counts = qsa_select(
        host,
        positions,
        ratio=ratio,
        k_blocks=k_blocks,
        order=order,
        nan=nan,
        page_table=page_table,
        page_size=page_size,
        seq_ids=seq_ids,
    )
    return torch.from_numpy(ids), torch.from_numpy(counts)


def _clamped_int32(torch: Any, x: Any) -> Any:
    """A device int32 / int64 tensor as a contiguous int32 one, converted on
    its device: int64 values are clamped into [-1, INT32_MAX] first
    (docs/semantics.md, Errors), so a value outside int32 stays out of range
    for the kernels (an all-padding row, a clamped length), never wraps into
    range."""
    x = x.detach()
    if x.dtype == torch.int64:
        x = x.clamp(-1, 2**31 - 1)
    return x.to(torch.int32).contiguous()


def _device_int32(torch: Any, what: str, x: Any, n: int, device: Any, owner: str = "scores") -> Any:
    """A per-row int32 vector of `n` entries on `device`, made without a host
    synchronisation. A CUDA tensor (int32 or int64, on `device`) is clamped
    into [-1, INT32_MAX] first, so an int64 value outside int32 becomes a row
    the kernels treat as out of range (all padding), never a wrapped one.
    Host data (a CPU tensor, an array, a list) is checked to fit int32.
    `owner` names the tensor that sets the device in the messages."""
    if isinstance(x, torch.Tensor) and x.device.type == "cuda":
        if x.device != device:
            raise ValueError(f"{what} is on {x.device} but {owner} {'are' if owner == 'scores' else 'is'} on {device}")
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{what} must hold int32 or int64 values, got {x.dtype}")
        if x.dim() != 1 or x.shape[0] != n:
            raise ValueError(f"{what} must be 1-D with {n} entries (one per row), got shape {tuple(x.shape)}")
        return _clamped_int32(torch, x)
    host = x.numpy() if isinstance(x, torch.Tensor) else x
    return torch.from_numpy(_int_vector(what, host, n, np.int32)).to(device)


def _device_pages(
    torch: Any, page_table: Any, page_size: int, seq_ids: Any, rows: int, device: Any, owner: str = "scores"
) -> Any:
    """(table, sequences, max_pages, page_size, seq_ids) device pointers and
    sizes for the native calls, plus the tensors to keep alive; None without
    a page table."""
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
    if page_table is None:
        return None, ()
    if not isinstance(page_table, torch.Tensor):
        page_table = torch.from_numpy(np.ascontiguousarray(np.asarray(page_table)))
    if page_table.dim() != 2 or page_table.dtype != torch.int32:
        raise TypeError(f"page_table must be int32 [sequences, max_pages], got {page_table.dtype} {tuple(page_table.shape)}")
    if page_table.device.type == "cuda" and page_table.device != device:
        raise ValueError(f"page_table is on {page_table.device} but {owner} {'are' if owner == 'scores' else 'is'} on {device}")
    if page_table.shape[0] == 0 or page_table.shape[1] == 0:
        raise ValueError(f"page_table must have at least one sequence and one page, got shape {tuple(page_table.shape)}")
    table = page_table.detach().to(device).contiguous()
    seqs = _device_int32(torch, "seq_ids", seq_ids, rows, device, owner)
    args = (table.data_ptr(), table.shape[0], table.shape[1], page_size, seqs.data_ptr())
    return args, (table, seqs)


_qsa_ws_cache: dict[tuple[Any, ...], int] = {}


def _qsa_cuda(
    scores: Any,
    positions: Any,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: Any,
    page_size: int,
    seq_ids: Any,
) -> Any:
    """qsa_select on CUDA tensors: ``(ids, counts)``, int32 ``[T, k_blocks *
    ratio + ratio - 1]`` and ``[T]`` on the scores' device, launched on the
    current stream without a host synchronisation (graph-safe). Device
    positions and sequence ids are not checked on the host: a row whose
    values are out of range comes out all -1 with count 0."""
    torch = sys.modules["torch"]
    name = _torch_dtype_name(torch, scores.dtype)
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D [queries, blocks], got shape {tuple(scores.shape)}")
    rows, blocks = scores.shape
    s2 = scores.detach()
    if rows > 0 and blocks > 1 and s2.stride(1) != 1:
        raise ValueError(
            f"scores: elements within a row must be contiguous (column stride {s2.stride(1)} elements); "
            "pass x.contiguous() if a copy is what you want"
        )
    row_stride = blocks if rows <= 1 or blocks == 0 else s2.stride(0)
    if row_stride < blocks:
        raise ValueError(f"scores: row stride {row_stride} is shorter than blocks = {blocks} (overlapping rows)")
    width = k_blocks * ratio + ratio - 1
    device = scores.device
    ordinal = scores.get_device()
    pos = _device_int32(torch, "positions", positions, rows, device)
    pages, keep = _device_pages(torch, page_table, page_size, seq_ids, rows, device)
    ids = torch.empty((rows, width), dtype=torch.int32, device=device)
    counts = torch.empty((rows,), dtype=torch.int32, device=device)
    if rows == 0:
        return ids, counts
    _ensure_engine(ordinal)
    key = (ordinal, name, rows, blocks, row_stride, ratio, k_blocks, order, nan)
    nbytes = _qsa_ws_cache.get(key)
    if nbytes is None:
        nbytes = _native.cuda_qsa_workspace_bytes(*key)
        if len(_qsa_ws_cache) >= _WS_CACHE_MAX:
            _qsa_ws_cache.clear()
        _qsa_ws_cache[key] = nbytes
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    _native.cuda_qsa_select(
        *key,
        s2.data_ptr() if blocks > 0 else 0,
        pos.data_ptr(),
        ids.data_ptr(),
        counts.data_ptr(),
        pages,
        ws.data_ptr(),
        nbytes,
        _raw_stream(torch, ordinal),
    )
    del keep  # back to torch's caching allocator, reuse ordered after the launch
    return ids, counts
