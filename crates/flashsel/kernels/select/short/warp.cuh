// The short-row path's warp-per-row body (short_warp_impl; entries
// fs_short_warp_* and fs_short_warp_tok_* in select/short.cu): the same
// selection as short_impl (select/short/kernel.cuh), but each warp of a CTA
// owns one row and nothing waits on a CTA barrier, so a row pays a warp's
// latency only (issue 21: QSA's first chunk, 8192 rows of V = 0 .. 2,048
// blocks, where the CTA-per-row kernel's barriers dominate).
//
// ALGORITHM (one row per warp, FS_SHORT_WARPS warps a CTA, each with its own
// slab of dynamic shared memory: 256 bins, the row's keys, the selection)
//   1. Load the row's len elements once (16-byte loads where aligned, U
//      groups in flight a lane) as order keys (common/keys.cuh) into the
//      slab, with their min and max (warp reductions).
//   2. len > k: the exact MSD radix select of short_select over the key
//      range [min, max], 8-bit digits from the range's top bit (256 bins a
//      warp, 8 a lane; <= 4 passes over 32-bit keys, <= 2 over 16-bit ones;
//      none for an all-equal row); the crossing bin found by a warp scan,
//      its lane by a ballot, broadcast by shuffles.
//   3. Gather in column order in one sweep of 32 columns at a time: every
//      key above the range and, of those in it, the `need` lowest columns,
//      as composites key << 32 | ~column; two ballots place each. The sweep
//      stops once m = min(k, len) are placed.
//   4. Score order: a warp bitonic sort of the m composites (descending) in
//      the slab. Index order: the gather's order already.
//   5. The write (as short_impl, a lane where a thread was): indices and
//      values, or the token write (select/tokens.cuh: ratio ids per column,
//      the tail, -1, counts, page-table slots). A row that selects nothing
//      (a QSA copy row, V <= k; an empty or out-of-range row) reads no score
//      and only writes.
//
// INVARIANTS
//   - The selected set and both orders are short_impl's (composites are
//     unique within a row): the CPU engine's bytes.
//   - Only __syncwarp orders a warp's shared memory; no CTA barrier, so a
//     warp past the last row returns at once. Every loop with a shuffle or
//     ballot has a warp-uniform bound.
//   - The bins are all zero between passes (a lane zeroes the 8 it scans).
//
// COST
//   Per row: one read of each score; per key a conversion and a shared
//   store, per pass a shared read and an atomic, one ballot sweep; score
//   order a bitonic sort of n = m rounded up to a power of two (n/64
//   compare-exchanges a lane a stage); the write: `width` ids (tokens) or
//   k entries, coalesced. No barrier latency: rows are hidden by the other
//   warps in flight (shared memory sets how many: 4 KB + 4 cols + 8 k bytes
//   a warp).
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

// u32 words of a warp's slab: the bins, the keys (cols rounded up to 4),
// cap composites (rounded up to 2): every part 16-byte aligned
// (plan::short_warp_smem_bytes is WW times this, in bytes).
__device__ __forceinline__ u32 warp_slab_words(int cols, int cap) {
    return (u32)WBINS + (((u32)cols + 3u) & ~3u) + (((u32)cap + 1u) & ~1u) * 2u;
}

