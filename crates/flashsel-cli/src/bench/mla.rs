//! `flashsel bench --only mla`: the sparse MLA rows of issue 23 on the CUDA
//! engine, with FLOPs counted as FlashMLA's tests count them
//! (`../shared/baselines/flashmla-sparse-h200.md`): prefill `2 * (s_q *
//! topk, or the sum of the rows' lengths) * h_q * (d_qk + d_v)`, decode `2 *
//! h_q * b * s_q * topk * (d_qk + d_v)`, `d_v = 512`. Each row is verified on
//! a sample of query rows against the float64 reference with FlashMLA's
//! tolerances. Only with `--only mla` (the rows take seconds to build and
//! check); CUDA only.

use flashsel::cuda::{CudaEngine, MlaPath, MlaPlan};
use flashsel::data::{normal_scores, Rng};
use flashsel::ops::mla::{
    check_close, reference_sparse_mla_decode, reference_sparse_mla_prefill, CacheFormat, PagedKvCache, SparseMlaDecode,
    SparseMlaPrefill, FP8_TOKEN_BYTES, LSE_TOLERANCE, OUT_TOLERANCE,
};
use flashsel::DType;
use half::bf16;
use serde::Serialize;

/// One row of the MLA table (and of the JSON's `mla` list).
#[derive(Debug, Clone, Serialize)]
pub struct MlaRow {
    pub case: String,
    /// FlashMLA's time on the H200 for this case, when the baseline has it.
    pub flashmla_ms: Option<f64>,
    pub iters: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    /// FLOPs as FlashMLA counts them (the useful work for padded rows).
    pub flops: f64,
    pub tflops: f64,
    /// Split-KV plan taken.
    pub splits: usize,
    /// The kernel family that ran ("tensor-core" or "f32") and its heads a
    /// CTA.
    pub kernel: String,
    /// What was checked against the reference.
    pub verified: String,
    /// The row's target, and the measured quantity it is judged on.
    pub target: String,
    pub ok: bool,
    pub error: Option<String>,
}

/// The table's kernel column: `tc/32`, `tc/16` or `f32/8`.
fn kernel_of(plan: Option<&MlaPlan>) -> String {
    plan.map_or("-".into(), |p| {
        let k = if p.path == MlaPath::TensorCore { "tc" } else { "f32" };
        format!("{k}/{}", p.heads_per_cta)
    })
}

fn median(t: &mut [f64]) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0])
}

/// `n` distinct random indices in `0..bound` (partial Fisher-Yates over a
/// scratch permutation; `n <= bound`).
fn distinct(rng: &mut Rng, perm: &mut [i32], n: usize) -> Vec<i32> {
    let len = perm.len();
    for i in 0..n {
        let j = i + rng.below((len - i) as u64) as usize;
        perm.swap(i, j);
    }
    perm[..n].to_vec()
}

/// A prefill request's data: bf16 q and kv from normals, indices per row.
struct Prefill {
    spec: SparseMlaPrefill,
    q: Vec<bf16>,
    kv: Vec<bf16>,
    idx: Vec<i32>,
}

fn prefill_data(s_q: usize, s_kv: usize, h_q: usize, d_qk: usize, topk: usize, seed: u64, ramp: bool) -> Prefill {
    let spec = SparseMlaPrefill::new(s_q, s_kv, h_q, d_qk, topk, 1.0 / (d_qk as f32).sqrt()).with_dtype(DType::BF16);
    let q: Vec<bf16> = normal_scores(s_q * h_q * d_qk, seed, 11).iter().map(|&x| bf16::from_f32(x)).collect();
    let kv: Vec<bf16> = normal_scores(s_kv * d_qk, seed, 12).iter().map(|&x| bf16::from_f32(x)).collect();
    let mut rng = Rng::new(seed ^ 0x6d6c_6131);
    let mut perm: Vec<i32> = (0..s_kv as i32).collect();
    let mut idx = Vec::with_capacity(s_q * topk);
    for r in 0..s_q {
        // Seed 000's ramp: row r holds ceil(1027 r / (s_q - 1)) + 1 valid
        // indices at the front, -1 after them.
        let valid = if ramp { ((1027 * r).div_ceil((s_q - 1).max(1)) + 1).min(topk) } else { topk };
        idx.extend(distinct(&mut rng, &mut perm, valid.min(s_kv)));
        idx.resize((r + 1) * topk, -1);
    }
    Prefill { spec, q, kv, idx }
}

