//! Pass 1: per-gallery statistics from the banks.
//!
//! Every bank method is a per-gallery statistic (the design notes'
//! decision 1, `../shared/DESIGN.md` beside a development checkout), kept
//! as a mergeable state per gallery item. The methods ask for statistics
//! by kind ([`crate::method::BankNeeds`]): log-sum-exp at a β, the k
//! largest bank similarities (with their rows, and the means of those
//! rows' own neighbours), every similarity sorted, per-bank-item top-k
//! (activation sets), the bank moments, and Sinkhorn sweeps
//! ([`sinkhorn`]). [`layout`] says which a set of methods needs and how
//! they become columns of `gallery_stats.parquet`; [`pass`] streams the
//! tiles.

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
