//! CUDA host code. (Being written: until then it reports itself unavailable.)

use crate::contract::{Error, Result, ScoreElem, ScoresView, SelectSpec, Selection};

/// The CUDA engine bound to one device.
pub struct CudaEngine {
    _private: (),
}

/// One asynchronous selection over caller-owned device buffers.
///
/// All pointers are `CUdeviceptr`s in the engine's context (torch tensors on the
/// same device qualify: torch uses the primary context).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSelect {
    pub spec: SelectSpec,
    /// Scores of `spec.dtype`, row `r` at `scores + r * row_stride * size`.
    pub scores: u64,
    /// Optional `i32` lengths, `rows` entries.
    pub lengths: Option<u64>,
    /// `i32` output, `rows * k`.
    pub out_indices: u64,
    /// Optional values output in `spec.dtype`, `rows * k`.
    pub out_values: Option<u64>,
    /// Scratch of at least [`CudaEngine::workspace_bytes`] bytes, 256-byte aligned.
    pub workspace: u64,
    pub workspace_bytes: usize,
    /// The `CUstream` to launch on (0: the legacy default stream).
    pub stream: u64,
}

impl CudaEngine {
    pub fn new(_ordinal: usize) -> Result<Self> {
        Err(Error::BackendUnavailable("the CUDA backend is not built yet".into()))
    }
    /// Workspace a [`DeviceSelect`] with this spec needs.
    pub fn workspace_bytes(&self, _spec: &SelectSpec, _has_lengths: bool) -> Result<usize> {
        unreachable!()
    }
    /// Launches the selection on `args.stream`; returns without waiting.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of the stated size.
    pub unsafe fn select_device(&self, _args: &DeviceSelect) -> Result<()> {
        unreachable!()
    }
    pub fn select_host<T: ScoreElem>(
        &self,
        _scores: &ScoresView<'_, T>,
        _spec: &SelectSpec,
        _lengths: Option<&[i32]>,
    ) -> Result<Selection<T>> {
        unreachable!()
    }
    pub fn time_select<T: ScoreElem>(
        &self,
        _scores: &ScoresView<'_, T>,
        _spec: &SelectSpec,
        _lengths: Option<&[i32]>,
        _iters: usize,
    ) -> Result<(Selection<T>, Vec<f64>)> {
        unreachable!()
    }
}
