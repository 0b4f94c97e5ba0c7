//! `flashsel-dev`: developer runs of flashsel's kernels.
//!
//! ```text
//! flashsel-dev time              the target shapes on the GPU: graph replays / events, medians, floors
//! flashsel-dev small             the check suite's small cases and one of each path (for compute-sanitizer)
//! flashsel-dev short             the short-row path against the row path on its target shapes (QSA's
//!                                first chunk, plain 8192 x 2048 k 512 with and without lengths)
//! flashsel-dev wide              the short path's wide kernel against the path the same rows take
//!                                without it (few rows of <= 16,384 columns; QSA decode rows)
//! flashsel-dev ranges            DSA's ranges to slots (64 x 131,072 f32, k 2048) beside the same rows
//!                                without slots, with aligned starts, and as plain rows with lengths: what
//!                                the ranges' heads and the slot write cost; built with `--features
//!                                profile`, also the split token kernels' phase cycles per row
//! flashsel-dev rowstats [N]      what the grid sampled pass sees on N+1 random 262,144-column rows (CPU)
//! flashsel-dev cubin ARCH MODULE [OUT] [--profile]   the ptxas log of one module (select/filter,
//!                                select/grid), and its cubin; --profile: the build with phase counters
//! ```

use flashsel::cuda::compile::{self, Module};
use flashsel::cuda::CudaEngine;
use flashsel::data::{generate_seeded, Data, Rng};
use flashsel::ops::select::check;
use flashsel::{DType, NanPolicy, OutputOrder, PageMap, ScoreElem, ScoresView, SelectSpec};
use half::bf16;

/// The time mode's data seed (its single rows are timed twice on the same data).
const TIME_SEED: u64 = 99;
/// Bins of the grid kernel's histograms.
const BINS: usize = 2048;

fn time_shape<T: ScoreElem>(e: &CudaEngine, rows: usize, cols: usize, k: usize, data: Data, bw: f64, rng: &mut Rng) {
    time_shape_in::<T>(e, rows, cols, k, OutputOrder::Score, data, bw, rng)
}

/// A plan's path, with the short path's kernel (`Short(warp)`, `Short(cta)`).
fn path_name(plan: &flashsel::ops::select::plan::Plan) -> String {
    match plan.short() {
        Some(s) => format!("Short({})", s.kernel.name()),
        None => format!("{:?}", plan.path()),
    }
}

/// The short-row A/B's engine settings: the row path (short path off), the
/// short path's CTA kernel, its warp kernel on every short row it fits.
const SHORT_MODES: [(&str, bool, u64); 3] =
    [("row", false, 0), ("cta", true, 0), ("warp", true, flashsel::ops::select::plan::SHORT_COLS)];

/// The engine's default short-row settings again.
fn short_defaults(e: &CudaEngine) {
    use flashsel::ops::select::plan::{SHORT_WARP_COLS, SHORT_WARP_MIN_ROWS};
    e.set_short_rows(true);
    e.set_short_warp(SHORT_WARP_COLS, SHORT_WARP_MIN_ROWS);
}

#[allow(clippy::too_many_arguments)]
fn time_shape_in<T: ScoreElem>(
    e: &CudaEngine,
    rows: usize,
    cols: usize,
    k: usize,
    order: OutputOrder,
    data: Data,
    bw: f64,
    rng: &mut Rng,
) {
    let spec = SelectSpec::new(rows, cols, k, T::DTYPE).with_order(order);
    let typed: Vec<T> = generate_seeded(data, rows * cols, rng.next_u64()).iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&typed, rows, cols).unwrap();
    let plan = e.plan(&spec, false).unwrap();
    let (got, mut t) = e.time_select(&view, &spec, None, 30).unwrap();
    t.sort_by(f64::total_cmp);
    let med = t[t.len() / 2];
    // Sixteen rows against the CPU engine.
    let ok = (0..rows).step_by((rows / 16).max(1)).all(|r| {
        let sub = ScoresView::new(view.row(r), 1, cols).unwrap();
        let w = flashsel::cpu::select(&sub, &SelectSpec::new(1, cols, k, T::DTYPE).with_order(order), None).unwrap();
        w.indices[..] == got.indices[r * k..(r + 1) * k]
    });
    let bytes = (rows * cols * std::mem::size_of::<T>()) as f64;
    let floor = bytes / bw;
    println!(
        "TIME {rows:>5} x {cols:>8} k {k:>5} {:>4} {:>9}{} | {:>9.2} us (min {:>9.2}) | {:>7.1} GB/s | floor {:>8.2} us | {:>5.1}% | path {} ctas/row {} | verified {}",
        T::DTYPE.name(),
        format!("{data:?}"),
        if order == OutputOrder::Index { " index" } else { "" },
        med * 1e6,
        t[0] * 1e6,
        bytes / med / 1e9,
        floor * 1e6,
        100.0 * floor / med,
        path_name(&plan),
        plan.ctas_per_row(),
        if ok { "ok" } else { "MISMATCH" }
    );
}

