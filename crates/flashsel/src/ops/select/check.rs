//! `flashsel check`: the CUDA engine against the CPU engine on fresh random and
//! adversarial inputs, every path boundary, outputs poisoned before each run.

use half::{bf16, f16};

use super::plan::{self, Path, Plan};
use super::{OutputOrder, SelectSpec, Selection};
use crate::contract::{DType, NanPolicy, Result, ScoreElem, ScoresView};
use crate::cuda::CudaEngine;
pub use crate::data::{generate, Data, Rng, ALL_DATA};

/// One check case.
#[derive(Debug, Clone)]
pub struct Case {
    pub rows: usize,
    pub cols: usize,
    pub k: usize,
    pub dtype: DType,
    pub data: Data,
    pub order: OutputOrder,
    pub nan: NanPolicy,
    /// Extra elements between rows (misaligns rows when odd).
    pub stride_pad: usize,
    /// `Some(spec)`: per-row lengths from this recipe.
    pub lengths: Option<LengthRecipe>,
    /// Per-row ranges `starts[r] .. ends[r]` (the edges, then random; the
    /// lengths recipe is not used).
    pub ranges: bool,
    /// Indices written as KV slots through a random page table of this
    /// page size.
    pub page_size: Option<usize>,
}

/// How per-row lengths are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthRecipe {
    /// 0, 1, k-1, k, k+1, cols, then random.
    Edges,
    /// Short rows in a wide buffer.
    Short(usize),
}

impl Case {
    pub fn spec(&self) -> SelectSpec {
        SelectSpec::new(self.rows, self.cols, self.k, self.dtype)
            .with_stride(self.cols + self.stride_pad)
            .with_order(self.order)
            .with_nan(self.nan)
    }
    pub fn describe(&self) -> String {
        let mut d = self.describe_select();
        if self.ranges {
            d.push_str(" ranges");
        }
        if let Some(ps) = self.page_size {
            d.push_str(&format!(" slots(page {ps})"));
        }
        d
    }
    fn describe_select(&self) -> String {
        format!(
            "{}x{} k={} {} {:?} order={} nan={} pad={} lengths={:?}",
            self.rows,
            self.cols,
            self.k,
            self.dtype.name(),
            self.data,
            self.order.name(),
            self.nan.name(),
            self.stride_pad,
            self.lengths
        )
    }
}

fn lengths_for(c: &Case, rng: &mut Rng) -> Option<Vec<i32>> {
    let r = c.lengths?;
    Some(
        (0..c.rows)
            .map(|i| match r {
                LengthRecipe::Edges => {
                    let edges = [0, 1, c.k.saturating_sub(1), c.k, c.k + 1, c.cols];
                    let l = if i < edges.len() { edges[i] } else { rng.below(c.cols as u64 + 1) as usize };
                    l.min(c.cols) as i32
                }
                LengthRecipe::Short(n) => (n.min(c.cols) - (i % 3).min(n)) as i32,
            })
            .collect(),
    )
}

/// Per-row ranges: the edges (empty at 0, one column, the last column,
/// the whole row, k - 1, k and k + 1 columns from an odd start, empty at
/// cols, the whole row from an odd start), then random.
fn ranges_for(c: &Case, rng: &mut Rng) -> (Vec<i32>, Vec<i32>) {
    let (cols, k) = (c.cols, c.k);
    let odd = 1.min(cols);
    let edges = [
        (0, 0),
        (0, 1.min(cols)),
        (cols.saturating_sub(1), cols),
        (0, cols),
        (odd, (odd + k.saturating_sub(1)).min(cols)),
        (odd, (odd + k).min(cols)),
        (odd, (odd + k + 1).min(cols)),
        (cols, cols),
        // The split token kernels read this row from the 16-byte boundary
        // below its start (a head); on SampleTrap data its sampled bound
        // fails and the rescue streams it again, head included.
        (odd, cols),
    ];
    (0..c.rows)
        .map(|i| {
            let (s, e) = if i < edges.len() {
                edges[i]
            } else {
                let a = rng.below(cols as u64 + 1) as usize;
                let b = rng.below(cols as u64 + 1) as usize;
                (a.min(b), a.max(b))
            };
            (s as i32, e as i32)
        })
        .unzip()
}

/// A random page table covering `cols` tokens for `sequences` sequences:
/// (table, max_pages, seq_ids with row r in sequence r % sequences).
pub(crate) fn pages_for(rng: &mut Rng, rows: usize, tokens: usize, page_size: usize) -> (Vec<i32>, usize, Vec<i32>) {
    let sequences = rows.div_ceil(2).max(1);
    let max_pages = tokens.div_ceil(page_size) + 1;
    let table = crate::data::page_table(rng, sequences, max_pages);
    let seq_ids = (0..rows).map(|r| (r % sequences) as i32).collect();
    (table, max_pages, seq_ids)
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub case: String,
    pub path: Path,
    pub ctas_per_row: u32,
    /// Grid plans: elements a thread of the grid kernel holds (16, 8 or 4);
    /// 0 otherwise.
    pub grid_items: u32,
    /// Short plans: the kernel (CTA, warp or wide); `None` otherwise.
    pub short_kernel: Option<plan::ShortKernel>,
    pub ok: bool,
    pub detail: String,
}

impl Outcome {
    /// The outcome of a case run under `plan`.
    pub(crate) fn of_plan(case: String, plan: &Plan, ok: bool, detail: String) -> Self {
        let grid_items = plan.grid().map_or(0, |g| g.items);
        let short_kernel = plan.short().map(|s| s.kernel);
        Outcome { case, path: plan.path(), ctas_per_row: plan.ctas_per_row(), grid_items, short_kernel, ok, detail }
    }

    /// A case that could not run (`path`: the path it was meant for).
    pub(crate) fn error(case: String, path: Path, err: crate::contract::Error) -> Self {
        Outcome {
            case,
            path,
            ctas_per_row: 0,
            grid_items: 0,
            short_kernel: None,
            ok: false,
            detail: format!("error: {err}"),
        }
    }
}

