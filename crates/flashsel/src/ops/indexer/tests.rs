use half::bf16;

use super::*;
use crate::data::Rng;
use crate::ops::qsa::{qsa_select, QsaSpec};
use crate::ScoresView;

/// The e4m3 value of `b` by the format's definition, in f64 (independent of
/// the bit construction the library uses).
fn e4m3_by_hand(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f64;
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f64.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

#[test]
fn every_e4m3_code_decodes_exactly() {
    for b in 0..=255u8 {
        let got = F8E4M3(b).to_f32();
        let want = e4m3_by_hand(b);
        if want.is_nan() {
            assert!(got.is_nan(), "{b:#04x}");
            assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "{b:#04x}: the NaN keeps its sign");
        } else {
            assert_eq!(got as f64, want, "{b:#04x}");
            assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "{b:#04x}: sign (zeros included)");
        }
        assert_eq!(<F8E4M3 as KeyElem>::to_f32(F8E4M3::from_bits(b)).to_bits(), got.to_bits());
    }
    // Landmarks of the format.
    assert_eq!(F8E4M3(0x7e).to_f32(), 448.0); // the largest
    assert_eq!(F8E4M3(0xfe).to_f32(), -448.0);
    assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
    assert_eq!(F8E4M3(0x08).to_f32(), 2f32.powi(-6)); // the smallest normal
    assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9)); // the smallest subnormal
    assert_eq!(F8E4M3(0x07).to_f32(), 7.0 * 2f32.powi(-9));
    assert_eq!(F8E4M3(0x80).to_f32().to_bits(), (-0.0f32).to_bits());
    assert!(F8E4M3(0x7f).to_f32().is_nan() && F8E4M3(0xff).to_f32().is_nan());
    assert_eq!((0..=255u8).filter(|&b| F8E4M3(b).to_f32().is_nan()).count(), 2, "two NaNs, no infinities");
    assert!((0..=255u8).all(|b| F8E4M3(b).to_f32().is_finite() || F8E4M3(b).to_f32().is_nan()));
}

#[test]
fn the_scale_is_the_nearest_f32() {
    assert_eq!(QsaScoresSpec::new(1, 1).with_dim(64).scale(), 0.125);
    assert_eq!(QsaScoresSpec::new(1, 1).with_dim(256).scale(), 0.0625);
    let c = QsaScoresSpec::new(1, 1).with_dim(128).scale();
    assert_eq!(c.to_bits(), 0x3db504f3); // 0.088388346..., round to nearest of 1/sqrt(128)
    let exact = 1.0 / 128f64.sqrt();
    assert!((c as f64 - exact).abs() <= 2f64.powi(-24) * exact);
}

/// Element types built from f32 (rounded to nearest).
trait FromF32: KeyElem {
    fn from_f32(x: f32) -> Self;
}
impl FromF32 for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
}
impl FromF32 for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
impl FromF32 for F8E4M3 {
    /// Round to the nearest e4m3 value by search (test data only, |x| <= 448).
    fn from_f32(x: f32) -> Self {
        let mut best = F8E4M3(0);
        for b in (0..=255u8).filter(|&b| b & 0x7f != 0x7f) {
            if (F8E4M3(b).to_f32() - x).abs() < (best.to_f32() - x).abs() {
                best = F8E4M3(b);
            }
        }
        best
    }
}

fn random<T: FromF32>(n: usize, scale: f32, rng: &mut Rng) -> Vec<T> {
    (0..n).map(|_| T::from_f32(rng.normal() * scale)).collect()
}

/// Positions with every V from 0 to NB represented at the ends.
fn positions(rows: usize, spec: &QsaScoresSpec, rng: &mut Rng) -> Vec<i64> {
    let r = spec.ratio as i64;
    let last = spec.blocks as i64 * r + r - 2; // the last position with V = NB
    let mut p = vec![0, r - 2, r - 1, last, last - r];
    while p.len() < rows {
        p.push(rng.below(last as u64 + 1) as i64);
    }
    p.truncate(rows);
    p.iter().map(|&t| t.clamp(0, last)).collect()
}

