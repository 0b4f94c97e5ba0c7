export FLASHSEL_CACHE_DIR=/tmp/fscache
mkdir -p target/release/examples && cp .carry/flashsel target/release/ && cp .carry/device_run target/release/examples/
mkdir -p $OUT/s && OUT=$OUT/s SKIP_SAN=1 SKIP_CHECK=1 SKIP_TIME=1 PYTEST_TIMEOUT=170 PEERS_TIMEOUT=230 bash bench/device_session.sh 2>&1 | grep -v "WARN"
