// The finish of a row: the top min(k, n) of the buffer in output order
// (index order: index_order.cuh; else, or where it declines, bucket rank;
// else radix select and a bitonic sort), then the row's indices and values.
#ifndef FLASHSEL_SELECT_FILTER_FINISH_CUH
#define FLASHSEL_SELECT_FILTER_FINISH_CUH

#include "select/filter/bucket.cuh"
#include "select/filter/compact.cuh"
#include "select/filter/index_order.cuh"
#include "select/filter/sort.cuh"
#include "select/filter/span.cuh"

// Writes the final row: the m sorted composites, then padding to k. `span`:
// the row's first score.
template <int TAG>
__device__ void write_row(const u64* buf, u32 m, int order_index, int k, int* out_idx, void* out_val,
                          const void* span, long long row) {
    for (u32 j = threadIdx.x; j < (u32)k; j += FS_BLOCK) {
        const long long o = row * (long long)k + j;
        if (j < m) {
            u64 c = buf[j];
            if (order_index) c = (c << 32) | (c >> 32);
            const u32 col = composite_col(c);  // the plain kernels take no head (span.cuh)
            out_idx[o] = (int)col;
            if (out_val) store_bits<TAG>(out_val, o, value_bits<TAG>((u32)(c >> 32), span, col));
        } else {
            write_padding<TAG>(out_idx, out_val, o);
        }
    }
}

// The token form of write_row (the *_tok_* kernels, select/tokens.cuh): the
// m sorted composites as `ratio` ids each, the tail, -1 to the row's width,
// and the row's count; values (ratio 1 only, the host checks) as write_row's.
template <int TAG, bool HEAD, typename Params>
__device__ void write_tokens(const u64* buf, u32 m, int order_index, const Params& P, const void* span, int row) {
    const Tokens& T = P.tok;
    const TokRow r = *tok_stash();
    const long long o0 = (long long)row * T.width;
    const u32 sel = m * (u32)T.ratio;
    for (u32 j = threadIdx.x; j < (u32)T.width; j += FS_BLOCK) {
        if (j < sel) {
            const u32 s = j / (u32)T.ratio, i = j - s * (u32)T.ratio;
            u64 c = buf[s];
            if (order_index) c = (c << 32) | (c >> 32);
            const u32 col = span_col<TAG, HEAD>(composite_col(c), span);
            P.out_idx[o0 + j] = tok_id(T, r, r.start + (int)col * T.ratio + (int)i);
            if (P.out_val) store_bits<TAG>(P.out_val, o0 + j, value_bits<TAG>((u32)(c >> 32), span, col));
        } else {
            P.out_idx[o0 + j] = tok_rest(T, r, j - sel);
            if (P.out_val) store_bits<TAG>(P.out_val, o0 + j, Elem<TAG>::NEG_INF);
        }
    }
    if (threadIdx.x == 0 && T.counts) T.counts[row] = tok_count(T, r, m);
}

// Finishes a row: the top min(k, count) in output order, then indices and
// values. order_index: the order word (index_order.cuh). Index order on rows
// of at most 65,536 columns: index_select (the selected set by column
// without a score order); wider rows, and where it declines, as the others.
// Bucket-rank when the candidates spread out (after an intermediate
// compaction if the buffer lacks its scratch space), else an exact radix
// select and a bitonic sort; index order then sorts the selected set again
// by column (words swapped: the low word, 0xffffffff - column, leads).
// write(buf, m) writes the row (finish_row: indices and values;
// finish_row_tok: tokens).
template <int TAG, typename Write>
__device__ __forceinline__ void finish_with(u64* buf, Shared& sh, int k, int cap, int order_index, Write write) {
    __syncthreads();
    u32 n = sh.count;
    const u32 m = n < (u32)k ? n : (u32)k;
    const long long t0 = PROF_CLOCK();
    if (n > m && 2 * n + NB > (u32)cap) {
        compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, ((u32)cap - NB) / 2);
        n = sh.count;
    }
    const long long t1 = PROF_CLOCK();
    // Index order: select without a score order, then order by column
    // (index_order.cuh); where it declines, bucket rank by score, then by
    // column. (!!: the form of the measured build; a plain bool from the
    // call compiles differently.)
    const bool indexed = order_index == ORDER_INDEX && index_select(buf, sh, n, m, (u32)cap);
    bool sorted = indexed || !!bucket_rank(buf, sh, n, m, (u32)cap);
    if (!indexed && sorted && order_index) {
        for (u32 i = threadIdx.x; i < m; i += FS_BLOCK) buf[i] = (buf[i] << 32) | (buf[i] >> 32);
        __syncthreads();
        if (!bucket_rank(buf, sh, m, m, (u32)cap)) sort_desc(buf, m, 0);
    } else if (!sorted) {
        if (n > m) compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, m);
        if (m > 2 * FS_BLOCK && m <= 4 * FS_BLOCK) {  // the buffer holds >= 8 * FS_BLOCK entries
            sort_desc_regs(buf, m, order_index);
        } else {
            sort_desc(buf, m, order_index);
        }
    }
    const long long t2 = PROF_CLOCK();
    write(buf, m);
    __syncthreads();
    if (threadIdx.x == 0) {
        PROF_ADD(PROF_FINISH_COMPACT, t1 - t0);
        PROF_ADD(PROF_FINISH_SORT, t2 - t1);
        PROF_ADD(PROF_FINISH_WRITE, PROF_CLOCK() - t2);
        PROF_ADD(PROF_FINISH_CANDIDATES, n);
        PROF_ADD(PROF_BUCKET_FINISHES, sorted ? 1 : 0);
        PROF_ADD(PROF_INDEX_FINISHES, indexed ? 1 : 0);
    }
}

template <int TAG>
__device__ void finish_row(u64* buf, Shared& sh, int k, int cap, int order_index, int* out_idx, void* out_val,
                           const void* span, long long row) {
    finish_with<TAG>(buf, sh, k, cap, order_index, [&](const u64* b, u32 m) {
        write_row<TAG>(b, m, order_index, k, out_idx, out_val, span, row);
    });
}

// The selection and sort of finish_row without its write: buf[0, m) holds
// the row's selection in output order; returns m. A call (noinline) whose
// arguments are plain values, so that the scan kernels' registers hold.
template <int TAG>
__device__ __noinline__ u32 finish_sorted(u64* buf, Shared& sh, int k, int cap, int order_index) {
    u32 selected = 0;
    finish_with<TAG>(buf, sh, k, cap, order_index, [&](const u64*, u32 m) { selected = m; });
    return selected;
}

// The token kernels' finish: finish_sorted, then write_tokens (from P.tok)
// in the kernel itself, so that P stays in the parameter space (a call that
// takes it by reference copies the block to the stack: measured spills).
// (Not finish_row with one more parameter: finish_row is a call, and its
// code would change.)
template <int TAG, bool HEAD, typename Params>
__device__ __forceinline__ void finish_row_tok(u64* buf, Shared& sh, int k, int cap, int order_index,
                                               const void* span, int row, const Params& P) {
    const u32 m = finish_sorted<TAG>(buf, sh, k, cap, order_index);
    write_tokens<TAG, HEAD>(buf, m, order_index, P, span, row);
    __syncthreads();
}

#endif  // FLASHSEL_SELECT_FILTER_FINISH_CUH
