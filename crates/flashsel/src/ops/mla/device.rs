//! Sparse MLA attention on the CUDA engine (kernels/attention/sparse_mla.cu):
//! the contract of [`super`] over device pointers, on the caller's stream.
//!
//! # The path (a function of the formats only)
//! bf16 q with a bf16 or fp8 cache runs on the tensor-core kernels
//! (`mla_tc_fwd_*`, kernels/attention/sparse_mla_tc.cuh: mma.sync bf16 with
//! f32 accumulation, 16 heads a CTA for `h_q <= 16`, else 32); everything else
//! (an f32 q or an f32 cache) on the f32 kernels (`mla_fwd_*`, 8 heads a
//! CTA). [`MlaPath::of`].
//!
//! # The plan (its split a function of the shapes and formats only)
//! One CTA per (query row, group of [`MlaPlan::heads_per_cta`] heads, KV
//! split). When the rows' CTAs (`rows * groups`, at 32 heads a CTA for
//! `h_q > 16`) fall short of [`TARGET_CTAS`], each row's `topk` positions
//! are cut into up to [`MAX_SPLITS`] chunks of whole tiles, every chunk a
//! CTA of its own that writes its unnormalised softmax state to the
//! workspace, and `mla_combine_*` merges the chunks in a fixed order. The
//! split never looks at the device or the data (not even the lengths), so a
//! request's bytes are the same on every GPU, and a derived `topk_length`
//! gives the bits of the same length passed explicitly. The device only
//! chooses the CTA's width ([`MlaPlan::on_device`]): over an fp8 cache, on
//! parts whose shared memory holds it (sm_90), the 32-head plan runs as 64
//! heads a CTA with two KV buffers, whose warps each do the 32-head CTA's
//! per-warp work: the same bytes.

use cudarc::driver::CudaSlice;

use super::{
    check_decode_request, check_prefill_request, CacheFormat, DecodeOutput, MlaElem, PagedKvCache, PrefillOutput,
    SparseMlaDecode, SparseMlaPrefill, D_V, FP8_TOKEN_BYTES,
};
use crate::contract::error::cuda_err;
use crate::contract::{DType, Error, Result};
use crate::cuda::compile::Module;
use crate::cuda::host::{alloc, bytes_of, elems_of, ptr, upload, widen_f32};
use crate::cuda::launch::{self, KernelParams, Launch};
use crate::cuda::{timing, CudaEngine, KernelId};
use crate::ops::select::plan::DeviceProps;

/// Every kernel of the module: the one-pass kernels by (q format, cache
/// format), then the combines by output format.
pub(crate) const MLA_ENTRIES: [&str; 13] = [
    "mla_fwd_qf32_kvf32",
    "mla_fwd_qf32_kvbf16",
    "mla_fwd_qf32_kvfp8",
    "mla_fwd_qbf16_kvf32",
    "mla_fwd_qbf16_kvbf16",
    "mla_fwd_qbf16_kvfp8",
    "mla_combine_f32",
    "mla_combine_bf16",
    "mla_tc_fwd_m16_qbf16_kvbf16",
    "mla_tc_fwd_m16_qbf16_kvfp8",
    "mla_tc_fwd_m32_qbf16_kvbf16",
    "mla_tc_fwd_m32_qbf16_kvfp8",
    "mla_tc_fwd_m64_qbf16_kvfp8",
];

/// Query heads one CTA of the f32 kernel computes (the kernel's `HG`).
pub const HEADS_PER_CTA: usize = 8;
/// bf16 elements per shared-memory q / k row of the tensor-core kernel (576 + 8).
const TC_LD: usize = 584;
/// Index positions per tile (the kernel's `KT`); splits are whole tiles.
pub const TILE: usize = 32;
/// Threads per CTA (every kernel but the 64-head one, which has 512).
const BLOCK: u32 = 256;
/// Heads a CTA of the double-buffered tensor-core kernel (`mla_tc_fwd_m64_qbf16_kvfp8`).
pub const WIDE_HEADS: usize = 64;
/// CTAs the split plan aims for (two waves' worth of a 132-SM part at one
/// CTA per SM; a constant, so that the plan depends on shapes only).
pub const TARGET_CTAS: usize = 264;
/// The most chunks a row's positions are split into.
pub const MAX_SPLITS: usize = 32;

/// Which forward kernel family a request runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MlaPath {
    /// `mla_fwd_*`: f32 arithmetic on CUDA cores, 8 heads a CTA.
    F32,
    /// `mla_tc_fwd_*`: mma.sync bf16 (f32 accumulation), 16, 32 or 64 heads a CTA.
    TensorCore,
}

impl MlaPath {
    /// The path of a request with q of `q` and a cache of `cache`: bf16 q
    /// with a bf16 or fp8 cache on tensor cores, the rest in f32.
    pub fn of(q: DType, cache: CacheFormat) -> Self {
        match (q, cache) {
            (DType::BF16, CacheFormat::BF16 | CacheFormat::Fp8V32) => MlaPath::TensorCore,
            _ => MlaPath::F32,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            MlaPath::F32 => "f32",
            MlaPath::TensorCore => "tensor-core",
        }
    }
}

/// How a request runs: the kernel family, head groups per row and the KV
/// split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaPlan {
    pub path: MlaPath,
    /// Heads one CTA computes: 8 (f32), 16 (tensor cores, `h_q <= 16`), 32,
    /// or 64 ([`MlaPlan::on_device`]).
    pub heads_per_cta: usize,
    /// CTAs per row across the heads: `ceil(h_q / heads_per_cta)`.
    pub groups: usize,
    /// Chunks of each row's positions (1: no split, no combine).
    pub splits: usize,
    /// Positions per chunk (a multiple of [`TILE`]; `topk` rounded up when
    /// `splits == 1`).
    pub chunk: usize,
}

