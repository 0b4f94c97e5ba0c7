//! `flashsel check`'s DSA indexer cases: the CUDA engine's `dsa_scores`
//! (tensor cores, the device order) within [`device_error_bound`] of the
//! float64 reference, the same bits on a second run, and its `dsa_indexer`
//! (the scores, then the select engine's range path) against the CPU's
//! `select_ranges` of the device's own scores, ids and values byte for
//! byte; the paged cache's scores the bits of the same keys held
//! contiguously: every q / k dtype pair,
//! DeepSeek-V3.2's 64 heads of 128 in fp8 with per-token key scales, head
//! counts that are not a multiple of 4, d 64 and 256, ranges of every kind
//! (empty, whole, causal prefixes, windows, crossing the kernel's 1024-key
//! chunks), keys from few values (ties, ReLU zeros), a NaN key, score and
//! index order, ids and KV slots through a page table. The outputs are
//! poisoned before each run.

use half::bf16;

use super::{device_error_bound, reference_dsa_scores, DsaPagedKeys, DsaScoresSpec, F8E4M3};
use crate::contract::{DType, Result, ScoresView};
use crate::cuda::CudaEngine;
use crate::data::Rng;
use crate::ops::indexer::KeyElem;
use crate::ops::pages::PageMap;
use crate::ops::select::{OutputOrder, SelectSpec};

/// One case.
#[derive(Debug, Clone)]
pub struct DsaCase {
    pub rows: usize,
    pub heads: usize,
    pub dim: usize,
    pub keys: usize,
    pub k: usize,
    pub q: DType,
    pub kdt: DType,
    pub scaled: bool,
    /// Keys from 5 values (ties and ReLU zeros).
    pub few_values: bool,
    pub nan_key: bool,
    pub order: OutputOrder,
    /// Slots through a page table of this page size.
    pub page_size: Option<usize>,
    /// The keys in DeepSeek-V3.2's paged fp8 cache (e4m3 keys with scales,
    /// re-encoded exactly; pages of `page_size`, 64 when `None`):
    /// [`super::dsa_scores_paged`]; with `page_size` the ids are the cache's
    /// slots.
    pub paged_keys: bool,
}

