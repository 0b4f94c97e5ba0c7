#!/usr/bin/env python3
"""The selection stage's block and range selection, flashsel against the
plain-torch pipeline (mask, torch.topk, expand, gather), in one process on
one GPU.

    python bench/stage_peers.py OUTDIR [--quick]

Writes OUTDIR/stage_peers.md and OUTDIR/stage_peers.json.

Cases (issue 21's table):
  qsa decode   B x NB block scores (bf16), every row at the window's last
               position, k_blocks 512, ratio 4: ids [B, 2051] + counts.
  qsa prefill  8192 consecutive queries at positions 254K..262K (65,536
               blocks), and the first 8192-token chunk (V from 0 to 2,048).
  dsa ranges   64 rows x 131,072 f32 logits, causal ranges, top-2048 written
               to KV slots through a 64-token page table.
  indexer      the fused QSA indexer (issue 22's table): flashsel.qsa_indexer
               from the queries (bf16 [T, 4, 128]) and block keys against
               the torch pipeline of shared/baselines/selection-stage-torch-h200.md
               (scores by matmul / bmm + relu + sum over heads, mask,
               torch.topk, expand, gather through the page table): decode
               1 x 4,096 / 131,072 / 1,048,576 tokens (bf16 keys, and fp8
               e4m3 keys at 1M: torch upcasts them to bf16 first), 16 x 1M
               and 32 x 131,072 (a paged cache, one query per sequence, slots
               out), and the 8192-query prefill at positions 254K..262K.

The torch pipeline is what a user writes without special kernels: mask the
invisible columns with -inf, torch.topk, expand blocks to tokens (+ tail),
map through the page table with a gather. Its tie order differs from
flashsel's contract (ties to the lower index); it is timed, not compared.
flashsel's outputs are checked byte for byte against flashsel's CPU engine
on sampled rows.

Timing: decode cases (a few rows) as CUDA graph replays of 20 calls (median
replay / 20); prefill and DSA cases with CUDA events around each call
(median). Floors: bytes read once (the scores a row reads, the ids written)
at 4.4 TB/s; indexer: the key bytes read once at 4.4 TB/s (prefill: the
larger of that and the scoring FLOPs at 790 TFLOP/s bf16, the rate the
baseline measured on the H200).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

BW = 4.4e12  # bytes/s, the H200's HBM3e (baselines/selection-stage-torch-h200.md)
BF16_FLOPS = 790e12  # the dense bf16 rate the baseline measured on the H200
GRAPH_CALLS = 20


def log(msg: str) -> None:
    print(msg, flush=True)


def time_graph(torch, fn, iters: int = 30, calls: int = GRAPH_CALLS) -> float:
    """Median us of fn as CUDA-graph replays of `calls` calls (per call)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(ts)


