// Order keys: raw float bits -> an unsigned key ordered as the float (-0 ==
// +0, one NaN, placed by nan_largest), and the 64-bit composite
//     key << 32 | (0xffffffff - column)
// whose unsigned order is the contract's total order (larger key first, then
// lower column first; docs/semantics.md). Tags: 32 f32, 16 bf16, 15 f16.
#ifndef FLASHSEL_COMMON_KEYS_CUH
#define FLASHSEL_COMMON_KEYS_CUH

#include "common/types.cuh"

template <int BITS>
struct FloatBits;
template <>
struct FloatBits<32> {
    static constexpr u32 SIGN = 0x80000000u, EXP = 0x7f800000u, MAN = 0x007fffffu;
};
template <>
struct FloatBits<16> {  // bf16
    static constexpr u32 SIGN = 0x8000u, EXP = 0x7f80u, MAN = 0x007fu;
};
template <>
struct FloatBits<15> {  // f16 (tag 15: 16-bit storage, IEEE half layout)
    static constexpr u32 SIGN = 0x8000u, EXP = 0x7c00u, MAN = 0x03ffu;
};

template <int TAG>
__device__ __forceinline__ u32 order_key(u32 bits, int nan_largest) {
    typedef FloatBits<TAG> F;
    const u32 all = F::SIGN | F::EXP | F::MAN;
    const u32 mag = bits & (F::EXP | F::MAN);
    u32 key = (bits & F::SIGN) ? (~bits & all) : (bits | F::SIGN);
    key = (mag == 0) ? F::SIGN : key;
    key = (mag > F::EXP) ? (nan_largest ? all : 0u) : key;
    return key;
}

// The raw bits whose key is `key`: order_key's inverse, exact except for the
// keys it merges (zero: -0 and +0 both give +0; NaN: one payload).
template <int TAG>
__device__ __forceinline__ u32 key_bits(u32 key) {
    typedef FloatBits<TAG> F;
    return (key & F::SIGN) ? (key & ~F::SIGN) : (~key & (F::SIGN | F::EXP | F::MAN));
}

__device__ __forceinline__ u64 composite(u32 key, u32 col) {
    return ((u64)key << 32) | (u64)(0xffffffffu - col);
}
__device__ __forceinline__ u32 composite_col(u64 c) { return 0xffffffffu - (u32)c; }

#endif  // FLASHSEL_COMMON_KEYS_CUH
