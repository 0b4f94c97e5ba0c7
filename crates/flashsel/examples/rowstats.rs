//! What the grid path's sampled pass sees on `device_run`'s tune rows, on
//! the CPU (no GPU): the same data (the same seeds and generator), the
//! sample's bound as `fs_grid4_f32` computes it (f32, 512 threads x 4 keys,
//! 16 warps), then per row the keys at or above it, the bins' shift, the
//! crossing bin and, per CTA, the keys it counts, the bins it flushes and
//! the keys it selects. For comparing rows whose times differ.
//! Usage: `rowstats [EXTRA_262K_ROWS]` (the tune's FS_EXTRA order: shape 0,
//! then that many extra 1 x 262,144 k 512 rows); `ROWSTATS_JB=J` takes the
//! J-th largest warp maximum as the bound instead of rs (13 here).
//! perf-log, fourteenth session: the rows' times follow the flush's global
//! atomics (keys at or above the bound), 2,155-3,439 on rows of 7.40-7.80
//! us, 4,067-4,802 on rows of 7.90-8.06.
use flashsel::cuda::check::{self, Data, Rng};

fn gen_par(n: usize, seed: u64) -> Vec<f32> {
    // device_run's generator, serially: 2^20-element parts, each its own Rng.
    let chunk = 1 << 20;
    (0..n.div_ceil(chunk))
        .flat_map(|i| {
            let mut r = Rng::new(seed ^ (i as u64).wrapping_mul(0x9e37));
            check::generate(Data::Normal, chunk.min(n - i * chunk), &mut r)
        })
        .collect()
}

fn key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x7fff_ffff == 0 {
        0x8000_0000
    } else if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

fn stats(row: &[f32], k: usize, chunks: usize) -> String {
    let len = row.len();
    let keys: Vec<u32> = row.iter().map(|&x| key(x)).collect();
    // The sample: thread t's 4 keys at (t * len / 512) rounded down to 4.
    let (block, vec, warps) = (512usize, 4usize, 16usize);
    let s_ex = (block * vec) as f32 * k as f32 / len as f32;
    let rs = (s_ex + 4.0 * s_ex.sqrt()) as usize + 1;
    // ROWSTATS_JB=J: the bound's rank among the maxima instead of rs.
    let rs = std::env::var("ROWSTATS_JB").ok().and_then(|j| j.parse().ok()).unwrap_or(rs);
    let mut maxima: Vec<u32> = (0..warps)
        .map(|w| {
            (w * 32..w * 32 + 32)
                .flat_map(|t| {
                    let r0 = (t * len / block) & !(vec - 1);
                    keys[r0..r0 + vec].to_vec()
                })
                .max()
                .unwrap()
        })
        .collect();
    maxima.sort_unstable_by(|a, b| b.cmp(a));
    let (bound, smax) = (maxima[rs - 1], maxima[0]);
    let span_bits = 32 - (smax - bound).leading_zeros() as i32;
    let next = if rs < warps { maxima[rs] } else { !bound };
    let shift = if span_bits > 10 && next != bound { (span_bits - 10) as u32 } else { 0 };
    let s_lo = bound & !((1u32 << shift) - 1);
    let bin = |x: u32| (((x - s_lo) >> shift) as usize).min(2047);
    let mut hist = vec![0usize; 2048];
    for &x in keys.iter().filter(|&&x| x >= s_lo) {
        hist[bin(x)] += 1;
    }
    let admitted: usize = hist.iter().sum();
    let (mut above, mut b) = (0usize, 2047usize);
    while above + hist[b] < k {
        above += hist[b];
        b -= 1;
    }
    let cnt = hist[b];
    let edge = s_lo + ((b as u32) << shift);
    let per = len.div_ceil(chunks).div_ceil(8) * 8;
    let (mut adm_max, mut bins_max, mut sel_max) = (0, 0, 0);
    let mut ctas_per_bin = vec![0usize; 2048];
    for c in 0..chunks {
        let part = &keys[(c * per).min(len)..((c + 1) * per).min(len)];
        let adm: Vec<usize> = part.iter().filter(|&&x| x >= s_lo).map(|&x| bin(x)).collect();
        let mut bins = adm.clone();
        bins.sort_unstable();
        bins.dedup();
        for &d in &bins {
            ctas_per_bin[d] += 1;
        }
        adm_max = adm_max.max(adm.len());
        bins_max = bins_max.max(bins.len());
        sel_max = sel_max.max(part.iter().filter(|&&x| x >= edge).count());
    }
    let nonzero = hist.iter().filter(|&&h| h > 0).count();
    let hot = ctas_per_bin.iter().max().copied().unwrap_or(0);
    let flushes: usize = ctas_per_bin.iter().sum();
    format!(
        "admitted {admitted:5} (max/CTA {adm_max:3}) shift {shift:2} bins used {nonzero:4} (max/CTA {bins_max:3}) crossing bin {b:4} cnt {cnt:3} list {:4} sel max/CTA {sel_max:2} flush atomics {flushes:5}, hottest bin {hot:3}",
        above + cnt
    )
}

fn main() {
    let extra: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(14);
    let mut rng = Rng::new(5);
    let seeds: Vec<u64> = (0..10 + extra).map(|_| rng.next_u64()).collect();
    // Shape 0, then the extras (after the 10 fixed shapes' seeds).
    for (i, &seed) in std::iter::once(&seeds[0]).chain(&seeds[10..]).enumerate() {
        let row = gen_par(262_144, seed);
        println!("262K row {i:2}: {}", stats(&row, 512, 128));
    }
}
