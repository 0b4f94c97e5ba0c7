//! `flashsel._native`: the PyO3 extension behind the `flashsel` Python package.
//!
//! This layer is deliberately thin. The pure-Python package (`pysrc/flashsel`)
//! inspects the caller's arrays and tensors, allocates the outputs with the
//! caller's own library (NumPy or torch) and calls in here with either NumPy
//! arrays (host paths; torch CPU tensors arrive as zero-copy NumPy views) or raw
//! device pointers (CUDA path). Every geometry is checked again here, so a bad
//! call from Python raises instead of reading out of bounds.
//!
//! Errors: a `flashsel::Error` caused by the request (shape, k, lengths,
//! options) becomes `ValueError` with the library's message; an allocation
//! that failed, `MemoryError`; a backend that cannot run or a CUDA driver
//! failure, `RuntimeError`.

use std::collections::HashMap;
use std::mem::{align_of, size_of};
use std::sync::{Arc, Mutex, OnceLock};

use flashsel::cuda::{
    CudaEngine, DeviceBlockKeys, DevicePages, DeviceQsaIndexer, DeviceQsaScores, DeviceQsaSelect, DeviceSelect,
};
use flashsel::ops::qsa::QsaSpec;
use flashsel::{DType, Error, NanPolicy, OutputOrder, ScoreElem, ScoresView, SelectSpec};
use half::{bf16, f16};
use numpy::{Element, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

mod dsa;
mod mla_cuda;
mod qsa_attention;

/// `flashsel::Error` to a Python exception.
fn to_py(e: Error) -> PyErr {
    match e {
        Error::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
        Error::BackendUnavailable(_) | Error::Cuda(_) | Error::Io(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

fn value_err(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

fn parse_opts(dtype: &str, order: &str, nan: &str) -> PyResult<(DType, OutputOrder, NanPolicy)> {
    Ok((
        DType::parse(dtype).map_err(to_py)?,
        OutputOrder::parse(order).map_err(to_py)?,
        NanPolicy::parse(nan).map_err(to_py)?,
    ))
}

/// Builds and validates a spec (k, sizes that must fit i32, stride).
fn make_spec(
    dtype: &str,
    rows: usize,
    cols: usize,
    row_stride: usize,
    k: usize,
    order: &str,
    nan: &str,
) -> PyResult<SelectSpec> {
    let (dtype, order, nan) = parse_opts(dtype, order, nan)?;
    let spec = SelectSpec { rows, cols, row_stride, k, dtype, order, nan };
    spec.validate().map_err(to_py)?;
    Ok(spec)
}

/// Checks a request's shape and options without running it, so the caller can
/// reject it before allocating `rows * k` outputs.
#[pyfunction]
#[pyo3(signature = (dtype, rows, cols, row_stride, k, order, nan))]
fn check_spec(
    dtype: &str,
    rows: usize,
    cols: usize,
    row_stride: usize,
    k: usize,
    order: &str,
    nan: &str,
) -> PyResult<()> {
    make_spec(dtype, rows, cols, row_stride, k, order, nan).map(|_| ())
}

// ---------------------------------------------------------------------------
// Host (CPU engine)
// ---------------------------------------------------------------------------

/// Row stride, in elements, of a 2-D NumPy array of `B`, after checking that
/// its rows are contiguous and its data aligned.
fn host_geometry<B: Element>(a: &PyReadonlyArray2<'_, B>) -> PyResult<(usize, usize, usize)> {
    let shape = a.shape();
    let (rows, cols) = (shape[0], shape[1]);
    if rows == 0 || cols == 0 {
        // Nothing is read (NumPy reports zero strides for empty arrays).
        return Ok((rows, cols, cols));
    }
    let strides = a.strides();
    let size = size_of::<B>() as isize;
    if cols > 1 && strides[1] != size {
        return Err(value_err(format!(
            "scores: elements within a row must be contiguous (column stride {} bytes, element size {size}); \
             pass a contiguous copy (numpy.ascontiguousarray / tensor.contiguous())",
            strides[1]
        )));
    }
    if (a.data() as usize) % align_of::<B>() != 0 {
        return Err(value_err("scores: the data pointer is not aligned to the element size; pass an aligned copy"));
    }
    let row_stride = if rows == 1 {
        cols
    } else {
        let s0 = strides[0];
        if s0 <= 0 || s0 % size != 0 {
            return Err(value_err(format!(
                "scores: row stride {s0} bytes is not a positive multiple of the element size {size}"
            )));
        }
        (s0 / size) as usize
    };
    Ok((rows, cols, row_stride))
}

/// A 2-D NumPy array of `B` bits (checked by [`host_geometry`]) as a view of
/// `T` scores.
fn host_view<'a, T: ScoreElem, B: Element>(
    scores: &'a PyReadonlyArray2<'_, B>,
    rows: usize,
    cols: usize,
    row_stride: usize,
) -> PyResult<ScoresView<'a, T>> {
    // The bit-level reinterpretation below needs identical layouts
    // (`half::f16` and `half::bf16` are `repr(transparent)` over `u16`).
    assert!(size_of::<B>() == size_of::<T>() && align_of::<B>() == align_of::<T>());
    let need = if rows == 0 { 0 } else { (rows - 1) * row_stride + cols };
    // SAFETY: NumPy guarantees that every element addressed by the array's
    // shape and (positive, checked by host_geometry) strides lies inside its
    // buffer; the span from the first element of row 0 to the last of row
    // rows-1 is `need` elements. The pointer is aligned (checked) and `B` and
    // `T` have the same layout (asserted).
    let data: &[T] =
        if need == 0 { &[] } else { unsafe { std::slice::from_raw_parts(scores.data() as *const T, need) } };
    ScoresView::with_stride(data, rows, cols, row_stride).map_err(to_py)
}

/// The typed host path. `B` is the NumPy element type the bits travel as
/// (`f32`, or `u16` for both 16-bit floats), `T` the score type they are.
#[allow(clippy::too_many_arguments)]
fn select_host<T: ScoreElem, B: Element>(
    py: Python<'_>,
    scores: &Bound<'_, PyAny>,
    k: usize,
    order: OutputOrder,
    nan: NanPolicy,
    lengths: Option<&[i32]>,
    starts: Option<&[i32]>,
    pages: Option<HostPages<'_>>,
    out_indices: &mut [i32],
    out_values: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let scores: PyReadonlyArray2<'_, B> = scores.extract().map_err(|e| PyTypeError::new_err(format!("scores: {e}")))?;
    let (rows, cols, row_stride) = host_geometry(&scores)?;
    let spec = SelectSpec { rows, cols, row_stride, k, dtype: T::DTYPE, order, nan };
    spec.validate().map_err(to_py)?;
    if out_indices.len() != rows * k {
        return Err(value_err(format!("out_indices holds {} elements, expected {rows} x {k}", out_indices.len())));
    }
    let view = host_view::<T, B>(&scores, rows, cols, row_stride)?;

    let mut values_guard: Option<PyReadwriteArray2<'_, B>> = match out_values {
        None => None,
        Some(v) => Some(v.extract().map_err(|e| PyTypeError::new_err(format!("out_values: {e}")))?),
    };
    let values: Option<&mut [T]> = match values_guard.as_mut() {
        None => None,
        Some(g) => {
            let s = g.as_slice_mut().map_err(|e| value_err(format!("out_values: {e}")))?;
            if s.len() != rows * k {
                return Err(value_err(format!("out_values holds {} elements, expected {rows} x {k}", s.len())));
            }
            // SAFETY: same layout, asserted above; the slice is uniquely borrowed.
            Some(unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut T, s.len()) })
        }
    };
    let map = page_map(pages)?;
    py.detach(|| match (starts, &map) {
        (_, Some(m)) => flashsel::cpu::select_ranges_paged_into(&view, &spec, starts, lengths, m, out_indices, values),
        (None, None) => flashsel::cpu::select_into(&view, &spec, lengths, out_indices, values),
        (Some(s), None) => flashsel::cpu::select_ranges_into(&view, &spec, s, lengths, out_indices, values),
    })
    .map_err(to_py)
}

