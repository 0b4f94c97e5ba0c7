// The short-row path's wide kernel (short_wide_impl; entries
// fs_short_wide_* and fs_short_wide_tok_* in select/short.cu): one CTA of
// FS_SHORT_WIDE_BLOCK threads holds a whole row of at most
// FS_SHORT_WIDE_BLOCK x WIDE_ITEMS columns in registers, for batches of few
// rows (at most one a SM: decode rows of 1K-16K columns, issue 21's 1 x
// 16,384 QSA blocks), where the grid path's cross-CTA passes and the row
// path's finish cost more than the whole selection.
//
// ALGORITHM (one row per CTA; thread t owns columns [16 t, 16 t + 16))
//   1. Load the thread's columns (16-byte loads where the row is aligned)
//      as order keys (common/keys.cuh) into registers; the row's min and
//      max key by a CTA reduction.
//   2. len > k: short_select's exact MSD radix select over the key range
//      [min, max] (11-bit digits from the range's top bit, 2048 shared bins,
//      a thread's two bins scanned from the top; <= 2 passes over 16-bit
//      keys, <= 3 over 32-bit ones, none for an all-equal row), each
//      thread binning its registers.
//   3. Place: every key above the range, and of those in it the `need`
//      lowest columns. A thread's columns are contiguous, so one CTA
//      exclusive scan of (above, in range) counts, packed in one word,
//      gives each selected key its place in column order.
//   4. short_write, as the CTA kernel: indices and values, or the token
//      write, in the place's order (index order: the planner sends no
//      other; a bitonic sort of the selection by 1,024 threads measured
//      +7.5 us at k 512 and +19.6 us at k 2048 on the H200, slower than the
//      row and grid paths' score order). A row that selects nothing reads
//      no score and only writes.
//
// INVARIANTS
//   - The selected set and its index order are short_impl's (composites
//     are unique within a row): the CPU engine's bytes.
//   - A register past the row's length (column >= len) is never binned,
//     counted or placed; validity is by column, not by key (key 0 is the
//     lowest NaN's).
//   - Every loop with a barrier has a CTA-uniform bound; the bins are all
//     zero between passes (a thread zeroes the two it scans).
//
// COST
//   Per row: one read of each score; per key a conversion, a compare a pass
//   and a shared atomic while it is in the range; 3 barriers a pass, 2 for
//   the load's reduction and the place's scan, one before the write. No
//   global scratch, no second kernel.
//
// Compile-time values (the host passes them as -D): FS_SHORT_WIDE_BLOCK
// (threads of the CTA, plan::SHORT_WIDE_BLOCK).
#ifndef FLASHSEL_SELECT_SHORT_WIDE_CUH
#define FLASHSEL_SELECT_SHORT_WIDE_CUH

#ifndef FS_SHORT_WIDE_BLOCK
#error "the host passes FS_SHORT_WIDE_BLOCK (plan::SHORT_WIDE_BLOCK)"
#endif

#include "select/short/kernel.cuh"

enum : int { XB = FS_SHORT_WIDE_BLOCK, XWARPS = FS_SHORT_WIDE_BLOCK / 32 };
enum : int { WIDE_ITEMS = 16 };      // columns a thread holds (plan::SHORT_WIDE_ITEMS)
enum : int { XPER = SBINS / XB };    // bins a thread scans
static_assert(XB % 32 == 0 && XWARPS <= 32, "one lane per warp partial");
static_assert(XPER == 2, "a thread's bins are one 8-byte pair");

struct WideShared {
    u32 hist[SBINS];
    u32 part[XWARPS];     // per-warp partials
    u32 red[2 * XWARPS];  // per-warp key min / max
    u32 cross_bin, cross_above, cross_cnt;
};

// The warp's inclusive sum of v in lane order.
__device__ __forceinline__ u32 warp_inclusive_sum(u32 v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 x = __shfl_up_sync(FULL_MASK, v, o);
        if (lane >= o) v += x;
    }
    return v;
}

// The sum over warps w < `warp` of part[w] (every lane the same value).
__device__ __forceinline__ u32 warps_before(const u32* part, int warp, int lane) {
    return __reduce_add_sync(FULL_MASK, lane < warp ? part[lane] : 0u);
}

