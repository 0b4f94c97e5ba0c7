"""QSA sparse attention (private: import from ``flashsel``):
``qsa_attention``, grouped-query attention of each query's heads over the
token ids or KV slots that ``qsa_select`` / ``qsa_indexer`` write. NumPy
arrays and CPU torch tensors run the Rust float64 reference
(``flashsel::ops::qsa_attention::reference_qsa_attention``, rounded once);
CUDA tensors run the CUDA engine's kernel (``CudaEngine::qsa_attention_device``:
zero-copy, on torch's current stream, no host synchronisation, so CUDA
graphs capture it). Torch tensors go through the torch operator
``flashsel::qsa_attention`` (``_torch_ops``), whose implementation is
``_qsa_attention`` here. The contract is docs/semantics.md, "QSA sparse
attention".

The input conversions are sparse MLA's (``_mla``: q's dtypes, int32
indices, lengths, the CUDA launch environment); the shape checks
(:func:`_geometry`) work on shapes and element strides alone, so that the
torch operator's fake implementation makes the same checks with the same
messages."""

import math
import sys
from typing import Any, NamedTuple

import numpy as np

from . import _mla, _native

_DEVICES_MSG = "QSA attention on CUDA takes every tensor on one device"
_DTYPE_NAMES = {"f32": "float32", "bf16": "bfloat16"}


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def qsa_attention(q: Any, k: Any, v: Any, indices: Any, *, scale: Any = None, lengths: Any = None) -> tuple[Any, Any]:
    """QSA sparse attention: each query row's heads attend to the keys and
    values its index row names (grouped-query attention).

    Parameters
    ----------
    q
        ``[rows, h_q, d]``, ``1 <= h_q <= 128``, ``d`` 64, 128 or 256.
        float32 or bfloat16 (NumPy: ``ml_dtypes.bfloat16`` or its uint16 /
        int16 bit patterns; torch: ``torch.bfloat16``).
    k, v
        The keys and values: one sequence ``[tokens, h_kv, d]``, or a paged
        cache ``[num_pages, page_size, h_kv, d]`` (slot ``s`` is token ``s %
        page_size`` of page ``s // page_size``). float32 or bfloat16, one
        dtype and one shape for both (q's dtype may differ); ``h_q % h_kv ==
        0``, query head ``h`` reads KV head ``h // (h_q // h_kv)``. The last
        two dimensions must be packed; the token and page dimensions may be
        strided (a slice of a larger buffer is read in place), with the same
        strides in ``k`` and ``v``.
    indices
        int32 ``[rows, width]``, ``width >= 1``: token ids of the sequence or
        slots of the cache (``qsa_select``'s ids). An entry is invalid
        (contributes nothing, its K / V rows are never read) when it is ``<
        0``, ``>= tokens`` (``num_pages * page_size``), or at a position ``>=
        lengths[i]``. Duplicates are attended once per occurrence.
    scale
        The logit scale (taken as float32); default ``1 / sqrt(d)``.
    lengths
        Optional int32 (or int64) ``[rows]``, each in ``0..=width``
        (``qsa_select``'s ``counts``): row ``i`` reads only ``indices[i,
        :lengths[i]]``. When absent it is derived from the indices: one past
        the last valid entry of the row (0 if none), the same bits as passing
        that length.

    Returns
    -------
    (out, lse)
        ``out [rows, h_q, d]`` in q's dtype: ``sum_j softmax(l)_j * v_j``
        over the attended entries, ``l_j = scale * q . k_j``; ``lse`` float32
        ``[rows, h_q]``, the natural-log sum of exp of the logits. A row
        with no attended entry gives ``out = 0``, ``lse = -inf``. NumPy in,
        NumPy out; a tensor in, tensors out. On the CPU computed in float64
        and rounded once; on CUDA within FlashMLA's tolerances of that
        reference (docs/semantics.md).

    Raises
    ------
    TypeError
        Unsupported types or dtypes (``k`` and ``v`` of different dtypes,
        non-int32 indices, a scale that is not a number).
    ValueError
        Bad shapes, strides, ``h_q``, ``h_kv``, ``d``, ``width``, lengths
        values, a non-finite scale, tensors on several devices.

    On CUDA tensors (all on one device) the kernel runs on torch's current
    stream without a host synchronisation; ``lengths`` values are then not
    checked on the host (values outside ``0..=width`` are clamped into it on
    the device). ``q`` and ``indices`` are made contiguous (no copy when they
    are); ``k`` and ``v`` are read in place.
    """
    torch = sys.modules.get("torch")
    if _mla._is_tensor(torch, q):
        # Through the torch operator flashsel::qsa_attention (torch.compile),
        # which runs _qsa_attention below.
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.qsa_attention(q, k, v, indices, scale, lengths)
    return _qsa_attention(q, k, v, indices, scale, lengths)


