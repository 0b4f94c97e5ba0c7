//! The op-neutral contract: the element types, how scores compare (keys, the
//! NaN policy, ties), the views operations read, the padded index lists they
//! write, and the errors. Every operation ([`crate::ops`]) builds on it, and
//! every backend honours it bit for bit. `docs/semantics.md` states the same
//! rules in prose.
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
//! # Outputs
//! Index outputs are padded index lists ([`padded`]): valid entries first,
//! then [`PAD`] (`-1`); value outputs pad with `-inf`.

pub(crate) mod error;
mod key;
pub mod padded;
mod view;

pub use error::{try_vec, CudaError, Error, Result};
pub use key::{composite, composite_index, composite_key, DType, NanPolicy, ScoreElem};
pub use padded::PAD;
pub use view::ScoresView;

#[cfg(test)]
mod tests;
