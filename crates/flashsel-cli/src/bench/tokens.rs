//! The bench's token cases: QSA block selection (decode rows and prefill
//! chunks) and DSA (per-row ranges, the indices written as KV slots), on the
//! backend of the run, built as the top-k cases are.
//!
//! Each case: the seeded normal data of the shared generator
//! ([`flashsel::data::normal_scores`]) in the case's dtype, then the same
//! three kinds as the top-k suite (normal, relu, relu-sparse) derived in
//! place. One untimed call ([`ops_backend::qsa_select`] /
//! [`ops_backend::select_ranges`]) is the baseline, then the engine's timed
//! runs ([`ops_backend::time_qsa_select`] / [`ops_backend::time_select_ranges`]:
//! `CudaEngine::time_qsa_select` / `time_select_ranges` on the GPU, the wall
//! clock on the CPU), median reported. Checks, as for top-k: `det` (the
//! timed call's result equals the baseline), `cpu` (on a backend other than
//! the CPU, the whole result equals `flashsel::cpu::qsa_select` /
//! `cpu::select_ranges_paged`), `ref` (sampled rows equal
//! `reference_qsa_select`, or `reference_select_ranges` mapped through the
//! page table, on one-row views).
//!
//! Bytes of the floor: the scores the rows read (QSA: `V` blocks of each row
//! that sees more than `k_blocks`, the others read none; DSA: each row's
//! range) at the dtype's size, plus the ids written (4 bytes each, padding
//! included: `rows x width`, `rows x k`), plus the counts (QSA: 4 bytes a
//! row). Not counted: the positions, ranges, sequence ids and page-table
//! entries read (4 bytes a row or a selected id, from L2), and the values
//! the DSA run also writes (`select_ranges_host` writes them; `rows x k x 4`
//! bytes, 1.6% of the DSA case's bytes).

use std::time::Instant;

use flashsel::ops::qsa::{reference_qsa_select, QsaSelection, QsaSpec};
use flashsel::{Backend, DType, PageMap, ScoreElem, ScoresView, SelectSpec};
use half::f16;
use indicatif::ProgressBar;
use rayon::prelude::*;

use super::{
    default_iters, first_mismatch, median, row_equal, rows_to_check, to_bf16, to_kind_in_place, Ctx, DataKind, Group,
    Row, Suite, CPU_CHECK_MAX_ELEMS, CPU_MAX_ROWS, KINDS,
};
use crate::ops_backend;

/// QSA's tokens per block.
const QSA_RATIO: usize = 4;

/// The CPU suite cuts a token case to [`CPU_MAX_ROWS`] rows when it holds
/// more scores than this (only the 8192 x 65,536 prefill chunk).
const CPU_CUT_ELEMS: usize = 1 << 26;

/// DSA range starts: row `r` starts at column `DSA_START + DSA_START_STEP * r`
/// (an offset unaligned to any vector width, different in every row).
const DSA_START: usize = 1;
const DSA_START_STEP: usize = 7;

/// How the rows of a case are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// QSA decode: every row at the last position `ratio * NB - 1`
    /// (`V = NB`, tail 0).
    QsaLast,
    /// QSA prefill: row `i` at position `first + i`.
    QsaChunk { first: usize },
    /// DSA: `rows` queries at the end of a `cols`-token sequence: row `r` at
    /// `t = cols - rows + r` selects among columns `DSA_START +
    /// DSA_START_STEP * r .. t + 1` (ends `cols - (rows - 1 - r)`), the
    /// indices written as slots through a random page table of one sequence.
    Dsa { page_size: usize },
}

/// One token case.
#[derive(Debug, Clone, Copy)]
pub(super) struct TokCase {
    pub group: Group,
    /// Rows as run.
    rows: usize,
    /// Rows in the full suite.
    full_rows: usize,
    /// QSA: blocks per row (`NB`); DSA: logits per row.
    cols: usize,
    /// QSA: `k_blocks`; DSA: `k`.
    k: usize,
    dtype: DType,
    form: Form,
}

