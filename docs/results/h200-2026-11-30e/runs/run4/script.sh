export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
OLD="FS_GRID_BIN_LIST=0,FS_GRID_TALLY_SPIN=0,grid8=0,FS_GRID_REG_PLACE=0"
timeout 120 .carry/flashsel check --quick --seed 17017 > $OUT/check.log 2>&1; rc=$?; ts "check rc=$rc"; grep -E "cases run|FAIL" $OUT/check.log | head -20
FS_SHAPES=0,1,6,7 FS_TUNE="$OLD;;FS_GRID_REG_PLACE=0;$OLD;;FS_GRID_REG_PLACE=0;FS_PROFILE=1;FS_PROFILE=1,FS_GRID_REG_PLACE=0" timeout 200 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $5, $6, $7, $8, $9}'
grep -E "^GRID |^GRIDTRAP" $OUT/tune.log | cut -c1-520

