//! The CPU engine against the contract's reference, bit for bit: property tests
//! over adversarial inputs, explicit cases for each category, the within-row
//! split, and the error paths.

use super::{self as cpu, ChunkPlan, Simd, Tuning};
use crate::contract::{DType, Error, NanPolicy, ScoreElem, ScoresView};
use crate::data::Rng;
use crate::ops::select::{reference_select, OutputOrder, SelectSpec};
use half::{bf16, f16};
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Data generation
// ---------------------------------------------------------------------------

/// A score type the tests can build from raw bits.
trait Elem: ScoreElem {
    fn from_bits(b: u32) -> Self;
    /// (sign, exponent field, mantissa field)
    const FIELDS: (u32, u32, u32);
}

impl Elem for f32 {
    fn from_bits(b: u32) -> Self {
        f32::from_bits(b)
    }
    const FIELDS: (u32, u32, u32) = (0x8000_0000, 0x7f80_0000, 0x007f_ffff);
}

impl Elem for bf16 {
    fn from_bits(b: u32) -> Self {
        bf16::from_bits(b as u16)
    }
    const FIELDS: (u32, u32, u32) = (0x8000, 0x7f80, 0x007f);
}

impl Elem for f16 {
    fn from_bits(b: u32) -> Self {
        f16::from_bits(b as u16)
    }
    const FIELDS: (u32, u32, u32) = (0x8000, 0x7c00, 0x03ff);
}

/// Bit patterns that stress the key mapping: both zeros, both infinities, NaNs
/// of several payloads and both signs, denormals, the extreme finite values.
fn specials<T: Elem>() -> Vec<T> {
    let (s, e, m) = T::FIELDS;
    let top = (m + 1) >> 1; // quiet bit
    [
        0,
        s,
        e,
        s | e,
        e | top,
        e | 1,
        s | e | m,
        s | e | top | 1,
        1,
        s | 1,
        m,
        s | m,
        e - 1,       // largest finite
        s | (e - 1), // most negative finite
        m + 1,       // smallest normal
        s | (m + 1),
    ]
    .into_iter()
    .map(T::from_bits)
    .collect()
}

/// The adversarial categories.
const MODES: u8 = 11;

fn mode_name(mode: u8) -> &'static str {
    [
        "random",
        "relu",
        "all-equal",
        "nan-every-fifth",
        "specials",
        "plateaus",
        "ascending",
        "descending",
        "raw-bits",
        "zeros-of-both-signs",
        "denormals",
    ][mode as usize]
}