const fn case(group: Group, rows: usize, cols: usize, k: usize, dtype: DType, form: Form) -> TokCase {
    TokCase { group, rows, full_rows: rows, cols, k, dtype, form }
}

/// The full suite's token cases: QSA decode over 1M tokens (1 and 16 rows
/// of 262,144 blocks) and 64K tokens (16,384 blocks); a prefill chunk of
/// 8192 rows ending at the 262,144th token (65,536 blocks, V 63,488 to
/// 65,536) and the first chunk of 8192 tokens (2048 blocks, V 0 to 2048:
/// a quarter of the rows copy); DSA, 64 rows of 131,072 f32 logits, k 2048,
/// into 64-token pages.
const FULL: &[TokCase] = &[
    case(Group::QsaDecode, 1, 262_144, 512, DType::BF16, Form::QsaLast),
    case(Group::QsaDecode, 16, 262_144, 512, DType::BF16, Form::QsaLast),
    case(Group::QsaDecode, 1, 16_384, 512, DType::BF16, Form::QsaLast),
    case(Group::QsaPrefill, 8192, 65_536, 512, DType::BF16, Form::QsaChunk { first: QSA_RATIO * 65_536 - 8192 }),
    case(Group::QsaPrefill, 8192, 2048, 512, DType::BF16, Form::QsaChunk { first: 0 }),
    case(Group::Dsa, 64, 131_072, 2048, DType::F32, Form::Dsa { page_size: 64 }),
];

/// `--quick`: the same forms, small.
const QUICK: &[TokCase] = &[
    case(Group::QsaDecode, 1, 16_384, 512, DType::BF16, Form::QsaLast),
    case(Group::QsaPrefill, 64, 4096, 512, DType::BF16, Form::QsaChunk { first: QSA_RATIO * 4096 - 64 }),
    case(Group::QsaPrefill, 512, 128, 32, DType::BF16, Form::QsaChunk { first: 0 }),
    case(Group::Dsa, 8, 16_384, 256, DType::F32, Form::Dsa { page_size: 64 }),
];

/// The token cases of a suite (the CPU suite cuts the largest, as the top-k
/// suite does its many-row shapes).
pub(super) fn cases(suite: Suite) -> Vec<TokCase> {
    match suite {
        Suite::Full => FULL.to_vec(),
        Suite::Quick => QUICK.to_vec(),
        Suite::Cpu => FULL
            .iter()
            .map(|c| {
                let rows = if c.rows * c.cols > CPU_CUT_ELEMS { c.rows.min(CPU_MAX_ROWS) } else { c.rows };
                TokCase { rows, ..*c }
            })
            .collect(),
    }
}

impl TokCase {
    /// QSA: each row's position.
    fn positions(&self) -> Vec<i64> {
        match self.form {
            Form::QsaLast => vec![(QSA_RATIO * self.cols - 1) as i64; self.rows],
            Form::QsaChunk { first } => (0..self.rows).map(|i| (first + i) as i64).collect(),
            Form::Dsa { .. } => Vec::new(),
        }
    }

    /// DSA: each row's range, `(starts, ends)`.
    fn ranges(&self) -> (Vec<i32>, Vec<i32>) {
        (0..self.rows)
            .map(|r| ((DSA_START + DSA_START_STEP * r) as i32, (self.cols - (self.rows - 1 - r)) as i32))
            .unzip()
    }

    fn qsa_spec(&self) -> QsaSpec {
        QsaSpec::new(self.rows, self.cols).with_ratio(QSA_RATIO).with_k_blocks(self.k)
    }

    /// The columns each row reads: `(row, lo, hi)`, rows that read nothing left out.
    fn spans(&self) -> Vec<(usize, usize, usize)> {
        match self.form {
            Form::Dsa { .. } => {
                let (s, e) = self.ranges();
                (0..self.rows).map(|r| (r, s[r] as usize, e[r] as usize)).collect()
            }
            _ => self
                .positions()
                .iter()
                .enumerate()
                .map(|(r, &t)| (r, (t as usize + 1) / QSA_RATIO))
                .filter(|&(_, v)| v > self.k)
                .map(|(r, v)| (r, 0, v))
                .collect(),
        }
    }

