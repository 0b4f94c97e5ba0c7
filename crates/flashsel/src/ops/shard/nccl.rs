//! The distributed selection over NCCL: each rank's local step, the
//! all-gather of the wire, and the device merge, on the caller's stream.
//!
//! [`NcclGroup`] is one rank of an NCCL communicator (libnccl loaded at run
//! time, as the driver is: nothing links against it). On it,
//! [`CudaEngine::shard_topk_device`] and [`CudaEngine::shard_qsa_select_device`]
//! give every rank the bytes one device returns on the whole rows
//! ([`super`]'s contract), in launches and NCCL calls on one stream: no
//! host synchronisation, no allocation (the caller's workspace), so a CUDA
//! graph can capture them.
//!
//! 1. `sh_local_len` (kernels/shard/merge.cu): each row's candidates
//!    clipped to the rank's shard (topk: the global lengths; QSA: `0 .. V`
//!    for the rows with `V > k_blocks`, none for the others).
//! 2. The select engine over the rank's shard, in index order
//!    ([`CudaEngine::select_device`]); `sh_globalize` makes its ids global.
//! 3. `ncclAllGather` of the ids and of the value bits (one NCCL group):
//!    `[ranks, rows, k]` each, rank-major.
//! 4. The device merge ([`CudaEngine::shard_merge_device`],
//!    [`CudaEngine::qsa_shard_merge_device`]).
//!
//! Every rank must call with the same request and its own shard; the
//! shards, in rank order, must tile the row (the merge pads a row whose
//! wire breaks that, see kernels/shard/merge.cu).
//!
//! Run on one H200 at world size 1 (`tests/nccl.rs`, ignored without NCCL
//! and a GPU); the multi-GPU test waits for a machine with two or more.

use cudarc::driver::{CudaSlice, DevicePtr};
use cudarc::nccl::{result as nccl, sys as nccl_sys};

use super::device::{DeviceQsaShardMerge, DeviceShardMerge};
use crate::contract::error::{cuda_err, CudaError};
use crate::contract::{DType, Error, Result, ScoreElem};
use crate::cuda::compile::Module;
use crate::cuda::host::{bytes_of, elems_of};
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::workspace::{Regions, ALIGN};
use crate::cuda::{CudaEngine, KernelId};
use crate::ops::pages::PageMap;
use crate::ops::qsa::{QsaSelection, QsaSpec};
use crate::ops::select::device::{DevicePages, PagesCopy};
use crate::ops::select::{plan, DeviceSelect, OutputOrder, SelectSpec, Selection};

/// `LocalParams` in kernels/shard/merge.cu. Field order and types must match.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LocalParams {
    lengths: u64,
    positions: u64,
    local_len: u64,
    ids: u64,
    rows: i32,
    k: i32,
    offset: i32,
    shard_cols: i32,
    cols: i32,
    ratio: i32,
    k_blocks: i32,
    pad: i32,
}
// SAFETY: #[repr(C)], the layout of the kernel's LocalParams (test below; the
// kernel asserts its size).
unsafe impl KernelParams for LocalParams {}

fn nccl_err(call: &str, e: nccl::NcclError) -> Error {
    Error::Cuda(CudaError::Nccl { call: call.into(), name: format!("{:?}", e.0) })
}

/// Why NCCL cannot be used here, or `Ok` when libnccl loads.
pub fn nccl_availability() -> std::result::Result<(), String> {
    // SAFETY: only probes dlopen.
    if unsafe { nccl_sys::is_culib_present() } {
        Ok(())
    } else {
        Err("no NCCL: libnccl.so was not found by the dynamic loader".into())
    }
}