/// Whether a downloaded f32 selection equals the CPU engine's, bit for bit.
fn same_as_cpu(data: &[f32], spec: &SelectSpec, lengths: Option<&[i32]>, idx: &[i32], val: &[f32]) -> Result<bool> {
    let view = ScoresView::new(data, spec.rows, spec.cols)?;
    let want = super::cpu::select(&view, spec, lengths)?;
    Ok(want.indices == idx && want.values.iter().zip(val).all(|(a, b)| a.to_bits() == b.to_bits()))
}

/// A case's token inputs: range starts (ends in `lengths`) and the page map.
struct TokenInputs {
    starts: Option<Vec<i32>>,
    pages: Option<(Vec<i32>, usize, usize, Vec<i32>)>,
}

fn run_typed<T: ScoreElem>(
    e: &CudaEngine,
    c: &Case,
    data: &[f32],
    lengths: Option<&[i32]>,
    tok: &TokenInputs,
) -> Result<(bool, String)> {
    let spec = c.spec();
    let typed: Vec<T> = data.iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::with_stride(&typed, c.rows, c.cols, spec.row_stride)?;
    if tok.starts.is_some() || tok.pages.is_some() {
        let starts = tok.starts.as_deref();
        let map = match &tok.pages {
            Some((t, max_pages, ps, q)) => Some(crate::ops::pages::PageMap::new(t, *max_pages, *ps, q)?),
            None => None,
        };
        let want = match &map {
            Some(m) => super::cpu::select_ranges_paged(&view, &spec, starts, lengths, m)?,
            None => super::cpu::select_ranges(&view, &spec, starts.unwrap_or(&[]), lengths)?,
        };
        let got = e.select_ranges_host(&view, &spec, starts, lengths, map.as_ref())?;
        return Ok(compare(&want, &got, c.k));
    }
    let want = super::cpu::select(&view, &spec, lengths)?;
    let got = e.select_host(&view, &spec, lengths)?;
    if want != got && want.indices.len() <= 1 << 22 {
        // Name the culprit: the naive reference decides.
        let naive = super::reference_select(&view, &spec, lengths)?;
        let bits = |s: &Selection<T>| s.values.iter().map(|v| v.bits()).collect::<Vec<_>>();
        let gpu_ok = naive.indices == got.indices && bits(&naive) == bits(&got);
        let cpu_ok = naive.indices == want.indices && bits(&naive) == bits(&want);
        if !gpu_ok || !cpu_ok {
            return Ok((
                false,
                format!("engines disagree: gpu matches the naive reference: {gpu_ok}; cpu engine does: {cpu_ok}"),
            ));
        }
    }
    Ok(compare(&want, &got, c.k))
}

/// The first difference between two selections (indices, then value bits).
fn compare<T: ScoreElem>(want: &Selection<T>, got: &Selection<T>, k: usize) -> (bool, String) {
    for (i, (a, b)) in want.indices.iter().zip(&got.indices).enumerate() {
        if a != b {
            return (false, format!("index mismatch at row {} slot {}: cpu {a}, gpu {b}", i / k, i % k));
        }
    }
    for (i, (a, b)) in want.values.iter().zip(&got.values).enumerate() {
        if a.bits() != b.bits() {
            return (false, format!("value bits differ at row {} slot {}", i / k, i % k));
        }
    }
    (true, String::new())
}

/// Runs one case with fresh data from `rng`.
pub fn run_case(e: &CudaEngine, c: &Case, rng: &mut Rng) -> Result<Outcome> {
    let spec = c.spec();
    let (lengths, starts) = if c.ranges {
        let (s, e) = ranges_for(c, rng);
        (Some(e), Some(s))
    } else {
        (lengths_for(c, rng), None)
    };
    let pages = c.page_size.map(|ps| {
        let (t, max_pages, q) = pages_for(rng, c.rows, c.cols, ps);
        (t, max_pages, ps, q)
    });
    let tok = TokenInputs { starts, pages };
    let plan = e.plan(&spec, lengths.is_some())?;
    let data = generate(c.data, spec.elements_needed(), rng);
    let run = || match c.dtype {
        DType::F32 => run_typed::<f32>(e, c, &data, lengths.as_deref(), &tok),
        DType::BF16 => run_typed::<bf16>(e, c, &data, lengths.as_deref(), &tok),
        DType::F16 => run_typed::<f16>(e, c, &data, lengths.as_deref(), &tok),
        other => Err(crate::contract::Error::UnknownDType(format!("no check cases for {other}"))),
    };
    let (ok, detail) = run()?;
    // Parity: the same rows, lengths and ranges on the row path and the
    // short path's other kernel too, the CPU's bytes from each.
    if let Some(other) = short_parity(e, &spec, &plan, run)? {
        let detail = format!("{other}; the planned kernel: {}", if ok { "ok" } else { &detail });
        return Ok(Outcome::of_plan(c.describe(), &plan, false, detail));
    }
    Ok(Outcome::of_plan(c.describe(), &plan, ok, detail))
}

