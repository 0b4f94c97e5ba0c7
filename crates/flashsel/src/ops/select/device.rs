//! The select operation on the CUDA engine: parameter blocks (mirrors of the
//! structs in `kernels/select/`), the launch sequence of each plan, and the
//! host-memory conveniences.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::plan::{self, Plan};
use super::{SelectSpec, Selection};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Error, NanPolicy, Result, ScoreElem, ScoresView};
use crate::cuda::compile::Module;
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::{timing, CudaEngine, KernelId};
use crate::ops::pages::PageMap;

/// One asynchronous selection over caller-owned device buffers.
///
/// All pointers are `CUdeviceptr`s in the engine's context (torch tensors on the
/// same device qualify: torch uses the primary context).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSelect {
    pub spec: SelectSpec,
    /// Scores of `spec.dtype`, row `r` at `scores + r * row_stride * size`.
    pub scores: u64,
    /// Optional `i32` lengths, `rows` entries. Device-resident lengths cannot be
    /// checked without a host synchronisation: a row whose length is outside
    /// `0..=cols` comes out as all padding (nothing out of bounds is read).
    pub lengths: Option<u64>,
    /// `i32` output, `rows * k`.
    pub out_indices: u64,
    /// Optional values output in `spec.dtype`, `rows * k`.
    pub out_values: Option<u64>,
    /// Scratch of at least [`CudaEngine::workspace_bytes`] bytes, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// The `CUstream` to launch on (0: the legacy default stream).
    pub stream: u64,
    /// Optional `i32` range starts, `rows` entries: row `r` selects among
    /// columns `starts[r] .. lengths[r]` (the lengths are then the range
    /// ends; `cols` where absent), indices absolute. A row whose range is out
    /// of bounds comes out as all padding.
    pub starts: Option<u64>,
    /// Optional page table: the indices are written as KV-cache slots
    /// ([`crate::ops::pages`]; `-1` stays `-1`).
    pub pages: Option<DevicePages>,
}

/// A page table on the device ([`crate::ops::pages`]'s contract).
#[derive(Debug, Clone, Copy)]
pub struct DevicePages {
    /// `i32 [sequences, max_pages]` page numbers, row-major.
    pub table: u64,
    pub sequences: usize,
    pub max_pages: usize,
    pub page_size: usize,
    /// `i32 [rows]`: the sequence of each row.
    pub seq_ids: u64,
}

impl DevicePages {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.page_size == 0 || self.max_pages == 0 || self.sequences == 0 {
            return Err(Error::InvalidOption {
                what: "page table",
                value: format!("{} x {} pages of {}", self.sequences, self.max_pages, self.page_size),
                expected: "at least one sequence, one page, one token a page",
            });
        }
        let max = i32::MAX as usize;
        if self.page_size > max || self.max_pages > max || self.sequences > max {
            return Err(Error::too_large(
                "page table geometry",
                self.page_size.max(self.max_pages).max(self.sequences) as u128,
            ));
        }
        if self.table == 0 || self.seq_ids == 0 {
            return Err(Error::InvalidOption {
                what: "page table",
                value: "a null pointer".into(),
                expected: "device pointers",
            });
        }
        Ok(())
    }
}

/// `Tokens` in kernels/select/tokens.cuh: the rows' extents and the token
/// write of the `*_tok_*` kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tokens {
    pub starts: u64,
    pub positions: u64,
    pub counts: u64,
    pub page_table: u64,
    pub seq_ids: u64,
    pub ratio: i32,
    pub width: i32,
    pub page_size: i32,
    pub max_pages: i32,
    pub batch: i32,
    pub pad: i32,
}

impl Tokens {
    pub(crate) fn with_pages(mut self, pages: Option<&DevicePages>) -> Self {
        if let Some(p) = pages {
            self.page_table = p.table;
            self.seq_ids = p.seq_ids;
            self.page_size = p.page_size as i32;
            self.max_pages = p.max_pages as i32;
            self.batch = p.sequences as i32;
        }
        self
    }
}

/// One launch of the select kernels: a selection, or (with `tok`) its token
/// form (ranges, QSA blocks, slots).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    pub spec: SelectSpec,
    pub scores: u64,
    pub lengths: u64,
    pub out_idx: u64,
    pub out_val: u64,
    pub workspace: u64,
    pub stream: u64,
    pub tok: Option<Tokens>,
}