impl DsaCase {
    pub fn describe(&self) -> String {
        format!(
            "dsa-indexer rows={} heads={} d={} keys={} k={} q={} k={}{}{}{} order={:?}{}",
            self.rows,
            self.heads,
            self.dim,
            self.keys,
            self.k,
            self.q.name(),
            self.kdt.name(),
            if self.scaled { " scaled" } else { "" },
            if self.few_values { " few-values" } else { "" },
            if self.nan_key { " nan-key" } else { "" },
            self.order,
            self.page_size.map_or(String::new(), |p| format!(" slots page={p}")),
        ) + if self.paged_keys { " paged-keys" } else { "" }
    }
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct DsaOutcome {
    pub case: String,
    pub ok: bool,
    pub detail: String,
}

fn values(rng: &mut Rng, n: usize, few: bool) -> Vec<f32> {
    (0..n).map(|_| if few { rng.below(5) as f32 - 2.0 } else { rng.normal() }).collect()
}

fn run_typed<Q: KeyElem, K: KeyElem>(
    e: &CudaEngine,
    c: &DsaCase,
    q: &[Q],
    k: &[K],
    rng: &mut Rng,
) -> Result<(bool, String)> {
    let spec = DsaScoresSpec::new(c.rows, c.heads, c.dim, c.keys);
    let w: Vec<f32> = (0..c.rows * c.heads).map(|_| rng.normal()).collect();
    let sc: Vec<f32> = (0..c.keys).map(|_| 0.25 + rng.uniform() as f32).collect();
    let sc = c.scaled.then_some(sc);
    let (starts, ends): (Vec<i32>, Vec<i32>) = (0..c.rows)
        .map(|t| match t % 5 {
            0 => (0, 0),
            1 => (0, c.keys as i32),
            2 => (0, 1 + rng.below(c.keys as u64) as i32),
            3 => (c.keys as i32 / 3, c.keys as i32 / 3 + (c.k as i32 / 2).min(c.keys as i32 - c.keys as i32 / 3)),
            _ => {
                let a = rng.below(c.keys as u64) as i32;
                (a, a + rng.below((c.keys as i32 - a) as u64 + 1) as i32)
            }
        })
        .unzip();
    let mut fails = Vec::new();
    if c.paged_keys {
        run_paged(e, c, q, k, sc.as_deref().unwrap_or(&[]), &w, &starts, &ends, &mut fails)?;
        return Ok((fails.is_empty(), fails.join("; ")));
    }
    let got = e.dsa_scores_host(q, k, sc.as_deref(), &w, &starts, &ends, &spec)?;
    let again = e.dsa_scores_host(q, k, sc.as_deref(), &w, &starts, &ends, &spec)?;
    if bits(&got) != bits(&again) {
        fails.push("a second run's scores differ".into());
    }
    if let Some(f) = beyond_bound(c, q, k, sc.as_deref(), &w, &starts, &ends, &got)? {
        fails.push(f);
    }
    let sel = SelectSpec::new(c.rows, c.keys, c.k, DType::F32).with_order(c.order);
    let table: Vec<i32>;
    let seq: Vec<i32>;
    let pages = match c.page_size {
        None => None,
        Some(ps) => {
            let n = c.keys.div_ceil(ps);
            // Two sequences, pages interleaved in reverse.
            table = (0..2 * n as i32).rev().collect();
            seq = (0..c.rows as i32).map(|t| t % 2).collect();
            Some(PageMap::new(&table, n, ps, &seq)?)
        }
    };
    let view = ScoresView::new(&got, c.rows, c.keys)?;
    let cpu = match &pages {
        None => crate::cpu::select_ranges(&view, &sel, &starts, Some(&ends))?,
        Some(p) => crate::cpu::select_ranges_paged(&view, &sel, Some(&starts), Some(&ends), p)?,
    };
    let gpu = e.dsa_indexer_host(q, k, sc.as_deref(), &w, &starts, &ends, &spec, &sel, pages.as_ref())?;
    if gpu.indices != cpu.indices {
        fails.push("the ids differ from the CPU's selection of the device's scores".into());
    }
    if bits(&gpu.values) != bits(&cpu.values) {
        fails.push("the selected values differ from the CPU's selection of the device's scores".into());
    }
    Ok((fails.is_empty(), fails.join("; ")))
}

/// The paged-cache form: the keys laid out in DeepGEMM's paged layout (two
/// sequences over one set of pages in a shuffled order), scores and ids
/// against the CPU engine's.
#[allow(clippy::too_many_arguments)]
fn run_paged<Q: KeyElem, K: KeyElem>(
    e: &CudaEngine,
    c: &DsaCase,
    q: &[Q],
    k: &[K],
    sc: &[f32],
    w: &[f32],
    starts: &[i32],
    ends: &[i32],
    fails: &mut Vec<String>,
) -> Result<()> {
    let spec = DsaScoresSpec::new(c.rows, c.heads, c.dim, c.keys);
    let ps = c.page_size.unwrap_or(64);
    let pages = c.keys.div_ceil(ps);
    let pb = ps * (c.dim + 4);
    // Page i of the sequence at physical page (7 i + 3) mod (pages + 1)
    // (a permutation when pages + 1 is prime to 7); one page stays NaN.
    let mut phys: Vec<i32> = (0..pages).map(|i| ((7 * i + 3) % (pages + 1)) as i32).collect();
    if (pages + 1).is_multiple_of(7) {
        phys = (0..pages as i32).rev().collect();
    }
    let mut cache = vec![0x7fu8; (pages + 1) * pb];
    for s in 0..c.keys {
        let (p, j) = (phys[s / ps] as usize, s % ps);
        for x in 0..c.dim {
            cache[p * pb + j * c.dim + x] = crate::ops::mla::f32_to_e4m3(k[s * c.dim + x].to_f32());
        }
        cache[p * pb + ps * c.dim + 4 * j..p * pb + ps * c.dim + 4 * j + 4].copy_from_slice(&sc[s].to_le_bytes());
    }
    let table: Vec<i32> = phys.iter().chain(&phys).copied().collect();
    let seq: Vec<i32> = (0..c.rows as i32).map(|t| t % 2).collect();
    let keys = DsaPagedKeys { cache: &cache, pages: PageMap::new(&table, pages, ps, &seq)? };
    let got = e.dsa_scores_paged_host(q, &keys, w, starts, ends, &spec)?;
    // The same keys held contiguously (re-encoded exactly) on the same
    // engine: the same order, so the same bits.
    let k8: Vec<F8E4M3> = k.iter().map(|x| F8E4M3(crate::ops::mla::f32_to_e4m3(x.to_f32()))).collect();
    let flat = e.dsa_scores_host(q, &k8, Some(sc), w, starts, ends, &spec)?;
    if bits(&got) != bits(&flat) {
        fails.push("paged scores differ from the same keys' contiguous scores".into());
    }
    if let Some(f) = beyond_bound(c, q, &k8, Some(sc), w, starts, ends, &got)? {
        fails.push(format!("paged: {f}"));
    }
    let sel = SelectSpec::new(c.rows, c.keys, c.k, DType::F32).with_order(c.order);
    let slots = c.page_size.is_some();
    let view = ScoresView::new(&got, c.rows, c.keys)?;
    let cpu = if slots {
        crate::cpu::select_ranges_paged(&view, &sel, Some(starts), Some(ends), &keys.pages)?
    } else {
        crate::cpu::select_ranges(&view, &sel, starts, Some(ends))?
    };
    let gpu = e.dsa_indexer_paged_host(q, &keys, w, starts, ends, &spec, &sel, slots)?;
    if gpu.indices != cpu.indices || bits(&gpu.values) != bits(&cpu.values) {
        fails.push("the paged indexer's ids or values differ from the CPU's selection of its scores".into());
    }
    Ok(())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The first score (of up to 24 rows spread over the case) farther from the
/// float64 reference than [`device_error_bound`], or a NaN or infinity
/// where the reference has none (and back), described.
#[allow(clippy::too_many_arguments)]
fn beyond_bound<Q: KeyElem, K: KeyElem>(
    c: &DsaCase,
    q: &[Q],
    k: &[K],
    sc: Option<&[f32]>,
    w: &[f32],
    starts: &[i32],
    ends: &[i32],
    got: &[f32],
) -> Result<Option<String>> {
    let (h, d, n) = (c.heads, c.dim, c.keys);
    let step = c.rows.div_ceil(24).max(1);
    let rows: Vec<usize> = (0..c.rows).step_by(step).collect();
    let pick = |v: &[i32]| rows.iter().map(|&t| v[t]).collect::<Vec<_>>();
    let qs: Vec<Q> = rows.iter().flat_map(|&t| q[t * h * d..(t + 1) * h * d].iter().copied()).collect();
    let ws: Vec<f32> = rows.iter().flat_map(|&t| w[t * h..(t + 1) * h].iter().copied()).collect();
    let spec = DsaScoresSpec::new(rows.len(), h, d, n);
    let want = reference_dsa_scores(&qs, k, sc, &ws, &pick(starts), &pick(ends), &spec)?;
    for (ri, &t) in rows.iter().enumerate() {
        let (a, b) = (starts[t] as usize, ends[t] as usize);
        if let Some(s) = (0..n).find(|&s| (s < a || s >= b) && got[t * n + s] != f32::NEG_INFINITY) {
            return Ok(Some(format!("score [{t}, {s}] outside the range [{a}, {b}) is {}, not -inf", got[t * n + s])));
        }
        for s in a..b {
            let (g, x) = (got[t * n + s] as f64, want[ri * n + s]);
            let (mut m, mut wmax) = (0f64, 1f64);
            for hh in 0..h {
                let a: f64 = (0..d)
                    .map(|j| (q[(t * h + hh) * d + j].to_f32() as f64 * k[s * d + j].to_f32() as f64).abs())
                    .sum();
                m += (w[t * h + hh] as f64).abs() * a;
                wmax = wmax.max((w[t * h + hh] as f64).abs());
            }
            let scale = sc.map_or(1.0, |v| v[s] as f64);
            let bound = device_error_bound(&spec, m * scale.abs(), wmax * scale.abs().max(1.0), c.q, c.kdt);
            let ok = if x.is_finite() {
                (g - x).abs() <= bound
            } else {
                g.to_bits() == x.to_bits() || (g.is_nan() && x.is_nan())
            };
            if !ok {
                return Ok(Some(format!(
                    "score [{t}, {s}] = {g} is beyond the device bound {bound:e} of the reference {x}"
                )));
            }
        }
    }
    Ok(None)
}

/// Runs one case with fresh data from `rng`.
pub fn run_case(e: &CudaEngine, c: &DsaCase, rng: &mut Rng) -> Result<DsaOutcome> {
    let mut qv = values(rng, c.rows * c.heads * c.dim, false);
    let mut kv = values(rng, c.keys * c.dim, c.few_values);
    if c.nan_key {
        kv[c.dim + 1] = f32::NAN;
        qv[0] = 1.0;
    }
    let (ok, detail) = match (c.q, c.kdt) {
        (DType::F32, DType::F32) => run_typed(e, c, &qv, &kv, rng)?,
        (DType::BF16, DType::BF16) => run_typed(e, c, &to_bf16(&qv), &to_bf16(&kv), rng)?,
        (DType::F8E4M3, DType::F8E4M3) => run_typed(e, c, &to_e4m3(&qv), &to_e4m3(&kv), rng)?,
        (DType::BF16, DType::F8E4M3) => run_typed(e, c, &to_bf16(&qv), &to_e4m3(&kv), rng)?,
        (DType::F32, DType::F8E4M3) => run_typed(e, c, &qv, &to_e4m3(&kv), rng)?,
        (DType::F8E4M3, DType::BF16) => run_typed(e, c, &to_e4m3(&qv), &to_bf16(&kv), rng)?,
        _ => run_typed(e, c, &to_bf16(&qv), &kv, rng)?,
    };
    Ok(DsaOutcome { case: c.describe(), ok, detail })
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn to_e4m3(v: &[f32]) -> Vec<F8E4M3> {
    v.iter().map(|&x| F8E4M3(crate::ops::mla::f32_to_e4m3(x * 4.0))).collect()
}

/// The cases (`quick`: fewer rows).
pub fn cases(quick: bool) -> Vec<DsaCase> {
    let r = |n: usize| if quick { n.div_ceil(2) } else { n };
    let base = |rows, heads, dim, keys, k, q, kdt| DsaCase {
        rows,
        heads,
        dim,
        keys,
        k,
        q,
        kdt,
        scaled: true,
        few_values: false,
        nan_key: false,
        order: OutputOrder::Index,
        page_size: None,
        paged_keys: false,
    };
    let (f32_, b16, f8) = (DType::F32, DType::BF16, DType::F8E4M3);
    let mut out = vec![
        // DeepSeek-V3.2: 64 fp8 heads of 128, top-2048, slots.
        DsaCase { page_size: Some(64), ..base(r(10), 64, 128, 5000, 2048, f8, f8) },
        DsaCase { order: OutputOrder::Score, ..base(r(10), 64, 128, 3000, 2048, f8, f8) },
        DsaCase { few_values: true, ..base(r(12), 64, 128, 2100, 512, f8, f8) },
        DsaCase { scaled: false, ..base(r(8), 6, 64, 1500, 100, f32_, f32_) },
        base(r(8), 5, 256, 900, 64, b16, b16),
        DsaCase { page_size: Some(17), ..base(r(6), 32, 128, 1100, 300, b16, f8) },
        base(r(6), 3, 128, 700, 50, f32_, f8),
        DsaCase { order: OutputOrder::Score, ..base(r(6), 9, 64, 1025, 1024, f8, b16) },
        DsaCase { few_values: true, ..base(r(5), 1, 64, 64, 64, b16, f32_) },
        DsaCase { nan_key: true, ..base(r(6), 4, 64, 300, 32, f32_, f32_) },
        // DeepSeek-V3.2's paged fp8 index-key cache: slots through its table,
        // and token ids with bf16 queries.
        DsaCase { paged_keys: true, page_size: Some(64), ..base(r(8), 64, 128, 3000, 2048, f8, f8) },
        DsaCase { paged_keys: true, ..base(r(6), 5, 64, 700, 100, b16, f8) },
    ];
    if !quick {
        // One decode row over 131,072 keys.
        out.push(DsaCase { page_size: Some(64), ..base(2, 64, 128, 131_072, 2048, f8, f8) });
        // Two row groups of the indexer's chain (512 + 88 rows of 131,072
        // keys: more than 256 MiB of scores).
        out.push(DsaCase { scaled: false, ..base(600, 1, 64, 131_072, 64, f32_, b16) });
    }
    out
}

/// Totals of a suite run.
#[derive(Debug, Default)]
pub struct DsaReport {
    pub run: usize,
    pub failed: usize,
    pub failures: Vec<DsaOutcome>,
}

/// Runs every case, or with `filter` those whose description contains it.
pub fn run_suite(
    e: &CudaEngine,
    quick: bool,
    seed: u64,
    filter: Option<&str>,
    mut progress: impl FnMut(usize, usize, &DsaOutcome),
) -> Result<DsaReport> {
    let mut rng = Rng::new(seed ^ 0x0064_7361);
    let cases: Vec<DsaCase> =
        cases(quick).into_iter().filter(|c| crate::ops::select::check::filter_keeps(filter, &c.describe())).collect();
    let mut rep = DsaReport::default();
    for (i, c) in cases.iter().enumerate() {
        let o = run_case(e, c, &mut rng).unwrap_or_else(|err| DsaOutcome {
            case: c.describe(),
            ok: false,
            detail: format!("error: {err}"),
        });
        rep.run += 1;
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
    fn cases_are_valid_and_cover_the_formats() {
        for quick in [false, true] {
            let cs = cases(quick);
            for c in &cs {
                DsaScoresSpec::new(c.rows, c.heads, c.dim, c.keys).validate().unwrap();
                SelectSpec::new(c.rows, c.keys, c.k, DType::F32).validate().unwrap();
            }
            assert!(cs.iter().any(|c| c.page_size.is_some()) && cs.iter().any(|c| c.nan_key));
            assert!(cs.iter().any(|c| c.heads % 4 != 0) && cs.iter().any(|c| c.keys > 1024));
            let spans_groups = |c: &DsaCase| {
                let s = DsaScoresSpec::new(c.rows, c.heads, c.dim, c.keys);
                super::super::device::indexer_group_rows(&s) < c.rows
            };
            assert_eq!(cs.iter().any(spans_groups), !quick, "the full suite runs the chain in several row groups");
            for c in cs.iter().filter(|c| c.paged_keys) {
                assert!(c.kdt == DType::F8E4M3 && c.scaled, "the paged cache holds scaled e4m3 keys");
            }
            for dt in [DType::F32, DType::BF16, DType::F8E4M3] {
                assert!(cs.iter().any(|c| c.q == dt) && cs.iter().any(|c| c.kdt == dt), "{dt}");
            }
        }
    }
}
