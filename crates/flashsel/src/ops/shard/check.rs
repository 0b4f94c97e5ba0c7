//! `flashsel check`'s context-parallel cases: the GPU merge
//! ([`CudaEngine::shard_merge_host`], [`CudaEngine::qsa_shard_merge_host`])
//! of simulated ranks ([`super::simulate_ranks`]: every rank's exact local
//! top-k with global ids, the all-gather's planes) against the CPU engine's
//! selection on the whole row, byte for byte: rank counts 1 to 16, even,
//! random (empty shards where cuts meet), all-on-one-rank and
//! short-then-long layouts, ties, signed zeros, infinities and NaN across
//! shard boundaries, k beyond the row, lengths and ranges, both orders and
//! NaN policies, f32 / bf16 / f16; QSA with and without pages.

use half::{bf16, f16};

use super::{simulate_ranks, ShardLayout};
use crate::contract::{DType, NanPolicy, Result, ScoreElem, ScoresView};
use crate::cuda::CudaEngine;
use crate::data::{generate, Data, Rng};
use crate::ops::pages::PageMap;
use crate::ops::qsa::QsaSpec;
use crate::ops::select::check::Outcome;
use crate::ops::select::{cpu, OutputOrder, SelectSpec, Selection};

/// How a case cuts its rows over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    Even,
    /// Random cuts: empty shards where two coincide.
    Random,
    /// Every column on one rank, the others empty.
    OneRank,
    /// Short shards (fewer than k columns) before one long one.
    ShortFirst,
}

/// One merge check case.
#[derive(Debug, Clone)]
pub struct ShardCase {
    pub rows: usize,
    pub cols: usize,
    pub k: usize,
    pub ranks: usize,
    pub cut: Cut,
    pub data: Data,
    pub dtype: DType,
    pub order: OutputOrder,
    pub nan: NanPolicy,
    /// Per-row lengths (`Some(false)`) or ranges (`Some(true)`).
    pub ranged: Option<bool>,
    /// QSA: the merge of block candidates, then the expansion (`Some(pages)`).
    pub qsa: Option<bool>,
}

impl ShardCase {
    pub fn describe(&self) -> String {
        format!(
            "shard merge {}{}x{} k={} ranks={} {:?} {:?} {} order={:?} nan={:?} ranged={:?}",
            match self.qsa {
                Some(true) => "qsa+pages ",
                Some(false) => "qsa ",
                None => "",
            },
            self.rows,
            self.cols,
            self.k,
            self.ranks,
            self.cut,
            self.data,
            self.dtype,
            self.order,
            self.nan,
            self.ranged
        )
    }

    fn layout(&self, rng: &mut Rng) -> Result<ShardLayout> {
        let (cols, ranks) = (self.cols, self.ranks);
        match self.cut {
            Cut::Even => ShardLayout::even(cols, ranks),
            Cut::Random => {
                let mut cuts: Vec<usize> = (0..ranks - 1).map(|_| rng.below(cols as u64 + 1) as usize).collect();
                cuts.sort_unstable();
                cuts.insert(0, 0);
                cuts.push(cols);
                ShardLayout::from_lens(&cuts.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>())
            }
            Cut::OneRank => {
                let mut lens = vec![0; ranks];
                lens[rng.below(ranks as u64) as usize] = cols;
                ShardLayout::from_lens(&lens)
            }
            Cut::ShortFirst => {
                let mut left = cols;
                let mut lens: Vec<usize> = (0..ranks - 1)
                    .map(|i| {
                        let l = left.min((self.k / 2).max(1) + i % 3);
                        left -= l;
                        l
                    })
                    .collect();
                lens.push(left);
                ShardLayout::from_lens(&lens)
            }
        }
    }
}

