//! Wires the stages together: the library's main entry points behind
//! `hubnorm stats`, `hubnorm search` and `hubnorm run`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Array, Int32Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::Serialize;

use crate::checkpoint::{checkpoint_dir, Checkpoint, CheckpointOptions};
use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::kernel::{QueryState, TopK};
use crate::options::{human_bytes, BankSample, MethodKind, MethodSpec, PassOptions};
use crate::progress::Progress;
use crate::query::sinkhorn_pp::SingleQuerySinkhorn;
use crate::query::{
    search, MethodRule, QueryBlockResult, QueryTerm, ScoringPlan, SearchRequest, Selection,
};
use crate::report::{HubnessMeasures, KOccurrence, QualityReport, RankList};
use crate::sink::{write_text_atomically, AtomicFile, ParquetSink};
use crate::source::{EmbeddingTable, IdKind};
use crate::stats_file::{
    load_plan, methods_json, parameters_json, write_stats, SinkhornReport, StatsInputs,
};

pub use crate::stats_file::stats_file_methods;

/// The k of the k-occurrence skewness reported in summaries.
pub const SKEWNESS_K: usize = 10;

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
}

/// Per-method figures of a run (`summary.json`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MethodSummary {
    pub method: String,
    pub parameters: serde_json::Map<String, serde_json::Value>,
    /// Skewness of the k-occurrence distribution at k = 10 over all gallery items.
    pub k_occurrence_skewness: f64,
    /// Every hubness measure of REPORTS.md at `ReportOptions::hubness_k`.
    pub hubness: HubnessMeasures,
    /// `dis`, `dual-dis`: the fraction of queries whose scores were
    /// corrected (raw top-1 in an activation set); the others stay raw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalised_fraction: Option<f64>,
    /// `sn`, `dbsn`: iterations run and how far the plan is from its marginals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sinkhorn: Option<SinkhornReport>,
    /// R@K with intervals, MdR, MnR, MRR: present when the queries carry ground truth.
    #[serde(flatten)]
    pub quality: Option<QualityReport>,
}

/// What pass 2 gathered for one method: enough to rebuild every report
/// (k-occurrence per gallery item, one rank per query).
#[derive(Debug, Clone, PartialEq)]
pub struct MethodOutcome {
    pub spec: MethodSpec,
    /// N_k at `ReportOptions::hubness_k`.
    pub occurrence: KOccurrence,
    /// N_k at k = 10, for `k_occurrence_skewness`.
    pub occurrence_at_10: KOccurrence,
    pub ranks: RankList,
    /// Gated methods: queries whose reported scoring was not the raw one.
    pub normalised: Option<u64>,
}

impl MethodOutcome {
    /// The summary figures of this method.
    pub fn summary(&self, options: &crate::options::ReportOptions) -> MethodSummary {
        MethodSummary {
            method: self.spec.kind().name().to_owned(),
            parameters: parameters_json(&self.spec),
            k_occurrence_skewness: self.occurrence_at_10.skewness(),
            hubness: self.occurrence.measures(options.top_hubs),
            normalised_fraction: self
                .normalised
                .map(|n| n as f64 / self.occurrence.queries.max(1) as f64),
            sinkhorn: None,
            quality: self.ranks.summary(&options.quality),
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

/// Runs `f` on a rayon pool of `threads` workers (0 = one per core).
pub(crate) fn with_threads<T: Send>(
    threads: usize,
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| HubnormError::Internal(format!("cannot start worker threads: {e}")))?;
    pool.install(f)
}

pub(crate) fn open_table(
    role: &str,
    spec: &str,
    options: &PassOptions,
    targets: bool,
) -> Result<EmbeddingTable> {
    EmbeddingTable::open(role, spec, &options.read, targets)
}

/// Opens a bank, subsampled when asked.
fn open_bank(
    role: &str,
    spec: &str,
    options: &PassOptions,
    sample: Option<BankSample>,
) -> Result<EmbeddingTable> {
    let table = open_table(role, spec, options, false)?;
    match sample {
        Some(s) => table.sampled(s.rows, s.seed),
        None => Ok(table),
    }
}

/// The tables pass 1 reads, opened and checked against the gallery.
pub(crate) struct Banks {
    pub bank: EmbeddingTable,
    pub gallery_bank: Option<EmbeddingTable>,
}

impl Banks {
    /// Pass 1's inputs: these banks against `gallery`.
    pub(crate) fn inputs<'a>(
        &'a self,
        gallery: &'a EmbeddingTable,
        index: &'a IdIndex,
    ) -> StatsInputs<'a> {
        StatsInputs {
            gallery,
            bank: &self.bank,
            gallery_bank: self.gallery_bank.as_ref(),
            index,
        }
    }

