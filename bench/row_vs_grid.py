#!/usr/bin/env python3
"""Where one row should leave the row path for the grid path: a single row's
time on the planner's choice (the grid path past the fit) against the row
path's one-row latency, measured as 264 rows of the same width (one CTA a
row, two a SM: every CTA runs at once, so the batch takes about one row's
time) and as 132 rows.

    python bench/row_vs_grid.py [--k 512]

CUDA-graph replays of 10 calls, medians, f32 and bf16, widths from 12K to
128K columns. The planner's boundary (plan::plan's grid choice for a single
row) was set when rows under 16 tiles could not be sampled on the row path;
v33 samples from 4 tiles, so this is the measurement that moves it.
"""

from __future__ import annotations

import argparse
import json

from stage_peers import time_graph  # the same graph-replay timing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=512)
    args = ap.parse_args()
    import torch

    import flashsel

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)

    def t_graph(fn) -> float:
        return round(time_graph(torch, fn, iters=15, calls=10), 2)

    flashsel.backends()  # the engine and its kernels, before any capture
    for dt in (torch.float32, torch.bfloat16):
        for w in (12_288, 16_384, 24_576, 32_768, 49_152, 65_536, 131_072):
            one = torch.randn((1, w), generator=g, device=dev).to(dt)
            many = torch.randn((264, w), generator=g, device=dev).to(dt)
            row = {
                "dtype": str(dt).removeprefix("torch."),
                "cols": w,
                "one_row_planned": t_graph(lambda: flashsel.topk(one, args.k)),
                "264_rows_row_path": t_graph(lambda: flashsel.topk(many, args.k)),
                "132_rows_row_path": t_graph(lambda: flashsel.topk(many[:132], args.k)),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
