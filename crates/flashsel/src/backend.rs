//! Choosing and driving a backend: the CPU engine or the CUDA engine.
//!
//! This is the host-memory front door used by the CLI: data in host memory in,
//! a [`Selection`] out. Code that already holds device buffers uses
//! [`crate::cuda`] directly.

use std::time::Instant;

use crate::contract::{Error, Result, ScoreElem, ScoresView};
use crate::ops::select::{SelectSpec, Selection};

/// What the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// CUDA when a usable GPU is present, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl BackendChoice {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            _ => Err(Error::InvalidOption { what: "backend", value: s.into(), expected: "auto|cpu|cuda" }),
        }
    }
}

/// An opened backend.
pub enum Backend {
    Cpu,
    Cuda(Box<crate::cuda::CudaEngine>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Backend {
    /// Opens the chosen backend. `Auto` falls back to the CPU when CUDA cannot
    /// be used; the reason is returned beside the backend so callers can say it.
    pub fn open(choice: BackendChoice) -> Result<(Self, Option<String>)> {
        match choice {
            BackendChoice::Cpu => Ok((Backend::Cpu, None)),
            BackendChoice::Cuda => Ok((Backend::Cuda(Box::new(crate::cuda::CudaEngine::new(0)?)), None)),
            BackendChoice::Auto => match crate::cuda::CudaEngine::new(0) {
                Ok(e) => Ok((Backend::Cuda(Box::new(e)), None)),
                Err(e) => Ok((Backend::Cpu, Some(e.to_string()))),
            },
        }
    }

    /// `"cpu"` or `"cuda"`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda(_) => "cuda",
        }
    }

    /// Selects from host data, returning host results.
    pub fn select<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
    ) -> Result<Selection<T>> {
        match self {
            Backend::Cpu => crate::ops::select::cpu::select(scores, spec, lengths),
            Backend::Cuda(e) => e.select_host(scores, spec, lengths),
        }
    }

    /// Runs the selection `iters` times after one warm-up and returns the last
    /// result with the time of each run in seconds. On CUDA the input stays on
    /// the device and each run is timed by the device (graph replays where
    /// possible); on the CPU by the wall clock.
    pub fn time_select<T: ScoreElem>(
        &self,
        scores: &ScoresView<'_, T>,
        spec: &SelectSpec,
        lengths: Option<&[i32]>,
        iters: usize,
    ) -> Result<(Selection<T>, Vec<f64>)> {
        match self {
            Backend::Cpu => {
                let mut out = crate::ops::select::cpu::select(scores, spec, lengths)?;
                let mut times = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let t = Instant::now();
                    out = crate::ops::select::cpu::select(scores, spec, lengths)?;
                    times.push(t.elapsed().as_secs_f64());
                }
                Ok((out, times))
            }
            Backend::Cuda(e) => e.time_select(scores, spec, lengths, iters),
        }
    }
}
