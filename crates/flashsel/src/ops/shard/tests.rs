//! The merge of simulated ranks against the single-device engine and the
//! reference on the whole row, byte for byte: every data family, rank counts
//! 1 to 16, even, uneven and empty shards, shards shorter than k, k beyond
//! the row, ties, signed zeros and NaN across shard boundaries, both orders
//! and NaN policies, three dtypes, lengths and ranges, QSA with and without
//! pages; a seeded randomized loop; and the errors.

use half::{bf16, f16};

use super::*;
use crate::contract::{DType, NanPolicy, ScoreElem, ScoresView};
use crate::data::{generate, Data, Rng, ALL_DATA};
use crate::ops::qsa::{qsa_select, reference_qsa_select};
use crate::ops::select::{cpu, reference_select_ranges, OutputOrder, SelectSpec, Selection};

const RANKS: [usize; 7] = [1, 2, 3, 4, 7, 8, 16];
const ORDERS: [OutputOrder; 2] = [OutputOrder::Score, OutputOrder::Index];
const NANS: [NanPolicy; 2] = [NanPolicy::Lowest, NanPolicy::Largest];

fn bits<T: ScoreElem>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.bits()).collect()
}

/// Indices equal and values equal bit for bit.
#[track_caller]
fn assert_same<T: ScoreElem>(got: &Selection<T>, want: &Selection<T>, what: &str) {
    assert_eq!((got.rows, got.k), (want.rows, want.k), "{what}: shape");
    assert_eq!(got.indices, want.indices, "{what}: indices");
    assert_eq!(bits(&got.values), bits(&want.values), "{what}: value bits");
}

/// `rows x cols` scores in a buffer of row stride `stride`, `+inf` between
/// the rows (selected at once if ever read).
fn strided<T: ScoreElem>(raw: &[f32], rows: usize, cols: usize, stride: usize) -> Vec<T> {
    let mut buf = vec![T::from_f32(f32::INFINITY); rows.saturating_sub(1) * stride + cols];
    for r in 0..rows {
        for c in 0..cols {
            buf[r * stride + c] = T::from_f32(raw[r * cols + c]);
        }
    }
    buf
}

/// Rank `shard`'s own copy of its columns, with a wider stride (`+inf`
/// between rows).
fn local_copy<T: ScoreElem>(view: &ScoresView<'_, T>, shard: Shard, pad: usize) -> Vec<T> {
    let stride = shard.len + pad;
    let mut buf = vec![T::from_f32(f32::INFINITY); view.rows().saturating_sub(1) * stride + shard.len];
    for r in 0..view.rows() {
        buf[r * stride..r * stride + shard.len].copy_from_slice(&view.row(r)[shard.range()]);
    }
    buf
}

/// Layouts of `cols` columns over `ranks` ranks: even, random cuts (empty
/// shards where cuts coincide), all on one rank, one-column shards first,
/// and short shards (fewer than `k` columns) before a long one.
fn layouts(cols: usize, ranks: usize, k: usize, rng: &mut Rng) -> Vec<ShardLayout> {
    let mut out = vec![ShardLayout::even(cols, ranks).unwrap()];
    let mut cuts: Vec<usize> = (0..ranks - 1).map(|_| rng.below(cols as u64 + 1) as usize).collect();
    cuts.sort_unstable();
    cuts.insert(0, 0);
    cuts.push(cols);
    out.push(ShardLayout::from_lens(&cuts.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()).unwrap());
    if ranks > 1 {
        let mut lens = vec![0; ranks];
        lens[rng.below(ranks as u64) as usize] = cols;
        out.push(ShardLayout::from_lens(&lens).unwrap());
        let mut left = cols;
        let mut lens: Vec<usize> = (0..ranks - 1)
            .map(|_| {
                let l = left.min(1);
                left -= l;
                l
            })
            .collect();
        lens.push(left);
        out.push(ShardLayout::from_lens(&lens).unwrap());
        let mut left = cols;
        let mut lens: Vec<usize> = (0..ranks - 1)
            .map(|_| {
                let l = left.min(rng.below(k as u64) as usize);
                left -= l;
                l
            })
            .collect();
        lens.insert(rng.below(ranks as u64) as usize, left);
        out.push(ShardLayout::from_lens(&lens).unwrap());
    }
    out
}

