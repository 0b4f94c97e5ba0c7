//! One device session: correctness suite, graph replay, then timings.
//! Usage: device_run [quick|full] [time]
use flashsel::cuda::check::{self, Data, Rng};
use flashsel::cuda::CudaEngine;
use flashsel::{ScoreElem, ScoresView, SelectSpec};
use half::bf16;

/// Slots of select.cu's `fs_prof` (its length in a FS_PROFILE build).
const PROF_SLOTS: usize = 48;

fn tune_shape<T: ScoreElem>(rows: usize, cols: usize, k: usize, data: Data, variants: &[String], rng: &mut Rng) {
    let seed = rng.next_u64();
    if variants.is_empty() {
        return;
    }
    let typed: Vec<T> = check::generate_seeded(data, rows * cols, seed).iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&typed, rows, cols).unwrap();
    let spec = SelectSpec::new(rows, cols, k, T::DTYPE);
    let want = flashsel::cpu::select(&view, &spec, None).unwrap();
    for var in variants {
        // "DEFINES" or "DEFINES@CAP" (a buffer capacity in place of the planner's)
        let (defs, cap) = match var.split_once('@') {
            Some((d, c)) => (d, c.parse().ok()),
            None => (var.as_str(), None),
        };
        let e = CudaEngine::new(0).unwrap().with_tuning(defs, cap);
        let plan = e.plan(&spec, false).unwrap();
        let (got, mut t) = e.time_select(&view, &spec, None, 10).unwrap();
        let prof = if defs.contains("PROFILE") { e.take_profile().unwrap() } else { vec![0; PROF_SLOTS] };
        t.sort_by(f64::total_cmp);
        let med = t[t.len() / 2];
        let per = |tot: u64, n: u64| if n == 0 { 0.0 } else { tot as f64 / n as f64 };
        // finish_row runs once per row (row path) or once per split row (its last CTA).
        let fin = if plan.ctas_per_row > 1 { prof[4] / plan.ctas_per_row as u64 } else { prof[4] };
        println!(
            "TUNE {rows}x{cols} k{k} {} {data:?} [{var}] {:.2} us ({:.0} GB/s) ok={} | rows {} cyc/row {:.0} loop compactions {} redone segs {} finish cyc/row {:.0} | restarts {} split fallbacks {} last-CTA merge cyc {:.0} | hist passes {} | finishes {} (bucket {}): compact {:.0} sort {:.0} write {:.0} cyc, {:.0} cands",
            T::DTYPE.name(),
            med * 1e6,
            (rows * cols * std::mem::size_of::<T>()) as f64 / med / 1e9,
            got.indices == want.indices,
            prof[4],
            per(prof[0], prof[4]),
            prof[2],
            prof[5],
            per(prof[3], prof[4]),
            prof[6],
            prof[7],
            per(prof[9], (prof[4] / plan.ctas_per_row as u64).max(1)),
            prof[16],
            fin,
            prof[14],
            per(prof[10], fin),
            per(prof[11], fin),
            per(prof[12], fin),
            per(prof[13], fin)
        );
        if defs.contains("PROFILE") {
            println!("PROF {rows}x{cols} k{k} {data:?} [{var}] raw {prof:?}");
        }
        if prof[14] > 0 {
            println!(
                "BUCKET {rows}x{cols} k{k} {data:?} [{var}] per bucket-rank finish (cycles, all passes): {}",
                averages(&prof, 14, &[("ranges", 8), ("histogram + scan", 15), ("scatter", 17), ("rank", 31)])
            );
        }
        if prof[20] > 0 {
            println!(
                "GRID {rows}x{cols} k{k} {data:?} [{var}] per row (CTA 0, ns): passes {:.2} (sampled: resolved {} fell back {}) | {} ({:.0} MHz)",
                prof[21] as f64 / prof[20] as f64,
                prof[33],
                prof[34],
                averages(
                    &prof,
                    20,
                    &[
                        ("load", 22),
                        ("sample loads", 36),
                        ("bound: top keys + barrier", 40),
                        ("bound: rank", 37),
                        ("PDL wait", 32),
                        ("passes: work", 23),
                        // FS_GRID_POLL (default): no pass barrier; the
                        // wait is in the histogram reads before a decision.
                        ("barrier", 24),
                        ("reads + decide", 25),
                        ("gather: count + atomic", 38),
                        ("gather: writes", 26),
                        ("barrier", 27),
                        ("stage", 30),
                        ("place: count", 18),
                        ("write", 28),
                        ("total", 29),
                    ]
                ),
                1e3 * prof[19] as f64 / prof[29].max(1) as f64
            );
        }
    }
}

