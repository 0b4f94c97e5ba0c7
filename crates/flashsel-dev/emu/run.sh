#!/usr/bin/env bash
# Builds and runs the host emulations (needs g++ >= 12, no GPU): each kernel
# source with its CUDA-only declarations rewritten for shim.h, compiled as
# C++20, every case against a reference written from the contract.
#   bash run.sh         all: the sparse MLA and QSA attention kernels, the QSA scorer, the finish
#   bash run.sh mla     the sparse MLA kernels (kernels/attention) only
#   bash run.sh qsa-attn
#                       the QSA sparse attention kernels (kernels/attention) only
#   bash run.sh qsa     the QSA scorer (kernels/indexer/qsa) only
#   bash run.sh dsa     the DSA indexer's scores (kernels/indexer/dsa_scores.cu) only
#   bash run.sh finish  the filter's index-order and bucket-rank finish
#                       (kernels/select/filter) only
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kernels="$here/../../flashsel/kernels"
which=${1:-all}
tmp=$(mktemp -d)
trap '[ -n "${KEEP_EMU:-}" ] || rm -rf "$tmp"' EXIT
rewrite() {
    sed -e 's/extern __shared__ __align__(16) float smem\[\];/extern float smem[];/' \
        -e 's/extern __shared__ __align__(16) u64 dyn_smem\[\];/extern u64 dyn_smem[];/' -e 's/__shared__ /static /' \
        -e 's/extern "C" __global__ void/void/' "$1"
}
cp "$here/shim.h" "$tmp/"
if [ "$which" = all ] || [ "$which" = mla ]; then
    mkdir -p "$tmp/inc/attention"
    rewrite "$kernels/attention/sparse_mla.cu" >"$tmp/kern.cpp"
    rewrite "$kernels/attention/sparse_mla_tc.cuh" >"$tmp/inc/attention/sparse_mla_tc.cuh"
    cp "$here/mla_emu.cpp" "$tmp/"
    g++ -std=c++20 -O2 -w -I "$tmp/inc" -I "$kernels" -o "$tmp/mla_emu" "$tmp/mla_emu.cpp" -lpthread
    "$tmp/mla_emu"
fi
if [ "$which" = all ] || [ "$which" = qsa-attn ]; then
    mkdir -p "$tmp/inc/attention"
    rewrite "$kernels/attention/sparse_qsa.cu" >"$tmp/kern_qsa_attn.cpp"
    rewrite "$kernels/attention/sparse_qsa_tc.cuh" >"$tmp/inc/attention/sparse_qsa_tc.cuh"
    cp "$here/qsa_attn_emu.cpp" "$tmp/"
    g++ -std=c++20 -O2 -w -I "$tmp/inc" -I "$kernels" -o "$tmp/qsa_attn_emu" "$tmp/qsa_attn_emu.cpp" -lpthread
    "$tmp/qsa_attn_emu"
fi
if [ "$which" = all ] || [ "$which" = qsa ]; then
    mkdir -p "$tmp/inc/common" "$tmp/inc/indexer/qsa"
    rewrite "$kernels/common/types.cuh" >"$tmp/inc/common/types.cuh"
    rewrite "$kernels/indexer/qsa/score.cuh" >"$tmp/inc/indexer/qsa/score.cuh"
    rewrite "$kernels/indexer/qsa/staged.cuh" >"$tmp/inc/indexer/qsa/staged.cuh"
    rewrite "$kernels/indexer/qsa_scores.cu" >"$tmp/kern_qsa.cpp"
    rewrite "$kernels/indexer/qsa_staged.cu" >"$tmp/kern_staged.cpp"
    cp "$here/qsa_emu.cpp" "$tmp/"
    # -ffp-contract=off: the kernel's __fmul_rn / __fadd_rn are single roundings.
    g++ -std=c++20 -O2 -w -ffp-contract=off -DFSA_HOST_EMU=1 -DFS_BLOCK=256 -I "$tmp/inc" -I "$kernels" \
        -o "$tmp/qsa_emu" "$tmp/qsa_emu.cpp" -lpthread
    "$tmp/qsa_emu"
fi
if [ "$which" = all ] || [ "$which" = dsa ]; then
    mkdir -p "$tmp/inc/common" "$tmp/inc/indexer/dsa"
    rewrite "$kernels/common/types.cuh" >"$tmp/inc/common/types.cuh"
    rewrite "$kernels/indexer/dsa/score.cuh" >"$tmp/inc/indexer/dsa/score.cuh"
    rewrite "$kernels/indexer/dsa_scores.cu" >"$tmp/kern_dsa.cpp"
    cp "$here/dsa_emu.cpp" "$tmp/"
    # -ffp-contract=off: the kernel's __fmul_rn / __fadd_rn are single roundings.
    g++ -std=c++20 -O2 -w -ffp-contract=off -DFSA_HOST_EMU=1 -DFS_BLOCK=256 -I "$tmp/inc" -I "$kernels" \
        -o "$tmp/dsa_emu" "$tmp/dsa_emu.cpp" -lpthread
    "$tmp/dsa_emu"
fi
if [ "$which" = all ] || [ "$which" = finish ]; then
    mkdir -p "$tmp/inc/common" "$tmp/inc/select/filter"
    for h in common/types.cuh common/profile.cuh common/sync.cuh select/filter/shared.cuh select/filter/sort.cuh \
        select/filter/bucket.cuh select/filter/index_order.cuh; do
        rewrite "$kernels/$h" >"$tmp/inc/$h"
    done
    cp "$here/finish_emu.cpp" "$tmp/"
    g++ -std=c++20 -O2 -w -DFS_BLOCK=256 -I "$tmp/inc" -o "$tmp/finish_emu" "$tmp/finish_emu.cpp" -lpthread
    "$tmp/finish_emu"
fi
