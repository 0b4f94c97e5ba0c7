use half::bf16;

use super::*;
use crate::data::Rng;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The invalid values FlashMLA's tests pad rows with (`s_kv` is added per case).
const INVALID: [i32; 7] = [i32::MIN, -123456, -1, 114514, 1919810, 2147480000, i32::MAX];

fn randn_bf16(n: usize, rng: &mut Rng) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(rng.normal())).collect()
}

/// Distinct random indices into `0..s_kv` (with replacement when `topk > s_kv`).
fn rand_indices(s_q: usize, topk: usize, s_kv: usize, rng: &mut Rng) -> Vec<i32> {
    (0..s_q * topk).map(|_| rng.below(s_kv as u64) as i32).collect()
}

/// An independent per-head computation from the definition, written without
/// the module's code: logits, then `lse = ln(sum exp(l))` directly (the test
/// data keep the logits small), `out = sum exp(l - lse) v`.
fn naive_head(q: &[f64], keys: &[Vec<f64>], scale: f64, sink: Option<f32>) -> (Vec<f64>, f64, f64) {
    if keys.is_empty() {
        return (vec![0.0; D_V], f64::NEG_INFINITY, f64::INFINITY);
    }
    let logits: Vec<f64> = keys.iter().map(|k| scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>()).collect();
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
    let mut out = vec![0.0; D_V];
    for (l, k) in logits.iter().zip(keys) {
        let p = (l - lse).exp();
        for (o, v) in out.iter_mut().zip(&k[..D_V]) {
            *o += p * v;
        }
    }
    if let Some(s) = sink {
        let e = lse.exp();
        let f = e / (e + (s as f64).exp());
        out.iter_mut().for_each(|o| *o *= f);
    }
    (out, max, lse)
}

/// The whole prefill by [`naive_head`]: indices and lengths applied by hand.
#[allow(clippy::too_many_arguments)]
fn naive_prefill(
    spec: &SparseMlaPrefill,
    q: &[bf16],
    kv: &[bf16],
    indices: &[i32],
    lengths: Option<&[i32]>,
    sink: Option<&[f32]>,
) -> PrefillOutput<f64> {
    let (h_q, d_qk, topk) = (spec.h_q, spec.d_qk, spec.topk);
    let mut res = PrefillOutput { out: vec![], max_logits: vec![], lse: vec![] };
    for r in 0..spec.s_q {
        let len = lengths.map_or(topk, |l| l[r] as usize);
        let keys: Vec<Vec<f64>> = indices[r * topk..r * topk + len]
            .iter()
            .filter(|&&i| i >= 0 && (i as usize) < spec.s_kv)
            .map(|&i| kv[i as usize * spec.kv_stride..][..d_qk].iter().map(|x| x.to_f64()).collect())
            .collect();
        for h in 0..h_q {
            let qh: Vec<f64> = q[(r * h_q + h) * d_qk..][..d_qk].iter().map(|x| x.to_f64()).collect();
            let (o, m, l) = naive_head(&qh, &keys, spec.sm_scale as f64, sink.map(|s| s[h]));
            res.out.extend(o);
            res.max_logits.push(m);
            res.lse.push(l);
        }
    }
    res
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() { (g - w).abs() <= tol * (1.0 + w.abs()) } else { g == w };
        assert!(ok, "{what}[{i}]: {g} vs {w}");
    }
}

fn assert_prefill_close(got: &PrefillOutput<f64>, want: &PrefillOutput<f64>, tol: f64) {
    assert_close("out", &got.out, &want.out, tol);
    assert_close("max_logits", &got.max_logits, &want.max_logits, tol);
    assert_close("lse", &got.lse, &want.lse, tol);
}

/// Bit-for-bit equality (NaN == NaN, -0.0 != +0.0).
fn assert_bits(what: &str, a: &PrefillOutput<f64>, b: &PrefillOutput<f64>) {
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.out), bits(&b.out), "{what}: out");
    assert_eq!(bits(&a.max_logits), bits(&b.max_logits), "{what}: max_logits");
    assert_eq!(bits(&a.lse), bits(&b.lse), "{what}: lse");
}

struct Case {
    spec: SparseMlaPrefill,
    q: Vec<bf16>,
    kv: Vec<bf16>,
}

fn case(s_q: usize, s_kv: usize, h_q: usize, d_qk: usize, topk: usize, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let spec = SparseMlaPrefill::new(s_q, s_kv, h_q, d_qk, topk, 1.0 / (d_qk as f32).sqrt());
    Case { spec, q: randn_bf16(s_q * h_q * d_qk, &mut rng), kv: randn_bf16(s_kv * d_qk, &mut rng) }
}

