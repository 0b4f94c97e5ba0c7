use half::{bf16, f16};

use super::*;
use crate::contract::ScoresView;
use crate::data::{generate, Data, Rng};

/// Rows at positions around every boundary of a spec: V = 0, V = k_blocks
/// and k_blocks + 1, every tail length, and the last position the scores hold.
fn positions_for(spec: &QsaSpec, rng: &mut Rng) -> Vec<i64> {
    let (r, k, nb) = (spec.ratio as i64, spec.k_blocks as i64, spec.blocks as i64);
    let mut p = vec![0, r - 1, r, k * r - 1, k * r, k * r + r - 1, (k + 1) * r, (k + 1) * r + 1, nb * r + r - 2];
    while p.len() < spec.rows {
        p.push(rng.below((nb * r + r - 1) as u64) as i64);
    }
    p.truncate(spec.rows);
    p.iter().map(|&t| t.clamp(0, nb * r + r - 2)).collect()
}

fn check_family<T: ScoreElem>(data: Data, order: OutputOrder, nan: NanPolicy, seed: u64) {
    let (rows, blocks) = (12, 3000);
    let spec = QsaSpec::new(rows, blocks).with_k_blocks(64).with_order(order).with_nan(nan);
    let mut rng = Rng::new(seed);
    let raw = generate(data, rows * blocks, &mut rng);
    let typed: Vec<T> = raw.iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&typed, rows, blocks).unwrap();
    let pos = positions_for(&spec, &mut rng);
    let got = qsa_select(&view, &pos, &spec, None).unwrap();
    let want = reference_qsa_select(&view, &pos, &spec, None).unwrap();
    assert_eq!(got, want, "{data:?} {order:?} {nan:?} {}", std::any::type_name::<T>());
    for (i, &t) in pos.iter().enumerate() {
        let row = got.row(i);
        let n = got.counts[i] as usize;
        assert!(crate::contract::padded::is_well_formed(row, blocks * spec.ratio + spec.ratio), "row {i}");
        assert_eq!(crate::contract::padded::valid_len(row), n);
        let v = (t as usize + 1) / spec.ratio;
        let tail = t as usize + 1 - v * spec.ratio;
        assert_eq!(n, v.min(spec.k_blocks) * spec.ratio + tail, "row {i} at {t}");
        if order == OutputOrder::Index || v <= spec.k_blocks {
            assert!(row[..n].windows(2).all(|w| w[0] < w[1]), "row {i}: ids ascend");
        }
    }
}

#[test]
fn the_engine_matches_the_reference_on_every_family() {
    for (s, data) in
        [Data::Normal, Data::Relu, Data::ReluFew, Data::AllEqual, Data::Nan5, Data::FewValues, Data::InfZero]
            .into_iter()
            .enumerate()
    {
        for order in [OutputOrder::Index, OutputOrder::Score] {
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                check_family::<f32>(data, order, nan, s as u64);
                check_family::<bf16>(data, order, nan, s as u64);
                check_family::<f16>(data, order, nan, s as u64);
            }
        }
    }
}

#[test]
fn a_worked_example() {
    // 8 blocks of 4 tokens; k_blocks 2.
    let scores = [0.5f32, 2.0, -1.0, 2.0, f32::NAN, 3.0, 0.0, 9.0];
    let view = ScoresView::new(&scores, 1, 8).unwrap();
    let spec = QsaSpec::new(1, 8).with_k_blocks(2);
    // t = 9: V = 2 <= k: blocks 0, 1 causally, then token 8, 9 (the tail).
    let s = qsa_select(&view, &[9], &spec, None).unwrap();
    assert_eq!(s.width, 2 * 4 + 3);
    assert_eq!(s.row(0), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1]);
    assert_eq!(s.counts, [10]);
    // t = 22: V = 5 (blocks 0..4: 0.5, 2, -1, 2, NaN): the top 2 are block 1
    // and block 3 (the tie at 2.0 goes to the lower block; NaN lowest), then
    // the tail 20, 21, 22.
    let s = qsa_select(&view, &[22], &spec, None).unwrap();
    assert_eq!(s.row(0), [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22]);
    // NaN largest: block 4 first in score order, then block 1.
    let largest = spec.with_nan(NanPolicy::Largest).with_order(OutputOrder::Score);
    let s = qsa_select(&view, &[22], &largest, None).unwrap();
    assert_eq!(s.row(0), [16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22]);
    // t = 31: V = 8, score order: block 7 (9.0), block 5 (3.0), no tail.
    let s = qsa_select(&view, &[31], &spec.with_order(OutputOrder::Score), None).unwrap();
    assert_eq!(s.row(0), [28, 29, 30, 31, 20, 21, 22, 23, -1, -1, -1]);
    assert_eq!(s.counts, [8]);
}

