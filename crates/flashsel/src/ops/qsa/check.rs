//! `flashsel check`'s QSA cases: the CUDA engine's `qsa_select` against the
//! CPU engine's, byte for byte (ids and counts), on every path the block
//! top-k takes (grid rows for decode, split rows, the row path for prefill
//! chunks), every data family and dtype, both orders and NaN policies, page
//! tables, and device rows whose values are out of range.

use cudarc::driver::DevicePtr;
use half::{bf16, f16};

use super::{PageMap, QsaSelection, QsaSpec};
use crate::contract::error::cuda_err;
use crate::contract::{DType, NanPolicy, Result, ScoreElem, ScoresView};
use crate::cuda::{CudaEngine, DevicePages, DeviceQsaSelect};
use crate::data::{generate, Data, Rng, ALL_DATA};
use crate::ops::select::check::{pages_for, Outcome};
use crate::ops::select::OutputOrder;

/// How a case's query positions are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    /// Rows seeing 0, 1, k - 1, k, k + 1, NB - 1 and NB blocks (each with a
    /// different tail), then random.
    Edges,
    /// A prefill chunk: consecutive positions from `start`.
    Chunk { start: usize },
    /// Decode: every row sees all NB blocks, tails 0 .. ratio - 1.
    Full,
}

/// One QSA check case.
#[derive(Debug, Clone)]
pub struct QsaCase {
    pub rows: usize,
    pub blocks: usize,
    pub k_blocks: usize,
    pub ratio: usize,
    pub dtype: DType,
    pub data: Data,
    pub order: OutputOrder,
    pub nan: NanPolicy,
    pub positions: Positions,
    pub page_size: Option<usize>,
}

impl QsaCase {
    fn spec(&self) -> QsaSpec {
        QsaSpec::new(self.rows, self.blocks)
            .with_ratio(self.ratio)
            .with_k_blocks(self.k_blocks)
            .with_order(self.order)
            .with_nan(self.nan)
    }
    pub fn describe(&self) -> String {
        format!(
            "qsa {}x{} blocks k={} ratio={} {} {:?} order={} nan={} positions={:?} pages={:?}",
            self.rows,
            self.blocks,
            self.k_blocks,
            self.ratio,
            self.dtype.name(),
            self.data,
            self.order.name(),
            self.nan.name(),
            self.positions,
            self.page_size
        )
    }
}

/// The position `t` of a query that sees exactly `v` blocks, tail `r` (`t + 1
/// = v * ratio + r`, `r < ratio`; at least position 0).
fn position(v: usize, r: usize, ratio: usize) -> i64 {
    (v * ratio + r).max(1) as i64 - 1
}

fn positions_for(c: &QsaCase, rng: &mut Rng) -> Vec<i64> {
    let (nb, k, ratio) = (c.blocks, c.k_blocks, c.ratio);
    (0..c.rows)
        .map(|i| match c.positions {
            Positions::Edges => {
                let edges = [0, 1, k.saturating_sub(1), k, k + 1, nb.saturating_sub(1), nb];
                let v = if i < edges.len() { edges[i].min(nb) } else { rng.below(nb as u64 + 1) as usize };
                position(v, i % ratio, ratio)
            }
            Positions::Chunk { start } => {
                let t = (start + i) as i64;
                t.min(position(nb, ratio - 1, ratio))
            }
            Positions::Full => position(nb, i % ratio, ratio),
        })
        .collect()
}

