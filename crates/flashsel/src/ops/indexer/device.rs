//! `qsa_scores` and `qsa_indexer` on the CUDA engine.
//!
//! - The scores: kernels/indexer/qsa/score.cuh, on tensor cores in the
//!   device order of docs/semantics.md ("The CUDA engine"): a score's bits
//!   depend on its row and block only (any batch, group or path), within
//!   [`super::device_error_bound`] of the exact value, not the CPU's bits.
//!   A CTA takes a group of [`score_group_rows`] rows that share their key
//!   loads; batches with many rows a sequence (prefill) take the staged
//!   form (kernels/indexer/qsa/staged.cuh, [`score_form`]): four groups a
//!   CTA with the keys staged through shared memory, the same bits.
//! - The indexer: the scores of a group of rows into the workspace, then
//!   [`CudaEngine::qsa_select_device`]'s kernels over them, group after
//!   group on the caller's stream (no host synchronisation: graph-capturable).
//!   The scorer skips every row with `V <= k_blocks` (the selection copies
//!   those rows and reads no score) and every block past a row's `V`, so the
//!   work follows each row's `V`. Its bytes are those of `qsa_select` over
//!   `qsa_scores` on the same device, because both halves are exact per row.
//!
//! - The fused decode kernel (kernels/indexer/qsa/decode.cuh) for batches
//!   of at most [`DECODE_MAX_ROWS`] rows whose scores fit the GPU's shared
//!   memory ([`decode_plan`]): each row's scores stay on chip, selected
//!   exactly across the row's CTAs (a cooperative launch); nothing of
//!   `[T, NB]` is written. Its bytes are the grouped path's: both are
//!   `qsa_select(qsa_scores(..))` exactly ([`IndexerPath`]).
//!
//! # Workspace bound (the device form)
//! Rows go in groups of `G = max(1, 256 MiB / (4 * NB))` (the device cannot
//! see the positions before the launch, so a group is sized by `NB`, not by
//! its rows' `V`): the score scratch is at most `max(256 MiB, 4 * NB)` bytes
//! (a decode step at 1M tokens and ratio 4: 1 MiB a row), beside the
//! selection's own workspace for `G` rows
//! ([`CudaEngine::qsa_indexer_workspace_bytes`]). The fused decode kernel
//! needs only its per-row state: [`DECODE_STATE_BYTES`] a row, plus `8 *
//! k_blocks` bytes a row in score order.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::{check_request, BlockKeys, KeyElem, QsaIndexerSpec, QsaScoresSpec, QueryElem, INDEXER_SCRATCH_BYTES};
use crate::contract::error::cuda_err;
use crate::contract::NanPolicy;
use crate::contract::{DType, Error, Result};
use crate::cuda::compile::Module;
use crate::cuda::host::bytes_of;
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::workspace::{Regions, ALIGN};
use crate::cuda::{timing, CudaEngine, KernelId};
use crate::ops::pages::PageMap;
use crate::ops::qsa::device::DeviceQsaSelect;
use crate::ops::qsa::{check_positions, QsaSelection};
use crate::ops::select::device::{DevicePages, PagesCopy, Tokens};
use crate::ops::select::plan::DeviceProps;
use crate::ops::select::OutputOrder;

/// Threads per CTA of the score kernels (`qsa::SCORE_THREADS`).
pub const SCORE_THREADS: usize = 256;

/// Every score kernel: query dtype, key dtype, head width (the order of
/// [`score_entry`]).
pub(crate) const SCORE_ENTRIES: [&str; 18] = [
    "qsa_scores_qf32_kf32_d64",
    "qsa_scores_qf32_kf32_d128",
    "qsa_scores_qf32_kf32_d256",
    "qsa_scores_qf32_kbf16_d64",
    "qsa_scores_qf32_kbf16_d128",
    "qsa_scores_qf32_kbf16_d256",
    "qsa_scores_qf32_ke4m3_d64",
    "qsa_scores_qf32_ke4m3_d128",
    "qsa_scores_qf32_ke4m3_d256",
    "qsa_scores_qbf16_kf32_d64",
    "qsa_scores_qbf16_kf32_d128",
    "qsa_scores_qbf16_kf32_d256",
    "qsa_scores_qbf16_kbf16_d64",
    "qsa_scores_qbf16_kbf16_d128",
    "qsa_scores_qbf16_kbf16_d256",
    "qsa_scores_qbf16_ke4m3_d64",
    "qsa_scores_qbf16_ke4m3_d128",
    "qsa_scores_qbf16_ke4m3_d256",
];

/// Every staged score kernel (kernels/indexer/qsa/staged.cuh), in
/// [`SCORE_ENTRIES`]' order, for the widths whose stages fit
/// ([`staged_geometry`]).
pub(crate) const STAGED_ENTRIES: [&str; 40] = [
    "qsa_staged_qf32_kbf16_d64_h1",
    "qsa_staged_qf32_kbf16_d64_h2",
    "qsa_staged_qf32_kbf16_d64_h4",
    "qsa_staged_qf32_kbf16_d64_h8",
    "qsa_staged_qf32_kbf16_d64_h16",
    "qsa_staged_qf32_kbf16_d128_h1",
    "qsa_staged_qf32_kbf16_d128_h2",
    "qsa_staged_qf32_kbf16_d128_h4",
    "qsa_staged_qf32_kbf16_d128_h8",
    "qsa_staged_qf32_kbf16_d128_h16",
    "qsa_staged_qf32_ke4m3_d64_h1",
    "qsa_staged_qf32_ke4m3_d64_h2",
    "qsa_staged_qf32_ke4m3_d64_h4",
    "qsa_staged_qf32_ke4m3_d64_h8",
    "qsa_staged_qf32_ke4m3_d64_h16",
    "qsa_staged_qf32_ke4m3_d128_h1",
    "qsa_staged_qf32_ke4m3_d128_h2",
    "qsa_staged_qf32_ke4m3_d128_h4",
    "qsa_staged_qf32_ke4m3_d128_h8",
    "qsa_staged_qf32_ke4m3_d128_h16",
    "qsa_staged_qbf16_kbf16_d64_h1",
    "qsa_staged_qbf16_kbf16_d64_h2",
    "qsa_staged_qbf16_kbf16_d64_h4",
    "qsa_staged_qbf16_kbf16_d64_h8",
    "qsa_staged_qbf16_kbf16_d64_h16",
    "qsa_staged_qbf16_kbf16_d128_h1",
    "qsa_staged_qbf16_kbf16_d128_h2",
    "qsa_staged_qbf16_kbf16_d128_h4",
    "qsa_staged_qbf16_kbf16_d128_h8",
    "qsa_staged_qbf16_kbf16_d128_h16",
    "qsa_staged_qbf16_ke4m3_d64_h1",
    "qsa_staged_qbf16_ke4m3_d64_h2",
    "qsa_staged_qbf16_ke4m3_d64_h4",
    "qsa_staged_qbf16_ke4m3_d64_h8",
    "qsa_staged_qbf16_ke4m3_d64_h16",
    "qsa_staged_qbf16_ke4m3_d128_h1",
    "qsa_staged_qbf16_ke4m3_d128_h2",
    "qsa_staged_qbf16_ke4m3_d128_h4",
    "qsa_staged_qbf16_ke4m3_d128_h8",
    "qsa_staged_qbf16_ke4m3_d128_h16",
];

/// Row groups of a staged CTA (`qsa::STAGED_CG`).
const STAGED_CG: usize = 4;
/// Blocks a stage (`qsa::STAGED_TILE`).
const STAGED_TILE: usize = 64;
/// The staged form's shared-memory budget a CTA (`qsa::STAGED_SMEM_BUDGET`).
const STAGED_SMEM_BUDGET: usize = 98_304;

/// The staged form's geometry for a query dtype, key dtype and head width
/// (`qsa::Staged`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedGeometry {
    /// Column tiles of 8 (row, head) columns a row group.
    pub nt: usize,
    /// Shared-memory stages of [`STAGED_TILE`] blocks' keys.
    pub stages: usize,
    /// Dynamic shared memory a CTA, bytes.
    pub smem: usize,
}

/// The staged form's geometry, `None` for f32 keys (their three terms
/// spill its registers on sm_80-89) and where its stages do not fit the
/// budget (d 256); then [`score_form`] takes the plain form.
pub fn staged_geometry(q: DType, k: DType, dim: usize) -> Option<StagedGeometry> {
    let key_bytes = match k {
        DType::BF16 => 2,
        DType::F8E4M3 => 1,
        _ => return None,
    };
    let nt = if q == DType::BF16 { 4 } else { 2 };
    // bf16 rows are padded by 16 bytes (an ldmatrix's 8 rows in distinct
    // bank groups), e4m3 rows by 32.
    let stride = dim * key_bytes + [0, 32, 16][key_bytes];
    let fixed = STAGED_CG * query_frag_bytes(q, dim, nt) + stride;
    let stages = (STAGED_SMEM_BUDGET.checked_sub(fixed)? / (STAGED_TILE * stride)).min(4);
    (stages >= 2).then_some(StagedGeometry { nt, stages, smem: fixed + stages * STAGED_TILE * stride })
}

