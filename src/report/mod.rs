//! Hubness measures of top-k lists and retrieval quality against ground
//! truth, as defined in `spec/REPORTS.md`.

pub mod hubness;
pub mod quality;

pub use hubness::{skewness, KOccurrence};
pub use quality::RetrievalMetrics;