/// One request, sharded by `layout`: the ranks' blocks (simulated from the
/// whole view and from each rank's own copy, which must agree), merged
/// (planes as gathered, reordered on the wire, into buffers with and without
/// values), against `cpu::select(_ranges)` and the reference on the whole rows.
#[allow(clippy::too_many_arguments)]
fn check<T: ScoreElem>(
    raw: &[f32],
    (rows, cols, k): (usize, usize, usize),
    order: OutputOrder,
    nan: NanPolicy,
    layout: &ShardLayout,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    what: &str,
) {
    let what = format!("{what} {} {order:?} {nan:?} k {k} layout {:?}", T::DTYPE, layout.shards());
    let stride = cols + (k % 3);
    let buf = strided::<T>(raw, rows, cols, stride);
    let view = ScoresView::with_stride(&buf, rows, cols, stride).unwrap();
    let spec = SelectSpec::new(rows, cols, k, T::DTYPE).with_stride(stride).with_order(order).with_nan(nan);
    let want = match starts {
        Some(s) => cpu::select_ranges(&view, &spec, s, ends),
        None => cpu::select(&view, &spec, ends),
    }
    .unwrap();
    assert_same(&want, &reference_select_ranges(&view, &spec, starts, ends).unwrap(), &format!("{what}: cpu vs ref"));

    let (ids, vals) = simulate_ranks(&view, &spec, layout, starts, ends).unwrap();
    let block = rows * k;
    for (rank, &shard) in layout.shards().iter().enumerate() {
        let pad = rank % 3;
        let own = local_copy(&view, shard, pad);
        let lview = ScoresView::with_stride(&own, rows, shard.len, shard.len + pad).unwrap();
        let mine = match starts {
            Some(s) => shard_select_ranges(&lview, &spec, layout, rank, s, ends),
            None => shard_select(&lview, &spec, layout, rank, ends),
        }
        .unwrap();
        let at = rank * block..(rank + 1) * block;
        assert_eq!(mine.indices, ids[at.clone()], "{what}: rank {rank}'s ids");
        assert_eq!(bits(&mine.values), bits(&vals[at]), "{what}: rank {rank}'s values");
    }

    let merge = |ids: &[i32], vals: &[T]| match starts {
        Some(s) => merge_candidates_ranges(ids, vals, &spec, layout, s, ends),
        None => merge_candidates(ids, vals, &spec, layout, ends),
    };
    assert_same(&merge(&ids, &vals).unwrap(), &want, &format!("{what}: merged"));

    // The wire's order within a block does not matter: each block's valid
    // entries reversed.
    let (mut rids, mut rvals) = (ids.clone(), vals.clone());
    for (bi, bv) in rids.chunks_mut(k).zip(rvals.chunks_mut(k)) {
        let n = padded::valid_len(bi);
        bi[..n].reverse();
        bv[..n].reverse();
    }
    assert_same(&merge(&rids, &rvals).unwrap(), &want, &format!("{what}: merged, reversed on the wire"));

    let mut idx = vec![7; rows * k];
    let mut val = vec![T::from_f32(3.0); rows * k];
    merge_candidates_into(&ids, &vals, &spec, layout, starts, ends, &mut idx, Some(&mut val)).unwrap();
    assert_eq!(idx, want.indices, "{what}: into");
    assert_eq!(bits(&val), bits(&want.values), "{what}: into values");
    let mut idx = vec![7; rows * k];
    merge_candidates_into(&ids, &vals, &spec, layout, starts, ends, &mut idx, None).unwrap();
    assert_eq!(idx, want.indices, "{what}: into, no values");
}

/// [`check`] in the three dtypes.
#[allow(clippy::too_many_arguments)]
fn check_all_types(
    raw: &[f32],
    shape: (usize, usize, usize),
    order: OutputOrder,
    nan: NanPolicy,
    layout: &ShardLayout,
    starts: Option<&[i32]>,
    ends: Option<&[i32]>,
    what: &str,
) {
    check::<f32>(raw, shape, order, nan, layout, starts, ends, what);
    check::<bf16>(raw, shape, order, nan, layout, starts, ends, what);
    check::<f16>(raw, shape, order, nan, layout, starts, ends, what);
}

