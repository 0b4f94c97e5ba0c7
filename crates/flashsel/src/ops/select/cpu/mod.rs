//! The CPU engine: exact top-k under the [contract](crate::contract), in linear
//! time, parallel over rows and, for a few long rows, within a row.
//!
//! It returns exactly the bytes of [`reference_select`](crate::contract::reference_select):
//! the same indices, the same value bits, the same padding (`-1` / `-inf`), for
//! both output orders and both NaN policies. Nothing here decides the answer
//! but the contract's total order; every heuristic below only changes the work.
//!
//! # Algorithm (per row, or per chunk of a row)
//! The row is streamed in ascending column order. Each score has a `u32`
//! contract key (computed by a branch-free equivalent of
//! [`ScoreElem::key`](crate::contract::ScoreElem::key), proved equal in the unit
//! tests) and candidates are kept as [`composite`](crate::contract::composite)s
//! (`key << 32 | (u32::MAX - col)`, larger = ranks higher) in a buffer of
//! capacity `cap = min(len, max(4k, k + 1024))`.
//! 1. *Start*: plain, the first `cap` elements go in unconditionally and the
//!    buffer is *compacted* (`select_nth_unstable` keeps the `k` largest
//!    composites; the threshold `t` becomes the key of the k-th). For rows of at
//!    least 16 Ki elements and `16 k`, a threshold is guessed instead from 2048
//!    scores sampled in evenly spaced runs (the `r`-th largest sampled key, `r`
//!    three standard deviations above the rank the k-th would have), and the
//!    whole row is streamed keeping `key >= guess`; if fewer than `k` elements
//!    pass, the guess was too high and the row is streamed again plainly.
//! 2. *Filter*: a later element is pushed only if `key > t`. The row goes by
//!    tiles of 4096: (A) the whole tile is compared with the threshold into
//!    64-bit masks, branch-free, without computing keys (the threshold is turned
//!    into a float or an order-preserving integer compare; SSE2, AVX2 or
//!    AVX-512 by run-time detection, or plain Rust); (B) the set bits become a
//!    list of positions, almost branch-free; (C) those elements, now in L1, are
//!    keyed, tested exactly and pushed. When the buffer is full it is compacted
//!    again, which can only raise `t`.
//! 3. *Finish*: compact to `min(k, len)`, then order: [`OutputOrder::Score`] sorts
//!    the composites descending, [`OutputOrder::Index`] by ascending column (as
//!    [`OutputOrder::arrange`] does), both by an LSD radix sort over the bits of
//!    the sort field that vary, ties then ordered by the other half; write
//!    indices, the value bits, and padding.
//!
//! # Invariants
//! * After each compaction the buffer holds the exact top `k` of the elements
//!   pushed so far and `t` is the key of the k-th of them.
//! * Strict `key > t` is exact: elements arrive in ascending column order, so a
//!   later element with key `t` loses the tie to all `k` survivors (each has key
//!   `>= t` and a lower column), and one with a lower key loses outright.
//! * A guessed start is exact once `k` elements reach it: every skipped element
//!   has a key below all of theirs.
//! * The buffer is a cache: its capacity changes how often it is compacted, never
//!   the answer. Nothing is sized by `k` beyond `min(k, len) + 1024` elements per
//!   row (plus the 2048 samples), except the `rows * k` output itself.
//!
//! # Splitting a long row
//! When a row has at least `Tuning::split_min_len` (64 Ki) candidates and the
//! pool has more threads than there are rows, the row is cut into
//! `ChunkPlan::chunks` equal contiguous chunks, a pure function of the row
//! length, `k` and the threads per row (`Tuning::chunk_plan`: one chunk per
//! thread, each at least `max(16 Ki, 8k)` long). Each chunk yields its exact top
//! `k` (composites carry global columns); the partial sets are merged pairwise
//! and pruned back to `k` after every merge. The top `k` of a union is the top
//! `k` of the union of each part's top `k`, so the merged set is exact whatever
//! the merge tree; the final sort makes the bytes deterministic.
//!
//! # Cost
//! `O(len)` comparisons per row plus the pushes: with a good guess about
//! `k + 3 sqrt(k len / 2048) len / 2048` of them and no compaction but the last;
//! plainly, for scores in random order, about `cap + k ln(len / cap)`; each
//! compaction is `O(cap)` and frees at least `cap - k >= max(3k, 1024)` slots,
//! so the total stays `O(len)` even for adversarial (ascending) input. Plus
//! `O(k log k)` for the final order. A wrong guess costs one more pass.
//! Extra memory per worker (and per chunk): one `cap`-sized `u64` buffer and a
//! few KiB of stack per tile.

