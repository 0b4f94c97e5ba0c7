"""flashsel's torch operators: ``torch.ops.flashsel.topk`` and
``torch.ops.flashsel.qsa_select``, each with a fake (meta) implementation, so
that :func:`flashsel.topk` and :func:`flashsel.qsa_select` on torch tensors
trace into ``torch.compile`` graphs without a graph break (``fullgraph=True``)
and are captured by CUDA graphs.

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

from . import _api, _native

# ---------------------------------------------------------------------------
# The operators
# ---------------------------------------------------------------------------

_LIB = torch.library.Library("flashsel", "FRAGMENT")  # kept alive: dropping it unregisters the ops

_TAGS = (torch.Tag.pt2_compliant_tag,)

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


_LIB.impl("topk", _topk_impl, "CompositeExplicitAutograd")
_LIB.impl("qsa_select", _qsa_impl, "CompositeExplicitAutograd")
# Not differentiable (indices; the values as selected bits): autograd passes
# through, so outputs never require grad, also for scores that do.
_LIB.impl("topk", torch.library.fallthrough_kernel, "Autograd")
_LIB.impl("qsa_select", torch.library.fallthrough_kernel, "Autograd")
torch.library.register_fake("flashsel::topk", _topk_fake, lib=_LIB)
torch.library.register_fake("flashsel::qsa_select", _qsa_fake, lib=_LIB)
_TOPK = torch.ops.flashsel.topk.default
_QSA = torch.ops.flashsel.qsa_select.default


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
        if not isinstance(page_table, torch.Tensor):
            page_table = torch.from_numpy(np.ascontiguousarray(np.asarray(page_table), dtype=np.int32))
        if not isinstance(seq_ids, torch.Tensor):
            seq_ids = torch.from_numpy(np.ascontiguousarray(np.asarray(seq_ids), dtype=np.int32))
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
            t = np.asarray(page_table)
            if t.ndim != 2 or t.dtype.kind not in "iu" or t.dtype.itemsize != 4:
                raise TypeError(f"page_table must be int32 [sequences, max_pages], got {t.dtype} {t.shape}")
            page_table = torch.from_numpy(np.ascontiguousarray(t, dtype=np.int32))
        if host[2]:
            seq_ids = torch.from_numpy(_api._int_vector("seq_ids", seq_ids, rows, np.int32))
    return _QSA(scores, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)


# ---------------------------------------------------------------------------
# Checks and conversions
# ---------------------------------------------------------------------------


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
