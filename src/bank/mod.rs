//! Pass 1: per-gallery statistics from the banks.
//!
//! Every bank method is a per-gallery statistic (DESIGN.md, decision 1),
//! kept as a mergeable state per gallery item: log-sum-exp for the inverted
//! softmaxes, bounded top-k values for NNN and CSLS, the sorted similarities
//! for GC, per-bank-item top-k for the DIS activation sets, and the bank
//! moments for DN and MP. [`layout`] says which a set of methods needs and how they
//! become columns of `gallery_stats.parquet`; [`pass`] streams the tiles.

pub mod driver;
pub mod layout;
pub mod pass;
pub mod shards;
pub mod sinkhorn;
pub mod states;

pub use layout::{BankMoments, StatsLayout};
pub use pass::{
    compute_bank_statistics, ActivationBank, ActivationShape, BankInput, BankPassOutput,
    BankPassRequest, StatsChunk,
};
pub use states::{ActivationState, Moments, RowMoments, SortedSimilarities};

pub use crate::kernel::LogSumExp;