def _qsa_attention(q: Any, k: Any, v: Any, indices: Any, scale: Any, lengths: Any) -> tuple[Any, Any]:
    """:func:`qsa_attention` on NumPy arrays, CPU tensors (the float64
    reference) and CUDA tensors (the kernel): the torch operator's
    implementation, arguments unchecked."""
    torch = sys.modules.get("torch")
    is_torch = _mla._is_tensor(torch, q)
    if torch is not None and _check_devices(torch, q=q, k=k, v=v, indices=indices, lengths=lengths) is not None:
        return _qsa_cuda(torch, q, k, v, indices, scale, lengths)
    qk = _mla._data("q", q, torch)
    ka, kn = _kv("k", k, torch)
    va, vn = _kv("v", v, torch)
    _same_kv_dtype(kn, vn)
    idx = _mla._int32_array("indices", indices, torch, strict=True)
    lens = None if lengths is None else _mla._int32_array("lengths", lengths, torch, strict=False)
    g = _geometry(
        qk.arr.shape,
        ka.shape,
        _elem_strides("k", ka),
        va.shape,
        _elem_strides("v", va),
        idx.shape,
        None if lens is None else lens.shape,
        scale,
    )
    out, lse = _native.qsa_attention_cpu(
        _mla._flat(qk.arr),
        qk.name,
        _span(ka, g),
        _span(va, g),
        kn,
        *g.spec(),
        _mla._flat(idx),
        g.scale,
        None if lens is None else _mla._flat(lens),
        qk.name == "bf16",
    )
    out = qk.wrap(out.reshape(g.rows, g.h_q, g.d), torch, is_torch)
    return out, _mla._wrap_f32(lse.reshape(g.rows, g.h_q), torch, is_torch)


# ---------------------------------------------------------------------------
# Checks shared with the torch operator's fake implementation
# ---------------------------------------------------------------------------


class _Geom(NamedTuple):
    """A request's geometry, as the engine's spec takes it (strides in
    elements; ``scale`` None for the default)."""

    rows: Any
    h_q: Any
    h_kv: Any
    d: Any
    width: Any
    num_pages: Any
    page_size: Any
    page_stride: Any
    token_stride: Any
    scale: Any

    def spec(self) -> tuple[Any, ...]:
        """The native functions' geometry arguments, in their order."""
        return tuple(self[:9])


def _check_devices(torch: Any, **args: Any) -> Any:
    """Where a call runs: ``_mla``'s device rule with this operation's
    messages."""
    return _mla._devices_of(torch, "QSA attention", _DEVICES_MSG, args)


def _same_kv_dtype(kn: str, vn: str) -> None:
    if kn != vn:
        raise TypeError(f"k and v must have the same dtype, got {_DTYPE_NAMES[kn]} and {_DTYPE_NAMES[vn]}")


def _scale(x: Any) -> Any:
    """The scale as a float (None: the default ``1/sqrt(d)``, computed by
    the engine)."""
    if x is None:
        return None
    try:
        s = float(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"scale must be a float, got {type(x).__qualname__}") from e
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite, got {s}")
    return s


