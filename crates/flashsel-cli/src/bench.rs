//! `flashsel bench`: the standard suite of shapes on the best backend, with
//! every result verified against the contract.
//!
//! Data is generated here, seeded and independent of the thread count: random
//! normal rows, and ReLU-plateau rows (`max(0, x)`, so about half the entries
//! are exactly 0.0, as in real indexer scores).
//!
//! Each case: one untimed `select` (its result is the baseline), then
//! [`Backend::time_select`] for the timed runs (median reported). Checks:
//! - `det`: the timed runs' result equals the first one bit for bit;
//! - `ref`: rows equal [`flashsel::reference_select`] run on a one-row view of
//!   the same data, for every row of small shapes and a deterministic sample of
//!   rows (first, last and six pseudo-random ones) of large shapes;
//! - `cpu`: on a backend other than the CPU, the whole result equals
//!   [`flashsel::cpu::select`] on the same data (up to 2^30 elements, which
//!   covers the whole standard suite).
//!
//! Any mismatch or backend error fails the run (status 1) after the table.
//!
//! The token operations (QSA block selection, DSA ranges written as KV slots)
//! are cases of their own after the top-k suite, built the same way (see
//! [`tokens`]). Then the fused QSA indexer's cases (`qsa_indexer` from
//! queries and block keys: [`indexer`]). `--only` picks groups of cases:
//! `select`, `qsa-decode`, `qsa-prefill`, `dsa`, `indexer` (`qsa` = both QSA
//! selection groups).

mod dsa_indexer;
mod indexer;
mod mla;
mod qsa_attn;
mod tokens;

use std::fs::File;
use std::io::Write;
use std::time::Instant;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use flashsel::{Backend, DType, ScoreElem, ScoresView, SelectSpec, Selection};
use half::bf16;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;

use crate::BenchArgs;

/// A group of cases `--only` can pick; the `op` column of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The top-k suite (`select`).
    Select,
    /// QSA decode rows: every row at the last position.
    QsaDecode,
    /// QSA prefill chunks: rows at consecutive positions.
    QsaPrefill,
    /// DSA: per-row ranges, the indices written as KV slots.
    Dsa,
    /// The fused QSA indexer (`qsa_indexer`: scores from the queries and
    /// block keys, then the block selection).
    Indexer,
    /// Sparse MLA attention (issue 23's rows; CUDA, only with `--only mla`).
    Mla,
    /// QSA sparse attention (CUDA, only with `--only qsa-attn`).
    QsaAttn,
    /// The DSA indexer (CUDA, only with `--only dsa-indexer`).
    DsaIndexer,
}

impl Group {
    const ALL: [Group; 5] = [Group::Select, Group::QsaDecode, Group::QsaPrefill, Group::Dsa, Group::Indexer];

    fn name(self) -> &'static str {
        match self {
            Group::Select => "select",
            Group::QsaDecode => "qsa-decode",
            Group::QsaPrefill => "qsa-prefill",
            Group::Dsa => "dsa",
            Group::Indexer => "indexer",
            Group::Mla => "mla",
            Group::QsaAttn => "qsa-attn",
            Group::DsaIndexer => "dsa-indexer",
        }
    }
}

