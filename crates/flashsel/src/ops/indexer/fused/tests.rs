use half::bf16;

use super::*;
use crate::data::Rng;
use crate::ops::indexer::{qsa_scores, F8E4M3};
use crate::ops::qsa::qsa_select;

/// What the fused operation must equal: the scores, then the selection.
fn composed<Q: QueryElem, K: KeyElem>(
    q: &[Q],
    keys: &BlockKeys<'_, K>,
    pos: &[i64],
    spec: &QsaIndexerSpec,
    pages: Option<&PageMap<'_>>,
) -> Result<QsaSelection> {
    let scores = qsa_scores(q, keys, pos, &spec.scores_spec())?;
    let view = ScoresView::new(&scores, spec.rows, spec.blocks)?;
    qsa_select(&view, pos, &spec.select_spec(), pages)
}

/// The fused result equals the composition (or both refuse with the same
/// message) at the default scratch and at tiny ones (groups of one row, of
/// a few rows, a row count that is not a multiple of the group).
fn same<Q: QueryElem, K: KeyElem>(
    q: &[Q],
    keys: &BlockKeys<'_, K>,
    pos: &[i64],
    spec: &QsaIndexerSpec,
    pages: Option<&PageMap<'_>>,
) -> Option<QsaSelection> {
    let want = composed(q, keys, pos, spec, pages);
    let nb = spec.blocks.max(1);
    for scratch in [INDEXER_SCRATCH_BYTES / 4, 1, nb, 2 * nb, 3 * nb + 1, 7 * nb] {
        let got = qsa_indexer_with(q, keys, pos, spec, pages, scratch);
        match (&want, &got) {
            (Ok(w), Ok(g)) => assert!(w == g, "scratch {scratch}: {spec:?}"),
            (Err(w), Err(g)) => assert_eq!(w.to_string(), g.to_string(), "scratch {scratch}"),
            _ => panic!("scratch {scratch}: composed {want:?}, fused {got:?}"),
        }
    }
    let public = qsa_indexer(q, keys, pos, spec, pages);
    assert_eq!(public.is_ok(), want.is_ok());
    want.ok()
}

fn normal(n: usize, scale: f32, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.normal() * scale).collect()
}

fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// Nearest e4m3 by search (test data, |x| <= 448).
fn to_e4m3(x: &[f32]) -> Vec<F8E4M3> {
    let codes: Vec<(u8, f32)> = (0..=255u8).filter(|b| b & 0x7f != 0x7f).map(|b| (b, F8E4M3(b).to_f32())).collect();
    x.iter()
        .map(|&v| F8E4M3(codes.iter().min_by(|a, b| (a.1 - v).abs().total_cmp(&(b.1 - v).abs())).unwrap().0))
        .collect()
}

/// Positions with V = 0, k - 1, k, k + 1, NB and random ones.
fn positions(rows: usize, spec: &QsaIndexerSpec, rng: &mut Rng) -> Vec<i64> {
    let (r, k) = (spec.ratio as i64, spec.k_blocks as i64);
    let last = (spec.blocks as i64 * r + r - 2).max(0); // the last position with V = NB
    let mut p = vec![0, k * r - 1, k * r + r - 2, k * r + r - 1, (k + 1) * r + r - 1, last];
    while p.len() < rows {
        p.push(rng.below(last as u64 + 1) as i64);
    }
    p.truncate(rows);
    p.iter().map(|&t| t.clamp(0, last)).collect()
}

fn specs() -> Vec<QsaIndexerSpec> {
    vec![
        QsaIndexerSpec::new(13, 97).with_heads(4).with_dim(64).with_k_blocks(16),
        QsaIndexerSpec::new(9, 60).with_heads(1).with_dim(128).with_k_blocks(7).with_order(OutputOrder::Score),
        QsaIndexerSpec::new(6, 40)
            .with_heads(7)
            .with_dim(256)
            .with_ratio(3)
            .with_k_blocks(5)
            .with_nan(NanPolicy::Largest),
        QsaIndexerSpec::new(5, 700).with_dim(128), // QSA's 4 x 128, k 512
    ]
}

#[test]
fn random_data_gives_the_bytes_of_the_composition() {
    let mut rng = Rng::new(1);
    for spec in specs() {
        for order in [OutputOrder::Index, OutputOrder::Score] {
            let spec = spec.with_order(order);
            let q = normal(spec.rows * spec.heads * spec.dim, 1.0, &mut rng);
            let k = normal(spec.blocks * spec.dim, 2.0, &mut rng);
            let pos = positions(spec.rows, &spec, &mut rng);
            let sel = same(&q, &BlockKeys::Contiguous(&k), &pos, &spec, None).unwrap();
            assert_eq!(sel.rows, spec.rows);
            same(&to_bf16(&q), &BlockKeys::Contiguous(&to_bf16(&k)), &pos, &spec, None).unwrap();
            same(&q, &BlockKeys::Contiguous(&to_e4m3(&k)), &pos, &spec, None).unwrap();
            same(&to_bf16(&q), &BlockKeys::Contiguous(&k), &pos, &spec, None).unwrap();
        }
    }
}