/// A short-row plan's parity runs: `run` again on each other path the
/// engine's switches give the geometry (the row path with the short path
/// off, the short path's CTA kernel, its warp kernel where the row fits
/// one, the wide kernel without its cluster form), each plan once; the
/// first failure's detail, or `None`. The
/// switches are restored. Other plans: `None`, nothing run.
pub(crate) fn short_parity(
    e: &CudaEngine,
    spec: &SelectSpec,
    plan: &Plan,
    mut run: impl FnMut() -> Result<(bool, String)>,
) -> Result<Option<String>> {
    if plan.path() != Path::Short || !e.short_rows() {
        return Ok(None);
    }
    let (wc0, wr0) = e.short_warp();
    let cl0 = e.short_cluster();
    let mut seen = vec![plan.clone()];
    let mut parity = || -> Result<Option<String>> {
        for (label, short, (wc, wr), cluster) in [
            ("row path (short path off)", false, (wc0, wr0), cl0),
            ("short path, CTA kernel", true, (0, 0), cl0),
            ("short path, warp kernel", true, (plan::SHORT_COLS, 0), cl0),
            ("short path, wide kernel without clusters", true, (wc0, wr0), false),
        ] {
            e.set_short_rows(short);
            e.set_short_warp(wc, wr);
            e.set_short_cluster(cluster);
            let p = e.plan(spec, true)?;
            if seen.contains(&p) {
                continue;
            }
            seen.push(p);
            let (ok, detail) = run()?;
            if !ok {
                return Ok(Some(format!("{label}: {detail}")));
            }
        }
        Ok(None)
    };
    let out = parity();
    e.set_short_rows(true);
    e.set_short_warp(wc0, wr0);
    e.set_short_cluster(cl0);
    out
}

/// The NaN policy of case `i` in `order`, alternating over both: the two
/// orders of one case take different policies, and so do neighbouring
/// cases of one order.
fn alternating_nan(i: usize, order: OutputOrder) -> NanPolicy {
    if (i + (order == OutputOrder::Index) as usize).is_multiple_of(2) {
        NanPolicy::Largest
    } else {
        NanPolicy::Lowest
    }
}

