export FLASHSEL_CACHE_DIR=/tmp/fscache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
FS_SHAPES=4 FS_TUNE='rowblock16=512;;rowblock16=512;;rowblock16=512,FS_PROFILE=1;FS_PROFILE=1' timeout 150 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"; grep -E "^TUNE|^BUCKET" $OUT/tune.log | cut -c1-330
timeout 100 .carry/flashsel check --quick --seed 41 > $OUT/check.log 2>&1; echo "check rc=$?"; grep "cases run" $OUT/check.log; grep -v " ok " $OUT/check.log | grep -v "^device\|^cases\|^$" | head -5
timeout 120 .carry/device_run none time > $OUT/time.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-140
