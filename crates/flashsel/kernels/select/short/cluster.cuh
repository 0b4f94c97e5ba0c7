// The wide kernel's cluster form (short_cluster_impl; entries
// fs_short_cluster_* and fs_short_cluster_tok_* in select/short.cu, sm_90+,
// clusters of FS_SHORT_CLUSTER_CTAS CTAs): a row of at most
// FS_SHORT_WIDE_BLOCK x 16 columns held by a thread-block cluster of CS
// CTAs of FS_SHORT_WIDE_BLOCK threads, ITEMS = 16 / CS columns a thread, so
// that one row's selection runs on CS SMs (the wide kernel's one SM issues
// ~48K warp instructions at 1 x 16,384; perf-log v42).
//
// ALGORITHM (cluster rank c, thread t owns columns [B (c XB + t) ... + B)
// with B = ITEMS)
//   1. Load the thread's columns as order keys into registers. The range
//      starts as every key of the type ([0, 2^16) or [0, 2^32)): no min/max
//      exchange between the CTAs (on most rows the passes narrow it as fast;
//      a row of few distinct values or a narrow range takes the type's
//      2 or 3 passes where the wide kernel takes fewer: 1 x 16,384 f32
//      FewValues 8.6 against 6.3 us, perf-log v43).
//   2. len > k: the wide kernel's radix select (11-bit digits from the
//      range's top bit, the crossing bin from the top), each CTA binning its
//      registers into its own shared histogram, then one cluster barrier and
//      every thread reading its two bins from every CTA's histogram
//      (distributed shared memory); every CTA finds the same crossing bin.
//      Histograms alternate between two buffers by pass, so a CTA clears the
//      one of the pass before after the next barrier, when every CTA has read
//      it.
//   3. Place: each CTA's (above, in range) counts packed as in the wide
//      kernel, a CTA scan, the CTAs' totals exchanged through a cluster
//      barrier; each selected key is stored as its composite into rank 0's
//      selection at its place in column order.
//   4. A cluster barrier, then rank 0 writes the row (short_write); the
//      other CTAs return (nothing reads their shared memory after it).
//
// INVARIANTS
//   - The selected set and its index order are the wide kernel's (the same
//     passes, over the same keys, from a wider first range): the CPU
//     engine's bytes. Index order only (the planner's rule, as wide).
//   - Every CTA of a cluster takes the same row and makes the same uniform
//     decisions (it reads the same histogram sums and totals).
//   - No CTA exits or rewrites a histogram buffer while another may read it.
//
// COST
//   Per row: one read of each score, per key a conversion, a compare a pass
//   and a shared atomic while in range (on CS SMs at once); per pass one
//   cluster barrier, CS remote 8-byte reads a thread (its two bins from
//   each CTA) and the wide kernel's two CTA barriers; the place one more
//   cluster barrier and CS - 1 remote reads at most; the write one more
//   barrier.
#ifndef FLASHSEL_SELECT_SHORT_CLUSTER_CUH
#define FLASHSEL_SELECT_SHORT_CLUSTER_CUH

#include "common/cluster.cuh"
#include "select/short/wide.cuh"

struct ClusterShared {
    u32 hist[2][SBINS];  // by pass parity
    u32 part[XWARPS];
    u32 total;  // the CTA's packed place counts
    u32 cross_bin, cross_above, cross_cnt;
};

