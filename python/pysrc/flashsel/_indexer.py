"""The QSA indexer (private: import from ``flashsel``): :func:`qsa_scores`,
the block scores :func:`flashsel.qsa_select` ranks, and :func:`qsa_indexer`,
the two fused, on the CPU engine (NumPy arrays, CPU tensors) and on the CUDA
engine (CUDA tensors: :func:`_scores_cuda`, :func:`_indexer_cuda`). Torch
tensors go through the operators ``flashsel::qsa_scores`` /
``flashsel::qsa_indexer`` (``_torch_ops``), whose real implementations are
:func:`_scores_torch` / :func:`_indexer_torch` here."""

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
        bfloat16 bit patterns) or a torch tensor on the CPU or a CUDA device
        (float32, bfloat16). Read exactly, never rounded (a bf16 q is
        widened, an f32 q stays f32). A q that is not C-contiguous is copied
        (it is small). q's device picks the engine: a CUDA q runs on that
        device, on its current stream, and every tensor argument must be on
        it (``positions``, ``page_table`` and ``seq_ids`` may also be host
        data, copied over, which a CUDA graph capture cannot hold).
    kbar
        The block keys, float32, bfloat16 or fp8 e4m3 without a scale
        (``ml_dtypes.float8_e4m3fn`` or uint8 bit patterns;
        ``torch.float8_e4m3fn``): one sequence ``[NB, d]``, or with
        ``page_table`` a paged cache ``[pages, page_size // ratio, d]``.
        Read in place: it must be C-contiguous (big-endian arrays are
        converted, a copy); on CUDA also 16-byte aligned (a slice of whole
        rows of a larger tensor is).
    positions
        ``[T]`` int32 / int64: the absolute position of each query (``>= 0``,
        ``V(t) <= NB``). Checked on the host for host data; CUDA values are
        not checked (that would need a synchronisation): a row whose position
        is negative or past the keys, or (paged) whose sequence id is outside
        the table or whose blocks reach past the table's pages, is all NaN
        (int64 values are clamped into int32 first, so a large one is such a
        row, never a wrapped one). A page entry outside the cache scores NaN.
        Nothing outside the inputs is ever read.
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
        float32 ``[T, NB]``: a NumPy array, or a tensor on q's device when
        ``q`` is a tensor (CUDA: returned without waiting). Each engine's
        arithmetic and summation order are fixed (docs/semantics.md): the
        same bytes on every run, in any batch. The CPU engine's error
        against the exact value is at most ``(d + H + 2) * 2**-24 * M + (d
        * H + 1) * 2**-149`` with ``M = sum over h, j of |q[t, h, j] *
        kbar[b, j]| / sqrt(d)``. The CUDA engine scores on tensor cores in
        its own order: its own bits (not the CPU engine's), the same on
        every run on one GPU model, within its own stated bound
        (docs/semantics.md, "The CUDA engine"); an infinite float32 q value
        beside float32 keys is not handled there (it can give NaN). A NaN
        input gives a NaN score.

    Raises
    ------
    TypeError
        Unsupported array types or dtypes (float16 is not taken: cast it).
    ValueError
        Bad shapes, H or d, options; tensors on different devices (or keys
        in host memory beside a CUDA q); a kbar that is not C-contiguous (on
        CUDA, not 16-byte aligned); host data only: a negative position, a
        position past the keys (``V > NB``), a page table entry outside the
        cache or a sequence id outside the table.
    RuntimeError
        The CUDA engine cannot run on q's device, or the driver failed.
    """
    ratio = _positive("ratio", ratio)
    page_size = _positive("page_size", page_size)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        # Through the torch operator flashsel::qsa_scores (torch.compile,
        # CUDA graphs), which runs _scores_torch.
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.qsa_scores(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    args, _ = _inputs(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    return _native.qsa_scores_cpu(*args)


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
    same ids, counts and errors), with a bounded score scratch instead of the
    ``[T, NB]`` float32 scores (below).

    ``q``, ``kbar``, ``positions``, ``ratio``, ``page_table``, ``page_size``
    and ``seq_ids`` are those of :func:`qsa_scores`; ``k_blocks``, ``order``
    and ``nan`` those of :func:`qsa_select`. With ``page_table`` the keys are
    the paged cache and the ids are slots through the same table (as
    ``qsa_select`` with that ``page_table`` and ``seq_ids``); without it,
    token ids.

    The CPU engine scores only the queries with ``V > k_blocks`` (the others
    select ``0 .. V - 1`` and read no key), in groups whose score scratch stays
    under 256 MiB (or one row of ``V`` floats when a single row needs more);
    decode at 1M tokens uses 1 MiB. The CUDA engine (a CUDA ``q``: one
    asynchronous call on the current stream, no host synchronisation,
    capturable in a CUDA graph, its workspace from torch's caching
    allocator) runs a decode batch (at most 64 queries, ``k_blocks <= 4096``,
    ``NB <= 65,536``, rows whose scores fit the GPU's shared memory) as one
    fused kernel that keeps the scores on chip and never writes them
    (workspace: 32,896 bytes a query, plus ``8 * k_blocks`` in score order);
    wider rows and larger batches are scored
    in groups of ``max(1, 256 MiB / (4 * NB))`` rows into that workspace,
    skipping the rows with ``V <= k_blocks`` and every block past a row's
    ``V``, and each group selected with :func:`qsa_select`'s kernels: score
    scratch at most ``max(256 MiB, 4 * NB)`` bytes, beside the selection's own
    workspace. Both give the same bytes. Device values as in :func:`qsa_scores`: a row
    whose position, sequence id or pages are out of range is all ``-1`` with
    count 0.

    Returns ``(ids, counts)``: int32 ``[T, k_blocks * ratio + ratio - 1]`` and
    int32 ``[T]`` (NumPy arrays, or tensors on q's device when ``q`` is a
    tensor).

    Raises what :func:`qsa_scores` and :func:`qsa_select` raise: ``TypeError``
    for types and dtypes, ``ValueError`` for shapes, options, devices and
    (host data) position or page-table values, ``RuntimeError`` when the
    CUDA engine cannot run.
    """
    order = _check_option("order", order, _ORDERS)
    nan = _check_option("nan", nan, _NANS)
    k_blocks = _positive("k_blocks", k_blocks)
    ratio = _positive("ratio", ratio)
    page_size = _positive("page_size", page_size)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        from . import _torch_ops  # noqa: PLC0415 - imports torch, already imported here

        return _torch_ops.qsa_indexer(q, kbar, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)
    return _indexer_host(q, kbar, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)


def _indexer_host(
    q: Any, kbar: Any, positions: Any, ratio: int, k_blocks: int, order: str, nan: str, page_table: Any,
    page_size: int, seq_ids: Any,
) -> Any:
    """The CPU engine's qsa_indexer on host data (NumPy arrays, CPU tensors);
    NumPy results, or CPU tensors when q is a tensor."""
    args, q_is_tensor = _inputs(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    (qh, q_name, kh, k_name, pos, ratio, table, page_size, seqs) = args
    ids, counts = _native.qsa_indexer_cpu(
        qh, q_name, kh, k_name, pos, ratio, k_blocks, order, nan, table, page_size, seqs
    )
    if q_is_tensor:
        torch = sys.modules["torch"]
        return torch.from_numpy(ids), torch.from_numpy(counts)
    return ids, counts


def _scores_host(
    q: Any, kbar: Any, positions: Any, ratio: int, page_table: Any, page_size: int, seq_ids: Any
) -> Any:
    """The CPU engine's qsa_scores on host data; a NumPy array, or a CPU
    tensor when q is a tensor."""
    args, q_is_tensor = _inputs(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    scores = _native.qsa_scores_cpu(*args)
    return sys.modules["torch"].from_numpy(scores) if q_is_tensor else scores


# ---------------------------------------------------------------------------
# Torch tensors (the operators' real implementations) and the CUDA engine
# ---------------------------------------------------------------------------


def _scores_torch(
    q: Any, kbar: Any, positions: Any, ratio: int, page_table: Any, page_size: int, seq_ids: Any
) -> Any:
    """``flashsel::qsa_scores`` on real tensors: CUDA q on the CUDA engine,
    CPU q on the CPU engine (zero-copy NumPy views)."""
    if q.device.type == "cuda":
        return _scores_cuda(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    return _scores_host(q, kbar, positions, ratio, page_table, page_size, seq_ids)


def _indexer_torch(
    q: Any, kbar: Any, positions: Any, ratio: int, k_blocks: int, order: str, nan: str, page_table: Any,
    page_size: int, seq_ids: Any,
) -> Any:
    """``flashsel::qsa_indexer`` on real tensors (as :func:`_scores_torch`)."""
    if q.device.type == "cuda":
        return _indexer_cuda(q, kbar, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)
    return _indexer_host(q, kbar, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids)


_TORCH_Q = {"float32": "f32", "bfloat16": "bf16"}
_TORCH_K = {"float32": "f32", "bfloat16": "bf16", "float8_e4m3fn": "f8e4m3"}


def _device_inputs(
    q: Any, kbar: Any, positions: Any, ratio: int, page_table: Any, page_size: int, seq_ids: Any
) -> tuple[Any, ...]:
    """The checked device arguments of a CUDA call: ``(torch, geometry,
    q, kbar, cache_pages, positions, pages, keep)`` with ``geometry = (q_name,
    k_name, rows, heads, d, blocks)``; the checks of the CPU path (the same
    messages, ``_torch_ops.indexer_meta``), then the device's own (16-byte
    aligned keys). Nothing here waits for the device."""
    from . import _api, _torch_ops  # noqa: PLC0415

    torch = sys.modules["torch"]
    rows, heads, d, blocks = _torch_ops.indexer_meta(q, kbar, positions, ratio, page_table, page_size, seq_ids)
    device = q.device
    qd = q.detach().contiguous()  # small; a copy only for a strided q
    kd = kbar.detach()
    if kd.numel() > 0 and kd.data_ptr() % 16:
        raise ValueError(
            f"kbar: the data at {kd.data_ptr():#x} is not 16-byte aligned (the CUDA engine reads keys in 16-byte "
            "loads); pass kbar.clone()"
        )
    cache_pages = kd.shape[0] if page_table is not None else 0
    pos = _api._device_int32(torch, "positions", positions, rows, device, owner="q")
    pages, keep = _api._device_pages(torch, page_table, page_size, seq_ids, rows, device, owner="q")
    names = (_TORCH_Q[str(q.dtype).removeprefix("torch.")], _TORCH_K[str(kbar.dtype).removeprefix("torch.")])
    if kd.numel() == 0:
        kd = torch.empty(16, dtype=torch.uint8, device=device)  # no block is read: any live pointer
    return torch, (*names, rows, heads, d, blocks), qd, kd, cache_pages, pos, pages, (keep, kd, qd, pos)


def _scores_cuda(
    q: Any, kbar: Any, positions: Any, ratio: int, page_table: Any, page_size: int, seq_ids: Any
) -> Any:
    """qsa_scores on CUDA tensors: float32 ``[T, NB]`` on q's device, launched
    on the current stream without a host synchronisation (graph-safe)."""
    from . import _api  # noqa: PLC0415

    torch, geo, qd, kd, cache_pages, pos, pages, keep = _device_inputs(
        q, kbar, positions, ratio, page_table, page_size, seq_ids
    )
    q_name, k_name, rows, heads, d, blocks = geo
    out = torch.empty((rows, blocks), dtype=torch.float32, device=q.device)
    if rows == 0 or blocks == 0:
        return out
    ordinal = q.get_device()
    _api._ensure_engine(ordinal)
    _native.cuda_qsa_scores(
        ordinal, q_name, k_name, rows, heads, d, blocks, ratio,
        qd.data_ptr(), kd.data_ptr(), cache_pages, pos.data_ptr(), out.data_ptr(), pages,
        _api._raw_stream(torch, ordinal),
    )  # fmt: skip
    del keep  # back to torch's caching allocator, reuse ordered after the launch
    return out


# Workspace bytes of each CUDA indexer geometry seen (a decode loop asks once).
_ws_cache: dict[tuple[Any, ...], int] = {}


def _indexer_cuda(
    q: Any, kbar: Any, positions: Any, ratio: int, k_blocks: int, order: str, nan: str, page_table: Any,
    page_size: int, seq_ids: Any,
) -> Any:
    """qsa_indexer on CUDA tensors: ``(ids, counts)`` on q's device, launched
    on the current stream without a host synchronisation (graph-safe); the
    workspace comes from torch's caching allocator on that stream."""
    from . import _api  # noqa: PLC0415

    torch, geo, qd, kd, cache_pages, pos, pages, keep = _device_inputs(
        q, kbar, positions, ratio, page_table, page_size, seq_ids
    )
    q_name, k_name, rows, heads, d, blocks = geo
    width = k_blocks * ratio + ratio - 1
    device = q.device
    ids = torch.empty((rows, width), dtype=torch.int32, device=device)
    counts = torch.empty((rows,), dtype=torch.int32, device=device)
    if rows == 0:
        return ids, counts
    ordinal = q.get_device()
    _api._ensure_engine(ordinal)
    key = (ordinal, rows, heads, d, blocks, ratio, k_blocks, order, nan)
    nbytes = _ws_cache.get(key)
    if nbytes is None:
        nbytes = _native.cuda_qsa_indexer_workspace_bytes(*key)
        if len(_ws_cache) >= _api._WS_CACHE_MAX:
            _ws_cache.clear()
        _ws_cache[key] = nbytes
    ws = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=device)
    _native.cuda_qsa_indexer(
        ordinal, q_name, k_name, rows, heads, d, blocks, ratio, k_blocks, order, nan,
        qd.data_ptr(), kd.data_ptr(), cache_pages, pos.data_ptr(), ids.data_ptr(), counts.data_ptr(), pages,
        ws.data_ptr(), nbytes, _api._raw_stream(torch, ordinal),
    )  # fmt: skip
    del keep, ws  # back to torch's caching allocator, reuse ordered after the launch
    return ids, counts


def _inputs(
    q: Any, kbar: Any, positions: Any, ratio: Any, page_table: Any, page_size: Any, seq_ids: Any
) -> tuple[tuple[Any, ...], bool]:
    """The checked native arguments of the CPU engine (``q, q_name, kbar,
    k_name, positions, ratio, page_table, page_size, seq_ids``) and whether q
    is a tensor. ``_torch_ops.indexer_meta`` makes the same checks, in the
    same order and with the same messages, on tensor metadata (the fakes and
    the CUDA path)."""
    ratio = _positive("ratio", ratio)
    page_size = _positive("page_size", page_size)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
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
        table = _table_array(_plain("page_table", page_table))
        seqs = _int_vector("seq_ids", _plain("seq_ids", seq_ids), rows, np.int32)
    if kh.shape[-1] != d:
        raise ValueError(f"kbar has d = {kh.shape[-1]} but q has d = {d} (q [{rows}, {qh.shape[1]}, {d}])")
    pos = _int_vector("positions", _plain("positions", positions), rows, np.int64)
    return (qh, q_name, kh, k_name, pos, ratio, table, page_size, seqs), q_is_tensor


def _table_array(page_table: Any) -> np.ndarray:
    """A host page table as a native C-contiguous int32 array (int32 only)."""
    t = np.asarray(page_table)
    if t.ndim != 2 or t.dtype.kind != "i" or t.dtype.itemsize != 4:
        raise TypeError(f"page_table must be int32 [sequences, max_pages], got {t.dtype} {t.shape}")
    return np.ascontiguousarray(t, dtype=np.int32)


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


def _plain(what: str, x: Any) -> Any:
    """A CPU torch tensor as a NumPy array (zero-copy); anything else as it is
    (a tensor on another device beside host q: ValueError)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError(f"{what} is on {x.device} but q is in host memory; pass all on one device")
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
            if what == "q":
                raise ValueError(f"q is on device {x.device}; flashsel runs on the CPU and on CUDA devices")
            raise ValueError(f"{what} is on {x.device} but q is in host memory; pass all on one device")
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
