export FLASHSEL_CACHE_DIR=/tmp/fscache
FS_SHAPES=0,1,6 FS_TUNE="FS_PROFILE=1,FS_GRID_SAMPLE=0;FS_PROFILE=1;FS_PROFILE=1,FS_GRID_SAMPLE=0;FS_PROFILE=1" timeout 150 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $5, $6, $7, $8, $9}'
grep -E "^GRID " $OUT/tune.log | cut -c1-600
