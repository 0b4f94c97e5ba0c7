// Split rows: each CTA appends its top min(k, n) to the row's slots; the
// last one merges them and finishes the row.
#ifndef FLASHSEL_SELECT_FILTER_MERGE_CUH
#define FLASHSEL_SELECT_FILTER_MERGE_CUH

#include "select/rows.cuh"
#include "select/filter/finish.cuh"
#include "select/filter/stream.cuh"

// Split rows, the last CTA's merge. Every CTA of a split row appends its exact
// top-min(k, n) to the row's candidate slots (at most chunks x k: no overflow)
// and counts itself done; the CTA that finishes last selects the row from the
// appended candidates. The top k of a union is the top k of the union of the
// parts' top k, so this one merge round is exact; with the row-wide bound the
// candidates number about k (1 + margin) in all, and at worst chunks x k.
// Visibility: candidates are written, fenced, then counted; the last CTA
// fences and reads them through L2 (ld.cg).

// Candidates base + j * FS_BLOCK + threadIdx.x of the row's slots (0 past
// total), all N loads issued before any is used.
template <int N>
__device__ __forceinline__ void load_slots(u64 (&c)[N], const u64* slots, u32 base, u32 total) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const u32 i = base + j * FS_BLOCK + threadIdx.x;
        c[j] = i < total ? __ldcg(slots + i) : 0ull;
    }
}

// row_scores, aligned: the scan's (TOK: from the row's head, span.cuh).
template <int TAG, bool TOK, typename Params>
__device__ __forceinline__ void split_finish(const Params& P, u64* buf, Shared& sh, int row, const void* row_scores,
                             bool aligned) {
    constexpr int ITEMS = 8;
    constexpr int TILE = FS_BLOCK * ITEMS;
    const int tid = threadIdx.x;
    __syncthreads();
    const u32 n = sh.count;
    const u32 m = n < (u32)P.k ? n : (u32)P.k;
    if (n > m) compact<Elem<TAG>::TOP_BIT>(buf, sh, n, m, m);
    if (tid == 0) sh.slot = atomicAdd(&P.row_count[row], m);
    __syncthreads();
    u64* slots = P.cand + (long long)row * P.chunks * P.k;
    for (u32 j = tid; j < m; j += FS_BLOCK) slots[sh.slot + j] = buf[j];
    __threadfence();
    __syncthreads();
    if (tid == 0) sh.last = atomicAdd(&P.row_done[row], 1u) == (u32)P.chunks - 1;
    __syncthreads();
    if (!sh.last) return;  // uniform
    __threadfence();
    const long long t_m = PROF_CLOCK();
    const u32 total = __ldcg(&P.row_count[row]);
    reset(sh);
    // With room for every candidate and a tile to spare, nothing is compacted
    // and lb stays 0, so the filter below would keep them all: copy them
    // (the buffer's order does not matter to the finish).
    // (The two loops below are the two ways, one of them empty; the measured
    // build has this form, an if/else compiles differently.)
    const bool copy = total + TILE <= (u32)P.cap;  // uniform
    for (u32 base = 0; copy && base < total; base += TILE) {
        u64 c[ITEMS];
        load_slots(c, slots, base, total);
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            const u32 i = base + j * FS_BLOCK + tid;
            if (i < total) buf[i] = c[j];
        }
    }
    if (copy && tid == 0) sh.count = total;
    for (u32 base = 0; !copy && base < total; base += TILE) {
        __syncthreads();
        const u32 cnt = sh.count;
        __syncthreads();  // read by all before anyone pushes: a uniform decision
        if (cnt + TILE > (u32)P.cap) compact<Elem<TAG>::TOP_BIT>(buf, sh, cnt, (u32)P.k, ((u32)P.cap - TILE + (u32)P.k) / 2);
        const u64 lb = sh.lb;
        // All ITEMS loads in flight before the first push: a push (ballot,
        // shared atomic, store) between two loads would make each wait out an
        // L2 round trip (this loop took ~5.7K cycles so, ~2.5K now).
        u64 c[ITEMS];
        load_slots(c, slots, base, total);
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) push(buf, sh, base + j * FS_BLOCK + tid < total && c[j] >= lb, c[j]);
    }
    __syncthreads();
    const int len = row_len_again<TOK>(P, row);
    // The row's first score (the plain kernels: the scan's pointer, h = 0).
    const void* span = TOK ? span_again<TAG, TOK>(P, row) : row_scores;
    if (P.row_lb[row] != 0ull && (int)sh.count < (len < P.k ? len : P.k)) {
        // The row's sampled bound admitted fewer than min(k, len) elements (a
        // sample unrepresentative by over SAMPLE_SD standard deviations:
        // ~1.6e-4 of random rows; flashsel check builds such data): this CTA
        // selects the whole row again (rescue), in the scan's columns.
        const u32 h = head_of<TAG, TOK>(span);
        rescue<TAG, TOK>(buf, sh, row_scores, h, (long long)h + len, aligned, P.cap, P.k, P.nan_largest,
                         len < P.k ? len : P.k, PROF_SPLIT_FALLBACKS);
    }
    if constexpr (TOK) {
        finish_row_tok<TAG, TOK>(buf, sh, P.k, finish_cap(P.cap, P.stage), P.order_index, span, row, P);
    } else {
        finish_row<TAG>(buf, sh, P.k, finish_cap(P.cap, P.stage), P.order_index, P.out_idx, P.out_val, span, row);
    }
    if (tid == 0) PROF_ADD(PROF_MERGE_CYCLES, PROF_CLOCK() - t_m);
}

#endif  // FLASHSEL_SELECT_FILTER_MERGE_CUH
