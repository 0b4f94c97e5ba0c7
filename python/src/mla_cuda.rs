//! Sparse MLA on CUDA tensors: the native side of `_mla`'s CUDA path. The
//! caller (torch) owns every buffer; the launch goes on the stream it names
//! and returns without a host synchronisation (graph-capturable: the engine
//! compiled its modules when it was created).

use flashsel::cuda::{DeviceSparseMlaDecode, DeviceSparseMlaPrefill, MlaPath, MlaPlan};
use flashsel::ops::mla::{CacheFormat, SparseMlaDecode, SparseMlaPrefill};
use flashsel::DType;
use pyo3::prelude::*;

use crate::{engine, to_py, value_err};

fn opt(p: u64) -> Option<u64> {
    (p != 0).then_some(p)
}

fn elem_dtype(name: &str) -> PyResult<DType> {
    match name {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        other => Err(value_err(format!("sparse MLA takes f32 or bf16, not {other}"))),
    }
}

fn cache_format(name: &str) -> PyResult<CacheFormat> {
    match name {
        "f32" => Ok(CacheFormat::F32),
        "bf16" => Ok(CacheFormat::BF16),
        "fp8" => Ok(CacheFormat::Fp8V32),
        other => Err(value_err(format!("unknown cache format {other}"))),
    }
}

/// Workspace bytes of a sparse MLA launch of `rows` query rows (prefill:
/// `s_q`; decode: `b * s_q`): a function of the shapes only, enough for
/// either kernel family (the tensor-core plan's fewer head groups can split
/// further than the f32 plan's).
#[pyfunction]
fn sparse_mla_workspace_bytes(rows: usize, h_q: usize, topk: usize) -> usize {
    [MlaPath::F32, MlaPath::TensorCore]
        .into_iter()
        .map(|path| MlaPlan::new_for(path, rows, h_q, topk).workspace_bytes(rows, h_q))
        .max()
        .unwrap_or(0)
}

/// `flash_mla_sparse_fwd` on device pointers: `q [s_q, h_q, d_qk]` and `kv`
/// (`s_kv` rows `kv_stride` elements apart) in `dtype`, `indices i32 [s_q,
/// topk]`, optional `topk_length i32 [s_q]` and `attn_sink f32 [h_q]` (0:
/// absent); writes `out [s_q, h_q, 512]` (dtype), `max_logits`, `lse` (f32
/// `[s_q, h_q]`).
#[pyfunction]
#[pyo3(signature = (device, dtype, s_q, s_kv, h_q, d_qk, d_v, topk, kv_stride, sm_scale, q, kv, indices,
                    topk_length, attn_sink, out, max_logits, lse, workspace, workspace_bytes, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_sparse_mla_prefill(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    s_q: usize,
    s_kv: usize,
    h_q: usize,
    d_qk: usize,
    d_v: usize,
    topk: usize,
    kv_stride: usize,
    sm_scale: f64,
    q: u64,
    kv: u64,
    indices: u64,
    topk_length: u64,
    attn_sink: u64,
    out: u64,
    max_logits: u64,
    lse: u64,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
) -> PyResult<()> {
    let spec = SparseMlaPrefill::new(s_q, s_kv, h_q, d_qk, topk, sm_scale as f32)
        .with_dtype(elem_dtype(dtype)?)
        .with_kv_stride(kv_stride)
        .with_d_v(d_v);
    spec.validate().map_err(to_py)?;
    let args = DeviceSparseMlaPrefill {
        spec,
        q,
        kv,
        indices,
        topk_length: opt(topk_length),
        attn_sink: opt(attn_sink),
        out,
        max_logits,
        lse,
        workspace,
        workspace_bytes,
        stream,
    };
    // SAFETY: the caller passes live device allocations of the sizes the
    // spec implies, on `device`, kept alive until the launch is ordered.
    py.detach(|| unsafe { engine(device)?.sparse_mla_prefill_device(&args) }).map_err(to_py)
}

/// The sparse `flash_mla_with_kvcache` on device pointers: `q [b, s_q, h_q,
/// d_qk]` (`q_dtype`), a paged cache of `cache` format (`page_stride`,
/// `token_stride` in its elements, bytes for fp8), `indices i32 [b, s_q,
/// topk]` (slots), optional `topk_length` (`[b, s_q]` when `per_row`, else
/// `[b]`) and `attn_sink`; writes `out [b, s_q, h_q, 512]` and `lse f32 [b,
/// h_q, s_q]`.
#[pyfunction]
#[pyo3(signature = (device, q_dtype, cache, b, s_q, h_q, d_qk, d_v, topk, num_pages, page_size, page_stride,
                    token_stride, sm_scale, q, k_cache, indices, topk_length, per_row, attn_sink, out, lse,
                    workspace, workspace_bytes, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_sparse_mla_decode(
    py: Python<'_>,
    device: usize,
    q_dtype: &str,
    cache: &str,
    b: usize,
    s_q: usize,
    h_q: usize,
    d_qk: usize,
    d_v: usize,
    topk: usize,
    num_pages: usize,
    page_size: usize,
    page_stride: usize,
    token_stride: usize,
    sm_scale: f64,
    q: u64,
    k_cache: u64,
    indices: u64,
    topk_length: u64,
    per_row: bool,
    attn_sink: u64,
    out: u64,
    lse: u64,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
) -> PyResult<()> {
    let spec =
        SparseMlaDecode::new(b, s_q, h_q, d_qk, topk, num_pages, page_size, cache_format(cache)?, sm_scale as f32)
            .with_strides(page_stride, token_stride)
            .with_q_dtype(elem_dtype(q_dtype)?)
            .with_d_v(d_v);
    spec.validate().map_err(to_py)?;
    let args = DeviceSparseMlaDecode {
        spec,
        q,
        k_cache,
        indices,
        topk_length: opt(topk_length),
        topk_length_per_row: per_row,
        attn_sink: opt(attn_sink),
        out,
        lse,
        workspace,
        workspace_bytes,
        stream,
    };
    // SAFETY: as cuda_sparse_mla_prefill.
    py.detach(|| unsafe { engine(device)?.sparse_mla_decode_device(&args) }).map_err(to_py)
}

/// Adds this file's functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sparse_mla_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_sparse_mla_prefill, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_sparse_mla_decode, m)?)?;
    Ok(())
}
