export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
timeout 90 .carry/flashsel check --quick --seed 33033 > $OUT/check.log 2>&1; ts "check rc=$?"; grep -E "cases run|FAIL" $OUT/check.log | head -10
python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site python/dist/*.whl && export PYTHONPATH=/tmp/site
(cd /tmp && timeout 150 python3 -m pytest -p no:cacheprovider -q -rs --timeout 120 "$OLDPWD/python/tests/test_cuda.py" > $OUT/pytest.log 2>&1); ts "pytest rc=$?"; tail -3 $OUT/pytest.log
FS_SHAPES=0,1,8 FS_EXTRA="1x16384k256,1x32768k512,1x65536k512,1x131072k512,1x131072k2048,2x262144k512,4x65536k1024,1x524288k1024" FS_TUNE=";gridchunk=2048;FS_PDL_CHAIN=3;;gridchunk=2048;FS_PDL_CHAIN=3;FS_GRID_PLACE_PAIR=0" timeout 300 .carry/device_run none tune > $OUT/tune.log 2>&1; ts "tune rc=$?"
grep -E "^TUNE" $OUT/tune.log | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
timeout 70 .carry/device_run none time > $OUT/time.log 2>&1; ts "time rc=$?"; grep -E "TIME|bandwidth" $OUT/time.log | cut -c1-150
