export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
timeout 420 .carry/flashsel check --seed 48048 > $OUT/check-full.log 2>&1; ts "check full rc=$?"; grep -E "cases run|FAIL" $OUT/check-full.log | head -12; grep -E "4194304" $OUT/check-full.log | head -3
