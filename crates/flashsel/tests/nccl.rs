//! The distributed selection over NCCL (ops::shard::nccl) against the CPU
//! engine on the whole rows: every rank's bytes must be one device's.
//!
//! Without libnccl the group cannot be made: that is checked here on every
//! machine. The runs need NCCL and GPUs, so they are ignored with the
//! reason; run them on a GPU machine with
//! `cargo test -p flashsel --release --test nccl -- --ignored`
//! (`every_gpu_a_rank` needs two GPUs or more and fails with fewer).

use flashsel::cuda::CudaEngine;
use flashsel::data::Rng;
use flashsel::ops::qsa::QsaSpec;
use flashsel::ops::shard::nccl::{nccl_availability, NcclGroup, NcclId};
use flashsel::{DType, Error, OutputOrder, PageMap, ScoresView, SelectSpec};

#[test]
fn a_missing_libnccl_is_a_clear_error() {
    match nccl_availability() {
        Err(why) => {
            assert!(why.contains("libnccl"), "{why}");
            assert!(matches!(NcclId::new(), Err(Error::BackendUnavailable(_))));
        }
        Ok(()) => assert!(NcclId::new().is_ok()),
    }
}

/// Scores with ties (small integers), NaN and -0.0 on every rank's side.
fn scores(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut g = Rng::new(seed);
    (0..rows * cols)
        .map(|i| match g.below(40) {
            0 => f32::NAN,
            1 => -0.0,
            _ if i % 7 == 0 => g.normal(),
            _ => g.below(5) as f32,
        })
        .collect()
}

/// `ranks` contiguous shards of `cols`, uneven, the second empty when there
/// are three or more.
fn cuts(cols: usize, ranks: usize) -> Vec<(usize, usize)> {
    let mut bounds: Vec<usize> = (0..=ranks).map(|r| cols * r * r / (ranks * ranks)).collect();
    if ranks >= 3 {
        bounds[2] = bounds[1];
    }
    bounds.windows(2).map(|w| (w[0], w[1] - w[0])).collect()
}

fn slice(x: &[f32], cols: usize, off: usize, n: usize) -> Vec<f32> {
    x.chunks(cols).flat_map(|row| row[off..off + n].iter().copied()).collect()
}

/// Rank `rank` of `ranks` on `engine`: topk (both orders, with and without
/// lengths) and qsa_select (with and without slots) against the CPU.
fn check_rank(engine: &CudaEngine, group: &NcclGroup) {
    let (rank, ranks) = (group.rank(), group.ranks());
    let (rows, cols, k) = (24, 50_000, 2048);
    let x = scores(rows, cols, 7);
    let (off, n) = cuts(cols, ranks)[rank];
    let mine = slice(&x, cols, off, n);
    let lengths: Vec<i32> = (0..rows).map(|i| (cols * i / rows) as i32).collect();
    for order in [OutputOrder::Score, OutputOrder::Index] {
        for lens in [None, Some(&lengths[..])] {
            let spec = SelectSpec::new(rows, cols, k, DType::F32).with_order(order);
            let got = engine.shard_topk_host(group, &mine, &spec, off, n, lens).unwrap();
            let view = ScoresView::new(&x, rows, cols).unwrap();
            let want = flashsel::cpu::select(&view, &spec, lens).unwrap();
            assert_eq!(got.indices, want.indices, "rank {rank}/{ranks} {order:?} lengths {}", lens.is_some());
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.values), bits(&want.values), "rank {rank}/{ranks} {order:?}");
        }
    }
    // QSA: positions from copy rows (V <= 512) to nearly the whole row.
    let nb = cols;
    let positions: Vec<i64> = (0..rows as i64).map(|i| (4 * nb as i64 * i) / rows as i64 + 3).collect();
    let (ps, seqs) = (64usize, 2usize);
    let max_pages = (4 * nb + 4).div_ceil(ps) + 1;
    let table: Vec<i32> = (0..(seqs * max_pages) as i32).rev().collect();
    let seq_ids: Vec<i32> = (0..rows as i32).map(|i| i % 2).collect();
    let map = PageMap::new(&table, max_pages, ps, &seq_ids).unwrap();
    for order in [OutputOrder::Index, OutputOrder::Score] {
        for pages in [None, Some(&map)] {
            let spec = QsaSpec::new(rows, nb).with_k_blocks(512).with_order(order);
            let got = engine.shard_qsa_select_host(group, &mine, &positions, &spec, off, n, pages).unwrap();
            let view = ScoresView::new(&x, rows, nb).unwrap();
            let want = flashsel::cpu::qsa_select(&view, &positions, &spec, pages).unwrap();
            assert_eq!(got, want, "rank {rank}/{ranks} qsa {order:?} slots {}", pages.is_some());
        }
    }
}

#[test]
#[ignore = "needs libnccl and a GPU"]
fn world_size_one_equals_one_device() {
    let engine = CudaEngine::new(0).unwrap();
    let id = NcclId::new().unwrap();
    let group = NcclGroup::new(&engine, &id, 0, 1).unwrap();
    check_rank(&engine, &group);
}

#[test]
#[ignore = "needs libnccl and two or more GPUs (NCCL_NVLS_ENABLE=0)"]
fn every_gpu_a_rank() {
    let ranks = cudarc::driver::CudaContext::device_count().unwrap() as usize;
    assert!(ranks >= 2, "this test needs two or more GPUs, found {ranks}");
    let id = NcclId::new().unwrap();
    std::thread::scope(|s| {
        for rank in 0..ranks {
            s.spawn(move || {
                let engine = CudaEngine::new(rank).unwrap();
                let group = NcclGroup::new(&engine, &id, rank, ranks).unwrap();
                check_rank(&engine, &group);
            });
        }
    });
}
