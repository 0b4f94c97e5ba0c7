// The finish of a row: the top min(k, n) of the buffer in output order
// (bucket rank, else radix select and a bitonic sort), then the row's
// indices and values.
#ifndef FLASHSEL_SELECT_FILTER_FINISH_CUH
#define FLASHSEL_SELECT_FILTER_FINISH_CUH

#include "select/filter/compact.cuh"
#include "select/filter/sort.cuh"
#include "select/filter/span.cuh"

// Writes the final row: the m sorted composites, then padding to k. `span`:
// the row's first score.
template <int TAG>
__device__ void write_row(const u64* buf, u32 m, int order_index, int k, int* out_idx, void* out_val,
                          const void* span, long long row) {
    for (u32 j = threadIdx.x; j < (u32)k; j += FS_BLOCK) {
        const long long o = row * (long long)k + j;
        if (j < m) {
            u64 c = buf[j];
            if (order_index) c = (c << 32) | (c >> 32);
            const u32 col = composite_col(c);  // the plain kernels take no head (span.cuh)
            out_idx[o] = (int)col;
            if (out_val) store_bits<TAG>(out_val, o, value_bits<TAG>((u32)(c >> 32), span, col));
        } else {
            write_padding<TAG>(out_idx, out_val, o);
        }
    }
}

// The token form of write_row (the *_tok_* kernels, select/tokens.cuh): the
// m sorted composites as `ratio` ids each, the tail, -1 to the row's width,
// and the row's count; values (ratio 1 only, the host checks) as write_row's.
template <int TAG, bool HEAD, typename Params>
__device__ void write_tokens(const u64* buf, u32 m, int order_index, const Params& P, const void* span, int row) {
    const Tokens& T = P.tok;
    const TokRow r = *tok_stash();
    const long long o0 = (long long)row * T.width;
    const u32 sel = m * (u32)T.ratio;
    for (u32 j = threadIdx.x; j < (u32)T.width; j += FS_BLOCK) {
        if (j < sel) {
            const u32 s = j / (u32)T.ratio, i = j - s * (u32)T.ratio;
            u64 c = buf[s];
            if (order_index) c = (c << 32) | (c >> 32);
            const u32 col = span_col<TAG, HEAD>(composite_col(c), span);
            P.out_idx[o0 + j] = tok_id(T, r, r.start + (int)col * T.ratio + (int)i);
            if (P.out_val) store_bits<TAG>(P.out_val, o0 + j, value_bits<TAG>((u32)(c >> 32), span, col));
        } else {
            P.out_idx[o0 + j] = tok_rest(T, r, j - sel);
            if (P.out_val) store_bits<TAG>(P.out_val, o0 + j, Elem<TAG>::NEG_INF);
        }
    }
    if (threadIdx.x == 0 && T.counts) T.counts[row] = tok_count(T, r, m);
}

// BUCKET-RANK FINISH. Selects and sorts in one pass when the candidates spread
// out: n composites -> the m largest, in descending order.
//   1. the range of the n composites' key words and column words; the bucket
//      of c is the top of its key offset, followed, when the keys span fewer
//      than NB_BITS bits, by the top of its column offset (Buckets), so
//      buckets are ordered as the composites (and tied keys, as in bf16,
//      still spread out by column).
//   2. histogram, then an exclusive scan from the top bucket down: where each
//      bucket's elements go in the output.
//   3. scatter into bucket order (tmp), then each element's rank inside its
//      bucket (how many of the bucket are larger: one pass over the bucket)
//      gives its output position; positions >= m are dropped.
//   4. a bucket that reaches into the top m with more than RANK_MAX elements
//      (a plateau of tied keys among spread ones) goes through the same pass
//      on its own, where its keys are equal and its columns spread it out
//      (bucket_big); at most BIG_MAX of them.
// Returns false, having changed nothing in its input, when more buckets are
// that big or the scratch space is short; the caller then takes the general
// path (radix select + bitonic sort). Scratch past the input, in the buffer:
// tmp (n composites) and two NB-entry u32 tables, per level.
// Cost: ~6 barriers, 3 passes over n, and a bucket's size in shared reads per
// element.
enum : int { NB_BITS = 11 };  // bucket-rank buckets, bits (10 and 12 measured slower)
#define NB (1 << NB_BITS)
enum : int { RANK_MAX = 64 };  // largest bucket ranked in place (32 and 128 measured no faster)
#define BIG_MAX 4
#define BIG_LIST 128  // sh.hist[BIG_LIST ..]: the big buckets' ids
static_assert(NB % FS_BLOCK == 0, "bucket table must split evenly over the threads");


