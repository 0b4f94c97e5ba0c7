//! The planner: a pure function from a geometry and a device description to the
//! launch plan of the CUDA engine.
//!
//! Nothing here touches a GPU, so `flashsel plan` and the tests run anywhere.
//!
//! # Rules
//! - Every CTA runs the same streaming-filter selection (`kernels/select/filter.cu`)
//!   over a contiguous range; its candidate buffer holds at least `2k + tile`
//!   composites. The buffer lives in shared memory when it fits the device's
//!   opt-in limit, else in a per-CTA slice of the workspace (`Buffer::Global`):
//!   same code, any `k`. No `k` makes a plan impossible. A shared buffer takes
//!   the room there is (two CTAs per SM on the row path, the whole opt-in limit
//!   on the split path): scratch for the finish, fewer barriers.
//! - `fit` is the shortest range worth a CTA of its own: `max(8192, 4k)`
//!   columns, so a split CTA always discards at least three quarters of what it
//!   reads.
//! - Rows are spread over CTAs until one wave fills the SMs:
//!   `ctas_per_row = clamp(floor(SMs / rows), 1, cols / fit)`. Many rows
//!   (prefill) give one CTA per row (`Path::Row`, one read of each score, the
//!   result written directly, two CTAs per SM). Few wide rows split
//!   (`Path::Split`) or, where their chunks fit the registers, take the grid
//!   path (below): a single row of 4,194,304 columns uses 132 split CTAs, one
//!   of 1,048,576 columns 132 grid CTAs; never one.
//! - A split row's CTAs each append their exact top-`min(k, n)` to the row's
//!   candidate slots (at most `ctas_per_row x k`, so nothing can overflow);
//!   the CTA that finishes last merges them in the same launch (one merge
//!   round, exact: the top k of a union is the top k of the union of the
//!   parts' top k).
//! - Before the scan, `fs_prep_*` (one CTA per split row) zeroes the row's
//!   counters and, for rows of at least 4 tiles with `8k <= len`, samples the
//!   whole row: the composite of a sample rank chosen so that clearly more than `k`
//!   elements are expected above it (on a plateau of ties its column is scaled
//!   from the sample to the row). Every scan CTA of the row starts its
//!   filter there, so the row's candidates number about `k (1 + margin)` and
//!   the merge is cheap; the last CTA re-selects the row exactly if the bound
//!   admitted fewer than `min(k, len)` elements.
//! - Few rows whose share per CTA fits the CTA's registers take the grid
//!   path (`Path::Grid`) instead of the split: `floor(SMs / rows)` CTAs per
//!   row (chunks of at least [`grid_min_chunk`], at most [`GRID_CHUNK`]
//!   columns), one cooperative launch in which the row's CTAs radix-select
//!   together (a global histogram per pass, a barrier between passes) and
//!   place the selected entries by counting. No sample, no merge CTA: the
//!   single-row shapes (262,144 and 1,048,576 columns) take it. `k` is
//!   bounded ([`GRID_MAX_K`], and `k^2 / ctas_per_row <= GRID_PLACE_MAX`, the
//!   placement's compares per CTA); past either bound the split path runs.
//! - Batches of short rows take the short-row path (`Path::Short`,
//!   `kernels/select/short.cu`): more rows than SMs, of at most
//!   [`SHORT_COLS`] columns, `k <= SHORT_MAX_K`. One CTA of [`SHORT_BLOCK`]
//!   threads per row loads the whole row into shared memory once,
//!   radix-selects the k-th key exactly, gathers the selection in column
//!   order and (score order) sorts it. The bounds are measured (H200,
//!   docs/perf-log.md v34): a CTA's row takes ~10-30 us, so a batch gains
//!   (8192 x 2048 k 512: 240 against 326 us on the row path) while a few
//!   rows lose (1 x 8192: 27.8 against 15.1 us; a 512-thread CTA with the
//!   row in shared memory still 19.4 against 10.2 us at 1 x 16,384, and
//!   9.3 against 6.2 at 1 x 1024), and the bitonic sort of a larger `k`
//!   loses too (8192 x 8192 k 2048: 1318 against 696 us). Its grid is the
//!   rows, so
//!   the hardware scheduler balances rows of any active length, and a row
//!   that selects nothing only writes. (The streaming filter's finish,
//!   sized for long rows, cost ~11 us a row there: docs/perf-log.md, v33.)
//!   Where its shared memory does not fit the device, the row path runs.
//!   Batches of at least [`SHORT_WARP_MIN_ROWS`] rows of at most
//!   [`SHORT_WARP_COLS`] columns take the same path's warp kernel instead
//!   (`ShortPlan::warp`, `kernels/select/short/warp.cuh`): [`SHORT_WARPS`]
//!   rows a CTA, one warp each, no CTA barrier, so a row pays a warp's
//!   latency and not a CTA's barriers (issue 21). Measured (H200,
//!   docs/perf-log.md v35): 8192 rows of 1024 .. 4096 columns gain in both
//!   orders (the QSA first chunk 88.4 -> 62.0 us; 8192 x 4096 k 512 index
//!   173.4 -> 121.0), 1024 x 2048 gains (index 18.3 -> 15.0, score 40.3 ->
//!   33.3) but 528 x 2048 loses (10.4 -> 13.3, 20.5 -> 23.9: a warp's row
//!   takes ~13-27 us, hidden only by enough rows), and 1024 x 8192 loses
//!   (84.4 -> 150.8). Both bounds are [`PathOptions`] fields (the engine's
//!   `set_short_warp`; `FLASHSEL_SHORT_WARP=0` turns the warp kernel off).
//!   Batches of at most one row a SM in index order, rows of at most
//!   [`SHORT_WIDE_COLS`] columns and `k <= SHORT_WIDE_MAX_K`, take the wide
//!   kernel
//!   (`ShortKernel::Wide`, `kernels/select/short/wide.cuh`): one CTA of
//!   [`SHORT_WIDE_BLOCK`] threads a row, the row in its registers, the
//!   radix passes on shared bins and the selection placed by one CTA scan,
//!   no global scratch and no second kernel (issue 21's decode rows of
//!   16,384 QSA blocks; `set_short_wide`, `FLASHSEL_SHORT_WIDE=0` turns it
//!   off). Measured (H200, docs/perf-log.md v42, index order): 1 x 16,384
//!   k 512 bf16 12.4 -> 8.1 us (grid), 1 x 4096 18.5 -> 6.4 (row), 1 x
//!   1024 8.2 -> 6.2 (row), 132 x 16,384 k 2048 16.8 -> 9.1 (row); score
//!   order stays on the other paths (a bitonic sort by the CTA measured
//!   16.7 against 12.4 us at 1 x 16,384). On sm_90+, batches of at most
//!   [`SHORT_CLUSTER_MAX_ROWS`] rows wider than [`SHORT_CLUSTER_MIN_COLS`]
//!   take its cluster form (`ShortKernel::Cluster`,
//!   `kernels/select/short/cluster.cuh`): a row on a cluster of
//!   [`SHORT_CLUSTER_CTAS`] CTAs, the histograms summed through distributed
//!   shared memory (v43: 1 x 16,384 k 512 bf16 7.76 -> 6.71 us, QSA decode
//!   1 x 16,384 blocks 8.9 -> 8.1; `set_short_cluster`,
//!   `FLASHSEL_SHORT_CLUSTER=0` turns it off).
//! - Work follows the active lengths: a CTA's range is its share of
//!   `lengths[row]`, not of `cols`, so short rows in a wide buffer cost what
//!   their length costs (the grid is sized by `cols`; CTAs with empty ranges
//!   append nothing).

