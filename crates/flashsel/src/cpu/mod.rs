//! The CPU engine (being written).
use crate::contract::{reference_select, Result, ScoreElem, ScoresView, SelectSpec, Selection};

/// Exact top-k under the contract.
pub fn select<T: ScoreElem>(scores: &ScoresView<'_, T>, spec: &SelectSpec, lengths: Option<&[i32]>) -> Result<Selection<T>> {
    reference_select(scores, spec, lengths)
}
