//! # hubnorm: hubness reduction for embedding retrieval, as a streaming data job
//!
//! Dual-encoder retrieval ranks a gallery by the inner product of embeddings;
//! in high dimensions a few gallery items ("hubs") are the nearest neighbour of
//! very many queries. Querybank normalisation re-scores with statistics from a
//! bank of training-split queries. hubnorm computes them out of core over
//! Parquet:
//!
//! ```text
//! gallery.parquet ─┐
//! bank.parquet ────┴─► pass 1: bank statistics ──► gallery_stats.parquet
//!                       (bank × gallery tiles,       (gallery_id, h(g), mergeable state)
//!                        mergeable per-item state)
//! queries.parquet ─┐
//! gallery + stats ─┴─► pass 2: query top-k ───────► results.parquet + summary.json
//!                       (query × gallery tiles,      (method, query_id, rank, gallery_id,
//!                        s − h(g) fused in the kernel) score, raw_score)
//! ```
//!
//! Modules follow the data flow: [`source`] reads embedding tables into
//! blocks, [`kernel`] computes similarity tiles and their epilogues, [`bank`]
//! is pass 1, [`query`] is pass 2, [`report`] the hubness and quality figures,
//! [`sink`] the atomic Parquet writers, [`stats_file`] the statistics file
//! between the passes, [`pipeline`] wires them together, and [`sql`] is the
//! SQL face (DataFusion functions, table functions, `hubnorm sql`), and
//! `cluster` (feature `cluster`) runs it on an Apache DataFusion Ballista
//! cluster whose scheduler and executors are hubnorm processes.
//! Each method lives in [`method`] (one module per method or family, and
//! the registry every stage loops over). [`update`] merges new input parts
//! into a stored stats file, and
//! [`export`] writes gallery vectors with h(g) appended for vector indexes.
//! [`storage`] resolves every path (local or object store), and `delta`
//! (feature `delta`) reads and writes Delta Lake tables through their log.
//!
//! ```no_run
//! use hubnorm::options::MethodSpec;
//! use hubnorm::pipeline::{run, RunJob};
//!
//! let job = RunJob {
//!     methods: vec![
//!         MethodSpec::new("is", &[("beta", 20.0)])?,
//!         MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 128.0)])?,
//!     ],
//!     ..RunJob::new("queries.parquet", "gallery/", "bank/*.parquet", "out")
//! };
//! let summary = run(&job, &hubnorm::progress::Silent)?;
//! println!("{}", summary.methods[1].k_occurrence_skewness);
//! # Ok::<(), hubnorm::error::HubnormError>(())
//! ```
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod bank;
pub mod cache;
pub mod cancel;
pub mod checkpoint;
#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "delta")]
pub mod delta;
pub mod error;
pub mod evaluate;
pub mod export;
pub mod ids;
pub mod inputs;
pub mod kernel;
pub mod method;
pub mod options;
pub mod pipeline;
pub mod plan;
pub mod progress;
pub mod query;
pub mod report;
pub mod sink;
pub mod source;
#[cfg(feature = "sql")]
pub mod sql;
pub mod stats_file;
pub mod storage;
pub mod tune;
pub mod update;

pub use error::{HubnormError, Result};
