//! `flashsel bench --only dsa-indexer`: the DSA (DeepSeek-V3.2) indexer on
//! the CUDA engine, 64 fp8 index heads of 128 with per-token key scales,
//! top-2048 of each row's key range: the scores kernel, then the select
//! engine's range path. Decode rows read DeepSeek's paged fp8 key cache
//! (pages of 64, DeepGEMM's layout) and write KV slots through its table;
//! the prefill row reads contiguous keys and writes token ids. Each row is
//! verified on sampled query rows: the ids must be the CPU's selection of
//! the CUDA engine's own scores of that row (the scores follow the device
//! order, not the CPU's bits; the row's scores do not depend on the batch).
//! Only with `--only dsa-indexer`; CUDA only.

use flashsel::cuda::CudaEngine;
use flashsel::data::Rng;
use flashsel::ops::dsa::{DsaPagedKeys, DsaScoresSpec, F8E4M3};
use flashsel::ops::pages::PageMap;
use flashsel::ops::select::{OutputOrder, SelectSpec};
use flashsel::DType;
use flashsel::ScoresView;
use serde::Serialize;

/// One row of the table (and of the JSON's `dsa_indexer` list).
#[derive(Debug, Clone, Serialize)]
pub struct DsaRow {
    pub case: String,
    pub iters: usize,
    pub median_us: f64,
    pub min_us: f64,
    /// Key bytes (and scales) read once per row: the floor's numerator.
    pub key_bytes: f64,
    pub verified: String,
    pub ok: bool,
    pub error: Option<String>,
}

fn e4m3(rng: &mut Rng, n: usize) -> Vec<F8E4M3> {
    (0..n).map(|_| F8E4M3(flashsel::ops::mla::f32_to_e4m3(rng.normal() * 4.0))).collect()
}