impl MlaPlan {
    /// The f32 kernel's plan of `rows` query rows of `h_q` heads and `topk`
    /// positions.
    pub fn new(rows: usize, h_q: usize, topk: usize) -> Self {
        Self::new_for(MlaPath::F32, rows, h_q, topk)
    }
    /// The plan of `path` for `rows` query rows of `h_q` heads and `topk`
    /// positions.
    pub fn new_for(path: MlaPath, rows: usize, h_q: usize, topk: usize) -> Self {
        let heads_per_cta = match path {
            MlaPath::F32 => HEADS_PER_CTA,
            MlaPath::TensorCore if h_q <= 16 => 16,
            MlaPath::TensorCore => 32,
        };
        let groups = h_q.div_ceil(heads_per_cta).max(1);
        let tiles = topk.div_ceil(TILE).max(1);
        let base = rows.saturating_mul(groups);
        let want = if base == 0 || base >= TARGET_CTAS { 1 } else { TARGET_CTAS.div_ceil(base) };
        let want = want.min(tiles).clamp(1, MAX_SPLITS);
        let chunk_tiles = tiles.div_ceil(want);
        let splits = tiles.div_ceil(chunk_tiles);
        Self { path, heads_per_cta, groups, splits, chunk: chunk_tiles * TILE }
    }
    /// This plan on `dev` for `rows` query rows of `h_q` heads over a
    /// `cache` cache: a tensor-core plan of 32 heads a CTA over an fp8 cache
    /// becomes one of [`WIDE_HEADS`] (`mla_tc_fwd_m64_qbf16_kvfp8`: two KV
    /// buffers, 512 threads, one CTA an SM, each token decoded once per 64
    /// heads) where
    /// - that CTA's `tc_smem_bytes(64)` = 222,976 bytes fit (sm_90, not
    ///   sm_80/86/89),
    /// - 64-head groups pad no more heads (`ceil(h_q / 64) * 2 == ceil(h_q /
    ///   32)`),
    /// - and its CTAs still number at least the SMs (a split one-row decode
    ///   would leave half of them idle).
    ///
    /// Measured on an H100 (docs/perf-log.md v50): fp8 decode 2.5-4.6%
    /// faster at b 64-128; bf16 (prefill) 3-7% slower, b 1 split 17%
    /// slower, so those stay at 32. Its warps do the 32-head CTA's per-warp
    /// work and the split stays the 32-head plan's: the same bytes. Any
    /// other plan is returned as it is.
    pub fn on_device(self, rows: usize, h_q: usize, cache: CacheFormat, dev: &DeviceProps) -> Self {
        let groups = h_q.div_ceil(WIDE_HEADS);
        let wide = self.path == MlaPath::TensorCore
            && cache == CacheFormat::Fp8V32
            && self.heads_per_cta == 32
            && groups * 2 == h_q.div_ceil(32)
            && tc_smem_bytes(WIDE_HEADS) <= dev.max_smem_per_block as usize
            && rows.saturating_mul(groups).saturating_mul(self.splits) >= dev.sm_count as usize;
        if !wide {
            return self;
        }
        Self { heads_per_cta: WIDE_HEADS, groups, ..self }
    }
    /// Threads a CTA of the one-pass kernel.
    pub fn threads(&self) -> u32 {
        if self.heads_per_cta == WIDE_HEADS {
            2 * BLOCK
        } else {
            BLOCK
        }
    }
    /// The one-pass kernel of this plan for q of `q` and a cache of `cache`.
    pub fn entry(&self, q: DType, cache: CacheFormat) -> Result<&'static str> {
        match self.path {
            MlaPath::F32 => forward_entry(q, cache),
            MlaPath::TensorCore => {
                if MlaPath::of(q, cache) != MlaPath::TensorCore {
                    return Err(Error::UnknownDType(format!(
                        "the tensor-core sparse MLA takes bf16 q with a bf16 or fp8 cache, not {q} with {}",
                        cache.name()
                    )));
                }
                Ok(match (self.heads_per_cta, cache) {
                    (16, CacheFormat::BF16) => "mla_tc_fwd_m16_qbf16_kvbf16",
                    (16, _) => "mla_tc_fwd_m16_qbf16_kvfp8",
                    (WIDE_HEADS, CacheFormat::Fp8V32) => "mla_tc_fwd_m64_qbf16_kvfp8",
                    (WIDE_HEADS, _) => {
                        return Err(Error::UnknownDType(format!(
                            "the 64-head sparse MLA CTA takes an fp8 cache, not {}",
                            cache.name()
                        )))
                    }
                    (_, CacheFormat::BF16) => "mla_tc_fwd_m32_qbf16_kvbf16",
                    _ => "mla_tc_fwd_m32_qbf16_kvfp8",
                })
            }
        }
    }
    /// Dynamic shared memory of the one-pass kernel at `d_qk`, bytes.
    pub fn smem_bytes(&self, d_qk: usize) -> usize {
        match self.path {
            MlaPath::F32 => smem_bytes(d_qk),
            MlaPath::TensorCore => tc_smem_bytes(self.heads_per_cta),
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
    /// Workspace bytes: the splits' partial states (f32 `O [rows][h_q][splits][512]`
    /// then `(m, sum) [rows][h_q][splits]`), 0 without a split.
    pub fn workspace_bytes(&self, rows: usize, h_q: usize) -> usize {
        if !self.split() {
            return 0;
        }
        rows * h_q * self.splits * (D_V + 2) * 4
    }
}

/// Dynamic shared memory of the one-pass kernel at `d_qk` (bytes): q and
/// one tile of keys as f32, logits, probabilities, the head states, the
/// tile's offsets.
pub fn smem_bytes(d_qk: usize) -> usize {
    ((HEADS_PER_CTA + TILE) * d_qk + 2 * HEADS_PER_CTA * TILE + 32) * 4 + TILE * 8
}

/// Dynamic shared memory of the tensor-core kernel with `heads` heads a CTA
/// (16, 32 or 64; any d_qk), bytes: q and one tile of keys a buffer (two at
/// 64 heads) as bf16 rows of 584, the partial logits (f32, `warps / (heads
/// / 16)` slices of `heads x 40`; 8 warps, 16 at 64 heads), P as two bf16
/// planes of `heads x 40`, the head states, each buffer's offsets, and at
/// 64 heads an fp8 staging area of its own (32 tokens of 656 bytes; the
/// single-buffer kernels stage over the logits and P) (the kernel's
/// `TcShape::SMEM`).
pub fn tc_smem_bytes(heads: usize) -> usize {
    let (warps, stages, raw) = if heads == WIDE_HEADS { (16, 2, TILE * FP8_TOKEN_BYTES) } else { (8, 1, 0) };
    let slices = warps / (heads / 16);
    heads * TC_LD * 2
        + stages * TILE * TC_LD * 2
        + slices * heads * 40 * 4
        + 2 * heads * 40 * 2
        + 3 * heads * 4
        + stages * TILE * 8
        + raw
}

/// `MlaParams` in kernels/attention/sparse_mla.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct MlaParams {
    q: u64,
    kv: u64,
    indices: u64,
    lengths: u64,
    sink: u64,
    out: u64,
    max_logits: u64,
    lse: u64,
    ws: u64,
    bound: i64,
    page_size: i64,
    page_stride: i64,
    token_stride: i64,
    rows: i32,
    h_q: i32,
    d_qk: i32,
    topk: i32,
    s_q: i32,
    len_per_row: i32,
    groups: i32,
    splits: i32,
    chunk: i32,
    sm_scale: f32,
}
// SAFETY: #[repr(C)], the layout of the kernel's MlaParams (test below; the
// kernel asserts its size).
unsafe impl KernelParams for MlaParams {}

