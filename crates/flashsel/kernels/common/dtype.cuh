// Element access for the three dtypes (no cuda_fp16 headers needed): raw
// loads and stores, 16-byte groups, exact widening to float, and the output
// value of a selected key.
#ifndef FLASHSEL_COMMON_DTYPE_CUH
#define FLASHSEL_COMMON_DTYPE_CUH

#include "common/keys.cuh"

// Raw element access for the three dtypes (no cuda_fp16 headers needed).
template <int TAG>
struct Elem;
template <>
struct Elem<32> {
    typedef u32 raw;
    static constexpr int VEC = 4;              // elements per 16-byte load
    static constexpr int ITEMS = 8;            // elements per thread per tile
    static constexpr int TOP_BIT = 63;         // highest composite bit in use
    static constexpr u32 NEG_INF = 0xff800000u;
};
template <>
struct Elem<16> {
    typedef u16 raw;
    static constexpr int VEC = 8;
    static constexpr int ITEMS = 8;
    static constexpr int TOP_BIT = 47;
    static constexpr u32 NEG_INF = 0xff80u;
};
template <>
struct Elem<15> : Elem<16> {  // f16: the bf16 storage, its own -inf
    static constexpr u32 NEG_INF = 0xfc00u;
};

template <int TAG>
__device__ __forceinline__ u32 load_bits(const void* base, long long i) {
    typedef typename Elem<TAG>::raw R;
    return (u32)__ldg(((const R*)base) + i);
}
template <int TAG>
__device__ __forceinline__ void store_bits(void* base, long long i, u32 bits) {
    typedef typename Elem<TAG>::raw R;
    ((R*)base)[i] = (R)bits;
}


__device__ __forceinline__ u32 word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The q-th element's raw bits from a 16-byte group.
template <int TAG>
__device__ __forceinline__ u32 unpack(const uint4& v, int q) {
    if (TAG == 32) return word(v, q);
    return (word(v, q >> 1) >> ((q & 1) * 16)) & 0xffffu;
}

// Loads the 16-byte group of elements [e0, e0 + VEC): one vector load when
// aligned and in range, else element by element (zeros past `end`). Offsets
// within a row are u32 (a row has at most 2^31 - 1 columns: the contract);
// measured 2-4% faster than 64-bit offsets in the streaming loop (perf-log v15).
template <int TAG>
__device__ __forceinline__ uint4 load_vec(const void* row, u32 e0, u32 end, bool aligned) {
    constexpr int VEC = Elem<TAG>::VEC;
    if (aligned && e0 + VEC <= end) {
        return __ldg((const uint4*)((const char*)row + (size_t)e0 * sizeof(typename Elem<TAG>::raw)));
    }
    u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int q = 0; q < VEC; ++q) {
        const u32 b = (e0 + q < end) ? load_bits<TAG>(row, e0 + q) : 0u;
        if (TAG == 32) {
            w[q] = b;
        } else {
            w[q >> 1] |= b << ((q & 1) * 16);
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The q-th element of a 16-byte group as a float, exactly (bf16 and f16 widen
// without rounding), for the fast filter.
template <int TAG>
__device__ __forceinline__ float elem_float(const uint4& v, int q) {
    if (TAG == 32) return __uint_as_float(word(v, q));
    const u32 w = word(v, q >> 1);
    if (TAG == 16) return __uint_as_float((q & 1) ? (w & 0xffff0000u) : (w << 16));
    float f;
    const u32 h = (q & 1) ? (w >> 16) : (w & 0xffffu);
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "r"(h));
    return f;
}

template <int TAG>
__device__ __forceinline__ float bits_float(u32 bits) {
    if (TAG == 32) return __uint_as_float(bits);
    if (TAG == 16) return __uint_as_float(bits << 16);
    float f;
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "r"(bits));
    return f;
}

// The filter's view of a lower bound lb (taken at a barrier).
//   Exact test: c >= lb  <=>  key > key(lb), or key == key(lb) and

// The output value of a selected element of key `key` at column `col`: the
// key gives the value back, except where the key merged several encodings
// (zero: -0 and +0; NaN: every payload): only those are read from the row.
template <int TAG>
__device__ __forceinline__ u32 value_bits(u32 key, const void* row_scores, u32 col) {
    typedef FloatBits<TAG> F;
    const u32 all = F::SIGN | F::EXP | F::MAN;
    return (key == F::SIGN || key == 0u || key == all) ? load_bits<TAG>(row_scores, col) : key_bits<TAG>(key);
}

// Output slot o past the row's selection: index -1, value -inf.
template <int TAG>
__device__ __forceinline__ void write_padding(int* out_idx, void* out_val, long long o) {
    out_idx[o] = -1;
    if (out_val) store_bits<TAG>(out_val, o, Elem<TAG>::NEG_INF);
}

#endif  // FLASHSEL_COMMON_DTYPE_CUH
