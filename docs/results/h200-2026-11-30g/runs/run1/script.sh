export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p target/release/examples $OUT/x && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 100 .carry/flashsel check --quick --seed 41041 > $OUT/check.log 2>&1; ts "check rc=$?"; grep -E "cases run|FAIL|chain" $OUT/check.log | head -12
FLASHSEL_NVRTC_DEFINES=FS_GRID_SCORE_T=1 timeout 70 .carry/flashsel check --quick --seed 42042 > $OUT/x/check-scoreT.log 2>&1; ts "check scoreT rc=$?"; grep -E "cases run|FAIL" $OUT/x/check-scoreT.log | head -5
FS_SHAPES=0,1 FS_EXTRA="1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x1048576k2048,1x1048576k2048,1x131072k2048,1x524288k1024" FS_TUNE=";FS_GRID_SCORE_T=1;;FS_GRID_SCORE_T=1;FS_PROFILE=1" timeout 220 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
grep -E "^GRID " $OUT/tune.log | cut -c1-400 | head -12
timeout 80 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth|again" $OUT/time.log | cut -c1-150
timeout 40 "$SAN" --tool memcheck --leak-check no .carry/device_run small > $OUT/x/memcheck.log 2>&1; ts "memcheck rc=$?"; grep -E "ERROR SUMMARY|SMALL" $OUT/x/memcheck.log | tail -2
(cd $OUT && tar czf extra.tgz x && rm -rf x); ls -la $OUT
