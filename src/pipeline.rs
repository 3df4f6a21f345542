//! Wires the stages together: the library's main entry points behind
//! `hubnorm stats`, `hubnorm search` and `hubnorm run`.

use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use serde::Serialize;

use crate::checkpoint::{checkpoint_dir, Checkpoint, CheckpointOptions};
use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::inputs::{
    bank_metadata, check_bank_sizes, check_methods, common_metadata, open_banks, open_table,
    table_metadata, with_threads, Banks,
};
use crate::options::{BankSample, ClusterJob, MethodKind, MethodSpec, PassOptions};
use crate::progress::Progress;
use crate::query::load_plan;
use crate::query::results::{results_schema, search_into, ResultRows};
use crate::query::sinkhorn_pp::SingleQuerySinkhorn;
use crate::query::ScoringPlan;
use crate::sink::{
    refuse_existing, refuse_output_in_inputs, write_text_atomically, AtomicFile, ParquetSink,
};
use crate::source::EmbeddingTable;
use crate::stats_file::{methods_json, stats_of_rows, write_stats, StatsInputs, StatsPlan};

pub use crate::query::results::{MethodOutcome, MethodSummary, SKEWNESS_K};
pub use crate::stats_file::stats_file_methods;

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
    /// query set known in advance. `bank` is then ignored.
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

// ---------------------------------------------------------------- pass 2 output

/// Pass 2 into an (uncommitted) results file.
#[allow(clippy::too_many_arguments)]
fn write_results(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    index: &IdIndex,
    plan: &ScoringPlan,
    k: usize,
    out: Option<&Path>,
    overwrite: bool,
    options: &PassOptions,
    metadata: Vec<(String, String)>,
    protocol: Option<&SingleQuerySinkhorn>,
    progress: &dyn Progress,
) -> Result<(Option<AtomicFile>, Vec<MethodOutcome>)> {
    // Without a destination (tuning), only the figures are gathered.
    let mut sink = out
        .map(|out| results_sink(queries, gallery, plan, k, out, overwrite, options, metadata))
        .transpose()?;
    let outcomes = search_into(
        queries,
        0..queries.rows,
        gallery,
        index,
        plan,
        k,
        ResultRows::TopK,
        options,
        protocol,
        progress,
        &mut |batch| match &mut sink {
            Some(sink) => sink.write(batch),
            None => Ok(()),
        },
    )?;
    let file = sink.map(ParquetSink::close_uncommitted).transpose()?;
    Ok((file, outcomes))
}