/// The reference on `n` sampled rows against the GPU's outputs.
fn verify_prefill(
    p: &Prefill,
    lens: Option<&[i32]>,
    got: &flashsel::ops::mla::PrefillOutput<f32>,
    n: usize,
) -> Result<String, String> {
    let SparseMlaPrefill { s_q, h_q, d_qk, topk, .. } = p.spec;
    let rows: Vec<usize> = (0..n).map(|i| i * (s_q - 1) / (n - 1).max(1)).collect();
    let q: Vec<bf16> = rows.iter().flat_map(|&r| p.q[r * h_q * d_qk..(r + 1) * h_q * d_qk].iter().copied()).collect();
    let idx: Vec<i32> = rows.iter().flat_map(|&r| p.idx[r * topk..(r + 1) * topk].iter().copied()).collect();
    let l: Option<Vec<i32>> = lens.map(|l| rows.iter().map(|&r| l[r]).collect());
    let spec = SparseMlaPrefill { s_q: rows.len(), ..p.spec };
    let want = reference_sparse_mla_prefill(&spec, &q, &p.kv, &idx, l.as_deref(), None).map_err(|e| e.to_string())?;
    let pick =
        |v: &[f32], w: usize| -> Vec<f32> { rows.iter().flat_map(|&r| v[r * w..(r + 1) * w].to_vec()).collect() };
    check_close("out", &pick(&got.out, h_q * 512), &want.out, OUT_TOLERANCE)?;
    check_close("lse", &pick(&got.lse, h_q), &want.lse, LSE_TOLERANCE)?;
    check_close("max_logits", &pick(&got.max_logits, h_q), &want.max_logits, LSE_TOLERANCE)?;
    Ok(format!("ref {n}/{s_q} rows"))
}

fn prefill_flops(spec: &SparseMlaPrefill, attended: f64) -> f64 {
    2.0 * attended * spec.h_q as f64 * (spec.d_qk + 512) as f64
}

#[allow(clippy::too_many_arguments)]
fn time_prefill(
    e: &CudaEngine,
    p: &Prefill,
    lens: Option<&[i32]>,
    attended: f64,
    iters: usize,
    case: String,
    flashmla_ms: Option<f64>,
    target: String,
) -> (MlaRow, f64) {
    let plan = e.sparse_mla_prefill_plan(&p.spec);
    let flops = prefill_flops(&p.spec, attended);
    let mut row = MlaRow {
        case,
        flashmla_ms,
        iters,
        median_ms: f64::NAN,
        min_ms: f64::NAN,
        flops,
        tflops: f64::NAN,
        splits: plan.as_ref().map_or(0, |p| p.splits),
        kernel: kernel_of(plan.as_ref().ok()),
        verified: String::new(),
        target,
        ok: false,
        error: None,
    };
    match e.time_sparse_mla_prefill(&p.spec, &p.q, &p.kv, &p.idx, lens, None, iters) {
        Ok((got, mut t)) => {
            let (med, min) = median(&mut t);
            row.median_ms = med * 1e3;
            row.min_ms = min * 1e3;
            row.tflops = flops / med / 1e12;
            match verify_prefill(p, lens, &got, 16) {
                Ok(v) => {
                    row.verified = v;
                    row.ok = true;
                }
                Err(err) => row.error = Some(err),
            }
        }
        Err(err) => row.error = Some(err.to_string()),
    }
    let med = row.median_ms;
    (row, med)
}

/// The decode row: b 128, s_q 2, h_q 128, topk 2048 over an fp8 cache of
/// 32,768 tokens per request (pages of 64, each request's own pages),
/// random bytes for the e4m3 values (no NaN codes), power-of-two scales and
/// bf16 rope values.
/// One decode shape: `b` requests of `s_q` queries and `h_q` heads over
/// `tokens` tokens each, topk 2048; `flashmla_ms`: the baseline's time.
#[derive(Debug, Clone, Copy)]
struct DecodeShape {
    b: usize,
    s_q: usize,
    h_q: usize,
    tokens: usize,
    flashmla_ms: Option<f64>,
}

/// The baseline file's decode shapes (`quick`: the first, smaller).
fn decode_shapes(quick: bool) -> Vec<DecodeShape> {
    let d = |b, s_q, h_q, tokens, ms| DecodeShape { b, s_q, h_q, tokens, flashmla_ms: Some(ms) };
    if quick {
        return vec![DecodeShape { b: 16, s_q: 2, h_q: 128, tokens: 4096, flashmla_ms: None }];
    }
    vec![
        d(128, 2, 128, 32_768, 0.4041),
        d(64, 1, 128, 65_536, 0.1287),
        d(1, 1, 128, 131_072, 0.0614),
        d(128, 2, 64, 32_768, 0.2591),
    ]
}

