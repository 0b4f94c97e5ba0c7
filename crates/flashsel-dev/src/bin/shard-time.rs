//! Times the GPU merge of context-parallel selection (issue 24): the
//! candidates of R simulated ranks (each rank's exact local top-k of its
//! shard of 1,048,576 columns, global ids, ascending) merged on the device
//! into the whole row's top 2048, against one device selecting over the
//! whole row. Every merged result is checked byte for byte against the CPU
//! engine's selection on the whole row. The all-gather is not measured here
//! (one GPU).
//!
//!   shard-time [--quick]
use flashsel::cuda::CudaEngine;
use flashsel::data::normal_scores;
use flashsel::ops::shard::{simulate_ranks, ShardLayout};
use flashsel::{cpu, OutputOrder, ScoreElem, ScoresView, SelectSpec};
use half::bf16;

fn med(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2] * 1e6
}

fn run<T: ScoreElem>(e: &CudaEngine, rows: usize, cols: usize, k: usize, ranks: usize, order: OutputOrder) {
    let raw = normal_scores(rows * cols, 24, rows as u64);
    let buf: Vec<T> = raw.iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&buf, rows, cols).unwrap();
    let spec = SelectSpec::new(rows, cols, k, T::DTYPE).with_order(order);
    let layout = ShardLayout::even(cols, ranks).unwrap();
    let (ids, vals) = simulate_ranks(&view, &spec, &layout, None, None).unwrap();
    let (got, tm) = e.time_shard_merge(&ids, &vals, &spec, &layout, None, None, 50).unwrap();
    let want = cpu::select(&view, &spec, None).unwrap();
    let same = got.indices == want.indices && got.values.iter().zip(&want.values).all(|(a, b)| a.bits() == b.bits());
    // One device on the whole row, and one rank's local selection on its shard.
    let (_, tw) = e.time_select(&view, &spec, None, 50).unwrap();
    let (tm, tw) = (med(tm), med(tw));
    let per = cols / ranks;
    let local: Vec<T> = (0..rows).flat_map(|r| view.row(r)[..per].to_vec()).collect();
    let lview = ScoresView::new(&local, rows, per).unwrap();
    let lspec = SelectSpec::new(rows, per, k, T::DTYPE).with_order(OutputOrder::Index);
    let tl = med(e.time_select(&lview, &lspec, None, 50).unwrap().1);
    println!(
        "SHARD {rows:>2} x {cols} {:<4} k={k} ranks={ranks} order={order:?}: merge {:>8.2} us  local select {:>8.2} us  \
         (local + merge {:>8.2} us)  one device {:>8.2} us  {}",
        T::DTYPE.to_string(),
        tm,
        tl,
        tl + tm,
        tw,
        if same { "ok" } else { "MISMATCH" }
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let e = CudaEngine::new(0).expect("a CUDA device");
    e.warm_up().unwrap();
    println!("device: {}", e.device_name());
    let cols = 1 << 20;
    for rows in [1usize, 16] {
        for ranks in [2usize, 4, 8] {
            run::<bf16>(&e, rows, cols, 2048, ranks, OutputOrder::Index);
            if !quick {
                run::<f32>(&e, rows, cols, 2048, ranks, OutputOrder::Score);
            }
        }
    }
}