/// `n` elements of category `mode`.
fn gen<T: Elem>(mode: u8, n: usize, rng: &mut Rng) -> Vec<T> {
    let (sign, _, man) = T::FIELDS;
    let sp = specials::<T>();
    let all_equal = if rng.below(3) == 0 { sp[rng.below(sp.len() as u64) as usize] } else { T::from_f32(rng.normal()) };
    (0..n)
        .map(|i| match mode {
            0 => T::from_f32(rng.normal()),
            1 => T::from_f32(rng.normal().max(0.0)),
            2 => all_equal,
            3 => {
                if i % 5 == 0 {
                    sp[[4, 5, 6, 7][i / 5 % 4]]
                } else {
                    T::from_f32(rng.normal())
                }
            }
            4 => {
                if rng.below(2) == 0 {
                    sp[rng.below(sp.len() as u64) as usize]
                } else {
                    T::from_f32(rng.normal())
                }
            }
            5 => T::from_f32([-1.0, 0.0, 1.0, 2.0][rng.below(4) as usize]),
            6 => T::from_f32(i as f32 * 0.25 - 8.0),
            7 => T::from_f32(8.0 - i as f32 * 0.25),
            8 => T::from_bits(rng.next_u64() as u32 & (sign | (sign - 1))),
            9 => T::from_bits(if rng.below(2) == 0 { 0 } else { sign }),
            _ => T::from_bits((rng.below(man as u64) as u32 + 1) | if rng.below(2) == 0 { 0 } else { sign }),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Checking
// ---------------------------------------------------------------------------

/// The tunings every case is run under, so that every instruction set of the
/// threshold test runs the whole engine (the default takes the widest this CPU
/// has):
/// - the default;
/// - tiny: buffer of `k + 1`, the within-row split and the sampled start forced
///   on short rows with samples too few to trust (so the fallback runs),
///   portable masks (compaction after nearly every push: short rows only);
/// - medium: AVX2 masks, small buffers, split from 16 elements;
/// - sse2: SSE2 masks, buffers of `k + 64`, split from 5000 elements.
fn tunings() -> [Tuning; 4] {
    [
        Tuning::default(),
        Tuning {
            threads: 3,
            split_min_len: 0,
            min_chunk: 1,
            chunk_k_factor: 1,
            chunks_per_thread: 2,
            buf_factor: 1,
            tile: 1,
            samples: 4,
            sample_min_len: 0,
            sample_k_factor: 2,
            simd: Simd::Portable,
        },
        Tuning {
            threads: 2,
            split_min_len: 16,
            min_chunk: 16,
            chunk_k_factor: 2,
            chunks_per_thread: 3,
            buf_factor: 2,
            tile: 7,
            samples: 24,
            sample_min_len: 40,
            sample_k_factor: 4,
            simd: Simd::Avx2,
        },
        Tuning {
            threads: 2,
            split_min_len: 5000,
            min_chunk: 2000,
            chunk_k_factor: 1,
            chunks_per_thread: 2,
            buf_factor: 1,
            tile: 64,
            samples: 64,
            sample_min_len: 0,
            sample_k_factor: 4,
            simd: Simd::Sse2,
        },
    ]
}

/// The tunings fit for rows of thousands (all but the tiny buffer).
fn long_row_tunings() -> Vec<Tuning> {
    let t = tunings();
    vec![t[0], t[2], t[3]]
}

#[derive(Debug, Clone)]
struct Case<T> {
    data: Vec<T>,
    rows: usize,
    cols: usize,
    stride: usize,
    k: usize,
    lengths: Option<Vec<i32>>,
}

impl<T: Elem> Case<T> {
    fn spec(&self, order: OutputOrder, nan: NanPolicy) -> SelectSpec {
        SelectSpec::new(self.rows, self.cols, self.k, T::DTYPE).with_stride(self.stride).with_order(order).with_nan(nan)
    }

    /// Every engine entry point under every order, NaN policy and tuning must
    /// return the reference's bytes.
    fn check(&self) {
        self.check_with(&tunings());
    }

    fn check_with(&self, tunings: &[Tuning]) {
        let view = ScoresView::with_stride(&self.data, self.rows, self.cols, self.stride).unwrap();
        let lengths = self.lengths.as_deref();
        for order in [OutputOrder::Score, OutputOrder::Index] {
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                let spec = self.spec(order, nan);
                let ctx = || format!("{} {spec:?} lengths={lengths:?}", T::DTYPE.name());
                let want = reference_select(&view, &spec, lengths).unwrap();
                let want_bits: Vec<u32> = want.values.iter().map(|v| v.bits()).collect();

                let got = cpu::select(&view, &spec, lengths).unwrap();
                assert_eq!(got.rows, want.rows, "{}", ctx());
                assert_eq!(got.k, want.k, "{}", ctx());
                assert_eq!(got.indices, want.indices, "select indices: {}", ctx());
                let got_bits: Vec<u32> = got.values.iter().map(|v| v.bits()).collect();
                assert_eq!(got_bits, want_bits, "select value bits: {}", ctx());

                let n = self.rows * self.k;
                for &tuning in tunings {
                    // Garbage in the outputs: every element must be written.
                    let mut idx = vec![0x5a5a_5a5a_i32; n];
                    let mut val = vec![T::from_bits(1); n];
                    cpu::select_into_tuned(&view, &spec, lengths, &mut idx, Some(&mut val), &tuning).unwrap();
                    assert_eq!(idx, want.indices, "select_into indices: {} {tuning:?}", ctx());
                    let bits: Vec<u32> = val.iter().map(|v| v.bits()).collect();
                    assert_eq!(bits, want_bits, "select_into value bits: {} {tuning:?}", ctx());

                    let mut idx = vec![7i32; n];
                    cpu::select_into_tuned(&view, &spec, lengths, &mut idx, None, &tuning).unwrap();
                    assert_eq!(idx, want.indices, "select_into (no values): {} {tuning:?}", ctx());
                }
                let mut idx = vec![7i32; n];
                cpu::select_into(&view, &spec, lengths, &mut idx, None).unwrap();
                assert_eq!(idx, want.indices, "select_into: {}", ctx());
            }
        }
    }
}

/// Lengths of interest for a row of `cols` with `k`.
fn length_of(choice: u8, cols: usize, k: usize, rng: &mut Rng) -> i32 {
    let l = match choice {
        0 => 0,
        1 => 1,
        2 => k.saturating_sub(1),
        3 => k,
        4 => k + 1,
        5 => cols,
        _ => rng.below(cols as u64 + 1) as usize,
    };
    l.min(cols) as i32
}

/// Builds a case; the gap between rows (`stride > cols`) is filled with values
/// that would win if they were ever read.
#[allow(clippy::too_many_arguments)]
fn build<T: Elem>(
    mode: u8,
    rows: usize,
    cols: usize,
    gap: usize,
    k: usize,
    lengths: Option<&[u8]>,
    seed: u64,
) -> Case<T> {
    let mut rng = Rng::new(seed);
    let stride = cols + gap;
    let mut data = Vec::new();
    for r in 0..rows {
        data.extend(gen::<T>(mode, cols, &mut rng));
        if r + 1 < rows {
            let (_, e, m) = T::FIELDS;
            data.extend((0..gap).map(|i| T::from_bits(if i % 2 == 0 { e } else { e | m })));
        }
    }
    let lengths = lengths.map(|ch| (0..rows).map(|r| length_of(ch[r % ch.len()], cols, k, &mut rng)).collect());
    Case { data, rows, cols, stride, k, lengths }
}

/// k choices: 1, k = cols, k > cols, and anything in between.
fn k_of(choice: u8, cols: usize, rng_k: usize) -> usize {
    match choice {
        0 => 1,
        1 => cols.max(1),
        2 => cols + 1 + rng_k % 5,
        3 => (cols / 2).max(1),
        _ => 1 + rng_k % (cols + 2),
    }
}

// ---------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------

fn case_params() -> impl Strategy<Value = (u8, usize, usize, usize, u8, usize, Option<Vec<u8>>, u64)> {
    (
        0..MODES,
        0usize..=4,                                                     // rows
        prop_oneof![Just(0usize), Just(1), 2usize..=40, 41usize..=300], // cols
        prop_oneof![Just(0usize), 1usize..=5],                          // stride - cols
        0u8..5,                                                         // k choice
        any::<usize>(),
        proptest::option::of(proptest::collection::vec(0u8..7, 1..=4)),
        any::<u64>(),
    )
}

fn run_case<T: Elem>(p: &(u8, usize, usize, usize, u8, usize, Option<Vec<u8>>, u64)) {
    let (mode, rows, cols, gap, kc, rk, lengths, seed) = p;
    let k = k_of(*kc, *cols, *rk);
    let case = build::<T>(*mode, *rows, *cols, *gap, k, lengths.as_deref(), *seed);
    case.check();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn prop_f32_matches_reference(p in case_params()) {
        run_case::<f32>(&p);
    }

    #[test]
    fn prop_bf16_matches_reference(p in case_params()) {
        run_case::<bf16>(&p);
    }

    #[test]
    fn prop_f16_matches_reference(p in case_params()) {
        run_case::<f16>(&p);
    }

    /// Rows long enough that the tiny and medium tunings split them into many
    /// chunks and merge (the default tuning only splits from 64 Ki).
    #[test]
    fn prop_split_rows_match_reference(mode in 0..MODES, cols in 200usize..1500, kc in 0u8..5, rk in any::<usize>(), seed in any::<u64>()) {
        let k = k_of(kc, cols, rk);
        let case = build::<f32>(mode, 1, cols, 0, k, None, seed);
        let tiny = tunings()[1];
        prop_assert!(k * 2 > cols || tiny.row_plan(1, cols, k).chunks > 1);
        case.check();
    }
}

fn run_long_case<T: Elem>(mode: u8, rows: usize, cols: usize, gap: usize, k: usize, seed: u64) {
    build::<T>(mode, rows, cols, gap, k, Some(&[5, 6, 3][..rows.min(3)]), seed).check_with(&long_row_tunings());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Rows of several 4096-element tiles: the SIMD masks, the position lists
    /// and the sampled start on every category, with k small, middling and
    /// beyond the row.
    #[test]
    fn prop_long_rows_match_reference(
        dtype in 0u8..3,
        mode in 0..MODES,
        rows in 1usize..=2,
        cols in 4096usize..14_000,
        gap in 0usize..3,
        kc in 0u8..4,
        rk in any::<usize>(),
        seed in any::<u64>(),
    ) {
        let k = match kc {
            0 => 1 + rk % 8,
            1 => 1 + rk % 300,
            2 => 1 + rk % (cols / 3),
            _ => cols + 1 - rk % 3,
        };
        match dtype {
            0 => run_long_case::<f32>(mode, rows, cols, gap, k, seed),
            1 => run_long_case::<bf16>(mode, rows, cols, gap, k, seed),
            _ => run_long_case::<f16>(mode, rows, cols, gap, k, seed),
        }
    }
}

// ---------------------------------------------------------------------------
// Explicit cases, one per category
// ---------------------------------------------------------------------------

fn every_category<T: Elem>() {
    for mode in 0..MODES {
        for &(rows, cols, gap) in &[(3usize, 97usize, 3usize), (1, 1, 0), (2, 300, 0)] {
            for k in [1, cols.saturating_sub(1).max(1), cols, cols + 1, 40] {
                for lengths in [None, Some(&[0u8, 1, 2, 3, 4, 5, 6][..])] {
                    let case = build::<T>(mode, rows, cols, gap, k, lengths, 0xc0ffee + mode as u64);
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case.check()))
                        .unwrap_or_else(|_| panic!("category {} rows={rows} cols={cols} k={k}", mode_name(mode)));
                }
            }
        }
    }
}

