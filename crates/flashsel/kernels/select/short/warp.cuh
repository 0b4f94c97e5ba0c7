// The short-row path's warp-per-row body (short_warp_impl; entries
// fs_short_warp_* and fs_short_warp_tok_* in select/short.cu): the same
// selection as short_impl (select/short/kernel.cuh), but each warp of a CTA
// owns one row and nothing waits on a CTA barrier, so a row pays a warp's
// latency only (issue 21: QSA's first chunk, 8192 rows of V = 0 .. 2,048
// blocks, where the CTA-per-row kernel's barriers dominate).
//
// ALGORITHM (one row per warp, FS_SHORT_WARPS warps a CTA, each with its own
// slab of dynamic shared memory: 256 bins, the row's keys (u16 for the
// 16-bit dtypes, u32 for f32), the selection (index order: u32 columns;
// score order: u64 composites))
//   1. Load the row's len elements once (16-byte loads where aligned, 8
//      groups in flight a lane on sm_90+, 4 before) as order keys (common/keys.cuh) into the
//      slab, with their min and max (warp reductions).
//   2. len > k: the exact MSD radix select of short_select over the key
//      range [min, max], 8-bit digits from the range's top bit (256 bins a
//      warp, 8 a lane; <= 4 passes over 32-bit keys, <= 2 over 16-bit ones;
//      none for an all-equal row), the keys read 16 bytes at a time; the
//      crossing bin found by a warp scan, its lane by a ballot, broadcast
//      by shuffles.
//   3. Gather in column order, four 32-column chunks a step (their keys
//      read first): every key above the range and, of those in it, the
//      `need` lowest columns; two ballots a chunk place each. The sweep
//      stops once m = min(k, len) are placed.
//   4. Score order: a warp bitonic sort of the m composites (descending) in
//      the slab (a lane's pairs of a stage loaded four at a time). Index
//      order: the gather's order already.
//   5. The write (as short_impl, a lane where a thread was; values rebuilt
//      from the keys): indices and values, or the token write
//      (select/tokens.cuh: ratio ids per column, the tail, -1, counts,
//      page-table slots). A row that selects nothing (a QSA copy row,
//      V <= k; an empty or out-of-range row) reads no score and only writes.
//
// INVARIANTS
//   - The selected set and both orders are short_impl's (composites are
//     unique within a row): the CPU engine's bytes.
//   - Only __syncwarp orders a warp's shared memory; no CTA barrier, so a
//     warp past the last row returns at once. Every loop with a shuffle or
//     ballot has a warp-uniform bound.
//   - The bins are all zero between passes (a lane zeroes the 8 it scans).
//   - Slab entries past len (the keys' 16-byte padding) are never used.
//
// COST
//   Per row: one read of each score; per key a conversion and a shared
//   store, per pass a shared read and an atomic, one ballot sweep; score
//   order a bitonic sort of n = m rounded up to a power of two (n/64
//   compare-exchanges a lane a stage); the write: `width` ids (tokens) or
//   k entries, coalesced. No barrier latency: rows are hidden by the other
//   warps in flight, as many as the slabs allow (1 KB + cols keys + k
//   entries a warp: a first-chunk bf16 row in index order 7 KB, 32 warps
//   an SM; f32 in score order 13 KB, 16).
//
// Compile-time values (the host passes them as -D): FS_SHORT_WARPS (warps a
// CTA, plan::SHORT_WARPS).
#ifndef FLASHSEL_SELECT_SHORT_WARP_CUH
#define FLASHSEL_SELECT_SHORT_WARP_CUH

#ifndef FS_SHORT_WARPS
#error "the host passes FS_SHORT_WARPS (plan::SHORT_WARPS)"
#endif

#include "select/short/kernel.cuh"

enum : int { WW = FS_SHORT_WARPS };
enum : int { WBITS = 8, WBINS = 1 << WBITS, WPER = WBINS / 32 };  // bins a lane scans
static_assert(WPER % 4 == 0, "a lane's bins in 16-byte groups");

// The slab's key type: 16-bit keys for the 16-bit dtypes (order_key < 2^16),
// so a 16-byte group of elements is one 16-byte group of keys either way.
template <int TAG>
struct WKey {
    typedef u16 T;
};
template <>
struct WKey<32> {
    typedef u32 T;
};