/// An NCCL unique id: made once (by one rank, [`NcclId::new`]) and handed
/// to every rank out of band (its 128 bytes), as NCCL requires.
#[derive(Clone, Copy)]
pub struct NcclId(nccl_sys::ncclUniqueId);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`).
    pub fn new() -> Result<Self> {
        nccl_availability().map_err(Error::BackendUnavailable)?;
        nccl::get_uniqueid().map(Self).map_err(|e| nccl_err("ncclGetUniqueId", e))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id another rank sent.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        Self(nccl_sys::ncclUniqueId { internal: bytes.map(|b| b as _) })
    }
}

/// One rank of an NCCL communicator, on one [`CudaEngine`]'s device.
#[derive(Debug)]
pub struct NcclGroup {
    comm: nccl_sys::ncclComm_t,
    rank: usize,
    ranks: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a
// time (&self methods only enqueue work on the caller's stream).
unsafe impl Send for NcclGroup {}

impl NcclGroup {
    /// Joins the communicator of `ranks` ranks named by `id` as `rank`, on
    /// `engine`'s device (`ncclCommInitRank`: every rank must call it; it
    /// returns once all have joined).
    pub fn new(engine: &CudaEngine, id: &NcclId, rank: usize, ranks: usize) -> Result<Self> {
        nccl_availability().map_err(Error::BackendUnavailable)?;
        if ranks == 0 || rank >= ranks || ranks > i32::MAX as usize {
            return Err(Error::InvalidOption {
                what: "NCCL rank",
                value: format!("rank {rank} of {ranks}"),
                expected: "0 <= rank < ranks",
            });
        }
        engine.context().bind_to_thread().map_err(cuda_err)?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL before it is read.
        let comm = unsafe {
            nccl::comm_init_rank(comm.as_mut_ptr(), ranks as i32, id.0, rank as i32)
                .map_err(|e| nccl_err("ncclCommInitRank", e))?;
            comm.assume_init()
        };
        Ok(Self { comm, rank, ranks })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The communicator's ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Enqueues the all-gathers of `parts` (each `(send, recv, bytes)`:
    /// every rank's `bytes` at `send`, gathered in rank order into `recv`,
    /// `ranks * bytes`) as one NCCL group on `stream`.
    ///
    /// # Safety
    /// The buffers must be device allocations of the stated sizes on this
    /// communicator's device, and `stream` a stream of its context.
    pub unsafe fn all_gather_bytes(&self, parts: &[(u64, u64, usize)], stream: u64) -> Result<()> {
        nccl::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut first_err = None;
        for &(send, recv, bytes) in parts {
            let r = nccl::all_gather(
                send as *const _,
                recv as *mut _,
                bytes,
                nccl_sys::ncclDataType_t::ncclUint8,
                self.comm,
                stream as nccl_sys::cudaStream_t,
            );
            if let (Err(e), None) = (r, &first_err) {
                first_err = Some(nccl_err("ncclAllGather", e));
            }
        }
        // The group is closed whatever happened inside it.
        nccl::group_end().map_err(|e| nccl_err("ncclGroupEnd", e))?;
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        // SAFETY: the communicator is ours and not used after this.
        let _ = unsafe { nccl::comm_destroy(self.comm) };
    }
}

/// A rank's part of the distributed `topk` over caller-owned device
/// buffers of the engine's context.
#[derive(Debug, Clone, Copy)]
pub struct DeviceShardTopk {
    /// The whole request: `rows`, `cols` (the whole row), `k`, `dtype`,
    /// `nan`, `order` (its `row_stride` is not read).
    pub spec: SelectSpec,
    /// This rank's first global column and its column count.
    pub offset: usize,
    pub shard_cols: usize,
    /// `[rows, shard_cols]` scores of `spec.dtype`, row `r` at `scores + r *
    /// shard_stride * size` (`shard_stride >= shard_cols`).
    pub scores: u64,
    pub shard_stride: usize,
    /// Optional `i32 [rows]` global lengths (row `i`'s candidates are its
    /// global columns `0 .. lengths[i]`; outside `0 ..= cols`: padding).
    pub lengths: Option<u64>,
    /// `i32 [rows, k]` output indices, and optionally the values.
    pub out_indices: u64,
    pub out_values: Option<u64>,
    /// Scratch of at least [`CudaEngine::shard_topk_workspace_bytes`]
    /// bytes, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    pub stream: u64,
}

