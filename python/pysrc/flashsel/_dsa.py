"""The DSA (DeepSeek-V3.2) lightning indexer (private: import from
``flashsel``): :func:`dsa_scores`, the indexer's logits over each query's
key range, and :func:`dsa_indexer`, their exact top-k as token ids or KV
slots, over contiguous keys or DeepSeek-V3.2's paged fp8 index-key cache
(DeepGEMM ``fp8_paged_mqa_logits``' layout). NumPy arrays and CPU torch
tensors run the CPU engine (``flashsel::cpu::dsa_scores`` / ``dsa_indexer``,
``dsa_scores_paged`` / ``dsa_indexer_paged``); CUDA tensors run the CUDA
engine (``CudaEngine::dsa_scores_device`` / ``dsa_indexer_device``, the
paged cache through ``DeviceDsaScores::paged``: zero-copy, on torch's
current stream, no host synchronisation, so CUDA graphs capture them),
whose scores follow its own device order (tensor cores; not the CPU's
bits) and whose ids are the exact selection of those scores. Torch tensors go through the torch
operators ``flashsel::dsa_scores`` / ``flashsel::dsa_indexer``
(``_torch_ops``), whose implementations are :func:`_dsa_scores` /
:func:`_dsa_indexer` here. The contract is docs/semantics.md, "DSA indexer
scores" and its "The paged key cache".

Which form ``k`` is (:func:`_check`): contiguous keys ``[N, d]`` / ``[N, 1,
d]`` (the last dimension is q's ``d``), or, when ``page_table`` is given and
``k`` is not that, the paged cache (bytes ``[pages, page_size, 1, d + 4]``,
``[pages, page_size, d + 4]``, ``[pages, page_size * (d + 4)]`` or flat;
its last dimension is never ``d``), whose ``N`` is ``max_pages *
page_size``.

The checks (:func:`_check`) read only metadata (types, dtypes, shapes,
devices, contiguity), so that the operators' fake implementations make the
same checks with the same messages; the value checks (the ranges, a page
table's entries) are the engine's, when the operator runs."""

import sys
from typing import Any, Literal, NamedTuple

import numpy as np

from . import _api, _indexer, _mla, _native