// Bytes of a warp's slab: the bins, the keys (cols of them, rounded up to
// 16 bytes), cap selection entries (index order: u32 columns; score order:
// u64 composites; rounded up to 16 bytes). plan::short_warp_smem_bytes is
// WW times this.
template <int TAG>
__device__ __forceinline__ u32 warp_slab_bytes(int cols, int cap, int order_index) {
    const u32 kb = (u32)cols * (u32)sizeof(typename WKey<TAG>::T);
    const u32 sb = (u32)cap * (order_index ? 4u : 8u);
    return 4u * WBINS + ((kb + 15u) & ~15u) + ((sb + 15u) & ~15u);
}

// The row's keys -> keys[0, len), and their min and max over the warp. U
// 16-byte groups in flight a lane (a 2,048-element bf16 row is one round).
template <int TAG>
__device__ __forceinline__ void warp_load(const void* row, int len, bool aligned, int nan_largest,
                                          typename WKey<TAG>::T* keys, u32& kmin, u32& kmax) {
    typedef Elem<TAG> E;
    typedef typename WKey<TAG>::T KT;
    constexpr int VEC = E::VEC;
    static_assert(VEC * sizeof(KT) == 16, "a group of elements is a group of keys");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int U = 8;
#else
    constexpr int U = 4;  // sm_8x: the 16-bit token kernels spill at 8 (<= 64 registers)
#endif
    const int lane = threadIdx.x & 31;
    u32 lo = ~0u, hi = 0u;
    int done = 0;
    if (aligned) {
        const int groups = len / VEC;
        const uint4* src = (const uint4*)row;
        for (int g0 = 0; g0 < groups; g0 += U * 32) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int g = g0 + u * 32 + lane;
                v[u] = g < groups ? __ldg(src + g) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int g = g0 + u * 32 + lane;
                if (g < groups) {
                    u32 kk[VEC];
#pragma unroll
                    for (int q = 0; q < VEC; ++q) {
                        kk[q] = order_key<TAG>(unpack<TAG>(v[u], q), nan_largest);
                        lo = min(lo, kk[q]);
                        hi = max(hi, kk[q]);
                    }
                    uint4 w;
                    if constexpr (VEC == 4) {
                        w = make_uint4(kk[0], kk[1], kk[2], kk[3]);
                    } else {
                        w = make_uint4(kk[0] | kk[1] << 16, kk[2] | kk[3] << 16, kk[4] | kk[5] << 16,
                                       kk[6] | kk[7] << 16);
                    }
                    ((uint4*)keys)[g] = w;
                }
            }
        }
        done = groups * VEC;
    }
    for (int i = done + lane; i < len; i += 32) {
        const u32 kq = order_key<TAG>(load_bits<TAG>(row, i), nan_largest);
        keys[i] = (KT)kq;
        lo = min(lo, kq);
        hi = max(hi, kq);
    }
    kmin = __reduce_min_sync(FULL_MASK, lo);
    kmax = __reduce_max_sync(FULL_MASK, hi);
    __syncwarp();  // the keys visible to every lane
}

// short_select for one warp (k < len): on return the keys in [lo, hi] hold
// the k-th largest, `above` keys lie above hi, and the selection is every
// key above hi plus the `need` lowest columns of those in [lo, hi]. hist
// (WBINS) is all zero on entry and on return. Keys are read 16 bytes at a
// time (the slab's keys are padded to 16 bytes; entries past len skipped).
template <int TAG>
__device__ __forceinline__ void warp_select(const typename WKey<TAG>::T* keys, int len, u32 k, u32* hist, u32& lo,
                                            u32& hi, u32& above, u32& need) {
    constexpr int KPV = 16 / (int)sizeof(typename WKey<TAG>::T);
    const int lane = threadIdx.x & 31;
    const int groups = (len + KPV - 1) / KPV;
    u32 cnt = (u32)len;  // keys in [lo, hi]
    above = 0;
    need = k;
    while (lo != hi && need != cnt) {  // warp-uniform
        const u32 r = hi - lo;
        const int shift = bit_len(r) > WBITS ? bit_len(r) - WBITS : 0;
        for (int g = lane; g < groups; g += 32) {
            const uint4 v = ((const uint4*)keys)[g];
#pragma unroll
            for (int q = 0; q < KPV; ++q) {
                const u32 d = unpack<TAG>(v, q) - lo;
                if (g * KPV + q < len && d <= r) atomicAdd(&hist[d >> shift], 1u);
            }
        }
        __syncwarp();
        // Lane l scans bins [WBINS - WPER (l + 1), WBINS - WPER l) from the
        // top, zeroing them for the next pass.
        const int b0 = WBINS - WPER * (lane + 1);
        u32 h[WPER], sum;
        const u32 incl = take_bins<WPER>(&hist[b0], h, sum, lane);
        u32 run = incl - sum;  // keys in the bins above this lane's
        const bool mine = run < need && need <= run + sum;  // exactly one lane
        const int owner = __ffs(__ballot_sync(FULL_MASK, mine)) - 1;
        u32 cb = 0, ca = 0, cc = 0;
        if (mine) {
#pragma unroll
            for (int j = WPER - 1; j >= 0; --j) {
                if (run < need && need <= run + h[j]) {
                    cb = (u32)(b0 + j);
                    ca = run;
                    cc = h[j];
                }
                run += h[j];
            }
        }
        cb = __shfl_sync(FULL_MASK, cb, owner);
        ca = __shfl_sync(FULL_MASK, ca, owner);
        cc = __shfl_sync(FULL_MASK, cc, owner);
        above += ca;
        need -= ca;
        cnt = cc;
        const u32 mask = (1u << shift) - 1u;
        lo += cb << shift;
        if (hi - lo > mask) hi = lo + mask;
        __syncwarp();  // every lane's bins zeroed before the next pass's atomics
    }
}