/// A rank's part of the distributed `qsa_select`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceShardQsaSelect {
    /// The whole request (`blocks` = the whole row's `NB`).
    pub spec: QsaSpec,
    pub dtype: DType,
    /// This rank's first global block and its block count.
    pub offset: usize,
    pub shard_blocks: usize,
    /// `[rows, shard_blocks]` block scores of `dtype`, rows contiguous.
    pub scores: u64,
    /// `i32 [rows]` query positions.
    pub positions: u64,
    /// `i32 [rows, spec.width()]` output ids, optional `i32 [rows]` counts,
    /// optional page table (slots).
    pub out_ids: u64,
    pub counts: Option<u64>,
    pub pages: Option<DevicePages>,
    /// Scratch of at least [`CudaEngine::shard_qsa_select_workspace_bytes`].
    pub workspace: u64,
    pub workspace_bytes: usize,
    pub stream: u64,
}

/// Where a rank's regions lie in its workspace.
struct LocalPlan {
    /// The rank's select over its shard.
    local: SelectSpec,
    local_len: u64,
    ids: u64,
    vals: u64,
    all_ids: u64,
    all_vals: u64,
    /// The select's, then the merge's scratch (stream-ordered: one region).
    scratch: u64,
    scratch_bytes: u64,
    total: u64,
}

impl CudaEngine {
    /// `whole`: the request on the whole rows (its stride is not read);
    /// the rank's shard is `shard_cols` columns a row, `stride` apart.
    fn local_plan(&self, whole: &SelectSpec, shard_cols: usize, stride: usize, ranks: usize) -> Result<LocalPlan> {
        let whole = whole.with_stride(whole.cols);
        whole.validate()?;
        if ranks == 0 {
            return Err(Error::InvalidOption { what: "rank count", value: "0".into(), expected: ">= 1" });
        }
        let local = SelectSpec::new(whole.rows, shard_cols, whole.k, whole.dtype)
            .with_nan(whole.nan)
            .with_order(OutputOrder::Index)
            .with_stride(stride);
        local.validate()?;
        let (rows, k, elem) = (whole.rows as u64, whole.k as u64, whole.dtype.size() as u64);
        let mut r = Regions::new();
        let local_len = r.add(rows * 4);
        let ids = r.add(rows * k * 4);
        let vals = r.add(rows * k * elem);
        let all_ids = r.add(ranks as u64 * rows * k * 4);
        let all_vals = r.add(ranks as u64 * rows * k * elem);
        let select = self.workspace_bytes(&local, true)? as u64;
        let merge = self.shard_merge_workspace_bytes(&whole, ranks)? as u64;
        let scratch_bytes = select.max(merge);
        let scratch = r.add(scratch_bytes);
        Ok(LocalPlan { local, local_len, ids, vals, all_ids, all_vals, scratch, scratch_bytes, total: r.total() })
    }

    /// Workspace a [`DeviceShardTopk`] needs on a group of `ranks`, bytes
    /// (`spec`, `shard_cols` and `shard_stride` as there).
    pub fn shard_topk_workspace_bytes(
        &self,
        spec: &SelectSpec,
        shard_cols: usize,
        shard_stride: usize,
        ranks: usize,
    ) -> Result<usize> {
        Ok(self.local_plan(spec, shard_cols, shard_stride, ranks)?.total as usize)
    }

    /// Workspace a [`DeviceShardQsaSelect`] needs on a group of `ranks`.
    pub fn shard_qsa_select_workspace_bytes(
        &self,
        spec: &QsaSpec,
        dtype: DType,
        shard_blocks: usize,
        ranks: usize,
    ) -> Result<usize> {
        spec.validate()?;
        Ok(self.local_plan(&spec.block_spec_of(dtype), shard_blocks, shard_blocks, ranks)?.total as usize)
    }

    /// The distributed `topk` of this rank (see the module): every rank
    /// ends with the whole rows' selection. Enqueued on `args.stream`;
    /// returns without waiting.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, `args.stream` a stream of it, and `group` a
    /// communicator on this device.
    pub unsafe fn shard_topk_device(&self, group: &NcclGroup, args: &DeviceShardTopk) -> Result<()> {
        let s = args.spec.with_stride(args.spec.cols);
        let p = self.local_plan(&s, args.shard_cols, args.shard_stride, group.ranks())?;
        let Some((all_ids, all_vals, scratch)) = self.local_step(group, &p, args, None)? else { return Ok(()) };
        self.shard_merge_device(&DeviceShardMerge {
            spec: s,
            ranks: group.ranks(),
            ids: all_ids,
            values: all_vals,
            out_indices: args.out_indices,
            out_values: args.out_values,
            workspace: scratch,
            workspace_bytes: p.scratch_bytes as usize,
            stream: args.stream,
        })
    }

