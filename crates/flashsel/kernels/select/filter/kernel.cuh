// The filter kernels' bodies (scan_impl: the row and split paths;
// prep_impl: the split rows' prep), shared by select/filter.cu (the
// selection's own write) and select/filter_tokens.cu (the token write,
// select/tokens.cuh). The algorithm is described in select/filter.cu.
#ifndef FLASHSEL_SELECT_FILTER_KERNEL_CUH
#define FLASHSEL_SELECT_FILTER_KERNEL_CUH

#ifndef FS_GLOBAL_BUF
#error "the host passes FS_GLOBAL_BUF"
#endif

#include "common/pdl.cuh"
#include "select/filter/merge.cuh"

// Two scan CTAs per SM (<= 64 registers) with a shared buffer; the global-
// buffer variant (large k) addresses the buffer generically and gets room.
#if FS_GLOBAL_BUF
#define SCAN_MIN_CTAS 1
#else
#define SCAN_MIN_CTAS 2
#endif

// Scan: grid (chunks, row slots). CTA (p, y) handles chunk p of rows
// y, y + gridDim.y, ...; chunk p of a row of length len is
// [p * L, min(len, (p + 1) * L)) with L = roundup(ceil(len / chunks), 8), so
// work follows the active length, not the buffer width. The split token
// kernels count columns from the 16-byte boundary at or below the row's
// first score, h before it (select/filter/span.cuh): the chunks cut [0, h +
// len) so, chunk 0 from h, and every load is an aligned 16-byte one.

template <int TAG, bool SPLIT, bool TOK, typename Params>
__device__ void scan_impl(const Params& P) {
    typedef Elem<TAG> E;
    constexpr int TILE = FS_BLOCK * E::ITEMS;
    // Heads (span.cuh) in the split token kernels only.
    constexpr bool HEAD = TOK && SPLIT;
    __shared__ Shared sh;
    u64* buf = cta_buffer(P.gbuf, P.cap);
    const int tid = threadIdx.x;
    const int p = blockIdx.x;
    constexpr bool split = SPLIT;  // the host launches fs_split_* iff chunks > 1
    // A row-path call's only kernel: wait for the stream's previous kernel
    // (the call chain) before the lengths and scores. Both kernels let the
    // next call's first kernel launch now; it waits for this grid.
    if (!split) CHAIN_WAIT();
    CHAIN_TRIGGER();

    for (int row = blockIdx.y; row < P.rows; row += gridDim.y) {
        reset(sh);
        const int len = row_span<TOK>(P, row).len;
        long long start, end;
        if constexpr (!HEAD) chunk_range(len, P.chunks, p, start, end);
        const void* span = span_scores<TAG, TOK>(P, row);
        const u32 h = head_of<TAG, HEAD>(span);
        const void* row_scores = filter_scores<TAG>(span, h);
        const bool aligned = aligned16(row_scores);
        if constexpr (HEAD) filter_chunk(len, h, P.chunks, p, start, end);

        const long long t_row = PROF_CLOCK();
        // SAMPLING. A split row's CTAs all start from the row-wide key bound
        // (fs_prep_*). A long range of a one-CTA row takes its own sample: lb
        // starts at the bound, the stream keeps about k (1 + margin) survivors
        // and rarely compacts; if fewer than min(k, range) elements pass, the
        // range is streamed again from a wider sampled bound, then from lb = 0
        // (exact either way; fs_prof[6] counts restarts, fs_prof[30] those
        // that fell through to lb = 0).
        const long long range = end - start;
        if (split) {
            if (PDL_ON) {
                // Until prep is done: ask L2 for this CTA's chunk.
                const char* r = (const char*)row_scores + (long long)start * (long long)sizeof(typename E::raw);
                const long long bytes = (end - start) * (long long)sizeof(typename E::raw);
                for (long long o = (long long)tid * 128; o < bytes; o += FS_BLOCK * 128)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(r + o));
                PDL_WAIT();
            }
            if (tid == 0) sh.lb = P.row_lb[row];
            __syncthreads();
        }
        bool sampled = !split && sampling_applies<TAG>(range, P.k);
        const long long want = range < P.k ? range : P.k;
        // Attempts (one call site each for the sample and the stream: the
        // kernel is at its register limit): the sampled bound; if it lets
        // fewer than `want` through, a fresh sample's bound RESCUE_SD
        // deviations wide (about twice the survivors); then lb = 0.
        float sd = (float)SAMPLE_SD;
        for (int attempt = 0;; ++attempt) {  // uniform
            u32 rate0 = TILE;  // the first segment's pushes per tile, before any is measured
            if (sampled) {
                rate0 = sample_lb<TAG, ROW_SAMPLE>(sh, row_scores, sample_start<TAG, HEAD>(start), end, aligned, P.k, P.nan_largest, sd);
                __syncthreads();
            }
            stream<TAG, !SPLIT, HEAD>(buf, sh, row_scores, (u32)start, (u32)end, aligned, P, rate0);
            __syncthreads();
            if (!sampled || (long long)sh.count >= want) break;
            restart(sh, attempt == 0 ? PROF_ROW_RESTARTS : PROF_RESCUE_RESTARTS);
            sampled = attempt == 0;
            sd = (float)RESCUE_SD;
        }
        const long long t_fin = PROF_CLOCK();
        if (split) {
            split_finish<TAG, TOK>(P, buf, sh, row, row_scores, aligned);
        } else {
            if constexpr (TOK) {
                finish_row_tok<TAG, HEAD>(buf, sh, P.k, finish_cap(P.cap, P.stage), P.order_index, row_scores, row, P);
            } else {
                finish_row<TAG>(buf, sh, P.k, finish_cap(P.cap, P.stage), P.order_index, P.out_idx, P.out_val,
                                row_scores, row);
            }
        }
        if (tid == 0) {
            PROF_ADD(PROF_FINISH_CYCLES, PROF_CLOCK() - t_fin);
            PROF_ADD(PROF_ROW_CYCLES, PROF_CLOCK() - t_row);
            PROF_ADD(PROF_CTA_ROWS, 1);
        }
        __syncthreads();
    }
}

