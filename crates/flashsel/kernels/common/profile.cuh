// Phase counters of a profiling build (FS_PROFILE=1; the host's `profile`
// feature): fs_prof[slot] accumulates clock64() cycles or %globaltimer ns,
// or counts. Without FS_PROFILE every PROF_* is nothing.
#ifndef FLASHSEL_COMMON_PROFILE_CUH
#define FLASHSEL_COMMON_PROFILE_CUH

#include "common/sync.cuh"

#ifndef FS_PROFILE
#define FS_PROFILE 0
#endif

#if FS_PROFILE
// 0 row cycles, 1 in-loop compaction cycles, 2 in-loop compactions, 3 finish
// cycles, 4 CTA rows, 5 optimistic segments redone, 6 row-path sample
// restarts, 7 split-row exact fallbacks, bucket passes' cycles: 8 ranges,
// 15 histogram and scan, 17 scatter, 31 rank (thread 0),
// 9 last-CTA merge cycles, 10/11/12 finish: exact compaction / sort / write
// cycles, 13 candidates at the finish, 14 bucket-rank finishes, 16 histogram passes (thread 0 of each CTA counts).
// Grid rows (CTA 0 of each row, %globaltimer ns): 20 rows, 21 passes, 22 load,
// 23 pass work, 25 pass decisions (the histogram reads that wait for the
// row's CTAs),
// 26 gather, 27 gather barrier wait, 30 staging and T, 18 placement's counts,
// 28 its writes, 29 whole CTA; 19 whole CTA in cycles; 32 the row sample's
// load and bound (the sampled pass), 33 rows whose sampled pass resolved, 34
// rows that fell back from it to the exact passes; 36 the sample's loads
// (thread 0's), 40 the warps' top sample keys and the CTA barrier after
// them, 37 the bound's rank, then 32 holds the PDL wait only; 38 the
// gather's list atomic (26 then holds its writes).
__device__ unsigned long long fs_prof[48];
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
