//! The DSA (DeepSeek-V3.2) lightning indexer: the native side of `_dsa`.
//! NumPy arrays (torch CPU tensors arrive as zero-copy NumPy views) run the
//! CPU engine (`flashsel::cpu::dsa_scores` / `dsa_indexer`); CUDA tensors run
//! `CudaEngine::dsa_scores_device` / `dsa_indexer_device` over the caller's
//! (torch's) buffers, on the stream it names, without a host
//! synchronisation (graph-capturable: the engine compiled its modules when it
//! was created).
//!
//! Every function rebuilds and validates the request's specs from its
//! geometry, so a bad call from Python raises instead of reading out of
//! bounds. q, k are flat C-order spans of `q_dtype` / `k_dtype` ("f32":
//! float32, "bf16": bf16 bits as uint16, "f8e4m3": e4m3 bits as uint8).
//!
//! The paged forms read DeepSeek-V3.2's paged fp8 index-key cache (DeepGEMM
//! `fp8_paged_mqa_logits`' layout, `flashsel::ops::dsa::DsaPagedKeys`): on
//! the CPU `dsa_scores_paged` / `dsa_indexer_paged` (`*_paged_cpu` here),
//! on CUDA the `paged` field of `DeviceDsaScores` (the `paged` argument of
//! `cuda_dsa_scores` / `cuda_dsa_indexer`).

use flashsel::ops::dsa::{DeviceDsaIndexer, DeviceDsaScores, DevicePagedKeys, DsaPagedKeys, DsaScoresSpec, F8E4M3};
use flashsel::ops::indexer::KeyElem;
use flashsel::{DType, NanPolicy, OutputOrder, PageMap, SelectSpec};
use half::bf16;
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::{
    bits_slice, device_pages, engine, host_pages, opt_slice, page_map, to_py, value_err, DevicePagesArgs, MlaData,
};

/// The element dtype of q / k by its name ("f32", "bf16", "f8e4m3").
fn elem_dtype(what: &str, name: &str) -> PyResult<DType> {
    match DType::parse(name).map_err(to_py)? {
        d @ (DType::F32 | DType::BF16 | DType::F8E4M3) => Ok(d),
        other => Err(value_err(format!("dsa_scores takes f32, bf16 or f8e4m3 {what}, not {other}"))),
    }
}

/// The validated scores spec.
fn scores_spec(rows: usize, heads: usize, dim: usize, keys: usize) -> PyResult<DsaScoresSpec> {
    let spec = DsaScoresSpec::new(rows, heads, dim, keys);
    spec.validate().map_err(to_py)?;
    Ok(spec)
}

/// The validated selection spec of the indexer over `[rows, keys]` f32
/// scores.
fn select_spec(rows: usize, keys: usize, topk: usize, order: &str, nan: &str) -> PyResult<SelectSpec> {
    let (order, nan) = (OutputOrder::parse(order).map_err(to_py)?, NanPolicy::parse(nan).map_err(to_py)?);
    let spec = SelectSpec::new(rows, keys, topk, DType::F32).with_order(order).with_nan(nan);
    spec.validate().map_err(to_py)?;
    Ok(spec)
}

