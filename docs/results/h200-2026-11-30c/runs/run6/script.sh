# run 6: the CLI bench with the profile counters printed per case (a
# temporary FS_BENCH_PROF hook in bench.rs, not committed) on v26's kernels
export FLASHSEL_CACHE_DIR=/tmp/fscache; FS_BENCH_PROF=1 FLASHSEL_NVRTC_DEFINES=FS_PROFILE=1 timeout 200 .carry/flashsel-prof bench --backend cuda > $OUT/bench-prof.log 2>&1
