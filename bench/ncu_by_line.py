#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by function and source line.

Input: the CSV of `ncu --section WarpStateStats --section SourceCounters
--page source --print-source sass --csv` (one kernel), and the SASS of the
same cubin disassembled with line info (`nvdisasm -c -g`, e.g. of the cubin
`flashsel-dev cubin sm_90a select/filter out.cubin` writes; profile the kernel
with `ncu --clock-control none ... flashsel-dev time`). Instructions are
matched by their offset from the kernel's first instruction.

Usage: ncu_by_line.py NCU.csv KERNEL.sass KERNEL_NAME [TOP]
"""
import collections
import csv
import re
import sys


def main():
    csv_path, sass_path, kernel = sys.argv[1:4]
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    hdr, data = None, []
    for r in csv.reader(open(csv_path)):
        if len(r) > 3 and r[0] == "Address":
            hdr = r
        elif hdr and len(r) == len(hdr) and r[0].startswith("0x"):
            data.append(r)
    if not data:
        sys.exit("no per-instruction rows in " + csv_path)
    col = {h: i for i, h in enumerate(hdr)}
    samples = col["Warp Stall Sampling (All Samples)"]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    # Offset -> (function, source line) from the SASS listing of the kernel's section.
    where, sec, fn, line = {}, None, None, None
    for l in open(sass_path):
        m = re.match(r"\s*\.section\s+\.text\.([^,]+),", l)
        if m:
            sec, fn = m.group(1), m.group(1)
        m = re.search(r'//## File ".*", line (\d+)', l)
        if m:
            line = int(m.group(1))
        m = re.match(r"^(\S+):\s*$", l)
        if m and not m.group(1).startswith(".L"):
            fn = m.group(1)
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+\S", l)
        if m and sec == kernel:
            where[int(m.group(1), 16)] = (fn, line)
    base = int(data[0][0], 16)
    total = sum(int(r[samples]) for r in data)
    by_fn, by_line = collections.Counter(), collections.Counter()
    why = collections.defaultdict(collections.Counter)
    for r in data:
        f, ln = where.get(int(r[0], 16) - base, ("?", None))
        s = int(r[samples])
        by_fn[f] += s
        by_line[(f, ln)] += s
        for c in stalls:
            if r[col[c]] not in ("", "0"):
                why[(f, ln)][c[6:]] += int(r[col[c]])
    print(f"{kernel}: {len(data)} instructions, {total} warp samples")
    for f, s in by_fn.most_common():
        print(f"  {100 * s / total:5.1f}%  {f}")
    print("top lines (share of all samples; the three largest stall reasons there):")
    for (f, ln), s in by_line.most_common(top):
        reasons = ", ".join(f"{k} {100 * v / s:.0f}%" for k, v in why[(f, ln)].most_common(3))
        print(f"  {100 * s / total:5.1f}%  line {ln}  [{f}]  {reasons}")


if __name__ == "__main__":
    main()