/// Checks a request's geometry and options without running it (the
/// engine's spec rules and messages): the scores spec, and with `topk` the
/// selection's.
#[pyfunction]
#[pyo3(signature = (rows, heads, dim, keys, topk=None, order="index", nan="lowest"))]
fn dsa_check(
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
    topk: Option<usize>,
    order: &str,
    nan: &str,
) -> PyResult<()> {
    scores_spec(rows, heads, dim, keys)?;
    if let Some(k) = topk {
        select_spec(rows, keys, k, order, nan)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The CPU engine
// ---------------------------------------------------------------------------

/// A computation over typed q and k slices (one per q / k dtype pair).
trait WithElems {
    type Out;
    fn run<Q: KeyElem, K: KeyElem>(self, q: &[Q], k: &[K]) -> PyResult<Self::Out>;
}

fn with_k<Q: KeyElem, R: WithElems>(q: &[Q], k: &MlaData<'_>, r: R) -> PyResult<R::Out> {
    match k {
        MlaData::F32(a) => r.run(q, bits_slice::<f32, f32, _>("k", a)?),
        MlaData::BF16(a) => r.run(q, bits_slice::<bf16, u16, _>("k", a)?),
        MlaData::U8(a) => r.run(q, bits_slice::<F8E4M3, u8, _>("k", a)?),
    }
}

/// `r` over q and k as their dtype names say (flat arrays of float32,
/// uint16 bf16 bits or uint8 e4m3 bits).
fn with_elems<'py, R: WithElems>(
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    k: &Bound<'py, PyAny>,
    k_dtype: &str,
    r: R,
) -> PyResult<R::Out> {
    let name = |what: &str, n: &str| -> PyResult<&'static str> {
        Ok(match elem_dtype(what, n)? {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            _ => "fp8",
        })
    };
    let qd = MlaData::extract("q", q, name("q", q_dtype)?)?;
    let kd = MlaData::extract("k", k, name("k", k_dtype)?)?;
    match &qd {
        MlaData::F32(a) => with_k(bits_slice::<f32, f32, _>("q", a)?, &kd, r),
        MlaData::BF16(a) => with_k(bits_slice::<bf16, u16, _>("q", a)?, &kd, r),
        MlaData::U8(a) => with_k(bits_slice::<F8E4M3, u8, _>("q", a)?, &kd, r),
    }
}

/// The f32 / i32 inputs beside q and k.
struct Rest<'a> {
    k_scale: Option<&'a [f32]>,
    weights: &'a [f32],
    starts: &'a [i32],
    ends: &'a [i32],
    spec: DsaScoresSpec,
}

struct Scores<'a, 'py> {
    py: Python<'py>,
    rest: Rest<'a>,
}

impl<'py> WithElems for Scores<'_, 'py> {
    type Out = Bound<'py, numpy::PyArray2<f32>>;
    fn run<Q: KeyElem, K: KeyElem>(self, q: &[Q], k: &[K]) -> PyResult<Self::Out> {
        let Rest { k_scale, weights, starts, ends, spec } = self.rest;
        let out =
            self.py.detach(|| flashsel::cpu::dsa_scores(q, k, k_scale, weights, starts, ends, &spec)).map_err(to_py)?;
        PyArray1::from_vec(self.py, out).reshape([spec.rows, spec.keys])
    }
}

/// `dsa_indexer_cpu`'s result: ids int32 and values float32, `[rows, topk]`.
type DsaSelection<'py> = (Bound<'py, numpy::PyArray2<i32>>, Bound<'py, numpy::PyArray2<f32>>);

struct Indexer<'a, 'py> {
    py: Python<'py>,
    rest: Rest<'a>,
    select: SelectSpec,
    pages: Option<PageMap<'a>>,
}

impl<'py> WithElems for Indexer<'_, 'py> {
    type Out = DsaSelection<'py>;
    fn run<Q: KeyElem, K: KeyElem>(self, q: &[Q], k: &[K]) -> PyResult<Self::Out> {
        let Rest { k_scale, weights, starts, ends, spec } = self.rest;
        let (select, pages) = (self.select, self.pages);
        let sel = self
            .py
            .detach(|| flashsel::cpu::dsa_indexer(q, k, k_scale, weights, starts, ends, &spec, &select, pages.as_ref()))
            .map_err(to_py)?;
        let ids = PyArray1::from_vec(self.py, sel.indices).reshape([sel.rows, sel.k])?;
        Ok((ids, PyArray1::from_vec(self.py, sel.values).reshape([sel.rows, sel.k])?))
    }
}

fn slice<'a, T: numpy::Element>(what: &str, a: &'a PyReadonlyArray1<'_, T>) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|e| value_err(format!("{what}: {e}")))
}

/// DSA indexer scores on the CPU engine: float32 `[rows, keys]` from flat
/// C-order q `[rows, heads, dim]` and k `[keys, dim]` (their dtypes by name:
/// "f32", "bf16", "f8e4m3"), k_scale float32 `[keys]` or None, weights
/// float32 `[rows, heads]`, starts and ends int32 `[rows]` (checked: `0 <=
/// starts <= ends <= keys`). The GIL is released while it runs.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, k, k_dtype, k_scale, weights, starts, ends, rows, heads, dim, keys))]
#[allow(clippy::too_many_arguments)]
fn dsa_scores_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    k: &Bound<'py, PyAny>,
    k_dtype: &str,
    k_scale: Option<PyReadonlyArray1<'py, f32>>,
    weights: PyReadonlyArray1<'py, f32>,
    starts: PyReadonlyArray1<'py, i32>,
    ends: PyReadonlyArray1<'py, i32>,
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
    let spec = scores_spec(rows, heads, dim, keys)?;
    let rest = Rest {
        k_scale: opt_slice("k_scale", &k_scale)?,
        weights: slice("weights", &weights)?,
        starts: slice("starts", &starts)?,
        ends: slice("ends", &ends)?,
        spec,
    };
    with_elems(q, q_dtype, k, k_dtype, Scores { py, rest })
}