def time_events(torch, fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(ts)


def torch_qsa(torch, scores, positions, ratio, k, width, table=None, seq_ids=None, page_size=64):
    """The plain-torch QSA selection: mask, topk, expand, tail, (gather)."""
    t, nb = scores.shape
    v = (positions + 1) // ratio
    cols = torch.arange(nb, device=scores.device)
    masked = scores.masked_fill(cols[None, :] >= v[:, None], float("-inf"))
    kk = min(k, nb)
    top = torch.topk(masked, kk, dim=1, sorted=False).indices
    causal = cols[None, :kk].expand(t, kk)
    blocks = torch.where((v > k)[:, None], top, causal)
    valid_b = torch.arange(kk, device=scores.device)[None, :] < torch.clamp(v, max=k)[:, None]
    toks = blocks[:, :, None] * ratio + torch.arange(ratio, device=scores.device)[None, None, :]
    toks = torch.where(valid_b[:, :, None], toks, -1).reshape(t, kk * ratio)
    tail = v[:, None] * ratio + torch.arange(ratio - 1, device=scores.device)[None, :]
    tail = torch.where(tail <= positions[:, None], tail, -1)
    ids = torch.cat([toks, tail], dim=1)
    if table is not None:
        safe = ids.clamp(min=0)
        pages = table[seq_ids[:, None].long(), (safe // page_size).long()]
        ids = torch.where(ids >= 0, pages * page_size + safe % page_size, -1)
    return ids


def torch_ranges(torch, logits, starts, ends, k, table, seq_ids, page_size):
    cols = torch.arange(logits.shape[1], device=logits.device)
    masked = logits.masked_fill((cols[None, :] < starts[:, None]) | (cols[None, :] >= ends[:, None]), float("-inf"))
    top = torch.topk(masked, k, dim=1, sorted=False).indices
    pages = table[seq_ids[:, None].long(), top // page_size]
    return pages * page_size + top % page_size


def check_qsa(flashsel, torch, scores, positions, got, sample, **kw):
    """flashsel's CUDA bytes against its CPU engine on `sample` rows."""
    rows = sorted(set(np.linspace(0, scores.shape[0] - 1, sample).astype(int).tolist()))
    s = scores[rows].cpu()
    p = positions[rows].cpu()
    extra = {}
    if kw.get("page_table") is not None:
        extra = {"page_table": kw["page_table"].cpu(), "seq_ids": kw["seq_ids"][rows].cpu()}
    want = flashsel.qsa_select(s, p, **extra)
    return bool(torch.equal(got[0][rows].cpu(), want[0]) and torch.equal(got[1][rows].cpu(), want[1]))


def torch_indexer_scores(torch, q, kbar):
    """The baseline's QSA scores: q [B, H, d] bf16, kbar [NB, d] (one
    sequence) or [B, NB, d] -> [B, NB] fp32 (tensor cores, fp32 accumulation)."""
    if kbar.dim() == 2:
        s = torch.matmul(kbar.unsqueeze(0), q.transpose(1, 2))  # [B, NB, H]
    else:
        s = torch.bmm(kbar, q.transpose(1, 2))
    return torch.relu(s.float()).sum(-1) * (1.0 / math.sqrt(q.shape[-1]))


def torch_prefill_scores(torch, q, kbar):
    """The baseline's prefill scores: [T * H, NB] products, relu, sum over heads."""
    t, h, d = q.shape
    s = torch.matmul(q.reshape(t * h, d), kbar.t())
    return torch.relu(s.float()).view(t, h, -1).sum(1) * (1.0 / math.sqrt(d))


def check_indexer(flashsel, torch, q, kbar, positions, got, rows, **kw):
    """flashsel's CUDA bytes against its CPU engine on the rows `rows` (the
    CPU engine on those rows only)."""
    extra = {}
    if kw.get("page_table") is not None:
        extra = {"page_table": kw["page_table"].cpu(), "seq_ids": kw["seq_ids"][rows].cpu()}
    k = kbar.cpu()
    want = flashsel.qsa_indexer(q[rows].cpu(), k, positions[rows].cpu(), **extra)
    return bool(torch.equal(got[0][rows].cpu(), want[0]) and torch.equal(got[1][rows].cpu(), want[1]))


def indexer_rows(torch, flashsel, g, dev, record, quick):
    """Issue 22's rows: flashsel.qsa_indexer against the torch pipeline."""
    ratio, k, d, heads, ps = 4, 512, 128, 4, 64
    width = k * ratio + ratio - 1
    fp8 = getattr(torch, "float8_e4m3fn", None)
    decode = [(1, 4096, "bf16"), (1, 131_072, "bf16"), (1, 1_048_576, "bf16"), (1, 1_048_576, "fp8"),
              (16, 1_048_576, "bf16"), (32, 131_072, "bf16")]  # fmt: skip
    if quick:
        decode = [(1, 131_072, "bf16"), (1, 131_072, "fp8"), (4, 131_072, "bf16")]
    for b, tokens, kd in decode:
        if kd == "fp8" and fp8 is None:
            continue
        nb = tokens // ratio
        q = torch.randn((b, heads, d), generator=g, device=dev).to(torch.bfloat16)
        keys = torch.randn((b, nb, d), generator=g, device=dev)
        keys = (keys * 8).to(fp8) if kd == "fp8" else keys.to(torch.bfloat16)
        pos = torch.full((b,), tokens - 1, dtype=torch.int32, device=dev)
        if b == 1:
            kbar, kw, tk = keys[0], {}, {}
        else:
            # One cache of b * max_pages pages, sequence s's pages in order
            # (the torch side reads the same bytes as [b, nb, d]).
            max_pages = tokens // ps
            kbar = keys.view(b * max_pages, ps // ratio, d)
            table = torch.arange(b * max_pages, dtype=torch.int32, device=dev).reshape(b, max_pages)
            seq_ids = torch.arange(b, dtype=torch.int32, device=dev)
            kw = {"page_table": table, "page_size": ps, "seq_ids": seq_ids}
            tk = {"table": table, "seq_ids": seq_ids, "page_size": ps}
        got = flashsel.qsa_indexer(q, kbar, pos, **kw)
        exact = check_indexer(flashsel, torch, q, kbar, pos, got, sorted({0, b - 1}), **kw)
        fs = time_graph(torch, lambda: flashsel.qsa_indexer(q, kbar, pos, **kw))
        tkeys = keys[0] if b == 1 else keys
        if kd == "fp8":

            def tq_fn():
                s = torch_indexer_scores(torch, q, tkeys.to(torch.bfloat16))
                return torch_qsa(torch, s, pos.long(), ratio, k, width, **tk)
        else:

            def tq_fn():
                s = torch_indexer_scores(torch, q, tkeys)
                return torch_qsa(torch, s, pos.long(), ratio, k, width, **tk)

        tq = time_graph(torch, tq_fn)
        key_bytes = b * nb * d * keys.element_size()
        form = "paged, slots" if b > 1 else "contiguous"
        record(f"indexer decode {b} x {tokens:,} tokens {kd} keys ({form})", fs, tq, key_bytes / BW * 1e6, exact, "graph")

    rows = 2048 if quick else 8192
    nb = 65_536
    q = torch.randn((rows, heads, d), generator=g, device=dev).to(torch.bfloat16)
    kbar = torch.randn((nb, d), generator=g, device=dev).to(torch.bfloat16)
    pos = torch.arange(ratio * nb - rows, ratio * nb, dtype=torch.int32, device=dev)
    got = flashsel.qsa_indexer(q, kbar, pos)
    sample = sorted(set(np.linspace(0, rows - 1, 8).astype(int).tolist()))
    exact = check_indexer(flashsel, torch, q, kbar, pos, got, sample)
    fs = time_events(torch, lambda: flashsel.qsa_indexer(q, kbar, pos), iters=10)
    tq = time_events(
        torch, lambda: torch_qsa(torch, torch_prefill_scores(torch, q, kbar), pos.long(), ratio, k, width), iters=5
    )
    v = (pos.long() + 1) // ratio
    scored = int(torch.where(v > k, v, 0).sum())
    floor = max(scored * d * 2 / BW, scored * heads * d * 2 / BF16_FLOPS) * 1e6
    record(f"indexer prefill {rows} x {nb:,} blocks (t {ratio * nb - rows}..{ratio * nb - 1}), scores + select",
           fs, tq, floor, exact, "events")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-indexer", action="store_true", help="leave out the indexer rows")
    ap.add_argument("--only-indexer", action="store_true", help="the indexer rows alone")
    args = ap.parse_args()
    import torch

    import flashsel

    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(21)
    results = []
    ratio, k = 4, 512
    width = k * ratio + ratio - 1

    def record(case, fs_us, torch_us, floor_us, exact, path):
        r = {
            "case": case,
            "flashsel_us": round(fs_us, 2),
            "torch_us": round(torch_us, 2),
            "floor_us": round(floor_us, 2),
            "speedup": round(torch_us / fs_us, 2),
            "exact": exact,
            "timing": path,
        }
        results.append(r)
        log(json.dumps(r))

    decode = [] if args.only_indexer else [(1, 262_144), (16, 262_144), (1, 16_384)]
    for b, nb in decode:
        scores = torch.randn((b, nb), generator=g, device=dev).to(torch.bfloat16)
        pos = torch.full((b,), nb * ratio + ratio - 2, dtype=torch.int32, device=dev)
        got = flashsel.qsa_select(scores, pos)
        exact = check_qsa(flashsel, torch, scores, pos, got, min(b, 4))
        fs = time_graph(torch, lambda: flashsel.qsa_select(scores, pos))
        tq = time_graph(torch, lambda: torch_qsa(torch, scores, pos.long(), ratio, k, width))
        floor = (b * nb * 2 + b * (width + 1) * 4) / BW * 1e6
        record(f"qsa decode {b} x {nb:,} blocks bf16", fs, tq, floor, exact, "graph")

    prefill_rows = 2048 if args.quick else 8192
    prefill = [
        ("qsa prefill, positions 254K..262K", 65_536, 262_144 - prefill_rows),
        ("qsa prefill, first chunk", 2048, 0),
    ]
    for name, nb, start in [] if args.only_indexer else prefill:
        scores = torch.randn((prefill_rows, nb), generator=g, device=dev).to(torch.bfloat16)
        pos = torch.arange(start, start + prefill_rows, dtype=torch.int32, device=dev)
        got = flashsel.qsa_select(scores, pos)
        exact = check_qsa(flashsel, torch, scores, pos, got, 16)
        fs = time_events(torch, lambda: flashsel.qsa_select(scores, pos))
        tq = time_events(torch, lambda: torch_qsa(torch, scores, pos.long(), ratio, k, width))
        v = (pos.long() + 1) // ratio
        read = int(torch.where(v > k, v, 0).sum()) * 2
        floor = (read + prefill_rows * (width + 1) * 4) / BW * 1e6
        record(f"{name} ({prefill_rows} x {nb:,} blocks bf16)", fs, tq, floor, exact, "events")

    if not args.only_indexer:
        rows, cols, kd, ps = 64, 131_072, 2048, 64
        logits = torch.randn((rows, cols), generator=g, device=dev)
        ends = torch.arange(cols - rows + 1, cols + 1, dtype=torch.int32, device=dev)
        starts = torch.zeros(rows, dtype=torch.int32, device=dev)
        max_pages = cols // ps + 1
        table = torch.randperm(rows * max_pages, generator=g, device=dev).to(torch.int32).reshape(rows, max_pages)
        seq_ids = torch.arange(rows, dtype=torch.int32, device=dev)
        slots = {"page_table": table, "page_size": ps, "seq_ids": seq_ids}
        got = flashsel.topk(logits, kd, lengths=ends, starts=starts, **slots)
        want = flashsel.topk(
            logits.cpu(), kd, lengths=ends.cpu(), starts=starts.cpu(), page_table=table.cpu(), page_size=ps,
            seq_ids=seq_ids.cpu(),
        )
        exact = bool(torch.equal(got.cpu(), want))
        fs = time_events(torch, lambda: flashsel.topk(logits, kd, lengths=ends, starts=starts, **slots))
        tq = time_events(torch, lambda: torch_ranges(torch, logits, starts, ends, kd, table, seq_ids, ps))
        floor = (int((ends - starts).sum()) * 4 + rows * kd * 4) / BW * 1e6
        record(f"dsa ranges {rows} x {cols:,} f32 k {kd}, to slots", fs, tq, floor, exact, "events")

    if not args.no_indexer:
        indexer_rows(torch, flashsel, g, dev, record, args.quick)

    (out / "stage_peers.json").write_text(json.dumps(results, indent=1))
    lines = ["| case | flashsel us | torch us | speedup | floor us | flashsel exact | timing |", "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['flashsel_us']} | {r['torch_us']} | {r['speedup']}x | {r['floor_us']} | "
            f"{r['exact']} | {r['timing']} |"
        )
    (out / "stage_peers.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
