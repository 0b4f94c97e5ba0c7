"""The QSA indexer (private: import from ``flashsel``): :func:`qsa_scores`,
the block scores :func:`flashsel.qsa_select` ranks, and :func:`qsa_indexer`,
the two fused, on the CPU engine."""

import operator
import sys
from typing import Any, Literal

import numpy as np

from . import _native
from ._api import _NANS, _ORDERS, _check_option, _int_vector

_I32_MAX = 2**31 - 1

_Q_ACCEPTED = "float32, bfloat16 (ml_dtypes.bfloat16), or uint16 / int16 holding bfloat16 bit patterns"
_K_ACCEPTED = (
    "float32, bfloat16 (ml_dtypes.bfloat16 or uint16 / int16 bit patterns), "
    "or fp8 e4m3 (ml_dtypes.float8_e4m3fn, or uint8 bit patterns)"
)
_CUDA_MSG = "qsa_scores on CUDA tensors: not built yet"
_CUDA_INDEXER_MSG = "qsa_indexer on CUDA tensors: not built yet"


def qsa_scores(
    q: Any,
    kbar: Any,
    positions: Any,
    *,
    ratio: int = 4,
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
) -> Any:
    """QSA indexer scores: float32 ``[T, NB]``, ``score[t, b] = sum over h of
    relu(q[t, h] . kbar[b]) / sqrt(d)`` for the blocks ``b < V(t) = (positions[t]
    + 1) // ratio`` each query sees, ``-inf`` for the rest.

    Parameters
    ----------
    q
        ``[T, H, d]`` queries, ``1 <= H <= 16``, ``d`` in {64, 128, 256}: a
        NumPy array (float32, ``ml_dtypes.bfloat16``, or uint16 / int16
        bfloat16 bit patterns) or a CPU torch tensor (float32, bfloat16). Read
        exactly, never rounded (a bf16 q is widened, an f32 q stays f32). A
        q that is not C-contiguous is copied (it is small).
    kbar
        The block keys, float32, bfloat16 or fp8 e4m3 without a scale
        (``ml_dtypes.float8_e4m3fn`` or uint8 bit patterns;
        ``torch.float8_e4m3fn``): one sequence ``[NB, d]``, or with
        ``page_table`` a paged cache ``[pages, page_size // ratio, d]``.
        Read in place: it must be C-contiguous (big-endian arrays are
        converted, a copy).
    positions
        ``[T]`` int32 / int64: the absolute position of each query (``>= 0``,
        ``V(t) <= NB``).
    ratio
        Tokens per block (4).
    page_table, page_size, seq_ids
        The token page table of :func:`qsa_select` (int32 ``[B, max_pages]``,
        pages of ``page_size`` tokens, a multiple of ``ratio``) and the
        sequence of each query (``[T]``): block ``b`` of query ``t`` is
        ``kbar[page_table[seq_ids[t], b // bpp], b % bpp]`` with ``bpp =
        page_size // ratio``; then ``NB = max_pages * bpp``. Every page a
        query reads (those of its blocks ``0 .. V - 1``) must be in the table
        and in ``0 .. pages - 1``.

    Returns
    -------
    scores
        float32 ``[T, NB]``: a NumPy array, or a CPU tensor when ``q`` is a
        tensor. The arithmetic and its summation order are fixed
        (docs/semantics.md): the same bytes on every run, in any batch. Against
        the exact value the error is at most ``(d + H + 2) * 2**-24 * M +
        (d * H + 1) * 2**-149`` with ``M = sum over h, j of |q[t, h, j] *
        kbar[b, j]| / sqrt(d)``. A NaN input gives a NaN score.

    Raises
    ------
    TypeError
        Unsupported array types or dtypes (float16 is not taken: cast it).
    ValueError
        Bad shapes, H or d, options; a negative position, a position past the
        keys (``V > NB``), a page table entry outside the cache or a sequence
        id outside the table.
    NotImplementedError
        CUDA tensors (not built yet).
    """
    torch = sys.modules.get("torch")
    args, q_is_tensor = _inputs(q, kbar, positions, ratio, page_table, page_size, seq_ids, _CUDA_MSG)
    scores = _native.qsa_scores_cpu(*args)
    return torch.from_numpy(scores) if q_is_tensor else scores


