// The streaming loop over one range: segments between barriers, the fast
// run under a bound every tie passes, compactions when the next tiles might
// not fit, and the rescue of a range whose sampled bound let too few pass.
#ifndef FLASHSEL_SELECT_FILTER_STREAM_CUH
#define FLASHSEL_SELECT_FILTER_STREAM_CUH

#include "select/filter/bound.cuh"
#include "select/filter/ring.cuh"
#include "select/filter/sample.cuh"

// The fast run of stream_range: r tiles from base, each whole with its ring
// successor, filtered by ge_mask.
template <int TAG, bool UNORD>
__device__ __forceinline__ void fast_run(Stage<TAG>& ring, u64* buf, Shared& sh, const void* row_scores, u32 base,
                                         u32 r, const Bound& bd, u32 cap) {
    constexpr int NV = Elem<TAG>::ITEMS / Elem<TAG>::VEC;
    constexpr int TILE = FS_BLOCK * Elem<TAG>::ITEMS;
    constexpr int DEPTH = Stage<TAG>::DEPTH;
    // Single tiles until the ring is at slot 0, then DEPTH tiles a round
    // with every slot a constant.
    for (; r > 0 && ring.slot != 0; --r, base += TILE) {  // uniform
        uint4 cur[NV];
        ring.next_whole(cur, row_scores, base);
        push_tile<TAG>(buf, sh, ge_mask<TAG, UNORD>(cur, bd), cur, base, cap);
    }
    const char* ahead = (const char*)row_scores +
                        (size_t)(base + (u32)((DEPTH - 1) * TILE) + threadIdx.x * Elem<TAG>::VEC) *
                            sizeof(typename Elem<TAG>::raw);
    constexpr size_t STEP = (size_t)TILE * sizeof(typename Elem<TAG>::raw);
    for (; r >= (u32)DEPTH; r -= DEPTH) {
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            uint4 cur[NV];
            ring.next_at(cur, ahead, (u32)s);
            push_tile<TAG>(buf, sh, ge_mask<TAG, UNORD>(cur, bd), cur, base, cap);
            ahead += STEP;
            base += TILE;
        }
    }
    for (u32 t = 0; t < r; ++t, base += TILE) {
        uint4 cur[NV];
        ring.next_whole(cur, row_scores, base);
        push_tile<TAG>(buf, sh, ge_mask<TAG, UNORD>(cur, bd), cur, base, cap);
    }
}

