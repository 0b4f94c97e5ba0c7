#!/usr/bin/env python3
"""Context-parallel QSA indexer (issue 24's benchmark): the block keys of
each sequence sharded over the ranks of a torch.distributed group, every
rank running flashsel.distributed.qsa_indexer, against one GPU holding the
whole row.

    torchrun --nproc-per-node N bench/context_parallel.py OUTDIR [--quick]
    python bench/context_parallel.py OUTDIR --cpu --ranks 3     # CPU smoke test (gloo)

Cases: 1 query x 1,048,576 tokens and 16 queries x 1M (one sequence each,
bf16 keys [NB, 128], bf16 q [T, 4, 128], k_blocks 512, ratio 4, each query
at its window's last position; 16 sequences: a paged cache of 64-token
pages on every rank, the rank's block range of every sequence, KV slots
out through the global page table). Each rank
holds a contiguous 1 / N of the blocks; `shard_sizes` is passed, so a call
makes no host synchronisation and is timed as CUDA graph replays (median
replay / calls). Per case, rank 0 reports: the distributed call, the two
all-gathers alone (the candidates' ids and value bytes, the same sizes the
call moves), the single-GPU flashsel.qsa_indexer on the whole keys (rank 0's
device), their ratio, and whether every rank's ids equal the single GPU's
(checked on every rank against rank 0's broadcast result). Targets (4
H200s): the 16-query row <= 0.35 x one GPU, the communication <= 15 us.

Writes OUTDIR/context_parallel.md (rank 0). NCCL's NVLink multicast stays
off (NCCL_NVLS_ENABLE=0 is set here if absent), as the device notes ask.
The --cpu mode runs the same code on CPU tensors with gloo at small sizes
and checks the bytes only (no timing): what this machine without GPUs can
run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402


def log(msg: str) -> None:
    print(f"[context_parallel {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def time_graph(torch, fn, iters: int = 20, calls: int = 10) -> float:
    """Median us per call of `calls` calls captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(times)