#[test]
fn layouts_tile_the_row() {
    let l = ShardLayout::from_lens(&[3, 0, 5, 0]).unwrap();
    assert_eq!(l.ranks(), 4);
    assert_eq!(l.cols(), 8);
    assert_eq!(
        l.shards(),
        [
            Shard { offset: 0, len: 3 },
            Shard { offset: 3, len: 0 },
            Shard { offset: 3, len: 5 },
            Shard { offset: 8, len: 0 }
        ]
    );
    assert_eq!(l.shard(2).clip(1, 4), 3..4);
    assert_eq!(l.shard(2).clip(9, 9), 8..8);
    assert_eq!(l.shard(0).clip(5, 7), 3..3);
    let e = ShardLayout::even(10, 4).unwrap();
    assert_eq!(e.shards().iter().map(|s| s.len).collect::<Vec<_>>(), [2, 3, 2, 3]);
    assert_eq!(ShardLayout::even(0, 3).unwrap().cols(), 0);
    assert_eq!(ShardLayout::even(2, 5).unwrap().shards().iter().filter(|s| s.len == 0).count(), 3);
    for ranks in 1..20 {
        for cols in [0, 1, 7, 100, 1001] {
            let l = ShardLayout::even(cols, ranks).unwrap();
            assert_eq!(l.cols(), cols);
            assert!(l.shards().windows(2).all(|w| w[0].end() == w[1].offset));
        }
    }
}