/// `name value | ...`: each fs_prof slot's total over the count in slot `per`.
fn averages(prof: &[u64], per: usize, fields: &[(&str, usize)]) -> String {
    let n = prof[per].max(1) as f64;
    fields.iter().map(|&(name, i)| format!("{name} {:.0}", prof[i] as f64 / n)).collect::<Vec<_>>().join(" | ")
}

/// Times kernel variants (`-D` sets, `;`-separated in FS_TUNE) on the main shapes.
fn tune(bw: f64) {
    let variants: Vec<String> =
        std::env::var("FS_TUNE").unwrap_or("FS_PROFILE=1".into()).split(';').map(|s| s.trim().to_string()).collect();
    // FS_SHAPES="0,3": only those shapes (default: all; 7 = the trap cases,
    // which run last).
    // Every shape draws its seed either way, so its data does not depend on
    // which others run.
    let only: Option<Vec<usize>> =
        std::env::var("FS_SHAPES").ok().map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect());
    let on = |i: usize| only.as_ref().is_none_or(|v| v.contains(&i));
    let none: Vec<String> = Vec::new();
    let vs = |i: usize| if on(i) { &variants } else { &none };
    let mut rng = Rng::new(5);
    tune_shape::<f32>(1, 262_144, 512, Data::Normal, vs(0), &mut rng);
    tune_shape::<f32>(1, 1_048_576, 2048, Data::Normal, vs(1), &mut rng);
    tune_shape::<f32>(64, 131_072, 2048, Data::Normal, vs(2), &mut rng);
    tune_shape::<f32>(2048, 131_072, 2048, Data::Normal, vs(3), &mut rng);
    tune_shape::<bf16>(2048, 131_072, 2048, Data::Normal, vs(4), &mut rng);
    tune_shape::<f32>(2048, 131_072, 2048, Data::ReluFew, vs(5), &mut rng);
    tune_shape::<f32>(1, 1_048_576, 2048, Data::ReluFew, vs(6), &mut rng);
    // 8, 9: where the grid and split paths meet (16 grid CTAs, k 2048).
    tune_shape::<f32>(1, 65_536, 2048, Data::Normal, vs(8), &mut rng);
    tune_shape::<bf16>(1, 65_536, 2048, Data::Normal, vs(9), &mut rng);
    // 10: a short row-path call (one kernel, 128 CTAs).
    tune_shape::<f32>(128, 32_768, 2048, Data::Normal, vs(10), &mut rng);
    // FS_EXTRA="1x131072k512,2x262144k512": more f32 normal shapes (after the
    // fixed ones, so their data stays as it was).
    for shape in std::env::var("FS_EXTRA").unwrap_or_default().split(',').filter(|s| !s.trim().is_empty()) {
        let dims: Option<Vec<usize>> = shape.trim().split(['x', 'k']).map(|d| d.parse().ok()).collect();
        match dims.as_deref() {
            Some(&[rows, cols, k]) => tune_shape::<f32>(rows, cols, k, Data::Normal, &variants, &mut rng),
            _ => eprintln!("FS_EXTRA: {shape:?} is not ROWSxCOLSkK"),
        }
    }
    if !on(7) {
        return;
    }
    // One f32 selection in a FS_PROFILE build: (exact?, fs_prof, path).
    let profiled = |data: &[f32], rows: usize, cols: usize, k: usize| {
        let view = ScoresView::new(data, rows, cols).unwrap();
        let spec = SelectSpec::new(rows, cols, k, flashsel::DType::F32);
        let e = CudaEngine::new(0).unwrap().with_tuning("FS_PROFILE=1", None);
        let got = e.select_host(&view, &spec, None).unwrap();
        let prof = e.take_profile().unwrap();
        let want = flashsel::cpu::select(&view, &spec, None).unwrap();
        (got.indices == want.indices, prof, e.plan(&spec, false).unwrap().path)
    };
    // The samplers' fallbacks must run on trap data (fs_prof[6]: row-path
    // restarts, [7]: split-row exact fallbacks).
    for &(rows, cols, k, period) in &[(300usize, 65_536usize, 5000usize, 4096usize), (1, 262_144, 8192, 16_384)] {
        let data = check::generate(Data::SampleTrap { period }, rows * cols, &mut rng);
        let (ok, prof, path) = profiled(&data, rows, cols, k);
        println!("TRAP {rows}x{cols} k{k}: ok={ok} row restarts {} split fallbacks {} plan {path:?}", prof[6], prof[7]);
    }
    // The grid path's sampled pass must fall back on its trap data
    // (fs_prof[34]) and resolve on normal rows (fs_prof[33]).
    for &(cols, k, data) in &[
        (1usize << 20, 4096usize, Data::GridSampleHigh { len: 1 << 20 }),
        (1 << 20, 2048, Data::GridSampleLow { len: 1 << 20 }),
        (262_144, 512, Data::GridSampleLow { len: 262_144 }),
        (1 << 20, 2048, Data::Normal),
    ] {
        let (ok, prof, path) = profiled(&check::generate(data, cols, &mut rng), 1, cols, k);
        println!(
            "GRIDTRAP 1x{cols} k{k} data {data:?}: ok={ok} sampled pass resolved {} fell back {} passes {} plan {path:?}",
            prof[33], prof[34], prof[21]
        );
    }
    let _ = bw;
}

