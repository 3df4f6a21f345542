//! Wires the stages together: the library's main entry points behind
//! `hubnorm stats`, `hubnorm search` and `hubnorm run`. Here the jobs, their
//! summaries, run fingerprints and the checks they share; each command's
//! flow in its own module (`stats`, `search`, `run`), and the client side
//! of `--cluster` in `on_cluster`.

use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use serde::Serialize;

use crate::bank::StatsLayout;
use crate::checkpoint::run::RunCheckpoint;
use crate::checkpoint::{checkpoint_dir, Checkpoint, CheckpointOptions};
use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::inputs::{
    bank_metadata, check_bank_sizes, check_methods, check_tolerance, common_metadata, open_bank,
    open_banks, open_table, table_metadata, with_threads, Banks,
};
use crate::options::{BankSample, ClusterJob, MethodKind, MethodSpec, PassOptions};
use crate::progress::Progress;
use crate::query::load_plan;
use crate::query::results::{
    results_schema, rows_schema, search_blocks_into, search_into, OutcomesFromRows, ResultRows,
};
use crate::query::sinkhorn_pp::SingleQuerySinkhorn;
use crate::query::ScoringPlan;
use crate::sink::{
    refuse_existing, refuse_output_in_inputs, write_text_atomically, AtomicFile, DeclaredTables,
    OutputLock, ParquetSink, TableFormat,
};
use crate::source::EmbeddingTable;
use crate::stats_file::{methods_json, stats_of_rows, write_stats, StatsInputs, StatsPlan};

pub use crate::query::results::{MethodOutcome, MethodSummary, SKEWNESS_K};
pub use crate::stats_file::stats_file_methods;

#[cfg(feature = "cluster")]
mod on_cluster;
mod run;
mod search;
mod stats;

pub(crate) use run::check_bank_choice;
pub(crate) use run::{commit_all, evaluate_methods, run_uncommitted};
pub use run::{declare_run_tables, run, RUN_OUTPUTS, RUN_TABLES};
use search::prepare_protocol;
pub use search::{run_search, run_search_on, stream_search, ProtocolBank};
use search::{write_results, write_results_checkpointed};
pub use stats::{
    check_shardable, declare_stats_table, run_stats, run_stats_on, stats_methods,
    stream_sinkhorn_round, stream_stats, stream_stats_rows,
};

/// Inputs and options of `hubnorm stats`.
#[derive(Debug, Clone)]
pub struct StatsJob {
    pub gallery: String,
    pub bank: String,
    /// Items of the gallery modality from the training split (`dual-is`,
    /// `dual-dis`, and `dn` when given).
    pub gallery_bank: Option<String>,
    /// Use a seeded uniform sample of each bank.
    pub bank_sample: Option<BankSample>,
    pub methods: Vec<MethodSpec>,
    pub out: PathBuf,
    pub overwrite: bool,
    pub options: PassOptions,
    /// Checkpoints of finished gallery chunks, and `--resume`.
    pub checkpoint: CheckpointOptions,
}

impl StatsJob {
    /// Pass 1 of the default method (`is`) over `gallery` × `bank` into
    /// `out`, with default options; set the other fields as needed.
    pub fn new(
        gallery: impl Into<String>,
        bank: impl Into<String>,
        out: impl Into<PathBuf>,
    ) -> Self {
        StatsJob {
            gallery: gallery.into(),
            bank: bank.into(),
            gallery_bank: None,
            bank_sample: None,
            methods: vec![MethodSpec::default_for(MethodKind::default())],
            out: out.into(),
            overwrite: false,
            options: PassOptions::default(),
            checkpoint: CheckpointOptions::default(),
        }
    }
}

/// What `hubnorm stats` wrote.
#[derive(Debug, Clone)]
pub struct StatsOutcome {
    pub path: PathBuf,
    /// Gallery rows taken from a checkpoint (`--resume`), 0 when none.
    pub resumed_rows: u64,
    /// What the bf16 screen did over the rows computed, when it screened
    /// (`--precision`).
    pub screen: Option<ScreenSummary>,
}

/// Inputs and options of `hubnorm search`.
#[derive(Debug, Clone)]
pub struct SearchJob {
    pub queries: String,
    pub gallery: String,
    /// `gallery_stats.parquet` from `hubnorm stats`; needed by every method but `none`.
    pub stats: Option<PathBuf>,
    pub methods: Vec<MethodSpec>,
    pub k: usize,
    pub out: PathBuf,
    pub overwrite: bool,
    pub options: PassOptions,
}