mod filter;
pub(crate) mod key;
mod order;
mod stream;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::{OutputOrder, SelectSpec, Selection};
use crate::contract::{composite_index, Error, Result, ScoreElem, ScoresView};

pub(crate) use filter::Simd;
use key::KeyFn;

/// Exact top-k under the contract: the bytes of
/// [`reference_select`](super::reference_select), in linear time.
pub fn select<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    lengths: Option<&[i32]>,
) -> Result<Selection<T>> {
    spec.validate_host(scores, lengths)?;
    let mut out = Selection::<T>::new_padded(spec)?;
    run(scores, spec, None, lengths, &mut out.indices, Some(&mut out.values), true, &Tuning::default())?;
    Ok(out)
}

/// [`select`] over per-row ranges: row `r` selects among columns
/// `starts[r] .. ends[r]` (half-open; `ends` `None`: to `cols`). Indices stay
/// absolute column numbers. A query at position `t` that may attend to its
/// own key passes `ends[r] = t + 1`; `ends[r] = t` excludes the diagonal.
pub fn select_ranges<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: &[i32],
    ends: Option<&[i32]>,
) -> Result<Selection<T>> {
    spec.validate_host(scores, ends)?;
    spec.validate_starts(starts, ends)?;
    let mut out = Selection::<T>::new_padded(spec)?;
    run(scores, spec, Some(starts), ends, &mut out.indices, Some(&mut out.values), true, &Tuning::default())?;
    Ok(out)
}

/// [`select_ranges`] (`starts` `None`: [`select`]) with the indices written
/// as KV-cache slots through `pages` ([`crate::ops::pages`]): token `c` of
/// row `r` becomes the slot of token `c` of sequence `seq_ids[r]`; `-1`
/// stays `-1`.
pub fn select_ranges_paged<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    pages: &crate::ops::pages::PageMap<'_>,
) -> Result<Selection<T>> {
    spec.validate_host(scores, ends)?;
    if let Some(s) = starts {
        spec.validate_starts(s, ends)?;
    }
    pages.check_ranges(spec, starts, ends)?;
    let mut out = match starts {
        Some(s) => select_ranges(scores, spec, s, ends)?,
        None => select(scores, spec, ends)?,
    };
    pages.map_padded(&mut out.indices, spec.k)?;
    Ok(out)
}

/// [`select_ranges_paged`] into caller-owned buffers, as [`select_into`].
pub fn select_ranges_paged_into<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    pages: &crate::ops::pages::PageMap<'_>,
    out_indices: &mut [i32],
    out_values: Option<&mut [T]>,
) -> Result<()> {
    spec.validate_host(scores, ends)?;
    if let Some(s) = starts {
        spec.validate_starts(s, ends)?;
    }
    pages.check_ranges(spec, starts, ends)?;
    match starts {
        Some(s) => select_ranges_into(scores, spec, s, ends, out_indices, out_values)?,
        None => select_into(scores, spec, ends, out_indices, out_values)?,
    }
    pages.map_padded(out_indices, spec.k)
}

/// [`select`] into caller-owned buffers: `out_indices` (and `out_values` when
/// given) must hold exactly `rows * k` elements, else [`Error::BufferSize`].
/// Every element is written, padding included.
pub fn select_into<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    lengths: Option<&[i32]>,
    out_indices: &mut [i32],
    out_values: Option<&mut [T]>,
) -> Result<()> {
    select_into_tuned(scores, spec, lengths, out_indices, out_values, &Tuning::default())
}