/// `ScanParams` in kernels/select/: the filter kernels (`fs_scan_*`,
/// `fs_split_*`, `fs_prep_*`). Field order and types must match.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ScanParams {
    scores: u64,
    row_stride: i64,
    lengths: u64,
    out_idx: u64,
    out_val: u64,
    /// Split rows: `rows x chunks x k` candidate slots.
    cand: u64,
    /// Split rows: candidates appended so far, per row.
    row_count: u64,
    /// Split rows: CTAs of the row that have finished.
    row_done: u64,
    /// Global buffers: `gridDim.x * gridDim.y * (cap + 1)` composites.
    gbuf: u64,
    /// Split rows: the per-row key bound from `fs_prep_*`.
    row_lb: u64,
    rows: i32,
    cols: i32,
    k: i32,
    chunks: i32,
    cap: i32,
    nan_largest: i32,
    order_index: i32,
    /// 1: the load ring (`stage_bytes`) follows the shared buffer.
    stage: i32,
    tok: Tokens,
}
// SAFETY: #[repr(C)], the layout of the kernel's ScanParams (test below; the
// kernel asserts its size).
unsafe impl KernelParams for ScanParams {}

/// `GridParams` in kernels/select/: the grid kernels (`fs_grid*`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GridParams {
    scores: u64,
    row_stride: i64,
    lengths: u64,
    out_idx: u64,
    out_val: u64,
    /// `rows x (k + GRID_SMALL)` list entries.
    list: u64,
    /// `rows x GRID_STATE_WORDS` words of state.
    state: u64,
    rows: i32,
    cols: i32,
    k: i32,
    chunks: i32,
    nan_largest: i32,
    order_index: i32,
    tok: Tokens,
}
// SAFETY: as ScanParams.
unsafe impl KernelParams for GridParams {}

/// Zeroes `words` words of cross-CTA state at `state` on `stream`
/// (`fs_grid_init_all`: it waits for the stream's previous kernel, then lets
/// a programmatic successor start, which must `PDL_WAIT` before it touches
/// the state). The grid path's and the fused decode indexer's.
///
/// # Safety
/// `state .. state + 4 * words` must lie in a live allocation of the
/// stream's context.
pub(crate) unsafe fn zero_state(
    e: &CudaEngine,
    state: u64,
    words: usize,
    stream: u64,
    programmatic: bool,
) -> Result<()> {
    let init = e.function(KernelId { module: Module::SelectGrid, global_buffer: false, entry: "fs_grid_init_all" })?;
    let block = plan::BLOCK;
    let ctas = (words as u64).div_ceil(block as u64 * 8).clamp(1, 1024) as u32;
    let l = Launch { grid: (ctas, 1), block, smem: 0, stream, programmatic, cooperative: false, cluster: 0 };
    l.run(&init, &GridInitParams { state, words: words as i64 })
}

/// `GridInitParams` in kernels/select/: `fs_grid_init_all`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GridInitParams {
    state: u64,
    words: i64,
}
// SAFETY: as ScanParams.
unsafe impl KernelParams for GridInitParams {}

/// The filter kernels: `fs_scan_*` (row path), `fs_split_*` and `fs_prep_*`
/// (split path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FilterKernel {
    Scan,
    Split,
    Prep,
}

/// The filter kernel of a kind, dtype and buffer kind; `tok`: its token form.
fn filter_kernel(kind: FilterKernel, dtype: DType, global_buffer: bool, tok: bool) -> KernelId {
    use FilterKernel::*;
    let entry = match (kind, dtype, tok) {
        (Scan, DType::F32, false) => "fs_scan_f32",
        (Scan, DType::BF16, false) => "fs_scan_bf16",
        (Scan, _, false) => "fs_scan_f16",
        (Split, DType::F32, false) => "fs_split_f32",
        (Split, DType::BF16, false) => "fs_split_bf16",
        (Split, _, false) => "fs_split_f16",
        (Prep, DType::F32, false) => "fs_prep_f32",
        (Prep, DType::BF16, false) => "fs_prep_bf16",
        (Prep, _, false) => "fs_prep_f16",
        (Scan, DType::F32, true) => "fs_scan_tok_f32",
        (Scan, DType::BF16, true) => "fs_scan_tok_bf16",
        (Scan, _, true) => "fs_scan_tok_f16",
        (Split, DType::F32, true) => "fs_split_tok_f32",
        (Split, DType::BF16, true) => "fs_split_tok_bf16",
        (Split, _, true) => "fs_split_tok_f16",
        (Prep, DType::F32, true) => "fs_prep_tok_f32",
        (Prep, DType::BF16, true) => "fs_prep_tok_bf16",
        (Prep, _, true) => "fs_prep_tok_f16",
    };
    let module = if tok { Module::SelectFilterTokens } else { Module::SelectFilter };
    KernelId { module, global_buffer, entry }
}

