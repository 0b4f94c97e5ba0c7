"""Sparse MLA attention with FlashMLA's semantics (private: import from
``flashsel``): ``sparse_mla_prefill`` (``flash_mla_sparse_fwd``) and
``sparse_mla_decode`` (the sparse ``flash_mla_with_kvcache``). NumPy arrays
and CPU torch tensors run the Rust float64 reference
(``flashsel::ops::mla``); CUDA tensors run the CUDA engine's kernels
(``CudaEngine::sparse_mla_*_device``: zero-copy, on torch's current stream,
no host synchronisation, so CUDA graphs capture them). Torch tensors
go through the torch operators ``flashsel::sparse_mla_prefill`` /
``flashsel::sparse_mla_decode`` (``_torch_ops``), whose implementation is
``_sparse_mla_prefill`` / ``_sparse_mla_decode`` here. The contract is
docs/semantics.md, "Sparse MLA attention"."""

import math
import sys
from typing import Any

import numpy as np

from . import _native

_DEVICES_MSG = "sparse MLA on CUDA takes every tensor on one device"
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_FP8_TOKEN_BYTES = 656

try:  # optional: NumPy's bfloat16 and float8_e4m3fn
    import ml_dtypes as _ml_dtypes

    _NP_BF16: Any = np.dtype(_ml_dtypes.bfloat16)
    _NP_FP8: Any = np.dtype(_ml_dtypes.float8_e4m3fn)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    _NP_BF16 = _NP_FP8 = None


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def sparse_mla_prefill(
    q: Any,
    kv: Any,
    indices: Any,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Any = None,
    topk_length: Any = None,
) -> tuple[Any, Any, Any]:
    """Sparse MLA prefill, a drop-in for FlashMLA's ``flash_mla_sparse_fwd``.

    Parameters
    ----------
    q
        ``[s_q, h_q, d_qk]``, ``1 <= h_q <= 128``, ``d_qk`` 512 or 576.
        float32 or bfloat16 (NumPy: ``ml_dtypes.bfloat16`` or its uint16 /
        int16 bit patterns; torch: ``torch.bfloat16``).
    kv
        ``[s_kv, 1, d_qk]`` (or ``[s_kv, d_qk]``), the dtype of ``q``. The
        value of each key is its first ``d_v = 512`` entries.
    indices
        int32 ``[s_q, 1, topk]`` (or ``[s_q, topk]``), ``topk >= 1``. An entry
        is invalid (contributes nothing, its kv row is never read) when it is
        ``< 0``, ``>= s_kv``, or at a position ``>= topk_length[i]``.
        Duplicates are attended once per occurrence.
    sm_scale
        The logit scale (taken as float32, as the kernels take it).
    d_v
        512 (the only value FlashMLA takes).
    attn_sink
        Optional float32 ``[h_q]``: ``out *= exp(lse) / (exp(lse) +
        exp(attn_sink))`` per head (``-inf`` changes nothing, ``+inf`` gives
        0); ``lse`` and ``max_logits`` are not affected.
    topk_length
        Optional int32 ``[s_q]``, each in ``0..=topk``: row ``i`` reads only
        ``indices[i, :, :topk_length[i]]``. When absent it is derived from the
        indices: one past the last in-range index of the row (0 if none),
        which gives the same bits as passing that length.

    Returns
    -------
    (out, max_logits, lse)
        ``out [s_q, h_q, d_v]`` in q's dtype; ``max_logits`` (the largest
        ``sm_scale * q . k``) and ``lse`` (natural-log sum of exp of those
        logits), float32 ``[s_q, h_q]``. A row with no valid index gives
        ``out = 0``, ``lse = +inf``, ``max_logits = -inf``. NumPy in, NumPy
        out; a CPU tensor in, CPU tensors out. On the CPU computed in
        float64 and rounded once; on CUDA within FlashMLA's tolerances of
        that reference (docs/semantics.md).

    Raises
    ------
    TypeError
        Unsupported types or dtypes (``q`` and ``kv`` of different dtypes,
        non-int32 indices).
    ValueError
        Bad shapes, ``h_q``, ``d_qk``, ``d_v``, ``topk_length`` values.

    On CUDA tensors (all on one device) the kernels run on torch's current
    stream without a host synchronisation; ``topk_length`` values are then
    not checked on the host (values outside ``0..=topk`` are clamped into
    it on the device). ``q`` and ``indices`` are made contiguous (no copy
    when they are), ``kv`` rows may be strided.
    """
    torch = sys.modules.get("torch")
    if _is_tensor(torch, q):
        # Through the torch operator flashsel::sparse_mla_prefill
        # (torch.compile), which runs _sparse_mla_prefill below.
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    return _sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


