//! The operations of the selection stage, one module each, over the
//! [contract](crate::contract): what each computes (its spec and the exact
//! reference it is tested against), its CPU engine, its GPU planner and its
//! device launch.
//!
//! - [`select`]: exact top-k per row of a score matrix.
//! - [`qsa`]: QSA block selection: the block top-k of each query's visible
//!   blocks, expanded to token ids (or KV slots through a page table).
//! - [`dsa`]: the DSA (DeepSeek-V3.2) indexer's logits over key ranges (`dsa_scores`) and their top-k (`dsa_indexer`).
//! - [`indexer`]: the QSA indexer's block scores (`qsa_scores`), exact to a stated bound.
//! - [`mla`]: sparse MLA attention over selected indices (FlashMLA's semantics; exact f64 reference).
//! - [`qsa_attention`]: QSA sparse attention over the selected token ids (grouped heads; exact f64 reference).
//! - [`pages`]: page tables, token ids to KV-cache slots (both operations).
//! - [`shard`]: context-parallel selection: rows sharded over ranks, the exact merge of their candidates.

pub mod dsa;
pub mod indexer;
pub mod mla;
pub mod pages;
pub mod qsa;
pub mod qsa_attention;
pub mod select;
pub mod shard;
