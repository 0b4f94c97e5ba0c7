//! QSA sparse attention: the native side of `_qsa_attention`. NumPy arrays
//! (torch CPU tensors arrive as zero-copy NumPy views) run the float64
//! reference (`flashsel::ops::qsa_attention::reference_qsa_attention`),
//! rounded once; CUDA tensors run `CudaEngine::qsa_attention_device` over
//! the caller's (torch's) buffers, on the stream it names, without a host
//! synchronisation (graph-capturable: the engine compiled its modules when it
//! was created).
//!
//! Every function rebuilds and validates the request's spec from its
//! geometry, so a bad call from Python raises instead of reading out of
//! bounds. The cache geometry is the Rust crate's: `num_pages` pages of
//! `page_size` tokens, `page_stride` / `token_stride` elements apart, `h_kv`
//! packed heads of `d` values a token (one sequence `[tokens, h_kv, d]` is
//! one page of `tokens`).

use flashsel::cuda::{DeviceQsaAttention, QsaAttnPlan};
use flashsel::ops::qsa_attention::{reference_qsa_attention, AttnElem, QsaAttention, QsaAttentionOutput};
use flashsel::DType;
use half::bf16;
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

use crate::{bits_slice, engine, mla_f32, mla_out, opt_slice, to_py, value_err, MlaData};

fn elem_dtype(what: &str, name: &str) -> PyResult<DType> {
    match name {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        other => Err(value_err(format!("qsa_attention takes f32 or bf16 {what}, not {other:?}"))),
    }
}

/// The validated spec of a request (`scale` None: `1/sqrt(d)` as f32).
#[allow(clippy::too_many_arguments)]
fn make_spec(
    rows: usize,
    h_q: usize,
    h_kv: usize,
    d: usize,
    width: usize,
    num_pages: usize,
    page_size: usize,
    page_stride: usize,
    token_stride: usize,
    q_dtype: &str,
    kv_dtype: &str,
    scale: Option<f64>,
) -> PyResult<QsaAttention> {
    let mut spec = QsaAttention::new(rows, page_size, h_q, h_kv, d, width)
        .with_pages(num_pages, page_size)
        .with_strides(page_stride, token_stride)
        .with_dtypes(elem_dtype("q", q_dtype)?, elem_dtype("k / v", kv_dtype)?);
    if let Some(s) = scale {
        spec = spec.with_scale(s as f32);
    }
    spec.validate().map_err(to_py)?;
    Ok(spec)
}

/// Checks a request's geometry (the engine's spec rules, its messages) and
/// returns the workspace bytes its CUDA launch needs (0 when the plan does
/// not split the positions): a function of the shapes only.
#[pyfunction]
#[pyo3(signature = (rows, h_q, h_kv, d, width, num_pages, page_size, page_stride, token_stride, q_dtype,
                    kv_dtype, scale))]
#[allow(clippy::too_many_arguments)]
fn qsa_attention_check(
    rows: usize,
    h_q: usize,
    h_kv: usize,
    d: usize,
    width: usize,
    num_pages: usize,
    page_size: usize,
    page_stride: usize,
    token_stride: usize,
    q_dtype: &str,
    kv_dtype: &str,
    scale: Option<f64>,
) -> PyResult<usize> {
    let spec = make_spec(
        rows,
        h_q,
        h_kv,
        d,
        width,
        num_pages,
        page_size,
        page_stride,
        token_stride,
        q_dtype,
        kv_dtype,
        scale,
    )?;
    Ok(QsaAttnPlan::new(&spec).workspace_bytes(&spec))
}

fn f32s<'a>(what: &str, a: &'a PyReadonlyArray1<'_, f32>) -> PyResult<&'a [f32]> {
    bits_slice::<f32, f32, _>(what, a)
}

fn bf16s<'a>(what: &str, a: &'a PyReadonlyArray1<'_, u16>) -> PyResult<&'a [bf16]> {
    bits_slice::<bf16, u16, _>(what, a)
}

/// `qsa_attention_cpu`'s result: flat out and lse.
type QsaAttnArrays<'py> = (Bound<'py, PyAny>, Bound<'py, numpy::PyArray1<f32>>);

fn run<Q: AttnElem, KV: AttnElem>(
    py: Python<'_>,
    spec: &QsaAttention,
    q: &[Q],
    k: &[KV],
    v: &[KV],
    indices: &[i32],
    lengths: Option<&[i32]>,
) -> flashsel::Result<QsaAttentionOutput<f64>> {
    py.detach(|| reference_qsa_attention(spec, q, k, v, indices, lengths))
}

/// QSA sparse attention by the float64 reference: flat C-order q `[rows,
/// h_q, d]` of `q_dtype` ("f32": float32, "bf16": bf16 bits as uint16);
/// `k` and `v` flat spans of `kv_dtype` holding the cache (the spec's
/// geometry: token `t` of page `p`, KV head `g` at element `p * page_stride
/// + t * token_stride + g * d`); indices int32 `[rows, width]` (slots);
/// lengths int32 `[rows]` (each in `0..=width`, checked) or None (derived).
/// Returns flat (out `[rows, h_q, d]` as float32 or, with `out_bf16`, bf16
/// bits as uint16; lse float32 `[rows, h_q]`). The GIL is released while it
/// runs.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, k, v, kv_dtype, rows, h_q, h_kv, d, width, num_pages, page_size, page_stride,
                    token_stride, indices, scale, lengths, out_bf16))]
