//! `qsa_indexer`: the QSA indexer fused with block selection, from queries
//! and block keys to the token ids (or KV slots) sparse attention reads.
//!
//! # Contract
//! The result is, byte for byte, `qsa_select(qsa_scores(q, kbar, positions),
//! positions)` on the CPU ([`super::qsa_scores`] with the heads, width and
//! ratio of the spec, then [`crate::ops::qsa::qsa_select`] with its ratio,
//! `k_blocks`, order and NaN policy, and `pages` for the ids), without the
//! `[T, NB]` f32 score matrix: the same checks in the same order (those of
//! `qsa_scores`, then those of `qsa_select`), so the same errors.
//!
//! # How (the CPU engine)
//! A row with `V <= k_blocks` selects `0..V` and reads no score, so it is not
//! scored at all. The other rows go, in order, in groups whose score scratch
//! (`rows x W` f32, `W` the group's largest `V`) stays within
//! [`INDEXER_SCRATCH_BYTES`] (256 MiB): each group is scored with the
//! `qsa_scores` engine's own row function (the same bytes: the arithmetic is
//! per row and per block, independent of the batch), then ranked by the
//! select engine ([`crate::ops::select::cpu::select_into`] with `lengths =
//! V`, exactly as `qsa_select` does; the select contract is exact, so the
//! blocks of a row do not depend on the rows beside it); the blocks are
//! expanded by `qsa_select`'s own assembly.
//!
//! # Workspace bound
//! The score scratch is at most `max(256 MiB, 4 * V_max bytes)`: 256 MiB, or
//! one row of `V_max` f32 when a single row's visible blocks exceed 256 MiB
//! (67,108,864 blocks, 256 Mi tokens at ratio 4); a decode step at 1M tokens
//! and ratio 4 uses 1 MiB (262,144 f32). Beside it: the block selection
//! (`rows * k_blocks` i32, as `qsa_select`'s), the output, and the select
//! engine's own per-call buffers.

use crate::contract::{try_vec, DType, NanPolicy, Result, ScoresView, PAD};
use crate::ops::pages::PageMap;
use crate::ops::qsa::{check_positions, expand_rows, QsaSelection, QsaSpec};
use crate::ops::select::OutputOrder;
use rayon::prelude::*;

use super::{check_request, score_fn, score_row, BlockKeys, KeyElem, QsaScoresSpec, QueryElem};

/// The most bytes of scores the CPU `qsa_indexer` holds at once (unless one
/// row alone needs more: then that row's `4 * V` bytes).
pub const INDEXER_SCRATCH_BYTES: usize = 256 << 20;

/// A fused indexer request: the `qsa_scores` shape and the `qsa_select`
/// options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QsaIndexerSpec {
    /// Queries (`T`).
    pub rows: usize,
    /// Query heads per row (`H`, 1 to 16).
    pub heads: usize,
    /// Values per head and per block key (`d`: 64, 128 or 256).
    pub dim: usize,
    /// Blocks of keys (`NB`).
    pub blocks: usize,
    /// Tokens per block (4 for QSA).
    pub ratio: usize,
    /// Blocks selected per row when more are visible (512 for QSA).
    pub k_blocks: usize,
    pub order: OutputOrder,
    pub nan: NanPolicy,
}

impl QsaIndexerSpec {
    /// QSA's defaults: 4 heads of 128, ratio 4, 512 blocks, index order, NaN
    /// lowest.
    pub fn new(rows: usize, blocks: usize) -> Self {
        let s = QsaSpec::new(rows, blocks);
        Self { rows, heads: 4, dim: 128, blocks, ratio: s.ratio, k_blocks: s.k_blocks, order: s.order, nan: s.nan }
    }
    pub fn with_heads(mut self, heads: usize) -> Self {
        self.heads = heads;
        self
    }
    pub fn with_dim(mut self, dim: usize) -> Self {
        self.dim = dim;
        self
    }
    pub fn with_ratio(mut self, ratio: usize) -> Self {
        self.ratio = ratio;
        self
    }
    pub fn with_k_blocks(mut self, k_blocks: usize) -> Self {
        self.k_blocks = k_blocks;
        self
    }
    pub fn with_order(mut self, order: OutputOrder) -> Self {
        self.order = order;
        self
    }
    pub fn with_nan(mut self, nan: NanPolicy) -> Self {
        self.nan = nan;
        self
    }