use super::{OutputOrder, SelectSpec};
use crate::contract::{DType, Error, Result};

/// Threads per CTA of every kernel.
pub const BLOCK: u32 = 512;
/// Elements per tile of every streaming loop, all dtypes (kernel: `FS_BLOCK *
/// Elem<...>::ITEMS`, 8 items per thread: one 16-byte load for the 16-bit types,
/// two for f32; 16 items for the 16-bit types measured no faster and would
/// double the rows a sample needs: docs/perf-log.md, v13).
pub const TILE: u32 = BLOCK * 8;
/// Static shared memory of a kernel (the `Shared` struct), rounded up.
pub const STATIC_SMEM: u32 = 2048;
/// The load ring of the row path's streaming loop (`FS_HOST_STAGE_BYTES`,
/// `kernels/select/filter/ring.cuh`): tiles in flight as cp.async copies in shared
/// memory, after a shared buffer, where it fits beside the smallest buffer;
/// the finish uses its room as scratch. 32 KiB: 4 tiles of a 16-bit type, 2
/// of f32. (The split path's short chunks measured slower with it: 64 x
/// 131,072 f32 23.8 -> 25.2 us, docs/perf-log.md.)
pub const STAGE_BYTES: u32 = 32 * 1024;
/// CTAs per SM the scan kernel's register budget allows (shared-buffer
/// variant; the global-buffer variant is built for one).
pub const SCAN_CTAS_PER_SM: u32 = 2;
/// Grid path: elements per thread of `fs_grid_*` (`GRID_ITEMS` in `kernels/select/grid/state.cuh`).
pub const GRID_ITEMS: u32 = 16;
/// Grid path: elements per CTA it can hold (`FS_BLOCK x GRID_ITEMS` in
/// registers).
pub const GRID_CHUNK: u64 = BLOCK as u64 * GRID_ITEMS as u64;
/// Grid path: elements per thread of the small grid kernels (`fs_grid8_*`),
/// which take chunks of at most `BLOCK x GRID_ITEMS_SMALL` elements: their
/// per-element phases issue half the instructions of `fs_grid_*`'s 16.
pub const GRID_ITEMS_SMALL: u32 = 8;
/// Grid path: elements per thread of `fs_grid4_f32` (f32 rows only: a
/// thread's 16-byte load holds 8 elements of the 16-bit types), for chunks
/// of at most `BLOCK x GRID_ITEMS_TINY`.
pub const GRID_ITEMS_TINY: u32 = 4;
/// Grid path: the smallest share of a row worth a CTA: one full CTA of the
/// narrowest grid kernel for the dtype (f32 `BLOCK x GRID_ITEMS_TINY` =
/// 2048, the 16-bit types `BLOCK x GRID_ITEMS_SMALL` = 4096). More CTAs of
/// smaller chunks shorten every per-element step; f32 chunks of 2048
/// measured 0.4-2.5 us faster than 4096 on every f32 geometry the rule
/// changed, 1 x 16,384 .. 262,144 (docs/perf-log.md, v31).
pub fn grid_min_chunk(dtype: crate::contract::DType) -> u64 {
    BLOCK as u64 * grid_items_narrowest(dtype) as u64
}

