//! The bench's indexer cases (`--only indexer`): the fused QSA indexer,
//! `qsa_indexer` (scores from the queries and block keys, then the block
//! selection, without the `[T, NB]` scores), on the backend of the run:
//! issue 22's rows and seed 003's depths.
//!
//! Each case: seeded normal queries (bf16, `[T, 4, 128]`) and block keys
//! (bf16, or fp8 e4m3 quantized from the same normals), one sequence's
//! contiguous keys `[NB, 128]` or a paged cache (64-token pages, 16 blocks a
//! page, a random permutation of the pages) with one query per sequence; one
//! untimed call is the baseline, then the engine's timed runs
//! (`CudaEngine::time_qsa_indexer`: inputs uploaded once, graph replays for
//! short runs; the wall clock on the CPU), median reported. Checks: `det`
//! (the timed call's first result equals the baseline); on the GPU `chain`
//! (the result equals `cpu::qsa_select` over the CUDA engine's own
//! `qsa_scores`, every row for decode; for prefill on a deterministic sample
//! of rows, scored alone, since every row depends on its own inputs only:
//! the device's scores are its tensor-core order's, within their stated
//! bound of the CPU's, so the CPU's selection may differ on near-ties); on
//! the CPU `ref` (sampled rows: the result equals
//! `cpu::qsa_select(cpu::qsa_scores(...))`, the unfused composition).
//!
//! Floor: the key bytes the rows read once (`V` blocks of each row that
//! sees more than `k_blocks`; the others read none) at the device's measured
//! copy bandwidth (`CudaEngine::copy_bandwidth`, as the other cases; on the
//! CPU: a plain parallel pass over those bytes, a sum of them); for
//! prefill also the scoring FLOPs (`2 * H * d` per scored block) at an
//! assumed dense bf16 rate of [`BF16_FLOPS`] (790 TFLOP/s: measured on the
//! H200 with torch's bf16 matmul, shared/baselines/selection-stage-torch-h200.md),
//! the larger of the two. The ids and counts written (`rows * 2052 * 4`
//! bytes) are not in the floor.

use std::time::Instant;

use flashsel::ops::indexer::{BlockKeys, KeyElem, QsaIndexerSpec, F8E4M3};
use flashsel::ops::qsa::QsaSelection;
use flashsel::{Backend, DType, PageMap, ScoresView};
use half::bf16;
use indicatif::ProgressBar;
use rayon::prelude::*;

use super::{default_iters, median, rows_to_check, Ctx, DataKind, Group, Row, Suite};

const RATIO: usize = 4;
const HEADS: usize = 4;
const DIM: usize = 128;
const K_BLOCKS: usize = 512;
const PAGE_SIZE: usize = 64;

/// The dense bf16 rate the prefill floor assumes, FLOP/s (H200, measured:
/// shared/baselines/selection-stage-torch-h200.md).
pub(super) const BF16_FLOPS: f64 = 790e12;

/// How the rows of a case are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `seqs` sequences of `tokens` tokens, one query each at the last
    /// position; one sequence: contiguous keys; several: a paged cache.
    Decode { seqs: usize, tokens: usize, paged: bool },
    /// `rows` consecutive queries of one sequence ending at `ratio * NB - 1`.
    Prefill { rows: usize, blocks: usize },
}

/// One indexer case.
#[derive(Debug, Clone, Copy)]
pub(super) struct IdxCase {
    form: Form,
    /// Key dtype: bf16 or f8e4m3.
    kdtype: DType,
    /// Rows in the full suite (more than the rows run when cut).
    full_rows: usize,
    /// A label for the legend: where the case comes from.
    from: &'static str,
}

const fn decode(seqs: usize, tokens: usize, kdtype: DType, from: &'static str) -> IdxCase {
    IdxCase { form: Form::Decode { seqs, tokens, paged: seqs > 1 }, kdtype, full_rows: seqs, from }
}

const fn prefill(rows: usize, blocks: usize, from: &'static str) -> IdxCase {
    IdxCase { form: Form::Prefill { rows, blocks }, kdtype: DType::BF16, full_rows: rows, from }
}

