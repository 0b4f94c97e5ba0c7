// The filter of one tile against the running lower bound: Bound (the bound
// as the filter sees it), the exact key test, the float-domain tests
// (fast_mask, ge_mask; 16-bit types two elements per packed compare), and
// the tile's loads. Each returns a bit per element of the thread's tile.
#ifndef FLASHSEL_SELECT_FILTER_BOUND_CUH
#define FLASHSEL_SELECT_FILTER_BOUND_CUH

#include "common/dtype.cuh"
#include "select/filter/params.cuh"

// The filter's view of a lower bound lb (taken at a barrier).
//   Exact test: c >= lb  <=>  key > key(lb), or key == key(lb) and
//   column <= tie_col.
//   Fast test, valid when `fast`: the element's float x against t, the float
//   whose key is key(lb) (clamped to -inf below it): x > t passes, x < t fails,
//   and x == t (a key tie; -0 and +0 are one key) passes iff its column is
//   <= tie_col. NaN passes iff `unord` (its key, all ones or zero, is then
//   above key(lb)).
//   Not `fast` when key(lb) is above +inf's key (only NaNs can pass, with a
//   column test) or is the NaN-lowest key with a column part: the exact test
//   then runs on every element.
//   `all_ties` (tie_col covers every column, as a sampled bound usually
//   does: its descent stops at a key digit): x >= t passes, one compare per
//   element and no tie flag (ge_mask).
struct Bound {
    u32 key;
    u32 tie_col;
    float t;
    u32 t2;  // 16-bit types: t's bits in both halves (packed compares)
    bool fast;
    bool unord;
    bool all_ties;
};

template <int TAG>
__device__ __forceinline__ Bound make_bound(u64 lb, int nan_largest) {
    typedef FloatBits<TAG> F;
    const u32 all = F::SIGN | F::EXP | F::MAN;
    const u32 key_ninf = ~(F::SIGN | F::EXP) & all;
    const u32 key_pinf = F::SIGN | F::EXP;
    Bound b;
    b.key = (u32)(lb >> 32);
    b.tie_col = 0xffffffffu - (u32)lb;
    b.fast = !(b.key > key_pinf || (b.key == 0 && lb != 0));
    b.unord = nan_largest || lb == 0;
    const u32 bits = key_bits<TAG>(b.key);
    b.t = b.key <= key_ninf ? __uint_as_float(0xff800000u) : bits_float<TAG>(bits);
    // Below -inf's key, -inf (x == t) passes whatever its column; likewise
    // +-0 when key(lb) is the unused key just below zero's (t is then -0.0).
    if (b.key < key_ninf || bits == F::SIGN) b.tie_col = 0xffffffffu;
    b.all_ties = b.tie_col == 0xffffffffu;
    const u32 t16 = b.key <= key_ninf ? Elem<TAG>::NEG_INF : bits;
    b.t2 = TAG == 32 ? 0u : (t16 | (t16 << 16));
    return b;
}

// tie_col as an offset from column c0, clamped to [-1, 2^31): an element at
// c0 + rel (rel >= 0) has column <= tie_col iff rel <= the result.
__device__ __forceinline__ int tie_offset(u32 tie_col, u32 c0) {
    return tie_col < c0 ? -1 : (int)min(tie_col - c0, 0x7fffffffu);
}

// The exact filter over one tile: bit j * VEC + q set iff the element passes
// c >= lb (elements at offsets >= lim are outside the range).
template <int TAG, int NV>
__device__ __forceinline__ u32 exact_mask(const uint4 (&cur)[NV], u32 tile0, u32 lim, const Bound& bd,
                                          int nan_largest) {
    constexpr int VEC = Elem<TAG>::VEC;
    // Offsets relative to this thread's first element, so that each element's
    // tests are against an immediate (no register per element).
    const u32 t0 = threadIdx.x * VEC;
    const int olim = lim <= t0 ? -1 : (int)min(lim - t0 - 1, 0x7fffffffu);
    const int otie = tie_offset(bd.tie_col, tile0 + t0);
    u32 pass = 0;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const int rel = j * FS_BLOCK * VEC + q;
            const u32 key = order_key<TAG>(unpack<TAG>(cur[j], q), nan_largest);
            // Bitwise, not short-circuit: no branch per element.
            const u32 ok = (u32)(rel <= olim) & ((u32)(key > bd.key) | ((u32)(key == bd.key) & (u32)(rel <= otie)));
            pass |= ok << (j * VEC + q);
        }
    }
    return pass;
}

// Packed compares of the two 16-bit elements of w against t2 (t in both
// halves): each half of the result is all ones where the compare holds.
// packed_gt: greater, packed_ge: greater or equal (either one or unordered
// with UNORD); packed_eq: equal. One body for the ordered pair, by the PTX
// comparison's name.
#define PACKED_COMPARE(NAME, OP)                                                          \
    template <int TAG, bool UNORD>                                                           \
    __device__ __forceinline__ u32 NAME(u32 w, u32 t2) {                                     \
        u32 d;                                                                               \
        if (TAG == 16) {                                                                     \
            if (UNORD) asm("set." OP "u.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2)); \
            else asm("set." OP ".u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));        \
        } else {                                                                             \
            if (UNORD) asm("set." OP "u.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));  \
            else asm("set." OP ".u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));         \
        }                                                                                    \
        return d;                                                                            \
    }