/// Which score kernel a request takes (both write the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreForm {
    /// kernels/indexer/qsa/score.cuh: row groups of [`score_group_rows`]
    /// rows, keys from global memory.
    Plain,
    /// kernels/indexer/qsa/staged.cuh: super-groups of 4 row groups, keys
    /// staged through shared memory.
    Staged(StagedGeometry),
}

/// Rows of a staged CTA's super-group (`STAGED_CG` row groups of `nt`
/// tiles).
fn staged_rows(heads: usize, nt: usize) -> usize {
    STAGED_CG * group_rows(heads, nt)
}

/// The staged geometry where it fits the device's shared memory a CTA.
pub fn staged_geometry_on(q: DType, k: DType, dim: usize, dev: &DeviceProps) -> Option<StagedGeometry> {
    staged_geometry(q, k, dim).filter(|g| g.smem <= dev.max_smem_per_block as usize)
}

/// The score kernel of `spec` over keys of `sequences` sequences (1 for
/// contiguous keys): the staged form where it fits the device and the rows
/// average a super-group or more a sequence (prefill: its passes a
/// super-group follow the sequences there, so rows of distinct sequences
/// take the plain form).
pub fn score_form(spec: &QsaScoresSpec, q: DType, k: DType, sequences: usize, dev: &DeviceProps) -> ScoreForm {
    match staged_geometry_on(q, k, spec.dim, dev) {
        Some(g) if spec.rows >= staged_rows(spec.heads, g.nt) * sequences.max(1) => ScoreForm::Staged(g),
        _ => ScoreForm::Plain,
    }
}

/// The kernel of a query dtype, key dtype and head width (checked before).
fn score_entry(q: DType, k: DType, dim: usize) -> &'static str {
    SCORE_ENTRIES[entry_index(q, k, dim)]
}

/// The index of a query dtype, key dtype and head width in
/// [`SCORE_ENTRIES`] and [`DECODE_ENTRIES`].
fn entry_index(q: DType, k: DType, dim: usize) -> usize {
    let qi = usize::from(q == DType::BF16);
    let ki = match k {
        DType::F32 => 0,
        DType::BF16 => 1,
        _ => 2,
    };
    let di = match dim {
        64 => 0,
        128 => 1,
        _ => 2,
    };
    qi * 9 + ki * 3 + di
}

/// The staged kernel of a query dtype, key dtype, head width (one with a
/// [`staged_geometry`]: bf16 or e4m3 keys, d 64 or 128) and head count (an
/// entry for each padded count), by its index in [`STAGED_ENTRIES`].
fn staged_entry(q: DType, k: DType, dim: usize, heads: usize) -> &'static str {
    let (qi, ki, di) = (usize::from(q == DType::BF16), usize::from(k != DType::BF16), usize::from(dim != 64));
    let hi = padded_heads(heads).trailing_zeros() as usize;
    STAGED_ENTRIES[((qi * 2 + ki) * 2 + di) * 5 + hi]
}

/// The fused decode kernel of a query dtype, key dtype and head width.
fn decode_entry(q: DType, k: DType, dim: usize) -> &'static str {
    DECODE_ENTRIES[entry_index(q, k, dim)]
}

/// `qsa::ScoreParams` in kernels/indexer/qsa/score.cuh.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ScoreParams {
    q: u64,
    kbar: u64,
    positions: u64,
    out: u64,
    page_table: u64,
    seq_ids: u64,
    positions_out: u64,
    out_stride: i64,
    rows: i32,
    heads: i32,
    blocks: i32,
    ratio: i32,
    max_pages: i32,
    per_page: i32,
    cache_pages: i32,
    sequences: i32,
    skip_upto: i32,
    scale: f32,
    blocks_per_cta: i32,
    pad: i32,
}
// SAFETY: #[repr(C)], the kernel's layout (size asserted here and there).
unsafe impl KernelParams for ScoreParams {}
const _: () = assert!(std::mem::size_of::<ScoreParams>() == 112);

/// Every fused decode kernel, in [`SCORE_ENTRIES`]' order.
pub(crate) const DECODE_ENTRIES: [&str; 18] = [
    "qsa_decode_qf32_kf32_d64",
    "qsa_decode_qf32_kf32_d128",
    "qsa_decode_qf32_kf32_d256",
    "qsa_decode_qf32_kbf16_d64",
    "qsa_decode_qf32_kbf16_d128",
    "qsa_decode_qf32_kbf16_d256",
    "qsa_decode_qf32_ke4m3_d64",
    "qsa_decode_qf32_ke4m3_d128",
    "qsa_decode_qf32_ke4m3_d256",
    "qsa_decode_qbf16_kf32_d64",
    "qsa_decode_qbf16_kf32_d128",
    "qsa_decode_qbf16_kf32_d256",
    "qsa_decode_qbf16_kbf16_d64",
    "qsa_decode_qbf16_kbf16_d128",
    "qsa_decode_qbf16_kbf16_d256",
    "qsa_decode_qbf16_ke4m3_d64",
    "qsa_decode_qbf16_ke4m3_d128",
    "qsa_decode_qbf16_ke4m3_d256",
];

/// `qsa::DecodeParams` in kernels/indexer/qsa/decode.cuh.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct DecodeParams {
    s: ScoreParams,
    tok: Tokens,
    ids: u64,
    state: u64,
    list: u64,
    lengths: u64,
    cols: i32,
    k: i32,
    ctas: i32,
    slots: i32,
    tile_cap: i32,
    nan_largest: i32,
    order_index: i32,
    cluster: i32,
}
// SAFETY: #[repr(C)], the kernel's layout (size asserted here and there).
unsafe impl KernelParams for DecodeParams {}
const _: () = assert!(std::mem::size_of::<DecodeParams>() == 240);

/// The most rows the fused decode kernel takes (more go in groups).
pub const DECODE_MAX_ROWS: usize = 64;
/// The most `k_blocks` the fused decode kernel takes (`qsa::DEC_MAX_K`).
pub const DECODE_MAX_K: usize = 4096;
/// Words of a row's state (`qsa::DEC_STATE_WORDS`): the barrier line, three
/// passes' histograms of 2,048 bins, two counts for each of up to 1,024 CTAs.
const DECODE_STATE_WORDS: usize = 32 + 3 * 2048 + 2 * DECODE_MAX_CTAS;
/// Bytes of a row's state in the fused decode kernel's workspace.
pub const DECODE_STATE_BYTES: usize = 4 * DECODE_STATE_WORDS;
/// The most CTAs a row (`qsa::DEC_MAX_CTAS`).
const DECODE_MAX_CTAS: usize = 1024;
/// A row's CTAs hold at least this many blocks each (one a thread) when the
/// row allows: fewer CTAs meet faster.
const DECODE_MIN_CHUNK: usize = 256;
/// The most CTAs a row of the fused decode kernel's cluster form
/// (`qsa::DEC_CLUSTER_MAX`), each with at most [`DECODE_CLUSTER_MAX_CHUNK`]
/// blocks: rows of at most 2,048 blocks (8,192 tokens at ratio 4) meet at
/// cluster barriers instead of global ones, in batches of at most one CTA
/// an SM. Measured on the H200 (perf-log v44, the grid form's plan against
/// the cluster form's): 1 x 4,096 tokens 12.19 -> 9.72 us, 8 x 4,096 13.05
/// -> 10.07, 1 x 8,192 12.70 -> 12.44, 16 x 8,192 13.93 -> 13.22; 8 CTAs a
/// row were slower (1 x 8,192: 19.44 with 11-bit digits), and so were
/// batches whose clusters do not all fit at once (64 x 4,096 at 4 CTAs a
/// row: 19.80 against 13.73 at 2).
pub const DECODE_CLUSTER_MAX_CTAS: usize = 4;
/// The most blocks a CTA of the cluster form takes (two scoring rounds);
/// a row of more takes the grid form (64 x 4,096 tokens at 1 CTA a row:
/// 17.87 us against 13.73 at 2).
const DECODE_CLUSTER_MAX_CHUNK: usize = 2 * DECODE_MIN_CHUNK;
/// The fused decode kernel's scratch for the histogram or the staged list
/// (`qsa::DEC_SCRATCH_BYTES`).
const DECODE_SCRATCH_BYTES: usize = 32_768;
/// Dynamic shared memory of a fused decode CTA beside its chunk's keys: the
/// query fragments of one column tile (sized for f32 queries, the larger),
/// the scratch, `qsa::DecShared` (rounded up).
fn decode_fixed_smem(dim: usize) -> usize {
    query_frag_bytes(DType::F32, dim, 1) + DECODE_SCRATCH_BYTES + 128
}

