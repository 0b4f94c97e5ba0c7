// The filter kernels' per-CTA shared state (the buffer's count, the bound,
// the radix select's and the split rows' scalars).
#ifndef FLASHSEL_SELECT_FILTER_SHARED_CUH
#define FLASHSEL_SELECT_FILTER_SHARED_CUH

#include "common/profile.cuh"
#include "common/types.cuh"

struct Shared {
    u32 hist[256];
    u32 count;       // composites in the buffer
    u32 digit;       // radix select: the crossing digit
    u32 above;       // radix select: composites in bins above it
    u32 bincnt;      // radix select: composites in its bin
    u64 lb;          // accept c >= lb
    u32 slot;        // split rows: where this CTA's candidates go
    u32 last;        // split rows: this CTA finishes the row
};

#endif  // FLASHSEL_SELECT_FILTER_SHARED_CUH
