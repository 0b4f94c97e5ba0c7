//! Kernel parameter blocks (mirrors of the structs in `kernels/select.cu`) and
//! the launch sequence of a plan.

use std::ffi::c_void;

use cudarc::driver::{sys, CudaStream};

use super::{DeviceSelect, Kernels};
use crate::contract::{DType, Error, Result};
use crate::plan::{self, Plan};

/// `ScanParams` in select.cu; field order and types must match.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ScanParams {
    scores: u64,
    row_stride: i64,
    lengths: u64,
    out_idx: u64,
    out_val: u64,
    cand: u64,
    row_count: u64,
    row_done: u64,
    gbuf: u64,
    row_lb: u64,
    rows: i32,
    cols: i32,
    k: i32,
    chunks: i32,
    cap: i32,
    nan_largest: i32,
    order_index: i32,
    /// 1: the load ring (`Plan::stage_bytes`) follows the shared buffer.
    stage: i32,
}

/// `GridInitParams` in select.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GridInitParams {
    state: u64,
    words: i64,
}

pub(crate) fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("{what}: {r:?}")))
    }
}

/// Fills `bytes` bytes at device address `ptr` with `byte` on `stream`
/// (outputs and workspaces are poisoned before a checked run).
///
/// # Safety
/// `ptr .. ptr + bytes` must lie in a live allocation of `stream`'s context.
pub(crate) unsafe fn poison(ptr: u64, byte: u8, bytes: usize, stream: sys::CUstream) -> Result<()> {
    check(sys::cuMemsetD8Async(ptr, byte, bytes, stream), "memset")
}

fn dtype_slot(d: DType) -> usize {
    match d {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
    }
}

