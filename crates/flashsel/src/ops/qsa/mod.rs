//! `qsa_select`: QSA block selection, from block scores to the token ids (or
//! KV-cache slots) sparse attention reads.
//!
//! # Contract
//! Row `i` is the query at absolute position `t = positions[i]` (`t >= 0`).
//! It sees `V = (t + 1) / ratio` complete blocks (`V <= blocks`, else an
//! error on the host).
//! 1. The selected blocks: `0..V` when `V <= k_blocks` (no score is read);
//!    otherwise the exact top `k_blocks` of the row's columns `[0, V)` under
//!    the [select contract](crate::ops::select): the larger key wins, ties
//!    go to the lower block, NaN ranks by the [`NanPolicy`] (lowest by
//!    default, unlike `torch.topk`, which ranks NaN above `+inf`; a NaN is
//!    never read as zero).
//! 2. Each selected block `b` gives its `ratio` tokens `ratio*b ..
//!    ratio*b + ratio - 1`, ascending; then come the tail tokens `ratio*V
//!    ..= t` (0 to `ratio - 1` of them); then `-1` up to the width
//!    `k_blocks * ratio + ratio - 1`. `counts[i]` is the number of valid ids.
//! 3. [`OutputOrder::Index`]: the blocks by ascending index, so the valid ids
//!    ascend. [`OutputOrder::Score`]: the blocks best first (each block's
//!    tokens ascending), the tail last; a row with `V <= k_blocks` keeps
//!    causal order (it reads no score).
//! 4. With a [`PageMap`], every valid token id `tok` of row `i` becomes the
//!    physical slot `page_table[seq, tok / page_size] * page_size + tok %
//!    page_size` with `seq = seq_ids[i]`, entry by entry (the order is that
//!    of the token positions); `-1` stays `-1`. A page-table entry a row
//!    needs must be a page (`>= 0`) and the slot must fit `i32`.
//!
//! Built on the select engine: the block top-k is [`crate::cpu::select_into`]
//! with `lengths = V`; rows with `V <= k_blocks` get length 0 there and read
//! nothing.

use crate::contract::{try_vec, DType, Error, NanPolicy, Result, ScoreElem, ScoresView, PAD};
pub use crate::ops::pages::PageMap;
use crate::ops::select::{OutputOrder, SelectSpec};

/// A QSA block-selection request: everything but the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QsaSpec {
    /// Queries (rows of the block scores).
    pub rows: usize,
    /// Blocks per score row (`NB`).
    pub blocks: usize,
    /// Elements between the starts of consecutive score rows.
    pub row_stride: usize,
    /// Tokens per block (4 for QSA).
    pub ratio: usize,
    /// Blocks selected per row when more are visible (512 for QSA).
    pub k_blocks: usize,
    pub order: OutputOrder,
    pub nan: NanPolicy,
}

