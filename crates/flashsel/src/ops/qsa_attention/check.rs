//! `flashsel check`'s QSA sparse attention cases: the CUDA engine against
//! the float64 reference with FlashMLA's tolerances ([`OUT_TOLERANCE`],
//! [`LSE_TOLERANCE`]): QSA's 24 / 2 heads of 256 and its tensor-parallel
//! shard 12 / 1 over rows shaped as `qsa_select` writes them (blocks of 4,
//! the causal tail, -1 padding, the counts as lengths), other group sizes
//! and widths (64, 128), one head, MHA, widths that are not a multiple of
//! the tile, ~2% rows with nothing valid, interior invalid entries and
//! invalid tails of every kind, random lengths, paged caches with padded
//! strides, f32 and bf16 on both sides, one decode row (split-KV) and long
//! prefills (sampled rows checked). Every K / V element that no attended
//! entry reads is NaN, so a read of one shows in the outputs. Rows without
//! lengths run again with the derived lengths passed explicitly: the same
//! bits.

use half::bf16;

use super::device::{QsaAttnPath, QsaAttnPlan};
use super::{derive_lengths, reference_qsa_attention, AttnElem, QsaAttention, QsaAttentionOutput};
use crate::contract::{DType, Result};
use crate::cuda::CudaEngine;
use crate::data::{normal_scores, Rng};
use crate::ops::mla::check::{bits, digest_of, index_rows};
use crate::ops::mla::{check_close, LSE_TOLERANCE, OUT_TOLERANCE};

/// How a case's index rows are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// sparse MLA's check rows: random slots (duplicates allowed), interior
    /// invalid entries, invalid tails, ~2% rows with nothing valid.
    Random,
    /// `qsa_select`'s output at random positions (ratio 4, `width = 4 k + 3`):
    /// the lengths passed are its counts.
    QsaIds,
}

/// One QSA sparse attention check case.
#[derive(Debug, Clone)]
pub struct QsaAttnCase {
    pub rows: usize,
    /// Tokens of the cache (rounded up to whole pages).
    pub tokens: usize,
    pub h_q: usize,
    pub h_kv: usize,
    pub d: usize,
    pub width: usize,
    pub q: DType,
    pub kv: DType,
    pub index: Rows,
    /// Random explicit lengths (`Rows::Random` only; `QsaIds` passes its
    /// counts); else derived.
    pub random_lengths: bool,
    /// Paged: `(page_size, token_pad, page_pad)` (pads in elements), pages
    /// stored in a shuffled order.
    pub paged: Option<(usize, usize, usize)>,
    /// Check only this many rows (first and last included); `None`: all.
    pub sample: Option<usize>,
    /// A NaN in the first attended key of the first row that attends one.
    pub nan_key: bool,
}