def qsa_indexer(
    q: Any,
    kbar: Any,
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
    """The QSA indexer fused with block selection: exactly
    ``qsa_select(qsa_scores(q, kbar, positions, ...), positions, ...)`` (the
    same ids, counts and errors), without the ``[T, NB]`` float32 scores.

    ``q``, ``kbar``, ``positions``, ``ratio``, ``page_table``, ``page_size``
    and ``seq_ids`` are those of :func:`qsa_scores`; ``k_blocks``, ``order``
    and ``nan`` those of :func:`qsa_select`. With ``page_table`` the keys are
    the paged cache and the ids are slots through the same table (as
    ``qsa_select`` with that ``page_table`` and ``seq_ids``); without it,
    token ids.

    The CPU engine scores only the queries with ``V > k_blocks`` (the others
    select ``0 .. V - 1`` and read no key), in groups whose score scratch stays
    under 64 MiB (or one row of ``V`` floats when a single row needs more);
    decode at 1M tokens uses 1 MiB.

    Returns ``(ids, counts)``: int32 ``[T, k_blocks * ratio + ratio - 1]`` and
    int32 ``[T]`` (NumPy arrays, or CPU tensors when ``q`` is a tensor).

    Raises what :func:`qsa_scores` and :func:`qsa_select` raise;
    ``NotImplementedError`` for CUDA tensors (not built yet).
    """
    order = _check_option("order", order, _ORDERS)
    nan = _check_option("nan", nan, _NANS)
    k_blocks = _positive("k_blocks", k_blocks)
    torch = sys.modules.get("torch")
    args, q_is_tensor = _inputs(q, kbar, positions, ratio, page_table, page_size, seq_ids, _CUDA_INDEXER_MSG)
    (qh, q_name, kh, k_name, pos, ratio, table, page_size, seqs) = args
    ids, counts = _native.qsa_indexer_cpu(
        qh, q_name, kh, k_name, pos, ratio, k_blocks, order, nan, table, page_size, seqs
    )
    if q_is_tensor:
        return torch.from_numpy(ids), torch.from_numpy(counts)
    return ids, counts


def _inputs(
    q: Any, kbar: Any, positions: Any, ratio: Any, page_table: Any, page_size: Any, seq_ids: Any, cuda_msg: str
) -> tuple[tuple[Any, ...], bool]:
    """The checked native arguments of the indexer (``q, q_name, kbar, k_name,
    positions, ratio, page_table, page_size, seq_ids``) and whether q is a
    tensor."""
    ratio = _positive("ratio", ratio)
    page_size = _positive("page_size", page_size)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
    torch = sys.modules.get("torch")
    if torch is not None:
        for x in (q, kbar, positions, page_table, seq_ids):
            if isinstance(x, torch.Tensor) and x.device.type == "cuda":
                raise NotImplementedError(cuda_msg)
    q_name, qh, q_is_tensor = _host("q", q, keys=False)
    k_name, kh, _ = _host("kbar", kbar, keys=True)
    if qh.ndim != 3:
        hint = "; for one query pass q[None]" if qh.ndim == 2 else ""
        raise ValueError(f"q must be 3-D [queries, heads, d], got shape {qh.shape}{hint}")
    qh = np.ascontiguousarray(qh)
    if not kh.flags.c_contiguous:
        raise ValueError(
            "kbar must be C-contiguous (it is read in place, never copied): "
            "pass np.ascontiguousarray(kbar) / kbar.contiguous()"
        )
    if not kh.flags.aligned:
        raise ValueError("kbar: the data is not aligned to its element size; pass an aligned copy")
    rows, _, d = qh.shape
    table = seqs = None
    if page_table is None:
        if kh.ndim != 2:
            raise ValueError(
                f"kbar must be 2-D [blocks, d] (one sequence), or 3-D [pages, page_size // ratio, d] with "
                f"page_table and seq_ids; got shape {kh.shape}"
            )
    else:
        if kh.ndim != 3:
            raise ValueError(f"with page_table, kbar must be 3-D [pages, page_size // ratio, d]; got shape {kh.shape}")
        if page_size % ratio:
            raise ValueError(f"page_size = {page_size} is not a multiple of ratio = {ratio} (a page holds whole blocks)")
        if kh.shape[1] != page_size // ratio:
            raise ValueError(
                f"kbar holds {kh.shape[1]} blocks a page but page_size // ratio = {page_size} // {ratio} = "
                f"{page_size // ratio}"
            )
        t = _plain(page_table)
        if t.ndim != 2 or t.dtype.kind != "i" or t.dtype.itemsize != 4:
            raise TypeError(f"page_table must be int32 [sequences, max_pages], got {t.dtype} {t.shape}")
        table = np.ascontiguousarray(t, dtype=np.int32)
        seqs = _int_vector("seq_ids", _plain(seq_ids), rows, np.int32)
    if kh.shape[-1] != d:
        raise ValueError(f"kbar has d = {kh.shape[-1]} but q has d = {d} (q [{rows}, {qh.shape[1]}, {d}])")
    pos = _int_vector("positions", _plain(positions), rows, np.int64)
    return (qh, q_name, kh, k_name, pos, ratio, table, page_size, seqs), q_is_tensor


def _positive(what: str, x: Any) -> int:
    if isinstance(x, bool):
        raise TypeError(f"{what} must be an integer, got bool")
    try:
        x = operator.index(x)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(x).__name__}") from None
    if not 1 <= x <= _I32_MAX:
        raise ValueError(f"{what} must be in 1 .. 2**31 - 1 (got {x})")
    return x


