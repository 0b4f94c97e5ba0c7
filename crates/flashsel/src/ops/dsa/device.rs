//! The DSA indexer on the CUDA engine: `dsa_scores_*`
//! (kernels/indexer/dsa_scores.cu, module IndexerDsa; tensor cores) writes
//! the scores in the device order ([`super`], "The CUDA engine's order",
//! within [`super::device_error_bound`] of the float64 reference);
//! `dsa_indexer` chains it with the select engine's range path (ids or KV
//! slots), so its ids are `select_ranges` on those scores, byte for byte.
//!
//! The chain keeps one row group's scores in the caller's workspace
//! ([`CudaEngine::dsa_indexer_workspace_bytes`]): groups of
//! [`indexer_group_rows`] rows, at most 256 MiB of f32 scores (a 1M-key
//! decode row is 4 MiB; an 8192-row prefill over 1M keys runs in 128 groups
//! of 64 rows instead of needing 32 GiB), then the selection's scratch.

use cudarc::driver::CudaSlice;

use super::{check_request, DsaPagedKeys, DsaScoresSpec};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Error, Result};
use crate::cuda::compile::Module;
use crate::cuda::host::{alloc, bytes_of, elems_of, ptr, upload};
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::{CudaEngine, KernelId};
use crate::ops::indexer::{KeyElem, INDEXER_SCRATCH_BYTES};
use crate::ops::mla::device::to_i32;
use crate::ops::pages::PageMap;
use crate::ops::select::device::PagesCopy;
use crate::ops::select::{DevicePages, DeviceSelect, SelectSpec, Selection};

/// Every kernel of the module: by (q format, k format) of f32, bf16, e4m3;
/// then the paged fp8 cache's by q format.
pub(crate) const DSA_ENTRIES: [&str; 12] = [
    "dsa_scores_qf32_kf32",
    "dsa_scores_qf32_kbf16",
    "dsa_scores_qf32_ke4m3",
    "dsa_scores_qbf16_kf32",
    "dsa_scores_qbf16_kbf16",
    "dsa_scores_qbf16_ke4m3",
    "dsa_scores_qe4m3_kf32",
    "dsa_scores_qe4m3_kbf16",
    "dsa_scores_qe4m3_ke4m3",
    "dsa_scores_paged_qf32",
    "dsa_scores_paged_qbf16",
    "dsa_scores_paged_qe4m3",
];

/// Columns one CTA writes (the kernel's `TC_KEYS`).
const CHUNK: usize = 512;
/// Threads a CTA (`TC_THREADS`).
const BLOCK: u32 = 128;
/// Heads of the widest chunk of query fragments (`TC_HEADS`).
const HEAD_CHUNK: usize = 32;

/// bf16 terms a value of `dtype` splits into (f32 three, bf16 and e4m3 one).
fn terms(dtype: DType) -> usize {
    if dtype == DType::F32 {
        3
    } else {
        1
    }
}

/// Dynamic shared memory of a launch: one head chunk's query fragments,
/// `terms(q) * (d / 16) * tiles * 32 lanes * 8` bytes, with the kernel's
/// `head_tiles` column tiles: 4 (32 heads), 2 with f32 keys.
fn frag_bytes(q: DType, k: DType, dim: usize) -> u32 {
    let tiles = if terms(k) > 1 { HEAD_CHUNK / 16 } else { HEAD_CHUNK / 8 };
    (terms(q) * (dim / 16) * tiles * 32 * 8) as u32
}

/// `DsaParams` in kernels/indexer/dsa_scores.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct DsaParams {
    q: u64,
    k: u64,
    k_scale: u64,
    weights: u64,
    starts: u64,
    ends: u64,
    out: u64,
    table: u64,
    seq_ids: u64,
    keys: i64,
    max_pages: i64,
    rows: i32,
    heads: i32,
    dim: i32,
    page_size: i32,
    num_pages: i32,
    sequences: i32,
}
// SAFETY: #[repr(C)], the kernel's layout (test below; the kernel asserts
// its size).
unsafe impl KernelParams for DsaParams {}

fn fmt_code(what: &str, dtype: DType) -> Result<usize> {
    match dtype {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        DType::F8E4M3 => Ok(2),
        other => Err(Error::UnknownDType(format!("dsa_scores takes f32, bf16 or fp8 e4m3 {what}, not {other}"))),
    }
}

