//! What a selection asks (the spec) and what it returns.

use crate::contract::{composite_index, try_vec, DType, Error, NanPolicy, Result, ScoreElem, ScoresView, PAD};

/// Order of each output row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputOrder {
    /// Best first, in the total order.
    #[default]
    Score,
    /// Ascending column index (what sparse attention wants for locality).
    Index,
}

impl OutputOrder {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "score" => Ok(Self::Score),
            "index" => Ok(Self::Index),
            _ => Err(Error::InvalidOption { what: "order", value: s.into(), expected: "score|index" }),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Score => "score",
            Self::Index => "index",
        }
    }
    /// Puts a row's selected composites, given best first, in output order.
    pub fn arrange(self, best_first: &mut [u64]) {
        if self == Self::Index {
            best_first.sort_unstable_by_key(|&c| composite_index(c));
        }
    }
}

/// A selection request: everything but the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct SelectSpec {
    pub rows: usize,
    pub cols: usize,
    /// Elements between the starts of consecutive rows (`>= cols`).
    pub row_stride: usize,
    pub k: usize,
    pub dtype: DType,
    pub order: OutputOrder,
    pub nan: NanPolicy,
}

impl SelectSpec {
    /// A dense (`row_stride == cols`) spec with default order and NaN policy.
    pub fn new(rows: usize, cols: usize, k: usize, dtype: DType) -> Self {
        Self { rows, cols, row_stride: cols, k, dtype, order: OutputOrder::Score, nan: NanPolicy::Lowest }
    }
    pub fn with_order(mut self, order: OutputOrder) -> Self {
        self.order = order;
        self
    }
    pub fn with_nan(mut self, nan: NanPolicy) -> Self {
        self.nan = nan;
        self
    }
    pub fn with_stride(mut self, row_stride: usize) -> Self {
        self.row_stride = row_stride;
        self
    }

    /// Checks the shape-only rules: `k`, sizes that must fit `i32`, the stride.
    pub fn validate(&self) -> Result<()> {
        if !self.dtype.is_score() {
            return Err(Error::UnknownDType(format!("select ranks f32, bf16 or f16 scores, not {}", self.dtype)));
        }
        if self.k == 0 {
            return Err(Error::ZeroK);
        }
        let max = i32::MAX as u128;
        if self.k as u128 > max {
            return Err(Error::too_large("k", self.k as u128));
        }
        if self.cols as u128 > max {
            return Err(Error::too_large("cols", self.cols as u128));
        }
        if self.rows as u128 > max {
            return Err(Error::too_large("rows", self.rows as u128));
        }
        let rk = self.rows as u128 * self.k as u128;
        if rk > max {
            return Err(Error::too_large("rows * k", rk));
        }
        if self.row_stride < self.cols {
            return Err(Error::StrideTooShort { stride: self.row_stride, cols: self.cols });
        }
        Ok(())
    }

    /// Elements a buffer must hold for this shape and stride.
    pub fn elements_needed(&self) -> usize {
        if self.rows == 0 {
            0
        } else {
            (self.rows - 1).saturating_mul(self.row_stride).saturating_add(self.cols)
        }
    }

    /// Checks lengths against the shape: one per row, each in `0..=cols`.
    pub fn validate_lengths(&self, lengths: &[i32]) -> Result<()> {
        if lengths.len() != self.rows {
            return Err(Error::LengthsCount { got: lengths.len(), rows: self.rows });
        }
        for (row, &len) in lengths.iter().enumerate() {
            if len < 0 || len as usize > self.cols {
                return Err(Error::LengthOutOfRange { row, len: len as i64, cols: self.cols });
            }
        }
        Ok(())
    }

