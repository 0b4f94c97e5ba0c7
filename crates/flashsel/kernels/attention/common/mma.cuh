// Tensor-core building blocks (sm_80+ PTX): mma.sync m16n8k16 with bf16
// inputs and f32 accumulation, ldmatrix (plain and transposed) from shared
// memory (the cp.async copies are common/cp_async.cuh's).
//
// FRAGMENTS (PTX ISA, "Matrix Fragments for mma.m16n8k16", bf16), lane l,
// g = l >> 2, t = l & 3; each register holds two bf16, the lower column /
// row in the low half:
//   A (16 x 16, row major): a[0] = (row g, cols 2t, 2t+1), a[1] = row g + 8,
//       a[2] = (row g, cols 2t + 8, 2t + 9), a[3] = row g + 8, cols 2t + 8..
//   B (16 x 8, k x n):      b[0] = (k 2t, 2t + 1; n g), b[1] = k 2t + 8, 2t + 9
//   C / D (16 x 8, f32):    c[0], c[1] = (row g; cols 2t, 2t + 1), c[2], c[3] = row g + 8
//   ldmatrix .x4: lanes 8i .. 8i + 7 give the row addresses of 8 x 8 matrix
//   i; register i of lane l gets matrix i's row l >> 2, cols 2 (l & 3), +1
//   (.trans: rows 2 (l & 3), +1 of column l >> 2).
//
// The host emulator (crates/flashsel-dev/emu/shim.h) defines FSA_HOST_EMU
// and implements the same functions from these layouts.
#ifndef FLASHSEL_ATTENTION_COMMON_MMA_CUH
#define FLASHSEL_ATTENTION_COMMON_MMA_CUH

#include "attention/common/types.cuh"
#include "common/cp_async.cuh"

namespace fsattn {

// Two f32 -> packed bf16 pair (round to nearest even), lo in the low half.
// On the device one cvt.rn.bf16x2.f32 (sm_80+; its first source goes to the
// upper half); the same values as f32_to_bf16_bits but for a NaN's payload.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return (u32)f32_to_bf16_bits(lo) | ((u32)f32_to_bf16_bits(hi) << 16);
#endif
}

// f32 -> bf16 bits, round to nearest even: one cvt.rn.bf16.f32 on the
// device; the bits of f32_to_bf16_bits for every value but a NaN's payload
// (a canonical NaN gives 0x7fff either way).
__device__ __forceinline__ u16 f32_to_bf16_rn(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u16 d;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(f));
    return d;
#else
    return f32_to_bf16_bits(f);
#endif
}

#ifndef FSA_HOST_EMU
// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// Four 8 x 8 bf16 matrices; `row` is this lane's row address (a 32-bit
// shared-memory address, 16-byte aligned).
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row));
}
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row));
}

// d += a * b (16 x 8 x 16, bf16 in, f32 accumulate).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif

}  // namespace fsattn

#endif  // FLASHSEL_ATTENTION_COMMON_MMA_CUH