    /// The distributed `qsa_select` of this rank (see the module).
    ///
    /// # Safety
    /// As [`CudaEngine::shard_topk_device`].
    pub unsafe fn shard_qsa_select_device(&self, group: &NcclGroup, args: &DeviceShardQsaSelect) -> Result<()> {
        let spec = &args.spec;
        spec.validate()?;
        let whole = spec.block_spec_of(args.dtype);
        let p = self.local_plan(&whole, args.shard_blocks, args.shard_blocks, group.ranks())?;
        if spec.rows > 0 && args.positions == 0 {
            return Err(null_pointer());
        }
        let topk = DeviceShardTopk {
            spec: whole,
            offset: args.offset,
            shard_cols: args.shard_blocks,
            scores: args.scores,
            shard_stride: args.shard_blocks,
            lengths: None,
            out_indices: args.out_ids,
            out_values: None,
            workspace: args.workspace,
            workspace_bytes: args.workspace_bytes,
            stream: args.stream,
        };
        let qsa = Some((args.positions, spec.ratio, spec.k_blocks));
        let Some((all_ids, all_vals, scratch)) = self.local_step(group, &p, &topk, qsa)? else { return Ok(()) };
        self.qsa_shard_merge_device(&DeviceQsaShardMerge {
            spec: *spec,
            dtype: args.dtype,
            ranks: group.ranks(),
            ids: all_ids,
            values: all_vals,
            positions: args.positions,
            out_ids: args.out_ids,
            counts: args.counts,
            pages: args.pages,
            workspace: scratch,
            workspace_bytes: p.scratch_bytes as usize,
            stream: args.stream,
        })
    }

    /// Steps 1-3 of the module: the rank's clipped lengths (from the global
    /// lengths, or for QSA from `(positions, ratio, k_blocks)`), its select
    /// in index order, global ids, the all-gather. Returns the gathered ids
    /// and values and the scratch region, or None when there are no rows.
    unsafe fn local_step(
        &self,
        group: &NcclGroup,
        p: &LocalPlan,
        a: &DeviceShardTopk,
        qsa: Option<(u64, usize, usize)>,
    ) -> Result<Option<(u64, u64, u64)>> {
        let s = &a.spec;
        let (ws, ws_bytes, offset) = (a.workspace, a.workspace_bytes, a.offset);
        if (ws_bytes as u64) < p.total {
            return Err(Error::BufferSize { what: "workspace (bytes)", got: ws_bytes, need: p.total as usize });
        }
        if !ws.is_multiple_of(ALIGN) {
            return Err(Error::InvalidOption {
                what: "workspace pointer",
                value: format!("{ws:#x}"),
                expected: "256-byte aligned",
            });
        }
        let end = offset as u128 + a.shard_cols as u128;
        if end > s.cols as u128 {
            return Err(Error::InvalidOption {
                what: "shard",
                value: format!("columns {offset} .. {end}"),
                expected: "inside the whole row's columns",
            });
        }
        if s.rows == 0 {
            return Ok(None);
        }
        if a.out_indices == 0 || a.out_values == Some(0) || (a.shard_cols > 0 && a.scores == 0) {
            return Err(null_pointer());
        }
        self.context().bind_to_thread().map_err(cuda_err)?;
        let (positions, ratio, k_blocks) = qsa.unwrap_or((0, 1, 0));
        let lp = LocalParams {
            lengths: a.lengths.unwrap_or(0),
            positions,
            local_len: ws + p.local_len,
            ids: ws + p.ids,
            rows: s.rows as i32,
            k: s.k as i32,
            offset: offset as i32,
            shard_cols: a.shard_cols as i32,
            cols: s.cols as i32,
            ratio: ratio as i32,
            k_blocks: k_blocks.min(i32::MAX as usize) as i32,
            pad: 0,
        };
        let block = plan::BLOCK;
        let launch = |n: u64| Launch {
            grid: (n.div_ceil(block as u64) as u32, 1),
            block,
            smem: 0,
            stream: a.stream,
            programmatic: false,
            cooperative: false,
            cluster: 0,
        };
        let clipped = a.lengths.is_some() || qsa.is_some();
        if clipped {
            let f =
                self.function(KernelId { module: Module::ShardMerge, global_buffer: false, entry: "sh_local_len" })?;
            launch(s.rows as u64).run(&f, &lp)?;
        }
        if a.shard_cols > 0 {
            self.select_device(&DeviceSelect {
                spec: p.local,
                scores: a.scores,
                lengths: clipped.then_some(ws + p.local_len),
                out_indices: ws + p.ids,
                out_values: Some(ws + p.vals),
                workspace: ws + p.scratch,
                workspace_bytes: p.scratch_bytes as usize,
                stream: a.stream,
                starts: None,
                pages: None,
            })?;
        }
        let entries = s.rows as u64 * s.k as u64;
        let f = self.function(KernelId { module: Module::ShardMerge, global_buffer: false, entry: "sh_globalize" })?;
        launch(entries).run(&f, &lp)?;
        let elem = s.dtype.size();
        group.all_gather_bytes(
            &[
                (ws + p.ids, ws + p.all_ids, entries as usize * 4),
                (ws + p.vals, ws + p.all_vals, entries as usize * elem),
            ],
            a.stream,
        )?;
        Ok(Some((ws + p.all_ids, ws + p.all_vals, ws + p.scratch)))
    }
}

