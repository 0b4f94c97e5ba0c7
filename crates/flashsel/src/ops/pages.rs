//! Page tables: token ids to KV-cache slots, shared by every operation that
//! writes token ids (`qsa_select`, `select` over ranges).
//!
//! # Contract
//! Token `tok` of sequence `seq` lives in slot `page_table[seq, tok /
//! page_size] * page_size + tok % page_size`. On the host every page a row
//! may reach must exist (`tok / page_size < max_pages`), be a page (`>= 0`),
//! and give a slot that fits `i32`; every row's sequence must be a row of the
//! table. On the device (values the host cannot see without a
//! synchronisation) a row whose sequence is outside the table, or whose last
//! token is past its sequence's pages, comes out all padding (count 0), and
//! an id whose entry is negative or whose slot does not fit `i32` is `-1`;
//! nothing outside the table is read.

use crate::contract::{Error, Result, PAD};
use crate::ops::select::SelectSpec;

/// Token ids to KV-cache slots through a page table.
#[derive(Debug, Clone, Copy)]
pub struct PageMap<'a> {
    table: &'a [i32],
    max_pages: usize,
    page_size: usize,
    seq_ids: &'a [i32],
}

impl<'a> PageMap<'a> {
    /// `table`: `[sequences, max_pages]` physical page numbers, row-major;
    /// `seq_ids`: the sequence of each query row.
    pub fn new(table: &'a [i32], max_pages: usize, page_size: usize, seq_ids: &'a [i32]) -> Result<Self> {
        if page_size == 0 {
            return Err(Error::InvalidOption { what: "page_size", value: "0".into(), expected: ">= 1" });
        }
        if page_size > i32::MAX as usize || max_pages > i32::MAX as usize {
            return Err(Error::too_large("page_size or max_pages", page_size.max(max_pages) as u128));
        }
        if max_pages == 0 || !table.len().is_multiple_of(max_pages) {
            return Err(Error::Shape(format!(
                "page_table holds {} entries, not a whole number of rows of max_pages = {max_pages}",
                table.len()
            )));
        }
        if table.len() / max_pages > i32::MAX as usize {
            return Err(Error::too_large("page_table sequences", (table.len() / max_pages) as u128));
        }
        Ok(Self { table, max_pages, page_size, seq_ids })
    }

    /// Rows of the table (sequences).
    pub fn sequences(&self) -> usize {
        self.table.len() / self.max_pages
    }
    pub fn max_pages(&self) -> usize {
        self.max_pages
    }
    pub fn page_size(&self) -> usize {
        self.page_size
    }
    pub fn table(&self) -> &'a [i32] {
        self.table
    }
    pub fn seq_ids(&self) -> &'a [i32] {
        self.seq_ids
    }

    /// `seq_ids` has one entry per row.
    pub(crate) fn check_rows(&self, rows: usize) -> Result<()> {
        if self.seq_ids.len() != rows {
            return Err(Error::Shape(format!("seq_ids has {} entries but there are {rows} rows", self.seq_ids.len())));
        }
        Ok(())
    }

    /// Row `row`'s sequence, checked against the table.
    pub(crate) fn seq(&self, row: usize) -> Result<usize> {
        let seq = self.seq_ids[row];
        if seq < 0 || seq as usize >= self.sequences() {
            return Err(Error::Shape(format!(
                "seq_ids[{row}] = {seq} is outside 0..{} (the page table's sequences)",
                self.sequences()
            )));
        }
        Ok(seq as usize)
    }

    /// The slot of token `tok` of sequence `seq` (checked: the page exists,
    /// is `>= 0`, and the slot fits `i32`).
    pub(crate) fn slot(&self, row: usize, seq: usize, tok: usize) -> Result<i32> {
        let page_idx = tok / self.page_size;
        if page_idx >= self.max_pages {
            return Err(Error::Shape(format!(
                "row {row}: token {tok} is on page {page_idx} but page_table has {} pages a sequence",
                self.max_pages
            )));
        }
        let page = self.table[seq * self.max_pages + page_idx];
        if page < 0 {
            return Err(Error::InvalidOption {
                what: "page_table entry",
                value: format!("page_table[{seq}, {page_idx}] = {page} (row {row}, token {tok})"),
                expected: ">= 0",
            });
        }
        let slot = page as u128 * self.page_size as u128 + (tok % self.page_size) as u128;
        i32::try_from(slot).map_err(|_| Error::too_large("a KV slot", slot))
    }

    /// Maps a row's valid ids (tokens) to slots, in place.
    pub(crate) fn map_row(&self, row: usize, ids: &mut [i32]) -> Result<()> {
        let seq = self.seq(row)?;
        for id in ids.iter_mut() {
            *id = self.slot(row, seq, *id as usize)?;
        }
        Ok(())
    }

    /// Every page tokens `lo..hi` of row `row` may reach maps to a slot (the
    /// host's check before a device run, which cannot report errors).
    pub(crate) fn check_span(&self, row: usize, lo: usize, hi: usize) -> Result<()> {
        let seq = self.seq(row)?;
        if hi <= lo {
            return Ok(());
        }
        let mut tok = lo;
        while tok < hi {
            self.slot(row, seq, tok)?;
            // The page's last token gives its largest slot.
            let last = ((tok / self.page_size + 1) * self.page_size).min(hi) - 1;
            self.slot(row, seq, last)?;
            tok = last + 1;
        }
        Ok(())
    }

    /// The checks of a selection over ranges written as slots: one sequence
    /// per row, and every page of each row's range `starts[r] .. ends[r]`.
    pub(crate) fn check_ranges(&self, spec: &SelectSpec, starts: Option<&[i32]>, ends: Option<&[i32]>) -> Result<()> {
        self.check_rows(spec.rows)?;
        for row in 0..spec.rows {
            let lo = starts.map_or(0, |s| s[row] as usize);
            self.check_span(row, lo, spec.row_len(row, ends))?;
        }
        Ok(())
    }

    /// Maps a padded index list (`rows x width`, valid ids then `-1`) to
    /// slots, row by row.
    pub(crate) fn map_padded(&self, ids: &mut [i32], width: usize) -> Result<()> {
        for (row, out) in ids.chunks_mut(width.max(1)).enumerate() {
            let n = out.iter().position(|&i| i == PAD).unwrap_or(out.len());
            self.map_row(row, &mut out[..n])?;
        }
        Ok(())
    }
}