/// A host page table: (table, max_pages, page_size, seq_ids).
type HostPages<'a> = (&'a [i32], usize, usize, &'a [i32]);

/// The page map of checked host page arguments, if any.
fn page_map<'a>(pages: Option<HostPages<'a>>) -> PyResult<Option<flashsel::PageMap<'a>>> {
    pages
        .map(|(table, max_pages, page_size, seq_ids)| {
            flashsel::PageMap::new(table, max_pages, page_size, seq_ids).map_err(to_py)
        })
        .transpose()
}

/// The page table arguments of the host paths, checked to come together.
fn host_pages<'a>(
    page_table: &'a Option<PyReadonlyArray2<'_, i32>>,
    page_size: usize,
    seq_ids: &'a Option<PyReadonlyArray1<'_, i32>>,
) -> PyResult<Option<HostPages<'a>>> {
    match (page_table, seq_ids) {
        (None, None) => Ok(None),
        (Some(t), Some(s)) => {
            let max_pages = t.shape()[1];
            let table = t.as_slice().map_err(|e| value_err(format!("page_table: {e}")))?;
            let seqs = s.as_slice().map_err(|e| value_err(format!("seq_ids: {e}")))?;
            Ok(Some((table, max_pages, page_size, seqs)))
        }
        _ => Err(value_err("page_table and seq_ids come together: pass both or neither")),
    }
}

/// Top-k of a 2-D NumPy array on the CPU engine, written into `out_indices`
/// (int32, C-contiguous, rows x k) and `out_values` (same bits type as
/// `scores`). `dtype` says what the bits are: "f32" (float32 array), "f16" or
/// "bf16" (uint16 arrays). The GIL is released while selecting.
#[pyfunction]
#[pyo3(signature = (scores, dtype, k, order, nan, lengths, out_indices, out_values, starts=None,
                    page_table=None, page_size=64, seq_ids=None))]
#[allow(clippy::too_many_arguments)]
fn select_cpu(
    py: Python<'_>,
    scores: &Bound<'_, PyAny>,
    dtype: &str,
    k: usize,
    order: &str,
    nan: &str,
    lengths: Option<PyReadonlyArray1<'_, i32>>,
    mut out_indices: PyReadwriteArray2<'_, i32>,
    out_values: Option<&Bound<'_, PyAny>>,
    starts: Option<PyReadonlyArray1<'_, i32>>,
    page_table: Option<PyReadonlyArray2<'_, i32>>,
    page_size: usize,
    seq_ids: Option<PyReadonlyArray1<'_, i32>>,
) -> PyResult<()> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let pages = host_pages(&page_table, page_size, &seq_ids)?;
    let lengths = opt_slice("lengths", &lengths)?;
    let starts = opt_slice("starts", &starts)?;
    let idx = out_indices.as_slice_mut().map_err(|e| value_err(format!("out_indices: {e}")))?;
    match dt {
        DType::F32 => select_host::<f32, f32>(py, scores, k, order, nan, lengths, starts, pages, idx, out_values),
        DType::F16 => select_host::<f16, u16>(py, scores, k, order, nan, lengths, starts, pages, idx, out_values),
        DType::BF16 => select_host::<bf16, u16>(py, scores, k, order, nan, lengths, starts, pages, idx, out_values),
        other => Err(value_err(format!("select takes f32, bf16 or f16 scores, not {other}"))),
    }
}

/// The typed QSA host path (see `qsa_select_cpu`).
#[allow(clippy::too_many_arguments)]
fn qsa_host<T: ScoreElem, B: Element>(
    py: Python<'_>,
    scores: &Bound<'_, PyAny>,
    positions: &[i64],
    spec: flashsel::ops::qsa::QsaSpec,
    pages: Option<HostPages<'_>>,
) -> PyResult<flashsel::ops::qsa::QsaSelection> {
    let scores: PyReadonlyArray2<'_, B> = scores.extract().map_err(|e| PyTypeError::new_err(format!("scores: {e}")))?;
    let (rows, blocks, row_stride) = host_geometry(&scores)?;
    let spec = flashsel::ops::qsa::QsaSpec { rows, blocks, row_stride, ..spec };
    let view = host_view::<T, B>(&scores, rows, blocks, row_stride)?;
    let map = page_map(pages)?;
    py.detach(|| flashsel::cpu::qsa_select(&view, positions, &spec, map.as_ref())).map_err(to_py)
}

/// `qsa_select_cpu`'s result: ids `[rows, width]` and counts `[rows]`.
type QsaArrays<'py> = (Bound<'py, numpy::PyArray2<i32>>, Bound<'py, numpy::PyArray1<i32>>);

/// QSA block selection of a 2-D NumPy array of block scores on the CPU
/// engine: returns (ids int32 [rows, width], counts int32 [rows]). `dtype`
/// as for `select_cpu`; `page_table` (int32 [sequences, max_pages], C order)
/// and `seq_ids` (int32 [rows]) come together or not at all.
#[pyfunction]
#[pyo3(signature = (scores, dtype, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids))]
#[allow(clippy::too_many_arguments)]
fn qsa_select_cpu<'py>(
    py: Python<'py>,
    scores: &Bound<'py, PyAny>,
    dtype: &str,
    positions: PyReadonlyArray1<'py, i64>,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
    page_table: Option<PyReadonlyArray2<'py, i32>>,
    page_size: usize,
    seq_ids: Option<PyReadonlyArray1<'py, i32>>,
) -> PyResult<QsaArrays<'py>> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let positions = positions.as_slice().map_err(|e| value_err(format!("positions: {e}")))?;
    let spec = flashsel::ops::qsa::QsaSpec::new(0, 0)
        .with_ratio(ratio)
        .with_k_blocks(k_blocks)
        .with_order(order)
        .with_nan(nan);
    let pages = host_pages(&page_table, page_size, &seq_ids)?;
    let sel = match dt {
        DType::F32 => qsa_host::<f32, f32>(py, scores, positions, spec, pages)?,
        DType::F16 => qsa_host::<f16, u16>(py, scores, positions, spec, pages)?,
        DType::BF16 => qsa_host::<bf16, u16>(py, scores, positions, spec, pages)?,
        other => return Err(value_err(format!("qsa_select takes f32, bf16 or f16 scores, not {other}"))),
    };
    let ids = numpy::PyArray1::from_vec(py, sel.ids).reshape([sel.rows, sel.width])?;
    Ok((ids, numpy::PyArray1::from_vec(py, sel.counts)))
}

// ---------------------------------------------------------------------------
// CUDA (device buffers owned by the caller, e.g. torch)
// ---------------------------------------------------------------------------

/// One engine per device ordinal, created on first use and kept for the life
/// of the process. Failures are not cached (the next call tries again).
fn engines() -> &'static Mutex<HashMap<usize, Arc<CudaEngine>>> {
    static ENGINES: OnceLock<Mutex<HashMap<usize, Arc<CudaEngine>>>> = OnceLock::new();
    ENGINES.get_or_init(|| Mutex::new(HashMap::new()))
}

fn engine(device: usize) -> flashsel::Result<Arc<CudaEngine>> {
    let mut map = engines().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = map.get(&device) {
        return Ok(Arc::clone(e));
    }
    let e = Arc::new(CudaEngine::new(device)?);
    // Compile and load every kernel now, so that NVRTC and module loading stay
    // out of later calls (and out of CUDA graph captures).
    e.warm_up()?;
    map.insert(device, Arc::clone(&e));
    Ok(e)
}

