"""flashsel: exact, deterministic top-k selection for long-context sparse attention.

One function does the work, :func:`topk`; :func:`backends` says what can run
here. NumPy arrays and CPU torch tensors go to the CPU engine (the GIL is
released while it runs); CUDA torch tensors go to the CUDA engine on the
tensor's device and current stream, asynchronously.

The contract (the same bytes on every backend)
----------------------------------------------
* Order: a larger score ranks higher. ``-0.0`` equals ``+0.0``.
* NaN: ``nan="lowest"`` (default) ranks every NaN below ``-inf``;
  ``nan="largest"`` ranks it above ``+inf``, as ``torch.topk`` does.
* Ties: among equal scores the lower column index ranks higher, so the result
  is fully determined by the input (no "any k of the tied ones").
* Padding: row ``i`` holds ``min(k, len_i)`` indices, then ``-1`` up to ``k``
  (``len_i = lengths[i]``, default ``cols``); padded values are ``-inf``.
* Output order: ``order="score"`` lists the selection best first;
  ``order="index"`` lists the same set by ascending column index.
"""

import operator
import sys
import threading
from typing import Any, Literal

import numpy as np

from . import _native

__version__: str = _native.__version__

__all__ = ["topk", "backends", "__version__"]

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
) -> Any:
    """Exact, deterministic top-k of each row of ``scores``.

    Parameters
    ----------
    scores
        A NumPy array (float32, float16, or ``ml_dtypes.bfloat16``) or a torch
        tensor (float32, float16, bfloat16) on the CPU or a CUDA device, of
        shape ``[rows, cols]`` or ``[cols]`` (one row). Rows may be strided
        (a row-slice or column-slice view of a larger matrix is read in place,
        not copied), but the elements of a row must be contiguous
        (column stride 1); anything else raises ``ValueError``: pass
        ``np.ascontiguousarray(x)`` / ``x.contiguous()`` yourself if a copy is
        what you want.
    k
        How many to select per row, ``k >= 1``. ``k`` may exceed ``cols``: the
        rest of the row is padding.
    lengths
        Optional per-row candidate counts: row ``i`` selects among columns
        ``0 .. lengths[i]``, each ``0 <= lengths[i] <= cols``. For host inputs:
        a sequence, a NumPy array or a CPU tensor of integers (one per row, or
        a scalar for 1-D ``scores``). For CUDA inputs: an int32 or int64 tensor
        on the same device (int64 is converted on the device); its values are
        not checked on the host, as that would need a synchronisation: a row
        whose length is outside ``0..=cols`` comes out as all padding.
    order
        ``"score"`` (best first, the default) or ``"index"`` (ascending
        column index, the same set).
    nan
        ``"lowest"`` (default: NaN below ``-inf``) or ``"largest"`` (NaN above
        ``+inf``, like ``torch.topk``).
    return_values
        Also return the selected scores, bit for bit in the input dtype
        (``-inf`` where padded).

    Returns
    -------
    indices, or (indices, values)
        The same kind as ``scores`` (NumPy array, or torch tensor on the same
        device): int32 indices ``[rows, k]`` (``[k]`` for 1-D input), ``-1``
        where padded; values in the input dtype.

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

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(scores, torch.Tensor):
        if scores.layout != torch.strided:
            raise TypeError(f"scores must be a dense (strided) tensor, got layout {scores.layout}")
        dev = scores.device.type
        if dev == "cuda":
            return _topk_cuda(torch, scores, k, lengths, order, nan, return_values)
        if dev == "cpu":
            return _topk_torch_cpu(torch, scores, k, lengths, order, nan, return_values)
        raise ValueError(f"scores is on device {scores.device}; flashsel runs on the CPU and on CUDA devices")
    if isinstance(scores, np.ma.MaskedArray):
        raise TypeError("masked arrays are not supported: pass the data with masked scores filled (or use lengths)")
    if isinstance(scores, np.ndarray):
        return _topk_numpy(scores, k, lengths, order, nan, return_values)
    raise TypeError(
        f"scores must be a numpy.ndarray or a torch.Tensor, got {type(scores).__module__}.{type(scores).__qualname__}"
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
            "inputs": "numpy.ndarray (float32, float16, ml_dtypes.bfloat16), CPU torch.Tensor",
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
    raise ValueError(f"scores must be 1-D [cols] or 2-D [rows, cols], got shape {tuple(shape)}")


def _host_lengths(lengths: Any, rows: int, cols: int, was_1d: bool) -> np.ndarray | None:
    """Host lengths as a contiguous int32 array of `rows` entries, checked."""
    if lengths is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(lengths, torch.Tensor):
        if lengths.device.type != "cpu":
            raise ValueError(f"lengths is on {lengths.device} but scores are in host memory; pass CPU lengths")
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise TypeError(f"lengths must hold integers, got {lengths.dtype}")
        lengths = lengths.detach().numpy()
    arr = np.asarray(lengths)
    if arr.size == 0 and not isinstance(lengths, np.ndarray):
        arr = arr.astype(np.int64)  # [] for zero rows
    if arr.dtype.kind not in "iu":
        raise TypeError(f"lengths must hold integers, got dtype {arr.dtype}")
    if arr.ndim == 0 and was_1d:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D with one entry per row, got shape {arr.shape}")
    if arr.shape[0] != rows:
        raise ValueError(f"lengths has {arr.shape[0]} entries but there are {rows} rows")
    if arr.size:
        bad = np.flatnonzero((arr < 0) | (arr > cols))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"lengths[{i}] = {int(arr[i])} is outside 0..={cols}")
    return np.ascontiguousarray(arr, dtype=np.int32)


# ---------------------------------------------------------------------------
# Host paths
# ---------------------------------------------------------------------------

# NumPy dtype -> (contract dtype name, the dtype its bits travel as)
_NP_F32 = np.dtype(np.float32)
_NP_F16 = np.dtype(np.float16)


def _numpy_kind(dtype: np.dtype) -> tuple[str, np.dtype]:
    if dtype == _NP_F32:
        return "f32", _NP_F32
    if dtype == _NP_F16:
        return "f16", np.dtype(np.uint16)
    if dtype.name == "bfloat16" and dtype.itemsize == 2:  # ml_dtypes.bfloat16
        return "bf16", np.dtype(np.uint16)
    raise TypeError(
        f"unsupported scores dtype {dtype}: flashsel takes float32, float16 or bfloat16 "
        "(ml_dtypes.bfloat16 for NumPy); cast explicitly, e.g. x.astype(np.float32)"
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
) -> None:
    _native.select_cpu(bits, name, k, order, nan, lengths, out_indices, out_value_bits)


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


def _topk_numpy(scores: np.ndarray, k: int, lengths: Any, order: str, nan: str, return_values: bool) -> Any:
    name, bits_dtype = _numpy_kind(scores.dtype)
    rows, cols, was_1d = _as_2d_shape(scores.shape)
    s2 = scores[None, :] if was_1d else scores  # a view, never a copy
    row_stride = _host_row_stride(s2.strides, rows, cols, scores.itemsize)
    _native.check_spec(name, rows, cols, row_stride, k, order, nan)
    lens = _host_lengths(lengths, rows, cols, was_1d)
    if not s2.flags.aligned:
        raise ValueError("scores: the data is not aligned to its element size; pass an aligned copy")
    out_idx = np.empty((rows, k), dtype=np.int32)
    out_val = np.empty((rows, k), dtype=scores.dtype) if return_values else None
    _host_select(
        s2.view(bits_dtype),
        name,
        k,
        lens,
        order,
        nan,
        out_idx,
        None if out_val is None else out_val.view(bits_dtype),
    )
    return _result(out_idx, out_val, was_1d, return_values)


def _torch_dtype_name(torch: Any, dtype: Any) -> str:
    """The native dtype name of a torch score dtype, or TypeError."""
    names = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
    name = names.get(dtype)
    if name is None:
        raise TypeError(f"unsupported scores dtype {dtype}: flashsel takes torch.float32, torch.float16 or torch.bfloat16")
    return name


def _result(out_idx: Any, out_val: Any, was_1d: bool, return_values: bool) -> Any:
    """Drops the row axis of a 1-D call; indices, or (indices, values)."""
    if was_1d:
        out_idx = out_idx[0]
        out_val = None if out_val is None else out_val[0]
    return (out_idx, out_val) if return_values else out_idx


def _topk_torch_cpu(torch: Any, scores: Any, k: int, lengths: Any, order: str, nan: str, return_values: bool) -> Any:
    name = _torch_dtype_name(torch, scores.dtype)
    rows, cols, was_1d = _as_2d_shape(tuple(scores.shape))
    s2 = scores.detach().unsqueeze(0) if was_1d else scores.detach()  # views, never copies
    itemsize = scores.element_size()
    strides = (s2.stride(0) * itemsize, s2.stride(1) * itemsize)
    row_stride = _host_row_stride(strides, rows, cols, itemsize)
    _native.check_spec(name, rows, cols, row_stride, k, order, nan)
    lens = _host_lengths(lengths, rows, cols, was_1d)

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
    public ``current_stream().cuda_stream`` ~3 us (H200 host, run 6 of the
    seventh session); the public one is the fallback."""
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


def _topk_cuda(torch: Any, scores: Any, k: int, lengths: Any, order: str, nan: str, return_values: bool) -> Any:
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
    lens = None
    if lengths is not None:
        device = scores.device  # only the lengths checks need it
        if not isinstance(lengths, torch.Tensor):
            raise ValueError(
                f"scores are on {device} so lengths must be a torch tensor on the same device, "
                f"got {type(lengths).__name__}"
            )
        if lengths.device != device:
            raise ValueError(f"lengths is on {lengths.device} but scores are on {device}")
        if lengths.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"lengths must be an int32 or int64 tensor, got {lengths.dtype}")
        if lengths.dim() == 0 and was_1d:
            lengths = lengths.reshape(1)
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be 1-D with one entry per row, got shape {tuple(lengths.shape)}")
        if lengths.shape[0] != rows:
            raise ValueError(f"lengths has {lengths.shape[0]} entries but there are {rows} rows")
        lens = lengths.detach().to(torch.int32).contiguous()  # on the device, no host sync

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
        )
        # `ws` and `lens` go back to torch's caching allocator here; their
        # reuse is ordered after this launch on the same stream.
    return _result(out_idx, out_val, was_1d, return_values)