/// The suite: `quick` keeps a few of each kind.
pub fn cases(quick: bool) -> Vec<ShardCase> {
    let mut out = Vec::new();
    let base = |rows, cols, k, ranks, cut, data, dtype| ShardCase {
        rows,
        cols,
        k,
        ranks,
        cut,
        data,
        dtype,
        order: OutputOrder::Score,
        nan: NanPolicy::Lowest,
        ranged: None,
        qsa: None,
    };
    let ranks: &[usize] = if quick { &[1, 2, 8] } else { &[1, 2, 3, 4, 7, 8, 16] };
    let cuts = [Cut::Even, Cut::Random, Cut::OneRank, Cut::ShortFirst];
    let datas = [Data::Normal, Data::AllEqual, Data::Nan5, Data::InfZero, Data::FewValues, Data::Relu];
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    let mut i = 0usize;
    for &r in ranks {
        for (ci, &cut) in cuts.iter().enumerate() {
            for (di, &data) in datas.iter().enumerate() {
                if quick && (ci + di) % 3 != 0 {
                    continue;
                }
                let dtype = dtypes[(i + di) % 3];
                let (rows, cols, k) = [(4, 3000, 64), (3, 700, 256), (2, 100, 128), (16, 20000, 2048)][i % 4];
                let mut c = base(rows, cols, k, r, cut, data, dtype);
                c.order = if i.is_multiple_of(2) { OutputOrder::Score } else { OutputOrder::Index };
                c.nan = if (i / 2).is_multiple_of(2) { NanPolicy::Lowest } else { NanPolicy::Largest };
                c.ranged = [None, Some(false), Some(true)][i % 3];
                out.push(c);
                i += 1;
            }
        }
    }
    // The bench's shape: one long row over 8 ranks, k = 2048, both orders.
    for order in [OutputOrder::Score, OutputOrder::Index] {
        let mut c = base(2, 1 << 20, 2048, 8, Cut::Even, Data::Normal, DType::BF16);
        c.order = order;
        out.push(c);
    }
    // QSA: block candidates merged, expanded (with and without pages).
    for (j, &r) in ranks.iter().enumerate() {
        for pages in [false, true] {
            let mut c = base(12, 1200, 64, r, cuts[j % 4], datas[j % datas.len()], dtypes[j % 3]);
            c.order = if pages { OutputOrder::Index } else { OutputOrder::Score };
            c.nan = if j.is_multiple_of(2) { NanPolicy::Largest } else { NanPolicy::Lowest };
            c.qsa = Some(pages);
            out.push(c);
        }
    }
    out
}

/// Runs one case.
pub fn run_case(e: &CudaEngine, c: &ShardCase, rng: &mut Rng) -> Result<Outcome> {
    match c.dtype {
        DType::F32 => run_typed::<f32>(e, c, rng),
        DType::BF16 => run_typed::<bf16>(e, c, rng),
        _ => run_typed::<f16>(e, c, rng),
    }
}

fn bits<T: ScoreElem>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| x.bits()).collect()
}

fn same<T: ScoreElem>(got: &Selection<T>, want: &Selection<T>) -> (bool, String) {
    if got.indices != want.indices {
        let j = got.indices.iter().zip(&want.indices).position(|(a, b)| a != b).unwrap_or(0);
        return (false, format!("indices differ at {j}: {} vs {}", got.indices[j], want.indices[j]));
    }
    if bits(&got.values) != bits(&want.values) {
        let j = got.values.iter().zip(&want.values).position(|(a, b)| a.bits() != b.bits()).unwrap_or(0);
        return (false, format!("value bits differ at {j}"));
    }
    (true, String::new())
}