// The bucket of a composite, monotone in it (a larger composite never falls
// in a lower bucket).
// p = key offset << t | column offset >> s2 (where the
// key offsets span fewer than NB_BITS bits, as many column bits as fit in 32;
// else none), and the bucket p * scale
// / 2^32 with scale = floor(NB 2^32 / (pmax + 1)): the whole range of p
// spread over all NB buckets (p itself when pmax < NB). Power-of-two
// shifts instead round the range up and leave up to half the buckets empty:
// measured (H200, 2048 x 131,072, k 2048) the rank step 6.8K -> 5.8K cycles
// (f32) and 7.0K -> 6.0K (bf16) with the scale, the row -0.8% and -2.7%;
// ReLU-few +0.6% (the scale's divide, in each of its two passes).
struct Buckets {
    u32 kmin, lmin;
    int s1, s2, t2;
    u32 scale;
    __device__ __forceinline__ u32 of(u64 c) const {
        const u32 kd = (u32)(c >> 32) - kmin;
        const u32 p = t2 ? (kd << t2) | (((u32)c - lmin) >> s2) : kd;
        return scale ? __umulhi(p, scale) : p;
    }
    __device__ __forceinline__ void init(u32 kmin_, u32 kmax, u32 lmin_, u32 lmax) {
        kmin = kmin_;
        lmin = lmin_;
        const int kb = bit_len(kmax - kmin), lb = bit_len(lmax - lmin);
        // Column bits only where the keys span fewer than NB_BITS bits
        // (as below): a plateau of tied keys among spread ones stays one
        // bucket (one second pass), not a few. t2 <= 31: the composites
        // are unique and bucket_rank takes n >= 2, so kb >= 1 when the
        // low words span 32 bits (index order's swapped words).
        if (kb >= NB_BITS) {
            t2 = 0;  // p = kd
            s2 = 0;
        } else {
            s2 = kb + lb > 32 ? kb + lb - 32 : 0;
            t2 = lb - s2;
        }
        s1 = 0;
        const u32 pmax = t2 ? ((kmax - kmin) << t2) | ((lmax - lmin) >> s2) : kmax - kmin;  // >= every p
        // In float, from below (the u64 division cost ~750 cycles a
        // pass): the approximate divide is within 2 ulp, the rounding of
        // pmax 1, so 0.99998 keeps scale under the exact quotient and
        // every bucket under NB. Exactness needs only monotone buckets.
        scale = pmax < (u32)NB ? 0u
                               : (u32)(__fdividef((float)NB * 4294967296.0f, (float)pmax + 1.0f) * 0.99998f);
    }
};

