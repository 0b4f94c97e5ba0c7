// Rows of a selection: where a row starts, its length (the lengths array's
// entry, or 0 when out of range), and the chunk of it a CTA owns.
#ifndef FLASHSEL_SELECT_ROWS_CUH
#define FLASHSEL_SELECT_ROWS_CUH

#include "common/dtype.cuh"

// Row `row`'s first score.
template <int TAG, typename Params>
__device__ __forceinline__ const void* row_start(const Params& P, int row) {
    return (const char*)P.scores + (long long)row * P.row_stride * (long long)sizeof(typename Elem<TAG>::raw);
}
__device__ __forceinline__ bool aligned16(const void* p) { return (((unsigned long long)p) & 15ull) == 0; }

// The row's length, or 0 for an out-of-range length (the host cannot check
// device-resident lengths without a synchronisation; such a row comes out as
// all padding).
__device__ __forceinline__ int row_length(const int* lengths, int row, int cols) {
    if (!lengths) return cols;
    const int len = lengths[row];
    return (len < 0 || len > cols) ? 0 : len;
}

// Chunk p of a row of length len cut into `chunks`: [start, end), each chunk
// ceil(len / chunks) rounded up to 8 elements (16-byte aligned starts), so
// work follows the active length, not the buffer width. I: the caller's offset
// type (long long, or u32 for the grid path: a row has < 2^31 columns).
template <typename I>
__device__ __forceinline__ void chunk_range(int len, int chunks, int p, I& start, I& end) {
    const long long per = ((long long)len + chunks - 1) / chunks;
    const long long L = (per + 7) & ~7ll;
    start = (I)((long long)p * L < len ? (long long)p * L : len);
    end = (I)(start + L < (I)len ? start + L : (I)len);
}

#endif  // FLASHSEL_SELECT_ROWS_CUH