// Streams [start, end) of one row through the filter into the buffer.
// Out of line, so that the streaming loop keeps its registers whatever the
// caller holds. HEAD (the split token kernels, span.cuh): the tiles start at the
// 16-byte group at or below `start`, and the first tile's elements before
// `start` (thread 0's first group) are cleared from its mask.
//
// SEGMENTS. Barriers come only at checkpoints between segments of tiles. At a
// checkpoint with n composites buffered, (cap - n) / TILE tiles fit whatever
// passes (a safe segment); when the last segment pushed few, a longer,
// optimistic segment runs, sized for twice the measured pushes per tile
// (at most SEG tiles). Pushes past cap are not kept; if the count
// exceeds cap at the next checkpoint, the segment is discarded (count reset)
// and streamed again as a safe one. Either way nothing is lost, and lb is read
// only at checkpoints (between them it is stale-low: admits more, never fewer).
template <int TAG, bool STAGED, bool HEAD>
__device__ __noinline__ void stream_range(u64* buf, Shared& sh, const void* row_scores, u32 start,
                                          u32 end, bool aligned, int cap, int k, int nan_largest, u32 rate0) {
    typedef Elem<TAG> E;
    constexpr int NV = E::ITEMS / E::VEC;
    constexpr int TILE = FS_BLOCK * E::ITEMS;
    const int tid = threadIdx.x;
    // Unstaged: the next tile's loads are in flight, in registers, while this
    // tile is filtered (deeper register pipelines measured no faster in the
    // split kernel: docs/perf-log.md, v12).
    uint4 nxt[NV];
    // Staged: the tiles ahead are in flight into the ring (Stage).
    Stage<TAG> ring(cap);
    // The tiles from `start` rounded down to a 16-byte group (`start` itself
    // stays the range's first element: no register more in the loop).
    const u32 first = HEAD ? start & ~(u32)(E::VEC - 1) : start;
    u32 base = first;
    if constexpr (STAGED) ring.fill(row_scores, base, end, aligned);
    else load_tile<TAG>(nxt, row_scores, base, end, aligned);
    u32 left = 0;  // tiles before the next checkpoint (uniform)
    u32 seg_base = first;
    u32 seg_n = 0, rate = rate0;  // pushes per tile: expected (a sampled bound) or TILE
    // Entries below `keyed` hold composites, those from it on raw ones (see
    // push_tile); set at the first checkpoint, before any push.
    u32 keyed = ~0u;
    u32 n = 0;
    Bound bd;
    for (;;) {
        if (left == 0 || base >= end) {  // uniform
            __syncthreads();
            n = sh.count;
            if (keyed == ~0u) keyed = n;
            // Nobody pushes (moving sh.count) before every thread has read it.
            __syncthreads();
            if (n > (u32)cap) {
                // The optimistic segment overflowed: drop it, redo it safely.
                if (tid == 0) sh.count = seg_n;
                n = seg_n;
                base = seg_base;
                if constexpr (STAGED) {
                    ring.drain();
                    ring.fill(row_scores, base, end, aligned);
                } else {
                    load_tile<TAG>(nxt, row_scores, base, end, aligned);
                }
                rate = TILE;
                if (tid == 0) PROF_ADD(PROF_SEGMENTS_REDONE, 1);
            } else if (base > seg_base) {
                rate = (n - seg_n) / (u32)((base - seg_base + TILE - 1) / TILE);
            }
            if (base >= end) break;
            if (n + TILE > (u32)cap) {
                const long long t0 = PROF_CLOCK();
                to_keys<TAG>(buf, keyed, n, HEAD ? start & ~(u32)(E::VEC - 1) : start, nan_largest);
                __syncthreads();
                compact<E::TOP_BIT>(buf, sh, n, (u32)k, ((u32)cap - TILE + (u32)k) / 2);
                n = sh.count;
                keyed = n;
                if (tid == 0) {
                    PROF_ADD(PROF_LOOP_COMPACT_CYCLES, PROF_CLOCK() - t0);
                    PROF_ADD(PROF_LOOP_COMPACTIONS, 1);
                }
            }
            const u32 safe = ((u32)cap - n) / TILE;
            const u32 opt = ((u32)cap - n) / (2 * rate + 64);
            left = safe > (opt < SEG ? opt : SEG) ? safe : (opt < SEG ? opt : SEG);
            seg_base = base;
            seg_n = n;
            bd = make_bound<TAG>(sh.lb, nan_largest);
            __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            if constexpr (STAGED) {
                // THE FAST RUN: the segment's tiles that are whole, with the
                // tile the ring starts for each whole too, under a bound that
                // every tie passes, in a loop of their own with every uniform
                // test of the loop below hoisted out (per tile: the ring,
                // ge_mask, the pushes). Tested here, once per segment, so the
                // loop below pays nothing for it.
                if (aligned && bd.fast && bd.all_ties && (!HEAD || base >= start) &&
                    end - base >= (u32)(Stage<TAG>::DEPTH * TILE)) {  // uniform
                    u32 r = (end - base - (u32)((Stage<TAG>::DEPTH - 1) * TILE)) / TILE;
                    r = r < left ? r : left;
                    if (bd.unord) {
                        fast_run<TAG, true>(ring, buf, sh, row_scores, base, r, bd, (u32)cap);
                    } else {
                        fast_run<TAG, false>(ring, buf, sh, row_scores, base, r, bd, (u32)cap);
                    }
                    base += r * TILE;
                    left -= r;
                    if (left == 0 || base >= end) continue;  // uniform: the next checkpoint
                }
            }
#endif
        }
        uint4 cur[NV];
        if constexpr (STAGED) {
            ring.next(cur, row_scores, base, end, aligned);
        } else {
#pragma unroll
            for (int j = 0; j < NV; ++j) cur[j] = nxt[j];
            if (base + TILE < end) load_tile<TAG>(nxt, row_scores, base + TILE, end, aligned);
        }
        const u32 tile0 = base;
        // Whole and inside the range: a tile before `start` (the first, where
        // the range does not start on a group) takes the exact filter.
        const bool full = base + TILE <= end && (!HEAD || base >= start);
        u32 pass;
        if (full && bd.fast && bd.all_ties) {  // uniform
            pass = bd.unord ? ge_mask<TAG, true>(cur, bd) : ge_mask<TAG, false>(cur, bd);
        } else if (full && bd.fast) {  // uniform
            bool tie = false;
            pass = bd.unord ? fast_mask<TAG, true, false>(cur, bd, tile0, tie)
                            : fast_mask<TAG, false, false>(cur, bd, tile0, tie);
            if (__any_sync(FULL_MASK, tie))
                pass = bd.unord ? fast_mask<TAG, true, true>(cur, bd, tile0, tie)
                                : fast_mask<TAG, false, true>(cur, bd, tile0, tie);
        } else {
            pass = exact_mask<TAG>(cur, tile0, full ? 0xffffffffu : end - base, bd, nan_largest);
            if (HEAD && tile0 < start && tid == 0) pass &= ~0u << (start - tile0);  // the elements before the range
        }
        push_tile<TAG>(buf, sh, pass, cur, tile0, (u32)cap);
        base += TILE;
        --left;
    }
    if constexpr (STAGED) ring.drain();  // nothing may land in the ring after this returns
    // The last checkpoint read n with no push after it: key what is raw.
    to_keys<TAG>(buf, keyed, n, HEAD ? start & ~(u32)(E::VEC - 1) : start, nan_largest);
    __syncthreads();
}

