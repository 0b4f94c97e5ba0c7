//! GPU-side subcommands: `plan`, `kernels`, `check`. Argument parsing lives
//! here; the bodies are thin entry points into the library.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;

/// `flashsel plan`: which GPU path the planner picks for a geometry.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Rows of the score matrix.
    #[arg(long)]
    pub rows: usize,
    /// Columns (candidates per row).
    #[arg(long)]
    pub cols: usize,
    /// Entries selected per row.
    #[arg(long)]
    pub k: usize,
    /// Score element type.
    #[arg(
        long,
        default_value = "f32",
        value_parser = PossibleValuesParser::new(["f32", "bf16", "f16"]).try_map(|s| flashsel::DType::parse(&s))
    )]
    pub dtype: flashsel::DType,
    /// Plan as if per-row lengths were given.
    #[arg(long)]
    pub lengths_present: bool,
    /// Plan for this many SMs instead of the local GPU's count.
    #[arg(long, value_name = "N")]
    pub sm_count: Option<u32>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `flashsel kernels`: compile (and load) the CUDA kernels through NVRTC.
#[derive(Debug, Clone, Args)]
pub struct KernelsArgs {
    /// Compile only: do not load the modules onto a device.
    #[arg(long)]
    pub compile_only: bool,
    /// Target architecture (repeatable), e.g. sm_90a, sm_90, sm_80, sm_86, sm_89.
    #[arg(long = "arch", value_name = "A", value_parser = parse_arch)]
    pub arch: Vec<String>,
}

/// `flashsel check`: the GPU backend against the CPU reference.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// A small set of cases.
    #[arg(long)]
    pub quick: bool,
    /// Seed for the generated data.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Backend under test.
    #[arg(long, default_value = "cuda", value_parser = crate::backend_parser())]
    pub backend: flashsel::BackendChoice,
    /// Run only these suites (comma-separated or repeated): select (top-k,
    /// ranges, QSA, the indexer, the context-parallel merge), indexer (the
    /// indexer's cases alone, on each device path), mla (sparse MLA
    /// attention against its f64 reference), qsa-attn (QSA sparse attention
    /// against its f64 reference), dsa-indexer (the DSA indexer's scores and
    /// ids against the CPU engine's bytes). Default: all but indexer.
    #[arg(long, value_name = "SUITE", value_delimiter = ',',
          value_parser = PossibleValuesParser::new(["select", "indexer", "mla", "qsa-attn", "dsa-indexer"]))]
    pub only: Vec<String>,
    /// Run only the cases whose description (as the progress lines print
    /// it) contains TEXT, e.g. `ranges`, `qsa`, `merge`, `decode`. Their
    /// data differ from a whole run's: skipped cases draw none.
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
}

/// `sm_90a`, `sm_80`, `compute_90`, ...
fn parse_arch(s: &str) -> Result<String, String> {
    let rest = s.strip_prefix("sm_").or_else(|| s.strip_prefix("compute_"));
    let ok = rest.is_some_and(|r| {
        let digits = r.trim_end_matches(['a', 'f']);
        !digits.is_empty() && digits.len() + 1 >= r.len() && digits.bytes().all(|b| b.is_ascii_digit())
    });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!("expected an architecture like sm_90a, sm_80 or compute_89, got {s:?}"))
    }
}