impl QsaSpec {
    /// QSA's defaults: ratio 4, 512 blocks, index order, NaN lowest.
    pub fn new(rows: usize, blocks: usize) -> Self {
        Self {
            rows,
            blocks,
            row_stride: blocks,
            ratio: 4,
            k_blocks: 512,
            order: OutputOrder::Index,
            nan: NanPolicy::Lowest,
        }
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
    pub fn with_stride(mut self, row_stride: usize) -> Self {
        self.row_stride = row_stride;
        self
    }

    /// Ids per output row: `k_blocks * ratio + ratio - 1` (2051 for QSA).
    pub fn width(&self) -> usize {
        self.k_blocks * self.ratio + self.ratio - 1
    }

    /// The select request of the block top-k.
    fn block_spec<T: ScoreElem>(&self) -> SelectSpec {
        self.block_spec_of(T::DTYPE)
    }

    /// The select request of the block top-k over scores of `dtype`.
    pub(crate) fn block_spec_of(&self, dtype: DType) -> SelectSpec {
        SelectSpec::new(self.rows, self.blocks, self.k_blocks, dtype)
            .with_stride(self.row_stride)
            .with_order(self.order)
            .with_nan(self.nan)
    }

    /// The shape rules: ratio and k_blocks at least 1, sizes that fit `i32`.
    pub fn validate(&self) -> Result<()> {
        if self.ratio == 0 {
            return Err(Error::InvalidOption { what: "ratio", value: "0".into(), expected: ">= 1" });
        }
        if self.k_blocks == 0 {
            return Err(Error::InvalidOption { what: "k_blocks", value: "0".into(), expected: ">= 1" });
        }
        let max = i32::MAX as u128;
        let width = self.k_blocks as u128 * self.ratio as u128 + self.ratio as u128 - 1;
        if width > max {
            return Err(Error::too_large("k_blocks * ratio + ratio - 1", width));
        }
        let cells = width * self.rows as u128;
        if cells > max {
            return Err(Error::too_large("rows * width", cells));
        }
        if self.blocks as u128 * self.ratio as u128 > max {
            return Err(Error::too_large("blocks * ratio (tokens)", self.blocks as u128 * self.ratio as u128));
        }
        Ok(())
    }

    /// The visible complete blocks of each row, checked: `t >= 0` and
    /// `(t + 1) / ratio <= blocks`.
    fn visible(&self, positions: &[i64]) -> Result<Vec<i32>> {
        let v = visible_blocks(positions, self.rows, self.ratio, self.blocks, "there are", "rows", "the scores hold")?;
        Ok(v.into_iter().map(|b| b as i32).collect())
    }
}

/// Each query's visible complete blocks `V = (t + 1) / ratio`, checked: one
/// position per row, `t >= 0`, `V <= blocks`. The one rule of every QSA
/// operation (`qsa_select`, `qsa_scores`); the words name the caller's
/// inputs in the errors (`"{rows_where} {rows} {rows_what}"`, `"{holder}
/// {blocks}"`).
pub(crate) fn visible_blocks(
    positions: &[i64],
    rows: usize,
    ratio: usize,
    blocks: usize,
    rows_where: &str,
    rows_what: &str,
    holder: &str,
) -> Result<Vec<usize>> {
    if positions.len() != rows {
        return Err(Error::Shape(format!(
            "positions has {} entries but {rows_where} {rows} {rows_what}",
            positions.len()
        )));
    }
    positions
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if t < 0 {
                return Err(Error::InvalidOption {
                    what: "position",
                    value: format!("positions[{i}] = {t}"),
                    expected: ">= 0",
                });
            }
            let v = (t as u128 + 1) / ratio as u128;
            if v > blocks as u128 {
                return Err(Error::Shape(format!(
                    "positions[{i}] = {t} sees {v} blocks of {ratio} tokens but {holder} {blocks}"
                )));
            }
            Ok(v as usize)
        })
        .collect()
}

/// The result: `rows x width` ids (tokens or slots, `-1` padded) and the
/// valid count of each row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QsaSelection {
    pub rows: usize,
    pub width: usize,
    pub ids: Vec<i32>,
    pub counts: Vec<i32>,
}

impl QsaSelection {
    /// Row `r`'s ids.
    pub fn row(&self, r: usize) -> &[i32] {
        &self.ids[r * self.width..(r + 1) * self.width]
    }
}

/// Writes one row's ids: its blocks (in output order) expanded, the tail,
/// padding; returns the count.
fn expand_row(spec: &QsaSpec, t: usize, v: usize, blocks: impl Iterator<Item = i32>, out: &mut [i32]) -> usize {
    let r = spec.ratio;
    let mut n = 0;
    for b in blocks {
        for j in 0..r {
            out[n] = (b as usize * r + j) as i32;
            n += 1;
        }
    }
    for tok in v * r..=t {
        out[n] = tok as i32;
        n += 1;
    }
    out[n..].fill(PAD);
    n
}

/// Every check of a request the host can make: the shapes, each position
/// (`t >= 0`, `V <= blocks`, `t` fits `i32`), and with pages every page a row
/// may reach (its tokens `0..=t`). Returns each row's `V`. The device paths
/// run it before a launch, so that they refuse what the CPU refuses.
pub(crate) fn check_request<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<&PageMap<'_>>,
) -> Result<Vec<i32>> {
    spec.validate()?;
    let visible = spec.visible(positions)?;
    spec.block_spec::<T>().validate_host(scores, None)?;
    check_rest(positions, spec, pages)?;
    Ok(visible)
}

/// [`check_request`] without a scores view (a context-parallel rank holds
/// only its shard of the row): the spec, the positions, the block request's
/// shape, the pages. Returns each row's `V`.
pub(crate) fn check_positions(
    positions: &[i64],
    spec: &QsaSpec,
    dtype: DType,
    pages: Option<&PageMap<'_>>,
) -> Result<Vec<i32>> {
    spec.validate()?;
    let visible = spec.visible(positions)?;
    spec.block_spec_of(dtype).validate()?;
    check_rest(positions, spec, pages)?;
    Ok(visible)
}

