// Descending bitonic sorts of composites: in registers for the finish's
// (2 x FS_BLOCK, 4 x FS_BLOCK] case, in place for any length otherwise.
#ifndef FLASHSEL_SELECT_FILTER_SORT_CUH
#define FLASHSEL_SELECT_FILTER_SORT_CUH

#include "common/types.cuh"

// A descending bitonic sort for m <= 4 * FS_BLOCK (the finish's general path
// for k in (1024, 2048]), with the data in registers: thread t holds elements
// 4t .. 4t+3. Compare-exchange partners at distance 1-2 are in the thread, at
// 4-64 in the warp (shuffles, no barrier), and only distances >= 128 go
// through shared memory. 20 barriers for 2048 elements instead of 66.
__device__ __forceinline__ u64 umax64(u64 a, u64 b) { return a > b ? a : b; }
__device__ __forceinline__ u64 umin64(u64 a, u64 b) { return a < b ? a : b; }
// Orders (a, b) descending when `down`, ascending otherwise.
__device__ __forceinline__ void cmp_swap(u64& a, u64& b, bool down) {
    const u64 hi = umax64(a, b), lo = umin64(a, b);
    a = down ? hi : lo;
    b = down ? lo : hi;
}

__device__ void sort_desc_regs(u64* buf, u32 m, int order_index) {
    constexpr u32 N = 4 * FS_BLOCK;
    const u32 t4 = 4 * threadIdx.x;
    u64 r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 e = t4 + j;
        u64 c = e < m ? buf[e] : 0ull;
        if (order_index && e < m) c = (c << 32) | (c >> 32);
        r[j] = c;
    }
    __syncthreads();
    for (u32 size = 2; size <= N; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            if (stride >= 128) {
#pragma unroll
                for (int j = 0; j < 4; ++j) buf[t4 + j] = r[j];
                __syncthreads();
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const u32 e = t4 + j;
                    const u64 o = buf[e ^ stride];
                    const bool keep_max = ((e & stride) == 0) == ((e & size) == 0);
                    r[j] = keep_max ? umax64(r[j], o) : umin64(r[j], o);
                }
                __syncthreads();
            } else if (stride >= 4) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const u32 e = t4 + j;
                    const u64 o = __shfl_xor_sync(FULL_MASK, r[j], stride >> 2);
                    const bool keep_max = ((e & stride) == 0) == ((e & size) == 0);
                    r[j] = keep_max ? umax64(r[j], o) : umin64(r[j], o);
                }
            } else {
                // Within the thread; (t4 + j) & size is the same for all j when
                // size >= 4, and for size 2 only stride 1 occurs.
                if (stride == 2) {
                    const bool up = (t4 & size) == 0;
                    cmp_swap(r[0], r[2], up);
                    cmp_swap(r[1], r[3], up);
                } else {
                    cmp_swap(r[0], r[1], ((t4 + 0) & size) == 0);
                    cmp_swap(r[2], r[3], ((t4 + 2) & size) == 0);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) buf[t4 + j] = r[j];
    __syncthreads();
}

// Descending bitonic sort of a[0..len) in place, any len: the variant whose
// merges all run one way (a mirror step, then half-cleaners), so the virtual
// padding past len (below everything) never has to move and is not stored.
// log2(N) (log2(N) + 1) / 2 steps of N/2 compare-exchanges, N = pow2 >= len,
// a barrier after each.
__device__ void sort_desc_range(u64* a, u32 len) {
    u32 n = 1;
    while (n < len) n <<= 1;
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 i = threadIdx.x; i < n / 2; i += FS_BLOCK) {
                u32 lo, hi;
                if (stride == size >> 1) {  // mirror step
                    const u32 blk = i / stride, off = i % stride;
                    lo = blk * size + off;
                    hi = blk * size + size - 1 - off;
                } else {
                    lo = 2 * i - (i & (stride - 1));
                    hi = lo + stride;
                }
                if (hi < len) {
                    const u64 x = a[lo], y = a[hi];
                    if (x < y) {
                        a[lo] = y;
                        a[hi] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// buf[0..m) in output order: descending by composite (score order), or, for
// index order, with the words swapped first, so that the low word
// (0xffffffff - column) leads and descending means ascending column.
__device__ void sort_desc(u64* buf, u32 m, int order_index) {
    if (order_index) {
        for (u32 i = threadIdx.x; i < m; i += FS_BLOCK) buf[i] = (buf[i] << 32) | (buf[i] >> 32);
        __syncthreads();
    }
    sort_desc_range(buf, m);
}

#endif  // FLASHSEL_SELECT_FILTER_SORT_CUH