/// The kernel of q of `q` and keys of `k`.
pub fn entry(q: DType, k: DType) -> Result<&'static str> {
    Ok(DSA_ENTRIES[fmt_code("q", q)? * 3 + fmt_code("k", k)?])
}

/// The paged cache's kernel for q of `q`.
pub fn paged_entry(q: DType) -> Result<&'static str> {
    Ok(DSA_ENTRIES[9 + fmt_code("q", q)?])
}

/// The kernel a request runs: the paged cache's (e4m3 keys only) when
/// `a.paged` is set, else the one of its q and k formats.
pub fn scores_entry(a: &DeviceDsaScores) -> Result<&'static str> {
    match a.paged {
        None => entry(a.q_dtype, a.k_dtype),
        Some(_) if a.k_dtype != DType::F8E4M3 => {
            Err(Error::UnknownDType(format!("the paged key cache holds fp8 e4m3 keys, not {}", a.k_dtype)))
        }
        Some(_) => paged_entry(a.q_dtype),
    }
}

/// DeepSeek-V3.2's paged fp8 key cache on the device
/// ([`super::DsaPagedKeys`]' layout): `k` of [`DeviceDsaScores`] is the
/// cache's first byte.
#[derive(Debug, Clone, Copy)]
pub struct DevicePagedKeys {
    /// `i32 [sequences, max_pages]` page numbers.
    pub table: u64,
    pub sequences: usize,
    pub max_pages: usize,
    pub page_size: usize,
    /// Pages of the cache.
    pub num_pages: usize,
    /// `i32 [T]`: the sequence of each row.
    pub seq_ids: u64,
}

/// One asynchronous `dsa_scores` over caller-owned device buffers.
#[derive(Debug, Clone, Copy)]
pub struct DeviceDsaScores {
    pub spec: DsaScoresSpec,
    pub q_dtype: DType,
    pub k_dtype: DType,
    /// `[T, H, d]` in `q_dtype`.
    pub q: u64,
    /// `[N, d]` in `k_dtype`.
    pub k: u64,
    /// Optional `f32 [N]`.
    pub k_scale: Option<u64>,
    /// `f32 [T, H]`.
    pub weights: u64,
    /// `i32 [T]` each; device values are clamped into `0 <= starts <= ends
    /// <= N` (the host cannot check them).
    pub starts: u64,
    pub ends: u64,
    /// `f32 [T, N]`.
    pub out: u64,
    pub stream: u64,
    /// The keys are a paged fp8 cache (`k_dtype` e4m3, `k_scale` unused: the
    /// cache's scales): key `s` of row `t` is token `s` of sequence
    /// `seq_ids[t]`. Device values outside the table or the cache score
    /// `-inf` and are never read.
    pub paged: Option<DevicePagedKeys>,
}

/// One asynchronous `dsa_indexer`: the scores into the workspace, then the
/// top `select.k` of each row's range (ids, or slots through `pages`).
#[derive(Debug, Clone, Copy)]
pub struct DeviceDsaIndexer {
    /// The scores' inputs (`out` is ignored: the scores go to the
    /// workspace).
    pub scores: DeviceDsaScores,
    /// The selection: `rows`, `cols` and `dtype` the scores' (`T`, `N`,
    /// f32).
    pub select: SelectSpec,
    pub pages: Option<DevicePages>,
    /// `i32 [T, k]`.
    pub out_indices: u64,
    /// Optional `f32 [T, k]`: the selected scores.
    pub out_values: Option<u64>,
    /// At least [`CudaEngine::dsa_indexer_workspace_bytes`] bytes, 256-byte
    /// aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
}

/// Rows of one group of the indexer's chain: as many as
/// [`INDEXER_SCRATCH_BYTES`] (256 MiB, `qsa_indexer`'s bound) of f32 scores
/// hold, at least one, at most `T` (a public engine's prefill allocated the
/// whole `[T, N]` and ran out of memory: 8 GiB at 8192 x 1M).
pub fn indexer_group_rows(spec: &DsaScoresSpec) -> usize {
    (INDEXER_SCRATCH_BYTES / (4 * spec.keys.max(1))).clamp(1, spec.rows.max(1))
}

fn scores_bytes(spec: &DsaScoresSpec) -> Result<usize> {
    Ok(spec
        .out_len()?
        .checked_mul(4)
        .ok_or_else(|| Error::Shape("the scores' bytes overflow".into()))?
        .next_multiple_of(256))
}