/// Creates (or finds) the engine for `device`; returns None when it is usable,
/// else the reason it is not.
#[pyfunction]
fn cuda_engine_error(py: Python<'_>, device: usize) -> Option<String> {
    py.detach(|| engine(device).err().map(|e| e.to_string()))
}

/// Bytes of device workspace a `cuda_select` call with this geometry needs.
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, cols, row_stride, k, order, nan, has_lengths))]
#[allow(clippy::too_many_arguments)]
fn cuda_workspace_bytes(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    cols: usize,
    row_stride: usize,
    k: usize,
    order: &str,
    nan: &str,
    has_lengths: bool,
) -> PyResult<usize> {
    let spec = make_spec(dtype, rows, cols, row_stride, k, order, nan)?;
    py.detach(|| engine(device)?.workspace_bytes(&spec, has_lengths)).map_err(to_py)
}

/// Launches one selection on `stream` over caller-owned device buffers
/// (`CUdeviceptr`s as integers) and returns without waiting.
///
/// The Python layer passes pointers of live torch allocations of the right
/// sizes; this is the one unchecked boundary of the package, which is why it
/// is private (`flashsel.topk` is the public entry).
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, cols, row_stride, k, order, nan,
                    scores, lengths, out_indices, out_values, workspace, workspace_bytes, stream,
                    starts=None, pages=None))]
#[allow(clippy::too_many_arguments)]
fn cuda_select(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    cols: usize,
    row_stride: usize,
    k: usize,
    order: &str,
    nan: &str,
    scores: u64,
    lengths: Option<u64>,
    out_indices: u64,
    out_values: Option<u64>,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
    starts: Option<u64>,
    pages: Option<DevicePagesArgs>,
) -> PyResult<()> {
    let spec = make_spec(dtype, rows, cols, row_stride, k, order, nan)?;
    let pages = pages.map(device_pages).transpose()?;
    if starts == Some(0) {
        return Err(value_err("starts: null device pointer"));
    }
    if rows > 0 && cols > 0 && scores == 0 {
        return Err(value_err("scores: null device pointer"));
    }
    if rows > 0 && out_indices == 0 {
        return Err(value_err("out_indices: null device pointer"));
    }
    if lengths == Some(0) || out_values == Some(0) {
        return Err(value_err("null device pointer for lengths or out_values"));
    }
    let args = DeviceSelect {
        spec,
        scores,
        lengths,
        out_indices,
        out_values,
        workspace,
        workspace_bytes,
        stream,
        starts,
        pages,
    };
    // SAFETY: the Python caller passes pointers of live device allocations
    // of the sizes the spec implies, on `device`, and keeps them alive for
    // the duration of the call; the launch is stream-ordered after that (the
    // engine checks the workspace's size and pointer).
    py.detach(|| unsafe { engine(device)?.select_device(&args) }).map_err(to_py)
}

/// A device page table from Python: (table pointer, sequences, max_pages,
/// page_size, seq_ids pointer).
type DevicePagesArgs = (u64, usize, usize, usize, u64);

fn device_pages((table, sequences, max_pages, page_size, seq_ids): DevicePagesArgs) -> PyResult<DevicePages> {
    if table == 0 || seq_ids == 0 {
        return Err(value_err("page_table / seq_ids: null device pointer"));
    }
    Ok(DevicePages { table, sequences, max_pages, page_size, seq_ids })
}

/// The QSA spec from Python's arguments, validated.
#[allow(clippy::too_many_arguments)]
fn qsa_spec(
    rows: usize,
    blocks: usize,
    row_stride: usize,
    ratio: usize,
    k_blocks: usize,
    order: OutputOrder,
    nan: NanPolicy,
) -> PyResult<QsaSpec> {
    let spec = QsaSpec::new(rows, blocks)
        .with_stride(row_stride)
        .with_ratio(ratio)
        .with_k_blocks(k_blocks)
        .with_order(order)
        .with_nan(nan);
    spec.validate().map_err(to_py)?;
    Ok(spec)
}

/// Bytes of device workspace a `cuda_qsa_select` call needs.
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, blocks, row_stride, ratio, k_blocks, order, nan))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_workspace_bytes(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    blocks: usize,
    row_stride: usize,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
) -> PyResult<usize> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let spec = qsa_spec(rows, blocks, row_stride, ratio, k_blocks, order, nan)?;
    py.detach(|| engine(device)?.qsa_workspace_bytes(&spec, dt)).map_err(to_py)
}

/// Launches one QSA block selection on `stream` over caller-owned device
/// buffers (int32 positions [rows], ids [rows, width], counts [rows]) and
/// returns without waiting; private for the reasons of `cuda_select`.
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, blocks, row_stride, ratio, k_blocks, order, nan,
                    scores, positions, ids, counts, pages, workspace, workspace_bytes, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_select(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    blocks: usize,
    row_stride: usize,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
    scores: u64,
    positions: u64,
    ids: u64,
    counts: u64,
    pages: Option<DevicePagesArgs>,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
) -> PyResult<()> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let spec = qsa_spec(rows, blocks, row_stride, ratio, k_blocks, order, nan)?;
    let pages = pages.map(device_pages).transpose()?;
    if rows > 0 && ((blocks > 0 && scores == 0) || positions == 0 || ids == 0 || counts == 0) {
        return Err(value_err("scores / positions / ids / counts: null device pointer"));
    }
    let args = DeviceQsaSelect {
        spec,
        dtype: dt,
        scores,
        positions,
        ids,
        counts: Some(counts),
        pages,
        workspace,
        workspace_bytes,
        stream,
    };
    // SAFETY: as cuda_select: live device allocations of the sizes the
    // spec implies, on `device`, kept alive by the caller.
    py.detach(|| unsafe { engine(device)?.qsa_select_device(&args) }).map_err(to_py)
}

// ---------------------------------------------------------------------------
// Context-parallel merge (flashsel.distributed)
// ---------------------------------------------------------------------------

/// The typed CPU merge: gathered planes (ids int32, value bits) of
/// `[ranks * rows * k]` each, to (indices, value bits) of `[rows * k]`.
#[allow(clippy::too_many_arguments)]
fn merge_host<T: ScoreElem, B: Element + Copy>(
    py: Python<'_>,
    ids: &[i32],
    values: &Bound<'_, PyAny>,
    spec: SelectSpec,
    layout: &flashsel::ops::shard::ShardLayout,
    starts: Option<&[i32]>,
    lengths: Option<&[i32]>,
) -> PyResult<(Vec<i32>, Vec<B>)> {
    let v: PyReadonlyArray1<'_, B> = values.extract().map_err(|e| PyTypeError::new_err(format!("values: {e}")))?;
    let vals: &[T] = bits_slice("values", &v)?;
    let n = spec.rows * spec.k;
    let mut out_i = vec![-1i32; n];
    let mut out_v = vec![T::neg_inf(); n];
    py.detach(|| {
        flashsel::cpu::merge_candidates_into(ids, vals, &spec, layout, starts, lengths, &mut out_i, Some(&mut out_v))
    })
    .map_err(to_py)?;
    // SAFETY: as above.
    let out_b: Vec<B> = out_v.iter().map(|x| unsafe { std::ptr::read(x as *const T as *const B) }).collect();
    Ok((out_i, out_b))
}