const FULL: &[IdxCase] = &[
    decode(1, 4_096, DType::BF16, "issue 22"),
    decode(1, 131_072, DType::BF16, "issue 22"),
    decode(1, 1_048_576, DType::BF16, "issue 22"),
    decode(1, 1_048_576, DType::F8E4M3, "issue 22"),
    decode(16, 1_048_576, DType::BF16, "issue 22"),
    decode(32, 131_072, DType::BF16, "issue 22"),
    prefill(8192, 65_536, "issue 22"),
    decode(1, 125_769, DType::BF16, "seed 003"),
    decode(1, 299_105, DType::BF16, "seed 003"),
    decode(1, 524_288, DType::BF16, "seed 003"),
    decode(1, 985_621, DType::BF16, "seed 003"),
];

const QUICK: &[IdxCase] = &[
    decode(1, 16_384, DType::BF16, "quick"),
    decode(1, 16_384, DType::F8E4M3, "quick"),
    decode(3, 8_192, DType::BF16, "quick"),
    prefill(64, 4096, "quick"),
];

/// Prefill rows the CPU suite keeps (the CPU engine scores `V` blocks a row:
/// 8192 rows deep in the prompt are minutes there).
const CPU_PREFILL_ROWS: usize = 32;

/// The cases of a suite.
pub(super) fn cases(suite: Suite) -> Vec<IdxCase> {
    match suite {
        Suite::Full => FULL.to_vec(),
        Suite::Quick => QUICK.to_vec(),
        Suite::Cpu => FULL
            .iter()
            .map(|c| match c.form {
                Form::Prefill { rows, blocks } => {
                    IdxCase { form: Form::Prefill { rows: rows.min(CPU_PREFILL_ROWS), blocks }, ..*c }
                }
                _ => *c,
            })
            .collect(),
    }
}

impl IdxCase {
    fn rows(&self) -> usize {
        match self.form {
            Form::Decode { seqs, .. } => seqs,
            Form::Prefill { rows, .. } => rows,
        }
    }

    fn paged(&self) -> bool {
        matches!(self.form, Form::Decode { paged: true, .. })
    }

    /// Blocks a score row has (`NB`): the sequence's complete blocks, or the
    /// table's (`max_pages * 16`) when paged.
    fn blocks(&self) -> usize {
        match self.form {
            Form::Decode { tokens, paged: false, .. } => tokens / RATIO,
            Form::Decode { tokens, paged: true, .. } => tokens.div_ceil(PAGE_SIZE) * (PAGE_SIZE / RATIO),
            Form::Prefill { blocks, .. } => blocks,
        }
    }

    fn max_pages(&self) -> usize {
        match self.form {
            Form::Decode { tokens, .. } => tokens.div_ceil(PAGE_SIZE),
            Form::Prefill { .. } => 0,
        }
    }

    fn positions(&self) -> Vec<i64> {
        match self.form {
            Form::Decode { seqs, tokens, .. } => vec![tokens as i64 - 1; seqs],
            Form::Prefill { rows, blocks } => {
                let first = RATIO * blocks - rows;
                (0..rows).map(|i| (first + i) as i64).collect()
            }
        }
    }

    fn spec(&self) -> QsaIndexerSpec {
        QsaIndexerSpec::new(self.rows(), self.blocks())
            .with_heads(HEADS)
            .with_dim(DIM)
            .with_ratio(RATIO)
            .with_k_blocks(K_BLOCKS)
    }

    /// Blocks scored: `V` of each row with `V > k_blocks`.
    fn scored_blocks(&self) -> u64 {
        self.positions().iter().map(|&t| (t as u64 + 1) / RATIO as u64).filter(|&v| v > K_BLOCKS as u64).sum()
    }

    /// The floor's bytes: the key bytes the rows read once.
    fn key_bytes(&self) -> u64 {
        self.scored_blocks() * (DIM * self.kdtype.size()) as u64
    }

    /// The scoring FLOPs: a multiply and an add per head and value of each
    /// scored block.
    fn flops(&self) -> f64 {
        self.scored_blocks() as f64 * (2 * HEADS * DIM) as f64
    }