    /// 4-byte words written: ids (padding included) and counts.
    fn out_words(&self) -> usize {
        match self.form {
            Form::Dsa { .. } => self.rows * self.k,
            _ => self.rows * (self.qsa_spec().width() + 1),
        }
    }

    /// The floor's bytes ([the module's rule](self)).
    fn bytes(&self) -> u64 {
        let read: usize = self.spans().iter().map(|&(_, lo, hi)| hi - lo).sum();
        (read * self.dtype.size() + self.out_words() * 4) as u64
    }

    /// What the rows are, for the legend and the JSON.
    fn describe(&self) -> String {
        match self.form {
            Form::QsaLast => format!(
                "QSA ratio {QSA_RATIO}, k_blocks {}: every row at t = {} (V = {} blocks, all); ids [{}, {}] + counts",
                self.k,
                QSA_RATIO * self.cols - 1,
                self.cols,
                self.rows,
                self.qsa_spec().width()
            ),
            Form::QsaChunk { first } => {
                let last = first + self.rows - 1;
                let copies = self.positions().iter().filter(|&&t| (t as usize + 1) / QSA_RATIO <= self.k).count();
                format!(
                    "QSA ratio {QSA_RATIO}, k_blocks {}: rows at t = {first}..={last} (V {}..={}; {copies} rows see \
                     <= {} blocks: copies, no score read); ids [{}, {}] + counts",
                    self.k,
                    (first + 1) / QSA_RATIO,
                    (last + 1) / QSA_RATIO,
                    self.k,
                    self.rows,
                    self.qsa_spec().width()
                )
            }
            Form::Dsa { page_size } => format!(
                "row r = the query at t = {} + r of one {}-token sequence: columns {DSA_START} + {DSA_START_STEP}r .. \
                 t + 1 = {} - ({} - r) (causal, own key included), k {}; indices out as KV slots through a \
                 random permutation of {} pages of {page_size} tokens",
                self.cols - self.rows,
                self.cols,
                self.cols,
                self.rows - 1,
                self.k,
                self.cols.div_ceil(page_size)
            ),
        }
    }
}

/// The legend of the token cases, before the table.
pub(super) fn print_legend(cases: &[TokCase]) {
    if cases.is_empty() {
        return;
    }
    println!(
        "qsa/dsa cases (k: k_blocks for qsa; bytes: the scores the rows read + ids written, 4 B each with \
         padding + counts, 4 B a row):"
    );
    for c in cases {
        let cut = if c.rows != c.full_rows { "*" } else { "" };
        println!("  {:<11} {}x{}{cut}: {}", c.group.name(), c.rows, c.cols, c.describe());
    }
}

/// Generates a case's data and runs it for every data kind.
pub(super) fn run_cases(ctx: &Ctx<'_>, c: &TokCase, ci: usize, pb: &ProgressBar, emit: &mut dyn FnMut(Row)) {
    pb.set_message(format!("generating {} {}x{}", c.group.name(), c.rows, c.cols));
    // Streams apart from the top-k suite's (0, 1, ...).
    let normal = flashsel::data::normal_scores(c.rows * c.cols, ctx.seed, 0x100 + ci as u64);
    let mut each = |data: &mut dyn FnMut(DataKind) -> Row| {
        for kind in KINDS {
            pb.set_message(format!("{} {}x{} k{} {} {}", c.group.name(), c.rows, c.cols, c.k, c.dtype, kind.name()));
            emit(data(kind));
        }
    };
    match c.dtype {
        DType::BF16 => {
            let mut v = to_bf16(&normal);
            drop(normal);
            each(&mut |kind| {
                to_kind_in_place(&mut v, kind);
                run_case(ctx, c, &v, kind, ci)
            });
        }
        DType::F16 => {
            let mut v: Vec<f16> = normal.par_iter().map(|&x| f16::from_f32(x)).collect();
            drop(normal);
            each(&mut |kind| {
                to_kind_in_place(&mut v, kind);
                run_case(ctx, c, &v, kind, ci)
            });
        }
        _ => {
            let mut v = normal;
            each(&mut |kind| {
                to_kind_in_place(&mut v, kind);
                run_case(ctx, c, &v, kind, ci)
            });
        }
    }
}

