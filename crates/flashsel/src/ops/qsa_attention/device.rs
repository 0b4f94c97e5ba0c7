//! QSA sparse attention on the CUDA engine
//! (kernels/attention/sparse_qsa.cu): the contract of [`super`] over device
//! pointers, on the caller's stream.
//!
//! # The path (a function of the dtypes and `d` only)
//! bf16 q with bf16 K / V at `d` 128 or 256 runs on the tensor-core kernels
//! (`qsa_attn_tc_fwd_d*`, kernels/attention/sparse_qsa_tc.cuh: mma.sync bf16
//! with f32 accumulation, 16 heads a CTA); everything else (an f32 side, or
//! `d` 64) on the f32 kernels (`qsa_attn_fwd_*`, 8 heads a CTA).
//! [`QsaAttnPath::of`].
//!
//! # The plan (a function of the shapes and the path only)
//! One CTA per (query row, KV head, group of [`QsaAttnPlan::heads_per_cta`]
//! of its query heads, KV split). When the rows' CTAs fall short of
//! [`crate::ops::mla::device::TARGET_CTAS`], each row's `width` positions
//! are cut into up to [`crate::ops::mla::device::MAX_SPLITS`] chunks of
//! whole tiles, every chunk a CTA of its own that writes its unnormalised
//! softmax state to the workspace, and `qsa_attn_combine_*` merges the
//! chunks in a fixed order: sparse MLA's split rule
//! ([`MlaPlan::new`]), over this operation's CTAs. The split never looks at
//! the device or the data (not even the lengths), so a request's bytes are
//! the same on every GPU, and a derived length gives the bits of the same
//! length passed explicitly.

use cudarc::driver::CudaSlice;

use super::{check_request, AttnElem, QsaAttention, QsaAttentionOutput};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Error, Result};
use crate::cuda::compile::Module;
use crate::cuda::host::{alloc, bytes_of, elems_of, ptr, upload, widen_f32};
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::{timing, CudaEngine, KernelId};
use crate::ops::mla::device::{null, to_i32, to_i64, MlaPlan, TILE};

/// Every kernel of the module: the one-pass kernels by (q format, k / v
/// format), then the combines by output format.
pub(crate) const QSA_ATTN_ENTRIES: [&str; 8] = [
    "qsa_attn_fwd_qf32_kvf32",
    "qsa_attn_fwd_qf32_kvbf16",
    "qsa_attn_fwd_qbf16_kvf32",
    "qsa_attn_fwd_qbf16_kvbf16",
    "qsa_attn_combine_f32",
    "qsa_attn_combine_bf16",
    "qsa_attn_tc_fwd_d128",
    "qsa_attn_tc_fwd_d256",
];

/// Query heads one CTA of the f32 kernel computes (its `HG`).
pub const HEADS_PER_CTA: usize = 8;
/// Query heads one CTA of the tensor-core kernel computes (one m16 tile).
pub const TC_HEADS_PER_CTA: usize = 16;

/// Which forward kernel family a request runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QsaAttnPath {
    /// `qsa_attn_fwd_*`: f32 arithmetic on CUDA cores, 8 heads a CTA.
    F32,
    /// `qsa_attn_tc_fwd_d*`: mma.sync bf16 (f32 accumulation), 16 heads a CTA.
    TensorCore,
}

impl QsaAttnPath {
    /// bf16 q and K / V at `d` 128 or 256 on tensor cores; the rest in f32.
    pub fn of(spec: &QsaAttention) -> Self {
        if spec.q_dtype == DType::BF16 && spec.kv_dtype == DType::BF16 && matches!(spec.d, 128 | 256) {
            QsaAttnPath::TensorCore
        } else {
            QsaAttnPath::F32
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            QsaAttnPath::F32 => "f32",
            QsaAttnPath::TensorCore => "tensor-core",
        }
    }
}
/// Threads per CTA.
const BLOCK: u32 = 256;