    fn describe(&self) -> String {
        let k = self.kdtype.name();
        match self.form {
            Form::Decode { seqs: 1, tokens, .. } => format!(
                "{}: decode, 1 sequence of {tokens} tokens (V = {} blocks), one query at t = {}, {k} keys [{}, {DIM}]",
                self.from,
                tokens / RATIO,
                tokens - 1,
                self.blocks()
            ),
            Form::Decode { seqs, tokens, .. } => format!(
                "{}: decode, {seqs} sequences x {tokens} tokens, one query each at t = {}, {k} keys paged \
                 ({} pages of {PAGE_SIZE} tokens a sequence, random permutation), ids as KV slots",
                self.from,
                tokens - 1,
                self.max_pages()
            ),
            Form::Prefill { rows, blocks } => {
                let first = RATIO * blocks - rows;
                format!(
                    "{}: prefill, {rows} queries at t = {first}..={} (V {}..={}), scores + select fused, {k} keys \
                     [{blocks}, {DIM}]; {:.1} GFLOP of scoring ({:.0} us at {:.0} TFLOP/s bf16; at the H200's 67 \
                     TFLOP/s fp32, without FMA as the exact kernel adds and multiplies: {:.0} us)",
                    self.from,
                    first + rows - 1,
                    (first + 1) / RATIO,
                    blocks,
                    self.flops() / 1e9,
                    self.flops() / BF16_FLOPS * 1e6,
                    BF16_FLOPS / 1e12,
                    self.flops() / (67e12 / 2.0) * 1e6
                )
            }
        }
    }
}

/// The legend of the indexer cases, before the table.
pub(super) fn print_legend(cases: &[IdxCase]) {
    if cases.is_empty() {
        return;
    }
    println!(
        "indexer cases (qsa_indexer: q bf16 [T, {HEADS}, {DIM}], ratio {RATIO}, k_blocks {K_BLOCKS}, ids [T, {}] + \
         counts; bytes: the key bytes the rows read once; floor: those bytes at the copy bandwidth, prefill: the \
         larger of that and the scoring FLOPs at {:.0} TFLOP/s bf16 (assumed: the H200's measured rate)):",
        K_BLOCKS * RATIO + RATIO - 1,
        BF16_FLOPS / 1e12
    );
    for c in cases {
        let cut = if c.rows() != c.full_rows { "*" } else { "" };
        println!("  indexer     {}x{}{cut}: {}", c.rows(), c.blocks(), c.describe());
    }
}

/// The keys of a case, in its dtype.
enum Keys {
    Bf16(Vec<bf16>),
    Fp8(Vec<F8E4M3>),
}

/// The nearest e4m3 code of `x` (ties to the lower magnitude; saturating at
/// 448): the positive finite codes 0..=0x7e increase with their value.
fn to_e4m3(x: f32) -> F8E4M3 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let (mut lo, mut hi) = (0u8, 0x7e);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if F8E4M3(mid).to_f32() <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let code = if lo < 0x7e && (F8E4M3(lo + 1).to_f32() - a) < (a - F8E4M3(lo).to_f32()) { lo + 1 } else { lo };
    F8E4M3(sign | code)
}

/// Runs every indexer case (one data kind: normal).
pub(super) fn run_cases(ctx: &Ctx<'_>, c: &IdxCase, ci: usize, pb: &ProgressBar, emit: &mut dyn FnMut(Row)) {
    pb.set_message(format!("generating indexer {}x{}", c.rows(), c.blocks()));
    let stream = 0x200 + 2 * ci as u64;
    let q: Vec<bf16> = flashsel::data::normal_scores(c.rows() * HEADS * DIM, ctx.seed, stream)
        .par_iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let n_keys = if c.paged() { c.rows() * c.max_pages() * (PAGE_SIZE / RATIO) } else { c.blocks() } * DIM;
    let normal = flashsel::data::normal_scores(n_keys, ctx.seed, stream + 1);
    let keys = match c.kdtype {
        DType::F8E4M3 => Keys::Fp8(normal.par_iter().map(|&x| to_e4m3(x * 8.0)).collect()),
        _ => Keys::Bf16(normal.par_iter().map(|&x| bf16::from_f32(x)).collect()),
    };
    drop(normal);
    pb.set_message(format!("indexer {}x{} {}", c.rows(), c.blocks(), c.kdtype));
    let row = match &keys {
        Keys::Bf16(k) => run_case(ctx, c, &q, k, ci),
        Keys::Fp8(k) => run_case(ctx, c, &q, k, ci),
    };
    emit(row);
}

fn run_case<K: KeyElem>(ctx: &Ctx<'_>, c: &IdxCase, q: &[bf16], kbar: &[K], ci: usize) -> Row {
    let dims = (c.rows(), c.blocks(), K_BLOCKS, c.full_rows);
    let mut row = Row::new(ctx, Group::Indexer, dims, c.kdtype, DataKind::Normal, c.key_bytes(), Some(c.describe()));
    if let Err(e) = measure(ctx, c, q, kbar, ci, &mut row) {
        row.error = Some(e);
        row.ok = false;
    }
    row
}