/// [`select_ranges`] into caller-owned buffers, as [`select_into`].
pub fn select_ranges_into<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: &[i32],
    ends: Option<&[i32]>,
    out_indices: &mut [i32],
    out_values: Option<&mut [T]>,
) -> Result<()> {
    spec.validate_host(scores, ends)?;
    spec.validate_starts(starts, ends)?;
    check_out_len(spec, out_indices.len(), out_values.as_ref().map(|v| v.len()))?;
    run(scores, spec, Some(starts), ends, out_indices, out_values, false, &Tuning::default())
}

/// Output buffers must hold exactly `rows * k` elements.
fn check_out_len(spec: &SelectSpec, indices: usize, values: Option<usize>) -> Result<()> {
    let need = spec.rows * spec.k; // validated to fit i32
    if indices != need {
        return Err(Error::BufferSize { what: "out_indices", got: indices, need });
    }
    if let Some(v) = values {
        if v != need {
            return Err(Error::BufferSize { what: "out_values", got: v, need });
        }
    }
    Ok(())
}

/// [`select_into`] with explicit tuning (the tests force tiny buffers and the
/// within-row split on short rows). The answer never depends on `tuning`.
pub(crate) fn select_into_tuned<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    lengths: Option<&[i32]>,
    out_indices: &mut [i32],
    out_values: Option<&mut [T]>,
    tuning: &Tuning,
) -> Result<()> {
    spec.validate_host(scores, lengths)?;
    check_out_len(spec, out_indices.len(), out_values.as_ref().map(|v| v.len()))?;
    run(scores, spec, None, lengths, out_indices, out_values, false, tuning)
}

/// The error of a request whose candidate buffers could not be allocated.
fn scratch_oom(spec: &SelectSpec, tuning: &Tuning) -> Error {
    let cap = tuning.capacity(spec.cols, spec.k) as u128;
    Error::OutOfMemory { what: "the CPU engine's candidate buffers", bytes: 8 * (cap + spec.k.min(spec.cols) as u128) }
}

/// Knobs of the engine. None of them changes the answer, only the work split
/// and how often the candidate buffer is compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuning {
    /// Threads the plan assumes; `0` = rayon's current pool size.
    pub threads: usize,
    /// Rows with fewer candidates than this are never split.
    pub split_min_len: usize,
    /// Least chunk length of a split row...
    pub min_chunk: usize,
    /// ...and at least this many times `k`.
    pub chunk_k_factor: usize,
    /// Chunks per thread of the row (more balance the load, but each costs a
    /// start, a final compaction and a merge).
    pub chunks_per_thread: usize,
    /// Buffer capacity is `max(buf_factor * k, k + tile)`, at most the row.
    pub buf_factor: usize,
    /// See `buf_factor`; at least 1.
    pub tile: usize,
    /// Scores sampled for a starting threshold; `0` disables sampling.
    pub samples: usize,
    /// Rows (or chunks) shorter than this are not sampled...
    pub sample_min_len: usize,
    /// ...nor those shorter than this many times `k`.
    pub sample_k_factor: usize,
    /// The widest instruction set the threshold test may use (lowered to what
    /// the CPU has when a request starts).
    pub simd: Simd,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            threads: 0,
            split_min_len: 1 << 16,
            min_chunk: 1 << 14,
            chunk_k_factor: 8,
            chunks_per_thread: 1,
            buf_factor: 4,
            tile: 1024,
            samples: 2048,
            sample_min_len: 1 << 14,
            sample_k_factor: 16,
            simd: Simd::Avx512,
        }
    }
}

/// How one row is cut for the within-row split: `chunks` equal contiguous
/// ranges of `0..len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkPlan {
    pub len: usize,
    pub chunks: usize,
}

impl ChunkPlan {
    /// Chunk `i`: `[i * len / chunks, (i + 1) * len / chunks)`.
    pub fn range(&self, i: usize) -> Range<usize> {
        let at = |j: usize| (j as u128 * self.len as u128 / self.chunks as u128) as usize;
        at(i)..at(i + 1)
    }
}

impl Tuning {
    fn pool_threads(&self) -> usize {
        if self.threads == 0 {
            rayon::current_num_threads().max(1)
        } else {
            self.threads
        }
    }