/// One `--only` value: the groups it names.
#[derive(Debug, Clone, Copy)]
pub struct Groups(&'static [Group]);

/// `--only`'s values: a group's name, or `qsa` for both QSA groups.
pub fn group_parser() -> impl TypedValueParser<Value = Groups> {
    PossibleValuesParser::new([
        "select",
        "qsa",
        "qsa-decode",
        "qsa-prefill",
        "dsa",
        "indexer",
        "mla",
        "qsa-attn",
        "dsa-indexer",
    ])
    .map(|s| {
        Groups(match s.as_str() {
            "select" => &[Group::Select],
            "qsa" => &[Group::QsaDecode, Group::QsaPrefill],
            "qsa-decode" => &[Group::QsaDecode],
            "qsa-prefill" => &[Group::QsaPrefill],
            "indexer" => &[Group::Indexer],
            "mla" => &[Group::Mla],
            "qsa-attn" => &[Group::QsaAttn],
            "dsa-indexer" => &[Group::DsaIndexer],
            _ => &[Group::Dsa],
        })
    })
}

/// The groups to run: those `--only` names, or all of them (sparse MLA
/// only when named).
fn selected_groups(only: &[Groups]) -> Vec<Group> {
    let mut g: Vec<Group> =
        Group::ALL.into_iter().filter(|g| only.is_empty() || only.iter().any(|o| o.0.contains(g))).collect();
    for extra in [Group::Mla, Group::QsaAttn, Group::DsaIndexer] {
        if only.iter().any(|o| o.0.contains(&extra)) {
            g.push(extra);
        }
    }
    g
}

/// One shape of a suite.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    k: usize,
    dtypes: &'static [DType],
    /// Rows of this shape in the full suite (more than `rows` when cut down).
    full_rows: usize,
}

const F32_BF16: &[DType] = &[DType::F32, DType::BF16];
const F32_ONLY: &[DType] = &[DType::F32];

const fn shape(rows: usize, cols: usize, k: usize, dtypes: &'static [DType]) -> Shape {
    Shape { rows, cols, k, dtypes, full_rows: rows }
}

/// The standard suite, from one long decode row to a many-row prefill.
const FULL: &[Shape] = &[
    shape(1, 262_144, 512, F32_BF16),
    shape(1, 1_048_576, 2048, F32_BF16),
    shape(64, 131_072, 2048, F32_BF16),
    shape(8192, 131_072, 2048, F32_BF16),
    shape(1, 65_536, 2048, F32_ONLY),
    shape(128, 262_144, 512, F32_ONLY),
    shape(4096, 65_536, 2048, F32_ONLY),
];

/// Largest matrix (elements) a non-CPU result is compared with
/// `flashsel::cpu::select` in full; larger ones are checked on sampled rows.
const CPU_CHECK_MAX_ELEMS: usize = 1 << 30;

/// Rows the many-row shapes are cut to on the CPU.
const CPU_MAX_ROWS: usize = 256;

