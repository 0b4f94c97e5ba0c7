export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 .carry/flashsel check --quick --seed 23023 > $OUT/check.log 2>&1; ts "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -10
FLASHSEL_NVRTC_DEFINES=gridchunk=2048 timeout 90 .carry/flashsel check --quick --seed 24024 > $OUT/check-gridchunk2048.log 2>&1; ts "check gridchunk=2048 rc=$?"; grep -E "cases run|FAIL" $OUT/check-gridchunk2048.log | head -10
FLASHSEL_ARCH=sm_90 timeout 90 .carry/flashsel check --quick --seed 25025 > $OUT/check-sm90.log 2>&1; ts "check sm_90 rc=$?"; grep -E "cases run|FAIL" $OUT/check-sm90.log | head -10
timeout 80 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-150
timeout 70 "$SAN" --tool memcheck --leak-check no .carry/device_run small > $OUT/memcheck.log 2>&1; ts "memcheck rc=$?"; grep -E "ERROR SUMMARY|SMALL" $OUT/memcheck.log | tail -3
timeout 70 "$SAN" --tool racecheck .carry/device_run small > $OUT/racecheck.log 2>&1; ts "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|SMALL" $OUT/racecheck.log | tail -3
timeout 60 .carry/flashsel bench --backend cuda --json $OUT/bench.json > $OUT/bench.log 2>&1; ts "bench rc=$?"; grep -E "^1x|^64x|^8192x|cases" $OUT/bench.log | cut -c1-150 | head -24
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
(cd /tmp && timeout 60 python3 -m pytest -p no:cacheprovider -q -rs --timeout 50 "$OLDPWD/python/tests/test_cuda.py" > $OUT/pytest.log 2>&1); ts "pytest rc=$?"; tail -2 $OUT/pytest.log
timeout 100 python3 bench/peers.py $OUT/peers --budget 0.1 > $OUT/peers.log 2>&1; ts "peers rc=$?"; tail -3 $OUT/peers.log
