#!/usr/bin/env bash
# Builds and runs the host emulation of the sparse MLA kernels (needs g++ >= 12,
# no GPU): the kernel source with its CUDA-only declarations rewritten for
# shim.h, compiled as C++20, every case against the float64 reference.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kernels="$here/../../flashsel/kernels"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rewrite() {
    sed -e 's/extern __shared__ __align__(16) float smem\[\];/extern float smem[];/' -e 's/__shared__ /static /' \
        -e 's/extern "C" __global__ void/void/' "$1"
}
mkdir -p "$tmp/inc/attention"
rewrite "$kernels/attention/sparse_mla.cu" >"$tmp/kern.cpp"
rewrite "$kernels/attention/sparse_mla_tc.cuh" >"$tmp/inc/attention/sparse_mla_tc.cuh"
cp "$here/shim.h" "$here/mla_emu.cpp" "$tmp/"
g++ -std=c++20 -O2 -w -I "$tmp/inc" -I "$kernels" -o "$tmp/mla_emu" "$tmp/mla_emu.cpp" -lpthread
"$tmp/mla_emu"