/// The checks after the shapes: positions that fit `i32`, every page a row
/// may reach (its tokens `0..=t`).
fn check_rest(positions: &[i64], spec: &QsaSpec, pages: Option<&PageMap<'_>>) -> Result<()> {
    if let Some(&t) = positions.iter().find(|&&t| t > i32::MAX as i64) {
        return Err(Error::too_large("a position", t as u128));
    }
    if let Some(p) = pages {
        p.check_rows(spec.rows)?;
        for (row, &t) in positions.iter().enumerate() {
            p.check_span(row, 0, t as usize + 1)?;
        }
    }
    Ok(())
}

/// Checks the request, then writes every row: the blocks `top(i)` gives for
/// a row that sees more than `k_blocks` (already in output order), or
/// `0..V` causally; expanded, mapped through `pages`. The one assembly of
/// both [`qsa_select`] and [`reference_qsa_select`]: they differ only in how
/// they find the top blocks.
fn assemble<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<&PageMap<'_>>,
    top: impl Fn(&[i32]) -> Result<Vec<i32>>,
) -> Result<QsaSelection> {
    let visible = check_request(scores, positions, spec, pages)?;
    let blocks = top(&visible)?;
    expand_rows(positions, spec, &visible, &blocks, pages)
}

/// Every row's ids from its selected blocks (`rows x k_blocks`, in output
/// order; read for the rows with `V > k_blocks`), the checked `visible`
/// and the positions: expanded, the tail, padding, slots. Also the last
/// step of the context-parallel merge (`ops::shard`).
pub(crate) fn expand_rows(
    positions: &[i64],
    spec: &QsaSpec,
    visible: &[i32],
    blocks: &[i32],
    pages: Option<&PageMap<'_>>,
) -> Result<QsaSelection> {
    let width = spec.width();
    let mut ids = try_vec("the id output", spec.rows * width, PAD)?;
    let mut counts = try_vec("the counts output", spec.rows, 0i32)?;
    for (i, out) in ids.chunks_mut(width).enumerate() {
        let v = visible[i] as usize;
        let t = positions[i] as usize;
        let n = if v > spec.k_blocks {
            let row_blocks = &blocks[i * spec.k_blocks..(i + 1) * spec.k_blocks];
            expand_row(spec, t, v, row_blocks.iter().copied(), out)
        } else {
            expand_row(spec, t, v, 0..v as i32, out)
        };
        if let Some(p) = pages {
            p.map_row(i, &mut out[..n])?;
        }
        counts[i] = n as i32;
    }
    Ok(QsaSelection { rows: spec.rows, width, ids, counts })
}

/// The block top-k's lengths: `V` for the rows that see more than
/// `k_blocks` blocks, 0 for the others (they read no score).
pub(crate) fn select_lengths(spec: &QsaSpec, visible: &[i32]) -> Vec<i32> {
    visible.iter().map(|&v| if v as usize > spec.k_blocks { v } else { 0 }).collect()
}

/// QSA block selection on the CPU: the bytes of [`reference_qsa_select`],
/// the block top-k by the select engine (`lengths = V` for the rows that
/// see more than `k_blocks` blocks, 0 for the others: nothing read).
pub fn qsa_select<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<&PageMap<'_>>,
) -> Result<QsaSelection> {
    assemble(scores, positions, spec, pages, |visible| {
        let lengths = select_lengths(spec, visible);
        let mut blocks = try_vec("the block selection", spec.rows * spec.k_blocks, PAD)?;
        crate::ops::select::cpu::select_into(scores, &spec.block_spec::<T>(), Some(&lengths), &mut blocks, None)?;
        Ok(blocks)
    })
}

/// The naive reference: per row that sees more than `k_blocks` blocks, sort
/// its visible blocks by the total order and take the first `k_blocks`; then
/// the same assembly as [`qsa_select`]. Tests pin every engine to it.
pub fn reference_qsa_select<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<&PageMap<'_>>,
) -> Result<QsaSelection> {
    assemble(scores, positions, spec, pages, |visible| {
        let mut blocks = vec![PAD; spec.rows * spec.k_blocks];
        for (i, &v) in visible.iter().enumerate().filter(|&(_, &v)| v as usize > spec.k_blocks) {
            let row = scores.row(i);
            let mut c: Vec<u64> =
                (0..v as usize).map(|b| crate::contract::composite(row[b].key(spec.nan), b as u32)).collect();
            c.sort_unstable_by(|a, b| b.cmp(a));
            c.truncate(spec.k_blocks);
            spec.order.arrange(&mut c);
            for (j, &c) in c.iter().enumerate() {
                blocks[i * spec.k_blocks + j] = crate::contract::composite_index(c) as i32;
            }
        }
        Ok(blocks)
    })
}

pub mod check;
pub mod device;

#[cfg(test)]
mod tests;