/// `M = sum over h, j of |q k| / sqrt(d)` of every visible entry (f64).
fn magnitudes<Q: KeyElem, K: KeyElem>(q: &[Q], kbar: &[K], spec: &QsaScoresSpec) -> Vec<f64> {
    let (h, d) = (spec.heads, spec.dim);
    let mut m = vec![0f64; spec.rows * spec.blocks];
    for t in 0..spec.rows {
        for b in 0..spec.blocks {
            let k = &kbar[b * d..(b + 1) * d];
            let a: f64 = q[t * h * d..(t + 1) * h * d]
                .chunks_exact(d)
                .map(|qh| qh.iter().zip(k).map(|(x, y)| (x.to_f32() as f64 * y.to_f32() as f64).abs()).sum::<f64>())
                .sum();
            m[t * spec.blocks + b] = a / (d as f64).sqrt();
        }
    }
    m
}

/// The documented order written out one scalar at a time (the engine must
/// give these bytes).
fn documented_order<Q: KeyElem, K: KeyElem>(q: &[Q], k: &[K], spec: &QsaScoresSpec) -> f32 {
    let d = spec.dim;
    let mut s = 0f32;
    for qh in q.chunks_exact(d) {
        let mut lanes = [0f32; 8];
        for j in 0..d {
            let p = qh[j].to_f32() * k[j].to_f32();
            lanes[j % 8] += p;
        }
        let dot = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        s += if dot > 0.0 || dot.is_nan() { dot } else { 0.0 };
    }
    let score = s * spec.scale();
    if score.is_nan() {
        f32::NAN
    } else {
        score
    }
}

/// Runs one random case and checks: the bound against the f64 reference,
/// `-inf` past V, the documented order bit for bit. Returns the largest
/// `|score - ref| / M` seen.
fn check_case<Q: FromF32 + QueryElem, K: FromF32>(
    spec: QsaScoresSpec,
    seed: u64,
    cancel: bool,
) -> (f64, Vec<f32>, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let (h, d) = (spec.heads, spec.dim);
    let kscale = if K::DTYPE == DType::F8E4M3 { 8.0 } else { 1.0 };
    let q: Vec<Q> = random(spec.rows * h * d, 1.0, &mut rng);
    let mut kbar: Vec<K> = random(spec.blocks * d, kscale, &mut rng);
    if cancel {
        // Blocks whose dot with row 0's head 0 is about zero: the last
        // element cancels the rest (then rounded to K), so the ReLU boundary
        // and cancellation are both exercised.
        let q0: Vec<f64> = q[..d].iter().map(|x| x.to_f32() as f64).collect();
        for b in (0..spec.blocks).step_by(2) {
            let k = &mut kbar[b * d..(b + 1) * d];
            let partial: f64 = (0..d - 1).map(|j| q0[j] * k[j].to_f32() as f64).sum();
            let want = -partial / q0[d - 1];
            if want.abs() < 400.0 {
                k[d - 1] = K::from_f32(want as f32);
            }
        }
    }
    let pos = positions(spec.rows, &spec, &mut rng);
    let keys = BlockKeys::Contiguous(&kbar);
    let got = qsa_scores(&q, &keys, &pos, &spec).unwrap();
    let want = reference_qsa_scores(&q, &keys, &pos, &spec).unwrap();
    let m = magnitudes(&q, &kbar, &spec);
    let mut worst = 0f64;
    for t in 0..spec.rows {
        let v = (pos[t] as usize + 1) / spec.ratio;
        for b in 0..spec.blocks {
            let i = t * spec.blocks + b;
            if b >= v {
                assert_eq!(got[i], f32::NEG_INFINITY, "row {t} block {b} (V = {v})");
                assert_eq!(want[i], f64::NEG_INFINITY);
                continue;
            }
            let err = (got[i] as f64 - want[i]).abs();
            let bound = error_bound(&spec, m[i]);
            assert!(
                err <= bound,
                "{spec:?} {} {}: row {t} block {b}: |{} - {}| = {err:e} > {bound:e}",
                Q::DTYPE,
                K::DTYPE,
                got[i],
                want[i]
            );
            if m[i] > 0.0 {
                worst = worst.max(err / m[i]);
            }
            let k = &kbar[b * d..(b + 1) * d];
            let doc = documented_order(&q[t * h * d..(t + 1) * h * d], k, &spec);
            assert_eq!(got[i].to_bits(), doc.to_bits(), "row {t} block {b}: the documented order");
        }
    }
    (worst, got, want)
}

