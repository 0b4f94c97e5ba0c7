// The select operation's streaming filter (module SelectFilter): exact,
// deterministic top-k of the row path (fs_scan_*) and the split path
// (fs_prep_*, fs_split_*). The grid path is select/grid.cu.
//
// ALGORITHM
//   A CTA owns one contiguous range of one row. It streams the range once, in
//   tiles of FS_BLOCK * ITEMS elements. Each element becomes a 64-bit composite
//       c = key << 32 | (0xffffffff - column)
//   whose unsigned order is the contract's total order (larger key first, then
//   lower column first; docs/semantics.md). An element is pushed into the CTA's
//   candidate buffer iff c >= lb, the running lower bound, tested as one float
//   compare per element (Bound; where every tie at lb's key passes, as under
//   a sampled bound, one >= compare, two at a time for the 16-bit types, in a
//   loop of its own: the fast run). A push stores the element's raw bits
//   (the key transform runs later on whole warps: to_keys). Barriers come
//   only between segments of tiles;
//   an optimistic segment that overflows the buffer is streamed again. When the
//   next tiles might not fit, the buffer is compacted: an MSD radix select
//   (8-bit digits, 256-bin shared histogram) keeps a prefix of the largest
//   composites and lb rises to that prefix.
//   Long ranges start from a sampled bound: a sample rank chosen so that clearly
//   more than k elements are expected above it (its column scaled from the
//   sample to the range, for plateaus of ties); if fewer pass, the range (or
//   row) is selected again from a wider sampled bound (RESCUE_SD), and
//   from lb = 0 if that fails too.
//   The finish selects and sorts the top min(k, n) in one bucket-rank pass
//   (bucket_rank; radix select + bitonic sort when the candidates do not
//   spread out), then writes indices and values (values rebuilt from keys).
//   Kernels:
//     fs_scan_*   one CTA per row (prefill): stream, finish (score order:
//                 composite descending; index order: the low word descending,
//                 i.e. column ascending), write.
//     fs_prep_*   one CTA per split row, before fs_split_*: zero the row's
//                 counters, take the row-wide sampled bound.
//     fs_split_*  several CTAs per row: each streams its chunk from the row's
//                 bound and appends its top min(k, n) to the row's slots; the
//                 CTA that finishes last merges the slots (a copy when they
//                 fit its buffer, else the same filter) and writes the row.
//
// INVARIANTS
//   - Composites are unique within a row (the column is in the low word), so the
//     k-th largest is well defined and the selected set is exactly the contract's.
//   - The buffer is a cache, never a decision: a compaction only raises lb to
//     a prefix that at least k buffered composites reach, so it never rejects an
//     element of the true top k, and it drops only elements with >= k better
//     ones. A sampled seed is the one bound not proven by the buffer: unless
//     min(k, len) elements passed it, the range (or row) is selected again
//     (a wider sampled bound, checked the same way, then lb = 0).
//   - capacity C >= 2k + TILE, so after a compaction (count <= (C - TILE + k)
//     / 2) at least one tile fits: (C - count) / TILE tiles is a safe segment.
//     Longer (optimistic) segments store nothing past C and are redone when
//     the count says they overflowed.
//   - During a stream the buffer's entries pushed since the last checkpoint
//     are raw (the element's bits where the key goes); only compact, after
//     to_keys and a barrier, and the callers of a finished stream read them,
//     and every entry they read is a composite.
//   - Every loop bound that contains __syncthreads or a warp collective is
//     uniform over the CTA. Decisions taken from sh.count (compact or not, how
//     many tiles until the next barrier) are read by every thread between two
//     barriers, before any push can move it (compute-sanitizer racecheck found
//     the version without the second barrier).
//   - The top-k of a union is the top-k of the union of each part's top-k, so
//     the split rows' one merge round returns the same set as one CTA would.
//
// COST
//   Reads: each score once, plus one sampled tile per long range; a split
//   row's candidates once more (about k (1 + margin) of them, at most
//   chunks x k).
//   Writes: <= k composites per split CTA, k indices (+ values) per row.
//   Compute per element: one float compare and an equality flag, a bit in the
//   thread's mask (16-bit types: one packed compare and one packed equality
//   per two elements); per warp and tile a vote, per lane with passes one
//   shared atomic and a raw store per passing element; the key transform
//   once per buffered element, on whole warps (to_keys).
//   A compaction costs up to 8 histogram passes over <= C shared entries
//   (usually 1-2 for an intermediate one). The bucket-rank finish: ~6
//   barriers, 3 passes over the candidates, a bucket's size per element.
//
// BUFFERS
//   FS_GLOBAL_BUF = 0: the buffer is dynamic shared memory (k <= the planner's
//   shared limit), followed on the row path by the load ring (P.stage), whose
//   room the finish also uses. FS_GLOBAL_BUF = 1: the buffer is a per-CTA
//   slice of the workspace, for any k; same code, slower memory. Either way
//   cap + 1 composites: the last takes the pushes past cap.
//
//
// Compile-time values (the host passes them as -D): FS_BLOCK (threads per
// CTA), FS_GLOBAL_BUF (0 or 1, as above), FS_HOST_STAGE_BYTES (the ring's
// size, plan::STAGE_BYTES); FS_PROFILE=1 adds the phase counters.

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
// work follows the active length, not the buffer width.

