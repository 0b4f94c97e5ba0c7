#!/usr/bin/env bash
# Sparse MLA (issue 23) on the GPU machine, through the device tool over a
# copy of the tree with these built here and carried: target/release/flashsel,
# target/release/flashsel-dev, python/dist/*.whl (installed into /tmp/site).
#   1. warm-up compile of every module (the SparseMla module's ptxas lines)
#   2. `flashsel check --only mla` (CHECK=--quick for the quick suite)
#   3. the same on the portable build forced on this GPU (FLASHSEL_ARCH=sm_90;
#      SKIP_PORTABLE=1 skips it)
#   4. compute-sanitizer memcheck (and racecheck) over `flashsel-dev small`,
#      which ends with the sparse MLA small cases (SKIP_SAN=1 skips it)
#   5. the Python GPU tests of sparse MLA when the file exists (SKIP_PY=1)
#   6. `flashsel bench --only mla` when the group exists (SKIP_BENCH=1)
# Logs go to $OUT (at the end: mla-session.tgz with all of them, beside
# check-mla.log and bench-mla.log).
set -u
OUT=${OUT:-/tmp/flashsel-mla}
mkdir -p "$OUT"
export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step() { echo "=== $1"; }

step "warm-up compile"
timeout 120 target/release/flashsel kernels >"$OUT/kernels.log" 2>&1
echo "rc=$?"; grep -E "attention/sparse_mla|loaded" "$OUT/kernels.log" | tail -20
step "flashsel check --only mla ${CHECK:-}"
timeout "${CHECK_TIMEOUT:-400}" target/release/flashsel check --only mla ${CHECK:-} --seed 3 >"$OUT/check-mla.log" 2>&1
echo "rc=$?"; grep -E "FAIL|cases run" "$OUT/check-mla.log" | head -40
if [ -z "${SKIP_PORTABLE:-}" ]; then
    step "portable build (FLASHSEL_ARCH=sm_90): flashsel check --only mla --quick"
    FLASHSEL_ARCH=sm_90 timeout 300 target/release/flashsel check --only mla --quick --seed 5 >"$OUT/check-mla-sm90.log" 2>&1
    echo "rc=$?"; grep -E "FAIL|cases run" "$OUT/check-mla-sm90.log" | head -20
fi
if [ -z "${SKIP_SAN:-}" ]; then
    step "memcheck (flashsel-dev small, sparse MLA cases last)"
    timeout "${SAN_TIMEOUT:-300}" "$SAN" --tool memcheck --leak-check no target/release/flashsel-dev small >"$OUT/memcheck.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|SMALL|FAIL" "$OUT/memcheck.log" | tail -5
    step "racecheck"
    timeout "${SAN_TIMEOUT:-300}" "$SAN" --tool racecheck target/release/flashsel-dev small >"$OUT/racecheck.log" 2>&1
    echo "rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|SMALL" "$OUT/racecheck.log" | tail -3
fi
if [ -z "${SKIP_PY:-}" ] && [ -f python/tests/test_cuda_mla.py ]; then
    step "python sparse MLA GPU tests"
    python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
    (cd /tmp && timeout "${PYTEST_TIMEOUT:-200}" python3 -m pytest -p no:cacheprovider -q -rs --timeout 180 \
        "$OLDPWD/python/tests/test_cuda_mla.py" >"$OUT/pytest-mla.log" 2>&1)
    echo "rc=$?"; tail -6 "$OUT/pytest-mla.log"
fi
if [ -z "${SKIP_BENCH:-}" ] && target/release/flashsel bench --help 2>/dev/null | grep -q mla; then
    step "flashsel bench --only mla"
    timeout 300 target/release/flashsel bench --backend cuda --only mla --json "$OUT/bench-mla.json" >"$OUT/bench-mla.log" 2>&1
    echo "rc=$?"; grep -E "^mla|cases" "$OUT/bench-mla.log"
fi
( cd "$OUT" && tar czf /tmp/mla-session.tgz --exclude=mla-session.tgz . && mv /tmp/mla-session.tgz . \
    && find . -type f ! -name mla-session.tgz ! -name check-mla.log ! -name bench-mla.log ! -name memcheck.log -delete )
echo "=== $OUT: $(ls "$OUT" | tr '\n' ' ')"