impl Case {
    fn run(&self, indices: &[i32], lengths: Option<&[i32]>, sink: Option<&[f32]>) -> PrefillOutput<f64> {
        reference_sparse_mla_prefill(&self.spec, &self.q, &self.kv, indices, lengths, sink).unwrap()
    }
    fn naive(&self, indices: &[i32], lengths: Option<&[i32]>, sink: Option<&[f32]>) -> PrefillOutput<f64> {
        naive_prefill(&self.spec, &self.q, &self.kv, indices, lengths, sink)
    }
    /// The same case with row `r`'s index list replaced (`topk` changes).
    fn with_topk(&self, topk: usize) -> Case {
        Case { spec: SparseMlaPrefill { topk, ..self.spec }, q: self.q.clone(), kv: self.kv.clone() }
    }
    /// kv with every row no entry of `indices` (within `lengths`) attends set to NaN.
    fn poison_unreferenced(&mut self, indices: &[i32], lengths: Option<&[i32]>) {
        let topk = self.spec.topk;
        let mut used = vec![false; self.spec.s_kv];
        for r in 0..self.spec.s_q {
            let len = lengths.map_or(topk, |l| l[r] as usize);
            for &i in &indices[r * topk..r * topk + len] {
                if i >= 0 && (i as usize) < self.spec.s_kv {
                    used[i as usize] = true;
                }
            }
        }
        let d = self.spec.d_qk;
        for (row, &u) in used.iter().enumerate() {
            if !u {
                self.kv[row * d..(row + 1) * d].fill(bf16::NAN);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// fp8 e4m3 and the token layout
// ---------------------------------------------------------------------------

#[test]
fn e4m3_all_256_codes() {
    let mut nans = 0;
    for code in 0..=255u8 {
        let got = e4m3_to_f32(code);
        assert_eq!(got.to_bits(), E4M3_TABLE[code as usize].to_bits(), "table {code:#04x}");
        // Independently: sign * 2^(e - 7) * (1 + m / 8), subnormal 2^-6 * m / 8.
        let (s, e, m) = ((code >> 7) as i32, ((code >> 3) & 15) as i32, (code & 7) as f64);
        if e == 15 && m == 7.0 {
            assert!(got.is_nan(), "{code:#04x} is NaN");
            nans += 1;
            continue;
        }
        let mag = if e == 0 { 2f64.powi(-6) * m / 8.0 } else { 2f64.powi(e - 7) * (1.0 + m / 8.0) };
        let want = if s == 1 { -mag } else { mag };
        assert_eq!(got as f64, want, "{code:#04x}");
        assert_eq!(got.is_sign_negative(), s == 1, "{code:#04x} sign");
        // Round trip through the encoder.
        assert_eq!(f32_to_e4m3(got), code, "{code:#04x} round trip");
    }
    assert_eq!(nans, 2);
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert_eq!(e4m3_to_f32(0xfe), -448.0);
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
    assert_eq!(e4m3_to_f32(0x38), 1.0);
    assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
    // Positive finite codes ascend.
    assert!((0..0x7e).all(|c| E4M3_TABLE[c] < E4M3_TABLE[c + 1]));
}

#[test]
fn e4m3_encoder_rounds_to_nearest_even_and_saturates() {
    assert_eq!(f32_to_e4m3(1.0625), 0x38); // halfway 1.0 .. 1.125: to the even mantissa (1.0)
    assert_eq!(f32_to_e4m3(1.1875), 0x3a); // halfway 1.125 .. 1.25: to 1.25 (mantissa 2)
    assert_eq!(f32_to_e4m3(1.07), 0x39);
    assert_eq!(f32_to_e4m3(-1.07), 0xb9);
    assert_eq!(f32_to_e4m3(1000.0), 0x7e);
    assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
    assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0x00); // a quarter of the smallest subnormal
    assert_eq!(f32_to_e4m3(3.0 * 2f32.powi(-10)), 0x02); // halfway 1..2 subnormal units: to 2 (even)
}

#[test]
fn fp8_token_layout() {
    // A token built byte by byte: codes, scales 1, 2, 0.5, 4 and rope values.
    let mut t = [0u8; FP8_TOKEN_BYTES];
    for (d, b) in t[..512].iter_mut().enumerate() {
        *b = (d % 256) as u8;
    }
    for (i, s) in [1.0f32, 2.0, 0.5, 4.0].iter().enumerate() {
        t[512 + 4 * i..516 + 4 * i].copy_from_slice(&s.to_le_bytes());
    }
    for j in 0..64 {
        let b = bf16::from_f32(j as f32 - 10.5).to_bits().to_le_bytes();
        t[528 + 2 * j..530 + 2 * j].copy_from_slice(&b);
    }
    let mut key = vec![0f64; 576];
    dequantize_fp8_token(&t, &mut key);
    let scales = [1.0, 2.0, 0.5, 4.0];
    for d in 0..512 {
        let want = e4m3_to_f32((d % 256) as u8) as f64 * scales[d / 128];
        assert!(key[d].to_bits() == want.to_bits() || (want.is_nan() && key[d].is_nan()), "dim {d}");
    }
    for j in 0..64 {
        assert_eq!(key[512 + j], j as f64 - 10.5, "rope {j}");
    }
}

#[test]
fn fp8_quantizer_matches_flashmla_and_dequantizes_back() {
    let mut rng = Rng::new(7);
    let vals: Vec<f32> = (0..576).map(|i| rng.normal() * if i < 128 { 0.01 } else { 3.0 }).collect();
    let t = quantize_fp8_token(&vals);
    let mut key = vec![0f64; 576];
    dequantize_fp8_token(&t, &mut key);
    for tile in 0..4 {
        let s = f32::from_le_bytes(t[512 + 4 * tile..516 + 4 * tile].try_into().unwrap());
        assert_eq!(s.to_bits() & 0x007f_ffff, 0, "tile {tile}: the scale is a power of two");
        let amax = vals[tile * 128..(tile + 1) * 128].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(amax / s <= 448.0 && amax / s > 224.0, "tile {tile}: the smallest power of two with amax/s <= 448");
        for d in tile * 128..(tile + 1) * 128 {
            // e4m3 keeps 3 mantissa bits: within 2^-4 relative, or a subnormal step.
            let err = (key[d] - vals[d] as f64).abs();
            assert!(err <= vals[d].abs() as f64 / 16.0 + s as f64 * 2f64.powi(-10), "dim {d}");
        }
    }
    for j in 0..64 {
        assert_eq!(key[512 + j], bf16::from_f32(vals[512 + j]).to_f64());
    }
}

// ---------------------------------------------------------------------------
// Prefill
// ---------------------------------------------------------------------------

#[test]
fn hand_computed_example() {
    // One query, one head, d_qk 512: q = e0; key a = (1, 2, 0...), key b = (0, 4, 0...).
    let spec = SparseMlaPrefill::new(1, 3, 1, 512, 3, 1.0).with_dtype(DType::F32);
    let mut q = vec![0f32; 512];
    q[0] = 1.0;
    let mut kv = vec![0f32; 3 * 512];
    kv[0] = 1.0; // row 0: a
    kv[1] = 2.0;
    kv[512 + 1] = 4.0; // row 1: b
    kv[1024] = f32::NAN; // row 2: never attended
    let idx = [0, -1, 1];
    let e = std::f64::consts::E;
    let r = reference_sparse_mla_prefill(&spec, &q, &kv, &idx, None, None).unwrap();
    // logits 1 and 0: lse = ln(e + 1), max 1, out = (e a + b) / (e + 1).
    assert_eq!(r.max_logits, [1.0]);
    assert!((r.lse[0] - (e + 1.0).ln()).abs() < 1e-15);
    assert!((r.out[0] - e / (e + 1.0)).abs() < 1e-15);
    assert!((r.out[1] - (2.0 * e + 4.0) / (e + 1.0)).abs() < 1e-15);
    assert!(r.out[2..].iter().all(|&x| x == 0.0));
    // A sink of 0: out *= exp(lse) / (exp(lse) + 1) = (e + 1) / (e + 2).
    let s = reference_sparse_mla_prefill(&spec, &q, &kv, &idx, None, Some(&[0.0])).unwrap();
    assert!((s.out[0] - e / (e + 2.0)).abs() < 1e-15);
    assert!((s.out[1] - (2.0 * e + 4.0) / (e + 2.0)).abs() < 1e-15);
    assert_eq!((s.lse[0], s.max_logits[0]), (r.lse[0], r.max_logits[0]), "the sink leaves lse and max_logits");
    // sm_scale multiplies the logits: scale 2 gives logits 2 and 0.
    let spec2 = SparseMlaPrefill { sm_scale: 2.0, ..spec };
    let r2 = reference_sparse_mla_prefill(&spec2, &q, &kv, &idx, None, None).unwrap();
    assert_eq!(r2.max_logits, [2.0]);
    assert!((r2.lse[0] - (e * e + 1.0).ln()).abs() < 1e-15);
    // topk_length 2 keeps only a (position 0; position 1 is -1).
    let r3 = reference_sparse_mla_prefill(&spec, &q, &kv, &idx, Some(&[2]), None).unwrap();
    assert_eq!((r3.max_logits[0], r3.lse[0], r3.out[0], r3.out[1]), (1.0, 1.0, 1.0, 2.0));
}

#[test]
fn matches_the_independent_definition() {
    for (s_q, s_kv, h_q, d_qk, topk) in [(3, 50, 2, 512, 16), (2, 40, 3, 576, 24), (4, 10, 1, 576, 32)] {
        let c = case(s_q, s_kv, h_q, d_qk, topk, 11 + topk as u64);
        let mut rng = Rng::new(5);
        let mut idx = rand_indices(s_q, topk, s_kv, &mut rng);
        idx[3] = -1;
        idx[topk + 1] = s_kv as i32;
        let sink: Vec<f32> = (0..h_q).map(|h| h as f32 - 1.0).collect();
        assert_prefill_close(&c.run(&idx, None, None), &c.naive(&idx, None, None), 1e-12);
        assert_prefill_close(&c.run(&idx, None, Some(&sink)), &c.naive(&idx, None, Some(&sink)), 1e-12);
        let lens: Vec<i32> = (0..s_q).map(|r| (r * 7 % (topk + 1)) as i32).collect();
        assert_prefill_close(&c.run(&idx, Some(&lens), None), &c.naive(&idx, Some(&lens), None), 1e-12);
    }
}

#[test]
fn f32_and_bf16_data_agree_and_the_cpu_entry_rounds_the_reference() {
    let c = case(3, 64, 4, 576, 32, 3);
    let idx = rand_indices(3, 32, 64, &mut Rng::new(1));
    let q32: Vec<f32> = c.q.iter().map(|x| x.to_f32()).collect();
    let kv32: Vec<f32> = c.kv.iter().map(|x| x.to_f32()).collect();
    let spec32 = c.spec.with_dtype(DType::F32);
    let a = c.run(&idx, None, None);
    let b = reference_sparse_mla_prefill(&spec32, &q32, &kv32, &idx, None, None).unwrap();
    assert_bits("f32 vs bf16 of the same values", &a, &b);
    let cpu = crate::cpu::sparse_mla_prefill(&c.spec, &c.q, &c.kv, &idx, None, None).unwrap();
    assert_eq!(cpu, a.to_f32());
    assert_eq!(a.out_bf16(), a.out.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>());
}

#[test]
fn empty_rows_give_zero_out_inf_lse_and_neg_inf_max_logits() {
    let c = case(4, 32, 3, 512, 8, 1);
    let mut idx = vec![-1i32; 4 * 8];
    idx[8..16].copy_from_slice(&[32, 114514, i32::MIN, -5, i32::MAX, 33, -1, 40]); // all out of range
    idx[16] = 7; // row 2 has one valid index, but length 0 below
    let lens = [8, 8, 0, 8];
    for sink in [None, Some(vec![0.5f32, f32::INFINITY, f32::NEG_INFINITY])] {
        let r = c.run(&idx, Some(&lens), sink.as_deref());
        assert!(r.out.iter().all(|&x| x.to_bits() == 0), "out is +0.0");
        assert!(r.lse.iter().all(|&x| x == f64::INFINITY));
        assert!(r.max_logits.iter().all(|&x| x == f64::NEG_INFINITY));
        let d = c.run(&idx, None, sink.as_deref());
        assert!(d.lse[6..9].iter().all(|x| x.is_finite()), "row 2 without the length attends its index");
        assert!(d.lse[..6].iter().chain(&d.lse[9..]).all(|&x| x == f64::INFINITY));
    }
    // s_kv = 0: every index is invalid and nothing is read.
    let spec = SparseMlaPrefill::new(2, 0, 1, 512, 4, 0.1);
    let q = vec![bf16::ONE; 2 * 512];
    let r = reference_sparse_mla_prefill(&spec, &q, &[], &[0, 1, -1, 5, 0, 0, 0, 0], None, None).unwrap();
    assert!(r.lse.iter().all(|&x| x == f64::INFINITY) && r.out.iter().all(|&x| x == 0.0));
}

#[test]
fn invalid_tails_are_ignored_and_never_read() {
    let (s_q, s_kv, topk) = (3, 70, 24);
    let valid = 10;
    let mut fill = INVALID.to_vec();
    fill.extend([s_kv as i32, s_kv as i32 + 1]);
    for (t, &bad) in fill.iter().enumerate() {
        let mut c = case(s_q, s_kv, 2, 576, topk, 100 + t as u64);
        let mut rng = Rng::new(t as u64);
        let mut idx = rand_indices(s_q, topk, s_kv, &mut rng);
        for r in 0..s_q {
            idx[r * topk + valid..(r + 1) * topk].fill(bad);
        }
        c.poison_unreferenced(&idx, None);
        let got = c.run(&idx, None, None);
        assert!(got.out.iter().all(|x| x.is_finite()), "tail {bad}: no NaN reaches out");
        // The same as the valid prefix alone, bit for bit.
        let short: Vec<i32> = (0..s_q).flat_map(|r| idx[r * topk..r * topk + valid].to_vec()).collect();
        assert_bits(&format!("tail {bad}"), &got, &c.with_topk(valid).run(&short, None, None));
        assert_prefill_close(&got, &c.naive(&idx, None, None), 1e-12);
        // Interior invalid entries too.
        let mut mixed = idx.clone();
        mixed[2] = bad;
        mixed[topk + 5] = bad;
        let r = c.run(&mixed, None, None);
        assert_prefill_close(&r, &c.naive(&mixed, None, None), 1e-12);
    }
}

#[test]
fn random_topk_length_ignores_entries_past_it_even_valid_ones() {
    let (s_q, s_kv, topk) = (8, 90, 40);
    let mut c = case(s_q, s_kv, 3, 512, topk, 21);
    let mut rng = Rng::new(22);
    let idx = rand_indices(s_q, topk, s_kv, &mut rng); // all valid
    let lens: Vec<i32> = (0..s_q).map(|_| rng.below(topk as u64 + 1) as i32).collect();
    c.poison_unreferenced(&idx, Some(&lens)); // rows only past a length are NaN
    let got = c.run(&idx, Some(&lens), None);
    assert!(got.out.iter().all(|x| x.is_finite()) && got.lse.iter().all(|x| !x.is_nan()));
    // The same as -1 past each length, with or without the lengths.
    let mut masked = idx.clone();
    for r in 0..s_q {
        masked[r * topk + lens[r] as usize..(r + 1) * topk].fill(-1);
    }
    assert_bits("lengths vs -1 past them", &got, &c.run(&masked, None, None));
    assert_bits("lengths vs -1 and lengths", &got, &c.run(&masked, Some(&lens), None));
    assert_prefill_close(&got, &c.naive(&idx, Some(&lens), None), 1e-12);
}

#[test]
fn derived_topk_length_is_bit_identical_to_passing_it() {
    let (s_q, s_kv, topk) = (16, 200, 96);
    let c = case(s_q, s_kv, 4, 512, topk, 31);
    let mut rng = Rng::new(32);
    let layouts: Vec<(&str, Vec<i32>)> = vec![
        ("fully valid", rand_indices(s_q, topk, s_kv, &mut rng)),
        ("ramp-padded", {
            // Row i: ceil(topk * i / s_q) + 1 valid at the front, -1 after (seed 000's workload, scaled).
            let mut v = rand_indices(s_q, topk, s_kv, &mut rng);
            for r in 0..s_q {
                let n = ((topk - 1) * r).div_ceil(s_q - 1).min(topk - 1) + 1;
                v[r * topk + n..(r + 1) * topk].fill(-1);
            }
            v
        }),
        ("scattered interior invalid", {
            let mut v = rand_indices(s_q, topk, s_kv, &mut rng);
            for x in v.iter_mut() {
                match rng.below(4) {
                    0 => *x = -1,
                    1 => *x = s_kv as i32 + rng.below(1000) as i32,
                    _ => {}
                }
            }
            v
        }),
        ("all invalid", vec![-1; s_q * topk]),
        ("tails of every invalid kind", {
            let mut v = rand_indices(s_q, topk, s_kv, &mut rng);
            for r in 0..s_q {
                let n = rng.below(topk as u64) as usize;
                for (p, x) in v[r * topk + n..(r + 1) * topk].iter_mut().enumerate() {
                    *x = if p % 8 == 7 { s_kv as i32 } else { INVALID[p % 7] };
                }
            }
            v
        }),
    ];
    for (name, idx) in layouts {
        let derived = derive_topk_length(&idx, topk, s_kv);
        for (r, &l) in derived.iter().enumerate() {
            let row = &idx[r * topk..(r + 1) * topk];
            assert!(row[l as usize..].iter().all(|&i| i < 0 || i as usize >= s_kv), "{name}: row {r} tail");
            assert!(l == 0 || (row[l as usize - 1] >= 0 && (row[l as usize - 1] as usize) < s_kv), "{name}: row {r}");
        }
        for sink in [None, Some(vec![0.3f32, f32::NEG_INFINITY, f32::INFINITY, -2.0])] {
            let a = c.run(&idx, None, sink.as_deref());
            let b = c.run(&idx, Some(&derived), sink.as_deref());
            assert_bits(name, &a, &b);
        }
    }
    // The derivation itself.
    assert_eq!(derive_topk_length(&[3, -1, 7, -1, -1, 5, 9, 8], 4, 8), [3, 2]);
    assert_eq!(derive_topk_length(&[-1, 5, 9, 2], 4, 8), [4]);
    assert_eq!(derive_topk_length(&[8, -1, i32::MAX, i32::MIN], 4, 8), [0]);
    assert_eq!(derive_topk_length(&[-1, -1, -1, 0], 4, 8), [4]);
}

#[test]
fn a_valid_index_after_invalid_ones_is_attended() {
    let c = case(1, 30, 2, 576, 6, 41);
    let idx = [-1, 30, i32::MIN, 12, -1, -1];
    let got = c.run(&idx, None, None);
    let alone = c.with_topk(1).run(&[12], None, None);
    assert_bits("[.., 12, ..] == [12]", &got, &alone);
    assert!(got.lse.iter().all(|x| x.is_finite()));
    assert_eq!(derive_topk_length(&idx, 6, 30), [4]);
}

#[test]
fn sinks_scale_out_only() {
    let (s_q, s_kv, h_q, topk) = (5, 60, 4, 16);
    let c = case(s_q, s_kv, h_q, 512, topk, 51);
    let mut idx = rand_indices(s_q, topk, s_kv, &mut Rng::new(52));
    idx[topk * 4..].fill(-1); // row 4 empty
    let plain = c.run(&idx, None, None);
    let sink = [f32::INFINITY, f32::NEG_INFINITY, 1.5, -40.0];
    let s = c.run(&idx, None, Some(&sink));
    assert_eq!(s.lse, plain.lse);
    assert_eq!(s.max_logits, plain.max_logits);
    for r in 0..s_q {
        for (h, &sink_h) in sink.iter().enumerate() {
            let at = (r * h_q + h) * D_V;
            let (o, p) = (&s.out[at..at + D_V], &plain.out[at..at + D_V]);
            match h {
                0 => assert!(o.iter().all(|&x| x == 0.0), "+inf sink: out 0"),
                1 => assert_eq!(o, p, "-inf sink: unchanged"),
                _ if r == 4 => assert!(o.iter().all(|&x| x == 0.0), "empty row stays 0"),
                _ => {
                    let lse = plain.lse[r * h_q + h];
                    let f = lse.exp() / (lse.exp() + (sink_h as f64).exp());
                    o.iter().zip(p).for_each(|(&a, &b)| assert!((a - b * f).abs() <= 1e-15 * (1.0 + b.abs())));
                }
            }
        }
    }
    assert_prefill_close(&s, &c.naive(&idx, None, Some(&sink)), 1e-12);
}

#[test]
fn duplicate_indices_are_attended_once_per_occurrence() {
    let c = case(1, 20, 2, 512, 3, 61);
    let twice = c.with_topk(2).run(&[4, 4], None, None);
    let once = c.with_topk(1).run(&[4], None, None);
    // Two equal entries: the same softmax weights, lse + ln 2.
    for h in 0..2 {
        assert!((twice.lse[h] - (once.lse[h] + 2f64.ln())).abs() < 1e-12);
        assert_eq!(twice.max_logits[h], once.max_logits[h]);
    }
    assert_close("out", &twice.out, &once.out, 1e-14);
    // [4, 4, 9] weighs 4 twice against 9: the definition over the list of entries.
    let three = c.run(&[4, 4, 9], None, None);
    assert_prefill_close(&three, &c.naive(&[4, 4, 9], None, None), 1e-12);
    let no_dup = c.with_topk(2).run(&[4, 9], None, None);
    assert!((three.lse[0] - no_dup.lse[0]).abs() > 1e-3, "the duplicate counts");
}

#[test]
fn every_head_count_and_heads_are_independent() {
    for h_q in [1, 8, 16, 24, 64, 128] {
        let (s_q, s_kv, topk) = (2, 48, 8);
        let c = case(s_q, s_kv, h_q, 576, topk, 70 + h_q as u64);
        let mut idx = rand_indices(s_q, topk, s_kv, &mut Rng::new(h_q as u64));
        idx[topk - 1] = -1;
        let sink: Vec<f32> = (0..h_q).map(|h| (h % 5) as f32 - 2.0).collect();
        let got = c.run(&idx, None, Some(&sink));
        assert_prefill_close(&got, &c.naive(&idx, None, Some(&sink)), 1e-12);
        // Head h alone (h_q = 1) gives the same bits.
        for h in [0, h_q / 2, h_q - 1] {
            let q1: Vec<bf16> = (0..s_q).flat_map(|r| c.q[(r * h_q + h) * 576..][..576].to_vec()).collect();
            let spec1 = SparseMlaPrefill { h_q: 1, ..c.spec };
            let one = reference_sparse_mla_prefill(&spec1, &q1, &c.kv, &idx, None, Some(&sink[h..h + 1])).unwrap();
            for r in 0..s_q {
                assert_eq!(one.lse[r].to_bits(), got.lse[r * h_q + h].to_bits(), "h_q {h_q} head {h}");
                assert_eq!(one.out[r * D_V..(r + 1) * D_V], got.out[(r * h_q + h) * D_V..][..D_V]);
            }
        }
    }
}

#[test]
fn s_kv_smaller_than_topk_and_strided_kv() {
    let (s_q, s_kv, topk) = (3, 5, 16);
    let c = case(s_q, s_kv, 2, 512, topk, 81);
    let mut idx = rand_indices(s_q, topk, s_kv + 3, &mut Rng::new(82)); // some >= s_kv
    idx[0] = 2;
    let got = c.run(&idx, None, None);
    assert_prefill_close(&got, &c.naive(&idx, None, None), 1e-12);
    // The same kv in rows of 600 elements (the gaps NaN: never read).
    let stride = 600;
    let mut wide = vec![bf16::NAN; (s_kv - 1) * stride + 512];
    for r in 0..s_kv {
        wide[r * stride..r * stride + 512].copy_from_slice(&c.kv[r * 512..(r + 1) * 512]);
    }
    let spec = c.spec.with_kv_stride(stride);
    let strided = reference_sparse_mla_prefill(&spec, &c.q, &wide, &idx, None, None).unwrap();
    assert_bits("strided kv", &got, &strided);
}

#[test]
fn prefill_validation_errors() {
    let ok = SparseMlaPrefill::new(2, 8, 4, 512, 4, 0.1);
    assert!(ok.validate().is_ok());
    let opt = |s: SparseMlaPrefill, what: &str| match s.validate() {
        Err(Error::InvalidOption { what: w, .. }) => assert_eq!(w, what),
        other => panic!("{what}: {other:?}"),
    };
    opt(SparseMlaPrefill { h_q: 0, ..ok }, "h_q");
    opt(SparseMlaPrefill { h_q: 129, ..ok }, "h_q");
    opt(SparseMlaPrefill { d_qk: 128, kv_stride: 128, ..ok }, "d_qk");
    opt(ok.with_d_v(256), "d_v");
    opt(SparseMlaPrefill { topk: 0, ..ok }, "topk");
    opt(SparseMlaPrefill { sm_scale: f32::NAN, ..ok }, "sm_scale");
    opt(SparseMlaPrefill { sm_scale: f32::INFINITY, ..ok }, "sm_scale");
    assert!(matches!(ok.with_dtype(DType::F16).validate(), Err(Error::UnknownDType(_))));
    assert!(matches!(ok.with_dtype(DType::F8E4M3).validate(), Err(Error::UnknownDType(_))));
    assert!(matches!(ok.with_kv_stride(500).validate(), Err(Error::StrideTooShort { .. })));
    for h_q in 1..=128 {
        assert!(SparseMlaPrefill { h_q, ..ok }.validate().is_ok());
    }
    assert!(SparseMlaPrefill { topk: 1, ..ok }.validate().is_ok());
    assert!(SparseMlaPrefill { topk: 100_000, ..ok }.validate().is_ok());

    let q = vec![bf16::ONE; 2 * 4 * 512];
    let kv = vec![bf16::ONE; 8 * 512];
    let idx = vec![0i32; 8];
    let run = |q: &[bf16], kv: &[bf16], idx: &[i32], l: Option<&[i32]>, s: Option<&[f32]>| {
        reference_sparse_mla_prefill(&ok, q, kv, idx, l, s).map(|_| ()).unwrap_err().to_string()
    };
    assert!(run(&q[1..], &kv, &idx, None, None).contains("q: buffer holds"));
    assert!(run(&q, &kv[1..], &idx, None, None).contains("kv: buffer holds"));
    assert!(run(&q, &kv, &idx[1..], None, None).contains("indices: buffer holds"));
    assert!(run(&q, &kv, &idx, Some(&[1]), None).contains("topk_length has 1 entries"));
    assert!(run(&q, &kv, &idx, Some(&[1, 5]), None).contains("5 at row 1 (topk = 4)"));
    assert!(run(&q, &kv, &idx, Some(&[-1, 0]), None).contains("-1 at row 0"));
    assert!(run(&q, &kv, &idx, None, Some(&[0.0; 3])).contains("attn_sink has 3 entries but h_q = 4"));
    let q32 = vec![1f32; 2 * 4 * 512];
    let kv32 = vec![1f32; 8 * 512];
    let e = reference_sparse_mla_prefill(&ok, &q32, &kv32, &idx, None, None).unwrap_err();
    assert!(matches!(e, Error::UnknownDType(_)), "{e}");
    // Lengths at the ends of the range are fine.
    assert!(reference_sparse_mla_prefill(&ok, &q, &kv, &idx, Some(&[0, 4]), None).is_ok());
}

// ---------------------------------------------------------------------------
// Decode
// ---------------------------------------------------------------------------

/// A paged decode case: `batch` sequences of `seq_len` tokens spread over a
/// shuffled set of pages (pages no sequence uses, and the tokens past each
/// sequence's end, are NaN), logical top-k positions and their slots.
struct DecodeCase {
    spec: SparseMlaDecode,
    q: Vec<bf16>,
    /// The logical tokens of every sequence, `[batch, seq_len, 576]` in f32.
    tokens: Vec<f32>,
    seq_len: usize,
    /// Logical positions `[batch, s_q, topk]` (-1 invalid) and their slots.
    positions: Vec<i32>,
    slots: Vec<i32>,
    cache_bf16: Vec<bf16>,
    cache_fp8: Vec<u8>,
}

fn decode_case(batch: usize, s_q: usize, h_q: usize, topk: usize, page_size: usize, seed: u64) -> DecodeCase {
    let mut rng = Rng::new(seed);
    let seq_len = topk + 7;
    let pages_per_seq = seq_len.div_ceil(page_size);
    let num_pages = batch * pages_per_seq + 3; // 3 spare pages
                                               // A random permutation of the pages.
    let mut perm: Vec<usize> = (0..num_pages).collect();
    for i in (1..num_pages).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let table: Vec<usize> = perm[..batch * pages_per_seq].to_vec();
    // Strided pages and tokens: page stride with a gap, token stride past the width.
    let (tok_bf16, tok_fp8) = (576 + 8, FP8_TOKEN_BYTES + 16);
    let spec_bf16 = SparseMlaDecode::new(batch, s_q, h_q, 576, topk, num_pages, page_size, CacheFormat::BF16, 0.05)
        .with_strides(page_size * tok_bf16 + 32, tok_bf16);
    let spec_fp8 = SparseMlaDecode::new(batch, s_q, h_q, 576, topk, num_pages, page_size, CacheFormat::Fp8V32, 0.05)
        .with_strides((page_size + 1) * tok_fp8, tok_fp8);
    let mut cache_bf16 = vec![bf16::NAN; spec_bf16.cache_len().unwrap()];
    let mut cache_fp8 = vec![0x7fu8; spec_fp8.cache_len().unwrap()]; // 0x7f: e4m3 NaN
    let tokens: Vec<f32> = (0..batch * seq_len * 576).map(|_| rng.normal()).collect();
    let slot_of = |b: usize, t: usize| table[b * pages_per_seq + t / page_size] * page_size + t % page_size;
    for b in 0..batch {
        for t in 0..seq_len {
            let v = &tokens[(b * seq_len + t) * 576..][..576];
            let s = slot_of(b, t);
            let at = spec_bf16.slot_at(s);
            cache_bf16[at..at + 576].iter_mut().zip(v).for_each(|(c, &x)| *c = bf16::from_f32(x));
            let at = spec_fp8.slot_at(s);
            cache_fp8[at..at + FP8_TOKEN_BYTES].copy_from_slice(&quantize_fp8_token(v));
        }
    }
    let mut positions: Vec<i32> = (0..batch * s_q * topk).map(|_| rng.below(seq_len as u64) as i32).collect();
    for (i, p) in positions.iter_mut().enumerate() {
        if i % 11 == 3 {
            *p = -1;
        }
    }
    let slots = positions
        .iter()
        .enumerate()
        .map(|(i, &p)| if p < 0 { -1 } else { slot_of(i / (s_q * topk), p as usize) as i32 })
        .collect();
    DecodeCase {
        spec: spec_bf16,
        q: randn_bf16(batch * s_q * h_q * 576, &mut rng),
        tokens,
        seq_len,
        positions,
        slots,
        cache_bf16,
        cache_fp8,
    }
}

impl DecodeCase {
    fn fp8_spec(&self) -> SparseMlaDecode {
        let tok = FP8_TOKEN_BYTES + 16;
        SparseMlaDecode { cache: CacheFormat::Fp8V32, ..self.spec }.with_strides((self.spec.page_size + 1) * tok, tok)
    }
    /// The decode as prefills, one per request, over the logical tokens as
    /// the cache stores them (`dequant`: the fp8 values, else bf16).
    fn as_prefill(&self, fp8: bool, lengths: Option<&[i32]>, sink: Option<&[f32]>) -> DecodeOutput<f64> {
        let SparseMlaDecode { batch, s_q, h_q, topk, .. } = self.spec;
        let mut out = vec![];
        let mut lse = vec![0f64; batch * h_q * s_q];
        for b in 0..batch {
            let kv: Vec<f32> = (0..self.seq_len)
                .flat_map(|t| {
                    let v = &self.tokens[(b * self.seq_len + t) * 576..][..576];
                    if fp8 {
                        let mut k = vec![0f64; 576];
                        dequantize_fp8_token(&quantize_fp8_token(v), &mut k);
                        k.into_iter().map(|x| x as f32).collect::<Vec<_>>()
                    } else {
                        v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
                    }
                })
                .collect();
            let q: Vec<f32> = self.q[b * s_q * h_q * 576..][..s_q * h_q * 576].iter().map(|x| x.to_f32()).collect();
            let spec =
                SparseMlaPrefill::new(s_q, self.seq_len, h_q, 576, topk, self.spec.sm_scale).with_dtype(DType::F32);
            let l = lengths.map(|l| &l[b * s_q..(b + 1) * s_q]);
            let pos = &self.positions[b * s_q * topk..(b + 1) * s_q * topk];
            let r = reference_sparse_mla_prefill(&spec, &q, &kv, pos, l, sink).unwrap();
            out.extend(r.out);
            for s in 0..s_q {
                for h in 0..h_q {
                    lse[(b * h_q + h) * s_q + s] = r.lse[s * h_q + h];
                }
            }
        }
        DecodeOutput { out, lse }
    }
}

fn assert_decode_bits(what: &str, a: &DecodeOutput<f64>, b: &DecodeOutput<f64>) {
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.out), bits(&b.out), "{what}: out");
    assert_eq!(bits(&a.lse), bits(&b.lse), "{what}: lse");
}

#[test]
fn decode_paged_bf16_and_fp8_caches_equal_prefill_over_the_sequence() {
    for (batch, s_q, h_q, topk, page_size) in [(3, 2, 16, 24, 8), (2, 1, 1, 64, 64), (2, 3, 24, 40, 5)] {
        let c = decode_case(batch, s_q, h_q, topk, page_size, 90 + topk as u64);
        let sink: Vec<f32> = (0..h_q).map(|h| if h == 0 { f32::INFINITY } else { h as f32 * 0.1 - 1.0 }).collect();
        for sink in [None, Some(&sink[..])] {
            let bf =
                reference_sparse_mla_decode(&c.spec, &c.q, PagedKvCache::BF16(&c.cache_bf16), &c.slots, None, sink)
                    .unwrap();
            assert_decode_bits("bf16 cache", &bf, &c.as_prefill(false, None, sink));
            let f8 =
                reference_sparse_mla_decode(&c.fp8_spec(), &c.q, PagedKvCache::Fp8(&c.cache_fp8), &c.slots, None, sink)
                    .unwrap();
            assert_decode_bits("fp8 cache", &f8, &c.as_prefill(true, None, sink));
            assert!(bf.out.iter().chain(&f8.out).all(|x| x.is_finite()), "NaN pages never read");
            // The CPU entry rounds the reference.
            let cpu =
                crate::cpu::sparse_mla_decode(&c.spec, &c.q, PagedKvCache::BF16(&c.cache_bf16), &c.slots, None, sink)
                    .unwrap();
            assert_eq!(cpu, bf.to_f32());
        }
    }
}

#[test]
fn decode_lengths_per_request_per_row_and_derived() {
    let (batch, s_q, topk) = (3, 2, 32);
    let mut c = decode_case(batch, s_q, 8, topk, 16, 7);
    // Invalid tails: slots past the cache, -1, INT_MIN ... after a random prefix.
    let slots = c.spec.slots() as i32;
    let mut rng = Rng::new(8);
    for r in 0..batch * s_q {
        let n = rng.below(topk as u64 + 1) as usize;
        for (p, x) in c.slots[r * topk + n..(r + 1) * topk].iter_mut().enumerate() {
            *x = if p % 2 == 0 { slots + p as i32 } else { INVALID[p % 7] };
        }
        c.positions[r * topk + n..(r + 1) * topk].fill(-1);
    }
    let cache = PagedKvCache::BF16(&c.cache_bf16);
    let run = |l: Option<&[i32]>| reference_sparse_mla_decode(&c.spec, &c.q, cache, &c.slots, l, None).unwrap();
    let derived = derive_topk_length(&c.slots, topk, c.spec.slots());
    assert_decode_bits("derived == explicit", &run(None), &run(Some(&derived)));
    assert_decode_bits("tails", &run(None), &c.as_prefill(false, None, None));
    // One length per request applies to all its rows (FlashMLA's [batch]).
    let per_req = [5, 0, 32];
    let per_row: Vec<i32> = per_req.iter().flat_map(|&l| [l, l]).collect();
    assert_decode_bits("per request == per row", &run(Some(&per_req)), &run(Some(&per_row)));
    assert_decode_bits("lengths", &run(Some(&per_row)), &c.as_prefill(false, Some(&per_row), None));
    let r = run(Some(&per_req));
    // Request 1 has length 0: out 0, lse +inf (layout [b, h, s]).
    assert!(r.lse[8 * s_q..2 * 8 * s_q].iter().all(|&x| x == f64::INFINITY));
    assert!(r.out[s_q * 8 * D_V..2 * s_q * 8 * D_V].iter().all(|&x| x == 0.0));
}

#[test]
fn decode_lse_layout_is_batch_heads_sq() {
    let c = decode_case(2, 3, 4, 8, 4, 3);
    let r =
        reference_sparse_mla_decode(&c.spec, &c.q, PagedKvCache::BF16(&c.cache_bf16), &c.slots, None, None).unwrap();
    // Row (b, s) head h alone, as a prefill of one row.
    let p = c.as_prefill(false, None, None);
    assert_eq!(r.lse, p.lse);
    assert_eq!(r.lse.len(), 2 * 4 * 3);
}

#[test]
fn decode_validation_errors() {
    let ok = SparseMlaDecode::new(2, 1, 8, 576, 4, 3, 4, CacheFormat::Fp8V32, 0.1);
    assert!(ok.validate().is_ok());
    assert_eq!(ok.cache_len().unwrap(), 3 * 4 * 656);
    let msg = |s: SparseMlaDecode| s.validate().unwrap_err().to_string();
    assert!(msg(SparseMlaDecode { d_qk: 512, ..ok }).contains("576 with the 656-byte fp8 cache"));
    assert!(msg(SparseMlaDecode { page_size: 0, ..ok }).contains("page_size"));
    assert!(msg(ok.with_strides(4 * 656, 600)).contains("token stride 600 is shorter than a token"));
    assert!(msg(ok.with_strides(3 * 656, 656)).contains("page stride 1968 is shorter than a page"));
    assert!(msg(SparseMlaDecode { h_q: 200, ..ok }).contains("h_q"));
    assert!(msg(ok.with_q_dtype(DType::F16)).contains("f32 or bf16 q"));
    // One page: no page stride needed.
    assert!(SparseMlaDecode { num_pages: 1, ..ok }.with_strides(0, 656).validate().is_ok());
    let dense = SparseMlaDecode::new(1, 1, 1, 512, 2, 2, 2, CacheFormat::F32, 0.1);
    assert!(dense.validate().is_ok());
    assert_eq!((dense.token_stride, dense.page_stride), (512, 1024));

    let q = vec![bf16::ONE; 2 * 8 * 576];
    let cache = vec![0u8; 3 * 4 * 656];
    let idx = vec![0i32; 8];
    let e = |cache: PagedKvCache, idx: &[i32], l: Option<&[i32]>| {
        reference_sparse_mla_decode(&ok, &q, cache, idx, l, None).map(|_| ()).unwrap_err().to_string()
    };
    assert!(e(PagedKvCache::Fp8(&cache[1..]), &idx, None).contains("k_cache: buffer holds"));
    assert!(e(PagedKvCache::BF16(&[]), &idx, None).contains("the cache is bf16 but the spec says fp8"));
    assert!(e(PagedKvCache::Fp8(&cache), &idx[1..], None).contains("indices"));
    assert!(e(PagedKvCache::Fp8(&cache), &idx, Some(&[1, 2, 3])).contains("expected batch = 2"));
    assert!(e(PagedKvCache::Fp8(&cache), &idx, Some(&[1, 5])).contains("5 at row 1"));
    // All-zero fp8 tokens decode to zero keys: a uniform softmax, fine.
    let r =
        reference_sparse_mla_decode(&ok, &q, PagedKvCache::Fp8(&cache), &[0, 1, 11, 12, -1, -1, -1, -1], None, None)
            .unwrap();
    // Slot 12 is past the cache (3 pages of 4): row 0 attends 3 entries; row 1 none.
    assert!(r.lse[..8].iter().all(|&x| (x - 3f64.ln()).abs() < 1e-15));
    assert!(r.lse[8..].iter().all(|&x| x == f64::INFINITY));
}

// ---------------------------------------------------------------------------
// The tolerance check the GPU is held to
// ---------------------------------------------------------------------------

#[test]
fn check_close_follows_flashmla() {
    let want = [1.0, -2.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.0];
    let got = [1.0f32, -2.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0];
    assert!(check_close("x", &got, &want, OUT_TOLERANCE).is_ok());
    // An anomaly in the wrong place fails.
    let mut g = got;
    g[2] = 1e30;
    assert!(check_close("x", &g, &want, OUT_TOLERANCE).unwrap_err().contains("inf / NaN positions differ"));
    // Either bound passes an element: abs 5e-4 on 0 (rel huge), rel 2% on 100.
    let want = [0.0, 100.0, 3.0];
    assert!(check_close("x", &[5e-4, 102.0, 3.0], &want, Tolerance { cos_diff: 1.0, ..OUT_TOLERANCE }).is_ok());
    let err = check_close("x", &[5e-4, 103.0, 3.0], &want, Tolerance { cos_diff: 1.0, ..OUT_TOLERANCE }).unwrap_err();
    assert!(err.contains("1 of 3 elements off") && err.contains("worst at 1"), "{err}");
    // The cosine bound.
    let w: Vec<f64> = (0..1000).map(|i| (i as f64 * 0.37).sin()).collect();
    let g: Vec<f32> = w.iter().map(|&x| (x * 1.01) as f32).collect(); // cosine difference ~5e-5
    assert!(check_close("x", &g, &w, Tolerance { abs: 1.0, ..OUT_TOLERANCE }).unwrap_err().contains("cosine"));
    // All-zero references skip it.
    assert!(check_close("x", &[1e-4], &[0.0], OUT_TOLERANCE).is_ok());
    assert!(check_close("x", &[1.0], &[1.0, 2.0], OUT_TOLERANCE).is_err());
    // The reference rounded to f32 always passes its own tolerances.
    let c = case(4, 64, 16, 576, 32, 99);
    let idx = rand_indices(4, 32, 64, &mut Rng::new(98));
    let r = c.run(&idx, None, None);
    let f = r.to_f32();
    check_close("out", &f.out, &r.out, OUT_TOLERANCE).unwrap();
    check_close("lse", &f.lse, &r.lse, LSE_TOLERANCE).unwrap();
    check_close("max_logits", &f.max_logits, &r.max_logits, LSE_TOLERANCE).unwrap();
    let b: Vec<f32> = r.out_bf16().iter().map(|x| x.to_f32()).collect();
    check_close("out (bf16)", &b, &r.out, OUT_TOLERANCE).unwrap();
}
