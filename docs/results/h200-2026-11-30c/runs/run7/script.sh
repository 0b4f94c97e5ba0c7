export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
timeout 100 .carry/flashsel check --quick --seed 5005 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head
timeout 120 .carry/flashsel bench --backend cuda --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"; grep -E "^64x|^8192|^4096|cases" $OUT/bench.log | cut -c1-150
FS_SHAPES=2,3,4 FS_TUNE=";FS_RESCUE_SD=0;;FS_RESCUE_SD=0" timeout 120 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $4, $5, $6, $7, $8, $9}'
timeout 100 .carry/device_run none time > $OUT/time.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-130
mkdir -p $OUT/s && OUT=$OUT/s SKIP_PEERS=1 SKIP_SAN=1 SKIP_CHECK=1 SKIP_TIME=1 SKIP_PORTABLE=1 PYTEST_TIMEOUT=150 bash bench/device_session.sh 2>&1 | grep -v "WARN" | grep -v "^\s*[0-9.]* us"