/// The fewest elements a thread of a grid kernel holds for `dtype`:
/// [`GRID_ITEMS_TINY`] for f32 (`fs_grid4_f32`), [`GRID_ITEMS_SMALL`] for the
/// 16-bit types, whose 16-byte load is 8 elements.
pub fn grid_items_narrowest(dtype: crate::contract::DType) -> u32 {
    if dtype == crate::contract::DType::F32 {
        GRID_ITEMS_TINY
    } else {
        GRID_ITEMS_SMALL
    }
}
/// The shortest range (tiles) the filter kernels sample a bound for
/// (`SAMPLE_MIN_TILES` in kernels/select/filter/sample.cuh).
pub const SAMPLE_MIN_TILES: u64 = 4;
/// Grid path: the largest `k` (each CTA stages the row's `k` selected
/// composites in shared memory to place its share).
pub const GRID_MAX_K: u64 = 4096;
/// Grid path: the most composites of the crossing bin resolved by counting
/// (`GRID_SMALL` in `kernels/select/grid/state.cuh` may be set lower, never higher); each row's
/// list holds `k + GRID_SMALL`.
pub const GRID_SMALL: u64 = 256;
/// Grid path: the most `k^2 / ctas_per_row` (compares per CTA placing the
/// selection) it takes.
pub const GRID_PLACE_MAX: u64 = 1 << 17;
/// Grid path: `u32` words of state per row (barrier and list counters on
/// one 128-byte line, the sampled pass's tally on the next, a 2048-bin
/// histogram for the sampled pass and one for each of the 6 radix passes);
/// `GRID_STATE_WORDS` in `kernels/select/grid/state.cuh`.
pub const GRID_STATE_WORDS: u64 = 64 + 7 * 2048;
/// Short-row path: the widest rows it takes (the buffer width `cols`; a
/// row's own length may be anything up to it).
pub const SHORT_COLS: u64 = 8192;
/// Short-row path: the largest `k`.
pub const SHORT_MAX_K: u64 = 512;
/// Short-row path: threads per CTA (`FS_SHORT_BLOCK`, kernels/select/short.cu).
pub const SHORT_BLOCK: u32 = 128;
/// Short-row path's warp kernel: rows (warps) per CTA (`FS_SHORT_WARPS`,
/// kernels/select/short/warp.cuh).
pub const SHORT_WARPS: u32 = 4;
/// Short-row path's warp kernel: the widest rows (`cols`) it takes
/// (measured: 8192 x 4096 k 512 gains, 1024 x 8192 loses; perf-log v35).
pub const SHORT_WARP_COLS: u64 = 4096;
/// Short-row path's warp kernel: the fewest rows it takes (measured: 1024 x
/// 2048 gains, 528 x 2048 loses; perf-log v35).
pub const SHORT_WARP_MIN_ROWS: u64 = 1024;
/// Short-row path's warp kernel: radix bins of a warp (`WBINS`).
pub const SHORT_WARP_BINS: u64 = 256;
/// Short-row path: static shared memory of its kernels (2048 histogram
/// bins and a few words), rounded up.
pub const SHORT_STATIC_SMEM: u32 = 8192 + 256;
/// Short path's wide kernel: threads of its CTA (`FS_SHORT_WIDE_BLOCK`).
pub const SHORT_WIDE_BLOCK: u32 = 1024;
/// Short path's wide kernel: columns a thread holds in registers
/// (`WIDE_ITEMS` in kernels/select/short/wide.cuh).
pub const SHORT_WIDE_ITEMS: u32 = 16;
/// Short path's wide kernel: its widest rows, `SHORT_WIDE_BLOCK x
/// SHORT_WIDE_ITEMS` columns.
pub const SHORT_WIDE_COLS: u64 = SHORT_WIDE_BLOCK as u64 * SHORT_WIDE_ITEMS as u64;
/// Short path's wide kernel: the largest `k` (the selection's scratch, 32
/// KiB; the score order's bitonic sort grows with it).
pub const SHORT_WIDE_MAX_K: u64 = 4096;
/// CTAs a cluster of the wide kernel's cluster form (`ShortKernel::Cluster`;
/// kernel: its entries' `CS`). 2, 4 and 8 measured on the H200 (perf-log
/// v43): 1 x 16,384 k 512 bf16 6.97 / 6.71 / ~8.7 us against the wide
/// kernel's 7.76.
pub const SHORT_CLUSTER_CTAS: u32 = 4;
/// Rows of the wide kernel's batches take its cluster form only when wider
/// than this (1 x 8192 measured 6.71 against 6.35 us bf16, 8.27 against
/// 6.09 f32) ...
pub const SHORT_CLUSTER_MIN_COLS: u64 = 8192;
/// ... in batches of at most this many rows (16 x 16,384 f32 measured 8.79
/// against 7.85 us, 67 rows 20.4 against 8.9).
pub const SHORT_CLUSTER_MAX_ROWS: u64 = 4;
/// Grid `x` limit of the CUDA launch.
pub const MAX_GRID_X: u64 = (1 << 31) - 1;
/// Grid `y` limit of the CUDA launch.
pub const MAX_GRID_Y: u32 = 65_535;

/// What the planner needs to know about a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceProps {
    pub sm_count: u32,
    /// Opt-in dynamic shared memory per block, bytes.
    pub max_smem_per_block: u32,
    /// Shared memory per SM, bytes.
    pub smem_per_sm: u32,
    pub max_threads_per_sm: u32,
    /// Whether kernels may run as thread-block clusters (sm_90+).
    pub clusters: bool,
}

impl DeviceProps {
    /// An H100/H200 (132 SMs, 227 KiB opt-in shared memory per block).
    pub fn hopper(sm_count: u32) -> Self {
        Self { sm_count, max_smem_per_block: 232_448, smem_per_sm: 233_472, max_threads_per_sm: 2048, clusters: true }
    }
    /// An Ada part (sm_89: 99 KiB opt-in shared memory per block, 1,536
    /// threads an SM, no clusters).
    pub fn ada(sm_count: u32) -> Self {
        Self { sm_count, max_smem_per_block: 101_376, smem_per_sm: 102_400, max_threads_per_sm: 1536, clusters: false }
    }
    /// A small device for the planners' tests: 40 SMs, 48 KiB of shared
    /// memory a block, no clusters.
    #[cfg(test)]
    pub(crate) fn small_test_device() -> Self {
        Self {
            sm_count: 40,
            max_smem_per_block: 49_152,
            smem_per_sm: 65_536,
            max_threads_per_sm: 1024,
            clusters: false,
        }
    }
}