fn time(e: &CudaEngine) {
    let bw = e.copy_bandwidth(1 << 30).unwrap();
    println!("copy bandwidth {:.2} TB/s", bw / 1e12);
    let mut rng = Rng::new(TIME_SEED);
    for data in [Data::Normal, Data::ReluFew] {
        time_shape::<f32>(e, 1, 262_144, 512, data, bw, &mut rng);
        time_shape::<f32>(e, 1, 1_048_576, 2048, data, bw, &mut rng);
        time_shape::<f32>(e, 64, 131_072, 2048, data, bw, &mut rng);
        time_shape::<f32>(e, 8192, 131_072, 2048, data, bw, &mut rng);
        time_shape::<bf16>(e, 8192, 131_072, 2048, data, bw, &mut rng);
        time_shape::<bf16>(e, 1, 262_144, 512, data, bw, &mut rng);
    }
    // The single rows over more random rows: their time depends on the data.
    println!("1 x 262,144 k 512 and 1 x 1,048,576 k 2048 over 8 random normal rows each:");
    for _ in 0..8 {
        time_shape::<f32>(e, 1, 262_144, 512, Data::Normal, bw, &mut rng);
    }
    for _ in 0..8 {
        time_shape::<f32>(e, 1, 1_048_576, 2048, Data::Normal, bw, &mut rng);
    }
}