impl SearchJob {
    /// Pass 2 of the default method (`is`, top-10) for `queries` over
    /// `gallery` with the statistics in `stats`, into `out`.
    pub fn new(
        queries: impl Into<String>,
        gallery: impl Into<String>,
        stats: Option<PathBuf>,
        out: impl Into<PathBuf>,
    ) -> Self {
        SearchJob {
            queries: queries.into(),
            gallery: gallery.into(),
            stats,
            methods: vec![MethodSpec::default_for(MethodKind::default())],
            k: 10,
            out: out.into(),
            overwrite: false,
            options: PassOptions::default(),
        }
    }
}

/// Inputs and options of `hubnorm run` (both passes).
#[derive(Debug, Clone)]
pub struct RunJob {
    pub queries: String,
    pub gallery: String,
    pub bank: String,
    /// Items of the gallery modality from the training split (`dual-is`,
    /// `dual-dis`, and `dn` when given).
    pub gallery_bank: Option<String>,
    /// Use a seeded uniform sample of each bank.
    pub bank_sample: Option<BankSample>,
    /// Use the test queries themselves as the query bank (`is`, `sn`). This
    /// peeks at the test set: only legitimate for offline re-ranking of a
    /// query set known in advance. `bank` must then be empty.
    pub transductive: bool,
    /// Methods to apply; the baseline `none` is always added first.
    pub methods: Vec<MethodSpec>,
    pub k: usize,
    pub out_dir: PathBuf,
    pub overwrite: bool,
    pub options: PassOptions,
    /// Both passes computed by a cluster (`--cluster`) instead of this
    /// process; the outputs are written here all the same.
    pub cluster: Option<ClusterJob>,
    /// Checkpoints of finished pass-1 chunks, Sinkhorn iterations and
    /// pass-2 query blocks in `out_dir/run.checkpoint/`, and `--resume`
    /// (not on a cluster).
    pub checkpoint: CheckpointOptions,
}

impl RunJob {
    /// Both passes of the default method (`is`, top-10) for `queries` over
    /// `gallery` with `bank`, into `out_dir`, with default options.
    pub fn new(
        queries: impl Into<String>,
        gallery: impl Into<String>,
        bank: impl Into<String>,
        out_dir: impl Into<PathBuf>,
    ) -> Self {
        RunJob {
            queries: queries.into(),
            gallery: gallery.into(),
            bank: bank.into(),
            gallery_bank: None,
            bank_sample: None,
            transductive: false,
            methods: vec![MethodSpec::default_for(MethodKind::default())],
            k: 10,
            out_dir: out_dir.into(),
            overwrite: false,
            options: PassOptions::default(),
            cluster: None,
            checkpoint: CheckpointOptions::default(),
        }
    }
}

/// What a search or run produced.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunSummary {
    pub queries: u64,
    pub gallery: u64,
    /// Query-bank rows used (after `--bank-sample`).
    pub bank: Option<u64>,
    /// Gallery-bank rows used, when one was given.
    pub gallery_bank: Option<u64>,
    /// Whether the test queries were the bank (`--transductive`).
    pub transductive: bool,
    pub dim: usize,
    pub k: usize,
    pub normalize: bool,
    pub methods: Vec<MethodSummary>,
    /// What pass 2's bf16 screen did, when it screened (`--precision`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub screen: Option<ScreenSummary>,
    /// What pass 1's screen did (its pairs are (bank, gallery) cells), when
    /// it screened: the statistics made of top-k lists only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bank_screen: Option<ScreenSummary>,
}

/// What a pass's bf16 screen did: the pairs it screened (in pass 2, per
/// scoring) and those it re-scored in f32. The results are the exact
/// search's; the share re-scored is what the screen did not save, and grows
/// as the similarities crowd together (a narrow band, a large k).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ScreenSummary {
    pub screened_pairs: u64,
    pub rescored_pairs: u64,
}

impl ScreenSummary {
    pub(crate) fn of(counts: crate::kernel::ScreenCounts) -> Self {
        ScreenSummary {
            screened_pairs: counts.screened,
            rescored_pairs: counts.rescored,
        }
    }
}

/// summary.json: the summary, and the fingerprint the run's Parquet outputs
/// record too ([`run_fingerprint`]). Not part of [`RunSummary`], which
/// compares equal across runs that differ only in how inputs are laid out.
#[derive(Serialize)]
struct SummaryFile<'a> {
    #[serde(flatten)]
    summary: &'a RunSummary,
    run: &'a str,
}