fn fmt_code(dtype: DType) -> Result<usize> {
    match dtype {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        other => Err(Error::UnknownDType(format!("sparse MLA takes f32 or bf16 q, not {other}"))),
    }
}

fn forward_entry(q: DType, cache: CacheFormat) -> Result<&'static str> {
    let c = match cache {
        CacheFormat::F32 => 0,
        CacheFormat::BF16 => 1,
        CacheFormat::Fp8V32 => 2,
    };
    Ok(MLA_ENTRIES[fmt_code(q)? * 3 + c])
}

fn combine_entry(q: DType) -> Result<&'static str> {
    Ok(MLA_ENTRIES[6 + fmt_code(q)?])
}

pub(crate) fn null(what: &'static str) -> Error {
    Error::InvalidOption { what, value: "a null pointer".into(), expected: "a device pointer" }
}

/// One asynchronous sparse prefill (`flash_mla_sparse_fwd`) over
/// caller-owned device buffers (`CUdeviceptr`s of the engine's context).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSparseMlaPrefill {
    pub spec: SparseMlaPrefill,
    /// `[s_q, h_q, d_qk]` in `spec.dtype`, dense.
    pub q: u64,
    /// `s_kv` rows of `spec.kv_stride` elements (`spec.dtype`).
    pub kv: u64,
    /// `i32 [s_q, topk]`.
    pub indices: u64,
    /// Optional `i32 [s_q]`; absent: derived per row. Device values outside
    /// `0..=topk` are clamped into it (the host cannot check them).
    pub topk_length: Option<u64>,
    /// Optional `f32 [h_q]`.
    pub attn_sink: Option<u64>,
    /// `[s_q, h_q, 512]` in `spec.dtype`.
    pub out: u64,
    /// `f32 [s_q, h_q]`.
    pub max_logits: u64,
    /// `f32 [s_q, h_q]`.
    pub lse: u64,
    /// Scratch of at least [`CudaEngine::sparse_mla_prefill_workspace_bytes`]
    /// bytes (0 / null when that is 0), 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// The `CUstream` to launch on.
    pub stream: u64,
}

/// One asynchronous sparse decode (the sparse `flash_mla_with_kvcache`).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSparseMlaDecode {
    pub spec: SparseMlaDecode,
    /// `[batch, s_q, h_q, d_qk]` in `spec.q_dtype`, dense.
    pub q: u64,
    /// The paged cache (`spec`'s geometry; elements of `spec.cache`, bytes
    /// for fp8).
    pub k_cache: u64,
    /// `i32 [batch, s_q, topk]`: slots `page * page_size + offset`.
    pub indices: u64,
    /// Optional `i32` lengths (clamped into `0..=topk` on the device).
    pub topk_length: Option<u64>,
    /// `true`: `topk_length` has one entry per row (`[batch, s_q]`); `false`:
    /// one per request (`[batch]`, FlashMLA's).
    pub topk_length_per_row: bool,
    /// Optional `f32 [h_q]`.
    pub attn_sink: Option<u64>,
    /// `[batch, s_q, h_q, 512]` in `spec.q_dtype`.
    pub out: u64,
    /// `f32 [batch, h_q, s_q]`.
    pub lse: u64,
    /// Scratch of at least [`CudaEngine::sparse_mla_decode_workspace_bytes`]
    /// bytes, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    pub stream: u64,
}