/// The short-row kernel of a dtype; `tok`: its token form; `kernel`: the
/// CTA, warp or wide kernel, or the wide kernel's cluster form.
fn short_kernel(dtype: DType, tok: bool, kernel: plan::ShortKernel) -> KernelId {
    use plan::ShortKernel::{Cluster, Cta, Warp, Wide};
    let entry = match (dtype, tok, kernel) {
        (DType::F32, false, Cta) => "fs_short_f32",
        (DType::BF16, false, Cta) => "fs_short_bf16",
        (_, false, Cta) => "fs_short_f16",
        (DType::F32, true, Cta) => "fs_short_tok_f32",
        (DType::BF16, true, Cta) => "fs_short_tok_bf16",
        (_, true, Cta) => "fs_short_tok_f16",
        (DType::F32, false, Warp) => "fs_short_warp_f32",
        (DType::BF16, false, Warp) => "fs_short_warp_bf16",
        (_, false, Warp) => "fs_short_warp_f16",
        (DType::F32, true, Warp) => "fs_short_warp_tok_f32",
        (DType::BF16, true, Warp) => "fs_short_warp_tok_bf16",
        (_, true, Warp) => "fs_short_warp_tok_f16",
        (DType::F32, false, Wide) => "fs_short_wide_f32",
        (DType::BF16, false, Wide) => "fs_short_wide_bf16",
        (_, false, Wide) => "fs_short_wide_f16",
        (DType::F32, true, Wide) => "fs_short_wide_tok_f32",
        (DType::BF16, true, Wide) => "fs_short_wide_tok_bf16",
        (_, true, Wide) => "fs_short_wide_tok_f16",
        (DType::F32, false, Cluster) => "fs_short_cluster_f32",
        (DType::BF16, false, Cluster) => "fs_short_cluster_bf16",
        (_, false, Cluster) => "fs_short_cluster_f16",
        (DType::F32, true, Cluster) => "fs_short_cluster_tok_f32",
        (DType::BF16, true, Cluster) => "fs_short_cluster_tok_bf16",
        (_, true, Cluster) => "fs_short_cluster_tok_f16",
    };
    KernelId { module: Module::SelectShort, global_buffer: false, entry }
}

/// The grid kernel of a width (`plan::grid_kernel_name`) and dtype; `tok`:
/// its token form.
fn grid_kernel(items: u32, dtype: DType, tok: bool) -> KernelId {
    let entry = match (items, dtype, tok) {
        (plan::GRID_ITEMS_TINY, _, false) => "fs_grid4_f32",
        (plan::GRID_ITEMS_SMALL, DType::F32, false) => "fs_grid8_f32",
        (plan::GRID_ITEMS_SMALL, DType::BF16, false) => "fs_grid8_bf16",
        (plan::GRID_ITEMS_SMALL, _, false) => "fs_grid8_f16",
        (_, DType::F32, false) => "fs_grid_f32",
        (_, DType::BF16, false) => "fs_grid_bf16",
        (_, _, false) => "fs_grid_f16",
        (plan::GRID_ITEMS_TINY, _, true) => "fs_grid4_tok_f32",
        (plan::GRID_ITEMS_SMALL, DType::F32, true) => "fs_grid8_tok_f32",
        (plan::GRID_ITEMS_SMALL, DType::BF16, true) => "fs_grid8_tok_bf16",
        (plan::GRID_ITEMS_SMALL, _, true) => "fs_grid8_tok_f16",
        (_, DType::F32, true) => "fs_grid_tok_f32",
        (_, DType::BF16, true) => "fs_grid_tok_bf16",
        (_, _, true) => "fs_grid_tok_f16",
    };
    let module = if tok { Module::SelectGridTokens } else { Module::SelectGrid };
    KernelId { module, global_buffer: false, entry }
}

impl CudaEngine {
    /// The plan for a selection on this device ([`plan::plan`] with this
    /// device's properties).
    pub fn plan(&self, spec: &SelectSpec, has_lengths: bool) -> Result<Plan> {
        let opts = plan::PathOptions {
            short: self.short_rows(),
            short_warp_cols: self.short_warp().0,
            short_warp_min_rows: self.short_warp().1,
            short_wide_cols: self.short_wide(),
            short_cluster: self.short_cluster(),
            ..plan::PathOptions::default()
        };
        plan::plan_with(spec, has_lengths, &self.props(), &opts)
    }