fn run_case<T: ScoreElem>(ctx: &Ctx<'_>, c: &TokCase, data: &[T], kind: DataKind, ci: usize) -> Row {
    let dims = (c.rows, c.cols, c.k, c.full_rows);
    let mut row = Row::new(ctx, c.group, dims, T::DTYPE, kind, c.bytes(), Some(c.describe()));
    let seed = ctx.seed ^ ((0x100 + ci as u64) << 8) ^ (kind as u64);
    let done = match c.form {
        Form::Dsa { page_size } => measure_dsa(ctx, c, data, page_size, seed, &mut row),
        _ => measure_qsa(ctx, c, data, seed, &mut row),
    };
    if let Err(e) = done {
        row.error = Some(e);
        row.ok = false;
    }
    row
}

/// The CPU floor's runs for a case timed `iters` times.
fn cpu_floor_runs(iters: usize) -> usize {
    iters.clamp(5, 50)
}

fn measure_qsa<T: ScoreElem>(ctx: &Ctx<'_>, c: &TokCase, data: &[T], seed: u64, row: &mut Row) -> Result<(), String> {
    let view = ScoresView::new(data, c.rows, c.cols).map_err(|e| e.to_string())?;
    let positions = c.positions();
    let spec = c.qsa_spec();
    let backend = ctx.backend;

    let t = Instant::now();
    let first = ops_backend::qsa_select(backend, &view, &positions, &spec, None)?;
    let t_first = t.elapsed().as_secs_f64();
    let iters = ctx.iters.unwrap_or_else(|| default_iters(ctx.suite, backend, t_first));
    let (last, mut times) = ops_backend::time_qsa_select(backend, &view, &positions, &spec, None, iters)?;
    row.set_times(ctx, &mut times, || cpu_floor(data, c, cpu_floor_runs(iters)))?;

    let mut checks = vec!["det".to_string()];
    let mut bad = Vec::new();
    if let Some(r) = qsa_mismatch(&first, &last) {
        bad.push(format!("MISMATCH: repeat runs differ at row {r}"));
    }
    if !matches!(backend, Backend::Cpu) {
        if c.rows * c.cols <= CPU_CHECK_MAX_ELEMS {
            let cpu = flashsel::cpu::qsa_select(&view, &positions, &spec, None)
                .map_err(|e| format!("cpu::qsa_select: {e}"))?;
            if let Some(r) = qsa_mismatch(&first, &cpu) {
                bad.push(format!("MISMATCH vs flashsel::cpu::qsa_select at row {r}"));
            }
            checks.push("cpu all".into());
        } else {
            checks.push("cpu skipped (too large)".into());
        }
    }
    let sample = rows_to_check(c.rows, c.cols, seed);
    for &r in &sample {
        let one = ScoresView::new(view.row(r), 1, c.cols).map_err(|e| e.to_string())?;
        let reference = reference_qsa_select(&one, &positions[r..r + 1], &QsaSpec { rows: 1, ..spec }, None)
            .map_err(|e| format!("reference_qsa_select: {e}"))?;
        if reference.row(0) != first.row(r) || reference.counts[0] != first.counts[r] {
            bad.push(format!("MISMATCH vs reference_qsa_select at row {r}"));
            break;
        }
    }
    checks.push(ref_check(sample.len(), c.rows));
    row.set_verified(checks, bad);
    Ok(())
}