// Prep (split rows): grid (1, row slots), before the scan. Zeroes the row's
// candidate and done counters and writes row_lb[row]: the key bound of
// sample_lb over the whole active length, or 0 when the row is too short for a
// sample to pay (16 tiles, k at most an eighth of it).

template <int TAG, bool TOK, typename Params>
__device__ void prep_impl(const Params& P) {
    __shared__ Shared sh;
    // The call's first kernel: the stream's previous kernel is done (its
    // scores and lengths written) before anything is read.
    CHAIN_WAIT();
    // fs_split_* may launch now; it waits for this grid before reading its
    // results (its chunk's scores it may read at once).
    PDL_TRIGGER();
    for (int row = blockIdx.y; row < P.rows; row += gridDim.y) {
        reset(sh);
        const int len = row_span<TOK>(P, row).len;
        const void* span = span_scores<TAG, TOK>(P, row);
        const u32 h = head_of<TAG, TOK>(span);
        const void* row_scores = filter_scores<TAG>(span, h);
        const bool aligned = aligned16(row_scores);
        const bool eligible = sampling_applies<TAG>(len, P.k);
        if (eligible) {
            sample_lb<TAG, PREP_SAMPLE>(sh, row_scores, sample_start<TAG, TOK>(h), (long long)h + len, aligned, P.k, P.nan_largest);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            P.row_lb[row] = eligible ? sh.lb : 0ull;
            P.row_count[row] = 0;
            P.row_done[row] = 0;
        }
        __syncthreads();
    }
}

#endif  // FLASHSEL_SELECT_FILTER_KERNEL_CUH
