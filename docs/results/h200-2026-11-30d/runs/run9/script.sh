export FLASHSEL_CACHE_DIR=/tmp/fscache
FS_SHAPES=0,1 FS_TUNE="FS_PROFILE=1;FS_PROFILE=1,FS_GRID_LIST_WORD=48;FS_PROFILE=1,FS_GRID_LIST_WORD=14399;FS_PROFILE=1,FS_GRID_LIST_WORD=8000;;FS_GRID_LIST_WORD=14399;FS_GRID_LIST_WORD=8000" timeout 150 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $5, $6, $7, $8, $9}'
grep -E "^GRID " $OUT/tune.log | cut -c1-600
