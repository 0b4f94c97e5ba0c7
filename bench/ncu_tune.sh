#!/usr/bin/env bash
# Tuning run on the GPU machine: device_run's tune mode over FS_TUNE variants,
# then Nsight Compute over the prefill kernels (throughput, scheduler and
# warp-stall sections) and the single-row kernels' durations.
# Carry target/release/examples/device_run. Logs go to $OUT.
set -u
OUT=${OUT:-/tmp/flashsel-tune}
mkdir -p "$OUT"
export FLASHSEL_CACHE_DIR=/tmp/fscache
DR=target/release/examples/device_run
echo "=== tune: $FS_TUNE (shapes ${FS_SHAPES:-all})"
timeout "${TUNE_TIMEOUT:-300}" $DR none tune >"$OUT/tune.log" 2>&1
echo "rc=$?"; grep -E "^(TUNE|TRAP)" "$OUT/tune.log"
[ -n "${SKIP_NCU:-}" ] && exit 0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for sh in 3 4; do
    echo "=== ncu prefill, tune shape $sh ($NCU)"
    FS_TUNE="${NCU_VARIANT:-FS_PF_NEXT=0}" FS_SHAPES=$sh timeout 150 "$NCU" --clock-control none \
        -k regex:'fs_scan_' -c 1 --section SpeedOfLight --section SchedulerStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        $DR none tune >"$OUT/ncu-prefill-$sh.log" 2>&1
    echo "rc=$?"; grep -E "fs_scan|Duration|Throughput|Issue Slots|Issued Warp|No Eligible|Active Warps|Eligible Warps|Stall|Achieved Occ|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu-prefill-$sh.log" | head -60
done
for sh in 0 1 2; do
    echo "=== ncu single rows, tune shape $sh"
    FS_TUNE="${NCU_VARIANT:-FS_PF_NEXT=0}" FS_SHAPES=$sh timeout 100 "$NCU" --clock-control none \
        -k regex:'fs_(prep|split)' -c 4 --metrics gpu__time_duration.sum,sm__cycles_active.max,launch__grid_size \
        $DR none tune >"$OUT/ncu-single-$sh.log" 2>&1
    echo "rc=$?"; grep -E "fs_(prep|split)|gpu__time|sm__cycles|grid_size" "$OUT/ncu-single-$sh.log" | head -24
done