def make_case(torch, rows: int, tokens: int, dev, seed: int, quick_d: int = 128):
    """q [rows, 4, d], per sequence keys [NB, d] (bf16 on CUDA, f32 on CPU),
    positions at each window's last token."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    nb = tokens // 4
    q = torch.randn((rows, 4, quick_d), generator=g).to(dt).to(dev)
    keys = torch.randn((rows, nb, quick_d), generator=g).to(dt).to(dev)
    pos = torch.full((rows,), tokens - 1, dtype=torch.int64).to(dev)
    return q, keys, pos, nb


def paged(torch, keys_rows, per_page: int):
    """A paged cache of `keys_rows` [S, n, d]: every sequence's pages in
    order, page s * pages + j; its table [S, pages]."""
    s, n, d = keys_rows.shape
    pages = n // per_page
    cache = keys_rows.reshape(s * pages, per_page, d).contiguous()
    table = torch.arange(s * pages, dtype=torch.int32, device=keys_rows.device).reshape(s, pages)
    return cache, table


def run(args) -> int:
    import torch
    import torch.distributed as dist

    import flashsel
    from flashsel import distributed as fd

    cpu = args.cpu
    rank, world = dist.get_rank(), dist.get_world_size()
    if cpu:
        dev = torch.device("cpu")
    else:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    if cpu:
        cases = [(1, 8192), (5, 8192)]
    elif args.quick:
        cases = [(1, 1 << 18), (16, 1 << 18)]
    else:
        cases = [(1, 1 << 20), (16, 1 << 20)]
    lines = []
    ok_all = True
    for rows, tokens in cases:
        q, keys, pos, nb = make_case(torch, rows, tokens, dev, seed=rows)
        k_blocks = 512 if not cpu else 64
        per_page = 16  # 64-token pages, ratio 4
        sizes = [((nb // per_page) * (r + 1) // world - (nb // per_page) * r // world) * per_page for r in range(world)]
        sizes[-1] += nb - sum(sizes)
        off = sum(sizes[:rank])
        n = sizes[rank]
        kw = dict(offset=off, total_blocks=nb, k_blocks=k_blocks, shard_sizes=sizes)
        if rows == 1:
            shard = keys[0, off : off + n].contiguous()

            def call():
                return fd.qsa_indexer(q, shard, pos, **kw)

            def whole():
                return flashsel.qsa_indexer(q, keys[0], pos, k_blocks=k_blocks)

        else:
            if n % per_page:
                raise SystemExit("shards must be page-aligned")
            cache_r, table_r = paged(torch, keys[:, off : off + n].contiguous(), per_page)
            cache, table = paged(torch, keys, per_page)
            seq = torch.arange(rows, dtype=torch.int32, device=dev)

            # Slots out through the global table, as the single GPU writes them.
            def call():
                return fd.qsa_indexer(q, cache_r, pos, seq_ids=seq, key_page_table=table_r, page_table=table, **kw)

            def whole():
                return flashsel.qsa_indexer(q, cache, pos, k_blocks=k_blocks, page_table=table, seq_ids=seq)

        got_ids, got_counts = call()
        # The single-GPU bytes: rank 0 computes them and broadcasts.
        if rank == 0:
            want_ids, want_counts = whole()
        else:
            want_ids, want_counts = torch.empty_like(got_ids), torch.empty_like(got_counts)
        dist.broadcast(want_ids, 0)
        dist.broadcast(want_counts, 0)
        same = bool(torch.equal(got_ids, want_ids) and torch.equal(got_counts, want_counts))
        flags = torch.tensor([int(same)], dtype=torch.int32, device=dev)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        exact = bool(flags.item())
        ok_all &= exact
        name = f"{rows} x {tokens:,} tokens over {world} ranks"
        if cpu:
            lines.append(f"| {name} | - | - | - | - | {'yes' if exact else 'NO'} |")
            continue
        t_call = time_graph(torch, call)
        # The communication alone: the same two all-gathers the call makes.
        ids = torch.zeros((rows, k_blocks), dtype=torch.int32, device=dev)
        vals = torch.zeros((rows, k_blocks * 4), dtype=torch.uint8, device=dev)
        g_ids = torch.empty((world, rows, k_blocks), dtype=torch.int32, device=dev)
        g_vals = torch.empty((world, rows, k_blocks * 4), dtype=torch.uint8, device=dev)

        def comm():
            dist.all_gather_into_tensor(g_ids.view(-1), ids.view(-1))
            dist.all_gather_into_tensor(g_vals.view(-1), vals.view(-1))

        t_comm = time_graph(torch, comm)
        t_one = time_graph(torch, whole) if rank == 0 else 0.0
        ratio = t_call / t_one if t_one else float("nan")
        lines.append(f"| {name} | {t_call:.1f} | {t_comm:.1f} | {t_one:.1f} | {ratio:.3f} | {'yes' if exact else 'NO'} |")
        dist.barrier()
    if rank == 0:
        head = (
            "| case | distributed qsa_indexer (us) | the all-gathers alone (us) | one GPU, whole keys (us) "
            "| ratio | every rank = one GPU |\n|---|---|---|---|---|---|"
        )
        text = head + "\n" + "\n".join(lines) + "\n"
        print(text)
        if args.outdir:
            os.makedirs(args.outdir, exist_ok=True)
            with open(os.path.join(args.outdir, "context_parallel.md"), "w") as f:
                f.write(text)
    return 0 if ok_all else 1


def _cpu_rank(rank: int, world: int, init: str, argv: list[str]) -> None:
    import torch.distributed as dist

    args = parse(argv)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        code = run(args)
    finally:
        dist.destroy_process_group()
    if code:
        raise SystemExit(code)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", nargs="?", default=None)
    p.add_argument("--quick", action="store_true", help="256K tokens instead of 1M")
    p.add_argument("--cpu", action="store_true", help="CPU tensors over gloo, small sizes, bytes only")
    p.add_argument("--ranks", type=int, default=2, help="--cpu: how many processes")
    return p.parse_args(argv)


def main() -> int:
    argv = sys.argv[1:]
    args = parse(argv)
    if args.cpu:
        import tempfile

        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as d:
            mp.spawn(_cpu_rank, args=(args.ranks, "file://" + os.path.join(d, "rdv"), argv), nprocs=args.ranks)
        return 0
    import torch.distributed as dist

    dist.init_process_group("nccl")
    try:
        return run(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