fn small(e: &CudaEngine) {
    let mut rng = Rng::new(11);
    let mut cases: Vec<check::Case> =
        check::suite(e, true, &mut rng).into_iter().filter(|c| c.rows * c.cols <= 40_000).step_by(12).collect();
    let extra = |rows, cols, k, data| check::Case {
        rows,
        cols,
        k,
        dtype: DType::F32,
        data,
        order: OutputOrder::Score,
        nan: NanPolicy::Lowest,
        stride_pad: 1,
        lengths: None,
        ranges: false,
        page_size: None,
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
    // The token kernels: ranges and slots on the row, split and grid paths.
    for (rows, cols, k, page_size) in
        [(12, 3000, 300, Some(16)), (3, 40_000, 2048, Some(64)), (1, 140_000, 512, Some(64)), (2, 40_000, 5000, None)]
    {
        let mut c = extra(rows, cols, k, Data::Relu);
        c.ranges = true;
        c.page_size = page_size;
        c.order = OutputOrder::Index;
        cases.push(c);
    }
    let (mut run, mut failed) = (0, 0);
    let mut report = |o: check::Outcome| {
        run += 1;
        if !o.ok {
            failed += 1;
            println!("FAIL {} {}", o.case, o.detail);
        }
    };
    for c in &cases {
        report(check::run_case(e, c, &mut rng).unwrap());
    }
    // The short-row path: plain rows with lengths at the edges, both
    // orders, unaligned strides, k past cols; ranges with slots.
    for (rows, cols, k, data, order) in [
        (9, 2048, 512, Data::Normal, OutputOrder::Score),
        (9, 8192, 2048, Data::ReluFew, OutputOrder::Index),
        (7, 300, 500, Data::Nan5, OutputOrder::Score),
        (6, 1000, 100, Data::AllEqual, OutputOrder::Index),
    ] {
        let mut c = extra(rows, cols, k, data);
        c.order = order;
        c.lengths = Some(check::LengthRecipe::Edges);
        c.stride_pad = 1;
        cases.push(c);
    }
    let mut c = extra(10, 2048, 512, Data::Relu);
    c.ranges = true;
    c.page_size = Some(16);
    c.order = OutputOrder::Index;
    cases.push(c);
    // QSA rows on each path, and device values out of range (nothing read
    // outside the inputs: the point of running this under memcheck).
    let qsa = flashsel::ops::qsa::check::cases(true);
    let row_path = qsa.iter().filter(|c| c.rows * c.blocks <= 70_000).take(3);
    let grid_path = qsa.iter().filter(|c| c.rows == 1 && c.blocks == 16_384);
    // A first chunk on the short-row path (copy rows, rows one past k).
    let short_path = qsa.iter().filter(|c| c.blocks == 2048 && c.rows <= 256).take(2);
    for c in row_path.chain(grid_path).chain(short_path) {
        report(flashsel::ops::qsa::check::run_case(e, c, &mut rng).unwrap());
    }
    report(flashsel::ops::qsa::check::bad_rows_check(e, &mut rng).unwrap());
    // Sparse MLA: prefill one pass and split, every cache format (nothing
    // read outside the attended rows and the outputs).
    for c in flashsel::ops::mla::check::small_cases() {
        let o = flashsel::ops::mla::check::run_case(e, &c, &mut rng).unwrap();
        run += 1;
        if !o.ok {
            failed += 1;
            println!("FAIL {} {}", o.case, o.detail);
        }
    }
    println!("SMALL cases run {run} failed {failed}");
}

/// The short-row path's kernels (CTA and warp) against the row path (the
/// engine's switches, SHORT_MODES) on its target shapes: QSA's first
/// 8192-token chunk (positions 0 .. 8191, ratio 4, k 512: V = 0 .. 2,048
/// blocks) and plain top-k 8192 x 2048 k 512 with the same lengths; graph
/// replays, medians of 30; every output against the CPU engine.
fn time_short(e: &CudaEngine) {
    use flashsel::ops::qsa::QsaSpec;
    let (rows, cols, k) = (8192usize, 2048usize, 512usize);
    let data = generate_seeded(Data::Normal, rows * cols, TIME_SEED);
    let positions: Vec<i64> = (0..rows as i64).collect();
    let lengths: Vec<i32> = positions.iter().map(|&t| ((t + 1) / 4) as i32).collect();
    fn one<T: ScoreElem>(
        e: &CudaEngine,
        data: &[f32],
        positions: &[i64],
        lengths: &[i32],
        rows: usize,
        cols: usize,
        k: usize,
    ) {
        let typed: Vec<T> = data.iter().map(|&x| T::from_f32(x)).collect();
        let view = ScoresView::new(&typed, rows, cols).unwrap();
        for order in [OutputOrder::Index, OutputOrder::Score] {
            let qspec = QsaSpec::new(rows, cols).with_ratio(4).with_k_blocks(k).with_order(order);
            let want = flashsel::cpu::qsa_select(&view, positions, &qspec, None).unwrap();
            for (_, short, warp) in SHORT_MODES {
                e.set_short_rows(short);
                e.set_short_warp(warp, 0);
                let path = path_name(&e.plan(&SelectSpec::new(rows, cols, k, T::DTYPE), true).unwrap());
                let (got, mut t) = e.time_qsa_select(&view, positions, &qspec, None, 30).unwrap();
                t.sort_by(f64::total_cmp);
                let ok = got.ids == want.ids && got.counts == want.counts;
                println!(
                    "SHORT qsa first chunk {rows} x {cols} k {k} {:>4} order {:>5} | {:>8.2} us (min {:>8.2}) | path {path} | verified {}",
                    T::DTYPE.name(), order.name(), t[t.len() / 2] * 1e6, t[0] * 1e6, if ok { "ok" } else { "MISMATCH" }
                );
            }
            let spec = SelectSpec::new(rows, cols, k, T::DTYPE).with_order(order);
            let want = flashsel::cpu::select(&view, &spec, Some(lengths)).unwrap();
            for (_, short, warp) in SHORT_MODES {
                e.set_short_rows(short);
                e.set_short_warp(warp, 0);
                let path = path_name(&e.plan(&spec, true).unwrap());
                let (got, mut t) = e.time_select(&view, &spec, Some(lengths), 30).unwrap();
                t.sort_by(f64::total_cmp);
                println!(
                    "SHORT topk lengths V  {rows} x {cols} k {k} {:>4} order {:>5} | {:>8.2} us (min {:>8.2}) | path {path} | verified {}",
                    T::DTYPE.name(), order.name(), t[t.len() / 2] * 1e6, t[0] * 1e6, if got == want { "ok" } else { "MISMATCH" }
                );
            }
        }
        short_defaults(e);
    }
    one::<bf16>(e, &data, &positions, &lengths, rows, cols, k);
    one::<f32>(e, &data, &positions, &lengths, rows, cols, k);
    // Plain 8192 x 2048 k 512 without lengths (every row selects; both
    // orders), rows at and past the warp kernel's proposed bound (4096) up
    // to SHORT_COLS, and the short path's widest rows (8192 x 8192 k 2048).
    let mut rng = Rng::new(TIME_SEED);
    let bw = e.copy_bandwidth(1 << 30).unwrap();
    for (mode, short, warp) in SHORT_MODES {
        println!("SHORT mode {mode}");
        e.set_short_rows(short);
        e.set_short_warp(warp, 0);
        time_shape::<bf16>(e, 8192, 2048, 512, Data::Normal, bw, &mut rng);
        time_shape_in::<bf16>(e, 8192, 2048, 512, OutputOrder::Index, Data::Normal, bw, &mut rng);
        time_shape::<f32>(e, 8192, 2048, 512, Data::Normal, bw, &mut rng);
        time_shape_in::<f32>(e, 8192, 2048, 512, OutputOrder::Index, Data::Normal, bw, &mut rng);
        time_shape_in::<bf16>(e, 8192, 1024, 512, OutputOrder::Index, Data::Normal, bw, &mut rng);
        time_shape_in::<bf16>(e, 8192, 3072, 512, OutputOrder::Index, Data::Normal, bw, &mut rng);
        time_shape_in::<bf16>(e, 8192, 4096, 512, OutputOrder::Index, Data::Normal, bw, &mut rng);
        time_shape::<bf16>(e, 8192, 4096, 512, Data::Normal, bw, &mut rng);
        time_shape::<f32>(e, 1024, 8192, 512, Data::ReluFew, bw, &mut rng);
        time_shape_in::<f32>(e, 1024, 8192, 512, OutputOrder::Index, Data::ReluFew, bw, &mut rng);
        // Rows of 2,048 from a few per SM up: where the warp kernel's
        // latency stops being hidden.
        for rows in [133, 264, 528, 1024] {
            time_shape_in::<bf16>(e, rows, 2048, 512, OutputOrder::Index, Data::Normal, bw, &mut rng);
            time_shape::<bf16>(e, rows, 2048, 512, Data::Normal, bw, &mut rng);
            time_shape::<f32>(e, rows, 2048, 512, Data::Normal, bw, &mut rng);
        }
        if mode == "warp" {
            continue; // the rest take no short path, or the CTA kernel
        }
        time_shape::<bf16>(e, 8192, 8192, 2048, Data::Normal, bw, &mut rng);
    }
    short_defaults(e);
}

/// The short path's wide kernel (at most one row a SM, the row in one
/// CTA's registers) against the plan the same rows take without it (the
/// engine's `set_short_wide(0)`: the row or grid path) and with its cluster
/// form for the rows that take it (`set_short_cluster`), on single decode
/// rows and a few rows up to SHORT_WIDE_COLS, both orders and the dtypes;
/// then QSA decode rows of 4,096 .. 16,384 blocks (ids and counts). Graph
/// replays, medians of 30, every output against the CPU engine.
fn time_wide(e: &CudaEngine) {
    use flashsel::ops::qsa::QsaSpec;
    use flashsel::ops::select::plan::SHORT_WIDE_COLS;
    let mut rng = Rng::new(TIME_SEED);
    let bw = e.copy_bandwidth(1 << 30).unwrap();
    let shapes: [(usize, usize, usize); 12] = [
        (1, 1024, 512),
        (1, 4096, 512),
        (1, 8192, 512),
        (1, 16_384, 512),
        (1, 16_384, 2048),
        (4, 16_384, 512),
        (16, 16_384, 512),
        (67, 16_384, 256),
        (132, 16_384, 2048),
        (132, 4096, 2048),
        (1, 2048, 32),
        (64, 8192, 2048),
    ];
    let cluster0 = e.short_cluster();
    for (mode, cols, cluster) in
        [("off", 0, false), ("wide", SHORT_WIDE_COLS, false), ("wide, clusters", SHORT_WIDE_COLS, true)]
    {
        if cluster && !cluster0 {
            continue; // no clusters on this device (or FLASHSEL_SHORT_CLUSTER=0)
        }
        println!("WIDE mode {mode}");
        e.set_short_wide(cols);
        e.set_short_cluster(cluster);
        for &(rows, c, k) in &shapes {
            time_shape_in::<bf16>(e, rows, c, k, OutputOrder::Index, Data::Normal, bw, &mut rng);
            time_shape_in::<f32>(e, rows, c, k, OutputOrder::Index, Data::Normal, bw, &mut rng);
            time_shape::<bf16>(e, rows, c, k, Data::Normal, bw, &mut rng);
        }
        time_shape_in::<bf16>(e, 1, 8192, 2048, OutputOrder::Index, Data::ReluFew, bw, &mut rng);
        time_shape_in::<f32>(e, 1, 16_384, 512, OutputOrder::Index, Data::FewValues, bw, &mut rng);
        for blocks in [4096usize, 8192, 16_384] {
            for rows in [1usize, 16] {
                let data = generate_seeded(Data::Normal, rows * blocks, rng.next_u64());
                let typed: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
                let view = ScoresView::new(&typed, rows, blocks).unwrap();
                let positions = vec![(4 * blocks - 1) as i64; rows];
                let qspec = QsaSpec::new(rows, blocks).with_ratio(4).with_k_blocks(512);
                let want = flashsel::cpu::qsa_select(&view, &positions, &qspec, None).unwrap();
                let spec = SelectSpec::new(rows, blocks, 512, DType::BF16).with_order(OutputOrder::Index);
                let path = path_name(&e.plan(&spec, true).unwrap());
                let (got, mut t) = e.time_qsa_select(&view, &positions, &qspec, None, 30).unwrap();
                t.sort_by(f64::total_cmp);
                let ok = got.ids == want.ids && got.counts == want.counts;
                println!(
                    "WIDE qsa decode {rows:>3} x {blocks:>6} blocks k 512 bf16 | {:>8.2} us (min {:>8.2}) | path {path} | verified {}",
                    t[t.len() / 2] * 1e6,
                    t[0] * 1e6,
                    if ok { "ok" } else { "MISMATCH" }
                );
            }
        }
    }
    e.set_short_wide(SHORT_WIDE_COLS);
    e.set_short_cluster(cluster0);
}

/// DSA's bench shape (`flashsel bench --only dsa`: row r selects [1 + 7r,
/// cols - 63 + r), k 2048, index order, slots through a random table of
/// 64-token pages) in four forms, each timed (graph replays, median of 30)
/// and checked against the CPU engine: ranges to slots; the same ranges
/// without slots; starts rounded down to 16 bytes (no heads) to slots; and
/// plain rows with lengths `end - start` from column 0. With the `profile`
/// feature: each form's filter phase counters.
fn time_ranges(e: &CudaEngine) {
    let (rows, cols, k, page_size) = (64usize, 131_072usize, 2048usize, 64usize);
    let mut rng = Rng::new(TIME_SEED);
    let data = generate_seeded(Data::Normal, rows * cols, rng.next_u64());
    let view = ScoresView::new(&data, rows, cols).unwrap();
    let spec = SelectSpec::new(rows, cols, k, DType::F32).with_order(OutputOrder::Index);
    let starts: Vec<i32> = (0..rows).map(|r| (1 + 7 * r) as i32).collect();
    let ends: Vec<i32> = (0..rows).map(|r| (cols - (rows - 1 - r)) as i32).collect();
    let aligned: Vec<i32> = starts.iter().map(|&s| s & !3).collect();
    let lengths: Vec<i32> = starts.iter().zip(&ends).map(|(&s, &e)| e - s).collect();
    let max_pages = cols.div_ceil(page_size);
    let table = flashsel::data::page_table(&mut rng, 1, max_pages);
    let seq_ids = vec![0i32; rows];
    let pages = PageMap::new(&table, max_pages, page_size, &seq_ids).unwrap();
    let median = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2] * 1e6
    };
    type Form<'a> = (&'a str, &'a [i32], Option<&'a PageMap<'a>>);
    let forms: [Form; 3] = [
        ("ranges, slots", &starts, Some(&pages)),
        ("ranges", &starts, None),
        ("aligned ranges, slots", &aligned, Some(&pages)),
    ];
    let plan = e.plan(&spec, true).unwrap();
    #[cfg(feature = "profile")]
    for m in [Module::SelectFilterTokens, Module::SelectFilter] {
        e.take_profile(m, false).unwrap(); // the counts of earlier runs
    }
    for (name, s, p) in forms {
        let (got, t) = e.time_select_ranges(&view, &spec, Some(s), Some(&ends), p, 30).unwrap();
        let want = match p {
            Some(m) => flashsel::cpu::select_ranges_paged(&view, &spec, Some(s), Some(&ends), m).unwrap(),
            None => flashsel::cpu::select_ranges(&view, &spec, s, Some(&ends)).unwrap(),
        };
        println!(
            "RANGES {name:<22} {:>8.2} us | path {} | verified {}",
            median(t),
            path_name(&plan),
            if got.indices == want.indices { "ok" } else { "MISMATCH" }
        );
        print_filter_profile(e, Module::SelectFilterTokens, plan.ctas_per_row());
    }
    let (got, t) = e.time_select(&view, &spec, Some(&lengths), 30).unwrap();
    let want = flashsel::cpu::select(&view, &spec, Some(&lengths)).unwrap();
    println!(
        "RANGES {:<22} {:>8.2} us | path {} | verified {}",
        "plain, lengths",
        median(t),
        path_name(&plan),
        if got.indices == want.indices { "ok" } else { "MISMATCH" }
    );
    print_filter_profile(e, Module::SelectFilter, plan.ctas_per_row());
}

