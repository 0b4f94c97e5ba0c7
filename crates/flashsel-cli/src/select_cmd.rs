//! `flashsel select`: .npy in, top-k indices (and values) out.
//!
//! Outputs are staged: each is written to a new temporary file beside its
//! target and renamed over the target only once every output is complete. A
//! failure at any point before that removes the temporaries this run created
//! and leaves every existing file as it was.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
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
        Scores::F32(d) => select_typed(d, &m, a, lengths.as_deref(), &backend, verbose),
        Scores::F16(d) => select_typed(d, &m, a, lengths.as_deref(), &backend, verbose),
        Scores::Bf16 { data, .. } => select_typed(data, &m, a, lengths.as_deref(), &backend, verbose),
    }
}

/// Temporary names tried per output before giving up.
const MAX_STALE_TEMPS: u32 = 100;

/// One output being written under a temporary name beside its target.
struct StagedFile {
    target: PathBuf,
    temp: PathBuf,
    /// The flag that named it, for messages: `--output` or `--values`.
    flag: &'static str,
    /// Set once the rename succeeded: the temporary no longer exists.
    renamed: bool,
}

/// The outputs of one run; dropped before [`Staged::commit`] succeeds, it
/// removes the temporaries it created (never a target).
#[derive(Default)]
struct Staged {
    files: Vec<StagedFile>,
}

impl Staged {
    /// Creates a new temporary file in `target`'s folder (never an existing
    /// file: `create_new`) and returns it for writing.
    fn create(&mut self, target: &Path, flag: &'static str) -> Result<BufWriter<File>, String> {
        let fail = |why: &dyn std::fmt::Display| format!("cannot write {flag} {}: {why}", target.display());
        if target.is_dir() {
            return Err(fail(&"it is a directory"));
        }
        let name = target.file_name().ok_or_else(|| fail(&"not a file name"))?.to_string_lossy().into_owned();
        let folder = target.parent().unwrap_or(Path::new(""));
        // A stale temporary of the same name (a killed run with this pid) is
        // left alone: the next number is tried.
        for attempt in 0..MAX_STALE_TEMPS {
            let temp = folder.join(format!(".{name}.flashsel-{}-{attempt}.tmp", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(f) => {
                    self.files.push(StagedFile { target: target.to_path_buf(), temp, flag, renamed: false });
                    return Ok(npy::buffered(f));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(fail(&e)),
            }
        }
        Err(fail(&format_args!("{MAX_STALE_TEMPS} stale temporary files .{name}.flashsel-* are in the way")))
    }

    /// Renames every temporary over its target.
    fn commit(mut self) -> Result<(), String> {
        for f in &mut self.files {
            std::fs::rename(&f.temp, &f.target)
                .map_err(|e| format!("cannot write {} {}: {e}", f.flag, f.target.display()))?;
            f.renamed = true;
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for f in self.files.iter().filter(|f| !f.renamed) {
            let _ = std::fs::remove_file(&f.temp);
        }
    }
}

/// Writes one array to a staged output and flushes it.
fn write_output<T: NpyElem>(
    mut w: BufWriter<File>,
    dtype: &str,
    shape: &[u64],
    data: &[T],
    flag: &str,
    target: &Path,
) -> Result<(), String> {
    T::write(&mut w, dtype, shape, data)
        .and_then(|()| w.flush())
        .map_err(|e| format!("cannot write {flag} {}: {e}", target.display()))
}

fn select_typed<T: ScoreElem + NpyElem>(
    data: &[T],
    m: &Matrix,
    a: &SelectArgs,
    lengths: Option<&[i32]>,
    backend: &flashsel::Backend,
    verbose: bool,
) -> Result<(), String> {
    let input = a.input.display();
    let view = ScoresView::new(data, m.rows, m.cols).map_err(|e| format!("{input}: {e}"))?;
    let spec = view.spec(a.k).with_order(a.order).with_nan(a.nan);
    spec.validate_host(&view, lengths).map_err(|e| e.to_string())?;

    // Opened before the work, so that a bad path fails before it.
    let mut staged = Staged::default();
    let out_file = staged.create(&a.output, "--output")?;
    let val_file = match &a.values {
        Some(p) => Some((staged.create(p, "--values")?, p)),
        None => None,
    };

    let t = Instant::now();
    let sel =
        backend.select(&view, &spec, lengths).map_err(|e| format!("selection on {} failed: {e}", backend.name()))?;
    let secs = t.elapsed().as_secs_f64();

    let shape = m.output_shape(a.k);
    write_output(out_file, "<i4", &shape, &sel.indices, "--output", &a.output)?;
    if let Some((f, p)) = val_file {
        write_output(f, m.values_dtype(), &shape, &sel.values, "--values", p)?;
    }
    staged.commit()?;
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
            if m.one_d { " (1-D input: one row, 1-D outputs)" } else { "" }
        );
    }
    Ok(())
}
