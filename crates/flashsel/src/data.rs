//! Seeded test data: the one generator and the score families that the
//! tests, `flashsel check` and `flashsel bench` draw from.
//!
//! Families cover what real indexer scores look like (normal rows, ReLU
//! plateaus of exact zeros) and what breaks selection engines (ties
//! everywhere, NaN, infinities and signed zeros, denormals, ascending rows,
//! and rows built to defeat the samplers' bounds so the exact fallbacks run).

use rand::rngs::Xoshiro256PlusPlus;
use rand::{Rng as _, RngExt, SeedableRng};
use rand_distr::StandardNormal;
use rayon::prelude::*;

/// Input families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    Normal,
    /// ReLU plateaus: `max(0, x)`, half the row exactly 0.0.
    Relu,
    /// `max(0, x - 3)`: about 0.13% positive, so for most k the k-th score is
    /// one of a plateau of tied zeros (ties decided by column).
    ReluFew,
    AllEqual,
    /// NaN on every fifth element.
    Nan5,
    /// +/-inf sprinkled, -0.0 beside +0.0.
    InfZero,
    Denormal,
    /// Increasing: every element beats all before it (worst case for the filter).
    Ascending,
    /// A handful of distinct values: ties everywhere.
    FewValues,
    /// 1.0 on the first 256 elements of every `period` (where the samplers
    /// look when a row is 16 periods long), far lower elsewhere: the sampled
    /// bound admits too few elements and the exact fallback must run.
    SampleTrap {
        period: usize,
    },
    /// Normal, but 0.25 higher on the first 256 elements of every `period`
    /// (again where the samplers look): a 131,072-column row's 3-sigma
    /// bound for k 2048 then admits ~1,620 elements (too few), the rescue's
    /// 8-sigma bound ~2,400 (enough, most rows): the rescue path that
    /// succeeds, where SampleTrap defeats it too.
    SampleHot {
        period: usize,
    },
    /// Rows of `len`: 1.0 on the first two elements of each group the grid
    /// path's row sample reads (see [`in_grid_sample`]), `x - 10` elsewhere:
    /// at most 2,048 elements reach the sample's bound (1,024 where the f32
    /// and bf16 groups start together), so for k 4096 (k 2048 there) the
    /// sampled pass counts fewer than k and the exact passes must run.
    GridSampleHigh {
        len: usize,
    },
    /// Rows of `len`: normal, except that one element in 16 off the sample
    /// groups is `1e6 + x`: the k-th falls in the sampled pass's last bin
    /// (above the sample's range) and the exact passes must run.
    GridSampleLow {
        len: usize,
    },
}

/// Whether column `pos` of a row of `len` is one of the first `first`
/// elements of a group the grid path's row sample reads
/// (`kernels/select/grid.cu`): thread t < 512 reads the 4 (f32) or 8 (16-bit)
/// elements at `t * len / 512` rounded down to the group; both widths count.
pub fn in_grid_sample(pos: usize, len: usize, first: usize) -> bool {
    let t0 = pos * 512 / len.max(1);
    (t0.saturating_sub(1)..=t0 + 1).filter(|&t| t < 512).any(|t| {
        [4usize, 8].iter().any(|&v| {
            let e0 = (t * len / 512) & !(v - 1);
            pos >= e0 && pos < e0 + first.min(v)
        })
    })
}

pub const ALL_DATA: [Data; 9] = [
    Data::Normal,
    Data::Relu,
    Data::ReluFew,
    Data::AllEqual,
    Data::Nan5,
    Data::InfZero,
    Data::Denormal,
    Data::Ascending,
    Data::FewValues,
];