    /// Workspace a [`DeviceSelect`] with this spec needs, bytes.
    pub fn workspace_bytes(&self, spec: &SelectSpec, has_lengths: bool) -> Result<usize> {
        Ok(self.plan(spec, has_lengths)?.workspace_bytes() as usize)
    }

    /// Launches the selection on `args.stream`; returns without waiting.
    ///
    /// On sm_90 and later the launches are programmatic (PDL): the first
    /// kernel waits for the stream's previous kernel before it reads
    /// anything, and the last lets the stream's next kernel launch early. A
    /// kernel launched programmatically after this call must wait
    /// (`griddepcontrol.wait`) before it reads the outputs; one launched
    /// plainly needs nothing.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, and `args.stream` a stream of that context.
    pub unsafe fn select_device(&self, args: &DeviceSelect) -> Result<()> {
        let spec = &args.spec;
        spec.validate()?;
        if let Some(p) = &args.pages {
            p.validate()?;
        }
        if args.starts == Some(0) {
            return Err(Error::InvalidOption {
                what: "starts",
                value: "a null pointer".into(),
                expected: "a device pointer",
            });
        }
        let tok = (args.starts.is_some() || args.pages.is_some()).then(|| {
            Tokens { starts: args.starts.unwrap_or(0), ratio: 1, width: spec.k as i32, ..Tokens::default() }
                .with_pages(args.pages.as_ref())
        });
        let job = Job {
            spec: *spec,
            scores: args.scores,
            lengths: args.lengths.unwrap_or(0),
            out_idx: args.out_indices,
            out_val: args.out_values.unwrap_or(0),
            workspace: args.workspace,
            stream: args.stream,
            tok,
        };
        self.run_job(&job, args.workspace_bytes)
    }

    /// Plans and launches a job after checking its workspace.
    ///
    /// # Safety
    /// As [`CudaEngine::select_device`].
    pub(crate) unsafe fn run_job(&self, job: &Job, workspace_bytes: usize) -> Result<()> {
        let plan = self.plan(&job.spec, job.lengths != 0 || job.tok.is_some())?;
        if (workspace_bytes as u64) < plan.workspace_bytes() {
            return Err(Error::BufferSize {
                what: "workspace (bytes)",
                got: workspace_bytes,
                need: plan.workspace_bytes() as usize,
            });
        }
        if plan.workspace_bytes() > 0
            && (job.workspace == 0 || !job.workspace.is_multiple_of(crate::cuda::workspace::ALIGN))
        {
            return Err(Error::InvalidOption {
                what: "workspace pointer",
                value: format!("{:#x}", job.workspace),
                expected: "a 256-byte aligned device pointer",
            });
        }
        if job.spec.rows == 0 {
            return Ok(());
        }
        self.context().bind_to_thread().map_err(cuda_err)?;
        run_plan(self, &plan, job)
    }

    /// Selects from host data: uploads, runs on the engine's stream, downloads.
    /// The outputs are poisoned before the run, so an unwritten element shows.
    pub fn select_host<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
    ) -> Result<Selection<T>> {
        DeviceData::upload(self, scores, spec, lengths)?.run(self, spec)
    }

    /// [`crate::cpu::select_ranges`] (or, with `pages`,
    /// [`crate::cpu::select_ranges_paged`]) on this device from host data:
    /// the CPU's checks, then the token kernels; outputs poisoned before the
    /// run. `starts` `None`: every row from column 0 (for a page-mapped
    /// selection without ranges).
    pub fn select_ranges_host<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        starts: Option<&[i32]>,
        ends: Option<&[i32]>,
        pages: Option<&PageMap<'_>>,
    ) -> Result<Selection<T>> {
        DeviceData::upload_ranges(self, scores, spec, starts, ends, pages)?.run(self, spec)
    }

    /// [`CudaEngine::time_select`] of [`CudaEngine::select_ranges_host`].
    pub fn time_select_ranges<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        starts: Option<&[i32]>,
        ends: Option<&[i32]>,
        pages: Option<&PageMap<'_>>,
        iters: usize,
    ) -> Result<(Selection<T>, Vec<f64>)> {
        DeviceData::upload_ranges(self, scores, spec, starts, ends, pages)?.time(self, spec, iters)
    }

    /// Uploads once, then times `iters` runs on the device. Runs shorter than
    /// ~50 us are timed as CUDA-graph replays of 20 launches (divided by 20),
    /// longer ones with events around each launch.
    pub fn time_select<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
        iters: usize,
    ) -> Result<(Selection<T>, Vec<f64>)> {
        DeviceData::upload(self, scores, spec, lengths)?.time(self, spec, iters)
    }
}

