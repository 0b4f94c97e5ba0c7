//! Developer tools for flashsel's kernels, kept out of the library's API.
//!
//! - [`grid_sample`]: a CPU emulation of the grid kernel's sampled pass, for
//!   the tests that pin the sampler's design and the check suite's trap data,
//!   and for `flashsel-dev rowstats`.
//! - `flashsel-dev` (src/bin): timing runs on a GPU (`time`), the small
//!   sanitizer suite (`small`), row statistics (`rowstats`), cubin dumps (`cubin`).

pub mod grid_sample;
