//! The selection contract: the one place that says how scores compare, how ties
//! break, what is padded and in which order results come out.
//!
//! Every backend (the CPU engine, each CUDA path) must return the same bytes as
//! [`reference_select`] for the same [`SelectSpec`] and input. `docs/semantics.md`
//! states the same rules in prose.
//!
//! # The total order
//! 1. Each score maps to an unsigned *key* ([`ScoreElem::key`]) ordered as the
//!    float is; `-0.0` and `+0.0` map to the same key and every NaN payload maps to
//!    one key: below `-inf` ([`NanPolicy::Lowest`], the default) or above `+inf`
//!    ([`NanPolicy::Largest`], as `torch.topk` does).
//! 2. A larger key ranks higher. Among equal keys the lower column index ranks
//!    higher. [`composite`] packs both into one `u64` whose natural order is the
//!    total order, so "the top k" is "the k largest composites".
//!
//! # The output
//! Row `i` holds exactly `min(k, len_i)` column indices (`i32`) followed by `-1`
//! up to `k`, where `len_i = lengths[i]` (default `cols`). Values, when asked
//! for, are the selected scores bit for bit in the input dtype; padding is `-inf`.
//! [`OutputOrder::Score`] lists the selection best first; [`OutputOrder::Index`]
//! lists it by ascending column index.

pub(crate) mod error;
mod key;
mod spec;

pub use error::{Error, Result};
pub use key::{composite, composite_index, composite_key, DType, NanPolicy, ScoreElem};
pub use spec::{OutputOrder, ScoresView, SelectSpec, Selection};

/// The naive reference: sort each row's candidates by the total order and take
/// the first `k` (`O(n log n)` per row). Tests pin every engine to it. Validates
/// like every backend does.
pub fn reference_select<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    lengths: Option<&[i32]>,
) -> Result<Selection<T>> {
    spec.validate_host(scores, lengths)?;
    let mut out = Selection::<T>::new_padded(spec);
    for r in 0..spec.rows {
        let len = spec.row_len(r, lengths);
        let row = scores.row(r);
        let mut comps: Vec<u64> = (0..len).map(|c| composite(row[c].key(spec.nan), c as u32)).collect();
        comps.sort_unstable_by(|a, b| b.cmp(a));
        comps.truncate(spec.k);
        spec.order.arrange(&mut comps);
        out.write_row(r, &comps, row);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
