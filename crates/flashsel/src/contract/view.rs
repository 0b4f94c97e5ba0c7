//! Strided, read-only views of host matrices.

use super::error::{Error, Result};

/// A read-only, row-major, strided view of a matrix in host memory: `rows`
/// rows of `cols` elements, row `r` starting at element `r * row_stride`.
///
/// The fields are private: a view that exists has been checked against its
/// buffer ([`Self::new`], [`Self::with_stride`]).
#[derive(Debug, Clone, Copy)]
pub struct ScoresView<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a, T> ScoresView<'a, T> {
    /// A dense view (`row_stride == cols`).
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        Self::with_stride(data, rows, cols, cols)
    }

    /// A strided view; the buffer must hold `(rows - 1) * row_stride + cols`
    /// elements.
    pub fn with_stride(data: &'a [T], rows: usize, cols: usize, row_stride: usize) -> Result<Self> {
        if row_stride < cols {
            return Err(Error::StrideTooShort { stride: row_stride, cols });
        }
        let need = if rows == 0 {
            0
        } else {
            (rows - 1)
                .checked_mul(row_stride)
                .and_then(|x| x.checked_add(cols))
                .ok_or_else(|| Error::Shape(format!("{rows}x{cols} with stride {row_stride} overflows")))?
        };
        if data.len() < need {
            return Err(Error::BufferSize { what: "scores", got: data.len(), need });
        }
        Ok(Self { data, rows, cols, row_stride })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Elements between the starts of consecutive rows (`>= cols`).
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// Row `r`, `cols` elements.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [T] {
        let s = r * self.row_stride;
        &self.data[s..s + self.cols]
    }
}