/// The cases: small shapes over every family, dtype, order, NaN policy and
/// ratio; then the decode geometries (1 and 16 rows of 262,144 blocks, one of
/// 16,384; the grid and split paths), a prefill chunk deep in a long prompt
/// and a first chunk (mostly rows that read no score), with and without page
/// tables.
pub fn cases(quick: bool) -> Vec<QsaCase> {
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    let base = |rows, blocks, k_blocks, dtype, data, positions| QsaCase {
        rows,
        blocks,
        k_blocks,
        ratio: 4,
        dtype,
        data,
        order: OutputOrder::Index,
        nan: NanPolicy::Lowest,
        positions,
        page_size: None,
    };
    let mut out = Vec::new();
    for (i, &data) in ALL_DATA.iter().enumerate() {
        for order in [OutputOrder::Index, OutputOrder::Score] {
            let mut c = base(20, 3000, 300, dtypes[i % 3], data, Positions::Edges);
            c.order = order;
            c.nan = if i % 2 == 0 { NanPolicy::Lowest } else { NanPolicy::Largest };
            c.ratio = [4, 1, 8, 3][i % 4];
            c.page_size = (order == OutputOrder::Score).then_some(64);
            out.push(c);
        }
    }
    // k edges: more blocks selected than exist, one block.
    for (blocks, k) in [(1, 1), (10, 1), (10, 10), (10, 11), (100, 5000)] {
        out.push(base(8, blocks, k, DType::F32, Data::Nan5, Positions::Edges));
    }
    let full =
        [(1, 262_144, DType::BF16), (16, 262_144, DType::BF16), (1, 16_384, DType::F32), (4, 65_536, DType::F16)];
    for (rows, blocks, dtype) in full {
        for (data, page_size, order) in [
            (Data::Normal, None, OutputOrder::Index),
            (Data::Relu, Some(64), OutputOrder::Index),
            (Data::Nan5, None, OutputOrder::Score),
            (Data::AllEqual, Some(64), OutputOrder::Score),
        ] {
            let mut c = base(rows, blocks, 512, dtype, data, Positions::Full);
            c.page_size = page_size;
            c.order = order;
            out.push(c);
        }
    }
    let prefill = if quick { 1024 } else { 8192 };
    for (data, page_size, dtype) in [(Data::Normal, None, DType::BF16), (Data::ReluFew, Some(64), DType::F32)] {
        let mut c = base(prefill, 65_536, 512, dtype, data, Positions::Chunk { start: 262_144 - prefill });
        c.page_size = page_size;
        out.push(c);
        let mut c = base(prefill, 2048, 512, dtype, data, Positions::Chunk { start: 0 });
        c.page_size = page_size;
        c.order = OutputOrder::Score;
        out.push(c);
    }
    // The short-row path (<= SHORT_COLS blocks; run_case repeats each on the
    // row path): first chunks in index order (the default) in every dtype
    // and family, NaN policies, ratios, page tables; rows at the edges
    // (0, 1, k - 1, k, k + 1, NB - 1, NB blocks); the boundary at
    // SHORT_COLS and one past it (the row path).
    let chunk = if quick { 1024 } else { 8192 };
    for (i, &data) in ALL_DATA.iter().enumerate() {
        let mut c =
            base(if quick { 256 } else { chunk }, 2048, 512, dtypes[i % 3], data, Positions::Chunk { start: 0 });
        c.nan = if i % 2 == 0 { NanPolicy::Largest } else { NanPolicy::Lowest };
        c.page_size = (i % 3 == 1).then_some(64);
        out.push(c);
    }
    let sc = crate::ops::select::plan::SHORT_COLS as usize;
    for (blocks, ratio, order, data) in [
        (sc, 4, OutputOrder::Index, Data::Relu),
        (sc, 1, OutputOrder::Score, Data::Nan5),
        (sc + 1, 4, OutputOrder::Index, Data::Normal),
        (1000, 3, OutputOrder::Score, Data::AllEqual),
    ] {
        let mut c = base(64, blocks, 512, DType::BF16, data, Positions::Edges);
        c.ratio = ratio;
        c.order = order;
        c.page_size = (ratio == 4).then_some(16);
        out.push(c);
    }
    // The short path's warp kernel (run_case runs every short case on it
    // too): first chunks in score order (ties, NaN every fifth, ReLU
    // plateaus, all equal; with and without slots), a chunk whose rows
    // straddle V = 512 (positions 1,900 .. 2,299 at ratio 4: V 475 .. 575),
    // and rows at the edges of its bound SHORT_WARP_COLS and one past it.
    for (i, &data) in [Data::FewValues, Data::Nan5, Data::Relu, Data::AllEqual].iter().enumerate() {
        let mut c = base(if quick { 512 } else { 2048 }, 2048, 512, dtypes[i % 3], data, Positions::Chunk { start: 0 });
        c.order = OutputOrder::Score;
        c.nan = if i % 2 == 0 { NanPolicy::Lowest } else { NanPolicy::Largest };
        c.page_size = (i % 2 == 1).then_some(64);
        out.push(c);
    }
    for (order, data) in [(OutputOrder::Index, Data::ReluFew), (OutputOrder::Score, Data::FewValues)] {
        let mut c = base(400, 2048, 512, DType::F32, data, Positions::Chunk { start: 1900 });
        c.order = order;
        out.push(c);
    }
    let wc = crate::ops::select::plan::SHORT_WARP_COLS as usize;
    for (blocks, order, data) in [
        (wc, OutputOrder::Index, Data::Nan5),
        (wc, OutputOrder::Score, Data::Relu),
        (wc + 1, OutputOrder::Index, Data::AllEqual),
    ] {
        let mut c = base(160, blocks, 512, DType::F16, data, Positions::Edges);
        c.order = order;
        c.page_size = (order == OutputOrder::Score).then_some(16);
        out.push(c);
    }
    out
}

