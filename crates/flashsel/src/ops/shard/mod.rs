//! Context-parallel selection: a row's columns sharded across ranks (the KV
//! cache and the indexer keys of one sequence split over GPUs), and the exact
//! merge that gives every rank the bytes one device would return on the
//! whole row.
//!
//! # Contract
//! A [`ShardLayout`] cuts every row's `cols` columns into one contiguous
//! [`Shard`] per rank, in rank order: rank `r` holds the global columns
//! `offset_r .. offset_r + len_r`, `offset_0 = 0`, `offset_{r+1} = offset_r +
//! len_r`, the lengths summing to `cols`. Shards may be uneven and empty, any
//! number of ranks (at least one).
//!
//! 1. **Each rank** selects its exact local top `k` (the global `k`) among
//!    its columns of the row's candidates (`0 .. len_i`, or the row's range
//!    `starts[i] .. ends[i]`, intersected with its shard) under the request's
//!    NaN policy, and writes them with **global** column ids: a
//!    [`Selection`] of `rows x k` whose row `i` holds exactly
//!    `min(k, |shard ∩ candidates_i|)` entries, then `-1` / `-inf`
//!    ([`shard_select`], [`shard_select_ranges`]; a rank's local column `c`
//!    is global `offset + c`, and ties inside a shard fall to the lower local
//!    column, which is the lower global one, so the local order is the
//!    global order).
//! 2. **The wire** (what an all-gather moves): each rank's block is two
//!    planes, the ids (`i32 [rows, k]`, global, `-1` padded) and the values
//!    (the score dtype's own bits `[rows, k]`, `-inf` padded); gathered in
//!    rank order they are `[ranks, rows, k]` each, rank-major (NCCL's
//!    all-gather concatenation). 8 bytes a candidate for `f32`, 6 for
//!    `bf16`/`f16`: no more than the `u64` [`composite`]
//!    (8 bytes whatever the dtype), and unlike it the values keep their bits
//!    (a composite cannot tell `-0.0` from `+0.0`, nor one NaN payload from
//!    another). The merge recomputes each key from the value bits. The CPU
//!    merge takes a rank's entries in any order; flashsel's ranks ship them
//!    in index order (ascending global ids), the form the GPU merge
//!    ([`device`]) requires and checks; padding is told by the id `-1`
//!    alone (a real `-inf` has an id).
//! 3. **The merge** ([`merge_candidates`], [`merge_candidates_ranges`],
//!    [`merge_candidates_into`]) takes the gathered planes and returns
//!    exactly [`crate::cpu::select`] (or [`crate::cpu::select_ranges`]) of
//!    the same [`SelectSpec`] on the whole row: the same indices in the same
//!    order, the same value bits, the same padding.
//!
//! # Why the merge is exact
//! Let `C` be a row's candidates and `C_r = C ∩ shard_r`; the shards are
//! disjoint and cover `C`. The contract's order is total (composites are
//! unique: one global id each). Take `x` in the global top `k` of `C`, held
//! by rank `r`: fewer than `k` elements of `C` rank above `x`, so fewer than
//! `k` of `C_r` do, and `x` is in rank `r`'s top `k`. So the global top `k`
//! lies in the union `U` of the ranks' top `k`s, and, `U` being a subset of
//! `C`, it is the top `k` of `U`. `|U| = Σ min(k, |C_r|) >= min(k, |C|)`, so
//! the merged row has `min(k, |C|)` entries, as one device pads. Ties across
//! ranks resolve by the global id in the composite (the lower wins), NaN by
//! the key of the NaN policy, and the final order (score or index) is a sort
//! by the total order or by the unique id: nothing depends on the rank
//! count, the shard sizes, or the order of the entries on the wire.
//!
//! # Checks
//! The merge checks what it can without the scores: the spec, the layout
//! against `cols`, the lengths and starts as the single-device call does,
//! the planes' sizes, and for every rank and row that the block is a padded
//! list of exactly `min(k, |C_r|)` distinct ids, each in `C_r` (a rank that
//! shipped fewer, or ids outside its columns, is an error naming the rank
//! and the row, never a silently different answer). It cannot check that
//! the values are the scores of those ids, nor that the ranks used the same
//! NaN policy: every rank and the merge run the same spec.
//!
//! # QSA
//! [`qsa_shard_select`] is a rank's part of `qsa_select` (the local top
//! `k_blocks` of its blocks among the row's visible `[0, V)`, for rows with
//! `V > k_blocks`; nothing for the others, which read no score), and
//! [`qsa_merge`] merges the blocks and assembles the ids exactly as
//! [`crate::cpu::qsa_select`] does on the whole row (blocks to tokens, the
//! unscored tail, padding, counts, page-table slots).
//!
//! # On the GPU
//! [`device`]: `CudaEngine::shard_merge_device` (and its QSA form) merges
//! the gathered planes on the device with the same bytes: the candidates
//! compacted in id order, the select engine over them, the ids gathered
//! back (QSA: the blocks expanded by the select kernels' token write).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::contract::{composite, composite_index, padded, try_vec, Error, Result, ScoreElem, ScoresView, PAD};
use crate::ops::pages::PageMap;
use crate::ops::qsa::{QsaSelection, QsaSpec};
use crate::ops::select::{OutputOrder, SelectSpec, Selection};