#[test]
fn page_tables_map_every_id() {
    let (rows, blocks) = (6, 700);
    let spec = QsaSpec::new(rows, blocks).with_k_blocks(100);
    let mut rng = Rng::new(5);
    let raw = generate(Data::Normal, rows * blocks, &mut rng);
    let view = ScoresView::new(&raw, rows, blocks).unwrap();
    let pos = positions_for(&spec, &mut rng);
    // Two sequences of 44 pages of 64 tokens, pages shuffled.
    let (page_size, max_pages) = (64usize, 44usize);
    let mut table: Vec<i32> = (0..2 * max_pages as i32).map(|p| (p * 37) % 97 + 3).collect();
    table[max_pages + 43] = 500;
    let seq_ids = [0, 1, 1, 0, 1, 0];
    let pages = PageMap::new(&table, max_pages, page_size, &seq_ids).unwrap();
    let tokens = qsa_select(&view, &pos, &spec, None).unwrap();
    let slots = qsa_select(&view, &pos, &spec, Some(&pages)).unwrap();
    assert_eq!(slots, reference_qsa_select(&view, &pos, &spec, Some(&pages)).unwrap());
    assert_eq!(slots.counts, tokens.counts);
    for i in 0..rows {
        for (j, (&tok, &slot)) in tokens.row(i).iter().zip(slots.row(i)).enumerate() {
            if tok < 0 {
                assert_eq!(slot, -1, "row {i} slot {j}: padding stays -1");
            } else {
                let (p, o) = (tok as usize / page_size, tok as usize % page_size);
                let want = table[seq_ids[i] as usize * max_pages + p] as usize * page_size + o;
                assert_eq!(slot as usize, want, "row {i} slot {j}");
            }
        }
    }
    // A page the row needs that the table lacks, or marks invalid, is an error.
    let short = PageMap::new(&table[..2 * 3], 3, page_size, &seq_ids).unwrap();
    assert!(matches!(qsa_select(&view, &pos, &spec, Some(&short)), Err(Error::Shape(_))));
    let mut holes = table.clone();
    holes[0] = -1;
    let holed = PageMap::new(&holes, max_pages, page_size, &seq_ids).unwrap();
    assert!(matches!(qsa_select(&view, &pos, &spec, Some(&holed)), Err(Error::InvalidOption { .. })));
    let bad_seq = [0, 1, 2, 0, 1, 0];
    let p = PageMap::new(&table, max_pages, page_size, &bad_seq).unwrap();
    assert!(matches!(qsa_select(&view, &pos, &spec, Some(&p)), Err(Error::Shape(_))));
}

#[test]
fn bad_requests_are_typed_errors() {
    let scores = [0.0f32; 16];
    let view = ScoresView::new(&scores, 2, 8).unwrap();
    let spec = QsaSpec::new(2, 8).with_k_blocks(2);
    // V = (35 + 1) / 4 = 9 > 8 blocks.
    assert!(matches!(qsa_select(&view, &[3, 35], &spec, None), Err(Error::Shape(_))));
    assert!(matches!(qsa_select(&view, &[3, -1], &spec, None), Err(Error::InvalidOption { .. })));
    assert!(matches!(qsa_select(&view, &[3], &spec, None), Err(Error::Shape(_))));
    assert!(qsa_select(&view, &[3, 4], &spec.with_ratio(0), None).is_err());
    assert!(qsa_select(&view, &[3, 4], &spec.with_k_blocks(0), None).is_err());
    assert!(matches!(QsaSpec::new(1, 8).with_k_blocks(1 << 30).validate(), Err(Error::TooLarge { .. })));
    assert!(PageMap::new(&[1, 2, 3], 2, 64, &[0]).is_err());
    assert!(PageMap::new(&[1, 2], 2, 0, &[0]).is_err());
    // The last position the scores hold: V = 8, the tail 3 tokens.
    let s = qsa_select(&view, &[34, 0], &spec, None).unwrap();
    assert_eq!(s.counts, [2 * 4 + 3, 1]);
}

/// The paths the geometries take on the H200 (132 SMs): the block
/// top-k is the select planner's over the block scores, so decode rows
/// spread over the GPU (grid rows; 16 rows split), prefill chunks take one
/// CTA a row, and the boundaries around the row path's fit hold for QSA
/// specs as for plain ones.
#[test]
fn qsa_geometries_take_the_planned_paths() {
    use crate::ops::select::plan::{plan, DeviceProps, Path};
    let h200 = DeviceProps::hopper(132);
    let path = |rows: usize, blocks: usize, dtype: DType| {
        let p = plan(&QsaSpec::new(rows, blocks).block_spec_of(dtype), true, &h200).unwrap();
        (p.path(), p.ctas_per_row())
    };
    assert_eq!(path(1, 262_144, DType::BF16), (Path::Grid, 64));
    assert_eq!(path(16, 262_144, DType::BF16), (Path::Split, 8));
    // A decode row of 16,384 blocks: the short path's wide kernel (one CTA,
    // the row in registers); one block more, the grid.
    assert_eq!(path(1, 16_384, DType::F32), (Path::Short, 1));
    assert_eq!(path(1, 16_385, DType::F32), (Path::Grid, 9));
    assert_eq!(path(8192, 65_536, DType::BF16), (Path::Row, 1));
    // The first chunk (V 0 .. 2,048) on the short-row path, one CTA a row.
    assert_eq!(path(8192, 2048, DType::BF16), (Path::Short, 1));
    assert_eq!(path(8192, 2048, DType::F32), (Path::Short, 1));
    // Around the row path's fit (k 512: 8192 columns = SHORT_COLS): a batch
    // short up to it and the row path past it; one row, or one a SM, the
    // wide kernel on both sides.
    let fit = plan(&QsaSpec::new(1, 1 << 20).block_spec_of(DType::F32), true, &h200).unwrap().fit() as usize;
    assert_eq!(fit, 8192);
    for blocks in [fit - 1, fit] {
        assert_eq!(path(133, blocks, DType::F32), (Path::Short, 1), "133 x {blocks}");
        assert_eq!(path(1, blocks, DType::F32), (Path::Short, 1), "1 x {blocks}");
        assert_eq!(path(132, blocks, DType::F32), (Path::Short, 1), "132 x {blocks}");
    }
    assert_eq!(path(1, fit + 1, DType::F32), (Path::Short, 1));
    assert_eq!(path(8192, fit + 1, DType::BF16), (Path::Row, 1));
    assert_ne!(path(1, 2 * fit, DType::F32).0, Path::Row);
}