    /// The metadata of a stats file computed from these banks.
    pub(crate) fn stats_metadata(
        &self,
        gallery: &EmbeddingTable,
        sample: Option<BankSample>,
        options: &PassOptions,
    ) -> Vec<(String, String)> {
        let mut metadata = common_metadata("gallery_stats", options);
        metadata.extend(table_metadata("gallery", gallery));
        metadata.extend(bank_metadata(self, sample));
        metadata
    }
}

pub(crate) fn open_banks(
    bank: &str,
    gallery_bank: Option<&str>,
    sample: Option<BankSample>,
    methods: &[MethodSpec],
    gallery: &EmbeddingTable,
    options: &PassOptions,
) -> Result<Banks> {
    let bank = open_bank("bank", bank, options, sample)?;
    let uses_gallery_bank = methods.iter().any(|m| m.kind().uses_gallery_bank());
    let gallery_bank = match gallery_bank {
        Some(spec) if uses_gallery_bank => Some(open_bank("gallery bank", spec, options, sample)?),
        _ => None,
    };
    for table in std::iter::once(&bank).chain(&gallery_bank) {
        if table.dim != gallery.dim {
            return Err(crate::bank::pass::dimension_error(table, gallery));
        }
    }
    check_bank_sizes(methods, &bank, gallery, options)?;
    Ok(Banks { bank, gallery_bank })
}

/// Methods without repeats, each checked, and the gallery bank present
/// when a method needs it.
pub(crate) fn check_methods(
    methods: &[MethodSpec],
    has_gallery_bank: bool,
) -> Result<Vec<MethodSpec>> {
    let mut unique: Vec<MethodSpec> = Vec::new();
    for m in methods {
        m.validate()?;
        if m.kind().needs_gallery_bank() && !has_gallery_bank {
            return Err(HubnormError::Usage(format!(
                "method {} needs --gallery-bank PATH (items of the gallery modality from the training split, e.g. the bank queries' targets)",
                m.kind()
            )));
        }
        if !unique.contains(m) {
            unique.push(*m);
        }
    }
    Ok(unique)
}

