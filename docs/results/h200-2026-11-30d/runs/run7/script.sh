export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 120 .carry/flashsel check --quick --seed 13013 > $OUT/check.log 2>&1; echo "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -20
FS_SHAPES=0,1,6,7 FS_TUNE="FS_GRID_SAMPLE=0;;FS_GRID_SAMPLE=0;;FS_PROFILE=1" timeout 150 .carry/device_run none tune > $OUT/tune.log 2>&1; echo "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $5, $6, $7, $8, $9}'
grep -E "^GRID |^GRIDTRAP" $OUT/tune.log | cut -c1-420
timeout 120 .carry/device_run none time > $OUT/time.log 2>&1; echo "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-130
timeout 100 "$SAN" --tool memcheck --leak-check no .carry/device_run small > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|SMALL" $OUT/memcheck.log | tail -3
timeout 100 "$SAN" --tool racecheck .carry/device_run small > $OUT/racecheck.log 2>&1; echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|SMALL" $OUT/racecheck.log | tail -3
timeout 100 .carry/flashsel bench --backend cuda --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc=$?"; grep -E "^1x|^64x|^8192x|cases" $OUT/bench.log | cut -c1-150 | head -24
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
(cd /tmp && timeout 90 python3 -m pytest -p no:cacheprovider -q -rs --timeout 80 "$OLDPWD/python/tests/test_cuda.py" > $OUT/pytest.log 2>&1); echo "pytest rc=$?"; tail -3 $OUT/pytest.log
