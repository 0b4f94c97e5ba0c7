export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
timeout 150 .carry/flashsel check --quick --seed 12012 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -20
FS_SHAPES=0,1,6,7 FS_TUNE="FS_GRID_SAMPLE=0;;FS_GRID_SPEC_LIST=0;FS_GRID_SAMPLE=0;;FS_GRID_SPEC_LIST=0;FS_PROFILE=1" timeout 250 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $5, $6, $7, $8, $9}'
grep -E "^GRID |^GRIDTRAP" $OUT/tune.log | cut -c1-420
FLASHSEL_NVRTC_DEFINES=FS_GRID_SPEC_CAP_MAX=64 timeout 150 .carry/flashsel check --quick --seed 12013 > $OUT/check-cap64.log 2>&1; echo "check cap64 rc=$?"; grep -E "cases run|FAIL" $OUT/check-cap64.log | head -20