impl QsaAttnCase {
    fn new(rows: usize, tokens: usize, h_q: usize, h_kv: usize, d: usize, width: usize) -> Self {
        Self {
            rows,
            tokens,
            h_q,
            h_kv,
            d,
            width,
            q: DType::BF16,
            kv: DType::BF16,
            index: Rows::Random,
            random_lengths: false,
            paged: None,
            sample: None,
            nan_key: false,
        }
    }
    /// The request (its cache geometry included).
    pub fn spec(&self) -> QsaAttention {
        let s = QsaAttention::new(self.rows, self.tokens, self.h_q, self.h_kv, self.d, self.width)
            .with_dtypes(self.q, self.kv);
        match self.paged {
            None => s,
            Some((ps, tp, pp)) => {
                let pages = self.tokens.div_ceil(ps);
                let ts = self.h_kv * self.d + tp;
                s.with_pages(pages, ps).with_strides(ps * ts + pp, ts)
            }
        }
    }
    /// Whether the engine must take the tensor-core kernel: bf16 on both
    /// sides at d 128 or 256 (stated here on its own, not through the
    /// planner).
    pub fn expect_tensor_cores(&self) -> bool {
        self.q == DType::BF16 && self.kv == DType::BF16 && (self.d == 128 || self.d == 256)
    }
    /// Whether the engine must split the positions: the rows' CTAs (`rows *
    /// h_kv * ceil(group / heads a CTA)`, 16 heads a CTA on tensor cores, 8
    /// on the f32 kernel) below 264 and more than one tile of positions.
    pub fn expect_split(&self) -> bool {
        let hpc = if self.expect_tensor_cores() { 16 } else { 8 };
        let ctas = self.rows * self.h_kv * (self.h_q / self.h_kv).div_ceil(hpc);
        ctas > 0 && ctas < 264 && self.width > 32
    }
    pub fn describe(&self) -> String {
        let cache = match self.paged {
            None => "contiguous".to_string(),
            Some((ps, tp, pp)) => format!("paged page={ps} pads={tp}/{pp}"),
        };
        format!(
            "qsa-attn rows={} tokens={} h_q={} h_kv={} d={} width={} q={} kv={} {:?} {cache}{}{}{}",
            self.rows,
            self.tokens,
            self.h_q,
            self.h_kv,
            self.d,
            self.width,
            self.q.name(),
            self.kv.name(),
            self.index,
            if self.random_lengths { " random lengths" } else { "" },
            self.sample.map_or(String::new(), |n| format!(" ({n} rows checked)")),
            if self.nan_key { " nan_key" } else { "" },
        )
    }
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct QsaAttnOutcome {
    pub case: String,
    /// Whether the plan split the positions (one-pass kernel + combine).
    pub split: bool,
    /// Whether the tensor-core kernel ran.
    pub tensor_cores: bool,
    pub ok: bool,
    pub detail: String,
    /// FNV-1a of the result's bits (out, lse).
    pub digest: u64,
}

/// `qsa_select`'s rows (index order, ratio 4, `k = (width - 3) / 4` blocks)
/// for random positions in `from..tokens`, and their counts.
pub fn qsa_rows(rng: &mut Rng, rows: usize, width: usize, from: usize, tokens: usize) -> (Vec<i32>, Vec<i32>) {
    let k = (width - 3) / 4;
    let mut ids = vec![-1i32; rows * width];
    let mut counts = vec![0i32; rows];
    for r in 0..rows {
        let t = from + rng.below((tokens - from) as u64) as usize;
        let v = (t + 1) / 4;
        let mut blocks: Vec<usize> = (0..v).collect();
        if v > k {
            for i in 0..k {
                let j = i + rng.below((v - i) as u64) as usize;
                blocks.swap(i, j);
            }
            blocks.truncate(k);
            blocks.sort_unstable();
        }
        let row = &mut ids[r * width..(r + 1) * width];
        let mut n = 0;
        for b in blocks {
            for j in 0..4 {
                row[n] = (4 * b + j) as i32;
                n += 1;
            }
        }
        for tok in 4 * v..=t {
            row[n] = tok as i32;
            n += 1;
        }
        counts[r] = n as i32;
    }
    (ids, counts)
}

fn cast<T: AttnElem>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

fn checked_rows(c: &QsaAttnCase) -> Vec<usize> {
    match c.sample {
        Some(n) if n < c.rows => (0..n).map(|i| i * (c.rows - 1) / (n - 1).max(1)).collect(),
        _ => (0..c.rows).collect(),
    }
}

fn same(a: &QsaAttentionOutput<f32>, b: &QsaAttentionOutput<f32>) -> bool {
    bits(&a.out) == bits(&b.out) && bits(&a.lse) == bits(&b.lse)
}

fn run<Q: AttnElem, KV: AttnElem>(e: &CudaEngine, c: &QsaAttnCase, rng: &mut Rng) -> Result<(bool, String, u64)> {
    let spec = c.spec();
    let slots = spec.slots();
    let seed = rng.next_u64();
    let q: Vec<Q> = cast(&normal_scores(c.rows * c.h_q * c.d, seed, 1));
    let (idx, lens) = match c.index {
        Rows::QsaIds => {
            let (ids, counts) = qsa_rows(rng, c.rows, c.width, 0, c.tokens);
            (ids, Some(counts))
        }
        Rows::Random => {
            let idx = index_rows(rng, c.rows, c.width, c.tokens);
            let lens = c.random_lengths.then(|| (0..c.rows).map(|_| rng.below(c.width as u64 + 1) as i32).collect());
            (idx, lens)
        }
    };
    // Logical token -> physical slot: pages in a shuffled order.
    let phys: Vec<usize> = match c.paged {
        None => (0..c.tokens).collect(),
        Some((ps, _, _)) => {
            let pages = c.tokens.div_ceil(ps);
            let mut order: Vec<usize> = (0..pages).collect();
            for i in (1..pages).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            (0..c.tokens).map(|t| order[t / ps] * ps + t % ps).collect()
        }
    };
    let idx: Vec<i32> =
        idx.iter().map(|&i| if i >= 0 && (i as usize) < c.tokens { phys[i as usize] as i32 } else { i }).collect();
    // Poison every element no attended entry reads; values for the others.
    let mut used = vec![false; slots];
    for (r, row) in idx.chunks_exact(c.width).enumerate() {
        let l = lens.as_ref().map_or(c.width, |l| l[r] as usize);
        for &i in &row[..l] {
            if i >= 0 && (i as usize) < slots {
                used[i as usize] = true;
            }
        }
    }
    let n = spec.cache_len()?;
    let mut kf = vec![f32::NAN; n];
    let mut vf = vec![f32::NAN; n];
    let kvals = normal_scores(slots * c.h_kv * c.d, seed, 2);
    let vvals = normal_scores(slots * c.h_kv * c.d, seed, 3);
    for s in (0..slots).filter(|&s| used[s]) {
        for g in 0..c.h_kv {
            let (at, from) = (spec.head_at(s, g), (s * c.h_kv + g) * c.d);
            kf[at..at + c.d].copy_from_slice(&kvals[from..from + c.d]);
            vf[at..at + c.d].copy_from_slice(&vvals[from..from + c.d]);
        }
    }
    let mut fails = Vec::new();
    if c.nan_key {
        let first = idx.chunks_exact(c.width).enumerate().find_map(|(r, row)| {
            let l = lens.as_ref().map_or(c.width, |l| l[r] as usize);
            row[..l].iter().find(|&&i| i >= 0 && (i as usize) < slots).copied()
        });
        match first {
            Some(i) => kf[spec.head_at(i as usize, 0)] = f32::NAN,
            None => fails.push("no row attends a key to make NaN (the case would test nothing)".to_string()),
        }
    }
    let (k, v): (Vec<KV>, Vec<KV>) = (cast(&kf), cast(&vf));
    drop((kf, vf, kvals, vvals));
    let plan = e.qsa_attention_plan(&spec)?;
    let tc = plan.path == QsaAttnPath::TensorCore;
    if plan.split() != c.expect_split() || tc != c.expect_tensor_cores() || plan != QsaAttnPlan::new(&spec) {
        fails.push(format!(
            "the engine's plan {plan:?} (expected: split {}, tensor cores {})",
            c.expect_split(),
            c.expect_tensor_cores()
        ));
    }
    let got = e.qsa_attention_host(&spec, &q, &k, &v, &idx, lens.as_deref())?;
    let rows = checked_rows(c);
    let hd = c.h_q * c.d;
    let sub_q: Vec<Q> = rows.iter().flat_map(|&r| q[r * hd..(r + 1) * hd].iter().copied()).collect();
    let sub_idx: Vec<i32> = rows.iter().flat_map(|&r| idx[r * c.width..(r + 1) * c.width].iter().copied()).collect();
    let sub_len: Option<Vec<i32>> = lens.as_ref().map(|l| rows.iter().map(|&r| l[r]).collect());
    let sub = QsaAttention { rows: rows.len(), ..spec };
    let want = reference_qsa_attention(&sub, &sub_q, &k, &v, &sub_idx, sub_len.as_deref())?;
    let pick = |x: &[f32], w: usize| -> Vec<f32> {
        rows.iter().flat_map(|&r| x[r * w..(r + 1) * w].iter().copied()).collect()
    };
    fails.extend(check_close("out", &pick(&got.out, hd), &want.out, OUT_TOLERANCE).err());
    fails.extend(check_close("lse", &pick(&got.lse, c.h_q), &want.lse, LSE_TOLERANCE).err());
    let again = match &lens {
        None => e.qsa_attention_host(&spec, &q, &k, &v, &idx, Some(&derive_lengths(&idx, c.width, slots)))?,
        Some(l) => e.qsa_attention_host(&spec, &q, &k, &v, &idx, Some(l))?,
    };
    if !same(&got, &again) {
        fails.push(if lens.is_none() {
            "the derived lengths passed explicitly give other bits".into()
        } else {
            "a second run gives other bits".into()
        });
    }
    Ok((fails.is_empty(), fails.join("; "), digest_of(&[&got.out, &got.lse])))
}

/// Runs one case with fresh data from `rng`.
pub fn run_case(e: &CudaEngine, c: &QsaAttnCase, rng: &mut Rng) -> Result<QsaAttnOutcome> {
    let (ok, detail, digest) = match (c.q, c.kv) {
        (DType::BF16, DType::BF16) => run::<bf16, bf16>(e, c, rng)?,
        (DType::BF16, _) => run::<bf16, f32>(e, c, rng)?,
        (_, DType::BF16) => run::<f32, bf16>(e, c, rng)?,
        _ => run::<f32, f32>(e, c, rng)?,
    };
    Ok(QsaAttnOutcome {
        case: c.describe(),
        split: c.expect_split(),
        tensor_cores: c.expect_tensor_cores(),
        ok,
        detail,
        digest,
    })
}

/// The cases (`quick`: a subset, every path, width and dtype still covered).
pub fn cases(quick: bool) -> Vec<QsaAttnCase> {
    let mut out = Vec::new();
    // QSA's geometry: 24 / 2 heads of 256, 2051 ids a row as qsa_select
    // writes them; one decode row (split), a batch, a sampled prefill.
    for (rows, tokens, sample) in
        [(1, 65_536, None), (48, 40_000, None), (if quick { 512 } else { 4096 }, 131_072, Some(16))]
    {
        let mut c = QsaAttnCase::new(rows, tokens, 24, 2, 256, 2051);
        (c.index, c.sample) = (Rows::QsaIds, sample);
        out.push(c);
    }
    // The tensor-parallel shard (12 / 1), paged like a serving cache.
    let mut c = QsaAttnCase::new(6, 9000, 12, 1, 256, 2051);
    (c.index, c.paged) = (Rows::QsaIds, Some((64, 0, 0)));
    out.push(c);
    // Other groups and widths, dtypes, pages, lengths.
    let geoms: &[(usize, usize, usize, usize, usize, usize)] = &[
        // rows, tokens, h_q, h_kv, d, width
        (5, 3000, 16, 4, 128, 512),
        (3, 90, 1, 1, 256, 100),
        (62, 700, 8, 8, 64, 128),
        (213, 1521, 32, 2, 128, 384),
        (2, 5000, 24, 2, 256, 2048),
        (40, 300, 12, 3, 64, 33),
    ];
    let dtypes =
        [(DType::BF16, DType::BF16), (DType::F32, DType::BF16), (DType::BF16, DType::F32), (DType::F32, DType::F32)];
    for (g, &(rows, tokens, h_q, h_kv, d, width)) in geoms.iter().enumerate() {
        if quick && g % 2 == 1 {
            continue;
        }
        let mut c = QsaAttnCase::new(rows, tokens, h_q, h_kv, d, width);
        (c.q, c.kv) = dtypes[g % dtypes.len()];
        c.random_lengths = g % 3 == 1;
        c.paged = [None, Some((64, 0, 0)), Some((1, 8, 0)), Some((17, 3, 5))][g % 4];
        out.push(c);
    }
    // Widths around the tile; s_kv below the width.
    for width in [1, 31, 32, 33] {
        out.push(QsaAttnCase::new(4, 20, 12, 1, 128, width));
    }
    // A NaN attended key, bf16 and f32.
    for dt in [DType::BF16, DType::F32] {
        let mut c = QsaAttnCase::new(6, 300, 12, 1, 256, 128);
        (c.q, c.kv, c.nan_key) = (dt, dt, true);
        out.push(c);
    }
    out
}

/// Totals of a suite run.
#[derive(Debug, Default)]
pub struct QsaAttnReport {
    pub run: usize,
    pub failed: usize,
    pub split: usize,
    pub tensor_cores: usize,
    pub failures: Vec<QsaAttnOutcome>,
}

/// Runs every case, or with `filter` those whose description contains it,
/// calling `progress` after each.
pub fn run_suite(
    e: &CudaEngine,
    quick: bool,
    seed: u64,
    filter: Option<&str>,
    mut progress: impl FnMut(usize, usize, &QsaAttnOutcome),
) -> Result<QsaAttnReport> {
    let mut rng = Rng::new(seed ^ 0x0071_7361);
    let cases: Vec<QsaAttnCase> =
        cases(quick).into_iter().filter(|c| crate::ops::select::check::filter_keeps(filter, &c.describe())).collect();
    let mut rep = QsaAttnReport::default();
    for (i, c) in cases.iter().enumerate() {
        let o = run_case(e, c, &mut rng).unwrap_or_else(|err| QsaAttnOutcome {
            case: c.describe(),
            split: c.expect_split(),
            tensor_cores: c.expect_tensor_cores(),
            ok: false,
            detail: format!("error: {err}"),
            digest: 0,
        });
        rep.run += 1;
        rep.split += o.split as usize;
        rep.tensor_cores += o.tensor_cores as usize;
        if !o.ok {
            rep.failed += 1;
            rep.failures.push(o.clone());
        }
        progress(i + 1, cases.len(), &o);
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_cover_the_paths() {
        for quick in [false, true] {
            let cs = cases(quick);
            assert!(cs.iter().any(|c| c.expect_split()) && cs.iter().any(|c| !c.expect_split()));
            for tc in [false, true] {
                assert!(cs.iter().any(|c| c.expect_tensor_cores() == tc && c.expect_split()), "tc {tc} split");
                assert!(cs.iter().any(|c| c.expect_tensor_cores() == tc && !c.expect_split()), "tc {tc} one pass");
            }
            for d in [64, 128, 256] {
                assert!(cs.iter().any(|c| c.d == d), "d {d}");
            }
            assert!(cs.iter().any(|c| c.paged.is_some()) && cs.iter().any(|c| c.index == Rows::QsaIds));
            assert!(cs.iter().any(|c| c.nan_key) && cs.iter().any(|c| c.width % 32 != 0));
            for c in &cs {
                c.spec().validate().unwrap();
                // The stated rules are the planner's.
                let p = QsaAttnPlan::new(&c.spec());
                assert_eq!(p.split(), c.expect_split(), "{}", c.describe());
                assert_eq!(p.path == QsaAttnPath::TensorCore, c.expect_tensor_cores(), "{}", c.describe());
            }
        }
    }

    #[test]
    fn qsa_rows_follow_qsa_select() {
        let mut rng = Rng::new(3);
        let (ids, counts) = qsa_rows(&mut rng, 50, 2051, 0, 10_000);
        for (row, &n) in ids.chunks_exact(2051).zip(&counts) {
            let n = n as usize;
            assert!(n >= 1 && row[n..].iter().all(|&x| x == -1));
            assert!(row[..n].windows(2).all(|w| w[0] < w[1]), "ascending, distinct");
            // Whole blocks (at most 512), then a tail of 0..=3 tokens from a
            // block boundary.
            let (blocks, tail) = (n / 4, n % 4);
            assert!(blocks <= 512);
            for b in 0..blocks {
                assert_eq!(row[4 * b] % 4, 0);
                assert!((1..4).all(|j| row[4 * b + j] == row[4 * b] + j as i32));
            }
            if tail > 0 {
                assert_eq!(row[4 * blocks] % 4, 0);
            }
        }
    }
}