// Thread t's columns c0 = 16 t .. c0 + 15 of the row as order keys; n: how
// many of them lie before len. Returns, over the CTA, the min and max key of
// the row's columns.
template <int TAG>
__device__ __forceinline__ void wide_load(const void* row, int len, bool aligned, int nan_largest,
                                          u32 (&key)[WIDE_ITEMS], int& n, WideShared& sh, u32& kmin, u32& kmax) {
    typedef Elem<TAG> E;
    constexpr int VEC = E::VEC;
    static_assert(WIDE_ITEMS % VEC == 0, "whole 16-byte groups a thread");
    const int tid = threadIdx.x;
    const int c0 = tid * WIDE_ITEMS;
    n = min(max(len - c0, 0), (int)WIDE_ITEMS);
    uint4 w[WIDE_ITEMS / VEC];
    u32 lo = ~0u, hi = 0u;
    if (aligned && n == WIDE_ITEMS) {
        // Whole and aligned (every thread but the row's last few): plain
        // 16-byte loads, no test per element.
        const uint4* src = (const uint4*)((const char*)row + (size_t)c0 * sizeof(typename E::raw));
#pragma unroll
        for (int j = 0; j < WIDE_ITEMS / VEC; ++j) w[j] = __ldg(src + j);
#pragma unroll
        for (int j = 0; j < WIDE_ITEMS / VEC; ++j) {
#pragma unroll
            for (int q = 0; q < VEC; ++q) {
                const int i = j * VEC + q;
                key[i] = order_key<TAG>(unpack<TAG>(w[j], q), nan_largest);
                lo = min(lo, key[i]);
                hi = max(hi, key[i]);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < WIDE_ITEMS / VEC; ++j) {
            const u32 e0 = (u32)(c0 + j * VEC);
            w[j] = e0 < (u32)len ? load_vec<TAG>(row, e0, (u32)len, aligned) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < WIDE_ITEMS / VEC; ++j) {
#pragma unroll
            for (int q = 0; q < VEC; ++q) {
                const int i = j * VEC + q;
                key[i] = order_key<TAG>(unpack<TAG>(w[j], q), nan_largest);
                if (i < n) {
                    lo = min(lo, key[i]);
                    hi = max(hi, key[i]);
                }
            }
        }
    }
    cta_min_max<XWARPS>(lo, hi, sh.red, kmin, kmax);
}

// short_select over the threads' registers: on return the keys in [lo, hi]
// hold the k-th largest, `above` keys lie above hi, and the selection is
// every key above hi plus the `need` lowest columns of those in [lo, hi].
// sh.hist is all zero on entry and on return.
__device__ __forceinline__ void wide_select(const u32 (&key)[WIDE_ITEMS], int n, int len, u32 k, WideShared& sh,
                                            u32& lo, u32& hi, u32& above, u32& need) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32 cnt = (u32)len;  // keys in [lo, hi]
    above = 0;
    need = k;
    while (lo != hi && need != cnt) {  // uniform
        const u32 r = hi - lo;
        const int shift = bit_len(r) > SBITS ? bit_len(r) - SBITS : 0;
        if (n > 0) {  // threads past the row's end skip their registers
#pragma unroll
            for (int i = 0; i < WIDE_ITEMS; ++i) {
                const u32 d = key[i] - lo;
                if (i < n && d <= r) atomicAdd(&sh.hist[d >> shift], 1u);
            }
        }
        __syncthreads();
        // Thread t scans bins [SBINS - 2 (t + 1), SBINS - 2 t) from the top,
        // zeroing them for the next pass.
        const int b0 = SBINS - XPER * (tid + 1);
        uint2* pair = (uint2*)&sh.hist[b0];
        const uint2 h = *pair;
        *pair = make_uint2(0u, 0u);
        const u32 sum = h.x + h.y;
        const u32 incl = warp_inclusive_sum(sum, lane);
        if (lane == 31) sh.part[warp] = incl;
        __syncthreads();
        const u32 run = incl - sum + warps_before(sh.part, warp, lane);  // bins above this thread's
        if (run < need && need <= run + sum) {  // exactly one thread
            const bool upper = need <= run + h.y;  // bin b0 + 1 lies above b0
            sh.cross_bin = (u32)b0 + (upper ? 1u : 0u);
            sh.cross_above = upper ? run : run + h.y;
            sh.cross_cnt = upper ? h.y : h.x;
        }
        __syncthreads();
        // (The next pass writes the crossing bin's words only after two more
        // barriers, each after every thread's reads here.)
        take_crossing(sh, shift, lo, hi, above, need, cnt);
    }
}