fn cache_elem_bytes(c: CacheFormat) -> usize {
    match c {
        CacheFormat::F32 => 4,
        CacheFormat::BF16 => 2,
        CacheFormat::Fp8V32 => 1,
    }
}

pub(crate) fn to_i32(what: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::too_large(what, v as u128))
}

pub(crate) fn to_i64(what: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::too_large(what, v as u128))
}

impl CudaEngine {
    /// Workspace a [`DeviceSparseMlaPrefill`] of this spec needs, bytes (0
    /// when the plan does not split).
    pub fn sparse_mla_prefill_workspace_bytes(&self, spec: &SparseMlaPrefill) -> Result<usize> {
        Ok(self.sparse_mla_prefill_plan(spec)?.workspace_bytes(spec.s_q, spec.h_q))
    }
    /// Workspace a [`DeviceSparseMlaDecode`] of this spec needs, bytes.
    pub fn sparse_mla_decode_workspace_bytes(&self, spec: &SparseMlaDecode) -> Result<usize> {
        Ok(self.sparse_mla_decode_plan(spec)?.workspace_bytes(spec.rows(), spec.h_q))
    }
    /// The plan a prefill of this spec runs (kernel family, head groups,
    /// split): a function of the spec only.
    pub fn sparse_mla_prefill_plan(&self, spec: &SparseMlaPrefill) -> Result<MlaPlan> {
        spec.validate()?;
        let cache = cache_of(spec.dtype)?;
        Ok(self.mla_plan(MlaPath::of(spec.dtype, cache), cache, spec.s_q, spec.h_q, spec.topk))
    }
    /// The plan a decode of this spec runs.
    pub fn sparse_mla_decode_plan(&self, spec: &SparseMlaDecode) -> Result<MlaPlan> {
        spec.validate()?;
        Ok(self.mla_plan(MlaPath::of(spec.q_dtype, spec.cache), spec.cache, spec.rows(), spec.h_q, spec.topk))
    }
    /// The plan of `path` over a `cache` cache on this device
    /// ([`MlaPlan::new_for`], then [`MlaPlan::on_device`]).
    pub fn mla_plan(&self, path: MlaPath, cache: CacheFormat, rows: usize, h_q: usize, topk: usize) -> MlaPlan {
        MlaPlan::new_for(path, rows, h_q, topk).on_device(rows, h_q, cache, &self.props())
    }

    /// Launches the sparse prefill on `args.stream`; returns without waiting
    /// (no host synchronisation: capturable in a CUDA graph once the module
    /// is loaded, e.g. by [`CudaEngine::warm_up`]).
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size in
    /// this engine's context, and `args.stream` a stream of that context.
    pub unsafe fn sparse_mla_prefill_device(&self, a: &DeviceSparseMlaPrefill) -> Result<()> {
        let s = &a.spec;
        s.validate()?;
        let esize = s.dtype.size();
        let p = MlaParams {
            q: a.q,
            kv: a.kv,
            indices: a.indices,
            lengths: a.topk_length.unwrap_or(0),
            sink: a.attn_sink.unwrap_or(0),
            out: a.out,
            max_logits: a.max_logits,
            lse: a.lse,
            ws: a.workspace,
            bound: to_i64("s_kv", s.s_kv)?,
            page_size: to_i64("s_kv", s.s_kv.max(1))?,
            page_stride: 0,
            token_stride: to_i64("kv stride", s.kv_stride * esize)?,
            rows: to_i32("s_q", s.s_q)?,
            h_q: s.h_q as i32,
            d_qk: s.d_qk as i32,
            topk: to_i32("topk", s.topk)?,
            s_q: 1,
            len_per_row: 1,
            sm_scale: s.sm_scale,
            ..MlaParams::default()
        };
        if s.s_q > 0 && (a.q == 0 || a.indices == 0 || a.out == 0 || a.max_logits == 0 || a.lse == 0) {
            return Err(null("sparse_mla_prefill buffers (q, indices, out, max_logits, lse)"));
        }
        if s.s_q > 0 && s.s_kv > 0 && a.kv == 0 {
            return Err(null("kv"));
        }
        self.run_mla(p, s.dtype, cache_of(s.dtype)?, a.workspace_bytes, a.stream)
    }

    /// Launches the sparse decode on `args.stream` (as
    /// [`CudaEngine::sparse_mla_prefill_device`]).
    ///
    /// # Safety
    /// As [`CudaEngine::sparse_mla_prefill_device`].
    pub unsafe fn sparse_mla_decode_device(&self, a: &DeviceSparseMlaDecode) -> Result<()> {
        let s = &a.spec;
        s.validate()?;
        let rows = s.rows();
        let eb = cache_elem_bytes(s.cache);
        // Indices are i32: slots past i32::MAX are unreachable.
        let bound = s.slots().min(i32::MAX as usize + 1);
        let p = MlaParams {
            q: a.q,
            kv: a.k_cache,
            indices: a.indices,
            lengths: a.topk_length.unwrap_or(0),
            sink: a.attn_sink.unwrap_or(0),
            out: a.out,
            max_logits: 0,
            lse: a.lse,
            ws: a.workspace,
            bound: bound as i64,
            page_size: to_i64("page_size", s.page_size)?,
            page_stride: to_i64("page stride", s.page_stride.saturating_mul(eb))?,
            token_stride: to_i64("token stride", s.token_stride * eb)?,
            rows: to_i32("batch * s_q", rows)?,
            h_q: s.h_q as i32,
            d_qk: s.d_qk as i32,
            topk: to_i32("topk", s.topk)?,
            s_q: s.s_q.max(1) as i32,
            len_per_row: a.topk_length_per_row as i32,
            sm_scale: s.sm_scale,
            ..MlaParams::default()
        };
        if rows > 0 && (a.q == 0 || a.indices == 0 || a.out == 0 || a.lse == 0) {
            return Err(null("sparse_mla_decode buffers (q, indices, out, lse)"));
        }
        if rows > 0 && s.num_pages > 0 && a.k_cache == 0 {
            return Err(null("k_cache"));
        }
        self.run_mla(p, s.q_dtype, s.cache, a.workspace_bytes, a.stream)
    }