/// The path a geometry takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// One CTA per row; one read of each score; output written directly.
    Row,
    /// Several CTAs per row; the row's last CTA merges their top-k lists.
    Split,
    /// Several CTAs per row, all resident (one cooperative launch), selecting
    /// the row together: radix passes over a global histogram, then placement.
    Grid,
    /// One small CTA (or, `ShortPlan::warp`, one warp) per short row, the
    /// whole row in shared memory.
    Short,
}

/// Where each CTA's candidate buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Buffer {
    Shared,
    Global,
}

/// A launch plan, one variant per path. Workspace offsets are bytes from the
/// workspace start, each region 256-byte aligned.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "path", rename_all = "lowercase")]
pub enum Plan {
    /// One CTA per row: the streaming filter, the result written directly.
    Row(FilterPlan),
    /// Several filter CTAs per row; the row's last CTA merges their top-k lists.
    Split(SplitPlan),
    /// Several CTAs per row, all resident, selecting the row together.
    Grid(GridPlan),
    /// One CTA per row, the row in shared memory (rows of <= [`SHORT_COLS`]).
    Short(ShortPlan),
}

/// The kernels of the short-row path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ShortKernel {
    /// `fs_short_*`: one CTA of [`SHORT_BLOCK`] threads per row, the row in
    /// shared memory.
    Cta,
    /// `fs_short_warp_*`: one warp per row, [`SHORT_WARPS`] rows a CTA.
    Warp,
    /// `fs_short_wide_*`: one CTA of [`SHORT_WIDE_BLOCK`] threads per row,
    /// the row in registers (at most one row a SM).
    Wide,
    /// `fs_short_cluster_*` (sm_90+): the wide kernel's row held by a
    /// thread-block cluster of [`SHORT_CLUSTER_CTAS`] CTAs of
    /// [`SHORT_WIDE_BLOCK`] threads (a few rows wider than
    /// [`SHORT_CLUSTER_MIN_COLS`]).
    Cluster,
}

impl ShortKernel {
    /// The kernel's name in plans and tool output.
    pub fn name(self) -> &'static str {
        match self {
            ShortKernel::Cta => "cta",
            ShortKernel::Warp => "warp",
            ShortKernel::Wide => "wide",
            ShortKernel::Cluster => "cluster",
        }
    }
}

/// The short-row launch (`fs_short_*`): grid `(rows, 1)` of [`SHORT_BLOCK`]
/// threads, CTA `x` on row `rows - 1 - x`; the warp kernel
/// (`fs_short_warp_*`): grid `(ceil(rows / SHORT_WARPS), 1)` of
/// `32 SHORT_WARPS` threads, warp `w` of CTA `x` on row `rows - 1 - (x
/// SHORT_WARPS + w)`; the wide kernel (`fs_short_wide_*`): grid `(rows, 1)`
/// of [`SHORT_WIDE_BLOCK`] threads, CTA `x` on row `rows - 1 - x`; its
/// cluster form (`fs_short_cluster_*`): grid `(rows SHORT_CLUSTER_CTAS, 1)`
/// in clusters of [`SHORT_CLUSTER_CTAS`], cluster `x` on row `rows - 1 - x`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ShortPlan {
    /// Which of the path's kernels runs.
    pub kernel: ShortKernel,
    /// Grid `x` of the launch: one CTA per row (the warp kernel: per
    /// [`SHORT_WARPS`] rows; the cluster kernel: [`SHORT_CLUSTER_CTAS`]
    /// per row).
    pub row_slots: u32,
    /// Composites of the selection's scratch: `min(k, cols)` rounded up to a
    /// power of two (the score order's bitonic sort).
    pub sel_cap: u32,
    /// Dynamic shared memory per CTA ([`short_smem_bytes`]; the warp
    /// kernel: [`short_warp_smem_bytes`]; the wide kernel: `sel_cap`
    /// composites).
    pub smem_bytes: u32,
    pub fit: u64,
    /// Always 0: nothing outside shared memory.
    pub workspace_bytes: u64,
}

/// Dynamic shared memory of a short-row CTA: the row's keys (`cols`
/// rounded up to 4, `u32`) and `sel_cap` composites.
pub fn short_smem_bytes(cols: u64, sel_cap: u64) -> u64 {
    cols.div_ceil(4) * 16 + sel_cap * 8
}

/// Dynamic shared memory of a warp kernel's CTA: [`SHORT_WARPS`] slabs, each
/// the warp's bins, its row's keys (`cols` of them: `u16` for the 16-bit
/// dtypes, `u32` for f32) and `sel_cap` entries of the selection (index
/// order: `u32` columns; score order: `u64` composites), each part rounded
/// up to 16 bytes; `warp_slab_bytes` in kernels/select/short/warp.cuh.
pub fn short_warp_smem_bytes(cols: u64, sel_cap: u64, dtype: DType, order: OutputOrder) -> u64 {
    let key = if dtype == DType::F32 { 4 } else { 2 };
    let entry = if order == OutputOrder::Index { 4 } else { 8 };
    let r16 = |b: u64| b.div_ceil(16) * 16;
    SHORT_WARPS as u64 * (SHORT_WARP_BINS * 4 + r16(cols * key) + r16(sel_cap * entry))
}