fn time_shape<T: ScoreElem>(e: &CudaEngine, rows: usize, cols: usize, k: usize, data: Data, bw: f64, rng: &mut Rng) {
    let spec = SelectSpec::new(rows, cols, k, T::DTYPE);
    let typed: Vec<T> =
        check::generate_seeded(data, rows * cols, rng.next_u64()).iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&typed, rows, cols).unwrap();
    let plan = e.plan(&spec, false).unwrap();
    let (got, mut t) = e.time_select(&view, &spec, None, 30).unwrap();
    t.sort_by(f64::total_cmp);
    let med = t[t.len() / 2];
    // verify a sample of rows
    let want_rows: Vec<usize> = (0..rows).step_by((rows / 16).max(1)).collect();
    let mut ok = true;
    for &r in &want_rows {
        let sub = ScoresView::new(view.row(r), 1, cols).unwrap();
        let w = flashsel::cpu::select(&sub, &SelectSpec::new(1, cols, k, T::DTYPE), None).unwrap();
        if w.indices[..] != got.indices[r * k..(r + 1) * k] {
            ok = false;
        }
    }
    let bytes = (rows * cols * std::mem::size_of::<T>()) as f64;
    let floor = bytes / bw;
    println!(
        "TIME {rows:>5} x {cols:>8} k {k:>5} {:>4} {:>9} | {:>9.2} us (min {:>9.2}) | {:>7.1} GB/s | floor {:>8.2} us | {:>5.1}% | path {:?} ctas/row {} levels {} | verified {}",
        T::DTYPE.name(),
        format!("{data:?}"),
        med * 1e6,
        t[0] * 1e6,
        bytes / med / 1e9,
        floor * 1e6,
        100.0 * floor / med,
        plan.path,
        plan.ctas_per_row,
        plan.merge_levels,
        if ok { "ok" } else { "MISMATCH" }
    );
}

