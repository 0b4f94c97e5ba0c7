export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 75 .carry/flashsel check --quick --seed 26026 > $OUT/check.log 2>&1; ts "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -10
FLASHSEL_NVRTC_DEFINES=gridchunk=2048 timeout 30 .carry/flashsel check --quick --seed 27027 > $OUT/check-gridchunk2048.log 2>&1; ts "check gridchunk=2048 rc=$?"; grep -E "cases run|FAIL" $OUT/check-gridchunk2048.log | head -10
timeout 20 "$SAN" --tool memcheck --leak-check no .carry/device_run small > $OUT/memcheck.log 2>&1; ts "memcheck rc=$?"; grep -E "ERROR SUMMARY|SMALL" $OUT/memcheck.log | tail -2
timeout 20 "$SAN" --tool racecheck .carry/device_run small > $OUT/racecheck.log 2>&1; ts "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|SMALL" $OUT/racecheck.log | tail -2
FS_SHAPES=0,1,8 FS_TUNE=";FS_GRID_BOUND_WARP0=0;gridchunk=2048;;FS_GRID_BOUND_WARP0=0;gridchunk=2048;FS_PROFILE=1" timeout 90 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
grep -E "^GRID " $OUT/tune.log | cut -c1-560
timeout 60 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-150