/// Columns the filter finish's index-order bitmap covers
/// (kernels/select/filter/index_order.cuh: `32 * INDEX_BITMAP_WORDS`).
pub(crate) const INDEX_BITMAP_COLS: usize = 65_536;

/// The kernels' order word: 0 score order, 1 index order, 3 index order of
/// rows wider than [`INDEX_BITMAP_COLS`], whose filter finish takes its two
/// bucket ranks without trying the bitmap (kernels/select/filter/
/// index_order.cuh, `ORDER_*`; the bitmap's cost grows with the range:
/// docs/perf-log.md v49). The other kernels read it as a bool.
fn order_word(order: super::OutputOrder, cols: usize) -> i32 {
    // The kernel's ORDER_SCORE, ORDER_INDEX, ORDER_INDEX_WIDE.
    const SCORE: i32 = 0;
    const INDEX: i32 = 1;
    const INDEX_WIDE: i32 = 3;
    match order {
        super::OutputOrder::Score => SCORE,
        super::OutputOrder::Index if cols <= INDEX_BITMAP_COLS => INDEX,
        super::OutputOrder::Index => INDEX_WIDE,
    }
}

/// Launches `plan`: for grid rows the state-zeroing kernel, then the
/// cooperative grid kernel; for split rows the prep kernel (counters,
/// row-wide sample), then the split filter (whose last CTA per row merges
/// the row); for the row path the filter alone. With PDL (sm_90+) a call's
/// first kernel is launched programmatically and waits for the stream's
/// previous kernel before it touches anything, and the second of a pair
/// overlaps the first's tail.
///
/// # Safety
/// As [`CudaEngine::select_device`].
unsafe fn run_plan(e: &CudaEngine, plan: &Plan, a: &Job) -> Result<()> {
    let spec = &a.spec;
    let tok = a.tok.unwrap_or_default();
    let is_tok = a.tok.is_some();
    let ws = a.workspace;
    let pdl = e.pdl();
    let nan_largest = (spec.nan == NanPolicy::Largest) as i32;
    let order_index = order_word(spec.order, spec.cols);
    let at = |o: u64| ws + o;
    let on = |grid: (u32, u32), smem: u32, programmatic: bool, cooperative: bool| Launch {
        grid,
        block: plan.block(),
        smem,
        stream: a.stream,
        programmatic,
        cooperative,
        cluster: 0,
    };
    if let Plan::Grid(g) = plan {
        let gp = GridParams {
            scores: a.scores,
            row_stride: spec.row_stride as i64,
            lengths: a.lengths,
            out_idx: a.out_idx,
            out_val: a.out_val,
            list: at(g.list),
            state: at(g.state),
            rows: spec.rows as i32,
            cols: spec.cols as i32,
            k: spec.k as i32,
            chunks: g.ctas_per_row as i32,
            nan_largest,
            order_index,
            tok,
        };
        // Zero every row's barrier counters and histograms, then the
        // cooperative selection (which may start early with PDL and waits
        // for the zeroes before its first global write).
        zero_state(e, at(g.state), (g.state_bytes / 4) as usize, a.stream, pdl)?;
        let kern = e.function(grid_kernel(g.items, spec.dtype, is_tok))?;
        return on((g.ctas_per_row, g.row_slots), g.smem_bytes, pdl, true).run(&kern, &gp);
    }
    if let Plan::Short(s) = plan {
        // One CTA (or warp) per row (the filter's parameter block: `cap` is
        // the selection's scratch; no workspace).
        let sp = ScanParams {
            scores: a.scores,
            row_stride: spec.row_stride as i64,
            lengths: a.lengths,
            out_idx: a.out_idx,
            out_val: a.out_val,
            cand: 0,
            row_count: 0,
            row_done: 0,
            gbuf: 0,
            row_lb: 0,
            rows: spec.rows as i32,
            cols: spec.cols as i32,
            k: spec.k as i32,
            chunks: 1,
            cap: s.sel_cap as i32,
            nan_largest,
            order_index,
            stage: 0,
            tok,
        };
        let kern = e.function(short_kernel(spec.dtype, is_tok, s.kernel))?;
        let mut l = on((s.row_slots, 1), s.smem_bytes, pdl, false);
        if s.kernel == plan::ShortKernel::Cluster {
            l.cluster = plan::SHORT_CLUSTER_CTAS;
        }
        return l.run(&kern, &sp);
    }
    let f = plan.filter().expect("a row or split plan");
    let split = plan.split();
    let global = f.buffer == plan::Buffer::Global;
    let sp = ScanParams {
        scores: a.scores,
        row_stride: spec.row_stride as i64,
        lengths: a.lengths,
        out_idx: a.out_idx,
        out_val: a.out_val,
        cand: split.map_or(0, |s| at(s.cand)),
        row_count: split.map_or(0, |s| at(s.row_count)),
        row_done: split.map_or(0, |s| at(s.row_done)),
        gbuf: f.gbuf.map_or(0, at),
        row_lb: split.map_or(0, |s| at(s.row_lb)),
        rows: spec.rows as i32,
        cols: spec.cols as i32,
        k: spec.k as i32,
        chunks: f.ctas_per_row as i32,
        cap: f.cap as i32,
        nan_largest,
        order_index,
        stage: (f.stage_bytes > 0) as i32,
        tok,
    };
    let kind = if split.is_some() {
        // The prep kernel's sample lives in registers: no dynamic shared
        // memory. (Its registers still keep a split CTA off its SM: sharing
        // SMs measured no faster.)
        let prep = e.function(filter_kernel(FilterKernel::Prep, spec.dtype, global, is_tok))?;
        on((1, f.row_slots), 0, pdl, false).run(&prep, &sp)?;
        FilterKernel::Split
    } else {
        FilterKernel::Scan
    };
    let scan = e.function(filter_kernel(kind, spec.dtype, global, is_tok))?;
    on((f.ctas_per_row, f.row_slots), f.smem_bytes, pdl, false).run(&scan, &sp)
}