/// The time mode's data seed (its single rows are timed twice on the same data).
const TIME_SEED: u64 = 99;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or("quick".into());
    let e = CudaEngine::new(0).expect("cuda");
    println!("device {} arch {} props {:?}", e.device_name(), e.arch(), e.props());
    let t = std::time::Instant::now();
    e.warm_up().expect("compile");
    println!("compiled in {:.2}s", t.elapsed().as_secs_f64());
    if std::env::args().any(|a| a == "tune") {
        tune(0.0);
    }
    if mode == "small" {
        // For compute-sanitizer: the suite's small cases, plus grid rows, split
        // rows (sampled and not) and one global-buffer geometry.
        let mut rng = Rng::new(11);
        let mut cases: Vec<check::Case> =
            check::suite(&e, true, &mut rng).into_iter().filter(|c| c.rows * c.cols <= 40_000).step_by(12).collect();
        let extra = |rows, cols, k, data| check::Case {
            rows,
            cols,
            k,
            dtype: flashsel::DType::F32,
            data,
            order: flashsel::OutputOrder::Score,
            nan: flashsel::NanPolicy::Lowest,
            stride_pad: 1,
            lengths: None,
        };
        cases.push(extra(1, 40_000, 512, Data::Normal));
        cases.push(extra(1, 70_000, 512, Data::Relu));
        cases.push(extra(1, 140_000, 512, Data::ReluFew));
        // A grid row whose sampled pass falls back to the exact passes.
        cases.push(extra(1, 140_000, 512, Data::GridSampleLow { len: 140_000 }));
        cases.push(extra(2, 40_000, 20_000, Data::Normal));
        // k past the grid path's: split rows, shared buffer (sampled or not).
        cases.push(extra(1, 40_000, 5000, Data::Normal));
        cases.push(extra(1, 140_000, 4500, Data::ReluFew));
        let (mut run, mut failed) = (0, 0);
        for c in &cases {
            let o = check::run_case(&e, c, &mut rng).unwrap();
            run += 1;
            if !o.ok {
                failed += 1;
                println!("FAIL {} {}", o.case, o.detail);
            }
        }
        println!("SMALL cases run {run} failed {failed}");
    }
    if mode == "quick" || mode == "full" {
        let rep = check::run_suite(&e, mode == "quick", 7, |i, n, o| {
            if !o.ok {
                println!("FAIL [{i}/{n}] {} :: {}", o.case, o.detail);
            } else if i % 25 == 0 || i == n {
                println!("ok [{i}/{n}] {} ({:?} x{})", o.case, o.path, o.ctas_per_row);
            }
        })
        .unwrap();
        println!("CHECK cases run {} failed {} by path {:?}", rep.run, rep.failed, rep.by_path);
    }
    if std::env::args().any(|a| a == "time") {
        let bw = e.copy_bandwidth(1 << 30).unwrap();
        println!("copy bandwidth {:.2} TB/s", bw / 1e12);
        let mut rng = Rng::new(TIME_SEED);
        for data in [Data::Normal, Data::ReluFew] {
            time_shape::<f32>(&e, 1, 262_144, 512, data, bw, &mut rng);
            time_shape::<f32>(&e, 1, 1_048_576, 2048, data, bw, &mut rng);
            time_shape::<f32>(&e, 64, 131_072, 2048, data, bw, &mut rng);
            time_shape::<f32>(&e, 8192, 131_072, 2048, data, bw, &mut rng);
            time_shape::<bf16>(&e, 8192, 131_072, 2048, data, bw, &mut rng);
            time_shape::<bf16>(&e, 1, 262_144, 512, data, bw, &mut rng);
        }
        // The two single rows again, on the same data (the same seeds), after
        // everything else: whether their place in the run (first after the
        // bandwidth copies) moves their time.
        println!("again, the same data, timed last:");
        let mut rng = Rng::new(TIME_SEED);
        time_shape::<f32>(&e, 1, 262_144, 512, Data::Normal, bw, &mut rng);
        time_shape::<f32>(&e, 1, 1_048_576, 2048, Data::Normal, bw, &mut rng);
    }
}