const QUICK: &[Shape] = &[shape(1, 65_536, 2048, F32_BF16), shape(8, 16_384, 256, F32_BF16)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suite {
    Full,
    Cpu,
    Quick,
}

impl Suite {
    fn name(self) -> &'static str {
        match self {
            Suite::Full => "full",
            Suite::Cpu => "cpu",
            Suite::Quick => "quick",
        }
    }
    fn shapes(self) -> Vec<Shape> {
        match self {
            Suite::Full => FULL.to_vec(),
            Suite::Quick => QUICK.to_vec(),
            Suite::Cpu => FULL.iter().map(|s| Shape { rows: s.rows.min(CPU_MAX_ROWS), ..*s }).collect(),
        }
    }
    fn note(self) -> String {
        match self {
            Suite::Full => "the standard suite".into(),
            Suite::Quick => "a small smoke-test suite (--quick)".into(),
            Suite::Cpu => format!(
                "the CPU suite: the 8192- and 4096-row top-k shapes and the 8192-row QSA prefill chunk deep in \
                 the prompt are cut to {CPU_MAX_ROWS} rows (marked *); --backend cuda runs them whole"
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataKind {
    Normal,
    Relu,
    /// `max(0, x - 3)`: ~0.13% positive, so for the suite's k the k-th score is
    /// one of a plateau of tied zeros, decided by column.
    ReluSparse,
}

impl DataKind {
    fn name(self) -> &'static str {
        match self {
            DataKind::Normal => "normal",
            DataKind::Relu => "relu",
            DataKind::ReluSparse => "relu-sparse",
        }
    }
}

/// One line of the table and of the JSON.
#[derive(Debug, Clone, Serialize)]
struct Row {
    /// The group: `select`, `qsa-decode`, `qsa-prefill`, `dsa`, `indexer`.
    op: &'static str,
    /// `rows x cols` as run (QSA: cols = blocks).
    shape: String,
    rows: usize,
    cols: usize,
    /// Entries selected per row (QSA: blocks, `k_blocks`).
    k: usize,
    /// Rows of this shape in the full suite (> rows when the CPU suite cut it).
    suite_rows: usize,
    dtype: &'static str,
    data: &'static str,
    backend: &'static str,
    iters: usize,
    /// Median of the timed runs, microseconds.
    median_us: f64,
    min_us: f64,
    /// The bytes of the floor: `select`: the scores (read once per run);
    /// QSA and DSA: the scores the rows read plus the ids (and counts)
    /// written ([`tokens`]); indexer: the block keys the rows read
    /// ([`indexer`]).
    bytes: u64,
    /// QSA and DSA: the positions, ranges and page table of the case.
    case: Option<String>,
    /// `bytes / median`, in 1e9 bytes per second.
    gbps: f64,
    /// Time of the read-once floor for these bytes, when known.
    floor_us: Option<f64>,
    floor_gbps: Option<f64>,
    /// `floor_us / median_us`: 1.0 means as fast as reading the scores once.
    fraction_of_floor: Option<f64>,
    /// What was checked, e.g. `det, ref all` or `det, cpu all, ref 8/8192 rows`.
    verified: String,
    ok: bool,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    tool: &'static str,
    version: &'static str,
    backend: &'static str,
    requested_backend: &'static str,
    /// The GPU, when the backend is CUDA.
    device: Option<String>,
    fallback_reason: Option<String>,
    suite: &'static str,
    suite_note: String,
    seed: u64,
    threads: usize,
    floor_method: String,
    /// The groups run (`--only`, or all).
    groups: Vec<&'static str>,
    debug_build: bool,
    ok: bool,
    results: Vec<Row>,
    /// `--only mla`: the sparse MLA rows.
    mla: Vec<mla::MlaRow>,
    /// `--only qsa-attn`: the QSA sparse attention rows.
    qsa_attn: Vec<qsa_attn::QsaAttnRow>,
    /// `--only dsa-indexer`: the DSA indexer rows.
    dsa_indexer: Vec<dsa_indexer::DsaRow>,
}

struct Ctx<'a> {
    backend: &'a Backend,
    suite: Suite,
    iters: Option<usize>,
    seed: u64,
    device_floor_bps: Option<f64>,
}

/// Bytes the device copy-bandwidth probe moves: large enough to stream from
/// device memory rather than L2.
const DEVICE_PROBE_BYTES: usize = 512 << 20;

/// The device bandwidth for the floor column, bytes per second: the CUDA
/// engine's device-to-device copy bandwidth (bytes read + written per second),
/// so the floor of a case is `bytes / bandwidth`.
fn device_floor_bandwidth(backend: &Backend) -> Result<Option<f64>, String> {
    match backend {
        Backend::Cpu => Ok(None),
        Backend::Cuda(engine) => engine
            .copy_bandwidth(DEVICE_PROBE_BYTES)
            .map(Some)
            .map_err(|e| format!("measuring the device copy bandwidth: {e}")),
    }
}

pub fn run(a: &BenchArgs, verbose: bool) -> Result<(), String> {
    let json_file = match &a.json {
        Some(p) => Some(File::create(p).map_err(|e| format!("cannot write --json {}: {e}", p.display()))?),
        None => None,
    };
    let (backend, reason) = crate::open_backend(a.backend, verbose)?;
    let suite = match (a.quick, &backend) {
        (true, _) => Suite::Quick,
        (false, Backend::Cpu) => Suite::Cpu,
        (false, _) => Suite::Full,
    };
    let ctx = Ctx {
        backend: &backend,
        suite,
        iters: a.iters.map(|n| n as usize),
        seed: a.seed,
        device_floor_bps: device_floor_bandwidth(&backend)?,
    };
    let threads = rayon::current_num_threads();
    let groups = selected_groups(&a.only);
    let floor_method = match &backend {
        Backend::Cpu => format!(
            "a plain rayon sum pass over the same buffer ({threads} threads), median time \
             (qsa/dsa: over the scores the rows read, then a fill of the output's bytes)"
        ),
        _ => match ctx.device_floor_bps {
            Some(bw) => format!(
                "bytes / device copy bandwidth ({:.1} GB/s read+written, cuMemcpyDtoD of {} MiB)",
                bw / 1e9,
                DEVICE_PROBE_BYTES >> 20
            ),
            None => "not known for this backend yet".into(),
        },
    };

    let device = match &backend {
        Backend::Cuda(e) => Some(format!("{} ({}, {} SMs)", e.device_name(), e.arch(), e.props().sm_count)),
        Backend::Cpu => None,
    };
    let backend_line = match (&reason, &device) {
        (Some(_), _) if verbose => "cpu (auto: CUDA is not usable, see the note above)".to_string(),
        (Some(_), _) => "cpu (auto: CUDA is not usable; -v says why)".to_string(),
        (None, Some(d)) => format!("{} on {d}", backend.name()),
        (None, None) => backend.name().to_string(),
    };
    println!(
        "flashsel {} bench: backend {backend_line}, {threads} threads, seed {}",
        env!("CARGO_PKG_VERSION"),
        a.seed
    );
    println!("suite: {}", suite.note());
    if groups.len() < Group::ALL.len() {
        println!("groups: {} (--only)", groups.iter().map(|g| g.name()).collect::<Vec<_>>().join(", "));
    }
    println!(
        "GB/s: bytes / median time (select: the scores, read once; qsa/dsa: the scores the rows read + ids \
         and counts written); floor: {floor_method}; of floor: floor time / median time"
    );
    println!(
        "verified: det = repeat runs identical; ref = rows equal flashsel::reference_select \
         (qsa: reference_qsa_select; dsa: reference_select_ranges, then the page table); \
         cpu = whole result equals flashsel::cpu::select (qsa: cpu::qsa_select; dsa: cpu::select_ranges_paged)"
    );
    let token_cases: Vec<tokens::TokCase> =
        tokens::cases(suite).into_iter().filter(|c| groups.contains(&c.group)).collect();
    tokens::print_legend(&token_cases);
    let indexer_cases = if groups.contains(&Group::Indexer) { indexer::cases(suite) } else { Vec::new() };
    indexer::print_legend(&indexer_cases);
    if cfg!(debug_assertions) && !a.quick {
        println!("note: this is a debug build; build with --release for meaningful timings");
    }
    println!();
    print_header();

    let shapes = if groups.contains(&Group::Select) { suite.shapes() } else { Vec::new() };
    let total: u64 = shapes.iter().map(|s| KINDS.len() as u64 * s.dtypes.len() as u64).sum::<u64>()
        + KINDS.len() as u64 * token_cases.len() as u64
        + indexer_cases.len() as u64;
    let pb = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}") {
        pb.set_style(style);
    }

    let mut rows = Vec::new();
    for (si, s) in shapes.iter().enumerate() {
        pb.set_message(format!("generating {}x{}", s.rows, s.cols));
        let mut normal = flashsel::data::normal_scores(s.rows * s.cols, a.seed, si as u64);
        let mut bf = s.dtypes.contains(&DType::BF16).then(|| to_bf16(&normal));

        let mut emit = |row: Row| {
            pb.suspend(|| print_row(&row));
            pb.inc(1);
            rows.push(row);
        };
        // Each kind derives from the one before, in place: normal, then
        // max(0, x), then max(0, x - 3) (= max(0, max(0, x) - 3)).
        for kind in KINDS {
            to_kind_in_place(&mut normal, kind);
            pb.set_message(label(s, "f32", kind));
            emit(run_case(&ctx, s, &normal, kind, si));
        }
        drop(normal);
        if let Some(bf) = bf.as_mut() {
            for kind in KINDS {
                to_kind_in_place(bf, kind);
                pb.set_message(label(s, "bf16", kind));
                emit(run_case(&ctx, s, bf, kind, si));
            }
        }
    }
    for (ci, c) in token_cases.iter().enumerate() {
        tokens::run_cases(&ctx, c, ci, &pb, &mut |row: Row| {
            pb.suspend(|| print_row(&row));
            pb.inc(1);
            rows.push(row);
        });
    }
    for (ci, c) in indexer_cases.iter().enumerate() {
        indexer::run_cases(&ctx, c, ci, &pb, &mut |row: Row| {
            pb.suspend(|| print_row(&row));
            pb.inc(1);
            rows.push(row);
        });
    }
    pb.finish_and_clear();
    let mla_rows = match (&backend, groups.contains(&Group::Mla)) {
        (Backend::Cuda(e), true) => {
            let r = mla::run(e, a.seed, ctx.iters, a.quick);
            mla::print(&r);
            r
        }
        (_, true) => {
            println!("mla: sparse MLA rows run on the CUDA backend only");
            Vec::new()
        }
        _ => Vec::new(),
    };
    let qa_rows = match (&backend, groups.contains(&Group::QsaAttn)) {
        (Backend::Cuda(e), true) => {
            let r = qsa_attn::run(e, a.seed, ctx.iters, a.quick);
            qsa_attn::print(&r);
            r
        }
        (_, true) => {
            println!("qsa-attn: QSA sparse attention rows run on the CUDA backend only");
            Vec::new()
        }
        _ => Vec::new(),
    };
    let dsa_rows = match (&backend, groups.contains(&Group::DsaIndexer)) {
        (Backend::Cuda(e), true) => {
            let r = dsa_indexer::run(e, a.seed, ctx.iters, a.quick);
            dsa_indexer::print(&r);
            r
        }
        (_, true) => {
            println!("dsa-indexer: DSA indexer rows run on the CUDA backend only");
            Vec::new()
        }
        _ => Vec::new(),
    };
    let mla_failed = mla_rows.iter().filter(|r| !r.ok).count()
        + qa_rows.iter().filter(|r| !r.ok).count()
        + dsa_rows.iter().filter(|r| !r.ok).count();

    let failed: Vec<&Row> = rows.iter().filter(|r| !r.ok).collect();
    println!();
    if suite == Suite::Cpu {
        println!("* rows cut from the full suite's shape for the CPU run");
    }
    let report = Report {
        tool: "flashsel bench",
        version: env!("CARGO_PKG_VERSION"),
        backend: backend.name(),
        requested_backend: crate::choice_name(a.backend),
        device,
        fallback_reason: reason,
        suite: suite.name(),
        suite_note: suite.note(),
        seed: a.seed,
        threads,
        floor_method,
        groups: groups.iter().map(|g| g.name()).collect(),
        debug_build: cfg!(debug_assertions),
        ok: failed.is_empty() && mla_failed == 0,
        results: rows.clone(),
        mla: mla_rows.clone(),
        qsa_attn: qa_rows.clone(),
        dsa_indexer: dsa_rows.clone(),
    };
    if let (Some(mut f), Some(p)) = (json_file, &a.json) {
        let text = serde_json::to_string_pretty(&report).map_err(|e| format!("cannot encode JSON: {e}"))?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.write_all(b"\n"))
            .map_err(|e| format!("cannot write --json {}: {e}", p.display()))?;
    }
    if failed.is_empty() && mla_failed == 0 {
        println!("{} cases, all verified", rows.len() + mla_rows.len() + qa_rows.len() + dsa_rows.len());
        Ok(())
    } else if failed.is_empty() {
        Err(format!(
            "{mla_failed} of {} sparse attention / DSA rows failed verification or errored",
            mla_rows.len() + qa_rows.len() + dsa_rows.len()
        ))
    } else {
        for r in &failed {
            eprintln!(
                "failed: {} {} k{} {} {}: {}",
                r.op,
                r.shape,
                r.k,
                r.dtype,
                r.data,
                r.error.as_deref().unwrap_or(&r.verified)
            );
        }
        Err(format!("{} of {} cases failed verification or errored", failed.len(), rows.len()))
    }
}

