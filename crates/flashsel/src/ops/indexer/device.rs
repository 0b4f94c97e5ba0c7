//! `qsa_scores` and `qsa_indexer` on the CUDA engine.
//!
//! - The scores: kernels/indexer/qsa/score.cuh, the CPU engine's arithmetic
//!   bit for bit (explicit round-to-nearest f32 multiplies and adds in the
//!   contract's lane order), so the GPU's scores are the CPU's bytes.
//! - The indexer: the scores of a group of rows into the workspace, then
//!   [`CudaEngine::qsa_select_device`]'s kernels over them, group after
//!   group on the caller's stream (no host synchronisation: graph-capturable).
//!   The scorer skips every row with `V <= k_blocks` (the selection copies
//!   those rows and reads no score) and every block past a row's `V`, so the
//!   work follows each row's `V`. Its bytes are those of `qsa_select` over
//!   `qsa_scores` on the same device, because both halves are exact per row.
//!
//! # Workspace bound (the device form)
//! Rows go in groups of `G = max(1, 64 MiB / (4 * NB))` (the device cannot
//! see the positions before the launch, so a group is sized by `NB`, not by
//! its rows' `V`): the score scratch is at most `max(64 MiB, 4 * NB)` bytes
//! (a decode step at 1M tokens and ratio 4: 1 MiB a row), beside the
//! selection's own workspace for `G` rows
//! ([`CudaEngine::qsa_indexer_workspace_bytes`]).

use cudarc::driver::{CudaSlice, DevicePtr};

use super::{check_request, BlockKeys, KeyElem, QsaIndexerSpec, QsaScoresSpec, QueryElem, INDEXER_SCRATCH_BYTES};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Error, Result};
use crate::cuda::compile::Module;
use crate::cuda::host::bytes_of;
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::workspace::{Regions, ALIGN};
use crate::cuda::{timing, CudaEngine, KernelId};
use crate::ops::pages::PageMap;
use crate::ops::qsa::device::DeviceQsaSelect;
use crate::ops::qsa::{check_positions, QsaSelection};
use crate::ops::select::device::{DevicePages, PagesCopy};

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

/// The kernel of a query dtype, key dtype and head width (checked before).
fn score_entry(q: DType, k: DType, dim: usize) -> &'static str {
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
    SCORE_ENTRIES[qi * 9 + ki * 3 + di]
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

/// Rows per scored group of the device indexer: `max(1, 64 MiB / (4 * NB))`,
/// at most the rows.
pub fn indexer_group_rows(spec: &QsaIndexerSpec) -> usize {
    (INDEXER_SCRATCH_BYTES / (4 * spec.blocks.max(1))).clamp(1, spec.rows.max(1))
}

/// Blocks per CTA of the score kernel: one wave of about two CTAs an SM
/// when the rows' blocks allow, at least one block a thread.
fn blocks_per_cta(sm_count: usize, spec: &QsaScoresSpec) -> usize {
    let total = spec.rows.saturating_mul(spec.blocks);
    let ctas = 2 * sm_count.max(1);
    let per = total.div_ceil(ctas * SCORE_THREADS).max(1) * SCORE_THREADS;
    per.min(spec.blocks.div_ceil(SCORE_THREADS).max(1) * SCORE_THREADS)
}

