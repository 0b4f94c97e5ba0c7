export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
FLASHSEL_NVRTC_DEFINES=gridchunk=2048 timeout 100 .carry/flashsel check --quick --seed 22022 > $OUT/check-chunk2048.log 2>&1; ts "check gridchunk=2048 rc=$?"; grep -E "cases run|FAIL" $OUT/check-chunk2048.log | head -10
FS_SHAPES=0 FS_TUNE=";gridchunk=2048;gridchunk=3072;;gridchunk=2048;gridchunk=3072;FS_PROFILE=1;FS_PROFILE=1,gridchunk=2048" timeout 150 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $5, $6, $7, $8, $9}'
grep -E "^GRID " $OUT/tune.log | cut -c1-560
