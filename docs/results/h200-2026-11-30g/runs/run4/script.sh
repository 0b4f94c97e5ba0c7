export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
FS_SHAPES=0,1 FS_EXTRA="1x262144k512" FS_TUNE=";FS_IFETCH_TEST=1;FS_IFETCH_TEST=2;;FS_IFETCH_TEST=1;FS_IFETCH_TEST=2;FS_PROFILE=1;FS_PROFILE=1,FS_IFETCH_TEST=1;FS_PROFILE=1,FS_IFETCH_TEST=2" timeout 200 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $6, $7, $8}'
grep -E "^GRID " $OUT/tune.log | sed -e 's/per row (CTA 0, ns): passes 1.00 (sampled: resolved 223 fell back 0)//' | cut -c1-330