/// splitmix64: one step of the seed sequence (also a good hash of a seed).
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seeded generator of every test, check and benchmark: xoshiro256++
/// seeded through splitmix64. The same seed gives the same numbers on every
/// machine.
pub struct Rng(Xoshiro256PlusPlus);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self::stream(seed, 0)
    }
    /// An independent generator for part `stream` of the data of `seed`
    /// (parts generated in parallel do not depend on the thread count).
    pub fn stream(seed: u64, stream: u64) -> Self {
        let mut st = seed ^ stream.wrapping_mul(0xa24b_aed4_963e_e407);
        Self(Xoshiro256PlusPlus::seed_from_u64(splitmix64(&mut st)))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal.
    pub fn normal(&mut self) -> f32 {
        self.0.sample(StandardNormal)
    }
    /// Uniform in 0..n (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// `n` standard-normal scores of `seed`, part `stream`: 64 Ki-element chunks,
/// each from its own generator, filled in parallel.
pub fn normal_scores(n: usize, seed: u64, stream: u64) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut v = vec![0f32; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = Rng::stream(seed ^ (i as u64).wrapping_mul(0x9fb2_1c65_1e98_df25), stream);
        chunk.iter_mut().for_each(|x| *x = rng.normal());
    });
    v
}

/// Fills `n` scores of family `d`.
pub fn generate(d: Data, n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| match d {
            Data::Normal => rng.normal(),
            Data::Relu => rng.normal().max(0.0),
            Data::ReluFew => (rng.normal() - 3.0).max(0.0),
            Data::AllEqual => 1.5,
            Data::Nan5 => {
                if i % 5 == 0 {
                    f32::from_bits(0x7fc0_0000 | (rng.next_u64() as u32 & 0x3f_ffff) | ((i as u32 & 1) << 31))
                } else {
                    rng.normal()
                }
            }
            Data::InfZero => match rng.below(8) {
                0 => f32::INFINITY,
                1 => f32::NEG_INFINITY,
                2 => -0.0,
                3 => 0.0,
                _ => rng.normal(),
            },
            Data::Denormal => f32::from_bits((rng.next_u64() as u32 & 0x007f_ffff) | ((rng.below(2) as u32) << 31)),
            Data::Ascending => i as f32,
            Data::FewValues => (rng.below(4) as f32) * 0.5,
            Data::SampleTrap { period } => {
                if i % period < 256 {
                    1.0
                } else {
                    rng.normal() - 10.0
                }
            }
            Data::SampleHot { period } => rng.normal() + if i % period < 256 { 0.25 } else { 0.0 },
            Data::GridSampleHigh { len } => {
                if in_grid_sample(i % len, len, 2) {
                    1.0
                } else {
                    rng.normal() - 10.0
                }
            }
            Data::GridSampleLow { len } => {
                let x = rng.normal();
                if i % 16 == 5 && !in_grid_sample(i % len, len, 8) {
                    1e6 + x
                } else {
                    x
                }
            }
        })
        .collect()
}

/// `n` scores of family `d` from `seed`: parts of 2^20 elements, each from
/// its own [`Rng::stream`], generated in parallel; `Ascending` counts up over
/// the whole buffer. The same seed gives the same scores everywhere.
pub fn generate_seeded(d: Data, n: usize, seed: u64) -> Vec<f32> {
    const PART: usize = 1 << 20;
    let parts: Vec<Vec<f32>> = (0..n.div_ceil(PART))
        .into_par_iter()
        .map(|i| {
            let mut r = Rng::stream(seed, i as u64);
            let mut v = generate(d, PART.min(n - i * PART), &mut r);
            if d == Data::Ascending {
                v.iter_mut().enumerate().for_each(|(j, x)| *x = (i * PART + j) as f32);
            }
            v
        })
        .collect();
    parts.concat()
}

/// A page table for tests and checks: `sequences x max_pages` distinct
/// physical pages, a random permutation of `0 .. sequences * max_pages`
/// (so every slot fits `i32` when that many pages of `page_size` do).
pub fn page_table(rng: &mut Rng, sequences: usize, max_pages: usize) -> Vec<i32> {
    let n = sequences * max_pages;
    let mut t: Vec<i32> = (0..n as i32).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        t.swap(i, j);
    }
    t
}