    /// Everything a host-side call checks: the spec, the view's agreement with
    /// it, and the lengths.
    pub fn validate_host<T: ScoreElem>(&self, scores: &ScoresView<'_, T>, lengths: Option<&[i32]>) -> Result<()> {
        self.validate()?;
        if T::DTYPE != self.dtype {
            return Err(Error::UnknownDType(format!(
                "spec says {} but the data is {}",
                self.dtype.name(),
                T::DTYPE.name()
            )));
        }
        if scores.rows() != self.rows || scores.cols() != self.cols || scores.row_stride() != self.row_stride {
            return Err(Error::Shape(format!(
                "view is {}x{} (stride {}) but the spec is {}x{} (stride {})",
                scores.rows(),
                scores.cols(),
                scores.row_stride(),
                self.rows,
                self.cols,
                self.row_stride
            )));
        }
        if let Some(l) = lengths {
            self.validate_lengths(l)?;
        }
        Ok(())
    }

    /// Checks per-row range starts: one per row, each in `0..=end` where the
    /// row's end is `ends[r]` (or `cols`).
    pub fn validate_starts(&self, starts: &[i32], ends: Option<&[i32]>) -> Result<()> {
        if starts.len() != self.rows {
            return Err(Error::Shape(format!("starts has {} entries but there are {} rows", starts.len(), self.rows)));
        }
        for (row, &s) in starts.iter().enumerate() {
            let end = self.row_len(row, ends);
            if s < 0 || s as usize > end {
                return Err(Error::InvalidOption {
                    what: "range start",
                    value: format!("starts[{row}] = {s} with the row's end {end}"),
                    expected: "0 <= start <= end",
                });
            }
        }
        Ok(())
    }

    /// Candidates of row `r`: `lengths[r]`, or `cols`. Assumes validated lengths.
    #[inline]
    pub fn row_len(&self, r: usize, lengths: Option<&[i32]>) -> usize {
        lengths.map_or(self.cols, |l| l[r] as usize)
    }
}

/// The result of a selection: `rows x k` indices and values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection<T> {
    pub rows: usize,
    pub k: usize,
    /// Column indices, `-1` where padded.
    pub indices: Vec<i32>,
    /// The selected scores bit for bit, `-inf` where padded.
    pub values: Vec<T>,
}

impl<T: ScoreElem> Selection<T> {
    /// All padding: indices `-1`, values `-inf`; [`Error::OutOfMemory`] when
    /// the `rows x k` outputs cannot be allocated.
    pub fn new_padded(spec: &SelectSpec) -> Result<Self> {
        let n = spec.rows * spec.k;
        Ok(Self {
            rows: spec.rows,
            k: spec.k,
            indices: try_vec("the index output", n, PAD)?,
            values: try_vec("the value output", n, T::neg_inf())?,
        })
    }

    /// Writes row `r` from composites already in output order.
    pub fn write_row(&mut self, r: usize, ordered: &[u64], row: &[T]) {
        let (idx, val) = self.row_mut(r);
        write_row_into(idx, val, ordered, row);
    }

    /// Mutable index and value slices of row `r`.
    pub fn row_mut(&mut self, r: usize) -> (&mut [i32], &mut [T]) {
        let s = r * self.k;
        (&mut self.indices[s..s + self.k], &mut self.values[s..s + self.k])
    }

    /// Row `r`'s indices.
    pub fn row_indices(&self, r: usize) -> &[i32] {
        &self.indices[r * self.k..(r + 1) * self.k]
    }
}

/// Fills one output row (`idx`, `val`, both `k` long) from composites in output
/// order, padding the rest.
pub fn write_row_into<T: ScoreElem>(idx: &mut [i32], val: &mut [T], ordered: &[u64], row: &[T]) {
    debug_assert!(ordered.len() <= idx.len());
    for (j, &c) in ordered.iter().enumerate() {
        let col = composite_index(c) as usize;
        idx[j] = col as i32;
        val[j] = row[col];
    }
    for j in ordered.len()..idx.len() {
        idx[j] = PAD;
        val[j] = T::neg_inf();
    }
}

impl<T: ScoreElem> ScoresView<'_, T> {
    /// The spec for selecting `k` from this view, default order and NaN policy.
    pub fn spec(&self, k: usize) -> SelectSpec {
        SelectSpec::new(self.rows(), self.cols(), k, T::DTYPE).with_stride(self.row_stride())
    }
}