    /// The plan's launches: the one-pass kernel, then the combine when the
    /// plan splits.
    unsafe fn run_mla(
        &self,
        mut p: MlaParams,
        q_dtype: DType,
        cache: CacheFormat,
        workspace_bytes: usize,
        stream: u64,
    ) -> Result<()> {
        let (rows, h_q) = (p.rows as usize, p.h_q as usize);
        if rows == 0 {
            return Ok(());
        }
        let plan = self.mla_plan(MlaPath::of(q_dtype, cache), cache, rows, h_q, p.topk as usize);
        let entry = plan.entry(q_dtype, cache)?;
        let need = plan.workspace_bytes(rows, h_q);
        if plan.split() && (p.ws == 0 || workspace_bytes < need) {
            return Err(Error::BufferSize { what: "sparse MLA workspace", got: workspace_bytes, need });
        }
        if plan.split() && !p.ws.is_multiple_of(256) {
            return Err(Error::InvalidOption {
                what: "workspace",
                value: format!("{:#x}", p.ws),
                expected: "a 256-byte aligned device pointer",
            });
        }
        let ctas = plan.ctas(rows);
        let ctas = u32::try_from(ctas).ok().filter(|&c| c <= i32::MAX as u32).ok_or_else(|| {
            Error::Shape(format!("sparse MLA: {ctas} CTAs ({rows} rows x {} head groups) is too many", plan.groups))
        })?;
        let smem = plan.smem_bytes(p.d_qk as usize) as u32;
        if smem > self.props().max_smem_per_block {
            return Err(Error::Shape(format!(
                "sparse MLA needs {smem} bytes of shared memory per CTA; the device allows {}",
                self.props().max_smem_per_block
            )));
        }
        p.groups = plan.groups as i32;
        p.splits = plan.splits as i32;
        p.chunk = to_i32("chunk", plan.chunk)?;
        let on = |grid: u32, block: u32, smem: u32| Launch {
            grid: (grid, 1),
            block,
            smem,
            stream,
            programmatic: false,
            cooperative: false,
            cluster: 0,
        };
        let f = self.function(KernelId { module: Module::SparseMla, global_buffer: false, entry })?;
        on(ctas, plan.threads(), smem).run(&f, &p)?;
        if plan.split() {
            let heads = u32::try_from(rows * h_q)
                .ok()
                .filter(|&c| c <= i32::MAX as u32)
                .ok_or_else(|| Error::Shape(format!("sparse MLA: {rows} x {h_q} heads is too many")))?;
            let c = self.function(KernelId {
                module: Module::SparseMla,
                global_buffer: false,
                entry: combine_entry(q_dtype)?,
            })?;
            on(heads, BLOCK, 0).run(&c, &p)?;
        }
        Ok(())
    }

    /// [`crate::cpu::sparse_mla_prefill`] on this device from host data:
    /// the CPU's checks (the same errors), upload, poisoned outputs and
    /// workspace, one run on the engine's stream, download (`out` widened to
    /// f32 exactly when it is bf16).
    pub fn sparse_mla_prefill_host<T: MlaElem>(
        &self,
        spec: &SparseMlaPrefill,
        q: &[T],
        kv: &[T],
        indices: &[i32],
        topk_length: Option<&[i32]>,
        attn_sink: Option<&[f32]>,
    ) -> Result<PrefillOutput<f32>> {
        let d = PrefillData::upload(self, spec, q, kv, indices, topk_length, attn_sink)?;
        d.run(self)?;
        d.download(self)
    }

    /// Uploads once, then times `iters` runs (as [`CudaEngine::time_select`]);
    /// returns the last run's result and the seconds of each run.
    #[allow(clippy::too_many_arguments)]
    pub fn time_sparse_mla_prefill<T: MlaElem>(
        &self,
        spec: &SparseMlaPrefill,
        q: &[T],
        kv: &[T],
        indices: &[i32],
        topk_length: Option<&[i32]>,
        attn_sink: Option<&[f32]>,
        iters: usize,
    ) -> Result<(PrefillOutput<f32>, Vec<f64>)> {
        let d = PrefillData::upload(self, spec, q, kv, indices, topk_length, attn_sink)?;
        d.run(self)?;
        let args = d.args(self);
        // SAFETY: buffers sized for the spec (PrefillData::upload).
        let times = timing::time_on_stream(self.stream(), iters, || unsafe { self.sparse_mla_prefill_device(&args) })?;
        Ok((d.download(self)?, times))
    }

    /// [`crate::cpu::sparse_mla_decode`] on this device from host data (as
    /// [`CudaEngine::sparse_mla_prefill_host`]).
    pub fn sparse_mla_decode_host<Q: MlaElem>(
        &self,
        spec: &SparseMlaDecode,
        q: &[Q],
        cache: PagedKvCache<'_>,
        indices: &[i32],
        topk_length: Option<&[i32]>,
        attn_sink: Option<&[f32]>,
    ) -> Result<DecodeOutput<f32>> {
        let d = DecodeData::upload(self, spec, q, cache, indices, topk_length, attn_sink)?;
        d.run(self)?;
        d.download(self)
    }