/// The fused decode kernel's geometry: `ctas` CTAs a row, `slots` rows in
/// flight (the grid is `ctas * slots` CTAs, two an SM), each CTA's chunk of
/// a row at most `tile_cap` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub ctas: usize,
    pub slots: usize,
    pub tile_cap: usize,
    /// Dynamic shared memory a CTA, bytes.
    pub smem: usize,
    /// The cluster form (sm_90+, at most [`DECODE_CLUSTER_MAX_CTAS`] CTAs a
    /// row): a row's CTAs are one thread-block cluster and meet at its
    /// barriers, with no state to zero and no cooperative launch. Otherwise
    /// every CTA is resident at once (a cooperative launch) and a row's CTAs
    /// meet through its state in the workspace. Both give the same bytes.
    pub cluster: bool,
}

impl DecodePlan {
    /// The same geometry in the other form (`cluster`: the cluster form,
    /// which takes at most [`DECODE_CLUSTER_MAX_CTAS`] CTAs a row).
    pub fn with_cluster(self, cluster: bool) -> Self {
        Self { cluster, ..self }
    }
}

/// How the device indexer runs a request (every path returns the same bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexerPath {
    /// The fused decode kernel: scores on chip, never in memory.
    Decode(DecodePlan),
    /// Groups of `rows` rows: scored into the workspace, then selected by
    /// `qsa_select`'s kernels.
    Grouped { rows: usize },
}

/// The most dynamic shared memory a fused decode CTA may take: two CTAs an
/// SM (each with the 1 KB the hardware reserves a CTA).
fn decode_cta_smem(dev: &DeviceProps) -> usize {
    (dev.smem_per_sm as usize / 2).saturating_sub(1024).min(dev.max_smem_per_block as usize)
}

/// The fused decode kernel's plan for `spec` on a device, or `None` when the
/// request is not a decode batch it takes: more than [`DECODE_MAX_ROWS`]
/// rows, `k_blocks > DECODE_MAX_K`, or a row whose scores do not fit the
/// GPU's shared memory at two CTAs an SM. Rows that
/// [`DECODE_CLUSTER_MAX_CTAS`] CTAs of at most `DECODE_CLUSTER_MAX_CHUNK`
/// blocks hold, in batches of at most one CTA an SM, take the cluster form
/// where the device has clusters. A pure function of the shape and the
/// device (not of the positions: the device cannot see them), so the chunks
/// are sized by `NB`; the kernel splits each row by its own `V`.
pub fn decode_plan(spec: &QsaIndexerSpec, dev: &DeviceProps) -> Option<DecodePlan> {
    if spec.rows == 0 || spec.rows > DECODE_MAX_ROWS || spec.k_blocks > DECODE_MAX_K || spec.blocks == 0 {
        return None;
    }
    let total = 2 * dev.sm_count as usize;
    let per_cta = decode_cta_smem(dev);
    let fixed = decode_fixed_smem(spec.dim);
    let tile_max = (per_cta.checked_sub(fixed)? / 4) & !7;
    if tile_max < 8 {
        return None;
    }
    let min_ctas = spec.blocks.div_ceil(tile_max);
    let max_slots = total / min_ctas;
    if max_slots == 0 || min_ctas > DECODE_MAX_CTAS {
        return None;
    }
    let waves = spec.rows.div_ceil(max_slots.min(spec.rows));
    let slots = spec.rows.div_ceil(waves);
    let ctas = (total / slots).min(DECODE_MAX_CTAS).min(spec.blocks.div_ceil(DECODE_MIN_CHUNK).max(min_ctas));
    // The cluster form: at most DECODE_CLUSTER_MAX_CTAS CTAs a row (fewer
    // where the batch would not fit a CTA an SM) of at most
    // DECODE_CLUSTER_MAX_CHUNK blocks each.
    if dev.clusters {
        let fit = (dev.sm_count as usize / slots).min(ctas).min(DECODE_CLUSTER_MAX_CTAS);
        if fit > 0 && spec.blocks.div_ceil(fit) <= DECODE_CLUSTER_MAX_CHUNK {
            let tile_cap = spec.blocks.div_ceil(fit).next_multiple_of(8);
            if tile_cap <= tile_max {
                return Some(DecodePlan { ctas: fit, slots, tile_cap, smem: fixed + 4 * tile_cap, cluster: true });
            }
        }
    }
    let tile_cap = spec.blocks.div_ceil(ctas).next_multiple_of(8);
    debug_assert!(tile_cap <= tile_max && ctas * slots <= total);
    Some(DecodePlan { ctas, slots, tile_cap, smem: fixed + 4 * tile_cap, cluster: false })
}

/// The widest rows (`NB`) the fused decode kernel is the default for: past
/// them the grouped path (the plain scorer, then the select engine's grid
/// path) was faster on the H200 (perf-log v41's sweep of 1, 4 and 16 rows
/// at 131K-1M tokens, bf16 and fp8 keys: the fused kernel scores at two
/// CTAs an SM beside its shared-memory scores).
pub const DECODE_DEFAULT_MAX_BLOCKS: usize = 65_536;

/// The device indexer's path for `spec` on a device: the fused decode
/// kernel for decode batches of at most [`DECODE_DEFAULT_MAX_BLOCKS`]
/// blocks, else groups (both return the same bytes).
pub fn indexer_path(spec: &QsaIndexerSpec, dev: &DeviceProps) -> IndexerPath {
    match decode_plan(spec, dev) {
        Some(p) if spec.blocks <= DECODE_DEFAULT_MAX_BLOCKS => IndexerPath::Decode(p),
        _ => IndexerPath::Grouped { rows: indexer_group_rows(spec) },
    }
}

/// The block keys on the device.
#[derive(Debug, Clone, Copy)]
pub struct DeviceBlockKeys {
    /// f32, bf16 or f8e4m3 (`F8E4M3`, raw bytes).
    pub dtype: DType,
    /// `[NB, d]` (contiguous) or `[cache_pages, page_size / ratio, d]`
    /// (paged), row-major, 16-byte aligned.
    pub kbar: u64,
    /// The page table of a paged cache (token pages: `page_size` tokens,
    /// `page_size / ratio` blocks a page), `None` for one contiguous
    /// sequence.
    pub pages: Option<DevicePages>,
    /// Pages in the paged cache (`kbar`'s first dimension); a table entry
    /// outside `0..cache_pages` scores NaN and is never read.
    pub cache_pages: usize,
}

/// One asynchronous `qsa_scores` over caller-owned device buffers
/// (`CUdeviceptr`s of the engine's context).
#[derive(Debug, Clone, Copy)]
pub struct DeviceQsaScores {
    pub spec: QsaScoresSpec,
    /// f32 or bf16 `q [rows, heads, dim]`.
    pub q_dtype: DType,
    pub q: u64,
    pub keys: DeviceBlockKeys,
    /// `i32 [rows]`: each query's absolute position. Device values are not
    /// checked on the host: a row whose position is negative, sees more
    /// blocks than `blocks`, or (paged) whose sequence or page count is
    /// outside the table comes out all NaN (nothing out of bounds is read).
    pub positions: u64,
    /// f32 `[rows, blocks]` output.
    pub out: u64,
    /// The `CUstream` to launch on.
    pub stream: u64,
}

/// One asynchronous `qsa_indexer` (the scores of [`DeviceQsaScores`], then
/// the selection of [`DeviceQsaSelect`]).
#[derive(Debug, Clone, Copy)]
pub struct DeviceQsaIndexer {
    pub spec: QsaIndexerSpec,
    pub q_dtype: DType,
    pub q: u64,
    pub keys: DeviceBlockKeys,
    /// `i32 [rows]` positions (device rows out of range: all padding, count 0).
    pub positions: u64,
    /// `i32 [rows, spec.width()]` output ids.
    pub ids: u64,
    /// Optional `i32 [rows]` counts.
    pub counts: Option<u64>,
    /// Optional page table for the output: ids become KV slots (usually the
    /// keys' own table).
    pub slots: Option<DevicePages>,
    /// Scratch of at least [`CudaEngine::qsa_indexer_workspace_bytes`]
    /// bytes, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    pub stream: u64,
}

/// Rows per scored group of the device indexer: `max(1, 256 MiB / (4 * NB))`,
/// at most the rows.
pub fn indexer_group_rows(spec: &QsaIndexerSpec) -> usize {
    (INDEXER_SCRATCH_BYTES / (4 * spec.blocks.max(1))).clamp(1, spec.rows.max(1))
}