/// The standard suite. `quick` keeps it to a few seconds.
pub fn suite(e: &CudaEngine, quick: bool, rng: &mut Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    let base = |rows, cols, k, dtype, data| Case {
        rows,
        cols,
        k,
        dtype,
        data,
        order: OutputOrder::Score,
        nan: NanPolicy::Lowest,
        stride_pad: 0,
        lengths: None,
        ranges: false,
        page_size: None,
    };
    // Every family x dtype x order x NaN policy on small multi-row shapes.
    for &data in &ALL_DATA {
        for &dtype in &dtypes {
            for order in [OutputOrder::Score, OutputOrder::Index] {
                for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                    let mut c = base(7, 5000, 300, dtype, data);
                    c.order = order;
                    c.nan = nan;
                    c.stride_pad = rng.below(3) as usize;
                    c.lengths = Some(LengthRecipe::Edges);
                    cases.push(c);
                }
            }
        }
    }
    // k edges.
    for (cols, k) in [(1, 1), (10, 1), (10, 10), (10, 11), (100, 5000), (4097, 4096), (40_000, 1), (40_000, 40_000)] {
        for &data in &[Data::Normal, Data::Relu, Data::Nan5] {
            cases.push(base(3, cols, k, DType::F32, data));
        }
    }
    // Path boundaries for one row, k 512 and 2048.
    for k in [512usize, 2048] {
        let fit = e.plan(&SelectSpec::new(1, 1 << 20, k, DType::F32), false).map(|p| p.fit() as usize).unwrap_or(8192);
        let mut widths = vec![fit - 1, fit, fit + 1, 2 * fit, 2 * fit + 1, 262_144, 1_048_576];
        if !quick {
            widths.push(4_194_304);
        }
        for &cols in &widths {
            for &data in &[Data::Normal, Data::Relu, Data::ReluFew, Data::Ascending] {
                for &dtype in &[DType::F32, DType::BF16] {
                    let mut c = base(1, cols, k, dtype, data);
                    c.order = if cols % 2 == 0 { OutputOrder::Index } else { OutputOrder::Score };
                    cases.push(c);
                }
            }
        }
    }
    // Grid rows (several CTAs per row selecting together): every data family,
    // dtype, order and NaN policy across the cases, lengths at the edges
    // (0, 1, k - 1, k, k + 1, cols), padded strides; then the grid path's
    // own boundaries: a chunk of exactly GRID_CHUNK columns and one more
    // (split), the largest k and one more (split).
    for (i, &data) in ALL_DATA.iter().enumerate() {
        let mut c = base(6, 100_000, 1000, dtypes[i % 3], data);
        c.order = if i % 2 == 0 { OutputOrder::Score } else { OutputOrder::Index };
        c.nan = if i % 4 < 2 { NanPolicy::Lowest } else { NanPolicy::Largest };
        c.stride_pad = i % 3;
        c.lengths = Some(LengthRecipe::Edges);
        cases.push(c);
    }
    let sms = e.props().sm_count as usize;
    let edge = sms * plan::GRID_CHUNK as usize;
    for (cols, k) in [(edge, 2048), (edge + 1, 2048), (1 << 20, 4096), (1 << 20, 4097)] {
        for &data in &[Data::Normal, Data::ReluFew] {
            cases.push(base(1, cols, k, DType::F32, data));
        }
    }
    // Multi-row shapes that split, with lengths, strides and short rows in wide buffers.
    for &data in &[Data::Normal, Data::Relu, Data::ReluFew, Data::FewValues] {
        let mut c = base(5, 300_000, 700, DType::F32, data);
        c.lengths = Some(LengthRecipe::Edges);
        c.stride_pad = 1;
        cases.push(c);
        let mut c = base(3, 1_048_576, 2048, DType::BF16, data);
        c.lengths = Some(LengthRecipe::Short(5000));
        cases.push(c);
        cases.push(base(64, 131_072, 2048, DType::F32, data));
        // Index order through each branch of the finish's index_select
        // (filter/index_order.cuh): taken (64 x 65,536, its bitmap's widest
        // range), declined for a column range past its bitmap (64 x 131,072
        // and 5 x 300,000), declined for a crossing plateau (FewValues).
        for (rows, cols, k) in [(64, 65_536, 2048), (64, 131_072, 2048), (5, 300_000, 700)] {
            let mut c = base(rows, cols, k, DType::F32, data);
            c.order = OutputOrder::Index;
            cases.push(c);
        }
        if !quick {
            cases.push(base(1024, 32_768, 512, DType::F16, data));
        }
    }
    // Split rows of a few CTAs each (6 per row on 132 SMs), with lengths at
    // the edges (rows shorter than k: the merge pads), both NaN policies,
    // both orders and padded strides.
    for (i, &data) in [Data::Normal, Data::Relu, Data::Nan5, Data::AllEqual].iter().enumerate() {
        let mut c = base(20, 100_000, 1000, dtypes[i % 3], data);
        c.lengths = Some(LengthRecipe::Edges);
        c.nan = if i % 2 == 0 { NanPolicy::Largest } else { NanPolicy::Lowest };
        c.order = if i == 3 { OutputOrder::Index } else { OutputOrder::Score };
        c.stride_pad = 1;
        cases.push(c);
    }
    // Prefill rows long enough for the sampled lower bound (one CTA per row,
    // range >= 16 tiles): ties make the sample's bound too high, forcing the
    // exact restart.
    for (i, &data) in
        [Data::Normal, Data::Relu, Data::AllEqual, Data::FewValues, Data::Ascending, Data::Nan5, Data::ReluFew]
            .iter()
            .enumerate()
    {
        let dtype = dtypes[i % 3];
        let mut c = base(300, 70_000, if i % 2 == 0 { 2048 } else { 300 }, dtype, data);
        c.lengths = Some(LengthRecipe::Edges);
        c.order = if i % 2 == 0 { OutputOrder::Score } else { OutputOrder::Index };
        cases.push(c);
    }
    // Data that defeats the samplers: the row path's restart (one CTA per row)
    // and the split path's exact fallback in the row's last CTA.
    for &dtype in &[DType::F32, DType::BF16] {
        let mut c = base(300, 65_536, 5000, dtype, Data::SampleTrap { period: 4096 });
        c.order = OutputOrder::Index;
        cases.push(c);
        cases.push(base(1, 262_144, 8192, dtype, Data::SampleTrap { period: 16_384 }));
        cases.push(base(2, 1_048_576, 2048, dtype, Data::FewValues));
    }
    // Data whose 3-sigma sampled bound fails and whose rescue bound (8
    // sigma) mostly holds: the row path's second attempt and the split
    // row's rescue, without the fall to lb = 0.
    cases.push(base(300, 131_072, 2048, DType::F32, Data::SampleHot { period: 8192 }));
    cases.push(base(64, 131_072, 2048, DType::BF16, Data::SampleHot { period: 8192 }));
    // Grid rows whose row sample misleads the sampled pass: too few keys at
    // its bound (k 4096), or the k-th above the sample's range; the exact
    // passes run after it. Two rows: each row's CTAs on their own tally.
    for &dtype in &[DType::F32, DType::BF16] {
        cases.push(base(1, 1 << 20, 4096, dtype, Data::GridSampleHigh { len: 1 << 20 }));
        cases.push(base(2, 262_144, 2048, dtype, Data::GridSampleHigh { len: 262_144 }));
        cases.push(base(1, 1 << 20, 2048, dtype, Data::GridSampleLow { len: 1 << 20 }));
        cases.push(base(2, 262_144, 512, dtype, Data::GridSampleLow { len: 262_144 }));
    }
    // Ranges (DSA's ks/ke) and slots through a page table, the token
    // kernels on every path: each family, dtype, order and NaN policy on a
    // small shape, alone and paged; then the row path (prefill rows), the
    // split path (DSA decode, 64 x 131,072 k 2048) and the grid path (one
    // wide row; odd starts misalign it), each with ranges and slots; slots
    // without ranges; and the global-memory buffer.
    for (i, &data) in ALL_DATA.iter().enumerate() {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            let mut c = base(12, 5000, 300, dtypes[i % 3], data);
            c.order = order;
            c.nan = if i % 2 == 0 { NanPolicy::Lowest } else { NanPolicy::Largest };
            c.stride_pad = i % 3;
            c.ranges = true;
            c.page_size = (order == OutputOrder::Index).then_some(16);
            cases.push(c);
        }
    }
    for (rows, cols, k, dtype) in [
        (300, 70_000, 2048, DType::BF16),
        (64, 131_072, 2048, DType::F32),
        (64, 131_072, 2048, DType::BF16),
        (2, 262_144, 512, DType::F32),
        (9, 1 << 20, 2048, DType::BF16),
        (3, 100_000, 16_000, DType::F32),
    ] {
        for (page_size, data) in [(None, Data::Normal), (Some(64), Data::Relu), (Some(1), Data::Nan5)] {
            let mut c = base(rows, cols, k, dtype, data);
            c.ranges = true;
            c.page_size = page_size;
            c.order = if page_size.is_some() { OutputOrder::Index } else { OutputOrder::Score };
            cases.push(c);
        }
    }
    // Split rows with heads whose sampled bound fails (the edge row from an
    // odd start over SampleTrap data): the merge's rescue, head included.
    for dtype in [DType::F32, DType::BF16] {
        let mut c = base(64, 131_072, 2048, dtype, Data::SampleTrap { period: 8192 });
        c.ranges = true;
        c.page_size = Some(64);
        c.order = OutputOrder::Index;
        cases.push(c);
    }
    for (rows, cols, k) in [(5, 300_000, 700), (1, 262_144, 512), (100, 20_000, 512)] {
        let mut c = base(rows, cols, k, DType::F32, Data::ReluFew);
        c.lengths = Some(LengthRecipe::Edges);
        c.page_size = Some(64);
        cases.push(c);
    }
    // The short-row path (batches of more rows than SMs, rows of <= SHORT_COLS
    // columns, k <= SHORT_MAX_K; one CTA each, the
    // row in shared memory; run_case repeats each on the row path): the
    // first-chunk and plain shapes with lengths from 0 to cols (copy rows,
    // rows shorter than k, rows one past k), every data family (ties,
    // NaN on every fifth, ReLU plateaus of exact zeros, all equal) in each
    // dtype, order and NaN policy, odd strides (unaligned rows), ranges and
    // slots, k past cols, and the boundary at SHORT_COLS (+1: the row path).
    let sc = plan::SHORT_COLS as usize;
    for (i, &data) in ALL_DATA.iter().enumerate() {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            let mut c = base(if quick { 140 } else { 160 }, 2048, 512, dtypes[i % 3], data);
            c.order = order;
            c.nan = alternating_nan(i + 1, order);
            c.stride_pad = i % 3;
            c.lengths = Some(LengthRecipe::Edges);
            cases.push(c);
        }
    }
    for (rows, cols, k, dtype, data) in [
        (64, sc, 2048, DType::BF16, Data::Normal),
        (160, sc, 512, DType::F32, Data::ReluFew),
        (64, sc - 1, 4096, DType::F16, Data::FewValues),
        (160, sc + 1, 512, DType::F32, Data::Normal),
        (33, 4096, 4096, DType::F32, Data::AllEqual),
        (9, 3000, 5000, DType::BF16, Data::Relu),
        (200, 97, 7, DType::F32, Data::Nan5),
        (150, 1, 1, DType::F16, Data::Normal),
        (1, sc, 512, DType::BF16, Data::Ascending),
        // Batches at the bounds: SHORT_MAX_K (+1: the row path), past the SM count.
        (133, sc, plan::SHORT_MAX_K as usize, DType::BF16, Data::Nan5),
        (133, 2048, plan::SHORT_MAX_K as usize + 1, DType::F32, Data::FewValues),
        (400, 300, 500, DType::F16, Data::Relu),
    ] {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            let mut c = base(rows, cols, k, dtype, data);
            c.order = order;
            c.lengths = Some(LengthRecipe::Edges);
            c.stride_pad = (order == OutputOrder::Index) as usize;
            cases.push(c);
        }
    }
    // The short path's warp kernel (run_case runs every short case on it
    // too, where the row fits a warp's slab): its bound SHORT_WARP_COLS and
    // one past it, rows around k (512: copy-like rows of <= k, k + 1) in
    // a buffer of k + 8 columns, ties (FewValues), NaN every fifth, ReLU
    // plateaus of zeros, all-equal rows, both orders and NaN policies,
    // unaligned strides.
    let wc = plan::SHORT_WARP_COLS as usize;
    for (i, (rows, cols, k, data)) in [
        (160, wc, 512, Data::Nan5),
        (160, wc + 1, 512, Data::Relu),
        (136, wc, 64, Data::FewValues),
        (200, 520, 512, Data::ReluFew),
        (200, 520, 512, Data::AllEqual),
        (137, 513, 512, Data::FewValues),
        (300, 33, 32, Data::Nan5),
        (300, 2048, 1, Data::Relu),
    ]
    .into_iter()
    .enumerate()
    {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            let mut c = base(rows, cols, k, dtypes[i % 3], data);
            c.order = order;
            c.nan = alternating_nan(i, order);
            c.lengths = Some(LengthRecipe::Edges);
            c.stride_pad = (i + 1) % 3;
            cases.push(c);
        }
    }
    for (i, &data) in [Data::Normal, Data::Relu, Data::Nan5, Data::AllEqual].iter().enumerate() {
        let mut c = base(140, 2048, 512, dtypes[i % 3], data);
        c.ranges = true;
        c.page_size = (i % 2 == 0).then_some(16);
        c.order = if i < 2 { OutputOrder::Index } else { OutputOrder::Score };
        c.nan = if i % 2 == 0 { NanPolicy::Largest } else { NanPolicy::Lowest };
        cases.push(c);
    }
    // The short path's wide kernel (at most one row a SM, the row in one
    // CTA's registers; run_case repeats each on the row or grid path): its
    // bounds SHORT_WIDE_COLS and SHORT_WIDE_MAX_K and one past each, one row
    // a SM (132 on the H200) and one more, rows shorter than a thread's 16
    // columns, ties and plateaus (FewValues, ReLU zeros, all equal), NaN
    // every fifth under both policies, every dtype, unaligned strides and
    // lengths at the edges, ranges with odd starts and slots. The kernel
    // takes index order only; each case's score-order twin checks the
    // path the same bounds take in that order.
    let (wc, wk) = (plan::SHORT_WIDE_COLS as usize, plan::SHORT_WIDE_MAX_K as usize);
    for (i, (rows, cols, k, data)) in [
        (1, wc, 512, Data::Normal),
        (1, wc, wk, Data::FewValues),
        (1, wc, wk + 1, Data::Relu),
        (1, wc + 1, 512, Data::Nan5),
        (2, wc, 2048, Data::AllEqual),
        (sms, wc, 2048, Data::ReluFew),
        (sms + 1, 4096, 512, Data::Nan5),
        (5, 13, 4, Data::FewValues),
        (3, 17, 17, Data::Relu),
        (4, 1000, 2000, Data::Nan5),
        (16, 8192, 1, Data::Ascending),
    ]
    .into_iter()
    .enumerate()
    {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            let mut c = base(rows, cols, k, dtypes[i % 3], data);
            c.order = order;
            c.nan = alternating_nan(i, order);
            c.lengths = (i % 2 == 1).then_some(LengthRecipe::Edges);
            c.stride_pad = i % 3;
            cases.push(c);
        }
    }
    for (i, &data) in [Data::Normal, Data::Nan5, Data::FewValues].iter().enumerate() {
        let mut c = base(8, wc, 2048, dtypes[i], data);
        c.ranges = true;
        c.page_size = (i != 1).then_some(64);
        c.order = if i == 2 { OutputOrder::Score } else { OutputOrder::Index };
        cases.push(c);
    }
    // Large k: the global-memory buffer.
    for &data in &[Data::Normal, Data::Relu, Data::Ascending] {
        cases.push(base(2, 200_000, 20_000, DType::F32, data));
        let mut c = base(3, 100_000, 16_000, DType::BF16, data);
        c.order = OutputOrder::Index;
        c.lengths = Some(LengthRecipe::Edges);
        cases.push(c);
    }
    cases
}