/// Launches `f`, optionally with programmatic stream serialisation (`pdl`): the
/// kernel may start before the previous one on the stream has finished, and
/// must wait for it (`griddepcontrol.wait`) before reading its results; and
/// optionally cooperative (`coop`): all CTAs resident at once, or an error.
///
/// # Safety
/// As [`super::CudaEngine::select_device`]; with `pdl`, the kernel waits as
/// said.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_ex<P>(
    f: sys::CUfunction,
    grid: (u32, u32),
    block: u32,
    smem: u32,
    stream: u64,
    p: &P,
    pdl: bool,
    coop: bool,
) -> Result<()> {
    let mut param = p as *const P as *mut c_void;
    let params = &mut param as *mut *mut c_void;
    if pdl || coop {
        let mut attrs: [sys::CUlaunchAttribute; 2] = std::mem::zeroed();
        let mut n = 0;
        if pdl {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        if coop {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attrs[n].value.cooperative = 1;
            n += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: stream as sys::CUstream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        return check(sys::cuLaunchKernelEx(&config, f, params, std::ptr::null_mut()), "cuLaunchKernelEx");
    }
    check(
        sys::cuLaunchKernel(
            f,
            grid.0,
            grid.1,
            1,
            block,
            1,
            1,
            smem,
            stream as sys::CUstream,
            params,
            std::ptr::null_mut(),
        ),
        "cuLaunchKernel",
    )
}

/// Launches `plan`: for split rows the prep kernel (counters, row-wide
/// sample), then the scan (whose last CTA per split row merges the row); for
/// grid rows the state-zeroing kernel, then the cooperative grid kernel.
/// With `pdl_chain` the first kernel is launched programmatically as well
/// and waits for the stream's previous kernel before it touches anything.
///
/// # Safety
/// As [`super::CudaEngine::select_device`].
pub(crate) unsafe fn run(kernels: &Kernels, plan: &Plan, a: &DeviceSelect) -> Result<()> {
    let spec = &a.spec;
    let slot = dtype_slot(spec.dtype);
    let ws = a.workspace;
    let at = |o: Option<u64>| o.map_or(0, |o| ws + o);
    let split = plan.layout.split;
    let grid = plan.layout.grid;
    let sp = ScanParams {
        scores: a.scores,
        row_stride: spec.row_stride as i64,
        lengths: a.lengths.unwrap_or(0),
        out_idx: a.out_indices,
        out_val: a.out_values.unwrap_or(0),
        cand: at(split.map(|s| s.cand).or(grid.map(|g| g.list))),
        row_count: at(split.map(|s| s.row_count).or(grid.map(|g| g.state))),
        row_done: at(split.map(|s| s.row_done)),
        gbuf: at(plan.layout.gbuf),
        row_lb: at(split.map(|s| s.row_lb)),
        rows: spec.rows as i32,
        cols: spec.cols as i32,
        k: spec.k as i32,
        chunks: plan.ctas_per_row as i32,
        cap: plan.cap as i32,
        nan_largest: (spec.nan == crate::NanPolicy::Largest) as i32,
        order_index: (spec.order == crate::OutputOrder::Index) as i32,
        stage: (plan.stage_bytes > 0) as i32,
    };
    if let Some(g) = grid {
        let kern = match g.items {
            plan::GRID_ITEMS => kernels.grid.as_ref().map(|k| &k[slot]),
            plan::GRID_ITEMS_SMALL => kernels.grid8.as_ref().map(|k| &k[slot]),
            plan::GRID_ITEMS_TINY if spec.dtype == DType::F32 => kernels.grid4.as_ref(),
            _ => None,
        };
        let (Some(kern), Some(init)) = (kern, &kernels.grid_init) else {
            return Err(Error::Cuda(format!(
                "this kernel build has no {}-element grid kernel for {} (tuning source?)",
                g.items,
                spec.dtype.name()
            )));
        };
        // Zero every row's barrier counters and histograms, then the
        // cooperative selection (which may start early with PDL and waits
        // for the zeroes before its first global write).
        let words = (g.state_bytes / 4) as i64;
        let state = ws + g.state;
        let init_ctas = (words as u64).div_ceil(plan.block as u64 * 8).clamp(1, 1024) as u32;
        let ip = GridInitParams { state, words };
        launch_ex(init.cu_function(), (init_ctas, 1), plan.block, 0, a.stream, &ip, kernels.pdl_chain, false)?;
        let grid_dim = (plan.ctas_per_row, plan.row_slots);
        let f = kern.cu_function();
        return launch_ex(f, grid_dim, plan.block, plan.smem_bytes, a.stream, &sp, kernels.pdl, true);
    }
    let (scan, pdl) = if split.is_some() {
        // The prep kernel's sample lives in registers: no dynamic shared
        // memory. (Its registers still keep a split CTA off its SM: sharing
        // SMs measured no faster, perf-log, sixth session, run 1.)
        let prep = kernels.prep[slot].cu_function();
        launch_ex(prep, (1, plan.row_slots), plan.block, 0, a.stream, &sp, kernels.pdl_chain, false)?;
        (&kernels.split[slot], kernels.pdl)
    } else {
        (&kernels.scan[slot], kernels.pdl_chain)
    };
    let grid = (plan.ctas_per_row, plan.row_slots);
    launch_ex(scan.cu_function(), grid, plan.block, plan.smem_bytes, a.stream, &sp, pdl, false)
}

/// Times `f` (which enqueues work on `stream`) `iters` times, in seconds per
/// call. A first event-timed call decides the method: under 50 us, each sample
/// is a CUDA-graph replay of 20 calls divided by 20 (launch gaps as in an
/// inference engine's captured decode step); else events around each call.
pub(crate) fn time_on_stream(
    stream: &std::sync::Arc<CudaStream>,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let ctx = stream.context();
    let ev = |_: ()| ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(super::cuda_err);
    let (e0, e1) = (ev(())?, ev(())?);
    let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        e0.record(stream).map_err(super::cuda_err)?;
        f()?;
        e1.record(stream).map_err(super::cuda_err)?;
        e1.synchronize().map_err(super::cuda_err)?;
        Ok(e0.elapsed_ms(&e1).map_err(super::cuda_err)? as f64 * 1e-3)
    };
    f()?;
    let first = timed(&mut f)?;
    let mut out = Vec::with_capacity(iters);
    if first < 50e-6 {
        const REPS: usize = 20;
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(super::cuda_err)?;
        let mut captured = Ok(());
        for _ in 0..REPS {
            captured = captured.and_then(|_| f());
        }
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(super::cuda_err)?;
        captured?;
        let graph = graph.ok_or_else(|| Error::Cuda("empty graph".into()))?;
        graph.launch().map_err(super::cuda_err)?;
        for _ in 0..iters {
            let t = timed(&mut || graph.launch().map_err(super::cuda_err))?;
            out.push(t / REPS as f64);
        }
    } else {
        for _ in 0..iters {
            out.push(timed(&mut f)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::ScanParams;

    /// The kernel source asserts the same size (static_assert in select.cu,
    /// checked whenever NVRTC compiles it), and the fields below are laid out
    /// as there: ten 8-byte pointers/offsets, then eight ints.
    #[test]
    fn scan_params_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<ScanParams>(), 112);
        assert_eq!(std::mem::offset_of!(ScanParams, row_lb), 72);
        assert_eq!(std::mem::offset_of!(ScanParams, rows), 80);
        assert_eq!(std::mem::offset_of!(ScanParams, stage), 108);
    }
}
