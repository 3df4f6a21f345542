//! Hubness measures of top-k lists and retrieval quality against ground
//! truth, as defined in `spec/REPORTS.md`, and the report files and page
//! built from them.

pub mod compare;
pub mod files;
pub mod html;
pub mod hubness;
pub mod quality;

pub use hubness::{skewness, HubnessMeasures, KOccurrence};
pub use quality::{QualityOptions, QualityReport, RankList, RecallAt};