/// Dynamic shared memory of a score CTA: the row's queries (f32) and two
/// stage buffers of 32 keys x 144 bytes for each of the 8 warps.
fn score_smem(heads: usize, dim: usize) -> usize {
    heads * dim * 4 + (SCORE_THREADS / 32) * 2 * 32 * 144
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
    ) -> Result<()> {
        if spec.rows == 0 {
            return Ok(());
        }
        let (page_table, max_pages, per_page, sequences) = match &keys.pages {
            Some(p) => (p.table, p.max_pages, p.page_size / spec.ratio, p.sequences),
            None => (0, 0, 1, 0),
        };
        let bpc = blocks_per_cta(self.props().sm_count as usize, spec);
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
        let f = self.function(KernelId {
            module: Module::IndexerQsa,
            global_buffer: false,
            entry: score_entry(q_dtype, keys.dtype, spec.dim),
        })?;
        let grid = (spec.blocks.div_ceil(bpc).max(1) as u32, spec.rows.min(65_535) as u32);
        let l = Launch {
            grid,
            block: SCORE_THREADS as u32,
            smem: score_smem(spec.heads, spec.dim) as u32,
            stream,
            programmatic: false,
            cooperative: false,
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
        )
    }

    /// Workspace a [`DeviceQsaIndexer`] with this spec needs, bytes: the
    /// score scratch of [`indexer_group_rows`] rows and the selection's
    /// workspace for a group.
    pub fn qsa_indexer_workspace_bytes(&self, spec: &QsaIndexerSpec) -> Result<usize> {
        self.indexer_workspace(spec, indexer_group_rows(spec))
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
        self.indexer_grouped(args, indexer_group_rows(&args.spec))
    }

    /// [`CudaEngine::qsa_indexer_device`] in groups of `g` rows (the checks
    /// force small groups; the answer never depends on `g`).
    pub(crate) unsafe fn indexer_grouped(&self, args: &DeviceQsaIndexer, g: usize) -> Result<()> {
        let spec = &args.spec;
        let g = g.clamp(1, spec.rows.max(1));
        let sspec = spec.scores_spec();
        self.check_keys(&sspec, args.q_dtype, args.q, &args.keys)?;
        let qspec = spec.select_spec();
        qspec.validate()?;
        let need = self.indexer_workspace(spec, g)?;
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
            self.qsa_scores_device(&args)?;
        }
        let mut host = s.clone_dtoh(&out).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        host.truncate(spec.out_len()?);
        // SAFETY: as above.
        let times = timing::time_on_stream(s, iters, || unsafe { self.qsa_scores_device(&args) })?;
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
        self.indexer_host_grouped(q, keys, positions, spec, slots, iters, indexer_group_rows(spec))
    }

    /// [`CudaEngine::time_qsa_indexer`] in groups of `g` rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn indexer_host_grouped<Q: QueryElem, K: KeyElem>(
        &self,
        q: &[Q],
        keys: &BlockKeys<'_, K>,
        positions: &[i64],
        spec: &QsaIndexerSpec,
        slots: Option<&PageMap<'_>>,
        iters: usize,
        g: usize,
    ) -> Result<(QsaSelection, Vec<f64>)> {
        let g = g.clamp(1, spec.rows.max(1));
        check_request(q.len(), keys, positions, &spec.scores_spec())?;
        check_positions(positions, &spec.select_spec(), DType::F32, slots)?;
        let d = IndexerData::upload(self, q, keys, positions, spec.dim, spec.ratio)?;
        let s = self.stream();
        let width = spec.width();
        let ids: CudaSlice<i32> = s.alloc_zeros((spec.rows * width).max(1)).map_err(cuda_err)?;
        let counts: CudaSlice<i32> = s.alloc_zeros(spec.rows.max(1)).map_err(cuda_err)?;
        let slot_copy = slots.map(|p| PagesCopy::upload(self, p)).transpose()?;
        let wb = self.indexer_workspace(spec, g)?;
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
            self.indexer_grouped(&args, g)?;
        }
        let mut h_ids = s.clone_dtoh(&ids).map_err(cuda_err)?;
        let mut h_counts = s.clone_dtoh(&counts).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        h_ids.truncate(spec.rows * width);
        h_counts.truncate(spec.rows);
        // SAFETY: as above.
        let times = timing::time_on_stream(s, iters, || unsafe { self.indexer_grouped(&args, g) })?;
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
        assert_eq!(indexer_group_rows(&s), 256); // 256 x 65,536 x 4 = 64 MiB
        assert_eq!(indexer_group_rows(&QsaIndexerSpec::new(16, 262_144)), 16);
        assert_eq!(indexer_group_rows(&QsaIndexerSpec::new(1, 1 << 25)), 1); // one row past 64 MiB
        assert_eq!(indexer_group_rows(&QsaIndexerSpec::new(0, 10)), 1);
    }

    #[test]
    fn tiles_fill_the_gpu_once() {
        // Decode at 1M tokens: 262,144 blocks over 132 SMs.
        let s = QsaScoresSpec::new(1, 262_144);
        let b = blocks_per_cta(132, &s);
        assert_eq!(b % SCORE_THREADS, 0);
        assert!(262_144usize.div_ceil(b) <= 264);
        // A short row: one CTA, the row rounded up to whole threads.
        assert_eq!(blocks_per_cta(132, &QsaScoresSpec::new(1, 100)), 256);
        // Prefill: one CTA a row.
        assert_eq!(blocks_per_cta(132, &QsaScoresSpec::new(8192, 65_536)), 65_536);
    }
}
