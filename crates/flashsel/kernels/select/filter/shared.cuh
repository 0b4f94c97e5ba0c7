// The filter kernels' per-CTA shared state (the buffer's count, the bound,
// the radix select's and the split rows' scalars), the warp-aggregated
// append and the CTA's exclusive prefix sum.
#ifndef FLASHSEL_SELECT_FILTER_SHARED_CUH
#define FLASHSEL_SELECT_FILTER_SHARED_CUH

#include "common/profile.cuh"
#include "common/types.cuh"

struct Shared {
    u32 hist[256];
    u32 count;       // composites in the buffer
    u32 digit;       // radix select: the crossing digit
    u32 above;       // radix select: composites in bins above it
    u32 bincnt;      // radix select: composites in its bin
    u64 lb;          // accept c >= lb
    u32 slot;        // split rows: where this CTA's candidates go
    u32 last;        // split rows: this CTA finishes the row
};

// Warp-aggregated append of c to dst at *counter when pred: every lane of
// the warp calls it.
__device__ __forceinline__ void append(u64* dst, u32* counter, bool pred, u64 c) {
    const u32 mask = __ballot_sync(FULL_MASK, pred);
    if (mask == 0) return;
    const int lane = threadIdx.x & 31;
    const int leader = __ffs(mask) - 1;
    u32 base = 0;
    if (lane == leader) base = atomicAdd(counter, (u32)__popc(mask));
    base = __shfl_sync(FULL_MASK, base, leader);
    if (pred) dst[base + __popc(mask & ((1u << lane) - 1u))] = c;
}

// The exclusive prefix sum over the CTA's threads, in thread order, of each
// thread's `sum`; every thread calls it. wsum: WARPS u32 of shared scratch,
// free at the call (one barrier inside; the caller orders any later reuse).
__device__ __forceinline__ u32 block_exclusive_sum(u32 sum, u32* wsum) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    return incl - sum + __reduce_add_sync(FULL_MASK, lane < warp ? wsum[lane] : 0u);
}

#endif  // FLASHSEL_SELECT_FILTER_SHARED_CUH
