"""Context-parallel selection over a ``torch.distributed`` process group.

Each rank holds a contiguous slice of every row's columns (the global
columns ``offset .. offset + cols_r``; the ranks' slices in rank order tile
``0 .. total_cols``, uneven and empty slices allowed). ``topk`` gives every
rank the same bytes one device returns on the whole rows:

1. the rank's exact local top ``k`` of its columns (``flashsel.topk`` in
   index order over the rank's part of each row's candidates), ids made
   global (``+ offset``, ``-1`` stays ``-1``);
2. an all-gather of the candidates over ``group``
   (``torch.distributed.all_gather_into_tensor`` on the current stream: NCCL
   for CUDA tensors, gloo for CPU tensors): ids int32 ``[R, rows, k]`` and
   the values' bits ``[R, rows, k]``, plus each rank's (offset, columns);
3. the exact merge (the GPU merge kernel for CUDA tensors, the CPU merge for
   CPU tensors): ties across ranks to the lower global id, NaN by the
   policy, ``-0.0 == +0.0``, rows with fewer than ``k`` candidates padded
   with ``-1`` / ``-inf``.

Every rank must call with the same ``k``, ``order``, ``nan``, ``lengths``
and ``total_cols``. The layout (every rank's offset and size) is
all-gathered and checked on each call, which reads it back to the host;
pass ``shard_sizes`` (every rank's size in rank order, the same list on
every rank: an engine's static sharding) and nothing is read back: the
call then makes no host synchronisation for CUDA tensors (lengths and
positions as CUDA tensors), as CUDA graph capture needs. ``qsa_select`` does the same for QSA block scores
sharded by block, ending in the QSA merge (token ids or slots), and
``qsa_indexer`` for block keys sharded by block (each rank scores its own
blocks, then ``qsa_select``). See
docs/semantics.md, "Context-parallel selection".
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from . import _native
from ._api import _ensure_engine, _raw_stream, _torch_dtype_name
from ._api import topk as _topk

__all__ = ["topk", "merge", "qsa_select", "qsa_indexer"]


def _bits_dtype(torch: Any, dtype: Any) -> Any:
    return torch.int32 if dtype == torch.float32 else torch.int16


def _all_gather(torch: Any, dist: Any, t: Any, world: int, group: Any) -> Any:
    """``[world, *t.shape]``: every rank's ``t`` in rank order."""
    out = torch.empty((world, *t.shape), dtype=t.dtype, device=t.device)
    try:
        dist.all_gather_into_tensor(out.view(-1), t.contiguous().view(-1), group=group)
    except (RuntimeError, NotImplementedError, AttributeError):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous(), group=group)
        out.copy_(torch.stack(parts))
    return out


def _global_lengths(torch: Any, lengths: Any, rows: int, device: Any) -> Any:
    """The global lengths as int64 ``[rows]`` on ``device`` (a CUDA tensor
    stays on its device: no host synchronisation)."""
    if lengths is None:
        return None
    if isinstance(lengths, int):
        return torch.full((rows,), lengths, dtype=torch.int64, device=device)
    return torch.as_tensor(lengths).to(device=device, dtype=torch.int64).reshape(rows)


def _layout(dist: Any, gathered: Any, sizes: Any, world: int, group: Any, offset: int, cols: int) -> list[list[int]]:
    """Every rank's (offset, size): from ``sizes`` (each rank's size in rank
    order; this rank checks its own entry), else ``gathered()`` (the
    all-gather, read back to the host)."""
    if sizes is None:
        return gathered()
    sizes = [int(c) for c in sizes]
    if len(sizes) != world:
        raise ValueError(f"shard_sizes has {len(sizes)} entries for a group of {world} ranks")
    if any(c < 0 for c in sizes):
        raise ValueError(f"shard_sizes must be >= 0, got {sizes}")
    rank = dist.get_rank(group)
    if sizes[rank] != int(cols):
        raise ValueError(f"shard_sizes[{rank}] is {sizes[rank]}, but this rank's shard has {cols}")
    starts = [sum(sizes[:r]) for r in range(world)]
    if starts[rank] != int(offset):
        raise ValueError(f"shard_sizes put rank {rank} at {starts[rank]}, but its offset is {offset}")
    return [[o, c] for o, c in zip(starts, sizes)]


