//! `qsa_select` on the CUDA engine: the select kernels' token form
//! (kernels/select/tokens.cuh), rows from the query positions, the ids (or
//! KV slots) written by the selection's own final write.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::{PageMap, QsaSelection, QsaSpec};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Error, Result, ScoreElem, ScoresView};
use crate::cuda::{launch, timing, CudaEngine};
use crate::ops::select::device::{pack_rows, DevicePages, Job, PagesCopy, Tokens};

/// One asynchronous QSA block selection over caller-owned device buffers
/// (`CUdeviceptr`s of the engine's context, as for
/// [`crate::ops::select::DeviceSelect`]).
#[derive(Debug, Clone, Copy)]
pub struct DeviceQsaSelect {
    pub spec: QsaSpec,
    /// The dtype of the block scores (f32, bf16, f16).
    pub dtype: DType,
    /// Block scores, row `r` at `scores + r * row_stride * size`.
    pub scores: u64,
    /// `i32 [rows]`: each query's absolute position. Device-resident values
    /// cannot be checked without a host synchronisation: a row whose
    /// position is negative, sees more blocks than the scores hold, or
    /// (with pages) whose sequence or last page is outside the table comes
    /// out as all padding, count 0 (nothing out of bounds is read).
    pub positions: u64,
    /// `i32 [rows, spec.width()]` output ids.
    pub ids: u64,
    /// Optional `i32 [rows]` output counts.
    pub counts: Option<u64>,
    /// Optional page table: ids become KV-cache slots.
    pub pages: Option<DevicePages>,
    /// Scratch of at least [`CudaEngine::qsa_workspace_bytes`] bytes,
    /// 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// The `CUstream` to launch on.
    pub stream: u64,
}

impl CudaEngine {
    /// Workspace a [`DeviceQsaSelect`] with this spec and dtype needs, bytes.
    pub fn qsa_workspace_bytes(&self, spec: &QsaSpec, dtype: DType) -> Result<usize> {
        spec.validate()?;
        self.workspace_bytes(&spec.block_spec_of(dtype), true)
    }

    /// Launches the selection on `args.stream`; returns without waiting (the
    /// same launch rules as [`CudaEngine::select_device`]).
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, and `args.stream` a stream of that context.
    pub unsafe fn qsa_select_device(&self, args: &DeviceQsaSelect) -> Result<()> {
        let spec = &args.spec;
        spec.validate()?;
        if !args.dtype.is_score() {
            return Err(Error::InvalidOption {
                what: "dtype",
                value: args.dtype.to_string(),
                expected: "f32, bf16 or f16 block scores",
            });
        }
        if let Some(p) = &args.pages {
            p.validate()?;
        }
        if spec.rows > 0 && (args.positions == 0 || args.ids == 0 || args.counts == Some(0)) {
            return Err(Error::InvalidOption {
                what: "qsa_select buffers",
                value: "a null pointer".into(),
                expected: "device pointers for positions, ids (and counts)",
            });
        }
        let tok = Tokens {
            positions: args.positions,
            counts: args.counts.unwrap_or(0),
            ratio: spec.ratio as i32,
            width: spec.width() as i32,
            ..Tokens::default()
        }
        .with_pages(args.pages.as_ref());
        let job = Job {
            spec: spec.block_spec_of(args.dtype),
            scores: args.scores,
            lengths: 0,
            out_idx: args.ids,
            out_val: 0,
            workspace: args.workspace,
            stream: args.stream,
            tok: Some(tok),
        };
        self.run_job(&job, args.workspace_bytes)
    }

