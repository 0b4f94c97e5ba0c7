"""The GPU-free parts of bench/peers.py (contract reference, tie-aware check,
report writers) and bench/plot_peers.py, on fake data."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _ref import KINDS, make, ref_topk

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


peers = load("peers")


@pytest.mark.parametrize("kind", KINDS)
def test_reference_row_matches_contract(kind):
    rng = np.random.default_rng(1)
    x = make(kind, 3, 900, np.float32, rng)
    for k in [1, 17, 450, 900, 1000]:
        want, _ = ref_topk(x, k)
        for r in range(3):
            got = peers.reference_row(x[r], k)
            np.testing.assert_array_equal(got, want[r, : min(k, 900)], err_msg=f"{kind} k={k}")


def test_classify_row():
    row = np.array([5.0, 0.0, 0.0, 3.0, 0.0, -0.0, 1.0], np.float32)
    want = peers.reference_row(row, 4)  # 0, 3, 6, then the first tied zero: 1
    np.testing.assert_array_equal(want, [0, 3, 6, 1])
    assert peers.classify_row(np.array([0, 3, 6, 1]), want, row) == "exact"
    assert peers.classify_row(np.array([3, 0, 6, 1]), want, row) == "order differs"
    assert peers.classify_row(np.array([0, 3, 6, 4]), want, row) == "set differs (ties)"
    assert peers.classify_row(np.array([0, 3, 6, 5]), want, row) == "set differs (ties)"  # -0.0 == +0.0
    assert peers.classify_row(np.array([0, 3, 1, 2]), want, row) == "set differs"
    assert peers.classify_row(np.array([0, 3, 6, 6]), want, row) == "invalid"
    assert peers.classify_row(np.array([0, 3, 6, 7]), want, row) == "invalid"
    assert peers.classify_row(np.array([0, 3, 6]), want, row) == "invalid"
    assert peers.worst(["exact", "set differs (ties)", "order differs"]) == "set differs (ties)"


def fake_doc():
    results = []
    for rows, cols, k in peers.SHAPES:
        for dtype in peers.DTYPES:
            for data in peers.DATA:
                for impl, scale in [("flashsel", 1.0), ("torch.topk", 2.5), ("flashinfer.top_k", None)]:
                    t = None if scale is None else scale * (5 + cols * rows / 2e5)
                    results.append(
                        dict(rows=rows, cols=cols, k=k, dtype=dtype, data=data, impl=impl, median_us=t,
                             graph_us=t / 2 if (t and rows == 1) else None, iters=100,
                             check=None if t is None else ("exact" if impl == "flashsel" else "set differs (ties)"),
                             error=None if t else "RuntimeError: not supported")
                    )
    meta = dict(device="Fake GPU", torch="0.0", cuda="0.0", flashsel="0.1.0", date="today", host="here",
                mode="full", budget_s=0.1)
    return dict(meta=meta, implementations=["flashsel", "torch.topk", "flashinfer.top_k"],
                unavailable={"sgl_kernel.fast_topk_v2": "ModuleNotFoundError: No module named 'sgl_kernel'"},
                results=results)


def test_markdown(tmp_path):
    doc = fake_doc()
    peers.write_outputs(doc, tmp_path)
    md = (tmp_path / "peers.md").read_text()
    assert "| 1 x 65536 | 2048 | f32 | normal |" in md
    assert "(2.50x)" in md and "n/a (RuntimeError: not supported)" in md
    assert "sgl_kernel.fast_topk_v2" in md and "set differs (ties)" in md
    assert json.loads((tmp_path / "peers.json").read_text())["meta"]["device"] == "Fake GPU"


def test_plot_script(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "peers.json"
    src.write_text(json.dumps(fake_doc()))
    out = tmp_path / "out.png"
    r = subprocess.run([sys.executable, str(BENCH / "plot_peers.py"), str(src), str(out)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_peers_without_gpu_exits_cleanly(tmp_path):
    """Here (no torch or no GPU) the script says why and exits 2, no traceback."""
    r = subprocess.run([sys.executable, str(BENCH / "peers.py"), str(tmp_path / "o"), "--quick"],
                       capture_output=True, text=True)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        pytest.skip("a GPU is present: the real run is bench/peers.py's job")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "torch" in r.stdout


def test_context_parallel_cpu_smoke(tmp_path):
    """bench/context_parallel.py's --cpu mode: three gloo ranks on CPU
    tensors, every rank's ids equal to one process's (exit 0, the table)."""
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(BENCH / "context_parallel.py"), str(tmp_path / "o"), "--cpu",
                        "--ranks", "3"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "o" / "context_parallel.md").read_text()
    assert table.count("| yes |") == 2 and "NO" not in table
