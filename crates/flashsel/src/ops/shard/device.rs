//! The context-parallel merge on the CUDA engine (kernels/shard/merge.cu):
//! the gathered candidates of every rank (the wire of [`super`], each
//! rank's ids ascending) merged on the device into the bytes one device
//! returns on the whole row.
//!
//! Three launches on the caller's stream, no host synchronisation, no
//! allocation (graph-capturable): `sh_pack_*` compacts each row's
//! candidates in global id order into the workspace, the select engine
//! ([`CudaEngine::select_device`]) selects over them (a row of `ranks * k`
//! columns whose ties by position are the ties by global id), and
//! `sh_write` gathers the selected positions' ids back (QSA: expanded to
//! tokens, the tail, counts and slots by the select kernels' token write).
//! Exact for any rank count, shard sizes and `k`: the engine is exact on
//! every row length.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::{check_ascending, check_merge, ShardLayout};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Error, Result, ScoreElem};
use crate::cuda::compile::Module;
use crate::cuda::host::{bytes_of, elems_of};
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::workspace::Regions;
use crate::cuda::{timing, CudaEngine, KernelId};
use crate::ops::pages::PageMap;
use crate::ops::qsa::{QsaSelection, QsaSpec};
use crate::ops::select::device::{DevicePages, PagesCopy, Tokens};
use crate::ops::select::{plan, DeviceSelect, SelectSpec, Selection};

/// The kernels of [`Module::ShardMerge`].
pub(crate) const MERGE_ENTRIES: [&str; 5] = ["sh_pack_b32", "sh_pack_b16", "sh_write", "sh_local_len", "sh_globalize"];

/// `MergeParams` in kernels/shard/merge.cu. Field order and types must match.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct MergeParams {
    ids: u64,
    values: u64,
    c_ids: u64,
    c_vals: u64,
    c_len: u64,
    bad: u64,
    pos: u64,
    out_ids: u64,
    out_vals: u64,
    lengths: u64,
    ranks: i32,
    rows: i32,
    k: i32,
    cols: i32,
    elem: i32,
    neg_inf: i32,
    tok: Tokens,
}
// SAFETY: #[repr(C)], the layout of the kernel's MergeParams (test below; the
// kernel asserts its size).
unsafe impl KernelParams for MergeParams {}

/// One asynchronous merge of gathered candidates over caller-owned device
/// buffers (`CUdeviceptr`s of the engine's context, as for [`DeviceSelect`]).
#[derive(Debug, Clone, Copy)]
pub struct DeviceShardMerge {
    /// The global request: `rows`, `cols` (the whole row: ids must lie in
    /// `0 .. cols`), `k`, `dtype`, `nan`, `order` (the stride is not read).
    pub spec: SelectSpec,
    /// The ranks whose blocks were gathered (at least one).
    pub ranks: usize,
    /// `i32 [ranks, rows, k]`: each rank's ids, ascending, `-1` padded. A
    /// row where some block is not that form comes out as all padding (see
    /// kernels/shard/merge.cu).
    pub ids: u64,
    /// `[ranks, rows, k]` value bits of `spec.dtype`.
    pub values: u64,
    /// `i32 [rows, k]` output.
    pub out_indices: u64,
    /// Optional `[rows, k]` values output of `spec.dtype`.
    pub out_values: Option<u64>,
    /// Scratch of at least [`CudaEngine::shard_merge_workspace_bytes`]
    /// bytes, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// The `CUstream` to launch on.
    pub stream: u64,
}

