// The select operation's grid path (module SelectGrid): exact, deterministic
// top-k of few long rows.
//
// Grid rows: fs_grid_init_all, then fs_grid_*. A cooperative launch of
// `chunks` CTAs per row (all resident: the host launches with the cooperative
// attribute, at most one CTA per SM), for rows whose chunk fits the CTA's
// registers (<= FS_BLOCK * GRID_ITEMS elements).
//
// ALGORITHM
//   Every CTA loads its chunk once, into registers, as order keys, and with
//   it the row-wide sample: the same VEC elements per thread in every CTA of
//   the row (rows of at least 4 x 512 x VEC elements whose
//   k needs at most GRID_SAMPLE_TOPS sample keys a warp). The row's
//   CTAs then run an exact MSD radix select together on the grid composite
//       g = key << 32 | (len - 1 - column)
//   (the contract's order: larger key, then lower column; the low word needs
//   only bit_width(len - 1) bits, so a plateau costs passes only for the bits
//   its columns use). Each pass: every CTA histograms (shared memory) the next
//   digit (<= 11 bits) of its composites that match the prefix decided so
//   far and adds the non-zero bins to the row's global histogram of that
//   pass; then each CTA reads the whole histogram until its counts add up to
//   the composites the pass counts (len, then the previous crossing bin's
//   count: no barrier needed, counts only grow) and, identically, finds
//   the crossing bin:
//   the one that holds the r-th largest (r: how many the prefix still
//   needs). The passes stop
//   when that bin is wanted whole or holds at most GRID_SMALL composites
//   (random f32 rows: 2 passes; the last possible pass has one-composite
//   bins, so the loop ends: at most 6).
//   The sampled pass, where a row has its sample, comes first: each CTA
//   takes its warps' largest sample keys (a warp's top `tops`), and the
//   rs-th largest of those (ranked by warp 0 alone), rs = the sample keys
//   expected at or above the k-th plus GRID_SAMPLE_SD deviations, is the
//   bound s_lo: at least rs sample keys reach it. Bins of 2^s_shift keys
//   from s_lo (s_lo a multiple
//   of it; the sample's largest key in the lower half of the 2048 bins; the
//   last bin takes everything above) count the keys >= s_lo, and a tally
//   word (CTAs added, keys counted) tells the readers the total to wait
//   for. A crossing bin other than the last is a key prefix, so the passes
//   go on below it as below any pass's crossing bin (random f32 rows: none
//   needed, the bin holds ~3-30 keys). Fewer than m counted, or the k-th
//   in the last bin: the bound missed, and the passes run from the top as
//   without a sample (the histograms have a slot each). A bound tied in the
//   sample (a plateau: ReLU zeros, equal rows) takes one key a bin, so the
//   plateau's key is decided by this pass and only column passes follow.
//   Gather: each CTA appends its composites at or above the crossing bin's
//   lower edge to the row's list (<= k - 1 + GRID_SMALL entries: the bins
//   above, then the crossing bin), one global atomic per CTA; one more
//   barrier. Where the sampled pass decided the crossing bin (random rows),
//   the list is laid out by its bins instead, with no counter:
//   bin d starts at the count of the bins above it,
//   each CTA's keys of d at the place its flush's atomic on d returned.
//   Every CTA copies the list to shared memory. Index order only: if the
//   crossing bin is not wanted whole, its r-th largest T is found there by
//   counting (<= GRID_SMALL^2 compares); the selection is exactly
//   { g >= T }.
//   Place: each CTA places its share of the list, a warp counting the
//   entries ahead of each. Score order: the entries with a larger g, i.e.
//   the entry's rank in the list; it is selected and written there iff the
//   rank is below m (no T). Index order: the selected entries with a larger
//   low word (a lower column). Values come back from the keys, except where a key merged
//   several encodings (zeros, NaNs): those are read from the row (their own
//   bits: NaN payloads, -0.0).
//
// INVARIANTS
//   - Grid composites are unique in a row, so ranks and T are exact and the
//     positions are a permutation of 0..m, whatever order the list was
//     appended in: the output does not depend on scheduling.
//   - Every CTA of a row takes the same decisions from the same global
//     histogram (read only once complete: its total is the count of
//     composites the pass counts, and no bin exceeds its final count);
//     barrier and loop bounds are uniform over the row's CTAs.
//   - The sample's bound decides nothing: every CTA computes the same s_lo
//     and s_shift from the same elements, and the crossing bin it yields
//     is the exact one whenever the pass counts at least m keys and the
//     k-th is not in the last bin; otherwise the exact passes run from the
//     top. The tally is read with the histogram: once every CTA has added,
//     the bins are trusted only when they add up to its total.
//   - Global state (barrier and list counters, the tally, one histogram per
//     pass) is zeroed by fs_grid_init_all before each run, never assumed; a
//     barrier or histogram read that waits over 4 s traps rather than hangs
//     (co-residency broken).
//   - The shared histogram is all zero at the start of every pass: the CTA
//     clears it once, and each pass clears the bins it filled as it adds
//     them to the global histogram.
//
// COST
//   Reads: each score once (+ one read per selected zero or NaN value), and
//   the sample (512 x 16 bytes) by every CTA of the row. The sampled pass:
//   a warp max and one CTA barrier for the bound, then a histogram of the
//   keys >= s_lo (about 1% of the row). Per pass: a
//   shared histogram over the CTA's matching composites, <= 2048 global
//   atomics per CTA, reads of the global histogram (one 16-byte load per
//   thread each) until it is complete (the sampled pass: one thread polls
//   the tally word until every CTA has added). Then one
//   atomic (none with the bin layout) and one barrier for the list, and the
//   placement: about (k + GRID_SMALL)^2 / chunks compares per CTA (the
//   planner bounds it). The work per element is unrolled over a thread's
//   elements: fs_grid8_* (8 a thread) for chunks of at most FS_BLOCK x 8
//   issue about half the instructions of fs_grid_*'s 16 in those phases.
//
// Compile-time values (the host passes them as -D): FS_BLOCK (threads per
// CTA, 512), FS_HOST_GRID_MAX_K, FS_HOST_GRID_SMALL, FS_HOST_GRID_STATE_WORDS
// (the host's layout); FS_PROFILE=1 adds the phase counters.