#[test]
fn every_family_rank_count_and_layout_gives_the_single_device_bytes() {
    let mut rng = Rng::new(24);
    for (f, data) in ALL_DATA.into_iter().enumerate() {
        let (rows, cols) = (3, 300 + 97 * f);
        let raw = generate(data, rows * cols, &mut rng);
        for ranks in RANKS {
            let k = [1, 5, 40, 128][(f + ranks) % 4];
            for (li, layout) in layouts(cols, ranks, k, &mut rng).iter().enumerate() {
                for order in ORDERS {
                    for nan in NANS {
                        check_all_types(
                            &raw,
                            (rows, cols, k),
                            order,
                            nan,
                            layout,
                            None,
                            None,
                            &format!("{data:?} ranks {ranks} layout {li}"),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn k_beyond_the_row_short_and_empty_shards_pad_as_one_device() {
    let mut rng = Rng::new(7);
    for data in [Data::Normal, Data::AllEqual, Data::Nan5, Data::InfZero] {
        for (rows, cols, k) in [(2, 10, 25), (3, 0, 4), (1, 1, 1), (2, 1, 3), (4, 100, 60), (2, 17, 17), (2, 17, 16)] {
            let raw = generate(data, rows * cols, &mut rng);
            for ranks in RANKS {
                for layout in layouts(cols, ranks, k, &mut rng) {
                    for order in ORDERS {
                        for nan in NANS {
                            check_all_types(
                                &raw,
                                (rows, cols, k),
                                order,
                                nan,
                                &layout,
                                None,
                                None,
                                &format!("{data:?}"),
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn ties_straddling_shard_boundaries_go_to_the_lower_global_column() {
    // All equal: the first k columns, whatever the cuts.
    let cols = 20;
    let raw = vec![1.5f32; cols];
    for cut in 0..=cols {
        for (k, ranks_after) in [(5, 1), (5, 3), (12, 2), (25, 4)] {
            let rest = cols - cut;
            let mut lens = vec![cut];
            lens.extend((0..ranks_after).map(|r| (r + 1) * rest / ranks_after - r * rest / ranks_after));
            let layout = ShardLayout::from_lens(&lens).unwrap();
            for order in ORDERS {
                check_all_types(&raw, (1, cols, k), order, NanPolicy::Lowest, &layout, None, None, "all equal");
            }
            let spec = SelectSpec::new(1, cols, k, DType::F32);
            let view = ScoresView::new(&raw, 1, cols).unwrap();
            let (ids, vals) = simulate_ranks(&view, &spec, &layout, None, None).unwrap();
            let m = merge_candidates(&ids, &vals, &spec, &layout, None).unwrap();
            let want: Vec<i32> = (0..k as i32).map(|c| if c < cols as i32 { c } else { -1 }).collect();
            assert_eq!(m.indices, want, "cut {cut} k {k}");
        }
    }
    // -0.0 (column 3, rank 0) ties +0.0 (column 4, rank 1): column 3 wins and
    // keeps its sign bit; the worked example of the semantics, cut everywhere.
    let raw = [-1.0f32, -1.0, -1.0, -0.0, 0.0, -1.0, -2.0];
    let example = [0.5f32, 2.0, -1.0, 2.0, f32::NAN, 0.0, -0.0];
    for cut in 0..=7 {
        let layout = ShardLayout::from_lens(&[cut, 7 - cut]).unwrap();
        let spec = SelectSpec::new(1, 7, 1, DType::F32);
        let (ids, vals) = simulate_ranks(&ScoresView::new(&raw, 1, 7).unwrap(), &spec, &layout, None, None).unwrap();
        let m = merge_candidates(&ids, &vals, &spec, &layout, None).unwrap();
        assert_eq!((m.indices[0], m.values[0].to_bits()), (3, 0x8000_0000), "cut {cut}");
        for (k, order, nan, lengths, want) in [
            (4, OutputOrder::Score, NanPolicy::Lowest, None, [1, 3, 0, 5]),
            (4, OutputOrder::Index, NanPolicy::Lowest, None, [0, 1, 3, 5]),
            (4, OutputOrder::Score, NanPolicy::Largest, None, [4, 1, 3, 0]),
            (4, OutputOrder::Score, NanPolicy::Lowest, Some([2]), [1, 0, -1, -1]),
        ] {
            let spec = SelectSpec::new(1, 7, k, DType::F32).with_order(order).with_nan(nan);
            let l = lengths.as_ref().map(|l| &l[..]);
            let view = ScoresView::new(&example, 1, 7).unwrap();
            let (ids, vals) = simulate_ranks(&view, &spec, &layout, None, l).unwrap();
            assert_eq!(merge_candidates(&ids, &vals, &spec, &layout, l).unwrap().indices, want, "cut {cut}");
        }
    }
    // FewValues and ReLU plateaus cut at every column of a short row.
    let mut rng = Rng::new(3);
    for data in [Data::FewValues, Data::Relu, Data::ReluFew] {
        let raw = generate(data, 2 * 41, &mut rng);
        for cut in 0..=41 {
            let layout = ShardLayout::from_lens(&[cut, 0, 41 - cut]).unwrap();
            for k in [1, 6, 20, 41, 50] {
                for order in ORDERS {
                    check::<f32>(&raw, (2, 41, k), order, NanPolicy::Lowest, &layout, None, None, "plateau");
                    check::<bf16>(&raw, (2, 41, k), order, NanPolicy::Largest, &layout, None, None, "plateau");
                }
            }
        }
    }
}

#[test]
fn nan_straddling_shard_boundaries_ranks_by_the_policy_and_keeps_its_bits() {
    // NaNs of different payloads and signs at columns 3..7; the cut falls
    // among them.
    let nan = |bits: u32| f32::from_bits(bits);
    let raw = [
        1.0f32,
        -3.0,
        0.25,
        nan(0x7fc0_0001),
        nan(0xffc0_0002),
        nan(0x7f80_0003),
        nan(0xff80_1004),
        2.0,
        f32::NEG_INFINITY,
        f32::INFINITY,
    ];
    let cols = raw.len();
    for cut in 0..=cols {
        for second in cut..=cols {
            let layout = ShardLayout::from_lens(&[cut, second - cut, cols - second]).unwrap();
            for k in [1, 2, 4, 6, 9, 10, 12] {
                for order in ORDERS {
                    for policy in NANS {
                        check::<f32>(&raw, (1, cols, k), order, policy, &layout, None, None, "nan boundary");
                    }
                }
            }
            // Largest: the four NaNs first, lower columns first, payloads kept.
            let spec = SelectSpec::new(1, cols, 4, DType::F32).with_nan(NanPolicy::Largest);
            let (ids, vals) =
                simulate_ranks(&ScoresView::new(&raw, 1, cols).unwrap(), &spec, &layout, None, None).unwrap();
            let m = merge_candidates(&ids, &vals, &spec, &layout, None).unwrap();
            assert_eq!(m.indices, [3, 4, 5, 6]);
            assert_eq!(bits(&m.values), [0x7fc0_0001, 0xffc0_0002, 0x7f80_0003, 0xff80_1004]);
        }
    }
    // Mostly NaN, fewer finite scores than k: NaN fills in by column under
    // lowest, across the cut.
    let mut rng = Rng::new(11);
    let raw = generate(Data::Nan5, 4 * 203, &mut rng);
    for ranks in RANKS {
        for layout in layouts(203, ranks, 180, &mut rng) {
            for policy in NANS {
                check_all_types(&raw, (4, 203, 180), OutputOrder::Score, policy, &layout, None, None, "nan5");
            }
        }
    }
}

/// Per-row `starts`/`ends` of `rows` rows of `cols`: empty, whole, one
/// column, random, and the last column only.
fn ranges(rows: usize, cols: usize, rng: &mut Rng) -> (Vec<i32>, Vec<i32>) {
    (0..rows)
        .map(|r| match r % 6 {
            0 => (cols / 2, cols / 2),
            1 => (0, cols),
            2 => (cols / 3, (cols / 3 + 1).min(cols)),
            5 => (cols.saturating_sub(1), cols),
            _ => {
                let a = rng.below(cols as u64 + 1) as usize;
                let b = rng.below(cols as u64 + 1) as usize;
                (a.min(b), a.max(b))
            }
        })
        .map(|(a, b)| (a as i32, b as i32))
        .unzip()
}

#[test]
fn ranges_and_lengths_are_intersected_with_each_shard() {
    let mut rng = Rng::new(21);
    for (f, data) in [Data::Normal, Data::FewValues, Data::Nan5, Data::InfZero, Data::Ascending].into_iter().enumerate()
    {
        let (rows, cols) = (12, 257 + 31 * f);
        let raw = generate(data, rows * cols, &mut rng);
        let (starts, ends) = ranges(rows, cols, &mut rng);
        for ranks in RANKS {
            for (li, layout) in layouts(cols, ranks, 30, &mut rng).iter().enumerate() {
                for (ki, k) in [1, 30, 300].into_iter().enumerate() {
                    let order = ORDERS[(li + ki) % 2];
                    let nan = NANS[(ki + ranks) % 2];
                    let shape = (rows, cols, k);
                    check_all_types(&raw, shape, order, nan, layout, Some(&starts), Some(&ends), "ranges");
                    check::<f32>(&raw, shape, order, nan, layout, Some(&starts), None, "starts only");
                    check::<bf16>(&raw, shape, order, nan, layout, None, Some(&ends), "lengths");
                }
            }
        }
    }
}

#[test]
fn long_rows_through_the_engines_sampled_and_split_paths() {
    let mut rng = Rng::new(5);
    for data in [Data::Normal, Data::ReluFew, Data::SampleTrap { period: 4096 }] {
        let cols = 70_000;
        let raw = generate(data, cols, &mut rng);
        for ranks in [1, 3, 8] {
            for k in [64, 2048] {
                let layout = ShardLayout::even(cols, ranks).unwrap();
                check::<f32>(&raw, (1, cols, k), OutputOrder::Score, NanPolicy::Lowest, &layout, None, None, "long");
                check::<bf16>(&raw, (1, cols, k), OutputOrder::Index, NanPolicy::Largest, &layout, None, None, "long");
            }
        }
        let layout = ShardLayout::from_lens(&[1000, 0, 50_000, 19_000]).unwrap();
        check::<f16>(&raw, (1, cols, 2048), OutputOrder::Score, NanPolicy::Lowest, &layout, None, None, "long uneven");
    }
}

#[test]
fn randomized_requests_merge_to_the_single_device_bytes() {
    let mut rng = Rng::new(0x5eed_0024);
    let families =
        [Data::Normal, Data::Relu, Data::ReluFew, Data::AllEqual, Data::Nan5, Data::InfZero, Data::FewValues];
    for it in 0..400 {
        let data = families[rng.below(families.len() as u64) as usize];
        let rows = 1 + rng.below(5) as usize;
        let cols = match rng.below(4) {
            0 => rng.below(8) as usize,
            1 => rng.below(100) as usize,
            _ => rng.below(3000) as usize,
        };
        let k = 1 + match rng.below(3) {
            0 => rng.below(8),
            1 => rng.below(cols as u64 + 10),
            _ => rng.below(300),
        } as usize;
        let ranks = if rng.below(4) == 0 { 1 + rng.below(40) as usize } else { RANKS[rng.below(7) as usize] };
        let all = layouts(cols, ranks, k, &mut rng);
        let layout = &all[rng.below(all.len() as u64) as usize];
        let order = ORDERS[rng.below(2) as usize];
        let nan = NANS[rng.below(2) as usize];
        let raw = generate(data, rows * cols, &mut rng);
        let (starts, ends) = ranges(rows, cols, &mut rng);
        let (s, e) = match rng.below(4) {
            0 => (None, None),
            1 => (None, Some(&ends[..])),
            2 => (Some(&starts[..]), None),
            _ => (Some(&starts[..]), Some(&ends[..])),
        };
        let what = format!("iteration {it} {data:?} {rows}x{cols} ranks {ranks}");
        match rng.below(3) {
            0 => check::<f32>(&raw, (rows, cols, k), order, nan, layout, s, e, &what),
            1 => check::<bf16>(&raw, (rows, cols, k), order, nan, layout, s, e, &what),
            _ => check::<f16>(&raw, (rows, cols, k), order, nan, layout, s, e, &what),
        }
    }
}

// ---------------------------------------------------------------------------
// QSA
// ---------------------------------------------------------------------------

/// Positions at every boundary of a QSA spec (as `ops::qsa`'s tests pick them).
fn qsa_positions(spec: &QsaSpec, rng: &mut Rng) -> Vec<i64> {
    let (r, k, nb) = (spec.ratio as i64, spec.k_blocks as i64, spec.blocks as i64);
    let mut p = vec![0, r - 1, r, k * r - 1, k * r, k * r + r - 1, (k + 1) * r, (k + 1) * r + 1, nb * r + r - 2];
    while p.len() < spec.rows {
        p.push(rng.below((nb * r + r - 1) as u64) as i64);
    }
    p.truncate(spec.rows);
    p.iter().map(|&t| t.clamp(0, nb * r + r - 2)).collect()
}

/// The ranks' QSA blocks (each from its own copy), gathered and merged,
/// against `qsa_select` and its reference on the whole rows.
fn check_qsa<T: ScoreElem>(raw: &[f32], spec: &QsaSpec, positions: &[i64], layout: &ShardLayout, pages: bool) {
    let what = format!("{} {:?} {:?} layout {:?}", T::DTYPE, spec.order, spec.nan, layout.shards());
    let typed: Vec<T> = raw.iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&typed, spec.rows, spec.blocks).unwrap();
    let mut rng = Rng::new(spec.rows as u64);
    let page_size = 64;
    let max_pages = (spec.blocks * spec.ratio + spec.ratio).div_ceil(page_size);
    let table = crate::data::page_table(&mut rng, 3, max_pages);
    let seq_ids: Vec<i32> = (0..spec.rows).map(|_| rng.below(3) as i32).collect();
    let map = PageMap::new(&table, max_pages, page_size, &seq_ids).unwrap();
    let pages = pages.then_some(&map);
    let want = qsa_select(&view, positions, spec, pages).unwrap();
    assert_eq!(want, reference_qsa_select(&view, positions, spec, pages).unwrap(), "{what}: cpu vs ref");

    let (mut ids, mut vals) = (Vec::new(), Vec::new());
    for (rank, &shard) in layout.shards().iter().enumerate() {
        let own = local_copy(&view, shard, 1);
        let lview = ScoresView::with_stride(&own, spec.rows, shard.len, shard.len + 1).unwrap();
        let block = qsa_shard_select(&lview, positions, spec, layout, rank).unwrap();
        ids.extend_from_slice(&block.indices);
        vals.extend_from_slice(&block.values);
    }
    // The same blocks simulated from the whole view.
    let visible = crate::ops::qsa::check_positions(positions, spec, T::DTYPE, None).unwrap();
    let ends = crate::ops::qsa::select_lengths(spec, &visible);
    let (sids, svals) = simulate_ranks(&view, &spec.block_spec_of(T::DTYPE), layout, None, Some(&ends)).unwrap();
    assert_eq!((&sids, bits(&svals)), (&ids, bits(&vals)), "{what}: simulated blocks");
    assert_eq!(qsa_merge(&ids, &vals, positions, spec, layout, pages).unwrap(), want, "{what}: merged");
}

#[test]
fn qsa_merge_gives_qsa_select_on_the_whole_row() {
    let (rows, blocks) = (12, 1500);
    let mut rng = Rng::new(42);
    for (f, data) in
        [Data::Normal, Data::Relu, Data::AllEqual, Data::Nan5, Data::FewValues, Data::InfZero].into_iter().enumerate()
    {
        let raw = generate(data, rows * blocks, &mut rng);
        for ranks in RANKS {
            for (li, layout) in layouts(blocks, ranks, 64, &mut rng).iter().enumerate() {
                for order in ORDERS {
                    for nan in NANS {
                        let spec = QsaSpec::new(rows, blocks).with_k_blocks(64).with_order(order).with_nan(nan);
                        let pos = qsa_positions(&spec, &mut rng);
                        let pages = (f + li) % 2 == 0;
                        check_qsa::<f32>(&raw, &spec, &pos, layout, pages);
                        check_qsa::<bf16>(&raw, &spec, &pos, layout, !pages);
                        check_qsa::<f16>(&raw, &spec, &pos, layout, pages);
                    }
                }
            }
        }
    }
    // Another ratio and a k_blocks beyond some shards, ranks of one block.
    let spec = QsaSpec::new(9, 40).with_ratio(3).with_k_blocks(5).with_order(OutputOrder::Score);
    let raw = generate(Data::FewValues, 9 * 40, &mut rng);
    let pos = qsa_positions(&spec, &mut rng);
    for ranks in [1, 5, 40, 41] {
        check_qsa::<f32>(&raw, &spec, &pos, &ShardLayout::even(40, ranks).unwrap(), true);
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

#[test]
fn bad_requests_and_bad_candidates_are_typed_errors() {
    let raw: Vec<f32> = (0..20).map(|i| ((i * 7) % 11) as f32).collect();
    let view = ScoresView::new(&raw, 2, 10).unwrap();
    let spec = SelectSpec::new(2, 10, 3, DType::F32);
    let layout = ShardLayout::from_lens(&[4, 0, 6]).unwrap();
    let (ids, vals) = simulate_ranks(&view, &spec, &layout, None, None).unwrap();
    let invalid = |r: Result<Selection<f32>>| match r {
        Err(Error::InvalidOption { what: "rank candidates", value, .. }) => value,
        other => panic!("{other:?}"),
    };

    assert!(matches!(ShardLayout::from_lens(&[]), Err(Error::InvalidOption { what: "rank count", .. })));
    assert!(matches!(ShardLayout::even(5, 0), Err(Error::InvalidOption { what: "rank count", .. })));
    assert!(matches!(ShardLayout::from_lens(&[i32::MAX as usize, 1]), Err(Error::TooLarge { .. })));
    // The layout must cover the row.
    let short = ShardLayout::from_lens(&[4, 5]).unwrap();
    assert!(matches!(merge_candidates(&ids[..18], &vals[..18], &spec, &short, None), Err(Error::Shape(_))));
    assert!(matches!(simulate_ranks(&view, &spec, &short, None, None), Err(Error::Shape(_))));
    // The spec's own checks first, as the single-device call makes them.
    assert!(matches!(
        merge_candidates(&ids, &vals, &SelectSpec::new(2, 10, 0, DType::F32), &layout, None),
        Err(Error::ZeroK)
    ));
    assert!(matches!(
        merge_candidates(&ids, &vals, &SelectSpec::new(2, 10, 3, DType::BF16), &layout, None),
        Err(Error::UnknownDType(_))
    ));
    assert!(matches!(
        merge_candidates(&ids, &vals, &spec, &layout, Some(&[3, 11])),
        Err(Error::LengthOutOfRange { row: 1, .. })
    ));
    assert!(matches!(
        merge_candidates_ranges(&ids, &vals, &spec, &layout, &[4, 0], Some(&[3, 10])),
        Err(Error::InvalidOption { what: "range start", .. })
    ));
    // The planes' sizes.
    assert!(matches!(
        merge_candidates(&ids[1..], &vals, &spec, &layout, None),
        Err(Error::BufferSize { what: "candidate ids", .. })
    ));
    assert!(matches!(
        merge_candidates(&ids, &vals[1..], &spec, &layout, None),
        Err(Error::BufferSize { what: "candidate values", .. })
    ));
    let mut small = vec![0; 5];
    assert!(matches!(
        merge_candidates_into(&ids, &vals, &spec, &layout, None, None, &mut small, None),
        Err(Error::BufferSize { what: "out_indices", .. })
    ));
    let (mut idx, mut v) = (vec![0; 6], vec![0f32; 7]);
    assert!(matches!(
        merge_candidates_into(&ids, &vals, &spec, &layout, None, None, &mut idx, Some(&mut v)),
        Err(Error::BufferSize { what: "out_values", .. })
    ));

    // A rank that shipped fewer than its top k (rank 2, row 1: slot 2 of its block).
    let mut bad = ids.clone();
    bad[2 * 6 + 3 + 2] = PAD;
    assert!(invalid(merge_candidates(&bad, &vals, &spec, &layout, None)).starts_with("rank 2, row 1: 2 ids"));
    // Candidates where the empty rank has none.
    let mut bad = ids.clone();
    bad[6] = 0;
    assert!(invalid(merge_candidates(&bad, &vals, &spec, &layout, None)).starts_with("rank 1, row 0"));
    // An id outside the rank's columns, an id after a -1, an id twice.
    let mut bad = ids.clone();
    bad[1] = 7;
    assert!(invalid(merge_candidates(&bad, &vals, &spec, &layout, None)).contains("id 7 is outside"));
    let mut bad = ids.clone();
    bad[2 * 6] = 11;
    assert!(invalid(merge_candidates(&bad, &vals, &spec, &layout, None)).contains("outside"));
    let mut bad = ids.clone();
    bad[2 * 6 + 1] = bad[2 * 6];
    assert!(invalid(merge_candidates(&bad, &vals, &spec, &layout, None)).contains("twice"));
    let lengths = [2, 10];
    let (lids, lvals) = simulate_ranks(&view, &spec, &layout, None, Some(&lengths)).unwrap();
    assert_eq!(lids[..3], [0, 1, PAD]);
    let mut bad = lids.clone();
    bad[2] = bad[1];
    bad[1] = PAD;
    assert!(invalid(merge_candidates(&bad, &lvals, &spec, &layout, Some(&lengths))).contains("follows a -1"));
    // Shipped under other lengths than the merge's.
    assert!(invalid(merge_candidates(&lids, &lvals, &spec, &layout, None)).starts_with("rank 0, row 0"));
    // The first bad row is the one reported, whatever the threads.
    let mut bad = ids.clone();
    bad[3] = 9;
    bad[0] = 9;
    assert!(invalid(merge_candidates(&bad, &vals, &spec, &layout, None)).starts_with("rank 0, row 0"));

    // A rank's view must be its shard; the rank must exist.
    let own = local_copy(&view, layout.shard(2), 0);
    let lview = ScoresView::new(&own, 2, 6).unwrap();
    assert!(shard_select(&lview, &spec, &layout, 2, None).is_ok());
    assert!(matches!(shard_select(&lview, &spec, &layout, 0, None), Err(Error::Shape(_))));
    assert!(matches!(shard_select(&lview, &spec, &layout, 3, None), Err(Error::InvalidOption { what: "rank", .. })));
    assert!(matches!(shard_select(&lview, &spec, &layout, 2, Some(&[11, 0])), Err(Error::LengthOutOfRange { .. })));

    // QSA: a bad position is the error qsa_select gives.
    let qspec = QsaSpec::new(2, 10).with_k_blocks(2);
    let qlayout = ShardLayout::even(10, 3).unwrap();
    for pos in [[-1i64, 3], [3, 44], [3, 39], [3, 4]] {
        let want = qsa_select(&view, &pos, &qspec, None);
        let blocks: Result<Vec<Selection<f32>>> = (0..3)
            .map(|r| {
                let own = local_copy(&view, qlayout.shard(r), 0);
                let lview = ScoresView::new(&own, 2, qlayout.shard(r).len).unwrap();
                qsa_shard_select(&lview, &pos, &qspec, &qlayout, r)
            })
            .collect();
        let (ids, vals): (Vec<i32>, Vec<f32>) = match blocks {
            Ok(b) => b.iter().flat_map(|b| b.indices.iter().copied().zip(b.values.iter().copied())).unzip(),
            Err(e) => {
                // The ranks refuse what qsa_select refuses, and so does the merge.
                assert_eq!(Err(e), want.clone().map(|_| ()), "{pos:?}");
                (vec![PAD; 12], vec![f32::NEG_INFINITY; 12])
            }
        };
        assert_eq!(qsa_merge(&ids, &vals, &pos, &qspec, &qlayout, None), want, "{pos:?}");
    }
    assert!(matches!(
        qsa_merge(&[PAD; 12], &[0f32; 12], &[3, 4], &qspec, &ShardLayout::even(9, 3).unwrap(), None),
        Err(Error::Shape(_))
    ));
}
