//! `flashsel select`: .npy in, top-k indices (and values) out.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use flashsel::{ScoreElem, ScoresView};

use crate::npy::{self, Matrix, NpyElem, Scores};
use crate::SelectArgs;

pub fn run(a: &SelectArgs, verbose: bool) -> Result<(), String> {
    if a.values.as_deref() == Some(a.output.as_path()) {
        return Err(format!("--output and --values are the same file ({})", a.output.display()));
    }
    if a.output == a.input || a.values.as_deref() == Some(a.input.as_path()) {
        return Err(format!("refusing to overwrite the input {} with the output", a.input.display()));
    }
    let (backend, _) = crate::open_backend(a.backend, verbose)?;
    let m = npy::read_scores(&a.input)?;
    let lengths = match &a.lengths {
        Some(p) => Some(npy::read_lengths(p, m.rows, m.cols)?),
        None => None,
    };
    match &m.scores {
        Scores::F32(d) => select_typed(d, &m, a, lengths.as_deref(), &backend, "<f4", verbose),
        Scores::F16(d) => select_typed(d, &m, a, lengths.as_deref(), &backend, "<f2", verbose),
        Scores::Bf16 { data, signed } => {
            let descr = if *signed { "<i2" } else { "<u2" };
            select_typed(data, &m, a, lengths.as_deref(), &backend, descr, verbose)
        }
    }
}

/// Output files created up front (so a bad path fails before the work) and
/// removed again if anything after that fails.
struct Outputs {
    created: Vec<PathBuf>,
    done: bool,
}

impl Outputs {
    fn create(&mut self, path: &Path, what: &str) -> Result<File, String> {
        let f = File::create(path).map_err(|e| format!("cannot write {what} {}: {e}", path.display()))?;
        self.created.push(path.to_path_buf());
        Ok(f)
    }
}

impl Drop for Outputs {
    fn drop(&mut self) {
        if !self.done {
            for p in &self.created {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

fn select_typed<T: ScoreElem + NpyElem>(
    data: &[T],
    m: &Matrix,
    a: &SelectArgs,
    lengths: Option<&[i32]>,
    backend: &flashsel::Backend,
    values_descr: &str,
    verbose: bool,
) -> Result<(), String> {
    let input = a.input.display();
    let view = ScoresView::new(data, m.rows, m.cols).map_err(|e| format!("{input}: {e}"))?;
    let spec = view.spec(a.k).with_order(a.order).with_nan(a.nan);
    spec.validate_host(&view, lengths).map_err(|e| e.to_string())?;

    let mut outs = Outputs { created: Vec::new(), done: false };
    let out_file = outs.create(&a.output, "--output")?;
    let val_file = match &a.values {
        Some(p) => Some(outs.create(p, "--values")?),
        None => None,
    };

    let t = Instant::now();
    let sel =
        backend.select(&view, &spec, lengths).map_err(|e| format!("selection on {} failed: {e}", backend.name()))?;
    let secs = t.elapsed().as_secs_f64();

    let shape = [m.rows as u64, a.k as u64];
    npy::write_array(out_file, "<i4", &shape, &sel.indices)
        .map_err(|e| format!("cannot write --output {}: {e}", a.output.display()))?;
    if let (Some(f), Some(p)) = (val_file, &a.values) {
        npy::write_array(f, values_descr, &shape, &sel.values)
            .map_err(|e| format!("cannot write --values {}: {e}", p.display()))?;
    }
    outs.done = true;
    if verbose {
        eprintln!(
            "selected top-{} of {}x{} {} ({}) by {} on {} in {:.3} ms{}",
            a.k,
            m.rows,
            m.cols,
            T::DTYPE.name(),
            m.descr,
            a.order.name(),
            backend.name(),
            secs * 1e3,
            if m.one_d { " (1-D input read as one row)" } else { "" }
        );
    }
    Ok(())
}