#include "select/grid/kernel.cuh"

struct GridInitParams {
    u32* state;       // rows x GRID_STATE_WORDS
    long long words;
};
// Zeroes every row's grid state (grid: any; each thread strides). Lets a
// programmatically dependent fs_grid_* start at once.
extern "C" __global__ void __launch_bounds__(FS_BLOCK) fs_grid_init_all(const GridInitParams p) {
    // The stream's previous kernel (which may be the last call's fs_grid_*,
    // reading this state; or the one writing the scores that fs_grid_*
    // loads before its own wait) is done before fs_grid_* may start.
    CHAIN_WAIT();
    PDL_TRIGGER();
    for (long long i = (long long)blockIdx.x * FS_BLOCK + threadIdx.x; i < p.words; i += (long long)gridDim.x * FS_BLOCK)
        p.state[i] = 0u;
}

// Grid rows: one CTA per SM at most (cooperative launch).
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_f32(const GridParams p) { grid_impl<32, GRID_ITEMS, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_bf16(const GridParams p) { grid_impl<16, GRID_ITEMS, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid_f16(const GridParams p) { grid_impl<15, GRID_ITEMS, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_f32(const GridParams p) { grid_impl<32, 8, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_bf16(const GridParams p) { grid_impl<16, 8, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid8_f16(const GridParams p) { grid_impl<15, 8, false>(p); }
// f32 only: a 16-bit type's VEC group is 8 elements.
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_grid4_f32(const GridParams p) { grid_impl<32, 4, false>(p); }