/// How a request runs: the kernel family, CTAs per row across the heads and
/// the KV split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QsaAttnPlan {
    pub path: QsaAttnPath,
    /// Heads a CTA: 8 (f32) or 16 (tensor cores).
    pub heads_per_cta: usize,
    /// CTAs per KV head: `ceil((h_q / h_kv) / heads_per_cta)`.
    pub per_kv_head: usize,
    /// CTAs per row across the heads: `h_kv * per_kv_head`.
    pub groups: usize,
    /// Chunks of each row's positions (1: no split, no combine).
    pub splits: usize,
    /// Positions per chunk (a multiple of the 32-entry tile).
    pub chunk: usize,
}

impl QsaAttnPlan {
    /// The plan of `spec` (its path, rows, heads and width).
    pub fn new(spec: &QsaAttention) -> Self {
        let path = QsaAttnPath::of(spec);
        let heads_per_cta = if path == QsaAttnPath::TensorCore { TC_HEADS_PER_CTA } else { HEADS_PER_CTA };
        let per_kv_head = spec.group().div_ceil(heads_per_cta).max(1);
        let groups = spec.h_kv * per_kv_head;
        // Sparse MLA's split rule over `groups` CTAs a row: its 8-head plan
        // of `groups * 8` heads has exactly `groups` CTAs a row.
        let m = MlaPlan::new(spec.rows, groups * HEADS_PER_CTA, spec.width);
        Self { path, heads_per_cta, per_kv_head, groups, splits: m.splits, chunk: m.chunk }
    }
    /// The one-pass kernel of this plan for `spec`'s dtypes and `d`.
    pub fn entry(&self, spec: &QsaAttention) -> Result<&'static str> {
        match (self.path, spec.d) {
            (QsaAttnPath::F32, _) => forward_entry(spec.q_dtype, spec.kv_dtype),
            (QsaAttnPath::TensorCore, 128) => Ok("qsa_attn_tc_fwd_d128"),
            (QsaAttnPath::TensorCore, 256) => Ok("qsa_attn_tc_fwd_d256"),
            (QsaAttnPath::TensorCore, d) => {
                Err(Error::Shape(format!("the tensor-core QSA attention takes d 128 or 256, not {d}")))
            }
        }
    }
    /// Dynamic shared memory of the one-pass kernel at `d`, bytes.
    pub fn smem_bytes(&self, d: usize) -> usize {
        match self.path {
            QsaAttnPath::F32 => smem_bytes(d),
            QsaAttnPath::TensorCore => tc_smem_bytes(d),
        }
    }
    /// Whether the positions are split (and combined).
    pub fn split(&self) -> bool {
        self.splits > 1
    }
    /// CTAs of the one-pass launch.
    pub fn ctas(&self, rows: usize) -> usize {
        rows * self.groups * self.splits
    }
    /// Workspace bytes: the splits' partial states (f32 `O [rows][h_q][splits][d]`
    /// then `(m, sum) [rows][h_q][splits]`), 0 without a split.
    pub fn workspace_bytes(&self, spec: &QsaAttention) -> usize {
        if !self.split() {
            return 0;
        }
        spec.rows * spec.h_q * self.splits * (spec.d + 2) * 4
    }
}

/// Dynamic shared memory of the one-pass kernel at head width `d` (bytes):
/// q, one tile of keys and one of values as f32, logits, probabilities, the
/// head states, the tile's offsets.
pub fn smem_bytes(d: usize) -> usize {
    ((HEADS_PER_CTA + 2 * TILE) * d + 2 * HEADS_PER_CTA * TILE + 32) * 4 + TILE * 8
}

/// Dynamic shared memory of the tensor-core kernel at head width `d`
/// (bytes): q (16 rows), one tile of keys and one of values as bf16 rows of
/// `d + 8`, the eight warps' partial logits (f32, 16 x 40 each), P as two
/// bf16 planes of 16 x 40, the head states, the tile's offsets (the
/// kernel's `QtShape::SMEM`).
pub fn tc_smem_bytes(d: usize) -> usize {
    let ld = d + 8;
    TC_HEADS_PER_CTA * ld * 2
        + 2 * TILE * ld * 2
        + 8 * TC_HEADS_PER_CTA * 40 * 4
        + 2 * TC_HEADS_PER_CTA * 40 * 2
        + 3 * TC_HEADS_PER_CTA * 4
        + TILE * 8
}