fn run_typed<T: ScoreElem>(
    e: &CudaEngine,
    c: &QsaCase,
    data: &[f32],
    positions: &[i64],
    pages: Option<&PageMap<'_>>,
) -> Result<(bool, String)> {
    let spec = c.spec();
    let typed: Vec<T> = data.iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&typed, c.rows, c.blocks)?;
    let want = super::qsa_select(&view, positions, &spec, pages)?;
    let got = e.qsa_select_host(&view, positions, &spec, pages)?;
    Ok(compare(&want, &got))
}

/// The first difference between two QSA selections.
pub(crate) fn compare(want: &QsaSelection, got: &QsaSelection) -> (bool, String) {
    for (r, (a, b)) in want.counts.iter().zip(&got.counts).enumerate() {
        if a != b {
            return (false, format!("count mismatch at row {r}: cpu {a}, gpu {b}"));
        }
    }
    for (i, (a, b)) in want.ids.iter().zip(&got.ids).enumerate() {
        if a != b {
            return (false, format!("id mismatch at row {} slot {}: cpu {a}, gpu {b}", i / want.width, i % want.width));
        }
    }
    (true, String::new())
}

/// Runs one case with fresh data from `rng`.
pub fn run_case(e: &CudaEngine, c: &QsaCase, rng: &mut Rng) -> Result<Outcome> {
    let spec = c.spec();
    let positions = positions_for(c, rng);
    let paged = c.page_size.map(|ps| {
        let tokens = c.blocks * c.ratio + c.ratio;
        let (t, max_pages, q) = pages_for(rng, c.rows, tokens, ps);
        (t, max_pages, ps, q)
    });
    let map = match &paged {
        Some((t, max_pages, ps, q)) => Some(PageMap::new(t, *max_pages, *ps, q)?),
        None => None,
    };
    let data = generate(c.data, c.rows * c.blocks, rng);
    let plan = e.plan(&spec.block_spec_of(c.dtype), true)?;
    let run = || match c.dtype {
        DType::F32 => run_typed::<f32>(e, c, &data, &positions, map.as_ref()),
        DType::BF16 => run_typed::<bf16>(e, c, &data, &positions, map.as_ref()),
        _ => run_typed::<f16>(e, c, &data, &positions, map.as_ref()),
    };
    let (ok, detail) = run()?;
    // Parity: the same rows on the row path and the short path's other
    // kernel (crate::ops::select::check::short_parity).
    if let Some(other) = crate::ops::select::check::short_parity(e, &spec.block_spec_of(c.dtype), &plan, run)? {
        let detail = format!("{other}; the planned kernel: {}", if ok { "ok" } else { &detail });
        return Ok(Outcome::of_plan(c.describe(), &plan, false, detail));
    }
    Ok(Outcome::of_plan(c.describe(), &plan, ok, detail))
}

pub(crate) fn bad_rows_case() -> String {
    "qsa device rows out of range (negative position, V > blocks, INT_MAX, sequence outside the table, page past \
     max_pages): all padding, count 0; the other rows as the CPU"
        .into()
}

