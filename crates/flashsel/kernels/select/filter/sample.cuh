// Sampled bounds: whether a range takes one, and sample_lb, which seeds the
// bound from a register-held sample of the range (sampled bounds are never
// trusted: the callers check that enough elements passed).
#ifndef FLASHSEL_SELECT_FILTER_SAMPLE_CUH
#define FLASHSEL_SELECT_FILTER_SAMPLE_CUH

#include "select/filter/compact.cuh"

__device__ __forceinline__ void reset(Shared& sh) {
    if (threadIdx.x == 0) {
        sh.count = 0;
        sh.lb = 0;
    }
    __syncthreads();
}

// Whether a range of `range` elements is long enough for a sampled bound
// (SAMPLE_MIN_TILES tiles: sample_lb's 16 blocks spread out, and k is a
// small share of it). The one test for the row path, fs_prep_*, and the
// rescue (plan::plan_with's `sampled` is the same on the buffer width).
// (16 tiles until v33: a prefill row of 63,488 bf16 columns, k 512, then
// streamed from lb = 0 in 2.3x the time of a 65,536-column sampled one.)
enum : int { SAMPLE_MIN_TILES = 4 };
template <int TAG>
__device__ __forceinline__ bool sampling_applies(long long range, int k) {
    return range >= (long long)SAMPLE_MIN_TILES * FS_BLOCK * Elem<TAG>::ITEMS && 8LL * k <= range;
}

// Where a sample of a range from `start` begins: `start` rounded up to a
// 16-byte group where the kernel takes heads (span.cuh), so that its loads
// are aligned (a sample need not see the range's first few elements;
// eligible ranges hold >= 4 tiles, so it still begins before `end`).
template <int TAG, bool HEAD>
__device__ __forceinline__ long long sample_start(long long start) {
    constexpr int VEC = Elem<TAG>::VEC;
    return HEAD ? (start + VEC - 1) & ~(long long)(VEC - 1) : start;
}

// A sampled bound let fewer than min(k, len) elements through: empty the
// buffer and drop the bound, so the caller streams its range again exactly
// (fs_prof[slot] counts it).
__device__ __forceinline__ void restart(Shared& sh, int slot) {
    __syncthreads();
    if (threadIdx.x == 0) PROF_ADD(slot, 1);
    reset(sh);
}

// Seeds sh.lb from a sample of [start, end): 16 blocks spread over the range,
// ST tiles in all (S elements), held in registers. The bound is the key of
// sample rank j, with j chosen so that clearly more than k elements of the
// range are expected above it (expected j * range / S; j adds SAMPLE_SD standard
// deviations and 4), found by compact's MSD descent with its histograms
// filled from the registers: the buffer is not touched. Out of line: it runs
// once per range and would otherwise crowd the streaming loop's registers.
template <int TAG, int ST>
__device__ __noinline__ u32 sample_lb(Shared& sh, const void* row_scores, long long start, long long end, bool aligned,
                                       int k, int nan_largest, float sd = (float)SAMPLE_SD) {
    typedef Elem<TAG> E;
    constexpr int VEC = E::VEC;
    static_assert(ST >= 1 && ST <= 16, "eligible ranges (>= 16 tiles) hold 16 sample blocks of ST / 16 tiles");
    constexpr int S = FS_BLOCK * E::ITEMS * ST;  // sample size: ST tiles
    constexpr int BLK = S / VEC / 16;           // vectors per sample block
    const long long range = end - start;
    const long long spacing = (range / 16) & ~7ll;
    // The sample stays in registers as composites (0: past the range, which
    // ranks below every composite that counts).
    u64 c[E::ITEMS * ST];
    u32 valid = 0;
#pragma unroll
    for (int j = 0; j < E::ITEMS * ST / VEC; ++j) {
        const int v = j * FS_BLOCK + threadIdx.x;
        const long long e0 = start + (v / BLK) * spacing + (long long)(v % BLK) * VEC;
        const uint4 w = load_vec<TAG>(row_scores, (u32)e0, (u32)end, aligned);
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const bool in = e0 + q < end;
            c[j * VEC + q] = in ? composite(order_key<TAG>(unpack<TAG>(w, q), nan_largest), (u32)(e0 + q)) : 0ull;
            valid += in;
        }
    }
    valid = __reduce_add_sync(FULL_MASK, valid);
    if ((threadIdx.x & 31) == 0) atomicAdd(&sh.count, valid);
    __syncthreads();
    const float expect = (float)k * (float)S / (float)range;
    const u32 j = (u32)(expect + sd * sqrtf(expect) + 4.0f);
    const u32 n = sh.count;
    // The bound: the prefix a compaction of the sample to j .. j + j/4 would
    // keep (the same descent, its histograms filled from the registers).
    if (j < n) {
        const u64 prefix = msd_prefix<E::TOP_BIT>(sh, j, j + j / 4, [&](u64 pre, u64 mask, int shift) {
#pragma unroll
            for (int i = 0; i < E::ITEMS * ST; ++i)
                if (c[i] != 0ull && (c[i] & mask) == pre) atomicAdd(&sh.hist[(u32)(c[i] >> shift) & 255u], 1u);
        });
        if (threadIdx.x == 0) sh.lb = prefix > sh.lb ? prefix : sh.lb;
        __syncthreads();
    }
    // On a plateau of ties (ReLU zeros, all-equal rows) the bound's key is
    // the plateau's and its column says how many of the sample's tied elements
    // it admits. The sample's columns are not the row's, so the column is
    // mapped from the bound's place among the sample positions to the same
    // fraction of the range: about as many of the row's ties pass as the
    // sample rank asked for, not the whole plateau. (A sampled bound is never
    // trusted: too few passing elements send the caller to the exact path.)
    if (threadIdx.x == 0) {
        const u64 lb = sh.lb;
        u32 low = 0;  // column part 0: every element of the bound's key passes
        if ((u32)lb != 0u) {
            constexpr u32 SPAN = S / 16;  // elements per sample block
            const u32 rel = (0xffffffffu - (u32)lb) - (u32)start;  // columns < 2^31
            u32 b = rel / (u32)spacing;
            b = b > 15u ? 15u : b;
            u32 o = rel - b * (u32)spacing;
            o = o > SPAN - 1 ? SPAN - 1 : o;
            const u64 scaled = ((u64)(b * SPAN + o + 1) * (u64)range + S - 1) / S;
            u32 col = (u32)start + (u32)scaled;
            col = col > (u32)(end - 1) ? (u32)(end - 1) : col;
            low = 0xffffffffu - col;
        }
        sh.lb = ((lb >> 32) << 32) | low;
        sh.count = 0;
    }
    // The pushes per tile the bound is expected to let through: j per S
    // sampled elements, a tile being S / ST of them.
    return (j + ST - 1) / ST;
}

#endif  // FLASHSEL_SELECT_FILTER_SAMPLE_CUH
