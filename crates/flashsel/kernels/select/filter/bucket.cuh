// The bucket-rank finish: the top m of n composites in descending order
// by one or two bucket passes (a histogram over buckets monotone in the
// composite, a scatter into bucket order, a rank inside each bucket).
#ifndef FLASHSEL_SELECT_FILTER_BUCKET_CUH
#define FLASHSEL_SELECT_FILTER_BUCKET_CUH

#include "select/filter/shared.cuh"
#include "select/filter/sort.cuh"

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

// Steps 1 and 2 of a bucket pass over in[0..n): the key and column ranges
// (the low words' range also to lmin, lmax), the buckets, each bucket's
// count in cnt[] and, scanning from the top bucket down, in pos[] the number
// of composites in the buckets above it. on_bucket(b, above, count) runs for
// every bucket, on the thread that scans it, before the scan's last barrier.
// The caller's shared state written before the call is ordered before
// on_bucket by the barriers here. cnt, pos: NB u32 each.
template <typename OnBucket>
__device__ __forceinline__ Buckets bucket_count(const u64* in, u32 n, u32* cnt, u32* pos, Shared& sh, u32& lmin_out,
                                                u32& lmax_out, long long& t_prof, OnBucket on_bucket) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32* red = sh.hist;  // 4 x WARPS partials (the histogram is free here)
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
    lmin_out = lmin;
    lmax_out = lmax;
    PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, PROF_BUCKET_RANGES);
    // 2. histogram and the scan from the top bucket down.
    for (u32 i = tid; i < n; i += FS_BLOCK) atomicAdd(&cnt[bk.of(in[i])], 1u);
    __syncthreads();
    constexpr int PER = NB / FS_BLOCK;
    u32 sum = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) sum += cnt[NB - 1 - (tid * PER + j)];
    __syncthreads();  // every thread has read `red` before it is reused
    u32 run = block_exclusive_sum(sum, sh.hist);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const u32 b = NB - 1 - (tid * PER + j);
        const u32 cb = cnt[b];
        pos[b] = run;
        on_bucket(b, run, cb);
        run += cb;
    }
    __syncthreads();
    PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, PROF_BUCKET_HIST);
    return bk;
}

// One bucket pass: in[0..n) -> out[0..m). Big buckets are left to the caller:
// their ids in sh.hist[BIG_LIST ..], their count in the return value (or
// ~0u when there are more than BIG_MAX: nothing was written then).
// tab: 2 NB u32 (counts, then ends after the scatter); tmp: n composites.
__device__ __noinline__ u32 bucket_pass(const u64* in, u32 n, u64* out, u32 m, u64* tmp, u32* tab, Shared& sh) {
    const int tid = threadIdx.x;
    u32* cnt = tab;
    u32* pos = tab + NB;  // becomes each bucket's end after the scatter
    long long t_prof = PROF_CLOCK();
    if (tid == 0) sh.above = 0;  // big buckets reaching into the top m
    u32 lmin, lmax;
    const Buckets bk = bucket_count(in, n, cnt, pos, sh, lmin, lmax, t_prof, [&](u32 b, u32 run, u32 cb) {
        if (run < m && cb > RANK_MAX) {
            const u32 t = atomicAdd(&sh.above, 1u);
            if (t < BIG_MAX) sh.hist[BIG_LIST + t] = b;
        }
    });
    const u32 nbig = sh.above;
    if (nbig > BIG_MAX) return ~0u;  // uniform; nothing written
    // 3. scatter into bucket order, then rank inside the bucket.
    for (u32 i = tid; i < n; i += FS_BLOCK) {
        const u64 v = in[i];
        tmp[atomicAdd(&pos[bk.of(v)], 1u)] = v;
    }
    __syncthreads();
    PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, PROF_BUCKET_SCATTER);
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
    PROF_STAMP(tid == 0, PROF_CLOCK(), t_prof, PROF_BUCKET_RANK);
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

#endif  // FLASHSEL_SELECT_FILTER_BUCKET_CUH