fn label(s: &Shape, dtype: &str, kind: DataKind) -> String {
    format!("{}x{} k{} {dtype} {}", s.rows, s.cols, s.k, kind.name())
}

fn print_header() {
    println!(
        "{:<11} {:<14} {:>5} {:<5} {:<11} {:<7} {:>5} {:>11} {:>8} {:>10} {:>10} {:>8}  verified",
        "op",
        "shape",
        "k",
        "dtype",
        "data",
        "backend",
        "iters",
        "median us",
        "GB/s",
        "floor us",
        "floor GB/s",
        "of floor"
    );
}

fn print_row(r: &Row) {
    let opt = |x: Option<f64>, prec: usize| x.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    let shape = if r.suite_rows != r.rows { format!("{}*", r.shape) } else { r.shape.clone() };
    let verified = match &r.error {
        Some(e) => format!("ERROR: {e}"),
        None => r.verified.clone(),
    };
    println!(
        "{:<11} {:<14} {:>5} {:<5} {:<11} {:<7} {:>5} {:>11.1} {:>8.2} {:>10} {:>10} {:>8}  {}",
        r.op,
        shape,
        r.k,
        r.dtype,
        r.data,
        r.backend,
        r.iters,
        r.median_us,
        r.gbps,
        opt(r.floor_us, 2),
        opt(r.floor_gbps, 2),
        opt(r.fraction_of_floor, 2),
        verified
    );
}

