//! `flashsel`: exact, deterministic top-k selection from the command line.
//!
//! Every failure prints one `error: <message>` line to stderr and exits with
//! status 1; usage errors (reported by clap, `--k 0` among them) exit with
//! status 2.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use flashsel::{Backend, BackendChoice, NanPolicy, OutputOrder};

mod bench;
mod gpu_cmds;
mod npy;
mod ops_backend;
mod qsa_cmd;
mod select_cmd;
mod staged;

const ABOUT: &str = "Exact, deterministic top-k selection for long-context sparse attention (CPU and CUDA).";

const SELECT_LONG_ABOUT: &str = "\
Select the top k entries of each row of a score matrix stored as .npy.

Input dtypes (C order, 1-D = one row, 2-D = rows x cols; big-endian accepted):
  <f4  float32
  <f2  float16
  <u2 or <i2  bfloat16, as raw bit patterns. numpy has no bfloat16 dtype: save
       torch_tensor.view(torch.int16).numpy(), or an ml_dtypes bfloat16 array
       viewed as np.uint16 (arr.view(np.uint16)).

Output: --output gets [rows, k] int32 column indices ([k] for a 1-D input;
-1 where a row has fewer than k candidates); --values gets the selected scores
bit for bit in the input dtype, little-endian (bfloat16 as the same <u2/<i2
bits as the input), padded with -inf. Existing output files are replaced only
when every output was written: a failed run leaves them as they were.
Ties break toward the lower column index; -0.0 == +0.0; NaN ranks lowest
(--nan lowest) or above +inf (--nan largest, as torch.topk).

Ranges (DSA's ks/ke): with --starts, row i selects among columns
starts[i]..lengths[i] (half-open; --lengths are then the ranges' ends,
default cols), 0 <= starts[i] <= lengths[i] <= cols; the indices out stay
absolute column numbers. A query at position t that may attend to its own
key passes lengths[i] = t + 1.

KV slots: with --page-table ([B, max_pages] page numbers) and --seq-ids (the
sequence of each row), with or without --starts, every selected column c of
row i is written to --output as the slot
page_table[seq_ids[i], c / page_size] * page_size + c % page_size (-1 stays
-1; --values are unchanged). Every page a row's columns may reach must be in
the table and >= 0.

Ranges and slots run on the backend asked for, as plain selection does (CPU:
flashsel::cpu::select_ranges / select_ranges_paged; CUDA: the token kernels).";

const QSA_LONG_ABOUT: &str = "\
QSA block selection: the token ids (or KV-cache slots) each query attends to.

Row i of --scores ([T, NB] block scores: <f4, <f2, or bfloat16 bits as
<u2/<i2; big-endian accepted) is the query at position t = positions[i]. It
sees V = (t + 1) / ratio complete blocks (V <= NB, else an error). V <=
k_blocks: blocks 0..V (no score read); else the exact top k_blocks of its
scores [0, V) (ties to the lower block, NaN by --nan). Each block b gives
tokens ratio*b .. ratio*b + ratio - 1, then the unscored tail ratio*V ..= t,
then -1 up to the width k_blocks * ratio + ratio - 1 (2051 for the defaults).
--order index: the ids ascend; score: blocks best first, the tail last.

With --page-table ([B, max_pages] page numbers) and --seq-ids (the sequence
of each row), every valid id becomes the slot
page_table[seq, tok / page_size] * page_size + tok % page_size.

Output: --ids gets int32 [T, width], --counts int32 [T] (the valid ids of
each row), little-endian; an existing file is replaced only when every output
was written. Integer inputs: int32 or int64, either byte order. Runs on the
backend asked for (auto: CUDA when usable, else the CPU; -v says why).";

#[derive(Debug, Parser)]
#[command(name = "flashsel", version, about = ABOUT, propagate_version = true)]
struct Cli {
    /// Say more on stderr (e.g. why `auto` fell back to the CPU).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Top-k of each row of a .npy score matrix.
    #[command(long_about = SELECT_LONG_ABOUT)]
    Select(SelectArgs),
    /// QSA block selection: block scores and query positions to token ids or KV slots.
    #[command(long_about = QSA_LONG_ABOUT)]
    Qsa(QsaArgs),
    /// Benchmark the standard suite (top-k, QSA, DSA ranges) on the best backend, verifying every result.
    Bench(BenchArgs),
    /// Version and the backends available here (and why one is not).
    Info,
    /// Show the GPU plan for a geometry.
    Plan(gpu_cmds::PlanArgs),
    /// Compile the CUDA kernels with NVRTC.
    Kernels(gpu_cmds::KernelsArgs),
    /// Check a GPU backend against the CPU reference on generated data.
    Check(gpu_cmds::CheckArgs),
}

pub(crate) fn backend_parser() -> impl TypedValueParser<Value = BackendChoice> {
    PossibleValuesParser::new(["auto", "cpu", "cuda"]).try_map(|s| BackendChoice::parse(&s))
}

/// `--k`: a count of at least 1; `0` is refused as a usage error, like any
/// value clap refuses.
fn parse_k(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("k must be at least 1".into()),
        Ok(k) => Ok(k),
        Err(e) => Err(e.to_string()),
    }
}

