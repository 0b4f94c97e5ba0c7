// Phase counters of a profiling build (FS_PROFILE=1; the host's `profile`
// feature): fs_prof[slot] accumulates clock64() cycles or %globaltimer ns,
// or counts. Without FS_PROFILE every PROF_* is nothing.
#ifndef FLASHSEL_COMMON_PROFILE_CUH
#define FLASHSEL_COMMON_PROFILE_CUH

#include "common/sync.cuh"

#ifndef FS_PROFILE
#define FS_PROFILE 0
#endif

// The slots of fs_prof (what each accumulates; the modules have an array
// each, so a number may mean one thing in the filter and another in the grid).
enum ProfSlot : int {
    // Filter (row and split paths): clock64() cycles or counts.
    PROF_ROW_CYCLES = 0,           // a row, whole
    PROF_LOOP_COMPACT_CYCLES = 1,  // in-loop compactions
    PROF_LOOP_COMPACTIONS = 2,     // their count
    PROF_FINISH_CYCLES = 3,        // the finish
    PROF_CTA_ROWS = 4,             // rows a CTA finished
    PROF_SEGMENTS_REDONE = 5,      // optimistic segments streamed again
    PROF_ROW_RESTARTS = 6,         // row path: a failed sampled bound, first restart
    PROF_SPLIT_FALLBACKS = 7,      // split rows selected again exactly
    PROF_BUCKET_RANGES = 8,        // bucket rank: the ranges step (thread 0)
    PROF_MERGE_CYCLES = 9,         // split rows: the last CTA's merge
    PROF_FINISH_COMPACT = 10,      // finish: the exact compaction
    PROF_FINISH_SORT = 11,         // finish: the sort
    PROF_FINISH_WRITE = 12,        // finish: the write
    PROF_FINISH_CANDIDATES = 13,   // candidates at the finish
    PROF_BUCKET_FINISHES = 14,     // finishes by bucket rank
    PROF_BUCKET_HIST = 15,         // bucket rank: histogram and scan
    PROF_HIST_PASSES = 16,         // compaction histogram passes (thread 0 of each CTA)
    PROF_BUCKET_SCATTER = 17,      // bucket rank: scatter
    PROF_RESCUE_RESTARTS = 30,     // restarts from lb = 0 after the rescue's bound
    PROF_BUCKET_RANK = 31,         // bucket rank: the rank step (thread 0)
    // Grid rows: CTA 0 of each row, %globaltimer ns unless noted.
    PROF_GRID_PLACE_COUNT = 18,    // placement's counts
    PROF_GRID_CTA_CYCLES = 19,     // the whole CTA, cycles
    PROF_GRID_ROWS = 20,           // rows
    PROF_GRID_PASSES = 21,         // radix passes
    PROF_GRID_LOAD = 22,           // the chunk's load
    PROF_GRID_PASS_WORK = 23,      // a pass's histogram and flush
    PROF_GRID_PASS_DECIDE = 25,    // a pass's histogram reads (they wait for the row's CTAs)
    PROF_GRID_GATHER = 26,         // the gather (with the list atomic, its writes)
    PROF_GRID_GATHER_WAIT = 27,    // the gather's barrier
    PROF_GRID_PLACE_WRITE = 28,    // placement's writes
    PROF_GRID_CTA_NS = 29,         // the whole CTA
    PROF_GRID_STAGE = 30,          // staging (and T)
    PROF_GRID_SAMPLE_BOUND = 32,   // the row sample's bound, then the PDL wait only
    PROF_GRID_SAMPLE_RESOLVED = 33,  // rows whose sampled pass resolved (count)
    PROF_GRID_SAMPLE_FELL_BACK = 34,  // rows that fell back to the exact passes (count)
    PROF_GRID_SAMPLE_LOADS = 36,   // the sample's loads (thread 0's)
    PROF_GRID_BOUND_RANK = 37,     // the bound's rank
    PROF_GRID_LIST_ATOMIC = 38,    // the gather's list atomic
    PROF_GRID_SAMPLE_SEEN = 39,    // keeps the sample's loads ahead of the stamp (never counts)
    PROF_GRID_SAMPLE_TOPS = 40,    // the warps' top sample keys and the barrier after them
    PROF_INDEX_SELECT = 41,        // index-order finish: the unordered selection (thread 0)
    PROF_INDEX_PLACE = 42,         // index-order finish: the bitmap's column order (thread 0)
    PROF_INDEX_FINISHES = 43,      // finishes by index_select (count)
    PROF_SLOTS = 48,               // fs_prof's length
};

#if FS_PROFILE
__device__ unsigned long long fs_prof[PROF_SLOTS];
#define PROF_ADD(i, v) atomicAdd(&fs_prof[(i)], (unsigned long long)(v))
#define PROF_CLOCK() clock64()
#define PROF_NS() global_ns()
#else
#define PROF_NS() 0ull
#define PROF_ADD(i, v) ((void)(v))
#define PROF_CLOCK() 0ll
#endif
// In a FS_PROFILE build and where `on`: adds the time since `last` (a
// variable) to fs_prof[slot] and moves `last` to now; `now` reads a clock
// (PROF_NS or PROF_CLOCK).
#define PROF_STAMP(on, now, last, slot)       \
    do {                                      \
        if (FS_PROFILE && (on)) {             \
            const auto t_ = (now);            \
            PROF_ADD(slot, t_ - (last));      \
            (last) = t_;                      \
        }                                     \
    } while (0)

#endif  // FLASHSEL_COMMON_PROFILE_CUH
