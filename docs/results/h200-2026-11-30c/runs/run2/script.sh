export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
timeout 100 .carry/flashsel check --quick --seed 2002 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head
V="src=$PWD/.carry/v25.cu;;FS_BUCKET_SCALE=0;;src=$PWD/.carry/v25.cu;FS_BUCKET_SCALE=0;FS_PROFILE=1;FS_PROFILE=1,FS_BUCKET_SCALE=0"
FS_SHAPES=3,4,5 FS_TUNE="$V" timeout 200 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $4, $5, $6, $7, $8, $9}' | sed "s|$PWD/.carry/||"
grep -E "^TUNE.*PROFILE" $OUT/tune.log | grep -o "cyc/row [0-9]*\|finish cyc/row [0-9]*\|[0-9]* cands" | paste - - - -
grep -E "^BUCKET" $OUT/tune.log | sed "s|$PWD/.carry/||" | cut -c1-200
mkdir -p $OUT/s && OUT=$OUT/s SKIP_PY=1 SKIP_PEERS=1 SKIP_CHECK=1 SKIP_PORTABLE=1 SAN_TIMEOUT=100 bash bench/device_session.sh 2>&1 | grep -v "^TIME\|WARN\|ERROR: \*"
grep -E "TIME|bandwidth" $OUT/s/time.log | cut -c1-130
