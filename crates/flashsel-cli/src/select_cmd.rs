//! `flashsel select`: .npy in, top-k indices (and values) out; with
//! `--starts`, over per-row column ranges `starts[i]..lengths[i]`; with
//! `--page-table`, the indices written as KV-cache slots. Plain selections
//! run through `Backend::select`, the token forms through
//! [`crate::ops_backend::select_ranges`]; both on the backend asked for.
//!
//! Outputs are staged ([`crate::staged`]): an existing file is replaced only
//! when every output was written; a failed run leaves it as it was.

use std::path::Path;
use std::time::Instant;

use flashsel::{PageMap, ScoreElem, ScoresView};

use crate::npy::{self, Matrix, NpyElem, Scores};
use crate::ops_backend;
use crate::staged::{check_distinct, write_output, Staged};
use crate::SelectArgs;

pub fn run(a: &SelectArgs, verbose: bool) -> Result<(), String> {
    let mut outputs = vec![("--output", a.output.as_path())];
    outputs.extend(a.values.as_deref().map(|p| ("--values", p)));
    let inputs: Vec<(&str, &Path)> = [
        ("--input", Some(a.input.as_path())),
        ("--lengths", a.lengths.as_deref()),
        ("--starts", a.starts.as_deref()),
        ("--page-table", a.page_table.as_deref()),
        ("--seq-ids", a.seq_ids.as_deref()),
    ]
    .into_iter()
    .filter_map(|(flag, p)| Some((flag, p?)))
    .collect();
    check_distinct(&outputs, &inputs)?;
    let backend = crate::open_backend(a.backend, verbose)?.0;
    let m = npy::read_scores(&a.input)?;
    let lengths = match &a.lengths {
        Some(p) => Some(npy::read_lengths(p, m.rows, m.cols)?),
        None => None,
    };
    let starts = match &a.starts {
        Some(p) => {
            let ends = a.lengths.as_deref().zip(lengths.as_deref());
            Some(npy::read_starts(p, m.rows, m.cols, ends)?)
        }
        None => None,
    };
    let paging = npy::Paging::read(a.page_table.as_deref(), a.seq_ids.as_deref(), a.page_size, m.rows)?;
    let pages = paging.as_ref().map(npy::Paging::map).transpose()?;
    let req = Request { lengths: lengths.as_deref(), starts: starts.as_deref(), pages: pages.as_ref() };
    match &m.scores {
        Scores::F32(d) => select_typed(d, &m, a, &req, &backend, verbose),
        Scores::F16(d) => select_typed(d, &m, a, &req, &backend, verbose),
        Scores::Bf16 { data, .. } => select_typed(data, &m, a, &req, &backend, verbose),
    }
}

/// What a selection reads beside the scores.
struct Request<'a> {
    lengths: Option<&'a [i32]>,
    starts: Option<&'a [i32]>,
    pages: Option<&'a PageMap<'a>>,
}

fn select_typed<T: ScoreElem + NpyElem>(
    data: &[T],
    m: &Matrix,
    a: &SelectArgs,
    req: &Request<'_>,
    backend: &flashsel::Backend,
    verbose: bool,
) -> Result<(), String> {
    let (lengths, starts) = (req.lengths, req.starts);
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
    let sel = if starts.is_some() || req.pages.is_some() {
        ops_backend::select_ranges(backend, &view, &spec, starts, lengths, req.pages)?
    } else {
        backend.select(&view, &spec, lengths).map_err(|e| format!("selection on {} failed: {e}", backend.name()))?
    };
    let secs = t.elapsed().as_secs_f64();

    let shape = m.output_shape(a.k);
    write_output(out_file, "<i4", &shape, &sel.indices, "--output", &a.output)?;
    if let Some((f, p)) = val_file {
        write_output(f, m.values_dtype(), &shape, &sel.values, "--values", p)?;
    }
    staged.commit()?;
    if verbose {
        eprintln!(
            "selected top-{}{}{} of {}x{} {} ({}) by {} on {} in {:.3} ms{}",
            a.k,
            if starts.is_some() { " over per-row ranges" } else { "" },
            if req.pages.is_some() { " as KV slots through the page table" } else { "" },
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
