//! The engine behind the operations whose CUDA path is not in this build yet:
//! `select --starts` (per-row ranges) and `qsa`. Both run on the CPU engine;
//! `--backend cuda` is a clear error, `auto` means the CPU.
//!
//! This module is the one place to wire their CUDA paths once the library
//! has them: open the backend in [`backend`] as `select` does
//! ([`crate::open_backend`]) and add the `Backend::Cuda` arm of the dispatch
//! functions below; the commands call only these.

use flashsel::ops::qsa::{PageMap, QsaSelection, QsaSpec};
use flashsel::{Backend, BackendChoice, ScoreElem, ScoresView, SelectSpec, Selection};

/// An operation that runs on the CPU engine only, for now.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// `select --starts`: the top k of each row's columns `starts[i]..ends[i]`.
    Ranges,
    /// `qsa`: QSA block selection.
    Qsa,
}

impl Op {
    fn what(self) -> &'static str {
        match self {
            Op::Ranges => "select --starts (per-row ranges)",
            Op::Qsa => "qsa",
        }
    }
}

/// The error of a CUDA request for `op` in this build.
fn not_built(op: Op) -> String {
    format!(
        "--backend cuda: the CUDA path of {} is not in this build yet; it runs on the CPU engine \
         (--backend cpu, or auto)",
        op.what()
    )
}

/// The backend that runs `op` for `choice`: the CPU for `auto` (said with
/// `-v`) and `cpu`; `cuda` is an error. Nothing is opened or read before.
pub fn backend(op: Op, choice: BackendChoice, verbose: bool) -> Result<Backend, String> {
    match choice {
        BackendChoice::Cuda => Err(not_built(op)),
        BackendChoice::Auto => {
            if verbose {
                eprintln!("note: {} runs on the CPU engine (its CUDA path is not in this build yet)", op.what());
            }
            Ok(Backend::Cpu)
        }
        BackendChoice::Cpu => Ok(Backend::Cpu),
    }
}

/// The top `spec.k` of each row's columns `starts[i]..ends[i]` (ends: the
/// lengths, or `cols`), absolute column indices; the library's error, as text.
pub fn select_ranges<T: ScoreElem>(
    backend: &Backend,
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: &[i32],
    ends: Option<&[i32]>,
) -> Result<Selection<T>, String> {
    match backend {
        Backend::Cpu => flashsel::cpu::select_ranges(scores, spec, starts, ends)
            .map_err(|e| format!("selection on {} failed: {e}", backend.name())),
        Backend::Cuda(_) => Err(not_built(Op::Ranges)),
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
        Backend::Cuda(_) => Err(not_built(Op::Qsa)),
    }
}
