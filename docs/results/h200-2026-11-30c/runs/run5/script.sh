export FLASHSEL_CACHE_DIR=/tmp/fscache; timeout 450 .carry/flashsel bench --backend cuda --json $OUT/bench.json > $OUT/bench.log 2>&1
