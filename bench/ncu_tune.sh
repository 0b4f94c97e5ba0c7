#!/usr/bin/env bash
# Tuning run on the GPU machine: device_run's tune mode over FS_TUNE variants
# (FS_SHAPES picks shapes), then Nsight Compute: per-instruction warp samples
# of the prefill kernel (tune shapes 3 and 4, f32 and bf16) and the durations
# of the single rows' kernels (shapes 0-2). Carry target/release/examples/device_run.
# Logs go to $OUT; map a ncu-source-N.csv to source lines here with
#   cargo run --release -p flashsel --example kres -- sm_90a "" /tmp/k.cubin
#   nvdisasm -c -g /tmp/k.cubin > /tmp/k.sass
#   python3 bench/ncu_by_line.py ncu-source-3.csv /tmp/k.sass fs_scan_f32
# (NCU_VARIANT: the FS_TUNE the profiles run, default the committed kernels;
# its defines must match the cubin disassembled.)
set -u
OUT=${OUT:-/tmp/flashsel-tune}
mkdir -p "$OUT"
export FLASHSEL_CACHE_DIR=/tmp/fscache
DR=target/release/examples/device_run
echo "=== tune: ${FS_TUNE:-FS_PROFILE=1} (shapes ${FS_SHAPES:-all})"
timeout "${TUNE_TIMEOUT:-300}" $DR none tune >"$OUT/tune.log" 2>&1
echo "rc=$?"; grep -E "^(TUNE|TRAP|BUCKET|GRID)" "$OUT/tune.log"
[ -n "${SKIP_NCU:-}" ] && exit 0
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for sh in 3 4; do
    echo "=== ncu prefill, tune shape $sh ($NCU): per-instruction warp samples"
    FS_TUNE="${NCU_VARIANT:-}" FS_SHAPES=$sh timeout 200 "$NCU" --clock-control none -k regex:'fs_scan_' -c 1 \
        --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
        $DR none tune >"$OUT/ncu-source-$sh.csv" 2>"$OUT/ncu-source-$sh.err"
    echo "rc=$?"; gzip -f "$OUT/ncu-source-$sh.csv"
done
for sh in 0 1 2; do
    echo "=== ncu single rows, tune shape $sh"
    FS_TUNE="${NCU_VARIANT:-}" FS_SHAPES=$sh timeout 100 "$NCU" --clock-control none \
        -k regex:'fs_(grid|prep|split)' -c 4 --metrics gpu__time_duration.sum,sm__cycles_active.max,launch__grid_size \
        $DR none tune >"$OUT/ncu-single-$sh.log" 2>&1
    echo "rc=$?"; grep -E "fs_(grid|prep|split)|gpu__time|sm__cycles|grid_size" "$OUT/ncu-single-$sh.log" | head -24
done