/// One rank's columns of every row: global columns `offset .. offset + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    pub offset: usize,
    pub len: usize,
}

impl Shard {
    /// One past the shard's last global column.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
    /// The shard's global columns.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.end()
    }
    /// The shard's part of the global columns `lo .. hi` (`lo <= hi`): empty
    /// when they do not meet.
    pub fn clip(&self, lo: usize, hi: usize) -> Range<usize> {
        let (a, b) = (self.offset, self.end());
        lo.clamp(a, b)..hi.clamp(a, b)
    }
}

/// How every row's columns are cut over the ranks: one contiguous [`Shard`]
/// per rank, in rank order, tiling `0 .. cols`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardLayout {
    shards: Vec<Shard>,
}

impl ShardLayout {
    /// Rank `r` holds `lens[r]` columns, after those of ranks `0 .. r` (zero
    /// is an empty shard). At least one rank; the total must fit `i32`.
    pub fn from_lens(lens: &[usize]) -> Result<Self> {
        if lens.is_empty() {
            return Err(Error::InvalidOption { what: "rank count", value: "0".into(), expected: ">= 1" });
        }
        let mut shards = Vec::with_capacity(lens.len());
        let mut offset = 0u128;
        for &len in lens {
            shards.push(Shard { offset: offset as usize, len });
            offset += len as u128;
            if offset > i32::MAX as u128 {
                return Err(Error::too_large("cols (the shards' total)", offset));
            }
        }
        Ok(Self { shards })
    }

    /// `cols` columns over `ranks` ranks as evenly as they go: rank `r` holds
    /// `r * cols / ranks .. (r + 1) * cols / ranks`.
    pub fn even(cols: usize, ranks: usize) -> Result<Self> {
        let at = |r: usize| (r as u128 * cols as u128 / ranks.max(1) as u128) as usize;
        let lens: Vec<usize> = (0..ranks).map(|r| at(r + 1) - at(r)).collect();
        Self::from_lens(&lens)
    }

    pub fn ranks(&self) -> usize {
        self.shards.len()
    }
    /// The columns of a row: the shards' total.
    pub fn cols(&self) -> usize {
        self.shards.last().map_or(0, Shard::end)
    }
    /// Rank `r`'s shard (`r < ranks`).
    pub fn shard(&self, r: usize) -> Shard {
        self.shards[r]
    }
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Rank `r`'s shard, checked.
    fn rank(&self, r: usize) -> Result<Shard> {
        self.shards.get(r).copied().ok_or_else(|| Error::InvalidOption {
            what: "rank",
            value: format!("{r} of a layout of {} ranks", self.ranks()),
            expected: "0 <= rank < ranks",
        })
    }

    /// The layout cuts rows of `cols` columns.
    fn check_cols(&self, cols: usize) -> Result<()> {
        if self.cols() != cols {
            return Err(Error::Shape(format!(
                "the shard layout covers {} columns but the rows hold {cols}",
                self.cols()
            )));
        }
        Ok(())
    }
}