    /// Uploads once, then times `iters` runs; returns the last run's result.
    #[allow(clippy::too_many_arguments)]
    pub fn time_sparse_mla_decode<Q: MlaElem>(
        &self,
        spec: &SparseMlaDecode,
        q: &[Q],
        cache: PagedKvCache<'_>,
        indices: &[i32],
        topk_length: Option<&[i32]>,
        attn_sink: Option<&[f32]>,
        iters: usize,
    ) -> Result<(DecodeOutput<f32>, Vec<f64>)> {
        let d = DecodeData::upload(self, spec, q, cache, indices, topk_length, attn_sink)?;
        d.run(self)?;
        let args = d.args(self);
        // SAFETY: buffers sized for the spec (DecodeData::upload).
        let times = timing::time_on_stream(self.stream(), iters, || unsafe { self.sparse_mla_decode_device(&args) })?;
        Ok((d.download(self)?, times))
    }
}

/// The cache format of a prefill's kv (its dtype).
fn cache_of(dtype: DType) -> Result<CacheFormat> {
    match dtype {
        DType::F32 => Ok(CacheFormat::F32),
        DType::BF16 => Ok(CacheFormat::BF16),
        other => Err(Error::UnknownDType(format!("sparse MLA takes f32 or bf16 kv, not {other}"))),
    }
}

/// Optional inputs and outputs of one host problem, in device memory.
struct Buffers {
    q: CudaSlice<u8>,
    kv: CudaSlice<u8>,
    indices: CudaSlice<u8>,
    lengths: Option<CudaSlice<u8>>,
    sink: Option<CudaSlice<u8>>,
    out: CudaSlice<u8>,
    max_logits: CudaSlice<u8>,
    lse: CudaSlice<u8>,
    ws: CudaSlice<u8>,
    ws_bytes: usize,
    out_bytes: usize,
    heads: usize,
}

impl Buffers {
    #[allow(clippy::too_many_arguments)]
    fn new(
        e: &CudaEngine,
        q: &[u8],
        kv: &[u8],
        indices: &[i32],
        lengths: Option<&[i32]>,
        sink: Option<&[f32]>,
        out_bytes: usize,
        heads: usize,
        ws_bytes: usize,
    ) -> Result<Self> {
        Ok(Self {
            q: upload(e, q)?,
            kv: upload(e, kv)?,
            indices: upload(e, bytes_of(indices))?,
            lengths: lengths.map(|l| upload(e, bytes_of(l))).transpose()?,
            sink: sink.map(|s| upload(e, bytes_of(s))).transpose()?,
            out: alloc(e, out_bytes)?,
            max_logits: alloc(e, heads * 4)?,
            lse: alloc(e, heads * 4)?,
            ws: alloc(e, ws_bytes)?,
            ws_bytes,
            out_bytes,
            heads,
        })
    }

    /// Poisons the outputs (NaN bytes) and the workspace.
    fn poison(&self, e: &CudaEngine) -> Result<()> {
        let s = e.stream().cu_stream();
        // SAFETY: each size is at most its allocation's.
        unsafe {
            launch::poison(ptr(e, &self.out), 0xff, self.out_bytes, s)?;
            launch::poison(ptr(e, &self.max_logits), 0xff, self.heads * 4, s)?;
            launch::poison(ptr(e, &self.lse), 0xff, self.heads * 4, s)?;
            launch::poison(ptr(e, &self.ws), 0xa5, self.ws_bytes.max(256), s)?;
        }
        Ok(())
    }

    /// `(out, max_logits, lse)` as host bytes.
    fn download(&self, e: &CudaEngine) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
        let s = e.stream();
        let out = s.clone_dtoh(&self.out).map_err(cuda_err)?;
        let m = s.clone_dtoh(&self.max_logits).map_err(cuda_err)?;
        let l = s.clone_dtoh(&self.lse).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok((out, m, l))
    }
}

/// Device copies of one host prefill problem.
struct PrefillData {
    spec: SparseMlaPrefill,
    b: Buffers,
}

impl PrefillData {
    fn upload<T: MlaElem>(
        e: &CudaEngine,
        spec: &SparseMlaPrefill,
        q: &[T],
        kv: &[T],
        indices: &[i32],
        topk_length: Option<&[i32]>,
        attn_sink: Option<&[f32]>,
    ) -> Result<Self> {
        check_prefill_request(spec, q, kv, indices, topk_length, attn_sink)?;
        let kv = &kv[..spec.kv_len()?];
        let heads = spec.s_q * spec.h_q;
        let out_bytes = heads * D_V * spec.dtype.size();
        let ws = e.sparse_mla_prefill_workspace_bytes(spec)?;
        let b = Buffers::new(e, bytes_of(q), bytes_of(kv), indices, topk_length, attn_sink, out_bytes, heads, ws)?;
        Ok(Self { spec: *spec, b })
    }

    fn args(&self, e: &CudaEngine) -> DeviceSparseMlaPrefill {
        let b = &self.b;
        DeviceSparseMlaPrefill {
            spec: self.spec,
            q: ptr(e, &b.q),
            kv: ptr(e, &b.kv),
            indices: ptr(e, &b.indices),
            topk_length: b.lengths.as_ref().map(|l| ptr(e, l)),
            attn_sink: b.sink.as_ref().map(|s| ptr(e, s)),
            out: ptr(e, &b.out),
            max_logits: ptr(e, &b.max_logits),
            lse: ptr(e, &b.lse),
            workspace: ptr(e, &b.ws),
            workspace_bytes: b.ws_bytes,
            stream: e.stream().cu_stream() as u64,
        }
    }