/// [`DeviceShardMerge`] for `qsa_select`: the ranks' block candidates
/// merged, then expanded to token ids (or slots) as
/// [`crate::cuda::DeviceQsaSelect`] writes them.
#[derive(Debug, Clone, Copy)]
pub struct DeviceQsaShardMerge {
    /// The whole request (`blocks` = the whole row's `NB`).
    pub spec: QsaSpec,
    pub dtype: DType,
    pub ranks: usize,
    /// `i32 [ranks, rows, k_blocks]` block ids, ascending, `-1` padded.
    pub ids: u64,
    /// `[ranks, rows, k_blocks]` value bits of `dtype`.
    pub values: u64,
    /// `i32 [rows]` query positions (device values: as
    /// [`crate::cuda::DeviceQsaSelect`]).
    pub positions: u64,
    /// `i32 [rows, spec.width()]` output ids.
    pub out_ids: u64,
    /// Optional `i32 [rows]` counts.
    pub counts: Option<u64>,
    pub pages: Option<DevicePages>,
    /// Scratch of at least [`CudaEngine::qsa_shard_merge_workspace_bytes`].
    pub workspace: u64,
    pub workspace_bytes: usize,
    pub stream: u64,
}

/// Where the merge's regions lie in its workspace.
#[derive(Debug, Clone, Copy)]
struct MergePlan {
    /// The engine's request over the compacted rows.
    inner: SelectSpec,
    c_len: u64,
    bad: u64,
    c_ids: u64,
    c_vals: u64,
    pos: u64,
    engine: u64,
    engine_bytes: u64,
    total: u64,
}

impl CudaEngine {
    fn merge_plan(&self, spec: &SelectSpec, ranks: usize) -> Result<MergePlan> {
        spec.validate()?;
        if ranks == 0 {
            return Err(Error::InvalidOption { what: "rank count", value: "0".into(), expected: ">= 1" });
        }
        let (rows, k) = (spec.rows as u64, spec.k as u64);
        let rk = ranks as u128 * k as u128;
        if rk > i32::MAX as u128 || ranks > i32::MAX as usize {
            return Err(Error::too_large("ranks * k (a merged row's candidates)", rk));
        }
        let inner =
            SelectSpec::new(spec.rows, rk as usize, spec.k, spec.dtype).with_nan(spec.nan).with_order(spec.order);
        inner.validate()?;
        let elem = spec.dtype.size() as u64;
        let mut r = Regions::new();
        let c_len = r.add(rows * 4);
        let bad = r.add(rows * ranks as u64 * 4);
        let c_ids = r.add(rows * rk as u64 * 4);
        let c_vals = r.add(rows * rk as u64 * elem);
        let pos = r.add(rows * k * 4);
        let engine_bytes = self.workspace_bytes(&inner, true)? as u64;
        let engine = r.add(engine_bytes);
        Ok(MergePlan { inner, c_len, bad, c_ids, c_vals, pos, engine, engine_bytes, total: r.total() })
    }

    /// Workspace a [`DeviceShardMerge`] of this request and rank count
    /// needs, bytes.
    pub fn shard_merge_workspace_bytes(&self, spec: &SelectSpec, ranks: usize) -> Result<usize> {
        Ok(self.merge_plan(spec, ranks)?.total as usize)
    }

    /// Workspace a [`DeviceQsaShardMerge`] needs, bytes.
    pub fn qsa_shard_merge_workspace_bytes(&self, spec: &QsaSpec, dtype: DType, ranks: usize) -> Result<usize> {
        spec.validate()?;
        self.shard_merge_workspace_bytes(&spec.block_spec_of(dtype), ranks)
    }

    /// Launches the merge on `args.stream`; returns without waiting (the
    /// select engine's launch rules: a kernel launched plainly after it
    /// needs nothing).
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, and `args.stream` a stream of that context.
    pub unsafe fn shard_merge_device(&self, args: &DeviceShardMerge) -> Result<()> {
        let s = &args.spec;
        if s.rows > 0 && (args.ids == 0 || args.values == 0 || args.out_indices == 0 || args.out_values == Some(0)) {
            return Err(null_pointer());
        }
        let tok = Tokens { width: s.k as i32, ratio: 1, ..Tokens::default() };
        self.run_merge(s, args.ranks, args.ids, args.values, args.out_indices, args.out_values, tok, args)
    }

