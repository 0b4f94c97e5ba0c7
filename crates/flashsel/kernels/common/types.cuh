// Types and launch-shape constants shared by every kernel module.
// FS_BLOCK (threads per CTA) is the host's plan::BLOCK, always passed.
#ifndef FLASHSEL_COMMON_TYPES_CUH
#define FLASHSEL_COMMON_TYPES_CUH

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#ifndef FS_BLOCK
#error "the host passes FS_BLOCK (plan::BLOCK)"
#endif
enum : int { WARPS = FS_BLOCK / 32 };
#define FULL_MASK 0xffffffffu

// Dynamic shared memory of every kernel that takes some (its layout is the
// kernel's own).
extern __shared__ __align__(16) u64 dyn_smem[];

__device__ __forceinline__ int bit_len(u32 x) { return 32 - __clz(x); }

#endif  // FLASHSEL_COMMON_TYPES_CUH