impl Row {
    /// A row not measured yet.
    #[allow(clippy::too_many_arguments)]
    fn new(
        ctx: &Ctx<'_>,
        group: Group,
        (rows, cols, k, suite_rows): (usize, usize, usize, usize),
        dtype: DType,
        kind: DataKind,
        bytes: u64,
        case: Option<String>,
    ) -> Self {
        Row {
            op: group.name(),
            shape: format!("{rows}x{cols}"),
            rows,
            cols,
            k,
            suite_rows,
            dtype: dtype.name(),
            data: kind.name(),
            backend: ctx.backend.name(),
            iters: 0,
            median_us: f64::NAN,
            min_us: f64::NAN,
            bytes,
            case,
            gbps: f64::NAN,
            floor_us: None,
            floor_gbps: None,
            fraction_of_floor: None,
            verified: String::new(),
            ok: false,
            error: None,
        }
    }

    /// Records the timed runs (median, min, GB/s) and the floor, when known:
    /// `cpu_floor_s` on the CPU, else `bytes` at the device's bandwidth.
    fn set_times(
        &mut self,
        ctx: &Ctx<'_>,
        times: &mut [f64],
        cpu_floor_s: impl FnOnce() -> Option<f64>,
    ) -> Result<(), String> {
        if times.is_empty() {
            return Err("the backend returned no timings".into());
        }
        let median = median(times);
        self.iters = times.len();
        self.median_us = median * 1e6;
        self.min_us = times[0] * 1e6;
        self.gbps = self.bytes as f64 / median / 1e9;
        let floor_s = match ctx.backend {
            Backend::Cpu => cpu_floor_s(),
            _ => ctx.device_floor_bps.map(|bw| self.bytes as f64 / bw),
        };
        if let Some(f) = floor_s {
            self.floor_us = Some(f * 1e6);
            self.floor_gbps = Some(self.bytes as f64 / f / 1e9);
            self.fraction_of_floor = Some(f / median);
        }
        Ok(())
    }

