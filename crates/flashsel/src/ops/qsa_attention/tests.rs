use half::bf16;

use super::*;
use crate::data::Rng;

fn rand_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

#[test]
fn one_head_by_hand() {
    // One row, one head of 64, two attended tokens: logits 0 and ln 3 (scale
    // 1), weights 1/4 and 3/4.
    let spec = QsaAttention::new(1, 3, 1, 1, 64, 4).with_dtypes(DType::F32, DType::F32).with_scale(1.0);
    let mut q = vec![0f32; 64];
    q[0] = 1.0;
    let mut k = vec![0f32; 3 * 64];
    k[64] = 3f32.ln(); // token 1
    let mut v = vec![0f32; 3 * 64];
    v[0] = 4.0; // token 0
    v[64 + 1] = 8.0; // token 1
    v[128] = f32::NAN; // token 2: never listed
    let r = reference_qsa_attention(&spec, &q, &k, &v, &[0, -1, 1, 7], None).unwrap();
    assert!((r.out[0] - 1.0).abs() < 1e-7, "{}", r.out[0]);
    assert!((r.out[1] - 6.0).abs() < 1e-6, "{}", r.out[1]);
    assert!((r.lse[0] - 4f64.ln()).abs() < 1e-7, "{}", r.lse[0]);
    assert!(r.out[2..].iter().all(|&x| x == 0.0));
}

