// Compaction: the MSD radix descent (8-bit digits, a 256-bin shared
// histogram) that finds a prefix at least m composites reach, and the
// in-place compaction of the buffer to it.
#ifndef FLASHSEL_SELECT_FILTER_COMPACT_CUH
#define FLASHSEL_SELECT_FILTER_COMPACT_CUH

#include "select/filter/buffer.cuh"

// The MSD descent of a compaction, over composites wherever they are:
// add_hist(prefix, mask, shift) adds to sh.hist the digit at `shift` of each
// composite matching `prefix` under `mask` (every thread calls it; it needs
// no barrier). Returns the prefix: at least m composites are >= it, and at
// most max_keep unless the descent reached the last digit (then exactly m).
template <int TOP_BIT, typename AddHist>
__device__ u64 msd_prefix(Shared& sh, u32 m, u32 max_keep, AddHist add_hist) {
    const int tid = threadIdx.x;
    u64 prefix = 0, mask = 0;
    u32 need = m;
    for (int shift = TOP_BIT - 7;; shift -= 8) {
        for (int i = tid; i < 256; i += FS_BLOCK) sh.hist[i] = 0;
        __syncthreads();
        if (tid == 0) PROF_ADD(PROF_HIST_PASSES, 1);
        add_hist(prefix, mask, shift);
        __syncthreads();
        if (tid < 32) {
            // Lane l owns bins 8l .. 8l+7; find the bin where the count from the
            // top crosses `need`.
            u32 h[8];
            u32 sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                h[j] = sh.hist[tid * 8 + j];
                sum += h[j];
            }
            u32 incl = sum;  // sum over lanes >= tid
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u32 v = __shfl_down_sync(FULL_MASK, incl, o);
                if (tid + o < 32) incl += v;
            }
            const u32 above_lane = incl - sum;
            if (above_lane < need && need <= incl) {
                u32 acc = above_lane;
#pragma unroll
                for (int j = 7; j >= 0; --j) {
                    if (acc < need && acc + h[j] >= need) {
                        sh.digit = tid * 8 + j;
                        sh.above = acc;
                        sh.bincnt = h[j];
                    }
                    acc += h[j];
                }
            }
        }
        __syncthreads();
        need -= sh.above;
        prefix |= (u64)sh.digit << shift;
        mask |= (u64)255 << shift;
        // Kept if we stop here: (m - need) above the bin, plus the whole bin.
        if (m - need + sh.bincnt <= max_keep || shift == 0) break;
    }
    return prefix;
}

// Compaction of buf[0..n) to a prefix of its largest composites: at least m,
// at most max_keep (m <= max_keep < n). With max_keep == m it is exact: the m
// largest. The MSD descent stops at the first digit whose crossing bin lets
// everything >= the bin's lower bound fit in max_keep, so an intermediate
// compaction (max_keep > m) usually takes one or two histogram passes.
// All threads call it; ends with a barrier; leaves sh.count = the number kept
// and raises sh.lb to the kept prefix.
template <int TOP_BIT>
__device__ void compact(u64* buf, Shared& sh, u32 n, u32 m, u32 max_keep) {
    const int tid = threadIdx.x;
    const u64 prefix = msd_prefix<TOP_BIT>(
        sh, m, max_keep, [&](u64 pre, u64 mask, int shift) { hist_pass(buf, sh, n, pre, mask, shift); });
    // Everything >= prefix is kept: between m and max_keep composites (exactly
    // m when the descent reached the last digit: prefix is the m-th itself).
    // In-place compaction in rounds: a round reads R*FS_BLOCK entries into
    // registers, then writes its survivors below the running count, which is
    // never past what has been read.
    __syncthreads();
    if (tid == 0) sh.count = 0;
    __syncthreads();
    constexpr int R = 8;
    for (u32 base = 0; base < n; base += R * FS_BLOCK) {
        u64 v[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const u32 i = base + j * FS_BLOCK + tid;
            v[j] = (i < n) ? buf[i] : 0ull;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < R; ++j) push(buf, sh, v[j] >= prefix && v[j] != 0ull, v[j]);
        __syncthreads();
    }
    if (tid == 0) sh.lb = prefix > sh.lb ? prefix : sh.lb;
    __syncthreads();
}

#endif  // FLASHSEL_SELECT_FILTER_COMPACT_CUH