impl CudaEngine {
    /// [`CudaEngine::shard_topk_device`] from host data: this rank's dense
    /// `[rows, shard_cols]` shard and the global lengths, uploaded; outputs
    /// and workspace poisoned; one run on the engine's stream; downloaded.
    pub fn shard_topk_host<T: ScoreElem>(
        &self,
        group: &NcclGroup,
        shard: &[T],
        spec: &SelectSpec,
        offset: usize,
        shard_cols: usize,
        lengths: Option<&[i32]>,
    ) -> Result<Selection<T>> {
        let whole = spec.with_stride(spec.cols);
        whole.validate()?;
        if shard.len() != whole.rows * shard_cols {
            return Err(Error::BufferSize { what: "shard", got: shard.len(), need: whole.rows * shard_cols });
        }
        if let Some(l) = lengths {
            whole.validate_lengths(l)?;
        }
        let st = self.stream();
        let elem = std::mem::size_of::<T>();
        let bytes = bytes_of(shard);
        let d_scores = st.clone_htod(if bytes.is_empty() { &[0u8; 4][..] } else { bytes }).map_err(cuda_err)?;
        let d_len =
            lengths.map(|l| st.clone_htod(if l.is_empty() { &[0][..] } else { l })).transpose().map_err(cuda_err)?;
        let n = (whole.rows * whole.k).max(1);
        let out_ids: CudaSlice<i32> = st.alloc_zeros(n).map_err(cuda_err)?;
        let out_vals: CudaSlice<u8> = st.alloc_zeros(n * elem).map_err(cuda_err)?;
        let wb = self.shard_topk_workspace_bytes(&whole, shard_cols, shard_cols, group.ranks())?;
        let ws: CudaSlice<u8> = st.alloc_zeros(wb.max(256)).map_err(cuda_err)?;
        let args = DeviceShardTopk {
            spec: whole,
            offset,
            shard_cols,
            scores: d_scores.device_ptr(st).0,
            shard_stride: shard_cols,
            lengths: d_len.as_ref().map(|l| l.device_ptr(st).0),
            out_indices: out_ids.device_ptr(st).0,
            out_values: Some(out_vals.device_ptr(st).0),
            workspace: ws.device_ptr(st).0,
            workspace_bytes: wb,
            stream: st.cu_stream() as u64,
        };
        // SAFETY: every buffer was allocated for this request above.
        unsafe {
            launch::poison(args.out_indices, 0x5a, n * 4, st.cu_stream())?;
            launch::poison(args.out_values.unwrap_or(0), 0x7f, n * elem, st.cu_stream())?;
            launch::poison(args.workspace, 0xa5, ws.len(), st.cu_stream())?;
            self.shard_topk_device(group, &args)?;
        }
        let mut indices = st.clone_dtoh(&out_ids).map_err(cuda_err)?;
        let raw = st.clone_dtoh(&out_vals).map_err(cuda_err)?;
        st.synchronize().map_err(cuda_err)?;
        let m = whole.rows * whole.k;
        indices.truncate(m);
        Ok(Selection { rows: whole.rows, k: whole.k, indices, values: elems_of(&raw, m) })
    }

