//! `flashsel bench --only qsa-attn`: QSA sparse attention on the CUDA engine
//! over ids shaped as `qsa_select` writes them (2,051 a row: 512 blocks of
//! 4 and the causal tail), FLOPs counted as `4 * d * h_q * attended` (QK^T
//! and PV, two FLOPs a multiply-add). Each row is verified on a sample of
//! query rows against the float64 reference with FlashMLA's tolerances.
//! Only with `--only qsa-attn`; CUDA only.

use flashsel::cuda::CudaEngine;
use flashsel::data::{normal_scores, Rng};
use flashsel::ops::mla::{check_close, LSE_TOLERANCE, OUT_TOLERANCE};
use flashsel::ops::qsa_attention::check::qsa_rows;
use flashsel::ops::qsa_attention::{reference_qsa_attention, QsaAttention, QsaAttentionOutput};
use half::bf16;
use serde::Serialize;

/// One row of the table (and of the JSON's `qsa_attn` list).
#[derive(Debug, Clone, Serialize)]
pub struct QsaAttnRow {
    pub case: String,
    pub iters: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub flops: f64,
    pub tflops: f64,
    pub splits: usize,
    /// The kernel family that ran ("tensor-core" or "f32").
    pub kernel: String,
    pub verified: String,
    pub ok: bool,
    pub error: Option<String>,
}

/// bf16 q, k, v from normals; `rows` queries at positions `tokens - rows ..
/// tokens` (prefill chunk) or all at the last position (decode).
#[allow(clippy::too_many_arguments)]
fn row(
    e: &CudaEngine,
    seed: u64,
    iters: usize,
    rows: usize,
    tokens: usize,
    h_q: usize,
    h_kv: usize,
    decode: bool,
) -> QsaAttnRow {
    let (d, width) = (256, 2051);
    let spec = QsaAttention::new(rows, tokens, h_q, h_kv, d, width);
    let what = if decode { "decode" } else { "prefill" };
    let case = format!("{what} {rows} rows x {tokens} tokens, {h_q}/{h_kv} heads of {d}, 2051 ids");
    let mut out = QsaAttnRow {
        case,
        iters,
        median_ms: f64::NAN,
        min_ms: f64::NAN,
        flops: 0.0,
        tflops: f64::NAN,
        splits: e.qsa_attention_plan(&spec).map_or(0, |p| p.splits),
        kernel: e.qsa_attention_plan(&spec).map_or("-".into(), |p| p.path.name().to_string()),
        verified: String::new(),
        ok: false,
        error: None,
    };
    let b = |v: Vec<f32>| -> Vec<bf16> { v.into_iter().map(bf16::from_f32).collect() };
    let q = b(normal_scores(rows * h_q * d, seed, 21));
    let k = b(normal_scores(tokens * h_kv * d, seed, 22));
    let v = b(normal_scores(tokens * h_kv * d, seed, 23));
    let mut rng = Rng::new(seed ^ 0x7161_7474);
    let from = if decode { tokens - 1 } else { tokens - rows };
    let (idx, counts) = qsa_rows(&mut rng, rows, width, from, tokens);
    let attended: f64 = counts.iter().map(|&c| c as f64).sum();
    out.flops = 4.0 * d as f64 * h_q as f64 * attended;
    match e.time_qsa_attention(&spec, &q, &k, &v, &idx, Some(&counts), iters) {
        Ok((got, mut t)) => {
            t.sort_by(f64::total_cmp);
            out.median_ms = t[t.len() / 2] * 1e3;
            out.min_ms = t[0] * 1e3;
            out.tflops = out.flops / t[t.len() / 2] / 1e12;
            match verify(&spec, &q, &k, &v, &idx, &counts, &got, 12) {
                Ok(s) => {
                    out.verified = s;
                    out.ok = true;
                }
                Err(err) => out.error = Some(err),
            }
        }
        Err(err) => out.error = Some(err.to_string()),
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn verify(
    spec: &QsaAttention,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    idx: &[i32],
    counts: &[i32],
    got: &QsaAttentionOutput<f32>,
    n: usize,
) -> Result<String, String> {
    let (rows, hd, w) = (spec.rows, spec.h_q * spec.d, spec.width);
    let pick: Vec<usize> = (0..n.min(rows)).map(|i| i * (rows - 1) / (n.min(rows) - 1).max(1)).collect();
    let sq: Vec<bf16> = pick.iter().flat_map(|&r| q[r * hd..(r + 1) * hd].iter().copied()).collect();
    let si: Vec<i32> = pick.iter().flat_map(|&r| idx[r * w..(r + 1) * w].iter().copied()).collect();
    let sc: Vec<i32> = pick.iter().map(|&r| counts[r]).collect();
    let sub = QsaAttention { rows: pick.len(), ..*spec };
    let want = reference_qsa_attention(&sub, &sq, k, v, &si, Some(&sc)).map_err(|e| e.to_string())?;
    let go: Vec<f32> = pick.iter().flat_map(|&r| got.out[r * hd..(r + 1) * hd].iter().copied()).collect();
    let gl: Vec<f32> = pick.iter().flat_map(|&r| got.lse[r * spec.h_q..(r + 1) * spec.h_q].iter().copied()).collect();
    check_close("out", &go, &want.out, OUT_TOLERANCE)?;
    check_close("lse", &gl, &want.lse, LSE_TOLERANCE)?;
    Ok(format!("{} rows", pick.len()))
}

pub fn run(e: &CudaEngine, seed: u64, iters: Option<usize>, quick: bool) -> Vec<QsaAttnRow> {
    let iters = iters.unwrap_or(5).max(1);
    let (prefill_rows, tokens) = if quick { (512, 65_536) } else { (4096, 262_144) };
    vec![
        row(e, seed, iters, prefill_rows, tokens, 24, 2, false),
        row(e, seed, iters, prefill_rows, tokens, 12, 1, false),
        row(e, seed, iters, 1, tokens, 12, 1, true),
        row(e, seed, iters, 1, tokens, 24, 2, true),
        row(e, seed, iters, if quick { 16 } else { 64 }, if quick { 16_384 } else { 131_072 }, 24, 2, true),
    ]
}

pub fn print(rows: &[QsaAttnRow]) {
    println!();
    println!(
        "QSA sparse attention (bf16; TFLOPS = 4 x d x h_q x attended / time; verified on sampled rows against \
         the f64 reference with FlashMLA's tolerances)"
    );
    println!(
        "{:<80} {:>9} {:>9} {:>8} {:>6} {:>12}  verified",
        "qsa-attn case", "ms", "min ms", "TFLOPS", "splits", "kernel"
    );
    for r in rows {
        let status = if r.ok { r.verified.clone() } else { format!("FAILED: {}", r.error.as_deref().unwrap_or("")) };
        println!(
            "qsa-attn {:<71} {:>9.3} {:>9.3} {:>8.2} {:>6} {:>12}  {}",
            r.case, r.median_ms, r.min_ms, r.tflops, r.splits, r.kernel, status
        );
    }
}
