#!/usr/bin/env python3
"""flashsel.topk against the other GPU top-k implementations importable here.

    python bench/peers.py OUTDIR [--quick] [--budget S] [--only NAME,...]

Writes OUTDIR/peers.md (table), OUTDIR/peers.json (everything) and, when
matplotlib is importable, OUTDIR/peers.png (bench/plot_peers.py draws it;
it can be re-run on the JSON anywhere).

Implementations: flashsel.topk, torch.topk (sorted and unsorted), and, where
importable, flashinfer.top_k, sgl_kernel.fast_topk_v2 and vLLM's
top_k_per_row_prefill op. One that is missing is listed with the reason; one
that fails on a case gets "n/a" with the reason and the run goes on.

Every implementation's answer is checked against the flashsel contract on
sampled rows (a NumPy reference in this file, independent of flashsel):
  exact               the same indices in the same order (order="score")
  order differs       the same index set, another order
  set differs (ties)  another index set, but only among equal scores (e.g.
                      which of the tied zeros of a ReLU plateau): the same
                      multiset of values
  set differs         a different multiset of values: a wrong answer
  invalid             out-of-range or repeated indices, or the wrong count
The worst row decides a case's status; nothing is hidden.

Timing: CUDA events around each call, median over as many calls as fit the
time budget after warm-up (so host launch overhead counts where the GPU
would wait for it). For single rows, also CUDA graphs of 20 calls, replayed:
median replay time / 20 (launch overhead removed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

SHAPES = [
    # rows, cols, k
    (1, 65_536, 2048),
    (1, 262_144, 512),
    (1, 262_144, 2048),
    (1, 1_048_576, 512),
    (1, 1_048_576, 2048),
    (64, 131_072, 2048),
    (128, 262_144, 512),
    (4096, 65_536, 2048),
    (8192, 131_072, 2048),
    (8192, 32_768, 512),
]
QUICK_SHAPES = [(1, 65_536, 2048), (1, 1_048_576, 2048), (64, 131_072, 2048), (8192, 32_768, 512)]
DTYPES = ["f32", "bf16"]
DATA = ["normal", "relu-plateau"]
SAMPLE_ROWS = 8
GRAPH_CALLS = 20

STATUS_RANK = {"exact": 0, "order differs": 1, "set differs (ties)": 2, "set differs": 3, "invalid": 4}


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------
# The contract reference and the check (pure NumPy: testable without a GPU)
# ---------------------------------------------------------------------------


def contract_keys(row: np.ndarray) -> np.ndarray:
    """float64 keys whose order is the contract's (nan="lowest"): -0.0 equals
    +0.0, NaN ranks below -inf."""
    with np.errstate(invalid="ignore"):
        v = row.astype(np.float64)
    nan = np.isnan(v)
    v[v == -np.inf] = -np.finfo(np.float64).max  # below every f32/bf16, above NaN
    v[nan] = -np.inf
    v[v == 0] = 0.0
    return v


def reference_row(row: np.ndarray, k: int) -> np.ndarray:
    """The contract's top-k of one row, best first (key desc, index asc), in
    O(n): the k-th key by partition, then the ties at it by lowest index."""
    keys = contract_keys(row)
    n = keys.shape[0]
    k = min(k, n)
    if k == 0:
        return np.zeros(0, np.int64)
    kth = np.partition(keys, n - k)[n - k]
    above = np.flatnonzero(keys > kth)
    ties = np.flatnonzero(keys == kth)[: k - above.shape[0]]
    sel = np.concatenate([above, ties])
    return sel[np.lexsort((sel, -keys[sel]))]


def classify_row(got: np.ndarray, want: np.ndarray, row: np.ndarray) -> str:
    """Status of one row's answer `got` (indices, any integer dtype) against
    the reference `want` (best first) for scores `row`."""
    got = np.asarray(got, dtype=np.int64).ravel()
    n = row.shape[0]
    if got.shape != want.shape or np.any(got < 0) or np.any(got >= n) or np.unique(got).shape[0] != got.shape[0]:
        return "invalid"
    if np.array_equal(got, want):
        return "exact"
    if np.array_equal(np.sort(got), np.sort(want)):
        return "order differs"
    keys = contract_keys(row)
    if np.array_equal(np.sort(keys[got]), np.sort(keys[want])):
        return "set differs (ties)"
    return "set differs"


def worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: STATUS_RANK[s]) if statuses else "unchecked"


# ---------------------------------------------------------------------------
# Report writers (pure: testable without a GPU)
# ---------------------------------------------------------------------------


def fmt_us(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def write_markdown(doc: dict, path: Path) -> None:
    meta = doc["meta"]
    results = doc["results"]
    impls = [n for n in doc["implementations"]]
    cases = []
    for r in results:
        c = (r["rows"], r["cols"], r["k"], r["dtype"], r["data"])
        if c not in cases:
            cases.append(c)
    by = {(r["rows"], r["cols"], r["k"], r["dtype"], r["data"], r["impl"]): r for r in results}

    lines = [
        "# flashsel vs other top-k implementations",
        "",
        f"- device: {meta['device']}; torch {meta['torch']}; CUDA {meta['cuda']}; flashsel {meta['flashsel']}",
        f"- date: {meta['date']}; host: {meta['host']}; mode: {meta['mode']}; "
        f"time budget per measurement: {meta['budget_s']} s",
        "- time: median of CUDA-event timings per call (us), after warm-up; "
        "ratio = implementation time / flashsel time (above 1: flashsel is faster)",
        f"- check: on up to {SAMPLE_ROWS} sampled rows against the contract reference "
        "(`exact`, `order differs`, `set differs (ties)`, `set differs`, `invalid`; see bench/peers.py)",
        "",
    ]
    if doc["unavailable"]:
        lines.append("Not importable or not usable here:")
        lines.append("")
        for name, why in doc["unavailable"].items():
            lines.append(f"- `{name}`: {why}")
        lines.append("")

    def cell(r: dict | None, field: str, base: float | None) -> str:
        if r is None:
            return "-"
        t = r.get(field)
        if t is None:
            why = r.get("error") or ("not measured" if field == "graph_us" else "n/a")
            return f"n/a ({why[:80]})" if r.get("error") else "n/a"
        s = f"{fmt_us(t)}"
        if r["impl"] != "flashsel" and base:
            s += f" ({t / base:.2f}x)"
        return s

    header = "| rows x cols | k | dtype | data | " + " | ".join(impls) + " |"
    sep = "|---|---|---|---|" + "---|" * len(impls)
    lines += ["## Median time per call (us), CUDA events", "", header, sep]
    for c in cases:
        base_r = by.get(c + ("flashsel",))
        base = base_r.get("median_us") if base_r else None
        cells = [cell(by.get(c + (n,)), "median_us", base) for n in impls]
        lines.append(f"| {c[0]} x {c[1]} | {c[2]} | {c[3]} | {c[4]} | " + " | ".join(cells) + " |")
    single = [c for c in cases if c[0] == 1]
    if single:
        lines += [
            "",
            f"## Single rows: CUDA graph of {GRAPH_CALLS} calls, median replay / {GRAPH_CALLS} (us)",
            "",
            header,
            sep,
        ]
        for c in single:
            base_r = by.get(c + ("flashsel",))
            base = base_r.get("graph_us") if base_r else None
            cells = [cell(by.get(c + (n,)), "graph_us", base) for n in impls]
            lines.append(f"| {c[0]} x {c[1]} | {c[2]} | {c[3]} | {c[4]} | " + " | ".join(cells) + " |")
    lines += ["", "## Check against the contract (worst sampled row)", "", header, sep]
    for c in cases:
        cells = []
        for n in impls:
            r = by.get(c + (n,))
            cells.append("-" if r is None else (r.get("check") or "n/a"))
        lines.append(f"| {c[0]} x {c[1]} | {c[2]} | {c[3]} | {c[4]} | " + " | ".join(cells) + " |")
    errors = [r for r in results if r.get("error")]
    if errors:
        lines += ["", "## Failures", ""]
        for r in errors:
            lines.append(
                f"- {r['impl']} on {r['rows']} x {r['cols']} k={r['k']} {r['dtype']} {r['data']}: {r['error']}"
            )
    lines += ["", f"Plot: {meta.get('plot', 'not written')}", ""]
    path.write_text("\n".join(lines))


def write_outputs(doc: dict, outdir: Path) -> None:
    (outdir / "peers.json").write_text(json.dumps(doc, indent=1))
    write_markdown(doc, outdir / "peers.md")


# ---------------------------------------------------------------------------
# GPU side
# ---------------------------------------------------------------------------


def make_impls(torch, flashsel_mod, flashsel_err):
    """name -> fn(x, k) returning indices [rows, k] on the device; and
    name -> reason for those that cannot run here."""
    impls, unavailable = {}, {}
    if flashsel_mod is not None:
        impls["flashsel"] = lambda x, k: flashsel_mod.topk(x, k)
    else:
        unavailable["flashsel"] = flashsel_err
    impls["torch.topk"] = lambda x, k: torch.topk(x, k, dim=-1).indices
    impls["torch.topk(sorted=False)"] = lambda x, k: torch.topk(x, k, dim=-1, sorted=False).indices

    try:
        import flashinfer

        fi_top_k = flashinfer.top_k
        impls["flashinfer.top_k"] = lambda x, k: fi_top_k(x, k)[1]
    except Exception as e:
        unavailable["flashinfer.top_k"] = f"{type(e).__name__}: {e}"

    try:
        import sgl_kernel

        fast = sgl_kernel.fast_topk_v2
        lens_cache = {}

        def sgl(x, k):
            key = (x.shape[0], x.shape[1], x.device)
            if key not in lens_cache:
                lens_cache[key] = torch.full((x.shape[0],), x.shape[1], dtype=torch.int32, device=x.device)
            return fast(x, lens_cache[key], k)

        impls["sgl_kernel.fast_topk_v2"] = sgl
    except Exception as e:
        unavailable["sgl_kernel.fast_topk_v2"] = f"{type(e).__name__}: {e}"

    try:
        import vllm._C  # noqa: F401  (registers torch.ops._C)

        op = torch.ops._C.top_k_per_row_prefill
        cache = {}

        def vllm_topk(x, k):
            key = (x.shape[0], x.shape[1], x.device)
            if key not in cache:
                rows = x.shape[0]
                cache[key] = (
                    torch.zeros(rows, dtype=torch.int32, device=x.device),
                    torch.full((rows,), x.shape[1], dtype=torch.int32, device=x.device),
                )
            starts, ends = cache[key]
            out = torch.empty((x.shape[0], k), dtype=torch.int32, device=x.device)
            op(x, starts, ends, out, x.shape[0], x.stride(0), x.stride(1), k)
            return out

        impls["vllm.top_k_per_row_prefill"] = vllm_topk
    except Exception as e:
        unavailable["vllm.top_k_per_row_prefill"] = f"{type(e).__name__}: {e}"
    return impls, unavailable


def make_data(torch, rows, cols, k, dtype, kind, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float32, generator=g)
    if kind == "relu-plateau":
        # About k/2 positive scores per row, the rest exactly 0: the k-th place
        # falls inside a plateau of tied zeros, as after a ReLU.
        from statistics import NormalDist

        t = NormalDist().inv_cdf(1 - min(0.5, k / (2 * cols)))
        x = torch.relu(x - t)
    return x.to(torch.bfloat16 if dtype == "bf16" else torch.float32)


def median_event_us(torch, call, budget_s: float, lo: int, hi: int) -> tuple[float, int]:
    """Median us of `call` between CUDA events, over as many calls as fit
    `budget_s` (lo..hi), and how many ran. The caller has warmed it up."""
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    iters = int(min(hi, max(lo, budget_s / one)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)), iters


def time_events(torch, fn, budget_s: float) -> tuple[float, int]:
    """Median us per call over as many calls as fit `budget_s` (10..1000)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return median_event_us(torch, fn, budget_s, 10, 1000)