def _sparse_mla_prefill(
    q: Any, kv: Any, indices: Any, sm_scale: Any, d_v: Any, attn_sink: Any, topk_length: Any
) -> tuple[Any, Any, Any]:
    """:func:`sparse_mla_prefill` on NumPy arrays, CPU tensors (the float64
    reference) and CUDA tensors (the kernels): the torch operator's
    implementation, arguments unchecked."""
    torch = sys.modules.get("torch")
    is_torch = _is_tensor(torch, q)
    if torch is not None:
        dev = _check_devices(torch, q=q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length)
        if dev is not None:
            return _prefill_cuda(torch, q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    qk = _data("q", q, torch)
    kvk = _data("kv", kv, torch)
    if qk.name != kvk.name:
        raise TypeError(f"q and kv must have the same dtype, got {qk.dtype_str} and {kvk.dtype_str}")
    if qk.arr.ndim != 3:
        raise ValueError(f"q must be 3-D [s_q, h_q, d_qk], got shape {qk.arr.shape}")
    s_q, h_q, d_qk = qk.arr.shape
    kva = kvk.arr
    if kva.ndim == 3:
        if kva.shape[1] != 1:
            raise ValueError(f"kv must have one KV head ([s_kv, 1, d_qk]), got shape {kva.shape}")
        kva = kva.reshape(kva.shape[0], kva.shape[2])
    if kva.ndim != 2:
        raise ValueError(f"kv must be [s_kv, 1, d_qk] (or [s_kv, d_qk]), got shape {kvk.arr.shape}")
    if kva.shape[1] != d_qk:
        raise ValueError(f"kv has d_qk = {kva.shape[1]} but q has d_qk = {d_qk}")
    s_kv = kva.shape[0]
    idx = _int32_array("indices", indices, torch, strict=True)
    if idx.ndim == 3:
        if idx.shape[1] != 1:
            raise ValueError(f"indices must be [s_q, 1, topk] (one KV head), got shape {idx.shape}")
        idx = idx.reshape(idx.shape[0], idx.shape[2])
    if idx.ndim != 2 or idx.shape[0] != s_q:
        raise ValueError(f"indices must be [s_q, 1, topk] with s_q = {s_q}, got shape {idx.shape}")
    topk = idx.shape[1]
    sink = _sink(attn_sink, h_q, torch)
    lens = None
    if topk_length is not None:
        lens = _int32_array("topk_length", topk_length, torch, strict=False)
        if lens.shape != (s_q,):
            raise ValueError(f"topk_length must be [s_q] = [{s_q}], got shape {lens.shape}")
    scale = _scale(sm_scale)
    out, max_logits, lse = _native.sparse_mla_prefill_cpu(
        _flat(qk.arr),
        _flat(kva),
        _flat(idx),
        qk.name,
        s_q,
        s_kv,
        h_q,
        d_qk,
        topk,
        scale,
        _int("d_v", d_v),
        sink,
        lens,
        qk.name == "bf16",
    )
    out = qk.wrap(out.reshape(s_q, h_q, -1), torch, is_torch)
    max_logits = _wrap_f32(max_logits.reshape(s_q, h_q), torch, is_torch)
    return out, max_logits, _wrap_f32(lse.reshape(s_q, h_q), torch, is_torch)


def sparse_mla_decode(
    q: Any,
    k_cache: Any,
    indices: Any,
    sm_scale: float | None = None,
    d_v: int = 512,
    *,
    is_fp8_kvcache: bool | None = None,
    topk_length: Any = None,
    attn_sink: Any = None,
) -> tuple[Any, Any]:
    """Sparse MLA decode over a paged KV cache, FlashMLA's sparse
    ``flash_mla_with_kvcache(q, k_cache, ..., softmax_scale, is_fp8_kvcache,
    indices, attn_sink, topk_length=...)``.

    Parameters
    ----------
    q
        ``[b, s_q, h_q, d_qk]``, float32 or bfloat16 (as for
        :func:`sparse_mla_prefill`), ``1 <= h_q <= 128``.
    k_cache
        ``[num_pages, page_size, 1, W]`` (or ``[num_pages, page_size, W]``):
        either the fp8 cache in FlashMLA's 656-byte token layout (``W =
        656``, ``d_qk = 576``; NumPy uint8 or ``ml_dtypes.float8_e4m3fn``,
        torch ``torch.uint8`` or ``torch.float8_e4m3fn``): 512 e4m3 values,
        4 float32 scales (one per 128 values), 64 bfloat16 rope values; or a
        float32 / bfloat16 cache of ``W = d_qk`` values per token. Pages may
        be strided (a slice of a larger buffer is read in place).
    indices
        int32 ``[b, s_q, topk]``: physical slots ``page * page_size +
        offset`` (as ``flashsel.topk`` / ``qsa_select`` write them with a
        page table). Invalid: ``< 0``, ``>= num_pages * page_size``, or at a
        position ``>= topk_length``.
    sm_scale
        FlashMLA's ``softmax_scale``; default ``d_qk ** -0.5``.
    d_v
        512.
    is_fp8_kvcache
        Optional: when given, must agree with ``k_cache``'s dtype.
    topk_length
        Optional int32 ``[b]`` (FlashMLA's: one length for all ``s_q`` rows of
        a request) or ``[b, s_q]`` (one per row), each in ``0..=topk``;
        derived per row from the indices when absent.
    attn_sink
        Optional float32 ``[h_q]``, as for :func:`sparse_mla_prefill`.

    Returns
    -------
    (out, lse)
        ``out [b, s_q, h_q, d_v]`` in q's dtype and ``lse`` float32 ``[b, h_q,
        s_q]`` (FlashMLA's layout); an empty row gives ``out = 0``, ``lse =
        +inf``.
    """
    torch = sys.modules.get("torch")
    if _is_tensor(torch, q):
        # Through the torch operator flashsel::sparse_mla_decode
        # (torch.compile), which runs _sparse_mla_decode below.
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.sparse_mla_decode(q, k_cache, indices, sm_scale, d_v, is_fp8_kvcache, topk_length, attn_sink)
    return _sparse_mla_decode(q, k_cache, indices, sm_scale, d_v, is_fp8_kvcache, topk_length, attn_sink)


def _sparse_mla_decode(
    q: Any,
    k_cache: Any,
    indices: Any,
    sm_scale: Any,
    d_v: Any,
    is_fp8_kvcache: Any,
    topk_length: Any,
    attn_sink: Any,
) -> tuple[Any, Any]:
    """:func:`sparse_mla_decode` on NumPy arrays, CPU tensors (the float64
    reference) and CUDA tensors (the kernels): the torch operator's
    implementation, arguments unchecked."""
    torch = sys.modules.get("torch")
    is_torch = _is_tensor(torch, q)
    if torch is not None:
        dev = _check_devices(torch, q=q, k_cache=k_cache, indices=indices, attn_sink=attn_sink, topk_length=topk_length)
        if dev is not None:
            return _decode_cuda(torch, q, k_cache, indices, sm_scale, d_v, is_fp8_kvcache, topk_length, attn_sink)
    qk = _data("q", q, torch)
    if qk.arr.ndim != 4:
        raise ValueError(f"q must be 4-D [b, s_q, h_q, d_qk], got shape {qk.arr.shape}")
    b, s_q, h_q, d_qk = qk.arr.shape
    cache, fmt = _cache(k_cache, torch)
    if is_fp8_kvcache is not None and bool(is_fp8_kvcache) != (fmt == "fp8"):
        raise ValueError(f"is_fp8_kvcache={is_fp8_kvcache} but k_cache is {'' if fmt == 'fp8' else 'not '}fp8")
    if cache.ndim == 4:
        if cache.shape[2] != 1:
            raise ValueError(f"k_cache must have one KV head ([pages, page_size, 1, W]), got shape {cache.shape}")
        cache = cache[:, :, 0, :]
    if cache.ndim != 3:
        raise ValueError(f"k_cache must be [num_pages, page_size, 1, W], got shape {cache.shape}")
    num_pages, page_size, width = cache.shape
    want = _FP8_TOKEN_BYTES if fmt == "fp8" else d_qk
    if width != want:
        what = "656 bytes a token (the fp8 layout)" if fmt == "fp8" else f"d_qk = {d_qk} values a token"
        raise ValueError(f"k_cache's last dimension is {width}, expected {what}")
    flat_cache, page_stride, token_stride = _span(cache)
    idx = _int32_array("indices", indices, torch, strict=True)
    if idx.ndim != 3 or idx.shape[:2] != (b, s_q):
        raise ValueError(f"indices must be [b, s_q, topk] = [{b}, {s_q}, topk], got shape {idx.shape}")
    topk = idx.shape[2]
    lens = None
    if topk_length is not None:
        lens = _int32_array("topk_length", topk_length, torch, strict=False)
        if lens.shape not in ((b,), (b, s_q)):
            raise ValueError(f"topk_length must be [b] = [{b}] or [b, s_q] = [{b}, {s_q}], got shape {lens.shape}")
    sink = _sink(attn_sink, h_q, torch)
    scale = d_qk**-0.5 if sm_scale is None else _scale(sm_scale)
    out, lse = _native.sparse_mla_decode_cpu(
        _flat(qk.arr),
        qk.name,
        flat_cache,
        fmt,
        b,
        s_q,
        h_q,
        d_qk,
        topk,
        num_pages,
        page_size,
        page_stride,
        token_stride,
        _flat(idx),
        scale,
        _int("d_v", d_v),
        sink,
        None if lens is None else _flat(lens),
        qk.name == "bf16",
    )
    out = out.reshape(b, s_q, h_q, -1)
    return qk.wrap(out, torch, is_torch), _wrap_f32(lse.reshape(b, h_q, s_q), torch, is_torch)


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def _is_tensor(torch: Any, x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _check_devices(torch: Any, **args: Any) -> Any:
    """Where a call runs: None (the CPU reference) when no tensor is on a
    CUDA device, else that device, which every argument must be a tensor on
    (torch.compile's fakes check the same: ``_torch_ops._mla_devices``)."""
    return _devices_of(torch, "sparse MLA", _DEVICES_MSG, args)


def _devices_of(torch: Any, op: str, msg: str, args: dict[str, Any]) -> Any:
    """The device rule of the attention operations (``op`` and ``msg`` name
    the operation in the errors): None when no tensor is on a CUDA device
    (every tensor then on the CPU or meta), else that device, which every
    given argument must be a tensor on."""
    tensors = {k: x for k, x in args.items() if _is_tensor(torch, x)}
    cuda = [x.device for x in tensors.values() if x.device.type == "cuda"]
    if not cuda:
        for name, x in tensors.items():
            if x.device.type not in ("cpu", "meta"):
                raise ValueError(f"{name} is on device {x.device}; {op} runs on CPU and CUDA tensors")
        return None
    dev = cuda[0]
    for name, x in args.items():
        if x is None:
            continue
        where = x.device if _is_tensor(torch, x) else type(x).__qualname__
        if where != dev:
            raise ValueError(f"{name} is on {where}, another tensor on {dev}: {msg}")
    return dev


class _Data:
    """q / kv as a native-order NumPy array of f32 or uint16 bf16 bits, and
    how to give an output back in the input's kind."""

    def __init__(self, arr: np.ndarray, name: str, dtype_str: str, out_np_dtype: Any) -> None:
        self.arr, self.name, self.dtype_str, self.out_np_dtype = arr, name, dtype_str, out_np_dtype

    def wrap(self, out: np.ndarray, torch: Any, is_torch: bool) -> Any:
        if is_torch:
            if self.name == "bf16":
                return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(out)
        return out if self.out_np_dtype is None else out.view(self.out_np_dtype)


def _data(what: str, x: Any, torch: Any) -> _Data:
    if _is_tensor(torch, x):
        if x.layout != torch.strided:
            raise TypeError(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
        if x.dtype == torch.float32:
            return _Data(x.detach().contiguous().numpy(), "f32", "torch.float32", None)
        if x.dtype == torch.bfloat16:
            bits = x.detach().contiguous().view(torch.int16).numpy().view(np.uint16)
            return _Data(bits, "bf16", "torch.bfloat16", None)
        raise TypeError(f"{what}: unsupported dtype {x.dtype} (expected torch.float32 or torch.bfloat16)")
    if not isinstance(x, np.ndarray) or isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{what} must be a numpy.ndarray or a torch.Tensor, got {type(x).__qualname__}")
    dt = x.dtype
    if dt.kind == "f" and dt.itemsize == 4:
        return _Data(np.asarray(x, np.float32), "f32", "float32", None)
    if _NP_BF16 is not None and dt == _NP_BF16:
        return _Data(x.view(np.uint16), "bf16", "bfloat16", _NP_BF16)
    if dt.kind in "iu" and dt.itemsize == 2:
        native = np.asarray(x, dt.newbyteorder("="))
        return _Data(native.view(np.uint16), "bf16", f"{dt} (bfloat16 bits)", native.dtype)
    raise TypeError(
        f"{what}: unsupported dtype {dt} (expected float32, ml_dtypes.bfloat16, or uint16 / int16 bfloat16 bits)"
    )


def _np_of(what: str, x: Any, torch: Any) -> np.ndarray:
    if _is_tensor(torch, x):
        return x.detach().numpy()
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except Exception as e:  # noqa: BLE001 - any conversion failure is the caller's type
        raise TypeError(f"{what}: cannot convert {type(x).__qualname__} to an array") from e


def _int32_array(what: str, x: Any, torch: Any, *, strict: bool) -> np.ndarray:
    """An int32 array: `strict` (indices, as FlashMLA) takes int32 only;
    else int32 or int64 (values checked to fit)."""
    if _is_tensor(torch, x):
        ok = x.dtype == torch.int32 or (not strict and x.dtype == torch.int64)
        if not ok:
            want = "torch.int32" if strict else "torch.int32 or torch.int64"
            raise TypeError(f"{what} must be {want}, got {x.dtype}")
        a = x.detach().numpy()
    else:
        a = _np_of(what, x, torch)
        if isinstance(x, (list, tuple)) and a.dtype.kind in "iu":
            a = a.astype(np.int64)
        ok = a.dtype.kind == "i" and (a.dtype.itemsize == 4 or (not strict and a.dtype.itemsize == 8))
        if not ok:
            want = "int32" if strict else "int32 or int64"
            raise TypeError(f"{what} must be {want}, got dtype {a.dtype}")
    if a.dtype.itemsize == 8 and a.size and (a.min() < _I32_MIN or a.max() > _I32_MAX):
        raise ValueError(f"{what}: values must fit int32")
    return np.asarray(a, np.int32)


def _sink(x: Any, h_q: int, torch: Any) -> np.ndarray | None:
    if x is None:
        return None
    if _is_tensor(torch, x) and x.dtype != torch.float32:
        raise TypeError(f"attn_sink must be torch.float32, got {x.dtype}")
    a = _np_of("attn_sink", x, torch)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"attn_sink must be float32, got dtype {a.dtype}")
    if a.shape != (h_q,):
        raise ValueError(f"attn_sink must be [h_q] = [{h_q}], got shape {a.shape}")
    return np.ascontiguousarray(a, np.float32)


def _scale(x: Any) -> float:
    try:
        s = float(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"sm_scale must be a float, got {type(x).__qualname__}") from e
    if not math.isfinite(s):
        raise ValueError(f"sm_scale must be finite, got {s}")
    return s


def _int(what: str, x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(x).__qualname__}")
    if x < 0:
        raise ValueError(f"{what} must be non-negative, got {x}")
    return int(x)


def _flat(a: np.ndarray) -> np.ndarray:
    """A C-contiguous 1-D copy or view of `a`, in native byte order."""
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return np.ascontiguousarray(a).reshape(-1)


def _wrap_f32(a: np.ndarray, torch: Any, is_torch: bool) -> Any:
    return torch.from_numpy(a) if is_torch else a


def _cache(x: Any, torch: Any) -> tuple[np.ndarray, str]:
    """k_cache as a NumPy array (strides kept) of uint8, float32 or uint16
    bf16 bits, and its format name."""
    if _is_tensor(torch, x):
        if x.layout != torch.strided:
            raise TypeError(f"k_cache must be a dense (strided) tensor, got layout {x.layout}")
        fp8 = getattr(torch, "float8_e4m3fn", None)
        if x.dtype == torch.uint8 or (fp8 is not None and x.dtype == fp8):
            return x.detach().view(torch.uint8).numpy(), "fp8"
        if x.dtype == torch.float32:
            return x.detach().numpy(), "f32"
        if x.dtype == torch.bfloat16:
            return x.detach().view(torch.int16).numpy().view(np.uint16), "bf16"
        raise TypeError(
            f"k_cache: unsupported dtype {x.dtype} (expected torch.uint8 / torch.float8_e4m3fn for the fp8 "
            "cache, torch.float32 or torch.bfloat16)"
        )
    if not isinstance(x, np.ndarray) or isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"k_cache must be a numpy.ndarray or a torch.Tensor, got {type(x).__qualname__}")
    dt = x.dtype
    if dt == np.uint8 or (_NP_FP8 is not None and dt == _NP_FP8):
        return x.view(np.uint8), "fp8"
    if dt.kind == "f" and dt.itemsize == 4:
        return (x if dt.isnative else x.astype(np.float32)), "f32"
    if _NP_BF16 is not None and dt == _NP_BF16:
        return x.view(np.uint16), "bf16"
    if dt.kind in "iu" and dt.itemsize == 2:
        return (x if dt.isnative else x.astype(dt.newbyteorder("="))).view(np.uint16), "bf16"
    raise TypeError(
        f"k_cache: unsupported dtype {dt} (expected uint8 / ml_dtypes.float8_e4m3fn for the fp8 cache, "
        "float32, ml_dtypes.bfloat16 or uint16 bfloat16 bits)"
    )


def _span(cache: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The 1-D view of the elements from a [pages, page_size, W] cache's first
    element to its last (the pages read in place), with the page and token
    strides in elements. A cache whose tokens are not contiguous, or whose
    strides are negative or not whole elements, is copied first."""
    pages, size, width = cache.shape
    item = cache.itemsize
    if pages == 0 or size == 0:
        return np.zeros(0, cache.dtype), width * size, width
    st = cache.strides
    ok = (width == 1 or st[2] == item) and all(s >= 0 and s % item == 0 for s in st[:2])
    if not ok or not cache.flags.aligned:
        cache = np.ascontiguousarray(cache)
        st = cache.strides
    ps = st[0] // item if pages > 1 else size * width
    ts = st[1] // item if size > 1 else width
    span = (pages - 1) * ps + (size - 1) * ts + width
    flat = np.lib.stride_tricks.as_strided(cache, shape=(span,), strides=(item,), writeable=False)
    return flat, ps, ts


# ---------------------------------------------------------------------------
# CUDA tensors
# ---------------------------------------------------------------------------


def _cuda_dtype(what: str, x: Any, torch: Any) -> str:
    """``_data``'s checks on a CUDA tensor: strided, float32 or bfloat16."""
    if x.layout != torch.strided:
        raise TypeError(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
    if x.dtype == torch.float32:
        return "f32"
    if x.dtype == torch.bfloat16:
        return "bf16"
    raise TypeError(f"{what}: unsupported dtype {x.dtype} (expected torch.float32 or torch.bfloat16)")


def _cuda_int32(what: str, x: Any, torch: Any, *, strict: bool) -> Any:
    """``_int32_array``'s dtype checks on a CUDA tensor, converted on the
    device by ``_api._clamped_int32`` (its values are not checked on the
    host)."""
    ok = x.dtype == torch.int32 or (not strict and x.dtype == torch.int64)
    if not ok:
        want = "torch.int32" if strict else "torch.int32 or torch.int64"
        raise TypeError(f"{what} must be {want}, got {x.dtype}")
    from . import _api  # noqa: PLC0415 - as in _launch_env

    return _api._clamped_int32(torch, x)


def _cuda_sink(x: Any, h_q: int, torch: Any) -> Any:
    if x is None:
        return None
    if x.dtype != torch.float32:
        raise TypeError(f"attn_sink must be torch.float32, got {x.dtype}")
    if tuple(x.shape) != (h_q,):
        raise ValueError(f"attn_sink must be [h_q] = [{h_q}], got shape {tuple(x.shape)}")
    return x.detach().contiguous()


def _ptr(x: Any) -> int:
    return 0 if x is None else int(x.data_ptr())


def _launch_env(torch: Any, device: Any) -> tuple[Any, int, int]:
    """The engine of `device` (created once, every module compiled), its
    ordinal and torch's current stream there."""
    from . import _api  # noqa: PLC0415 - _api imports nothing of this module

    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    _api._ensure_engine(ordinal)
    return _api, ordinal, _api._raw_stream(torch, ordinal)


def _workspace(torch: Any, rows: int, h_q: int, topk: int, device: Any) -> tuple[Any, int]:
    nbytes = _native.sparse_mla_workspace_bytes(rows, h_q, topk)
    return (torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None), nbytes


def _prefill_cuda(
    torch: Any, q: Any, kv: Any, indices: Any, sm_scale: Any, d_v: Any, attn_sink: Any, topk_length: Any
) -> tuple[Any, Any, Any]:
    """:func:`sparse_mla_prefill` on CUDA tensors of one device: one launch
    (two with the split-KV combine) on the current stream."""
    name = _cuda_dtype("q", q, torch)
    if _cuda_dtype("kv", kv, torch) != name:
        raise TypeError(f"q and kv must have the same dtype, got {q.dtype} and {kv.dtype}")
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [s_q, h_q, d_qk], got shape {tuple(q.shape)}")
    s_q, h_q, d_qk = q.shape
    kv2 = kv.detach()
    if kv2.dim() == 3:
        if kv2.shape[1] != 1:
            raise ValueError(f"kv must have one KV head ([s_kv, 1, d_qk]), got shape {tuple(kv.shape)}")
        kv2 = kv2[:, 0, :]
    if kv2.dim() != 2:
        raise ValueError(f"kv must be [s_kv, 1, d_qk] (or [s_kv, d_qk]), got shape {tuple(kv.shape)}")
    if kv2.shape[1] != d_qk:
        raise ValueError(f"kv has d_qk = {kv2.shape[1]} but q has d_qk = {d_qk}")
    s_kv = kv2.shape[0]
    if s_kv > 0 and (kv2.stride(1) != 1 or (s_kv > 1 and kv2.stride(0) < d_qk)):
        kv2 = kv2.contiguous()
    kv_stride = kv2.stride(0) if s_kv > 1 else d_qk
    idx = indices.detach()
    if idx.dtype != torch.int32:
        raise TypeError(f"indices must be torch.int32, got {idx.dtype}")
    if idx.dim() == 3:
        if idx.shape[1] != 1:
            raise ValueError(f"indices must be [s_q, 1, topk] (one KV head), got shape {tuple(idx.shape)}")
        idx = idx[:, 0, :]
    if idx.dim() != 2 or idx.shape[0] != s_q:
        raise ValueError(f"indices must be [s_q, 1, topk] with s_q = {s_q}, got shape {tuple(indices.shape)}")
    topk = idx.shape[1]
    idx = idx.contiguous()
    sink = _cuda_sink(attn_sink, h_q, torch)
    lens = None
    if topk_length is not None:
        lens = _cuda_int32("topk_length", topk_length, torch, strict=False)
        if tuple(lens.shape) != (s_q,):
            raise ValueError(f"topk_length must be [s_q] = [{s_q}], got shape {tuple(topk_length.shape)}")
    scale = _scale(sm_scale)
    dv = _int("d_v", d_v)
    device = q.device
    qc = q.detach().contiguous()
    out = torch.empty((s_q, h_q, dv), dtype=q.dtype, device=device)
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=device)
    _, ordinal, stream = _launch_env(torch, device)
    ws, nbytes = _workspace(torch, s_q, h_q, topk, device)
    _native.cuda_sparse_mla_prefill(
        ordinal,
        name,
        s_q,
        s_kv,
        h_q,
        d_qk,
        dv,
        topk,
        kv_stride,
        scale,
        _ptr(qc),
        _ptr(kv2) if s_kv > 0 else 0,
        _ptr(idx),
        _ptr(lens),
        _ptr(sink),
        _ptr(out),
        _ptr(max_logits),
        _ptr(lse),
        _ptr(ws),
        nbytes,
        stream,
    )
    return out, max_logits, lse


def _decode_cuda(
    torch: Any,
    q: Any,
    k_cache: Any,
    indices: Any,
    sm_scale: Any,
    d_v: Any,
    is_fp8_kvcache: Any,
    topk_length: Any,
    attn_sink: Any,
) -> tuple[Any, Any]:
    """:func:`sparse_mla_decode` on CUDA tensors of one device."""
    name = _cuda_dtype("q", q, torch)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [b, s_q, h_q, d_qk], got shape {tuple(q.shape)}")
    b, s_q, h_q, d_qk = q.shape
    x = k_cache.detach()
    if x.layout != torch.strided:
        raise TypeError(f"k_cache must be a dense (strided) tensor, got layout {x.layout}")
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if x.dtype == torch.uint8 or (fp8 is not None and x.dtype == fp8):
        x, fmt = x.view(torch.uint8), "fp8"
    elif x.dtype == torch.float32:
        fmt = "f32"
    elif x.dtype == torch.bfloat16:
        fmt = "bf16"
    else:
        raise TypeError(
            f"k_cache: unsupported dtype {x.dtype} (expected torch.uint8 / torch.float8_e4m3fn for the fp8 "
            "cache, torch.float32 or torch.bfloat16)"
        )
    if is_fp8_kvcache is not None and bool(is_fp8_kvcache) != (fmt == "fp8"):
        raise ValueError(f"is_fp8_kvcache={is_fp8_kvcache} but k_cache is {'' if fmt == 'fp8' else 'not '}fp8")
    if x.dim() == 4:
        if x.shape[2] != 1:
            raise ValueError(f"k_cache must have one KV head ([pages, page_size, 1, W]), got shape {tuple(x.shape)}")
        x = x[:, :, 0, :]
    if x.dim() != 3:
        raise ValueError(f"k_cache must be [num_pages, page_size, 1, W], got shape {tuple(x.shape)}")
    num_pages, page_size, width = x.shape
    want = _FP8_TOKEN_BYTES if fmt == "fp8" else d_qk
    if width != want:
        what = "656 bytes a token (the fp8 layout)" if fmt == "fp8" else f"d_qk = {d_qk} values a token"
        raise ValueError(f"k_cache's last dimension is {width}, expected {what}")
    if num_pages > 0 and page_size > 0 and width > 1 and x.stride(2) != 1:
        x = x.contiguous()
    page_stride = x.stride(0) if num_pages > 1 else page_size * width
    token_stride = x.stride(1) if page_size > 1 else width
    idx = indices.detach()
    if idx.dtype != torch.int32:
        raise TypeError(f"indices must be torch.int32, got {idx.dtype}")
    if idx.dim() != 3 or tuple(idx.shape[:2]) != (b, s_q):
        raise ValueError(f"indices must be [b, s_q, topk] = [{b}, {s_q}, topk], got shape {tuple(idx.shape)}")
    topk = idx.shape[2]
    idx = idx.contiguous()
    lens = None
    if topk_length is not None:
        lens = _cuda_int32("topk_length", topk_length, torch, strict=False)
        if tuple(lens.shape) not in ((b,), (b, s_q)):
            raise ValueError(
                f"topk_length must be [b] = [{b}] or [b, s_q] = [{b}, {s_q}], got shape {tuple(topk_length.shape)}"
            )
    sink = _cuda_sink(attn_sink, h_q, torch)
    scale = d_qk**-0.5 if sm_scale is None else _scale(sm_scale)
    dv = _int("d_v", d_v)
    device = q.device
    qc = q.detach().contiguous()
    out = torch.empty((b, s_q, h_q, dv), dtype=q.dtype, device=device)
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=device)
    _, ordinal, stream = _launch_env(torch, device)
    ws, nbytes = _workspace(torch, b * s_q, h_q, topk, device)
    _native.cuda_sparse_mla_decode(
        ordinal,
        name,
        fmt,
        b,
        s_q,
        h_q,
        d_qk,
        dv,
        topk,
        num_pages,
        page_size,
        page_stride,
        token_stride,
        scale,
        _ptr(qc),
        _ptr(x) if num_pages > 0 else 0,
        _ptr(idx),
        _ptr(lens),
        lens is not None and lens.dim() == 2,
        _ptr(sink),
        _ptr(out),
        _ptr(lse),
        _ptr(ws),
        nbytes,
        stream,
    )
    return out, lse