    /// [`crate::cpu::qsa_select`] on this device from host data: checks the
    /// request as the CPU does (the same errors), uploads, runs on the
    /// engine's stream with poisoned outputs, downloads.
    pub fn qsa_select_host<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        positions: &[i64],
        spec: &QsaSpec,
        pages: Option<&PageMap<'_>>,
    ) -> Result<QsaSelection> {
        let dev = QsaData::upload(self, scores, positions, spec, pages)?;
        dev.run(self)?;
        dev.download(self)
    }

    /// Uploads once, then times `iters` runs (as
    /// [`CudaEngine::time_select`]); returns the last timed run's result.
    pub fn time_qsa_select<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        positions: &[i64],
        spec: &QsaSpec,
        pages: Option<&PageMap<'_>>,
        iters: usize,
    ) -> Result<(QsaSelection, Vec<f64>)> {
        let dev = QsaData::upload(self, scores, positions, spec, pages)?;
        dev.run(self)?;
        let args = dev.args(self);
        // SAFETY: buffers sized for the spec (QsaData::upload).
        let times = timing::time_on_stream(self.stream(), iters, || unsafe { self.qsa_select_device(&args) })?;
        // The last timed run's output (every run writes the same buffers).
        let out = dev.download(self)?;
        Ok((out, times))
    }
}

/// Device copies of one host QSA problem.
struct QsaData {
    spec: QsaSpec,
    dtype: DType,
    scores: CudaSlice<u8>,
    positions: CudaSlice<i32>,
    ids: CudaSlice<i32>,
    counts: CudaSlice<i32>,
    pages: Option<PagesCopy>,
    workspace: CudaSlice<u8>,
    workspace_bytes: usize,
}

impl QsaData {
    fn upload<T: ScoreElem>(
        e: &CudaEngine,
        scores: &ScoresView<'_, T>,
        positions: &[i64],
        spec: &QsaSpec,
        pages: Option<&PageMap<'_>>,
    ) -> Result<Self> {
        super::check_request(scores, positions, spec, pages)?;
        let s = e.stream();
        let host = pack_rows(scores, spec.rows, spec.row_stride, spec.rows * spec.row_stride.max(1))?;
        let pos: Vec<i32> = positions.iter().map(|&t| t as i32).collect();
        let width = spec.width();
        let dpages = pages.map(|p| PagesCopy::upload(e, p)).transpose()?;
        let wb = e.qsa_workspace_bytes(spec, T::DTYPE)?;
        Ok(Self {
            spec: *spec,
            dtype: T::DTYPE,
            scores: s.clone_htod(&host[..]).map_err(cuda_err)?,
            positions: s.clone_htod(&pos[..]).map_err(cuda_err)?,
            ids: s.alloc_zeros((spec.rows * width).max(1)).map_err(cuda_err)?,
            counts: s.alloc_zeros(spec.rows.max(1)).map_err(cuda_err)?,
            pages: dpages,
            workspace: s.alloc_zeros(wb.max(256)).map_err(cuda_err)?,
            workspace_bytes: wb,
        })
    }

    fn args(&self, e: &CudaEngine) -> DeviceQsaSelect {
        let st = e.stream();
        DeviceQsaSelect {
            spec: self.spec,
            dtype: self.dtype,
            scores: self.scores.device_ptr(st).0,
            positions: self.positions.device_ptr(st).0,
            ids: self.ids.device_ptr(st).0,
            counts: Some(self.counts.device_ptr(st).0),
            pages: self.pages.as_ref().map(|p| p.pages(e)),
            workspace: self.workspace.device_ptr(st).0,
            workspace_bytes: self.workspace_bytes,
            stream: st.cu_stream() as u64,
        }
    }

    /// Poisons the outputs and the workspace, then runs once.
    fn run(&self, e: &CudaEngine) -> Result<()> {
        let st = e.stream();
        let s = st.cu_stream();
        // SAFETY: sizes are the allocations' own; the buffers are sized for
        // the spec.
        unsafe {
            launch::poison(self.ids.device_ptr(st).0, 0x5a, self.ids.len() * 4, s)?;
            launch::poison(self.counts.device_ptr(st).0, 0x5a, self.counts.len() * 4, s)?;
            launch::poison(self.workspace.device_ptr(st).0, 0xa5, self.workspace.len(), s)?;
            e.qsa_select_device(&self.args(e))
        }
    }

    fn download(&self, e: &CudaEngine) -> Result<QsaSelection> {
        let s = e.stream();
        let mut ids = s.clone_dtoh(&self.ids).map_err(cuda_err)?;
        let mut counts = s.clone_dtoh(&self.counts).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        let width = self.spec.width();
        ids.truncate(self.spec.rows * width);
        counts.truncate(self.spec.rows);
        Ok(QsaSelection { rows: self.spec.rows, width, ids, counts })
    }
}