#[test]
fn categories_f32() {
    every_category::<f32>();
}

#[test]
fn categories_bf16() {
    every_category::<bf16>();
}

#[test]
fn categories_f16() {
    every_category::<f16>();
}

#[test]
fn contract_worked_example() {
    let data = [0.5f32, 2.0, -1.0, 2.0, f32::NAN, 0.0, -0.0];
    let v = ScoresView::new(&data, 1, 7).unwrap();
    let spec = v.spec(4);
    assert_eq!(cpu::select(&v, &spec, None).unwrap().indices, vec![1, 3, 0, 5]);
    assert_eq!(cpu::select(&v, &spec.with_order(OutputOrder::Index), None).unwrap().indices, vec![0, 1, 3, 5]);
    assert_eq!(cpu::select(&v, &spec.with_nan(NanPolicy::Largest), None).unwrap().indices, vec![4, 1, 3, 0]);
    let s = cpu::select(&v, &spec, Some(&[2])).unwrap();
    assert_eq!(s.indices, vec![1, 0, -1, -1]);
    assert_eq!(s.values[..2], [2.0, 0.5]);
    assert!(s.values[2..].iter().all(|x| *x == f32::NEG_INFINITY));
}

#[test]
fn zero_signs_tie_by_column_and_keep_their_bits() {
    // -0.0 and +0.0 are one key: the lower column wins, and the value written is
    // the element's own bits.
    let data = [-0.0f32, 0.0, -0.0, -1.0];
    let v = ScoresView::new(&data, 1, 4).unwrap();
    let s = cpu::select(&v, &v.spec(2), None).unwrap();
    assert_eq!(s.indices, vec![0, 1]);
    assert_eq!(s.values[0].to_bits(), 0x8000_0000);
    assert_eq!(s.values[1].to_bits(), 0);
}

