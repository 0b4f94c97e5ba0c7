#!/usr/bin/env bash
# Context-parallel selection's GPU session (issue 24) on one GPU, run through
# the device tool in the repository root over a copy of the tree with these
# built here and carried: target/release/flashsel, target/release/shard-time
# and python/dist/*.whl (installed to /tmp/site here).
#   1. `flashsel check --quick --only select`, then the full suite: the
#      select, QSA and indexer cases and, last, the shard-merge cases
#      (ops/shard/check.rs: simulated ranks merged on the GPU, byte for byte
#      against the CPU engine on the whole row; SKIP_CHECK=1 skips)
#   2. shard-time: the GPU merge of 1 and 16 x 1,048,576 columns sharded
#      over 2/4/8 simulated ranks (k = 2048), a rank's local selection and
#      one device on the whole row, each merge verified (SKIP_BENCH=1)
#   3. python/tests/test_distributed.py: world-size-1 NCCL and the GPU merge
#      of simulated shards on CUDA tensors; the gloo CPU ranks
#      (SKIP_PY=1)
# Multi-GPU (NCCL over 2-8 ranks) needs a multi-GPU kind: not here.
# Logs go to $OUT.
set -u
OUT=${OUT:-/tmp/flashsel-shard}
mkdir -p "$OUT"
export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
step() { echo "=== $1"; }

step "warm-up compile"
timeout 120 target/release/flashsel kernels 2>&1 | tail -2
if [ -z "${SKIP_CHECK:-}" ]; then
    step "flashsel check --quick --only select (shard cases last)"
    timeout 240 target/release/flashsel check --quick --only select >"$OUT/check-quick.log" 2>&1
    echo "rc=$?"; grep -E "shard merge|FAIL|fail|passed|cases" "$OUT/check-quick.log" | tail -30
    step "flashsel check --only select (full)"
    timeout "${CHECK_TIMEOUT:-420}" target/release/flashsel check --only select >"$OUT/check-full.log" 2>&1
    echo "rc=$?"; grep -E "FAIL|fail|passed|cases" "$OUT/check-full.log" | tail -20
fi
if [ -z "${SKIP_BENCH:-}" ]; then
    step "shard-time"
    timeout 240 target/release/shard-time >"$OUT/shard-time.log" 2>&1
    echo "rc=$?"; cat "$OUT/shard-time.log"
fi
if [ -z "${SKIP_PY:-}" ]; then
    step "python: test_distributed.py"
    python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
    (cd /tmp && timeout 300 python3 -m pytest -p no:cacheprovider -q -rs "$OLDPWD/python/tests/test_distributed.py" \
        >"$OUT/pytest-distributed.log" 2>&1)
    echo "rc=$?"; tail -25 "$OUT/pytest-distributed.log"
fi