    fn run(&self, e: &CudaEngine) -> Result<()> {
        self.b.poison(e)?;
        // SAFETY: buffers sized for the spec (upload).
        unsafe { e.sparse_mla_prefill_device(&self.args(e)) }
    }

    fn download(&self, e: &CudaEngine) -> Result<PrefillOutput<f32>> {
        let (out, m, l) = self.b.download(e)?;
        let heads = self.b.heads;
        Ok(PrefillOutput {
            out: widen_f32(&out, self.spec.dtype, heads * D_V),
            max_logits: elems_of::<f32>(&m, heads),
            lse: elems_of::<f32>(&l, heads),
        })
    }
}

/// Device copies of one host decode problem.
struct DecodeData {
    spec: SparseMlaDecode,
    per_row: bool,
    b: Buffers,
}

impl DecodeData {
    fn upload<Q: MlaElem>(
        e: &CudaEngine,
        spec: &SparseMlaDecode,
        q: &[Q],
        cache: PagedKvCache<'_>,
        indices: &[i32],
        topk_length: Option<&[i32]>,
        attn_sink: Option<&[f32]>,
    ) -> Result<Self> {
        let layout = check_decode_request(spec, q, cache, indices, topk_length, attn_sink)?;
        let need = spec.cache_len()?;
        let cache_bytes: &[u8] = match cache {
            PagedKvCache::F32(d) => bytes_of(&d[..need]),
            PagedKvCache::BF16(d) => bytes_of(&d[..need]),
            PagedKvCache::Fp8(d) => &d[..need],
        };
        let heads = spec.rows() * spec.h_q;
        let out_bytes = heads * D_V * spec.q_dtype.size();
        let ws = e.sparse_mla_decode_workspace_bytes(spec)?;
        let b = Buffers::new(e, bytes_of(q), cache_bytes, indices, topk_length, attn_sink, out_bytes, heads, ws)?;
        Ok(Self { spec: *spec, per_row: layout.unwrap_or(true), b })
    }

    fn args(&self, e: &CudaEngine) -> DeviceSparseMlaDecode {
        let b = &self.b;
        DeviceSparseMlaDecode {
            spec: self.spec,
            q: ptr(e, &b.q),
            k_cache: ptr(e, &b.kv),
            indices: ptr(e, &b.indices),
            topk_length: b.lengths.as_ref().map(|l| ptr(e, l)),
            topk_length_per_row: self.per_row,
            attn_sink: b.sink.as_ref().map(|s| ptr(e, s)),
            out: ptr(e, &b.out),
            lse: ptr(e, &b.lse),
            workspace: ptr(e, &b.ws),
            workspace_bytes: b.ws_bytes,
            stream: e.stream().cu_stream() as u64,
        }
    }

    fn run(&self, e: &CudaEngine) -> Result<()> {
        self.b.poison(e)?;
        // SAFETY: buffers sized for the spec (upload).
        unsafe { e.sparse_mla_decode_device(&self.args(e)) }
    }