/// Rows of `scores` laid out `row_stride` elements apart in `elements`
/// elements of plain bits: the host image of a device score buffer.
pub(crate) fn pack_rows<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    rows: usize,
    row_stride: usize,
    elements: usize,
) -> Result<Vec<u8>> {
    let elem = std::mem::size_of::<T>();
    let mut host = crate::contract::try_vec("the score upload", elements * elem, 0u8)?;
    for r in 0..rows {
        let row = scores.row(r);
        // SAFETY: f32 / bf16 / f16 are plain bits.
        let bytes = unsafe { std::slice::from_raw_parts(row.as_ptr() as *const u8, std::mem::size_of_val(row)) };
        let at = r * row_stride * elem;
        host[at..at + bytes.len()].copy_from_slice(bytes);
    }
    Ok(host)
}

/// A device copy of a host page table.
pub(crate) struct PagesCopy {
    table: CudaSlice<i32>,
    seq_ids: CudaSlice<i32>,
    sequences: usize,
    max_pages: usize,
    page_size: usize,
}

impl PagesCopy {
    pub(crate) fn upload(e: &CudaEngine, p: &PageMap<'_>) -> Result<Self> {
        let s = e.stream();
        Ok(Self {
            table: s.clone_htod(p.table()).map_err(cuda_err)?,
            seq_ids: s.clone_htod(p.seq_ids()).map_err(cuda_err)?,
            sequences: p.sequences(),
            max_pages: p.max_pages(),
            page_size: p.page_size(),
        })
    }

    pub(crate) fn pages(&self, e: &CudaEngine) -> DevicePages {
        let st = e.stream();
        DevicePages {
            table: self.table.device_ptr(st).0,
            sequences: self.sequences,
            max_pages: self.max_pages,
            page_size: self.page_size,
            seq_ids: self.seq_ids.device_ptr(st).0,
        }
    }
}

/// Device copies of one host problem.
struct DeviceData {
    scores: CudaSlice<u8>,
    lengths: Option<CudaSlice<i32>>,
    starts: Option<CudaSlice<i32>>,
    pages: Option<PagesCopy>,
    out_idx: CudaSlice<i32>,
    out_val: CudaSlice<u8>,
    workspace: CudaSlice<u8>,
    workspace_bytes: usize,
}

impl DeviceData {
    fn upload<T: ScoreElem>(
        e: &CudaEngine,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
    ) -> Result<Self> {
        spec.validate_host(scores, lengths)?;
        Self::upload_checked(e, scores, spec, lengths)
    }

