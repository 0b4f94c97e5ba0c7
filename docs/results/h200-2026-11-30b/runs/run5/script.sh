export FLASHSEL_CACHE_DIR=/tmp/fscache
FS_SHAPES=2,3,4,5 FS_TUNE="FS_RUN_UNROLL=0;;FS_RUN_UNROLL=0;;FS_PROFILE=1" timeout 200 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $4, $5, $6, $7, $8}'
grep "PROFILE" $OUT/tune.log | grep "^TUNE" | grep -o "\[[^]]*\]\|cyc/row [0-9]*\|finish cyc/row [0-9]*" | paste - - -
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
mkdir -p $OUT/s && OUT=$OUT/s SKIP_PY=1 SKIP_PEERS=1 SAN_TIMEOUT=100 bash bench/device_session.sh 2>&1 | grep -v "^TIME\|WARN\|ERROR: \*" 
grep -E "TIME|bandwidth" $OUT/s/time.log | cut -c1-130
