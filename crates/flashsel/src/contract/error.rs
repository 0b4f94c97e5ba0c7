use std::fmt;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every way a selection request can be rejected, or a backend can fail.
///
/// Bad input is always one of these, with a message naming the offending value;
/// no backend panics on, or silently clamps, a bad request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `k` was zero.
    #[error("k must be at least 1 (got 0)")]
    ZeroK,
    /// `k`, `rows`, `rows * k` or `cols` does not fit the `i32` the output uses.
    #[error("{what} = {value} does not fit in i32 (max {max})", max = i32::MAX)]
    TooLarge { what: &'static str, value: u128 },
    /// A row stride shorter than the row.
    #[error("row stride {stride} is shorter than cols = {cols}")]
    StrideTooShort { stride: usize, cols: usize },
    /// The buffer holds fewer elements than the shape and stride need.
    #[error("{what}: buffer holds {got} elements but the shape needs {need}")]
    BufferSize { what: &'static str, got: usize, need: usize },
    /// A shape that is not two-dimensional, or otherwise malformed.
    #[error("bad shape: {0}")]
    Shape(String),
    /// `lengths` with the wrong number of entries.
    #[error("lengths has {got} entries but there are {rows} rows")]
    LengthsCount { got: usize, rows: usize },
    /// A length below zero or beyond `cols`.
    #[error("lengths[{row}] = {len} is outside 0..={cols}")]
    LengthOutOfRange { row: usize, len: i64, cols: usize },
    /// A dtype name or file format this library does not read.
    #[error("unsupported dtype: {0}")]
    UnknownDType(String),
    /// A bad option value (order, NaN policy, backend ...).
    #[error("invalid {what}: {value:?} (expected {expected})")]
    InvalidOption { what: &'static str, value: String, expected: &'static str },
    /// A backend that cannot run here, with the reason.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// An error reported by the CUDA driver or NVRTC.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// Reading or writing a file.
    #[error("{0}")]
    Io(String),
}

impl Error {
    pub(crate) fn too_large(what: &'static str, value: impl Into<u128>) -> Self {
        Error::TooLarge { what, value: value.into() }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// Helper so a `Display` error from another crate becomes a CUDA error.
pub(crate) fn cuda_err(e: impl fmt::Debug) -> Error {
    Error::Cuda(format!("{e:?}"))
}