fn measure_dsa<T: ScoreElem>(
    ctx: &Ctx<'_>,
    c: &TokCase,
    data: &[T],
    page_size: usize,
    seed: u64,
    row: &mut Row,
) -> Result<(), String> {
    let view = ScoresView::new(data, c.rows, c.cols).map_err(|e| e.to_string())?;
    let (starts, ends) = c.ranges();
    let max_pages = c.cols.div_ceil(page_size);
    let table = flashsel::data::page_table(&mut flashsel::data::Rng::new(seed), 1, max_pages);
    let seq_ids = vec![0i32; c.rows];
    let pages = PageMap::new(&table, max_pages, page_size, &seq_ids).map_err(|e| e.to_string())?;
    let spec = view.spec(c.k);
    let backend = ctx.backend;
    let (s, e, p) = (Some(&starts[..]), Some(&ends[..]), Some(&pages));

    let t = Instant::now();
    let first = ops_backend::select_ranges(backend, &view, &spec, s, e, p)?;
    let t_first = t.elapsed().as_secs_f64();
    let iters = ctx.iters.unwrap_or_else(|| default_iters(ctx.suite, backend, t_first));
    let (last, mut times) = ops_backend::time_select_ranges(backend, &view, &spec, s, e, p, iters)?;
    row.set_times(ctx, &mut times, || cpu_floor(data, c, cpu_floor_runs(iters)))?;

    let mut checks = vec!["det".to_string()];
    let mut bad = Vec::new();
    if let Some(r) = first_mismatch(&first, &last) {
        bad.push(format!("MISMATCH: repeat runs differ at row {r}"));
    }
    if !matches!(backend, Backend::Cpu) {
        if c.rows * c.cols <= CPU_CHECK_MAX_ELEMS {
            let cpu = flashsel::cpu::select_ranges_paged(&view, &spec, s, e, &pages)
                .map_err(|e| format!("cpu::select_ranges_paged: {e}"))?;
            if let Some(r) = first_mismatch(&first, &cpu) {
                bad.push(format!("MISMATCH vs flashsel::cpu::select_ranges_paged at row {r}"));
            }
            checks.push("cpu all".into());
        } else {
            checks.push("cpu skipped (too large)".into());
        }
    }
    let sample = rows_to_check(c.rows, c.cols, seed);
    for &r in &sample {
        let one = ScoresView::new(view.row(r), 1, c.cols).map_err(|e| e.to_string())?;
        let one_spec = SelectSpec { rows: 1, ..spec };
        let mut reference =
            flashsel::ops::select::reference_select_ranges(&one, &one_spec, Some(&starts[r..=r]), Some(&ends[r..=r]))
                .map_err(|e| format!("reference_select_ranges: {e}"))?;
        let seq = seq_ids[r] as usize;
        for id in reference.indices.iter_mut().filter(|id| **id >= 0) {
            let col = *id as usize;
            *id = table[seq * max_pages + col / page_size] * page_size as i32 + (col % page_size) as i32;
        }
        if !row_equal(&first, r, &reference, 0) {
            bad.push(format!("MISMATCH vs reference_select_ranges (through the page table) at row {r}"));
            break;
        }
    }
    checks.push(ref_check(sample.len(), c.rows));
    row.set_verified(checks, bad);
    Ok(())
}

fn ref_check(sampled: usize, rows: usize) -> String {
    if sampled == rows {
        "ref all".into()
    } else {
        format!("ref {sampled}/{rows} rows")
    }
}

/// The first row where two QSA selections differ (ids or count).
fn qsa_mismatch(a: &QsaSelection, b: &QsaSelection) -> Option<usize> {
    if a.rows != b.rows || a.width != b.width || a.counts.len() != b.counts.len() {
        return Some(0);
    }
    (0..a.rows).find(|&r| a.row(r) != b.row(r) || a.counts[r] != b.counts[r])
}

