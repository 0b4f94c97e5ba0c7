//! What the grid path's sampled pass sees on `device_run`'s tune rows, on
//! the CPU (no GPU): the same data (`check::generate_seeded`, the same
//! seeds), the pass as `check::grid_sampled_pass` emulates it for f32 (512
//! threads x 4 keys, 16 warps), then per row the keys at or above the
//! bound, the bins' shift, the crossing bin and, per CTA, the keys it
//! counts, the bins it flushes (one global atomic each) and the keys it
//! selects. For comparing rows whose times differ.
//! Usage: `rowstats [EXTRA_262K_ROWS]` (the tune's FS_EXTRA order: shape 0,
//! then that many extra 1 x 262,144 k 512 rows); `ROWSTATS_JB=J` takes the
//! J-th largest candidate (here a warp maximum) as the bound instead of rs.
//! perf-log, fourteenth session: the rows' times follow the flush's global
//! atomics (keys at or above the bound), 2,155-3,439 on rows of 7.40-7.80
//! us, 4,067-4,802 on rows of 7.90-8.06.
use flashsel::cuda::check::{self, Data, Rng};
use flashsel::{DType, NanPolicy, ScoreElem};

const BINS: usize = 2048;

fn stats(row: &[f32], k: usize, chunks: usize, bound_rank: Option<usize>) -> String {
    let Some(sp) = check::grid_sampled_pass(row, k, DType::F32, bound_rank) else {
        return "the sampled pass falls back to the exact passes".into();
    };
    let len = row.len();
    let keys: Vec<u32> = row.iter().map(|&x| x.key(NanPolicy::Lowest)).collect();
    let bin = |x: u32| (((x - sp.s_lo) >> sp.shift) as usize).min(BINS - 1);
    let edge = sp.s_lo + (sp.bin << sp.shift);
    // The kernel's chunks: ceil(len / chunks) rounded up to 8 elements.
    let per = len.div_ceil(chunks).div_ceil(8) * 8;
    let (mut admitted, mut adm_max, mut bins_max, mut sel_max) = (0, 0, 0, 0);
    let mut ctas_per_bin = vec![0usize; BINS];
    for c in 0..chunks {
        let part = &keys[(c * per).min(len)..((c + 1) * per).min(len)];
        let mut bins: Vec<usize> = part.iter().filter(|&&x| x >= sp.s_lo).map(|&x| bin(x)).collect();
        admitted += bins.len();
        adm_max = adm_max.max(bins.len());
        bins.sort_unstable();
        bins.dedup();
        for &d in &bins {
            ctas_per_bin[d] += 1;
        }
        bins_max = bins_max.max(bins.len());
        sel_max = sel_max.max(part.iter().filter(|&&x| x >= edge).count());
    }
    let used = ctas_per_bin.iter().filter(|&&n| n > 0).count();
    let hot = ctas_per_bin.iter().max().copied().unwrap_or(0);
    let flushes: usize = ctas_per_bin.iter().sum();
    format!(
        "admitted {admitted:5} (max/CTA {adm_max:3}) shift {:2} bins used {used:4} (max/CTA {bins_max:3}) crossing bin {:4} cnt {:3} list {:4} sel max/CTA {sel_max:2} flush atomics {flushes:5}, hottest bin {hot:3}",
        sp.shift,
        sp.bin,
        sp.cnt,
        sp.above + sp.cnt
    )
}

fn main() {
    let extra: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(14);
    let bound_rank: Option<usize> = std::env::var("ROWSTATS_JB").ok().and_then(|j| j.parse().ok());
    // device_run's tune draws one seed per shape: its 10 fixed shapes (shape
    // 0 the first), then the FS_EXTRA rows.
    let mut rng = Rng::new(5);
    let seeds: Vec<u64> = (0..10 + extra).map(|_| rng.next_u64()).collect();
    for (i, &seed) in std::iter::once(&seeds[0]).chain(&seeds[10..]).enumerate() {
        let row = check::generate_seeded(Data::Normal, 262_144, seed);
        println!("262K row {i:2}: {}", stats(&row, 512, 128, bound_rank));
    }
}