def _cache(what: str, shape: tuple[Any, ...], strides: tuple[Any, ...]) -> tuple[Any, Any, Any, Any]:
    """``(num_pages, page_size, page_stride, token_stride)`` of a k / v of
    this shape (3-D or 4-D, checked) and these element strides: the last two
    dimensions packed, the others non-negative. One sequence ``[tokens,
    h_kv, d]`` is one page of ``tokens`` (no page when it is empty)."""
    h_kv, d = shape[-2], shape[-1]
    w = h_kv * d
    if len(shape) == 3:
        if shape[0] == 0:
            return 0, 1, w, w
        num_pages, page_size = 1, shape[0]
        st = (0, *strides)
    else:
        num_pages, page_size = shape[0], shape[1]
        st = tuple(strides)
    if num_pages == 0 or page_size == 0 or w == 0:
        return num_pages, page_size, page_size * w, w
    if (d > 1 and st[3] != 1) or (h_kv > 1 and st[2] != d):
        raise ValueError(
            f"{what}: the last two dimensions [h_kv, d] must be packed (strides ({st[2]}, {st[3]}) elements, "
            f"expected ({d}, 1)); pass a contiguous copy (numpy.ascontiguousarray / tensor.contiguous())"
        )
    if st[0] < 0 or st[1] < 0:
        raise ValueError(f"{what}: negative strides {tuple(strides)}; pass a contiguous copy")
    token_stride = st[1] if page_size > 1 else w
    page_stride = st[0] if num_pages > 1 else page_size * token_stride
    return num_pages, page_size, page_stride, token_stride


def _geometry(
    q_shape: tuple[Any, ...],
    k_shape: tuple[Any, ...],
    k_strides: tuple[Any, ...],
    v_shape: tuple[Any, ...],
    v_strides: tuple[Any, ...],
    idx_shape: tuple[Any, ...],
    lens_shape: tuple[Any, ...] | None,
    scale: Any,
) -> _Geom:
    """The shape checks of a request, on shapes and element strides alone
    (the eager paths and the torch operator's fake make them alike)."""
    q_shape, k_shape, v_shape, idx_shape = tuple(q_shape), tuple(k_shape), tuple(v_shape), tuple(idx_shape)
    if len(q_shape) != 3:
        raise ValueError(f"q must be 3-D [rows, h_q, d], got shape {q_shape}")
    rows, h_q, d = q_shape
    if len(k_shape) not in (3, 4):
        raise ValueError(
            f"k must be [tokens, h_kv, d] or a paged cache [num_pages, page_size, h_kv, d], got shape {k_shape}"
        )
    if v_shape != k_shape:
        raise ValueError(f"v must have k's shape {k_shape}, got shape {v_shape}")
    if k_shape[-1] != d:
        raise ValueError(f"k and v have d = {k_shape[-1]} but q has d = {d}")
    kc = _cache("k", k_shape, k_strides)
    vc = _cache("v", v_shape, v_strides)
    if kc != vc:
        raise ValueError(
            f"k and v must have the same strides, got {tuple(k_strides)} and {tuple(v_strides)} elements "
            f"(page and token strides {kc[2:]} and {vc[2:]})"
        )
    if len(idx_shape) != 2 or idx_shape[0] != rows:
        raise ValueError(f"indices must be [rows, width] with rows = {rows}, got shape {idx_shape}")
    if lens_shape is not None and tuple(lens_shape) != (rows,):
        raise ValueError(f"lengths must be [rows] = [{rows}], got shape {tuple(lens_shape)}")
    return _Geom(rows, h_q, k_shape[-2], d, idx_shape[1], *kc, _scale(scale))


def _check_spec(g: _Geom, q_name: str, kv_name: str) -> int:
    """The engine's spec checks (``QsaAttention::validate``, its messages);
    the CUDA workspace bytes."""
    return _native.qsa_attention_check(*g.spec(), q_name, kv_name, g.scale)