impl CudaEngine {
    /// Launches `dsa_scores` on `a.stream`; returns without waiting.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, and `a.stream` a stream of that context.
    pub unsafe fn dsa_scores_device(&self, a: &DeviceDsaScores) -> Result<()> {
        let s = &a.spec;
        s.validate()?;
        let f =
            self.function(KernelId { module: Module::IndexerDsa, global_buffer: false, entry: scores_entry(a)? })?;
        if s.rows == 0 || s.keys == 0 {
            return Ok(());
        }
        if a.q == 0 || a.k == 0 || a.weights == 0 || a.starts == 0 || a.ends == 0 || a.out == 0 {
            return Err(Error::InvalidOption {
                what: "dsa_scores buffers (q, k, weights, starts, ends, out)",
                value: "a null pointer".into(),
                expected: "device pointers",
            });
        }
        let rows = u32::try_from(s.rows)
            .ok()
            .filter(|&r| r <= i32::MAX as u32)
            .ok_or_else(|| Error::too_large("rows", s.rows as u128))?;
        let chunks = u32::try_from(s.keys.div_ceil(CHUNK)).ok().filter(|&c| c <= 65_535).ok_or_else(|| {
            Error::Shape(format!("dsa_scores: {} keys is more than 65,535 chunks of {CHUNK}", s.keys))
        })?;
        let mut p = DsaParams {
            q: a.q,
            k: a.k,
            k_scale: a.k_scale.unwrap_or(0),
            weights: a.weights,
            starts: a.starts,
            ends: a.ends,
            out: a.out,
            keys: s.keys as i64,
            rows: s.rows as i32,
            heads: s.heads as i32,
            dim: s.dim as i32,
            ..DsaParams::default()
        };
        if let Some(pg) = &a.paged {
            if pg.table == 0 || pg.seq_ids == 0 || pg.page_size == 0 || pg.max_pages == 0 {
                return Err(Error::InvalidOption {
                    what: "paged key cache",
                    value: format!("{} pages of {} tokens a sequence", pg.max_pages, pg.page_size),
                    expected: "a page table and seq_ids, at least one page of one token",
                });
            }
            p.k_scale = 0;
            p.table = pg.table;
            p.seq_ids = pg.seq_ids;
            p.max_pages = pg.max_pages as i64;
            p.page_size = to_i32("page_size", pg.page_size)?;
            p.num_pages = to_i32("num_pages", pg.num_pages)?;
            p.sequences = to_i32("sequences", pg.sequences)?;
        }
        // The keys' vector loads: 16 bytes (f32, bf16) or 8 (e4m3) a lane.
        let align = if a.k_dtype == DType::F8E4M3 { 8 } else { 16 };
        let paged_odd = a.paged.is_some_and(|pg| pg.page_size % 2 != 0);
        if !a.k.is_multiple_of(align) || paged_odd {
            return Err(Error::InvalidOption {
                what: "dsa_scores keys",
                value: format!("address {:#x}{}", a.k, if paged_odd { " with an odd page size" } else { "" }),
                expected: "keys aligned to 16 bytes (8 for fp8), a paged cache of even page size",
            });
        }
        Launch {
            grid: (rows, chunks),
            block: BLOCK,
            smem: frag_bytes(a.q_dtype, a.k_dtype, s.dim),
            stream: a.stream,
            programmatic: false,
            cooperative: false,
            cluster: 0,
        }
        .run(&f, &p)
    }

    /// Workspace a [`DeviceDsaIndexer`] needs, bytes: one row group's scores
    /// (`4 G N` with `G` = [`indexer_group_rows`], rounded up to 256) and the
    /// selection's scratch for a group; at most about
    /// [`INDEXER_SCRATCH_BYTES`] of scores whatever `T`.
    pub fn dsa_indexer_workspace_bytes(&self, spec: &DsaScoresSpec, select: &SelectSpec) -> Result<usize> {
        let g = indexer_group_rows(spec);
        let mut need = 0;
        for rows in [g, spec.rows % g.max(1)] {
            if rows > 0 {
                need = need.max(self.workspace_bytes(&SelectSpec { rows, ..*select }, true)?);
            }
        }
        Ok(scores_bytes(&DsaScoresSpec { rows: g, ..*spec })? + need)
    }

