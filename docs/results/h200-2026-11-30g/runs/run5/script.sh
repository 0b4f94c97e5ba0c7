export FLASHSEL_CACHE_DIR=/tmp/fscache PYTHONUNBUFFERED=1
T0=$(date +%s); ts(){ echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1); $NCU --version | tail -1
FS_SHAPES=0 FS_TUNE="FS_PDL=0" timeout 200 $NCU --clock-control none -k regex:fs_grid4 --launch-skip 3 --launch-count 1 --warp-sampling-interval 0 --section WarpStateStats --section SourceCounters --section SchedulerStats --section LaunchStats -o $OUT/prof .carry/device_run none tune > $OUT/ncu.log 2>&1; ts "ncu rc=$?"
tail -5 $OUT/ncu.log
ls -la $OUT
if [ -f $OUT/prof.ncu-rep ]; then
  timeout 60 $NCU -i $OUT/prof.ncu-rep --print-details all > $OUT/details.txt 2>&1; ts "details rc=$?"
  timeout 60 $NCU -i $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2>&1; ts "sass rc=$?"; wc -l $OUT/sass.csv; head -3 $OUT/sass.csv | cut -c1-600
  grep -i -E "stall|warp cycles|issued|eligible" $OUT/details.txt | head -40
fi