// The selection in column order into sel[0, m): every key above hi, and the
// `need` lowest columns of the keys in [lo, hi]; ballots place each, four
// 32-column chunks a step (their keys read first); it stops once m are
// placed (no chunk after that selects anything). Index order: the columns
// (sel32); score order: composites (sel64).
template <typename KT>
__device__ __forceinline__ void warp_gather(const KT* keys, int len, u32 lo, u32 hi, u32 need, u32 m, bool index,
                                            u32* sel32, u64* sel64) {
    constexpr int UG = 4;
    const u32 lane = threadIdx.x & 31, lt = lanes_below(), r = hi - lo;
    u32 inr = 0, outp = 0;
    for (u32 base = 0; base < (u32)len && outp < m; base += 32 * UG) {  // warp-uniform
        u32 key[UG];
#pragma unroll
        for (int u = 0; u < UG; ++u) {
            const u32 c = base + 32 * u + lane;
            key[u] = c < (u32)len ? (u32)keys[c] : 0u;
        }
#pragma unroll
        for (int u = 0; u < UG; ++u) {
            const u32 c = base + 32 * u + lane;
            const bool v = c < (u32)len;
            const bool in = v && key[u] - lo <= r;
            const u32 bi = __ballot_sync(FULL_MASK, in);
            const bool s = (v && key[u] > hi) || (in && inr + __popc(bi & lt) < need);
            const u32 bs = __ballot_sync(FULL_MASK, s);
            if (s) {
                const u32 p = outp + __popc(bs & lt);
                if (index) {
                    sel32[p] = c;
                } else {
                    sel64[p] = composite(key[u], c);
                }
            }
            inr += __popc(bi);
            outp += __popc(bs);
        }
    }
    __syncwarp();  // the selection visible to every lane
}

// Bitonic sort of sel[0, n) descending (n a power of two), one warp; a
// lane's compare-exchanges of a stage (disjoint pairs) loaded four at a
// time before any is stored.
__device__ __forceinline__ void warp_sort(u64* sel, u32 n) {
    constexpr u32 P = 4;
    const u32 lane = threadIdx.x & 31, half = n / 2;
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 t0 = lane; t0 < half; t0 += 32 * P) {
                u64 a[P], b[P];
                u32 ii[P];
#pragma unroll
                for (u32 q = 0; q < P; ++q) {
                    const u32 t = t0 + 32 * q;
                    ii[q] = 2 * t - (t & (stride - 1));
                    if (t < half) {
                        a[q] = sel[ii[q]];
                        b[q] = sel[ii[q] + stride];
                    }
                }
#pragma unroll
                for (u32 q = 0; q < P; ++q) {
                    const u32 t = t0 + 32 * q;
                    const bool desc = (ii[q] & size) == 0;
                    if (t < half && (a[q] < b[q]) == desc) {
                        sel[ii[q]] = b[q];
                        sel[ii[q] + stride] = a[q];
                    }
                }
            }
            __syncwarp();
        }
    }
}