/// The streaming filter's launch (`fs_scan_*` on the row path, `fs_split_*`
/// on the split path).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FilterPlan {
    pub buffer: Buffer,
    pub ctas_per_row: u32,
    /// Grid `y` of the launch: row slots, each CTA looping over rows.
    pub row_slots: u32,
    /// Candidate buffer capacity, composites.
    pub cap: u32,
    /// Dynamic shared memory per CTA, bytes: for a shared buffer,
    /// [`shared_bytes`]`(cap, stage_bytes)`; 0 for a global one.
    pub smem_bytes: u32,
    /// The load ring's bytes, after the buffer in the dynamic shared memory
    /// ([`STAGE_BYTES`] on the row path where it fits, else 0).
    pub stage_bytes: u32,
    /// Shortest range worth a CTA of its own, columns.
    pub fit: u64,
    /// The per-CTA global candidate buffers (`Buffer::Global`): `cap + 1`
    /// composites for each of `ctas_per_row x row_slots` CTAs.
    pub gbuf: Option<u64>,
    pub workspace_bytes: u64,
}

/// A split plan: the filter launch and the rows' shared state, filled by
/// `fs_prep_*` before it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SplitPlan {
    #[serde(flatten)]
    pub filter: FilterPlan,
    /// Whether rows of the full width take the row-wide sample in
    /// `fs_prep_*` (whose key bound every CTA of the row starts from).
    pub sampled: bool,
    /// `rows x ctas_per_row x k` candidate slots (`u64` composites).
    pub cand: u64,
    /// `rows` counters of appended candidates (`u32`).
    pub row_count: u64,
    /// `rows` counters of finished CTAs (`u32`).
    pub row_done: u64,
    /// `rows` sampled key bounds (`u64`).
    pub row_lb: u64,
}

/// A grid plan: `fs_grid_init_all`, then one cooperative launch of the grid
/// kernel of width `items`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GridPlan {
    pub ctas_per_row: u32,
    /// Grid `y` of the launch: one per row.
    pub row_slots: u32,
    /// Elements a thread holds: [`GRID_ITEMS`] (`fs_grid_*`),
    /// [`GRID_ITEMS_SMALL`] (`fs_grid8_*`) or [`GRID_ITEMS_TINY`]
    /// (`fs_grid4_f32`); see [`grid_items`].
    pub items: u32,
    /// Entries of a row's list (and of each CTA's staged copy): `k + GRID_SMALL`.
    pub list_len: u32,
    /// Dynamic shared memory per CTA: the staged list ([`grid_smem_bytes`]).
    pub smem_bytes: u32,
    pub fit: u64,
    /// `rows x list_len` composites (`u64`): the bins above the crossing bin
    /// and the crossing bin.
    pub list: u64,
    /// `rows x GRID_STATE_WORDS` `u32` words, zeroed by each run.
    pub state: u64,
    /// Bytes of the state region.
    pub state_bytes: u64,
    pub workspace_bytes: u64,
}

impl Plan {
    pub fn path(&self) -> Path {
        match self {
            Plan::Row(_) => Path::Row,
            Plan::Split(_) => Path::Split,
            Plan::Grid(_) => Path::Grid,
            Plan::Short(_) => Path::Short,
        }
    }
    /// The filter launch of a row or split plan.
    pub fn filter(&self) -> Option<&FilterPlan> {
        match self {
            Plan::Row(f) => Some(f),
            Plan::Split(s) => Some(&s.filter),
            Plan::Grid(_) | Plan::Short(_) => None,
        }
    }
    pub fn split(&self) -> Option<&SplitPlan> {
        match self {
            Plan::Split(s) => Some(s),
            _ => None,
        }
    }
    pub fn grid(&self) -> Option<&GridPlan> {
        match self {
            Plan::Grid(g) => Some(g),
            _ => None,
        }
    }
    pub fn short(&self) -> Option<&ShortPlan> {
        match self {
            Plan::Short(s) => Some(s),
            _ => None,
        }
    }
    /// Threads per CTA of the plan's launches ([`BLOCK`]; the short-row
    /// path [`SHORT_BLOCK`], its warp kernel `32 SHORT_WARPS`, its wide
    /// kernel [`SHORT_WIDE_BLOCK`]).
    pub fn block(&self) -> u32 {
        match self {
            Plan::Short(s) => match s.kernel {
                ShortKernel::Cta => SHORT_BLOCK,
                ShortKernel::Warp => 32 * SHORT_WARPS,
                ShortKernel::Wide | ShortKernel::Cluster => SHORT_WIDE_BLOCK,
            },
            _ => BLOCK,
        }
    }
    /// `on_filter` of a row or split plan's filter launch, `on_grid` of a
    /// grid plan, `on_short` of a short-row plan.
    fn either<R>(
        &self,
        on_filter: impl FnOnce(&FilterPlan) -> R,
        on_grid: impl FnOnce(&GridPlan) -> R,
        on_short: impl FnOnce(&ShortPlan) -> R,
    ) -> R {
        match self {
            Plan::Row(f) => on_filter(f),
            Plan::Split(s) => on_filter(&s.filter),
            Plan::Grid(g) => on_grid(g),
            Plan::Short(s) => on_short(s),
        }
    }
    pub fn ctas_per_row(&self) -> u32 {
        self.either(|f| f.ctas_per_row, |g| g.ctas_per_row, |_| 1)
    }
    pub fn row_slots(&self) -> u32 {
        self.either(|f| f.row_slots, |g| g.row_slots, |s| s.row_slots)
    }
    /// Where each CTA's candidate buffer lives (a grid CTA stages its list in
    /// shared memory, a short-row CTA its row).
    pub fn buffer(&self) -> Buffer {
        self.either(|f| f.buffer, |_| Buffer::Shared, |_| Buffer::Shared)
    }
    /// Candidate buffer capacity (grid: the list's entries; short rows: the
    /// selection's scratch).
    pub fn cap(&self) -> u32 {
        self.either(|f| f.cap, |g| g.list_len, |s| s.sel_cap)
    }
    pub fn smem_bytes(&self) -> u32 {
        self.either(|f| f.smem_bytes, |g| g.smem_bytes, |s| s.smem_bytes)
    }
    pub fn stage_bytes(&self) -> u32 {
        self.either(|f| f.stage_bytes, |_| 0, |_| 0)
    }
    pub fn fit(&self) -> u64 {
        self.either(|f| f.fit, |g| g.fit, |s| s.fit)
    }
    /// Merge rounds after the filter: 1 for a split row (its last CTA merges
    /// the row's candidates), 0 otherwise.
    pub fn merge_levels(&self) -> usize {
        matches!(self, Plan::Split(_)) as usize
    }
    /// Whether split rows take the row-wide sample.
    pub fn sampled(&self) -> bool {
        self.split().is_some_and(|s| s.sampled)
    }
    /// The global candidate buffers' region, when `Buffer::Global`.
    pub fn gbuf(&self) -> Option<u64> {
        self.filter().and_then(|f| f.gbuf)
    }
    pub fn workspace_bytes(&self) -> u64 {
        self.either(|f| f.workspace_bytes, |g| g.workspace_bytes, |s| s.workspace_bytes)
    }
}

