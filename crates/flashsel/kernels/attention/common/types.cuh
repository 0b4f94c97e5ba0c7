// Types, element conversions and small warp helpers shared by the attention
// kernels (sparse MLA today; QSA sparse attention later). Everything lives in
// namespace fsattn so that a program may include these beside other headers.
//
// No CUDA headers are needed: bf16 is handled as raw 16-bit patterns, fp8
// e4m3 is decoded by bit manipulation (exact: every code's value is an f32).
#ifndef FLASHSEL_ATTENTION_COMMON_TYPES_CUH
#define FLASHSEL_ATTENTION_COMMON_TYPES_CUH

namespace fsattn {

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;
typedef unsigned long long u64;

#define FSA_FULL 0xffffffffu

// The element formats of q, kv and caches (host: ops/mla/device.rs, KvFormat).
enum : int { FMT_F32 = 0, FMT_BF16 = 1, FMT_FP8 = 2 };

__device__ __forceinline__ float fsa_inf() { return __int_as_float(0x7f800000); }
// The NaN that the GPU's f32 arithmetic returns.
__device__ __forceinline__ float fsa_nan() { return __int_as_float(0x7fffffff); }

// bf16 bits -> f32 (exact).
__device__ __forceinline__ float bf16_bits_to_f32(u32 b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// f32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN).
__device__ __forceinline__ u16 f32_to_bf16_bits(float f) {
    u32 b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (u16)(b >> 16);
}

// The exact value of the float8_e4m3fn code `c` (bias 7, 3 mantissa bits,
// subnormals m * 2^-9, 0x7f / 0xff NaN, no infinities).
__device__ __forceinline__ float e4m3_to_f32(u32 c) {
    const u32 e = (c >> 3) & 15u, m = c & 7u;
    float mag = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * (1.0f / 512.0f);
    if ((c & 0x7fu) == 0x7fu) mag = __int_as_float(0x7fc00000);
    return __uint_as_float(__float_as_uint(mag) | ((c & 0x80u) << 24));
}

// max that propagates NaN (fmaxf drops it): a NaN logit makes the row NaN,
// as the reference's max does.
// Selects, not branches: a warp's reduction stays straight-line code.
__device__ __forceinline__ float nan_max(float a, float b) {
    const float r = b != b ? b : fmaxf(a, b);
    return a != a ? a : r;
}

// Reduce-scatter of 32 per-lane partial sums: on return lane l holds the sum
// over the warp of entry l (31 shuffles instead of 32 x 5). The order of the
// additions is fixed by the lane, so the result is deterministic.
template <int HALF>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[32], int lane) {
    const bool up = (lane & HALF) != 0;
#pragma unroll
    for (int k = 0; k < HALF; ++k) {
        const float send = up ? v[k] : v[k + HALF];
        const float keep = up ? v[k + HALF] : v[k];
        v[k] = keep + __shfl_xor_sync(FSA_FULL, send, HALF);
    }
}
__device__ __forceinline__ float warp_reduce_scatter32(float (&v)[32], int lane) {
    reduce_scatter_step<16>(v, lane);
    reduce_scatter_step<8>(v, lane);
    reduce_scatter_step<4>(v, lane);
    reduce_scatter_step<2>(v, lane);
    reduce_scatter_step<1>(v, lane);
    return v[0];
}

// 16 bytes at p: one vector load when `aligned` (p 16-byte aligned), else
// byte by byte (strides that are not multiples of 16 bytes).
__device__ __forceinline__ uint4 ld16(const u8* p, bool aligned) {
    if (aligned) return __ldg((const uint4*)p);
    u32 w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        w[q] = (u32)__ldg(p + 4 * q) | ((u32)__ldg(p + 4 * q + 1) << 8) | ((u32)__ldg(p + 4 * q + 2) << 16) |
               ((u32)__ldg(p + 4 * q + 3) << 24);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ u32 ld4(const u8* p, bool aligned) {
    if (aligned) return __ldg((const u32*)p);
    return (u32)__ldg(p) | ((u32)__ldg(p + 1) << 8) | ((u32)__ldg(p + 2) << 16) | ((u32)__ldg(p + 3) << 24);
}

// One q / out element of format FMT (f32 or bf16) as f32.
template <int FMT>
__device__ __forceinline__ float load_elem(const void* base, i64 i) {
    if (FMT == FMT_F32) return __ldg((const float*)base + i);
    return bf16_bits_to_f32((u32)__ldg((const u16*)base + i));
}
template <int FMT>
__device__ __forceinline__ void store_elem(void* base, i64 i, float v) {
    if (FMT == FMT_F32) {
        ((float*)base)[i] = v;
    } else {
        ((u16*)base)[i] = f32_to_bf16_bits(v);
    }
}

}  // namespace fsattn

#endif  // FLASHSEL_ATTENTION_COMMON_TYPES_CUH
