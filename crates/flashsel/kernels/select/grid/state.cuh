// The grid path's layout (the host's, checked), its per-row global state
// (barrier and list counters, the sampled pass's tally, one histogram per
// pass), the row barrier, and the histogram flush and crossing-bin search
// that every CTA of a row runs identically.
#ifndef FLASHSEL_SELECT_GRID_STATE_CUH
#define FLASHSEL_SELECT_GRID_STATE_CUH

#include "common/sync.cuh"
#include "common/profile.cuh"

enum : int { GRID_SAMPLE_SD = 4 };  // the sampled pass's margin in its rank, standard deviations
// A CTA whose placement reads at least this many staged entries (its entries
// x the padded list) places two a warp (see the placement's measurements).
enum : int { GRID_PLACE_PAIR = 32768 };
// The host's grid layout (compile.rs passes plan::GRID_MAX_K, GRID_SMALL and
// GRID_STATE_WORDS): the most k, the list's room past k, the state per row.
#if !defined(FS_HOST_GRID_MAX_K) || !defined(FS_HOST_GRID_SMALL) || !defined(FS_HOST_GRID_STATE_WORDS)
#error "the host passes FS_HOST_GRID_MAX_K, FS_HOST_GRID_SMALL and FS_HOST_GRID_STATE_WORDS"
#endif
// The placement reads the staged list GRID_STEP entries a round (8 per
// lane); the stage is padded to a multiple of it.
#define GRID_STEP 256
// Stage loads per thread: the longest list, rounded up to GRID_STEP, over
// FS_BLOCK threads.
#define GRID_STAGE_ROUNDS \
    ((FS_HOST_GRID_MAX_K + FS_HOST_GRID_SMALL + GRID_STEP - 1) / GRID_STEP * GRID_STEP / FS_BLOCK + 1)
enum : int { GRID_SMALL = 256 };  // a crossing bin this small ends the passes (the most the host sizes for)
#define GRID_ITEMS 16   // elements per thread in registers
#define GRID_BINS 2048  // 11-bit digits
#define GRID_PASSES 6   // ceil(32 / 11) key passes + ceil(31 / 11) column passes
#define GRID_SLOTS (1 + GRID_PASSES)  // histograms: slot 0 the sampled pass's, slot 1 + i pass i's
#define GRID_SAMPLE_TOPS 4  // the sampled pass: at most this many sample keys a warp (else no sample)
// Per row: barrier and list counters (line 0), the sampled pass's tally
// (line 1), then GRID_SLOTS histograms.
#define GRID_HDR 64  // two 128-byte lines: barrier and list counters; the sampled pass's tally
#define GRID_STATE_WORDS (GRID_HDR + GRID_SLOTS * GRID_BINS)
static_assert(FS_BLOCK == 512, "grid_crossing: one 16-byte histogram load per thread, 16 warps");
static_assert(GRID_SMALL <= FS_HOST_GRID_SMALL, "the host sizes each row's list for k + FS_HOST_GRID_SMALL");
static_assert(GRID_STATE_WORDS == FS_HOST_GRID_STATE_WORDS, "the host's state layout differs");

struct GridShared {
    u32 hist[GRID_BINS];
    u32 part[WARPS];
    u32 bin, above, cnt, base, nsmall;
    u32 scand[GRID_SAMPLE_TOPS * WARPS];  // each warp's largest sample keys
    u32 admitted;                             // the CTA's keys in the sampled pass
    u32 s_lo, s_shift;                        // warp 0's bound for the CTA
    u64 T;
    u64 tally;  // the row's tally word as last read
    u64 small[GRID_SMALL];
    // The list by bin: bin b's first list entry for this CTA (the keys of
    // the row in bins above b, then the other CTAs' keys in b before it).
    u32 binpos[GRID_BINS];
};

// The sampled pass's tally word: each CTA adds GRID_TALLY_ONE plus the keys
// it counted, so the word says how many CTAs have added and what they
// counted in all.
#define GRID_TALLY_ONE (1ull << 40)
#define GRID_NO_BIN 0xffffffffu

