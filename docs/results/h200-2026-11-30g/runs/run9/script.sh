export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
FS_SHAPES=0,1 FS_EXTRA="1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x1048576k2048,1x1048576k2048,1x524288k1024" FS_TUNE=";FS_GRID_MAXIMA_BOUND=1;FS_GRID_MAXIMA_BOUND=1,FS_GRID_SAMPLE_TAIL=1e-5;;FS_GRID_MAXIMA_BOUND=1;FS_GRID_MAXIMA_BOUND=1,FS_GRID_SAMPLE_TAIL=1e-5" timeout 130 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{printf "%s %s %s\n", $2, $6, $7}' | sed 's/FS_GRID_//g; s/MAXIMA_BOUND=1/MB/; s/SAMPLE_TAIL=//' | paste -d' ' - - - - - -
grep -c "ok=false" $OUT/tune.log
FLASHSEL_NVRTC_DEFINES=FS_GRID_MAXIMA_BOUND=1 timeout 70 .carry/flashsel check --quick --seed 49049 > $OUT/check-mb.log 2>&1; ts "check MB rc=$?"; grep -E "cases run|FAIL" $OUT/check-mb.log | head -5
FLASHSEL_NVRTC_DEFINES=FS_GRID_MAXIMA_BOUND=1 timeout 60 .carry/device_run none time > $OUT/time-mb.log 2>&1; ts "time MB rc=$?"; grep -E "TIME|bandwidth|again" $OUT/time-mb.log | cut -c1-110