/// Column tiles of 8 (row, head) columns a score CTA holds
/// (`qsa::GROUP_NT`).
const SCORE_NT: usize = 2;

/// A row's heads padded to a power of two (`qsa::padded_heads`).
fn padded_heads(heads: usize) -> usize {
    heads.max(1).next_power_of_two()
}

/// Rows of a row group of `nt` column tiles (`qsa::group_rows`): `8 nt`
/// columns of (row, padded head); sixteen heads take two tiles a row.
fn group_rows(heads: usize, nt: usize) -> usize {
    match padded_heads(heads) {
        16 => nt / 2,
        hp => 8 * nt / hp,
    }
}

/// Rows a score CTA takes at once: a row group of `SCORE_NT` tiles
/// ([`group_rows`]).
pub fn score_group_rows(heads: usize) -> usize {
    group_rows(heads, SCORE_NT)
}

/// Bytes of the query fragments of `nt` column tiles
/// (`qsa::query_frag_bytes`): a bf16 term a value for bf16 queries, three
/// for f32; `dim / 16` steps of 32 lanes x 8 bytes a tile.
fn query_frag_bytes(q: DType, dim: usize, nt: usize) -> usize {
    let terms = if q == DType::BF16 { 1 } else { 3 };
    terms * (dim / 16) * nt * 32 * 8
}

/// Blocks per CTA of the score kernel whose CTAs take `group` rows: one
/// wave of about two CTAs an SM when the groups' blocks allow, at least one
/// block a thread.
fn blocks_per_cta(sm_count: usize, spec: &QsaScoresSpec, group: usize) -> usize {
    let total = spec.rows.div_ceil(group).saturating_mul(spec.blocks);
    let ctas = 2 * sm_count.max(1);
    let per = total.div_ceil(ctas * SCORE_THREADS).max(1) * SCORE_THREADS;
    per.min(spec.blocks.div_ceil(SCORE_THREADS).max(1) * SCORE_THREADS)
}

/// Dynamic shared memory of a score CTA: its row group's query fragments.
fn score_smem(q: DType, dim: usize) -> usize {
    query_frag_bytes(q, dim, SCORE_NT)
}

fn check_dtypes(q: DType, k: DType) -> Result<()> {
    if !matches!(q, DType::F32 | DType::BF16) {
        return Err(Error::InvalidOption { what: "q dtype", value: q.to_string(), expected: "f32 or bf16" });
    }
    if !matches!(k, DType::F32 | DType::BF16 | DType::F8E4M3) {
        return Err(Error::InvalidOption {
            what: "kbar dtype",
            value: k.to_string(),
            expected: "f32, bf16 or f8e4m3 (float8_e4m3fn)",
        });
    }
    Ok(())
}

fn fits_i32(what: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::too_large(what, n as u128))
}