// One bucket pass: in[0..n) -> out[0..m). Big buckets are left to the caller:
// their ids in sh.hist[BIG_LIST ..], their count in the return value (or
// ~0u when there are more than BIG_MAX: nothing was written then).
// tab: 2 NB u32 (counts, then ends after the scatter); tmp: n composites.
__device__ __noinline__ u32 bucket_pass(const u64* in, u32 n, u64* out, u32 m, u64* tmp, u32* tab, Shared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32* cnt = tab;
    u32* pos = tab + NB;
    u32* red = sh.hist;  // 4 x WARPS partials (the histogram is free here)
    long long t_prof = PROF_CLOCK();
    // Cycles since the last stamp into fs_prof[slot] (thread 0).
#define BUCKET_STAMP(slot) PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, slot)
    // 1. key and column ranges.
    u32 kmin = ~0u, kmax = 0, lmin = ~0u, lmax = 0;
    for (u32 i = tid; i < n; i += FS_BLOCK) {
        const u64 c = in[i];
        const u32 hi = (u32)(c >> 32), lo = (u32)c;
        kmin = min(kmin, hi);
        kmax = max(kmax, hi);
        lmin = min(lmin, lo);
        lmax = max(lmax, lo);
    }
    kmin = __reduce_min_sync(FULL_MASK, kmin);
    kmax = __reduce_max_sync(FULL_MASK, kmax);
    lmin = __reduce_min_sync(FULL_MASK, lmin);
    lmax = __reduce_max_sync(FULL_MASK, lmax);
    if (lane == 0) {
        red[warp] = kmin;
        red[WARPS + warp] = kmax;
        red[2 * WARPS + warp] = lmin;
        red[3 * WARPS + warp] = lmax;
    }
    for (u32 i = tid; i < NB; i += FS_BLOCK) cnt[i] = 0;
    if (tid == 0) sh.above = 0;  // big buckets reaching into the top m
    __syncthreads();
    Buckets bk;
    // Every warp reduces the partials, a lane each.
    static_assert(WARPS <= 32, "one lane per warp partial");
    {
        const bool in = lane < WARPS;
        kmin = __reduce_min_sync(FULL_MASK, in ? red[lane] : ~0u);
        kmax = __reduce_max_sync(FULL_MASK, in ? red[WARPS + lane] : 0u);
        lmin = __reduce_min_sync(FULL_MASK, in ? red[2 * WARPS + lane] : ~0u);
        lmax = __reduce_max_sync(FULL_MASK, in ? red[3 * WARPS + lane] : 0u);
    }
    bk.init(kmin, kmax, lmin, lmax);
    BUCKET_STAMP(PROF_BUCKET_RANGES);
    // 2. histogram and the scan from the top bucket down.
    for (u32 i = tid; i < n; i += FS_BLOCK) atomicAdd(&cnt[bk.of(in[i])], 1u);
    __syncthreads();
    constexpr int PER = NB / FS_BLOCK;
    u32 sum = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) sum += cnt[NB - 1 - (tid * PER + j)];
    u32 incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += v;
    }
    __syncthreads();  // every thread has read `red` before it is reused
    u32* wsum = sh.hist;
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    u32 run = incl - sum + __reduce_add_sync(FULL_MASK, lane < warp ? wsum[lane] : 0u);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const u32 b = NB - 1 - (tid * PER + j);
        const u32 cb = cnt[b];
        pos[b] = run;  // becomes the bucket's end after the scatter
        if (run < m && cb > RANK_MAX) {
            const u32 t = atomicAdd(&sh.above, 1u);
            if (t < BIG_MAX) sh.hist[BIG_LIST + t] = b;
        }
        run += cb;
    }
    __syncthreads();
    const u32 nbig = sh.above;
    BUCKET_STAMP(PROF_BUCKET_HIST);
    if (nbig > BIG_MAX) return ~0u;  // uniform; nothing written
    // 3. scatter into bucket order, then rank inside the bucket.
    for (u32 i = tid; i < n; i += FS_BLOCK) {
        const u64 v = in[i];
        tmp[atomicAdd(&pos[bk.of(v)], 1u)] = v;
    }
    __syncthreads();
    BUCKET_STAMP(PROF_BUCKET_SCATTER);
    for (u32 i = tid; i < n; i += FS_BLOCK) {
        const u64 v = tmp[i];
        const u32 b = bk.of(v);
        const u32 end = pos[b], s0 = end - cnt[b];
        if (s0 >= m || end - s0 > RANK_MAX) continue;
        u32 r = s0;
        for (u32 q = s0; q < end; ++q) r += tmp[q] > v;
        if (r < m) out[r] = v;
    }
    __syncthreads();
    BUCKET_STAMP(PROF_BUCKET_RANK);
#undef BUCKET_STAMP
    return nbig;
}

// The whole finish: buf[0..n) -> buf[0..m) sorted, two levels deep: a big
// bucket of the first pass gets a pass of its own (scratch permitting), and a
// big bucket of that one a bitonic sort. False: nothing changed.
__device__ bool bucket_rank(u64* buf, Shared& sh, u32 n, u32 m, u32 cap) {
    if (n < 2 || 2 * n + NB > cap) return false;  // uniform
    u64* tmp = buf + n;
    u32* tab = (u32*)(buf + 2 * n);
    const u32 nbig = bucket_pass(buf, n, buf, m, tmp, tab, sh);
    if (nbig == ~0u) return false;
    u32 big[BIG_MAX];
#pragma unroll
    for (int t = 0; t < BIG_MAX; ++t) big[t] = t < (int)nbig ? sh.hist[BIG_LIST + t] : 0;
    __syncthreads();  // big[] read before the next pass rewrites the list
    const u32 used = 2 * n + NB;  // buffer entries in use: buf, tmp, tables
    for (u32 t = 0; t < nbig; ++t) {  // uniform
        const u32 b = big[t];
        const u32 end = tab[NB + b], s0 = end - tab[b], len = end - s0;
        const u32 take = min(end, m) - s0;
        u32 nbig2 = ~0u;
        if (used + len + NB <= cap) {
            u64* tmp2 = buf + used;
            nbig2 = bucket_pass(tmp + s0, len, buf + s0, take, tmp2, (u32*)(tmp2 + len), sh);
            for (u32 t2 = 0; nbig2 != ~0u && t2 < nbig2; ++t2) {
                const u32 b2 = sh.hist[BIG_LIST + t2];
                u32* tab2 = (u32*)(tmp2 + len);
                const u32 e2 = tab2[NB + b2], z2 = e2 - tab2[b2];
                sort_desc_range(tmp2 + z2, e2 - z2);
                for (u32 i = threadIdx.x; z2 + i < min(e2, take); i += FS_BLOCK) buf[s0 + z2 + i] = tmp2[z2 + i];
                __syncthreads();
            }
        }
        if (nbig2 == ~0u) {  // no room or too many big buckets: sort the bucket
            sort_desc_range(tmp + s0, len);
            for (u32 i = threadIdx.x; i < take; i += FS_BLOCK) buf[s0 + i] = tmp[s0 + i];
            __syncthreads();
        }
    }
    return true;
}

