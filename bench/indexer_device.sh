#!/usr/bin/env bash
# The QSA indexer's GPU session (issue 22), run through the device tool in the
# repository root over a copy of the tree with these built here and carried:
# target/release/flashsel and python/dist/*.whl (installed to /tmp/site here).
#   1. the Python GPU tests of the indexer: python/tests/test_cuda_indexer.py
#      (bytes equal to the CPU engine, paged keys, device values, CUDA graphs,
#      torch.compile) and the CPU-side torch operator tests
#      (test_torch_indexer.py, test_indexer.py); SKIP_PY=1 skips them
#   2. `flashsel bench --backend cuda --only indexer`: issue 22's rows and seed
#      003's depths, each verified against the CPU engine (SKIP_BENCH=1)
#   3. the same rows on the portable build forced on this GPU
#      (FLASHSEL_ARCH=sm_90: plain sm_90, no sm_90a features; --iters 20;
#      SKIP_PORTABLE=1)
#   4. bench/stage_peers.py --only-indexer: flashsel.qsa_indexer beside the
#      plain-torch pipeline in one process (SKIP_PEERS=1)
# Logs go to $OUT (indexer.tgz holds all of them; the summaries stay beside
# it). Each step has its own time limit.
set -u
OUT=${OUT:-/tmp/flashsel-indexer}
mkdir -p "$OUT"
export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
step() { echo "=== $1"; }

step "warm-up compile"
timeout 90 target/release/flashsel kernels 2>&1 | tail -1
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
python3 -c 'import flashsel, torch; print("flashsel", flashsel.__file__, "torch", torch.__version__, flashsel.backends()["cuda"]["available"])'
if [ -z "${SKIP_PY:-}" ]; then
    step "python: test_cuda_indexer.py, test_torch_indexer.py, test_indexer.py"
    TO=$(python3 -c 'import pytest_timeout' 2>/dev/null && echo "--timeout 150" || echo "")
    (cd /tmp && timeout "${PYTEST_TIMEOUT:-300}" python3 -m pytest -p no:cacheprovider -q -rs $TO \
        "$OLDPWD/python/tests/test_cuda_indexer.py" "$OLDPWD/python/tests/test_torch_indexer.py" \
        "$OLDPWD/python/tests/test_indexer.py" >"$OUT/pytest-indexer.log" 2>&1)
    echo "rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/pytest-indexer.log" | tail -25
fi
if [ -z "${SKIP_BENCH:-}" ]; then
    step "flashsel bench --backend cuda --only indexer"
    timeout "${BENCH_TIMEOUT:-240}" target/release/flashsel bench --backend cuda --only indexer \
        --json "$OUT/bench-indexer.json" >"$OUT/bench-indexer.log" 2>&1
    echo "rc=$?"; grep -E "^(flashsel|indexer |floor|GB/s)|cases|failed|  indexer" "$OUT/bench-indexer.log"
fi
if [ -z "${SKIP_PORTABLE:-}" ]; then
    step "portable build (FLASHSEL_ARCH=sm_90): flashsel bench --only indexer --iters 20"
    FLASHSEL_ARCH=sm_90 timeout "${PORTABLE_TIMEOUT:-180}" target/release/flashsel bench --backend cuda \
        --only indexer --iters 20 >"$OUT/bench-indexer-sm90.log" 2>&1
    echo "rc=$?"; grep -E "^indexer |cases|failed" "$OUT/bench-indexer-sm90.log"
fi
if [ -z "${SKIP_PEERS:-}" ]; then
    step "the indexer against plain torch (bench/stage_peers.py --only-indexer)"
    timeout "${PEERS_TIMEOUT:-200}" python3 bench/stage_peers.py "$OUT/stage" --only-indexer >"$OUT/stage_indexer.log" 2>&1
    echo "rc=$?"; tail -12 "$OUT/stage_indexer.log"
fi
# The device tool returns at most 8 files: one archive, the summaries beside it.
( cd "$OUT" && tar czf /tmp/indexer.tgz --exclude=indexer.tgz . && mv /tmp/indexer.tgz . \
    && find . -type f ! -name indexer.tgz ! -name pytest-indexer.log ! -name bench-indexer.log \
        ! -name bench-indexer-sm90.log ! -name stage_indexer.log -delete \
    && find . -mindepth 1 -type d -empty -delete )
echo "=== $OUT: $(ls "$OUT" | tr '\n' ' ')"
