//! Wires the stages together: the library's main entry points behind
//! `hubnorm stats`, `hubnorm search` and `hubnorm run`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, Float32Array, Float64Array, Int32Array, RecordBatch, StringArray,
    UInt32Array,
};
use arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef};
use serde::Serialize;

use crate::bank::{compute_bank_statistics, InvertedSoftmax, StatsChunk};
use crate::error::{HubnormError, Result};
use crate::ids::{id_at, IdIndex};
use crate::options::{MethodKind, MethodSpec, PassOptions};
use crate::progress::Progress;
use crate::query::{search, QueryBlockResult, ScoringMethod, SearchRequest};
use crate::report::{KOccurrence, RetrievalMetrics};
use crate::sink::{write_text_atomically, AtomicFile, ParquetSink};
use crate::source::{EmbeddingTable, IdKind};

/// The k of the k-occurrence skewness reported in summaries.
pub const SKEWNESS_K: usize = 10;

/// Inputs and options of `hubnorm stats`.
#[derive(Debug, Clone)]
pub struct StatsJob {
    pub gallery: String,
    pub bank: String,
    pub methods: Vec<MethodSpec>,
    pub out: PathBuf,
    pub overwrite: bool,
    pub options: PassOptions,
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
    /// R@1/5/10, MRR, mean rank: present when the queries carry ground truth.
    #[serde(flatten)]
    pub quality: Option<crate::report::quality::RecallSummary>,
}

/// What a search or run produced.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunSummary {
    pub queries: u64,
    pub gallery: u64,
    pub bank: Option<u64>,
    pub dim: usize,
    pub k: usize,
    pub normalize: bool,
    pub methods: Vec<MethodSummary>,
}

/// Runs `f` on a rayon pool of `threads` workers (0 = one per core).
fn with_threads<T: Send>(threads: usize, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| HubnormError::Internal(format!("cannot start worker threads: {e}")))?;
    pool.install(f)
}

fn open_table(
    role: &str,
    spec: &str,
    options: &PassOptions,
    targets: bool,
) -> Result<EmbeddingTable> {
    EmbeddingTable::open(role, spec, &options.read, targets)
}

fn bank_methods(methods: &[MethodSpec]) -> Vec<InvertedSoftmax> {
    methods
        .iter()
        .filter_map(|m| match m {
            MethodSpec::InvertedSoftmax { beta } => Some(InvertedSoftmax { beta: *beta }),
            MethodSpec::None => None,
        })
        .collect()
}