    /// Launches `dsa_indexer` on `a.scores.stream`: for each group of
    /// [`indexer_group_rows`] rows, the scores kernel into the workspace, then
    /// the select engine over each row's range (rows are independent: the
    /// same bytes as one group).
    ///
    /// # Safety
    /// As [`CudaEngine::dsa_scores_device`]; the workspace as stated.
    pub unsafe fn dsa_indexer_device(&self, a: &DeviceDsaIndexer) -> Result<()> {
        let s = &a.scores.spec;
        let sel = &a.select;
        super::check_select(s, sel)?;
        let need = self.dsa_indexer_workspace_bytes(s, sel)?;
        if a.workspace_bytes < need || a.workspace == 0 || !a.workspace.is_multiple_of(256) {
            return Err(Error::BufferSize {
                what: "dsa_indexer workspace (256-byte aligned)",
                got: a.workspace_bytes,
                need,
            });
        }
        let g = indexer_group_rows(s);
        let sb = scores_bytes(&DsaScoresSpec { rows: g, ..*s })?;
        let qb = (s.heads * s.dim * a.scores.q_dtype.size()) as u64;
        let at = |base: u64, r0: usize, bytes: u64| base + r0 as u64 * bytes;
        let mut r0 = 0;
        while r0 < s.rows.max(1) {
            let rows = g.min(s.rows - r0);
            if rows == 0 {
                break;
            }
            let sc = DeviceDsaScores {
                spec: DsaScoresSpec { rows, ..*s },
                q: at(a.scores.q, r0, qb),
                weights: at(a.scores.weights, r0, 4 * s.heads as u64),
                starts: at(a.scores.starts, r0, 4),
                ends: at(a.scores.ends, r0, 4),
                out: a.workspace,
                paged: a.scores.paged.map(|p| DevicePagedKeys { seq_ids: at(p.seq_ids, r0, 4), ..p }),
                ..a.scores
            };
            self.dsa_scores_device(&sc)?;
            let kb = 4 * sel.k as u64;
            self.select_device(&DeviceSelect {
                spec: SelectSpec { rows, ..*sel },
                scores: a.workspace,
                lengths: Some(sc.ends),
                out_indices: at(a.out_indices, r0, kb),
                out_values: a.out_values.map(|v| at(v, r0, kb)),
                workspace: a.workspace + sb as u64,
                workspace_bytes: a.workspace_bytes - sb,
                stream: a.scores.stream,
                starts: Some(sc.starts),
                pages: a.pages.map(|p| DevicePages { seq_ids: at(p.seq_ids, r0, 4), ..p }),
            })?;
            r0 += rows;
        }
        Ok(())
    }

    /// [`crate::cpu::dsa_scores`] on this device from host data: the CPU's
    /// checks (the same errors), upload, the output poisoned, one run,
    /// download. The device order's bits (not the CPU engine's).
    #[allow(clippy::too_many_arguments)]
    pub fn dsa_scores_host<Q: KeyElem, K: KeyElem>(
        &self,
        q: &[Q],
        k: &[K],
        k_scale: Option<&[f32]>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
    ) -> Result<Vec<f32>> {
        check_request(spec, q.len(), k.len(), k_scale, weights, starts, ends)?;
        let d =
            Inputs::upload(self, bytes_of(q), Q::DTYPE, bytes_of(k), K::DTYPE, k_scale, weights, starts, ends, None)?;
        self.scores_of(&d, spec)
    }

    /// [`crate::cpu::dsa_scores_paged`] on this device from host data (as
    /// [`CudaEngine::dsa_scores_host`]).
    pub fn dsa_scores_paged_host<Q: KeyElem>(
        &self,
        q: &[Q],
        keys: &DsaPagedKeys<'_>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
    ) -> Result<Vec<f32>> {
        check_request(spec, q.len(), spec.keys * spec.dim, None, weights, starts, ends)?;
        keys.check(spec, starts, ends)?;
        let paged = Some((&keys.pages, keys.num_pages(spec.dim)));
        let d =
            Inputs::upload(self, bytes_of(q), Q::DTYPE, keys.cache, DType::F8E4M3, None, weights, starts, ends, paged)?;
        self.scores_of(&d, spec)
    }

    fn scores_of(&self, d: &Inputs, spec: &DsaScoresSpec) -> Result<Vec<f32>> {
        let n = spec.out_len()?;
        let out = alloc(self, n * 4)?;
        let st = self.stream().cu_stream();
        // SAFETY: buffers sized for the spec (checked by the callers).
        unsafe {
            launch::poison(ptr(self, &out), 0xff, n * 4, st)?;
            self.dsa_scores_device(&d.args(self, *spec, ptr(self, &out)))?;
        }
        let raw = self.stream().clone_dtoh(&out).map_err(cuda_err)?;
        self.stream().synchronize().map_err(cuda_err)?;
        Ok(elems_of::<f32>(&raw, n))
    }