/// How the rows of a check are computed (the selection on the CPU engine).
#[derive(Clone, Copy)]
enum CpuForm<'a> {
    /// `cpu::qsa_select(cpu::qsa_scores(...))`, the composition it equals.
    Composed,
    /// `cpu::qsa_select` over the CUDA engine's `qsa_scores`: the chain a
    /// CUDA `qsa_indexer` equals (its scores are the device's, within their
    /// bound of the CPU's, not the CPU's bits).
    DeviceChain(&'a flashsel::cuda::CudaEngine),
}

/// The selection of the case's rows `rows` on the CPU engine.
fn cpu_rows<K: KeyElem>(
    c: &IdxCase,
    q: &[bf16],
    kbar: &[K],
    pages: Option<(&[i32], &[i32])>,
    rows: &[usize],
    form: CpuForm<'_>,
) -> Result<QsaSelection, String> {
    let pos_all = c.positions();
    let positions: Vec<i64> = rows.iter().map(|&r| pos_all[r]).collect();
    let qs: Vec<bf16> = rows.iter().flat_map(|&r| q[r * HEADS * DIM..(r + 1) * HEADS * DIM].iter().copied()).collect();
    let spec = QsaIndexerSpec { rows: rows.len(), ..c.spec() };
    let seq: Vec<i32> = pages.map_or(Vec::new(), |(_, all)| rows.iter().map(|&r| all[r]).collect());
    let map = match pages {
        Some((table, _)) => Some(PageMap::new(table, c.max_pages(), PAGE_SIZE, &seq).map_err(|e| e.to_string())?),
        None => None,
    };
    let keys = match map {
        Some(pages) => BlockKeys::Paged { kbar, pages },
        None => BlockKeys::Contiguous(kbar),
    };
    let fail = |e: flashsel::Error| format!("the CPU engine: {e}");
    match form {
        CpuForm::Composed | CpuForm::DeviceChain(_) => {
            let scores = match form {
                CpuForm::DeviceChain(e) => e.qsa_scores_host(&qs, &keys, &positions, &spec.scores_spec()),
                _ => flashsel::cpu::qsa_scores(&qs, &keys, &positions, &spec.scores_spec()),
            }
            .map_err(fail)?;
            let view = ScoresView::new(&scores, spec.rows, spec.blocks).map_err(|e| e.to_string())?;
            flashsel::cpu::qsa_select(&view, &positions, &spec.select_spec(), map.as_ref()).map_err(fail)
        }
    }
}

/// The CPU floor: the median time of a plain parallel pass over the key
/// bytes the rows read (a sum of them, per scored row its `V` blocks, page
/// by page when paged); `None` when no row reads a key.
fn cpu_floor<K: KeyElem>(c: &IdxCase, kbar: &[K], table: Option<&[i32]>, runs: usize) -> Option<f64> {
    // SAFETY: the key types are plain bytes without padding (f32, bf16, u8).
    let bytes = unsafe { std::slice::from_raw_parts(kbar.as_ptr() as *const u8, std::mem::size_of_val(kbar)) };
    let block = DIM * std::mem::size_of::<K>();
    let per = PAGE_SIZE / RATIO;
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for (r, &t) in c.positions().iter().enumerate() {
        let v = (t as usize + 1) / RATIO;
        if v <= K_BLOCKS {
            continue;
        }
        match table {
            None => spans.push((0, v * block)),
            Some(t) => {
                for p in 0..v.div_ceil(per) {
                    let page = t[r * c.max_pages() + p] as usize;
                    let n = per.min(v - p * per);
                    spans.push((page * per * block, (page * per + n) * block));
                }
            }
        }
    }
    if spans.is_empty() {
        return None;
    }
    let pass = || {
        spans
            .par_iter()
            .map(|&(a, b)| bytes[a..b].iter().fold(0u64, |s, &x| s.wrapping_add(x as u64)))
            .reduce(|| 0, u64::wrapping_add)
    };
    std::hint::black_box(pass());
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(pass());
            t.elapsed().as_secs_f64()
        })
        .collect();
    Some(median(&mut times))
}

