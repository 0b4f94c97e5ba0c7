//! One row, or one chunk of a row, to its exact top-k set: the streaming
//! candidate buffer, its compaction, and the exact merge of partial results.

use crate::contract::{composite, composite_key, NanPolicy, ScoreElem};

use super::filter::{tile_masks, Simd, Thr, BLOCK, TILE, TILE_BLOCKS};
use super::key::KeyFn;

/// Reduces `buf` (longer than `k >= 1`) to its `k` largest composites, in no
/// particular order, and returns the key of the smallest survivor: the key an
/// element arriving later (higher column) must beat strictly.
#[inline(never)]
pub(crate) fn compact(buf: &mut Vec<u64>, k: usize) -> u32 {
    debug_assert!(k >= 1 && buf.len() >= k);
    buf.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    buf.truncate(k);
    composite_key(buf[k - 1])
}

/// The exact top-`k` union of two exact partial top-`k` sets (disjoint columns).
pub(crate) fn merge(mut a: Vec<u64>, mut b: Vec<u64>, k: usize) -> Vec<u64> {
    if a.capacity() < b.capacity() {
        std::mem::swap(&mut a, &mut b);
    }
    a.extend_from_slice(&b);
    if a.len() > k {
        compact(&mut a, k);
    }
    a
}

/// How one row (or chunk) is streamed; see [`super::Tuning`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamCfg {
    /// Candidate-buffer capacity (raised to `k + 1`, cut to the row).
    pub cap: usize,
    /// Scores sampled for a starting threshold; `0`: no sampling.
    pub samples: usize,
    /// The instruction set of the threshold test (available on this CPU).
    pub simd: Simd,
}

/// Leaves in `buf` the composites of the exact top `min(k, row.len())` of `row`,
/// in no particular order. `row[0]` is column `base`.
pub(crate) fn top_set<T: ScoreElem>(row: &[T], base: u32, k: usize, cfg: StreamCfg, kf: KeyFn, buf: &mut Vec<u64>) {
    match (kf.is_fast(), kf.nan()) {
        (true, NanPolicy::Lowest) => top_set_impl::<T, true, false>(row, base, k, cfg, kf, buf),
        (true, NanPolicy::Largest) => top_set_impl::<T, true, true>(row, base, k, cfg, kf, buf),
        (false, _) => top_set_impl::<T, false, false>(row, base, k, cfg, kf, buf),
    }
}

#[inline(always)]
fn key<T: ScoreElem, const FAST: bool>(kf: &KeyFn, x: T) -> u32 {
    if FAST {
        kf.fast(x)
    } else {
        kf.exact(x)
    }
}

/// The candidate-buffer stream.
///
/// Plain: the first `cap` elements go in unconditionally and are compacted,
/// then [`stream`] filters the rest.
///
/// Sampled (`cfg.samples > 0`): a starting threshold `t0` is guessed from a
/// sample spread over the row (see [`sample_floor`]) and the whole row is
/// streamed from column 0 keeping `key >= t0`. If at least `k` elements passed, every skipped
/// element ranks below `k` kept ones and the result is exact; otherwise the guess
/// was too high and the row is streamed again plainly. The guess only ever
/// changes the work done, never the answer.
fn top_set_impl<T: ScoreElem, const FAST: bool, const LARGEST: bool>(
    row: &[T],
    base: u32,
    k: usize,
    cfg: StreamCfg,
    kf: KeyFn,
    buf: &mut Vec<u64>,
) {
    buf.clear();
    let len = row.len();
    let k = k.min(len);
    if k == 0 {
        return;
    }
    // Room for at least one push after a compaction, never more than the row.
    let cap = cfg.cap.max(k + 1).min(len);
    let cfg = StreamCfg { cap, ..cfg };
    buf.reserve(cap);
    if cap == len {
        buf.extend(row.iter().enumerate().map(|(c, &x)| composite(key::<T, FAST>(&kf, x), base + c as u32)));
        if len > k {
            compact(buf, k);
        }
        return;
    }

    if cfg.samples > 0 {
        let floor = sample_floor::<T, FAST>(row, k, cfg.samples, &kf, buf);
        buf.clear();
        if let Some(t) = floor {
            let passed = stream::<T, FAST, LARGEST>(row, base, k, cfg, &kf, Thr::new::<T>(t, &kf), buf);
            if passed >= k {
                if buf.len() > k {
                    compact(buf, k);
                }
                return;
            }
            buf.clear();
        }
    }

    // Fill: the first `cap` elements go in unconditionally.
    buf.extend(row[..cap].iter().enumerate().map(|(c, &x)| composite(key::<T, FAST>(&kf, x), base + c as u32)));
    let th = Thr::new::<T>(compact(buf, k), &kf);
    stream::<T, FAST, LARGEST>(&row[cap..], base + cap as u32, k, cfg, &kf, th, buf);
    if buf.len() > k {
        compact(buf, k);
    }
}

/// Consecutive scores per sampled run: a run costs one cache line where a
/// lone score would too, so runs keep the sample's memory traffic small.
const SAMPLE_RUN: u64 = 8;

