export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 150 .carry/flashsel check --quick --seed 9009 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -20
FS_SHAPES=0,1,6,7 FS_TUNE="FS_GRID_SAMPLE=0;;FS_GRID_SAMPLE=0;;FS_PROFILE=1,FS_GRID_SAMPLE=0;FS_PROFILE=1" timeout 200 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $5, $6, $7, $8, $9}'
grep -E "^GRID |^TRAP|^GRIDTRAP" $OUT/tune.log | cut -c1-400
timeout 120 .carry/device_run none time > $OUT/time.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-130