def _gather_candidates(
    torch: Any,
    dist: Any,
    shard: Any,
    k: int,
    local_len: Any,
    nan: str,
    offset: int,
    total: int,
    group: Any,
    unit: str,
    sizes: Any = None,
) -> tuple[Any, Any, list[int]]:
    """Step 1 and 2 of every distributed selection: this rank's exact local
    top ``k`` of its ``[rows, cols_r]`` shard in index order (``local_len``:
    each row's candidates in the shard, or None), ids made global; then the
    all-gather of every rank's (offset, cols) (or ``sizes``, every rank's
    cols, taken as given: no gather, no read-back), checked to tile ``0 ..
    total`` (``unit`` names the columns in the messages), and of the ids and
    values. Returns (ids int32 ``[R, rows, k]``, values ``[R, rows, k]`` in
    the shard's dtype, the ranks' column counts)."""
    rows, cols = shard.shape
    world = dist.get_world_size(group)
    idx, val = _topk(shard, k, lengths=local_len, order="index", nan=nan, return_values=True)
    ids = torch.where(idx >= 0, idx + int(offset), idx).to(torch.int32)
    # The values travel as their bytes (uint8: every backend moves them, and
    # NCCL and gloo have no int16).
    bits = val.contiguous().view(torch.uint8)
    # The layout: every rank's (offset, columns), checked to tile the rows.
    def gathered() -> Any:
        shape = torch.tensor([int(offset), int(cols)], dtype=torch.int64, device=shard.device)
        return _all_gather(torch, dist, shape, world, group).cpu().tolist()

    layout = _layout(dist, gathered, sizes, world, group, offset, cols)
    at = 0
    for r, (o, c) in enumerate(layout):
        if o != at:
            raise ValueError(f"rank {r}'s shard starts at {unit} {o}, but ranks 0..{r - 1} end at {at}")
        at += c
    if at != total:
        raise ValueError(f"the shards cover {at} {unit}s, the total says {total}")
    g_ids = _all_gather(torch, dist, ids, world, group).contiguous()
    g_vals = _all_gather(torch, dist, bits, world, group).view(shard.dtype).reshape(world, rows, k)
    return g_ids, g_vals, [c for _, c in layout]


def topk(
    scores_shard: Any,
    k: int,
    *,
    group: Any = None,
    offset: int,
    total_cols: int,
    lengths: Any = None,
    order: Literal["score", "index"] = "score",
    nan: Literal["lowest", "largest"] = "lowest",
    return_values: bool = False,
    shard_sizes: Any = None,
) -> Any:
    """The whole rows' exact top ``k`` from this rank's ``[rows, cols_r]``
    shard of the scores (global columns ``offset .. offset + cols_r``).

    ``lengths`` (optional, global): row ``i``'s candidates are its global
    columns ``0 .. lengths[i]`` (a host int or a sequence / tensor of
    ``rows`` ints). ``shard_sizes`` (optional): every rank's column count
    in rank order, the same on every rank; given, the layout is not
    all-gathered (no host synchronisation; see the module's docstring).
    Returns the global indices ``[rows, k]`` int32 on the scores' device
    (and the values, with ``return_values``): the same bytes on every rank,
    equal to ``flashsel.topk`` on the whole rows."""
    import torch
    import torch.distributed as dist

    if scores_shard.dim() != 2:
        raise ValueError(f"scores_shard must be [rows, cols_r], got shape {tuple(scores_shard.shape)}")
    rows, cols = scores_shard.shape
    _torch_dtype_name(torch, scores_shard.dtype)
    glen = _global_lengths(torch, lengths, rows, scores_shard.device)
    local_len = None if glen is None else (glen - offset).clamp(0, cols).to(torch.int32)
    g_ids, g_vals, shard_lens = _gather_candidates(
        torch, dist, scores_shard, k, local_len, nan, offset, total_cols, group, "column", shard_sizes
    )
    out_idx, out_val = merge(
        g_ids,
        g_vals,
        k=k,
        shard_lens=shard_lens,
        order=order,
        nan=nan,
        lengths=None if glen is None or glen.is_cuda else glen,
    )
    return (out_idx, out_val) if return_values else out_idx