// Thread t's ITEMS columns c0 .. c0 + ITEMS - 1 of the row as order keys
// (n of them before len).
template <int TAG, int ITEMS>
__device__ __forceinline__ void cluster_load(const void* row, int c0, int len, bool aligned, int nan_largest,
                                             u32 (&key)[ITEMS], int& n) {
    typedef typename Elem<TAG>::raw R;
    constexpr int BYTES = ITEMS * (int)sizeof(R);
    static_assert(BYTES % 4 == 0, "whole words a thread");
    n = min(max(len - c0, 0), ITEMS);
    if (aligned && n == ITEMS) {
        u32 w[BYTES / 4];
        const char* src = (const char*)row + (size_t)c0 * sizeof(R);
        if constexpr (BYTES % 16 == 0) {
#pragma unroll
            for (int j = 0; j < BYTES / 16; ++j) {
                const uint4 v = __ldg((const uint4*)src + j);
                w[4 * j] = v.x;
                w[4 * j + 1] = v.y;
                w[4 * j + 2] = v.z;
                w[4 * j + 3] = v.w;
            }
        } else if constexpr (BYTES % 8 == 0) {
#pragma unroll
            for (int j = 0; j < BYTES / 8; ++j) {
                const uint2 v = __ldg((const uint2*)src + j);
                w[2 * j] = v.x;
                w[2 * j + 1] = v.y;
            }
        } else {
#pragma unroll
            for (int j = 0; j < BYTES / 4; ++j) w[j] = __ldg((const u32*)src + j);
        }
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const u32 b = sizeof(R) == 4 ? w[i] : (w[i / 2] >> ((i & 1) * 16)) & 0xffffu;
            key[i] = order_key<TAG>(b, nan_largest);
        }
    } else {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) key[i] = i < n ? order_key<TAG>(load_bits<TAG>(row, c0 + i), nan_largest) : 0u;
    }
}

// The wide kernel's radix passes over the cluster's histograms (see the
// header): on return the keys in [lo, hi] hold the k-th largest, `above`
// keys lie above hi, and the selection is every key above hi plus the
// `need` lowest columns of those in [lo, hi].
template <int CS, int ITEMS>
__device__ __forceinline__ void cluster_select(const u32 (&key)[ITEMS], int n, int len, u32 k, ClusterShared& sh,
                                               u32& lo, u32& hi, u32& above, u32& need) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32 cnt = (u32)len;
    above = 0;
    need = k;
    int buf = 0;
    while (lo != hi && need != cnt) {  // uniform across the cluster
        const u32 r = hi - lo;
        const int shift = bit_len(r) > SBITS ? bit_len(r) - SBITS : 0;
        if (n > 0) {
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) {
                const u32 d = key[i] - lo;
                if ((i < n) & (d <= r)) atomicAdd(&sh.hist[buf][d >> shift], 1u);
            }
        }
        cluster_sync();  // every CTA's bins of this pass counted; the last pass's read by all
        // This CTA's bins of the pass before, read by every CTA before the
        // barrier above, cleared for the pass after this one.
        *(uint2*)&sh.hist[buf ^ 1][2 * tid] = make_uint2(0u, 0u);
        const int b0 = SBINS - XPER * (tid + 1);
        const u32 at = (u32)__cvta_generic_to_shared(&sh.hist[buf][b0]);
        uint2 h = make_uint2(0u, 0u);
#pragma unroll
        for (int c = 0; c < CS; ++c) {
            const uint2 x = cluster_ld2(cluster_map(at, (u32)c));
            h.x += x.x;
            h.y += x.y;
        }
        const u32 sum = h.x + h.y;
        const u32 incl = warp_inclusive_sum(sum, lane);
        if (lane == 31) sh.part[warp] = incl;
        __syncthreads();
        const u32 run = incl - sum + warps_before(sh.part, warp, lane);
        if (run < need && need <= run + sum) {  // exactly one thread
            const bool upper = need <= run + h.y;
            sh.cross_bin = (u32)b0 + (upper ? 1u : 0u);
            sh.cross_above = upper ? run : run + h.y;
            sh.cross_cnt = upper ? h.y : h.x;
        }
        __syncthreads();
        // (The next pass writes sh.part and the crossing only after its
        // cluster barrier, which every thread of this CTA reaches after
        // these reads.)
        take_crossing(sh, shift, lo, hi, above, need, cnt);
        buf ^= 1;
    }
}

