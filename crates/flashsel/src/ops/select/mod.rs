//! `select`: the exact top-k of each row of a score matrix.
//!
//! # Contract
//! Row `i` holds exactly `min(k, len_i)` column indices (`i32`) followed by `-1`
//! up to `k` (a [padded index list](crate::contract::padded)), where
//! `len_i = lengths[i]` (default `cols`): the `min(k, len_i)` largest
//! composites of its first `len_i` columns under the contract's
//! [total order](crate::contract). With per-row range starts
//! ([`cpu::select_ranges`]) the candidates are columns `starts[i] ..
//! lengths[i]` (half-open, so a query that may see its own key ends at
//! `t + 1`), `min(k, len_i - starts[i])` of them are selected, and the
//! indices stay absolute column numbers. Values, when asked for, are the selected
//! scores bit for bit in the input dtype; padding is `-inf`.
//! [`OutputOrder::Score`] lists the selection best first; [`OutputOrder::Index`]
//! lists it by ascending column index.
//!
//! Every backend (the [CPU engine](cpu), each CUDA path of the
//! [planner](plan)) returns the bytes of [`reference_select`] for the same
//! [`SelectSpec`] and input.
//!
//! # Layout
//! - [`spec`](SelectSpec): the request and its validation; [`Selection`], the result.
//! - [`cpu`]: the CPU engine.
//! - [`plan`]: the pure GPU planner (row, split and grid paths).
//! - `device`: the CUDA launch of a plan ([`crate::cuda::CudaEngine::select_device`]).
//! - [`check`]: the GPU-against-CPU check suite behind `flashsel check`.

pub mod check;
pub mod cpu;
pub(crate) mod device;
pub mod plan;
mod spec;

pub use device::{DevicePages, DeviceSelect};
pub use spec::{write_row_into, OutputOrder, SelectSpec, Selection};

use crate::contract::{composite, Result, ScoreElem, ScoresView};

/// The naive reference: sort each row's candidates by the total order and take
/// the first `k` (`O(n log n)` per row). Tests pin every engine to it. Validates
/// like every backend does.
pub fn reference_select<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    lengths: Option<&[i32]>,
) -> Result<Selection<T>> {
    reference_select_ranges(scores, spec, None, lengths)
}

/// [`reference_select`] over per-row ranges `starts[r] .. ends[r]` (see
/// [`cpu::select_ranges`]; `starts` `None`: from column 0).
pub fn reference_select_ranges<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
) -> Result<Selection<T>> {
    spec.validate_host(scores, ends)?;
    if let Some(s) = starts {
        spec.validate_starts(s, ends)?;
    }
    let mut out = Selection::<T>::new_padded(spec)?;
    for r in 0..spec.rows {
        let len = spec.row_len(r, ends);
        let row = scores.row(r);
        let mut comps: Vec<u64> =
            (starts.map_or(0, |s| s[r] as usize)..len).map(|c| composite(row[c].key(spec.nan), c as u32)).collect();
        comps.sort_unstable_by(|a, b| b.cmp(a));
        comps.truncate(spec.k);
        spec.order.arrange(&mut comps);
        out.write_row(r, &comps, row);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
