#!/usr/bin/env bash
# One GPU-machine session, run through the device tool over a copy of the tree
# with these built here and carried: target/release/flashsel,
# target/release/flashsel-dev (crates/flashsel-dev), python/dist/*.whl.
#   1. the Python package's GPU tests (torch CUDA tensors, streams, graphs)
#      and bench/py_overhead.py (host time per call; SKIP_PY=1 skips both)
#   2. bench/peers.py: flashsel beside torch.topk on the standard shapes
#      (SKIP_PEERS=1 skips it)
#   3. compute-sanitizer memcheck and racecheck over a subset of the check cases
#      (SKIP_SAN=1 skips them when they already ran on the same kernels)
#   4. `flashsel check` (every path, adversarial data, CPU parity; CHECK=--quick
#      for the quick suite; SKIP_CHECK=1 skips it)
#   5. the same check on the portable build forced on this GPU
#      (FLASHSEL_ARCH=sm_90; SKIP_PORTABLE=1 skips it)
#   6. `flashsel-dev time`: the target shapes (SKIP_TIME=1 skips them)
#   7. `flashsel bench --backend cuda`, the main job, with the token rows
#      (SKIP_BENCH=1 skips it), then bench/stage_peers.py (the selection stage
#      against plain torch; SKIP_PEERS=1 skips it too)
#   8. bench/row_vs_grid.py: the single-row grid/row boundary's measurement
#      (SKIP_ROWGRID=1 skips it)
# Logs and results go to $OUT (at the end: session.tgz with all of them, plus
# time.log, check.log and peers.md). Each step has its own time limit.
set -u
OUT=${OUT:-/tmp/flashsel-session}
mkdir -p "$OUT"
export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step() { echo "=== $1"; }

step "warm-up compile"
timeout 60 target/release/flashsel kernels 2>&1 | tail -1
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
if [ -z "${SKIP_PY:-}" ]; then
    step "python GPU tests"
    (cd /tmp && timeout "${PYTEST_TIMEOUT:-150}" python3 -m pytest -p no:cacheprovider -q -rs --timeout 120 \
        "$OLDPWD/python/tests/test_cuda.py" "$OLDPWD/python/tests/test_torch_cpu.py" >"$OUT/pytest.log" 2>&1)
    echo "rc=$?"; tail -4 "$OUT/pytest.log"
    step "python host time per call"
    for shape in "1 262144 512" "64 131072 2048"; do
        timeout 120 python3 bench/py_overhead.py $shape >>"$OUT/py_overhead.log" 2>&1
    done
    echo "rc=$?"; cat "$OUT/py_overhead.log"
fi
if [ -z "${SKIP_PEERS:-}" ]; then
    step "peers"
    timeout "${PEERS_TIMEOUT:-200}" python3 bench/peers.py "$OUT/peers" --budget "${PEERS_BUDGET:-0.25}" >"$OUT/peers.log" 2>&1
    echo "rc=$?"; tail -3 "$OUT/peers.log"
fi
if [ -z "${SKIP_SAN:-}" ]; then
    step "memcheck"
    timeout "${SAN_TIMEOUT:-150}" "$SAN" --tool memcheck --leak-check no target/release/flashsel-dev small >"$OUT/memcheck.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|SMALL" "$OUT/memcheck.log" | tail -3
    step "racecheck"
    timeout "${SAN_TIMEOUT:-150}" "$SAN" --tool racecheck target/release/flashsel-dev small >"$OUT/racecheck.log" 2>&1
    echo "rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|SMALL" "$OUT/racecheck.log" | tail -3
fi
step "flashsel check ${CHECK:-}"
[ -n "${SKIP_CHECK:-}" ] || timeout "${CHECK_TIMEOUT:-300}" target/release/flashsel check ${CHECK:-} --seed 3 >"$OUT/check.log" 2>&1
echo "rc=$?"; tail -2 "$OUT/check.log"
step "portable build (FLASHSEL_ARCH=sm_90): flashsel check --quick"
[ -n "${SKIP_PORTABLE:-}" ] || FLASHSEL_ARCH=sm_90 timeout 150 target/release/flashsel check --quick --seed 5 >"$OUT/check-sm90.log" 2>&1
echo "rc=$?"; tail -1 "$OUT/check-sm90.log"
step "timings (flashsel-dev time)"
[ -n "${SKIP_TIME:-}" ] || timeout 200 target/release/flashsel-dev time >"$OUT/time.log" 2>&1
echo "rc=$?"; grep -E "TIME|bandwidth" "$OUT/time.log"
step "flashsel bench --backend cuda"
[ -n "${SKIP_BENCH:-}" ] || timeout 300 target/release/flashsel bench --backend cuda --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
echo "rc=$?"; grep -E "^(select|qsa|dsa)|cases" "$OUT/bench.log"
step "the selection stage against plain torch (bench/stage_peers.py)"
[ -n "${SKIP_PEERS:-}" ] || timeout 200 python3 bench/stage_peers.py "$OUT/stage" >"$OUT/stage_peers.log" 2>&1
echo "rc=$?"; tail -8 "$OUT/stage_peers.log"
step "the single-row grid/row boundary (bench/row_vs_grid.py)"
[ -n "${SKIP_ROWGRID:-}" ] || timeout 120 python3 bench/row_vs_grid.py >"$OUT/row_vs_grid.log" 2>&1
echo "rc=$?"; cat "$OUT/row_vs_grid.log"
# The device tool returns at most 8 files: everything goes into one archive,
# and the summaries most often read stay beside it.
( cd "$OUT" && tar czf /tmp/session.tgz --exclude=session.tgz . && mv /tmp/session.tgz . \
    && find . -type f ! -name session.tgz ! -name time.log ! -name check.log ! -name bench.log ! -name peers.md ! -name py_overhead.log ! -name stage_peers.log ! -name row_vs_grid.log -delete \
    && { [ ! -f peers/peers.md ] || mv peers/peers.md .; } && find . -mindepth 1 -type d -empty -delete )
echo "=== $OUT: $(ls "$OUT" | tr '\n' ' ')"