# ---------------------------------------------------------------------------
# Host inputs
# ---------------------------------------------------------------------------


def _kv(what: str, x: Any, torch: Any) -> tuple[np.ndarray, str]:
    """k / v as a NumPy array of float32 or uint16 bf16 bits, strides kept
    (read in place), and its dtype name."""
    if _mla._is_tensor(torch, x):
        name = _mla._cuda_dtype(what, x, torch)  # _data's tensor checks, no copy
        x = x.detach()
        return (x.numpy() if name == "f32" else x.view(torch.int16).numpy().view(np.uint16)), name
    d = _mla._data(what, x, torch)  # NumPy: strides kept (a copy only to native byte order)
    return d.arr, d.name


def _elem_strides(what: str, a: np.ndarray) -> tuple[int, ...]:
    """A NumPy array's strides in elements (whole elements, aligned data)."""
    item = a.itemsize
    if a.size and (any(s % item for s in a.strides) or not a.flags.aligned):
        raise ValueError(
            f"{what}: strides {a.strides} bytes are not whole {item}-byte elements, or the data is unaligned; "
            "pass a contiguous copy"
        )
    return tuple(s // item for s in a.strides)


def _span(a: np.ndarray, g: _Geom) -> np.ndarray:
    """The 1-D view of a checked k / v from its first element to the last
    the geometry addresses (the cache read in place)."""
    if g.num_pages == 0 or g.page_size == 0 or g.h_kv * g.d == 0:
        return np.zeros(0, a.dtype)
    n = (g.num_pages - 1) * g.page_stride + (g.page_size - 1) * g.token_stride + g.h_kv * g.d
    return np.lib.stride_tricks.as_strided(a, shape=(n,), strides=(a.itemsize,), writeable=False)


# ---------------------------------------------------------------------------
# CUDA tensors
# ---------------------------------------------------------------------------


def _qsa_cuda(torch: Any, q: Any, k: Any, v: Any, indices: Any, scale: Any, lengths: Any) -> tuple[Any, Any]:
    """:func:`qsa_attention` on CUDA tensors of one device: one launch (two
    with the split-KV combine) on the current stream."""
    qn = _mla._cuda_dtype("q", q, torch)
    kn, vn = _mla._cuda_dtype("k", k, torch), _mla._cuda_dtype("v", v, torch)
    _same_kv_dtype(kn, vn)
    idx = indices.detach()
    if idx.dtype != torch.int32:
        raise TypeError(f"indices must be torch.int32, got {idx.dtype}")
    lens = None if lengths is None else _mla._cuda_int32("lengths", lengths, torch, strict=False)
    g = _geometry(
        tuple(q.shape),
        tuple(k.shape),
        tuple(k.stride()),
        tuple(v.shape),
        tuple(v.stride()),
        tuple(idx.shape),
        None if lengths is None else tuple(lengths.shape),
        scale,
    )
    nbytes = _check_spec(g, qn, kn)
    device = q.device
    qc = q.detach().contiguous()
    idx = idx.contiguous()
    out = torch.empty((g.rows, g.h_q, g.d), dtype=q.dtype, device=device)
    lse = torch.empty((g.rows, g.h_q), dtype=torch.float32, device=device)
    _, ordinal, stream = _mla._launch_env(torch, device)
    # torch's caching allocator gives 512-byte aligned blocks (the engine
    # needs 256).
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None
    has_cache = g.num_pages > 0 and g.page_size > 0
    _native.cuda_qsa_attention(
        ordinal,
        qn,
        kn,
        *g.spec(),
        g.scale,
        _mla._ptr(qc),
        _mla._ptr(k) if has_cache else 0,
        _mla._ptr(v) if has_cache else 0,
        _mla._ptr(idx),
        _mla._ptr(lens),
        _mla._ptr(out),
        _mla._ptr(lse),
        _mla._ptr(ws),
        nbytes,
        stream,
    )
    return out, lse
