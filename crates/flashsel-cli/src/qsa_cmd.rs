//! `flashsel qsa`: QSA block selection, .npy in, token ids (or KV-cache
//! slots) and counts out, by `flashsel::cpu::qsa_select` or the CUDA
//! engine's `qsa_select_host` (the backend chosen as for `select`).
//!
//! Outputs are staged ([`crate::staged`]): an existing file is replaced only
//! when every output was written; a failed run leaves it as it was.

use std::path::Path;
use std::time::Instant;

use flashsel::ops::qsa::{PageMap, QsaSpec};
use flashsel::{ScoreElem, ScoresView};

use crate::npy::{self, Matrix, Scores};
use crate::ops_backend;
use crate::staged::{check_distinct, write_output, Staged};
use crate::QsaArgs;

pub fn run(a: &QsaArgs, verbose: bool) -> Result<(), String> {
    let mut outputs = vec![("--ids", a.ids.as_path())];
    outputs.extend(a.counts.as_deref().map(|p| ("--counts", p)));
    let inputs: Vec<(&str, &Path)> = [
        ("--scores", Some(a.scores.as_path())),
        ("--positions", Some(a.positions.as_path())),
        ("--page-table", a.page_table.as_deref()),
        ("--seq-ids", a.seq_ids.as_deref()),
    ]
    .into_iter()
    .filter_map(|(flag, p)| Some((flag, p?)))
    .collect();
    check_distinct(&outputs, &inputs)?;
    let backend = crate::open_backend(a.backend, verbose)?.0;

    let m = npy::read_scores(&a.scores)?;
    if m.one_d {
        return Err(format!(
            "{}: scores must be 2-D [queries, blocks], got a 1-D array (one query: save it with shape (1, NB))",
            a.scores.display()
        ));
    }
    let positions = npy::read_positions(&a.positions, m.rows)?;
    let paging = npy::Paging::read(a.page_table.as_deref(), a.seq_ids.as_deref(), a.page_size, m.rows)?;
    let pages = paging.as_ref().map(npy::Paging::map).transpose()?;
    let spec =
        QsaSpec::new(m.rows, m.cols).with_ratio(a.ratio).with_k_blocks(a.k_blocks).with_order(a.order).with_nan(a.nan);
    spec.validate().map_err(|e| e.to_string())?;

    let run = Run { m: &m, a, spec: &spec, positions: &positions, pages: pages.as_ref(), backend: &backend, verbose };
    match &m.scores {
        Scores::F32(d) => run.typed(d),
        Scores::F16(d) => run.typed(d),
        Scores::Bf16 { data, .. } => run.typed(data),
    }
}

/// One checked request, ready for its element type.
struct Run<'a> {
    m: &'a Matrix,
    a: &'a QsaArgs,
    spec: &'a QsaSpec,
    positions: &'a [i64],
    pages: Option<&'a PageMap<'a>>,
    backend: &'a flashsel::Backend,
    verbose: bool,
}

impl Run<'_> {
    fn typed<T: ScoreElem>(&self, data: &[T]) -> Result<(), String> {
        let (m, a) = (self.m, self.a);
        let view = ScoresView::new(data, m.rows, m.cols).map_err(|e| format!("{}: {e}", a.scores.display()))?;

        // Opened before the work, so that a bad path fails before it.
        let mut staged = Staged::default();
        let ids_file = staged.create(&a.ids, "--ids")?;
        let counts_file = match &a.counts {
            Some(p) => Some((staged.create(p, "--counts")?, p)),
            None => None,
        };

        let t = Instant::now();
        let sel = ops_backend::qsa_select(self.backend, &view, self.positions, self.spec, self.pages)?;
        let secs = t.elapsed().as_secs_f64();

        write_output(ids_file, "<i4", &[sel.rows as u64, sel.width as u64], &sel.ids, "--ids", &a.ids)?;
        if let Some((f, p)) = counts_file {
            write_output(f, "<i4", &[sel.rows as u64], &sel.counts, "--counts", p)?;
        }
        staged.commit()?;
        if self.verbose {
            eprintln!(
                "qsa: {} queries x {} blocks {} ({}), ratio {}, k_blocks {}, {} order{}: ids [{}, {}] on {} in {:.3} ms",
                m.rows,
                m.cols,
                T::DTYPE.name(),
                m.descr,
                self.spec.ratio,
                self.spec.k_blocks,
                self.spec.order.name(),
                if self.pages.is_some() { ", through the page table" } else { "" },
                sel.rows,
                sel.width,
                self.backend.name(),
                secs * 1e3
            );
        }
        Ok(())
    }
}