fn specs() -> Vec<QsaScoresSpec> {
    let mut v = Vec::new();
    for &d in &DIMS {
        for &h in &[1, 4, 16] {
            v.push(QsaScoresSpec::new(6, 37).with_dim(d).with_heads(h));
        }
    }
    v.push(QsaScoresSpec::new(4, 15).with_dim(64).with_heads(7)); // head groups of 4, 2 and 1
    v.push(QsaScoresSpec::new(5, 20).with_ratio(1));
    v.push(QsaScoresSpec::new(5, 9).with_ratio(7).with_heads(3));
    v
}

#[test]
fn scores_are_within_the_bound_of_the_f64_reference() {
    let mut worst = 0f64;
    for (s, spec) in specs().into_iter().enumerate() {
        for cancel in [false, true] {
            let seed = 100 + s as u64 * 2 + cancel as u64;
            worst = worst.max(check_case::<f32, f32>(spec, seed, cancel).0);
            worst = worst.max(check_case::<f32, bf16>(spec, seed, cancel).0);
            worst = worst.max(check_case::<f32, F8E4M3>(spec, seed, cancel).0);
            worst = worst.max(check_case::<bf16, f32>(spec, seed, cancel).0);
            worst = worst.max(check_case::<bf16, bf16>(spec, seed, cancel).0);
            worst = worst.max(check_case::<bf16, F8E4M3>(spec, seed, cancel).0);
        }
    }
    // The test has something to measure: the f32 arithmetic does round.
    assert!(worst > 2f64.powi(-30), "worst relative error {worst:e}");
    assert!(worst < 2f64.powi(-20), "worst relative error {worst:e}");
}

#[test]
fn rounding_q_to_bf16_breaks_the_bound() {
    // What the contract forbids, shown to fail the same test: the f32 q of a
    // case rounded to bf16 before scoring.
    let spec = QsaScoresSpec::new(4, 64);
    let mut rng = Rng::new(7);
    let q: Vec<f32> = random(spec.rows * spec.heads * spec.dim, 1.0, &mut rng);
    let kbar: Vec<bf16> = random(spec.blocks * spec.dim, 1.0, &mut rng);
    let pos = vec![(spec.blocks * spec.ratio) as i64 - 1; spec.rows];
    let keys = BlockKeys::Contiguous(&kbar);
    let q16: Vec<bf16> = q.iter().map(|&x| bf16::from_f32(x)).collect();
    let bad = qsa_scores(&q16, &keys, &pos, &spec).unwrap();
    let want = reference_qsa_scores(&q, &keys, &pos, &spec).unwrap();
    let m = magnitudes(&q, &kbar, &spec);
    let over = (0..bad.len()).filter(|&i| (bad[i] as f64 - want[i]).abs() > error_bound(&spec, m[i])).count();
    assert!(over > bad.len() / 2, "{over} of {} over the bound", bad.len());
}