/// `qsa`'s `--ratio`, `--k-blocks`, `--page-size`: at least 1, else a usage error.
fn parse_at_least_1(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn order_parser() -> impl TypedValueParser<Value = OutputOrder> {
    PossibleValuesParser::new(["score", "index"]).try_map(|s| OutputOrder::parse(&s))
}

fn nan_parser() -> impl TypedValueParser<Value = NanPolicy> {
    PossibleValuesParser::new(["lowest", "largest"]).try_map(|s| NanPolicy::parse(&s))
}

#[derive(Debug, Args)]
pub struct SelectArgs {
    /// Score matrix (.npy: f4, f2, or bfloat16 bits as u2/i2, either byte order; 1-D or 2-D, C order).
    #[arg(long, value_name = "S.npy")]
    pub input: PathBuf,
    /// Entries to select per row (at least 1; beyond a row's candidates the row is padded).
    #[arg(long, value_parser = parse_k)]
    pub k: usize,
    /// Per-row candidate counts (.npy, <i4 or <i8, each in 0..=cols): 1-D with one
    /// entry per row (row i selects among its first lengths[i] columns), or a 0-d
    /// scalar for every row. With --starts: the ranges' ends.
    #[arg(long, value_name = "L.npy")]
    pub lengths: Option<PathBuf>,
    /// Per-row range starts (.npy, <i4 or <i8, 1-D one per row or a 0-d scalar):
    /// row i selects among columns starts[i]..lengths[i] (ends default to cols),
    /// indices out stay absolute.
    #[arg(long, value_name = "S.npy")]
    pub starts: Option<PathBuf>,
    /// Page table [B, max_pages] (.npy, <i4 or <i8): the indices out become KV-cache
    /// slots (column c of row i: page_table[seq_ids[i], c / page_size] * page_size
    /// + c % page_size). Needs --seq-ids.
    #[arg(long, value_name = "PT.npy", requires = "seq_ids")]
    pub page_table: Option<PathBuf>,
    /// The sequence (page-table row) of each row (.npy, <i4 or <i8, 1-D one per row). Needs --page-table.
    #[arg(long, value_name = "Q.npy", requires = "page_table")]
    pub seq_ids: Option<PathBuf>,
    /// Tokens per page of the page table (with --page-table).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = parse_at_least_1, requires = "page_table")]
    pub page_size: usize,
    /// Order of each output row: best first, or by ascending column index.
    #[arg(long, default_value = "score", value_parser = order_parser())]
    pub order: OutputOrder,
    /// Where NaN ranks: below -inf, or above +inf (as torch.topk).
    #[arg(long, default_value = "lowest", value_parser = nan_parser())]
    pub nan: NanPolicy,
    /// Indices out: [rows, k] <i4 ([k] for a 1-D input), -1 where padded.
    #[arg(long, value_name = "I.npy")]
    pub output: PathBuf,
    /// Values out: the shape of --output, in the input dtype, -inf where padded.
    #[arg(long, value_name = "V.npy")]
    pub values: Option<PathBuf>,
    /// Backend: CUDA when usable (auto), or the one named.
    #[arg(long, default_value = "auto", value_parser = backend_parser())]
    pub backend: BackendChoice,
}

#[derive(Debug, Args)]
pub struct QsaArgs {
    /// Block scores [T, NB] (.npy: f4, f2, or bfloat16 bits as u2/i2, either byte order; C order).
    #[arg(long, value_name = "S.npy")]
    pub scores: PathBuf,
    /// The absolute position of each query (.npy, <i4 or <i8, 1-D [T], each >= 0).
    #[arg(long, value_name = "P.npy")]
    pub positions: PathBuf,
    /// Tokens per block.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = parse_at_least_1)]
    pub ratio: usize,
    /// Blocks selected per row when more are visible.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = parse_at_least_1)]
    pub k_blocks: usize,
    /// Order of each output row: ascending ids (index), or blocks best first (score).
    #[arg(long, default_value = "index", value_parser = order_parser())]
    pub order: OutputOrder,
    /// Where NaN ranks: below -inf, or above +inf (as torch.topk).
    #[arg(long, default_value = "lowest", value_parser = nan_parser())]
    pub nan: NanPolicy,
    /// Page table [B, max_pages] (.npy, <i4 or <i8): token ids become KV-cache slots. Needs --seq-ids.
    #[arg(long, value_name = "PT.npy", requires = "seq_ids")]
    pub page_table: Option<PathBuf>,
    /// The sequence (page-table row) of each query (.npy, <i4 or <i8, 1-D [T]). Needs --page-table.
    #[arg(long, value_name = "Q.npy", requires = "page_table")]
    pub seq_ids: Option<PathBuf>,
    /// Tokens per page of the page table (with --page-table).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = parse_at_least_1, requires = "page_table")]
    pub page_size: usize,
    /// Ids out: [T, k_blocks * ratio + ratio - 1] <i4, -1 where padded.
    #[arg(long, value_name = "I.npy")]
    pub ids: PathBuf,
    /// Counts out: [T] <i4, the valid ids of each row.
    #[arg(long, value_name = "C.npy")]
    pub counts: Option<PathBuf>,
    /// Backend: CUDA when usable (auto), or the one named.
    #[arg(long, default_value = "auto", value_parser = backend_parser())]
    pub backend: BackendChoice,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Backend: CUDA when usable (auto), or the one named.
    #[arg(long, default_value = "auto", value_parser = backend_parser())]
    pub backend: BackendChoice,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// A small suite (seconds; for tests and smoke checks).
    #[arg(long)]
    pub quick: bool,
    /// Timed runs per case (default: chosen per backend and case).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub iters: Option<u32>,
    /// Seed for the generated data.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Run only these groups of cases (comma-separated or repeated): select (the
    /// plain top-k suite), qsa (= qsa-decode,qsa-prefill), qsa-decode, qsa-prefill,
    /// dsa (ranges written as KV slots), indexer (the fused QSA indexer from
    /// queries and block keys), mla (sparse MLA attention, CUDA; run only when
    /// named), qsa-attn (QSA sparse attention, CUDA; run only when named),
    /// dsa-indexer (the DSA indexer, CUDA; run only when named). Default: all
    /// but mla, qsa-attn and dsa-indexer.
    #[arg(long, value_name = "GROUP", value_delimiter = ',', value_parser = bench::group_parser())]
    pub only: Vec<bench::Groups>,
}

/// Opens the backend asked for. `auto` falls back to the CPU; the reason is
/// printed (once) only with `-v`. An explicit `cuda` that cannot open is an error.
pub fn open_backend(choice: BackendChoice, verbose: bool) -> Result<(Backend, Option<String>), String> {
    match Backend::open(choice) {
        Ok((b, reason)) => {
            if let (Some(r), true) = (&reason, verbose) {
                eprintln!("note: CUDA is not usable ({r}); using the CPU backend");
            }
            Ok((b, reason))
        }
        Err(e) => Err(format!("--backend {}: {e}", choice_name(choice))),
    }
}

pub fn choice_name(c: BackendChoice) -> &'static str {
    match c {
        BackendChoice::Auto => "auto",
        BackendChoice::Cpu => "cpu",
        BackendChoice::Cuda => "cuda",
    }
}