    fn download(&self, e: &CudaEngine) -> Result<DecodeOutput<f32>> {
        let (out, _, l) = self.b.download(e)?;
        let heads = self.b.heads;
        Ok(DecodeOutput { out: widen_f32(&out, self.spec.q_dtype, heads * D_V), lse: elems_of::<f32>(&l, heads) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<MlaParams>(), 144);
        assert_eq!(std::mem::offset_of!(MlaParams, bound), 72);
        assert_eq!(std::mem::offset_of!(MlaParams, rows), 104);
        assert_eq!(std::mem::offset_of!(MlaParams, sm_scale), 140);
    }

    #[test]
    fn entries_follow_the_formats() {
        assert_eq!(forward_entry(DType::F32, CacheFormat::F32).unwrap(), "mla_fwd_qf32_kvf32");
        assert_eq!(forward_entry(DType::BF16, CacheFormat::Fp8V32).unwrap(), "mla_fwd_qbf16_kvfp8");
        assert_eq!(forward_entry(DType::F32, CacheFormat::BF16).unwrap(), "mla_fwd_qf32_kvbf16");
        assert_eq!(combine_entry(DType::BF16).unwrap(), "mla_combine_bf16");
        assert!(forward_entry(DType::F16, CacheFormat::F32).is_err());
        assert_eq!(Module::SparseMla.entry_points(), &MLA_ENTRIES);
    }

    #[test]
    fn the_plan_splits_only_small_batches() {
        // Prefill rows fill the GPU: no split.
        let p = MlaPlan::new(4096, 128, 2048);
        assert_eq!((p.groups, p.splits, p.chunk), (16, 1, 2048));
        assert_eq!(p.workspace_bytes(4096, 128), 0);
        // Decode b 128 s_q 2 h_q 128: 4096 CTAs, no split.
        assert!(!MlaPlan::new(256, 128, 2048).split());
        // One row of 128 heads: 16 CTAs, split into 17 chunks' worth -> whole tiles.
        let p = MlaPlan::new(1, 128, 2048);
        assert_eq!(p.groups, 16);
        assert!(p.split() && p.splits <= MAX_SPLITS);
        assert_eq!(p.chunk % TILE, 0);
        assert!(p.chunk * p.splits >= 2048 && p.chunk * (p.splits - 1) < 2048, "{p:?}");
        // h_q 1: one group; topk below a tile: never split.
        let p = MlaPlan::new(1, 1, 20);
        assert_eq!((p.groups, p.splits, p.chunk), (1, 1, 32));
        let p = MlaPlan::new(1, 1, 2048);
        assert_eq!((p.splits, p.chunk), (32, 64));
        // Every chunk holds at least one position.
        for (rows, h, topk) in [(1, 8, 100), (3, 24, 384), (62, 16, 2048), (1, 128, 33), (7, 1, 1)] {
            let p = MlaPlan::new(rows, h, topk);
            assert!(p.chunk * (p.splits - 1) < topk.max(1), "{rows} {h} {topk}: {p:?}");
        }
        assert_eq!(smem_bytes(576), 94_592);
        assert!(smem_bytes(576) <= 99 * 1024, "fits sm_86 / sm_89");
    }

    #[test]
    fn the_tensor_core_plan() {
        assert_eq!(MlaPath::of(DType::BF16, CacheFormat::BF16), MlaPath::TensorCore);
        assert_eq!(MlaPath::of(DType::BF16, CacheFormat::Fp8V32), MlaPath::TensorCore);
        assert_eq!(MlaPath::of(DType::BF16, CacheFormat::F32), MlaPath::F32);
        assert_eq!(MlaPath::of(DType::F32, CacheFormat::BF16), MlaPath::F32);
        let tc = MlaPath::TensorCore;
        // Prefill h_q 128: 4 blocks of 32 heads, no split.
        let p = MlaPlan::new_for(tc, 4096, 128, 2048);
        assert_eq!((p.heads_per_cta, p.groups, p.splits), (32, 4, 1));
        assert_eq!(p.entry(DType::BF16, CacheFormat::BF16).unwrap(), "mla_tc_fwd_m32_qbf16_kvbf16");
        assert!(p.entry(DType::F32, CacheFormat::BF16).is_err());
        // h_q <= 16: one block of 16 (masked rows inside the kernel).
        for h in [1, 9, 16] {
            let p = MlaPlan::new_for(tc, 4096, h, 2048);
            assert_eq!((p.heads_per_cta, p.groups), (16, 1), "{h}");
            assert_eq!(p.entry(DType::BF16, CacheFormat::Fp8V32).unwrap(), "mla_tc_fwd_m16_qbf16_kvfp8");
        }
        assert_eq!(MlaPlan::new_for(tc, 1, 17, 64).groups, 1);
        assert_eq!(MlaPlan::new_for(tc, 1, 33, 64).groups, 2);
        // Decode b 128 s_q 2 h_q 128: 1024 CTAs, no split; one row splits.
        assert!(!MlaPlan::new_for(tc, 256, 128, 2048).split());
        assert!(MlaPlan::new_for(tc, 1, 128, 2048).split());
        assert_eq!(tc_smem_bytes(32), 100_992);
        assert_eq!(tc_smem_bytes(16), 79_552);
        assert!(tc_smem_bytes(32) <= 99 * 1024, "fits sm_86 / sm_89");
        assert_eq!(MlaPlan::new_for(tc, 1, 128, 2048).smem_bytes(512), 100_992);
    }

    #[test]
    fn the_wide_plan_keeps_the_split() {
        let tc = MlaPath::TensorCore;
        let (h100, ada) = (DeviceProps::hopper(132), DeviceProps::ada(128));
        let fp8 = CacheFormat::Fp8V32;
        assert_eq!(tc_smem_bytes(WIDE_HEADS), 222_976);
        for (rows, h, topk) in [(256, 128, 2048), (64, 128, 2048), (128, 64, 2048), (200, 40, 70), (3, 100, 20_000)] {
            let p = MlaPlan::new_for(tc, rows, h, topk);
            let w = p.on_device(rows, h, fp8, &h100);
            assert_eq!((w.heads_per_cta, w.groups, w.threads()), (64, h.div_ceil(64), 512), "{rows} {h}");
            assert_eq!((w.splits, w.chunk), (p.splits, p.chunk), "the 32-head plan's split");
            assert_eq!(w.workspace_bytes(rows, h), p.workspace_bytes(rows, h));
            assert_eq!(w.entry(DType::BF16, fp8).unwrap(), "mla_tc_fwd_m64_qbf16_kvfp8");
            assert!(w.entry(DType::BF16, CacheFormat::BF16).is_err());
            assert_eq!(w.smem_bytes(576), 222_976);
            assert!(w.ctas(rows) >= 132);
            assert_eq!(p.on_device(rows, h, fp8, &ada), p, "sm_86 / sm_89 keep 32 heads");
            assert_eq!(p.on_device(rows, h, CacheFormat::BF16, &h100), p, "bf16 caches keep 32 heads");
        }
        // Not widened: fewer CTAs than SMs (one decode row, split 32 ways:
        // 64 wide CTAs), 16-head CTAs, the f32 kernel, and h_q where 64 would
        // pad more heads than 32 (65..=96 needs 3 x 32 but 2 x 64).
        let one = MlaPlan::new_for(tc, 1, 128, 2048);
        assert_eq!((one.splits, one.on_device(1, 128, fp8, &h100)), (32, one));
        for h in [1, 16, 17, 32, 65, 80, 96] {
            let p = MlaPlan::new_for(tc, 256, h, 2048);
            assert_eq!(p.on_device(256, h, fp8, &h100), p, "{h}");
        }
        let f = MlaPlan::new(256, 128, 2048);
        assert_eq!(f.on_device(256, 128, fp8, &h100), f);
        assert_eq!(MlaPlan::new_for(tc, 256, 33, 2048).on_device(256, 33, fp8, &h100).heads_per_cta, 64);
    }
}