def time_graph(torch, fn, budget_s: float) -> float:
    """Median us per call of a CUDA graph of GRAPH_CALLS calls, replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    median, _ = median_event_us(torch, g.replay, budget_s, 5, 500)
    del g
    return median / GRAPH_CALLS


def short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300] if msg else ''}"


def cuda_alive(torch) -> bool:
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def run(args) -> int:
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    try:
        import torch
    except Exception as e:
        log(f"torch is not importable ({e}); peers.py needs torch with CUDA")
        return 2
    if not torch.cuda.is_available():
        log("torch sees no CUDA device; peers.py needs a GPU")
        return 2
    try:
        import flashsel

        flashsel_mod, flashsel_err, flashsel_ver = flashsel, None, flashsel.__version__
        cuda_info = flashsel.backends()["cuda"]
        if not cuda_info["available"]:
            flashsel_err = f"flashsel CUDA engine unavailable: {cuda_info['reason']}"
            log(flashsel_err)
    except Exception as e:
        flashsel_mod, flashsel_err, flashsel_ver = None, f"import flashsel failed: {short_error(e)}", "n/a"
        log(flashsel_err)

    impls, unavailable = make_impls(torch, flashsel_mod, flashsel_err)
    if args.only:
        keep = set(args.only.split(","))
        impls = {n: f for n, f in impls.items() if n in keep}
    shapes = QUICK_SHAPES if args.quick else SHAPES
    budget = args.budget if args.budget is not None else (0.15 if args.quick else 0.6)
    doc = {
        "meta": {
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "flashsel": flashsel_ver,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "mode": "quick" if args.quick else "full",
            "budget_s": budget,
            "graph_calls": GRAPH_CALLS,
            "sample_rows": SAMPLE_ROWS,
        },
        "implementations": list(impls),
        "unavailable": unavailable,
        "results": [],
    }
    for name, why in unavailable.items():
        log(f"[skip] {name}: {why}")
    log(f"implementations: {', '.join(impls)}; {len(shapes)} shapes x {len(DTYPES)} dtypes x {len(DATA)} data")

    rng = np.random.default_rng(0)
    alive = True
    n_cases = len(shapes) * len(DTYPES) * len(DATA)
    case_no = 0
    t_start = time.perf_counter()
    for rows, cols, k in shapes:
        for dtype in DTYPES:
            for kind in DATA:
                case_no += 1
                if not alive:
                    break
                tag = f"[{case_no}/{n_cases}] {rows}x{cols} k={k} {dtype} {kind}"
                try:
                    x = make_data(torch, rows, cols, k, dtype, kind, seed=case_no)
                except Exception as e:
                    log(f"{tag}: data generation failed: {short_error(e)}")
                    for name in impls:
                        doc["results"].append(
                            dict(rows=rows, cols=cols, k=k, dtype=dtype, data=kind, impl=name, median_us=None,
                                 graph_us=None, iters=0, check=None, error=f"data: {short_error(e)}")
                        )
                    torch.cuda.empty_cache()
                    continue
                picks = [0, rows - 1, rows // 2] + [int(i) for i in rng.integers(0, rows, SAMPLE_ROWS)]
                sample = sorted(set(picks))[:SAMPLE_ROWS]
                host = x[sample].float().cpu().numpy()
                want = [reference_row(host[i], k) for i in range(len(sample))]
                for name, fn in impls.items():
                    rec = dict(rows=rows, cols=cols, k=k, dtype=dtype, data=kind, impl=name, median_us=None,
                               graph_us=None, iters=0, check=None, check_rows=None, error=None)
                    try:
                        got = fn(x, k)
                        torch.cuda.synchronize()
                        got_host = got[sample].cpu().numpy()
                        statuses = [classify_row(got_host[i], want[i], host[i]) for i in range(len(sample))]
                        rec["check"] = worst(statuses)
                        rec["check_rows"] = {s: statuses.count(s) for s in set(statuses)}
                        del got
                        rec["median_us"], rec["iters"] = time_events(torch, lambda fn=fn, x=x: fn(x, k), budget)
                        if rows == 1:
                            try:
                                rec["graph_us"] = time_graph(torch, lambda fn=fn, x=x: fn(x, k), budget)
                            except Exception as e:
                                rec["graph_error"] = short_error(e)
                                if not cuda_alive(torch):
                                    raise
                    except Exception as e:
                        rec["error"] = short_error(e)
                        if os.environ.get("PEERS_TRACEBACK"):
                            traceback.print_exc()
                        if not cuda_alive(torch):
                            alive = False
                            rec["error"] += " (the CUDA context is broken: stopping)"
                    doc["results"].append(rec)
                    g = f", graph {fmt_us(rec['graph_us'])} us" if rec["graph_us"] is not None else ""
                    if rec.get("graph_error"):
                        g = f", graph n/a ({rec['graph_error']})"
                    status = rec["error"] and f"n/a ({rec['error']})" or f"{fmt_us(rec['median_us'])} us{g}"
                    log(f"{tag} {name}: {status}; check: {rec['check']}")
                    if not alive:
                        break
                del x
                torch.cuda.empty_cache()
                write_outputs(doc, outdir)  # partial results survive a timeout
    doc["meta"]["elapsed_s"] = round(time.perf_counter() - t_start, 1)

    png = outdir / "peers.png"
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from plot_peers import plot

        log(plot(doc, str(png)))
        doc["meta"]["plot"] = "peers.png"
    except ImportError as e:
        doc["meta"]["plot"] = f"not written: matplotlib is not importable ({e})"
        log(doc["meta"]["plot"])
    except Exception as e:
        doc["meta"]["plot"] = f"not written: {short_error(e)}"
        log(doc["meta"]["plot"])
    write_outputs(doc, outdir)
    log(f"wrote {outdir / 'peers.md'} and {outdir / 'peers.json'} in {doc['meta']['elapsed_s']} s")
    return 0 if alive else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdir")
    p.add_argument("--quick", action="store_true", help="4 shapes, short timing budget")
    p.add_argument("--budget", type=float, default=None, help="seconds of timed calls per measurement")
    p.add_argument("--only", default=None, help="comma-separated implementation names")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
