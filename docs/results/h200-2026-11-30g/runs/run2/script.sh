export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p target/release/examples $OUT/x && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
timeout 100 .carry/flashsel check --quick --seed 43043 > $OUT/check.log 2>&1; ts "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -12
FLASHSEL_NVRTC_DEFINES=FS_GRID_SAMPLE_TOPS_MIN=2 timeout 70 .carry/flashsel check --quick --seed 44044 > $OUT/x/check-tops2.log 2>&1; ts "check tops2 rc=$?"; grep -E "cases run|FAIL" $OUT/x/check-tops2.log | head -5
FS_SHAPES=0,1 FS_EXTRA="1x262144k512,1x262144k512,1x262144k512,1x262144k512,1x1048576k2048,1x1048576k2048,1x131072k2048,1x524288k1024" FS_TUNE=";FS_GRID_PLACE_SPLIT=1;FS_GRID_SAMPLE_TOPS_MIN=2;FS_GRID_SAMPLE_TOPS_MIN=3;;FS_GRID_PLACE_SPLIT=1;FS_GRID_SAMPLE_TOPS_MIN=2;FS_PROFILE=1;FS_PROFILE=1,FS_GRID_PLACE_SPLIT=1" timeout 300 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $4, $5, $6, $7, $8}'
grep -E "^GRID " $OUT/tune.log | sed -e 's/per row (CTA 0, ns): passes 1.00 (sampled: resolved 223 fell back 0)//' | cut -c1-330
timeout 80 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth|again" $OUT/time.log | cut -c1-110
(cd $OUT && tar czf extra.tgz x && rm -rf x); ls -la $OUT