/// Totals of a check run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub run: usize,
    pub failed: usize,
    pub failures: Vec<Outcome>,
    /// Cases per path taken.
    pub by_path: Vec<(Path, usize)>,
    /// Of the grid cases, those on the narrow kernels (`fs_grid8_*`,
    /// `fs_grid4_f32`).
    pub grid_narrow: usize,
    /// Of the short cases, those on the wide kernel (`fs_short_wide_*`).
    pub short_wide: usize,
    /// Of the short cases, those on its cluster form (`fs_short_cluster_*`).
    pub short_cluster: usize,
}

/// One case of a run: its description (as the progress lines print it) and
/// how to run it on the run's shared data stream.
type Job<'a> = (String, Path, Box<dyn Fn(&mut Rng) -> Result<Outcome> + 'a>);

/// Whether `flashsel check --filter` keeps the case `description`: no
/// filter keeps every case, a filter those whose description contains it.
pub(crate) fn filter_keeps(filter: Option<&str>, description: &str) -> bool {
    filter.is_none_or(|f| description.contains(f))
}

/// Runs the jobs whose description contains `filter` (all without one), in
/// order, on one data stream from `seed`, calling `progress` after each.
/// Stops at nothing: every kept job runs and is counted; an error is a
/// failed case on the path the job names. (A filter changes the data of
/// the cases it keeps: the skipped ones draw nothing from the stream.)
fn run_jobs(
    jobs: Vec<Job<'_>>,
    rng: &mut Rng,
    filter: Option<&str>,
    progress: &mut impl FnMut(usize, usize, &Outcome),
) -> Report {
    let jobs: Vec<Job<'_>> = jobs.into_iter().filter(|(name, _, _)| filter_keeps(filter, name)).collect();
    let mut rep = Report::default();
    for (i, (name, path, run)) in jobs.iter().enumerate() {
        let o = run(rng).unwrap_or_else(|err| Outcome::error(name.clone(), *path, err));
        rep.record(&o);
        progress(i + 1, jobs.len(), &o);
    }
    rep
}