fn run_typed<T: ScoreElem>(e: &CudaEngine, c: &ShardCase, rng: &mut Rng) -> Result<Outcome> {
    let layout = c.layout(rng)?;
    let raw = generate(c.data, c.rows * c.cols, rng);
    let buf: Vec<T> = raw.iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&buf, c.rows, c.cols)?;
    let inner = SelectSpec::new(c.rows, c.ranks * c.k, c.k, T::DTYPE).with_nan(c.nan).with_order(c.order);
    let plan = e.plan(&inner, true)?;
    if let Some(pages) = c.qsa {
        return run_qsa(e, c, &view, &layout, pages, rng).map(|(ok, d)| Outcome::of_plan(c.describe(), &plan, ok, d));
    }
    let spec = SelectSpec::new(c.rows, c.cols, c.k, T::DTYPE).with_order(c.order).with_nan(c.nan);
    let (mut starts, mut ends) = (None, None);
    if let Some(ranged) = c.ranged {
        let e: Vec<i32> = (0..c.rows).map(|_| rng.below(c.cols as u64 + 1) as i32).collect();
        if ranged {
            starts = Some(e.iter().map(|&x| rng.below(x as u64 + 1) as i32).collect::<Vec<_>>());
        }
        ends = Some(e);
    }
    let want = match &starts {
        Some(s) => cpu::select_ranges(&view, &spec, s, ends.as_deref())?,
        None => cpu::select(&view, &spec, ends.as_deref())?,
    };
    let (ids, vals) = simulate_ranks(&view, &spec, &layout, starts.as_deref(), ends.as_deref())?;
    let got = e.shard_merge_host(&ids, &vals, &spec, &layout, starts.as_deref(), ends.as_deref())?;
    let (ok, detail) = same(&got, &want);
    Ok(Outcome::of_plan(c.describe(), &plan, ok, detail))
}

/// QSA: the ranks' block candidates of `qsa_select` merged and expanded on
/// the device, against the CPU's `qsa_select` on the whole rows.
fn run_qsa<T: ScoreElem>(
    e: &CudaEngine,
    c: &ShardCase,
    view: &ScoresView<'_, T>,
    layout: &ShardLayout,
    pages: bool,
    rng: &mut Rng,
) -> Result<(bool, String)> {
    let ratio = 4;
    let spec = QsaSpec::new(c.rows, c.cols).with_k_blocks(c.k).with_order(c.order).with_nan(c.nan);
    // Positions from the first block to the last: copy rows (V <= k) and
    // selecting rows, a tail of 0..3.
    let positions: Vec<i64> = (0..c.rows)
        .map(|i| match i {
            0 => 0,
            1 => (ratio * c.k) as i64 - 1,
            2 => (ratio * c.k) as i64 + 2,
            3 => (ratio * c.cols) as i64 - 1,
            _ => rng.below((ratio * c.cols) as u64) as i64,
        })
        .collect();
    let page_size = 64;
    let max_pages = (ratio * c.cols).div_ceil(page_size);
    let seqs = 3;
    let table: Vec<i32> = (0..seqs * max_pages).map(|p| ((p * 7919) % (seqs * max_pages)) as i32).collect();
    let seq_ids: Vec<i32> = (0..c.rows).map(|i| (i % seqs) as i32).collect();
    let map = if pages { Some(PageMap::new(&table, max_pages, page_size, &seq_ids)?) } else { None };
    let want = crate::ops::qsa::qsa_select(view, &positions, &spec, map.as_ref())?;
    let visible = crate::ops::qsa::check_positions(&positions, &spec, T::DTYPE, map.as_ref())?;
    let ends = crate::ops::qsa::select_lengths(&spec, &visible);
    let (ids, vals) = simulate_ranks(view, &spec.block_spec_of(T::DTYPE), layout, None, Some(&ends))?;
    let got = e.qsa_shard_merge_host(&ids, &vals, &positions, &spec, layout, map.as_ref())?;
    if got.counts != want.counts {
        return Ok((false, "counts differ".into()));
    }
    if got.ids != want.ids {
        let j = got.ids.iter().zip(&want.ids).position(|(a, b)| a != b).unwrap_or(0);
        return Ok((false, format!("ids differ at {j}: {} vs {}", got.ids[j], want.ids[j])));
    }
    Ok((true, String::new()))
}