    /// Records the checks: `ok` when nothing is `bad`.
    fn set_verified(&mut self, checks: Vec<String>, bad: Vec<String>) {
        if bad.is_empty() {
            self.verified = checks.join(", ");
            self.ok = true;
        } else {
            self.verified = bad.join("; ");
            self.ok = false;
        }
    }
}

fn run_case<T: ScoreElem>(ctx: &Ctx<'_>, s: &Shape, data: &[T], kind: DataKind, shape_idx: usize) -> Row {
    let bytes = (data.len() * T::DTYPE.size()) as u64;
    let dims = (s.rows, s.cols, s.k, s.full_rows);
    let mut row = Row::new(ctx, Group::Select, dims, T::DTYPE, kind, bytes, None);
    if let Err(e) = measure(ctx, s, data, kind, shape_idx, &mut row) {
        row.error = Some(e);
        row.ok = false;
    }
    row
}

fn measure<T: ScoreElem>(
    ctx: &Ctx<'_>,
    s: &Shape,
    data: &[T],
    kind: DataKind,
    shape_idx: usize,
    row: &mut Row,
) -> Result<(), String> {
    let view = ScoresView::new(data, s.rows, s.cols).map_err(|e| e.to_string())?;
    let spec = view.spec(s.k);
    let backend = ctx.backend;

    let t = Instant::now();
    let first = backend.select(&view, &spec, None).map_err(|e| e.to_string())?;
    let t_first = t.elapsed().as_secs_f64();

    let iters = ctx.iters.unwrap_or_else(|| default_iters(ctx.suite, backend, t_first));
    let (last, mut times) = backend.time_select(&view, &spec, None, iters).map_err(|e| e.to_string())?;
    row.set_times(ctx, &mut times, || Some(cpu_floor(data, iters.clamp(5, 50))))?;

    // Verification.
    let mut checks = Vec::new();
    let mut bad = Vec::new();
    if let Some(r) = first_mismatch(&first, &last) {
        bad.push(format!("MISMATCH: repeat runs differ at row {r}"));
    }
    checks.push("det".to_string());
    if !matches!(backend, Backend::Cpu) {
        if s.rows * s.cols <= CPU_CHECK_MAX_ELEMS {
            let cpu = flashsel::cpu::select(&view, &spec, None).map_err(|e| format!("cpu::select: {e}"))?;
            if let Some(r) = first_mismatch(&first, &cpu) {
                bad.push(format!("MISMATCH vs flashsel::cpu::select at row {r}"));
            }
            checks.push("cpu all".into());
        } else {
            checks.push("cpu skipped (too large)".into());
        }
    }
    let sample = rows_to_check(s.rows, s.cols, ctx.seed ^ ((shape_idx as u64) << 8) ^ (kind as u64));
    for &r in &sample {
        let one = ScoresView::new(view.row(r), 1, s.cols).map_err(|e| e.to_string())?;
        let reference = flashsel::reference_select(&one, &SelectSpec { rows: 1, ..spec }, None)
            .map_err(|e| format!("reference_select: {e}"))?;
        if !row_equal(&first, r, &reference, 0) {
            bad.push(format!("MISMATCH vs reference_select at row {r}"));
            break;
        }
    }
    checks.push(if sample.len() == s.rows {
        "ref all".into()
    } else {
        format!("ref {}/{} rows", sample.len(), s.rows)
    });
    row.set_verified(checks, bad);
    Ok(())
}