#[allow(clippy::too_many_arguments)]
fn qsa_attention_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    kv_dtype: &str,
    rows: usize,
    h_q: usize,
    h_kv: usize,
    d: usize,
    width: usize,
    num_pages: usize,
    page_size: usize,
    page_stride: usize,
    token_stride: usize,
    indices: PyReadonlyArray1<'py, i32>,
    scale: Option<f64>,
    lengths: Option<PyReadonlyArray1<'py, i32>>,
    out_bf16: bool,
) -> PyResult<QsaAttnArrays<'py>> {
    let spec = make_spec(
        rows,
        h_q,
        h_kv,
        d,
        width,
        num_pages,
        page_size,
        page_stride,
        token_stride,
        q_dtype,
        kv_dtype,
        scale,
    )?;
    let qd = MlaData::extract("q", q, q_dtype)?;
    let (kd, vd) = (MlaData::extract("k", k, kv_dtype)?, MlaData::extract("v", v, kv_dtype)?);
    let idx = indices.as_slice().map_err(|e| value_err(format!("indices: {e}")))?;
    let lens = opt_slice("lengths", &lengths)?;
    let r = match (&qd, &kd, &vd) {
        (MlaData::F32(q), MlaData::F32(k), MlaData::F32(v)) => {
            run(py, &spec, f32s("q", q)?, f32s("k", k)?, f32s("v", v)?, idx, lens)
        }
        (MlaData::F32(q), MlaData::BF16(k), MlaData::BF16(v)) => {
            run(py, &spec, f32s("q", q)?, bf16s("k", k)?, bf16s("v", v)?, idx, lens)
        }
        (MlaData::BF16(q), MlaData::F32(k), MlaData::F32(v)) => {
            run(py, &spec, bf16s("q", q)?, f32s("k", k)?, f32s("v", v)?, idx, lens)
        }
        (MlaData::BF16(q), MlaData::BF16(k), MlaData::BF16(v)) => {
            run(py, &spec, bf16s("q", q)?, bf16s("k", k)?, bf16s("v", v)?, idx, lens)
        }
        _ => return Err(value_err("qsa_attention takes f32 or bf16 q, k and v (k and v of one dtype)")),
    }
    .map_err(to_py)?;
    Ok((mla_out(py, &r.out, out_bf16), mla_f32(py, &r.lse)))
}

/// QSA sparse attention on device pointers (`CudaEngine::qsa_attention_device`):
/// q `[rows, h_q, d]` (`q_dtype`, dense), the k / v caches (`kv_dtype`, the
/// geometry of `qsa_attention_cpu`, the same strides for both), indices i32
/// `[rows, width]`, optional lengths i32 `[rows]` (0: absent, derived; device
/// values are clamped into `0..=width`); writes out `[rows, h_q, d]`
/// (`q_dtype`) and lse f32 `[rows, h_q]`. `workspace`: at least
/// `qsa_attention_check`'s bytes, 256-byte aligned (0 when that is 0).
#[pyfunction]
#[pyo3(signature = (device, q_dtype, kv_dtype, rows, h_q, h_kv, d, width, num_pages, page_size, page_stride,
                    token_stride, scale, q, k, v, indices, lengths, out, lse, workspace, workspace_bytes, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_attention(
    py: Python<'_>,
    device: usize,
    q_dtype: &str,
    kv_dtype: &str,
    rows: usize,
    h_q: usize,
    h_kv: usize,
    d: usize,
    width: usize,
    num_pages: usize,
    page_size: usize,
    page_stride: usize,
    token_stride: usize,
    scale: Option<f64>,
    q: u64,
    k: u64,
    v: u64,
    indices: u64,
    lengths: u64,
    out: u64,
    lse: u64,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
) -> PyResult<()> {
    let spec = make_spec(
        rows,
        h_q,
        h_kv,
        d,
        width,
        num_pages,
        page_size,
        page_stride,
        token_stride,
        q_dtype,
        kv_dtype,
        scale,
    )?;
    let args = DeviceQsaAttention {
        spec,
        q,
        k,
        v,
        indices,
        lengths: (lengths != 0).then_some(lengths),
        out,
        lse,
        workspace,
        workspace_bytes,
        stream,
    };
    // SAFETY: the caller passes live device allocations of the sizes the
    // spec implies, on `device`, kept alive until the launch is ordered.
    py.detach(|| unsafe { engine(device)?.qsa_attention_device(&args) }).map_err(to_py)
}

/// Adds this file's functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(qsa_attention_check, m)?)?;
    m.add_function(wrap_pyfunction!(qsa_attention_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_attention, m)?)?;
    Ok(())
}