/// The writer of a results file, with its footer's metadata.
#[allow(clippy::too_many_arguments)]
fn results_sink(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    plan: &ScoringPlan,
    k: usize,
    out: &Path,
    overwrite: bool,
    options: &PassOptions,
    mut metadata: Vec<(String, String)>,
) -> Result<ParquetSink> {
    let schema = results_schema(queries.id_kind, gallery.id_kind);
    metadata.extend(common_metadata("results", options));
    metadata.push((
        "hubnorm.methods".into(),
        methods_json(&plan.methods.iter().map(|m| m.spec).collect::<Vec<_>>()),
    ));
    metadata.push(("hubnorm.k".into(), k.to_string()));
    metadata.extend(table_metadata("queries", queries));
    metadata.extend(table_metadata("gallery", gallery));
    ParquetSink::create(out, schema, metadata, overwrite)
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

/// `sinkhorn-pp` has no gallery statistic: it runs in `hubnorm run` only.
fn refuse_protocol(methods: &[MethodSpec], command: &str) -> Result<()> {
    if let Some(m) = methods.iter().find(|m| m.method().single_query()) {
        return Err(HubnormError::Usage(format!(
            "{} normalises every query with its own pseudo-test stack and has no gallery statistic; it runs in `hubnorm run`, not `hubnorm {command}`",
            m.kind()
        )));
    }
    Ok(())
}

/// Opens pass 1's inputs for `job` (in its thread pool) and hands them,
/// with the stats file's metadata, to `pass`.
fn with_stats_inputs<T: Send>(
    job: &StatsJob,
    methods: &[MethodSpec],
    pass: impl FnOnce(&StatsInputs<'_>, Vec<(String, String)>) -> Result<T> + Send,
) -> Result<T> {
    with_threads(job.options.threads, || {
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        let banks = open_banks(
            &job.bank,
            job.gallery_bank.as_deref(),
            job.bank_sample,
            methods,
            &gallery,
            &job.options,
        )?;
        let index = IdIndex::build(&gallery)?;
        let metadata = banks.stats_metadata(&gallery, job.bank_sample, &job.options);
        pass(&banks.inputs(&gallery, &index), metadata)
    })
}

/// `hubnorm stats`: pass 1 only; writes `gallery_stats.parquet`,
/// checkpointing finished gallery chunks as `job.checkpoint` says.
pub fn run_stats(job: &StatsJob, progress: &dyn Progress) -> Result<StatsOutcome> {
    let methods = check_methods(&job.methods, job.gallery_bank.is_some())?;
    refuse_protocol(&methods, "stats")?;
    refuse_output_in_inputs(&job.out, &stats_inputs(job))?;
    refuse_existing(&job.out, job.overwrite)?;
    with_stats_inputs(job, &methods, |inputs, metadata| {
        let manifest = checkpoint_manifest(&metadata, &methods, &job.options);
        let saves_activation = !crate::bank::StatsLayout::new(&methods)
            .columns()
            .1
            .is_empty();
        let mut checkpoint =
            Checkpoint::open(&job.out, &manifest, &job.checkpoint, saves_activation)?;
        let resumed_rows = checkpoint.as_ref().map_or(0, Checkpoint::resumed_rows);
        let written = write_stats(
            inputs,
            &methods,
            &job.out,
            job.overwrite,
            &job.options,
            metadata,
            progress,
            checkpoint.as_mut(),
        );
        let (file, _) = match written {
            Ok(written) => written,
            Err(err) => {
                // Saved work is never deleted (the message says where it
                // is); a checkpoint with nothing saved would only block the
                // next run.
                let saved = checkpoint.as_ref().map_or(0, Checkpoint::saved_rows);
                if let Some(checkpoint) = checkpoint.filter(|_| saved == 0) {
                    // The failure is what to report: a checkpoint that cannot
                    // be removed (a store that is gone) only asks the next
                    // run for --resume.
                    let _ = checkpoint.remove();
                }
                return Err(match err {
                    HubnormError::Interrupted(message) if saved > 0 => {
                        HubnormError::Interrupted(format!(
                            "{message}; the first {saved} gallery rows are saved in {}: run the same command with --resume to continue",
                            checkpoint_dir(&job.out).display()
                        ))
                    }
                    err => err,
                });
            }
        };
        let path = file.commit()?;
        if let Some(checkpoint) = checkpoint {
            checkpoint.remove()?;
        }
        Ok(StatsOutcome { path, resumed_rows })
    })
}

/// `hubnorm stats --cluster`: pass 1 of `job` computed by the cluster of
/// `cluster`, in shards of gallery rows, into the same file `run_stats`
/// writes, bit for bit, written and committed here once every shard is in.
/// No checkpoint: a task lost with its executor is run again by the
/// scheduler.
pub fn run_stats_on(job: &StatsJob, cluster: &ClusterJob) -> Result<StatsOutcome> {
    let methods = stats_methods(job)?;
    check_cluster_pass1(&methods)?;
    if job.checkpoint.resume {
        return Err(HubnormError::Usage(
            "--resume: a cluster run keeps no checkpoint (the scheduler runs lost tasks again)"
                .into(),
        ));
    }
    refuse_output_in_inputs(&job.out, &stats_inputs(job))?;
    refuse_existing(&job.out, job.overwrite)?;
    #[cfg(not(feature = "cluster"))]
    return Err(without_cluster(&cluster.scheduler));
    #[cfg(feature = "cluster")]
    with_stats_inputs(job, &methods, |inputs, metadata| {
        let path =
            on_cluster::stats(job, &methods, inputs, metadata, &job.out, cluster)?.commit()?;
        Ok(StatsOutcome {
            path,
            resumed_rows: 0,
        })
    })
}

/// The error for `--cluster` in a build without the `cluster` feature.
pub fn without_cluster(scheduler: &str) -> HubnormError {
    HubnormError::Usage(format!(
        "--cluster {scheduler}: this hubnorm was built without the `cluster` feature (cargo build --release --features cluster)"
    ))
}

/// The inputs of a stats job, as (role, spec) pairs.
fn stats_inputs(job: &StatsJob) -> Vec<(&str, &str)> {
    let mut inputs = vec![
        ("gallery", job.gallery.as_str()),
        ("bank", job.bank.as_str()),
    ];
    inputs.extend(job.gallery_bank.as_deref().map(|g| ("gallery bank", g)));
    inputs
}

/// What a checkpoint must match to be resumed: the stats file's metadata
/// (input parts with sizes and modification times, normalisation, bank
/// sample), the methods, and the options that change the statistics.
fn checkpoint_manifest(
    metadata: &[(String, String)],
    methods: &[MethodSpec],
    options: &PassOptions,
) -> std::collections::BTreeMap<String, String> {
    let mut manifest: std::collections::BTreeMap<String, String> =
        metadata.iter().cloned().collect();
    manifest.insert(
        "hubnorm.methods".into(),
        crate::stats_file::methods_json(methods),
    );
    manifest.insert(
        "hubnorm.sinkhorn_tolerance".into(),
        format!("{:?}", options.sinkhorn_tolerance),
    );
    let read = &options.read;
    manifest.insert(
        "hubnorm.columns".into(),
        format!("{} {}", read.id_column, read.embedding_column),
    );
    manifest
}

/// `hubnorm search`: pass 2 only, with statistics from a stats file.
pub fn run_search(job: &SearchJob, progress: &dyn Progress) -> Result<RunSummary> {
    let methods = check_search(job)?;
    with_threads(job.options.threads, || {
        let SearchInputs {
            queries,
            gallery,
            index,
            plan,
        } = SearchInputs::open(job, &methods)?;
        let (file, outcomes) = write_results(
            &queries,
            &gallery,
            &index,
            &plan,
            job.k,
            Some(&job.out),
            job.overwrite,
            &job.options,
            search_metadata(job),
            None,
            progress,
        )?;
        file.expect("a destination").commit()?;
        Ok(search_summary(job, &queries, &gallery, &outcomes))
    })
}

/// `hubnorm search --cluster`: pass 2 of `job` computed by the cluster of
/// `cluster`, in shards of query rows, into the same results file and
/// summary `run_search` makes, bit for bit. The shards' rows go down to the
/// depth of the hubness measures and carry the report columns, from which
/// the summary is rebuilt here; the file is written and committed here
/// once every shard is in.
pub fn run_search_on(job: &SearchJob, cluster: &ClusterJob) -> Result<RunSummary> {
    #[cfg(feature = "cluster")]
    return on_cluster::search(job, cluster);
    #[cfg(not(feature = "cluster"))]
    {
        check_search(job)?;
        Err(without_cluster(&cluster.scheduler))
    }
}

#[cfg(feature = "cluster")]
mod on_cluster;

/// What a search reads before its pass: the tables (checked), the
/// gallery's id index and the scoring plan from the stats file.
struct SearchInputs {
    queries: EmbeddingTable,
    gallery: EmbeddingTable,
    index: IdIndex,
    plan: ScoringPlan,
}

impl SearchInputs {
    fn open(job: &SearchJob, methods: &[MethodSpec]) -> Result<Self> {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        check_k_within(job.k, &gallery)?;
        let index = IdIndex::build(&gallery)?;
        let plan = load_plan(job.stats.as_deref(), &index, methods)?;
        Ok(SearchInputs {
            queries,
            gallery,
            index,
            plan,
        })
    }
}

/// What `run_search` and `run_search_on` check before reading any row:
/// the methods (returned), k, and the output's place.
fn check_search(job: &SearchJob) -> Result<Vec<MethodSpec>> {
    check_k(job.k)?;
    let methods = check_methods(&job.methods, true)?;
    refuse_protocol(&methods, "search")?;
    let mut inputs = vec![
        ("queries", job.queries.as_str()),
        ("gallery", job.gallery.as_str()),
    ];
    let stats = job.stats.as_ref().map(|s| s.display().to_string());
    inputs.extend(stats.as_deref().map(|s| ("stats", s)));
    refuse_output_in_inputs(&job.out, &inputs)?;
    refuse_existing(&job.out, job.overwrite)?;
    if let Some(stats) = &job.stats {
        check_beside_its_run(stats)?;
    }
    Ok(methods)
}

/// The footer metadata a search adds to its results file.
fn search_metadata(job: &SearchJob) -> Vec<(String, String)> {
    job.stats
        .iter()
        .map(|stats| ("hubnorm.stats.path".into(), stats.display().to_string()))
        .collect()
}

/// The summary of a search from its methods' figures.
fn search_summary(
    job: &SearchJob,
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    outcomes: &[MethodOutcome],
) -> RunSummary {
    RunSummary {
        queries: queries.rows,
        gallery: gallery.rows,
        bank: None,
        gallery_bank: None,
        transductive: false,
        dim: gallery.dim,
        k: job.k,
        normalize: job.options.read.normalize,
        methods: outcomes
            .iter()
            .map(|o| o.summary(&job.options.report))
            .collect(),
    }
}

/// The methods of `job`, checked for a stats pass.
pub fn stats_methods(job: &StatsJob) -> Result<Vec<MethodSpec>> {
    let methods = check_methods(&job.methods, job.gallery_bank.is_some())?;
    refuse_protocol(&methods, "stats")?;
    Ok(methods)
}

/// Refuses `methods` unless pass 1 can compute any range of gallery rows on
/// its own with no merge after it, as the partitions of `hubnorm_stats`
/// on a cluster do (see
/// [`crate::bank::driver::StatsPlan::rows_are_independent`]).
pub fn check_shardable(methods: &[MethodSpec]) -> Result<()> {
    refuse_methods(
        methods,
        |m| m.method().columns(m).iter().any(|c| c.late),
        "cannot run in hubnorm_stats on a cluster yet: their statistics need every gallery row at once (the activation sets of dis and dual-dis, the Sinkhorn potentials of sn and dbsn), while the table's partitions are independent shards of gallery rows; use `hubnorm stats --cluster` for dis and dual-dis, or run without --cluster",
    )
}

/// Refuses `methods` unless a cluster can compute their pass 1 in shards of
/// gallery rows merged by the client: every method but the Sinkhorn ones
/// (`sn`, `dbsn`), whose potentials come from sweeps over every gallery
/// row at once.
pub fn check_cluster_pass1(methods: &[MethodSpec]) -> Result<()> {
    refuse_methods(
        methods,
        |m| m.method().sinkhorn(m).is_some(),
        "cannot run on a cluster yet: their Sinkhorn potentials come from sweeps over every gallery row at once, while a cluster computes pass 1 in shards of gallery rows; run them without --cluster",
    )
}

/// A usage error naming the methods `refused` picks, followed by `why`.
fn refuse_methods(
    methods: &[MethodSpec],
    refused: impl Fn(&MethodSpec) -> bool,
    why: &str,
) -> Result<()> {
    let names: Vec<&str> = methods
        .iter()
        .filter(|m| refused(m))
        .map(|m| m.kind().name())
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    Err(HubnormError::Usage(format!("{} {why}", names.join(", "))))
}

/// The stats rows of gallery rows `gallery_rows` alone (a cluster task's
/// shard of `job`), batch by batch into `emit`, in gallery order: the
/// rows the whole pass writes for them. With `activation_rows`, the early
/// columns in [`crate::bank::shards::shard_schema`] followed by the shard's
/// activation states, for a client that merges them (methods passing
/// [`check_cluster_pass1`]); without, the methods must pass
/// [`check_shardable`].
pub fn stream_stats_rows(
    job: &StatsJob,
    gallery_rows: std::ops::Range<u64>,
    activation_rows: bool,
    progress: &dyn Progress,
    emit: &mut (dyn FnMut(&RecordBatch) -> Result<()> + Send),
) -> Result<()> {
    let methods = stats_methods(job)?;
    if activation_rows {
        check_cluster_pass1(&methods)?;
    } else {
        check_shardable(&methods)?;
    }
    with_threads(job.options.threads, || {
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        gallery.check_shard(&gallery_rows)?;
        let banks = open_banks(
            &job.bank,
            job.gallery_bank.as_deref(),
            job.bank_sample,
            &methods,
            &gallery,
            &job.options,
        )?;
        let inputs = StatsInputs {
            gallery: &gallery,
            bank: &banks.bank,
            gallery_bank: banks.gallery_bank.as_ref(),
            index: None,
        };
        let plan = StatsPlan::new(&inputs, &methods, Vec::new())?;
        if !activation_rows {
            stats_of_rows(
                &inputs,
                &plan,
                gallery_rows,
                &job.options,
                progress,
                |batch| emit(&batch),
            )?;
            return Ok(());
        }
        use crate::bank::shards;
        let schema = shards::shard_schema(&plan.layout, gallery.id_kind);
        let output = stats_of_rows(
            &inputs,
            &plan,
            gallery_rows,
            &job.options,
            progress,
            |batch| emit(&shards::early_rows(&batch, &schema)?),
        )?;
        shards::activation_rows(
            &output,
            &plan.activation_shapes(&inputs),
            &schema,
            job.options.read.batch_rows,
            emit,
        )
    })
}

/// `hubnorm stats` as a stream of record batches into `sink` (`job.out`
/// and `job.overwrite` are not used); columns known only at the end go
/// through a scratch file at `spool`, removed afterwards.
pub fn stream_stats(
    job: &StatsJob,
    spool: &Path,
    progress: &dyn Progress,
    sink: &mut (dyn crate::stats_file::StatsSink + Send),
) -> Result<()> {
    let methods = stats_methods(job)?;
    with_stats_inputs(job, &methods, |inputs, metadata| {
        crate::stats_file::stream_stats(
            inputs,
            &methods,
            spool,
            &job.options,
            metadata,
            progress,
            sink,
            None,
        )?;
        Ok(())
    })
}

/// `hubnorm search` as a stream of record batches into `emit` (`job.out`
/// and `job.overwrite` are not used), one batch per query block: of every
/// query, or of the rows `query_rows` alone (a cluster task's shard).
pub fn stream_search(
    job: &SearchJob,
    query_rows: Option<std::ops::Range<u64>>,
    rows: ResultRows,
    progress: &dyn Progress,
    emit: &mut (dyn FnMut(&RecordBatch) -> Result<()> + Send),
) -> Result<()> {
    check_k(job.k)?;
    let methods = check_methods(&job.methods, true)?;
    refuse_protocol(&methods, "search")?;
    with_threads(job.options.threads, || {
        let SearchInputs {
            queries,
            gallery,
            index,
            plan,
        } = SearchInputs::open(job, &methods)?;
        search_into(
            &queries,
            query_rows.unwrap_or(0..queries.rows),
            &gallery,
            &index,
            &plan,
            job.k,
            rows,
            &job.options,
            None,
            progress,
            emit,
        )?;
        Ok(())
    })
}

/// File names `hubnorm run` writes into its output directory.
pub const RUN_OUTPUTS: [&str; 3] = ["results.parquet", "gallery_stats.parquet", "summary.json"];

/// `hubnorm run`: pass 1, pass 2 and the summary, into `job.out_dir`.
/// Nothing appears under the final names unless every output is complete.
pub fn run(job: &RunJob, progress: &dyn Progress) -> Result<RunSummary> {
    let products = run_uncommitted(job, &[], progress)?;
    commit_all(products.files)?;
    Ok(products.summary)
}

/// What `hubnorm run` produced, before its files take their final names.
pub(crate) struct RunProducts {
    pub summary: RunSummary,
    pub outcomes: Vec<MethodOutcome>,
    /// The gallery's ids in row order, with their lookup.
    pub index: IdIndex,
    /// gallery_stats, results, summary.json: uncommitted.
    pub files: Vec<AtomicFile>,
}

impl RunProducts {
    /// The stats file as written so far (its temporary name).
    pub fn stats_path(&self) -> &Path {
        self.files[0].temporary_path()
    }
}

/// Gives every file its final name, in the order written.
pub(crate) fn commit_all(files: Vec<AtomicFile>) -> Result<()> {
    for file in files {
        file.commit()?;
    }
    Ok(())
}

/// Both passes and the summary into uncommitted files; `extra_outputs`
/// are further names in `job.out_dir` a caller will write (refused when they
/// exist, as run's own).
pub(crate) fn run_uncommitted(
    job: &RunJob,
    extra_outputs: &[&str],
    progress: &dyn Progress,
) -> Result<RunProducts> {
    check_k(job.k)?;
    let none = MethodKind::baseline();
    let mut methods = vec![MethodSpec::default_for(none)];
    methods.extend(job.methods.iter().filter(|m| m.kind() != none));
    let methods = check_methods(&methods, job.gallery_bank.is_some())?;
    if job.transductive {
        if let Some(m) = methods
            .iter()
            .find(|m| !m.kind().has_transductive_variant())
        {
            return Err(HubnormError::Usage(format!(
                "--transductive uses the test queries as the bank, which METHODS.md defines for is, sn, dsl and sinkhorn-pp only, not {}",
                m.kind()
            )));
        }
    }
    let mut inputs = vec![
        ("queries", job.queries.as_str()),
        ("gallery", job.gallery.as_str()),
    ];
    if !job.transductive {
        inputs.push(("bank", job.bank.as_str()));
    }
    inputs.extend(job.gallery_bank.as_deref().map(|g| ("gallery bank", g)));
    refuse_output_in_inputs(&job.out_dir, &inputs)?;
    if let Some(cluster) = &job.cluster {
        check_run_on_cluster(job, &methods, cluster)?;
    }
    for name in RUN_OUTPUTS.iter().chain(extra_outputs) {
        refuse_output_in_inputs(&job.out_dir.join(name), &inputs)?;
        refuse_existing(&job.out_dir.join(name), job.overwrite)?;
    }
    with_threads(job.options.threads, || {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        check_k_within(job.k, &gallery)?;
        if queries.dim != gallery.dim {
            return Err(crate::bank::pass::dimension_error(&queries, &gallery));
        }
        let bank_spec = if job.transductive {
            &job.queries
        } else {
            &job.bank
        };
        let banks = open_banks(
            bank_spec,
            job.gallery_bank.as_deref(),
            job.bank_sample,
            &methods,
            &gallery,
            &job.options,
        )?;
        let index = IdIndex::build(&gallery)?;
        let mut metadata = banks.stats_metadata(&gallery, job.bank_sample, &job.options);
        metadata.push(("hubnorm.transductive".into(), job.transductive.to_string()));
        let run_id = {
            let mut pairs = metadata.clone();
            pairs.extend(table_metadata("queries", &queries));
            pairs.push(("hubnorm.methods".into(), methods_json(&methods)));
            pairs.push(("hubnorm.k".into(), job.k.to_string()));
            // Not the memory limit or the threads: outputs do not depend on them.
            let o = &job.options;
            let options = format!("{:?} {:?} {:?}", o.read, o.sinkhorn_tolerance, o.report);
            pairs.push(("hubnorm.options".into(), options));
            run_fingerprint(&pairs)
        };
        metadata.push((RUN_KEY.into(), run_id.clone()));
        let stats_out = job.out_dir.join("gallery_stats.parquet");
        let (stats_file, sinkhorn) = match &job.cluster {
            None => write_stats(
                &banks.inputs(&gallery, &index),
                &methods,
                &stats_out,
                job.overwrite,
                &job.options,
                metadata,
                progress,
                None,
            )?,
            #[cfg(feature = "cluster")]
            Some(cluster) => {
                let stats_job = StatsJob {
                    gallery: job.gallery.clone(),
                    bank: bank_spec.clone(),
                    gallery_bank: job.gallery_bank.clone(),
                    bank_sample: job.bank_sample,
                    methods: methods.clone(),
                    out: stats_out.clone(),
                    overwrite: job.overwrite,
                    options: job.options.clone(),
                    checkpoint: Default::default(),
                };
                let inputs = banks.inputs(&gallery, &index);
                let file = on_cluster::stats(
                    &stats_job, &methods, &inputs, metadata, &stats_out, cluster,
                )?;
                (file, Vec::new())
            }
            #[cfg(not(feature = "cluster"))]
            Some(cluster) => return Err(without_cluster(&cluster.scheduler)),
        };
        // Read back through the same code as `hubnorm search`.
        let plan = load_plan(Some(stats_file.temporary_path()), &index, &methods)?;
        let protocol = methods
            .iter()
            .find(|m| m.method().single_query())
            .map(|m| {
                SingleQuerySinkhorn::prepare(
                    &gallery,
                    &banks.bank,
                    queries.rows,
                    m.count("m") - 1,
                    job.bank_sample.map_or(0, |s| s.seed),
                    m.get("tau"),
                    m.count("t"),
                    job.options.memory.bytes(),
                )
            })
            .transpose()?;
        let results_out = job.out_dir.join("results.parquet");
        let results_metadata = bank_metadata(&banks, job.bank_sample)
            .into_iter()
            .chain([(RUN_KEY.to_owned(), run_id.clone())])
            .collect();
        let (results_file, outcomes) = match &job.cluster {
            None => {
                let (file, outcomes) = write_results(
                    &queries,
                    &gallery,
                    &index,
                    &plan,
                    job.k,
                    Some(&results_out),
                    job.overwrite,
                    &job.options,
                    results_metadata,
                    protocol.as_ref(),
                    progress,
                )?;
                (file.expect("a destination"), outcomes)
            }
            #[cfg(feature = "cluster")]
            Some(cluster) => {
                // The executors read the statistics from the stats file
                // under its temporary name, beside the outputs.
                let search_job = SearchJob {
                    queries: job.queries.clone(),
                    gallery: job.gallery.clone(),
                    stats: Some(stats_file.temporary_path().to_path_buf()),
                    methods: methods.clone(),
                    k: job.k,
                    out: results_out,
                    overwrite: job.overwrite,
                    options: job.options.clone(),
                };
                on_cluster::results(
                    &search_job,
                    &queries,
                    &gallery,
                    &plan,
                    results_metadata,
                    cluster,
                )?
            }
            #[cfg(not(feature = "cluster"))]
            Some(cluster) => return Err(without_cluster(&cluster.scheduler)),
        };
        let mut summaries: Vec<MethodSummary> = outcomes
            .iter()
            .map(|o| o.summary(&job.options.report))
            .collect();
        for (summary, rule) in summaries.iter_mut().zip(&plan.methods) {
            summary.sinkhorn = sinkhorn.iter().find(|r| r.method == rule.spec).cloned();
        }
        let summary = RunSummary {
            queries: queries.rows,
            gallery: gallery.rows,
            bank: Some(banks.bank.rows),
            transductive: job.transductive,
            gallery_bank: banks.gallery_bank.as_ref().map(|t| t.rows),
            dim: gallery.dim,
            k: job.k,
            normalize: job.options.read.normalize,
            methods: summaries,
        };
        let json = serde_json::to_string_pretty(&SummaryFile {
            summary: &summary,
            run: &run_id,
        })
        .map_err(|e| HubnormError::Internal(e.to_string()))?;
        let summary_file =
            write_text_atomically(&job.out_dir.join("summary.json"), &json, job.overwrite)?;
        Ok(RunProducts {
            summary,
            outcomes,
            index,
            files: vec![stats_file, results_file, summary_file],
        })
    })
}

/// Refuses a run on `cluster` that a cluster cannot compute: a method
/// whose pass 1 needs every gallery row at once, `sinkhorn-pp` (each query
/// is normalised with its own stack, on one machine), or outputs in object
/// storage (the executors read the statistics from the stats file before
/// it is committed, which for an object is a local temporary file).
fn check_run_on_cluster(job: &RunJob, methods: &[MethodSpec], cluster: &ClusterJob) -> Result<()> {
    if !cfg!(feature = "cluster") {
        return Err(without_cluster(&cluster.scheduler));
    }
    check_cluster_pass1(methods)?;
    if let Some(m) = methods.iter().find(|m| m.method().single_query()) {
        return Err(HubnormError::Usage(format!(
            "{} normalises every query with its own pseudo-test stack on one machine; run it without --cluster",
            m.kind()
        )));
    }
    if crate::storage::is_remote(&job.out_dir) {
        return Err(HubnormError::Usage(format!(
            "--out {}: a run on a cluster writes its outputs to a directory the executors can read (they read its statistics before they are committed), not to object storage; write to shared storage, or run `stats --cluster` and `search --cluster` with URL outputs",
            job.out_dir.display()
        )));
    }
    Ok(())
}

/// Pass 1 and pass 2 of `methods` for `queries`, keeping no output: the
/// figures of each method (`hubnorm tune`). The statistics go to a
/// temporary file in `scratch_dir`, removed on return.
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate_methods(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    bank: EmbeddingTable,
    gallery_bank: Option<EmbeddingTable>,
    methods: &[MethodSpec],
    options: &PassOptions,
    scratch_dir: &Path,
    progress: &dyn Progress,
) -> Result<Vec<MethodOutcome>> {
    let methods = check_methods(methods, gallery_bank.is_some())?;
    refuse_protocol(&methods, "tune")?;
    for table in std::iter::once(&bank).chain(&gallery_bank).chain([queries]) {
        if table.dim != gallery.dim {
            return Err(crate::bank::pass::dimension_error(table, gallery));
        }
    }
    check_bank_sizes(&methods, &bank, gallery, options)?;
    let banks = Banks { bank, gallery_bank };
    with_threads(options.threads, || {
        let index = IdIndex::build(gallery)?;
        let (stats, _) = write_stats(
            &banks.inputs(gallery, &index),
            &methods,
            &scratch_dir.join("tune_stats.parquet"),
            true,
            options,
            Vec::new(),
            progress,
            None,
        )?;
        let plan = load_plan(Some(stats.temporary_path()), &index, &methods)?;
        let (_, outcomes) = write_results(
            queries,
            gallery,
            &index,
            &plan,
            SKEWNESS_K,
            None,
            true,
            options,
            Vec::new(),
            None,
            progress,
        )?;
        Ok(outcomes)
    })
}