fn measure<K: KeyElem>(
    ctx: &Ctx<'_>,
    c: &IdxCase,
    q: &[bf16],
    kbar: &[K],
    ci: usize,
    row: &mut Row,
) -> Result<(), String> {
    let positions = c.positions();
    let spec = c.spec();
    let backend = ctx.backend;
    let table = c.paged().then(|| {
        flashsel::data::page_table(
            &mut flashsel::data::Rng::new(ctx.seed ^ 0x1dc0 ^ ci as u64),
            c.rows(),
            c.max_pages(),
        )
    });
    let seq_ids: Vec<i32> = (0..c.rows() as i32).collect();
    let map = match &table {
        Some(t) => Some(PageMap::new(t, c.max_pages(), PAGE_SIZE, &seq_ids).map_err(|e| e.to_string())?),
        None => None,
    };
    let keys = match map {
        Some(pages) => BlockKeys::Paged { kbar, pages },
        None => BlockKeys::Contiguous(kbar),
    };
    let fail = |e: flashsel::Error| format!("qsa_indexer on {} failed: {e}", backend.name());

    let t = Instant::now();
    let first = match backend {
        Backend::Cpu => flashsel::cpu::qsa_indexer(q, &keys, &positions, &spec, map.as_ref()),
        Backend::Cuda(e) => e.qsa_indexer_host(q, &keys, &positions, &spec, map.as_ref()),
    }
    .map_err(fail)?;
    let t_first = t.elapsed().as_secs_f64();
    let iters = ctx.iters.unwrap_or_else(|| default_iters(ctx.suite, backend, t_first));
    let (again, mut times) = match backend {
        Backend::Cpu => {
            let mut times = Vec::with_capacity(iters);
            let mut last = None;
            for _ in 0..iters.max(1) {
                let t = Instant::now();
                last = Some(flashsel::cpu::qsa_indexer(q, &keys, &positions, &spec, map.as_ref()).map_err(fail)?);
                times.push(t.elapsed().as_secs_f64());
            }
            (last.expect("one run at least"), times)
        }
        Backend::Cuda(e) => e.time_qsa_indexer(q, &keys, &positions, &spec, map.as_ref(), iters).map_err(fail)?,
    };
    row.set_times(ctx, &mut times, || cpu_floor(c, kbar, table.as_deref(), iters.clamp(5, 50)))?;
    // The prefill floor on a GPU: the larger of the key bytes and the FLOPs.
    if let (Form::Prefill { .. }, Some(_), false) = (c.form, row.floor_us, matches!(backend, Backend::Cpu)) {
        let flop_us = c.flops() / BF16_FLOPS * 1e6;
        let floor = row.floor_us.unwrap_or(0.0).max(flop_us);
        row.floor_us = Some(floor);
        row.floor_gbps = Some(row.bytes as f64 / floor * 1e-3);
        row.fraction_of_floor = Some(floor / row.median_us);
    }

    let mut checks = vec!["det".to_string()];
    let mut bad = Vec::new();
    if let Some(r) = mismatch(&first, &again, None) {
        bad.push(format!("MISMATCH: repeat runs differ at row {r}"));
    }
    let pages = table.as_deref().map(|t| (t, &seq_ids[..]));
    let sample = match c.form {
        Form::Prefill { rows, blocks } => rows_to_check(rows, blocks, ctx.seed ^ ci as u64),
        Form::Decode { .. } => (0..c.rows()).collect(),
    };
    // The reference's rows on the CPU (16 x 1M holds 16 MiB of scores).
    let ref_rows: Vec<usize> = sample.iter().copied().take(16).collect();
    let coverage = |rows: &[usize], what: &str| {
        if rows.len() == c.rows() {
            format!("{what} all")
        } else {
            format!("{what} {}/{} rows", rows.len(), c.rows())
        }
    };
    match backend {
        Backend::Cuda(e) => {
            // The chain the device's fused call equals: qsa_select (on the
            // CPU) over the device's scores.
            let chain = cpu_rows(c, q, kbar, pages, &sample, CpuForm::DeviceChain(e))?;
            if let Some(r) = mismatch(&first, &chain, Some(&sample)) {
                bad.push(format!("MISMATCH vs cpu::qsa_select(cuda qsa_scores) at row {r}"));
            }
            checks.push(coverage(&sample, "chain"));
        }
        _ => {
            // The reference: qsa_select(qsa_scores) on the CPU, on sampled
            // rows (a decode case's few rows: all of them).
            let composed = cpu_rows(c, q, kbar, pages, &ref_rows, CpuForm::Composed)?;
            if let Some(r) = mismatch(&first, &composed, Some(&ref_rows)) {
                bad.push(format!("MISMATCH vs qsa_select(qsa_scores) at row {r}"));
            }
            checks.push(coverage(&ref_rows, "ref"));
        }
    }
    row.set_verified(checks, bad);
    Ok(())
}