#[test]
fn nan_payloads_are_one_key_and_keep_their_bits() {
    let nans = [0x7fc0_0000u32, 0xffc0_0001, 0x7f80_0001, 0xffff_ffff];
    let data: Vec<f32> = nans.iter().map(|&b| f32::from_bits(b)).chain([1.0, f32::INFINITY]).collect();
    let v = ScoresView::new(&data, 1, 6).unwrap();
    let s = cpu::select(&v, &v.spec(6).with_nan(NanPolicy::Largest), None).unwrap();
    assert_eq!(s.indices, vec![0, 1, 2, 3, 5, 4]);
    let bits: Vec<u32> = s.values[..4].iter().map(|x| x.to_bits()).collect();
    assert_eq!(bits, nans);
    let s = cpu::select(&v, &v.spec(3), None).unwrap();
    assert_eq!(s.indices, vec![5, 4, 0]);
}

#[test]
fn long_rows_of_nan_and_infinities() {
    // The k-th best is NaN under `Lowest` (every non-NaN passes: the masks are
    // skipped) or nothing can beat it (NaN under `Largest`, +inf under
    // `Lowest`: the scan stops early).
    let cols = 10_000;
    let nan = f32::from_bits(0xffc0_0001);
    let rows: Vec<Vec<f32>> = vec![
        vec![nan; cols],
        (0..cols).map(|i| if i % 97 == 0 { i as f32 } else { nan }).collect(),
        vec![f32::INFINITY; cols],
        (0..cols).map(|i| if i % 3 == 0 { f32::INFINITY } else { f32::NEG_INFINITY }).collect(),
        (0..cols).map(|i| if i % 5 == 0 { nan } else { f32::INFINITY }).collect(),
    ];
    for data in rows {
        for k in [1, 50, 200, 3000] {
            Case { data: data.clone(), rows: 1, cols, stride: cols, k, lengths: None }.check_with(&long_row_tunings());
        }
    }
}

