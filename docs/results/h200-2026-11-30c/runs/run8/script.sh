export FLASHSEL_CACHE_DIR=/tmp/fscache
FS_SHAPES=2 FS_TUNE=";FS_RESCUE_SD=0;;FS_RESCUE_SD=0;" timeout 80 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $4, $5, $6, $7, $8, $9}'
timeout 90 .carry/flashsel check --quick --seed 6006 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head
timeout 90 .carry/flashsel bench --backend cuda --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"; grep -E "^64x|cases" $OUT/bench.log | cut -c1-150
