export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p target/release/examples $OUT/x && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_elapsed.max,smsp__cycles_active.avg'
FS_SHAPES=0 FS_TUNE=";" timeout 100 $NCU --clock-control none --cache-control none -k regex:fs_grid4_f32 --launch-skip 40 --launch-count 1 --metrics "$M" .carry/device_run none tune > $OUT/ncu.log 2>&1; ts "ncu 262K rc=$?"
FS_SHAPES=1 FS_TUNE=";" timeout 100 $NCU --clock-control none --cache-control none -k regex:fs_grid_f32 --launch-skip 40 --launch-count 1 --metrics "$M" .carry/device_run none tune > $OUT/x/ncu1m.log 2>&1; ts "ncu 1M rc=$?"
grep -E "stalled|duration|inst_executed|cycles" $OUT/ncu.log | awk '$NF+0 > 0.05 || /duration|inst|cycles/' | head -40
grep -E "stalled|duration|inst_executed|cycles" $OUT/x/ncu1m.log | awk '$NF+0 > 0.05 || /duration|inst|cycles/' | head -40
FLASHSEL_ARCH=sm_90 timeout 90 .carry/flashsel check --quick --seed 46046 > $OUT/x/check-sm90.log 2>&1; ts "check sm_90 rc=$?"; grep -E "cases run|FAIL" $OUT/x/check-sm90.log | head -5
timeout 40 "$SAN" --tool racecheck .carry/device_run small > $OUT/x/racecheck.log 2>&1; ts "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|SMALL" $OUT/x/racecheck.log | tail -2
timeout 80 .carry/flashsel bench --backend cuda --json $OUT/x/bench.json > $OUT/bench.log 2>&1; ts "bench rc=$?"; grep -E "^1x|^64x|^8192x|cases" $OUT/bench.log | cut -c1-150 | head -40
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
(cd /tmp && timeout 100 python3 -m pytest -p no:cacheprovider -q -rs --timeout 60 "$OLDPWD/python/tests/test_cuda.py" "$OLDPWD/python/tests/test_torch_cpu.py" > $OUT/x/pytest.log 2>&1); ts "pytest rc=$?"; tail -2 $OUT/x/pytest.log
timeout 120 python3 bench/peers.py $OUT/peers --budget 0.1 > $OUT/peers.log 2>&1; ts "peers rc=$?"; tail -3 $OUT/peers.log
(cd $OUT && cp peers/peers.md . 2>/dev/null; mv peers x/ 2>/dev/null; tar czf extra.tgz x && rm -rf x); ls -la $OUT