// Finishes a row: the top min(k, count) in output order, then indices and
// values. Bucket-rank when the candidates spread out (after an intermediate
// compaction if the buffer lacks its scratch space), else an exact radix
// select and a bitonic sort. Index order sorts the selected set again by
// column (words swapped: the low word, 0xffffffff - column, leads).
// write(buf, m) writes the row (finish_row: indices and values;
// finish_row_tok: tokens).
template <int TAG, typename Write>
__device__ __forceinline__ void finish_with(u64* buf, Shared& sh, int k, int cap, int order_index, Write write) {
    __syncthreads();
    u32 n = sh.count;
    const u32 m = n < (u32)k ? n : (u32)k;
    const long long t0 = PROF_CLOCK();
    if (n > m && 2 * n + NB > (u32)cap) {
        compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, ((u32)cap - NB) / 2);
        n = sh.count;
    }
    const long long t1 = PROF_CLOCK();
    // (!!: the form of the measured build; a plain bool from the call compiles differently.)
    bool sorted = !!bucket_rank(buf, sh, n, m, (u32)cap);
    if (sorted && order_index) {
        for (u32 i = threadIdx.x; i < m; i += FS_BLOCK) buf[i] = (buf[i] << 32) | (buf[i] >> 32);
        __syncthreads();
        if (!bucket_rank(buf, sh, m, m, (u32)cap)) sort_desc(buf, m, 0);
    } else if (!sorted) {
        if (n > m) compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, m);
        if (m > 2 * FS_BLOCK && m <= 4 * FS_BLOCK) {  // the buffer holds >= 8 * FS_BLOCK entries
            sort_desc_regs(buf, m, order_index);
        } else {
            sort_desc(buf, m, order_index);
        }
    }
    const long long t2 = PROF_CLOCK();
    write(buf, m);
    __syncthreads();
    if (threadIdx.x == 0) {
        PROF_ADD(PROF_FINISH_COMPACT, t1 - t0);
        PROF_ADD(PROF_FINISH_SORT, t2 - t1);
        PROF_ADD(PROF_FINISH_WRITE, PROF_CLOCK() - t2);
        PROF_ADD(PROF_FINISH_CANDIDATES, n);
        PROF_ADD(PROF_BUCKET_FINISHES, sorted ? 1 : 0);
    }
}

template <int TAG>
__device__ void finish_row(u64* buf, Shared& sh, int k, int cap, int order_index, int* out_idx, void* out_val,
                           const void* span, long long row) {
    finish_with<TAG>(buf, sh, k, cap, order_index, [&](const u64* b, u32 m) {
        write_row<TAG>(b, m, order_index, k, out_idx, out_val, span, row);
    });
}

// The selection and sort of finish_row without its write: buf[0, m) holds
// the row's selection in output order; returns m. A call (noinline) whose
// arguments are plain values, so that the scan kernels' registers hold.
template <int TAG>
__device__ __noinline__ u32 finish_sorted(u64* buf, Shared& sh, int k, int cap, int order_index) {
    u32 selected = 0;
    finish_with<TAG>(buf, sh, k, cap, order_index, [&](const u64*, u32 m) { selected = m; });
    return selected;
}

// The token kernels' finish: finish_sorted, then write_tokens (from P.tok)
// in the kernel itself, so that P stays in the parameter space (a call that
// takes it by reference copies the block to the stack: measured spills).
// (Not finish_row with one more parameter: finish_row is a call, and its
// code would change.)
template <int TAG, bool HEAD, typename Params>
__device__ __forceinline__ void finish_row_tok(u64* buf, Shared& sh, int k, int cap, int order_index,
                                               const void* span, int row, const Params& P) {
    const u32 m = finish_sorted<TAG>(buf, sh, k, cap, order_index);
    write_tokens<TAG, HEAD>(buf, m, order_index, P, span, row);
    __syncthreads();
}

#endif  // FLASHSEL_SELECT_FILTER_FINISH_CUH