/// Runs the suite (plus the graph-capture and chained-call checks, the QSA
/// block selection, the indexer and the context-parallel merge), or with
/// `filter` only the cases whose description contains it, calling
/// `progress` after each. Stops at nothing: every case runs and is counted.
pub fn run_suite(
    e: &CudaEngine,
    quick: bool,
    seed: u64,
    filter: Option<&str>,
    mut progress: impl FnMut(usize, usize, &Outcome),
) -> Result<Report> {
    use crate::ops::{qsa::check as qc, shard::check as sc};
    let mut rng = Rng::new(seed);
    let cases = suite(e, quick, &mut rng);
    // Graph capture of a grid geometry (cooperative launch) and of a split one.
    let graphs = [300_000usize, 1_000_000];
    // Back-to-back calls sharing a workspace: grid, split and row plans.
    let chains = [(1usize, 262_144usize, 512usize), (1, 2_097_152, 2048), (160, 8192, 256)];
    let qsa = qc::cases(quick);
    let indexer = crate::ops::indexer::check::cases(quick);
    let shard = sc::cases(quick);
    let mut jobs: Vec<Job<'_>> = Vec::new();
    for c in &cases {
        jobs.push((c.describe(), Path::Row, Box::new(move |rng| run_case(e, c, rng))));
    }
    for cols in graphs {
        jobs.push((graph_case(cols), Path::Split, Box::new(move |rng| graph_replay_check(e, rng, cols))));
    }
    for (rows, cols, k) in chains {
        jobs.push((
            chained_case(rows, cols, k),
            Path::Row,
            Box::new(move |rng| chained_calls_check(e, rng, rows, cols, k)),
        ));
    }
    // The QSA block selection (the token kernels' QSA rows), device rows
    // out of range, the parity of every path.
    for c in &qsa {
        jobs.push((c.describe(), Path::Row, Box::new(move |rng| qc::run_case(e, c, rng))));
    }
    jobs.push((qc::bad_rows_case(), Path::Grid, Box::new(move |rng| qc::bad_rows_check(e, rng))));
    jobs.push((qc::parity_case(), Path::Row, Box::new(move |rng| qc::parity_check(e, rng))));
    indexer_jobs(e, &indexer, &mut jobs);
    // The context-parallel merge of simulated ranks (ops/shard/check.rs).
    for c in &shard {
        jobs.push((c.describe(), Path::Row, Box::new(move |rng| sc::run_case(e, c, rng))));
    }
    Ok(run_jobs(jobs, &mut rng, filter, &mut progress))
}

/// The indexer's cases alone (`flashsel check --only indexer`): every
/// [`crate::ops::indexer::check::cases`] case on each device path, then the
/// device values out of range; with `filter`, those whose description
/// contains it.
pub fn run_indexer_suite(
    e: &CudaEngine,
    quick: bool,
    seed: u64,
    filter: Option<&str>,
    mut progress: impl FnMut(usize, usize, &Outcome),
) -> Result<Report> {
    let mut rng = Rng::new(seed);
    let indexer = crate::ops::indexer::check::cases(quick);
    let mut jobs: Vec<Job<'_>> = Vec::new();
    indexer_jobs(e, &indexer, &mut jobs);
    Ok(run_jobs(jobs, &mut rng, filter, &mut progress))
}

/// The indexer cases, then the device values out of range.
fn indexer_jobs<'a>(e: &'a CudaEngine, cases: &'a [crate::ops::indexer::check::IndexerCase], jobs: &mut Vec<Job<'a>>) {
    use crate::ops::indexer::check as ic;
    for c in cases {
        jobs.push((c.describe(), Path::Row, Box::new(move |rng| ic::run_case(e, c, rng))));
    }
    jobs.push((ic::bad_values_case(), Path::Row, Box::new(move |rng| ic::bad_values_check(e, rng))));
}