pub fn plan(args: &PlanArgs) -> Result<(), String> {
    use flashsel::plan::{self, DeviceProps};
    let spec = flashsel::SelectSpec::new(args.rows, args.cols, args.k, args.dtype);
    // The device: an explicit --sm-count plans for a Hopper-class part of that
    // size without touching a GPU; otherwise the local GPU, else an H200.
    let (dev, source) = match args.sm_count {
        Some(n) => (DeviceProps::hopper(n), format!("--sm-count {n} (Hopper shared-memory limits)")),
        None => match flashsel::cuda::CudaEngine::new(0) {
            Ok(e) => (e.props(), format!("local GPU: {}", e.device_name())),
            Err(_) => (DeviceProps::hopper(132), "no GPU here: an H200 (132 SMs)".to_string()),
        },
    };
    let p = plan::plan(&spec, args.lengths_present, &dev).map_err(|e| e.to_string())?;
    if args.json {
        let mut v = serde_json::to_value(&p).map_err(|e| e.to_string())?;
        v["device"] = serde_json::to_value(dev).map_err(|e| e.to_string())?;
        v["device_assumed"] = source.clone().into();
        // The fields every path has, beside the path's own.
        v["merge_levels"] = p.merge_levels().into();
        v["sampled"] = p.sampled().into();
        v["buffer"] = serde_json::to_value(p.buffer()).map_err(|e| e.to_string())?;
        v["rows"] = args.rows.into();
        v["cols"] = args.cols.into();
        v["k"] = args.k.into();
        v["dtype"] = args.dtype.name().into();
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        println!("plan for {} x {}, k {}, {} ({source})", args.rows, args.cols, args.k, args.dtype.name());
        println!("  path            {:?}", p.path());
        println!("  ctas_per_row    {}", p.ctas_per_row());
        let (merge_note, buffer_note) = match p.path() {
            flashsel::plan::Path::Split => ("a split row's last CTA merges its candidates", "candidate buffer"),
            flashsel::plan::Path::Grid => ("the row's CTAs select it together: no merge", "staged list"),
            flashsel::plan::Path::Row => ("one CTA per row: no merge", "candidate buffer"),
            flashsel::plan::Path::Short => match p.short().map(|s| s.kernel) {
                Some(flashsel::plan::ShortKernel::Warp) => {
                    ("one warp per short row (4 a CTA), the row in shared memory", "selection scratch")
                }
                Some(flashsel::plan::ShortKernel::Wide) => {
                    ("one wide CTA per row (at most one an SM), the row in registers", "selection scratch")
                }
                Some(flashsel::plan::ShortKernel::Cluster) => {
                    ("a cluster of wide CTAs per row, the row in their registers", "selection scratch")
                }
                _ => ("one small CTA per short row, the row in shared memory", "selection scratch"),
            },
        };
        println!("  merge_levels    {} ({merge_note})", p.merge_levels());
        println!("  sampled         {}", p.sampled());
        let ring = if p.stage_bytes() > 0 { format!(" + {} B load ring", p.stage_bytes()) } else { String::new() };
        println!(
            "  buffer          {:?}, {} composites ({} B shared: {buffer_note}{ring})",
            p.buffer(),
            p.cap(),
            p.smem_bytes()
        );
        if let Some(g) = p.grid() {
            println!("  grid kernel     {} ({} elements a thread)", plan::grid_kernel_name(g.items), g.items);
        }
        println!("  fit             {} columns", p.fit());
        println!("  row_slots       {}", p.row_slots());
        println!("  workspace_bytes {}", p.workspace_bytes());
    }
    Ok(())
}