// The row's keys -> keys[0, len), and their min and max over the warp.
template <int TAG>
__device__ __forceinline__ void warp_load(const void* row, int len, bool aligned, int nan_largest, u32* keys,
                                          u32& kmin, u32& kmax) {
    typedef Elem<TAG> E;
    constexpr int VEC = E::VEC;
    constexpr int U = 4;
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
                    uint4* dst = (uint4*)(keys + g * VEC);
#pragma unroll
                    for (int q = 0; q < VEC; q += 4) dst[q / 4] = make_uint4(kk[q], kk[q + 1], kk[q + 2], kk[q + 3]);
                }
            }
        }
        done = groups * VEC;
    }
    for (int i = done + lane; i < len; i += 32) {
        const u32 kq = order_key<TAG>(load_bits<TAG>(row, i), nan_largest);
        keys[i] = kq;
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
// (WBINS) is all zero on entry and on return.
__device__ __forceinline__ void warp_select(const u32* keys, int len, u32 k, u32* hist, u32& lo, u32& hi,
                                            u32& above, u32& need) {
    const int lane = threadIdx.x & 31;
    u32 cnt = (u32)len;  // keys in [lo, hi]
    above = 0;
    need = k;
    while (lo != hi && need != cnt) {  // warp-uniform
        const u32 r = hi - lo;
        const int shift = bit_len(r) > WBITS ? bit_len(r) - WBITS : 0;
        for (int i = lane; i < len; i += 32) {
            const u32 d = keys[i] - lo;
            if (d <= r) atomicAdd(&hist[d >> shift], 1u);
        }
        __syncwarp();
        // Lane l scans bins [WBINS - WPER (l + 1), WBINS - WPER l) from the
        // top, zeroing them for the next pass.
        const int b0 = WBINS - WPER * (lane + 1);
        u32 h[WPER];
#pragma unroll
        for (int j = 0; j < WPER; j += 4) {
            uint4* p = (uint4*)&hist[b0 + j];
            const uint4 v = *p;
            h[j] = v.x;
            h[j + 1] = v.y;
            h[j + 2] = v.z;
            h[j + 3] = v.w;
            *p = make_uint4(0, 0, 0, 0);
        }
        u32 sum = 0;
#pragma unroll
        for (int j = 0; j < WPER; ++j) sum += h[j];
        u32 incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += v;
        }
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
// `need` lowest columns of the keys in [lo, hi]; one sweep, ballots place
// each; it stops once m are placed.
__device__ __forceinline__ void warp_gather(const u32* keys, int len, u32 lo, u32 hi, u32 need, u32 m, u64* sel) {
    const u32 lane = threadIdx.x & 31, lt = lanes_below(), r = hi - lo;
    u32 inr = 0, outp = 0;
    for (u32 base = 0; base < (u32)len && outp < m; base += 32) {  // warp-uniform
        const u32 c = base + lane;
        const bool v = c < (u32)len;
        const u32 key = v ? keys[c] : 0u;
        const bool in = v && key - lo <= r;
        const u32 bi = __ballot_sync(FULL_MASK, in);
        const bool s = (v && key > hi) || (in && inr + __popc(bi & lt) < need);
        const u32 bs = __ballot_sync(FULL_MASK, s);
        if (s) sel[outp + __popc(bs & lt)] = composite(key, c);
        inr += __popc(bi);
        outp += __popc(bs);
    }
    __syncwarp();  // the selection visible to every lane
}

// Bitonic sort of sel[0, n) descending (n a power of two), one warp.
__device__ __forceinline__ void warp_sort(u64* sel, u32 n) {
    const u32 lane = threadIdx.x & 31;
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 t = lane; t < n / 2; t += 32) {
                const u32 i = 2 * t - (t & (stride - 1));
                const u32 j = i + stride;
                const u64 a = sel[i], b = sel[j];
                const bool desc = (i & size) == 0;
                if ((a < b) == desc) {
                    sel[i] = b;
                    sel[j] = a;
                }
            }
            __syncwarp();
        }
    }
}

// One row per warp: warp w of CTA x takes row rows - 1 - (x WW + w) (the
// longest rows of a causal chunk first). Dynamic shared memory: WW slabs of
// warp_slab_words(P.cols, P.cap) words.
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ void short_warp_impl(const Params& P) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    CHAIN_WAIT();
    CHAIN_TRIGGER();
    const int row = P.rows - 1 - ((int)blockIdx.x * WW + warp);
    if (row < 0) return;  // warp-uniform; no CTA barrier follows
    u32* hist = (u32*)dyn_smem + (u32)warp * warp_slab_words(P.cols, P.cap);
    u32* keys = hist + WBINS;
    u64* sel = (u64*)(keys + (((u32)P.cols + 3u) & ~3u));
    TokRow tr = {0, 0, 0, 0, 0};
    int len;
    if constexpr (TOK) {
        tr = tok_row(P, row);
        len = tr.len;
    } else {
        len = row_length(P.lengths, row, P.cols);
    }
    const void* row_scores =
        (const char*)row_start<TAG>(P, row) + (long long)tr.start * (long long)sizeof(typename Elem<TAG>::raw);
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
            warp_select(keys, len, k, hist, lo, hi, above, need);
        }
        warp_gather(keys, len, lo, hi, need, m, sel);
        if (!P.order_index && m > 1) {
            const u32 n = 1u << bit_len(m - 1);
            for (u32 i = m + lane; i < n; i += 32) sel[i] = 0ull;  // below every composite
            __syncwarp();
            warp_sort(sel, n);
        }
    }
    // The write: sel[0, m) in output order.
    if constexpr (TOK) {
        const Tokens& T = P.tok;
        const long long o0 = (long long)row * T.width;
        const u32 ratio = (u32)T.ratio;
        const u32 nsel = m * ratio;
        // j = s * ratio + i, kept incrementally (no divide per entry).
        u32 s = (u32)lane / ratio, i = (u32)lane - s * ratio;
        const u32 ds = 32u / ratio, di = 32u - ds * ratio;
        for (u32 j = lane; j < (u32)T.width; j += 32) {
            int id;
            if (j < nsel) {
                const u32 col = composite_col(sel[s]);
                id = tok_id(T, tr, tr.start + (int)(col * ratio + i));
            } else {
                id = tok_rest(T, tr, j - nsel);
            }
            P.out_idx[o0 + j] = id;
            if (P.out_val) {
                if (j < nsel) {
                    const u64 c = sel[s];
                    store_bits<TAG>(P.out_val, o0 + j, value_bits<TAG>((u32)(c >> 32), row_scores, composite_col(c)));
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
                const u64 c = sel[j];
                const u32 col = composite_col(c);
                P.out_idx[o] = (int)col;
                if (P.out_val) store_bits<TAG>(P.out_val, o, value_bits<TAG>((u32)(c >> 32), row_scores, col));
            } else {
                write_padding<TAG>(P.out_idx, P.out_val, o);
            }
        }
    }
}

#endif  // FLASHSEL_SELECT_SHORT_WARP_CUH