def merge(
    ids: Any,
    values: Any,
    *,
    k: int,
    shard_lens: list[int],
    order: Literal["score", "index"] = "score",
    nan: Literal["lowest", "largest"] = "lowest",
    lengths: Any = None,
) -> tuple[Any, Any]:
    """The exact merge of gathered candidates: ``ids`` int32 and ``values``
    ``[R, rows, k]`` (each rank's global ids ascending, ``-1`` padded; the
    values in the scores' dtype), rank ``r`` holding ``shard_lens[r]``
    columns. CUDA tensors: the GPU merge kernel on the current stream (no
    host synchronisation; the host-side checks of the CPU merge are not
    made: a malformed row comes out as padding). CPU tensors: the CPU merge,
    with every check. Returns (indices int32 ``[rows, k]``, values)."""
    import torch

    ranks, rows, kk = ids.shape
    if kk != k or len(shard_lens) != ranks:
        raise ValueError(f"ids are {tuple(ids.shape)} for k={k} and {len(shard_lens)} ranks")
    name = _torch_dtype_name(torch, values.dtype)
    cols = int(sum(shard_lens))
    if ids.is_cuda:
        device = ids.device.index if ids.device.index is not None else torch.cuda.current_device()
        _ensure_engine(device)
        ids = ids.contiguous()
        values = values.contiguous()
        out_idx = torch.empty((rows, k), dtype=torch.int32, device=ids.device)
        out_val = torch.empty((rows, k), dtype=values.dtype, device=ids.device)
        nbytes = _native.cuda_shard_merge_workspace_bytes(device, name, rows, cols, k, ranks, order, nan)
        ws = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=ids.device)
        _native.cuda_shard_merge(
            device,
            name,
            rows,
            cols,
            k,
            ranks,
            order,
            nan,
            ids.data_ptr(),
            values.data_ptr(),
            out_idx.data_ptr(),
            out_val.data_ptr(),
            ws.data_ptr(),
            nbytes,
            _raw_stream(torch, device),
        )
        return out_idx, out_val
    np_ids = np.ascontiguousarray(ids.numpy().reshape(-1), dtype=np.int32)
    bits = values.contiguous().view(_bits_dtype(torch, values.dtype)).numpy().reshape(-1)
    np_vals = bits.view(np.float32) if values.dtype == torch.float32 else bits.view(np.uint16)
    np_len = None if lengths is None else np.ascontiguousarray(np.asarray(lengths, dtype=np.int32).reshape(rows))
    i, v = _native.shard_merge_cpu(np_ids, np_vals, name, list(shard_lens), rows, k, order, nan, np_len)
    out_idx = torch.from_numpy(i.reshape(rows, k))
    vbits = v.view(np.int32) if values.dtype == torch.float32 else v.view(np.int16)
    out_val = torch.from_numpy(vbits.reshape(rows, k).copy()).view(values.dtype)
    return out_idx, out_val