#[test]
fn near_ties_give_the_bytes_of_the_composition() {
    let mut rng = Rng::new(2);
    for spec in specs() {
        for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
            for order in [OutputOrder::Index, OutputOrder::Score] {
                let spec = spec.with_nan(nan).with_order(order);
                let d = spec.dim;
                // q from {-1, 0, 1, 2}; keys: 3 distinct rows repeated, so most
                // scores tie exactly.
                let q: Vec<f32> = (0..spec.rows * spec.heads * d).map(|_| rng.below(4) as f32 - 1.0).collect();
                let base: Vec<f32> = (0..3 * d).map(|_| rng.below(5) as f32 - 2.0).collect();
                let k: Vec<f32> = (0..spec.blocks).flat_map(|b| base[(b % 3) * d..(b % 3 + 1) * d].to_vec()).collect();
                let pos = positions(spec.rows, &spec, &mut rng);
                same(&q, &BlockKeys::Contiguous(&k), &pos, &spec, None).unwrap();
                // Keys one bf16 ulp apart: scores that differ in the last bits.
                let one = normal(d, 1.0, &mut rng);
                let k2: Vec<bf16> = (0..spec.blocks)
                    .flat_map(|b| {
                        one.iter()
                            .enumerate()
                            .map(|(j, &x)| {
                                let bits = bf16::from_f32(x).to_bits();
                                bf16::from_bits(if j == b % d { bits.wrapping_add((b % 3) as u16) } else { bits })
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                let qn = normal(spec.rows * spec.heads * d, 1.0, &mut rng);
                same(&qn, &BlockKeys::Contiguous(&k2), &pos, &spec, None).unwrap();
                // All-zero scores (q = 0): one big tie.
                let z = vec![0f32; q.len()];
                same(&z, &BlockKeys::Contiguous(&k2), &pos, &spec, None).unwrap();
            }
        }
    }
}

#[test]
fn nan_scores_follow_the_policy_as_the_composition() {
    let mut rng = Rng::new(3);
    for spec in specs() {
        for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
            let spec = spec.with_nan(nan).with_order(OutputOrder::Score);
            let d = spec.dim;
            let mut q = normal(spec.rows * spec.heads * d, 1.0, &mut rng);
            // Row 1 all NaN; row 2 one NaN value.
            if spec.rows > 2 {
                q[spec.heads * d..2 * spec.heads * d].fill(f32::NAN);
                q[2 * spec.heads * d + 3] = f32::NAN;
            }
            let mut k = normal(spec.blocks * d, 1.0, &mut rng);
            // Every fifth block holds a NaN (with its own sign), some an infinity.
            for b in (0..spec.blocks).step_by(5) {
                k[b * d + 1] = if b % 2 == 0 { f32::NAN } else { -f32::NAN };
            }
            for b in (2..spec.blocks).step_by(7) {
                k[b * d] = f32::INFINITY;
            }
            let pos = positions(spec.rows, &spec, &mut rng);
            same(&q, &BlockKeys::Contiguous(&k), &pos, &spec, None).unwrap();
            let mut k8 = to_e4m3(&normal(spec.blocks * d, 1.0, &mut rng));
            for b in (1..spec.blocks).step_by(3) {
                k8[b * d] = F8E4M3(if b % 2 == 0 { 0x7f } else { 0xff });
            }
            same(&q, &BlockKeys::Contiguous(&k8), &pos, &spec, None).unwrap();
        }
    }
}

#[test]
fn v_around_k_blocks() {
    let mut rng = Rng::new(4);
    let spec = QsaIndexerSpec::new(0, 30).with_heads(2).with_dim(64).with_k_blocks(10);
    let q1 = normal(2 * 64, 1.0, &mut rng);
    let k = normal(30 * 64, 1.0, &mut rng);
    let keys = BlockKeys::Contiguous(&k);
    // Every position from 0 to the last one, one row each.
    let pos: Vec<i64> = (0..=30 * 4 + 2).collect();
    let rows = pos.len();
    let q: Vec<f32> = (0..rows).flat_map(|_| q1.clone()).collect();
    let spec = QsaIndexerSpec { rows, ..spec };
    let sel = same(&q, &keys, &pos, &spec, None).unwrap();
    for (i, &t) in pos.iter().enumerate() {
        let v = (t as usize + 1) / 4;
        let want = if v <= 10 { t as i32 + 1 } else { 10 * 4 + (t as i32 + 1 - 4 * v as i32) };
        assert_eq!(sel.counts[i], want, "t = {t}");
    }
    // k_blocks past NB: nothing is scored, every row causal.
    let big = spec.with_k_blocks(31);
    let sel = same(&q, &keys, &pos, &big, None).unwrap();
    assert!(sel.counts.iter().zip(&pos).all(|(&c, &t)| c == t as i32 + 1));
}

/// A paged cache holding `seqs` (each `[blocks, d]`) through a random table,
/// the unused entries past `blocks` set to -7.
fn paged(
    seqs: &[Vec<f32>],
    blocks: usize,
    d: usize,
    per_page: usize,
    max_pages: usize,
    rng: &mut Rng,
) -> (Vec<f32>, Vec<i32>) {
    let mut table = crate::data::page_table(rng, seqs.len(), max_pages);
    let used = blocks.div_ceil(per_page);
    for s in 0..seqs.len() {
        table[s * max_pages + used..(s + 1) * max_pages].fill(-7);
    }
    let mut cache = vec![0f32; (seqs.len() * max_pages + 2) * per_page * d];
    for (s, keys) in seqs.iter().enumerate() {
        for b in 0..blocks {
            let at = (table[s * max_pages + b / per_page] as usize * per_page + b % per_page) * d;
            cache[at..at + d].copy_from_slice(&keys[b * d..(b + 1) * d]);
        }
    }
    (cache, table)
}

#[test]
fn page_tables_for_the_keys_and_the_ids() {
    let mut rng = Rng::new(5);
    let (page_size, ratio, d) = (16usize, 4usize, 64usize);
    let per_page = page_size / ratio;
    let blocks_used = 50usize;
    let max_pages = blocks_used.div_ceil(per_page);
    let nb = max_pages * per_page;
    for order in [OutputOrder::Index, OutputOrder::Score] {
        let spec = QsaIndexerSpec::new(11, nb).with_heads(3).with_dim(d).with_k_blocks(9).with_order(order);
        let seqs: Vec<Vec<f32>> = (0..3).map(|_| normal(blocks_used * d, 1.0, &mut rng)).collect();
        let (cache, table) = paged(&seqs, blocks_used, d, per_page, max_pages, &mut rng);
        let seq_ids: Vec<i32> = (0..11).map(|i| i * 7 % 3).collect();
        let map = PageMap::new(&table, max_pages, page_size, &seq_ids).unwrap();
        let q = normal(11 * 3 * d, 1.0, &mut rng);
        let mut pos: Vec<i64> = (0..11).map(|_| rng.below((blocks_used * ratio) as u64) as i64).collect();
        pos[0] = (blocks_used * ratio - 1) as i64;
        pos[1] = 9 * 4 + 3; // V = 10 = k + 1
        let keys = BlockKeys::Paged { kbar: &cache, pages: map };
        let sel = same(&q, &keys, &pos, &spec, Some(&map)).unwrap();
        // The slots are those of the token ids through the same table.
        let ids = same(&q, &keys, &pos, &spec, None).unwrap();
        for i in 0..11 {
            let n = sel.counts[i] as usize;
            for j in 0..n {
                let tok = ids.row(i)[j] as usize;
                let page = table[seq_ids[i] as usize * max_pages + tok / page_size];
                assert_eq!(sel.row(i)[j], page * page_size as i32 + (tok % page_size) as i32);
            }
        }
        // Paged keys give the selection of each sequence's contiguous keys.
        for i in 0..11 {
            let one = QsaIndexerSpec { rows: 1, blocks: blocks_used, ..spec };
            let flat = BlockKeys::Contiguous(&seqs[seq_ids[i] as usize][..]);
            let alone = qsa_indexer(&q[i * 3 * d..(i + 1) * 3 * d], &flat, &pos[i..i + 1], &one, None).unwrap();
            assert_eq!(alone.row(0), ids.row(i), "row {i}");
        }
    }
}

#[test]
fn groups_never_change_the_answer() {
    // Many rows with V > k and different V, at scratch sizes that cut the
    // rows anywhere (1 row, a prime count, the whole batch).
    let mut rng = Rng::new(6);
    let spec = QsaIndexerSpec::new(37, 200).with_heads(2).with_dim(64).with_k_blocks(20);
    let q = normal(37 * 2 * 64, 1.0, &mut rng);
    let k = to_bf16(&normal(200 * 64, 1.0, &mut rng));
    let pos: Vec<i64> = (0..37).map(|i| if i % 4 == 0 { 30 } else { 84 + rng.below(716) as i64 }).collect();
    let keys = BlockKeys::Contiguous(&k);
    let want = composed(&q, &keys, &pos, &spec, None).unwrap();
    for scratch in [0, 1, 199, 200, 201, 401, 3 * 200 + 7, 5000, 37 * 200, usize::MAX] {
        assert!(qsa_indexer_with(&q, &keys, &pos, &spec, None, scratch).unwrap() == want, "{scratch}");
    }
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        assert!(pool.install(|| qsa_indexer_with(&q, &keys, &pos, &spec, None, 401)).unwrap() == want);
    }
}

#[test]
fn empty_requests() {
    let spec = QsaIndexerSpec::new(0, 5).with_dim(64).with_heads(1);
    let k = vec![0f32; 5 * 64];
    let sel = same::<f32, f32>(&[], &BlockKeys::Contiguous(&k), &[], &spec, None).unwrap();
    assert!(sel.ids.is_empty() && sel.counts.is_empty());
    let spec = QsaIndexerSpec::new(2, 0).with_dim(64).with_heads(1);
    let q = vec![1f32; 128];
    let sel = same::<f32, f32>(&q, &BlockKeys::Contiguous(&[]), &[0, 2], &spec, None).unwrap();
    assert_eq!(sel.counts, [1, 3]);
    assert!(same::<f32, f32>(&q, &BlockKeys::Contiguous(&[]), &[0, 3], &spec, None).is_none());
}

/// The fused error, checked to be the composition's.
fn err<K: KeyElem>(
    q: &[f32],
    keys: &BlockKeys<'_, K>,
    pos: &[i64],
    spec: &QsaIndexerSpec,
    pages: Option<&PageMap<'_>>,
) -> String {
    assert!(same(q, keys, pos, spec, pages).is_none(), "refused");
    qsa_indexer(q, keys, pos, spec, pages).unwrap_err().to_string()
}

#[test]
fn bad_requests_are_refused_as_the_composition_refuses() {
    let spec = QsaIndexerSpec::new(2, 4).with_dim(64).with_heads(2).with_k_blocks(2);
    let q = vec![0.5f32; 2 * 2 * 64];
    let k = vec![0.5f32; 4 * 64];
    let flat = BlockKeys::Contiguous(&k[..]);
    let ok = [3i64, 16];
    assert!(same(&q, &flat, &ok, &spec, None).is_some());
    // The scores' checks.
    assert!(err(&q, &flat, &ok, &spec.with_heads(0), None).contains("heads"));
    assert!(err(&q, &flat, &ok, &spec.with_dim(96), None).contains("head dim"));
    assert!(err(&q, &flat, &ok, &spec.with_ratio(0), None).contains("ratio"));
    assert!(err(&q[1..], &flat, &ok, &spec, None).contains("q holds 255 elements"));
    assert!(err(&q, &BlockKeys::Contiguous(&k[..200]), &ok, &spec, None).contains("kbar holds 200 elements"));
    assert!(err(&q, &flat, &[3], &spec, None).contains("positions has 1 entries but q has 2 rows"));
    assert!(err(&q, &flat, &[3, -1], &spec, None).contains("positions[1] = -1"));
    let e = err(&q, &flat, &[3, 19], &spec, None);
    assert!(e.contains("sees 5 blocks of 4 tokens but the keys hold 4"), "{e}");
    // The selection's checks.
    assert!(err(&q, &flat, &ok, &spec.with_k_blocks(0), None).contains("k_blocks"));
    let e = err(&q, &flat, &ok, &spec.with_k_blocks(1 << 30), None);
    assert!(e.contains("k_blocks * ratio + ratio - 1"), "{e}");
    // The ids' page table: a sequence outside it, too few pages, a negative page.
    let table = [0, 1, 2, 3, /* seq 1 */ 4, -1, 5, 6];
    let m = |seqs: &'static [i32], ps| PageMap::new(&table, 4, ps, seqs).unwrap();
    assert!(same(&q, &flat, &ok, &spec, Some(&m(&[0, 0], 8))).is_some());
    assert!(err(&q, &flat, &ok, &spec, Some(&m(&[0, 2], 8))).contains("seq_ids[1] = 2"));
    assert!(err(&q, &flat, &ok, &spec, Some(&m(&[0], 8))).contains("seq_ids has 1 entries"));
    assert!(err(&q, &flat, &ok, &spec, Some(&m(&[0, 1], 8))).contains("page_table[1, 1] = -1"));
    assert!(err(&q, &flat, &ok, &spec, Some(&m(&[0, 0], 4))).contains("page_table has 4 pages a sequence"));
    // Paged keys: a page outside the cache.
    let cache = vec![0.25f32; 3 * 2 * 64];
    let keys = BlockKeys::Paged { kbar: &cache[..], pages: m(&[0, 1], 8) };
    let e = err(&q, &keys, &[3, 16], &spec, Some(&m(&[0, 1], 8)));
    assert!(e.contains("page_table[1, 0] = 4") && e.contains("outside the key cache's pages 0..3"), "{e}");
}
