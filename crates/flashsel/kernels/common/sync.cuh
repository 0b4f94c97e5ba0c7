// Clocks and memory-order helpers: %globaltimer, and the acquire / release /
// relaxed accesses with which CTAs of one grid exchange counters and
// histograms through global memory (gpu scope).
#ifndef FLASHSEL_COMMON_SYNC_CUH
#define FLASHSEL_COMMON_SYNC_CUH

#include "common/types.cuh"

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u32 ld_acquire_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add(u32* p, u32 v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint4 ld_relaxed_v4(const u32* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_relaxed_u32(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 ld_relaxed_u64(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// The CTAs of a row (the grid path's, the fused decode indexer's) meet:
// returns when all `chunks` of them have arrived `target / chunks` times.
// Writes (and atomics) before it, by any thread of these CTAs, are visible
// to every thread of them after it: bar.sync, then thread 0's release add;
// its acquire poll, then bar.sync. Traps after 4 s (a launch whose CTAs are
// not all resident: the host launches these kernels cooperatively).
__device__ __forceinline__ void grid_barrier(u32* counter, u32 target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        red_release_add(counter, 1u);
        const unsigned long long t0 = global_ns();
        while (ld_acquire_u32(counter) < target) {
            if (global_ns() - t0 > 4000000000ull) __trap();
        }
    }
    __syncthreads();
}

#endif  // FLASHSEL_COMMON_SYNC_CUH