    /// Launches the QSA merge on `args.stream` (as
    /// [`CudaEngine::shard_merge_device`]).
    ///
    /// # Safety
    /// As [`CudaEngine::shard_merge_device`].
    pub unsafe fn qsa_shard_merge_device(&self, args: &DeviceQsaShardMerge) -> Result<()> {
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
        if spec.rows > 0
            && (args.ids == 0 || args.values == 0 || args.positions == 0 || args.out_ids == 0 || args.counts == Some(0))
        {
            return Err(null_pointer());
        }
        let tok = Tokens {
            positions: args.positions,
            counts: args.counts.unwrap_or(0),
            ratio: spec.ratio as i32,
            width: spec.width() as i32,
            ..Tokens::default()
        }
        .with_pages(args.pages.as_ref());
        let bspec = spec.block_spec_of(args.dtype);
        let common = DeviceShardMerge {
            spec: bspec,
            ranks: args.ranks,
            ids: args.ids,
            values: args.values,
            out_indices: args.out_ids,
            out_values: None,
            workspace: args.workspace,
            workspace_bytes: args.workspace_bytes,
            stream: args.stream,
        };
        self.run_merge(&bspec, args.ranks, args.ids, args.values, args.out_ids, None, tok, &common)
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn run_merge(
        &self,
        spec: &SelectSpec,
        ranks: usize,
        ids: u64,
        values: u64,
        out_ids: u64,
        out_values: Option<u64>,
        tok: Tokens,
        a: &DeviceShardMerge,
    ) -> Result<()> {
        let plan = self.merge_plan(spec, ranks)?;
        if (a.workspace_bytes as u64) < plan.total {
            return Err(Error::BufferSize {
                what: "workspace (bytes)",
                got: a.workspace_bytes,
                need: plan.total as usize,
            });
        }
        if !a.workspace.is_multiple_of(crate::cuda::workspace::ALIGN) {
            return Err(Error::InvalidOption {
                what: "workspace pointer",
                value: format!("{:#x}", a.workspace),
                expected: "256-byte aligned",
            });
        }
        if spec.rows == 0 {
            return Ok(());
        }
        self.context().bind_to_thread().map_err(cuda_err)?;
        let ws = a.workspace;
        let elem = spec.dtype.size();
        let neg_inf = match spec.dtype {
            DType::F32 => f32::NEG_INFINITY.to_bits() as i32,
            DType::BF16 => half::bf16::NEG_INFINITY.to_bits() as i32,
            _ => half::f16::NEG_INFINITY.to_bits() as i32,
        };
        let p = MergeParams {
            ids,
            values,
            c_ids: ws + plan.c_ids,
            c_vals: ws + plan.c_vals,
            c_len: ws + plan.c_len,
            bad: ws + plan.bad,
            pos: ws + plan.pos,
            out_ids,
            out_vals: out_values.unwrap_or(0),
            lengths: 0,
            ranks: ranks as i32,
            rows: spec.rows as i32,
            k: spec.k as i32,
            cols: spec.cols as i32,
            elem: elem as i32,
            neg_inf,
            tok,
        };
        let block = plan::BLOCK;
        let rows = spec.rows as u32;
        let on = |grid: (u32, u32)| Launch {
            grid,
            block,
            smem: 0,
            stream: a.stream,
            programmatic: false,
            cooperative: false,
            cluster: 0,
        };
        let pack = if elem == 4 { "sh_pack_b32" } else { "sh_pack_b16" };
        let pack = self.function(KernelId { module: Module::ShardMerge, global_buffer: false, entry: pack })?;
        // Grid y (the ranks) is at most 65535.
        if ranks > 65535 {
            return Err(Error::too_large("ranks (the merge's grid)", ranks as u128));
        }
        on((rows, ranks as u32)).run(&pack, &p)?;
        self.select_device(&DeviceSelect {
            spec: plan.inner,
            scores: ws + plan.c_vals,
            lengths: Some(ws + plan.c_len),
            out_indices: ws + plan.pos,
            out_values,
            workspace: ws + plan.engine,
            workspace_bytes: plan.engine_bytes as usize,
            stream: a.stream,
            starts: None,
            pages: None,
        })?;
        let write = self.function(KernelId { module: Module::ShardMerge, global_buffer: false, entry: "sh_write" })?;
        on((rows, 1)).run(&write, &p)
    }

    /// [`crate::cpu::merge_candidates`] (or, with `starts`,
    /// [`crate::cpu::merge_candidates_ranges`]) on this device: the CPU
    /// merge's checks and the GPU merge's wire form (each rank's ids
    /// ascending), then uploads, poisons the outputs and the workspace,
    /// runs on the engine's stream, downloads.
    pub fn shard_merge_host<T: ScoreElem>(
        &self,
        ids: &[i32],
        values: &[T],
        spec: &SelectSpec,
        layout: &ShardLayout,
        starts: Option<&[i32]>,
        lengths: Option<&[i32]>,
    ) -> Result<Selection<T>> {
        Ok(self.time_shard_merge(ids, values, spec, layout, starts, lengths, 0)?.0)
    }

    /// [`CudaEngine::shard_merge_host`], then `iters` timed runs of the
    /// device merge alone ([`timing::time_on_stream`]); the last run's
    /// result.
    #[allow(clippy::too_many_arguments)]
    pub fn time_shard_merge<T: ScoreElem>(
        &self,
        ids: &[i32],
        values: &[T],
        spec: &SelectSpec,
        layout: &ShardLayout,
        starts: Option<&[i32]>,
        lengths: Option<&[i32]>,
        iters: usize,
    ) -> Result<(Selection<T>, Vec<f64>)> {
        check_merge(ids, values, spec, layout, starts, lengths)?;
        check_ascending(ids, spec.rows, spec.k, layout.ranks())?;
        let d = Upload::new(self, ids, values, spec, layout.ranks(), spec.rows * spec.k, std::mem::size_of::<T>())?;
        let st = self.stream();
        let args = DeviceShardMerge {
            spec: *spec,
            ranks: layout.ranks(),
            ids: d.ids.device_ptr(st).0,
            values: d.values.device_ptr(st).0,
            out_indices: d.out_ids.device_ptr(st).0,
            out_values: Some(d.out_vals.device_ptr(st).0),
            workspace: d.workspace.device_ptr(st).0,
            workspace_bytes: d.workspace_bytes,
            stream: st.cu_stream() as u64,
        };
        d.poison(self)?;
        // SAFETY: every buffer was allocated for this request by the upload.
        let run = || unsafe { self.shard_merge_device(&args) };
        run()?;
        let times = if iters > 0 { timing::time_on_stream(st, iters, run)? } else { Vec::new() };
        let n = spec.rows * spec.k;
        let mut idx = st.clone_dtoh(&d.out_ids).map_err(cuda_err)?;
        let raw = st.clone_dtoh(&d.out_vals).map_err(cuda_err)?;
        st.synchronize().map_err(cuda_err)?;
        idx.truncate(n);
        Ok((Selection { rows: spec.rows, k: spec.k, indices: idx, values: elems_of(&raw, n) }, times))
    }

    /// [`crate::cpu::qsa_merge`] on this device from host data (the CPU's
    /// checks and the ascending wire), outputs poisoned before the run.
    pub fn qsa_shard_merge_host<T: ScoreElem>(
        &self,
        ids: &[i32],
        values: &[T],
        positions: &[i64],
        spec: &QsaSpec,
        layout: &ShardLayout,
        pages: Option<&PageMap<'_>>,
    ) -> Result<QsaSelection> {
        let visible = crate::ops::qsa::check_positions(positions, spec, T::DTYPE, pages)?;
        let ends = crate::ops::qsa::select_lengths(spec, &visible);
        let bspec = spec.block_spec_of(T::DTYPE);
        check_merge(ids, values, &bspec, layout, None, Some(&ends))?;
        check_ascending(ids, spec.rows, spec.k_blocks, layout.ranks())?;
        let width = spec.width();
        let mut d =
            Upload::new(self, ids, values, &bspec, layout.ranks(), spec.rows * width, std::mem::size_of::<T>())?;
        d.workspace_bytes = self.qsa_shard_merge_workspace_bytes(spec, T::DTYPE, layout.ranks())?;
        let st = self.stream();
        let pos: Vec<i32> = positions.iter().map(|&t| t as i32).collect();
        let dpos = st.clone_htod(&pos[..]).map_err(cuda_err)?;
        let counts: CudaSlice<i32> = st.alloc_zeros(spec.rows.max(1)).map_err(cuda_err)?;
        let dpages = pages.map(|p| PagesCopy::upload(self, p)).transpose()?;
        let args = DeviceQsaShardMerge {
            spec: *spec,
            dtype: T::DTYPE,
            ranks: layout.ranks(),
            ids: d.ids.device_ptr(st).0,
            values: d.values.device_ptr(st).0,
            positions: dpos.device_ptr(st).0,
            out_ids: d.out_ids.device_ptr(st).0,
            counts: Some(counts.device_ptr(st).0),
            pages: dpages.as_ref().map(|p| p.pages(self)),
            workspace: d.workspace.device_ptr(st).0,
            workspace_bytes: d.workspace_bytes,
            stream: st.cu_stream() as u64,
        };
        d.poison(self)?;
        // SAFETY: buffers sized for the request above.
        unsafe {
            launch::poison(counts.device_ptr(st).0, 0x5a, counts.len() * 4, st.cu_stream())?;
            self.qsa_shard_merge_device(&args)?;
        }
        let mut ids = st.clone_dtoh(&d.out_ids).map_err(cuda_err)?;
        let mut counts = st.clone_dtoh(&counts).map_err(cuda_err)?;
        st.synchronize().map_err(cuda_err)?;
        ids.truncate(spec.rows * width);
        counts.truncate(spec.rows);
        Ok(QsaSelection { rows: spec.rows, width, ids, counts })
    }
}

fn null_pointer() -> Error {
    Error::InvalidOption { what: "shard merge buffers", value: "a null pointer".into(), expected: "device pointers" }
}

/// Device copies of one host merge.
struct Upload {
    ids: CudaSlice<i32>,
    values: CudaSlice<u8>,
    out_ids: CudaSlice<i32>,
    out_vals: CudaSlice<u8>,
    workspace: CudaSlice<u8>,
    workspace_bytes: usize,
}

impl Upload {
    fn new<T: ScoreElem>(
        e: &CudaEngine,
        ids: &[i32],
        values: &[T],
        spec: &SelectSpec,
        ranks: usize,
        out_ids: usize,
        elem: usize,
    ) -> Result<Self> {
        let st = e.stream();
        let bytes = bytes_of(values);
        let wb = e.shard_merge_workspace_bytes(spec, ranks)?;
        Ok(Self {
            ids: st.clone_htod(if ids.is_empty() { &[-1][..] } else { ids }).map_err(cuda_err)?,
            values: st.clone_htod(if bytes.is_empty() { &[0u8; 4][..] } else { bytes }).map_err(cuda_err)?,
            out_ids: st.alloc_zeros(out_ids.max(1)).map_err(cuda_err)?,
            out_vals: st.alloc_zeros((spec.rows * spec.k).max(1) * elem).map_err(cuda_err)?,
            workspace: st.alloc_zeros(wb.max(256)).map_err(cuda_err)?,
            workspace_bytes: wb,
        })
    }

    fn poison(&self, e: &CudaEngine) -> Result<()> {
        let st = e.stream();
        let s = st.cu_stream();
        // SAFETY: sizes are the allocations' own.
        unsafe {
            launch::poison(self.out_ids.device_ptr(st).0, 0x5a, self.out_ids.len() * 4, s)?;
            launch::poison(self.out_vals.device_ptr(st).0, 0x7f, self.out_vals.len(), s)?;
            launch::poison(self.workspace.device_ptr(st).0, 0xa5, self.workspace.len(), s)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{MergeParams, MERGE_ENTRIES};
    use crate::cuda::compile::Module;

    /// The kernel asserts the same size (static_assert).
    #[test]
    fn parameter_block_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<MergeParams>(), 168);
        assert_eq!(std::mem::offset_of!(MergeParams, ranks), 80);
        assert_eq!(std::mem::offset_of!(MergeParams, neg_inf), 100);
        assert_eq!(std::mem::offset_of!(MergeParams, tok), 104);
        assert_eq!(Module::ShardMerge.entry_points(), &MERGE_ENTRIES);
    }
}
