//! flashsel: the selection stage of long-context sparse attention, exact and
//! deterministic, on the CPU and on NVIDIA GPUs.
//!
//! The operations: [`select`](ops::select), the exact top-k of each row
//! of a score matrix, the same bytes on every backend (ties to the lower
//! column, `-0.0 == +0.0`, one NaN policy, rows padded with `-1`); and
//! [`qsa`](ops::qsa), QSA block selection on top of it (CPU so far).
//!
//! ```
//! use flashsel::{cpu, ScoresView, SelectSpec, DType};
//!
//! // Two rows of five scores; the best 3 of each.
//! let scores = [0.5f32, 2.0, -1.0, 2.0, 0.0, /* row 1 */ 9.0, f32::NAN, 1.0, 1.0, 3.0];
//! let view = ScoresView::new(&scores, 2, 5)?;
//! let spec = SelectSpec::new(2, 5, 3, DType::F32);
//! let top = cpu::select(&view, &spec, None)?;
//! assert_eq!(top.row_indices(0), [1, 3, 0]); // 2.0 at column 1 beats the tie at 3
//! assert_eq!(top.row_indices(1), [0, 4, 2]); // NaN ranks lowest by default
//! // The same with the first 2 columns of row 0 and 4 of row 1 active:
//! let top = cpu::select(&view, &spec, Some(&[2, 4]))?;
//! assert_eq!(top.row_indices(0), [1, 0, -1]); // padded with -1
//! # Ok::<(), flashsel::Error>(())
//! ```
//!
//! Layers, one module each:
//! - [`contract`]: what is op-neutral: element types, the total order of
//!   scores, strided views, padded index lists, errors.
//! - [`ops`]: one module per operation (spec, exact reference, CPU engine,
//!   GPU planner, device launch).
//! - [`cuda`]: the CUDA engine the operations share: NVRTC compilation of the
//!   kernels (`kernels/`), the module registry, the typed launch, workspace
//!   regions.
//! - [`backend`]: the host-memory front door (CPU or CUDA) the CLI uses.
//! - [`data`]: the seeded test-data families of the tests, `check` and `bench`.

pub mod backend;
pub mod contract;
pub mod cuda;
pub mod data;
pub mod ops;

pub use backend::{Backend, BackendChoice};
pub use contract::{composite, CudaError, DType, Error, NanPolicy, Result, ScoreElem, ScoresView};
pub use ops::pages::PageMap;
pub use ops::select::{reference_select, OutputOrder, SelectSpec, Selection};

/// The CPU engine's entry points, one per operation.
pub mod cpu {
    pub use crate::ops::dsa::{dsa_indexer, dsa_indexer_paged, dsa_scores, dsa_scores_paged};
    pub use crate::ops::indexer::{qsa_indexer, qsa_scores};
    pub use crate::ops::mla::{sparse_mla_decode, sparse_mla_prefill};
    pub use crate::ops::qsa::qsa_select;
    pub use crate::ops::qsa_attention::qsa_attention;
    pub use crate::ops::select::cpu::{
        select, select_into, select_ranges, select_ranges_into, select_ranges_paged, select_ranges_paged_into,
    };
    pub use crate::ops::shard::{merge_candidates, merge_candidates_into, merge_candidates_ranges, qsa_merge};
}

/// The select operation's GPU planner (`flashsel plan`).
pub use ops::select::plan;