    /// [`crate::cpu::dsa_indexer`] on this device from host data (the chain
    /// of [`CudaEngine::dsa_indexer_device`]); outputs poisoned before the
    /// run. The CPU's `select_ranges` of this engine's own scores, byte for
    /// byte.
    #[allow(clippy::too_many_arguments)]
    pub fn dsa_indexer_host<Q: KeyElem, K: KeyElem>(
        &self,
        q: &[Q],
        k: &[K],
        k_scale: Option<&[f32]>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
        select: &SelectSpec,
        pages: Option<&PageMap<'_>>,
    ) -> Result<Selection<f32>> {
        let d = IndexerData::flat(self, q, k, k_scale, weights, starts, ends, spec, select, pages)?;
        d.run(self)?;
        d.download(self)
    }

    /// [`crate::cpu::dsa_indexer_paged`] on this device from host data (as
    /// [`CudaEngine::dsa_indexer_host`]).
    #[allow(clippy::too_many_arguments)]
    pub fn dsa_indexer_paged_host<Q: KeyElem>(
        &self,
        q: &[Q],
        keys: &DsaPagedKeys<'_>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
        select: &SelectSpec,
        slots: bool,
    ) -> Result<Selection<f32>> {
        let d = IndexerData::paged(self, q, keys, weights, starts, ends, spec, select, slots)?;
        d.run(self)?;
        d.download(self)
    }

    /// Uploads once, then times `iters` runs of [`CudaEngine::dsa_indexer_device`]
    /// (events around each); returns the last run's result and the seconds
    /// of each run.
    #[allow(clippy::too_many_arguments)]
    pub fn time_dsa_indexer<Q: KeyElem, K: KeyElem>(
        &self,
        q: &[Q],
        k: &[K],
        k_scale: Option<&[f32]>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
        select: &SelectSpec,
        pages: Option<&PageMap<'_>>,
        iters: usize,
    ) -> Result<(Selection<f32>, Vec<f64>)> {
        let d = IndexerData::flat(self, q, k, k_scale, weights, starts, ends, spec, select, pages)?;
        d.time(self, iters)
    }

    /// [`CudaEngine::time_dsa_indexer`] over a paged fp8 key cache.
    #[allow(clippy::too_many_arguments)]
    pub fn time_dsa_indexer_paged<Q: KeyElem>(
        &self,
        q: &[Q],
        keys: &DsaPagedKeys<'_>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
        select: &SelectSpec,
        slots: bool,
        iters: usize,
    ) -> Result<(Selection<f32>, Vec<f64>)> {
        let d = IndexerData::paged(self, q, keys, weights, starts, ends, spec, select, slots)?;
        d.time(self, iters)
    }
}

/// Device copies of one host `dsa_indexer` problem.
struct IndexerData {
    inputs: Inputs,
    /// The page table the ids are mapped through (slots), if any.
    pages: Option<PagesCopy>,
    spec: DsaScoresSpec,
    select: SelectSpec,
    ws: CudaSlice<u8>,
    ws_bytes: usize,
    idx: CudaSlice<u8>,
    val: CudaSlice<u8>,
}

impl IndexerData {
    #[allow(clippy::too_many_arguments)]
    fn flat<Q: KeyElem, K: KeyElem>(
        e: &CudaEngine,
        q: &[Q],
        k: &[K],
        k_scale: Option<&[f32]>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
        select: &SelectSpec,
        pages: Option<&PageMap<'_>>,
    ) -> Result<Self> {
        check_request(spec, q.len(), k.len(), k_scale, weights, starts, ends)?;
        let inputs =
            Inputs::upload(e, bytes_of(q), Q::DTYPE, bytes_of(k), K::DTYPE, k_scale, weights, starts, ends, None)?;
        Self::new(e, inputs, spec, select, starts, ends, pages)
    }