#[test]
fn empty_row_is_zero_with_lse_minus_inf() {
    let spec = QsaAttention::new(2, 4, 2, 1, 64, 3).with_dtypes(DType::F32, DType::F32);
    let mut rng = Rng::new(1);
    let q = rand_vec(&mut rng, 2 * 2 * 64);
    let k = vec![f32::NAN; 4 * 64];
    let v = vec![f32::NAN; 4 * 64];
    // Row 0: every entry invalid; row 1: a length of 0 hides a valid entry.
    let idx = [-1, 4, i32::MIN, 2, 0, 1];
    let r = qsa_attention(&spec, &q, &k, &v, &idx, Some(&[3, 0])).unwrap();
    assert!(r.out.iter().all(|&x| x == 0.0));
    assert!(r.lse.iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn grouped_heads_read_their_kv_head() {
    // h_q 4, h_kv 2: heads 0, 1 read KV head 0; heads 2, 3 KV head 1.
    let (h_q, h_kv, d) = (4, 2, 64);
    let spec = QsaAttention::new(1, 2, h_q, h_kv, d, 2).with_dtypes(DType::F32, DType::F32);
    let q = vec![0f32; h_q * d];
    let mut v = vec![0f32; 2 * h_kv * d];
    v[0] = 1.0; // token 0, head 0
    v[d] = 5.0; // token 0, head 1
    v[h_kv * d] = 3.0; // token 1, head 0
    v[h_kv * d + d] = 7.0; // token 1, head 1
    let k = vec![0f32; 2 * h_kv * d];
    let r = reference_qsa_attention(&spec, &q, &k, &v, &[0, 1], None).unwrap();
    // Equal logits: each head averages its KV head's two values.
    for h in 0..h_q {
        let want = if h < 2 { 2.0 } else { 6.0 };
        assert_eq!(r.out[h * d], want, "head {h}");
    }
}

#[test]
fn derived_length_equals_explicit_and_skips_invalid_entries() {
    let (rows, tokens, h_q, d, w) = (6, 50, 4, 128, 40);
    let spec = QsaAttention::new(rows, tokens, h_q, 1, d, w).with_dtypes(DType::BF16, DType::BF16);
    let mut rng = Rng::new(7);
    let q: Vec<bf16> = rand_vec(&mut rng, rows * h_q * d).into_iter().map(bf16::from_f32).collect();
    let k: Vec<bf16> = rand_vec(&mut rng, tokens * d).into_iter().map(bf16::from_f32).collect();
    let v: Vec<bf16> = rand_vec(&mut rng, tokens * d).into_iter().map(bf16::from_f32).collect();
    let mut idx = vec![-1i32; rows * w];
    for t in 0..rows {
        for p in 0..(t * 7).min(w) {
            // An invalid entry before a valid one: the valid one still counts.
            idx[t * w + p] = if p % 5 == 3 { tokens as i32 + p as i32 } else { ((p * 13 + t) % tokens) as i32 };
        }
    }
    let lens = derive_lengths(&idx, w, tokens);
    let a = reference_qsa_attention(&spec, &q, &k, &v, &idx, None).unwrap();
    let b = reference_qsa_attention(&spec, &q, &k, &v, &idx, Some(&lens)).unwrap();
    assert_eq!(a, b);
    // The same rows with the invalid entries removed.
    let mut packed = vec![-1i32; rows * w];
    for t in 0..rows {
        let keep: Vec<i32> = idx[t * w..(t + 1) * w].iter().copied().filter(|&i| i >= 0 && i < tokens as i32).collect();
        packed[t * w..t * w + keep.len()].copy_from_slice(&keep);
    }
    let c = reference_qsa_attention(&spec, &q, &k, &v, &packed, None).unwrap();
    assert_eq!(a, c);
    assert_eq!(a.lse[0], f64::NEG_INFINITY);
    assert!(a.lse[h_q..].iter().all(|x| x.is_finite()));
}

#[test]
fn paged_cache_equals_the_contiguous_one() {
    // The same tokens laid out over 4 pages of 16 (pages in reverse order,
    // padded token and page strides) give the same result as one sequence.
    let (rows, h_q, h_kv, d, w) = (3, 6, 2, 64, 20);
    let (pages, ps) = (4usize, 16usize);
    let tokens = pages * ps;
    let mut rng = Rng::new(3);
    let q = rand_vec(&mut rng, rows * h_q * d);
    let k = rand_vec(&mut rng, tokens * h_kv * d);
    let v = rand_vec(&mut rng, tokens * h_kv * d);
    let idx: Vec<i32> = (0..rows * w).map(|i| ((i * 37) % (tokens + 3)) as i32 - 1).collect();
    let flat = QsaAttention::new(rows, tokens, h_q, h_kv, d, w).with_dtypes(DType::F32, DType::F32);
    let want = reference_qsa_attention(&flat, &q, &k, &v, &idx, None).unwrap();

    let tok_stride = h_kv * d + 8;
    let page_stride = ps * tok_stride + 32;
    let paged = flat.with_pages(pages, ps).with_strides(page_stride, tok_stride);
    // Logical page p is stored at physical page pages - 1 - p; the indices
    // become physical slots.
    let mut kp = vec![f32::NAN; paged.cache_len().unwrap()];
    let mut vp = kp.clone();
    let phys = |s: usize| (pages - 1 - s / ps) * ps + s % ps;
    for s in 0..tokens {
        for g in 0..h_kv {
            let (from, to) = ((s * h_kv + g) * d, paged.head_at(phys(s), g));
            kp[to..to + d].copy_from_slice(&k[from..from + d]);
            vp[to..to + d].copy_from_slice(&v[from..from + d]);
        }
    }
    let idx_p: Vec<i32> =
        idx.iter().map(|&i| if i >= 0 && (i as usize) < tokens { phys(i as usize) as i32 } else { i }).collect();
    let got = reference_qsa_attention(&paged, &q, &kp, &vp, &idx_p, None).unwrap();
    assert_eq!(got, want);
}

#[test]
fn bad_requests_say_what_is_wrong() {
    let ok = QsaAttention::new(2, 8, 4, 2, 64, 4).with_dtypes(DType::F32, DType::F32);
    assert!(ok.validate().is_ok());
    let cases: Vec<(QsaAttention, &str)> = vec![
        (QsaAttention { h_kv: 3, ..ok }, "h_kv"),
        (QsaAttention { h_q: 0, ..ok }, "h_q"),
        (QsaAttention { h_q: 132, h_kv: 1, ..ok }, "h_q"),
        (QsaAttention { d: 96, ..ok }, "d"),
        (QsaAttention { width: 0, ..ok }, "width"),
        (ok.with_scale(f32::NAN), "scale"),
        (ok.with_dtypes(DType::F16, DType::F32), "f32 or bf16"),
        (QsaAttention { token_stride: 100, ..ok }, "token stride"),
        (QsaAttention { page_size: 0, ..ok }, "page_size"),
    ];
    for (spec, what) in cases {
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains(what), "{e} should name {what}");
    }
    let q = vec![0f32; 2 * 4 * 64];
    let kv = vec![0f32; 8 * 2 * 64];
    let idx = vec![0i32; 8];
    let e = qsa_attention(&ok, &q, &kv[..100], &kv, &idx, None).unwrap_err().to_string();
    assert!(e.contains('k'), "{e}");
    let e = qsa_attention(&ok, &q, &kv, &kv, &idx[..7], None).unwrap_err().to_string();
    assert!(e.contains("indices"), "{e}");
    let e = qsa_attention(&ok, &q, &kv, &kv, &idx, Some(&[1, 5])).unwrap_err().to_string();
    assert!(e.contains("lengths"), "{e}");
    let e = qsa_attention(&ok, &q, &kv, &kv, &idx, Some(&[1])).unwrap_err().to_string();
    assert!(e.contains("lengths"), "{e}");
    let qb = vec![bf16::ZERO; 2 * 4 * 64];
    let e = qsa_attention(&ok, &qb, &kv, &kv, &idx, None).unwrap_err().to_string();
    assert!(e.contains("spec says"), "{e}");
}

#[test]
fn nan_key_that_is_attended_makes_the_head_nan() {
    let spec = QsaAttention::new(1, 2, 1, 1, 64, 2).with_dtypes(DType::F32, DType::F32);
    let q = vec![1f32; 64];
    let mut k = vec![0f32; 2 * 64];
    k[64 + 5] = f32::NAN;
    let v = vec![1f32; 2 * 64];
    let r = qsa_attention(&spec, &q, &k, &v, &[0, 1], None).unwrap();
    assert!(r.lse[0].is_nan() && r.out.iter().all(|x| x.is_nan()));
    // Not listed: no effect.
    let r = qsa_attention(&spec, &q, &k, &v, &[0, -1], None).unwrap();
    assert_eq!(r.out[0], 1.0);
    assert_eq!(r.lse[0], 0.0);
}
