// The select operation's short-row path (module SelectShort): exact,
// deterministic top-k of rows short enough that the whole row fits a CTA's
// shared memory (the planner's SHORT_COLS columns): fs_short_* (indices and
// values) and their token form fs_short_tok_* (ranges, QSA blocks, slots:
// select/tokens.cuh), for prefill batches of short rows such as QSA's first
// chunk (V = 0 .. 2,048 blocks) where the streaming filter's finish, sized
// for long rows, dominates. Batches of >= SHORT_WARP_MIN_ROWS rows of <=
// SHORT_WARP_COLS columns take a warp a row instead (fs_short_warp_*,
// fs_short_warp_tok_*: four rows a CTA, no CTA barrier; select/short/warp.cuh
// has its algorithm and cost). Batches of at most one row a SM, of <=
// SHORT_WIDE_COLS columns in index order, take one wide CTA a row with the
// row in its registers (fs_short_wide_*, fs_short_wide_tok_*: select/short/wide.cuh);
// on sm_90+ a few of those rows, wider than SHORT_CLUSTER_MIN_COLS, take a
// cluster of FS_SHORT_CLUSTER_CTAS such CTAs a row instead (fs_short_cluster_*,
// fs_short_cluster_tok_*: select/short/cluster.cuh).
//
// ALGORITHM (select/short/kernel.cuh; one row per CTA of FS_SHORT_BLOCK threads)
//   1. Load the row's len elements once (16-byte loads where aligned) as
//      order keys into shared memory (common/keys.cuh: -0 == +0, NaN by the
//      policy), with their min and max.
//   2. len > k: an exact MSD radix select of the k-th largest key over the
//      key range [min, max]: each pass bins the keys of the current range by
//      their offset from its bottom, 11 bits from the range's top bit (2048
//      shared bins), and keeps the crossing bin; it stops when the range is
//      one key (at most 3 passes) or the crossing bin is wanted whole. An
//      all-equal row takes no pass.
//   3. Gather in column order: every key above the range, and of the keys in
//      it the `need` lowest columns (ties to the lower column: the
//      contract's order), as composites key << 32 | ~column; ballots place
//      each (a warp owns a run of columns).
//   4. Score order: a bitonic sort of the m = min(k, len) composites
//      (descending). Index order: the gather's order already.
//   5. The write: plain indices and values (values rebuilt from keys, the
//      merged encodings read back, as every path), or the token write
//      (ratio ids per selected column, the tail, -1, counts, page-table
//      slots). A row that selects nothing (a QSA copy row, V <= k; an empty
//      or out-of-range row) reads no score and only writes.
//
// INVARIANTS
//   - Composites are unique within a row, so the selected set and its
//     orders are exactly the contract's: the same bytes as the CPU engine.
//   - The range [lo, hi] always holds the k-th largest key; `above` keys lie
//     above it, need = k - above of the range's are taken, lowest columns
//     first.
//   - Every loop with a barrier has a CTA-uniform bound.
//
// COST
//   Reads each score once; per key a conversion and a shared store, per
//   pass a shared read and an atomic, two ballot sweeps; score order a
//   bitonic sort of m. Work follows each row's length: grid x is the rows
//   (one CTA each, the hardware scheduler balances rows of any length),
//   longest first for a causal chunk (CTA x takes row rows - 1 - x).
//
// Compile-time values (the host passes them as -D): FS_BLOCK (for the
// shared headers), FS_SHORT_BLOCK (threads per CTA, plan::SHORT_BLOCK),
// FS_SHORT_WARPS (warps, so rows, per CTA of the warp kernels,
// plan::SHORT_WARPS), FS_SHORT_WIDE_BLOCK (threads of the wide kernels'
// CTA, plan::SHORT_WIDE_BLOCK).

#include "select/short/kernel.cuh"
#include "select/short/warp.cuh"
#include "select/short/wide.cuh"
#include "select/short/cluster.cuh"

