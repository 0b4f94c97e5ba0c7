export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
FS_SHAPES=0,1 FS_EXTRA="1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x1048576k2048,1x1048576k2048" FS_TUNE=";FS_GRID_WAIT_FIRST=1;FS_GRID_RANK_TREE=1;FS_GRID_WAIT_FIRST=1,FS_GRID_RANK_TREE=1;;FS_GRID_WAIT_FIRST=1;FS_GRID_RANK_TREE=1;FS_GRID_WAIT_FIRST=1,FS_GRID_RANK_TREE=1" timeout 400 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{printf "%s %s %s\n", $2, $6, $7}' | sed 's/FS_GRID_//g' | paste -d' ' - - - - - - - -
grep -c "ok=false" $OUT/tune.log