// The crossing bin of a row's global histogram of nbins (<= GRID_BINS)
// bins, from the top: the bin b with above < r <= above + cnt, above = the
// count in bins above b. Every thread returns the same (b, above, cnt);
// b = GRID_NO_BIN where the histogram holds fewer than r.
// expected == 0 and no tally: complete (a grid barrier came first).
// expected > 0: the row's CTAs may still be adding to it; it
// is read again until its counts add up to `expected`, the composites the
// pass counts. Counts only grow, so a read whose total is `expected` saw
// every bin's final count: the reads replace the pass's grid barrier.
// tally (the sampled pass, whose total no CTA knows in advance): as
// expected > 0, with `expected` the total the tally word gives once all
// `chunks` CTAs have added to it.
// Adds the CTA's non-zero shared bins (of nbins) to the row's histogram
// ghist and clears them, so the shared histogram is zero for the next pass.
// place[j]: bin threadIdx.x + j * FS_BLOCK's count before this CTA's add,
// i.e. the CTA's place among the row's keys of that bin (0 where the CTA
// has none). A caller that ignores it gets reductions, not returning atomics.
#define GRID_FLUSH_J (GRID_BINS / FS_BLOCK)
__device__ __forceinline__ void grid_flush(GridShared& gs, u32* ghist, u32 nbins, u32 (&place)[GRID_FLUSH_J]) {
#pragma unroll
    for (int j = 0; j < GRID_FLUSH_J; ++j) {
        const u32 b = threadIdx.x + (u32)j * FS_BLOCK;
        place[j] = 0u;
        if (b < nbins) {
            const u32 v = gs.hist[b];
            if (v) {
                place[j] = atomicAdd(&ghist[b], v);
                gs.hist[b] = 0u;
            }
        }
    }
}

__device__ __forceinline__ void grid_crossing(GridShared& gs, const u32* ghist, u32 nbins, u32 r, u32& b, u32& above,
                                              u32& cnt, u32 expected, const u64* tally = nullptr, u32 chunks = 0,
                                              u32* above_out = nullptr) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool poll = expected || tally;  // uniform
    const unsigned long long t0 = poll && tid == 0 ? global_ns() : 0ull;
    if (tid == 0) gs.bin = GRID_NO_BIN;  // read after the loop's CTA barriers
    // Until every CTA has added to the tally, one thread
    // reads its word alone; the histogram reads below then start from a
    // total that is final (the bins themselves may still lag behind it).
    if (tally) {
        if (tid == 0) {
            while ((u32)(ld_relaxed_u64(tally) / GRID_TALLY_ONE) < chunks) {
                if (global_ns() - t0 > 4000000000ull) __trap();
            }
        }
        __syncthreads();
    }
    // Thread t holds bins nbins-1-4t .. nbins-4-4t (c[0] the highest).
    u32 c[4], s, before;
    for (;;) {  // uniform
        c[0] = c[1] = c[2] = c[3] = 0u;
        if (tally && tid == 0) gs.tally = ld_relaxed_u64(tally);
        if (nbins >= 4) {
            if ((u32)(4 * tid) < nbins) {
                const u32* at = ghist + nbins - 4 * (tid + 1);
                const uint4 w = poll ? ld_relaxed_v4(at) : __ldcg((const uint4*)at);
                c[0] = w.w, c[1] = w.z, c[2] = w.y, c[3] = w.x;
            }
        } else if (tid == 0) {
#pragma unroll
            for (u32 q = 0; q < 4; ++q)
                if (q < nbins) c[q] = poll ? ld_relaxed_u32(ghist + nbins - 1 - q) : __ldcg(ghist + nbins - 1 - q);
        }
        s = c[0] + c[1] + c[2] + c[3];
        u32 incl = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += v;
        }
        if (lane == 31) gs.part[warp] = incl;
        __syncthreads();
        const u32 part = lane < WARPS ? gs.part[lane] : 0u;
        before = __reduce_add_sync(FULL_MASK, lane < warp ? part : 0u) + incl - s;
        if (!poll) break;
        u32 want = expected;
        if (tally) {
            const u64 t = gs.tally;
            want = (u32)(t / GRID_TALLY_ONE) == chunks ? (u32)(t % GRID_TALLY_ONE) : 0xffffffffu;
        }
        if (__reduce_add_sync(FULL_MASK, part) == want) break;
        // The same co-residency guard as grid_barrier's.
        if (tid == 0 && global_ns() - t0 > 4000000000ull) __trap();
        __syncthreads();  // gs.part is rewritten by the next read
    }
    if (above_out) {  // each bin's count of the bins above it
        u32 acc = before;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if ((u32)(4 * tid + q) < nbins) above_out[nbins - 1 - (4 * tid + q)] = acc;
            acc += c[q];
        }
    }
    if (before < r && r <= before + s) {  // exactly one thread
        u32 acc = before;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (acc < r && r <= acc + c[q]) {
                gs.bin = nbins - 1 - (4 * tid + q);
                gs.above = acc;
                gs.cnt = c[q];
            }
            acc += c[q];
        }
    }
    __syncthreads();
    b = gs.bin, above = gs.above, cnt = gs.cnt;
    __syncthreads();  // gs is rewritten by the next call
}

#endif  // FLASHSEL_SELECT_GRID_STATE_CUH