// Stores each selected key of a thread's ITEMS registers (columns c0 ..,
// n of them before the row's end) as composite(key, column) at place pos
// of the selection, pos counting on: every key above hi, and of those in
// [lo, hi] while inr (the in-range keys at lower columns) < need. `at`: the
// selection's shared address, this CTA's (CLUSTER false) or a cluster
// CTA's (true: st.shared::cluster, sm_90+).
template <int ITEMS, bool CLUSTER>
__device__ __forceinline__ void place_items(const u32 (&key)[ITEMS], int n, u32 c0, u32 lo, u32 hi, u32 need, u32 inr,
                                            u32 pos, u32 at) {
    const u32 r = hi - lo;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        // Bitwise, not short-circuit: no branch per entry.
        const bool ok = i < n;
        const bool in = ok & (key[i] - lo <= r);
        const bool s = (ok & (key[i] > hi)) | (in & (inr < need));
        inr += in ? 1u : 0u;
        // composite(key, column) as its two words (the 64-bit form's
        // arithmetic, unrolled 16 times, spilled at 64 registers).
        if (s) {
            if constexpr (CLUSTER) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};" ::"r"(at + pos * 8u),
                             "r"(0xffffffffu - (c0 + (u32)i)), "r"(key[i])
                             : "memory");
#endif
            } else {
                asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(at + pos * 8u), "r"(0xffffffffu - (c0 + (u32)i)),
                             "r"(key[i])
                             : "memory");
            }
        }
        pos += s ? 1u : 0u;
    }
}

// The selection in column order into sel[0, m) as composites: every key
// above hi and the `need` lowest columns of those in [lo, hi]; one CTA
// exclusive scan of the threads' (above, in range) counts, packed as
// above | in_range << 16 (each total <= 16,384 columns).
__device__ __forceinline__ void wide_place(const u32 (&key)[WIDE_ITEMS], int n, u32 lo, u32 hi, u32 need, u64* sel,
                                           WideShared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 r = hi - lo;
    u32 v = 0;
    if (n > 0) {
#pragma unroll
        for (int i = 0; i < WIDE_ITEMS; ++i) {
            if (i < n) v += key[i] > hi ? 1u : (key[i] - lo <= r ? 0x10000u : 0u);
        }
    }
    const u32 incl = warp_inclusive_sum(v, lane);
    if (lane == 31) sh.part[warp] = incl;
    __syncthreads();
    const u32 excl = incl - v + warps_before(sh.part, warp, lane);
    u32 inr = excl >> 16;                      // keys in the range at lower columns
    u32 pos = (excl & 0xffffu) + min(inr, need);  // selected keys at lower columns
    // The selection's shared address, once (a generic store rebuilt it for
    // each of the 16 entries).
    const u32 at = (u32)__cvta_generic_to_shared(sel);
    if (n == 0) return;
    place_items<WIDE_ITEMS, false>(key, n, (u32)tid * WIDE_ITEMS, lo, hi, need, inr, pos, at);
}

// One row per CTA (CTA x takes row rows - 1 - x, as the CTA kernel).
// Dynamic shared memory: P.cap composites of the selection.
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ void short_wide_impl(const Params& P) {
    __shared__ WideShared sh;
    const int tid = threadIdx.x;
    u64* sel = (u64*)dyn_smem;
    CHAIN_WAIT();
    CHAIN_TRIGGER();
    for (int i = tid; i < SBINS; i += XB) sh.hist[i] = 0;
    const int row = P.rows - 1 - (int)blockIdx.x;
    TokRow tr;
    int len;
    const void* row_scores = short_row<TAG, TOK>(P, row, tr, len);
    // The planner keeps rows within the registers and sends index order
    // only; never drop columns or return another order.
    if (len > XB * WIDE_ITEMS || !P.order_index) __trap();
    const u32 k = (u32)P.k;
    const u32 m = min(k, (u32)len);
    if (m > 0) {  // uniform
        u32 key[WIDE_ITEMS];
        int n;
        u32 lo, hi;
        wide_load<TAG>(row_scores, len, aligned16(row_scores), P.nan_largest, key, n, sh, lo, hi);
        u32 above = 0, need = (u32)len;
        if ((u32)len > k) wide_select(key, n, len, k, sh, lo, hi, above, need);
        wide_place(key, n, lo, hi, need, sel, sh);
        __syncthreads();
    }
    short_write<TAG, TOK, XB>(P, row, tr, m, sel, row_scores);
}

#endif  // FLASHSEL_SELECT_SHORT_WIDE_CUH