fn info() -> Result<(), String> {
    println!("flashsel {}", env!("CARGO_PKG_VERSION"));
    println!("backends:");
    println!("  cpu   available ({} threads)", rayon::current_num_threads());
    let cuda = flashsel::cuda::CudaEngine::new(0);
    match &cuda {
        Ok(e) => {
            println!("  cuda  available: device 0, {} ({}, {} SMs)", e.device_name(), e.arch(), e.props().sm_count)
        }
        Err(e) => println!("  cuda  unavailable: {e}"),
    }
    println!("auto picks: {}", if cuda.is_ok() { "cuda" } else { "cpu" });
    Ok(())
}

fn run(cli: Cli) -> Result<(), String> {
    match &cli.cmd {
        Cmd::Select(a) => select_cmd::run(a, cli.verbose),
        Cmd::Qsa(a) => qsa_cmd::run(a, cli.verbose),
        Cmd::Bench(a) => bench::run(a, cli.verbose),
        Cmd::Info => info(),
        Cmd::Plan(a) => gpu_cmds::plan(a),
        Cmd::Kernels(a) => gpu_cmds::kernels(a),
        Cmd::Check(a) => gpu_cmds::check(a),
    }
}

fn main() -> ExitCode {
    // A bug must still end in one `error:` line and status 1, not a backtrace.
    // The hook prints it; the panic then unwinds to `main`, dropping what was
    // live (a failed `select` removes its temporary outputs on the way).
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        if msg.starts_with("failed printing to std") {
            // A closed pipe (`flashsel bench | head`): not a bug.
            eprintln!("error: {msg}");
        } else {
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            eprintln!("error: internal error (a bug in flashsel): {msg}{at}");
        }
    }));
    let cli = Cli::parse();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli))) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
        // The hook has printed the error line.
        Err(_) => ExitCode::from(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