const CHAINED_CALLS: usize = 4;

fn chained_case(rows: usize, cols: usize, k: usize) -> String {
    format!("{CHAINED_CALLS} back-to-back calls, one workspace, {rows} x {cols} k={k}")
}

fn graph_case(cols: usize) -> String {
    format!("graph capture + replay on new data, 3 x {cols}")
}

/// Enqueues `CHAINED_CALLS` selections of one geometry back to back on one
/// stream, with no host synchronisation between them, each on its own
/// scores and outputs but all on one (poisoned) workspace; then compares
/// every output with the CPU engine. A call's first kernel must wait for the
/// previous call's last kernel before it zeroes or reads the shared state
/// (calls chained by PDL, `FS_PDL_CHAIN`), and a call must not read its
/// scores or write its outputs early.
pub fn chained_calls_check(e: &CudaEngine, rng: &mut Rng, rows: usize, cols: usize, k: usize) -> Result<Outcome> {
    use crate::contract::error::cuda_err;
    use cudarc::driver::DevicePtr;
    let spec = SelectSpec::new(rows, cols, k, DType::F32);
    let plan = e.plan(&spec, false)?;
    let case = chained_case(rows, cols, k);
    e.warm_up()?;
    let s = e.context().new_stream().map_err(cuda_err)?;
    let n = spec.elements_needed();
    let mut data = Vec::with_capacity(CHAINED_CALLS);
    let (mut dscores, mut didx, mut dval) = (Vec::new(), Vec::new(), Vec::new());
    for c in 0..CHAINED_CALLS {
        data.push(generate(if c % 2 == 1 { Data::Relu } else { Data::Normal }, n, rng));
        dscores.push(s.clone_htod(&data[c]).map_err(cuda_err)?);
        didx.push(s.alloc_zeros::<i32>(rows * k).map_err(cuda_err)?);
        dval.push(s.alloc_zeros::<f32>(rows * k).map_err(cuda_err)?);
    }
    let ws_bytes = (plan.workspace_bytes() as usize).max(256);
    let dws = s.alloc_zeros::<u8>(ws_bytes).map_err(cuda_err)?;
    let ws = dws.device_ptr(&s).0;
    // SAFETY: poisoning buffers of the stated sizes.
    unsafe {
        crate::cuda::launch::poison(ws, 0xa5, ws_bytes, s.cu_stream())?;
        for c in 0..CHAINED_CALLS {
            crate::cuda::launch::poison(didx[c].device_ptr(&s).0, 0x5a, rows * k * 4, s.cu_stream())?;
            crate::cuda::launch::poison(dval[c].device_ptr(&s).0, 0x5a, rows * k * 4, s.cu_stream())?;
        }
    }
    s.synchronize().map_err(cuda_err)?;
    for c in 0..CHAINED_CALLS {
        let args = super::DeviceSelect {
            spec,
            scores: dscores[c].device_ptr(&s).0,
            lengths: None,
            out_indices: didx[c].device_ptr(&s).0,
            out_values: Some(dval[c].device_ptr(&s).0),
            workspace: ws,
            workspace_bytes: ws_bytes,
            stream: s.cu_stream() as u64,
            starts: None,
            pages: None,
        };
        // SAFETY: buffers sized for the spec above.
        unsafe { e.select_device(&args)? };
    }
    for c in 0..CHAINED_CALLS {
        let idx = s.clone_dtoh(&didx[c]).map_err(cuda_err)?;
        let val = s.clone_dtoh(&dval[c]).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        if !same_as_cpu(&data[c], &spec, None, &idx, &val)? {
            return Ok(Outcome::of_plan(case, &plan, false, format!("call {c} differs from the CPU engine")));
        }
    }
    Ok(Outcome::of_plan(case, &plan, true, String::new()))
}

impl Report {
    fn record(&mut self, o: &Outcome) {
        self.run += 1;
        if !o.ok {
            self.failed += 1;
            self.failures.push(o.clone());
        }
        self.grid_narrow += (o.grid_items > 0 && o.grid_items < plan::GRID_ITEMS) as usize;
        self.short_wide += (o.short_kernel == Some(plan::ShortKernel::Wide)) as usize;
        self.short_cluster += (o.short_kernel == Some(plan::ShortKernel::Cluster)) as usize;
        match self.by_path.iter_mut().find(|(p, _)| *p == o.path) {
            Some((_, n)) => *n += 1,
            None => self.by_path.push((o.path, 1)),
        }
    }
}