PACKED_COMPARE(packed_gt, "gt")
PACKED_COMPARE(packed_ge, "ge")
#undef PACKED_COMPARE
template <int TAG>
__device__ __forceinline__ u32 packed_eq(u32 w, u32 t2) {
    u32 d;
    if (TAG == 16) asm("set.eq.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));
    else asm("set.eq.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(w), "r"(t2));
    return d;
}

// Packed masks (16-bit types): word w of 16-byte group j holds elements
// j * 8 + 2w (low half) and j * 8 + 2w + 1 (high half); a packed compare's
// results are kept at bits j * 8 + 2w and 16 + j * 8 + 2w (pair_bits), and
// one fold at the end interleaves the two halves into bit = element.
__device__ __forceinline__ constexpr u32 pair_bits(int j, int w) {
    return (1u << (j * 8 + 2 * w)) | (1u << (16 + j * 8 + 2 * w));
}
template <int NV>
__device__ __forceinline__ u32 fold_pairs(u32 acc) {
    static_assert(NV == 1, "one fold covers 8 elements per thread");
    return (acc & 0x55u) | ((acc >> 15) & 0xaau);
}

// bf16x2 compares need sm_90; f16x2 ones run everywhere.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PACKED_BF16 1
#else
#define PACKED_BF16 0
#endif

// The filter over one full tile in the float domain (see Bound). Without
// TIES: one compare per element plus an equality flag (`tie`); a warp where
// some element equals t runs it again WITH TIES, which adds the column test
// for those elements. Exact whenever the bound is `fast`.
// 16-bit types compare two elements per instruction on the
// untied pass, with the same NaN and signed-zero semantics (IEEE compares of
// the exact bf16 / f16 values; no flush of subnormals).
template <int TAG, bool UNORD, bool TIES, int NV>
__device__ __forceinline__ u32 fast_mask(const uint4 (&cur)[NV], const Bound& bd, u32 tile0, bool& tie) {
    constexpr int VEC = Elem<TAG>::VEC;
    if constexpr (TAG != 32 && !TIES && (TAG == 16 ? PACKED_BF16 : 1)) {
        u32 acc = 0, eq = 0;  // see pair_bits
#pragma unroll
        for (int j = 0; j < NV; ++j) {
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const u32 x = word(cur[j], w);
                acc |= packed_gt<TAG, UNORD>(x, bd.t2) & pair_bits(j, w);
                eq |= packed_eq<TAG>(x, bd.t2);
            }
        }
        tie |= eq != 0;
        return fold_pairs<NV>(acc);
    }
    const int otie = TIES ? tie_offset(bd.tie_col, tile0 + threadIdx.x * VEC) : 0;
    u32 pass = 0;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const float x = elem_float<TAG>(cur[j], q);
            u32 ok = (u32)(UNORD ? !(x <= bd.t) : (x > bd.t));
            if (TIES) {
                ok |= (u32)(x == bd.t) & (u32)(j * FS_BLOCK * VEC + q <= otie);
            } else {
                tie |= x == bd.t;
            }
            pass |= ok << (j * VEC + q);
        }
    }
    return pass;
}

// The filter over one full tile when every tie at t passes (Bound::
// all_ties, `fast`): x >= t, or unordered (UNORD); no tie flag, no second
// pass. 16-bit types two at a time, as in fast_mask.
template <int TAG, bool UNORD, int NV>
__device__ __forceinline__ u32 ge_mask(const uint4 (&cur)[NV], const Bound& bd) {
    constexpr int VEC = Elem<TAG>::VEC;
    if constexpr (TAG != 32 && (TAG == 16 ? PACKED_BF16 : 1)) {
        u32 acc = 0;  // see pair_bits
#pragma unroll
        for (int j = 0; j < NV; ++j) {
#pragma unroll
            for (int w = 0; w < 4; ++w) acc |= packed_ge<TAG, UNORD>(word(cur[j], w), bd.t2) & pair_bits(j, w);
        }
        return fold_pairs<NV>(acc);
    }
    u32 pass = 0;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            const float x = elem_float<TAG>(cur[j], q);
            pass |= (u32)(UNORD ? !(x < bd.t) : (x >= bd.t)) << (j * VEC + q);
        }
    }
    return pass;
}

template <int TAG>
__device__ __forceinline__ void load_tile(uint4 (&v)[Elem<TAG>::ITEMS / Elem<TAG>::VEC], const void* row_scores,
                                          u32 base, u32 end, bool aligned) {
#pragma unroll
    for (int j = 0; j < Elem<TAG>::ITEMS / Elem<TAG>::VEC; ++j)
        v[j] = load_vec<TAG>(row_scores, base + (u32)(j * FS_BLOCK + threadIdx.x) * Elem<TAG>::VEC, end,
                             aligned);
}

#endif  // FLASHSEL_SELECT_FILTER_BOUND_CUH