/// The DSA indexer on the CPU engine: the top `topk` of each row's range of
/// `dsa_scores_cpu`'s scores (`order`, `nan`), as ids int32 `[rows, topk]`
/// (`-1` padded; KV slots through `page_table` int32 `[sequences,
/// max_pages]` and `seq_ids` int32 `[rows]`, which come together) and their
/// scores float32 `[rows, topk]` (`-inf` padded). The GIL is released while
/// it runs.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, k, k_dtype, k_scale, weights, starts, ends, rows, heads, dim, keys, topk, order,
                    nan, page_table, page_size, seq_ids))]
#[allow(clippy::too_many_arguments)]
fn dsa_indexer_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    k: &Bound<'py, PyAny>,
    k_dtype: &str,
    k_scale: Option<PyReadonlyArray1<'py, f32>>,
    weights: PyReadonlyArray1<'py, f32>,
    starts: PyReadonlyArray1<'py, i32>,
    ends: PyReadonlyArray1<'py, i32>,
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
    topk: usize,
    order: &str,
    nan: &str,
    page_table: Option<PyReadonlyArray2<'py, i32>>,
    page_size: usize,
    seq_ids: Option<PyReadonlyArray1<'py, i32>>,
) -> PyResult<DsaSelection<'py>> {
    let spec = scores_spec(rows, heads, dim, keys)?;
    let select = select_spec(rows, keys, topk, order, nan)?;
    if let Some(t) = &page_table {
        if !t.is_c_contiguous() {
            return Err(value_err("page_table: the array is not C-contiguous; pass np.ascontiguousarray(x)"));
        }
    }
    let pages = page_map(host_pages(&page_table, page_size, &seq_ids)?)?;
    let rest = Rest {
        k_scale: opt_slice("k_scale", &k_scale)?,
        weights: slice("weights", &weights)?,
        starts: slice("starts", &starts)?,
        ends: slice("ends", &ends)?,
        spec,
    };
    with_elems(q, q_dtype, k, k_dtype, Indexer { py, rest, select, pages })
}

/// A computation over a typed q slice (the paged cache's keys are e4m3).
trait WithQ {
    type Out;
    fn run<Q: KeyElem>(self, q: &[Q]) -> PyResult<Self::Out>;
}

/// `r` over q as its dtype name says.
fn with_q<R: WithQ>(q: &Bound<'_, PyAny>, q_dtype: &str, r: R) -> PyResult<R::Out> {
    let name = match elem_dtype("q", q_dtype)? {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        _ => "fp8",
    };
    match &MlaData::extract("q", q, name)? {
        MlaData::F32(a) => r.run(bits_slice::<f32, f32, _>("q", a)?),
        MlaData::BF16(a) => r.run(bits_slice::<bf16, u16, _>("q", a)?),
        MlaData::U8(a) => r.run(bits_slice::<F8E4M3, u8, _>("q", a)?),
    }
}

/// The f32 / i32 inputs beside q and the paged cache.
struct PagedRest<'a> {
    keys: DsaPagedKeys<'a>,
    weights: &'a [f32],
    starts: &'a [i32],
    ends: &'a [i32],
    spec: DsaScoresSpec,
}

/// The paged cache's keys: the cache's bytes through the page table (the
/// table's page size is the cache's).
fn paged_keys<'a>(
    cache: &'a PyReadonlyArray1<'_, u8>,
    page_table: &'a PyReadonlyArray2<'_, i32>,
    page_size: usize,
    seq_ids: &'a PyReadonlyArray1<'_, i32>,
) -> PyResult<DsaPagedKeys<'a>> {
    if !page_table.is_c_contiguous() {
        return Err(value_err("page_table: the array is not C-contiguous; pass np.ascontiguousarray(x)"));
    }
    let table = page_table.as_slice().map_err(|e| value_err(format!("page_table: {e}")))?;
    let max_pages = page_table.shape()[1];
    let pages = PageMap::new(table, max_pages, page_size, slice("seq_ids", seq_ids)?).map_err(to_py)?;
    Ok(DsaPagedKeys { cache: slice("k (the paged key cache)", cache)?, pages })
}

