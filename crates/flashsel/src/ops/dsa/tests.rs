use half::bf16;

use super::*;
use crate::data::Rng;
use crate::ops::pages::PageMap;
use crate::ops::select::OutputOrder;

fn normals(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

fn e4m3(x: &[f32]) -> Vec<F8E4M3> {
    x.iter().map(|&v| F8E4M3(crate::ops::mla::f32_to_e4m3(v * 8.0))).collect()
}

/// Ranges of every kind: empty, whole, a prefix (causal), a window.
fn ranges(rng: &mut Rng, rows: usize, keys: usize) -> (Vec<i32>, Vec<i32>) {
    (0..rows)
        .map(|t| match t % 4 {
            0 => (0, 0),
            1 => (0, keys as i32),
            2 => (0, 1 + rng.below(keys as u64) as i32),
            _ => {
                let a = rng.below(keys as u64) as i32;
                (a, a + rng.below((keys as i32 - a) as u64 + 1) as i32)
            }
        })
        .unzip()
}

/// The CPU engine against the float64 reference within the stated bound,
/// on every q / k dtype pair.
fn within_bound<Q: KeyElem, K: KeyElem>(q: &[Q], k: &[K], spec: &DsaScoresSpec, rng: &mut Rng) {
    let (starts, ends) = ranges(rng, spec.rows, spec.keys);
    let w: Vec<f32> = normals(rng, spec.rows * spec.heads);
    let sc: Vec<f32> = (0..spec.keys).map(|_| 0.5 + rng.uniform() as f32).collect();
    let got = dsa_scores(q, k, Some(&sc), &w, &starts, &ends, spec).unwrap();
    let want = reference_dsa_scores(q, k, Some(&sc), &w, &starts, &ends, spec).unwrap();
    let (h, d) = (spec.heads, spec.dim);
    for t in 0..spec.rows {
        for s in 0..spec.keys {
            let (g, x) = (got[t * spec.keys + s], want[t * spec.keys + s]);
            if s < starts[t] as usize || s >= ends[t] as usize {
                assert_eq!(g, f32::NEG_INFINITY);
                continue;
            }
            let mut m = 0f64;
            let mut wmax = 1f64;
            for hh in 0..h {
                let a: f64 = (0..d)
                    .map(|j| (q[(t * h + hh) * d + j].to_f32() as f64 * k[s * d + j].to_f32() as f64).abs())
                    .sum();
                m += (w[t * h + hh] as f64).abs() * a;
                wmax = wmax.max((w[t * h + hh] as f64).abs());
            }
            m *= sc[s] as f64;
            let bound = error_bound(spec, m, wmax * (sc[s] as f64).max(1.0));
            assert!((g as f64 - x).abs() <= bound, "row {t} key {s}: {g} vs {x} (bound {bound})");
        }
    }
}

#[test]
fn by_hand() {
    // Two heads of 64; key 1: dots 2 and -2; key 2: -3 and 3 (scale 4).
    let spec = DsaScoresSpec::new(1, 2, 64, 3);
    let mut q = vec![0f32; 128];
    (q[0], q[64]) = (1.0, -1.0);
    let mut k = vec![0f32; 192];
    (k[64], k[128]) = (2.0, -3.0);
    let s = dsa_scores(&q, &k, Some(&[1.0, 1.0, 4.0]), &[0.5, 2.0], &[1], &[3], &spec).unwrap();
    assert_eq!(s, [f32::NEG_INFINITY, 1.0, 24.0]);
    // No scale: 6; a negative weight keeps its sign after the ReLU.
    let s = dsa_scores(&q, &k, None, &[0.5, -2.0], &[0], &[3], &spec).unwrap();
    assert_eq!(s, [0.0, 1.0, -6.0]);
}

#[test]
fn cpu_is_within_the_stated_bound_of_the_reference() {
    let mut rng = Rng::new(11);
    for (rows, heads, dim, keys) in [(9, 64, 128, 70), (5, 3, 64, 33), (4, 1, 256, 20)] {
        let spec = DsaScoresSpec::new(rows, heads, dim, keys);
        let qf = normals(&mut rng, rows * heads * dim);
        let kf = normals(&mut rng, keys * dim);
        within_bound(&qf, &kf, &spec, &mut rng);
        within_bound(&bf(&qf), &bf(&kf), &spec, &mut rng);
        within_bound(&e4m3(&qf), &e4m3(&kf), &spec, &mut rng);
        within_bound(&bf(&qf), &e4m3(&kf), &spec, &mut rng);
    }
}

fn bf(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

#[test]
fn rows_do_not_depend_on_the_batch() {
    let mut rng = Rng::new(5);
    let spec = DsaScoresSpec::new(6, 8, 128, 50);
    let q = e4m3(&normals(&mut rng, 6 * 8 * 128));
    let k = e4m3(&normals(&mut rng, 50 * 128));
    let w = normals(&mut rng, 6 * 8);
    let (starts, ends) = ranges(&mut rng, 6, 50);
    let all = dsa_scores(&q, &k, None, &w, &starts, &ends, &spec).unwrap();
    for t in 0..6 {
        let one = DsaScoresSpec { rows: 1, ..spec };
        let r = dsa_scores(
            &q[t * 1024..(t + 1) * 1024],
            &k,
            None,
            &w[t * 8..(t + 1) * 8],
            &starts[t..t + 1],
            &ends[t..t + 1],
            &one,
        )
        .unwrap();
        assert_eq!(
            r.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            all[t * 50..(t + 1) * 50].iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn nan_is_the_canonical_quiet_nan() {
    let spec = DsaScoresSpec::new(1, 1, 64, 2);
    let mut k = vec![1f32; 128];
    k[70] = f32::NAN;
    let q = vec![1f32; 64];
    let s = dsa_scores(&q, &k, None, &[1.0], &[0], &[2], &spec).unwrap();
    assert_eq!(s[0], 64.0);
    assert_eq!(s[1].to_bits(), 0x7fc0_0000);
    // +inf times a zero weight is NaN as well (the contract's arithmetic).
    let k = vec![f32::MAX; 128];
    let s = dsa_scores(&q, &k, None, &[0.0], &[0], &[2], &spec).unwrap();
    assert_eq!(s[0].to_bits(), 0x7fc0_0000);
}

#[test]
fn bad_requests_say_what_is_wrong() {
    let spec = DsaScoresSpec::new(2, 4, 64, 10);
    let q = vec![0f32; 2 * 4 * 64];
    let k = vec![0f32; 10 * 64];
    let w = vec![1f32; 8];
    let ok = |q: &[f32], k: &[f32], sc: Option<&[f32]>, w: &[f32], a: &[i32], b: &[i32], s: &DsaScoresSpec| {
        dsa_scores(q, k, sc, w, a, b, s).map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(ok(&q, &k, None, &w, &[0, 2], &[10, 5], &spec).is_ok());
    let cases: Vec<(Result<(), String>, &str)> = vec![
        (ok(&q, &k, None, &w, &[0, 6], &[10, 5], &spec), "[6, 5) at row 1"),
        (ok(&q, &k, None, &w, &[-1, 0], &[10, 5], &spec), "[-1, 10) at row 0"),
        (ok(&q, &k, None, &w, &[0, 0], &[11, 5], &spec), "[0, 11) at row 0"),
        (ok(&q, &k[..64], None, &w, &[0, 0], &[1, 1], &spec), "k"),
        (ok(&q, &k, Some(&[1.0; 9]), &w, &[0, 0], &[1, 1], &spec), "k_scale"),
        (ok(&q, &k, None, &w[..7], &[0, 0], &[1, 1], &spec), "weights"),
        (ok(&q[..10], &k, None, &w, &[0, 0], &[1, 1], &spec), "q"),
        (ok(&q, &k, None, &w, &[0], &[1, 1], &spec), "starts"),
        (ok(&q, &k, None, &w, &[0, 0], &[1, 1], &DsaScoresSpec { heads: 0, ..spec }), "heads"),
        (ok(&q, &k, None, &w, &[0, 0], &[1, 1], &DsaScoresSpec { dim: 96, ..spec }), "head dim"),
    ];
    for (r, what) in cases {
        let e = r.unwrap_err();
        assert!(e.contains(what), "{e} should name {what}");
    }
}

#[test]
fn the_indexer_is_select_ranges_on_the_scores() {
    let mut rng = Rng::new(9);
    let (rows, heads, dim, keys, topk) = (12, 16, 128, 300, 40);
    let spec = DsaScoresSpec::new(rows, heads, dim, keys);
    // Many ties: keys from a few values, ReLU zeros.
    let q = e4m3(&normals(&mut rng, rows * heads * dim));
    let k = e4m3(&(0..keys * dim).map(|i| ((i * 7) % 5) as f32 - 2.0).collect::<Vec<_>>());
    let w = normals(&mut rng, rows * heads);
    let (starts, ends) = ranges(&mut rng, rows, keys);
    let sel = SelectSpec::new(rows, keys, topk, DType::F32).with_order(OutputOrder::Index);
    let got = dsa_indexer(&q, &k, None, &w, &starts, &ends, &spec, &sel, None).unwrap();
    let scores = dsa_scores(&q, &k, None, &w, &starts, &ends, &spec).unwrap();
    let view = ScoresView::new(&scores, rows, keys).unwrap();
    let want = crate::cpu::select_ranges(&view, &sel, &starts, Some(&ends)).unwrap();
    assert_eq!(got.indices, want.indices);
    // Each row: min(k, range) ids inside the range, then -1.
    for t in 0..rows {
        let n = (ends[t] - starts[t]).min(topk as i32) as usize;
        let row = &got.indices[t * topk..(t + 1) * topk];
        assert!(row[..n].iter().all(|&i| i >= starts[t] && i < ends[t]));
        assert!(row[n..].iter().all(|&i| i == -1));
    }
    // Slots through a page table: one sequence of 5 pages of 64 tokens, in
    // reverse physical order.
    let table: Vec<i32> = (0..5).rev().collect();
    let seq = vec![0i32; rows];
    let pages = PageMap::new(&table, 5, 64, &seq).unwrap();
    let slots = dsa_indexer(&q, &k, None, &w, &starts, &ends, &spec, &sel, Some(&pages)).unwrap();
    for (i, s) in want.indices.iter().zip(&slots.indices) {
        let expect = if *i < 0 { -1 } else { table[(*i / 64) as usize] * 64 + i % 64 };
        assert_eq!(*s, expect);
    }
    // A spec that is not the scores' is an error: other columns, or rows
    // that are not packed (the device chain writes them densely).
    let bad = SelectSpec::new(rows, keys + 1, topk, DType::F32);
    assert!(dsa_indexer(&q, &k, None, &w, &starts, &ends, &spec, &bad, None).is_err());
    let strided = sel.with_stride(keys + 8);
    let e = dsa_indexer(&q, &k, None, &w, &starts, &ends, &spec, &strided, None).unwrap_err().to_string();
    assert!(e.contains("row stride"), "{e}");
}

/// A paged cache in DeepGEMM's layout holding the keys `k` (e4m3 codes)
/// and scales `sc` of one sequence, its pages stored in reverse order, plus
/// one unused page of NaN codes.
fn paged_cache(k: &[F8E4M3], sc: &[f32], d: usize, ps: usize) -> (Vec<u8>, Vec<i32>) {
    let n = sc.len();
    let pages = n.div_ceil(ps);
    let pb = ps * (d + 4);
    let mut cache = vec![0x7fu8; (pages + 1) * pb];
    let table: Vec<i32> = (0..pages as i32).rev().collect();
    for s in 0..n {
        let p = table[s / ps] as usize;
        let j = s % ps;
        for x in 0..d {
            cache[p * pb + j * d + x] = k[s * d + x].0;
        }
        cache[p * pb + ps * d + 4 * j..p * pb + ps * d + 4 * j + 4].copy_from_slice(&sc[s].to_le_bytes());
    }
    (cache, table)
}

#[test]
fn paged_keys_give_the_contiguous_bits() {
    let mut rng = Rng::new(21);
    let (rows, heads, dim, keys, ps) = (7, 12, 128, 300, 64);
    let spec = DsaScoresSpec::new(rows, heads, dim, keys);
    let q = e4m3(&normals(&mut rng, rows * heads * dim));
    let k = e4m3(&normals(&mut rng, keys * dim));
    let sc: Vec<f32> = (0..keys).map(|_| 0.5 + rng.uniform() as f32).collect();
    let w = normals(&mut rng, rows * heads);
    let (starts, ends) = ranges(&mut rng, rows, keys);
    let want = dsa_scores(&q, &k, Some(&sc), &w, &starts, &ends, &spec).unwrap();
    let (cache, table) = paged_cache(&k, &sc, dim, ps);
    let seq = vec![0i32; rows];
    let pages = PageMap::new(&table, table.len(), ps, &seq).unwrap();
    let pk = DsaPagedKeys { cache: &cache, pages };
    let got = dsa_scores_paged(&q, &pk, &w, &starts, &ends, &spec).unwrap();
    assert_eq!(
        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // The indexer: ids as tokens, or as the cache's slots.
    let sel = SelectSpec::new(rows, keys, 50, DType::F32).with_order(OutputOrder::Index);
    let ids = dsa_indexer_paged(&q, &pk, &w, &starts, &ends, &spec, &sel, false).unwrap();
    let flat = dsa_indexer(&q, &k, Some(&sc), &w, &starts, &ends, &spec, &sel, None).unwrap();
    assert_eq!(ids.indices, flat.indices);
    let slots = dsa_indexer_paged(&q, &pk, &w, &starts, &ends, &spec, &sel, true).unwrap();
    for (i, s) in flat.indices.iter().zip(&slots.indices) {
        let expect = if *i < 0 { -1 } else { table[(*i / 64) as usize] * 64 + i % 64 };
        assert_eq!(*s, expect);
    }
    // A range past the table's pages, a page past the cache, a partial page.
    let short = PageMap::new(&table[..2], 2, ps, &seq).unwrap();
    let e = dsa_scores_paged(&q, &DsaPagedKeys { cache: &cache, pages: short }, &w, &[0; 7], &[200; 7], &spec);
    assert!(e.unwrap_err().to_string().contains("pages a sequence"));
    let far = vec![9i32; table.len()];
    let e = dsa_scores_paged(
        &q,
        &DsaPagedKeys { cache: &cache, pages: PageMap::new(&far, far.len(), ps, &seq).unwrap() },
        &w,
        &starts,
        &ends,
        &spec,
    );
    assert!(e.unwrap_err().to_string().contains("the key cache has"));
    let e = dsa_scores_paged(&q, &DsaPagedKeys { cache: &cache[..cache.len() - 1], pages }, &w, &starts, &ends, &spec);
    assert!(e.unwrap_err().to_string().contains("whole number of pages"));
}
