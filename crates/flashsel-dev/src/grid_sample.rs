//! The grid kernel's sampled pass, emulated on the CPU.

use flashsel::{DType, NanPolicy, ScoreElem};
use half::{bf16, f16};

/// The outcome of the grid kernel's sampled pass on a row that resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampledPass {
    /// Keys in the crossing bin, and the bins' width in bits.
    pub cnt: u32,
    pub shift: u32,
    /// The bound (the first bin's lower edge), the crossing bin, and
    /// the keys in the bins above it.
    pub s_lo: u32,
    pub bin: u32,
    pub above: u32,
}

/// What the grid kernel's sampled pass (kernels/select/grid) does
/// with one row of `dtype`, emulated: `Some` where it resolves, `None`
/// where it falls back to the exact passes. `bound_rank`: the bound is that
/// candidate (1 = the largest) instead of the kernel's rs-th (what-if
/// studies, `flashsel-dev rowstats`). The tests check the kernel's design
/// with it; it is not the kernel.
///
/// # Panics
/// Where the kernel takes no sample for `k` (more than 4 keys a warp).
pub fn grid_sampled_pass(row: &[f32], k: usize, dtype: DType, bound_rank: Option<usize>) -> Option<SampledPass> {
    let key = |x: f32| match dtype {
        DType::F32 => x.key(NanPolicy::Lowest),
        DType::BF16 => bf16::from_f32(x).key(NanPolicy::Lowest),
        _ => f16::from_f32(x).key(NanPolicy::Lowest),
    };
    let len = row.len();
    // Elements a thread's 16-byte sample load holds.
    let vec = if dtype == DType::F32 { 4usize } else { 8 };
    let (block, bins) = (512usize, 2048usize);
    let ex = (block * vec) as f32 * k as f32 / len as f32;
    let rs = (ex + 4.0 * ex.sqrt()) as usize + 1;
    let (warps, tops) = (block / 32, rs.div_ceil(block / 32));
    assert!(tops <= 4, "the kernel takes no sample here");
    // Each warp's `tops` largest sample keys (the kernel strikes them
    // one at a time; the multiset is the same), then the rs-th largest.
    let mut cand: Vec<u32> = (0..warps)
        .flat_map(|w| {
            let mut keys: Vec<u32> = (32 * w..32 * w + 32)
                .flat_map(|t| (0..vec).map(move |q| ((t * len / block) & !(vec - 1)) + q))
                .map(|i| key(row[i]))
                .collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            keys.truncate(tops);
            keys
        })
        .collect();
    cand.sort_unstable_by(|a, b| b.cmp(a));
    let j = bound_rank.unwrap_or(rs);
    let (bound, smax) = (cand[j - 1], cand[0]);
    let tied = cand.get(j) == Some(&bound);
    let crossing = |hist: &[u32], r: u32| {
        let mut above = 0;
        for b in (0..hist.len()).rev() {
            if above < r && r <= above + hist[b] {
                return Some((b as u32, above, hist[b]));
            }
            above += hist[b];
        }
        None
    };
    let span_bits: u32 = 32 - (smax - bound).leading_zeros();
    let shift = if tied { 0 } else { span_bits.saturating_sub(10) };
    let s_lo = bound & !((1u32 << shift) - 1);
    let mut pass = vec![0u32; bins];
    for &x in row {
        let kx = key(x);
        if kx >= s_lo {
            pass[(((kx - s_lo) >> shift) as usize).min(bins - 1)] += 1;
        }
    }
    match crossing(&pass, k as u32) {
        Some((bin, above, cnt)) if bin != bins as u32 - 1 => Some(SampledPass { cnt, shift, s_lo, bin, above }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsel::data::{generate, Data, Rng};

    /// The list by bins (the grid kernel's list layout), emulated with the
    /// CTAs flushing in a random order: each CTA's place in a bin is the
    /// row's count of that bin before its flush, bin d starts at the count
    /// of the bins above d, and a CTA's keys of d follow in any order. The
    /// selected keys (those in the crossing bin and above) must fill the
    /// list's first above + cnt entries, each exactly once.
    #[test]
    fn grid_bin_list_places_are_a_permutation() {
        let mut rng = Rng::new(33);
        for (len, k, chunks) in [(262_144usize, 512usize, 64usize), (1 << 20, 2048, 132)] {
            let row = generate(Data::Normal, len, &mut rng);
            let sp = grid_sampled_pass(&row, k, DType::F32, None).expect("a normal row resolves");
            let key = |x: f32| x.key(NanPolicy::Lowest);
            let bin_of = |kx: u32| (((kx - sp.s_lo) >> sp.shift) as usize).min(2047);
            let per = len.div_ceil(chunks).div_ceil(8) * 8;
            // Each CTA's bins (keys >= s_lo), as its shared histogram holds them.
            let cta_bins: Vec<Vec<u32>> = (0..chunks)
                .map(|p| {
                    let mut h = vec![0u32; 2048];
                    for &x in &row[(p * per).min(len)..((p + 1) * per).min(len)] {
                        if key(x) >= sp.s_lo {
                            h[bin_of(key(x))] += 1;
                        }
                    }
                    h
                })
                .collect();
            // Flushes in a random order; `place[p][d]`: the count before p's add.
            let mut order: Vec<usize> = (0..chunks).collect();
            for i in (1..chunks).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            let mut global = vec![0u32; 2048];
            let mut place = vec![vec![0u32; 2048]; chunks];
            for &p in &order {
                for d in 0..2048 {
                    if cta_bins[p][d] > 0 {
                        place[p][d] = global[d];
                        global[d] += cta_bins[p][d];
                    }
                }
            }
            let mut start = vec![0u32; 2048]; // keys in the bins above d
            for d in (0..2047).rev() {
                start[d] = start[d + 1] + global[d + 1];
            }
            assert_eq!((start[sp.bin as usize], global[sp.bin as usize]), (sp.above, sp.cnt));
            let n = (sp.above + sp.cnt) as usize;
            let mut seen = vec![false; n];
            for p in 0..chunks {
                let mut local = vec![0u32; 2048];
                for &x in &row[(p * per).min(len)..((p + 1) * per).min(len)] {
                    let kx = key(x);
                    if kx >= sp.s_lo && bin_of(kx) >= sp.bin as usize {
                        let d = bin_of(kx);
                        let pos = (start[d] + place[p][d] + local[d]) as usize;
                        local[d] += 1;
                        assert!(pos < n && !seen[pos], "{len}: place {pos} of {n} taken twice or out of range");
                        seen[pos] = true;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "{len}: a list entry left unwritten");
        }
    }

    /// The grid sampled pass resolves normal rows to a crossing bin of at
    /// most GRID_SMALL keys (so the row needs no further pass), decides the
    /// key of a plateau's k-th (one key a bin: only column passes follow),
    /// and the two trap families make it fall back (so `flashsel check`
    /// runs the exact passes after it).
    #[test]
    fn grid_sample_resolves_normal_rows_and_the_traps_fall_back() {
        let mut rng = Rng::new(21);
        for dtype in [DType::F32, DType::BF16] {
            for (len, k) in [(1usize << 20, 2048usize), (262_144, 512)] {
                for _ in 0..4 {
                    let row = generate(Data::Normal, len, &mut rng);
                    let cnt = grid_sampled_pass(&row, k, dtype, None).map(|p| (p.cnt, p.shift));
                    assert!(
                        cnt.is_some_and(|(c, _)| c as u64 <= flashsel::plan::GRID_SMALL),
                        "{dtype:?} {len} k{k}: {cnt:?}"
                    );
                }
                let few = generate(Data::ReluFew, len, &mut rng);
                let zeros = few.iter().filter(|&&x| x == 0.0).count() as u32;
                assert_eq!(
                    grid_sampled_pass(&few, k, dtype, None).map(|p| (p.cnt, p.shift)),
                    Some((zeros, 0)),
                    "ReluFew {dtype:?} {len} k{k}"
                );
                let equal = generate(Data::AllEqual, len, &mut rng);
                assert_eq!(
                    grid_sampled_pass(&equal, k, dtype, None).map(|p| (p.cnt, p.shift)),
                    Some((len as u32, 0)),
                    "AllEqual {dtype:?} {len} k{k}"
                );
            }
            // The check suite's trap cases.
            let high = generate(Data::GridSampleHigh { len: 1 << 20 }, 1 << 20, &mut rng);
            assert_eq!(grid_sampled_pass(&high, 4096, dtype, None), None, "{dtype:?}");
            let high = generate(Data::GridSampleHigh { len: 262_144 }, 262_144, &mut rng);
            assert_eq!(grid_sampled_pass(&high, 2048, dtype, None), None, "{dtype:?}");
            for (len, k) in [(1usize << 20, 2048usize), (262_144, 512)] {
                let low = generate(Data::GridSampleLow { len }, len, &mut rng);
                assert_eq!(grid_sampled_pass(&low, k, dtype, None), None, "GridSampleLow {dtype:?} {len} k{k}");
            }
        }
    }
}