/// The exact merge of every rank's candidates on the CPU engine
/// (`flashsel::cpu::merge_candidates`): `ids` int32 and `values` (float32,
/// or uint16 bits for f16 / bf16), flat `[ranks * rows * k]` each in rank
/// order; `shard_lens` the ranks' column counts. Returns (indices int32
/// [rows * k], values [rows * k]) flat.
#[pyfunction]
#[pyo3(signature = (ids, values, dtype, shard_lens, rows, k, order, nan, lengths=None, starts=None))]
#[allow(clippy::too_many_arguments)]
fn shard_merge_cpu<'py>(
    py: Python<'py>,
    ids: PyReadonlyArray1<'py, i32>,
    values: &Bound<'py, PyAny>,
    dtype: &str,
    shard_lens: Vec<usize>,
    rows: usize,
    k: usize,
    order: &str,
    nan: &str,
    lengths: Option<PyReadonlyArray1<'py, i32>>,
    starts: Option<PyReadonlyArray1<'py, i32>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let layout = flashsel::ops::shard::ShardLayout::from_lens(&shard_lens).map_err(to_py)?;
    let spec = SelectSpec::new(rows, layout.cols(), k, dt).with_order(order).with_nan(nan);
    let ids = ids.as_slice().map_err(|e| value_err(format!("ids: {e}")))?;
    let lengths = opt_slice("lengths", &lengths)?;
    let starts = opt_slice("starts", &starts)?;
    Ok(match dt {
        DType::F32 => {
            let (i, v) = merge_host::<f32, f32>(py, ids, values, spec, &layout, starts, lengths)?;
            (numpy::PyArray1::from_vec(py, i).into_any(), numpy::PyArray1::from_vec(py, v).into_any())
        }
        DType::F16 => {
            let (i, v) = merge_host::<f16, u16>(py, ids, values, spec, &layout, starts, lengths)?;
            (numpy::PyArray1::from_vec(py, i).into_any(), numpy::PyArray1::from_vec(py, v).into_any())
        }
        DType::BF16 => {
            let (i, v) = merge_host::<bf16, u16>(py, ids, values, spec, &layout, starts, lengths)?;
            (numpy::PyArray1::from_vec(py, i).into_any(), numpy::PyArray1::from_vec(py, v).into_any())
        }
        other => return Err(value_err(format!("the merge takes f32, bf16 or f16 values, not {other}"))),
    })
}

/// Bytes of device workspace a `cuda_shard_merge` call needs.
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, cols, k, ranks, order, nan))]
#[allow(clippy::too_many_arguments)]
fn cuda_shard_merge_workspace_bytes(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    cols: usize,
    k: usize,
    ranks: usize,
    order: &str,
    nan: &str,
) -> PyResult<usize> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let spec = SelectSpec::new(rows, cols, k, dt).with_order(order).with_nan(nan);
    py.detach(|| engine(device)?.shard_merge_workspace_bytes(&spec, ranks)).map_err(to_py)
}

/// Launches the GPU merge on `stream` over caller-owned device buffers
/// (ids int32 / values [ranks, rows, k], each rank's ids ascending;
/// out_indices int32 / out_values [rows, k]) and returns without waiting.
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, cols, k, ranks, order, nan,
                    ids, values, out_indices, out_values, workspace, workspace_bytes, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_shard_merge(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    cols: usize,
    k: usize,
    ranks: usize,
    order: &str,
    nan: &str,
    ids: u64,
    values: u64,
    out_indices: u64,
    out_values: Option<u64>,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
) -> PyResult<()> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let spec = SelectSpec::new(rows, cols, k, dt).with_order(order).with_nan(nan);
    let args = flashsel::ops::shard::device::DeviceShardMerge {
        spec,
        ranks,
        ids,
        values,
        out_indices,
        out_values,
        workspace,
        workspace_bytes,
        stream,
    };
    // SAFETY: the Python caller passes live device allocations of the sizes
    // the arguments imply, on `device`; the launch is stream-ordered.
    py.detach(|| unsafe { engine(device)?.shard_merge_device(&args) }).map_err(to_py)
}

/// The typed CPU QSA merge (`flashsel::cpu::qsa_merge`).
#[allow(clippy::too_many_arguments)]
fn qsa_merge_host<T: ScoreElem, B: Element + Copy>(
    py: Python<'_>,
    ids: &[i32],
    values: &Bound<'_, PyAny>,
    positions: &[i64],
    spec: QsaSpec,
    layout: &flashsel::ops::shard::ShardLayout,
    pages: Option<HostPages<'_>>,
) -> PyResult<flashsel::ops::qsa::QsaSelection> {
    let v: PyReadonlyArray1<'_, B> = values.extract().map_err(|e| PyTypeError::new_err(format!("values: {e}")))?;
    let vals: &[T] = bits_slice("values", &v)?;
    let map = page_map(pages)?;
    py.detach(|| flashsel::cpu::qsa_merge(ids, vals, positions, &spec, layout, map.as_ref())).map_err(to_py)
}

/// QSA block selection from every rank's gathered block candidates on the
/// CPU engine (`flashsel::cpu::qsa_merge`): `ids` int32 and `values`
/// (float32, or uint16 bits for f16 / bf16), flat `[ranks * rows *
/// k_blocks]` each in rank order (each rank's ids ascending); `shard_lens`
/// the ranks' block counts. Returns (ids int32 [rows, width], counts int32
/// [rows]), the bytes of `qsa_select` on the whole rows.
#[pyfunction]
#[pyo3(signature = (ids, values, dtype, shard_lens, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids))]
#[allow(clippy::too_many_arguments)]
fn qsa_merge_cpu<'py>(
    py: Python<'py>,
    ids: PyReadonlyArray1<'py, i32>,
    values: &Bound<'py, PyAny>,
    dtype: &str,
    shard_lens: Vec<usize>,
    positions: PyReadonlyArray1<'py, i64>,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
    page_table: Option<PyReadonlyArray2<'py, i32>>,
    page_size: usize,
    seq_ids: Option<PyReadonlyArray1<'py, i32>>,
) -> PyResult<QsaArrays<'py>> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let layout = flashsel::ops::shard::ShardLayout::from_lens(&shard_lens).map_err(to_py)?;
    let positions = positions.as_slice().map_err(|e| value_err(format!("positions: {e}")))?;
    let spec = qsa_spec(positions.len(), layout.cols(), layout.cols(), ratio, k_blocks, order, nan)?;
    let ids = ids.as_slice().map_err(|e| value_err(format!("ids: {e}")))?;
    let pages = host_pages(&page_table, page_size, &seq_ids)?;
    let sel = match dt {
        DType::F32 => qsa_merge_host::<f32, f32>(py, ids, values, positions, spec, &layout, pages)?,
        DType::F16 => qsa_merge_host::<f16, u16>(py, ids, values, positions, spec, &layout, pages)?,
        DType::BF16 => qsa_merge_host::<bf16, u16>(py, ids, values, positions, spec, &layout, pages)?,
        other => return Err(value_err(format!("the merge takes f32, bf16 or f16 values, not {other}"))),
    };
    let out = numpy::PyArray1::from_vec(py, sel.ids).reshape([sel.rows, sel.width])?;
    Ok((out, numpy::PyArray1::from_vec(py, sel.counts)))
}

/// Bytes of device workspace a `cuda_qsa_shard_merge` call needs.
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, blocks, ratio, k_blocks, ranks, order, nan))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_shard_merge_workspace_bytes(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    blocks: usize,
    ratio: usize,
    k_blocks: usize,
    ranks: usize,
    order: &str,
    nan: &str,
) -> PyResult<usize> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let spec = qsa_spec(rows, blocks, blocks, ratio, k_blocks, order, nan)?;
    py.detach(|| engine(device)?.qsa_shard_merge_workspace_bytes(&spec, dt, ranks)).map_err(to_py)
}