struct PagedScores<'a, 'py> {
    py: Python<'py>,
    rest: PagedRest<'a>,
}

impl<'py> WithQ for PagedScores<'_, 'py> {
    type Out = Bound<'py, numpy::PyArray2<f32>>;
    fn run<Q: KeyElem>(self, q: &[Q]) -> PyResult<Self::Out> {
        let PagedRest { keys, weights, starts, ends, spec } = self.rest;
        let out = self
            .py
            .detach(|| flashsel::cpu::dsa_scores_paged(q, &keys, weights, starts, ends, &spec))
            .map_err(to_py)?;
        PyArray1::from_vec(self.py, out).reshape([spec.rows, spec.keys])
    }
}

struct PagedIndexer<'a, 'py> {
    py: Python<'py>,
    rest: PagedRest<'a>,
    select: SelectSpec,
    slots: bool,
}

impl<'py> WithQ for PagedIndexer<'_, 'py> {
    type Out = DsaSelection<'py>;
    fn run<Q: KeyElem>(self, q: &[Q]) -> PyResult<Self::Out> {
        let PagedRest { keys, weights, starts, ends, spec } = self.rest;
        let (select, slots) = (self.select, self.slots);
        let sel = self
            .py
            .detach(|| flashsel::cpu::dsa_indexer_paged(q, &keys, weights, starts, ends, &spec, &select, slots))
            .map_err(to_py)?;
        let ids = PyArray1::from_vec(self.py, sel.indices).reshape([sel.rows, sel.k])?;
        Ok((ids, PyArray1::from_vec(self.py, sel.values).reshape([sel.rows, sel.k])?))
    }
}

/// DSA indexer scores over DeepSeek-V3.2's paged fp8 index-key cache on the
/// CPU engine (`flashsel::cpu::dsa_scores_paged`): float32 `[rows, keys]`
/// from flat C-order q `[rows, heads, dim]` (its dtype by name), the cache's
/// bytes (uint8, flat: pages of `page_size * dim` e4m3 bytes then
/// `page_size` f32 scales), weights float32 `[rows, heads]`, starts and ends
/// int32 `[rows]`, page_table int32 `[sequences, max_pages]` and seq_ids
/// int32 `[rows]` (key `s` of row `t`: token `s` of sequence `seq_ids[t]`).
/// Checked: the ranges, a whole number of pages, every page of each row's
/// range in the table and in the cache. The GIL is released while it runs.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, cache, weights, starts, ends, rows, heads, dim, keys, page_table, page_size, seq_ids))]
#[allow(clippy::too_many_arguments)]
fn dsa_scores_paged_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    cache: PyReadonlyArray1<'py, u8>,
    weights: PyReadonlyArray1<'py, f32>,
    starts: PyReadonlyArray1<'py, i32>,
    ends: PyReadonlyArray1<'py, i32>,
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
    page_table: PyReadonlyArray2<'py, i32>,
    page_size: usize,
    seq_ids: PyReadonlyArray1<'py, i32>,
) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
    let spec = scores_spec(rows, heads, dim, keys)?;
    let rest = PagedRest {
        keys: paged_keys(&cache, &page_table, page_size, &seq_ids)?,
        weights: slice("weights", &weights)?,
        starts: slice("starts", &starts)?,
        ends: slice("ends", &ends)?,
        spec,
    };
    with_q(q, q_dtype, PagedScores { py, rest })
}

/// The DSA indexer over the paged fp8 key cache on the CPU engine
/// (`flashsel::cpu::dsa_indexer_paged`): `dsa_scores_paged_cpu`'s inputs,
/// then the top `topk` of each row's range (`order`, `nan`) as ids int32
/// `[rows, topk]`, token positions or (`slots`) the cache's slots through
/// its page table, `-1` padded, and their scores float32 `[rows, topk]`.
#[pyfunction]
#[pyo3(signature = (q, q_dtype, cache, weights, starts, ends, rows, heads, dim, keys, topk, order, nan, page_table,
                    page_size, seq_ids, slots))]