def qsa_select(
    scores_shard: Any,
    positions: Any,
    *,
    group: Any = None,
    offset: int,
    total_blocks: int,
    ratio: int = 4,
    k_blocks: int = 512,
    order: Literal["score", "index"] = "index",
    nan: Literal["lowest", "largest"] = "lowest",
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
    shard_sizes: Any = None,
) -> tuple[Any, Any]:
    """QSA block selection over block scores sharded by block: this rank
    holds ``[T, nb_r]``, the global blocks ``offset .. offset + nb_r`` of
    every row (the ranks' slices in rank order tile ``0 .. total_blocks``).
    Returns ``(ids, counts)`` with the bytes of :func:`flashsel.qsa_select`
    on the whole rows, on every rank (``positions``, ``ratio``,
    ``k_blocks``, ``order``, ``nan`` and the page table as there).

    How: each rank selects its exact local top ``k_blocks`` of its part of
    ``0 .. V`` for the rows with ``V > k_blocks`` (the others read no score,
    as in ``qsa_select``), in index order with global block ids; the
    candidates and each rank's layout are all-gathered over ``group``; the
    QSA merge (``flashsel::cpu::qsa_merge`` for CPU tensors with every host
    check, ``CudaEngine::qsa_shard_merge_device`` for CUDA tensors, device
    rows out of range as padding) selects the blocks and expands them to
    token ids or slots. Every rank must pass the same ``positions``,
    options and page table. ``shard_sizes`` (every rank's block count in
    rank order, the same on every rank) skips the layout's all-gather: no
    host synchronisation for CUDA tensors."""
    import torch
    import torch.distributed as dist

    from ._api import _device_int32, _device_pages, _host_table, _int_vector

    if scores_shard.dim() != 2:
        raise ValueError(f"scores_shard must be [queries, blocks_r], got shape {tuple(scores_shard.shape)}")
    rows, cols = scores_shard.shape
    name = _torch_dtype_name(torch, scores_shard.dtype)
    if ratio < 1 or k_blocks < 1:
        raise ValueError(f"ratio and k_blocks must be >= 1, got {ratio} and {k_blocks}")
    dev = scores_shard.device
    pos = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(np.asarray(positions))
    if pos.dim() != 1 or pos.shape[0] != rows or pos.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be int32 / int64 [{rows}], got {pos.dtype} {tuple(pos.shape)}")
    # The blocks each row ranks: 0 .. V when V > k_blocks, none otherwise.
    v = torch.div(pos.to(torch.int64) + 1, ratio, rounding_mode="floor")
    ends = torch.where(v > k_blocks, v, torch.zeros_like(v))
    local_len = (ends - int(offset)).clamp(0, cols).to(torch.int32).to(dev)
    g_ids, g_vals, shard_lens = _gather_candidates(
        torch, dist, scores_shard, k_blocks, local_len, nan, offset, total_blocks, group, "block", shard_sizes
    )
    width = k_blocks * ratio + ratio - 1
    world = len(shard_lens)
    if dev.type == "cuda":
        device = dev.index if dev.index is not None else torch.cuda.current_device()
        _ensure_engine(device)
        dpos = _device_int32(torch, "positions", pos, rows, dev)
        pages, keep = _device_pages(torch, page_table, page_size, seq_ids, rows, dev)
        out = torch.empty((rows, width), dtype=torch.int32, device=dev)
        counts = torch.empty((rows,), dtype=torch.int32, device=dev)
        nbytes = _native.cuda_qsa_shard_merge_workspace_bytes(
            device, name, rows, total_blocks, ratio, k_blocks, world, order, nan
        )
        ws = torch.empty(max(nbytes, 256), dtype=torch.uint8, device=dev)
        g_vals = g_vals.contiguous()
        _native.cuda_qsa_shard_merge(
            device, name, rows, total_blocks, ratio, k_blocks, world, order, nan,
            g_ids.data_ptr(), g_vals.data_ptr(), dpos.data_ptr(), out.data_ptr(), counts.data_ptr(),
            pages, ws.data_ptr(), nbytes, _raw_stream(torch, device),
        )  # fmt: skip
        del keep
        return out, counts
    np_ids = np.ascontiguousarray(g_ids.numpy().reshape(-1), dtype=np.int32)
    vbits = g_vals.contiguous().view(_bits_dtype(torch, g_vals.dtype)).numpy().reshape(-1)
    np_vals = vbits.view(np.float32) if g_vals.dtype == torch.float32 else vbits.view(np.uint16)
    np_pos = _int_vector("positions", pos.cpu().numpy(), rows, np.int64)
    if (page_table is None) != (seq_ids is None):
        raise ValueError("page_table and seq_ids come together: pass both or neither")
    table = None
    seqs = None
    if page_table is not None:
        pt = page_table.cpu().numpy() if isinstance(page_table, torch.Tensor) else page_table
        table = _host_table(pt)
        sq = seq_ids.cpu().numpy() if isinstance(seq_ids, torch.Tensor) else seq_ids
        seqs = _int_vector("seq_ids", sq, rows, np.int32)
    out_np, counts_np = _native.qsa_merge_cpu(
        np_ids, np_vals, name, shard_lens, np_pos, ratio, k_blocks, order, nan, table, page_size, seqs
    )
    return torch.from_numpy(np.ascontiguousarray(out_np)), torch.from_numpy(counts_np)