/// Launches the GPU QSA merge on `stream` over caller-owned device buffers
/// (ids int32 / values [ranks, rows, k_blocks], each rank's ids ascending;
/// positions int32 [rows]; out_ids int32 [rows, width], counts int32
/// [rows]) and returns without waiting.
#[pyfunction]
#[pyo3(signature = (device, dtype, rows, blocks, ratio, k_blocks, ranks, order, nan,
                    ids, values, positions, out_ids, counts, pages, workspace, workspace_bytes, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_shard_merge(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    rows: usize,
    blocks: usize,
    ratio: usize,
    k_blocks: usize,
    ranks: usize,
    order: &str,
    nan: &str,
    ids: u64,
    values: u64,
    positions: u64,
    out_ids: u64,
    counts: u64,
    pages: Option<DevicePagesArgs>,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
) -> PyResult<()> {
    let (dt, order, nan) = parse_opts(dtype, order, nan)?;
    let spec = qsa_spec(rows, blocks, blocks, ratio, k_blocks, order, nan)?;
    let pages = pages.map(device_pages).transpose()?;
    if rows > 0 && (ids == 0 || values == 0 || positions == 0 || out_ids == 0 || counts == 0) {
        return Err(value_err("ids / values / positions / out_ids / counts: null device pointer"));
    }
    let args = flashsel::ops::shard::device::DeviceQsaShardMerge {
        spec,
        dtype: dt,
        ranks,
        ids,
        values,
        positions,
        out_ids,
        counts: Some(counts),
        pages,
        workspace,
        workspace_bytes,
        stream,
    };
    // SAFETY: the Python caller passes live device allocations of the sizes
    // the arguments imply, on `device`; the launch is stream-ordered.
    py.detach(|| unsafe { engine(device)?.qsa_shard_merge_device(&args) }).map_err(to_py)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(check_spec, m)?)?;
    m.add_function(wrap_pyfunction!(select_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(shard_merge_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_shard_merge_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_shard_merge, m)?)?;
    m.add_function(wrap_pyfunction!(qsa_merge_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_shard_merge_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_shard_merge, m)?)?;
    m.add_function(wrap_pyfunction!(qsa_select_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_engine_error, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_select, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_select, m)?)?;
    m.add_function(wrap_pyfunction!(qsa_scores_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_scores, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_indexer_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_qsa_indexer, m)?)?;
    m.add_function(wrap_pyfunction!(qsa_indexer_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(sparse_mla_prefill_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(sparse_mla_decode_cpu, m)?)?;
    mla_cuda::register(m)?;
    qsa_attention::register(m)?;
    dsa::register(m)?;
    Ok(())
}

// ---------------------------------------------------------------------------
// QSA indexer scores (CPU engine)
// ---------------------------------------------------------------------------

/// [`bits_slice`] of an array of any rank, and its shape.
fn typed_slice<'a, T, B: Element>(
    what: &str,
    a: &'a numpy::PyReadonlyArrayDyn<'_, B>,
) -> PyResult<(&'a [T], Vec<usize>)> {
    Ok((bits_slice(what, a)?, a.shape().to_vec()))
}

/// The typed host path of `qsa_scores_cpu`: `Q`/`K` the element types, `QB`/`KB`
/// the NumPy types their bits travel as.
#[allow(clippy::too_many_arguments)]
fn qsa_scores_host<'py, Q, QB, K, KB>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    kbar: &Bound<'py, PyAny>,
    positions: &[i64],
    ratio: usize,
    pages: Option<HostPages<'_>>,
) -> PyResult<Bound<'py, numpy::PyArray2<f32>>>
where
    Q: flashsel::ops::indexer::QueryElem,
    K: flashsel::ops::indexer::KeyElem,
    QB: Element,
    KB: Element,
{
    indexer_inputs::<Q, QB, K, KB, _>(q, kbar, ratio, pages, |qs, keys, spec| {
        let scores = py.detach(|| flashsel::cpu::qsa_scores(qs, keys, positions, &spec)).map_err(to_py)?;
        numpy::PyArray1::from_vec(py, scores).reshape([spec.rows, spec.blocks])
    })
}

/// The inputs of the indexer (`qsa_scores_cpu`, `qsa_indexer_cpu`) as typed
/// slices, block keys and a scores spec (`NB` from the keys or the page
/// table), handed to `f`.
fn indexer_inputs<'py, Q, QB, K, KB, R>(
    q: &Bound<'py, PyAny>,
    kbar: &Bound<'py, PyAny>,
    ratio: usize,
    pages: Option<HostPages<'_>>,
    f: impl FnOnce(&[Q], &flashsel::ops::indexer::BlockKeys<'_, K>, flashsel::ops::indexer::QsaScoresSpec) -> PyResult<R>,
) -> PyResult<R>
where
    Q: flashsel::ops::indexer::QueryElem,
    K: flashsel::ops::indexer::KeyElem,
    QB: Element,
    KB: Element,
{
    use flashsel::ops::indexer::{BlockKeys, QsaScoresSpec};
    let q: numpy::PyReadonlyArrayDyn<'py, QB> = q.extract().map_err(|e| PyTypeError::new_err(format!("q: {e}")))?;
    let kbar: numpy::PyReadonlyArrayDyn<'py, KB> =
        kbar.extract().map_err(|e| PyTypeError::new_err(format!("kbar: {e}")))?;
    let (qs, qshape) = typed_slice::<Q, QB>("q", &q)?;
    let (ks, kshape) = typed_slice::<K, KB>("kbar", &kbar)?;
    let [rows, heads, dim] = qshape[..] else {
        return Err(value_err(format!("q must be 3-D [queries, heads, d], got shape {qshape:?}")));
    };
    let spec = QsaScoresSpec::new(rows, 0).with_heads(heads).with_dim(dim).with_ratio(ratio);
    let (blocks, map) = match pages {
        None => {
            let [blocks, kd] = kshape[..] else {
                return Err(value_err(format!(
                    "kbar must be 2-D [blocks, d] without a page table (3-D [pages, page_size / ratio, d] with one), \
                     got shape {kshape:?}"
                )));
            };
            if kd != dim {
                return Err(value_err(format!("kbar has d = {kd} but q has d = {dim}")));
            }
            (blocks, None)
        }
        Some((table, max_pages, page_size, seq_ids)) => {
            let [_, per_page, kd] = kshape[..] else {
                return Err(value_err(format!(
                    "with a page table kbar must be 3-D [pages, page_size / ratio, d], got shape {kshape:?}"
                )));
            };
            if kd != dim {
                return Err(value_err(format!("kbar has d = {kd} but q has d = {dim}")));
            }
            if ratio == 0 || page_size % ratio != 0 || per_page != page_size / ratio {
                return Err(value_err(format!(
                    "kbar's blocks per page ({per_page}) must be page_size / ratio = {page_size} / {ratio} \
                     (a whole number of blocks)"
                )));
            }
            let map = flashsel::PageMap::new(table, max_pages, page_size, seq_ids).map_err(to_py)?;
            (max_pages * per_page, Some(map))
        }
    };
    let spec = QsaScoresSpec { blocks, ..spec };
    let keys = match map {
        None => BlockKeys::Contiguous(ks),
        Some(pages) => BlockKeys::Paged { kbar: ks, pages },
    };
    f(qs, &keys, spec)
}