/// `QsaAttnParams` in kernels/attention/sparse_qsa.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct QsaAttnParams {
    q: u64,
    k: u64,
    v: u64,
    indices: u64,
    lengths: u64,
    out: u64,
    lse: u64,
    ws: u64,
    bound: i64,
    page_size: i64,
    page_stride: i64,
    token_stride: i64,
    rows: i32,
    h_q: i32,
    d: i32,
    width: i32,
    group: i32,
    gpk: i32,
    groups: i32,
    splits: i32,
    chunk: i32,
    scale: f32,
}
// SAFETY: #[repr(C)], the layout of the kernel's QsaAttnParams (test below;
// the kernel asserts its size).
unsafe impl KernelParams for QsaAttnParams {}

fn fmt_code(what: &str, dtype: DType) -> Result<usize> {
    match dtype {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        other => Err(Error::UnknownDType(format!("qsa_attention takes f32 or bf16 {what}, not {other}"))),
    }
}

/// The one-pass kernel of q of `q` over k / v of `kv`.
pub fn forward_entry(q: DType, kv: DType) -> Result<&'static str> {
    Ok(QSA_ATTN_ENTRIES[fmt_code("q", q)? * 2 + fmt_code("k / v", kv)?])
}

fn combine_entry(q: DType) -> Result<&'static str> {
    Ok(QSA_ATTN_ENTRIES[4 + fmt_code("q", q)?])
}

/// One asynchronous QSA sparse attention over caller-owned device buffers
/// (`CUdeviceptr`s of the engine's context).
#[derive(Debug, Clone, Copy)]
pub struct DeviceQsaAttention {
    pub spec: QsaAttention,
    /// `[rows, h_q, d]` in `spec.q_dtype`, dense.
    pub q: u64,
    /// The key cache (`spec`'s geometry, `spec.kv_dtype`).
    pub k: u64,
    /// The value cache (the same geometry and dtype).
    pub v: u64,
    /// `i32 [rows, width]`: slots.
    pub indices: u64,
    /// Optional `i32 [rows]`; absent: derived per row. Device values outside
    /// `0..=width` are clamped into it (the host cannot check them).
    pub lengths: Option<u64>,
    /// `[rows, h_q, d]` in `spec.q_dtype`.
    pub out: u64,
    /// `f32 [rows, h_q]`.
    pub lse: u64,
    /// Scratch of at least [`CudaEngine::qsa_attention_workspace_bytes`]
    /// bytes (0 / null when that is 0), 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// The `CUstream` to launch on.
    pub stream: u64,
}

impl CudaEngine {
    /// The plan a request of this spec runs: a function of the spec only.
    pub fn qsa_attention_plan(&self, spec: &QsaAttention) -> Result<QsaAttnPlan> {
        spec.validate()?;
        Ok(QsaAttnPlan::new(spec))
    }
    /// Workspace a [`DeviceQsaAttention`] of this spec needs, bytes (0 when
    /// the plan does not split).
    pub fn qsa_attention_workspace_bytes(&self, spec: &QsaAttention) -> Result<usize> {
        Ok(self.qsa_attention_plan(spec)?.workspace_bytes(spec))
    }