/// The smallest candidate buffer that works, in composites: it must hold k
/// survivors plus one more tile, and a compaction must free at least a tile.
pub fn min_cap(k: usize) -> u64 {
    2 * k as u64 + TILE as u64
}

/// Dynamic shared memory of a CTA with a shared buffer of `cap` composites
/// and a load ring of `stage` bytes: `cap + 1` composites (the last slot
/// takes a segment's pushes past `cap`, never read) padded to 16 bytes, then
/// the ring (`ring_offset` in `kernels/select/filter/buffer.cuh`).
pub fn shared_bytes(cap: u64, stage: u32) -> u64 {
    (cap + 1).div_ceil(2) * 16 + stage as u64
}

/// The largest buffer whose [`shared_bytes`] (without a ring) fit `bytes`.
pub fn shared_cap(bytes: u64) -> u64 {
    (bytes / 16 * 2).saturating_sub(1)
}

/// The shared buffer and ring that `room` bytes of dynamic shared memory
/// hold: (cap, stage bytes). The ring only where asked and beside at least
/// the smallest buffer; the buffer never below [`min_cap`].
fn shared_layout(room: u64, min_cap: u64, ring: bool) -> (u64, u32) {
    let stage = if ring && room >= shared_bytes(min_cap, STAGE_BYTES) { STAGE_BYTES } else { 0 };
    let cap = min_cap.max(shared_cap(room.saturating_sub(stage as u64)));
    (cap, stage)
}

/// Plans a selection. Pure: the same inputs always give the same plan.
pub fn plan(spec: &SelectSpec, has_lengths: bool, dev: &DeviceProps) -> Result<Plan> {
    plan_with(spec, has_lengths, dev, &PathOptions::default())
}

/// Planner switches, for the tests that pin one path against another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PathOptions {
    /// `false`: geometries the grid path would take get the split plan they
    /// took before it.
    pub grid: bool,
    /// The smallest share of a row per grid CTA (`None`: [`grid_min_chunk`]
    /// of the dtype).
    pub grid_min_chunk: Option<u64>,
    /// The most `k^2 / ctas_per_row` the grid path takes ([`GRID_PLACE_MAX`]).
    pub grid_place_max: u64,
    /// `false`: grid rows always take the 16-element kernels (`fs_grid_*`),
    /// never `fs_grid8_*` or `fs_grid4_f32`.
    pub grid_small_items: bool,
    /// `false`: rows of <= [`SHORT_COLS`] take the row path they took before
    /// the short-row path (the engine's `set_short_rows`, `FLASHSEL_SHORT=0`).
    pub short: bool,
    /// Short rows of at most this many columns take the warp kernel (0:
    /// none; [`SHORT_WARP_COLS`]; the engine's `set_short_warp`,
    /// `FLASHSEL_SHORT_WARP`) ...
    pub short_warp_cols: u64,
    /// ... in batches of at least this many rows ([`SHORT_WARP_MIN_ROWS`]).
    pub short_warp_min_rows: u64,
    /// Batches of at most one row a SM of at most this many columns take
    /// the wide kernel (0: none; at most [`SHORT_WIDE_COLS`]; the engine's
    /// `set_short_wide`, `FLASHSEL_SHORT_WIDE`).
    pub short_wide_cols: u64,
    /// Whether the wide kernel's batches of at most
    /// [`SHORT_CLUSTER_MAX_ROWS`] rows wider than [`SHORT_CLUSTER_MIN_COLS`]
    /// take its cluster form (thread-block clusters: sm_90+; the engine's
    /// `set_short_cluster`, `FLASHSEL_SHORT_CLUSTER=0`).
    pub short_cluster: bool,
}

impl Default for PathOptions {
    fn default() -> Self {
        Self {
            grid: true,
            grid_min_chunk: None,
            grid_place_max: GRID_PLACE_MAX,
            grid_small_items: true,
            short: true,
            short_warp_cols: SHORT_WARP_COLS,
            short_warp_min_rows: SHORT_WARP_MIN_ROWS,
            short_wide_cols: SHORT_WIDE_COLS,
            short_cluster: true,
        }
    }
}

