export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p target/release/examples $OUT/x && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 .carry/flashsel check --quick --seed 37037 > $OUT/check.log 2>&1; ts "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -10
FLASHSEL_NVRTC_DEFINES=FS_GRID_BIN_PLACE=100000 timeout 60 .carry/flashsel check --quick --seed 38038 > $OUT/x/check-binplace-all.log 2>&1; ts "check binplace all rc=$?"; grep -E "cases run|FAIL" $OUT/x/check-binplace-all.log | head -10
FLASHSEL_NVRTC_DEFINES=FS_GRID_BIN_PLACE=2 timeout 60 .carry/flashsel check --quick --seed 39039 > $OUT/x/check-binplace-2.log 2>&1; ts "check binplace 2 rc=$?"; grep -E "cases run|FAIL" $OUT/x/check-binplace-2.log | head -10
FLASHSEL_ARCH=sm_90 timeout 90 .carry/flashsel check --quick --seed 40040 > $OUT/x/check-sm90.log 2>&1; ts "check sm_90 rc=$?"; grep -E "cases run|FAIL" $OUT/x/check-sm90.log | head -10
timeout 40 "$SAN" --tool memcheck --leak-check no .carry/device_run small > $OUT/x/memcheck.log 2>&1; ts "memcheck rc=$?"; grep -E "ERROR SUMMARY|SMALL" $OUT/x/memcheck.log | tail -2
timeout 40 "$SAN" --tool racecheck .carry/device_run small > $OUT/x/racecheck.log 2>&1; ts "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|SMALL" $OUT/x/racecheck.log | tail -2
timeout 70 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-150
FS_SHAPES=0,1,6 FS_EXTRA="1x131072k2048,1x524288k1024,4x65536k1024,1x65536k2048" FS_TUNE=";FS_GRID_BIN_PLACE=0;;FS_GRID_BIN_PLACE=0;FS_PROFILE=1;FS_PROFILE=1,FS_GRID_BIN_PLACE=0" timeout 200 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
grep -E "^GRID " $OUT/tune.log | cut -c1-600
timeout 80 .carry/flashsel bench --backend cuda --json $OUT/x/bench.json > $OUT/bench.log 2>&1; ts "bench rc=$?"; grep -E "^1x|^64x|^8192x|cases" $OUT/bench.log | cut -c1-150 | head -40
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
(cd /tmp && timeout 100 python3 -m pytest -p no:cacheprovider -q -rs --timeout 60 "$OLDPWD/python/tests/test_cuda.py" "$OLDPWD/python/tests/test_torch_cpu.py" > $OUT/x/pytest.log 2>&1); ts "pytest rc=$?"; tail -2 $OUT/x/pytest.log
timeout 120 python3 bench/peers.py $OUT/peers --budget 0.1 > $OUT/peers.log 2>&1; ts "peers rc=$?"; tail -3 $OUT/peers.log
(cd $OUT && cp peers/peers.md . 2>/dev/null; mv peers x/ 2>/dev/null; tar czf extra.tgz x && rm -rf x); ls -la $OUT