/// QSA indexer scores on the CPU engine: float32 `[T, NB]` from `q`
/// (`[T, H, d]`, float32 or bf16 bits as uint16; `q_dtype` "f32" or "bf16")
/// and `kbar` (`[NB, d]`, or `[pages, page_size / ratio, d]` with a page
/// table; float32, bf16 bits as uint16 or e4m3 bits as uint8; `k_dtype`
/// "f32", "bf16" or "f8e4m3"), both C-contiguous. `NB` is the keys' blocks,
/// or `max_pages * page_size / ratio` with a page table. The GIL is released
/// while it runs.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, kbar, k_dtype, positions, ratio, page_table, page_size, seq_ids))]
#[allow(clippy::too_many_arguments)]
fn qsa_scores_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    kbar: &Bound<'py, PyAny>,
    k_dtype: &str,
    positions: PyReadonlyArray1<'py, i64>,
    ratio: usize,
    page_table: Option<PyReadonlyArray2<'py, i32>>,
    page_size: usize,
    seq_ids: Option<PyReadonlyArray1<'py, i32>>,
) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
    use flashsel::ops::indexer::F8E4M3;
    let positions = positions.as_slice().map_err(|e| value_err(format!("positions: {e}")))?;
    if let Some(t) = &page_table {
        if !t.is_c_contiguous() {
            return Err(value_err("page_table: the array is not C-contiguous; pass np.ascontiguousarray(x)"));
        }
    }
    let pages = host_pages(&page_table, page_size, &seq_ids)?;
    let (qd, kd) = (DType::parse(q_dtype).map_err(to_py)?, DType::parse(k_dtype).map_err(to_py)?);
    match (qd, kd) {
        (DType::F32, DType::F32) => qsa_scores_host::<f32, f32, f32, f32>(py, q, kbar, positions, ratio, pages),
        (DType::F32, DType::BF16) => qsa_scores_host::<f32, f32, bf16, u16>(py, q, kbar, positions, ratio, pages),
        (DType::F32, DType::F8E4M3) => qsa_scores_host::<f32, f32, F8E4M3, u8>(py, q, kbar, positions, ratio, pages),
        (DType::BF16, DType::F32) => qsa_scores_host::<bf16, u16, f32, f32>(py, q, kbar, positions, ratio, pages),
        (DType::BF16, DType::BF16) => qsa_scores_host::<bf16, u16, bf16, u16>(py, q, kbar, positions, ratio, pages),
        (DType::BF16, DType::F8E4M3) => qsa_scores_host::<bf16, u16, F8E4M3, u8>(py, q, kbar, positions, ratio, pages),
        (DType::F32 | DType::BF16, other) => {
            Err(value_err(format!("qsa_scores takes f32, bf16 or f8e4m3 keys, not {other}")))
        }
        (other, _) => Err(value_err(format!("qsa_scores takes f32 or bf16 queries, not {other}"))),
    }
}

// ---------------------------------------------------------------------------
// Sparse MLA attention (the CPU reference)
// ---------------------------------------------------------------------------

/// A C-contiguous, aligned NumPy array of `B` as a slice of `T` (the same
/// layout): f32 / u16 / u8 bits as f32, bf16, f16 or e4m3 values.
fn bits_slice<'a, T, B: Element, D: numpy::ndarray::Dimension>(
    what: &str,
    a: &'a numpy::PyReadonlyArray<'_, B, D>,
) -> PyResult<&'a [T]> {
    assert!(size_of::<B>() == size_of::<T>() && align_of::<B>() == align_of::<T>());
    if !a.is_c_contiguous() {
        return Err(value_err(format!(
            "{what}: the array is not C-contiguous; pass np.ascontiguousarray(x) / x.contiguous()"
        )));
    }
    let s = a.as_slice().map_err(|e| value_err(format!("{what}: {e} (pass an aligned, C-contiguous array)")))?;
    // SAFETY: `B` and `T` have the same size and alignment (asserted; `bf16`
    // is `repr(transparent)` over `u16`, `F8E4M3` over `u8`) and every bit
    // pattern is a valid `T`; the slice borrows the array's buffer, which the
    // guard keeps alive.
    Ok(unsafe { std::slice::from_raw_parts(s.as_ptr() as *const T, s.len()) })
}

/// One flat q / kv / cache argument of the sparse MLA paths, by its dtype.
enum MlaData<'py> {
    F32(PyReadonlyArray1<'py, f32>),
    BF16(PyReadonlyArray1<'py, u16>),
    U8(PyReadonlyArray1<'py, u8>),
}

impl<'py> MlaData<'py> {
    /// `a` (1-D float32, uint16 bf16 bits or uint8 fp8 bytes) as `dtype` says.
    fn extract(what: &str, a: &Bound<'py, PyAny>, dtype: &str) -> PyResult<Self> {
        let te = |e: PyErr| PyTypeError::new_err(format!("{what}: {e}"));
        Ok(match dtype {
            "f32" => MlaData::F32(a.extract().map_err(te)?),
            "bf16" => MlaData::BF16(a.extract().map_err(te)?),
            "fp8" => MlaData::U8(a.extract().map_err(te)?),
            other => return Err(value_err(format!("{what}: unknown dtype {other:?} (expected f32, bf16 or fp8)"))),
        })
    }
}

/// The out array (f32, or bf16 bits as uint16 when `out_bf16`) of a reference `out`.
fn mla_out<'py>(py: Python<'py>, out: &[f64], out_bf16: bool) -> Bound<'py, PyAny> {
    if out_bf16 {
        let bits: Vec<u16> = out.iter().map(|&x| bf16::from_f64(x).to_bits()).collect();
        numpy::PyArray1::from_vec(py, bits).into_any()
    } else {
        numpy::PyArray1::from_vec(py, out.iter().map(|&x| x as f32).collect::<Vec<f32>>()).into_any()
    }
}

fn mla_f32<'py>(py: Python<'py>, v: &[f64]) -> Bound<'py, numpy::PyArray1<f32>> {
    numpy::PyArray1::from_vec(py, v.iter().map(|&x| x as f32).collect::<Vec<f32>>())
}

fn opt_slice<'a, T: Element>(what: &str, a: &'a Option<PyReadonlyArray1<'_, T>>) -> PyResult<Option<&'a [T]>> {
    a.as_ref().map(|x| x.as_slice().map_err(|e| value_err(format!("{what}: {e}")))).transpose()
}

/// `sparse_mla_prefill_cpu`'s result: flat out, max_logits and lse.
type MlaPrefillArrays<'py> = (Bound<'py, PyAny>, Bound<'py, numpy::PyArray1<f32>>, Bound<'py, numpy::PyArray1<f32>>);

/// Sparse MLA prefill (FlashMLA's `flash_mla_sparse_fwd`) by the float64
/// reference: flat C-order arrays q `[s_q, h_q, d_qk]` and kv `[s_kv,
/// d_qk]` of `dtype` ("f32": float32, "bf16": bf16 bits as uint16), indices
/// int32 `[s_q, topk]`, attn_sink float32 `[h_q]`, topk_length int32
/// `[s_q]`. Returns flat (out `[s_q, h_q, d_v]` as float32 or, with
/// `out_bf16`, bf16 bits as uint16; max_logits and lse float32 `[s_q,
/// h_q]`). The GIL is released while it runs.
#[pyfunction]
#[pyo3(signature = (q, kv, indices, dtype, s_q, s_kv, h_q, d_qk, topk, sm_scale, d_v, attn_sink, topk_length, out_bf16))]
#[allow(clippy::too_many_arguments)]
fn sparse_mla_prefill_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    kv: &Bound<'py, PyAny>,
    indices: PyReadonlyArray1<'py, i32>,
    dtype: &str,
    s_q: usize,
    s_kv: usize,
    h_q: usize,
    d_qk: usize,
    topk: usize,
    sm_scale: f64,
    d_v: usize,
    attn_sink: Option<PyReadonlyArray1<'py, f32>>,
    topk_length: Option<PyReadonlyArray1<'py, i32>>,
    out_bf16: bool,
) -> PyResult<MlaPrefillArrays<'py>> {
    use flashsel::ops::mla::{reference_sparse_mla_prefill, SparseMlaPrefill};
    let dt = match dtype {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        other => return Err(value_err(format!("sparse_mla_prefill takes f32 or bf16 q / kv, not {other:?}"))),
    };
    let spec = SparseMlaPrefill::new(s_q, s_kv, h_q, d_qk, topk, sm_scale as f32).with_dtype(dt).with_d_v(d_v);
    spec.validate().map_err(to_py)?;
    let (qd, kvd) = (MlaData::extract("q", q, dtype)?, MlaData::extract("kv", kv, dtype)?);
    let idx = indices.as_slice().map_err(|e| value_err(format!("indices: {e}")))?;
    let sink = opt_slice("attn_sink", &attn_sink)?;
    let lens = opt_slice("topk_length", &topk_length)?;
    let r = match (&qd, &kvd) {
        (MlaData::F32(q), MlaData::F32(kv)) => {
            let (q, kv) = (bits_slice::<f32, f32, _>("q", q)?, bits_slice::<f32, f32, _>("kv", kv)?);
            py.detach(|| reference_sparse_mla_prefill(&spec, q, kv, idx, lens, sink))
        }
        (MlaData::BF16(q), MlaData::BF16(kv)) => {
            let (q, kv) = (bits_slice::<bf16, u16, _>("q", q)?, bits_slice::<bf16, u16, _>("kv", kv)?);
            py.detach(|| reference_sparse_mla_prefill(&spec, q, kv, idx, lens, sink))
        }
        _ => unreachable!("q and kv share the dtype"),
    }
    .map_err(to_py)?;
    Ok((mla_out(py, &r.out, out_bf16), mla_f32(py, &r.max_logits), mla_f32(py, &r.lse)))
}

