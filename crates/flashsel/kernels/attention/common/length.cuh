// The attended length of one index list (seed 000's derived topk_length),
// shared by the sparse attention kernels.
//
// ALGORITHM
//   With explicit lengths, lengths[at] clamped to 0..n. Otherwise the list
//   is scanned from the tail, NT positions at a time (NT: the CTA's
//   threads), until a chunk holds an entry in 0..bound; the length is one
//   past the last such position, 0 when there is none.
//
// INVARIANTS
//   - Positions at or past the returned length hold no entry in range, so a
//     kernel that stops there attends exactly the entries it would attend
//     without the length: passing the derived length explicitly gives the
//     same bits.
//   - Every thread of the CTA calls it (barriers inside); the result is the
//     same on every thread. atomicMax is order-free.
//
// COST
//   One coalesced read of the list's tail, up to its last valid chunk; the
//   loads of a chunk are issued before its barrier.
#ifndef FLASHSEL_ATTENTION_COMMON_LENGTH_CUH
#define FLASHSEL_ATTENTION_COMMON_LENGTH_CUH

#include "attention/common/types.cuh"

namespace fsattn {

template <int NT>
__device__ __forceinline__ int list_length(const int* lengths, i64 at, const int* idx_row, int n, i64 bound,
                                           int* len_s) {
    if (lengths) {
        const int l = __ldg(lengths + at);
        return min(max(l, 0), n);
    }
    if (threadIdx.x == 0) *len_s = 0;
    __syncthreads();
    for (int base = ((n - 1) / NT) * NT; base >= 0; base -= NT) {
        const int p = base + (int)threadIdx.x;
        bool v = false;
        if (p < n) {
            const i64 idx = (i64)__ldg(idx_row + p);
            v = idx >= 0 && idx < bound;
        }
        if (__syncthreads_or(v)) {
            if (v) atomicMax(len_s, p + 1);
            __syncthreads();
            return *len_s;
        }
    }
    return 0;
}

}  // namespace fsattn

#endif  // FLASHSEL_ATTENTION_COMMON_LENGTH_CUH