fn methods_json(methods: &[MethodSpec]) -> String {
    let list: Vec<_> = methods
        .iter()
        .map(|m| {
            serde_json::json!({
                "method": m.kind().name(),
                "parameters": parameters_json(m),
                "column_prefix": m.column_prefix(),
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn parameters_json(m: &MethodSpec) -> serde_json::Map<String, serde_json::Value> {
    m.parameters()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), serde_json::json!(v)))
        .collect()
}

fn common_metadata(kind: &str, options: &PassOptions) -> Vec<(String, String)> {
    vec![
        ("hubnorm.version".into(), env!("CARGO_PKG_VERSION").into()),
        ("hubnorm.output".into(), kind.into()),
        (
            "hubnorm.normalize".into(),
            options.read.normalize.to_string(),
        ),
    ]
}

fn table_metadata(role: &str, table: &EmbeddingTable) -> Vec<(String, String)> {
    let key = role.replace(' ', "_");
    vec![
        (format!("hubnorm.{key}.path"), table.spec.clone()),
        (format!("hubnorm.{key}.rows"), table.rows.to_string()),
    ]
}

// ---------------------------------------------------------------- pass 1 output

/// Columns of `gallery_stats.parquet` for one inverted-softmax statistic.
fn stats_columns(method: &InvertedSoftmax) -> [String; 3] {
    let prefix = MethodSpec::InvertedSoftmax { beta: method.beta }.column_prefix();
    [
        format!("{prefix}_correction"),
        format!("{prefix}_lse_max"),
        format!("{prefix}_lse_sum"),
    ]
}

/// Schema of `gallery_stats.parquet`: `gallery_id`, then per statistic its
/// correction h(g) and the mergeable log-sum-exp state (max, sum) it came from.
pub fn stats_schema(id_kind: IdKind, methods: &[InvertedSoftmax]) -> SchemaRef {
    let mut fields = vec![Field::new("gallery_id", id_kind.data_type(), false)];
    for m in methods {
        for name in stats_columns(m) {
            fields.push(Field::new(name, DataType::Float64, false));
        }
    }
    Arc::new(Schema::new(fields))
}

fn stats_batch(
    schema: &SchemaRef,
    chunk: &StatsChunk<'_>,
    methods: &[InvertedSoftmax],
) -> Result<RecordBatch> {
    let nb = methods.len();
    let rows = chunk.ids.len();
    let mut columns: Vec<ArrayRef> = vec![chunk.ids.clone()];
    for (b, m) in methods.iter().enumerate() {
        let state = |i: usize| &chunk.states[i * nb + b];
        columns.push(Arc::new(Float64Array::from_iter_values(
            (0..rows).map(|i| m.correction(state(i))),
        )));
        columns.push(Arc::new(Float64Array::from_iter_values(
            (0..rows).map(|i| state(i).max),
        )));
        columns.push(Arc::new(Float64Array::from_iter_values(
            (0..rows).map(|i| state(i).sum),
        )));
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Pass 1 into an (uncommitted) stats file; also returns the corrections as
/// scoring methods for pass 2.
fn write_stats(
    gallery: &EmbeddingTable,
    bank: &EmbeddingTable,
    index: &IdIndex,
    methods: &[MethodSpec],
    out: &Path,
    overwrite: bool,
    options: &PassOptions,
    progress: &dyn Progress,
) -> Result<(AtomicFile, Vec<ScoringMethod>)> {
    let statistics = bank_methods(methods);
    let schema = stats_schema(gallery.id_kind, &statistics);
    let mut metadata = common_metadata("gallery_stats", options);
    metadata.push((
        "hubnorm.methods".into(),
        methods_json(
            &statistics
                .iter()
                .map(|m| MethodSpec::InvertedSoftmax { beta: m.beta })
                .collect::<Vec<_>>(),
        ),
    ));
    metadata.extend(table_metadata("gallery", gallery));
    metadata.extend(table_metadata("bank", bank));
    let mut sink = ParquetSink::create(out, schema.clone(), metadata, overwrite)?;
    let mut scoring: Vec<ScoringMethod> = statistics
        .iter()
        .map(|m| ScoringMethod {
            spec: MethodSpec::InvertedSoftmax { beta: m.beta },
            corrections: vec![0.0; gallery.rows as usize],
        })
        .collect();
    let betas: Vec<f32> = statistics.iter().map(|m| m.beta.0 as f32).collect();
    let resident = index.memory_bytes()
        + scoring
            .iter()
            .map(ScoringMethod::memory_bytes)
            .sum::<usize>();
    compute_bank_statistics(
        gallery,
        bank,
        &betas,
        options.memory.bytes(),
        resident,
        progress,
        |chunk| {
            let nb = statistics.len();
            for (b, m) in statistics.iter().enumerate() {
                let h = &mut scoring[b].corrections;
                for i in 0..chunk.ids.len() {
                    h[chunk.first_row as usize + i] =
                        m.correction(&chunk.states[i * nb + b]) as f32;
                }
            }
            sink.write(&stats_batch(&schema, &chunk, &statistics)?)
        },
    )?;
    Ok((sink.close_uncommitted()?, scoring))
}

fn check_positive_betas(methods: &[MethodSpec]) -> Result<()> {
    for m in methods {
        if let MethodSpec::InvertedSoftmax { beta } = m {
            if !(beta.0 > 0.0 && beta.0.is_finite()) {
                return Err(HubnormError::Usage(format!(
                    "--beta must be a positive number, got {}",
                    beta.0
                )));
            }
        }
    }
    Ok(())
}

/// `hubnorm stats`: pass 1 only; writes `gallery_stats.parquet`.
pub fn run_stats(job: &StatsJob, progress: &dyn Progress) -> Result<PathBuf> {
    check_positive_betas(&job.methods)?;
    if !job.overwrite && job.out.exists() {
        return Err(HubnormError::Usage(format!(
            "{} already exists (pass --overwrite to replace it)",
            job.out.display()
        )));
    }
    with_threads(job.options.threads, || {
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        let bank = open_table("bank", &job.bank, &job.options, false)?;
        let index = IdIndex::build(&gallery)?;
        let (file, _) = write_stats(
            &gallery,
            &bank,
            &index,
            &job.methods,
            &job.out,
            job.overwrite,
            &job.options,
            progress,
        )?;
        file.commit()
    })
}

// ---------------------------------------------------------------- stats input

/// The methods recorded in a `gallery_stats.parquet` file.
pub fn stats_file_methods(path: &Path) -> Result<Vec<MethodSpec>> {
    let builder = crate::source::open_parquet(path)?;
    let schema = builder.schema();
    let mut found = Vec::new();
    for field in schema.fields() {
        if let Some(prefix) = field.name().strip_suffix("_correction") {
            if let Some(beta) = prefix
                .strip_prefix("is_beta")
                .and_then(|b| b.parse::<f64>().ok())
            {
                found.push(MethodSpec::InvertedSoftmax {
                    beta: crate::options::Beta(beta),
                });
            }
        }
    }
    Ok(found)
}

/// Reads the corrections of `methods` from a stats file, aligned to the
/// gallery's rows through its ids. Every gallery item must have exactly one row.
pub fn load_corrections(
    path: &Path,
    index: &IdIndex,
    methods: &[MethodSpec],
) -> Result<Vec<ScoringMethod>> {
    let builder = crate::source::open_parquet(path)?;
    let schema = builder.schema().clone();
    let id_col = schema
        .index_of("gallery_id")
        .map_err(|_| HubnormError::input(path, None, Some("gallery_id"), "missing column"))?;
    // (index in `methods`, column in the file) for every method with a statistic.
    let mut wanted = Vec::new();
    for (index, m) in methods.iter().enumerate() {
        if m.kind() == MethodKind::None {
            continue;
        }
        let name = format!("{}_correction", m.column_prefix());
        let col = schema.index_of(&name).map_err(|_| {
            let available: Vec<String> = stats_file_methods(path)
                .unwrap_or_default()
                .iter()
                .map(|m| format!("{} {:?}", m.kind(), m.parameters()))
                .collect();
            HubnormError::input(
                path,
                None,
                Some(&name),
                format!(
                    "the stats file has no statistic for this method and parameters (it has: {})",
                    available.join("; ")
                ),
            )
        })?;
        wanted.push((index, col));
    }
    let n = index.len();
    let mut out: Vec<ScoringMethod> = methods
        .iter()
        .map(|m| ScoringMethod {
            spec: *m,
            corrections: vec![0.0; n],
        })
        .collect();
    let mut seen = vec![false; n];
    let id_type = index.ids().data_type().clone();
    let reader = builder
        .build()
        .map_err(|e| HubnormError::input(path, None, None, format!("cannot read: {e}")))?;
    let mut file_row = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| {
            HubnormError::input(path, Some(file_row), None, format!("cannot decode: {e}"))
        })?;
        let ids = crate::source::normalise_ids(batch.column(id_col))?;
        let ids = if ids.data_type() == &id_type {
            ids
        } else {
            arrow::compute::cast(&ids, &id_type)?
        };
        for i in 0..batch.num_rows() {
            let row = file_row + i as u64;
            if ids.is_null(i) {
                return Err(HubnormError::input(
                    path,
                    Some(row),
                    Some("gallery_id"),
                    "null or unconvertible id",
                ));
            }
            let id = id_at(ids.as_ref(), i);
            let g = index.find(id).ok_or_else(|| {
                HubnormError::input(
                    path,
                    Some(row),
                    Some("gallery_id"),
                    format!("id {id} is not in the gallery (stats from another gallery?)"),
                )
            })? as usize;
            if std::mem::replace(&mut seen[g], true) {
                return Err(HubnormError::input(
                    path,
                    Some(row),
                    Some("gallery_id"),
                    format!("duplicate id {id}"),
                ));
            }
            for &(index, col) in &wanted {
                let values = batch
                    .column(col)
                    .as_primitive_opt::<Float64Type>()
                    .ok_or_else(|| {
                        HubnormError::input(
                            path,
                            None,
                            Some(schema.field(col).name()),
                            "expected Float64",
                        )
                    })?;
                let v = values.value(i);
                if !v.is_finite() {
                    return Err(HubnormError::input(
                        path,
                        Some(row),
                        Some(schema.field(col).name()),
                        "correction is not finite",
                    ));
                }
                out[index].corrections[g] = v as f32;
            }
        }
        file_row += batch.num_rows() as u64;
    }
    if let Some(g) = seen.iter().position(|s| !s) {
        return Err(HubnormError::input(
            path,
            None,
            Some("gallery_id"),
            format!(
                "gallery item {} has no statistics in this file (stats from another gallery?)",
                id_at(index.ids().as_ref(), g)
            ),
        ));
    }
    Ok(out)
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

/// Turns query blocks into result rows, and accumulates the summary figures.
struct ResultsCollector<'a> {
    schema: SchemaRef,
    methods: &'a [ScoringMethod],
    gallery_ids: &'a ArrayRef,
    k: usize,
    occurrence: Vec<KOccurrence>,
    quality: Vec<RetrievalMetrics>,
}

impl<'a> ResultsCollector<'a> {
    fn new(
        schema: SchemaRef,
        methods: &'a [ScoringMethod],
        gallery_ids: &'a ArrayRef,
        k: usize,
    ) -> Self {
        let n = gallery_ids.len();
        ResultsCollector {
            schema,
            methods,
            gallery_ids,
            k,
            occurrence: methods
                .iter()
                .map(|_| KOccurrence::new(SKEWNESS_K, n))
                .collect(),
            quality: methods
                .iter()
                .map(|_| RetrievalMetrics::default())
                .collect(),
        }
    }

    fn batch(&mut self, block: &QueryBlockResult<'_>) -> Result<RecordBatch> {
        let nm = block.methods;
        let rows = block.query_ids.len();
        let (mut method, mut query, mut rank, mut gallery, mut score, mut raw) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        // Query-major order (query, method, rank): the file's row order then
        // does not depend on the block sizes the memory limit chose.
        for q in 0..rows {
            for (m, scoring) in self.methods.iter().enumerate() {
                let name = scoring.spec.kind().name();
                let state = &block.states[q * nm + m];
                let list = state.top.sorted();
                self.occurrence[m].add_list(list.iter().map(|c| c.row));
                if let Some(r) = state.rank() {
                    self.quality[m].add_rank(r);
                }
                for (r, c) in list.iter().take(self.k).enumerate() {
                    method.push(name);
                    query.push(q as u32);
                    rank.push(r as i32 + 1);
                    gallery.push(c.row);
                    score.push(c.score);
                    raw.push(c.raw);
                }
            }
        }
        let take = |ids: &ArrayRef, rows: Vec<u32>| {
            arrow::compute::take(ids.as_ref(), &UInt32Array::from(rows), None)
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(method)),
            take(block.query_ids, query)?,
            Arc::new(Int32Array::from(rank)),
            take(self.gallery_ids, gallery)?,
            Arc::new(Float32Array::from(score)),
            Arc::new(Float32Array::from(raw)),
        ];
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }

    fn summaries(&self) -> Vec<MethodSummary> {
        self.methods
            .iter()
            .enumerate()
            .map(|(m, scoring)| MethodSummary {
                method: scoring.spec.kind().name().to_owned(),
                parameters: parameters_json(&scoring.spec),
                k_occurrence_skewness: self.occurrence[m].skewness(),
                quality: self.quality[m].summary(),
            })
            .collect()
    }
}

/// Pass 2 into an (uncommitted) results file.
#[allow(clippy::too_many_arguments)]
fn write_results(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    index: &IdIndex,
    methods: &[ScoringMethod],
    k: usize,
    out: &Path,
    overwrite: bool,
    options: &PassOptions,
    mut metadata: Vec<(String, String)>,
    progress: &dyn Progress,
) -> Result<(AtomicFile, Vec<MethodSummary>)> {
    let schema = results_schema(queries.id_kind, gallery.id_kind);
    metadata.extend(common_metadata("results", options));
    metadata.push((
        "hubnorm.methods".into(),
        methods_json(&methods.iter().map(|m| m.spec).collect::<Vec<_>>()),
    ));
    metadata.push(("hubnorm.k".into(), k.to_string()));
    metadata.extend(table_metadata("queries", queries));
    metadata.extend(table_metadata("gallery", gallery));
    let mut sink = ParquetSink::create(out, schema.clone(), metadata, overwrite)?;
    let mut collector = ResultsCollector::new(schema, methods, index.ids(), k);
    let resident = index.memory_bytes()
        + methods
            .iter()
            .map(ScoringMethod::memory_bytes)
            .sum::<usize>()
        + methods.len() * index.len() * 4;
    let request = SearchRequest {
        queries,
        gallery,
        gallery_index: index,
        methods,
        k: k.max(SKEWNESS_K),
        budget: options.memory.bytes(),
        resident_bytes: resident,
    };
    search(&request, progress, |block| {
        sink.write(&collector.batch(&block)?)
    })?;
    Ok((sink.close_uncommitted()?, collector.summaries()))
}

fn check_k(k: usize) -> Result<()> {
    if k == 0 {
        return Err(HubnormError::Usage("--k must be at least 1".into()));
    }
    Ok(())
}

/// `hubnorm search`: pass 2 only, with corrections from a stats file.
pub fn run_search(job: &SearchJob, progress: &dyn Progress) -> Result<RunSummary> {
    check_k(job.k)?;
    if !job.overwrite && job.out.exists() {
        return Err(HubnormError::Usage(format!(
            "{} already exists (pass --overwrite to replace it)",
            job.out.display()
        )));
    }
    with_threads(job.options.threads, || {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        let index = IdIndex::build(&gallery)?;
        let needs_stats = job.methods.iter().any(|m| m.kind().needs_bank());
        let methods = match (&job.stats, needs_stats) {
            (Some(path), _) => load_corrections(path, &index, &job.methods)?,
            (None, false) => job
                .methods
                .iter()
                .map(|_| ScoringMethod::baseline(index.len()))
                .collect(),
            (None, true) => {
                return Err(HubnormError::Usage(
                    "--stats FILE is needed for every method but 'none'".into(),
                ))
            }
        };
        let mut metadata = Vec::new();
        if let Some(stats) = &job.stats {
            metadata.push(("hubnorm.stats.path".into(), stats.display().to_string()));
        }
        let (file, summaries) = write_results(
            &queries,
            &gallery,
            &index,
            &methods,
            job.k,
            &job.out,
            job.overwrite,
            &job.options,
            metadata,
            progress,
        )?;
        file.commit()?;
        Ok(RunSummary {
            queries: queries.rows,
            gallery: gallery.rows,
            bank: None,
            dim: gallery.dim,
            k: job.k,
            normalize: job.options.read.normalize,
            methods: summaries,
        })
    })
}

/// File names `hubnorm run` writes into its output directory.
pub const RUN_OUTPUTS: [&str; 3] = ["results.parquet", "gallery_stats.parquet", "summary.json"];

/// `hubnorm run`: pass 1, pass 2 and the summary, into `job.out_dir`.
/// Nothing appears under the final names unless every output is complete.
pub fn run(job: &RunJob, progress: &dyn Progress) -> Result<RunSummary> {
    check_k(job.k)?;
    check_positive_betas(&job.methods)?;
    for name in RUN_OUTPUTS {
        let path = job.out_dir.join(name);
        if path.exists() && !job.overwrite {
            return Err(HubnormError::Usage(format!(
                "{} already exists (pass --overwrite to replace it)",
                path.display()
            )));
        }
    }
    with_threads(job.options.threads, || {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        let bank = open_table("bank", &job.bank, &job.options, false)?;
        for table in [&queries, &bank] {
            if table.dim != gallery.dim {
                return Err(crate::bank::pass::dimension_error(table, &gallery));
            }
        }
        let index = IdIndex::build(&gallery)?;
        let mut methods = vec![MethodSpec::None];
        methods.extend(
            job.methods
                .iter()
                .filter(|m| m.kind() != MethodKind::None)
                .copied(),
        );
        let (stats_file, corrected) = write_stats(
            &gallery,
            &bank,
            &index,
            &methods,
            &job.out_dir.join("gallery_stats.parquet"),
            job.overwrite,
            &job.options,
            progress,
        )?;
        let mut scoring = vec![ScoringMethod::baseline(index.len())];
        scoring.extend(corrected);
        let metadata = table_metadata("bank", &bank);
        let (results_file, summaries) = write_results(
            &queries,
            &gallery,
            &index,
            &scoring,
            job.k,
            &job.out_dir.join("results.parquet"),
            job.overwrite,
            &job.options,
            metadata,
            progress,
        )?;
        let summary = RunSummary {
            queries: queries.rows,
            gallery: gallery.rows,
            bank: Some(bank.rows),
            dim: gallery.dim,
            k: job.k,
            normalize: job.options.read.normalize,
            methods: summaries,
        };
        let json = serde_json::to_string_pretty(&summary)
            .map_err(|e| HubnormError::Internal(e.to_string()))?;
        let summary_file =
            write_text_atomically(&job.out_dir.join("summary.json"), &json, job.overwrite)?;
        stats_file.commit()?;
        results_file.commit()?;
        summary_file.commit()?;
        Ok(summary)
    })
}
