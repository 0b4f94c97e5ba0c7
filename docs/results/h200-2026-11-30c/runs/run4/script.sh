export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
FS_SHAPES=0,1,6 FS_TUNE=";FS_PROFILE=1" timeout 100 .carry/device_run none tune > $OUT/tune-grid.log 2>&1; echo "tune rc=$?"
grep -E "^(TUNE|GRID)" $OUT/tune-grid.log | cut -c1-400
FS_SHAPES=2,3,4,5 FS_TUNE=";FS_SAMPLE_SD=2.5;;FS_SAMPLE_SD=2.5" timeout 150 .carry/device_run none tune > $OUT/tune-sd.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune-sd.log | awk '{print $2, $4, $5, $6, $7, $8, $9}'
timeout 100 .carry/device_run none time > $OUT/time.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-130
timeout 100 .carry/flashsel check --quick --seed 4004 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run" $OUT/check.log