/// The global request's checks, as the single-device call makes them (the
/// spec, the dtype), then the layout against `cols`, the ends and the starts.
fn check_global<T: ScoreElem>(
    spec: &SelectSpec,
    layout: &ShardLayout,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
) -> Result<()> {
    spec.validate()?;
    if T::DTYPE != spec.dtype {
        return Err(Error::UnknownDType(format!("spec says {} but the data is {}", spec.dtype, T::DTYPE)));
    }
    layout.check_cols(spec.cols)?;
    if let Some(e) = ends {
        spec.validate_lengths(e)?;
    }
    if let Some(s) = starts {
        spec.validate_starts(s, ends)?;
    }
    Ok(())
}

/// Row `r`'s candidates (validated starts and ends): `starts[r] .. ends[r]`.
#[inline]
fn row_range(spec: &SelectSpec, r: usize, starts: Option<&[i32]>, ends: Option<&[i32]>) -> (usize, usize) {
    (starts.map_or(0, |s| s[r] as usize), spec.row_len(r, ends))
}

/// Rank `rank`'s candidates of the global request `spec` (whose `cols` are
/// the whole row's), from its own columns only: `local` is the rank's
/// `rows x len_r` shard (any stride), local column `c` being global column
/// `offset + c`. Returns a `rows x k` [`Selection`] with global ids in
/// ascending order (index order): the rank's block of the wire. `lengths` are the global per-row
/// lengths of [`crate::cpu::select`].
pub fn shard_select<T: ScoreElem>(
    local: &ScoresView<'_, T>,
    spec: &SelectSpec,
    layout: &ShardLayout,
    rank: usize,
    lengths: Option<&[i32]>,
) -> Result<Selection<T>> {
    shard_select_impl(local, spec, layout, rank, None, lengths)
}

/// [`shard_select`] over the global per-row ranges `starts[i] .. ends[i]` of
/// [`crate::cpu::select_ranges`], each intersected with the rank's shard.
pub fn shard_select_ranges<T: ScoreElem>(
    local: &ScoresView<'_, T>,
    spec: &SelectSpec,
    layout: &ShardLayout,
    rank: usize,
    starts: &[i32],
    ends: Option<&[i32]>,
) -> Result<Selection<T>> {
    shard_select_impl(local, spec, layout, rank, Some(starts), ends)
}

fn shard_select_impl<T: ScoreElem>(
    local: &ScoresView<'_, T>,
    spec: &SelectSpec,
    layout: &ShardLayout,
    rank: usize,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
) -> Result<Selection<T>> {
    check_global::<T>(spec, layout, starts, ends)?;
    let shard = layout.rank(rank)?;
    if local.rows() != spec.rows || local.cols() != shard.len {
        return Err(Error::Shape(format!(
            "rank {rank}'s view is {}x{} but its shard is {}x{}",
            local.rows(),
            local.cols(),
            spec.rows,
            shard.len
        )));
    }
    // The row's global range, clipped to the shard, in local columns.
    let (mut lo, mut hi) = (Vec::with_capacity(spec.rows), Vec::with_capacity(spec.rows));
    for r in 0..spec.rows {
        let (s, e) = row_range(spec, r, starts, ends);
        let c = shard.clip(s, e);
        lo.push((c.start - shard.offset) as i32);
        hi.push((c.end - shard.offset) as i32);
    }
    let lspec = SelectSpec::new(spec.rows, shard.len, spec.k, T::DTYPE)
        .with_stride(local.row_stride())
        .with_nan(spec.nan)
        .with_order(OutputOrder::Index);
    let mut out = crate::ops::select::cpu::select_ranges(local, &lspec, &lo, Some(&hi))?;
    // Local to global: order-preserving, so the local ties are the global ones.
    let off = shard.offset as i32;
    out.indices.iter_mut().filter(|i| **i != PAD).for_each(|i| *i += off);
    Ok(out)
}