impl CudaEngine {
    /// The score launch of `spec.rows` rows into `out` (row stride
    /// `out_stride` f32); the fused form (`Some((k_blocks, positions_out))`)
    /// skips rows with `V <= k_blocks` and blocks past `V`, and writes each
    /// row's position (`-1` for a row out of range) to `positions_out`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_scores(
        &self,
        spec: &QsaScoresSpec,
        q_dtype: DType,
        q: u64,
        keys: &DeviceBlockKeys,
        positions: u64,
        seq_ids_of_rows: u64,
        out: u64,
        out_stride: usize,
        fused: Option<(usize, u64)>,
        stream: u64,
        force: Option<ScoreForm>,
    ) -> Result<()> {
        if spec.rows == 0 {
            return Ok(());
        }
        let (page_table, max_pages, per_page, sequences) = match &keys.pages {
            Some(p) => (p.table, p.max_pages, p.page_size / spec.ratio, p.sequences),
            None => (0, 0, 1, 0),
        };
        let dev = self.props();
        let form =
            force.unwrap_or_else(|| score_form(spec, q_dtype, keys.dtype, keys.pages.map_or(1, |p| p.sequences), &dev));
        if let ScoreForm::Staged(g) = form {
            if staged_geometry_on(q_dtype, keys.dtype, spec.dim, &dev) != Some(g) {
                return Err(Error::InvalidOption {
                    what: "score form",
                    value: format!("{g:?}"),
                    expected: "the staged geometry of these dtypes and width, within the device's shared memory",
                });
            }
        }
        let (group, smem, entry, module) = match form {
            ScoreForm::Plain => (
                score_group_rows(spec.heads),
                score_smem(q_dtype, spec.dim),
                score_entry(q_dtype, keys.dtype, spec.dim),
                Module::IndexerQsa,
            ),
            ScoreForm::Staged(g) => (
                staged_rows(spec.heads, g.nt),
                g.smem,
                staged_entry(q_dtype, keys.dtype, spec.dim, spec.heads),
                Module::IndexerQsaStaged,
            ),
        };
        let bpc = blocks_per_cta(dev.sm_count as usize, spec, group);
        let params = ScoreParams {
            q,
            kbar: keys.kbar,
            positions,
            out,
            page_table,
            seq_ids: seq_ids_of_rows,
            positions_out: fused.map_or(0, |f| f.1),
            out_stride: out_stride as i64,
            rows: fits_i32("rows", spec.rows)?,
            heads: spec.heads as i32,
            blocks: fits_i32("blocks", spec.blocks)?,
            ratio: fits_i32("ratio", spec.ratio)?,
            max_pages: fits_i32("page table pages", max_pages)?,
            per_page: fits_i32("blocks a page", per_page)?,
            cache_pages: fits_i32("cache pages", keys.cache_pages)?,
            sequences: fits_i32("sequences", sequences)?,
            skip_upto: fused.map_or(-1, |f| f.0.min(i32::MAX as usize) as i32),
            scale: spec.scale(),
            blocks_per_cta: fits_i32("blocks a CTA", bpc)?,
            pad: 0,
        };
        let f = self.function(KernelId { module, global_buffer: false, entry })?;
        let groups = spec.rows.div_ceil(group);
        let grid = (spec.blocks.div_ceil(bpc).max(1) as u32, groups.min(65_535) as u32);
        let l = Launch {
            grid,
            block: SCORE_THREADS as u32,
            smem: smem as u32,
            stream,
            programmatic: false,
            cooperative: false,
            cluster: 0,
        };
        self.context().bind_to_thread().map_err(cuda_err)?;
        l.run(&f, &params)
    }

    fn check_keys(&self, spec: &QsaScoresSpec, q_dtype: DType, q: u64, keys: &DeviceBlockKeys) -> Result<()> {
        spec.validate()?;
        check_dtypes(q_dtype, keys.dtype)?;
        if spec.rows > 0 && (q == 0 || keys.kbar == 0) {
            return Err(Error::InvalidOption {
                what: "qsa_scores buffers",
                value: "a null pointer".into(),
                expected: "device pointers for q and kbar",
            });
        }
        if !keys.kbar.is_multiple_of(16) || !q.is_multiple_of(q_dtype.size() as u64) {
            return Err(Error::InvalidOption {
                what: "kbar / q pointer",
                value: format!("{:#x} / {:#x}", keys.kbar, q),
                expected: "kbar 16-byte aligned, q aligned to its element",
            });
        }
        if let Some(p) = &keys.pages {
            p.validate()?;
            if !p.page_size.is_multiple_of(spec.ratio) {
                return Err(Error::InvalidOption {
                    what: "page_size",
                    value: format!("{} with ratio {}", p.page_size, spec.ratio),
                    expected: "a multiple of ratio (a page holds whole blocks)",
                });
            }
            if keys.cache_pages == 0 {
                return Err(Error::InvalidOption {
                    what: "cache_pages",
                    value: "0".into(),
                    expected: "the number of pages in kbar (>= 1)",
                });
            }
        }
        Ok(())
    }

    /// Launches `qsa_scores` on `args.stream`; returns without waiting.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context (`kbar`: `cache_pages` pages when paged), and
    /// `args.stream` a stream of that context.
    pub unsafe fn qsa_scores_device(&self, args: &DeviceQsaScores) -> Result<()> {
        self.qsa_scores_device_as(args, None)
    }

    /// [`Self::qsa_scores_device`] in a given form (`None`: [`score_form`]'s),
    /// for tests and benchmarks that compare the forms' bits and times.
    ///
    /// # Safety
    /// As [`Self::qsa_scores_device`].
    pub unsafe fn qsa_scores_device_as(&self, args: &DeviceQsaScores, form: Option<ScoreForm>) -> Result<()> {
        let spec = &args.spec;
        self.check_keys(spec, args.q_dtype, args.q, &args.keys)?;
        if spec.rows > 0 && (args.positions == 0 || args.out == 0) {
            return Err(Error::InvalidOption {
                what: "qsa_scores buffers",
                value: "a null pointer".into(),
                expected: "device pointers for positions and the output",
            });
        }
        let seq = args.keys.pages.map_or(0, |p| p.seq_ids);
        self.launch_scores(
            spec,
            args.q_dtype,
            args.q,
            &args.keys,
            args.positions,
            seq,
            args.out,
            spec.blocks,
            None,
            args.stream,
            form,
        )
    }

    /// Workspace a [`DeviceQsaIndexer`] with this spec needs, bytes: the
    /// score scratch of [`indexer_group_rows`] rows and the selection's
    /// workspace for a group.
    pub fn qsa_indexer_workspace_bytes(&self, spec: &QsaIndexerSpec) -> Result<usize> {
        self.qsa_indexer_workspace_bytes_on(spec, self.qsa_indexer_path(spec))
    }

    /// The path [`CudaEngine::qsa_indexer_device`] takes for `spec` on this
    /// device ([`indexer_path`]).
    pub fn qsa_indexer_path(&self, spec: &QsaIndexerSpec) -> IndexerPath {
        indexer_path(spec, &self.props())
    }

    /// Workspace of [`CudaEngine::qsa_indexer_device_on`] with `path`, bytes.
    pub fn qsa_indexer_workspace_bytes_on(&self, spec: &QsaIndexerSpec, path: IndexerPath) -> Result<usize> {
        match path {
            IndexerPath::Grouped { rows } => self.indexer_workspace(spec, rows.clamp(1, spec.rows.max(1))),
            IndexerPath::Decode(_) => {
                spec.scores_spec().validate()?;
                spec.select_spec().validate()?;
                let mut r = Regions::new();
                r.add((spec.rows * DECODE_STATE_BYTES) as u64);
                if spec.order == OutputOrder::Score {
                    r.add((spec.rows * spec.k_blocks * 8) as u64);
                }
                Ok(r.total() as usize)
            }
        }
    }

    /// The workspace of groups of `g` rows.
    fn indexer_workspace(&self, spec: &QsaIndexerSpec, g: usize) -> Result<usize> {
        spec.scores_spec().validate()?;
        spec.select_spec().validate()?;
        let mut r = Regions::new();
        r.add((g * spec.blocks * 4) as u64);
        r.add((g * 4) as u64);
        let sel = |rows: usize| -> Result<usize> {
            let s = crate::ops::qsa::QsaSpec { rows, ..spec.select_spec() };
            self.qsa_workspace_bytes(&s, DType::F32)
        };
        let rest = spec.rows % g;
        let select = sel(g.min(spec.rows.max(1)))?.max(if rest > 0 { sel(rest)? } else { 0 });
        r.add(select as u64);
        Ok(r.total() as usize)
    }

    /// Launches `qsa_indexer` on `args.stream`: per group of rows, the scores
    /// into the workspace, then the selection; returns without waiting.
    ///
    /// # Safety
    /// As [`CudaEngine::qsa_scores_device`] and
    /// [`CudaEngine::qsa_select_device`].
    pub unsafe fn qsa_indexer_device(&self, args: &DeviceQsaIndexer) -> Result<()> {
        self.qsa_indexer_device_on(args, self.qsa_indexer_path(&args.spec))
    }

    /// [`CudaEngine::qsa_indexer_device`] on a given path (the checks and the
    /// benchmarks run each; the answer never depends on the path). The
    /// workspace is [`CudaEngine::qsa_indexer_workspace_bytes_on`]'s.
    ///
    /// # Safety
    /// As [`CudaEngine::qsa_indexer_device`].
    pub unsafe fn qsa_indexer_device_on(&self, args: &DeviceQsaIndexer, path: IndexerPath) -> Result<()> {
        let spec = &args.spec;
        let sspec = spec.scores_spec();
        self.check_keys(&sspec, args.q_dtype, args.q, &args.keys)?;
        let qspec = spec.select_spec();
        qspec.validate()?;
        let need = self.qsa_indexer_workspace_bytes_on(spec, path)?;
        if args.workspace_bytes < need {
            return Err(Error::BufferSize { what: "workspace (bytes)", got: args.workspace_bytes, need });
        }
        if !args.workspace.is_multiple_of(ALIGN) {
            return Err(Error::InvalidOption {
                what: "workspace pointer",
                value: format!("{:#x}", args.workspace),
                expected: "256-byte aligned",
            });
        }
        if spec.rows > 0 && (args.positions == 0 || args.ids == 0 || args.counts == Some(0)) {
            return Err(Error::InvalidOption {
                what: "qsa_indexer buffers",
                value: "a null pointer".into(),
                expected: "device pointers for positions, ids (and counts)",
            });
        }
        if let Some(p) = &args.slots {
            p.validate()?;
        }
        match path {
            IndexerPath::Decode(plan) => self.launch_decode(args, &plan),
            IndexerPath::Grouped { rows } => self.indexer_grouped(args, rows),
        }
    }

    /// The grouped path: groups of `g` rows scored into the workspace, then
    /// selected (arguments checked by the caller).
    unsafe fn indexer_grouped(&self, args: &DeviceQsaIndexer, g: usize) -> Result<()> {
        let spec = &args.spec;
        let g = g.clamp(1, spec.rows.max(1));
        let sspec = spec.scores_spec();
        let qspec = spec.select_spec();
        let mut r = Regions::new();
        let scores = args.workspace + r.add((g * spec.blocks * 4) as u64);
        let positions = args.workspace + r.add((g * 4) as u64);
        let sel_ws = args.workspace + r.add(0);
        let sel_bytes = args.workspace_bytes - (sel_ws - args.workspace) as usize;
        let width = spec.width() as u64;
        let mut at = 0;
        while at < spec.rows {
            let n = g.min(spec.rows - at);
            let off = at as u64 * 4;
            let key_seq = args.keys.pages.map_or(0, |p| p.seq_ids + off);
            self.launch_scores(
                &QsaScoresSpec { rows: n, ..sspec },
                args.q_dtype,
                args.q + (at * spec.heads * spec.dim * args.q_dtype.size()) as u64,
                &args.keys,
                args.positions + off,
                key_seq,
                scores,
                spec.blocks,
                Some((spec.k_blocks, positions)),
                args.stream,
                None,
            )?;
            let sel = DeviceQsaSelect {
                spec: crate::ops::qsa::QsaSpec { rows: n, ..qspec },
                dtype: DType::F32,
                scores,
                positions,
                ids: args.ids + at as u64 * width * 4,
                counts: args.counts.map(|c| c + off),
                pages: args.slots.map(|p| DevicePages { seq_ids: p.seq_ids + off, ..p }),
                workspace: sel_ws,
                workspace_bytes: sel_bytes,
                stream: args.stream,
            };
            self.qsa_select_device(&sel)?;
            at += n;
        }
        Ok(())
    }

    /// The fused decode launch (arguments checked by the caller): the rows'
    /// state zeroed, then one cooperative grid of `plan.ctas * plan.slots`
    /// CTAs; or (the cluster form) one grid of `plan.slots` clusters of
    /// `plan.ctas` CTAs.
    unsafe fn launch_decode(&self, args: &DeviceQsaIndexer, plan: &DecodePlan) -> Result<()> {
        let spec = &args.spec;
        if spec.rows == 0 {
            return Ok(());
        }
        let fixed = decode_fixed_smem(spec.dim);
        if spec.k_blocks > DECODE_MAX_K
            || plan.ctas == 0
            || plan.ctas > DECODE_MAX_CTAS
            || plan.slots == 0
            || !plan.tile_cap.is_multiple_of(8)
            || plan.tile_cap < spec.blocks.div_ceil(plan.ctas.max(1)).next_multiple_of(8)
            || plan.smem < fixed + 4 * plan.tile_cap
            || (plan.cluster && (plan.ctas > DECODE_CLUSTER_MAX_CTAS || !self.props().clusters))
        {
            return Err(Error::InvalidOption {
                what: "decode plan",
                value: format!("{plan:?} for {} x {} blocks, k_blocks {}", spec.rows, spec.blocks, spec.k_blocks),
                expected: "a plan that covers every block (decode_plan)",
            });
        }
        let f = self.function(KernelId {
            module: Module::IndexerQsaDecode,
            global_buffer: false,
            entry: decode_entry(args.q_dtype, args.keys.dtype, spec.dim),
        })?;
        self.context().bind_to_thread().map_err(cuda_err)?;
        // The grid form: every CTA must be resident at once (the row
        // barriers): the plan's bound, two CTAs an SM within half an SM's
        // shared memory (the cooperative launch refuses anything else). The
        // cluster form's CTAs meet only within their cluster.
        let grid = plan.ctas * plan.slots;
        let dev = self.props();
        if (!plan.cluster && grid > 2 * dev.sm_count as usize) || plan.smem > decode_cta_smem(&dev) {
            return Err(Error::InvalidOption {
                what: "decode plan",
                value: format!("{grid} CTAs of {} bytes", plan.smem),
                expected: "at most two CTAs an SM, each within half an SM's shared memory (decode_plan)",
            });
        }
        let (page_table, max_pages, per_page, sequences) = match &args.keys.pages {
            Some(p) => (p.table, p.max_pages, p.page_size / spec.ratio, p.sequences),
            None => (0, 0, 1, 0),
        };
        let mut r = Regions::new();
        let state = args.workspace + r.add((spec.rows * DECODE_STATE_BYTES) as u64);
        let list = if spec.order == OutputOrder::Score {
            args.workspace + r.add((spec.rows * spec.k_blocks * 8) as u64)
        } else {
            0
        };
        let s = ScoreParams {
            q: args.q,
            kbar: args.keys.kbar,
            positions: args.positions,
            out: 0,
            page_table,
            seq_ids: args.keys.pages.map_or(0, |p| p.seq_ids),
            positions_out: 0,
            out_stride: 0,
            rows: fits_i32("rows", spec.rows)?,
            heads: spec.heads as i32,
            blocks: fits_i32("blocks", spec.blocks)?,
            ratio: fits_i32("ratio", spec.ratio)?,
            max_pages: fits_i32("page table pages", max_pages)?,
            per_page: fits_i32("blocks a page", per_page)?,
            cache_pages: fits_i32("cache pages", args.keys.cache_pages)?,
            sequences: fits_i32("sequences", sequences)?,
            skip_upto: -1,
            scale: spec.scores_spec().scale(),
            blocks_per_cta: 0,
            pad: 0,
        };
        let tok = Tokens {
            positions: args.positions,
            counts: args.counts.unwrap_or(0),
            ratio: s.ratio,
            width: fits_i32("width", spec.width())?,
            ..Tokens::default()
        }
        .with_pages(args.slots.as_ref());
        let params = DecodeParams {
            s,
            tok,
            ids: args.ids,
            state,
            list,
            lengths: 0,
            cols: s.blocks,
            k: spec.k_blocks as i32,
            ctas: plan.ctas as i32,
            slots: plan.slots as i32,
            tile_cap: plan.tile_cap as i32,
            nan_largest: i32::from(spec.nan == NanPolicy::Largest),
            order_index: i32::from(spec.order == OutputOrder::Index),
            cluster: i32::from(plan.cluster),
        };
        // The grid form: the rows' state zeroed, then the kernel, which may
        // start early (PDL: it scores first and waits for the zeroes before
        // its first use of the state). The cluster form has no state: the
        // kernel alone, waiting for the stream's earlier work first.
        let pdl = self.pdl();
        if !plan.cluster {
            crate::ops::select::device::zero_state(self, state, spec.rows * DECODE_STATE_WORDS, args.stream, pdl)?;
        }
        let l = Launch {
            grid: (grid as u32, 1),
            block: SCORE_THREADS as u32,
            smem: plan.smem as u32,
            stream: args.stream,
            programmatic: pdl,
            cooperative: !plan.cluster,
            cluster: if plan.cluster { plan.ctas as u32 } else { 0 },
        };
        l.run(&f, &params)
    }

    /// [`crate::cpu::qsa_scores`] on this device from host data: the CPU's
    /// checks (the same errors), upload, a run with a poisoned output,
    /// download.
    pub fn qsa_scores_host<Q: QueryElem, K: KeyElem>(
        &self,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        spec: &QsaScoresSpec,
    ) -> Result<Vec<f32>> {
        Ok(self.time_qsa_scores(q, keys, positions, spec, 0)?.0)
    }

    /// Uploads once, runs once with a poisoned output, then times `iters`
    /// runs; returns the first run's scores (every run writes the same
    /// bytes; the first is the one checked against the poison).
    pub fn time_qsa_scores<Q: QueryElem, K: KeyElem>(
        &self,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        spec: &QsaScoresSpec,
        iters: usize,
    ) -> Result<(Vec<f32>, Vec<f64>)> {
        self.time_qsa_scores_as(q, keys, positions, spec, iters, None)
    }

    /// [`Self::time_qsa_scores`] in a given form (`None`: [`score_form`]'s).
    pub fn time_qsa_scores_as<Q: QueryElem, K: KeyElem>(
        &self,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        spec: &QsaScoresSpec,
        iters: usize,
        form: Option<ScoreForm>,
    ) -> Result<(Vec<f32>, Vec<f64>)> {
        check_request(q.len(), keys, positions, spec)?;
        let d = IndexerData::upload(self, q, keys, positions, spec.dim, spec.ratio)?;
        let s = self.stream();
        let out: CudaSlice<f32> = s.alloc_zeros(spec.out_len()?.max(1)).map_err(cuda_err)?;
        let args = DeviceQsaScores {
            spec: *spec,
            q_dtype: Q::DTYPE,
            q: d.q.device_ptr(s).0,
            keys: d.keys(self, K::DTYPE),
            positions: d.positions.device_ptr(s).0,
            out: out.device_ptr(s).0,
            stream: s.cu_stream() as u64,
        };
        // SAFETY: buffers sized for the spec (checked above, uploaded whole).
        unsafe {
            launch::poison(args.out, 0x5a, out.len() * 4, s.cu_stream())?;
            self.qsa_scores_device_as(&args, form)?;
        }
        let mut host = s.clone_dtoh(&out).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        host.truncate(spec.out_len()?);
        // SAFETY: as above.
        let times = timing::time_on_stream(s, iters, || unsafe { self.qsa_scores_device_as(&args, form) })?;
        Ok((host, times))
    }

    /// [`crate::cpu::qsa_indexer`] on this device from host data: the CPU's
    /// checks (the same errors), upload, a run with poisoned outputs and
    /// workspace, download.
    pub fn qsa_indexer_host<Q: QueryElem, K: KeyElem>(
        &self,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        spec: &QsaIndexerSpec,
        slots: Option<&PageMap<'_>>,
    ) -> Result<QsaSelection> {
        Ok(self.time_qsa_indexer(q, keys, positions, spec, slots, 0)?.0)
    }

    /// Uploads once, runs once (poisoned outputs and workspace), then times
    /// `iters` runs; returns the first run's selection.
    pub fn time_qsa_indexer<Q: QueryElem, K: KeyElem>(
        &self,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        spec: &QsaIndexerSpec,
        slots: Option<&PageMap<'_>>,
        iters: usize,
    ) -> Result<(QsaSelection, Vec<f64>)> {
        self.time_qsa_indexer_on(q, keys, positions, spec, slots, iters, self.qsa_indexer_path(spec))
    }

    /// [`CudaEngine::time_qsa_indexer`] on a given path.
    #[allow(clippy::too_many_arguments)]
    pub fn time_qsa_indexer_on<Q: QueryElem, K: KeyElem>(
        &self,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        spec: &QsaIndexerSpec,
        slots: Option<&PageMap<'_>>,
        iters: usize,
        path: IndexerPath,
    ) -> Result<(QsaSelection, Vec<f64>)> {
        check_request(q.len(), keys, positions, &spec.scores_spec())?;
        check_positions(positions, &spec.select_spec(), DType::F32, slots)?;
        let d = IndexerData::upload(self, q, keys, positions, spec.dim, spec.ratio)?;
        let s = self.stream();
        let width = spec.width();
        let ids: CudaSlice<i32> = s.alloc_zeros((spec.rows * width).max(1)).map_err(cuda_err)?;
        let counts: CudaSlice<i32> = s.alloc_zeros(spec.rows.max(1)).map_err(cuda_err)?;
        let slot_copy = slots.map(|p| PagesCopy::upload(self, p)).transpose()?;
        let wb = self.qsa_indexer_workspace_bytes_on(spec, path)?;
        let ws: CudaSlice<u8> = s.alloc_zeros(wb.max(256)).map_err(cuda_err)?;
        let args = DeviceQsaIndexer {
            spec: *spec,
            q_dtype: Q::DTYPE,
            q: d.q.device_ptr(s).0,
            keys: d.keys(self, K::DTYPE),
            positions: d.positions.device_ptr(s).0,
            ids: ids.device_ptr(s).0,
            counts: Some(counts.device_ptr(s).0),
            slots: slot_copy.as_ref().map(|p| p.pages(self)),
            workspace: ws.device_ptr(s).0,
            workspace_bytes: wb,
            stream: s.cu_stream() as u64,
        };
        let cs = s.cu_stream();
        // SAFETY: buffers sized for the spec.
        unsafe {
            launch::poison(args.ids, 0x5a, ids.len() * 4, cs)?;
            launch::poison(counts.device_ptr(s).0, 0x5a, counts.len() * 4, cs)?;
            launch::poison(args.workspace, 0xa5, ws.len(), cs)?;
            self.qsa_indexer_device_on(&args, path)?;
        }
        let mut h_ids = s.clone_dtoh(&ids).map_err(cuda_err)?;
        let mut h_counts = s.clone_dtoh(&counts).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        h_ids.truncate(spec.rows * width);
        h_counts.truncate(spec.rows);
        // SAFETY: as above.
        let times = timing::time_on_stream(s, iters, || unsafe { self.qsa_indexer_device_on(&args, path) })?;
        Ok((QsaSelection { rows: spec.rows, width, ids: h_ids, counts: h_counts }, times))
    }
}

