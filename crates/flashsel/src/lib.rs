//! flashsel: exact, deterministic top-k selection for long-context sparse
//! attention, on the CPU and on NVIDIA GPUs.
//!
//! Layers, one module each:
//! - [`contract`]: the ordering contract every backend honours bit for bit.
//! - [`cpu`]: the CPU engine, both the reference backend and a real one.
//! - [`plan`]: the pure planner that maps a geometry to a GPU path.
//! - [`cuda`]: the CUDA host code (NVRTC compilation, launches); kernels live in
//!   `kernels/*.cu`.

pub mod contract;
pub mod cpu;

pub use contract::{
    composite, reference_select, DType, Error, NanPolicy, OutputOrder, Result, ScoreElem, ScoresView, SelectSpec,
    Selection,
};
pub mod backend;
pub mod cuda;

pub use backend::{Backend, BackendChoice};
pub mod plan;