pub fn kernels(args: &KernelsArgs) -> Result<(), String> {
    use flashsel::cuda::compile::{self, ARCHS};
    compile::nvrtc_available()?;
    let archs: Vec<&'static str> = if args.arch.is_empty() {
        ARCHS.to_vec()
    } else {
        args.arch.iter().map(|a| &*Box::leak(a.clone().into_boxed_str())).collect()
    };
    let engine =
        if args.compile_only { None } else { Some(flashsel::cuda::CudaEngine::new(0).map_err(|e| e.to_string())?) };
    let (v0, v1) = compile::nvrtc_version().map_err(|e| e.to_string())?;
    println!("NVRTC {v0}.{v1}");
    println!(
        "{:<44} {:<16} {:>5} {:>7} {:>7} {:>6} {:>6}",
        "variant", "kernel", "regs", "smem", "stack", "spillS", "spillL"
    );
    let mut problems = Vec::new();
    for arch in archs {
        for v in compile::shipped_variants(arch) {
            let t = std::time::Instant::now();
            let c = compile::compile(&v).map_err(|e| format!("{}: {e}", v.name()))?;
            eprintln!("{}: {:.1} s{}", v.name(), t.elapsed().as_secs_f64(), if c.from_cache { " (cache)" } else { "" });
            for r in &c.resources {
                println!(
                    "{:<44} {:<16} {:>5} {:>7} {:>7} {:>6} {:>6}",
                    v.name(),
                    short(&r.kernel),
                    r.registers,
                    r.static_smem,
                    r.stack_bytes,
                    r.spill_stores,
                    r.spill_loads
                );
                if r.spill_stores > 0 || r.spill_loads > 0 {
                    problems.push(format!("{} {}: register spills", v.name(), r.kernel));
                }
            }
        }
    }
    if let Some(e) = engine {
        e.warm_up().map_err(|e| e.to_string())?;
        println!("loaded on {} ({})", e.device_name(), e.arch());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Out-of-line device functions carry mangled names: keep them readable.
fn short(name: &str) -> String {
    if name.len() <= 16 {
        name.to_string()
    } else {
        format!("{}..", &name[..14])
    }
}

pub fn check(args: &CheckArgs) -> Result<(), String> {
    use flashsel::ops::select::check;
    if args.backend == flashsel::BackendChoice::Cpu {
        return Err("check compares a GPU backend with the CPU engine: use --backend cuda".into());
    }
    let e = flashsel::cuda::CudaEngine::new(0).map_err(|e| e.to_string())?;
    eprintln!("device {} ({}), seed {}", e.device_name(), e.arch(), args.seed);
    e.warm_up().map_err(|e| e.to_string())?;
    let wants = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    let (mla_run, mla_failed) = if wants("mla") { check_mla(&e, args)? } else { (0, 0) };
    let (qa_run, qa_failed) = if wants("qsa-attn") { check_qsa_attention(&e, args)? } else { (0, 0) };
    let (dsa_run, dsa_failed) = if wants("dsa-indexer") { check_dsa(&e, args)? } else { (0, 0) };
    let (mla_run, mla_failed) = (mla_run + qa_run + dsa_run, mla_failed + qa_failed + dsa_failed);
    // A filter that keeps no case has checked nothing: an error, not a pass.
    let none_kept = |run: usize| match &args.filter {
        Some(f) if run == 0 => Err(format!("no case's description contains --filter {f:?}")),
        _ => Ok(()),
    };
    // The indexer alone, unless the select suite (which holds it) runs.
    let indexer_only = !wants("select") && args.only.iter().any(|o| o == "indexer");
    if !wants("select") && !indexer_only {
        none_kept(mla_run)?;
        return if mla_failed > 0 { Err(format!("{mla_failed} attention / DSA cases failed")) } else { Ok(()) };
    }
    let show = |i: usize, n: usize, o: &check::Outcome| {
        if o.ok {
            let items = if o.grid_items > 0 { format!(", {} elements a thread", o.grid_items) } else { String::new() };
            eprintln!("[{i}/{n}] ok   {} ({:?}, {} CTAs/row{items})", o.case, o.path, o.ctas_per_row);
        } else {
            eprintln!("[{i}/{n}] FAIL {} ({:?}): {}", o.case, o.path, o.detail);
        }
    };
    let rep = if indexer_only {
        check::run_indexer_suite(&e, args.quick, args.seed, args.filter.as_deref(), show)
    } else {
        check::run_suite(&e, args.quick, args.seed, args.filter.as_deref(), show)
    }
    .map_err(|e| e.to_string())?;
    let paths: Vec<String> = rep.by_path.iter().map(|(p, n)| format!("{p:?} {n}")).collect();
    println!(
        "cases run: {}, failed: {} (by path: {}; grid cases on the 8- or 4-element kernels: {}; short cases on the wide kernel: {}, on its cluster form: {})",
        rep.run,
        rep.failed,
        paths.join(", "),
        rep.grid_narrow,
        rep.short_wide,
        rep.short_cluster
    );
    if rep.failed > 0 {
        for f in &rep.failures {
            println!("FAILED {}: {}", f.case, f.detail);
        }
        return Err(format!("{} of {} cases differ from the CPU engine", rep.failed, rep.run));
    }
    none_kept(rep.run + mla_run)?;
    if mla_failed > 0 {
        return Err(format!("{mla_failed} attention / DSA cases failed"));
    }
    Ok(())
}

/// The DSA indexer suite; returns how many cases ran and how many failed.
fn check_dsa(e: &flashsel::cuda::CudaEngine, args: &CheckArgs) -> Result<(usize, usize), String> {
    use flashsel::ops::dsa::check;
    let rep = check::run_suite(e, args.quick, args.seed, args.filter.as_deref(), |i, n, o| {
        if o.ok {
            eprintln!("[dsa {i}/{n}] ok   {}", o.case);
        } else {
            eprintln!("[dsa {i}/{n}] FAIL {}: {}", o.case, o.detail);
        }
    })
    .map_err(|e| e.to_string())?;
    println!("dsa-indexer cases run: {}, failed: {}", rep.run, rep.failed);
    for f in &rep.failures {
        println!("FAILED {}: {}", f.case, f.detail);
    }
    Ok((rep.run, rep.failed))
}

/// The QSA sparse attention suite; returns how many cases ran and how many
/// failed.
fn check_qsa_attention(e: &flashsel::cuda::CudaEngine, args: &CheckArgs) -> Result<(usize, usize), String> {
    use flashsel::ops::qsa_attention::check;
    let rep = check::run_suite(e, args.quick, args.seed, args.filter.as_deref(), |i, n, o| {
        let split = if o.split { "split-KV + combine" } else { "one pass" };
        let path = format!("{} kernel, {split}", if o.tensor_cores { "tensor-core" } else { "f32" });
        if o.ok {
            eprintln!("[qsa-attn {i}/{n}] ok   {} ({path}) #{:016x}", o.case, o.digest);
        } else {
            eprintln!("[qsa-attn {i}/{n}] FAIL {} ({path}): {}", o.case, o.detail);
        }
    })
    .map_err(|e| e.to_string())?;
    println!(
        "qsa-attn cases run: {}, failed: {} (split-KV: {}, one pass: {}; tensor-core kernel: {}, f32 kernel: {})",
        rep.run,
        rep.failed,
        rep.split,
        rep.run - rep.split,
        rep.tensor_cores,
        rep.run - rep.tensor_cores
    );
    for f in &rep.failures {
        println!("FAILED {}: {}", f.case, f.detail);
    }
    Ok((rep.run, rep.failed))
}

/// The sparse MLA suite; returns how many cases ran and how many failed.
fn check_mla(e: &flashsel::cuda::CudaEngine, args: &CheckArgs) -> Result<(usize, usize), String> {
    use flashsel::ops::mla::check;
    let rep = check::run_suite(e, args.quick, args.seed, args.filter.as_deref(), |i, n, o| {
        let split = if o.split { "split-KV + combine" } else { "one pass" };
        let path = format!("{} kernel, {} heads a CTA, {split}", o.path.name(), o.heads_per_cta);
        if o.ok {
            eprintln!("[mla {i}/{n}] ok   {} ({path}) #{:016x}", o.case, o.digest);
        } else {
            eprintln!("[mla {i}/{n}] FAIL {} ({path}): {}", o.case, o.detail);
        }
    })
    .map_err(|e| e.to_string())?;
    println!(
        "mla cases run: {}, failed: {} (split-KV: {}, one pass: {}; tensor-core kernel: {}, f32 kernel: {})",
        rep.run,
        rep.failed,
        rep.split,
        rep.run - rep.split,
        rep.tensor_core,
        rep.run - rep.tensor_core
    );
    for f in &rep.failures {
        println!("FAILED {}: {}", f.case, f.detail);
    }
    Ok((rep.run, rep.failed))
}