    /// [`DeviceData::upload`] of a request already checked.
    fn upload_checked<T: ScoreElem>(
        e: &CudaEngine,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
    ) -> Result<Self> {
        let s = e.stream();
        let elem = std::mem::size_of::<T>();
        let host = pack_rows(scores, spec.rows, spec.row_stride, spec.elements_needed())?;
        let dscores = s.clone_htod(&host[..]).map_err(cuda_err)?;
        let dlen = match lengths {
            Some(l) => Some(s.clone_htod(l).map_err(cuda_err)?),
            None => None,
        };
        let outn = (spec.rows * spec.k).max(1);
        let wb = e.workspace_bytes(spec, lengths.is_some())?;
        Ok(Self {
            scores: dscores,
            lengths: dlen,
            starts: None,
            pages: None,
            out_idx: s.alloc_zeros(outn).map_err(cuda_err)?,
            out_val: s.alloc_zeros(outn * elem).map_err(cuda_err)?,
            workspace: s.alloc_zeros(wb.max(256)).map_err(cuda_err)?,
            workspace_bytes: wb,
        })
    }

    /// [`DeviceData::upload`] with range starts and a page table, after
    /// the CPU's checks of both.
    fn upload_ranges<T: ScoreElem>(
        e: &CudaEngine,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        starts: Option<&[i32]>,
        ends: Option<&[i32]>,
        pages: Option<&PageMap<'_>>,
    ) -> Result<Self> {
        spec.validate_host(scores, ends)?;
        if let Some(st) = starts {
            spec.validate_starts(st, ends)?;
        }
        if let Some(p) = pages {
            p.check_ranges(spec, starts, ends)?;
        }
        let mut d = Self::upload_checked(e, scores, spec, ends)?;
        let s = e.stream();
        if let Some(st) = starts {
            d.starts = Some(s.clone_htod(st).map_err(cuda_err)?);
        }
        if let Some(p) = pages {
            d.pages = Some(PagesCopy::upload(e, p)?);
        }
        Ok(d)
    }

    /// Poisons the outputs and the workspace, runs once, downloads.
    fn run<T: ScoreElem>(&self, e: &CudaEngine, spec: &SelectSpec) -> Result<Selection<T>> {
        self.poison(e)?;
        // SAFETY: every buffer was allocated by the upload with the sizes the spec needs.
        unsafe { e.select_device(&self.args(e, spec))? };
        self.download(e, spec)
    }

    /// Poisons, runs once, times `iters` runs ([`timing::time_on_stream`]),
    /// then downloads the last timed run's output (every run writes the
    /// same buffers).
    fn time<T: ScoreElem>(&self, e: &CudaEngine, spec: &SelectSpec, iters: usize) -> Result<(Selection<T>, Vec<f64>)> {
        self.poison(e)?;
        let args = self.args(e, spec);
        // SAFETY: buffers sized for the spec by the upload.
        let run = || unsafe { e.select_device(&args) };
        run()?;
        let times = timing::time_on_stream(e.stream(), iters, run)?;
        Ok((self.download(e, spec)?, times))
    }

    fn poison(&self, e: &CudaEngine) -> Result<()> {
        let st = e.stream();
        let s = st.cu_stream();
        let (pi, _) = self.out_idx.device_ptr(st);
        let (pv, _) = self.out_val.device_ptr(st);
        let (pw, _) = self.workspace.device_ptr(st);
        // SAFETY: sizes are the allocations' own.
        unsafe {
            launch::poison(pi, 0x5a, self.out_idx.len() * 4, s)?;
            launch::poison(pv, 0x7f, self.out_val.len(), s)?;
            launch::poison(pw, 0xa5, self.workspace.len(), s)?;
        }
        Ok(())
    }

    fn args(&self, e: &CudaEngine, spec: &SelectSpec) -> DeviceSelect {
        let st = e.stream();
        DeviceSelect {
            spec: *spec,
            scores: self.scores.device_ptr(st).0,
            lengths: self.lengths.as_ref().map(|l| l.device_ptr(st).0),
            out_indices: self.out_idx.device_ptr(st).0,
            out_values: Some(self.out_val.device_ptr(st).0),
            workspace: self.workspace.device_ptr(st).0,
            workspace_bytes: self.workspace_bytes,
            stream: st.cu_stream() as u64,
            starts: self.starts.as_ref().map(|v| v.device_ptr(st).0),
            pages: self.pages.as_ref().map(|p| p.pages(e)),
        }
    }