#[test]
fn k_far_beyond_the_row_pads() {
    let data = [3.0f32, 1.0, 2.0];
    let v = ScoresView::new(&data, 1, 3).unwrap();
    let k = 100_000;
    let s = cpu::select(&v, &v.spec(k), None).unwrap();
    assert_eq!(&s.indices[..4], &[0, 2, 1, -1]);
    assert!(s.indices[3..].iter().all(|&i| i == -1));
    assert!(s.values[3..].iter().all(|x| *x == f32::NEG_INFINITY));
    // Lengths beyond k's reach: padding, not an error.
    let s = cpu::select(&v, &v.spec(5), Some(&[1])).unwrap();
    assert_eq!(s.indices, vec![0, -1, -1, -1, -1]);
}

#[test]
fn empty_shapes() {
    let data: [f32; 0] = [];
    for (rows, cols) in [(0, 0), (0, 5), (3, 0)] {
        let v = ScoresView::new(&data, rows, cols).unwrap();
        let spec = v.spec(4);
        let s = cpu::select(&v, &spec, None).unwrap();
        assert_eq!(s, reference_select(&v, &spec, None).unwrap());
        assert_eq!(s.indices.len(), rows * 4);
        assert!(s.indices.iter().all(|&i| i == -1));
    }
}

#[test]
fn ascending_and_descending_long_rows() {
    // Ascending input pushes every element (the buffer compacts over and over);
    // descending input pushes none after the fill.
    for mode in [6u8, 7] {
        for k in [1, 33, 1000, 4095, 4096, 4097] {
            // Not the tiny tuning: a buffer of k + 1 makes ascending input O(n k).
            build::<f32>(mode, 2, 9000, 1, k, None, 1).check_with(&long_row_tunings());
        }
    }
}

