//! Staged outputs, shared by the commands that write files (`select`,
//! `qsa`): each output is written to a new temporary file beside its target
//! and renamed over the target only once every output is complete. A failure
//! at any point before that (or a panic unwinding through [`Staged`]) removes
//! the temporaries this run created and leaves every existing file as it was.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::npy::{self, NpyElem};

/// Temporary names tried per output before giving up.
const MAX_STALE_TEMPS: u32 = 100;

/// One output being written under a temporary name beside its target.
struct StagedFile {
    target: PathBuf,
    temp: PathBuf,
    /// The flag that named it, for messages: `--output`, `--values`, `--ids`, ...
    flag: &'static str,
    /// Set once the rename succeeded: the temporary no longer exists.
    renamed: bool,
}

/// The outputs of one run; dropped before [`Staged::commit`] succeeds, it
/// removes the temporaries it created (never a target).
#[derive(Default)]
pub struct Staged {
    files: Vec<StagedFile>,
}

impl Staged {
    /// Creates a new temporary file in `target`'s folder (never an existing
    /// file: `create_new`) and returns it for writing.
    pub fn create(&mut self, target: &Path, flag: &'static str) -> Result<BufWriter<File>, String> {
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
    pub fn commit(mut self) -> Result<(), String> {
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
pub fn write_output<T: NpyElem>(
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

/// Refuses two outputs that name the same file, and an output that names an
/// input (`(flag, path)` pairs; paths compared as given).
pub fn check_distinct(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> Result<(), String> {
    for (i, (flag, out)) in outputs.iter().enumerate() {
        if let Some((other, _)) = outputs[..i].iter().find(|(_, o)| o == out) {
            return Err(format!("{other} and {flag} are the same file ({})", out.display()));
        }
        if let Some((input_flag, _)) = inputs.iter().find(|(_, p)| p == out) {
            return Err(format!("refusing to overwrite the input {} ({input_flag}) with {flag}", out.display()));
        }
    }
    Ok(())
}