def qsa_indexer(
    q: Any,
    kbar_shard: Any,
    positions: Any,
    *,
    group: Any = None,
    offset: int,
    total_blocks: int,
    ratio: int = 4,
    k_blocks: int = 512,
    order: Literal["score", "index"] = "index",
    nan: Literal["lowest", "largest"] = "lowest",
    page_table: Any = None,
    page_size: int = 64,
    seq_ids: Any = None,
    key_page_table: Any = None,
    shard_sizes: Any = None,
) -> tuple[Any, Any]:
    """The QSA indexer with the block keys sharded by block: this rank holds
    the global blocks ``offset .. offset + nb_r`` of the keys (the ranks'
    slices in rank order tile ``0 .. total_blocks``), and every rank the
    same ``q`` ``[T, H, d]`` and ``positions``. Returns ``(ids, counts)``:
    the bytes of ``flashsel.qsa_indexer`` (``flashsel.qsa_select`` of
    ``flashsel.qsa_scores``) on the whole keys, on every rank.

    The rank's keys are either one sequence's, contiguous: ``kbar_shard``
    ``[nb_r, d]``; or a paged cache of its own, ``kbar_shard`` ``[pages_r,
    page_size // ratio, d]`` with ``key_page_table`` int32 ``[B,
    max_pages_r]`` (the rank's table: sequence ``s``'s local block ``j``,
    global block ``offset + j``, is ``kbar_shard[key_page_table[s, j //
    bpp], j % bpp]``, ``bpp = page_size // ratio``) and ``seq_ids`` (each
    query's sequence): then ``nb_r = max_pages_r * bpp``, the same block
    range of every sequence on this rank. ``page_table`` (with ``seq_ids``)
    maps the output ids to KV slots (as in :func:`qsa_select`: the global
    token table, not the rank's key table); ``shard_sizes`` is
    :func:`qsa_select`'s.

    How: the rank scores its blocks with :func:`flashsel.qsa_scores` (each
    block's score is its own arithmetic, so the bytes of the whole row's),
    row ``t`` seeing its blocks below ``V(t) = (positions[t] + 1) //
    ratio``; then :func:`qsa_select` over those scores. The rank's scores
    ``[T, nb_r]`` f32 are written (not fused)."""
    import torch

    from ._indexer import qsa_scores as _qsa_scores

    if ratio < 1:
        raise ValueError(f"ratio must be >= 1, got {ratio}")
    pos = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(np.asarray(positions))
    if pos.dim() != 1 or pos.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be int32 / int64 [T], got {pos.dtype} {tuple(pos.shape)}")
    if key_page_table is None:
        if kbar_shard.dim() != 2:
            raise ValueError(
                f"kbar_shard must be [blocks_r, d] (one sequence's keys; a paged cache takes key_page_table), "
                f"got shape {tuple(kbar_shard.shape)}"
            )
        nb_r = kbar_shard.shape[0]
        paged: dict[str, Any] = {}
    else:
        if seq_ids is None:
            raise ValueError("key_page_table needs seq_ids (the sequence of each query)")
        if page_size < 1 or page_size % ratio:
            raise ValueError(f"page_size must be a positive multiple of ratio ({ratio}), got {page_size}")
        bpp = page_size // ratio
        if kbar_shard.dim() != 3 or kbar_shard.shape[1] != bpp:
            raise ValueError(
                f"with key_page_table, kbar_shard must be [pages_r, page_size // ratio = {bpp}, d], "
                f"got shape {tuple(kbar_shard.shape)}"
            )
        if not isinstance(key_page_table, torch.Tensor):
            key_page_table = torch.from_numpy(np.ascontiguousarray(np.asarray(key_page_table)))
        if key_page_table.dim() != 2:
            raise ValueError(f"key_page_table must be [sequences, max_pages_r], got {tuple(key_page_table.shape)}")
        nb_r = key_page_table.shape[1] * bpp
        # qsa_scores at ratio 2 reads bpp blocks a page from pages of 2 bpp.
        paged = dict(page_table=key_page_table, page_size=2 * bpp, seq_ids=seq_ids)
    v = torch.div(pos.to(torch.int64) + 1, ratio, rounding_mode="floor")
    v_local = (v - int(offset)).clamp(0, nb_r)
    # Positions that see exactly v_local of this rank's blocks at ratio 2
    # ((2 v + 1) // 2 = v, and >= 0 even where v is 0); a block's score does
    # not depend on the ratio.
    if nb_r == 0:
        local = torch.empty((pos.shape[0], 0), dtype=torch.float32, device=q.device)
    else:
        local = _qsa_scores(q, kbar_shard, 2 * v_local, ratio=2, **paged)
    return qsa_select(
        local,
        pos,
        group=group,
        offset=offset,
        total_blocks=total_blocks,
        ratio=ratio,
        k_blocks=k_blocks,
        order=order,
        nan=nan,
        page_table=page_table,
        page_size=page_size,
        # seq_ids also name the key pages; without page_table they map no slots.
        seq_ids=None if page_table is None and key_page_table is not None else seq_ids,
        shard_sizes=shard_sizes,
    )