/// The metadata key of a run's fingerprint in its Parquet outputs (and the
/// `run` field of its summary.json).
pub const RUN_KEY: &str = "hubnorm.run";

/// What tells `run`'s outputs apart from another run's: a hash of
/// everything the outputs are a function of (each input part's path, rows,
/// size, modification time or ETag, the methods and their parameters, k,
/// normalisation, bank sample, the GEMM, hubnorm's version). Outputs are
/// deterministic, so two runs with one fingerprint wrote the same bytes,
/// and outputs with different fingerprints come from different runs: a
/// reader of a run folder whose files disagree knows it holds a mix (an
/// object store has no rename of several objects at once, so a run that
/// failed between its uploads can leave one).
pub fn run_fingerprint(pairs: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = pairs.iter().collect();
    sorted.sort();
    // FNV-1a, 64 bits: stable across Rust releases, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (key, value) in sorted {
        for byte in key.bytes().chain([0]).chain(value.bytes()).chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The fingerprint `path` records: `hubnorm.run` of a Parquet output, the
/// `run` field of a summary.json; `None` when it records none.
pub fn recorded_run(path: &Path) -> Result<Option<String>> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    if is_json {
        let text = crate::storage::read_to_string(path)?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| HubnormError::input(path, None, None, format!("not JSON: {e}")))?;
        return Ok(json.get("run").and_then(|r| r.as_str()).map(str::to_owned));
    }
    #[cfg(feature = "delta")]
    if let Some(table) = crate::delta::parse_spec(&path.to_string_lossy()) {
        if crate::delta::files(&table)?.files.len() > 1 {
            // Rows appended by several writes: no one run's output.
            return Ok(None);
        }
    }
    Ok(crate::stats_file::file_metadata(path)?.remove(RUN_KEY))
}

/// Refuses outputs of different runs read together: `files` that record a
/// fingerprint must all record the same one.
pub fn check_same_run(files: &[&Path]) -> Result<()> {
    let mut first: Option<(String, &Path)> = None;
    for &file in files {
        let Some(run) = recorded_run(file)? else {
            continue;
        };
        match &first {
            None => first = Some((run, file)),
            Some((seen, other)) if *seen != run => {
                return Err(HubnormError::Usage(format!(
                    "{} and {} come from different runs ({RUN_KEY} {seen} and {run}): a run was interrupted between writing its outputs, or they were copied together; rerun, or read them apart",
                    other.display(),
                    file.display()
                )))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Refuses a file of a run folder that sits beside another run's outputs
/// (the other files `hubnorm run` writes there): which of them is stale
/// cannot be told, so none is read.
fn check_beside_its_run(file: &Path) -> Result<()> {
    if recorded_run(file)?.is_none() {
        return Ok(());
    }
    let mut files = vec![file.to_path_buf()];
    for name in RUN_OUTPUTS {
        let sibling = file.with_file_name(name);
        if sibling != file && crate::storage::exists(&sibling)? {
            files.push(sibling);
        }
    }
    check_same_run(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>())
}

fn check_k(k: usize) -> Result<()> {
    if k == 0 {
        return Err(HubnormError::Usage("--k must be at least 1".into()));
    }
    Ok(())
}

/// A top-k needs at least k gallery items.
fn check_k_within(k: usize, gallery: &EmbeddingTable) -> Result<()> {
    if k as u64 > gallery.rows {
        return Err(HubnormError::Usage(format!(
            "--k {k} is larger than the gallery ({} items in {})",
            gallery.rows, gallery.spec
        )));
    }
    Ok(())
}

/// `sinkhorn-pp` has no gallery statistic: it runs in `hubnorm run` and `compare` only.
fn refuse_protocol(methods: &[MethodSpec], command: &str) -> Result<()> {
    if let Some(m) = methods
        .iter()
        .find(|m| m.method().single_query(m).is_some())
    {
        return Err(HubnormError::Usage(format!(
            "{} normalises every query with its own pseudo-test stack and has no gallery statistic; it runs in `hubnorm run`, not `hubnorm {command}`",
            m.kind()
        )));
    }
    Ok(())
}

/// The error for `--cluster` in a build without the `cluster` feature.
pub fn without_cluster(scheduler: &str) -> HubnormError {
    HubnormError::Usage(format!(
        "--cluster {scheduler}: this hubnorm was built without the `cluster` feature (cargo build --release --features cluster)"
    ))
}