_NP_ACCEPTED = (
    "float32, bfloat16 (ml_dtypes.bfloat16, or uint16 / int16 bit patterns), "
    "or fp8 e4m3 (ml_dtypes.float8_e4m3fn, or uint8 bit patterns)"
)
_TORCH_ACCEPTED = "torch.float32, torch.bfloat16 or torch.float8_e4m3fn"
_DEVICES_MSG = "the DSA indexer on CUDA takes q, k, weights and k_scale on one device"


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def dsa_scores(
    q: Any,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    *,
    k_scale: Any = None,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> Any:
    """DSA (DeepSeek-V3.2) lightning indexer scores: float32 ``[T, N]``,

    ``score[t, s] = k_scale[s] * sum over h of weights[t, h] * relu(q[t, h] .
    k[s])`` for the keys ``starts[t] <= s < ends[t]`` of each query's range,
    ``-inf`` for the rest (DeepGEMM's ``fp8_mqa_logits``).

    Parameters
    ----------
    q
        ``[T, H, d]`` index queries, ``1 <= H <= 128``, ``d`` in {64, 128,
        256} (DeepSeek-V3.2: 64 heads of 128). float32, bfloat16 or fp8 e4m3
        without a scale (fold q's scale into ``weights``): NumPy float32,
        ``ml_dtypes.bfloat16`` (or uint16 / int16 bit patterns),
        ``ml_dtypes.float8_e4m3fn`` (or uint8 bit patterns); torch
        ``float32``, ``bfloat16``, ``float8_e4m3fn``. Read exactly. A q that
        is not C-contiguous is copied (it is small). q's device picks the
        engine.
    k
        The keys, one head shared by every index head: ``[N, d]`` (or ``[N,
        1, d]``), any of q's dtypes (may differ from q's). Read in place: it
        must be C-contiguous. Or, with ``page_table``, DeepSeek-V3.2's paged
        fp8 index-key cache (see *The paged key cache* below).
    weights
        float32 ``[T, H]``: the head weights (with q's scales and ``1 /
        sqrt(d)`` folded in).
    starts, ends
        int32 or int64 ``[T]`` (int64 values must fit int32): row ``t``
        scores the keys ``starts[t] .. ends[t] - 1``, ``0 <= starts[t] <=
        ends[t] <= N`` (checked for host data, an error naming the row). A
        query at position ``p`` that may attend to its own key passes
        ``ends = p + 1``.
    k_scale
        Optional float32 ``[N]``: the fp8 cache's per-token scale (absent:
        1), multiplied after the head sum. ``None`` with the paged cache
        (which holds the scales).
    page_table, page_size, seq_ids
        The paged key cache's page table, int32 ``[B, max_pages]``, its
        page size (default 64, DeepSeek-V3.2's) and the sequence of each
        query, int32 ``[T]``: they come together, and only with a paged
        ``k``.

    The paged key cache
    -------------------
    ``k`` is read as DeepSeek-V3.2's paged fp8 index-key cache (DeepGEMM
    ``fp8_paged_mqa_logits``' ``kv_cache``) exactly when ``page_table`` is
    given and ``k`` is not ``[N, d]`` / ``[N, 1, d]``: uint8 (or
    ``float8_e4m3fn``; NumPy uint8 or ``ml_dtypes.float8_e4m3fn``) bytes of
    ``P`` pages, shaped ``[P, page_size, 1, d + 4]`` (DeepGEMM's), ``[P,
    page_size, d + 4]`` (vLLM's), ``[P, page_size * (d + 4)]`` or flat ``[P
    * page_size * (d + 4)]`` (the shape must agree with ``page_size``), read
    in place (C-contiguous). Each page is ``page_size * d`` e4m3 bytes
    (token ``j``'s key at byte ``j d``) then ``page_size`` little-endian f32
    scales (token ``j``'s at byte ``page_size d + 4 j``). Key (column) ``s``
    of row ``t`` is token ``s`` of sequence ``seq_ids[t]``: page
    ``page_table[seq_ids[t], s // page_size]``, scaled by the token's scale.
    ``N = max_pages * page_size`` (slice the scores to a shorter context).
    The scores are, bit for bit, those of the same keys and scales held
    contiguously. On the host every page of each row's range must be in the
    table (entry ``>= 0``) and in the cache (``< P``), else a ``ValueError``
    naming the row; on CUDA these values are not checked: a key whose
    sequence or page is outside the table or the cache scores ``-inf`` and
    is never read.

    Returns
    -------
    scores
        float32 ``[T, N]``: a NumPy array, or a tensor on q's device when q
        is a tensor. The CPU engine's arithmetic is fixed (f32, no fused
        multiply-add, docs/semantics.md): the same bits on every run and in
        any batch, and the CUDA engine writes the same bits. A NaN score is
        ``0x7fc00000``.

    Raises
    ------
    TypeError
        Unsupported types or dtypes (float16 q or k, weights or k_scale not
        float32, ranges not int32 / int64, a paged cache not of bytes, a page
        table not int32).
    ValueError
        Bad shapes, ``H``, ``d``, a k that is not C-contiguous, tensors on
        several devices; a paged cache whose shape disagrees with
        ``page_size`` or that is not whole pages, ``k_scale`` with it, a
        ``page_table`` with contiguous keys; host data: a range outside ``0
        <= starts <= ends <= N``, a page of a row's range outside the table
        or the cache, a sequence id outside the table, or an int64 value
        that does not fit int32.
    RuntimeError
        The CUDA engine cannot run on q's device.

    On CUDA tensors (q, k, weights and k_scale on one device) the kernel runs
    on torch's current stream without a host synchronisation. ``starts`` and
    ``ends`` (and ``page_table``, ``seq_ids``) should be CUDA tensors on q's
    device (host data is copied over, which a CUDA graph capture cannot
    hold); their device values are not checked but clamped into ``0 <=
    starts <= ends <= N`` (int64 values clamped into ``[-1, 2**31 - 1]``
    first).
    """
    page_size = _page_options(page_size, page_table, seq_ids)
    torch = sys.modules.get("torch")
    if _mla._is_tensor(torch, q):
        # Through the torch operator flashsel::dsa_scores (torch.compile,
        # CUDA graphs), which runs _dsa_scores below.
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.dsa_scores(q, k, weights, starts, ends, k_scale, page_table, page_size, seq_ids)
    return _dsa_scores(q, k, weights, starts, ends, k_scale, page_table, page_size, seq_ids)


def dsa_indexer(
    q: Any,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    *,
    topk: int = 2048,
    k_scale: Any = None,
    order: Literal["score", "index"] = "index",
    nan: Literal["lowest", "largest"] = "lowest",
    return_values: bool = False,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
    slots: bool | None = None,
) -> Any:
    """The DSA indexer's selection: the top ``topk`` keys of each query's
    range of :func:`dsa_scores`, exactly ``flashsel.topk(dsa_scores(q, k,
    weights, starts, ends, k_scale=k_scale), topk, starts=starts,
    lengths=ends, order=order, nan=nan, return_values=return_values,
    page_table=page_table, page_size=page_size, seq_ids=seq_ids)`` (the same
    bytes).

    ``q``, ``k``, ``weights``, ``starts``, ``ends`` and ``k_scale`` are those
    of :func:`dsa_scores`; ``topk`` (default 2048, DeepSeek-V3.2's),
    ``order`` (default ``"index"``: ascending ids), ``nan`` and
    ``return_values`` those of :func:`flashsel.topk`: row ``t`` holds
    ``min(topk, ends[t] - starts[t])`` ids, ties to the lower id, then
    ``-1``. With ``page_table`` (int32 ``[B, max_pages]``) and ``seq_ids``
    (int32 ``[T]``, the sequence of each query) the ids are KV-cache slots
    ``page_table[seq, s // page_size] * page_size + s % page_size`` (``-1``
    stays ``-1``); on the host a page a row's range needs outside the table,
    or a sequence id outside it, is a ``ValueError``.

    **The paged key cache.** With ``page_table`` and a ``k`` that is not
    ``[N, d]`` / ``[N, 1, d]``, ``k`` is DeepSeek-V3.2's paged fp8
    index-key cache and ``page_table`` its own table (see
    :func:`dsa_scores`: ``N = max_pages * page_size``, ``k_scale`` None);
    the selection is then the top ``topk`` of those scores, written as the
    cache's slots ``page_table[seq, s // page_size] * page_size + s %
    page_size`` (the default: DeepSeek-V3.2's index-key cache and its MLA
    cache share the block table, so these are the indices
    :func:`flashsel.sparse_mla_decode` reads) or, with ``slots=False``, as
    token positions ``s``. ``slots`` (default ``None``: slots exactly when
    ``page_table`` is given) says which: ``slots=True`` needs a
    ``page_table``, ``slots=False`` with contiguous keys and a
    ``page_table`` is a ``ValueError`` (leave the table out for token ids).

    Returns ``ids`` int32 ``[T, topk]``, or ``(ids, values)`` with
    ``return_values`` (the selected scores, float32, ``-inf`` where padded):
    NumPy arrays, or tensors on q's device when q is a tensor.

    On CUDA tensors the scores go to a workspace from torch's caching
    allocator (``4 T N`` bytes plus the selection's scratch: 4 MiB a decode
    row at 1M keys; call a long prefill in groups of rows), then the
    selection reads them: one asynchronous call on the current stream,
    capturable in a CUDA graph. ``page_table`` and ``seq_ids`` should then be
    CUDA tensors on q's device too; device values are not checked (a row
    whose range is out of bounds, or whose sequence id or pages are outside
    the table, comes out all ``-1``).

    Raises what :func:`dsa_scores` and :func:`flashsel.topk` raise:
    ``TypeError`` for types and dtypes (``slots`` not a bool or None too),
    ``ValueError`` for shapes, options (``topk`` in 1 .. 2**31 - 1, ``T *
    topk`` too; ``slots`` as above), devices and host range or page-table
    values, ``RuntimeError`` when the CUDA engine cannot run.
    """
    topk, order, nan, page_size, slots = _options(topk, order, nan, page_size, page_table, seq_ids, slots)
    return_values = bool(return_values)
    torch = sys.modules.get("torch")
    if _mla._is_tensor(torch, q):
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        ids, values = _torch_ops.dsa_indexer(
            q, k, weights, starts, ends, topk, k_scale, order, nan, return_values, page_table, page_size, seq_ids,
            slots,
        )  # fmt: skip
    else:
        ids, values = _dsa_indexer(
            q, k, weights, starts, ends, topk, k_scale, order, nan, return_values, page_table, page_size, seq_ids,
            slots,
        )  # fmt: skip
    return (ids, values) if return_values else ids


def _page_options(page_size: Any, page_table: Any, seq_ids: Any) -> Any:
    """The page arguments' option checks (both functions', their operators'
    and fakes'): ``page_size``, checked unless symbolic (the fake under
    dynamic shapes); ``page_table`` and ``seq_ids`` come together."""
    page_size = page_size if _symbolic(page_size) else _indexer._positive("page_size", page_size)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
    return page_size


def _options(
    topk: Any, order: Any, nan: Any, page_size: Any, page_table: Any, seq_ids: Any, slots: Any = None
) -> tuple[Any, ...]:
    """The indexer's option checks (the public function's, the operator's
    and its fake's): ``(topk, order, nan, page_size, slots)``, ``slots``
    None or a bool (``True`` only with a page table). Symbolic ints (the
    fake under dynamic shapes) pass unchecked."""
    topk = topk if _symbolic(topk) else _indexer._positive("topk", topk)
    order = _api._check_option("order", order, _api._ORDERS)
    nan = _api._check_option("nan", nan, _api._NANS)
    page_size = _page_options(page_size, page_table, seq_ids)
    if isinstance(slots, np.bool_):
        slots = bool(slots)
    if slots is not None and not isinstance(slots, bool):
        raise TypeError(f"slots must be a bool or None, got {type(slots).__name__}")
    if slots and page_table is None:
        raise ValueError("slots=True writes the ids as KV slots through page_table: pass page_table and seq_ids")
    return topk, order, nan, page_size, slots


def _symbolic(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.SymInt)


# ---------------------------------------------------------------------------
# The implementations (NumPy, CPU tensors, CUDA tensors)
# ---------------------------------------------------------------------------


def _dsa_scores(
    q: Any,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    k_scale: Any,
    page_table: Any = None,
    page_size: Any = 64,
    seq_ids: Any = None,
) -> Any:
    """:func:`dsa_scores` on NumPy arrays, CPU tensors (the CPU engine) and
    CUDA tensors (the CUDA engine): the torch operator's implementation."""
    page_size = _page_options(page_size, page_table, seq_ids)
    torch = sys.modules.get("torch")
    pages = (page_table, page_size, seq_ids)
    g = _check(torch, q, k, weights, starts, ends, k_scale, *pages)
    if g.device is not None:
        return _scores_cuda(torch, g, q, k, weights, starts, ends, k_scale, pages)
    args = _host_inputs(torch, g, q, k, weights, starts, ends, k_scale)
    if g.paged:
        out = _native.dsa_scores_paged_cpu(*args, *g.spec(), *_api._host_pages(pages, g.rows))
    else:
        out = _native.dsa_scores_cpu(*args, *g.spec())
    return torch.from_numpy(out) if g.is_torch else out


def _dsa_indexer(
    q: Any,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    topk: Any,
    k_scale: Any,
    order: Any,
    nan: Any,
    return_values: bool,
    page_table: Any,
    page_size: Any,
    seq_ids: Any,
    slots: Any = None,
) -> tuple[Any, Any]:
    """:func:`dsa_indexer` on NumPy arrays, CPU tensors and CUDA tensors
    (the torch operator's implementation): ``(ids, values)``, values None
    unless ``return_values``."""
    topk, order, nan, page_size, slots = _options(topk, order, nan, page_size, page_table, seq_ids, slots)
    torch = sys.modules.get("torch")
    pages = (page_table, page_size, seq_ids)
    g = _check(torch, q, k, weights, starts, ends, k_scale, *pages, topk, order, nan, slots)
    if g.device is not None:
        return _indexer_cuda(torch, g, q, k, weights, starts, ends, k_scale, topk, order, nan, return_values, pages)
    args = _host_inputs(torch, g, q, k, weights, starts, ends, k_scale)
    table, page_size, seqs = _api._host_pages(pages, g.rows)
    if g.paged:
        ids, values = _native.dsa_indexer_paged_cpu(*args, *g.spec(), topk, order, nan, table, page_size, seqs, g.slots)
    else:
        ids, values = _native.dsa_indexer_cpu(*args, *g.spec(), topk, order, nan, table, page_size, seqs)
    if not return_values:
        values = None
    if g.is_torch:
        return torch.from_numpy(ids), None if values is None else torch.from_numpy(values)
    return ids, values


# ---------------------------------------------------------------------------
# Checks shared with the torch operators' fake implementations
# ---------------------------------------------------------------------------


class _Geom(NamedTuple):
    """A checked request: the dtype names of q and k, its sizes, where it
    runs (None: the CPU engine; else the CUDA device), whether q is a
    tensor, the pages of a paged key cache (None: contiguous keys) and
    whether the indexer writes its ids as slots through the page table."""

    q_name: str
    k_name: str
    rows: Any
    heads: Any
    dim: Any
    keys: Any
    device: Any
    is_torch: bool
    num_pages: Any = None
    slots: bool = False

    @property
    def paged(self) -> bool:
        return self.num_pages is not None

    def spec(self) -> tuple[Any, ...]:
        """The native functions' geometry arguments, in their order."""
        return self.rows, self.heads, self.dim, self.keys


def _check(
    torch: Any,
    q: Any,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    k_scale: Any,
    page_table: Any = None,
    page_size: Any = 64,
    seq_ids: Any = None,
    topk: Any = None,
    order: str = "index",
    nan: str = "lowest",
    slots: Any = None,
) -> _Geom:
    """Every check of a request that needs no data, in one order for the
    eager paths and the fakes: devices, q's dtype and shape, k's form
    (contiguous keys, or with ``page_table`` the paged cache), its dtype,
    shape and layout, weights, k_scale, the ranges' and page arguments'
    dtypes and shapes (host data in full), ``slots`` against k's form, then
    (concrete sizes) the engine's spec rules (H, d, N; with ``topk`` the
    selection's). ``topk`` None: a ``dsa_scores`` request, whose
    ``page_table`` is only the paged cache's. ``page_size`` and the
    pairing of the page arguments are checked before (:func:`_options`)."""
    device = _device(torch, q, k=k, weights=weights, k_scale=k_scale, starts=starts, ends=ends,
                     page_table=page_table, seq_ids=seq_ids)  # fmt: skip
    q_name = _kind("q", q, torch)
    q_shape = tuple(q.shape)
    if len(q_shape) != 3:
        hint = "; for one query pass q[None]" if len(q_shape) == 2 else ""
        raise ValueError(f"q must be 3-D [queries, heads, d], got shape {q_shape}{hint}")
    rows, heads, d = q_shape
    _array("k", k, torch)
    k_shape = tuple(k.shape)
    contiguous_form = len(k_shape) in (2, 3) and k_shape[-1] == d
    num_pages = None
    if page_table is not None and not contiguous_form:
        # The paged key cache: N is what its table addresses.
        k_name = "f8e4m3"
        num_pages = _cache_pages(k, torch, d, page_size)
        if k_scale is not None:
            raise ValueError("k_scale must be None with a paged key cache: the cache holds the keys' scales")
        keys = _table(page_table, torch)[1] * page_size
    else:
        if page_table is not None and topk is None:
            raise ValueError(
                f"dsa_scores takes page_table and seq_ids only with a paged key cache, but k is contiguous keys "
                f"[keys, d] (shape {k_shape}): leave them out (dsa_indexer's page_table with contiguous keys "
                "writes the ids as KV slots)"
            )
        if page_table is None and not contiguous_form and _is_bytes(k, torch):
            raise ValueError(
                f"k must be [keys, d] (or [keys, 1, d]: one key head), got shape {k_shape}; a paged key cache "
                "(bytes [pages, page_size, 1, d + 4]) needs page_table= and seq_ids="
            )
        k_name = _kind("k", k, torch)
        if len(k_shape) == 3 and k_shape[1] == 1:
            k_shape = (k_shape[0], k_shape[2])
        if len(k_shape) != 2:
            raise ValueError(f"k must be [keys, d] (or [keys, 1, d]: one key head), got shape {tuple(k.shape)}")
        if k_shape[1] != d:
            raise ValueError(f"k has d = {k_shape[1]} but q has d = {d} (q [{rows}, {heads}, {d}])")
        keys = k_shape[0]
        if not _contiguous(k, torch):
            raise ValueError(
                "k must be C-contiguous (it is read in place, never copied): "
                "pass np.ascontiguousarray(k) / k.contiguous()"
            )
    _f32("weights", weights, torch, (rows, heads), "[queries, heads]")
    if k_scale is not None:
        _f32("k_scale", k_scale, torch, (keys,), "[keys]")
    _ints("starts", starts, torch, rows)
    _ints("ends", ends, torch, rows)
    if page_table is not None:
        _table(page_table, torch)
        _ints("seq_ids", seq_ids, torch, rows)
    if slots is False and page_table is not None and num_pages is None:
        raise ValueError(
            "slots=False with contiguous keys: the page table would go unused; leave out page_table and "
            "seq_ids for token ids (slots=False is for a paged key cache)"
        )
    if all(type(x) is int for x in (rows, heads, d, keys)) and (topk is None or type(topk) is int):
        _native.dsa_check(rows, heads, d, keys, topk, order, nan)
    write_slots = page_table is not None and slots is not False
    return _Geom(q_name, k_name, rows, heads, d, keys, device, _mla._is_tensor(torch, q), num_pages, write_slots)


def _contiguous(x: Any, torch: Any) -> bool:
    return bool(x.is_contiguous() if _mla._is_tensor(torch, x) else x.flags.c_contiguous)


def _array(what: str, x: Any, torch: Any) -> None:
    """``x`` is a dense tensor or a (not masked) NumPy array, else
    TypeError."""
    if _mla._is_tensor(torch, x):
        if x.layout != torch.strided:
            raise TypeError(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
        return
    if isinstance(x, np.ma.MaskedArray) or not isinstance(x, np.ndarray):
        raise TypeError(
            f"{what} must be a numpy.ndarray or a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}"
        )


def _is_bytes(x: Any, torch: Any) -> bool:
    """Whether ``x`` holds bytes a paged cache may be: uint8 or fp8 e4m3."""
    if _mla._is_tensor(torch, x):
        return x.dtype in (torch.uint8, getattr(torch, "float8_e4m3fn", torch.uint8))
    return x.dtype == np.uint8 or x.dtype in _FP8_NP


def _cache_pages(k: Any, torch: Any, d: Any, page_size: Any) -> Any:
    """The pages of a paged key cache ``k`` (bytes ``[P, page_size, 1, d +
    4]``, ``[P, page_size, d + 4]``, ``[P, page_size * (d + 4)]`` or flat
    ``[P * page_size * (d + 4)]``, C-contiguous, at least one page), or
    TypeError / ValueError."""
    shape = tuple(k.shape)
    if not _is_bytes(k, torch):
        got = _np_name(k.dtype) if _mla._is_tensor(torch, k) else k.dtype
        raise TypeError(
            f"k is read as a paged key cache (page_table is given and k is not [keys, d]) and must hold bytes "
            f"(uint8 or float8_e4m3fn), got {got} {shape}"
        )
    pb = page_size * (d + 4)
    if len(shape) in (3, 4) and shape[-1] == d + 4 and (len(shape) == 3 or shape[2] == 1):
        if shape[1] != page_size:
            raise ValueError(
                f"k is a paged key cache of pages of {shape[1]} tokens (shape {shape}) but page_size = "
                f"{page_size}: pass page_size={shape[1]}"
            )
        pages = shape[0]
    elif len(shape) == 2 and shape[1] == pb:
        pages = shape[0]
    elif len(shape) == 1:
        if shape[0] % pb != 0:
            raise ValueError(
                f"the paged key cache holds {shape[0]} bytes, not a whole number of pages of {pb} ({page_size} "
                f"tokens of {d} e4m3 bytes and an f32 scale)"
            )
        pages = shape[0] // pb
    else:
        raise ValueError(
            f"k is read as a paged key cache (page_table is given and k is not [keys, d]) and must be bytes "
            f"[pages, page_size, 1, d + 4] = [P, {page_size}, 1, {d + 4}], [P, {page_size}, {d + 4}], "
            f"[pages, page_size * (d + 4)] = [P, {pb}] or flat [P * {pb}], got shape {shape}"
        )
    if pages == 0:
        raise ValueError(f"k: the paged key cache has no pages (shape {shape})")
    if not _contiguous(k, torch):
        raise ValueError(
            "k must be C-contiguous (the paged key cache is read in place, never copied): "
            "pass np.ascontiguousarray(k) / k.contiguous()"
        )
    return pages


def _device(torch: Any, q: Any, **args: Any) -> Any:
    """Where a call runs: None (the CPU engine) for host data or a CPU (or
    meta) tensor q, whose other tensor arguments must be in host memory too;
    a CUDA q's device, where k, weights and k_scale must be tensors on it
    and the per-row vectors and page arguments tensors on it or host data."""
    if not _mla._is_tensor(torch, q) or q.device.type in ("cpu", "meta"):
        for name, x in args.items():
            if _mla._is_tensor(torch, x) and x.device.type not in ("cpu", "meta"):
                raise ValueError(f"{name} is on {x.device} but q is in host memory; pass all on one device")
        return None
    dev = q.device
    if dev.type != "cuda":
        raise ValueError(f"q is on device {dev}; flashsel runs on the CPU and on CUDA devices")
    for name, x in args.items():
        if x is None:
            continue
        tensor = _mla._is_tensor(torch, x)
        if name in ("k", "weights", "k_scale"):
            where = x.device if tensor else type(x).__qualname__
            if where != dev:
                raise ValueError(f"{name} is on {where} but q is on {dev}: {_DEVICES_MSG}")
        elif tensor and x.device.type not in ("cpu", "meta") and x.device != dev:
            raise ValueError(f"{name} is on {x.device} but q is on {dev}")
    return dev


_FP8_NP = (np.dtype(np.uint8),) + (() if _mla._NP_FP8 is None else (_mla._NP_FP8,))
_BF16_NP = (np.dtype(np.uint16), np.dtype(np.int16)) + (() if _mla._NP_BF16 is None else (_mla._NP_BF16,))


def _kind(what: str, x: Any, torch: Any) -> str:
    """The engine's dtype name of q or k ("f32", "bf16", "f8e4m3"), or
    TypeError naming the accepted ones."""
    if _mla._is_tensor(torch, x):
        if x.layout != torch.strided:
            raise TypeError(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
        names = {torch.float32: "f32", torch.bfloat16: "bf16", getattr(torch, "float8_e4m3fn", None): "f8e4m3"}
        name = names.get(x.dtype)
        if name is not None:
            return name
        hint = ""
        if x.dtype == torch.int16:
            hint = "; bf16 bit patterns in a tensor: pass x.view(torch.bfloat16)"
        elif x.dtype == torch.uint8:
            hint = "; e4m3 bit patterns in a tensor: pass x.view(torch.float8_e4m3fn)"
        raise TypeError(f"unsupported {what} dtype {x.dtype}: dsa_scores takes {_TORCH_ACCEPTED}{hint}")
    if isinstance(x, np.ma.MaskedArray) or not isinstance(x, np.ndarray):
        raise TypeError(
            f"{what} must be a numpy.ndarray or a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}"
        )
    native = x.dtype if x.dtype.isnative else x.dtype.newbyteorder("=")
    if native == np.float32:
        return "f32"
    if native in _BF16_NP:
        return "bf16"
    if native in _FP8_NP:
        return "f8e4m3"
    raise TypeError(
        f"unsupported {what} dtype {x.dtype}: dsa_scores takes {_NP_ACCEPTED}; "
        "cast explicitly, e.g. x.astype(np.float32)"
    )


def _np_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _f32(what: str, x: Any, torch: Any, shape: tuple[Any, ...], desc: str) -> None:
    """weights / k_scale: float32 (NumPy: either byte order) of `shape`."""
    if _mla._is_tensor(torch, x):
        if x.dtype != torch.float32:
            raise TypeError(f"{what} must be float32, got {_np_name(x.dtype)}")
    elif isinstance(x, np.ndarray) and not isinstance(x, np.ma.MaskedArray):
        if x.dtype.kind != "f" or x.dtype.itemsize != 4:
            raise TypeError(f"{what} must be float32, got {x.dtype}")
    else:
        raise TypeError(f"{what} must be a float32 numpy.ndarray or torch.Tensor, got {type(x).__qualname__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{what} must be {desc} = [{', '.join(map(str, shape))}], got shape {tuple(x.shape)}")


def _ints(what: str, x: Any, torch: Any, rows: Any) -> None:
    """A per-row int32 / int64 vector: a tensor's metadata (the messages of
    ``_api._int_vector``), host data in full (also that it fits int32)."""
    if _mla._is_tensor(torch, x):
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{what} must hold int32 or int64 values, got {_np_name(x.dtype)}")
        if x.dim() != 1 or x.shape[0] != rows:
            raise ValueError(f"{what} must be 1-D with {rows} entries (one per row), got shape {tuple(x.shape)}")
        return  # the values (int64 that fits int32) when the request runs
    _host_vector(what, x, rows)


def _host_vector(what: str, x: Any, rows: Any) -> np.ndarray:
    """Host per-row data (an array, a sequence of ints; ``[]`` for no rows)
    as native int32, checked (``_api._int_vector``)."""
    if not isinstance(x, np.ndarray) and np.size(x) == 0 and np.ndim(x) == 1:
        x = np.zeros(0, np.int64)
    return _api._int_vector(what, x, rows, np.int32)


def _table(page_table: Any, torch: Any) -> tuple[Any, Any]:
    """A page table: int32 ``[sequences, max_pages]``, neither empty; its
    shape."""
    if _mla._is_tensor(torch, page_table):
        if page_table.dim() != 2 or page_table.dtype != torch.int32:
            raise TypeError(
                f"page_table must be int32 [sequences, max_pages], got {_np_name(page_table.dtype)} "
                f"{tuple(page_table.shape)}"
            )
    else:
        page_table = _api._host_table(page_table)
    if page_table.shape[0] == 0 or page_table.shape[1] == 0:
        raise ValueError(
            f"page_table must have at least one sequence and one page, got shape {tuple(page_table.shape)}"
        )
    return tuple(page_table.shape)


# ---------------------------------------------------------------------------
# Host inputs (the CPU engine)
# ---------------------------------------------------------------------------


def _bits(torch: Any, x: Any, name: str, copy_ok: bool) -> np.ndarray:
    """q / k as a flat, native-order NumPy array of its bits (float32,
    uint16 bf16 bits, uint8 e4m3 bits): a view of a contiguous tensor or
    array, else (``copy_ok``: q) a copy."""
    if _mla._is_tensor(torch, x):
        t = x.detach()
        a = t.numpy() if name == "f32" else t.view(torch.int16 if name == "bf16" else torch.uint8).numpy()
    else:
        a = x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))  # big-endian: a native copy
        if not a.flags.aligned:
            if not copy_ok:
                raise ValueError("k: the data is not aligned to its element size; pass an aligned copy")
            a = a.copy()
    a = a.view({"f32": np.float32, "bf16": np.uint16, "f8e4m3": np.uint8}[name])
    return np.ascontiguousarray(a).reshape(-1)


def _f32_host(torch: Any, x: Any) -> np.ndarray:
    a = x.detach().numpy() if _mla._is_tensor(torch, x) else x
    return np.require(np.asarray(a, np.float32), requirements=["C", "A"]).reshape(-1)


def _vector(torch: Any, what: str, x: Any, rows: int) -> np.ndarray:
    return _host_vector(what, x.detach().numpy() if _mla._is_tensor(torch, x) else x, rows)


def _cache_bytes(torch: Any, k: Any) -> np.ndarray:
    """A checked paged key cache as a flat uint8 view (read in place)."""
    if _mla._is_tensor(torch, k):
        return k.detach().view(torch.uint8).numpy().reshape(-1)
    return k.view(np.uint8).reshape(-1)


def _host_inputs(
    torch: Any, g: _Geom, q: Any, k: Any, weights: Any, starts: Any, ends: Any, k_scale: Any
) -> tuple[Any, ...]:
    """The CPU engine's arguments ``q, q_dtype, k, k_dtype, k_scale,
    weights, starts, ends`` of a checked host request; for a paged cache
    those of the paged functions, ``q, q_dtype, cache, weights, starts,
    ends``."""
    if g.paged:
        return (
            _bits(torch, q, g.q_name, copy_ok=True),
            g.q_name,
            _cache_bytes(torch, k),
            _f32_host(torch, weights),
            _vector(torch, "starts", starts, g.rows),
            _vector(torch, "ends", ends, g.rows),
        )
    return (
        _bits(torch, q, g.q_name, copy_ok=True),
        g.q_name,
        _bits(torch, k, g.k_name, copy_ok=False),
        g.k_name,
        None if k_scale is None else _f32_host(torch, k_scale),
        _f32_host(torch, weights),
        _vector(torch, "starts", starts, g.rows),
        _vector(torch, "ends", ends, g.rows),
    )


# ---------------------------------------------------------------------------
# CUDA tensors
# ---------------------------------------------------------------------------


def _device_inputs(
    torch: Any, g: _Geom, q: Any, k: Any, weights: Any, starts: Any, ends: Any, k_scale: Any
) -> tuple[Any, ...]:
    """Device pointers of a checked CUDA request ``(q, k, k_scale or None,
    weights, starts, ends)`` and the tensors to keep alive until the launch
    is ordered (``starts`` / ``ends`` as int32 on the device, made without a
    host synchronisation)."""
    dev = g.device
    qd = q.detach().contiguous()  # small; a copy only for a strided q
    kd = k.detach()
    w = weights.detach().contiguous()
    ks = None if k_scale is None else k_scale.detach().contiguous()
    st = _api._device_int32(torch, "starts", starts, g.rows, dev, owner="q")
    en = _api._device_int32(torch, "ends", ends, g.rows, dev, owner="q")
    ptrs = (_mla._ptr(qd), _mla._ptr(kd), None if ks is None else _mla._ptr(ks), _mla._ptr(w), _mla._ptr(st),
            _mla._ptr(en))  # fmt: skip
    return ptrs, (qd, kd, w, ks, st, en)


def _device_paged(torch: Any, g: _Geom, pages: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """The page arguments of a checked CUDA request on q's device: ``(the
    paged cache's arguments or None, the slot map's or None, the tensors to
    keep alive)``."""
    args, keep = _api._device_pages(torch, *pages, g.rows, g.device, owner="q")
    paged = None if args is None or not g.paged else (*args, g.num_pages)
    return paged, (args if g.slots else None), keep


def _scores_cuda(
    torch: Any, g: _Geom, q: Any, k: Any, weights: Any, starts: Any, ends: Any, k_scale: Any, pages: Any
) -> Any:
    """:func:`dsa_scores` on CUDA tensors: float32 ``[T, N]`` on q's device,
    one launch on the current stream."""
    ptrs, keep = _device_inputs(torch, g, q, k, weights, starts, ends, k_scale)
    paged, _, keep_pages = _device_paged(torch, g, pages)
    out = torch.empty((g.rows, g.keys), dtype=torch.float32, device=g.device)
    if g.rows == 0 or g.keys == 0:
        return out
    _, ordinal, stream = _mla._launch_env(torch, g.device)
    _native.cuda_dsa_scores(ordinal, g.q_name, g.k_name, *g.spec(), *ptrs, _mla._ptr(out), stream, paged)
    del keep, keep_pages  # back to torch's caching allocator, reuse ordered after the launch
    return out


# Workspace bytes of each CUDA indexer geometry seen (a decode loop asks once).
_ws_cache: dict[tuple[Any, ...], int] = {}


def _indexer_cuda(
    torch: Any,
    g: _Geom,
    q: Any,
    k: Any,
    weights: Any,
    starts: Any,
    ends: Any,
    k_scale: Any,
    topk: int,
    order: str,
    nan: str,
    return_values: bool,
    pages: Any,
) -> tuple[Any, Any]:
    """:func:`dsa_indexer` on CUDA tensors: the scores into a workspace from
    torch's caching allocator, then the selection, on the current stream
    without a host synchronisation (graph-safe)."""
    dev = g.device
    ptrs, keep = _device_inputs(torch, g, q, k, weights, starts, ends, k_scale)
    paged, slot_map, keep_pages = _device_paged(torch, g, pages)
    ids = torch.empty((g.rows, topk), dtype=torch.int32, device=dev)
    values = torch.empty((g.rows, topk), dtype=torch.float32, device=dev) if return_values else None
    if g.rows == 0:
        return ids, values
    if g.keys == 0:  # every range is empty
        ids.fill_(-1)
        if values is not None:
            values.fill_(float("-inf"))
        return ids, values
    _, ordinal, stream = _mla._launch_env(torch, dev)
    key = (ordinal, *g.spec(), topk, order, nan)
    nbytes = _ws_cache.get(key)
    if nbytes is None:
        nbytes = _native.cuda_dsa_indexer_workspace_bytes(*key)
        if len(_ws_cache) >= _api._WS_CACHE_MAX:
            _ws_cache.clear()
        _ws_cache[key] = nbytes
    # torch's caching allocator gives 512-byte aligned blocks (the engine
    # needs 256).
    ws = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=dev)
    _native.cuda_dsa_indexer(
        ordinal, g.q_name, g.k_name, *g.spec(), topk, order, nan, *ptrs, slot_map,
        _mla._ptr(ids), None if values is None else _mla._ptr(values), _mla._ptr(ws), nbytes, stream, paged,
    )  # fmt: skip
    del keep, keep_pages, ws  # back to torch's caching allocator, reuse ordered after the launch
    return ids, values