// The selection placed in column order into rank 0's sel (composites):
// every key above hi and the `need` lowest columns of those in [lo, hi].
// Ends with the cluster barrier after which rank 0's sel is whole.
template <int CS, int ITEMS>
__device__ __forceinline__ void cluster_place(const u32 (&key)[ITEMS], int n, int c0, u32 rank, u32 lo, u32 hi,
                                              u32 need, u64* sel, ClusterShared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 r = hi - lo;
    u32 v = 0;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const bool ok = i < n;
        v += (ok & (key[i] > hi)) ? 1u : ((ok & (key[i] - lo <= r)) ? 0x10000u : 0u);
    }
    const u32 incl = warp_inclusive_sum(v, lane);
    if (lane == 31) sh.part[warp] = incl;
    __syncthreads();
    u32 excl = incl - v + warps_before(sh.part, warp, lane);
    if (warp == 0) {
        const u32 t = __reduce_add_sync(FULL_MASK, lane < XWARPS ? sh.part[lane] : 0u);
        if (lane == 0) sh.total = t;
    }
    cluster_sync();  // every CTA's total published
    const u32 at_total = (u32)__cvta_generic_to_shared(&sh.total);
    for (u32 c = 0; c < rank; ++c) excl += cluster_ld(cluster_map(at_total, c));
    u32 inr = excl >> 16;
    u32 pos = (excl & 0xffffu) + min(inr, need);
    const u32 at = cluster_map((u32)__cvta_generic_to_shared(sel), 0u);
    place_items<ITEMS, true>(key, n, (u32)c0, lo, hi, need, inr, pos, at);
    cluster_sync();  // rank 0's selection whole; no CTA's shared memory is read after this
}

// One row per cluster of CS CTAs (cluster x takes row rows - 1 - x).
// Dynamic shared memory: P.cap composites of the selection (rank 0's used).
template <int TAG, bool TOK, int CS, typename Params>
__device__ __forceinline__ void short_cluster_impl(const Params& P) {
    constexpr int ITEMS = WIDE_ITEMS / CS;
    static_assert(ITEMS * CS == WIDE_ITEMS, "the wide kernel's row, split");
    __shared__ ClusterShared sh;
    const int tid = threadIdx.x;
    u64* sel = (u64*)dyn_smem;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
    __trap();  // the planner takes clusters on sm_90+ only
#endif
    CHAIN_WAIT();
    CHAIN_TRIGGER();
    const u32 rank = cluster_rank();
    *(uint4*)&sh.hist[0][4 * tid] = make_uint4(0u, 0u, 0u, 0u);  // 2 x 2048 bins: 4 a thread
    static_assert(2 * SBINS == 4 * XB, "each thread clears four bins");
    const int row = P.rows - 1 - (int)blockIdx.x / CS;
    TokRow tr;
    int len;
    const void* row_scores = short_row<TAG, TOK>(P, row, tr, len);
    // As the wide kernel: the planner keeps rows within the registers and
    // sends index order only.
    if (len > XB * WIDE_ITEMS || !P.order_index) __trap();
    const u32 k = (u32)P.k;
    const u32 m = min(k, (u32)len);
    if (m > 0) {  // uniform across the cluster
        u32 key[ITEMS];
        int n;
        const int c0 = ((int)rank * XB + tid) * ITEMS;
        cluster_load<TAG, ITEMS>(row_scores, c0, len, aligned16(row_scores), P.nan_largest, key, n);
        __syncthreads();  // the bins cleared
        u32 lo = 0, hi = TAG == 32 ? 0xffffffffu : 0xffffu;
        u32 above = 0, need = (u32)len;
        if ((u32)len > k) cluster_select<CS, ITEMS>(key, n, len, k, sh, lo, hi, above, need);
        cluster_place<CS, ITEMS>(key, n, c0, rank, lo, hi, need, sel, sh);
    }
    if (rank == 0) short_write<TAG, TOK, XB>(P, row, tr, m, sel, row_scores);
}

#endif  // FLASHSEL_SELECT_SHORT_CLUSTER_CUH
