#!/usr/bin/env bash
# The short-row path's GPU session (bench/device_session.sh's conventions), run
# through the device tool over a copy of the tree with target/release/flashsel
# and target/release/flashsel-dev built here and carried. Steps (STEPS picks
# them, default all; the whole takes ~8 minutes, so two calls of
# STEPS="san check" and STEPS="time bench" fit the 10-minute limit):
#   san    compute-sanitizer memcheck and racecheck over `flashsel-dev small`
#          (the short-row cases among them: plain rows with lengths at the
#          edges, both orders, unaligned strides, k past cols, ranges with
#          slots, a QSA first chunk)
#   check  `flashsel check ${CHECK---quick}` (every path; each short-row case
#          runs again with the short path off, the row path, and both must
#          give the CPU's bytes; CHECK= for the full suite with the
#          8192-row first chunks) and the portable build's quick check
#          (FLASHSEL_ARCH=sm_90)
#   time   `flashsel-dev short`: QSA's first 8192-token chunk (ratio 4, k 512,
#          V 0 .. 2,048) and plain top-k 8192 x 2048 k 512 with the same
#          lengths, bf16 and f32, both orders, the short path off (before:
#          the row path) and on (after), each verified against the CPU
#          engine; then 8192 x 2048 without lengths, 8192 x 8192 k 2048,
#          1024 x 8192 ReLU-few and 1 x 8192, off and on
#   bench  `flashsel bench --backend cuda --only qsa-prefill` with
#          FLASHSEL_SHORT=0 (before) and the default (after): the first
#          chunk's row (target <= 40 us) beside the deep chunk's (unchanged)
# Logs go to $OUT (at the end: session.tgz with all of them, plus the
# summaries short.log, check.log and bench-*.log beside it).
set -u
OUT=${OUT:-/tmp/flashsel-shortrow}
mkdir -p "$OUT"
export FLASHSEL_CACHE_DIR=/tmp/fscache
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
STEPS=${STEPS:-san check time bench}
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
step() { echo "=== $1"; }

step "warm-up compile"
timeout 90 target/release/flashsel kernels 2>&1 | tail -1
timeout 30 target/release/flashsel plan --rows 8192 --cols 2048 --k 512 --dtype bf16 2>&1 | head -12
if want san; then
    step "memcheck (flashsel-dev small)"
    timeout "${SAN_TIMEOUT:-120}" "$SAN" --tool memcheck --leak-check no target/release/flashsel-dev small >"$OUT/memcheck.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|SMALL|FAIL" "$OUT/memcheck.log" | tail -5
    step "racecheck (flashsel-dev small)"
    timeout "${SAN_TIMEOUT:-150}" "$SAN" --tool racecheck target/release/flashsel-dev small >"$OUT/racecheck.log" 2>&1
    echo "rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|SMALL|FAIL" "$OUT/racecheck.log" | tail -5
fi
if want check; then
    step "flashsel check ${CHECK---quick}"
    timeout "${CHECK_TIMEOUT:-240}" target/release/flashsel check ${CHECK---quick} --seed 3 >"$OUT/check.log" 2>&1
    echo "rc=$?"; grep -ciE "short" "$OUT/check.log" | sed 's/^/short-path lines: /'; grep -E "FAIL" "$OUT/check.log" | head -5; tail -2 "$OUT/check.log"
    step "portable build (FLASHSEL_ARCH=sm_90): flashsel check --quick"
    FLASHSEL_ARCH=sm_90 timeout 150 target/release/flashsel check --quick --seed 5 >"$OUT/check-sm90.log" 2>&1
    echo "rc=$?"; grep -E "FAIL" "$OUT/check-sm90.log" | head -3; tail -1 "$OUT/check-sm90.log"
fi
if want time; then
    step "timings: short path off / on (flashsel-dev short)"
    timeout "${TIME_TIMEOUT:-200}" target/release/flashsel-dev short >"$OUT/short.log" 2>&1
    echo "rc=$?"; grep -E "SHORT|TIME|MISMATCH" "$OUT/short.log"
fi
if want bench; then
    for mode in off on; do
        step "flashsel bench --only qsa-prefill (short path $mode)"
        if [ $mode = off ]; then export FLASHSEL_SHORT=0; else unset FLASHSEL_SHORT; fi
        timeout "${BENCH_TIMEOUT:-120}" target/release/flashsel bench --backend cuda --only qsa-prefill \
            --json "$OUT/bench-$mode.json" >"$OUT/bench-$mode.log" 2>&1
        echo "rc=$?"; grep -E "^qsa|cases|MISMATCH" "$OUT/bench-$mode.log"
    done
    unset FLASHSEL_SHORT
fi
# The device tool returns at most 8 files: everything goes into one archive,
# and the summaries most often read stay beside it.
( cd "$OUT" && tar czf /tmp/session.tgz --exclude=session.tgz . && mv /tmp/session.tgz . \
    && find . -type f ! -name session.tgz ! -name short.log ! -name check.log ! -name 'bench-o*.log' -delete \
    && find . -mindepth 1 -type d -empty -delete )
echo "=== $OUT: $(ls "$OUT" | tr '\n' ' ')"