/// Device-resident positions and sequence ids the host never saw: rows with
/// out-of-range values come out all `-1` with count 0, the rest as the CPU
/// selects them (on the grid path and the row path).
pub fn bad_rows_check(e: &CudaEngine, rng: &mut Rng) -> Result<Outcome> {
    let mut detail = String::new();
    let mut ok = true;
    let mut plan = None;
    for (rows, blocks) in [(8usize, 262_144usize), (40, 5000)] {
        let spec = QsaSpec::new(rows, blocks);
        let ratio = spec.ratio;
        let page_size = 64;
        let tokens = blocks * ratio + ratio;
        let max_pages = tokens.div_ceil(page_size);
        let sequences = 3;
        let table = crate::data::page_table(rng, sequences, max_pages);
        let data = generate(Data::Normal, rows * blocks, rng);
        let mut positions: Vec<i64> = (0..rows).map(|_| rng.below((blocks * ratio) as u64) as i64).collect();
        let mut seq_ids: Vec<i32> = (0..rows).map(|r| (r % sequences) as i32).collect();
        // Device-only values: a row each.
        let bad_pos = [-5i64, (blocks * ratio + ratio) as i64, i32::MAX as i64, i32::MIN as i64];
        for (j, &t) in bad_pos.iter().enumerate() {
            positions[j] = t;
        }
        seq_ids[4] = sequences as i32; // outside the table
        seq_ids[5] = -1;
        let bad: Vec<usize> = (0..6).collect();
        // The short table: rows at the end of the window reach past it.
        let short_pages = max_pages - 2;
        let short_table: Vec<i32> =
            (0..sequences).flat_map(|s| table[s * max_pages..s * max_pages + short_pages].to_vec()).collect();
        positions[6] = (blocks * ratio - 1) as i64; // its last page is past short_pages
                                                    // The CPU on the good rows (the short table covers them: they sit
                                                    // below its last page).
        let good: Vec<usize> = (0..rows).filter(|r| !bad.contains(r) && *r != 6).collect();
        for &r in &good {
            positions[r] = positions[r].min((short_pages * page_size - 1) as i64);
        }
        let sub: Vec<f32> = good.iter().flat_map(|&r| data[r * blocks..(r + 1) * blocks].to_vec()).collect();
        let sub_pos: Vec<i64> = good.iter().map(|&r| positions[r]).collect();
        let sub_seq: Vec<i32> = good.iter().map(|&r| seq_ids[r]).collect();
        let sub_map = PageMap::new(&short_table, short_pages, page_size, &sub_seq)?;
        let sub_view = ScoresView::new(&sub, good.len(), blocks)?;
        let sub_spec = QsaSpec::new(good.len(), blocks);
        let want = super::qsa_select(&sub_view, &sub_pos, &sub_spec, Some(&sub_map))?;

        let s = e.stream();
        let pos32: Vec<i32> = positions.iter().map(|&t| t as i32).collect();
        let dscores = s.clone_htod(&data).map_err(cuda_err)?;
        let dpos = s.clone_htod(&pos32).map_err(cuda_err)?;
        let dtable = s.clone_htod(&short_table).map_err(cuda_err)?;
        let dseq = s.clone_htod(&seq_ids).map_err(cuda_err)?;
        let width = spec.width();
        let mut dids = s.alloc_zeros::<i32>(rows * width).map_err(cuda_err)?;
        let mut dcounts = s.alloc_zeros::<i32>(rows).map_err(cuda_err)?;
        s.memset_zeros(&mut dids).map_err(cuda_err)?;
        s.memset_zeros(&mut dcounts).map_err(cuda_err)?;
        let wb = e.qsa_workspace_bytes(&spec, DType::F32)?;
        let dws = s.alloc_zeros::<u8>(wb.max(256)).map_err(cuda_err)?;
        let args = DeviceQsaSelect {
            spec,
            dtype: DType::F32,
            scores: dscores.device_ptr(s).0,
            positions: dpos.device_ptr(s).0,
            ids: dids.device_ptr(s).0,
            counts: Some(dcounts.device_ptr(s).0),
            pages: Some(DevicePages {
                table: dtable.device_ptr(s).0,
                sequences,
                max_pages: short_pages,
                page_size,
                seq_ids: dseq.device_ptr(s).0,
            }),
            workspace: dws.device_ptr(s).0,
            workspace_bytes: wb,
            stream: s.cu_stream() as u64,
        };
        // SAFETY: buffers sized for the spec above.
        unsafe { e.qsa_select_device(&args)? };
        let ids = s.clone_dtoh(&dids).map_err(cuda_err)?;
        let counts = s.clone_dtoh(&dcounts).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        plan = Some(e.plan(&spec.block_spec_of(DType::F32), true)?);
        for r in bad.iter().copied().chain([6]) {
            if counts[r] != 0 || ids[r * width..(r + 1) * width].iter().any(|&x| x != -1) {
                ok = false;
                detail = format!("{rows} x {blocks}: out-of-range row {r} is not all padding (count {})", counts[r]);
            }
        }
        for (j, &r) in good.iter().enumerate() {
            if counts[r] != want.counts[j] || ids[r * width..(r + 1) * width] != *want.row(j) {
                ok = false;
                detail = format!("{rows} x {blocks}: row {r} differs from the CPU");
            }
        }
    }
    let plan = plan.expect("two geometries ran");
    Ok(Outcome::of_plan(bad_rows_case(), &plan, ok, detail))
}

