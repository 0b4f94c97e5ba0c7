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
//   The split token kernels (filter_tokens.cu) read a row from the 16-byte
//   boundary at or below its first score and mask the elements before it
//   (filter/span.cuh), so a range that starts anywhere loads as an aligned
//   one; every column moves by the same offset, so the order is unchanged.
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

#include "select/filter/kernel.cuh"

// Row path (one CTA per row): two CTAs per SM. Split path: room for the last
// CTA's merge; its grids are small (one row's CTAs spread over the GPU).
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_f32(const ScanParams p) { scan_impl<32, false, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_bf16(const ScanParams p) { scan_impl<16, false, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, SCAN_MIN_CTAS) fs_scan_f16(const ScanParams p) { scan_impl<15, false, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_f32(const ScanParams p) { scan_impl<32, true, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_bf16(const ScanParams p) { scan_impl<16, true, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_split_f16(const ScanParams p) { scan_impl<15, true, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_f32(const ScanParams p) { prep_impl<32, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_bf16(const ScanParams p) { prep_impl<16, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_BLOCK, 1) fs_prep_f16(const ScanParams p) { prep_impl<15, false>(p); }