/// A starting threshold for a row of `len > cap > k` from about `samples`
/// scores in evenly spaced runs of up to [`SAMPLE_RUN`] (a pure function of the
/// row): the key of the `r`-th largest sampled score, `r` = the rank the k-th
/// would have in the sample plus three standard deviations and 2, so that for
/// scores in random order at least `k` scores of the row reach it with high
/// probability. Returns the strict threshold just below it ([`KeyFn::below`]),
/// or `None` when that filters nothing. Uses `scratch` for the sampled keys.
fn sample_floor<T: ScoreElem, const FAST: bool>(
    row: &[T],
    k: usize,
    samples: usize,
    kf: &KeyFn,
    scratch: &mut Vec<u64>,
) -> Option<u32> {
    let len = row.len() as u64;
    let m = (samples as u64).clamp(1, len);
    let run = (len / m).clamp(1, SAMPLE_RUN).min(m);
    let runs = m / run;
    let stride = len / runs; // >= run
    scratch.clear();
    for i in 0..runs {
        let start = (i * len / runs + (stride - run) / 2).min(len - run) as usize;
        scratch.extend(row[start..start + run as usize].iter().map(|&x| key::<T, FAST>(kf, x) as u64));
    }
    let m = scratch.len();
    let expect = k as f64 * m as f64 / len as f64;
    let r = ((expect + 3.0 * expect.sqrt()) as usize + 2).min(m);
    scratch.select_nth_unstable_by(r - 1, |a, b| b.cmp(a));
    kf.below(scratch[r - 1] as u32)
}

/// Streams `row` (first column `base`) through the filter starting at `th`,
/// pushing every element with `key > th.t` into `buf` and compacting to `k`
/// whenever `buf` reaches `cfg.cap` (which only raises the threshold). Returns how
/// many elements were pushed.
///
/// Invariant: after every compaction `buf` holds the exact top `k` of the
/// elements pushed so far and `th.t` is the key of the k-th; a later element with
/// key `<= th.t` ranks below all `k` of them (equal keys lose on the higher
/// column), so skipping it cannot change the answer.
fn stream<T: ScoreElem, const FAST: bool, const LARGEST: bool>(
    row: &[T],
    base: u32,
    k: usize,
    cfg: StreamCfg,
    kf: &KeyFn,
    mut th: Thr,
    buf: &mut Vec<u64>,
) -> usize {
    let StreamCfg { cap, simd, .. } = cfg;
    let mut passed = 0;
    let mut col = base;
    let mut masks = [0u64; TILE_BLOCKS];
    // Tile-relative positions of the candidates; 4 slots of slack for the
    // unconditional writes of `collect_positions`.
    let mut pos = [0u16; TILE + 4];
    let whole = row.len() / TILE * TILE;
    for tile in row[..whole].chunks_exact(TILE) {
        if th.none {
            return passed;
        }
        let n = if th.all {
            for (i, p) in pos[..TILE].iter_mut().enumerate() {
                *p = i as u16;
            }
            TILE
        } else {
            // Phase A: the masks of the whole tile, branch-free.
            tile_masks::<T, FAST, LARGEST>(simd, kf, &th, tile, &mut masks);
            // Phase B: the set bits as a list of positions, almost branch-free.
            collect_positions(&masks, &mut pos)
        };
        // Phase C: the candidates, from L1; no data-dependent branch but the
        // (rarely failing) exact test.
        for &p in &pos[..n] {
            let kk = key::<T, FAST>(kf, tile[p as usize]);
            // The exact test: `th` may have risen since the masks were taken.
            if kk > th.t {
                buf.push(composite(kk, col + p as u32));
                passed += 1;
                if buf.len() == cap {
                    th = Thr::new::<T>(compact(buf, k), kf);
                }
            }
        }
        col += TILE as u32;
    }
    if th.none {
        return passed;
    }
    for (j, &x) in row[whole..].iter().enumerate() {
        let kk = key::<T, FAST>(kf, x);
        if kk > th.t {
            buf.push(composite(kk, col + j as u32));
            passed += 1;
            if buf.len() == cap {
                th = Thr::new::<T>(compact(buf, k), kf);
            }
        }
    }
    passed
}

/// Writes the positions of the set bits of `masks` (bit `j` of word `w` is
/// position `64 w + j`) in ascending order to the front of `pos`; returns how
/// many. Four positions per word are written unconditionally (extra slots hold
/// garbage past the count), so only words with more than four bits branch.
#[inline(always)]
fn collect_positions(masks: &[u64; TILE_BLOCKS], pos: &mut [u16; TILE + 4]) -> usize {
    let mut n = 0usize;
    for (w, &m) in masks.iter().enumerate() {
        let base = (w * BLOCK) as u16;
        let mut m = m;
        for _ in 0..4 {
            pos[n] = base + m.trailing_zeros() as u16;
            n += (m != 0) as usize;
            m &= m.wrapping_sub(1);
        }
        while m != 0 {
            pos[n] = base + m.trailing_zeros() as u16;
            n += 1;
            m &= m - 1;
        }
    }
    n
}
