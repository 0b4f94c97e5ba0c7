// The short-row path's body (short_impl), shared by the plain kernels
// (fs_short_*: indices and values) and the token form (fs_short_tok_*:
// ranges, QSA blocks, slots; select/tokens.cuh). Described in
// select/short.cu.
#ifndef FLASHSEL_SELECT_SHORT_KERNEL_CUH
#define FLASHSEL_SELECT_SHORT_KERNEL_CUH

#ifndef FS_SHORT_BLOCK
#error "the host passes FS_SHORT_BLOCK (plan::SHORT_BLOCK)"
#endif

#include "common/pdl.cuh"
#include "select/filter/params.cuh"

enum : int { SB = FS_SHORT_BLOCK, SWARPS = FS_SHORT_BLOCK / 32 };
enum : int { SBITS = 11, SBINS = 1 << SBITS };  // radix digits: <= 3 passes over 32-bit keys
enum : int { SPER = SBINS / SB };               // bins a thread scans
static_assert(SB % 32 == 0 && SBINS % (4 * SB) == 0, "bins split into 16-byte groups a thread");
static_assert(SWARPS <= 32, "one lane per warp partial");

struct ShortShared {
    u32 hist[SBINS];
    u32 part[2 * SWARPS];  // per-warp partials
    u32 red[2 * SWARPS];   // per-warp key min / max
    u32 cross_bin, cross_above, cross_cnt;
};

__device__ __forceinline__ u32 lanes_below() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// A thread's PER consecutive bins (16-byte aligned) read into h and
// cleared, their sum, and the warp's inclusive scan of the sums in lane
// order (the caller's bins run from the top, lane 0 first).
template <int PER>
__device__ __forceinline__ u32 take_bins(u32* bins, u32 (&h)[PER], u32& sum, int lane) {
    static_assert(PER % 4 == 0, "whole 16-byte reads");
#pragma unroll
    for (int j = 0; j < PER; j += 4) {
        uint4* p = (uint4*)&bins[j];
        const uint4 v = *p;
        h[j] = v.x;
        h[j + 1] = v.y;
        h[j + 2] = v.z;
        h[j + 3] = v.w;
        *p = make_uint4(0, 0, 0, 0);
    }
    sum = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) sum += h[j];
    u32 incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += v;
    }
    return incl;
}

// The CTA's min and max of the threads' lo and hi (NW warps; red: 2 NW
// words of shared memory), returned to every thread.
template <int NW>
__device__ __forceinline__ void cta_min_max(u32 lo, u32 hi, u32* red, u32& kmin, u32& kmax) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    lo = __reduce_min_sync(FULL_MASK, lo);
    hi = __reduce_max_sync(FULL_MASK, hi);
    if (lane == 0) {
        red[warp] = lo;
        red[NW + warp] = hi;
    }
    __syncthreads();
    const bool in = lane < NW;
    kmin = __reduce_min_sync(FULL_MASK, in ? red[lane] : ~0u);
    kmax = __reduce_max_sync(FULL_MASK, in ? red[NW + lane] : 0u);
}

// A short row's extent: its token description (TOK; else zero) and length,
// and (returned) its first score.
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ const void* short_row(const Params& P, int row, TokRow& tr, int& len) {
    tr = TokRow{0, 0, 0, 0, 0};
    if constexpr (TOK) {
        tr = tok_row(P, row);
        len = tr.len;
    } else {
        len = row_length(P.lengths, row, P.cols);
    }
    return (const char*)row_start<TAG>(P, row) + (long long)tr.start * (long long)sizeof(typename Elem<TAG>::raw);
}