    /// The split of a row of `len` candidates, selecting `k`, with `threads`
    /// threads for this row: one chunk unless `threads > 1` and
    /// `len >= split_min_len`; otherwise as many chunks as fit
    /// `max(min_chunk, chunk_k_factor * k)` elements each, at most
    /// `chunks_per_thread * threads`. A pure function of its arguments.
    pub fn chunk_plan(&self, len: usize, k: usize, threads: usize) -> ChunkPlan {
        let one = ChunkPlan { len, chunks: 1 };
        if threads <= 1 || len < self.split_min_len || len == 0 {
            return one;
        }
        let least = self.min_chunk.max(self.chunk_k_factor.saturating_mul(k)).max(1);
        let chunks = (len / least).min(self.chunks_per_thread.max(1).saturating_mul(threads)).max(1);
        ChunkPlan { len, chunks }
    }

    /// Threads each of `rows` rows may use: the pool spread over the rows.
    pub fn threads_per_row(&self, rows: usize) -> usize {
        (self.pool_threads() / rows.max(1)).max(1)
    }

    /// The plan the engine uses for a row of `len` candidates in a request of
    /// `rows` rows: [`Self::chunk_plan`] with [`Self::threads_per_row`].
    #[cfg(test)]
    pub fn row_plan(&self, rows: usize, len: usize, k: usize) -> ChunkPlan {
        self.chunk_plan(len, k, self.threads_per_row(rows))
    }

    /// How a row or chunk of `len` elements is streamed.
    pub(crate) fn stream_cfg(&self, len: usize, k: usize) -> stream::StreamCfg {
        let sampled = len >= self.sample_min_len && len >= self.sample_k_factor.saturating_mul(k);
        stream::StreamCfg {
            cap: self.capacity(len, k),
            samples: if sampled { self.samples } else { 0 },
            simd: self.simd,
        }
    }

    /// Candidate-buffer capacity for selecting `k` from `len` elements.
    pub fn capacity(&self, len: usize, k: usize) -> usize {
        let k = k.min(len);
        k.saturating_mul(self.buf_factor).max(k.saturating_add(self.tile.max(1))).min(len)
    }
}

/// Runs a validated request. `prepadded`: the outputs already hold padding.
/// Every buffer sized by the request is reserved fallibly: a row whose
/// buffers cannot be had is left unwritten and the request fails with
/// [`Error::OutOfMemory`].
#[allow(clippy::too_many_arguments)]
fn run<T: ScoreElem>(
    scores: &ScoresView<'_, T>,
    spec: &SelectSpec,
    starts: Option<&[i32]>,
    lengths: Option<&[i32]>,
    out_indices: &mut [i32],
    out_values: Option<&mut [T]>,
    prepadded: bool,
    tuning: &Tuning,
) -> Result<()> {
    if spec.rows == 0 {
        return Ok(());
    }
    let k = spec.k;
    let tuning = Tuning { simd: tuning.simd.available(), ..*tuning };
    let ctx = RowCtx {
        k,
        order: spec.order,
        kf: KeyFn::for_type::<T>(spec.nan),
        tuning,
        threads: tuning.threads_per_row(spec.rows),
        prepadded,
    };
    // Keep tasks of tiny rows from being scheduled one by one.
    let min_rows = ((1usize << 15) / spec.cols.max(1)).max(1);
    // A row's candidates: columns start..len of its first len.
    let row_of = |r: usize| (&scores.row(r)[..spec.row_len(r, lengths)], starts.map_or(0, |s| s[r] as usize));
    let oom = AtomicBool::new(false);
    match out_values {
        Some(values) => out_indices
            .par_chunks_mut(k)
            .zip(values.par_chunks_mut(k))
            .enumerate()
            .with_min_len(min_rows)
            .for_each_init(Scratch::default, |s, (r, (idx, val))| ctx.row(row_of(r), s, idx, Some(val), &oom)),
        None => out_indices
            .par_chunks_mut(k)
            .enumerate()
            .with_min_len(min_rows)
            .for_each_init(Scratch::default, |s, (r, idx)| ctx.row(row_of(r), s, idx, None, &oom)),
    }
    if oom.load(Ordering::Relaxed) {
        return Err(scratch_oom(spec, &tuning));
    }
    Ok(())
}

