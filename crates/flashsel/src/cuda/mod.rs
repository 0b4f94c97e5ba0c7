//! CUDA host code. (Being written: until then it reports itself unavailable.)

use crate::contract::{Error, Result, ScoreElem, ScoresView, SelectSpec, Selection};

/// The CUDA engine bound to one device.
pub struct CudaEngine {
    _private: (),
}

impl CudaEngine {
    pub fn new(_ordinal: usize) -> Result<Self> {
        Err(Error::BackendUnavailable("the CUDA backend is not built yet".into()))
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