#[test]
fn rows_past_their_keys_are_minus_inf_and_read_nothing() {
    let spec = QsaScoresSpec::new(4, 10).with_dim(64).with_heads(2);
    let mut rng = Rng::new(3);
    let q: Vec<f32> = random(spec.rows * 2 * 64, 1.0, &mut rng);
    // Blocks 3.. hold NaN: a row that sees 3 blocks never reads them.
    let mut kbar: Vec<f32> = random(10 * 64, 1.0, &mut rng);
    kbar[3 * 64..].fill(f32::NAN);
    let pos = [0i64, 2, 3, 14]; // V = 0, 0, 1, 3
    let got = qsa_scores(&q, &BlockKeys::Contiguous(&kbar), &pos, &spec).unwrap();
    for (t, v) in [0usize, 0, 1, 3].into_iter().enumerate() {
        let row = &got[t * 10..(t + 1) * 10];
        assert!(row[..v].iter().all(|x| x.is_finite() && *x >= 0.0), "row {t}: {row:?}");
        assert!(row[v..].iter().all(|&x| x == f32::NEG_INFINITY), "row {t}: {row:?}");
    }
    // A row that sees the NaN blocks gets the canonical NaN there.
    let got = qsa_scores(&q[..128], &BlockKeys::Contiguous(&kbar), &[39], &QsaScoresSpec { rows: 1, ..spec }).unwrap();
    assert!(got[..3].iter().all(|x| x.is_finite()));
    assert!(got[3..].iter().all(|x| x.to_bits() == 0x7fc0_0000), "{got:?}");
}

#[test]
fn nan_and_special_values() {
    let spec = QsaScoresSpec::new(1, 3).with_dim(64).with_heads(2);
    let mut q = vec![0f32; 128];
    q[0] = 1.0; // head 0 reads k[0]
    q[64 + 1] = -1.0; // head 1 reads -k[1]
    let mut kbar = vec![0f32; 3 * 64];
    kbar[0] = 8.0; // block 0: relu(8) + relu(-0.0) = 8, times 0.125: 1.0
    kbar[64] = -8.0; // block 1: relu(-8) + relu(-8) = 0
    kbar[65] = 8.0;
    kbar[128 + 1] = -16.0; // block 2: relu(0) + relu(16) = 16: 2.0
    let got = qsa_scores(&q, &BlockKeys::Contiguous(&kbar), &[11], &spec).unwrap();
    assert_eq!(got, [1.0, 0.0, 2.0]);
    assert_eq!(got[1].to_bits(), 0, "relu gives +0.0");
    // An fp8 NaN key is a NaN score (canonical), an infinite q an infinite one.
    let k8: Vec<F8E4M3> = kbar.iter().map(|&x| F8E4M3::from_f32(x)).collect();
    let mut k8n = k8.clone();
    k8n[0] = F8E4M3(0xff);
    let got = qsa_scores(&q, &BlockKeys::Contiguous(&k8n), &[11], &spec).unwrap();
    assert_eq!(got[0].to_bits(), 0x7fc0_0000);
    assert_eq!(&got[1..], [0.0, 2.0]);
    let mut qi = q.clone();
    qi[0] = f32::INFINITY;
    let got = qsa_scores(&qi, &BlockKeys::Contiguous(&k8), &[11], &spec).unwrap();
    assert_eq!(got[0], f32::INFINITY); // inf * 8
    assert_eq!(got[1], 0.0); // relu(inf * -8 = -inf) = 0
    assert_eq!(got[2].to_bits(), 0x7fc0_0000, "inf * 0 is NaN: {got:?}");
}