    /// Launches the attention on `args.stream`; returns without waiting (no
    /// host synchronisation: capturable in a CUDA graph once the module is
    /// loaded).
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, and `args.stream` a stream of that context.
    pub unsafe fn qsa_attention_device(&self, a: &DeviceQsaAttention) -> Result<()> {
        let s = &a.spec;
        let plan = self.qsa_attention_plan(s)?;
        if s.rows == 0 {
            return Ok(());
        }
        if a.q == 0 || a.indices == 0 || a.out == 0 || a.lse == 0 {
            return Err(null("qsa_attention buffers (q, indices, out, lse)"));
        }
        if s.num_pages > 0 && (a.k == 0 || a.v == 0) {
            return Err(null("k / v"));
        }
        let need = plan.workspace_bytes(s);
        if plan.split() && (a.workspace == 0 || a.workspace_bytes < need) {
            return Err(Error::BufferSize { what: "qsa_attention workspace", got: a.workspace_bytes, need });
        }
        if plan.split() && !a.workspace.is_multiple_of(256) {
            return Err(Error::InvalidOption {
                what: "workspace",
                value: format!("{:#x}", a.workspace),
                expected: "a 256-byte aligned device pointer",
            });
        }
        let ctas = plan.ctas(s.rows);
        let ctas = u32::try_from(ctas).ok().filter(|&c| c <= i32::MAX as u32).ok_or_else(|| {
            Error::Shape(format!(
                "qsa_attention: {ctas} CTAs ({} rows x {} head groups) is too many",
                s.rows, plan.groups
            ))
        })?;
        let smem = plan.smem_bytes(s.d) as u32;
        if smem > self.props().max_smem_per_block {
            return Err(Error::Shape(format!(
                "qsa_attention needs {smem} bytes of shared memory per CTA; the device allows {}",
                self.props().max_smem_per_block
            )));
        }
        let eb = s.kv_dtype.size();
        // Indices are i32: slots past i32::MAX are unreachable.
        let bound = s.slots().min(i32::MAX as usize + 1);
        let p = QsaAttnParams {
            q: a.q,
            k: a.k,
            v: a.v,
            indices: a.indices,
            lengths: a.lengths.unwrap_or(0),
            out: a.out,
            lse: a.lse,
            ws: a.workspace,
            bound: bound as i64,
            page_size: to_i64("page_size", s.page_size)?,
            page_stride: to_i64("page stride", s.page_stride.saturating_mul(eb))?,
            token_stride: to_i64("token stride", s.token_stride * eb)?,
            rows: to_i32("rows", s.rows)?,
            h_q: s.h_q as i32,
            d: s.d as i32,
            width: to_i32("width", s.width)?,
            group: s.group() as i32,
            gpk: plan.per_kv_head as i32,
            groups: plan.groups as i32,
            splits: plan.splits as i32,
            chunk: to_i32("chunk", plan.chunk)?,
            scale: s.scale,
        };
        let on = |grid: u32, smem: u32| Launch {
            grid: (grid, 1),
            block: BLOCK,
            smem,
            stream: a.stream,
            programmatic: false,
            cooperative: false,
            cluster: 0,
        };
        let id = |entry| KernelId { module: Module::SparseQsa, global_buffer: false, entry };
        let f = self.function(id(plan.entry(s)?))?;
        on(ctas, smem).run(&f, &p)?;
        if plan.split() {
            let heads = u32::try_from(s.rows * s.h_q)
                .ok()
                .filter(|&c| c <= i32::MAX as u32)
                .ok_or_else(|| Error::Shape(format!("qsa_attention: {} x {} heads is too many", s.rows, s.h_q)))?;
            let c = self.function(id(combine_entry(s.q_dtype)?))?;
            on(heads, 0).run(&c, &p)?;
        }
        Ok(())
    }

    /// [`crate::cpu::qsa_attention`] on this device from host data: the
    /// CPU's checks (the same errors), upload, poisoned outputs and
    /// workspace, one run on the engine's stream, download (`out` widened to
    /// f32 exactly when it is bf16).
    pub fn qsa_attention_host<Q: AttnElem, KV: AttnElem>(
        &self,
        spec: &QsaAttention,
        q: &[Q],
        k: &[KV],
        v: &[KV],
        indices: &[i32],
        lengths: Option<&[i32]>,
    ) -> Result<QsaAttentionOutput<f32>> {
        let d = Data::upload(self, spec, q, k, v, indices, lengths)?;
        d.run(self)?;
        d.download(self)
    }