/// `sparse_mla_decode_cpu`'s result: flat out and lse.
type MlaDecodeArrays<'py> = (Bound<'py, PyAny>, Bound<'py, numpy::PyArray1<f32>>);

/// Sparse MLA decode (the sparse path of FlashMLA's `flash_mla_with_kvcache`)
/// by the float64 reference: flat q `[batch, s_q, h_q, d_qk]` of `q_dtype`
/// ("f32" / "bf16" bits as uint16); `cache` a flat buffer of `cache_format`
/// ("f32", "bf16" bits as uint16, "fp8": the 656-byte tokens as uint8) in
/// which token `t` of page `p` starts at element `p * page_stride + t *
/// token_stride`; indices int32 `[batch, s_q, topk]` (slots `page *
/// page_size + offset`); topk_length int32 `[batch]` or `[batch * s_q]`.
/// Returns flat (out `[batch, s_q, h_q, d_v]`, float32 or bf16 bits; lse
/// float32 `[batch, h_q, s_q]`). The GIL is released while it runs.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, cache, cache_format, batch, s_q, h_q, d_qk, topk, num_pages, page_size,
                    page_stride, token_stride, indices, sm_scale, d_v, attn_sink, topk_length, out_bf16))]
#[allow(clippy::too_many_arguments)]
fn sparse_mla_decode_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    cache: &Bound<'py, PyAny>,
    cache_format: &str,
    batch: usize,
    s_q: usize,
    h_q: usize,
    d_qk: usize,
    topk: usize,
    num_pages: usize,
    page_size: usize,
    page_stride: usize,
    token_stride: usize,
    indices: PyReadonlyArray1<'py, i32>,
    sm_scale: f64,
    d_v: usize,
    attn_sink: Option<PyReadonlyArray1<'py, f32>>,
    topk_length: Option<PyReadonlyArray1<'py, i32>>,
    out_bf16: bool,
) -> PyResult<MlaDecodeArrays<'py>> {
    use flashsel::ops::mla::{reference_sparse_mla_decode, CacheFormat, PagedKvCache, SparseMlaDecode};
    let qdt = match q_dtype {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        other => return Err(value_err(format!("sparse_mla_decode takes f32 or bf16 q, not {other:?}"))),
    };
    let fmt = match cache_format {
        "f32" => CacheFormat::F32,
        "bf16" => CacheFormat::BF16,
        "fp8" => CacheFormat::Fp8V32,
        other => return Err(value_err(format!("unknown cache format {other:?} (expected f32, bf16 or fp8)"))),
    };
    let spec = SparseMlaDecode::new(batch, s_q, h_q, d_qk, topk, num_pages, page_size, fmt, sm_scale as f32)
        .with_strides(page_stride, token_stride)
        .with_q_dtype(qdt)
        .with_d_v(d_v);
    spec.validate().map_err(to_py)?;
    let qd = MlaData::extract("q", q, q_dtype)?;
    let cd = MlaData::extract("k_cache", cache, cache_format)?;
    let kv = match &cd {
        MlaData::F32(c) => PagedKvCache::F32(bits_slice::<f32, f32, _>("k_cache", c)?),
        MlaData::BF16(c) => PagedKvCache::BF16(bits_slice::<bf16, u16, _>("k_cache", c)?),
        MlaData::U8(c) => PagedKvCache::Fp8(bits_slice::<u8, u8, _>("k_cache", c)?),
    };
    let idx = indices.as_slice().map_err(|e| value_err(format!("indices: {e}")))?;
    let sink = opt_slice("attn_sink", &attn_sink)?;
    let lens = opt_slice("topk_length", &topk_length)?;
    let r = match &qd {
        MlaData::F32(q) => {
            let q = bits_slice::<f32, f32, _>("q", q)?;
            py.detach(|| reference_sparse_mla_decode(&spec, q, kv, idx, lens, sink))
        }
        MlaData::BF16(q) => {
            let q = bits_slice::<bf16, u16, _>("q", q)?;
            py.detach(|| reference_sparse_mla_decode(&spec, q, kv, idx, lens, sink))
        }
        MlaData::U8(_) => unreachable!("q is f32 or bf16"),
    }
    .map_err(to_py)?;
    Ok((mla_out(py, &r.out, out_bf16), mla_f32(py, &r.lse)))
}

// ---------------------------------------------------------------------------
// The fused QSA indexer (CPU engine)
// ---------------------------------------------------------------------------

/// The typed host path of `qsa_indexer_cpu` (see `qsa_scores_host`).
#[allow(clippy::too_many_arguments)]
fn qsa_indexer_host<'py, Q, QB, K, KB>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    kbar: &Bound<'py, PyAny>,
    positions: &[i64],
    ratio: usize,
    k_blocks: usize,
    order: OutputOrder,
    nan: NanPolicy,
    pages: Option<HostPages<'_>>,
) -> PyResult<QsaArrays<'py>>
where
    Q: flashsel::ops::indexer::QueryElem,
    K: flashsel::ops::indexer::KeyElem,
    QB: Element,
    KB: Element,
{
    use flashsel::ops::indexer::{BlockKeys, QsaIndexerSpec};
    indexer_inputs::<Q, QB, K, KB, _>(q, kbar, ratio, pages, |qs, keys, s| {
        let spec = QsaIndexerSpec::new(s.rows, s.blocks)
            .with_heads(s.heads)
            .with_dim(s.dim)
            .with_ratio(s.ratio)
            .with_k_blocks(k_blocks)
            .with_order(order)
            .with_nan(nan);
        // A paged cache's table also maps the ids to slots.
        let map = match keys {
            BlockKeys::Paged { pages, .. } => Some(*pages),
            BlockKeys::Contiguous(_) => None,
        };
        let sel = py.detach(|| flashsel::cpu::qsa_indexer(qs, keys, positions, &spec, map.as_ref())).map_err(to_py)?;
        let ids = numpy::PyArray1::from_vec(py, sel.ids).reshape([sel.rows, sel.width])?;
        Ok((ids, numpy::PyArray1::from_vec(py, sel.counts)))
    })
}