// Eight CTAs an SM (<= 64 registers): a short row's latency is hidden by
// the other rows in flight.
#define SHORT_MIN_CTAS 8
extern "C" __global__ void __launch_bounds__(FS_SHORT_BLOCK, SHORT_MIN_CTAS) fs_short_f32(const ScanParams p) { short_impl<32, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_BLOCK, SHORT_MIN_CTAS) fs_short_bf16(const ScanParams p) { short_impl<16, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_BLOCK, SHORT_MIN_CTAS) fs_short_f16(const ScanParams p) { short_impl<15, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_BLOCK, SHORT_MIN_CTAS) fs_short_tok_f32(const ScanTokParams p) { short_impl<32, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_BLOCK, SHORT_MIN_CTAS) fs_short_tok_bf16(const ScanTokParams p) { short_impl<16, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_BLOCK, SHORT_MIN_CTAS) fs_short_tok_f16(const ScanTokParams p) { short_impl<15, true>(p); }

// The warp kernels: FS_SHORT_WARPS rows a CTA, eight CTAs an SM by
// registers (<= 64; shared memory usually allows fewer).
#define SHORT_WARP_THREADS (FS_SHORT_WARPS * 32)
extern "C" __global__ void __launch_bounds__(SHORT_WARP_THREADS, SHORT_MIN_CTAS) fs_short_warp_f32(const ScanParams p) { short_warp_impl<32, false>(p); }
extern "C" __global__ void __launch_bounds__(SHORT_WARP_THREADS, SHORT_MIN_CTAS) fs_short_warp_bf16(const ScanParams p) { short_warp_impl<16, false>(p); }
extern "C" __global__ void __launch_bounds__(SHORT_WARP_THREADS, SHORT_MIN_CTAS) fs_short_warp_f16(const ScanParams p) { short_warp_impl<15, false>(p); }
extern "C" __global__ void __launch_bounds__(SHORT_WARP_THREADS, SHORT_MIN_CTAS) fs_short_warp_tok_f32(const ScanTokParams p) { short_warp_impl<32, true>(p); }
extern "C" __global__ void __launch_bounds__(SHORT_WARP_THREADS, SHORT_MIN_CTAS) fs_short_warp_tok_bf16(const ScanTokParams p) { short_warp_impl<16, true>(p); }
extern "C" __global__ void __launch_bounds__(SHORT_WARP_THREADS, SHORT_MIN_CTAS) fs_short_warp_tok_f16(const ScanTokParams p) { short_warp_impl<15, true>(p); }

// The wide kernels: one CTA of FS_SHORT_WIDE_BLOCK threads a row (so <= 64
// registers), one CTA an SM.
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_wide_f32(const ScanParams p) { short_wide_impl<32, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_wide_bf16(const ScanParams p) { short_wide_impl<16, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_wide_f16(const ScanParams p) { short_wide_impl<15, false>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_wide_tok_f32(const ScanTokParams p) { short_wide_impl<32, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_wide_tok_bf16(const ScanTokParams p) { short_wide_impl<16, true>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_wide_tok_f16(const ScanTokParams p) { short_wide_impl<15, true>(p); }

// The wide kernel's cluster form: clusters of FS_SHORT_CLUSTER_CTAS CTAs
// (plan::SHORT_CLUSTER_CTAS), the cluster shape set at the launch.
#ifndef FS_SHORT_CLUSTER_CTAS
#error "the host passes FS_SHORT_CLUSTER_CTAS (plan::SHORT_CLUSTER_CTAS)"
#endif
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_cluster_f32(const ScanParams p) { short_cluster_impl<32, false, FS_SHORT_CLUSTER_CTAS>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_cluster_bf16(const ScanParams p) { short_cluster_impl<16, false, FS_SHORT_CLUSTER_CTAS>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_cluster_f16(const ScanParams p) { short_cluster_impl<15, false, FS_SHORT_CLUSTER_CTAS>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_cluster_tok_f32(const ScanTokParams p) { short_cluster_impl<32, true, FS_SHORT_CLUSTER_CTAS>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_cluster_tok_bf16(const ScanTokParams p) { short_cluster_impl<16, true, FS_SHORT_CLUSTER_CTAS>(p); }
extern "C" __global__ void __launch_bounds__(FS_SHORT_WIDE_BLOCK, 1) fs_short_cluster_tok_f16(const ScanTokParams p) { short_cluster_impl<15, true, FS_SHORT_CLUSTER_CTAS>(p); }