/// A filter module's phase counters since the last read (common/profile.cuh:
/// slots 0-4 per CTA row, 9-13 per finished row, 7 rescues, 8/14/15/17/31 the
/// bucket rank, 41-43 the index-order finish), as averages;
/// `ctas`: CTAs a row (the plan's). The `profile` feature only.
#[cfg(feature = "profile")]
fn print_filter_profile(e: &CudaEngine, module: Module, ctas: u32) {
    let p = e.take_profile(module, false).unwrap();
    let cta_rows = p[4].max(1) as f64;
    let rows = (cta_rows / ctas.max(1) as f64).max(1.0);
    let per_cta = |slot: usize| p[slot] as f64 / cta_rows;
    let per_row = |slot: usize| p[slot] as f64 / rows;
    println!(
        "  cycles per CTA row ({:.0} of them): row {:.0}, after the stream {:.0}, loop compactions {:.0} ({:.2} a CTA row); \
         per row ({rows:.0}): last CTA's merge {:.0}, finish compact {:.0}, sort {:.0}, write {:.0}, candidates {:.0}; \
         rescues {}; bucket rank per row: {:.2} finishes, ranges {:.0}, histogram and scan {:.0}, scatter {:.0}, \
         rank {:.0}; index order per row: {:.2} finishes, select {:.0}, place {:.0} (its count's ranges and \
         histogram among the bucket rank's)",
        cta_rows,
        per_cta(0),
        per_cta(3),
        per_cta(1),
        per_cta(2),
        per_row(9),
        per_row(10),
        per_row(11),
        per_row(12),
        per_row(13),
        p[7],
        per_row(14),
        per_row(8),
        per_row(15),
        per_row(17),
        per_row(31),
        per_row(43),
        per_row(41),
        per_row(42)
    );
}
#[cfg(not(feature = "profile"))]
fn print_filter_profile(_: &CudaEngine, _: Module, _: u32) {}