/// [`plan`] with [`PathOptions`].
pub(crate) fn plan_with(spec: &SelectSpec, has_lengths: bool, dev: &DeviceProps, opts: &PathOptions) -> Result<Plan> {
    spec.validate()?;
    let _ = has_lengths; // lengths change the work, not the launch geometry
    if dev.sm_count == 0 {
        return Err(Error::InvalidOption { what: "sm count", value: "0".into(), expected: ">= 1" });
    }
    let k = spec.k as u64;
    let rows = spec.rows as u64;
    let cols = spec.cols as u64;
    let block = BLOCK;
    let tile = TILE;
    let min_cap = min_cap(spec.k);
    if min_cap > u32::MAX as u64 / 2 {
        return Err(Error::too_large("k (candidate buffer)", k as u128));
    }
    let buffer = if shared_bytes(min_cap, 0) + STATIC_SMEM as u64 <= dev.max_smem_per_block as u64 {
        Buffer::Shared
    } else {
        Buffer::Global
    };
    let fit = (4 * k).max(8192);
    if opts.short {
        if let Some(s) = short_plan(spec, fit, dev, opts) {
            return Ok(Plan::Short(s));
        }
    }
    let max_split = (cols / fit).max(1);
    let ctas_per_row = (dev.sm_count as u64).checked_div(rows).unwrap_or(1).clamp(1, max_split);
    let ctas_per_row = ctas_per_row.min(u32::MAX as u64 / 2) as u32;
    let path = if ctas_per_row == 1 { Path::Row } else { Path::Split };
    if path == Path::Split && opts.grid {
        if let Some((g, chunk)) = grid_ctas(rows, cols, k, spec.dtype, dev, opts) {
            return Ok(Plan::Grid(grid_plan(rows, k, g, fit, grid_items(chunk, spec.dtype, opts))));
        }
    }

    // A bigger buffer gives the finish its scratch space (the bucket-rank
    // passes, docs/design.md) and longer stretches between barriers.
    // Row path: as big as two CTAs per SM allow (their registers allow no
    // more). Split path: one CTA per SM anyway, so all the shared memory there
    // is: the last CTA then merges and finishes the row's candidates without
    // compacting them first.
    // The row path adds the load ring where it fits beside the smallest buffer.
    // (Grid plans returned above: `path` is Row or Split here.)
    let (cap64, stage_bytes) = match buffer {
        Buffer::Global => (min_cap, 0),
        Buffer::Shared if path == Path::Row => {
            let per_cta = (dev.smem_per_sm / SCAN_CTAS_PER_SM).saturating_sub(STATIC_SMEM + 1024) as u64;
            shared_layout(per_cta, min_cap, true)
        }
        Buffer::Shared => shared_layout((dev.max_smem_per_block - STATIC_SMEM) as u64, min_cap, false),
    };
    let cap = cap64 as u32;
    let smem_bytes = if buffer == Buffer::Shared { shared_bytes(cap64, stage_bytes) as u32 } else { 0 };

    // Resident CTAs per SM of the row-path kernel, by threads, shared memory
    // and registers (`__launch_bounds__(512, 2)` with a shared buffer). The
    // split kernel is built for one CTA per SM (the last CTA's merge needs the
    // registers), so a split grid is kept to one wave: floor(SMs / rows) CTAs
    // per row.
    let by_threads = (dev.max_threads_per_sm / block).max(1);
    let by_smem = (dev.smem_per_sm / (smem_bytes + STATIC_SMEM + 1024)).max(1);
    let by_regs = if buffer == Buffer::Shared { SCAN_CTAS_PER_SM } else { 1 };
    let per_sm = by_threads.min(by_smem).min(by_regs) as u64;
    let target = dev.sm_count as u64 * per_sm;

    // Row slots: with shared buffers, as many as the grid allows; with global
    // buffers, enough to fill the GPU, since each slot owns a buffer.
    let rows_nz = rows.max(1);
    let row_slots = match buffer {
        Buffer::Shared => rows_nz.min(MAX_GRID_Y as u64),
        Buffer::Global => rows_nz.min(target.div_ceil(ctas_per_row as u64).max(1)).min(MAX_GRID_Y as u64),
    } as u32;

    let mut ws = crate::cuda::workspace::Regions::new();
    let split = (path == Path::Split)
        .then(|| (ws.add(rows * ctas_per_row as u64 * k * 8), ws.add(rows * 4), ws.add(rows * 4), ws.add(rows * 8)));
    // A global buffer: cap + 1 composites per CTA (the spare slot, as in
    // shared_bytes).
    let gbuf = (buffer == Buffer::Global).then(|| ws.add(ctas_per_row as u64 * row_slots as u64 * (cap64 + 1) * 8));
    let filter = FilterPlan {
        buffer,
        ctas_per_row,
        row_slots,
        cap,
        smem_bytes,
        stage_bytes,
        fit,
        gbuf,
        workspace_bytes: ws.total(),
    };
    Ok(match split {
        None => Plan::Row(filter),
        Some((cand, row_count, row_done, row_lb)) => {
            // The kernel decides per row (against its active length) whether
            // the row-wide sample runs; this is the same test on the buffer width.
            let sampled = cols >= SAMPLE_MIN_TILES * tile as u64 && 8 * k <= cols;
            Plan::Split(SplitPlan { filter, sampled, cand, row_count, row_done, row_lb })
        }
    })
}