fn decode_row(e: &CudaEngine, seed: u64, iters: usize, shape: DecodeShape, target: bool) -> MlaRow {
    let DecodeShape { b, s_q, h_q, tokens, flashmla_ms } = shape;
    let topk = 2048;
    let page = 64;
    let pages = b * tokens / page;
    let spec = SparseMlaDecode::new(b, s_q, h_q, 576, topk, pages, page, CacheFormat::Fp8V32, 1.0 / 24.0);
    let mut rng = Rng::new(seed ^ 0x6465_636f);
    let n = pages * page;
    let mut cache = vec![0u8; n * FP8_TOKEN_BYTES];
    for tok in cache.chunks_exact_mut(FP8_TOKEN_BYTES) {
        for byte in tok[..512].iter_mut() {
            // sign, exponent 4..=10 (|v| in [2^-3, 2^4)), any mantissa: never NaN.
            let r = rng.next_u64();
            *byte = ((r & 0x80) as u8) | ((4 + (r >> 8) % 7) as u8) << 3 | ((r >> 16) & 7) as u8;
        }
        for t in 0..4 {
            let s = 2f32.powi(-((rng.below(4) + 2) as i32));
            tok[512 + 4 * t..516 + 4 * t].copy_from_slice(&s.to_le_bytes());
        }
        for j in 0..64 {
            let v = bf16::from_f32(rng.normal()).to_bits().to_le_bytes();
            tok[528 + 2 * j..530 + 2 * j].copy_from_slice(&v);
        }
    }
    let q: Vec<bf16> = normal_scores(b * s_q * h_q * 576, seed, 21).iter().map(|&x| bf16::from_f32(x)).collect();
    let mut perm: Vec<i32> = (0..tokens as i32).collect();
    let mut idx = Vec::with_capacity(b * s_q * topk);
    for req in 0..b {
        for _ in 0..s_q {
            idx.extend(distinct(&mut rng, &mut perm, topk).into_iter().map(|t| (req * tokens) as i32 + t));
        }
    }
    let flops = 2.0 * (h_q * b * s_q * topk) as f64 * (576.0 + 512.0);
    let plan = e.sparse_mla_decode_plan(&spec);
    let mut row = MlaRow {
        case: format!("decode b {b} s_q {s_q} h_q {h_q} topk {topk} fp8 ({tokens} tokens a request)"),
        flashmla_ms,
        iters,
        median_ms: f64::NAN,
        min_ms: f64::NAN,
        flops,
        tflops: f64::NAN,
        splits: plan.as_ref().map_or(0, |p| p.splits),
        kernel: kernel_of(plan.as_ref().ok()),
        verified: String::new(),
        target: if target { ">= 200 TFLOPS".into() } else { String::new() },
        ok: false,
        error: None,
    };
    match e.time_sparse_mla_decode(&spec, &q, PagedKvCache::Fp8(&cache), &idx, None, None, iters) {
        Ok((got, mut t)) => {
            let (med, min) = median(&mut t);
            row.median_ms = med * 1e3;
            row.min_ms = min * 1e3;
            row.tflops = flops / med / 1e12;
            // The reference on up to 4 requests (first, two inside, last).
            let mut reqs = vec![0, b / 3, 2 * b / 3, b - 1];
            reqs.dedup();
            let per_q = s_q * h_q * 576;
            let sub_q: Vec<bf16> = reqs.iter().flat_map(|&r| q[r * per_q..(r + 1) * per_q].to_vec()).collect();
            let sub_idx: Vec<i32> =
                reqs.iter().flat_map(|&r| idx[r * s_q * topk..(r + 1) * s_q * topk].to_vec()).collect();
            let sub = SparseMlaDecode { batch: reqs.len(), ..spec };
            let checked = reference_sparse_mla_decode(&sub, &sub_q, PagedKvCache::Fp8(&cache), &sub_idx, None, None)
                .map_err(|e| e.to_string())
                .and_then(|want| {
                    let w = s_q * h_q * 512;
                    let out: Vec<f32> = reqs.iter().flat_map(|&r| got.out[r * w..(r + 1) * w].to_vec()).collect();
                    let l = h_q * s_q;
                    let lse: Vec<f32> = reqs.iter().flat_map(|&r| got.lse[r * l..(r + 1) * l].to_vec()).collect();
                    check_close("out", &out, &want.out, OUT_TOLERANCE)?;
                    check_close("lse", &lse, &want.lse, LSE_TOLERANCE)
                });
            match checked {
                Ok(()) => {
                    row.verified = format!("ref {}/{b} requests", reqs.len());
                    row.ok = true;
                }
                Err(err) => row.error = Some(err),
            }
        }
        Err(err) => row.error = Some(err.to_string()),
    }
    row
}