/// The CPU floor of a case: the median time of a plain parallel pass that
/// reads the scores the rows read (a sum of their bits, in pieces of 64 Ki
/// elements) and then writes the output's words once (a fill with that sum).
/// `None` when the case moves nothing.
fn cpu_floor<T: ScoreElem>(data: &[T], c: &TokCase, runs: usize) -> Option<f64> {
    const PIECE: usize = 1 << 16;
    let pieces: Vec<(usize, usize)> = c
        .spans()
        .into_iter()
        .flat_map(|(r, lo, hi)| {
            let (a, b) = (r * c.cols + lo, r * c.cols + hi);
            (a..b).step_by(PIECE).map(move |x| (x, (x + PIECE).min(b)))
        })
        .collect();
    let mut out = vec![0i32; c.out_words()];
    if pieces.is_empty() && out.is_empty() {
        return None;
    }
    let mut pass = || {
        let sum = pieces
            .par_iter()
            .map(|&(a, b)| data[a..b].iter().fold(0u64, |s, x| s.wrapping_add(x.bits() as u64)))
            .reduce(|| 0, u64::wrapping_add);
        out.par_chunks_mut(PIECE).for_each(|w| w.fill(sum as i32));
        std::hint::black_box(&out);
    };
    pass();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed().as_secs_f64()
        })
        .collect();
    Some(median(&mut times))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cases_are_the_ones_asked_for() {
        let full = cases(Suite::Full);
        let dims: Vec<_> = full.iter().map(|c| (c.group, c.rows, c.cols, c.k, c.dtype)).collect();
        assert_eq!(
            dims,
            [
                (Group::QsaDecode, 1, 262_144, 512, DType::BF16),
                (Group::QsaDecode, 16, 262_144, 512, DType::BF16),
                (Group::QsaDecode, 1, 16_384, 512, DType::BF16),
                (Group::QsaPrefill, 8192, 65_536, 512, DType::BF16),
                (Group::QsaPrefill, 8192, 2048, 512, DType::BF16),
                (Group::Dsa, 64, 131_072, 2048, DType::F32),
            ]
        );
        // Decode: every row at the last position, V = NB.
        let d = &full[1];
        assert!(d.positions().iter().all(|&t| t == 1_048_575 && (t as usize + 1) / 4 == 262_144));
        // Prefill deep in the prompt: t = 262,144 - 8192 + i, V 63,488 ..= 65,536.
        let p = &full[3];
        let pos = p.positions();
        assert_eq!((pos[0], pos[8191]), (262_144 - 8192, 262_143));
        assert_eq!(((pos[0] + 1) / 4, (pos[8191] + 1) / 4), (63_488, 65_536));
        // The first chunk: t = 0..8191, V 0 ..= 2048; rows with V <= 512 read nothing.
        let f = &full[4];
        let pos = f.positions();
        assert_eq!((pos[0], pos[8191], (pos[8191] + 1) / 4), (0, 8191, 2048));
        assert_eq!(f.spans().len(), 8192 - 2051);
        // DSA: a causal diagonal, every range inside the row.
        let dsa = &full[5];
        let (s, e) = dsa.ranges();
        assert_eq!((e[0], e[63]), (131_072 - 63, 131_072));
        assert!(s.iter().zip(&e).all(|(s, e)| 0 < *s && s < e));
        // CPU: only the 8192 x 65,536 chunk is cut.
        let cpu = cases(Suite::Cpu);
        let cut: Vec<_> = cpu.iter().filter(|c| c.rows != c.full_rows).map(|c| (c.rows, c.cols)).collect();
        assert_eq!(cut, [(CPU_MAX_ROWS, 65_536)]);
    }

    #[test]
    fn floor_bytes_count_the_scores_read_and_the_outputs() {
        let full = cases(Suite::Full);
        // 1 x 262,144 bf16: the row's scores, 2051 ids and a count.
        assert_eq!(full[0].bytes(), 262_144 * 2 + 2052 * 4);
        // The first chunk: only rows with V > 512 read V blocks.
        let f = &full[4];
        let read: u64 = (2051..8192u64).map(|t| (t + 1) / 4).filter(|&v| v > 512).sum::<u64>() * 2;
        assert_eq!(f.bytes(), read + 8192 * 2052 * 4);
        // DSA: each range's f32 logits and 2048 ids a row.
        let d = &full[5];
        let (s, e) = d.ranges();
        let read: u64 = s.iter().zip(&e).map(|(s, e)| (e - s) as u64 * 4).sum();
        assert_eq!(d.bytes(), read + 64 * 2048 * 4);
    }

    #[test]
    fn the_cpu_floor_reads_what_the_rows_read() {
        let c = QUICK[2];
        let data = vec![half::bf16::from_f32(1.0); c.rows * c.cols];
        assert!(cpu_floor(&data, &c, 3).is_some_and(|t| t > 0.0));
    }
}