/// Every rank's block, simulated from the whole rows (`scores`, the
/// single-device input) and concatenated in rank order: the two planes an
/// all-gather of [`shard_select`] (or, with `starts`, [`shard_select_ranges`])
/// delivers, `[ranks, rows, k]` each. Each rank's block is
/// [`crate::cpu::select_ranges`] on the whole view over the row's range
/// clipped to the shard (it reads only the shard's columns; its ids are
/// global), the same bytes as [`shard_select`] on the rank's own copy.
pub fn simulate_ranks<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    layout: &ShardLayout,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
) -> Result<(Vec<i32>, Vec<T>)> {
    spec.validate_host(scores, ends)?;
    check_global::<T>(spec, layout, starts, ends)?;
    let n = gathered_len(spec, layout)?;
    let mut ids = try_vec("the gathered ids", n, PAD)?;
    let mut values = try_vec("the gathered values", n, T::neg_inf())?;
    let rspec = spec.with_order(OutputOrder::Index);
    let block = spec.rows * spec.k;
    for (rank, shard) in layout.shards().iter().enumerate() {
        let (mut lo, mut hi) = (Vec::with_capacity(spec.rows), Vec::with_capacity(spec.rows));
        for r in 0..spec.rows {
            let (s, e) = row_range(spec, r, starts, ends);
            let c = shard.clip(s, e);
            lo.push(c.start as i32);
            hi.push(c.end as i32);
        }
        let at = rank * block..(rank + 1) * block;
        crate::ops::select::cpu::select_ranges_into(
            scores,
            &rspec,
            &lo,
            Some(&hi),
            &mut ids[at.clone()],
            Some(&mut values[at]),
        )?;
    }
    Ok((ids, values))
}

/// Elements of each gathered plane: `ranks * rows * k`, checked.
fn gathered_len(spec: &SelectSpec, layout: &ShardLayout) -> Result<usize> {
    let n = layout.ranks() as u128 * spec.rows as u128 * spec.k as u128;
    usize::try_from(n).map_err(|_| Error::too_large("ranks * rows * k (the gathered candidates)", n))
}

/// The merge of the gathered candidates (`ids`, `values`: `[ranks, rows, k]`
/// each, rank-major, as [`simulate_ranks`] or an all-gather of the ranks'
/// [`shard_select`] blocks leave them): exactly [`crate::cpu::select`] of
/// `spec` with `lengths` on the whole rows.
pub fn merge_candidates<T: ScoreElem>(
    ids: &[i32],
    values: &[T],
    spec: &SelectSpec,
    layout: &ShardLayout,
    lengths: Option<&[i32]>,
) -> Result<Selection<T>> {
    check_merge(ids, values, spec, layout, None, lengths)?;
    let mut out = Selection::<T>::new_padded(spec)?;
    merge_rows(ids, values, spec, layout, &mut out.indices, Some(&mut out.values))?;
    Ok(out)
}

/// [`merge_candidates`] over the per-row ranges `starts[i] .. ends[i]`:
/// exactly [`crate::cpu::select_ranges`] on the whole rows.
pub fn merge_candidates_ranges<T: ScoreElem>(
    ids: &[i32],
    values: &[T],
    spec: &SelectSpec,
    layout: &ShardLayout,
    starts: &[i32],
    ends: Option<&[i32]>,
) -> Result<Selection<T>> {
    check_merge(ids, values, spec, layout, Some(starts), ends)?;
    let mut out = Selection::<T>::new_padded(spec)?;
    merge_rows(ids, values, spec, layout, &mut out.indices, Some(&mut out.values))?;
    Ok(out)
}

/// [`merge_candidates`] (`starts` `None`) or [`merge_candidates_ranges`]
/// into caller-owned buffers of exactly `rows * k` elements each (else
/// [`Error::BufferSize`]); every element is written, padding included.
#[allow(clippy::too_many_arguments)]
pub fn merge_candidates_into<T: ScoreElem>(
    ids: &[i32],
    values: &[T],
    spec: &SelectSpec,
    layout: &ShardLayout,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    out_indices: &mut [i32],
    out_values: Option<&mut [T]>,
) -> Result<()> {
    check_merge(ids, values, spec, layout, starts, ends)?;
    let need = spec.rows * spec.k; // validated to fit i32
    if out_indices.len() != need {
        return Err(Error::BufferSize { what: "out_indices", got: out_indices.len(), need });
    }
    if let Some(v) = out_values.as_ref().filter(|v| v.len() != need) {
        return Err(Error::BufferSize { what: "out_values", got: v.len(), need });
    }
    merge_rows(ids, values, spec, layout, out_indices, out_values)
}