// ---------------------------------------------------------------------------
// The within-row split
// ---------------------------------------------------------------------------

#[test]
fn chunk_plan_is_a_pure_function() {
    let t = Tuning::default();
    // The benchmark geometries.
    assert_eq!(t.chunk_plan(1 << 20, 2048, 2).chunks, 2);
    assert_eq!(t.chunk_plan(131_072, 2048, 1).chunks, 1);
    // Short rows, one thread, or k too large for chunks to pay: no split.
    assert_eq!(t.chunk_plan(65_535, 1, 8).chunks, 1);
    assert_eq!(t.chunk_plan(1 << 20, 1, 1).chunks, 1);
    assert_eq!(t.chunk_plan(1 << 20, 1 << 20, 8).chunks, 1);
    assert_eq!(t.chunk_plan(0, 1, 8).chunks, 1);
    // Bounded by threads * chunks_per_thread, and by len / max(min_chunk, 8k).
    assert_eq!(t.chunk_plan(1 << 20, 1, 3).chunks, 3);
    assert_eq!(t.chunk_plan(1 << 17, 1, 64).chunks, 8);
    assert_eq!(t.chunk_plan(1 << 20, 1 << 14, 64).chunks, 8);
    // Rows share the pool.
    let t4 = Tuning { threads: 4, ..t };
    assert_eq!(t4.threads_per_row(1), 4);
    assert_eq!(t4.threads_per_row(3), 1);
    assert_eq!(t4.threads_per_row(64), 1);
    assert_eq!(t4.row_plan(1, 1 << 20, 2048).chunks, 4);
    assert_eq!(t4.row_plan(2, 1 << 20, 2048).chunks, 2);
    assert_eq!(t4.row_plan(64, 1 << 20, 2048).chunks, 1);
    // Ranges tile 0..len exactly, in order, none empty when chunks <= len.
    for len in [0usize, 1, 7, 100, 1 << 20, 1_000_003] {
        for chunks in 1..=9 {
            let p = ChunkPlan { len, chunks };
            let mut at = 0;
            for i in 0..chunks {
                let r = p.range(i);
                assert_eq!(r.start, at);
                assert!(r.end >= r.start);
                assert!(chunks > len || !r.is_empty());
                at = r.end;
            }
            assert_eq!(at, len);
        }
    }
}

