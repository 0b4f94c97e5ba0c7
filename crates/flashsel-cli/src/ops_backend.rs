//! The engine behind the token operations: `select --starts` (per-row
//! ranges), `select --page-table` (indices written as KV-cache slots) and
//! `qsa`, on the CPU engine or the CUDA engine, and their timed forms for
//! `flashsel bench`.
//!
//! The backend is opened as for plain `select` ([`crate::open_backend`]):
//! `auto` is CUDA when it is usable, else the CPU (the reason printed with
//! `-v`); an explicit `cuda` that cannot open is an error. The commands and
//! the bench call only the functions here.

use std::time::Instant;

use flashsel::ops::qsa::{QsaSelection, QsaSpec};
use flashsel::{Backend, PageMap, ScoreElem, ScoresView, SelectSpec, Selection};

/// The top `spec.k` of each row's columns `starts[i]..ends[i]` (`starts`
/// absent: from column 0; `ends`: the lengths, or `cols`), absolute column
/// indices, or with `pages` the KV-cache slots of those columns; the
/// library's error, as text.
pub fn select_ranges<T: ScoreElem>(
    backend: &Backend,
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    pages: Option<&PageMap<'_>>,
) -> Result<Selection<T>, String> {
    let fail = |e: flashsel::Error| format!("selection on {} failed: {e}", backend.name());
    match backend {
        Backend::Cpu => cpu_select_ranges(scores, spec, starts, ends, pages).map_err(fail),
        Backend::Cuda(e) => e.select_ranges_host(scores, spec, starts, ends, pages).map_err(fail),
    }
}

/// The CPU engine's form of [`select_ranges`].
fn cpu_select_ranges<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    pages: Option<&PageMap<'_>>,
) -> flashsel::Result<Selection<T>> {
    match (starts, pages) {
        (_, Some(p)) => flashsel::cpu::select_ranges_paged(scores, spec, starts, ends, p),
        (Some(s), None) => flashsel::cpu::select_ranges(scores, spec, s, ends),
        (None, None) => flashsel::cpu::select(scores, spec, ends),
    }
}

/// QSA block selection; the library's error, as text.
pub fn qsa_select<T: ScoreElem>(
    backend: &Backend,
    scores: &ScoresView<'_, T>,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<&PageMap<'_>>,
) -> Result<QsaSelection, String> {
    match backend {
        Backend::Cpu => flashsel::cpu::qsa_select(scores, positions, spec, pages).map_err(|e| e.to_string()),
        Backend::Cuda(e) => e.qsa_select_host(scores, positions, spec, pages).map_err(|e| e.to_string()),
    }
}

/// Runs `f` once, then `iters` times under the wall clock (the CPU engine's
/// timing, as `Backend::time_select`); returns the last result.
fn wall_clock<R>(iters: usize, mut f: impl FnMut() -> flashsel::Result<R>) -> flashsel::Result<(R, Vec<f64>)> {
    let mut out = f()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        out = f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok((out, times))
}

/// [`select_ranges`] `iters` times after a warm-up, with the time of each
/// run in seconds: on CUDA by the device (`CudaEngine::time_select_ranges`:
/// the input uploaded once, graph replays for short runs; the result is the
/// warm-up's), on the CPU by the wall clock (the result is the last run's).
pub fn time_select_ranges<T: ScoreElem>(
    backend: &Backend,
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    pages: Option<&PageMap<'_>>,
    iters: usize,
) -> Result<(Selection<T>, Vec<f64>), String> {
    match backend {
        Backend::Cpu => wall_clock(iters, || cpu_select_ranges(scores, spec, starts, ends, pages)),
        Backend::Cuda(e) => e.time_select_ranges(scores, spec, starts, ends, pages, iters),
    }
    .map_err(|e| e.to_string())
}

/// [`qsa_select`] `iters` times after a warm-up, timed as
/// [`time_select_ranges`] (on CUDA: `CudaEngine::time_qsa_select`).
pub fn time_qsa_select<T: ScoreElem>(
    backend: &Backend,
    scores: &ScoresView<'_, T>,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<&PageMap<'_>>,
    iters: usize,
) -> Result<(QsaSelection, Vec<f64>), String> {
    match backend {
        Backend::Cpu => wall_clock(iters, || flashsel::cpu::qsa_select(scores, positions, spec, pages)),
        Backend::Cuda(e) => e.time_qsa_select(scores, positions, spec, pages, iters),
    }
    .map_err(|e| e.to_string())
}