/// Checks that need the bank's size: k of NNN/CSLS within the bank, and
/// `gc`'s sorted similarities within the memory limit.
pub(crate) fn check_bank_sizes(
    methods: &[MethodSpec],
    bank: &EmbeddingTable,
    gallery: &EmbeddingTable,
    options: &PassOptions,
) -> Result<()> {
    for m in methods {
        match *m {
            MethodSpec::NearestNeighbour { k, .. } | MethodSpec::Csls { k }
                if k as u64 > bank.rows =>
            {
                let flag = if m.kind() == MethodKind::Csls {
                    "--csls-k"
                } else {
                    "--nnn-k"
                };
                return Err(HubnormError::Usage(format!(
                    "{flag} {k} is larger than the bank ({} rows); method {} averages the k most similar bank items",
                    bank.rows,
                    m.kind()
                )));
            }
            MethodSpec::GloballyCorrected => {
                let needed = bank.rows.saturating_mul(gallery.rows).saturating_mul(4);
                let allowed = options.memory.bytes() as u64 / 2;
                if needed > allowed {
                    let fits = (allowed / (gallery.rows.max(1) * 4)).max(1);
                    return Err(HubnormError::Budget(format!(
                        "method gc keeps every bank similarity of every gallery item: {} bank × {} gallery × 4 bytes = {}, more than half of --memory-limit {}; raise the limit or pass --bank-sample N (N ≤ {fits} fits)",
                        bank.rows,
                        gallery.rows,
                        human_bytes(needed),
                        options.memory
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn bank_metadata(banks: &Banks, sample: Option<BankSample>) -> Vec<(String, String)> {
    let mut metadata = table_metadata("bank", &banks.bank);
    if let Some(gallery_bank) = &banks.gallery_bank {
        metadata.extend(table_metadata("gallery bank", gallery_bank));
    }
    if let Some(s) = sample {
        if s.rows != u64::MAX {
            metadata.push(("hubnorm.bank_sample.rows".into(), s.rows.to_string()));
        }
        metadata.push(("hubnorm.bank_sample.seed".into(), s.seed.to_string()));
    }
    metadata
}

fn common_metadata(kind: &str, options: &PassOptions) -> Vec<(String, String)> {
    vec![
        ("hubnorm.version".into(), env!("CARGO_PKG_VERSION").into()),
        ("hubnorm.output".into(), kind.into()),
        // The last bits of every score depend on which GEMM computed it.
        ("hubnorm.gemm".into(), crate::kernel::gemm::backend_name()),
        (
            "hubnorm.normalize".into(),
            options.read.normalize.to_string(),
        ),
    ]
}

pub(crate) fn table_metadata(role: &str, table: &EmbeddingTable) -> Vec<(String, String)> {
    let key = role.replace(' ', "_");
    vec![
        (format!("hubnorm.{key}.path"), table.spec.clone()),
        (format!("hubnorm.{key}.rows"), table.rows.to_string()),
        (
            format!("hubnorm.{key}.parts"),
            crate::update::PartRecord::list_json(table),
        ),
    ]
}

// ---------------------------------------------------------------- pass 2 output

/// Schema of `results.parquet`.
pub fn results_schema(query_ids: IdKind, gallery_ids: IdKind) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("method", DataType::Utf8, false),
        Field::new("query_id", query_ids.data_type(), false),
        Field::new("rank", DataType::Int32, false),
        Field::new("gallery_id", gallery_ids.data_type(), false),
        Field::new("score", DataType::Float32, false),
        Field::new("raw_score", DataType::Float32, false),
    ]))
}

/// Which scoring `rule` reports for the query whose states are `states`.
fn selected_scoring(rule: &MethodRule, states: &[QueryState]) -> usize {
    match &rule.selection {
        Selection::Fixed(s) => *s,
        Selection::SingleQuery => unreachable!("single-query methods have their own states"),
        Selection::Gated { raw, sets, choices } => {
            // The raw top-1 g*; a query with no candidate stays raw.
            let Some(top1) = states[*raw].top.best() else {
                return choices[0];
            };
            let bits = sets
                .iter()
                .enumerate()
                .filter(|(_, set)| set[top1.row as usize])
                .fold(0usize, |acc, (i, _)| acc | (1 << i));
            choices[bits]
        }
    }
}

/// The term `rule` subtracts from every reported score of a query.
fn query_offset(rule: &MethodRule, states: &[QueryState], query: &[f32]) -> f64 {
    match &rule.query_term {
        QueryTerm::None => 0.0,
        QueryTerm::HalfNeighbourMean { raw, k } => {
            let top: &TopK = &states[*raw].top;
            let sorted = top.sorted();
            let take = (*k).min(sorted.len()).max(1);
            0.5 * sorted.iter().take(take).map(|c| c.raw as f64).sum::<f64>() / take as f64
        }
        QueryTerm::DistributionShift {
            lambda,
            gallery_mean,
            constant,
        } => {
            let dot: f64 = query
                .iter()
                .zip(gallery_mean)
                .map(|(&q, &m)| q as f64 * m)
                .sum();
            lambda * dot - constant
        }
    }
}

/// Turns query blocks into result rows, and accumulates the summary figures.
struct ResultsCollector<'a> {
    schema: SchemaRef,
    rules: &'a [MethodRule],
    /// `sinkhorn-pp`'s inputs, when it is among the methods.
    protocol: Option<&'a SingleQuerySinkhorn>,
    /// Candidates kept per query (at least `k` and the skewness's 10).
    search_k: usize,
    gallery_ids: &'a ArrayRef,
    k: usize,
    /// Whether the queries carry ground truth (a query without a usable target is then skipped).
    has_targets: bool,
    outcomes: Vec<MethodOutcome>,
}

impl<'a> ResultsCollector<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        schema: SchemaRef,
        rules: &'a [MethodRule],
        protocol: Option<&'a SingleQuerySinkhorn>,
        gallery_ids: &'a ArrayRef,
        k: usize,
        search_k: usize,
        hubness_k: usize,
        has_targets: bool,
    ) -> Self {
        let n = gallery_ids.len();
        ResultsCollector {
            schema,
            rules,
            protocol,
            search_k,
            gallery_ids,
            k,
            has_targets,
            outcomes: rules
                .iter()
                .map(|rule| MethodOutcome {
                    spec: rule.spec,
                    occurrence: KOccurrence::new(hubness_k, n),
                    occurrence_at_10: KOccurrence::new(SKEWNESS_K, n),
                    ranks: RankList::default(),
                    normalised: matches!(rule.selection, Selection::Gated { .. }).then_some(0),
                })
                .collect(),
        }
    }

    fn batch(&mut self, block: &QueryBlockResult<'_>) -> Result<RecordBatch> {
        let ns = block.scorings;
        let queries = block.queries;
        let (mut method, mut query, mut rank, mut gallery, mut score, mut raw) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let protocol_states: Vec<QueryState> = match self.protocol {
            Some(p) => p.search_block(&queries.data, block.positives, self.search_k),
            None => Vec::new(),
        };
        // Query-major order (query, method, rank): the file's row order then
        // does not depend on the block sizes the memory limit chose.
        for q in 0..queries.rows {
            let states = &block.states[q * ns..(q + 1) * ns];
            let embedding = &queries.data[q * queries.dim..(q + 1) * queries.dim];
            for (m, rule) in self.rules.iter().enumerate() {
                let name = rule.spec.kind().name();
                let outcome = &mut self.outcomes[m];
                let state = if rule.selection == Selection::SingleQuery {
                    &protocol_states[q]
                } else {
                    let selected = selected_scoring(rule, states);
                    if let Selection::Gated { choices, .. } = &rule.selection {
                        *outcome.normalised.as_mut().expect("gated") +=
                            (selected != choices[0]) as u64;
                    }
                    &states[selected]
                };
                let offset = query_offset(rule, states, embedding);
                let list = state.top.sorted();
                outcome.occurrence.add_list(list.iter().map(|c| c.row));
                outcome
                    .occurrence_at_10
                    .add_list(list.iter().map(|c| c.row));
                match state.rank() {
                    Some(r) => outcome.ranks.add_rank(r),
                    None if self.has_targets => outcome.ranks.add_skipped(),
                    None => {}
                }
                for (r, c) in list.iter().take(self.k).enumerate() {
                    method.push(name);
                    query.push(q as u32);
                    rank.push(r as i32 + 1);
                    gallery.push(c.row);
                    score.push((c.score as f64 - offset) as f32);
                    raw.push(c.raw);
                }
            }
        }
        let take = |ids: &ArrayRef, rows: Vec<u32>| {
            arrow::compute::take(ids.as_ref(), &UInt32Array::from(rows), None)
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(method)),
            take(&queries.ids, query)?,
            Arc::new(Int32Array::from(rank)),
            take(self.gallery_ids, gallery)?,
            Arc::new(Float32Array::from(score)),
            Arc::new(Float32Array::from(raw)),
        ];
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

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
    mut metadata: Vec<(String, String)>,
    protocol: Option<&SingleQuerySinkhorn>,
    progress: &dyn Progress,
) -> Result<(Option<AtomicFile>, Vec<MethodOutcome>)> {
    let schema = results_schema(queries.id_kind, gallery.id_kind);
    metadata.extend(common_metadata("results", options));
    metadata.push((
        "hubnorm.methods".into(),
        methods_json(&plan.methods.iter().map(|m| m.spec).collect::<Vec<_>>()),
    ));
    metadata.push(("hubnorm.k".into(), k.to_string()));
    metadata.extend(table_metadata("queries", queries));
    metadata.extend(table_metadata("gallery", gallery));
    // Without a destination (tuning), only the figures are gathered.
    let mut sink = out
        .map(|out| ParquetSink::create(out, schema, metadata, overwrite))
        .transpose()?;
    let outcomes = search_into(
        queries,
        gallery,
        index,
        plan,
        k,
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

/// Pass 2: every query block's result rows into `emit` (results schema,
/// query-major order), and the figures of each method.
#[allow(clippy::too_many_arguments)]
fn search_into(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    index: &IdIndex,
    plan: &ScoringPlan,
    k: usize,
    options: &PassOptions,
    protocol: Option<&SingleQuerySinkhorn>,
    progress: &dyn Progress,
    emit: &mut dyn FnMut(&RecordBatch) -> Result<()>,
) -> Result<Vec<MethodOutcome>> {
    let schema = results_schema(queries.id_kind, gallery.id_kind);
    let hubness_k = options.report.hubness_k;
    let search_k = k
        .max(SKEWNESS_K)
        .max(hubness_k)
        .max(plan.neighbours_needed());
    let mut collector = ResultsCollector::new(
        schema,
        &plan.methods,
        protocol,
        index.ids(),
        k,
        search_k,
        hubness_k,
        queries.has_targets,
    );
    // Two k-occurrence counts per method and gallery item, one rank per method and query.
    let resident = index.memory_bytes()
        + plan.memory_bytes()
        + plan.methods.len() * (index.len() * 8 + queries.rows as usize * 8);
    let request = SearchRequest {
        queries,
        gallery,
        gallery_index: index,
        scorings: &plan.scorings,
        k: search_k,
        budget: options.memory.bytes(),
        resident_bytes: resident,
        // The result rows built from each query (~48 bytes per row).
        output_row_bytes: plan.methods.len() * k * 48,
    };
    search(&request, progress, |block| emit(&collector.batch(&block)?))?;
    Ok(collector.outcomes)
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
    if methods.iter().any(|m| m.kind() == MethodKind::SinkhornPp) {
        return Err(HubnormError::Usage(format!(
            "sinkhorn-pp normalises every query with its own pseudo-test stack and has no gallery statistic; it runs in `hubnorm run`, not `hubnorm {command}`"
        )));
    }
    Ok(())
}

pub(crate) fn refuse_existing(path: &Path, overwrite: bool) -> Result<()> {
    if !overwrite && path.exists() {
        return Err(HubnormError::Usage(format!(
            "{} already exists (pass --overwrite to replace it)",
            path.display()
        )));
    }
    Ok(())
}

/// Refuses an output at `out` that is one of the `inputs` ((role, spec)
/// pairs), lies inside an input directory, or matches an input glob: a later
/// run would read it as another part of that input, and `--overwrite` would
/// replace the user's data.
pub(crate) fn refuse_output_in_inputs(out: &Path, inputs: &[(&str, &str)]) -> Result<()> {
    let out_abs = absolute(out);
    for &(role, spec) in inputs.iter().filter(|(_, spec)| !spec.is_empty()) {
        let spec_path = Path::new(spec);
        let clash = if spec_path.is_dir() {
            out_abs.starts_with(absolute(spec_path))
        } else if spec.contains(['*', '?', '[']) {
            glob::Pattern::new(spec)
                .map(|p| p.matches_path(out) || p.matches_path(&out_abs))
                .unwrap_or(false)
        } else {
            out_abs == absolute(spec_path)
        };
        if clash {
            return Err(HubnormError::Usage(format!(
                "the output {} is inside the {role} input {spec}: a later run would read it as part of the {role}, and --overwrite would replace input data; write it elsewhere",
                out.display()
            )));
        }
    }
    Ok(())
}

/// `path` made absolute with symbolic links resolved as far as it exists.
fn absolute(path: &Path) -> PathBuf {
    if let Ok(canonical) = path.canonicalize() {
        return canonical;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            absolute(parent).join(name)
        }
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
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
                    checkpoint.remove()?;
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
    with_threads(job.options.threads, || {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        check_k_within(job.k, &gallery)?;
        let index = IdIndex::build(&gallery)?;
        let plan = load_plan(job.stats.as_deref(), &index, &methods)?;
        let mut metadata = Vec::new();
        if let Some(stats) = &job.stats {
            metadata.push(("hubnorm.stats.path".into(), stats.display().to_string()));
        }
        let (file, outcomes) = write_results(
            &queries,
            &gallery,
            &index,
            &plan,
            job.k,
            Some(&job.out),
            job.overwrite,
            &job.options,
            metadata,
            None,
            progress,
        )?;
        file.expect("a destination").commit()?;
        Ok(RunSummary {
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
        })
    })
}

/// The schema of `hubnorm stats`'s output for `job` (reads file metadata only).
pub fn stats_schema(job: &StatsJob) -> Result<SchemaRef> {
    let methods = check_methods(&job.methods, job.gallery_bank.is_some())?;
    refuse_protocol(&methods, "stats")?;
    let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
    Ok(crate::bank::StatsLayout::new(&methods).schema(gallery.id_kind))
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
    let methods = check_methods(&job.methods, job.gallery_bank.is_some())?;
    refuse_protocol(&methods, "stats")?;
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

/// The schema of `hubnorm search`'s results for `job` (reads file metadata only).
pub fn search_schema(job: &SearchJob) -> Result<SchemaRef> {
    let queries = open_table("queries", &job.queries, &job.options, false)?;
    let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
    Ok(results_schema(queries.id_kind, gallery.id_kind))
}

/// `hubnorm search` as a stream of record batches into `emit` (`job.out`
/// and `job.overwrite` are not used), one batch per query block.
pub fn stream_search(
    job: &SearchJob,
    progress: &dyn Progress,
    emit: &mut (dyn FnMut(&RecordBatch) -> Result<()> + Send),
) -> Result<()> {
    check_k(job.k)?;
    let methods = check_methods(&job.methods, true)?;
    refuse_protocol(&methods, "search")?;
    with_threads(job.options.threads, || {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        check_k_within(job.k, &gallery)?;
        let index = IdIndex::build(&gallery)?;
        let plan = load_plan(job.stats.as_deref(), &index, &methods)?;
        search_into(
            &queries,
            &gallery,
            &index,
            &plan,
            job.k,
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
    let mut methods = vec![MethodSpec::None];
    methods.extend(job.methods.iter().filter(|m| m.kind() != MethodKind::None));
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
        let (stats_file, sinkhorn) = write_stats(
            &banks.inputs(&gallery, &index),
            &methods,
            &job.out_dir.join("gallery_stats.parquet"),
            job.overwrite,
            &job.options,
            metadata,
            progress,
            None,
        )?;
        // Read back through the same code as `hubnorm search`.
        let plan = load_plan(Some(stats_file.temporary_path()), &index, &methods)?;
        let protocol = methods
            .iter()
            .find_map(|m| match *m {
                MethodSpec::SinkhornPp {
                    tau,
                    iterations,
                    pseudo_queries,
                } => Some(SingleQuerySinkhorn::prepare(
                    &gallery,
                    &banks.bank,
                    queries.rows,
                    pseudo_queries,
                    job.bank_sample.map_or(0, |s| s.seed),
                    tau,
                    iterations,
                    job.options.memory.bytes(),
                )),
                _ => None,
            })
            .transpose()?;
        let (results_file, outcomes) = write_results(
            &queries,
            &gallery,
            &index,
            &plan,
            job.k,
            Some(&job.out_dir.join("results.parquet")),
            job.overwrite,
            &job.options,
            bank_metadata(&banks, job.bank_sample),
            protocol.as_ref(),
            progress,
        )?;
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
        let json = serde_json::to_string_pretty(&summary)
            .map_err(|e| HubnormError::Internal(e.to_string()))?;
        let summary_file =
            write_text_atomically(&job.out_dir.join("summary.json"), &json, job.overwrite)?;
        Ok(RunProducts {
            summary,
            outcomes,
            index,
            files: vec![
                stats_file,
                results_file.expect("a destination"),
                summary_file,
            ],
        })
    })
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
