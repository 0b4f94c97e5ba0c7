// The split token kernels' view of a row (fs_prep_tok_*, fs_split_tok_*):
// its scores from the 16-byte boundary at or below the row's first score, so
// that every load of the stream is an aligned 16-byte one whatever the row's
// start (a DSA range's start, a row stride that is not a multiple of 16
// bytes). The other kernels take h = 0 (HEAD false below) and keep their
// code as measured: in the row kernels the head's tests cost 2% (QSA prefill
// 8192 x 65,536 bf16, perf-log v46), and their SASS is then the same as
// before the heads.
//
// COORDINATES. The filter's columns count from that boundary: the row's
// column c is the filter's column c + h, where h (the head, < 16 bytes of
// elements) is the row's distance from the boundary; the row's span is
// [h, h + len). Every column moves by the same h, so the composites'
// order (key, then lower column) and with it the selection are unchanged;
// the write takes h off again (span_col). The elements before h are read
// (the same 16 bytes as the first score) and never pushed: the stream
// clears their pass bits (stream_range), the sample skips them (sample_lb).
// A row whose first score is not even element aligned keeps h = 0 and the
// unaligned loads.
// COST. Per row: the head from the pointer's low bits; per tile: one
// uniform compare (a tile before h); none per element. Measured (H200, DSA
// 64 x 131,072 f32 ranges to slots): 29.4 -> 27.7-28.0 us (v46).
#ifndef FLASHSEL_SELECT_FILTER_SPAN_CUH
#define FLASHSEL_SELECT_FILTER_SPAN_CUH

#include "select/filter/params.cuh"

// The head h of a row whose first score is `span`: its elements before it
// from the 16-byte boundary (0 when `span` is not element aligned, and
// where the kernel takes no heads: HEAD false).
template <int TAG, bool HEAD>
__device__ __forceinline__ u32 head_of(const void* span) {
    if constexpr (!HEAD) return 0u;
    constexpr unsigned long long SZ = sizeof(typename Elem<TAG>::raw);
    const unsigned long long a = (unsigned long long)span;
    return (a % SZ) ? 0u : (u32)((a & 15ull) / SZ);
}

// The filter's score pointer of a row whose first score is `span`: h
// elements before it.
template <int TAG>
__device__ __forceinline__ const void* filter_scores(const void* span, u32 h) {
    return (const char*)span - (size_t)h * sizeof(typename Elem<TAG>::raw);
}

// The row's column of filter column `col` (span: the row's first score).
template <int TAG, bool HEAD>
__device__ __forceinline__ u32 span_col(u32 col, const void* span) {
    return col - head_of<TAG, HEAD>(span);
}

// Chunk p of the span [h, h + len) cut into `chunks`, in filter columns:
// [p * L, (p + 1) * L) of [0, h + len), chunk 0 from h, with L = ceil((h +
// len) / chunks) rounded up to 8 elements, so that every chunk but the
// first starts on a 16-byte boundary and work follows the active length,
// not the buffer width.
__device__ __forceinline__ void filter_chunk(int len, u32 h, int chunks, int p, long long& start, long long& end) {
    const long long total = (long long)len + h;
    const long long per = (total + chunks - 1) / chunks;
    const long long L = (per + 7) & ~7ll;
    start = (long long)p * L < total ? (long long)p * L : total;
    end = start + L < total ? start + L : total;
    if (start < (long long)h) start = h;  // chunk 0 (L >= 8 > h: still [h, end))
}

// The row's first score again after its stream (TOK: the start from the
// stash, no global load).
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ const void* span_again(const Params& P, int row) {
    if constexpr (TOK) {
        return (const char*)row_start<TAG>(P, row) + (long long)tok_stash()->start * (long long)sizeof(typename Elem<TAG>::raw);
    } else {
        return row_start<TAG>(P, row);
    }
}

#endif  // FLASHSEL_SELECT_FILTER_SPAN_CUH
