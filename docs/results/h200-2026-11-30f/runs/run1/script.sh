export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 .carry/flashsel check --quick --seed 31031 > $OUT/check.log 2>&1; ts "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -10
FLASHSEL_NVRTC_DEFINES=FS_GRID_PLACE_PAIR=1 timeout 60 .carry/flashsel check --quick --seed 32032 > $OUT/check-pair.log 2>&1; ts "check pair rc=$?"; grep -E "cases run|FAIL" $OUT/check-pair.log | head -10
timeout 25 "$SAN" --tool memcheck --leak-check no .carry/device_run small > $OUT/memcheck.log 2>&1; ts "memcheck rc=$?"; grep -E "ERROR SUMMARY|SMALL" $OUT/memcheck.log | tail -2
timeout 25 "$SAN" --tool racecheck .carry/device_run small > $OUT/racecheck.log 2>&1; ts "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|SMALL" $OUT/racecheck.log | tail -2
FS_SHAPES=0,1,2,8,10 FS_TUNE=";FS_PDL_CHAIN=0;FS_PDL_CHAIN=1;FS_GRID_PLACE_PAIR=1024;FS_GRID_PLACE_PAIR=1;gridchunk=2048;;FS_PDL_CHAIN=0;FS_PDL_CHAIN=1;FS_GRID_PLACE_PAIR=1024;gridchunk=2048;FS_PROFILE=1;FS_PROFILE=1,FS_GRID_PLACE_PAIR=1024;FS_PROFILE=1,FS_PDL_CHAIN=0" timeout 260 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
grep -E "^GRID " $OUT/tune.log | cut -c1-600
timeout 70 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-150