/// The rows (`quick`: smaller shapes, the same kinds).
pub fn run(e: &CudaEngine, seed: u64, iters: Option<usize>, quick: bool) -> Vec<MlaRow> {
    let iters = iters.unwrap_or(5).max(1);
    let mut rows = Vec::new();
    let (s_q, s_kv) = if quick { (256, 8192) } else { (4096, 32_768) };
    // 1. The main prefill: h_q 128, d_qk 576, topk 2048, every index valid.
    let p = prefill_data(s_q, s_kv, 128, 576, 2048, seed, false);
    let all = (s_q * 2048) as f64;
    let (r, _) = time_prefill(
        e,
        &p,
        None,
        all,
        iters,
        format!("prefill s_q {s_q} h_q 128 d_qk 576 s_kv {s_kv} topk 2048"),
        (!quick).then_some(4.010),
        ">= 300 TFLOPS".into(),
    );
    rows.push(r);
    drop(p);
    // 2. h_q 16 against the same call padded to 64 heads.
    let p16 = prefill_data(s_q, s_kv, 16, 576, 2048, seed, false);
    let (mut r16, t16) = time_prefill(
        e,
        &p16,
        None,
        all,
        iters,
        format!("prefill h_q 16 (s_q {s_q} d_qk 576 s_kv {s_kv} topk 2048)"),
        None,
        String::new(),
    );
    drop(p16);
    let p64 = prefill_data(s_q, s_kv, 64, 576, 2048, seed, false);
    let (mut r64, t64) = time_prefill(
        e,
        &p64,
        None,
        all,
        iters,
        format!("prefill h_q 64 (the h_q 16 call padded; s_q {s_q} d_qk 576 s_kv {s_kv} topk 2048)"),
        None,
        String::new(),
    );
    drop(p64);
    r16.target = format!(">= 3x faster than padded to 64 heads: {:.2}x", t64 / t16);
    r64.target = "(the padded reference for h_q 16)".into();
    rows.push(r16);
    rows.push(r64);
    // 3. Seed 000's ramp-padded workload, with and without topk_length.
    let (rs_q, rs_kv) = if quick { (1024, 8192) } else { (8192, 8192) };
    let p = prefill_data(rs_q, rs_kv, 64, 512, 1152, seed, true);
    let lens = flashsel::ops::mla::derive_topk_length(&p.idx, 1152, rs_kv);
    let useful: f64 = lens.iter().map(|&l| l as f64).sum();
    let (mut with, t_with) = time_prefill(
        e,
        &p,
        Some(&lens),
        useful,
        iters,
        format!("prefill ramp-padded s_q {rs_q} h_q 64 d_qk 512 topk 1152, topk_length passed"),
        (!quick).then_some(1.180),
        String::new(),
    );
    let (mut without, t_without) = time_prefill(
        e,
        &p,
        None,
        useful,
        iters,
        format!("prefill ramp-padded s_q {rs_q} h_q 64 d_qk 512 topk 1152, no topk_length (derived)"),
        (!quick).then_some(2.144),
        String::new(),
    );
    without.target = format!("<= 1.03x the time with topk_length: {:.3}x", t_without / t_with);
    with.target = "(the baseline of the row below)".into();
    rows.push(with);
    rows.push(without);
    // 4. Decode: the row (the first), then the baseline file's others.
    for (i, shape) in decode_shapes(quick).into_iter().enumerate() {
        rows.push(decode_row(e, seed, iters, shape, i == 0));
    }
    rows
}

pub fn print(rows: &[MlaRow]) {
    println!();
    println!(
        "sparse MLA (TFLOPS as FlashMLA counts them: 2 x attended x h_q x (d_qk + 512); verified on sampled rows \
         against the f64 reference with FlashMLA's tolerances)"
    );
    println!(
        "  kernel: tc/N = the tensor-core kernels (mma.sync bf16, f32 accumulation; bf16 q with a bf16 or fp8 \
         cache), N heads a CTA; f32/8 = the f32 kernels (f32 q or cache)"
    );
    println!(
        "{:<92} {:>9} {:>9} {:>8} {:>6} {:>10}  target / verified",
        "mla case", "ms", "FlashMLA", "TFLOPS", "splits", "kernel"
    );
    for r in rows {
        let fm = r.flashmla_ms.map_or("-".to_string(), |m| format!("{m:.3}"));
        let status = if r.ok { r.verified.clone() } else { format!("FAILED: {}", r.error.as_deref().unwrap_or("")) };
        println!(
            "mla {:<88} {:>9.3} {:>9} {:>8.1} {:>6} {:>10}  {} | {}",
            r.case, r.median_ms, fm, r.tflops, r.splits, r.kernel, r.target, status
        );
    }
}