    /// Uploads once, then times `iters` runs; returns the last run's result
    /// and the seconds of each run.
    #[allow(clippy::too_many_arguments)]
    pub fn time_qsa_attention<Q: AttnElem, KV: AttnElem>(
        &self,
        spec: &QsaAttention,
        q: &[Q],
        k: &[KV],
        v: &[KV],
        indices: &[i32],
        lengths: Option<&[i32]>,
        iters: usize,
    ) -> Result<(QsaAttentionOutput<f32>, Vec<f64>)> {
        let d = Data::upload(self, spec, q, k, v, indices, lengths)?;
        d.run(self)?;
        let args = d.args(self);
        // SAFETY: buffers sized for the spec (Data::upload).
        let times = timing::time_on_stream(self.stream(), iters, || unsafe { self.qsa_attention_device(&args) })?;
        Ok((d.download(self)?, times))
    }
}

/// Device copies of one host problem.
struct Data {
    spec: QsaAttention,
    q: CudaSlice<u8>,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    indices: CudaSlice<u8>,
    lengths: Option<CudaSlice<u8>>,
    out: CudaSlice<u8>,
    lse: CudaSlice<u8>,
    ws: CudaSlice<u8>,
    ws_bytes: usize,
}

impl Data {
    fn upload<Q: AttnElem, KV: AttnElem>(
        e: &CudaEngine,
        spec: &QsaAttention,
        q: &[Q],
        k: &[KV],
        v: &[KV],
        indices: &[i32],
        lengths: Option<&[i32]>,
    ) -> Result<Self> {
        check_request(spec, q, k, v, indices, lengths)?;
        let n = spec.cache_len()?;
        let heads = spec.rows * spec.h_q;
        let ws_bytes = e.qsa_attention_workspace_bytes(spec)?;
        Ok(Self {
            spec: *spec,
            q: upload(e, bytes_of(q))?,
            k: upload(e, bytes_of(&k[..n]))?,
            v: upload(e, bytes_of(&v[..n]))?,
            indices: upload(e, bytes_of(indices))?,
            lengths: lengths.map(|l| upload(e, bytes_of(l))).transpose()?,
            out: alloc(e, heads * spec.d * spec.q_dtype.size())?,
            lse: alloc(e, heads * 4)?,
            ws: alloc(e, ws_bytes)?,
            ws_bytes,
        })
    }

    fn args(&self, e: &CudaEngine) -> DeviceQsaAttention {
        DeviceQsaAttention {
            spec: self.spec,
            q: ptr(e, &self.q),
            k: ptr(e, &self.k),
            v: ptr(e, &self.v),
            indices: ptr(e, &self.indices),
            lengths: self.lengths.as_ref().map(|l| ptr(e, l)),
            out: ptr(e, &self.out),
            lse: ptr(e, &self.lse),
            workspace: ptr(e, &self.ws),
            workspace_bytes: self.ws_bytes,
            stream: e.stream().cu_stream() as u64,
        }
    }

    /// Poisons the outputs (NaN bytes) and the workspace, then runs.
    fn run(&self, e: &CudaEngine) -> Result<()> {
        let s = e.stream().cu_stream();
        let heads = self.spec.rows * self.spec.h_q;
        // SAFETY: each size is at most its allocation's; buffers sized for
        // the spec (upload).
        unsafe {
            launch::poison(ptr(e, &self.out), 0xff, heads * self.spec.d * self.spec.q_dtype.size(), s)?;
            launch::poison(ptr(e, &self.lse), 0xff, heads * 4, s)?;
            launch::poison(ptr(e, &self.ws), 0xa5, self.ws_bytes.max(256), s)?;
            e.qsa_attention_device(&self.args(e))
        }
    }