pub(crate) fn parity_case() -> String {
    "qsa parity: the same rows alone (grid), in 16s (split) and in a batch of 300 (row path), f32/bf16/f16: \
     every output the CPU's bytes"
        .into()
}

/// The parity check: one set of rows (random, NaN on every fifth block,
/// ReLU plateaus of exact zeros, all equal; visible lengths on both sides of
/// the row path's fit and of the grid path's chunking, one with a final part
/// of one block) selected alone, in batches of 16 and in one batch of 300,
/// which the planner sends down the grid, split and row paths, in each
/// dtype: every row's ids and count equal the CPU's for that row alone.
pub fn parity_check(e: &CudaEngine, rng: &mut Rng) -> Result<Outcome> {
    let blocks = 100_000usize;
    let k = 512usize;
    let ratio = 4usize;
    let fit =
        e.plan(&QsaSpec::new(1, blocks).block_spec_of(DType::F32), true).map(|p| p.fit() as usize).unwrap_or(8192);
    let mut vs = vec![blocks, blocks - 1, fit - 1, fit, fit + 1, 2 * fit + 1, k + 1, 64 * 2048 + 1, 8 * 1000 + 1];
    vs.retain(|&v| v <= blocks);
    let families = [Data::Normal, Data::Nan5, Data::Relu, Data::AllEqual];
    let mut rows_data = Vec::new();
    let mut positions = Vec::new();
    for (i, &v) in vs.iter().enumerate() {
        for (j, &d) in families.iter().enumerate() {
            rows_data.extend(generate(d, blocks, rng));
            positions.push(position(v, (i + j) % ratio, ratio));
        }
    }
    let n = positions.len();
    let mut fails = Vec::new();
    let mut last_plan = None;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for order in [OutputOrder::Index, OutputOrder::Score] {
            let batches: [(&str, usize); 3] = [("alone", 1), ("16s", 16), ("300", 300)];
            for (name, b) in batches {
                // Row r of the batch is row r % n of the set.
                let chunk_rows = if b == 300 { 300 } else { b };
                for start in (0..n).step_by(chunk_rows.min(n)) {
                    let rows: Vec<usize> = (0..chunk_rows).map(|r| (start + r) % n).collect();
                    let data: Vec<f32> =
                        rows.iter().flat_map(|&r| rows_data[r * blocks..(r + 1) * blocks].to_vec()).collect();
                    let pos: Vec<i64> = rows.iter().map(|&r| positions[r]).collect();
                    let spec = QsaSpec::new(rows.len(), blocks).with_order(order);
                    let plan = e.plan(&spec.block_spec_of(dtype), true)?;
                    let (ok, detail) = match dtype {
                        DType::F32 => parity_typed::<f32>(e, &spec, &data, &pos)?,
                        DType::BF16 => parity_typed::<bf16>(e, &spec, &data, &pos)?,
                        _ => parity_typed::<f16>(e, &spec, &data, &pos)?,
                    };
                    if !ok {
                        fails.push(format!("{} {} {name} ({:?}): {detail}", dtype.name(), order.name(), plan.path()));
                    }
                    last_plan = Some(plan);
                    if b == 300 || b == 1 && start >= 8 {
                        break; // one batch of 300; 8 rows alone
                    }
                }
            }
        }
    }
    let plan = last_plan.expect("batches ran");
    Ok(Outcome::of_plan(parity_case(), &plan, fails.is_empty(), fails.join("; ")))
}

/// A batch on the GPU against the CPU engine, each row alone.
fn parity_typed<T: ScoreElem>(e: &CudaEngine, spec: &QsaSpec, data: &[f32], pos: &[i64]) -> Result<(bool, String)> {
    let typed: Vec<T> = data.iter().map(|&x| T::from_f32(x)).collect();
    let view = ScoresView::new(&typed, spec.rows, spec.blocks)?;
    let got = e.qsa_select_host(&view, pos, spec, None)?;
    for r in 0..spec.rows {
        let one = ScoresView::new(&typed[r * spec.blocks..(r + 1) * spec.blocks], 1, spec.blocks)?;
        let want = super::qsa_select(&one, &pos[r..r + 1], &QsaSpec { rows: 1, ..*spec }, None)?;
        if want.counts[0] != got.counts[r] || want.row(0) != got.row(r) {
            return Ok((false, format!("row {r} (position {}) differs from the CPU's row alone", pos[r])));
        }
    }
    Ok((true, String::new()))
}