#[allow(clippy::too_many_arguments)]
fn dsa_indexer_paged_cpu<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    q_dtype: &str,
    cache: PyReadonlyArray1<'py, u8>,
    weights: PyReadonlyArray1<'py, f32>,
    starts: PyReadonlyArray1<'py, i32>,
    ends: PyReadonlyArray1<'py, i32>,
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
    topk: usize,
    order: &str,
    nan: &str,
    page_table: PyReadonlyArray2<'py, i32>,
    page_size: usize,
    seq_ids: PyReadonlyArray1<'py, i32>,
    slots: bool,
) -> PyResult<DsaSelection<'py>> {
    let spec = scores_spec(rows, heads, dim, keys)?;
    let select = select_spec(rows, keys, topk, order, nan)?;
    let rest = PagedRest {
        keys: paged_keys(&cache, &page_table, page_size, &seq_ids)?,
        weights: slice("weights", &weights)?,
        starts: slice("starts", &starts)?,
        ends: slice("ends", &ends)?,
        spec,
    };
    with_q(q, q_dtype, PagedIndexer { py, rest, select, slots })
}

// ---------------------------------------------------------------------------
// The CUDA engine (device buffers owned by the caller, e.g. torch)
// ---------------------------------------------------------------------------

/// The device scores' arguments (`out` 0 for the indexer: its scores go to
/// the workspace).
#[allow(clippy::too_many_arguments)]
fn device_scores(
    q_dtype: &str,
    k_dtype: &str,
    spec: DsaScoresSpec,
    q: u64,
    k: u64,
    k_scale: Option<u64>,
    weights: u64,
    starts: u64,
    ends: u64,
    out: u64,
    stream: u64,
    paged: Option<DevicePagedArgs>,
) -> PyResult<DeviceDsaScores> {
    if k_scale == Some(0) {
        return Err(value_err("k_scale: null device pointer"));
    }
    let paged = paged.map(|p| device_paged(k_dtype, k_scale, p)).transpose()?;
    Ok(DeviceDsaScores {
        spec,
        q_dtype: elem_dtype("q", q_dtype)?,
        k_dtype: elem_dtype("k", k_dtype)?,
        q,
        k,
        k_scale,
        weights,
        starts,
        ends,
        out,
        stream,
        paged,
    })
}

/// The paged key cache's device arguments: `(table, sequences, max_pages,
/// page_size, seq_ids, num_pages)` (the page arguments of `DevicePagesArgs`
/// and the cache's pages).
type DevicePagedArgs = (u64, usize, usize, usize, u64, usize);

/// The paged cache's `DevicePagedKeys` (`k` is then the cache's first byte,
/// its dtype e4m3 and without a k_scale: the cache holds the scales).
fn device_paged(
    k_dtype: &str,
    k_scale: Option<u64>,
    (table, sequences, max_pages, page_size, seq_ids, num_pages): DevicePagedArgs,
) -> PyResult<DevicePagedKeys> {
    if elem_dtype("k", k_dtype)? != DType::F8E4M3 || k_scale.is_some() {
        return Err(value_err("a paged key cache holds e4m3 keys and their scales: k_dtype f8e4m3, no k_scale"));
    }
    if table == 0 || seq_ids == 0 {
        return Err(value_err("page_table / seq_ids: null device pointer"));
    }
    Ok(DevicePagedKeys { table, sequences, max_pages, page_size, num_pages, seq_ids })
}

/// Launches `dsa_scores` on `stream` over caller-owned device buffers (q
/// `[rows, heads, dim]`, k `[keys, dim]` of their dtypes, optional k_scale
/// f32 `[keys]`, weights f32 `[rows, heads]`, starts / ends i32 `[rows]`,
/// out f32 `[rows, keys]`) and returns without waiting; private for the
/// reasons of `cuda_select` (device range values are clamped, not checked).
/// With `paged` (`DevicePagedArgs`) k is the paged fp8 key cache (k_dtype
/// "f8e4m3", no k_scale) read through that page table.
#[pyfunction]
#[pyo3(signature = (device, q_dtype, k_dtype, rows, heads, dim, keys, q, k, k_scale, weights, starts, ends, out,
                    stream, paged=None))]