    #[allow(clippy::too_many_arguments)]
    fn paged<Q: KeyElem>(
        e: &CudaEngine,
        q: &[Q],
        keys: &DsaPagedKeys<'_>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        spec: &DsaScoresSpec,
        select: &SelectSpec,
        slots: bool,
    ) -> Result<Self> {
        check_request(spec, q.len(), spec.keys * spec.dim, None, weights, starts, ends)?;
        keys.check(spec, starts, ends)?;
        let paged = Some((&keys.pages, keys.num_pages(spec.dim)));
        let inputs =
            Inputs::upload(e, bytes_of(q), Q::DTYPE, keys.cache, DType::F8E4M3, None, weights, starts, ends, paged)?;
        Self::new(e, inputs, spec, select, starts, ends, slots.then_some(&keys.pages))
    }

    fn new(
        e: &CudaEngine,
        inputs: Inputs,
        spec: &DsaScoresSpec,
        select: &SelectSpec,
        starts: &[i32],
        ends: &[i32],
        pages: Option<&PageMap<'_>>,
    ) -> Result<Self> {
        super::check_select(spec, select)?;
        select.validate()?;
        if let Some(p) = pages {
            p.check_ranges(select, Some(starts), Some(ends))?;
        }
        let ws_bytes = e.dsa_indexer_workspace_bytes(spec, select)?;
        let n = select.rows * select.k;
        Ok(Self {
            inputs,
            pages: pages.map(|p| PagesCopy::upload(e, p)).transpose()?,
            spec: *spec,
            select: *select,
            ws: alloc(e, ws_bytes)?,
            ws_bytes,
            idx: alloc(e, n * 4)?,
            val: alloc(e, n * 4)?,
        })
    }

    fn args(&self, e: &CudaEngine) -> DeviceDsaIndexer {
        DeviceDsaIndexer {
            scores: self.inputs.args(e, self.spec, 0),
            select: self.select,
            pages: self.pages.as_ref().map(|p| p.pages(e)),
            out_indices: ptr(e, &self.idx),
            out_values: Some(ptr(e, &self.val)),
            workspace: ptr(e, &self.ws),
            workspace_bytes: self.ws_bytes,
        }
    }

    /// Poisons the outputs, then runs.
    fn run(&self, e: &CudaEngine) -> Result<()> {
        let n = self.select.rows * self.select.k;
        let st = e.stream().cu_stream();
        // SAFETY: buffers sized for the specs (new).
        unsafe {
            launch::poison(ptr(e, &self.idx), 0xa5, n * 4, st)?;
            launch::poison(ptr(e, &self.val), 0xa5, n * 4, st)?;
            e.dsa_indexer_device(&self.args(e))
        }
    }

    /// One run, then `iters` timed runs; the last run's result.
    fn time(&self, e: &CudaEngine, iters: usize) -> Result<(Selection<f32>, Vec<f64>)> {
        self.run(e)?;
        let args = self.args(e);
        // SAFETY: buffers sized for the specs (new).
        let times = crate::cuda::timing::time_on_stream(e.stream(), iters, || unsafe { e.dsa_indexer_device(&args) })?;
        Ok((self.download(e)?, times))
    }

    fn download(&self, e: &CudaEngine) -> Result<Selection<f32>> {
        let n = self.select.rows * self.select.k;
        let ri = e.stream().clone_dtoh(&self.idx).map_err(cuda_err)?;
        let rv = e.stream().clone_dtoh(&self.val).map_err(cuda_err)?;
        e.stream().synchronize().map_err(cuda_err)?;
        Ok(Selection {
            rows: self.select.rows,
            k: self.select.k,
            indices: elems_of::<i32>(&ri, n),
            values: elems_of::<f32>(&rv, n),
        })
    }
}

/// Device copies of one host request's inputs.
struct Inputs {
    q: CudaSlice<u8>,
    q_dtype: DType,
    k: CudaSlice<u8>,
    k_dtype: DType,
    k_scale: Option<CudaSlice<u8>>,
    weights: CudaSlice<u8>,
    starts: CudaSlice<u8>,
    ends: CudaSlice<u8>,
    /// A paged cache's table and its page count.
    paged: Option<(PagesCopy, usize)>,
}