/// Every check of a merge: the global request, the planes' sizes, and each
/// rank's block of each row (see the module's Checks). The first failing
/// row's error (by row, then rank), whatever the thread count.
pub(crate) fn check_merge<T: ScoreElem>(
    ids: &[i32],
    values: &[T],
    spec: &SelectSpec,
    layout: &ShardLayout,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
) -> Result<()> {
    check_global::<T>(spec, layout, starts, ends)?;
    let need = gathered_len(spec, layout)?;
    if ids.len() != need {
        return Err(Error::BufferSize { what: "candidate ids", got: ids.len(), need });
    }
    if values.len() != need {
        return Err(Error::BufferSize { what: "candidate values", got: values.len(), need });
    }
    let k = spec.k;
    let bad = (0..spec.rows)
        .into_par_iter()
        .map_init(Vec::new, |seen: &mut Vec<i32>, r| {
            let (s, e) = row_range(spec, r, starts, ends);
            for (rank, shard) in layout.shards().iter().enumerate() {
                let block = &ids[(rank * spec.rows + r) * k..][..k];
                let mine = shard.clip(s, e);
                let want = k.min(mine.len());
                let n = padded::valid_len(block);
                let complain = |what: String| {
                    Err(Error::InvalidOption {
                        what: "rank candidates",
                        value: format!("rank {rank}, row {r}: {what}"),
                        expected: "min(k, the rank's candidate columns) distinct ids of them, then -1",
                    })
                };
                if let Some(j) = block[n..].iter().position(|&i| i != PAD) {
                    return complain(format!("id {} at slot {} follows a -1", block[n + j], n + j));
                }
                if n != want {
                    return complain(format!("{n} ids where its candidate columns {mine:?} and k = {k} give {want}"));
                }
                if let Some(&id) = block[..n].iter().find(|&&i| i < 0 || !mine.contains(&(i as usize))) {
                    return complain(format!("id {id} is outside its candidate columns {mine:?}"));
                }
                seen.clear();
                seen.extend_from_slice(&block[..n]);
                seen.sort_unstable();
                if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                    return complain(format!("id {} appears twice", w[0]));
                }
            }
            Ok(())
        })
        .filter_map(Result::err)
        .find_first(|_| true);
    bad.map_or(Ok(()), Err)
}