#[allow(clippy::too_many_arguments)]
fn cuda_dsa_scores(
    py: Python<'_>,
    device: usize,
    q_dtype: &str,
    k_dtype: &str,
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
    q: u64,
    k: u64,
    k_scale: Option<u64>,
    weights: u64,
    starts: u64,
    ends: u64,
    out: u64,
    stream: u64,
    paged: Option<DevicePagedArgs>,
) -> PyResult<()> {
    let spec = scores_spec(rows, heads, dim, keys)?;
    let args = device_scores(q_dtype, k_dtype, spec, q, k, k_scale, weights, starts, ends, out, stream, paged)?;
    // SAFETY: the caller passes live device allocations of the sizes the
    // spec implies, on `device`, kept alive until the launch is ordered.
    py.detach(|| unsafe { engine(device)?.dsa_scores_device(&args) }).map_err(to_py)
}

/// Bytes of device workspace a `cuda_dsa_indexer` call needs (the `[rows,
/// keys]` scores, then the selection's scratch).
#[pyfunction]
#[pyo3(signature = (device, rows, heads, dim, keys, topk, order, nan))]
#[allow(clippy::too_many_arguments)]
fn cuda_dsa_indexer_workspace_bytes(
    py: Python<'_>,
    device: usize,
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
    topk: usize,
    order: &str,
    nan: &str,
) -> PyResult<usize> {
    let spec = scores_spec(rows, heads, dim, keys)?;
    let select = select_spec(rows, keys, topk, order, nan)?;
    py.detach(|| engine(device)?.dsa_indexer_workspace_bytes(&spec, &select)).map_err(to_py)
}

/// Launches the DSA indexer on `stream` over caller-owned device buffers
/// (the inputs of `cuda_dsa_scores`; ids i32 `[rows, topk]`, optional values
/// f32 `[rows, topk]`; with `pages` the ids are KV slots; with `paged` the
/// keys are the paged fp8 cache, as `cuda_dsa_scores`) and returns without
/// waiting; `workspace`: at least `cuda_dsa_indexer_workspace_bytes`,
/// 256-byte aligned.
#[pyfunction]
#[pyo3(signature = (device, q_dtype, k_dtype, rows, heads, dim, keys, topk, order, nan, q, k, k_scale, weights,
                    starts, ends, pages, out_indices, out_values, workspace, workspace_bytes, stream, paged=None))]
#[allow(clippy::too_many_arguments)]
fn cuda_dsa_indexer(
    py: Python<'_>,
    device: usize,
    q_dtype: &str,
    k_dtype: &str,
    rows: usize,
    heads: usize,
    dim: usize,
    keys: usize,
    topk: usize,
    order: &str,
    nan: &str,
    q: u64,
    k: u64,
    k_scale: Option<u64>,
    weights: u64,
    starts: u64,
    ends: u64,
    pages: Option<DevicePagesArgs>,
    out_indices: u64,
    out_values: Option<u64>,
    workspace: u64,
    workspace_bytes: usize,
    stream: u64,
    paged: Option<DevicePagedArgs>,
) -> PyResult<()> {
    let spec = scores_spec(rows, heads, dim, keys)?;
    let select = select_spec(rows, keys, topk, order, nan)?;
    let pages = pages.map(device_pages).transpose()?;
    if rows > 0 && (out_indices == 0 || out_values == Some(0)) {
        return Err(value_err("out_indices / out_values: null device pointer"));
    }
    let args = DeviceDsaIndexer {
        scores: device_scores(q_dtype, k_dtype, spec, q, k, k_scale, weights, starts, ends, 0, stream, paged)?,
        select,
        pages,
        out_indices,
        out_values,
        workspace,
        workspace_bytes,
    };
    // SAFETY: as cuda_dsa_scores; the engine checks the workspace's size and
    // alignment.
    py.detach(|| unsafe { engine(device)?.dsa_indexer_device(&args) }).map_err(to_py)
}

/// Adds this file's functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dsa_check, m)?)?;
    m.add_function(wrap_pyfunction!(dsa_scores_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(dsa_indexer_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(dsa_scores_paged_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(dsa_indexer_paged_cpu, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_dsa_scores, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_dsa_indexer_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_dsa_indexer, m)?)?;
    Ok(())
}
