"""flashsel's torch operators: ``torch.ops.flashsel.topk``,
``torch.ops.flashsel.qsa_select``, ``torch.ops.flashsel.qsa_scores``,
``torch.ops.flashsel.qsa_indexer``, ``torch.ops.flashsel.sparse_mla_prefill``,
``torch.ops.flashsel.sparse_mla_decode``, ``torch.ops.flashsel.qsa_attention``,
``torch.ops.flashsel.dsa_scores`` and ``torch.ops.flashsel.dsa_indexer``,
each with a fake (meta) implementation, so that :func:`flashsel.topk`,
:func:`flashsel.qsa_select`, :func:`flashsel.qsa_scores`,
:func:`flashsel.qsa_indexer`, :func:`flashsel.sparse_mla_prefill`,
:func:`flashsel.sparse_mla_decode`, :func:`flashsel.qsa_attention`,
:func:`flashsel.dsa_scores` and :func:`flashsel.dsa_indexer` on torch
tensors trace into ``torch.compile`` graphs without a graph break
(``fullgraph=True``); on CUDA tensors all nine are also captured by CUDA
graphs.

The sparse MLA operators run ``_mla._sparse_mla_prefill`` /
``_mla._sparse_mla_decode`` (the CPU float64 reference, or the CUDA kernels
on CUDA tensors), the QSA attention operator
``_qsa_attention._qsa_attention`` (likewise), the DSA indexer operators
``_dsa._dsa_scores`` / ``_dsa._dsa_indexer`` (the CPU engine, or the CUDA
engine on CUDA tensors). Their fake implementations accept CUDA tensors
(all on one device); see :func:`_mla_prefill_fake`.

This module imports torch, so flashsel imports it only when torch is already
imported: ``flashsel/__init__.py`` does when torch was imported first, and the
public functions do on their first torch-tensor call. Importing it registers
the operators (once per process).

The public functions check their options, then call :func:`topk` /
:func:`qsa_select` here, which pass tensors and Python ints on as they are,
bring other host arguments (lists, NumPy arrays and scalars) to tensors, and
call the operator. The operator's real implementation is the existing torch
path of ``_api`` (``_topk_torch_cpu``, ``_topk_cuda``, ``_qsa_torch``),
dispatched on the scores' device, so eager results and errors are the same as
before. The fake implementations check the metadata (dtype, shape, strides,
devices, an int length's range) with the same messages, and return empty
tensors of the outputs' shapes: they never read data, so value checks (a
tensor length out of range, say) happen when the operator runs. Neither
operator is differentiable: autograd passes through them, so their outputs
never require grad.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import _api, _dsa, _indexer, _mla, _native, _qsa_attention

# ---------------------------------------------------------------------------
# The operators
# ---------------------------------------------------------------------------

_LIB = torch.library.Library("flashsel", "FRAGMENT")  # kept alive: dropping it unregisters the ops

_TAGS = (torch.Tag.pt2_compliant_tag,)


def _register(name: str, impl: Any, fake: Any) -> Any:
    """Registers the defined operator flashsel::name: its implementation
    (CompositeExplicitAutograd), its fake (meta) function, and autograd
    passing through (none of the operators is differentiable: outputs never
    require grad, also for inputs that do). Returns the op overload."""
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(f"flashsel::{name}", fake, lib=_LIB)
    return getattr(torch.ops.flashsel, name).default

# `values` is always returned: [rows, k] (or [k]) in the scores' dtype when
# return_values, else an empty [0] tensor of that dtype on the scores' device.
# A scalar length or start for every row travels as the int `length` /
# `start` (not filled into a tensor first), at most one of each pair given.
_LIB.define(
    "topk(Tensor scores, SymInt k, Tensor? lengths, Tensor? starts, str order, str nan, bool return_values,"
    " SymInt? length=None, SymInt? start=None, Tensor? page_table=None, SymInt page_size=64,"
    " Tensor? seq_ids=None) -> (Tensor indices, Tensor values)",
    tags=_TAGS,
)
_LIB.define(
    "qsa_select(Tensor scores, Tensor positions, SymInt ratio, SymInt k_blocks, str order, str nan,"
    " Tensor? page_table, SymInt page_size, Tensor? seq_ids) -> (Tensor ids, Tensor counts)",
    tags=_TAGS,
)



def _topk_cuda(
    scores: Any, k: int, lengths: Any, starts: Any, order: str, nan: str, return_values: bool, pages: Any
) -> Any:
    """The one call of ``_api._topk_cuda`` (``starts=`` and the page table
    passed only when given)."""
    extra = {} if starts is None else {"starts": starts}
    if pages[0] is not None:
        extra.update(page_table=pages[0], page_size=pages[1], seq_ids=pages[2])
    return _api._topk_cuda(torch, scores, k, lengths, order, nan, return_values, **extra)


def _topk_impl(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    starts: torch.Tensor | None,
    order: str,
    nan: str,
    return_values: bool,
    length: int | None = None,
    start: int | None = None,
    page_table: torch.Tensor | None = None,
    page_size: int = 64,
    seq_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::topk`` on real tensors: the CPU or the CUDA engine, by the
    scores' device (whatever device the dispatcher picked from the others)."""
    if length is not None or start is not None:
        lengths = _one_of("length", lengths, length)
        starts = _one_of("start", starts, start)
    pages = (page_table, page_size, seq_ids)
    dev = scores.device.type
    if dev == "cuda":
        out = _topk_cuda(scores, k, lengths, starts, order, nan, return_values, pages)
    elif dev == "cpu":
        out = _api._topk_torch_cpu(torch, scores, k, lengths, order, nan, return_values, starts, pages)
    else:
        raise ValueError(f"scores is on device {scores.device}; flashsel runs on the CPU and on CUDA devices")
    if return_values:
        return out
    return out, scores.new_empty((0,))


