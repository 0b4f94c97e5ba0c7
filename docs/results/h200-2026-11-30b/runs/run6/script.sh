export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
FS_SHAPES=3,4 FS_TUNE="FS_SAMPLE_SD=2.5;FS_SAMPLE_SD=2;;FS_SAMPLE_SD=2.5;FS_SAMPLE_SD=2;" timeout 120 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $4, $5, $6, $7, $8}'
mkdir -p $OUT/s && OUT=$OUT/s SKIP_PEERS=1 SKIP_SAN=1 SKIP_CHECK=1 SKIP_PORTABLE=1 SKIP_TIME=1 PYTEST_TIMEOUT=170 bash bench/device_session.sh 2>&1 | grep -v "WARN"
FLASHSEL_NVRTC_DEFINES=FS_SAMPLE_SD=2.5 timeout 70 .carry/device_run none time > $OUT/time-sd25.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time-sd25.log | grep "8192\|bandw" | cut -c1-130
FLASHSEL_NVRTC_DEFINES=FS_SAMPLE_SD=2.5 timeout 60 .carry/flashsel check --quick --seed 47 > $OUT/check-sd25.log 2>&1; echo "check rc=$?"; grep "cases run" $OUT/check-sd25.log
