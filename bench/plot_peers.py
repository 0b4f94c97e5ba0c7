#!/usr/bin/env python3
"""Plot peers.json (written by bench/peers.py): time vs columns, log-log, one
line per implementation and batch size (the marker gives k); one panel per
dtype and data kind.

    python bench/plot_peers.py peers.json out.png

Needs matplotlib (only this script and the optional plot of peers.py do).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

STYLES = ["-", "--", ":", "-.", (0, (6, 1.5)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3))]
MARKERS = {512: "o", 2048: "s"}


def plot(doc: dict, out_png: str) -> str:
    """Writes the plot; returns a one-line summary. Raises ImportError when
    matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in doc.get("results", []) if r.get("median_us") is not None]
    panels = sorted({(r["dtype"], r["data"]) for r in results})
    if not panels:
        panels = [("f32", "normal")]
    impls = sorted({r["impl"] for r in results}, key=lambda n: (n != "flashsel", n))
    colors = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(impls)}
    all_rows = sorted({r["rows"] for r in results})
    style_of_rows = {rows: STYLES[i % len(STYLES)] for i, rows in enumerate(all_rows)}

    ncols = min(2, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 5.2 * nrows), squeeze=False)
    for ax, (dtype, data) in zip(axes.flat, panels):
        lines = defaultdict(list)
        for r in results:
            if (r["dtype"], r["data"]) == (dtype, data):
                lines[(r["impl"], r["rows"])].append((r["cols"], r["k"], r["median_us"]))
        for (impl, rows), pts in sorted(lines.items(), key=lambda kv: (kv[0][0] != "flashsel", kv[0])):
            pts.sort()
            width = 2.2 if impl == "flashsel" else 1.3
            ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle=style_of_rows[rows], color=colors[impl],
                    linewidth=width, label=f"{impl}, rows={rows}")
            for cols, k, t in pts:
                ax.plot([cols], [t], marker=MARKERS.get(k, "^"), color=colors[impl], linestyle="none")
        ks = sorted({r["k"] for r in results})
        for k in ks:  # marker legend entries
            ax.plot([], [], marker=MARKERS.get(k, "^"), color="gray", linestyle="none", label=f"k={k}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("columns")
        ax.set_ylabel("median time per call (us, CUDA events)")
        ax.set_title(f"{dtype}, {data}")
        ax.grid(True, which="both", alpha=0.3)
        if lines:
            ax.legend(fontsize=7, ncol=1)
        else:
            ax.text(0.5, 0.5, "no timings", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    meta = doc.get("meta", {})
    fig.suptitle(
        f"top-k selection on {meta.get('device', '?')}: flashsel {meta.get('flashsel', '?')}, "
        f"torch {meta.get('torch', '?')}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return f"{out_png}: {len(panels)} panels, {len(results)} timings, {len(impls)} implementations"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        doc = json.load(f)
    try:
        print(plot(doc, argv[2]))
    except ImportError as e:
        print(f"matplotlib is not importable ({e}); no plot written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