/// A worker's buffers, reused from row to row.
#[derive(Default)]
struct Scratch {
    /// The candidate buffer, then the row's selection.
    buf: Vec<u64>,
    /// For the final sort.
    tmp: Vec<u64>,
    counts: Vec<u32>,
}

/// Everything a row needs besides its data and outputs.
#[derive(Clone, Copy)]
struct RowCtx {
    k: usize,
    order: OutputOrder,
    kf: KeyFn,
    tuning: Tuning,
    threads: usize,
    prepadded: bool,
}

impl RowCtx {
    /// Selects one row into `idx` (and `val`). Its buffers are reserved
    /// first, fallibly: when they cannot be had, `oom` is set and the row is
    /// left as it is (the request then fails).
    fn row<T: ScoreElem>(
        &self,
        (row, start): (&[T], usize),
        scratch: &mut Scratch,
        idx: &mut [i32],
        val: Option<&mut [T]>,
        oom: &AtomicBool,
    ) {
        let (k, kf) = (self.k, self.kf);
        // The candidates: columns start.. of the row (composites keep the
        // absolute column).
        let cand = &row[start..];
        let len = cand.len();
        // The candidate buffer (the stream never grows it past its capacity)
        // and the sort's scratch.
        let reserve = |v: &mut Vec<u64>, n: usize| {
            v.clear();
            v.try_reserve(n).is_ok()
        };
        let cfg = self.tuning.stream_cfg(len, k);
        if !reserve(&mut scratch.buf, cfg.cap.max(k + 1).min(len)) || !reserve(&mut scratch.tmp, k.min(len)) {
            oom.store(true, Ordering::Relaxed);
            return;
        }
        let buf = &mut scratch.buf;
        // The same plan as `Tuning::row_plan(rows, len, k)`.
        let plan = self.tuning.chunk_plan(len, k, self.threads);
        if plan.chunks <= 1 {
            stream::top_set(cand, start as u32, k, cfg, kf, buf);
        } else {
            let tuning = self.tuning;
            *buf = (0..plan.chunks)
                .into_par_iter()
                .map(|i| {
                    let r = plan.range(i);
                    let cfg = tuning.stream_cfg(r.len(), k);
                    let mut part = Vec::new();
                    if !reserve(&mut part, cfg.cap.max(k + 1).min(r.len())) {
                        oom.store(true, Ordering::Relaxed);
                        return part;
                    }
                    stream::top_set(&cand[r.clone()], (start + r.start) as u32, k, cfg, kf, &mut part);
                    part
                })
                .reduce(Vec::new, |a, b| stream::merge(a, b, k));
            if oom.load(Ordering::Relaxed) {
                return;
            }
        }
        match self.order {
            OutputOrder::Score => order::sort_desc(buf, &mut scratch.tmp, &mut scratch.counts),
            // `OutputOrder::arrange`, faster: ascending column is descending
            // `u32::MAX - col` (the low half, unique), so sort with the halves
            // swapped.
            OutputOrder::Index => {
                buf.iter_mut().for_each(|c| *c = c.rotate_left(32));
                order::sort_desc(buf, &mut scratch.tmp, &mut scratch.counts);
                buf.iter_mut().for_each(|c| *c = c.rotate_left(32));
            }
        }
        write_row(buf, row, idx, val, self.prepadded);
    }
}

/// Writes composites in output order, then padding unless already there.
fn write_row<T: ScoreElem>(sel: &[u64], row: &[T], idx: &mut [i32], val: Option<&mut [T]>, prepadded: bool) {
    let n = sel.len();
    for (o, &c) in idx.iter_mut().zip(sel) {
        *o = composite_index(c) as i32;
    }
    if !prepadded {
        idx[n..].fill(-1);
    }
    if let Some(val) = val {
        for (o, &c) in val.iter_mut().zip(sel) {
            *o = row[composite_index(c) as usize];
        }
        if !prepadded {
            val[n..].fill(T::neg_inf());
        }
    }
}

#[cfg(test)]
mod tests;