def _topk_fake(
    scores: torch.Tensor,
    k: Any,
    lengths: torch.Tensor | None,
    starts: torch.Tensor | None,
    order: str,
    nan: str,
    return_values: bool,
    length: Any = None,
    start: Any = None,
    page_table: torch.Tensor | None = None,
    page_size: Any = 64,
    seq_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::topk`` on fake (meta) tensors: the metadata checks, in the
    real path's order, and empty outputs of its shapes."""
    lengths = _one_of("length", lengths, length)
    starts = _one_of("start", starts, start)
    if type(k) is int:
        _api._check_k(k)
    _api._check_option("order", order, _api._ORDERS)
    _api._check_option("nan", nan, _api._NANS)
    rows, cols, was_1d = _check_scores(scores, k, order, nan, native=True)
    if isinstance(lengths, torch.Tensor):
        _check_lengths_meta(lengths, scores, rows)
    elif type(lengths) is int and type(cols) is int:
        _api._check_length_value(lengths, cols)
    if starts is not None:
        if isinstance(starts, torch.Tensor):
            _check_int_vector_meta("starts", starts, rows, scalar_ok=True)
        elif type(starts) is int and not -(2**31) <= starts <= _api._I32_MAX:
            raise ValueError("starts: a value does not fit int32")
    shape = (k,) if was_1d else (rows, k)
    indices = scores.new_empty(shape, dtype=torch.int32)
    values = scores.new_empty(shape if return_values else (0,))
    return indices, values


def _qsa_impl(
    scores: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: torch.Tensor | None,
    page_size: int,
    seq_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::qsa_select`` on real tensors (``_api._qsa_torch``)."""
    return _api._qsa_torch(scores, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)


def _qsa_fake(
    scores: torch.Tensor,
    positions: torch.Tensor,
    ratio: Any,
    k_blocks: Any,
    order: str,
    nan: str,
    page_table: torch.Tensor | None,
    page_size: Any,
    seq_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::qsa_select`` on fake (meta) tensors: the metadata checks and
    empty ``ids [T, k_blocks * ratio + ratio - 1]``, ``counts [T]`` (int32)."""
    _api._check_option("order", order, _api._ORDERS)
    _api._check_option("nan", nan, _api._NANS)
    for v in (ratio, k_blocks, page_size):
        if type(v) is int:
            _api._check_k(v)
    rows = _check_qsa_scores(scores)
    _check_int_vector_meta("positions", positions, rows)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
    if page_table is not None:
        if page_table.dim() != 2 or page_table.dtype not in (torch.int32, getattr(torch, "uint32", torch.int32)):
            raise TypeError(
                f"page_table must be int32 [sequences, max_pages], got {_np_name(page_table.dtype)} "
                f"{tuple(page_table.shape)}"
            )
        _check_int_vector_meta("seq_ids", seq_ids, rows)
    ids = scores.new_empty((rows, k_blocks * ratio + ratio - 1), dtype=torch.int32)
    counts = scores.new_empty((rows,), dtype=torch.int32)
    return ids, counts


# Not differentiable (indices; the values as selected bits).
_TOPK = _register("topk", _topk_impl, _topk_fake)
_QSA = _register("qsa_select", _qsa_impl, _qsa_fake)


# ---------------------------------------------------------------------------
# Sparse MLA: flashsel::sparse_mla_prefill, flashsel::sparse_mla_decode
# ---------------------------------------------------------------------------

# The arguments of the public functions, in their order; the optional ones
# as Tensor? / float? / bool? with the public defaults.
_LIB.define(
    "sparse_mla_prefill(Tensor q, Tensor kv, Tensor indices, float sm_scale, SymInt d_v=512,"
    " Tensor? attn_sink=None, Tensor? topk_length=None) -> (Tensor out, Tensor max_logits, Tensor lse)",
    tags=_TAGS,
)
_LIB.define(
    "sparse_mla_decode(Tensor q, Tensor k_cache, Tensor indices, float? sm_scale=None, SymInt d_v=512,"
    " bool? is_fp8_kvcache=None, Tensor? topk_length=None, Tensor? attn_sink=None) -> (Tensor out, Tensor lse)",
    tags=_TAGS,
)

_MLA_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
_FP8_DTYPES = tuple(d for d in (torch.uint8, getattr(torch, "float8_e4m3fn", None)) if d is not None)
_CACHE_NAMES = {"f32": "f32", "bf16": "bf16", "fp8": "fp8 (656-byte V3.2 tokens)"}  # the engine's names


def _mla_prefill_impl(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``flashsel::sparse_mla_prefill`` on real tensors: ``_mla``'s CPU
    reference or, on CUDA tensors, its kernels."""
    return _mla._sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


def _mla_decode_impl(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | None = None,
    d_v: int = 512,
    is_fp8_kvcache: bool | None = None,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::sparse_mla_decode`` on real tensors: ``_mla``'s CPU
    reference, or its CUDA kernels on CUDA tensors."""
    return _mla._sparse_mla_decode(q, k_cache, indices, sm_scale, d_v, is_fp8_kvcache, topk_length, attn_sink)


def _mla_prefill_fake(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: Any,
    d_v: Any = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``flashsel::sparse_mla_prefill`` on fake (meta) tensors: the metadata
    checks of ``_mla._sparse_mla_prefill`` and of the engine's spec, in their
    order and with their messages, and empty ``out [s_q, h_q, d_v]`` (q's
    dtype), ``max_logits`` and ``lse`` float32 ``[s_q, h_q]`` on q's device.

    CUDA tensors are accepted when all are on one device (the real
    implementation runs the CUDA kernels on them); tensors on several
    devices, one of them CUDA, raise the eager ValueError. Value
    checks (topk_length values, int64 lengths that do not fit int32) happen
    when the operator runs."""
    _mla_devices(q=q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length)
    qn, kvn = _mla_dtype("q", q), _mla_dtype("kv", kv)
    if qn != kvn:
        raise TypeError(f"q and kv must have the same dtype, got {q.dtype} and {kv.dtype}")
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [s_q, h_q, d_qk], got shape {_shape(q)}")
    s_q, h_q, d_qk = q.shape
    kvs = _shape(kv)
    if len(kvs) == 3:
        if kvs[1] != 1:
            raise ValueError(f"kv must have one KV head ([s_kv, 1, d_qk]), got shape {kvs}")
        kvs = (kvs[0], kvs[2])
    if len(kvs) != 2:
        raise ValueError(f"kv must be [s_kv, 1, d_qk] (or [s_kv, d_qk]), got shape {_shape(kv)}")
    if kvs[1] != d_qk:
        raise ValueError(f"kv has d_qk = {kvs[1]} but q has d_qk = {d_qk}")
    idx = _mla_int32("indices", indices, strict=True)
    if len(idx) == 3:
        if idx[1] != 1:
            raise ValueError(f"indices must be [s_q, 1, topk] (one KV head), got shape {idx}")
        idx = (idx[0], idx[2])
    if len(idx) != 2 or idx[0] != s_q:
        raise ValueError(f"indices must be [s_q, 1, topk] with s_q = {s_q}, got shape {idx}")
    topk = idx[1]
    _mla_sink(attn_sink, h_q)
    if topk_length is not None:
        lens = _mla_int32("topk_length", topk_length, strict=False)
        if len(lens) != 1 or lens[0] != s_q:
            raise ValueError(f"topk_length must be [s_q] = [{s_q}], got shape {lens}")
    scale = _mla._scale(sm_scale)
    _mla_d_v(d_v)
    _mla_spec(h_q, d_qk, d_v, topk, scale)
    out = q.new_empty((s_q, h_q, d_v))
    return out, q.new_empty((s_q, h_q), dtype=torch.float32), q.new_empty((s_q, h_q), dtype=torch.float32)


def _mla_decode_fake(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: Any = None,
    d_v: Any = 512,
    is_fp8_kvcache: bool | None = None,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::sparse_mla_decode`` on fake (meta) tensors: the metadata
    checks of ``_mla._sparse_mla_decode`` and of the engine's spec (cache
    geometry from the strides, as ``_mla._span`` reads them), and empty ``out
    [b, s_q, h_q, d_v]`` (q's dtype) and ``lse`` float32 ``[b, h_q, s_q]``.
    Devices and value checks as :func:`_mla_prefill_fake`."""
    _mla_devices(q=q, k_cache=k_cache, indices=indices, attn_sink=attn_sink, topk_length=topk_length)
    _mla_dtype("q", q)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [b, s_q, h_q, d_qk], got shape {_shape(q)}")
    b, s_q, h_q, d_qk = q.shape
    fmt = _mla_cache_format(k_cache)
    if is_fp8_kvcache is not None and bool(is_fp8_kvcache) != (fmt == "fp8"):
        raise ValueError(f"is_fp8_kvcache={is_fp8_kvcache} but k_cache is {'' if fmt == 'fp8' else 'not '}fp8")
    shape, strides = _shape(k_cache), tuple(k_cache.stride())
    if len(shape) == 4:
        if shape[2] != 1:
            raise ValueError(f"k_cache must have one KV head ([pages, page_size, 1, W]), got shape {shape}")
        shape, strides = shape[:2] + shape[3:], strides[:2] + strides[3:]
    if len(shape) != 3:
        raise ValueError(f"k_cache must be [num_pages, page_size, 1, W], got shape {shape}")
    num_pages, page_size, width = shape
    want = _mla._FP8_TOKEN_BYTES if fmt == "fp8" else d_qk
    if width != want:
        what = "656 bytes a token (the fp8 layout)" if fmt == "fp8" else f"d_qk = {d_qk} values a token"
        raise ValueError(f"k_cache's last dimension is {width}, expected {what}")
    page_stride, token_stride = _mla_span_strides(shape, strides)
    idx = _mla_int32("indices", indices, strict=True)
    if len(idx) != 3 or idx[0] != b or idx[1] != s_q:
        raise ValueError(f"indices must be [b, s_q, topk] = [{b}, {s_q}, topk], got shape {idx}")
    topk = idx[2]
    if topk_length is not None:
        lens = _mla_int32("topk_length", topk_length, strict=False)
        if not (len(lens) == 1 and lens[0] == b) and not (len(lens) == 2 and lens[0] == b and lens[1] == s_q):
            raise ValueError(f"topk_length must be [b] = [{b}] or [b, s_q] = [{b}, {s_q}], got shape {lens}")
    _mla_sink(attn_sink, h_q)
    if sm_scale is None:
        scale = d_qk**-0.5 if type(d_qk) is int else 1.0  # finite for any d_qk > 0
    else:
        scale = _mla._scale(sm_scale)
    _mla_d_v(d_v)
    _mla_spec(h_q, d_qk, d_v, topk, scale)
    # SparseMlaDecode::validate's cache rules.
    if fmt == "fp8" and d_qk != 576:
        raise ValueError(f'invalid d_qk: "{d_qk}" (expected 576 with the 656-byte fp8 cache)')
    if page_size == 0:
        raise ValueError('invalid page_size: "0" (expected >= 1)')
    if token_stride < want:
        raise ValueError(
            f"bad shape: the cache's token stride {token_stride} is shorter than a token "
            f"({want} {_CACHE_NAMES[fmt]} elements)"
        )
    extent = (page_size - 1) * token_stride + want
    if num_pages > 1 and page_stride < extent:
        raise ValueError(
            f"bad shape: the cache's page stride {page_stride} is shorter than a page ({extent} elements: "
            f"{page_size} tokens of stride {token_stride})"
        )
    return q.new_empty((b, s_q, h_q, d_v)), q.new_empty((b, h_q, s_q), dtype=torch.float32)


# Not differentiable yet (the reference reads detached data), as in eager
# before the operators.
_MLA_PREFILL = _register("sparse_mla_prefill", _mla_prefill_impl, _mla_prefill_fake)
_MLA_DECODE = _register("sparse_mla_decode", _mla_decode_impl, _mla_decode_fake)


# ---------------------------------------------------------------------------
# QSA sparse attention: flashsel::qsa_attention
# ---------------------------------------------------------------------------

# The public function's arguments, in its order (scale and lengths keyword
# arguments there).
_LIB.define(
    "qsa_attention(Tensor q, Tensor k, Tensor v, Tensor indices, float? scale=None, Tensor? lengths=None)"
    " -> (Tensor out, Tensor lse)",
    tags=_TAGS,
)


def _qsa_attention_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    scale: float | None = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::qsa_attention`` on real tensors: ``_qsa_attention``'s CPU
    reference or, on CUDA tensors, its kernel."""
    return _qsa_attention._qsa_attention(q, k, v, indices, scale, lengths)


def _qsa_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    scale: Any = None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::qsa_attention`` on fake (meta) tensors: the metadata
    checks of ``_qsa_attention._qsa_attention`` in their order and with their
    messages (devices, dtypes, then ``_qsa_attention._geometry`` on the
    shapes and strides, then, for concrete sizes, the engine's spec checks),
    and empty ``out [rows, h_q, d]`` (q's dtype) and ``lse`` float32 ``[rows,
    h_q]`` on q's device. CUDA tensors are accepted when all are on one
    device. Value checks (lengths values, int64 lengths that do not fit
    int32) happen when the operator runs."""
    _qsa_attention._check_devices(torch, q=q, k=k, v=v, indices=indices, lengths=lengths)
    qn = _mla_dtype("q", q)
    kn, vn = _mla_dtype("k", k), _mla_dtype("v", v)
    _qsa_attention._same_kv_dtype(kn, vn)
    idx = _mla_int32("indices", indices, strict=True)
    lens = None if lengths is None else _mla_int32("lengths", lengths, strict=False)
    g = _qsa_attention._geometry(
        _shape(q), _shape(k), tuple(k.stride()), _shape(v), tuple(v.stride()), idx, lens, scale
    )
    if all(type(x) is int for x in g.spec()):
        _qsa_attention._check_spec(g, qn, kn)
    return q.new_empty((g.rows, g.h_q, g.d)), q.new_empty((g.rows, g.h_q), dtype=torch.float32)


_QSA_ATTENTION = _register("qsa_attention", _qsa_attention_impl, _qsa_attention_fake)


# ---------------------------------------------------------------------------
# The QSA indexer: flashsel::qsa_scores, flashsel::qsa_indexer
# ---------------------------------------------------------------------------

_LIB.define(
    "qsa_scores(Tensor q, Tensor kbar, Tensor positions, SymInt ratio, Tensor? page_table, SymInt page_size,"
    " Tensor? seq_ids) -> Tensor",
    tags=_TAGS,
)
_LIB.define(
    "qsa_indexer(Tensor q, Tensor kbar, Tensor positions, SymInt ratio, SymInt k_blocks, str order, str nan,"
    " Tensor? page_table, SymInt page_size, Tensor? seq_ids) -> (Tensor ids, Tensor counts)",
    tags=_TAGS,
)

_IDX_Q = (torch.float32, torch.bfloat16)
_IDX_K = tuple(d for d in (torch.float32, torch.bfloat16, getattr(torch, "float8_e4m3fn", None)) if d is not None)


def _idx_dtype(what: str, x: torch.Tensor, q: torch.Tensor | None) -> None:
    """``_indexer._host``'s checks on a tensor (layout, device, dtype), with
    its messages; the device rule is the CUDA path's when q is on CUDA (the
    keys on q's device, read in place)."""
    keys = q is not None
    if x.layout != torch.strided:
        raise TypeError(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
    if q is None:
        if x.device.type not in ("cpu", "cuda", "meta"):
            raise ValueError(f"q is on device {x.device}; flashsel runs on the CPU and on CUDA devices")
    elif q.device.type == "cuda":
        if x.device != q.device:
            raise ValueError(f"{what} is on {x.device} but q is on {q.device}; pass the keys on q's device")
    elif x.device.type not in ("cpu", "meta"):
        raise ValueError(f"{what} is on {x.device} but q is in host memory; pass all on one device")
    if x.dtype in (_IDX_K if keys else _IDX_Q):
        return
    hint = ""
    if x.dtype == torch.int16:
        hint = "; bf16 bit patterns in a tensor: pass x.view(torch.bfloat16)"
    elif x.dtype == torch.uint8 and keys:
        hint = "; e4m3 bit patterns in a tensor: pass x.view(torch.float8_e4m3fn)"
    accepted = "torch.float32, torch.bfloat16" + (" or torch.float8_e4m3fn" if keys else "")
    raise TypeError(f"unsupported {what} dtype {x.dtype}: qsa_scores takes {accepted}{hint}")


def _idx_vector(what: str, x: Any, q: torch.Tensor, rows: Any, np_dtype: Any) -> None:
    """``_api._int_vector``'s checks on a per-row vector (a tensor's metadata;
    host data in full), and its device: on a CUDA q, a CUDA tensor on q's
    device or host data (copied over); on a CPU q, host data."""
    if not isinstance(x, torch.Tensor):
        _api._int_vector(what, x, rows, np_dtype)
        return
    _idx_device(what, x, q)
    _check_int_vector_meta(what, x, rows)


def _idx_device(what: str, x: torch.Tensor, q: torch.Tensor) -> None:
    if q.device.type == "cuda":
        if x.device.type == "cuda" and x.device != q.device:
            raise ValueError(f"{what} is on {x.device} but q is on {q.device}")
    elif x.device.type not in ("cpu", "meta"):
        raise ValueError(f"{what} is on {x.device} but q is in host memory; pass all on one device")


def indexer_meta(
    q: torch.Tensor, kbar: torch.Tensor, positions: Any, ratio: Any, page_table: Any, page_size: Any, seq_ids: Any
) -> tuple[Any, Any, Any, Any]:
    """The checks of ``_indexer._inputs`` on tensor metadata (real or fake
    tensors, CPU or CUDA), in its order and with its messages, then the
    engine's spec checks (H, d; ``rows * width`` is the indexer's, in its
    fake): what can be checked without the data. ``positions``, ``page_table``
    and ``seq_ids`` may also be host data (checked in full). Returns ``(rows,
    heads, d, blocks)``."""
    for what, v in (("ratio", ratio), ("page_size", page_size)):
        if type(v) is int:
            _indexer._positive(what, v)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
    _idx_dtype("q", q, None)
    _idx_dtype("kbar", kbar, q)
    if q.dim() != 3:
        hint = "; for one query pass q[None]" if q.dim() == 2 else ""
        raise ValueError(f"q must be 3-D [queries, heads, d], got shape {_shape(q)}{hint}")
    if not kbar.is_contiguous():
        raise ValueError(
            "kbar must be C-contiguous (it is read in place, never copied): "
            "pass np.ascontiguousarray(kbar) / kbar.contiguous()"
        )
    rows, heads, d = q.shape
    if page_table is None:
        if kbar.dim() != 2:
            raise ValueError(
                f"kbar must be 2-D [blocks, d] (one sequence), or 3-D [pages, page_size // ratio, d] with "
                f"page_table and seq_ids; got shape {_shape(kbar)}"
            )
        blocks = kbar.shape[0]
    else:
        if kbar.dim() != 3:
            raise ValueError(
                f"with page_table, kbar must be 3-D [pages, page_size // ratio, d]; got shape {_shape(kbar)}"
            )
        if page_size % ratio:
            raise ValueError(
                f"page_size = {page_size} is not a multiple of ratio = {ratio} (a page holds whole blocks)"
            )
        if kbar.shape[1] != page_size // ratio:
            raise ValueError(
                f"kbar holds {kbar.shape[1]} blocks a page but page_size // ratio = {page_size} // {ratio} = "
                f"{page_size // ratio}"
            )
        if isinstance(page_table, torch.Tensor):
            _idx_device("page_table", page_table, q)
            if page_table.dim() != 2 or page_table.dtype != torch.int32:
                raise TypeError(
                    f"page_table must be int32 [sequences, max_pages], got {_np_name(page_table.dtype)} "
                    f"{_shape(page_table)}"
                )
            max_pages = page_table.shape[1]
        else:
            max_pages = _indexer._table_array(page_table).shape[1]
        _idx_vector("seq_ids", seq_ids, q, rows, np.int32)
        blocks = max_pages * (page_size // ratio)
    if kbar.shape[-1] != d:
        raise ValueError(f"kbar has d = {kbar.shape[-1]} but q has d = {d} (q [{rows}, {heads}, {d}])")
    _idx_vector("positions", positions, q, rows, np.int64)
    # QsaScoresSpec::validate, with its messages.
    if heads == 0 or heads > 16:
        raise ValueError(f'invalid heads (H, q\'s second dimension): "{heads}" (expected 1..=16)')
    if d != 64 and d != 128 and d != 256:
        raise ValueError(f'invalid head dim (d, the last dimension of q and kbar): "{d}" (expected 64, 128 or 256)')
    return rows, heads, d, blocks


def _qsa_scores_impl(
    q: torch.Tensor,
    kbar: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    page_table: torch.Tensor | None,
    page_size: int,
    seq_ids: torch.Tensor | None,
) -> torch.Tensor:
    """``flashsel::qsa_scores`` on real tensors (``_indexer._scores_torch``)."""
    return _indexer._scores_torch(q, kbar, positions, ratio, page_table, page_size, seq_ids)


def _qsa_scores_fake(
    q: torch.Tensor,
    kbar: torch.Tensor,
    positions: torch.Tensor,
    ratio: Any,
    page_table: torch.Tensor | None,
    page_size: Any,
    seq_ids: torch.Tensor | None,
) -> torch.Tensor:
    """``flashsel::qsa_scores`` on fake (meta) tensors: the metadata checks and
    an empty float32 ``[T, NB]`` on q's device."""
    rows, _, _, blocks = indexer_meta(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    return q.new_empty((rows, blocks), dtype=torch.float32)


def _qsa_indexer_impl(
    q: torch.Tensor,
    kbar: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: torch.Tensor | None,
    page_size: int,
    seq_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::qsa_indexer`` on real tensors (``_indexer._indexer_torch``)."""
    return _indexer._indexer_torch(q, kbar, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)


def _qsa_indexer_fake(
    q: torch.Tensor,
    kbar: torch.Tensor,
    positions: torch.Tensor,
    ratio: Any,
    k_blocks: Any,
    order: str,
    nan: str,
    page_table: torch.Tensor | None,
    page_size: Any,
    seq_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::qsa_indexer`` on fake (meta) tensors: the public function's
    option checks, the metadata checks, the selection's size check, and empty
    int32 ``ids [T, k_blocks * ratio + ratio - 1]``, ``counts [T]``."""
    _api._check_option("order", order, _api._ORDERS)
    _api._check_option("nan", nan, _api._NANS)
    if type(k_blocks) is int:
        _indexer._positive("k_blocks", k_blocks)
    rows, _, _, _ = indexer_meta(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    width = k_blocks * ratio + ratio - 1
    if all(type(v) is int for v in (rows, width)):
        if width > _api._I32_MAX:
            raise ValueError(f"k_blocks * ratio + ratio - 1 = {width} does not fit in i32 (max {_api._I32_MAX})")
        if width * rows > _api._I32_MAX:
            raise ValueError(f"rows * width = {width * rows} does not fit in i32 (max {_api._I32_MAX})")
    return q.new_empty((rows, width), dtype=torch.int32), q.new_empty((rows,), dtype=torch.int32)


# Not differentiable (the scores are a selection stage's, read detached).
_QSA_SCORES = _register("qsa_scores", _qsa_scores_impl, _qsa_scores_fake)
_QSA_INDEXER = _register("qsa_indexer", _qsa_indexer_impl, _qsa_indexer_fake)


# ---------------------------------------------------------------------------
# The DSA indexer: flashsel::dsa_scores, flashsel::dsa_indexer
# ---------------------------------------------------------------------------

# The public functions' arguments, in their order (the keyword-only options
# with their defaults; the paged key cache's page arguments and the
# indexer's `slots` came last, so the earlier arguments keep their
# positions). `values` is always returned, as topk's: [T, topk] float32 when
# return_values, else an empty [0] float32 tensor on q's device.
_LIB.define(
    "dsa_scores(Tensor q, Tensor k, Tensor weights, Tensor starts, Tensor ends, Tensor? k_scale=None,"
    " Tensor? page_table=None, SymInt page_size=64, Tensor? seq_ids=None) -> Tensor",
    tags=_TAGS,
)
_LIB.define(
    "dsa_indexer(Tensor q, Tensor k, Tensor weights, Tensor starts, Tensor ends, SymInt topk=2048,"
    " Tensor? k_scale=None, str order=\"index\", str nan=\"lowest\", bool return_values=False,"
    " Tensor? page_table=None, SymInt page_size=64, Tensor? seq_ids=None, bool? slots=None)"
    " -> (Tensor ids, Tensor values)",
    tags=_TAGS,
)


def _dsa_scores_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    page_size: int = 64,
    seq_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``flashsel::dsa_scores`` on real tensors: the CPU engine, or the CUDA
    engine on CUDA tensors (``_dsa._dsa_scores``; a paged key cache with
    ``page_table``)."""
    return _dsa._dsa_scores(q, k, weights, starts, ends, k_scale, page_table, page_size, seq_ids)


def _dsa_scores_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    page_size: Any = 64,
    seq_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``flashsel::dsa_scores`` on fake (meta) tensors: the page options and
    the metadata checks of ``_dsa._check`` (devices, dtypes, shapes, k's
    form and layout, the paged cache's shape against ``page_size``, then for
    concrete sizes the engine's spec rules), with the eager messages, and an
    empty float32 ``[T, N]`` on q's device (``N = max_pages * page_size``
    for a paged cache). The ranges' and page table's values are checked
    when the operator runs."""
    page_size = _dsa._page_options(page_size, page_table, seq_ids)
    g = _dsa._check(torch, q, k, weights, starts, ends, k_scale, page_table, page_size, seq_ids)
    return q.new_empty((g.rows, g.keys), dtype=torch.float32)


def _dsa_indexer_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    topk: int = 2048,
    k_scale: torch.Tensor | None = None,
    order: str = "index",
    nan: str = "lowest",
    return_values: bool = False,
    page_table: torch.Tensor | None = None,
    page_size: int = 64,
    seq_ids: torch.Tensor | None = None,
    slots: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::dsa_indexer`` on real tensors (``_dsa._dsa_indexer``)."""
    ids, values = _dsa._dsa_indexer(
        q, k, weights, starts, ends, topk, k_scale, order, nan, return_values, page_table, page_size, seq_ids,
        slots,
    )  # fmt: skip
    return ids, (q.new_empty((0,), dtype=torch.float32) if values is None else values)


def _dsa_indexer_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    topk: Any = 2048,
    k_scale: torch.Tensor | None = None,
    order: str = "index",
    nan: str = "lowest",
    return_values: bool = False,
    page_table: torch.Tensor | None = None,
    page_size: Any = 64,
    seq_ids: torch.Tensor | None = None,
    slots: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel::dsa_indexer`` on fake (meta) tensors: the option checks
    (``slots`` too), the metadata checks of :func:`_dsa_scores_fake` and of
    the page arguments, the selection's size rules (concrete sizes), and
    empty ``ids`` int32 ``[T, topk]``, ``values`` float32 ``[T, topk]`` (or
    ``[0]`` without ``return_values``)."""
    topk, order, nan, page_size, slots = _dsa._options(topk, order, nan, page_size, page_table, seq_ids, slots)
    g = _dsa._check(torch, q, k, weights, starts, ends, k_scale, page_table, page_size, seq_ids, topk, order, nan,
                    slots)  # fmt: skip
    ids = q.new_empty((g.rows, topk), dtype=torch.int32)
    return ids, q.new_empty((g.rows, topk) if return_values else (0,), dtype=torch.float32)


# Not differentiable (a selection stage's scores, read detached).
_DSA_SCORES = _register("dsa_scores", _dsa_scores_impl, _dsa_scores_fake)
_DSA_INDEXER = _register("dsa_indexer", _dsa_indexer_impl, _dsa_indexer_fake)


# ---------------------------------------------------------------------------
# The wrappers the public functions call (traced by torch.compile)
# ---------------------------------------------------------------------------


def topk(
    scores: torch.Tensor,
    k: int,
    lengths: Any,
    order: str,
    nan: str,
    return_values: bool,
    starts: Any,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> Any:
    """``flashsel.topk`` on a strided CPU or CUDA tensor, options already
    checked: calls ``torch.ops.flashsel.topk``. Tensor ``lengths`` / ``starts``
    pass as they are and a Python int as the operator's ``length`` /
    ``start`` (the operator checks both, as before); other host forms
    (sequences, NumPy arrays and scalars) become tensors through the host
    checks, made after the scores' own checks so that those errors come
    first, as before."""
    # The common cases (no lengths, a tensor, an int) take few steps: this
    # runs on every call.
    length = start = None
    host_lengths = lengths is not None and not isinstance(lengths, torch.Tensor)
    if host_lengths and _is_i64(lengths):
        length, lengths, host_lengths = lengths, None, False
    host_starts = starts is not None and not isinstance(starts, torch.Tensor)
    if host_starts and _is_i64(starts):
        start, starts, host_starts = starts, None, False
    if host_lengths or host_starts:
        rows, cols, _ = _check_scores(scores, k, order, nan, native=not torch.compiler.is_compiling())
        if host_lengths:
            lengths = _lengths_tensor(lengths, scores, rows, cols)
        if host_starts:
            starts = torch.from_numpy(_api._host_starts(starts, rows))
    if page_table is not None:
        # Host tables and sequence ids: checked as the host engine checks
        # them (4-byte integers, one sequence id per row), never cast.
        if not isinstance(page_table, torch.Tensor):
            page_table = torch.from_numpy(_api._host_table(page_table))
        if not isinstance(seq_ids, torch.Tensor):
            rows = 1 if scores.dim() == 1 else scores.shape[0]
            seq_ids = torch.from_numpy(_api._int_vector("seq_ids", seq_ids, rows, np.int32))
        indices, values = _TOPK(
            scores, k, lengths, starts, order, nan, return_values, length, start, page_table, page_size, seq_ids
        )
    else:
        indices, values = _TOPK(scores, k, lengths, starts, order, nan, return_values, length, start)
    return (indices, values) if return_values else indices


def qsa_select(
    scores: torch.Tensor,
    positions: Any,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: Any,
    page_size: int,
    seq_ids: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel.qsa_select`` on a CPU or CUDA tensor, options already
    checked: brings host ``positions`` / ``page_table`` / ``seq_ids`` (lists,
    NumPy arrays) to CPU tensors with the host checks (after the scores' own),
    and calls ``torch.ops.flashsel.qsa_select``."""
    host = [x is not None and not isinstance(x, torch.Tensor) for x in (positions, page_table, seq_ids)]
    if any(host):
        rows = _check_qsa_scores(scores)
        if host[0]:
            positions = torch.from_numpy(_api._int_vector("positions", positions, rows, np.int64))
        if (page_table is None) != (seq_ids is None):
            raise ValueError("page_table and seq_ids come together: pass both or neither")
        if host[1]:
            page_table = torch.from_numpy(_api._host_table(page_table))
        if host[2]:
            seq_ids = torch.from_numpy(_api._int_vector("seq_ids", seq_ids, rows, np.int32))
    return _QSA(scores, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)


def _indexer_args(
    q: torch.Tensor, kbar: Any, positions: Any, ratio: int, page_table: Any, page_size: int, seq_ids: Any
) -> tuple[Any, Any, Any] | None:
    """The operator's ``positions``, ``page_table``, ``seq_ids`` for the
    indexer wrappers: host data (lists, NumPy arrays) becomes CPU tensors
    after every metadata check (so errors come in the eager order), or None
    when the call must run the eager path (``kbar`` not a tensor)."""
    if not isinstance(kbar, torch.Tensor):
        return None
    host = [x is not None and not isinstance(x, torch.Tensor) for x in (positions, page_table, seq_ids)]
    if any(host):
        rows, _, _, _ = indexer_meta(q, kbar, positions, ratio, page_table, page_size, seq_ids)
        if host[0]:
            positions = torch.from_numpy(_api._int_vector("positions", positions, rows, np.int64))
        if host[1]:
            page_table = torch.from_numpy(_indexer._table_array(page_table))
        if host[2]:
            seq_ids = torch.from_numpy(_api._int_vector("seq_ids", seq_ids, rows, np.int32))
    return positions, page_table, seq_ids


def qsa_scores(
    q: torch.Tensor, kbar: Any, positions: Any, ratio: int, page_table: Any, page_size: int, seq_ids: Any
) -> torch.Tensor:
    """``flashsel.qsa_scores`` with a tensor ``q``, ratio and page_size already
    checked: calls ``torch.ops.flashsel.qsa_scores`` (host positions, tables
    and sequence ids brought to CPU tensors first); a ``kbar`` that is not a
    tensor runs the eager host path directly (as before)."""
    args = _indexer_args(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    if args is None:
        return _indexer._scores_host(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    positions, page_table, seq_ids = args
    return _QSA_SCORES(q, kbar, positions, ratio, page_table, page_size, seq_ids)


def qsa_indexer(
    q: torch.Tensor,
    kbar: Any,
    positions: Any,
    ratio: int,
    k_blocks: int,
    order: str,
    nan: str,
    page_table: Any,
    page_size: int,
    seq_ids: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flashsel.qsa_indexer`` with a tensor ``q``, options already checked:
    calls ``torch.ops.flashsel.qsa_indexer`` as :func:`qsa_scores` does."""
    args = _indexer_args(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    if args is None:
        return _indexer._indexer_host(q, kbar, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)
    positions, page_table, seq_ids = args
    return _QSA_INDEXER(q, kbar, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)


def sparse_mla_prefill(
    q: torch.Tensor, kv: Any, indices: Any, sm_scale: Any, d_v: Any, attn_sink: Any, topk_length: Any
) -> tuple[Any, Any, Any]:
    """``flashsel.sparse_mla_prefill`` with a tensor ``q``: calls
    ``torch.ops.flashsel.sparse_mla_prefill`` when every argument has the
    schema's type (tensors; a real ``sm_scale``; an int ``d_v``), else runs
    the eager path directly (host forms such as lists or NumPy arrays beside
    a tensor q, which it converts; its errors for what it rejects)."""
    scale, dv = _op_float(sm_scale), _op_int(d_v)
    bad = isinstance(scale, _Not) or isinstance(dv, _Not)
    if bad or not _tensors(kv, indices) or not _opt_tensors(attn_sink, topk_length):
        return _mla._sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    return _MLA_PREFILL(q, kv, indices, scale, dv, attn_sink, topk_length)


def sparse_mla_decode(
    q: torch.Tensor,
    k_cache: Any,
    indices: Any,
    sm_scale: Any,
    d_v: Any,
    is_fp8_kvcache: Any,
    topk_length: Any,
    attn_sink: Any,
) -> tuple[Any, Any]:
    """``flashsel.sparse_mla_decode`` with a tensor ``q``: calls
    ``torch.ops.flashsel.sparse_mla_decode`` as :func:`sparse_mla_prefill`
    does (``sm_scale`` also None; ``is_fp8_kvcache`` None or a bool)."""
    scale = None if sm_scale is None else _op_float(sm_scale)
    dv = _op_int(d_v)
    fp8 = is_fp8_kvcache
    if isinstance(fp8, np.bool_):
        fp8 = bool(fp8)
    ok = (
        not isinstance(scale, _Not)
        and not isinstance(dv, _Not)
        and (fp8 is None or isinstance(fp8, bool))
        and _tensors(k_cache, indices)
        and _opt_tensors(topk_length, attn_sink)
    )
    if not ok:
        return _mla._sparse_mla_decode(q, k_cache, indices, sm_scale, d_v, is_fp8_kvcache, topk_length, attn_sink)
    return _MLA_DECODE(q, k_cache, indices, scale, dv, fp8, topk_length, attn_sink)


def qsa_attention(q: torch.Tensor, k: Any, v: Any, indices: Any, scale: Any, lengths: Any) -> tuple[Any, Any]:
    """``flashsel.qsa_attention`` with a tensor ``q``: calls
    ``torch.ops.flashsel.qsa_attention`` when every argument has the schema's
    type (tensors, ``None`` lengths; a real or ``None`` scale), else runs the
    eager path directly (host forms such as lists or NumPy arrays beside a
    tensor q, which it converts; its errors for what it rejects)."""
    sc = None if scale is None else _op_float(scale)
    if isinstance(sc, _Not) or not _tensors(k, v, indices) or not _opt_tensors(lengths):
        return _qsa_attention._qsa_attention(q, k, v, indices, scale, lengths)
    return _QSA_ATTENTION(q, k, v, indices, sc, lengths)


def dsa_scores(
    q: torch.Tensor,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    k_scale: Any,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> Any:
    """``flashsel.dsa_scores`` with a tensor ``q``, options already checked:
    calls ``torch.ops.flashsel.dsa_scores`` when every array argument is a
    tensor (or None where optional), else runs the eager path directly (host
    forms such as lists or NumPy arrays beside a tensor q, which it
    converts; its errors for what it rejects)."""
    if not _tensors(k, weights, starts, ends) or not _opt_tensors(k_scale, page_table, seq_ids):
        return _dsa._dsa_scores(q, k, weights, starts, ends, k_scale, page_table, page_size, seq_ids)
    return _DSA_SCORES(q, k, weights, starts, ends, k_scale, page_table, page_size, seq_ids)


def dsa_indexer(
    q: torch.Tensor,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    topk: int,
    k_scale: Any,
    order: str,
    nan: str,
    return_values: bool,
    page_table: Any,
    page_size: int,
    seq_ids: Any,
    slots: bool | None = None,
) -> tuple[Any, Any]:
    """``flashsel.dsa_indexer`` with a tensor ``q``, options already checked:
    calls ``torch.ops.flashsel.dsa_indexer`` as :func:`dsa_scores` does;
    returns ``(ids, values)`` (values empty or None unless
    ``return_values``)."""
    if not _tensors(k, weights, starts, ends) or not _opt_tensors(k_scale, page_table, seq_ids):
        return _dsa._dsa_indexer(
            q, k, weights, starts, ends, topk, k_scale, order, nan, return_values, page_table, page_size, seq_ids,
            slots,
        )  # fmt: skip
    return _DSA_INDEXER(
        q, k, weights, starts, ends, topk, k_scale, order, nan, return_values, page_table, page_size, seq_ids, slots
    )


# ---------------------------------------------------------------------------
# Checks and conversions
# ---------------------------------------------------------------------------


class _Not:
    """The type of _NOT (tested by isinstance: under torch.compile a
    symbolic float or int cannot be compared by identity with an object)."""


_NOT = _Not()  # an argument the operator's schema cannot carry


def _op_float(x: Any) -> Any:
    """`x` for a ``float`` argument (as ``float(x)``, which is what the eager
    path takes), or _NOT (a string, a tensor, ...: the eager path decides)."""
    if isinstance(x, (torch.SymFloat, torch.SymInt)):
        return x
    if isinstance(x, (float, int, np.floating, np.integer)):
        try:
            return float(x)
        except OverflowError:
            return _NOT
    return _NOT


def _op_int(x: Any) -> Any:
    """`x` for a ``SymInt`` argument (a Python or NumPy int in int64), or
    _NOT (a bool, a float, ...: the eager path's TypeError)."""
    if isinstance(x, torch.SymInt):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and -(2**63) <= x < 2**63:
        return int(x)
    return _NOT


def _tensors(*xs: Any) -> bool:
    return all(isinstance(x, torch.Tensor) for x in xs)


def _opt_tensors(*xs: Any) -> bool:
    return all(x is None or isinstance(x, torch.Tensor) for x in xs)


def _shape(x: torch.Tensor) -> tuple[Any, ...]:
    """The shape as a tuple (as NumPy prints it in the eager messages)."""
    return tuple(x.shape)


def _mla_devices(**tensors: torch.Tensor | None) -> None:
    """``_mla._check_devices`` on fake tensors (the same errors): CPU (and
    meta) tensors, or tensors all on one CUDA device."""
    _mla._check_devices(torch, **tensors)


def _mla_dtype(what: str, x: torch.Tensor) -> str:
    """``_mla._data``'s checks on a tensor: strided, float32 or bfloat16."""
    if x.layout != torch.strided:
        raise TypeError(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
    name = _MLA_DTYPES.get(x.dtype)
    if name is None:
        raise TypeError(f"{what}: unsupported dtype {x.dtype} (expected torch.float32 or torch.bfloat16)")
    return name


def _mla_cache_format(x: torch.Tensor) -> str:
    """``_mla._cache``'s checks on a tensor; the format name."""
    if x.layout != torch.strided:
        raise TypeError(f"k_cache must be a dense (strided) tensor, got layout {x.layout}")
    if x.dtype in _FP8_DTYPES:
        return "fp8"
    if x.dtype in _MLA_DTYPES:
        return _MLA_DTYPES[x.dtype]
    raise TypeError(
        f"k_cache: unsupported dtype {x.dtype} (expected torch.uint8 / torch.float8_e4m3fn for the fp8 "
        "cache, torch.float32 or torch.bfloat16)"
    )


def _mla_int32(what: str, x: torch.Tensor, *, strict: bool) -> tuple[Any, ...]:
    """``_mla._int32_array``'s dtype check on a tensor; its shape."""
    if not (x.dtype == torch.int32 or (not strict and x.dtype == torch.int64)):
        want = "torch.int32" if strict else "torch.int32 or torch.int64"
        raise TypeError(f"{what} must be {want}, got {x.dtype}")
    return _shape(x)


def _mla_sink(x: torch.Tensor | None, h_q: Any) -> None:
    """``_mla._sink``'s checks on a tensor."""
    if x is None:
        return
    if x.dtype != torch.float32:
        raise TypeError(f"attn_sink must be torch.float32, got {x.dtype}")
    if x.dim() != 1 or x.shape[0] != h_q:
        raise ValueError(f"attn_sink must be [h_q] = [{h_q}], got shape {_shape(x)}")


def _mla_d_v(d_v: Any) -> None:
    """``_mla._int("d_v", ...)`` on the schema's int."""
    if d_v < 0:
        raise ValueError(f"d_v must be non-negative, got {d_v}")


def _mla_spec(h_q: Any, d_qk: Any, d_v: Any, topk: Any, scale: float) -> None:
    """The engine's shared spec checks (``ops::mla::check_common``), with its
    messages: h_q in 1..=128, d_qk 512 or 576, d_v 512, 1 <= topk <= i32 max,
    the scale finite as float32."""
    if h_q == 0 or h_q > 128:
        raise ValueError(f'invalid h_q: "{h_q}" (expected 1..=128)')
    if d_qk != 512 and d_qk != 576:
        raise ValueError(f'invalid d_qk: "{d_qk}" (expected 512 or 576)')
    if d_v != 512:
        raise ValueError(f'invalid d_v: "{d_v}" (expected 512 (the first 512 values of each key))')
    if topk == 0:
        raise ValueError('invalid topk: "0" (expected >= 1)')
    if topk > _api._I32_MAX:
        raise ValueError(f"topk = {topk} does not fit in i32 (max {_api._I32_MAX})")
    with np.errstate(over="ignore"):
        s32 = np.float32(scale)
    if np.isinf(s32):
        raise ValueError(f'invalid sm_scale: "{"inf" if s32 > 0 else "-inf"}" (expected a finite float)')


def _mla_span_strides(shape: tuple[Any, ...], strides: tuple[Any, ...]) -> tuple[Any, Any]:
    """The page and token strides (elements) that ``_mla._span`` gives the
    engine for a [pages, page_size, W] cache of these strides (a cache whose
    tokens are not contiguous is copied there, so dense strides)."""
    pages, size, width = shape
    if pages == 0 or size == 0:
        return width * size, width
    if not (width == 1 or strides[2] == 1):
        strides = (size * width, width, 1)
    return (strides[0] if pages > 1 else size * width), (strides[1] if size > 1 else width)




def _check_scores(scores: torch.Tensor, k: Any, order: str, nan: str, *, native: bool) -> tuple[Any, Any, bool]:
    """The checks that ``_topk_torch_cpu`` / ``_topk_cuda`` make on the scores
    before they look at lengths, in their order and with their messages:
    dtype, shape, strides, and (``native``, concrete sizes only) the engine's
    spec check. Metadata only. Returns ``(rows, cols, was_1d)``."""
    name = _api._torch_dtype_name(torch, scores.dtype)
    rows, cols, was_1d = _api._as_2d_shape(tuple(scores.shape))
    col_stride = scores.stride(-1)
    raw_row_stride = cols if was_1d else scores.stride(0)
    if scores.device.type == "cuda":
        # As _topk_cuda.
        if rows > 0 and cols > 1 and col_stride != 1:
            raise ValueError(
                f"scores: elements within a row must be contiguous (column stride {col_stride} elements); "
                "flashsel reads strided rows in place but not strided columns: pass x.contiguous() "
                "if a copy is what you want"
            )
        if rows <= 1 or cols == 0:
            row_stride = cols
        else:
            row_stride = raw_row_stride
            if row_stride < cols:
                raise ValueError(f"scores: row stride {row_stride} is shorter than cols = {cols} (overlapping rows)")
    else:
        itemsize = scores.element_size()
        row_stride = _api._host_row_stride(
            (raw_row_stride * itemsize, col_stride * itemsize), rows, cols, itemsize
        )
    if native and all(type(v) is int for v in (rows, cols, row_stride, k)):
        _native.check_spec(name, rows, cols, row_stride, k, order, nan)
    return rows, cols, was_1d


def _check_qsa_scores(scores: torch.Tensor) -> Any:
    """The scores checks of qsa_select (dtype, 2-D); returns the rows."""
    _api._torch_dtype_name(torch, scores.dtype)
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D [queries, blocks], got shape {tuple(scores.shape)}")
    return scores.shape[0]


def _np_name(dtype: torch.dtype) -> str:
    """A torch dtype as NumPy names it (the host checks' messages)."""
    return str(dtype).removeprefix("torch.")


def _check_lengths_meta(lengths: torch.Tensor, scores: torch.Tensor, rows: Any) -> None:
    """The metadata checks of a lengths tensor, as ``_host_lengths`` (CPU
    scores) and ``_cuda_lengths`` (CUDA scores) make them."""
    if scores.device.type == "cuda":
        if lengths.device != scores.device:
            raise ValueError(f"lengths is on {lengths.device} but scores are on {scores.device}")
    elif lengths.device.type != "cpu":
        raise ValueError(f"lengths is on {lengths.device} but scores are in host memory; pass CPU lengths")
    if lengths.dtype not in (torch.int32, torch.int64):
        raise _api._lengths_dtype_error(lengths.dtype)
    if lengths.dim() == 0:
        return
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be a scalar or 1-D with one entry per row, got shape {tuple(lengths.shape)}")
    if lengths.shape[0] != rows:
        raise ValueError(f"lengths has {lengths.shape[0]} entries but scores has {_api._rows_phrase(rows)}")


def _check_int_vector_meta(what: str, x: torch.Tensor, rows: Any, scalar_ok: bool = False) -> None:
    """The metadata checks of ``_api._int_vector`` on a tensor (a 0-d one
    stands for every row where ``scalar_ok``, as ``_host_starts`` has it)."""
    if x.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{what} must hold int32 or int64 values, got {_np_name(x.dtype)}")
    if scalar_ok and x.dim() == 0:
        return
    if x.dim() != 1 or x.shape[0] != rows:
        raise ValueError(f"{what} must be 1-D with {rows} entries (one per row), got shape {tuple(x.shape)}")


def _is_i64(x: Any) -> bool:
    """Whether `x` is a Python int (or a traced SymInt) that fits the
    operator's int arguments (a larger one goes through the host checks,
    which name it)."""
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool) and -(2**63) <= x < 2**63


def _one_of(what: str, tensor: torch.Tensor | None, scalar: Any) -> Any:
    """The one given of the tensor and the int form of `what` (or None)."""
    if scalar is None:
        return tensor
    if tensor is not None:
        raise ValueError(f"flashsel::topk takes {what}s (a tensor) or {what} (an int), not both")
    return scalar


def _lengths_tensor(lengths: Any, scores: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Host lengths (neither a tensor nor a Python int) as an int32 tensor,
    with the checks of the scores' device: ``_cuda_lengths`` (a NumPy scalar
    filled on the device, anything else its error) or ``_host_lengths``."""
    if scores.device.type == "cuda":
        return _api._cuda_lengths(torch, lengths, scores.device, rows, cols)
    return torch.from_numpy(_api._host_lengths(lengths, rows, cols))