// The row's keys -> keys[0, len), and (returned) their min and max over the
// CTA. Vector loads where the row start is 16-byte aligned, U groups in
// flight a thread.
template <int TAG>
__device__ __forceinline__ void short_load(const void* row, int len, bool aligned, int nan_largest, u32* keys,
                                           ShortShared& sh, u32& kmin, u32& kmax) {
    typedef Elem<TAG> E;
    constexpr int VEC = E::VEC;
    constexpr int U = 4;
    const int tid = threadIdx.x;
    u32 lo = ~0u, hi = 0u;
    int done = 0;
    if (aligned) {
        const int groups = len / VEC;
        const uint4* src = (const uint4*)row;
        for (int g0 = 0; g0 < groups; g0 += U * SB) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int g = g0 + u * SB + tid;
                v[u] = g < groups ? __ldg(src + g) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int g = g0 + u * SB + tid;
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
    for (int i = done + tid; i < len; i += SB) {
        const u32 kq = order_key<TAG>(load_bits<TAG>(row, i), nan_largest);
        keys[i] = kq;
        lo = min(lo, kq);
        hi = max(hi, kq);
    }
    cta_min_max<SWARPS>(lo, hi, sh.red, kmin, kmax);
}

// After a radix pass: the range narrows to its crossing bin (sh.cross_bin,
// bins of 2^shift keys from lo): lo moves to the bin's lower edge and hi to
// at most its upper one, the bins above it leave the range (`above` gains
// and `need` loses their keys) and cnt becomes the bin's keys. Sh: the
// kernel's shared state (cross_bin, cross_above, cross_cnt).
template <typename Sh>
__device__ __forceinline__ void take_crossing(const Sh& sh, int shift, u32& lo, u32& hi, u32& above, u32& need,
                                              u32& cnt) {
    const u32 b = sh.cross_bin, up = sh.cross_above, c = sh.cross_cnt;  // read once (the refs may alias)
    above += up;
    need -= up;
    cnt = c;
    const u32 mask = (1u << shift) - 1u;
    lo += b << shift;
    if (hi - lo > mask) hi = lo + mask;
}

// Exact radix select of the k-th largest key among keys[0, len) (k < len):
// on return the keys in [lo, hi] hold the k-th, `above` keys lie above hi,
// and the selection is every key above hi plus the `need` lowest columns of
// those in [lo, hi] (need == their count: all of them). Each pass bins the
// keys in [lo, hi] by their offset from lo (11-bit digits from the range's
// top bit) and keeps the crossing bin; it ends when the range is one key
// (at most 3 passes) or the crossing bin is wanted whole. sh.hist is all
// zero on entry and on return.
__device__ __forceinline__ void short_select(const u32* keys, int len, u32 k, ShortShared& sh, u32& lo, u32& hi,
                                             u32& above, u32& need) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32 cnt = (u32)len;  // keys in [lo, hi]
    above = 0;
    need = k;
    while (lo != hi && need != cnt) {  // uniform
        const u32 r = hi - lo;
        const int shift = bit_len(r) > SBITS ? bit_len(r) - SBITS : 0;
        for (int i = tid; i < len; i += SB) {
            const u32 d = keys[i] - lo;
            if (d <= r) atomicAdd(&sh.hist[d >> shift], 1u);
        }
        __syncthreads();
        // Thread t scans bins [SBINS - SPER (t + 1), SBINS - SPER t) from the
        // top, zeroing them for the next pass.
        const int b0 = SBINS - SPER * (tid + 1);
        u32 h[SPER], sum;
        const u32 incl = take_bins<SPER>(&sh.hist[b0], h, sum, lane);
        if (lane == 31) sh.part[warp] = incl;
        __syncthreads();
        u32 run = incl - sum;  // bins above this thread's, from the top
#pragma unroll
        for (int w = 0; w < SWARPS; ++w) run += w < warp ? sh.part[w] : 0u;
        if (run < need && need <= run + sum) {  // exactly one thread
#pragma unroll
            for (int j = SPER - 1; j >= 0; --j) {
                if (run < need && need <= run + h[j]) {
                    sh.cross_bin = (u32)(b0 + j);
                    sh.cross_above = run;
                    sh.cross_cnt = h[j];
                }
                run += h[j];
            }
        }
        __syncthreads();
        take_crossing(sh, shift, lo, hi, above, need, cnt);
        __syncthreads();  // the crossing bin read before the next pass writes it
    }
}

// The selected set in column order into sel[0, m) as composites: every key
// above hi, and the `need` lowest columns of the keys in [lo, hi]. Warp w
// owns a contiguous run of columns; ballots give each selected key its place.
__device__ __forceinline__ void short_gather(const u32* keys, int len, u32 lo, u32 hi, u32 need, u64* sel,
                                             ShortShared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 seg = (((u32)len + 32 * SWARPS - 1) / (32 * SWARPS)) * 32;
    const u32 w0 = (u32)warp * seg;
    const u32 w1 = min((u32)len, w0 + seg);
    const u32 r = hi - lo, lt = lanes_below();
    u32 na = 0, ni = 0;
    for (u32 base = w0; base < w1; base += 32) {  // warp-uniform
        const u32 c = base + lane;
        const bool v = c < w1;
        const u32 key = v ? keys[c] : 0u;
        na += __popc(__ballot_sync(FULL_MASK, v && key > hi));
        ni += __popc(__ballot_sync(FULL_MASK, v && key - lo <= r));
    }
    if (lane == 0) {
        sh.part[warp] = na;
        sh.part[SWARPS + warp] = ni;
    }
    __syncthreads();
    u32 inr = 0, outp = 0;
#pragma unroll
    for (int w = 0; w < SWARPS; ++w) {
        if (w < warp) {
            const u32 a = sh.part[w], i = sh.part[SWARPS + w];
            outp += a + min(i, need - min(need, inr));
            inr += i;
        }
    }
    for (u32 base = w0; base < w1; base += 32) {
        const u32 c = base + lane;
        const bool v = c < w1;
        const u32 key = v ? keys[c] : 0u;
        const bool in = v && key - lo <= r;
        const u32 bi = __ballot_sync(FULL_MASK, in);
        const bool s = (v && key > hi) || (in && inr + __popc(bi & lt) < need);
        const u32 bs = __ballot_sync(FULL_MASK, s);
        if (s) sel[outp + __popc(bs & lt)] = composite(key, c);
        inr += __popc(bi);
        outp += __popc(bs);
    }
}