def _plain(x: Any) -> Any:
    """A CPU torch tensor as a NumPy array (zero-copy); anything else as it is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return x


def _host(what: str, x: Any, keys: bool) -> tuple[str, np.ndarray, bool]:
    """(dtype name for the engine, a native-byte-order NumPy view of the bits,
    whether x is a torch tensor) of q (keys=False) or kbar (keys=True)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise TypeError(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
        if x.device.type != "cpu":
            raise ValueError(f"{what} is on {x.device}; qsa_scores runs on the CPU")
        t = x.detach()
        fp8 = getattr(torch, "float8_e4m3fn", None)
        if t.dtype == torch.float32:
            return "f32", t.numpy(), True
        if t.dtype == torch.bfloat16:
            return "bf16", t.view(torch.int16).numpy().view(np.uint16), True
        if keys and fp8 is not None and t.dtype == fp8:
            return "f8e4m3", t.view(torch.uint8).numpy(), True
        hint = ""
        if t.dtype == torch.int16:
            hint = "; bf16 bit patterns in a tensor: pass x.view(torch.bfloat16)"
        elif t.dtype == torch.uint8 and keys:
            hint = "; e4m3 bit patterns in a tensor: pass x.view(torch.float8_e4m3fn)"
        accepted = "torch.float32, torch.bfloat16" + (" or torch.float8_e4m3fn" if keys else "")
        raise TypeError(f"unsupported {what} dtype {t.dtype}: qsa_scores takes {accepted}{hint}")
    if isinstance(x, np.ma.MaskedArray) or not isinstance(x, np.ndarray):
        raise TypeError(
            f"{what} must be a numpy.ndarray or a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}"
        )
    dtype = x.dtype
    native = dtype if dtype.isnative else dtype.newbyteorder("=")
    if native == np.float32:
        name, bits = "f32", np.dtype(np.float32)
    elif native in (np.uint16, np.int16) or (native.name == "bfloat16" and native.itemsize == 2):
        name, bits = "bf16", np.dtype(np.uint16)
    elif keys and (native == np.uint8 or (native.name == "float8_e4m3fn" and native.itemsize == 1)):
        name, bits = "f8e4m3", np.dtype(np.uint8)
    else:
        accepted = _K_ACCEPTED if keys else _Q_ACCEPTED
        raise TypeError(
            f"unsupported {what} dtype {dtype}: qsa_scores takes {accepted}; "
            "cast explicitly, e.g. x.astype(np.float32)"
        )
    if dtype != native:
        x = x.astype(native)  # big-endian: a native copy
    return name, x.view(bits), False