// A range's stream, through the ring when the launch has one.
// RING: the kernel is built with the staged loop (the row path's; the split
// kernel without it: its code alone, never run, measured 1 us slower on 64 x
// 131,072).
template <int TAG, bool RING, bool HEAD>
__device__ __forceinline__ void stream(u64* buf, Shared& sh, const void* row_scores, u32 start, u32 end,
                                       bool aligned, const ScanParams& P, u32 rate0) {
    if constexpr (RING && !FS_GLOBAL_BUF && Stage<TAG>::DEPTH >= 2) {
        if (P.stage) {  // uniform
            stream_range<TAG, true, HEAD>(buf, sh, row_scores, start, end, aligned, P.cap, P.k, P.nan_largest, rate0);
            return;
        }
    }
    stream_range<TAG, false, HEAD>(buf, sh, row_scores, start, end, aligned, P.cap, P.k, P.nan_largest, rate0);
}

// A sampled bound let fewer than `want` elements of [start, end) through, so
// it may have dropped some of the top k: the buffer is emptied and the range
// selected again, first from a fresh sample's bound with a margin of
// RESCUE_SD deviations (about twice the survivors; a cache checked the
// same way), and from lb = 0 only if that one fails too. The cost of a
// failure is then about one more sampled stream, not an exact stream from
// lb = 0 that pushes and compacts most of the range. fs_prof[slot] counts
// rescues, fs_prof[30] the ones that fell through to lb = 0. (The row path
// does the same in scan_impl's attempt loop.)
template <int TAG, bool HEAD>
__device__ __noinline__ void rescue(u64* buf, Shared& sh, const void* row_scores, long long start, long long end,
                                    bool aligned, int cap, int k, int nan_largest, long long want, int slot) {
    // Scalars, not the ScanParams reference: a reference passed to an
    // out-of-line function makes the kernel copy its parameters to the stack
    // at entry (128 bytes per thread, paid on every launch).
    constexpr int TILE = FS_BLOCK * Elem<TAG>::ITEMS;
    const long long range = end - start;
    restart(sh, slot);
    if (sampling_applies<TAG>(range, k)) {  // uniform
        const u32 rate = sample_lb<TAG, 1>(sh, row_scores, sample_start<TAG, HEAD>(start), end, aligned, k, nan_largest, (float)RESCUE_SD);
        __syncthreads();
        stream_range<TAG, false, HEAD>(buf, sh, row_scores, (u32)start, (u32)end, aligned, cap, k, nan_largest, rate);
        __syncthreads();
        if ((long long)sh.count >= want) return;  // uniform
        restart(sh, PROF_RESCUE_RESTARTS);
    }
    stream_range<TAG, false, HEAD>(buf, sh, row_scores, (u32)start, (u32)end, aligned, cap, k, nan_largest, (u32)TILE);
}

#endif  // FLASHSEL_SELECT_FILTER_STREAM_CUH
