//! CPU engine against a sort-based baseline and a plain pass over the same data.
//!
//! Geometries: 64 x 131072 f32 and 1 x 1048576 f32, k = 2048, normal scores.
//! Each group has three entries:
//! - `flashsel cpu select`: [`flashsel::cpu::select`] (values included);
//! - `sort baseline`: every row's composites sorted descending, first k kept;
//! - `sum pass`: one read of every score (16 independent lanes so it runs at
//!   memory speed), rayon-parallel like the others; the floor for any selection.
//!
//! `cargo bench -p flashsel --bench cpu_select`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use flashsel::{composite, cpu, NanPolicy, ScoreElem, ScoresView};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

fn scores(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    (0..rows * cols).map(|_| normal.sample(&mut rng)).collect()
}

/// Sort each row's composites, keep the first k (indices and values).
fn sort_baseline(data: &[f32], cols: usize, k: usize) -> Vec<i32> {
    let rows = data.len() / cols;
    let mut out = vec![-1i32; rows * k];
    out.par_chunks_mut(k).zip(data.par_chunks(cols)).for_each(|(o, row)| {
        let mut c: Vec<u64> =
            row.iter().enumerate().map(|(i, x)| composite(x.key(NanPolicy::Lowest), i as u32)).collect();
        if rows == 1 {
            c.par_sort_unstable_by(|a, b| b.cmp(a));
        } else {
            c.sort_unstable_by(|a, b| b.cmp(a));
        }
        for (o, &c) in o.iter_mut().zip(&c[..k.min(c.len())]) {
            *o = (u32::MAX - c as u32) as i32;
        }
    });
    out
}

/// Reads every score once: 16 lanes of partial sums (vectorisable), in
/// parallel over slices of at most 64 Ki elements.
fn sum_pass(data: &[f32], cols: usize) -> f32 {
    data.par_chunks(cols.min(1 << 16))
        .map(|part| {
            let mut acc = [0.0f32; 16];
            let mut it = part.chunks_exact(16);
            for c in &mut it {
                for (a, x) in acc.iter_mut().zip(c) {
                    *a += x;
                }
            }
            acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
        })
        .sum()
}

fn bench_geometry(c: &mut Criterion, rows: usize, cols: usize, k: usize) {
    let data = scores(rows, cols, 0x5eed);
    let view = ScoresView::new(&data, rows, cols).unwrap();
    let spec = view.spec(k);
    // The engine must agree with the baseline before anything is timed.
    let sel = cpu::select(&view, &spec, None).unwrap();
    assert_eq!(sel.indices, sort_baseline(&data, cols, k));

    let mut g = c.benchmark_group(format!("{rows}x{cols} f32 k={k}"));
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements((rows * cols) as u64));
    g.bench_function("flashsel cpu select", |b| b.iter(|| cpu::select(black_box(&view), &spec, None).unwrap()));
    g.bench_function("sort baseline", |b| b.iter(|| sort_baseline(black_box(&data), cols, k)));
    g.bench_function("sum pass", |b| b.iter(|| sum_pass(black_box(&data), cols)));
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_geometry(c, 64, 131_072, 2048);
    bench_geometry(c, 1, 1 << 20, 2048);
}

criterion_group!(cpu_select, benches);
criterion_main!(cpu_select);