    fn download(&self, e: &CudaEngine) -> Result<QsaAttentionOutput<f32>> {
        let st = e.stream();
        let out = st.clone_dtoh(&self.out).map_err(cuda_err)?;
        let lse = st.clone_dtoh(&self.lse).map_err(cuda_err)?;
        st.synchronize().map_err(cuda_err)?;
        let heads = self.spec.rows * self.spec.h_q;
        let n = heads * self.spec.d;
        let out = widen_f32(&out, self.spec.q_dtype, n);
        Ok(QsaAttentionOutput { out, lse: elems_of::<f32>(&lse, heads) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<QsaAttnParams>(), 136);
        assert_eq!(std::mem::offset_of!(QsaAttnParams, bound), 64);
        assert_eq!(std::mem::offset_of!(QsaAttnParams, rows), 96);
        assert_eq!(std::mem::offset_of!(QsaAttnParams, scale), 132);
    }

    #[test]
    fn entries_follow_the_formats() {
        assert_eq!(forward_entry(DType::F32, DType::F32).unwrap(), "qsa_attn_fwd_qf32_kvf32");
        assert_eq!(forward_entry(DType::F32, DType::BF16).unwrap(), "qsa_attn_fwd_qf32_kvbf16");
        assert_eq!(forward_entry(DType::BF16, DType::F32).unwrap(), "qsa_attn_fwd_qbf16_kvf32");
        assert_eq!(forward_entry(DType::BF16, DType::BF16).unwrap(), "qsa_attn_fwd_qbf16_kvbf16");
        assert_eq!(combine_entry(DType::BF16).unwrap(), "qsa_attn_combine_bf16");
        assert_eq!(QSA_ATTN_ENTRIES[6..], ["qsa_attn_tc_fwd_d128", "qsa_attn_tc_fwd_d256"]);
        assert!(forward_entry(DType::F16, DType::F32).is_err());
        assert_eq!(Module::SparseQsa.entry_points(), &QSA_ATTN_ENTRIES);
    }

    #[test]
    fn the_plan() {
        // QSA's 24 / 2 heads of 256 in bf16: tensor cores, one CTA of 16 a KV
        // head (12 heads, 4 masked rows); in f32: two CTAs (8 + 4).
        let s = QsaAttention::new(8192, 262_144, 24, 2, 256, 2051);
        let p = QsaAttnPlan::new(&s);
        assert_eq!(
            (p.path, p.heads_per_cta, p.per_kv_head, p.groups, p.splits),
            (QsaAttnPath::TensorCore, 16, 1, 2, 1)
        );
        assert_eq!(p.entry(&s).unwrap(), "qsa_attn_tc_fwd_d256");
        assert_eq!(p.smem_bytes(256), 65_728);
        assert_eq!(p.workspace_bytes(&s), 0);
        let f = s.with_dtypes(DType::F32, DType::BF16);
        let p = QsaAttnPlan::new(&f);
        assert_eq!((p.path, p.per_kv_head, p.groups, p.splits), (QsaAttnPath::F32, 2, 4, 1));
        assert_eq!(p.entry(&f).unwrap(), "qsa_attn_fwd_qf32_kvbf16");
        // d 64 stays on the f32 kernel; d 128 takes tensor cores.
        assert_eq!(QsaAttnPath::of(&QsaAttention::new(1, 10, 8, 1, 64, 4)), QsaAttnPath::F32);
        assert_eq!(QsaAttnPath::of(&QsaAttention::new(1, 10, 8, 1, 128, 4)), QsaAttnPath::TensorCore);
        assert_eq!(tc_smem_bytes(128), 45_248);
        // A tensor-parallel shard (12 / 1) decoding one token: split.
        let s = QsaAttention::new(1, 1 << 20, 12, 1, 256, 2051).with_dtypes(DType::F32, DType::F32);
        let p = QsaAttnPlan::new(&s);
        assert_eq!((p.per_kv_head, p.groups), (2, 2));
        assert!(p.split() && p.chunk.is_multiple_of(TILE));
        assert!(p.chunk * p.splits >= 2051 && p.chunk * (p.splits - 1) < 2051, "{p:?}");
        assert_eq!(p.workspace_bytes(&s), 12 * p.splits * 258 * 4);
        // One head a KV head (MHA): a CTA per head on either path; 32 / 1 on
        // tensor cores: two CTAs of 16.
        let p = QsaAttnPlan::new(&QsaAttention::new(4096, 100, 16, 16, 64, 64));
        assert_eq!((p.per_kv_head, p.groups), (1, 16));
        let p = QsaAttnPlan::new(&QsaAttention::new(4096, 100, 32, 1, 256, 64));
        assert_eq!((p.per_kv_head, p.groups), (2, 2));
        assert_eq!(smem_bytes(256), 76_160);
        assert!(smem_bytes(256) <= 99 * 1024, "fits sm_86 / sm_89");
    }
}
