export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
timeout 100 .carry/flashsel check --quick --seed 1001 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head
V="src=$PWD/.carry/v25.cu;;FS_SAMPLE_RATE=0;FS_RANK_UNROLL=0;FS_BUCKET_SCALE=0;FS_ROW_SAMPLE=2;FS_SAMPLE_SD=2.5;FS_NB_BITS=12;src=$PWD/.carry/v25.cu;;FS_PROFILE=1;src=$PWD/.carry/v25.cu,FS_PROFILE=1"
FS_SHAPES=2,3,4,5 FS_TUNE="$V" timeout 280 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $4, $5, $6, $7, $8}' | sed "s|$PWD/.carry/||"
grep -E "^TUNE.*PROFILE" $OUT/tune.log | grep -o "cyc/row [0-9]*\|finish cyc/row [0-9]*\|[0-9]* cands" | paste - - - -
grep -E "^BUCKET" $OUT/tune.log | sed "s|$PWD/.carry/||" | cut -c1-200
timeout 100 .carry/device_run none time > $OUT/time.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-130