fn default_iters(suite: Suite, backend: &Backend, t_first: f64) -> usize {
    match (suite, backend) {
        (Suite::Quick, Backend::Cpu) => 3,
        (Suite::Quick, _) => 10,
        // About a second of timed runs per case, within 3..=30.
        (_, Backend::Cpu) => ((1.0 / t_first.max(1e-6)).ceil() as usize).clamp(3, 30),
        (_, _) => 50,
    }
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    let n = times.len();
    if n % 2 == 1 {
        times[n / 2]
    } else {
        (times[n / 2 - 1] + times[n / 2]) / 2.0
    }
}

/// Median time of a plain parallel sum over the buffer's bits: reading every
/// byte once, doing as little as possible with it.
fn cpu_floor<T: ScoreElem>(data: &[T], runs: usize) -> f64 {
    let pass = || {
        data.par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |s, x| s.wrapping_add(x.bits() as u64)))
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
    median(&mut times)
}

/// Rows checked against the reference: all of a small shape, else the first,
/// the last and six pseudo-random ones (deterministic in `seed`).
fn rows_to_check(rows: usize, cols: usize, seed: u64) -> Vec<usize> {
    if rows <= 8 || rows.saturating_mul(cols) <= 1 << 21 {
        return (0..rows).collect();
    }
    let mut out = vec![0, rows - 1];
    let mut state = seed;
    while out.len() < 8 {
        let r = (flashsel::data::splitmix64(&mut state) % rows as u64) as usize;
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out.sort_unstable();
    out
}

/// The first row where two selections differ (indices, or value bits).
fn first_mismatch<T: ScoreElem>(a: &Selection<T>, b: &Selection<T>) -> Option<usize> {
    if a.rows != b.rows || a.k != b.k {
        return Some(0);
    }
    (0..a.rows).find(|&r| !row_equal(a, r, b, r))
}

fn row_equal<T: ScoreElem>(a: &Selection<T>, ra: usize, b: &Selection<T>, rb: usize) -> bool {
    if a.k != b.k || ra >= a.rows || rb >= b.rows {
        return false;
    }
    let k = a.k;
    let (ia, va) = (&a.indices[ra * k..(ra + 1) * k], &a.values[ra * k..(ra + 1) * k]);
    let (ib, vb) = (&b.indices[rb * k..(rb + 1) * k], &b.values[rb * k..(rb + 1) * k]);
    ia == ib && va.iter().zip(vb).all(|(x, y)| x.bits() == y.bits())
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.par_iter().map(|&x| bf16::from_f32(x)).collect()
}

/// The data kinds of every shape, in the order `to_kind_in_place` derives them.
const KINDS: [DataKind; 3] = [DataKind::Normal, DataKind::Relu, DataKind::ReluSparse];

/// Turns the previous kind's data into `kind`'s (normal data is left as is).
fn to_kind_in_place<T: ScoreElem>(v: &mut [T], kind: DataKind) {
    match kind {
        DataKind::Normal => {}
        DataKind::Relu => relu_in_place(v, 0.0),
        DataKind::ReluSparse => relu_in_place(v, 3.0),
    }
}

/// `max(0, x - shift)` with `+0.0` for every entry at or below `shift`.
fn relu_in_place<T: ScoreElem>(v: &mut [T], shift: f32) {
    let zero = T::from_f32(0.0);
    v.par_iter_mut().for_each(|x| {
        let v = x.to_f32();
        if v.is_nan() || v <= shift {
            *x = zero;
        } else if shift != 0.0 {
            *x = T::from_f32(v - shift);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_are_what_they_say() {
        let cpu = Suite::Cpu.shapes();
        assert!(cpu.iter().all(|s| s.rows <= CPU_MAX_ROWS));
        assert_eq!(cpu.iter().filter(|s| s.rows != s.full_rows).count(), 2);
        assert_eq!(Suite::Full.shapes().iter().map(|s| s.rows * s.dtypes.len()).max(), Some(8192 * 2));
    }

    #[test]
    fn data_is_seeded_and_relu_has_zero_plateau() {
        let a = flashsel::data::normal_scores(200_000, 7, 1);
        assert_eq!(a, flashsel::data::normal_scores(200_000, 7, 1));
        assert_ne!(a, flashsel::data::normal_scores(200_000, 8, 1));
        let mut r = a.clone();
        to_kind_in_place(&mut r, DataKind::Relu);
        let zeros = r.iter().filter(|x| x.to_bits() == 0).count();
        assert!((90_000..110_000).contains(&zeros), "{zeros}");
        assert!(r.iter().all(|x| *x >= 0.0));
        // relu-sparse from relu: max(0, x - 3), ~0.13% positive.
        to_kind_in_place(&mut r, DataKind::ReluSparse);
        let positive = r.iter().filter(|x| **x > 0.0).count();
        assert!((150..450).contains(&positive), "{positive}");
        let direct: Vec<f32> = a.iter().map(|&x| if x > 3.0 { x - 3.0 } else { 0.0 }).collect();
        assert_eq!(
            r.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            direct.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn sampled_rows_are_deterministic_and_in_range() {
        let s = rows_to_check(8192, 131_072, 3);
        assert_eq!(s, rows_to_check(8192, 131_072, 3));
        assert_eq!(s.len(), 8);
        assert!(s.contains(&0) && s.contains(&8191));
        assert_eq!(rows_to_check(8, 1 << 20, 3).len(), 8);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }
}