/// Merges checked planes into the outputs (`rows x k`), in parallel over
/// rows. A row's work buffer is reserved fallibly ([`Error::OutOfMemory`]).
fn merge_rows<T: ScoreElem>(
    ids: &[i32],
    values: &[T],
    spec: &SelectSpec,
    layout: &ShardLayout,
    out_indices: &mut [i32],
    out_values: Option<&mut [T]>,
) -> Result<()> {
    let (rows, k, ranks) = (spec.rows, spec.k, layout.ranks());
    if rows == 0 {
        return Ok(());
    }
    let oom = AtomicBool::new(false);
    let row = |buf: &mut Vec<(u64, T)>, r: usize, idx: &mut [i32], val: Option<&mut [T]>| {
        buf.clear();
        if buf.try_reserve(ranks.saturating_mul(k.min(spec.cols))).is_err() {
            oom.store(true, Ordering::Relaxed);
            return;
        }
        for rank in 0..ranks {
            let at = (rank * rows + r) * k;
            for (&id, &v) in ids[at..at + k].iter().zip(&values[at..at + k]) {
                if id == PAD {
                    break;
                }
                buf.push((composite(v.key(spec.nan), id as u32), v));
            }
        }
        // The top k of the union, in output order.
        if buf.len() > k {
            buf.select_nth_unstable_by(k - 1, |a, b| b.0.cmp(&a.0));
            buf.truncate(k);
        }
        match spec.order {
            OutputOrder::Score => buf.sort_unstable_by_key(|p| std::cmp::Reverse(p.0)),
            OutputOrder::Index => buf.sort_unstable_by_key(|p| composite_index(p.0)),
        }
        let n = buf.len();
        for (o, p) in idx.iter_mut().zip(buf.iter()) {
            *o = composite_index(p.0) as i32;
        }
        idx[n..].fill(PAD);
        if let Some(val) = val {
            for (o, p) in val.iter_mut().zip(buf.iter()) {
                *o = p.1;
            }
            val[n..].fill(T::neg_inf());
        }
    };
    let min_rows = ((1usize << 12) / (ranks * k).max(1)).max(1);
    match out_values {
        Some(vals) => out_indices
            .par_chunks_mut(k)
            .zip(vals.par_chunks_mut(k))
            .enumerate()
            .with_min_len(min_rows)
            .for_each_init(Vec::new, |buf, (r, (idx, val))| row(buf, r, idx, Some(val))),
        None => out_indices
            .par_chunks_mut(k)
            .enumerate()
            .with_min_len(min_rows)
            .for_each_init(Vec::new, |buf, (r, idx)| row(buf, r, idx, None)),
    }
    if oom.load(Ordering::Relaxed) {
        let bytes = ranks as u128 * k.min(spec.cols) as u128 * std::mem::size_of::<(u64, T)>() as u128;
        return Err(Error::OutOfMemory { what: "the merge's candidate buffer", bytes });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// QSA
// ---------------------------------------------------------------------------

/// Rank `rank`'s part of `qsa_select`: its exact local top `k_blocks` of the
/// row's visible blocks `[0, V)` in its shard of the block scores (`local`:
/// `rows x len_r`, local block `b` = global `offset + b`), global block ids,
/// ascending; rows with `V <= k_blocks` are all padding. `spec` is the
/// whole request (`blocks` = `NB`, the whole row). Its block of the wire
/// for [`qsa_merge`].
pub fn qsa_shard_select<T: ScoreElem>(
    local: &ScoresView<'_, T>,
    positions: &[i64],
    spec: &QsaSpec,
    layout: &ShardLayout,
    rank: usize,
) -> Result<Selection<T>> {
    let visible = crate::ops::qsa::check_positions(positions, spec, T::DTYPE, None)?;
    shard_select(
        local,
        &spec.block_spec_of(T::DTYPE),
        layout,
        rank,
        Some(&crate::ops::qsa::select_lengths(spec, &visible)),
    )
}

/// QSA block selection from the gathered block candidates of every rank
/// ([`qsa_shard_select`]'s blocks, `[ranks, rows, k_blocks]` ids and values):
/// exactly [`crate::cpu::qsa_select`] on the whole rows, pages included.
pub fn qsa_merge<T: ScoreElem>(
    ids: &[i32],
    values: &[T],
    positions: &[i64],
    spec: &QsaSpec,
    layout: &ShardLayout,
    pages: Option<&PageMap<'_>>,
) -> Result<QsaSelection> {
    let visible = crate::ops::qsa::check_positions(positions, spec, T::DTYPE, pages)?;
    let ends = crate::ops::qsa::select_lengths(spec, &visible);
    let bspec = spec.block_spec_of(T::DTYPE);
    check_merge(ids, values, &bspec, layout, None, Some(&ends))?;
    let mut blocks = try_vec("the block selection", spec.rows * spec.k_blocks, PAD)?;
    merge_rows(ids, values, &bspec, layout, &mut blocks, None)?;
    // The assembly of `qsa_select`: blocks to tokens, the tail, padding,
    // slots.
    crate::ops::qsa::expand_rows(positions, spec, &visible, &blocks, pages)
}

/// The GPU merge's wire form, checked on the host: every rank's valid ids
/// of every row ascend (flashsel's ranks select in index order). The first
/// failing row's error, by row then rank.
pub(crate) fn check_ascending(ids: &[i32], rows: usize, k: usize, ranks: usize) -> Result<()> {
    for r in 0..rows {
        for rank in 0..ranks {
            let block = &ids[(rank * rows + r) * k..][..k];
            let n = padded::valid_len(block);
            if let Some(j) = block[..n].windows(2).position(|w| w[0] >= w[1]) {
                return Err(Error::InvalidOption {
                    what: "rank candidates",
                    value: format!(
                        "rank {rank}, row {r}: id {} at slot {} follows id {}",
                        block[j + 1],
                        j + 1,
                        block[j]
                    ),
                    expected: "each rank's ids in ascending order (index order) for the GPU merge",
                });
            }
        }
    }
    Ok(())
}

pub mod check;
pub mod device;
pub mod nccl;

#[cfg(test)]
mod tests;