    fn download<T: ScoreElem>(&self, e: &CudaEngine, spec: &SelectSpec) -> Result<Selection<T>> {
        let s = e.stream();
        let n = spec.rows * spec.k;
        let mut idx = s.clone_dtoh(&self.out_idx).map_err(cuda_err)?;
        let val = s.clone_dtoh(&self.out_val).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        idx.truncate(n);
        Ok(Selection { rows: spec.rows, k: spec.k, indices: idx, values: crate::cuda::host::elems_of(&val, n) })
    }
}

#[cfg(test)]
mod tests {
    use super::{
        filter_kernel, grid_kernel, order_word, short_kernel, FilterKernel, GridInitParams, GridParams, ScanParams,
        Tokens, INDEX_BITMAP_COLS,
    };
    use crate::contract::DType;
    use crate::cuda::compile::Module;
    use crate::ops::select::OutputOrder;

    /// The kernel sources assert the same sizes (static_assert, checked
    /// whenever NVRTC compiles them), and the fields are laid out as there.
    #[test]
    fn parameter_blocks_match_the_kernels() {
        assert_eq!(std::mem::size_of::<ScanParams>(), 176);
        assert_eq!(std::mem::offset_of!(ScanParams, row_lb), 72);
        assert_eq!(std::mem::offset_of!(ScanParams, rows), 80);
        assert_eq!(std::mem::offset_of!(ScanParams, stage), 108);
        assert_eq!(std::mem::offset_of!(ScanParams, tok), 112);
        assert_eq!(std::mem::size_of::<GridParams>(), 144);
        assert_eq!(std::mem::offset_of!(GridParams, state), 48);
        assert_eq!(std::mem::offset_of!(GridParams, rows), 56);
        assert_eq!(std::mem::offset_of!(GridParams, order_index), 76);
        assert_eq!(std::mem::offset_of!(GridParams, tok), 80);
        assert_eq!(std::mem::size_of::<Tokens>(), 64);
        assert_eq!(std::mem::offset_of!(Tokens, ratio), 40);
        assert_eq!(std::mem::offset_of!(Tokens, batch), 56);
        assert_eq!(std::mem::size_of::<GridInitParams>(), 16);
    }

    /// Index order tries the finish's bitmap only on rows it covers (QSA
    /// prefill's 65,536 blocks do; DSA's 131,072 columns and decode's 262,144
    /// blocks do not); the kernel asserts the same width.
    #[test]
    fn the_order_word() {
        assert_eq!(INDEX_BITMAP_COLS, 65_536);
        for cols in [1, 2048, 65_536, 65_537, 131_072, 262_144] {
            assert_eq!(order_word(OutputOrder::Score, cols), 0);
        }
        for (cols, word) in [(1, 1), (2048, 1), (65_536, 1), (65_537, 3), (131_072, 3), (262_144, 3)] {
            assert_eq!(order_word(OutputOrder::Index, cols), word, "{cols}");
        }
    }

    /// Every kernel a plan can name is an entry point of its module.
    #[test]
    fn every_planned_kernel_exists() {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (kind, name) in
                [(FilterKernel::Scan, "scan"), (FilterKernel::Split, "split"), (FilterKernel::Prep, "prep")]
            {
                for global in [false, true] {
                    for (tok, infix) in [(false, ""), (true, "tok_")] {
                        let id = filter_kernel(kind, dtype, global, tok);
                        assert!(id.module.entry_points().contains(&id.entry), "{name} {dtype}: {}", id.entry);
                        assert_eq!(
                            (id.entry.to_string(), id.global_buffer),
                            (format!("fs_{name}_{infix}{dtype}"), global)
                        );
                    }
                }
            }
            let widths: &[u32] = if dtype == DType::F32 { &[4, 8, 16] } else { &[8, 16] };
            for &items in widths {
                for tok in [false, true] {
                    let id = grid_kernel(items, dtype, tok);
                    assert!(id.module.entry_points().contains(&id.entry), "{items} {dtype}: {}", id.entry);
                    assert_eq!(id.entry.contains("_tok_"), tok);
                }
            }
        }
        assert!(Module::SelectGrid.entry_points().contains(&"fs_grid_init_all"));
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (tok, infix) in [(false, ""), (true, "tok_")] {
                use crate::ops::select::plan::ShortKernel::{Cta, Warp, Wide};
                for (kernel, winfix) in [(Cta, ""), (Warp, "warp_"), (Wide, "wide_")] {
                    let id = short_kernel(dtype, tok, kernel);
                    assert!(id.module.entry_points().contains(&id.entry), "{dtype}: {}", id.entry);
                    assert_eq!(id.entry, format!("fs_short_{winfix}{infix}{dtype}"));
                }
            }
        }
    }
}