impl Inputs {
    #[allow(clippy::too_many_arguments)]
    fn upload(
        e: &CudaEngine,
        q: &[u8],
        q_dtype: DType,
        k: &[u8],
        k_dtype: DType,
        k_scale: Option<&[f32]>,
        weights: &[f32],
        starts: &[i32],
        ends: &[i32],
        paged: Option<(&PageMap<'_>, usize)>,
    ) -> Result<Self> {
        Ok(Self {
            q: upload(e, q)?,
            q_dtype,
            k: upload(e, k)?,
            k_dtype,
            k_scale: k_scale.map(|s| upload(e, bytes_of(s))).transpose()?,
            weights: upload(e, bytes_of(weights))?,
            starts: upload(e, bytes_of(starts))?,
            ends: upload(e, bytes_of(ends))?,
            paged: paged.map(|(p, n)| PagesCopy::upload(e, p).map(|c| (c, n))).transpose()?,
        })
    }

    fn args(&self, e: &CudaEngine, spec: DsaScoresSpec, out: u64) -> DeviceDsaScores {
        DeviceDsaScores {
            spec,
            q_dtype: self.q_dtype,
            k_dtype: self.k_dtype,
            q: ptr(e, &self.q),
            k: ptr(e, &self.k),
            k_scale: self.k_scale.as_ref().map(|s| ptr(e, s)),
            weights: ptr(e, &self.weights),
            starts: ptr(e, &self.starts),
            ends: ptr(e, &self.ends),
            out,
            stream: e.stream().cu_stream() as u64,
            paged: self.paged.as_ref().map(|(c, n)| {
                let d = c.pages(e);
                DevicePagedKeys {
                    table: d.table,
                    sequences: d.sequences,
                    max_pages: d.max_pages,
                    page_size: d.page_size,
                    num_pages: *n,
                    seq_ids: d.seq_ids,
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<DsaParams>(), 112);
        assert_eq!(std::mem::offset_of!(DsaParams, keys), 72);
        assert_eq!(std::mem::offset_of!(DsaParams, rows), 88);
        assert_eq!(std::mem::offset_of!(DsaParams, sequences), 108);
    }

    #[test]
    fn entries_follow_the_formats() {
        assert_eq!(entry(DType::F8E4M3, DType::F8E4M3).unwrap(), "dsa_scores_qe4m3_ke4m3");
        assert_eq!(entry(DType::F32, DType::BF16).unwrap(), "dsa_scores_qf32_kbf16");
        assert_eq!(entry(DType::BF16, DType::F8E4M3).unwrap(), "dsa_scores_qbf16_ke4m3");
        assert!(entry(DType::F16, DType::F32).is_err());
        assert_eq!(paged_entry(DType::BF16).unwrap(), "dsa_scores_paged_qbf16");
        // A request takes the paged kernel exactly when it names a paged cache.
        let pg = DevicePagedKeys { table: 1, sequences: 1, max_pages: 1, page_size: 64, num_pages: 1, seq_ids: 1 };
        let mut a = DeviceDsaScores {
            spec: DsaScoresSpec::new(1, 64, 128, 64),
            q_dtype: DType::F8E4M3,
            k_dtype: DType::F8E4M3,
            q: 1,
            k: 1,
            k_scale: None,
            weights: 1,
            starts: 1,
            ends: 1,
            out: 1,
            stream: 0,
            paged: None,
        };
        assert_eq!(scores_entry(&a).unwrap(), "dsa_scores_qe4m3_ke4m3");
        a.paged = Some(pg);
        assert_eq!(scores_entry(&a).unwrap(), "dsa_scores_paged_qe4m3");
        a.q_dtype = DType::F32;
        assert_eq!(scores_entry(&a).unwrap(), "dsa_scores_paged_qf32");
        a.k_dtype = DType::BF16;
        assert!(scores_entry(&a).unwrap_err().to_string().contains("e4m3"));
    }

    #[test]
    fn the_workspace_is_bounded_by_row_groups() {
        // 8192 rows x 1M keys: 64 rows a group (256 MiB), not 32 GiB.
        let s = DsaScoresSpec::new(8192, 64, 128, 1 << 20);
        assert_eq!(indexer_group_rows(&s), 64);
        assert_eq!(scores_bytes(&DsaScoresSpec { rows: indexer_group_rows(&s), ..s }).unwrap(), 256 << 20);
        // Decode: every row in one group; at least one row a group.
        assert_eq!(indexer_group_rows(&DsaScoresSpec::new(16, 64, 128, 131_072)), 16);
        assert_eq!(indexer_group_rows(&DsaScoresSpec::new(3, 64, 128, 100 << 20)), 1);
        assert_eq!(indexer_group_rows(&DsaScoresSpec::new(0, 64, 128, 10)), 1);
        assert_eq!(Module::IndexerDsa.entry_points(), &DSA_ENTRIES);
    }
}