/// Per row: the keys at or above the sampled bound, the bins' shift, the
/// crossing bin and, over the row's CTAs, the bins flushed (one global
/// atomic each) and the keys selected.
fn row_stats(row: &[f32], k: usize, chunks: usize) -> String {
    let Some(sp) = flashsel_dev::grid_sample::grid_sampled_pass(row, k, DType::F32, None) else {
        return "the sampled pass falls back to the exact passes".into();
    };
    let len = row.len();
    let keys: Vec<u32> = row.iter().map(|&x| x.key(NanPolicy::Lowest)).collect();
    let bin = |x: u32| (((x - sp.s_lo) >> sp.shift) as usize).min(BINS - 1);
    let per = len.div_ceil(chunks).div_ceil(8) * 8;
    let (mut admitted, mut flushes) = (0, 0);
    for c in 0..chunks {
        let part = &keys[(c * per).min(len)..((c + 1) * per).min(len)];
        let mut bins: Vec<usize> = part.iter().filter(|&&x| x >= sp.s_lo).map(|&x| bin(x)).collect();
        admitted += bins.len();
        bins.sort_unstable();
        bins.dedup();
        flushes += bins.len();
    }
    format!(
        "admitted {admitted:5} shift {:2} crossing bin {:4} cnt {:3} list {:4} flush atomics {flushes:5}",
        sp.shift,
        sp.bin,
        sp.cnt,
        sp.above + sp.cnt
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    match mode {
        "time" | "small" | "short" | "wide" | "ranges" => {
            let e = CudaEngine::new(0).expect("a CUDA device");
            println!("device {} arch {} props {:?}", e.device_name(), e.arch(), e.props());
            let t = std::time::Instant::now();
            e.warm_up().expect("compile");
            println!("compiled in {:.2}s", t.elapsed().as_secs_f64());
            match mode {
                "time" => time(&e),
                "short" => time_short(&e),
                "wide" => time_wide(&e),
                "ranges" => time_ranges(&e),
                _ => small(&e),
            }
        }
        "rowstats" => {
            let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(14);
            let mut rng = Rng::new(5);
            for i in 0..=n {
                let row = generate_seeded(Data::Normal, 262_144, rng.next_u64());
                println!("262K row {i:2}: {}", row_stats(&row, 512, 128));
            }
        }
        "cubin" => {
            let arch: &'static str = Box::leak(args.get(1).cloned().unwrap_or("sm_90a".into()).into_boxed_str());
            let name = args.get(2).map(String::as_str).unwrap_or("select/filter");
            let Some(module) = Module::ALL.into_iter().find(|m| m.name() == name) else {
                eprintln!("no module {name:?}; modules: {:?}", Module::ALL.map(|m| m.name()));
                std::process::exit(2);
            };
            let profile = args.iter().any(|a| a == "--profile");
            let v = compile::Variant { profile, ..compile::Variant::new(module, arch, false) };
            let c = compile::compile(&v).unwrap_or_else(|e| {
                eprintln!("{}: {e}", v.name());
                std::process::exit(1)
            });
            println!("{}", c.log);
            if let Some(out) = args.get(3).filter(|a| !a.starts_with("--")) {
                std::fs::write(out, &c.cubin).unwrap();
            }
        }
        _ => {
            eprintln!(
                "usage: flashsel-dev time | small | short | wide | ranges | rowstats [N] | cubin ARCH MODULE [OUT] [--profile]"
            );
            std::process::exit(2);
        }
    }
}