/// The first row where `a` differs from `b` (ids or count); `b` holds the
/// rows `rows` of `a` in that order when given.
fn mismatch(a: &QsaSelection, b: &QsaSelection, rows: Option<&[usize]>) -> Option<usize> {
    let all: Vec<usize>;
    let rows = match rows {
        Some(r) => r,
        None => {
            if a.rows != b.rows {
                return Some(0);
            }
            all = (0..a.rows).collect();
            &all
        }
    };
    if a.width != b.width || b.rows != rows.len() {
        return Some(0);
    }
    rows.iter().enumerate().find(|&(i, &r)| a.row(r) != b.row(i) || a.counts[r] != b.counts[i]).map(|(_, &r)| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cases_are_the_ones_asked_for() {
        let full = cases(Suite::Full);
        let dims: Vec<_> = full.iter().map(|c| (c.rows(), c.blocks(), c.kdtype, c.paged())).collect();
        assert_eq!(
            dims,
            [
                (1, 1024, DType::BF16, false),
                (1, 32_768, DType::BF16, false),
                (1, 262_144, DType::BF16, false),
                (1, 262_144, DType::F8E4M3, false),
                (16, 262_144, DType::BF16, true),
                (32, 32_768, DType::BF16, true),
                (8192, 65_536, DType::BF16, false),
                (1, 31_442, DType::BF16, false),
                (1, 74_776, DType::BF16, false),
                (1, 131_072, DType::BF16, false),
                (1, 246_405, DType::BF16, false),
            ]
        );
        // Decode at 1M: the one query sees every block; 16 x 1M reads 1 GiB of bf16 keys.
        assert_eq!(full[2].positions(), [1_048_575]);
        assert_eq!(full[4].key_bytes(), 1 << 30);
        assert_eq!(full[3].key_bytes(), 262_144 * 128);
        // Prefill: t = 254K..262K, V 63,488 ..= 65,536, every row scored.
        let p = full[6].positions();
        assert_eq!((p[0], p[8191]), (262_144 - 8192, 262_143));
        assert!((full[6].flops() / 1e12 - 0.55).abs() < 0.01, "{}", full[6].flops());
        // Seed 003's depths: one query at the last token, the tail's tokens unscored.
        assert_eq!(full[7].positions(), [125_768]);
        // The CPU suite cuts the prefill chunk only.
        let cpu = cases(Suite::Cpu);
        assert_eq!(cpu.iter().filter(|c| c.rows() != c.full_rows).count(), 1);
        // A 4,096-token decode sees 1024 blocks > 512: scored.
        assert_eq!(full[0].key_bytes(), 1024 * 128 * 2);
    }

    #[test]
    fn e4m3_rounds_to_the_nearest_code() {
        for code in 0u8..=0x7e {
            let v = F8E4M3(code).to_f32();
            assert_eq!(to_e4m3(v).0, code);
            assert_eq!(to_e4m3(-v).0, code | 0x80);
        }
        assert_eq!(to_e4m3(1e9).0, 0x7e); // 448
        assert_eq!(to_e4m3(1.0 + 1.0 / 32.0).to_f32(), 1.0); // below the midpoint of 1 and 1.125
        assert_eq!(to_e4m3(1.1).to_f32(), 1.125);
    }

    #[test]
    fn a_quick_case_runs_on_the_cpu() {
        let c = QUICK[2]; // paged, 3 sequences
        let q = vec![bf16::from_f32(0.5); c.rows() * HEADS * DIM];
        let kbar = vec![bf16::from_f32(1.0); c.rows() * c.max_pages() * 16 * DIM];
        let table = flashsel::data::page_table(&mut flashsel::data::Rng::new(1), c.rows(), c.max_pages());
        let seq: Vec<i32> = (0..c.rows() as i32).collect();
        let sel = cpu_rows(&c, &q, &kbar, Some((&table, &seq)), &[0, 2], CpuForm::Composed).unwrap();
        assert_eq!(sel.rows, 2);
        assert_eq!(sel.counts, [2048, 2048]);
        assert_eq!(mismatch(&sel, &sel, None), None);
        assert!(cpu_floor(&c, &kbar, Some(&table), 3).is_some_and(|t| t > 0.0));
    }
}