// One row per warp: warp w of CTA x takes row rows - 1 - (x WW + w) (the
// longest rows of a causal chunk first). Dynamic shared memory: WW slabs of
// warp_slab_bytes.
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ void short_warp_impl(const Params& P) {
    typedef typename WKey<TAG>::T KT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    CHAIN_WAIT();
    CHAIN_TRIGGER();
    const int row = P.rows - 1 - ((int)blockIdx.x * WW + warp);
    if (row < 0) return;  // warp-uniform; no CTA barrier follows
    const bool index = P.order_index != 0;
    char* slab = (char*)dyn_smem + (u32)warp * warp_slab_bytes<TAG>(P.cols, P.cap, P.order_index);
    u32* hist = (u32*)slab;
    KT* keys = (KT*)(slab + 4 * WBINS);
    void* selp = slab + 4 * WBINS + ((((u32)P.cols * (u32)sizeof(KT)) + 15u) & ~15u);
    u32* sel32 = (u32*)selp;  // index order: columns
    u64* sel64 = (u64*)selp;  // score order: composites
    TokRow tr;
    int len;
    const void* row_scores = short_row<TAG, TOK>(P, row, tr, len);
    const u32 k = (u32)P.k;
    const u32 m = min(k, (u32)len);
    if (m > 0) {
        u32 lo, hi;
        warp_load<TAG>(row_scores, len, aligned16(row_scores), P.nan_largest, keys, lo, hi);
        u32 above = 0, need = (u32)len;
        if ((u32)len > k) {
#pragma unroll
            for (int j = 0; j < WPER; j += 4) *(uint4*)&hist[WPER * lane + j] = make_uint4(0, 0, 0, 0);
            __syncwarp();
            warp_select<TAG>(keys, len, k, hist, lo, hi, above, need);
        }
        warp_gather(keys, len, lo, hi, need, m, index, sel32, sel64);
        if (!index && m > 1) {
            const u32 n = 1u << bit_len(m - 1);
            for (u32 i = m + lane; i < n; i += 32) sel64[i] = 0ull;  // below every composite
            __syncwarp();
            warp_sort(sel64, n);
        }
    }
    // The write: entry s of the selection, in output order.
    auto sel_col = [&](u32 s) -> u32 { return index ? sel32[s] : composite_col(sel64[s]); };
    auto sel_key = [&](u32 s, u32 col) -> u32 { return index ? (u32)keys[col] : (u32)(sel64[s] >> 32); };
    if constexpr (TOK) {
        const Tokens& T = P.tok;
        const long long o0 = (long long)row * T.width;
        const u32 ratio = (u32)T.ratio;
        if (tok_write_ids<32>(P, row, tr, m, (u32)lane, sel_col)) return;
        const u32 nsel = m * ratio;
        // j = s * ratio + i, kept incrementally (no divide per entry).
        u32 s = (u32)lane / ratio, i = (u32)lane - s * ratio;
        const u32 ds = 32u / ratio, di = 32u - ds * ratio;
#pragma unroll 2
        for (u32 j = lane; j < (u32)T.width; j += 32) {
            int id;
            u32 col = 0;
            if (j < nsel) {
                col = sel_col(s);
                id = tok_id(T, tr, tr.start + (int)(col * ratio + i));
            } else {
                id = tok_rest(T, tr, j - nsel);
            }
            P.out_idx[o0 + j] = id;
            if (P.out_val) {
                if (j < nsel) {
                    store_bits<TAG>(P.out_val, o0 + j, value_bits<TAG>(sel_key(s, col), row_scores, col));
                } else {
                    store_bits<TAG>(P.out_val, o0 + j, Elem<TAG>::NEG_INF);
                }
            }
            s += ds;
            i += di;
            if (i >= ratio) {
                i -= ratio;
                ++s;
            }
        }
        if (lane == 0 && T.counts) T.counts[row] = tok_count(T, tr, m);
    } else {
        for (u32 j = lane; j < k; j += 32) {
            const long long o = (long long)row * (long long)k + j;
            if (j < m) {
                const u32 col = sel_col(j);
                P.out_idx[o] = (int)col;
                if (P.out_val) store_bits<TAG>(P.out_val, o, value_bits<TAG>(sel_key(j, col), row_scores, col));
            } else {
                write_padding<TAG>(P.out_idx, P.out_val, o);
            }
        }
    }
}

#endif  // FLASHSEL_SELECT_SHORT_WARP_CUH
