/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every way a request can be rejected, or a backend can fail.
///
/// Bad input is always one of these, with a message naming the offending value;
/// no backend panics on, or silently clamps, a bad request. New variants may
/// be added: match with a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// A dtype name or file format this library does not read, or a dtype
    /// an operation does not take.
    #[error("unsupported dtype: {0}")]
    UnknownDType(String),
    /// A bad option value (order, NaN policy, backend ...).
    #[error("invalid {what}: {value:?} (expected {expected})")]
    InvalidOption { what: &'static str, value: String, expected: &'static str },
    /// An allocation the request needs could not be made (host memory; device
    /// memory is reported by the driver as [`CudaError::Driver`]).
    #[error("out of memory: {what} needs {bytes} bytes")]
    OutOfMemory { what: &'static str, bytes: u128 },
    /// A backend that cannot run here, with the reason.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// A failure reported by the CUDA driver or NVRTC.
    #[error("CUDA: {0}")]
    Cuda(CudaError),
    /// Reading or writing a file.
    #[error("{0}")]
    Io(String),
}

/// What failed on the CUDA side, kept apart so callers can tell a driver
/// error code from a compile error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// A driver API call returned an error code (`CUresult`).
    #[error("{call}: {name} (code {code})")]
    Driver { call: String, code: u32, name: String },
    /// NVRTC rejected the kernel source; `log` is its compile log.
    #[error("NVRTC could not compile {module}:\n{log}")]
    Compile { module: String, log: String },
    /// An NVRTC call other than the compile failed.
    #[error("NVRTC {call}: {name}")]
    Nvrtc { call: String, name: String },
    /// An NCCL call failed (`ncclResult_t`'s name).
    #[error("NCCL {call}: {name}")]
    Nccl { call: String, name: String },
    /// Anything else (a missing kernel in a module, an empty graph capture ...).
    #[error("{0}")]
    Other(String),
}

impl CudaError {
    /// The driver's error code, when a driver call failed.
    pub fn driver_code(&self) -> Option<u32> {
        match self {
            CudaError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl Error {
    pub(crate) fn too_large(what: &'static str, value: impl Into<u128>) -> Self {
        Error::TooLarge { what, value: value.into() }
    }
    /// A CUDA failure that is neither a driver code nor a compile error.
    pub(crate) fn cuda_other(msg: impl Into<String>) -> Self {
        Error::Cuda(CudaError::Other(msg.into()))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        driver_error("CUDA driver call", e.0)
    }
}

/// A driver error code from the call named `call`.
pub(crate) fn driver_error(call: &str, r: cudarc::driver::sys::CUresult) -> Error {
    Error::Cuda(CudaError::Driver { call: call.to_string(), code: r as u32, name: format!("{r:?}") })
}

/// Maps a cudarc driver error (the usual `map_err` argument) to [`Error::Cuda`].
pub(crate) fn cuda_err(e: cudarc::driver::DriverError) -> Error {
    Error::from(e)
}

/// Reserves a vector of `n` elements or reports [`Error::OutOfMemory`] for
/// `what`: every allocation sized by the request goes through here, so an
/// impossible request is an error, never an abort.
pub fn try_vec<T: Clone>(what: &'static str, n: usize, fill: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory { what, bytes: n as u128 * std::mem::size_of::<T>() as u128 })?;
    v.resize(n, fill);
    Ok(v)
}