/// Scatters a contiguous `[NB, d]` key set per sequence into a paged cache
/// with a random table (plus unused pages); returns (cache, table, pages).
fn paged_from<K: Copy + Default>(
    seqs: &[Vec<K>],
    blocks: usize,
    d: usize,
    per_page: usize,
    max_pages: usize,
    rng: &mut Rng,
) -> (Vec<K>, Vec<i32>) {
    let n_pages = seqs.len() * max_pages + 3;
    let mut table = crate::data::page_table(rng, seqs.len(), max_pages);
    // Unused table entries past each sequence's blocks may be anything.
    let used = blocks.div_ceil(per_page);
    for s in 0..seqs.len() {
        for j in used..max_pages {
            table[s * max_pages + j] = -7;
        }
    }
    let mut cache = vec![K::default(); n_pages * per_page * d];
    for (s, keys) in seqs.iter().enumerate() {
        for b in 0..blocks {
            let page = table[s * max_pages + b / per_page] as usize;
            let at = (page * per_page + b % per_page) * d;
            cache[at..at + d].copy_from_slice(&keys[b * d..(b + 1) * d]);
        }
    }
    (cache, table)
}

fn paged_equals_contiguous<K: FromF32 + Default>() {
    let (rows, blocks, d, ratio, page_size): (usize, usize, usize, usize, usize) = (9, 45, 128, 4, 64);
    let per_page = page_size / ratio;
    let max_pages = blocks.div_ceil(per_page) + 1;
    let spec = QsaScoresSpec::new(rows, blocks).with_ratio(ratio);
    let mut rng = Rng::new(11);
    let q: Vec<bf16> = random(rows * spec.heads * d, 1.0, &mut rng);
    let seqs: Vec<Vec<K>> = (0..3).map(|_| random(blocks * d, 4.0, &mut rng)).collect();
    let (cache, table) = paged_from(&seqs, blocks, d, per_page, max_pages, &mut rng);
    let seq_ids: Vec<i32> = (0..rows as i32).map(|i| i % 3).collect();
    let pos = positions(rows, &spec, &mut rng);
    let map = PageMap::new(&table, max_pages, page_size, &seq_ids).unwrap();
    let got = qsa_scores(&q, &BlockKeys::Paged { kbar: &cache, pages: map }, &pos, &spec).unwrap();
    let got_ref = reference_qsa_scores(&q, &BlockKeys::Paged { kbar: &cache, pages: map }, &pos, &spec).unwrap();
    let hd = spec.heads * d;
    for t in 0..rows {
        let one = QsaScoresSpec { rows: 1, ..spec };
        let keys = BlockKeys::Contiguous(&seqs[seq_ids[t] as usize]);
        let want = qsa_scores(&q[t * hd..(t + 1) * hd], &keys, &pos[t..t + 1], &one).unwrap();
        let row = &got[t * blocks..(t + 1) * blocks];
        assert_eq!(
            row.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let want_ref = reference_qsa_scores(&q[t * hd..(t + 1) * hd], &keys, &pos[t..t + 1], &one).unwrap();
        assert_eq!(&got_ref[t * blocks..(t + 1) * blocks], &want_ref[..]);
    }
}

#[test]
fn paged_keys_give_the_bytes_of_contiguous_ones() {
    paged_equals_contiguous::<f32>();
    paged_equals_contiguous::<bf16>();
    paged_equals_contiguous::<F8E4M3>();
}

#[test]
fn a_row_is_the_same_bytes_alone_in_any_batch_and_thread_count() {
    let spec = QsaScoresSpec::new(7, 1500).with_heads(4).with_dim(128);
    let mut rng = Rng::new(5);
    let q: Vec<f32> = random(7 * 4 * 128, 1.0, &mut rng);
    let kbar: Vec<bf16> = random(1500 * 128, 1.0, &mut rng);
    let pos = positions(7, &spec, &mut rng);
    let keys = BlockKeys::Contiguous(&kbar);
    let all = qsa_scores(&q, &keys, &pos, &spec).unwrap();
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let again = pool.install(|| qsa_scores(&q, &keys, &pos, &spec).unwrap());
        assert!(all.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
    }
    for t in [0, 3, 6] {
        let one = QsaScoresSpec { rows: 1, ..spec };
        let alone = qsa_scores(&q[t * 512..(t + 1) * 512], &keys, &pos[t..t + 1], &one).unwrap();
        let row = &all[t * 1500..(t + 1) * 1500];
        assert!(row.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "row {t}");
    }
    // The _into form writes the same bytes over anything.
    let mut out = vec![f32::NAN; all.len()];
    qsa_scores_into(&q, &keys, &pos, &spec, &mut out).unwrap();
    assert!(out.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn the_scores_feed_qsa_select() {
    let (rows, blocks) = (3, 700);
    let spec = QsaScoresSpec::new(rows, blocks);
    let mut rng = Rng::new(9);
    let q: Vec<f32> = random(rows * 4 * 128, 1.0, &mut rng);
    let kbar: Vec<bf16> = random(blocks * 128, 1.0, &mut rng);
    let pos = [2798i64, 2050, 100]; // V = 699 (top 512 + a tail of 3), 512 (all), 25
    let scores = qsa_scores(&q, &BlockKeys::Contiguous(&kbar), &pos, &spec).unwrap();
    let view = ScoresView::new(&scores, rows, blocks).unwrap();
    let sel = qsa_select(&view, &pos, &QsaSpec::new(rows, blocks), None).unwrap();
    assert_eq!(sel.counts, [2051, 2051, 101]);
}

#[test]
fn empty_requests() {
    let spec = QsaScoresSpec::new(0, 5).with_dim(64);
    let k = vec![0f32; 5 * 64];
    assert_eq!(qsa_scores::<f32, f32>(&[], &BlockKeys::Contiguous(&k), &[], &spec).unwrap(), Vec::<f32>::new());
    let spec = QsaScoresSpec::new(2, 0).with_dim(64).with_heads(1);
    let q = vec![1f32; 128];
    assert!(qsa_scores::<f32, f32>(&q, &BlockKeys::Contiguous(&[]), &[0, 2], &spec).unwrap().is_empty());
    assert!(qsa_scores::<f32, f32>(&q, &BlockKeys::Contiguous(&[]), &[0, 3], &spec).is_err());
}

/// A page map over `table` (4 pages a sequence).
fn pm<'a>(table: &'a [i32], seq_ids: &'a [i32], page_size: usize) -> PageMap<'a> {
    PageMap::new(table, 4, page_size, seq_ids).unwrap()
}

fn err<Q: QueryElem, K: KeyElem>(q: &[Q], keys: &BlockKeys<'_, K>, pos: &[i64], spec: &QsaScoresSpec) -> String {
    let e = qsa_scores(q, keys, pos, spec).unwrap_err().to_string();
    let r = reference_qsa_scores(q, keys, pos, spec).unwrap_err().to_string();
    assert_eq!(e, r, "the engine and the reference refuse alike");
    e
}

#[test]
fn bad_requests_are_refused_with_a_clear_error() {
    let spec = QsaScoresSpec::new(2, 4).with_dim(64).with_heads(2);
    let q = vec![0.5f32; 2 * 2 * 64];
    let k = vec![0.5f32; 4 * 64];
    let flat = BlockKeys::Contiguous(&k[..]);
    let ok = [3i64, 16];
    assert!(qsa_scores(&q, &flat, &ok, &spec).is_ok());

    let e = err(&q, &flat, &ok, &spec.with_heads(0));
    assert!(e.contains("heads") && e.contains("1..=16"), "{e}");
    let e = err(&vec![0f32; 2 * 17 * 64], &flat, &ok, &spec.with_heads(17));
    assert!(e.contains("\"17\""), "{e}");
    let e = err(&q, &flat, &ok, &spec.with_dim(96));
    assert!(e.contains("head dim") && e.contains("64, 128 or 256"), "{e}");
    let e = err(&q, &flat, &ok, &spec.with_ratio(0));
    assert!(e.contains("ratio"), "{e}");
    let e = err(&q[1..], &flat, &ok, &spec);
    assert!(e.contains("q holds 255 elements but [T = 2, H = 2, d = 64] needs 256"), "{e}");
    let e = err(&q, &BlockKeys::Contiguous(&k[..200]), &ok, &spec);
    assert!(e.contains("kbar holds 200 elements but [NB = 4, d = 64] needs 256"), "{e}");
    let e = err(&q, &flat, &[3], &spec);
    assert!(e.contains("positions has 1 entries but q has 2 rows"), "{e}");
    let e = err(&q, &flat, &[3, -1], &spec);
    assert!(e.contains("positions[1] = -1"), "{e}");
    let e = err(&q, &flat, &[3, 19], &spec);
    assert!(e.contains("positions[1] = 19 sees 5 blocks of 4 tokens but the keys hold 4"), "{e}");
    let mut out = vec![0f32; 7];
    let e = qsa_scores_into(&q, &flat, &ok, &spec, &mut out).unwrap_err().to_string();
    assert!(e.contains("the scores output") && e.contains("8"), "{e}");

    // Paged: pages of 8 tokens = 2 blocks; a cache of 3 pages; 2 sequences
    // of 4 pages.
    let cache = vec![0.25f32; 3 * 2 * 64];
    let table = [2, 0, 1, -1, /* seq 1 */ 1, 5, 0, 0];
    let seqs = [0, 1];
    let paged = |pages| BlockKeys::Paged { kbar: &cache[..], pages };
    // Row 0 sees 4 blocks (pages 2, 0), row 1 sees 2 blocks (page 1): fine.
    assert!(qsa_scores(&q, &paged(pm(&table, &seqs, 8)), &[16, 8], &spec).is_ok());
    // Row 1 sees 3 blocks: page_table[1, 1] = 5 is not a page of the cache.
    let e = err(&q, &paged(pm(&table, &seqs, 8)), &[16, 12], &spec);
    assert!(e.contains("page_table[1, 1] = 5 (row 1, blocks 2..3) is outside the key cache's pages 0..3"), "{e}");
    // A negative entry a row reads.
    let spec8 = QsaScoresSpec { blocks: 8, ..spec };
    let e = err(&q, &paged(pm(&table, &seqs, 8)), &[31, 0], &spec8);
    assert!(e.contains("page_table[0, 3] = -1"), "{e}");
    // More blocks than the table's pages hold.
    let spec9 = QsaScoresSpec { blocks: 9, ..spec };
    let e = err(&q, &paged(pm(&table, &seqs, 8)), &[35, 0], &spec9);
    assert!(e.contains("sees 9 blocks, on 5 pages of 2 blocks, but page_table has 4 pages a sequence"), "{e}");
    // Sequence ids: out of the table, or the wrong count.
    let e = err(&q, &paged(pm(&table, &[0, 2], 8)), &ok, &spec);
    assert!(e.contains("seq_ids[1] = 2 is outside 0..2"), "{e}");
    let e = err(&q, &paged(pm(&table, &[0], 8)), &ok, &spec);
    assert!(e.contains("seq_ids has 1 entries but there are 2 rows"), "{e}");
    // A page size that is not whole blocks, a cache that is not whole pages.
    let e = err(&q, &paged(pm(&table, &seqs, 6)), &ok, &spec);
    assert!(e.contains("page_size") && e.contains("multiple of ratio"), "{e}");
    let e = err(&q, &BlockKeys::Paged { kbar: &cache[..300], pages: pm(&table, &seqs, 8) }, &ok, &spec);
    assert!(e.contains("not a whole number of pages of [blocks_per_page = 2, d = 64]"), "{e}");
}

#[test]
fn bounds_and_the_fp8_type_are_what_the_docs_say() {
    let spec = QsaScoresSpec::new(1, 1);
    assert_eq!(error_bound(&spec, 1.0), (128.0 + 4.0 + 2.0) * 2f64.powi(-24) + 513.0 * 2f64.powi(-149));
    assert_eq!(<F8E4M3 as KeyElem>::DTYPE, DType::F8E4M3);
    assert_eq!(std::mem::size_of::<F8E4M3>(), 1);
}