    /// The scores half: `qsa_scores`' request.
    pub fn scores_spec(&self) -> QsaScoresSpec {
        QsaScoresSpec::new(self.rows, self.blocks).with_heads(self.heads).with_dim(self.dim).with_ratio(self.ratio)
    }

    /// The selection half: `qsa_select`'s request over the `[T, NB]` scores.
    pub fn select_spec(&self) -> QsaSpec {
        QsaSpec::new(self.rows, self.blocks)
            .with_ratio(self.ratio)
            .with_k_blocks(self.k_blocks)
            .with_order(self.order)
            .with_nan(self.nan)
    }

    /// Ids per output row: `k_blocks * ratio + ratio - 1`.
    pub fn width(&self) -> usize {
        self.select_spec().width()
    }
}

/// The fused QSA indexer on the CPU: the bytes of `qsa_select(qsa_scores(q,
/// keys, positions), positions, pages)`, scoring only the rows with `V >
/// k_blocks`, in groups of at most [`INDEXER_SCRATCH_BYTES`] of scores (see
/// the module docs). `pages` maps the ids to slots as in `qsa_select` (pass
/// the keys' page map for the slots of a paged cache; `None` for token ids).
pub fn qsa_indexer<Q: QueryElem, K: KeyElem>(
    q: &[Q],
    keys: &BlockKeys<'_, K>,
    positions: &[i64],
    spec: &QsaIndexerSpec,
    pages: Option<&PageMap<'_>>,
) -> Result<QsaSelection> {
    qsa_indexer_with(q, keys, positions, spec, pages, INDEXER_SCRATCH_BYTES / 4)
}

/// [`qsa_indexer`] with a scratch of `scratch` f32 (the tests force tiny
/// groups). The answer never depends on `scratch`.
pub(crate) fn qsa_indexer_with<Q: QueryElem, K: KeyElem>(
    q: &[Q],
    keys: &BlockKeys<'_, K>,
    positions: &[i64],
    spec: &QsaIndexerSpec,
    pages: Option<&PageMap<'_>>,
    scratch: usize,
) -> Result<QsaSelection> {
    let sspec = spec.scores_spec();
    // qsa_scores' checks, then qsa_select's (its view of [T, NB] f32 scores
    // always agrees with its spec).
    let (visible, resolved) = check_request(q.len(), keys, positions, &sspec)?;
    let qspec = spec.select_spec();
    let visible_i32 = check_positions(positions, &qspec, DType::F32, pages)?;
    let k = spec.k_blocks;
    let mut blocks = try_vec("the block selection", spec.rows * k, PAD)?;
    let ranked: Vec<usize> = (0..spec.rows).filter(|&i| visible[i] > k).collect();
    let per_row = spec.heads * spec.dim;
    let (run, scale) = (score_fn::<K>(spec.dim), sspec.scale());
    let mut buf: Vec<f32> = Vec::new();
    let mut at = 0;
    while at < ranked.len() {
        // The longest run of rows from `at` whose scratch fits (one row at least).
        let (mut end, mut width) = (at, 0);
        while end < ranked.len() {
            let w = width.max(visible[ranked[end]]);
            if end > at && (end - at + 1).saturating_mul(w) > scratch {
                break;
            }
            (end, width) = (end + 1, w);
        }
        let group = &ranked[at..end];
        let n = group.len() * width;
        if buf.len() < n {
            drop(std::mem::take(&mut buf)); // the old scratch goes first: one at a time
            buf = try_vec("the indexer's score scratch", n, 0f32)?;
        }
        let scores = &mut buf[..n];
        scores.par_chunks_mut(width).zip(group.par_iter()).for_each(|(out, &row)| {
            score_row(&q[row * per_row..(row + 1) * per_row], &resolved, row, visible[row], run, scale, out);
        });
        let view = ScoresView::new(scores, group.len(), width)?;
        let gspec = QsaSpec { rows: group.len(), blocks: width, row_stride: width, ..qspec }.block_spec_of(DType::F32);
        let lengths: Vec<i32> = group.iter().map(|&row| visible_i32[row]).collect();
        let mut top = try_vec("the block selection", group.len() * k, PAD)?;
        crate::ops::select::cpu::select_into(&view, &gspec, Some(&lengths), &mut top, None)?;
        for (&row, sel) in group.iter().zip(top.chunks_exact(k)) {
            blocks[row * k..(row + 1) * k].copy_from_slice(sel);
        }
        at = end;
    }
    expand_rows(positions, &qspec, &visible_i32, &blocks, pages)
}

#[cfg(test)]
mod tests;
