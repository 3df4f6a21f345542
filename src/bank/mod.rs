//! Pass 1: per-gallery statistics from the query bank.
//!
//! Every bank method is a per-gallery statistic (DESIGN.md, decision 1). The
//! inverted-softmax statistic is the log-sum-exp of β·s(b, g) over the bank,
//! kept as a mergeable [`LogSumExp`] per gallery item and β.

pub mod inverted_softmax;
pub mod pass;

pub use inverted_softmax::InvertedSoftmax;
pub use pass::{compute_bank_statistics, StatsChunk};

pub use crate::kernel::LogSumExp;