/// Device copies of the inputs of one host request.
struct IndexerData {
    q: CudaSlice<u8>,
    kbar: CudaSlice<u8>,
    positions: CudaSlice<i32>,
    pages: Option<PagesCopy>,
    cache_pages: usize,
}

impl IndexerData {
    /// Uploads a checked request (`dim` and `ratio` of its spec).
    fn upload<Q: QueryElem, K: KeyElem>(
        e: &CudaEngine,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        dim: usize,
        ratio: usize,
    ) -> Result<Self> {
        let s = e.stream();
        let up = |b: &[u8]| -> Result<CudaSlice<u8>> {
            if b.is_empty() {
                s.alloc_zeros(16).map_err(cuda_err)
            } else {
                s.clone_htod(b).map_err(cuda_err)
            }
        };
        let (kbar, pages, cache_pages) = match keys {
            BlockKeys::Contiguous(k) => (up(bytes_of(k))?, None, 0),
            BlockKeys::Paged { kbar, pages } => {
                let page_elems = (pages.page_size() / ratio) * dim;
                (up(bytes_of(kbar))?, Some(PagesCopy::upload(e, pages)?), kbar.len() / page_elems)
            }
        };
        let pos: Vec<i32> = positions.iter().map(|&t| t as i32).collect();
        let positions = if pos.is_empty() {
            s.alloc_zeros(1).map_err(cuda_err)?
        } else {
            s.clone_htod(&pos[..]).map_err(cuda_err)?
        };
        Ok(Self { q: up(bytes_of(q))?, kbar, positions, pages, cache_pages })
    }

