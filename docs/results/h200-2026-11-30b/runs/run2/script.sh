export FLASHSEL_CACHE_DIR=/tmp/fscache
V=src=$PWD/.carry/v21.cu
FS_SHAPES=2,3,4,5 FS_TUNE="$V;;$V;;$V,FS_PROFILE=1;FS_PROFILE=1" timeout 200 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"; grep -E "^TUNE" $OUT/tune.log | cut -c1-60,100-200 | sed "s|$PWD/.carry/||"
grep -E "^BUCKET" $OUT/tune.log | sed "s|$PWD/.carry/||" | cut -c1-220
timeout 100 .carry/flashsel check --quick --seed 43 > $OUT/check.log 2>&1; echo "check rc=$?"; grep "cases run" $OUT/check.log; grep -v " ok " $OUT/check.log | grep -v "^device\|^cases\|^$" | head -5
FLASHSEL_ARCH=sm_90 timeout 100 .carry/flashsel check --quick --seed 44 > $OUT/check-portable.log 2>&1; echo "portable rc=$?"; grep "cases run" $OUT/check-portable.log
timeout 120 .carry/device_run none time > $OUT/time.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-100