/// The fused QSA indexer on the CPU engine: `qsa_select(qsa_scores(...))`
/// without the `[T, NB]` scores; returns (ids int32 [T, width], counts int32
/// [T]). The inputs as for `qsa_scores_cpu`, the options as for
/// `qsa_select_cpu`; with a page table the ids are slots through it. The GIL
/// is released while it runs.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, kbar, k_dtype, positions, ratio, k_blocks, order, nan, page_table, page_size, seq_ids))]
#[allow(clippy::too_many_arguments)]
fn qsa_indexer_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    kbar: &Bound<'py, PyAny>,
    k_dtype: &str,
    positions: PyReadonlyArray1<'py, i64>,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
    page_table: Option<PyReadonlyArray2<'py, i32>>,
    page_size: usize,
    seq_ids: Option<PyReadonlyArray1<'py, i32>>,
) -> PyResult<QsaArrays<'py>> {
    use flashsel::ops::indexer::F8E4M3;
    let (order, nan) = (OutputOrder::parse(order).map_err(to_py)?, NanPolicy::parse(nan).map_err(to_py)?);
    let positions = positions.as_slice().map_err(|e| value_err(format!("positions: {e}")))?;
    if let Some(t) = &page_table {
        if !t.is_c_contiguous() {
            return Err(value_err("page_table: the array is not C-contiguous; pass np.ascontiguousarray(x)"));
        }
    }
    let pages = host_pages(&page_table, page_size, &seq_ids)?;
    let (qd, kd) = (DType::parse(q_dtype).map_err(to_py)?, DType::parse(k_dtype).map_err(to_py)?);
    let (p, r, k) = (positions, ratio, k_blocks);
    match (qd, kd) {
        (DType::F32, DType::F32) => qsa_indexer_host::<f32, f32, f32, f32>(py, q, kbar, p, r, k, order, nan, pages),
        (DType::F32, DType::BF16) => qsa_indexer_host::<f32, f32, bf16, u16>(py, q, kbar, p, r, k, order, nan, pages),
        (DType::F32, DType::F8E4M3) => {
            qsa_indexer_host::<f32, f32, F8E4M3, u8>(py, q, kbar, p, r, k, order, nan, pages)
        }
        (DType::BF16, DType::F32) => qsa_indexer_host::<bf16, u16, f32, f32>(py, q, kbar, p, r, k, order, nan, pages),
        (DType::BF16, DType::BF16) => qsa_indexer_host::<bf16, u16, bf16, u16>(py, q, kbar, p, r, k, order, nan, pages),
        (DType::BF16, DType::F8E4M3) => {
            qsa_indexer_host::<bf16, u16, F8E4M3, u8>(py, q, kbar, p, r, k, order, nan, pages)
        }
        (DType::F32 | DType::BF16, other) => {
            Err(value_err(format!("qsa_indexer takes f32, bf16 or f8e4m3 keys, not {other}")))
        }
        (other, _) => Err(value_err(format!("qsa_indexer takes f32 or bf16 queries, not {other}"))),
    }
}

// ---------------------------------------------------------------------------
// The QSA indexer on CUDA (device buffers owned by the caller, e.g. torch)
// ---------------------------------------------------------------------------

/// The fused spec from Python's arguments, validated (both halves).
#[allow(clippy::too_many_arguments)]
fn indexer_spec(
    rows: usize,
    heads: usize,
    dim: usize,
    blocks: usize,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
) -> PyResult<flashsel::ops::indexer::QsaIndexerSpec> {
    let (order, nan) = (OutputOrder::parse(order).map_err(to_py)?, NanPolicy::parse(nan).map_err(to_py)?);
    let spec = flashsel::ops::indexer::QsaIndexerSpec::new(rows, blocks)
        .with_heads(heads)
        .with_dim(dim)
        .with_ratio(ratio)
        .with_k_blocks(k_blocks)
        .with_order(order)
        .with_nan(nan);
    spec.scores_spec().validate().map_err(to_py)?;
    spec.select_spec().validate().map_err(to_py)?;
    Ok(spec)
}

/// The device block keys: `kbar` (`[NB, d]`, or `[cache_pages, page_size /
/// ratio, d]` with `pages`), its dtype name ("f32", "bf16", "f8e4m3").
fn device_keys(
    k_dtype: &str,
    kbar: u64,
    cache_pages: usize,
    pages: Option<DevicePagesArgs>,
) -> PyResult<DeviceBlockKeys> {
    let dtype = DType::parse(k_dtype).map_err(to_py)?;
    let pages = pages.map(device_pages).transpose()?;
    Ok(DeviceBlockKeys { dtype, kbar, pages, cache_pages })
}

/// Launches `qsa_scores` on `stream` over caller-owned device buffers (q
/// `[rows, heads, dim]` f32/bf16, kbar as `device_keys`, int32 positions
/// `[rows]`, f32 out `[rows, blocks]`) and returns without waiting; private
/// for the reasons of `cuda_select`.
#[pyfunction]
#[pyo3(signature = (device, q_dtype, k_dtype, rows, heads, dim, blocks, ratio,
                    q, kbar, cache_pages, positions, out, pages, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_scores(
    py: Python<'_>,
    device: usize,
    q_dtype: &str,
    k_dtype: &str,
    rows: usize,
    heads: usize,
    dim: usize,
    blocks: usize,
    ratio: usize,
    q: u64,
    kbar: u64,
    cache_pages: usize,
    positions: u64,
    out: u64,
    pages: Option<DevicePagesArgs>,
    stream: u64,
) -> PyResult<()> {
    let spec =
        flashsel::ops::indexer::QsaScoresSpec::new(rows, blocks).with_heads(heads).with_dim(dim).with_ratio(ratio);
    spec.validate().map_err(to_py)?;
    let args = DeviceQsaScores {
        spec,
        q_dtype: DType::parse(q_dtype).map_err(to_py)?,
        q,
        keys: device_keys(k_dtype, kbar, cache_pages, pages)?,
        positions,
        out,
        stream,
    };
    // SAFETY: as cuda_select: live device allocations of the sizes the
    // spec implies, on `device`, kept alive by the caller.
    py.detach(|| unsafe { engine(device)?.qsa_scores_device(&args) }).map_err(to_py)
}

/// Bytes of device workspace a `cuda_qsa_indexer` call needs.
#[pyfunction]
#[pyo3(signature = (device, rows, heads, dim, blocks, ratio, k_blocks, order, nan))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_indexer_workspace_bytes(
    py: Python<'_>,
    device: usize,
    rows: usize,
    heads: usize,
    dim: usize,
    blocks: usize,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
) -> PyResult<usize> {
    let spec = indexer_spec(rows, heads, dim, blocks, ratio, k_blocks, order, nan)?;
    py.detach(|| engine(device)?.qsa_indexer_workspace_bytes(&spec)).map_err(to_py)
}

/// Launches the fused `qsa_indexer` on `stream` over caller-owned device
/// buffers (the inputs of `cuda_qsa_scores`; int32 ids `[rows, width]` and
/// counts `[rows]`; with `pages` the ids are slots through the same table)
/// and returns without waiting; private for the reasons of `cuda_select`.
#[pyfunction]
#[pyo3(signature = (device, q_dtype, k_dtype, rows, heads, dim, blocks, ratio, k_blocks, order, nan,
                    q, kbar, cache_pages, positions, ids, counts, pages, workspace, workspace_bytes, stream))]
#[allow(clippy::too_many_arguments)]
fn cuda_qsa_indexer(
    py: Python<'_>,
    device: usize,
    q_dtype: &str,
    k_dtype: &str,
    rows: usize,
    heads: usize,
    dim: usize,
    blocks: usize,
    ratio: usize,
    k_blocks: usize,
    order: &str,
    nan: &str,
    q: u64,
    kbar: u64,
    cache_pages: usize,
    positions: u64,
    ids: u64,
    counts: u64,
    pages: Option<DevicePagesArgs>,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
) -> PyResult<()> {
    let spec = indexer_spec(rows, heads, dim, blocks, ratio, k_blocks, order, nan)?;
    let keys = device_keys(k_dtype, kbar, cache_pages, pages)?;
    let args = DeviceQsaIndexer {
        spec,
        q_dtype: DType::parse(q_dtype).map_err(to_py)?,
        q,
        keys,
        positions,
        ids,
        counts: Some(counts),
        // A paged cache's table also maps the ids to slots (as on the CPU).
        slots: keys.pages,
        workspace,
        workspace_bytes,
        stream,
    };
    // SAFETY: as cuda_select: live device allocations of the sizes the
    // spec implies, on `device`, kept alive by the caller.
    py.detach(|| unsafe { engine(device)?.qsa_indexer_device(&args) }).map_err(to_py)
}