/// Captures one selection (a split geometry: prep + scan) in a CUDA graph on
/// a side stream, then replays it on fresh data copied into the same input
/// buffer, comparing every replay with the CPU engine.
pub fn graph_replay_check(e: &CudaEngine, rng: &mut Rng, cols: usize) -> Result<Outcome> {
    use crate::contract::error::cuda_err;
    use cudarc::driver::{sys, DevicePtr};
    let spec = SelectSpec::new(3, cols, 1024, DType::F32).with_order(OutputOrder::Index);
    let plan = e.plan(&spec, true)?;
    e.warm_up()?;
    let s = e.context().new_stream().map_err(cuda_err)?;
    let n = spec.elements_needed();
    let mut dscores = s.alloc_zeros::<f32>(n).map_err(cuda_err)?;
    let lengths = vec![cols as i32, 5000, 0];
    let dlen = s.clone_htod(&lengths).map_err(cuda_err)?;
    let didx = s.alloc_zeros::<i32>(spec.rows * spec.k).map_err(cuda_err)?;
    let dval = s.alloc_zeros::<f32>(spec.rows * spec.k).map_err(cuda_err)?;
    let dws = s.alloc_zeros::<u8>(plan.workspace_bytes() as usize).map_err(cuda_err)?;
    let args = super::DeviceSelect {
        spec,
        scores: dscores.device_ptr(&s).0,
        lengths: Some(dlen.device_ptr(&s).0),
        out_indices: didx.device_ptr(&s).0,
        out_values: Some(dval.device_ptr(&s).0),
        workspace: dws.device_ptr(&s).0,
        workspace_bytes: plan.workspace_bytes() as usize,
        stream: s.cu_stream() as u64,
        starts: None,
        pages: None,
    };
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(cuda_err)?;
    // SAFETY: buffers sized for the spec above.
    let launched = unsafe { e.select_device(&args) };
    let graph = s.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(cuda_err)?;
    launched?;
    let graph = graph.ok_or_else(|| crate::Error::cuda_other("capture produced no graph"))?;
    for rep in 0..3 {
        let data = generate(if rep == 1 { Data::Relu } else { Data::Normal }, n, rng);
        s.memcpy_htod(&data, &mut dscores).map_err(cuda_err)?;
        // SAFETY: poisoning buffers of the stated sizes.
        unsafe { crate::cuda::launch::poison(args.out_indices, 0x5a, spec.rows * spec.k * 4, s.cu_stream())? };
        graph.launch().map_err(cuda_err)?;
        let idx = s.clone_dtoh(&didx).map_err(cuda_err)?;
        let val = s.clone_dtoh(&dval).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        if !same_as_cpu(&data, &spec, Some(&lengths), &idx, &val)? {
            return Ok(Outcome::of_plan(
                graph_case(cols),
                &plan,
                false,
                format!("replay {rep} differs from the CPU engine"),
            ));
        }
    }
    Ok(Outcome::of_plan(format!("{} (3 replays)", graph_case(cols)), &plan, true, String::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The samplers' geometry for one 131,072-column f32 row (kernels/select/filter/sample.cuh's
    /// sample_lb with one tile of 512 x 8 elements): 16 blocks of 256
    /// elements, one every 8,192 columns; the bound is sample rank
    /// j = e + sd sqrt(e) + 4 with e = k * 4096 / cols.
    fn row_count_above_sample_rank(row: &[f32], k: usize, sd: f64) -> usize {
        let mut sample: Vec<f32> = (0..16).flat_map(|b| row[b * 8192..b * 8192 + 256].iter().copied()).collect();
        sample.sort_by(|a, b| b.total_cmp(a));
        let e = (k * sample.len()) as f64 / row.len() as f64;
        let j = (e + sd * e.sqrt() + 4.0) as usize;
        let bound = sample[j - 1];
        row.iter().filter(|&&x| x >= bound).count()
    }

    /// SampleHot does what its doc says: the 3-sigma sampled bound admits
    /// fewer than k elements of most rows, the rescue's 8-sigma bound at
    /// least k of most (so `flashsel check` takes the rescue that succeeds).
    #[test]
    fn sample_hot_defeats_the_first_bound_not_the_rescue() {
        let (rows, cols, k) = (40, 131_072, 2048);
        let data = generate(Data::SampleHot { period: 8192 }, rows * cols, &mut Rng::new(11));
        let (mut first_fails, mut rescue_holds) = (0, 0);
        for row in data.chunks(cols) {
            first_fails += (row_count_above_sample_rank(row, k, 3.0) < k) as usize;
            rescue_holds += (row_count_above_sample_rank(row, k, 8.0) >= k) as usize;
        }
        assert!(first_fails >= 36, "3-sigma bound failed on {first_fails} of {rows} rows");
        assert!(rescue_holds >= 32, "8-sigma bound held on {rescue_holds} of {rows} rows");
        // Plain normal rows: the 3-sigma bound holds.
        let normal = generate(Data::Normal, rows * cols, &mut Rng::new(12));
        let held = normal.chunks(cols).filter(|r| row_count_above_sample_rank(r, k, 3.0) >= k).count();
        assert_eq!(held, rows);
    }

    /// A filter keeps the jobs whose description contains it, in order, on
    /// one data stream; an error counts as a failure on the job's path; no
    /// filter keeps every job.
    #[test]
    fn run_jobs_keeps_what_the_filter_names() {
        let ok = |name: &str| {
            let name = name.to_string();
            Box::new(move |rng: &mut Rng| {
                Ok(Outcome {
                    case: format!("{name} {}", rng.below(1000)),
                    path: Path::Row,
                    ctas_per_row: 1,
                    grid_items: 0,
                    short_kernel: None,
                    ok: true,
                    detail: String::new(),
                })
            }) as Box<dyn Fn(&mut Rng) -> Result<Outcome>>
        };
        let jobs = || -> Vec<Job<'static>> {
            vec![
                ("a ranges".into(), Path::Row, ok("a")),
                ("b".into(), Path::Row, ok("b")),
                ("c ranges".into(), Path::Grid, Box::new(|_: &mut Rng| Err(crate::contract::Error::Io("x".into())))),
                ("d ranges".into(), Path::Row, ok("d")),
            ]
        };
        let mut seen = Vec::new();
        let rep = run_jobs(jobs(), &mut Rng::new(1), Some("ranges"), &mut |i, n, o| seen.push((i, n, o.case.clone())));
        assert_eq!((rep.run, rep.failed), (3, 1));
        assert_eq!(seen.iter().map(|(i, n, _)| (*i, *n)).collect::<Vec<_>>(), [(1, 3), (2, 3), (3, 3)]);
        assert!(seen[0].2.starts_with("a ") && seen[1].2 == "c ranges" && seen[2].2.starts_with("d "));
        assert_eq!(rep.failures[0].path, Path::Grid);
        let all = run_jobs(jobs(), &mut Rng::new(1), None, &mut |_, _, _| {});
        assert_eq!((all.run, all.failed), (4, 1));
        let none = run_jobs(jobs(), &mut Rng::new(1), Some("qsa"), &mut |_, _, _| {});
        assert_eq!(none.run, 0);
    }
}
