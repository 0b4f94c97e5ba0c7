export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
timeout 90 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth|again" $OUT/time.log | cut -c1-150
FS_SHAPES=0,1 FS_EXTRA="1x262144k512,1x262144k512,1x262144k512,1x1048576k2048,1x1048576k2048" FS_TUNE=";" timeout 100 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