/// The short-row plan, or `None` where it does not apply. At most one row a
/// SM: the wide kernel, for index order, rows of at most
/// `opts.short_wide_cols` (<= [`SHORT_WIDE_COLS`]) columns and `k <=
/// SHORT_WIDE_MAX_K` (its cluster form with `opts.short_cluster` for at most
/// [`SHORT_CLUSTER_MAX_ROWS`] rows wider than [`SHORT_CLUSTER_MIN_COLS`]),
/// else `None`.
/// More rows: `None` for rows wider than [`SHORT_COLS`], `k` past
/// [`SHORT_MAX_K`], more rows than one launch's grid `x`, or shared memory
/// the device cannot give one CTA; batches of at least
/// `opts.short_warp_min_rows` rows of at most `opts.short_warp_cols` columns
/// take the warp kernel where its CTA's shared memory fits (else the CTA
/// kernel).
fn short_plan(spec: &SelectSpec, fit: u64, dev: &DeviceProps, opts: &PathOptions) -> Option<ShortPlan> {
    let (rows, cols, k) = (spec.rows as u64, spec.cols as u64, spec.k as u64);
    let sel_cap = k.min(cols).max(1).next_power_of_two();
    if rows <= dev.sm_count as u64 {
        let wide = spec.order == OutputOrder::Index
            && cols <= opts.short_wide_cols.min(SHORT_WIDE_COLS)
            && k <= SHORT_WIDE_MAX_K;
        let cluster = opts.short_cluster
            && cols > SHORT_CLUSTER_MIN_COLS
            && rows <= SHORT_CLUSTER_MAX_ROWS
            && rows * SHORT_CLUSTER_CTAS as u64 <= dev.sm_count as u64;
        let (kernel, slots) = if cluster {
            (ShortKernel::Cluster, rows * SHORT_CLUSTER_CTAS as u64)
        } else {
            (ShortKernel::Wide, rows.max(1))
        };
        return (wide && sel_cap * 8 <= dev.max_smem_per_block as u64).then(|| ShortPlan {
            kernel,
            row_slots: slots as u32,
            sel_cap: sel_cap as u32,
            smem_bytes: (sel_cap * 8) as u32,
            fit,
            workspace_bytes: 0,
        });
    }
    if cols > SHORT_COLS || k > SHORT_MAX_K || rows > MAX_GRID_X {
        return None;
    }
    let warp_smem = short_warp_smem_bytes(cols, sel_cap, spec.dtype, spec.order);
    if cols <= opts.short_warp_cols && rows >= opts.short_warp_min_rows && warp_smem <= dev.max_smem_per_block as u64 {
        return Some(ShortPlan {
            kernel: ShortKernel::Warp,
            row_slots: rows.div_ceil(SHORT_WARPS as u64) as u32,
            sel_cap: sel_cap as u32,
            smem_bytes: warp_smem as u32,
            fit,
            workspace_bytes: 0,
        });
    }
    let smem = short_smem_bytes(cols, sel_cap);
    if smem + SHORT_STATIC_SMEM as u64 > dev.max_smem_per_block as u64 {
        return None;
    }
    Some(ShortPlan {
        kernel: ShortKernel::Cta,
        row_slots: rows.max(1) as u32,
        sel_cap: sel_cap as u32,
        smem_bytes: smem as u32,
        fit,
        workspace_bytes: 0,
    })
}

/// CTAs per row of the grid path and the elements of a CTA's chunk, or
/// `None` where it does not apply: one CTA per SM at most (all resident),
/// each row's share in one CTA's registers, `k` within the placement's
/// bounds; chunks of at least the dtype's [`grid_min_chunk`] unless `opts`
/// sets one.
fn grid_ctas(
    rows: u64,
    cols: u64,
    k: u64,
    dtype: crate::contract::DType,
    dev: &DeviceProps,
    opts: &PathOptions,
) -> Option<(u64, u64)> {
    let min_chunk = opts.grid_min_chunk.unwrap_or_else(|| grid_min_chunk(dtype));
    let g = (dev.sm_count as u64 / rows.max(1)).min(cols.div_ceil(min_chunk.max(1)));
    if g < 2 || k > GRID_MAX_K || k * k > opts.grid_place_max * g {
        return None;
    }
    // The kernel's chunk: ceil(cols / g) rounded up to 8 elements.
    let chunk = cols.div_ceil(g).div_ceil(8) * 8;
    (chunk <= GRID_CHUNK).then_some((g, chunk))
}

/// Elements a thread of the grid kernel holds for a chunk: the fewest of
/// [`grid_items_narrowest`], [`GRID_ITEMS_SMALL`] and [`GRID_ITEMS`] that
/// hold it (`grid8=0`: always [`GRID_ITEMS`]).
pub(crate) fn grid_items(chunk: u64, dtype: crate::contract::DType, opts: &PathOptions) -> u32 {
    let fits = |items: u32| chunk <= BLOCK as u64 * items as u64;
    if !opts.grid_small_items {
        return GRID_ITEMS;
    }
    [grid_items_narrowest(dtype), GRID_ITEMS_SMALL].into_iter().find(|&items| fits(items)).unwrap_or(GRID_ITEMS)
}

/// The grid kernel of a plan's width, as named in `kernels/select/grid.cu`.
pub fn grid_kernel_name(items: u32) -> &'static str {
    match items {
        GRID_ITEMS_TINY => "fs_grid4_f32",
        GRID_ITEMS_SMALL => "fs_grid8_*",
        _ => "fs_grid_*",
    }
}

/// Dynamic shared memory of a grid CTA for `k`: the staged list, `k +
/// GRID_SMALL` composites padded to the placement's step of 256
/// (`GRID_STEP` in `kernels/select/grid/state.cuh`).
pub fn grid_smem_bytes(k: u64) -> u32 {
    ((k + GRID_SMALL).div_ceil(256) * 256 * 8) as u32
}

fn grid_plan(rows: u64, k: u64, ctas_per_row: u64, fit: u64, items: u32) -> GridPlan {
    let mut ws = crate::cuda::workspace::Regions::new();
    let list = ws.add(rows * (k + GRID_SMALL) * 8);
    let state_bytes = rows * GRID_STATE_WORDS * 4;
    let state = ws.add(state_bytes);
    GridPlan {
        ctas_per_row: ctas_per_row as u32,
        row_slots: rows as u32,
        items,
        list_len: (k + GRID_SMALL) as u32,
        smem_bytes: grid_smem_bytes(k),
        fit,
        list,
        state,
        state_bytes,
        workspace_bytes: ws.total(),
    }
}

#[cfg(test)]
mod tests;
