// The index-order finish: the top m of n composites, in column order, without
// ordering them by score first.
//   1. one bucket count (bucket.cuh, steps 1-2) finds the bucket that holds
//      the m-th largest composite (the crossing bucket): the buckets above
//      it are taken whole, the crossing one is ranked inside itself (at most
//      RANK_MAX composites), the rest dropped. The selected m, unordered.
//   2. a bitmap over the candidates' column range gets a bit a selected
//      column; a prefix count over its words gives each selected composite
//      its place in column order (columns are unique in a row).
// The same set and order as bucket_rank by score, then by column (the
// composites are unique, so the top m is one set; the column alone orders it).
// Returns false, having written nothing in buf[0..n), when the crossing bucket
// is bigger than RANK_MAX (a plateau of tied keys among spread ones), when
// the column range is wider than INDEX_BITMAP_WORDS words, or when the
// scratch is short; the caller then takes bucket_rank.
// Scratch past the input, in the buffer: m + RANK_MAX composites, then 2 NB
// u32 (the bucket tables, then the bitmap of W <= NB words and its prefix
// counts).
// Cost: ~9 barriers, 3 passes over n (ranges, histogram, select), the
// bitmap's W words cleared and scanned, two passes over m.
#ifndef FLASHSEL_SELECT_FILTER_INDEX_ORDER_CUH
#define FLASHSEL_SELECT_FILTER_INDEX_ORDER_CUH

#include "select/filter/bucket.cuh"

// The bitmap's largest size in 32-bit words (65,536 columns): wider column
// ranges take bucket_rank's second pass, whose cost does not grow with the
// range. Measured (docs/perf-log.md v49, H100): 8,192 words (QSA decode 16 x
// 262,144 blocks, k 512) cost +5 us a call, 4,096 (DSA, 131,072 columns, k
// 2,048) gained nothing, 2,048 (QSA prefill) gained 5.6%. At W <= NB the
// bitmap and its prefix counts fit in the tables' scratch.
enum : u32 { INDEX_BITMAP_WORDS = NB };

// The order word of the filter kernels' parameters (host:
// ops/select/device.rs, order_word): 0 score order, 1 index order, 3 index
// order of rows wider than the bitmap (over 32 INDEX_BITMAP_WORDS columns),
// where finish_with does not try index_select (such rows would pay its
// bucket count before the decline). Every other reader takes it as a bool.
enum : int { ORDER_SCORE = 0, ORDER_INDEX = 1, ORDER_INDEX_WIDE = 3 };
static_assert(32 * INDEX_BITMAP_WORDS == 65536, "host: ops/select/device.rs, INDEX_BITMAP_COLS");
// sh.hist slots of the crossing bucket's facts (past bucket_count's partials).
enum : int { CROSS_AT = BIG_LIST, CROSS_ABOVE = BIG_LIST + 1, CROSS_LEN = BIG_LIST + 2 };

// buf[0..n) -> buf[0..m) as index order's word-swapped composites (the column
// word leading, descending: columns ascending). m <= n; cap: the buffer's
// composites of scratch.
__device__ __noinline__ bool index_select(u64* buf, Shared& sh, u32 n, u32 m, u32 cap) {
    if (n < 2 || m == 0) return false;  // uniform
    const int tid = threadIdx.x;
    // The buffer's scratch: the tables now, the bitmap once its range is known.
    const u64 fixed = (u64)n + m + RANK_MAX;
    if (fixed + NB > cap) return false;
    u64* sel = buf + n;         // the selected, unordered
    u64* cross = sel + m;       // the crossing bucket's composites
    u32* tab = (u32*)(cross + RANK_MAX);
    u32* cnt = tab;
    u32* pos = tab + NB;
    long long t_prof = PROF_CLOCK();
    if (tid == 0) {
        sh.hist[CROSS_AT] = ~0u;  // none: the top m end on a bucket boundary
        sh.hist[CROSS_ABOVE] = m;
        sh.hist[CROSS_LEN] = 0;
        sh.above = 0;  // appended to sel
        sh.bincnt = 0;  // appended to cross
    }
    u32 lmin, lmax;
    const Buckets bk = bucket_count(buf, n, cnt, pos, sh, lmin, lmax, t_prof, [&](u32 b, u32 run, u32 cb) {
        if (run < m && run + cb > m) {
            sh.hist[CROSS_AT] = b;
            sh.hist[CROSS_ABOVE] = run;
            sh.hist[CROSS_LEN] = cb;
        }
    });
    const u32 cb = sh.hist[CROSS_LEN], above = sh.hist[CROSS_ABOVE];
    const u32 words = ((lmax - lmin) >> 5) + 1;
    // Uniform; buf[0..n) untouched.
    // (words <= INDEX_BITMAP_WORDS = NB: the bitmap fits the tables' scratch,
    // checked above.)
    if (cb > RANK_MAX || words > INDEX_BITMAP_WORDS) return false;
    // 1. the buckets above the crossing one whole, the crossing one apart.
    for (u32 i0 = 0; i0 < n; i0 += FS_BLOCK) {  // whole warps: append's ballots
        const u32 i = i0 + tid;
        bool take = false, crossing = false;
        u64 v = 0;
        if (i < n) {
            v = buf[i];
            const u32 b = bk.of(v), s0 = pos[b];
            take = s0 + cnt[b] <= m;
            crossing = !take && s0 < m;
        }
        append(sel, &sh.above, take, v);
        append(cross, &sh.bincnt, crossing, v);
    }
    __syncthreads();
    // The crossing bucket's top m - above by rank inside it; meanwhile the
    // bitmap (over the tables: read no more) is cleared.
    u32* bits = tab;
    u32* pre = tab + words;
    if (tid < cb) {
        const u64 v = cross[tid];
        u32 r = 0;
        for (u32 q = 0; q < cb; ++q) r += cross[q] > v;
        if (r < m - above) sel[above + r] = v;
    }
    for (u32 w = tid; w < words; w += FS_BLOCK) bits[w] = 0;
    __syncthreads();
    PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, PROF_INDEX_SELECT);
    // 2. a bit a selected column (offset lmax - low word: columns ascending).
    for (u32 i = tid; i < m; i += FS_BLOCK) {
        const u32 o = lmax - (u32)sel[i];
        atomicOr(&bits[o >> 5], 1u << (o & 31));
    }
    __syncthreads();
    // Exclusive prefix counts of the words: each thread a run of them.
    const u32 per = (words + FS_BLOCK - 1) / FS_BLOCK, w0 = tid * per, w1 = min(words, w0 + per);
    u32 sum = 0;
    for (u32 w = w0; w < w1; ++w) sum += __popc(bits[w]);
    // (sh.hist: the crossing facts were read before the last barrier.)
    u32 run = block_exclusive_sum(sum, sh.hist);
    for (u32 w = w0; w < w1; ++w) {
        pre[w] = run;
        run += __popc(bits[w]);
    }
    __syncthreads();
    // Each selected composite to its place, words swapped.
    for (u32 i = tid; i < m; i += FS_BLOCK) {
        const u64 v = sel[i];
        const u32 o = lmax - (u32)v;
        const u32 p = pre[o >> 5] + __popc(bits[o >> 5] & ((1u << (o & 31)) - 1u));
        buf[p] = (v << 32) | (v >> 32);
    }
    __syncthreads();
    PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, PROF_INDEX_PLACE);
    return true;
}

#endif  // FLASHSEL_SELECT_FILTER_INDEX_ORDER_CUH