// Bitonic sort of sel[0, n) descending (n a power of two).
__device__ __forceinline__ void short_sort(u64* sel, u32 n) {
    for (u32 size = 2; size <= n; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 t = threadIdx.x; t < n / 2; t += SB) {
                const u32 i = 2 * t - (t & (stride - 1));
                const u32 j = i + stride;
                const u64 a = sel[i], b = sel[j];
                const bool desc = (i & size) == 0;
                if ((a < b) == desc) {
                    sel[i] = b;
                    sel[j] = a;
                }
            }
            __syncthreads();
        }
    }
}

// The write of a row whose selection is sel[0, m) in output order, by a CTA
// of NT threads: plain indices and values (values rebuilt from the keys,
// the merged encodings read back), or the token write (ratio ids per
// selected column, the tail, -1, counts, page-table slots).
template <int TAG, bool TOK, int NT, typename Params>
__device__ __forceinline__ void short_write(const Params& P, int row, const TokRow& tr, u32 m, const u64* sel,
                                            const void* row_scores) {
    const int tid = threadIdx.x;
    const u32 k = (u32)P.k;
    if constexpr (TOK) {
        const Tokens& T = P.tok;
        const long long o0 = (long long)row * T.width;
        const u32 ratio = (u32)T.ratio;
        if (tok_write_ids<NT>(P, row, tr, m, (u32)tid, [&](u32 s) { return composite_col(sel[s]); })) return;
        const u32 nsel = m * ratio;
        // j = s * ratio + i, kept incrementally (no divide per entry).
        u32 s = (u32)tid / ratio, i = (u32)tid - s * ratio;
        const u32 ds = (u32)NT / ratio, di = (u32)NT - ds * ratio;
        for (u32 j = tid; j < (u32)T.width; j += NT) {
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
        if (tid == 0 && T.counts) T.counts[row] = tok_count(T, tr, m);
    } else {
        for (u32 j = tid; j < k; j += NT) {
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

// One row per CTA (grid x: rows, the longest-first order of a causal
// chunk: CTA x takes row rows - 1 - x). Dynamic shared memory: the keys
// (P.cols rounded up to 4), then P.cap composites of the selection.
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ void short_impl(const Params& P) {
    __shared__ ShortShared sh;
    const int tid = threadIdx.x;
    u32* keys = (u32*)dyn_smem;
    u64* sel = (u64*)(keys + ((P.cols + 3) & ~3));
    CHAIN_WAIT();
    CHAIN_TRIGGER();
    for (int i = tid; i < SBINS; i += SB) sh.hist[i] = 0;
    const int row = P.rows - 1 - (int)blockIdx.x;
    TokRow tr;
    int len;
    const void* row_scores = short_row<TAG, TOK>(P, row, tr, len);
    const u32 k = (u32)P.k;
    const u32 m = min(k, (u32)len);
    if (m > 0) {
        u32 lo, hi;
        short_load<TAG>(row_scores, len, aligned16(row_scores), P.nan_largest, keys, sh, lo, hi);
        u32 above = 0, need = (u32)len;
        if ((u32)len > k) {
            short_select(keys, len, k, sh, lo, hi, above, need);
        }
        short_gather(keys, len, lo, hi, need, sel, sh);
        __syncthreads();
        if (!P.order_index && m > 1) {
            const u32 n = 1u << bit_len(m - 1);
            for (u32 i = m + tid; i < n; i += SB) sel[i] = 0ull;  // below every composite
            __syncthreads();
            short_sort(sel, n);
        }
    }
    short_write<TAG, TOK, SB>(P, row, tr, m, sel, row_scores);
}

#endif  // FLASHSEL_SELECT_SHORT_KERNEL_CUH