    fn keys(&self, e: &CudaEngine, dtype: DType) -> DeviceBlockKeys {
        let s = e.stream();
        DeviceBlockKeys {
            dtype,
            kbar: self.kbar.device_ptr(s).0,
            pages: self.pages.as_ref().map(|p| p.pages(e)),
            cache_pages: self.cache_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_entries_are_the_modules() {
        assert_eq!(Module::IndexerQsa.entry_points(), &SCORE_ENTRIES[..]);
        assert_eq!(score_entry(DType::F32, DType::F32, 64), "qsa_scores_qf32_kf32_d64");
        assert_eq!(score_entry(DType::BF16, DType::F8E4M3, 256), "qsa_scores_qbf16_ke4m3_d256");
        assert_eq!(score_entry(DType::F32, DType::BF16, 128), "qsa_scores_qf32_kbf16_d128");
    }

    #[test]
    fn staged_entries_are_the_modules() {
        assert_eq!(Module::IndexerQsaStaged.entry_points(), &STAGED_ENTRIES[..]);
        assert_eq!(staged_entry(DType::BF16, DType::BF16, 128, 4), "qsa_staged_qbf16_kbf16_d128_h4");
        assert_eq!(staged_entry(DType::F32, DType::F8E4M3, 64, 3), "qsa_staged_qf32_ke4m3_d64_h4");
        assert_eq!(staged_entry(DType::BF16, DType::BF16, 64, 9), "qsa_staged_qbf16_kbf16_d64_h16");
        assert_eq!(staged_entry(DType::BF16, DType::F8E4M3, 128, 1), "qsa_staged_qbf16_ke4m3_d128_h1");
        // Every geometry's kernels by name, and every entry some geometry's.
        let mut seen = std::collections::BTreeSet::new();
        for q in [DType::F32, DType::BF16] {
            for k in [DType::F32, DType::BF16, DType::F8E4M3] {
                for dim in [64, 128, 256] {
                    if staged_geometry(q, k, dim).is_some() {
                        for heads in 1..=16 {
                            let kn = if k == DType::BF16 { "bf16" } else { "e4m3" };
                            let want = format!("qsa_staged_q{}_k{kn}_d{dim}_h{}", q.name(), padded_heads(heads));
                            assert_eq!(staged_entry(q, k, dim, heads), want);
                            seen.insert(want);
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len(), STAGED_ENTRIES.len());
    }

    /// The geometry the kernel computes (`qsa::Staged`; staged.cuh asserts
    /// the same bytes for bf16 queries and keys at d 128).
    #[test]
    fn staged_geometry_is_the_kernels() {
        let g = |q, k, d| staged_geometry(q, k, d);
        assert_eq!(g(DType::BF16, DType::BF16, 128), Some(StagedGeometry { nt: 4, stages: 3, smem: 85_264 }));
        assert_eq!(g(DType::BF16, DType::F8E4M3, 128), Some(StagedGeometry { nt: 4, stages: 4, smem: 73_888 }));
        assert_eq!(g(DType::F32, DType::BF16, 128), Some(StagedGeometry { nt: 2, stages: 2, smem: 84_240 }));
        assert_eq!(g(DType::BF16, DType::BF16, 64), Some(StagedGeometry { nt: 4, stages: 4, smem: 53_392 }));
        assert_eq!(g(DType::BF16, DType::BF16, 256), None);
        assert_eq!(g(DType::BF16, DType::F32, 64), None);
        for q in [DType::F32, DType::BF16] {
            for k in [DType::BF16, DType::F8E4M3] {
                for d in [64, 128] {
                    let x = g(q, k, d).unwrap();
                    assert!(x.smem <= STAGED_SMEM_BUDGET && (2..=4).contains(&x.stages), "{q} {k} {d}: {x:?}");
                }
            }
        }
    }

    /// Which score form each geometry takes, at and around the boundary:
    /// a super-group's rows (32 at 4 heads with bf16 queries, 16 with f32)
    /// a sequence.
    #[test]
    fn score_forms_follow_rows_a_sequence() {
        let h200 = DeviceProps::hopper(132);
        let staged = |rows, heads, q, k, seqs| {
            let spec = QsaScoresSpec::new(rows, 65_536).with_heads(heads);
            matches!(score_form(&spec, q, k, seqs, &h200), ScoreForm::Staged(_))
        };
        let (b, f, e) = (DType::BF16, DType::F32, DType::F8E4M3);
        assert!(staged(8192, 4, b, b, 1)); // the prefill bench
        assert!(staged(32, 4, b, b, 1) && !staged(31, 4, b, b, 1));
        assert!(staged(16, 4, f, b, 1) && !staged(15, 4, f, b, 1));
        assert!(staged(64, 4, b, e, 2) && !staged(63, 4, b, e, 2));
        assert!(!staged(32, 4, b, b, 32)); // a decode batch of distinct sequences
        assert!(staged(128, 1, b, b, 1) && !staged(127, 1, b, b, 1)); // one head: 32 rows a group
        assert!(staged(8, 16, b, b, 1) && !staged(7, 16, b, b, 1)); // sixteen heads: 2 rows a group
        assert!(!staged(8192, 4, b, f, 1)); // f32 keys: the plain form
        let spec = QsaScoresSpec::new(8192, 65_536).with_dim(256);
        assert_eq!(score_form(&spec, b, b, 1, &h200), ScoreForm::Plain);
        // A GPU with less shared memory a CTA than the geometry.
        let small = DeviceProps::small_test_device();
        assert_eq!(score_form(&QsaScoresSpec::new(8192, 65_536), b, b, 1, &small), ScoreForm::Plain);
        let ada = DeviceProps::ada(84);
        assert!(matches!(score_form(&QsaScoresSpec::new(8192, 65_536), b, b, 1, &ada), ScoreForm::Staged(_)));
    }

    #[test]
    fn score_params_layout() {
        assert_eq!(std::mem::size_of::<ScoreParams>(), 112);
        assert_eq!(std::mem::offset_of!(ScoreParams, positions_out), 48);
        assert_eq!(std::mem::offset_of!(ScoreParams, out_stride), 56);
        assert_eq!(std::mem::offset_of!(ScoreParams, rows), 64);
        assert_eq!(std::mem::offset_of!(ScoreParams, skip_upto), 96);
        assert_eq!(std::mem::offset_of!(ScoreParams, scale), 100);
        assert_eq!(std::mem::offset_of!(ScoreParams, blocks_per_cta), 104);
    }

    #[test]
    fn groups_bound_the_score_scratch() {
        let s = QsaIndexerSpec::new(8192, 65_536);
        assert_eq!(indexer_group_rows(&s), 1024); // 1,024 x 65,536 x 4 = 256 MiB
        assert_eq!(indexer_group_rows(&QsaIndexerSpec::new(16, 262_144)), 16);
        assert_eq!(indexer_group_rows(&QsaIndexerSpec::new(4, 1 << 27)), 1); // one row past 256 MiB
        assert_eq!(indexer_group_rows(&QsaIndexerSpec::new(0, 10)), 1);
    }

    #[test]
    fn decode_entries_are_the_modules() {
        assert_eq!(Module::IndexerQsaDecode.entry_points(), &DECODE_ENTRIES[..]);
        assert_eq!(decode_entry(DType::BF16, DType::BF16, 128), "qsa_decode_qbf16_kbf16_d128");
        assert_eq!(decode_entry(DType::F32, DType::F8E4M3, 64), "qsa_decode_qf32_ke4m3_d64");
        assert_eq!(std::mem::size_of::<DecodeParams>(), 240);
        assert_eq!(std::mem::offset_of!(DecodeParams, tok), 112);
        assert_eq!(std::mem::offset_of!(DecodeParams, ids), 176);
        assert_eq!(std::mem::offset_of!(DecodeParams, cols), 208);
        assert_eq!(std::mem::offset_of!(DecodeParams, order_index), 232);
        assert_eq!(std::mem::offset_of!(DecodeParams, cluster), 236);
    }

    /// The paths of the shapes on an H200 (132 SMs): decode batches
    /// take the fused kernel, prefill goes in groups.
    #[test]
    fn decode_batches_take_the_fused_kernel() {
        let h200 = DeviceProps::hopper(132);
        let plan = |rows, blocks| decode_plan(&QsaIndexerSpec::new(rows, blocks), &h200);
        for (rows, blocks) in
            [(1usize, 1024usize), (1, 32_768), (1, 262_144), (16, 262_144), (32, 32_768), (64, 65_536)]
        {
            let p = plan(rows, blocks).unwrap_or_else(|| panic!("{rows} x {blocks}: no decode plan"));
            assert!(p.ctas * p.slots <= 264, "{rows} x {blocks}: {p:?}");
            assert!(p.slots <= rows && rows.div_ceil(p.slots) * p.slots - rows < rows.div_ceil(p.slots), "{p:?}");
            assert!(p.tile_cap * p.ctas >= blocks && p.tile_cap % 8 == 0, "{p:?}");
            assert!(p.smem <= 233_472 / 2 - 1024, "{p:?}");
            assert!(blocks.div_ceil(p.ctas) >= DECODE_MIN_CHUNK.min(blocks) || p.ctas == 1, "{p:?}");
        }
        // 1M tokens, one row: spread over every SM, about 1,000 blocks a CTA.
        let p = plan(1, 262_144).unwrap();
        assert_eq!((p.ctas, p.slots), (264, 1));
        // 16 rows of 1M: one wave, 16 CTAs a row.
        let p = plan(16, 262_144).unwrap();
        assert_eq!((p.ctas, p.slots), (16, 16));
        // Not decode batches: too many rows, too large a k, rows past the chip.
        assert_eq!(plan(65, 1024), None);
        assert_eq!(plan(8192, 65_536), None);
        assert_eq!(decode_plan(&QsaIndexerSpec::new(1, 65_536).with_k_blocks(4097), &h200), None);
        assert_eq!(plan(1, 1 << 25), None);
        // The default path: fused up to 65,536 blocks, grouped past them.
        assert!(matches!(indexer_path(&QsaIndexerSpec::new(1, 65_536), &h200), IndexerPath::Decode(_)));
        assert!(matches!(indexer_path(&QsaIndexerSpec::new(16, 65_536), &h200), IndexerPath::Decode(_)));
        assert_eq!(indexer_path(&QsaIndexerSpec::new(1, 65_537), &h200), IndexerPath::Grouped { rows: 1 });
        assert_eq!(indexer_path(&QsaIndexerSpec::new(1, 262_144), &h200), IndexerPath::Grouped { rows: 1 });
        assert_eq!(indexer_path(&QsaIndexerSpec::new(16, 262_144), &h200), IndexerPath::Grouped { rows: 16 });
        assert_eq!(indexer_path(&QsaIndexerSpec::new(8192, 65_536), &h200), IndexerPath::Grouped { rows: 1024 });
        // 16 heads of 256 leave less room for the chunk: more CTAs a row.
        let wide = QsaIndexerSpec::new(1, 262_144).with_heads(16).with_dim(256);
        let p = decode_plan(&wide, &h200).unwrap();
        assert!(p.smem <= 233_472 / 2 - 1024 && p.tile_cap * p.ctas >= 262_144);
    }

    /// Rows of at most DECODE_CLUSTER_MAX_CTAS CTAs take the cluster form
    /// where the device has clusters (fewer CTAs a row where that makes the
    /// batch fit a CTA an SM).
    #[test]
    fn decode_rows_of_few_ctas_take_clusters() {
        let h200 = DeviceProps::hopper(132);
        let plan = |rows, blocks, dev: &DeviceProps| decode_plan(&QsaIndexerSpec::new(rows, blocks), dev).unwrap();
        // 4,096 tokens: four CTAs of 256 blocks, one cluster.
        let p = plan(1, 1024, &h200);
        assert_eq!((p.ctas, p.slots, p.cluster), (4, 1, true));
        // Up to four CTAs a row of up to 512 blocks (2,048); past them the
        // grid form at 256 blocks a CTA.
        let p = plan(1, 2048, &h200);
        assert_eq!((p.ctas, p.tile_cap, p.cluster), (4, 512, true));
        assert_eq!((plan(1, 1025, &h200).ctas, plan(1, 1025, &h200).cluster), (4, true));
        assert_eq!((plan(1, 2049, &h200).ctas, plan(1, 2049, &h200).cluster), (9, false));
        assert_eq!((plan(16, 2048, &h200).ctas, plan(16, 2048, &h200).cluster), (4, true));
        assert_eq!((plan(1, 200, &h200).ctas, plan(1, 200, &h200).cluster), (1, true));
        // At most a CTA an SM: 33 rows of four CTAs, 66 of two.
        assert_eq!((plan(33, 1024, &h200).ctas, plan(33, 1024, &h200).cluster), (4, true));
        let p = plan(64, 500, &h200);
        assert_eq!((p.ctas, p.slots, p.cluster), (2, 64, true));
        // 34-66 rows of 4,096 tokens: as many CTAs a row as a CTA an SM
        // allows (three at 34-44 rows, two at 45-66, up to 512 blocks a
        // CTA); wider rows: the grid form at four.
        let p = plan(64, 1024, &h200);
        assert_eq!((p.ctas, p.slots, p.tile_cap, p.cluster), (2, 64, 512, true));
        assert_eq!((plan(34, 1024, &h200).ctas, plan(34, 1024, &h200).cluster), (3, true));
        assert_eq!((plan(64, 1025, &h200).ctas, plan(64, 1025, &h200).cluster), (4, false));
        let p = plan(64, 65_536, &h200);
        assert_eq!((p.ctas, p.slots, p.cluster), (4, 64, false));
        assert!(!plan(1, 262_144, &h200).cluster && !plan(16, 262_144, &h200).cluster);
        // Without clusters (below sm_90): the same geometry in the grid form.
        let ampere = DeviceProps { clusters: false, ..h200 };
        for (rows, blocks) in [(1usize, 1024usize), (1, 200), (64, 500)] {
            assert_eq!(plan(rows, blocks, &ampere), plan(rows, blocks, &h200).with_cluster(false));
        }
    }

    #[test]
    fn tiles_fill_the_gpu_once() {
        // Decode at 1M tokens: 262,144 blocks over 132 SMs.
        let s = QsaScoresSpec::new(1, 262_144);
        let b = blocks_per_cta(132, &s, score_group_rows(s.heads));
        assert_eq!(b % SCORE_THREADS, 0);
        assert!(262_144usize.div_ceil(b) <= 264);
        // A short row: one CTA, the row rounded up to whole threads.
        assert_eq!(blocks_per_cta(132, &QsaScoresSpec::new(1, 100), 4), 256);
        // Prefill: one CTA a row group (four rows of four heads).
        assert_eq!(score_group_rows(4), 4);
        assert_eq!(
            (score_group_rows(1), score_group_rows(3), score_group_rows(8), score_group_rows(16)),
            (16, 4, 2, 1)
        );
        assert_eq!(blocks_per_cta(132, &QsaScoresSpec::new(8192, 65_536), 4), 65_536);
        assert_eq!(blocks_per_cta(132, &QsaScoresSpec::new(256, 65_536), 4), 63 * 256);
    }
}