    /// [`CudaEngine::shard_qsa_select_device`] from host data (this rank's
    /// dense `[rows, shard_blocks]` block scores), as
    /// [`CudaEngine::shard_topk_host`].
    #[allow(clippy::too_many_arguments)]
    pub fn shard_qsa_select_host<T: ScoreElem>(
        &self,
        group: &NcclGroup,
        shard: &[T],
        positions: &[i64],
        spec: &QsaSpec,
        offset: usize,
        shard_blocks: usize,
        pages: Option<&PageMap<'_>>,
    ) -> Result<QsaSelection> {
        spec.validate()?;
        if shard.len() != spec.rows * shard_blocks {
            return Err(Error::BufferSize { what: "shard", got: shard.len(), need: spec.rows * shard_blocks });
        }
        if positions.len() != spec.rows {
            return Err(Error::LengthsCount { got: positions.len(), rows: spec.rows });
        }
        let st = self.stream();
        let bytes = bytes_of(shard);
        let d_scores = st.clone_htod(if bytes.is_empty() { &[0u8; 4][..] } else { bytes }).map_err(cuda_err)?;
        let pos: Vec<i32> = positions.iter().map(|&t| t.clamp(-1, i32::MAX as i64) as i32).collect();
        let d_pos = st.clone_htod(if pos.is_empty() { &[0][..] } else { &pos[..] }).map_err(cuda_err)?;
        let width = spec.width();
        let out_ids: CudaSlice<i32> = st.alloc_zeros((spec.rows * width).max(1)).map_err(cuda_err)?;
        let counts: CudaSlice<i32> = st.alloc_zeros(spec.rows.max(1)).map_err(cuda_err)?;
        let d_pages = pages.map(|p| PagesCopy::upload(self, p)).transpose()?;
        let wb = self.shard_qsa_select_workspace_bytes(spec, T::DTYPE, shard_blocks, group.ranks())?;
        let ws: CudaSlice<u8> = st.alloc_zeros(wb.max(256)).map_err(cuda_err)?;
        let args = DeviceShardQsaSelect {
            spec: *spec,
            dtype: T::DTYPE,
            offset,
            shard_blocks,
            scores: d_scores.device_ptr(st).0,
            positions: d_pos.device_ptr(st).0,
            out_ids: out_ids.device_ptr(st).0,
            counts: Some(counts.device_ptr(st).0),
            pages: d_pages.as_ref().map(|p| p.pages(self)),
            workspace: ws.device_ptr(st).0,
            workspace_bytes: wb,
            stream: st.cu_stream() as u64,
        };
        // SAFETY: every buffer was allocated for this request above.
        unsafe {
            launch::poison(args.out_ids, 0x5a, out_ids.len() * 4, st.cu_stream())?;
            launch::poison(counts.device_ptr(st).0, 0x5a, counts.len() * 4, st.cu_stream())?;
            launch::poison(args.workspace, 0xa5, ws.len(), st.cu_stream())?;
            self.shard_qsa_select_device(group, &args)?;
        }
        let mut ids = st.clone_dtoh(&out_ids).map_err(cuda_err)?;
        let mut counts = st.clone_dtoh(&counts).map_err(cuda_err)?;
        st.synchronize().map_err(cuda_err)?;
        ids.truncate(spec.rows * width);
        counts.truncate(spec.rows);
        Ok(QsaSelection { rows: spec.rows, width, ids, counts })
    }
}

fn null_pointer() -> Error {
    Error::InvalidOption {
        what: "distributed select buffers",
        value: "a null pointer".into(),
        expected: "device pointers for the scores, positions and outputs",
    }
}

#[cfg(test)]
mod tests {
    use super::LocalParams;

    #[test]
    fn params_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<LocalParams>(), 64);
        assert_eq!(std::mem::offset_of!(LocalParams, rows), 32);
        assert_eq!(std::mem::offset_of!(LocalParams, k_blocks), 56);
    }
}
