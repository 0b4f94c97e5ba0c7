FS_SHAPES=0 FS_EXTRA="1x262144k512,1x262144k512,1x262144k512" FS_TUNE="FS_PROFILE=1" FLASHSEL_CACHE_DIR=/tmp/fscache timeout 80 .carry/device_run none tune > $OUT/tune-prof.log 2>&1