#[test]
fn long_row_takes_the_split_path_and_matches() {
    // 1 row of 200 000 with 4 threads: the default tuning splits it into 2 to 4
    // chunks (asserted through the plan the engine uses), each chunk's top-k is
    // merged and pruned.
    let cols = 200_000;
    for (mode, k) in [(0u8, 64usize), (5, 3000), (3, 1), (1, 12_000)] {
        let case = build::<f32>(mode, 1, cols, 0, k, None, 42);
        let t4 = Tuning { threads: 4, ..Tuning::default() };
        let plan = t4.row_plan(1, cols, k);
        assert!(plan.chunks > 1, "k={k}: {plan:?}");
        let view = ScoresView::new(&case.data, 1, cols).unwrap();
        for order in [OutputOrder::Score, OutputOrder::Index] {
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                let spec = case.spec(order, nan);
                let want = reference_select(&view, &spec, None).unwrap();
                let mut idx = vec![0; k];
                let mut val = vec![0.0f32; k];
                cpu::select_into_tuned(&view, &spec, None, &mut idx, Some(&mut val), &t4).unwrap();
                assert_eq!(idx, want.indices, "mode {} k={k} {order:?} {nan:?}", mode_name(mode));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&val), bits(&want.values));
                // And through the public entry point on a 4-thread pool.
                let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
                let got = pool.install(|| cpu::select(&view, &spec, None)).unwrap();
                assert_eq!(got.indices, want.indices);
                assert_eq!(bits(&got.values), bits(&want.values));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

#[test]
fn errors_are_typed_and_never_panic() {
    let data = [1.0f32; 12];
    let v = ScoresView::new(&data, 3, 4).unwrap();
    let sel = |spec: &SelectSpec, lengths: Option<&[i32]>| cpu::select(&v, spec, lengths).map(|_| ());

    assert_eq!(sel(&v.spec(0), None), Err(Error::ZeroK));
    assert!(matches!(sel(&v.spec(2), Some(&[1, 2])), Err(Error::LengthsCount { got: 2, rows: 3 })));
    assert!(matches!(sel(&v.spec(2), Some(&[1, 2, 3, 4])), Err(Error::LengthsCount { got: 4, rows: 3 })));
    assert!(matches!(sel(&v.spec(2), Some(&[1, 5, 0])), Err(Error::LengthOutOfRange { row: 1, len: 5, cols: 4 })));
    assert!(matches!(sel(&v.spec(2), Some(&[0, 0, -1])), Err(Error::LengthOutOfRange { row: 2, len: -1, .. })));
    assert!(matches!(sel(&v.spec(2), Some(&[i32::MIN, 0, 0])), Err(Error::LengthOutOfRange { .. })));
    // k beyond i32, rows * k beyond i32.
    assert!(matches!(sel(&v.spec(1 << 31), None), Err(Error::TooLarge { what: "k", .. })));
    assert!(matches!(sel(&v.spec(1 << 30), None), Err(Error::TooLarge { what: "rows * k", .. })));
    // The spec and the data disagree.
    assert!(matches!(sel(&SelectSpec::new(3, 4, 2, DType::BF16), None), Err(Error::UnknownDType(_))));
    assert!(matches!(sel(&SelectSpec::new(2, 4, 2, DType::F32), None), Err(Error::Shape(_))));
    assert!(matches!(sel(&v.spec(2).with_stride(5), None), Err(Error::Shape(_))));
    assert!(matches!(sel(&v.spec(2).with_stride(3), None), Err(Error::StrideTooShort { stride: 3, cols: 4 })));
    // Short score buffers are refused when the view is made.
    assert!(matches!(ScoresView::new(&data, 4, 4), Err(Error::BufferSize { what: "scores", got: 12, need: 16 })));
    assert!(matches!(ScoresView::with_stride(&data, 3, 4, 5), Err(Error::BufferSize { .. })));
    assert!(matches!(ScoresView::with_stride(&data, 2, 4, 3), Err(Error::StrideTooShort { .. })));
    assert!(matches!(ScoresView::with_stride(&data, 3, 4, usize::MAX), Err(Error::Shape(_))));
}

#[test]
fn output_buffers_must_be_exactly_rows_times_k() {
    let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let v = ScoresView::new(&data, 2, 3).unwrap();
    let spec = v.spec(2);
    for n in [0usize, 3, 5] {
        let mut idx = vec![0; n];
        assert_eq!(
            cpu::select_into(&v, &spec, None, &mut idx, None),
            Err(Error::BufferSize { what: "out_indices", got: n, need: 4 })
        );
        let mut idx = vec![0; 4];
        let mut val = vec![0.0f32; n];
        assert_eq!(
            cpu::select_into(&v, &spec, None, &mut idx, Some(&mut val)),
            Err(Error::BufferSize { what: "out_values", got: n, need: 4 })
        );
    }
    // Validation of the request comes first.
    let mut idx = vec![0; 1];
    assert_eq!(cpu::select_into(&v, &v.spec(0), None, &mut idx, None), Err(Error::ZeroK));
    // Right sizes work.
    let mut idx = vec![0; 4];
    let mut val = vec![0.0f32; 4];
    cpu::select_into(&v, &spec, None, &mut idx, Some(&mut val)).unwrap();
    assert_eq!(idx, vec![2, 1, 2, 1]);
    assert_eq!(val, vec![3.0, 2.0, 6.0, 5.0]);
}

/// Per-row ranges (DSA's ks/ke): the engine returns the reference's bytes,
/// indices stay absolute, every row family and both orders, short and long
/// ranges (a 4-thread pool splits the long ones inside their range).
#[test]
fn ranges_match_the_reference_and_keep_absolute_columns() {
    let (rows, cols) = (9, 150_000);
    let mut rng = Rng::new(77);
    let data: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
    let view = ScoresView::new(&data, rows, cols).unwrap();
    // Empty, one column, shorter than k, the diagonal excluded (end = t),
    // a long range from the middle, the whole row, a range ending at cols.
    let starts = [0, 5, 10, 0, 70_000, 0, 149_000, 3, 1000];
    let ends = [0, 6, 100, 4095, 150_000, 150_000, 150_000, 133_333, 140_000];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
    for k in [1usize, 64, 2048] {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                let spec = SelectSpec::new(rows, cols, k, DType::F32).with_order(order).with_nan(nan);
                let want =
                    crate::ops::select::reference_select_ranges(&view, &spec, Some(&starts), Some(&ends)).unwrap();
                let got = pool.install(|| cpu::select_ranges(&view, &spec, &starts, Some(&ends))).unwrap();
                assert_eq!(got.indices, want.indices, "k {k} {order:?} {nan:?}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.values), bits(&want.values));
                for r in 0..rows {
                    let row = got.row_indices(r);
                    let n = crate::contract::padded::valid_len(row);
                    assert_eq!(n, k.min((ends[r] - starts[r]) as usize), "row {r}");
                    assert!(row[..n].iter().all(|&c| c >= starts[r] && c < ends[r]), "row {r}: absolute, in range");
                }
            }
        }
    }
    // One row alone on the 4-thread pool: 80,000 candidates from column
    // 70,000 split into chunks inside the range (the plan says so).
    let one = ScoresView::new(view.row(4), 1, cols).unwrap();
    for k in [64usize, 2048] {
        assert!(Tuning { threads: 4, ..Tuning::default() }.row_plan(1, 80_000, k).chunks > 1);
        let spec = SelectSpec::new(1, cols, k, DType::F32);
        let want = crate::ops::select::reference_select_ranges(&one, &spec, Some(&[70_000]), None).unwrap();
        let got = pool.install(|| cpu::select_ranges(&one, &spec, &[70_000], None)).unwrap();
        assert_eq!(got, want, "k {k}");
    }
    // The buffer form writes the same bytes.
    let spec = SelectSpec::new(rows, cols, 64, DType::F32);
    let want = cpu::select_ranges(&view, &spec, &starts, Some(&ends)).unwrap();
    let (mut idx, mut val) = (vec![7; rows * 64], vec![7.0f32; rows * 64]);
    cpu::select_ranges_into(&view, &spec, &starts, Some(&ends), &mut idx, Some(&mut val)).unwrap();
    assert_eq!((idx, val), (want.indices, want.values));
    // Starts alone (ends = cols), and a start of 0 is plain select.
    let spec = SelectSpec::new(rows, cols, 16, DType::F32);
    let zero = cpu::select_ranges(&view, &spec, &[0; 9], None).unwrap();
    assert_eq!(zero, cpu::select(&view, &spec, None).unwrap());
    // Bad ranges are typed errors.
    let mut bad = starts;
    bad[2] = 101;
    assert!(matches!(cpu::select_ranges(&view, &spec, &bad, Some(&ends)), Err(Error::InvalidOption { .. })));
    bad[2] = -1;
    assert!(matches!(cpu::select_ranges(&view, &spec, &bad, Some(&ends)), Err(Error::InvalidOption { .. })));
    assert!(matches!(cpu::select_ranges(&view, &spec, &starts[..3], Some(&ends)), Err(Error::Shape(_))));
}