/// `rows` queries over `keys` keys; `causal`: row `t` at position `keys -
/// rows + t` sees keys `0..=pos`, else every row sees them all; `paged`:
/// ids as slots of one sequence's pages of 64 (reversed).
fn row(e: &CudaEngine, seed: u64, iters: usize, rows: usize, keys: usize, causal: bool, paged: bool) -> DsaRow {
    let (heads, dim, topk) = (64, 128, 2048);
    let spec = DsaScoresSpec::new(rows, heads, dim, keys);
    let mut rng = Rng::new(seed ^ 0x6473_6169);
    let q = e4m3(&mut rng, rows * heads * dim);
    let k = e4m3(&mut rng, keys * dim);
    let w: Vec<f32> = (0..rows * heads).map(|_| rng.normal() / 8.0).collect();
    let sc: Vec<f32> = (0..keys).map(|_| 0.5 + rng.uniform() as f32).collect();
    let starts = vec![0i32; rows];
    let ends: Vec<i32> = (0..rows).map(|t| if causal { (keys - rows + t + 1) as i32 } else { keys as i32 }).collect();
    let sel = SelectSpec::new(rows, keys, topk, DType::F32).with_order(OutputOrder::Index);
    let pages_n = keys.div_ceil(64);
    let table: Vec<i32> = (0..pages_n as i32).rev().collect();
    let seq = vec![0i32; rows];
    // The paged cache (DeepGEMM's layout): page p = table[i] holds tokens 64
    // i .. 64 i + 63: their e4m3 codes, then their scales.
    let mut cache = vec![0u8; pages_n * 64 * (dim + 4)];
    if paged {
        let pb = 64 * (dim + 4);
        for s in 0..keys {
            let (p, j) = (table[s / 64] as usize, s % 64);
            for x in 0..dim {
                cache[p * pb + j * dim + x] = k[s * dim + x].0;
            }
            cache[p * pb + 64 * dim + 4 * j..p * pb + 64 * dim + 4 * j + 4].copy_from_slice(&sc[s].to_le_bytes());
        }
    }
    let what = if causal { "prefill (causal ranges)" } else { "decode" };
    let case = format!(
        "{what} {rows} rows x {keys} keys, 64 fp8 heads of 128, top-2048, {}",
        if paged { "paged cache, slots" } else { "contiguous keys, ids" }
    );
    let mut out = DsaRow {
        case,
        iters,
        median_us: f64::NAN,
        min_us: f64::NAN,
        key_bytes: keys as f64 * (dim + 4) as f64,
        verified: String::new(),
        ok: false,
        error: None,
    };
    let pm = PageMap::new(&table, pages_n, 64, &seq).expect("a valid page table");
    let pk = DsaPagedKeys { cache: &cache, pages: pm };
    let timed = if paged {
        e.time_dsa_indexer_paged(&q, &pk, &w, &starts, &ends, &spec, &sel, true, iters)
    } else {
        e.time_dsa_indexer(&q, &k, Some(&sc), &w, &starts, &ends, &spec, &sel, None, iters)
    };
    match timed {
        Ok((got, mut t)) => {
            t.sort_by(f64::total_cmp);
            out.median_us = t[t.len() / 2] * 1e6;
            out.min_us = t[0] * 1e6;
            // The first and last rows: the CPU's selection of the device's
            // scores of the row.
            let picks: Vec<usize> = if rows > 1 { vec![0, rows - 1] } else { vec![0] };
            let mut bad = None;
            for &r in &picks {
                let one = DsaScoresSpec { rows: 1, ..spec };
                let s1 = SelectSpec { rows: 1, ..sel };
                let seq1 = [0i32];
                let qs = &q[r * heads * dim..(r + 1) * heads * dim];
                let (w1, a1, b1) = (&w[r * heads..(r + 1) * heads], &starts[r..=r], &ends[r..=r]);
                let pm1 = PageMap::new(&table, pages_n, 64, &seq1).expect("valid");
                let want = if paged {
                    let pk1 = DsaPagedKeys { cache: &cache, pages: pm1 };
                    e.dsa_scores_paged_host(qs, &pk1, w1, a1, b1, &one)
                } else {
                    e.dsa_scores_host(qs, &k, Some(&sc), w1, a1, b1, &one)
                }
                .and_then(|scores| {
                    let view = ScoresView::new(&scores, 1, keys)?;
                    if paged {
                        flashsel::cpu::select_ranges_paged(&view, &s1, Some(a1), Some(b1), &pm1)
                    } else {
                        flashsel::cpu::select_ranges(&view, &s1, a1, Some(b1))
                    }
                });
                match want {
                    Ok(want) if want.indices[..] != got.indices[r * topk..(r + 1) * topk] => {
                        bad = Some(format!("row {r}: the ids differ from the CPU's selection of the device's scores"))
                    }
                    Ok(_) => {}
                    Err(err) => bad = Some(err.to_string()),
                }
            }
            match bad {
                None => {
                    out.verified = format!("{} rows = CPU select of the device's scores", picks.len());
                    out.ok = true;
                }
                Some(err) => out.error = Some(err),
            }
        }
        Err(err) => out.error = Some(err.to_string()),
    }
    out
}

pub fn run(e: &CudaEngine, seed: u64, iters: Option<usize>, quick: bool) -> Vec<DsaRow> {
    let iters = iters.unwrap_or(5).max(1);
    let s = |n: usize| if quick { n / 8 } else { n };
    vec![
        row(e, seed, iters, 1, s(131_072), false, true),
        row(e, seed, iters, 64, s(65_536), false, true),
        row(e, seed, iters, s(1024), s(32_768), true, false),
    ]
}

pub fn print(rows: &[DsaRow]) {
    println!();
    println!(
        "DSA indexer (scores on CUDA cores in the CPU engine's order, then the select engine's ranges; verified: \
         sampled rows equal the CPU engine's ids)"
    );
    println!("{:<84} {:>10} {:>10} {:>12}  verified", "dsa-indexer case", "us", "min us", "key MB/row");
    for r in rows {
        let status = if r.ok { r.verified.clone() } else { format!("FAILED: {}", r.error.as_deref().unwrap_or("")) };
        println!(
            "dsa-indexer {:<72} {:>10.1} {:>10.1} {:>12.2}  {}",
            r.case,
            r.median_us,
            r.min_us,
            r.key_bytes / 1e6,
            status
        );
    }
}
