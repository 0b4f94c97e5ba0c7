//! Device timing: CUDA events, or CUDA-graph replays for short calls.

use std::sync::Arc;

use cudarc::driver::{sys, CudaStream};

use crate::contract::error::cuda_err;
use crate::contract::{Error, Result};

/// Calls shorter than this (seconds) are timed as graph replays: launch gaps
/// as in an inference engine's captured decode step.
const GRAPH_BELOW_S: f64 = 50e-6;
/// Calls per captured graph when timing by replays.
const GRAPH_REPS: usize = 20;

/// Times `f` (which enqueues work on `stream`) `iters` times, in seconds per
/// call. A first event-timed call decides the method: under
/// [`GRAPH_BELOW_S`], each sample is a CUDA-graph replay of [`GRAPH_REPS`]
/// calls divided by that count; else events around each call.
pub(crate) fn time_on_stream(
    stream: &Arc<CudaStream>,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let ctx = stream.context();
    let ev = |_: ()| ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err);
    let (e0, e1) = (ev(())?, ev(())?);
    let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        e0.record(stream).map_err(cuda_err)?;
        f()?;
        e1.record(stream).map_err(cuda_err)?;
        e1.synchronize().map_err(cuda_err)?;
        Ok(e0.elapsed_ms(&e1).map_err(cuda_err)? as f64 * 1e-3)
    };
    f()?;
    let first = timed(&mut f)?;
    let mut out = Vec::with_capacity(iters);
    if first < GRAPH_BELOW_S {
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(cuda_err)?;
        let mut captured = Ok(());
        for _ in 0..GRAPH_REPS {
            captured = captured.and_then(|_| f());
        }
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(cuda_err)?;
        captured?;
        let graph = graph.ok_or_else(|| Error::cuda_other("graph capture produced no graph"))?;
        graph.launch().map_err(cuda_err)?;
        for _ in 0..iters {
            let t = timed(&mut || graph.launch().map_err(cuda_err))?;
            out.push(t / GRAPH_REPS as f64);
        }
    } else {
        for _ in 0..iters {
            out.push(timed(&mut f)?);
        }
    }
    Ok(out)
}