template <int TAG, bool SPLIT>
__device__ void scan_impl(const ScanParams& P) {
    typedef Elem<TAG> E;
    constexpr int TILE = FS_BLOCK * E::ITEMS;
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
        const int len = row_length(P.lengths, row, P.cols);
        long long start, end;
        chunk_range(len, P.chunks, p, start, end);
        const void* row_scores = row_start<TAG>(P, row);
        const bool aligned = aligned16(row_scores);

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
                rate0 = sample_lb<TAG, ROW_SAMPLE>(sh, row_scores, start, end, aligned, P.k, P.nan_largest, sd);
                __syncthreads();
            }
            stream<TAG, !SPLIT>(buf, sh, row_scores, (u32)start, (u32)end, aligned, P, rate0);
            __syncthreads();
            if (!sampled || (long long)sh.count >= want) break;
            restart(sh, attempt == 0 ? PROF_ROW_RESTARTS : PROF_RESCUE_RESTARTS);
            sampled = attempt == 0;
            sd = (float)RESCUE_SD;
        }
        const long long t_fin = PROF_CLOCK();
        if (split) {
            split_finish<TAG>(P, buf, sh, row, row_scores, aligned);
        } else {
            finish_row<TAG>(buf, sh, P.k, finish_cap(P.cap, P.stage), P.order_index, P.out_idx, P.out_val, row_scores,
                            row);
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

template <int TAG>
__device__ void prep_impl(const ScanParams& P) {
    __shared__ Shared sh;
    // The call's first kernel: the stream's previous kernel is done (its
    // scores and lengths written) before anything is read.
    CHAIN_WAIT();
    // fs_split_* may launch now; it waits for this grid before reading its
    // results (its chunk's scores it may read at once).
    PDL_TRIGGER();
    for (int row = blockIdx.y; row < P.rows; row += gridDim.y) {
        reset(sh);
        const int len = row_length(P.lengths, row, P.cols);
        const void* row_scores = row_start<TAG>(P, row);
        const bool aligned = aligned16(row_scores);
        const bool eligible = sampling_applies<TAG>(len, P.k);
        if (eligible) {
            sample_lb<TAG, PREP_SAMPLE>(sh, row_scores, 0, len, aligned, P.k, P.nan_largest);
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

// Row path (one CTA per row): two CTAs per SM. Split path: room for the last
// CTA's merge; its grids are small (one row's CTAs spread over the GPU).
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_f32(const ScanParams p) { scan_impl<32, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_bf16(const ScanParams p) { scan_impl<16, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_f16(const ScanParams p) { scan_impl<15, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_f32(const ScanParams p) { scan_impl<32, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_bf16(const ScanParams p) { scan_impl<16, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_f16(const ScanParams p) { scan_impl<15, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_f32(const ScanParams p) { prep_impl<32>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_bf16(const ScanParams p) { prep_impl<16>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_f16(const ScanParams p) { prep_impl<15>(p); }
