//! `gallery_stats.parquet`: written by pass 1, read by pass 2.
//!
//! `hubnorm run` writes the file and reads its scorings back through the
//! same code as `hubnorm search`, so `stats` followed by `search` gives
//! exactly what `run` gives.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type, Schema, SchemaRef};

use crate::bank::layout::{DN_GALLERY_MEAN_KEY, DN_QUERY_BANK_MEAN_KEY};
use crate::bank::sinkhorn::{sinkhorn_potentials, SinkhornRequest};
use crate::bank::{
    compute_bank_statistics, BankInput, BankPassRequest, DnMeans, StatsLayout, VectorMean,
};
use crate::checkpoint::Checkpoint;
use crate::error::{HubnormError, Result};
use crate::ids::{id_at, IdIndex};
use crate::options::{MethodKind, MethodSpec, PassOptions};
use crate::progress::Progress;
use crate::query::{MethodRule, QueryTerm, Scoring, ScoringPlan, Selection};
use crate::sink::{AtomicFile, ParquetSink};
use crate::source::EmbeddingTable;

/// The tables pass 1 reads.
#[derive(Debug, Clone, Copy)]
pub struct StatsInputs<'a> {
    pub gallery: &'a EmbeddingTable,
    pub bank: &'a EmbeddingTable,
    pub gallery_bank: Option<&'a EmbeddingTable>,
    pub index: &'a IdIndex,
}

/// The mean row of a table, read block by block.
fn table_mean(table: &EmbeddingTable) -> Result<Vec<f64>> {
    let mut mean = VectorMean::default();
    let mut blocks = table.blocks(4096);
    while let Some(block) = blocks.next_block()? {
        mean.add_rows(&block.data, block.dim);
    }
    Ok(mean.mean())
}

fn floats_json(values: &[f64]) -> String {
    serde_json::Value::from(values.to_vec()).to_string()
}

/// Metadata pairs describing the methods (method, parameters, column prefix).
pub fn methods_json(methods: &[MethodSpec]) -> String {
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

/// A method's parameters as a JSON object.
pub fn parameters_json(m: &MethodSpec) -> serde_json::Map<String, serde_json::Value> {
    m.parameters()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), serde_json::json!(v)))
        .collect()
}

/// Where pass 1's rows go: a Parquet file, or a stream of record batches
/// (the SQL table function).
pub trait StatsSink {
    /// Called once, before the first batch, with the final schema and the
    /// file metadata (methods, `dn` means, Sinkhorn reports).
    fn begin(&mut self, schema: SchemaRef, metadata: Vec<(String, String)>) -> Result<()>;
    /// One batch of rows, in gallery order.
    fn write(&mut self, batch: &RecordBatch) -> Result<()>;
}

/// A [`StatsSink`] into an uncommitted Parquet file.
struct FileStatsSink<'a> {
    out: &'a Path,
    overwrite: bool,
    sink: Option<ParquetSink>,
}

impl StatsSink for FileStatsSink<'_> {
    fn begin(&mut self, schema: SchemaRef, metadata: Vec<(String, String)>) -> Result<()> {
        self.sink = Some(ParquetSink::create(
            self.out,
            schema,
            metadata,
            self.overwrite,
        )?);
        Ok(())
    }
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.sink.as_mut().expect("begun").write(batch)
    }
}

/// Pass 1 into an uncommitted stats file at `out`, with how each Sinkhorn
/// method's iterations ended. `metadata` is stored in the footer, with the
/// methods, the means of `dn`, and the Sinkhorn reports added.
pub fn write_stats(
    inputs: &StatsInputs<'_>,
    methods: &[MethodSpec],
    out: &Path,
    overwrite: bool,
    options: &PassOptions,
    metadata: Vec<(String, String)>,
    progress: &dyn Progress,
    checkpoint: Option<&mut Checkpoint>,
) -> Result<(AtomicFile, Vec<SinkhornReport>)> {
    let mut sink = FileStatsSink {
        out,
        overwrite,
        sink: None,
    };
    let reports = stream_stats(
        inputs,
        methods,
        &spool_path(out),
        options,
        metadata,
        progress,
        &mut sink,
        checkpoint,
    )?;
    let file = sink.sink.expect("begun").close_uncommitted()?;
    Ok((file, reports))
}

/// Pass 1 into `sink`: each gallery chunk's rows as soon as the banks have
/// streamed past it, or, when some column is known only at the end
/// (activation sets, Sinkhorn potentials), after the last chunk, joined
/// with the early columns held in a scratch file at `spool`.
///
/// With a `checkpoint`, the finished chunks are saved as they go, and a
/// resumed checkpoint's rows are replayed before the pass goes on after them.
#[allow(clippy::too_many_arguments)]
pub fn stream_stats(
    inputs: &StatsInputs<'_>,
    methods: &[MethodSpec],
    spool: &Path,
    options: &PassOptions,
    mut metadata: Vec<(String, String)>,
    progress: &dyn Progress,
    sink: &mut dyn StatsSink,
    mut checkpoint: Option<&mut Checkpoint>,
) -> Result<Vec<SinkhornReport>> {
    let StatsInputs {
        gallery,
        bank,
        gallery_bank,
        index,
    } = *inputs;
    let layout = StatsLayout::new(methods);
    let means = if layout.needs_means() {
        let query_bank = table_mean(bank)?;
        let gallery_mean = table_mean(gallery_bank.unwrap_or(gallery))?;
        metadata.push((DN_QUERY_BANK_MEAN_KEY.into(), floats_json(&query_bank)));
        metadata.push((DN_GALLERY_MEAN_KEY.into(), floats_json(&gallery_mean)));
        Some(DnMeans {
            query_bank,
            gallery: gallery_mean,
        })
    } else {
        None
    };
    metadata.push(("hubnorm.methods".into(), methods_json(layout.methods())));
    let schema = layout.schema(gallery.id_kind);
    let (early, late) = layout.columns();
    // Activation columns are known only after the last chunk: the other
    // columns go to a scratch file first and are copied next to them then.
    let direct = late.is_empty();
    let early_schema =
        std::sync::Arc::new(Schema::new(schema.fields()[..1 + early.len()].to_vec()));
    let mut spool_sink = if direct {
        sink.begin(schema.clone(), metadata.clone())?;
        None
    } else {
        Some(ParquetSink::create(
            spool,
            early_schema.clone(),
            vec![],
            true,
        )?)
    };
    // A resumed pass: the saved rows first, then the pass from after them.
    let mut resume = None;
    if let Some(checkpoint) = checkpoint.as_deref() {
        for path in checkpoint.resumed_segments() {
            let reader = crate::source::open_parquet(path)?
                .build()
                .map_err(|e| HubnormError::parquet(path, e))?;
            for batch in reader {
                let batch = batch.map_err(|e| HubnormError::parquet(path, e.into()))?;
                let batch = RecordBatch::try_new(early_schema.clone(), batch.columns().to_vec())
                    .map_err(|_| {
                        HubnormError::input(
                            path,
                            None,
                            None,
                            "corrupt checkpoint: unexpected columns",
                        )
                    })?;
                match &mut spool_sink {
                    Some(spool) => spool.write(&batch)?,
                    None => sink.write(&batch)?,
                }
            }
        }
        let shape = |input: Option<&EmbeddingTable>, k: usize| {
            input.filter(|_| k > 0).map(|t| (t.rows as usize, k))
        };
        resume = checkpoint.resume_point(
            shape(Some(bank), layout.bank_request().row_top_k),
            shape(
                gallery_bank.filter(|_| layout.needs_gallery_bank_tiles()),
                layout.gallery_bank_request().row_top_k,
            ),
        )?;
    }
    let request = BankPassRequest {
        gallery,
        bank: Some(BankInput {
            table: bank,
            request: layout.bank_request(),
        }),
        gallery_bank: gallery_bank
            .filter(|_| layout.needs_gallery_bank_tiles())
            .map(|table| BankInput {
                table,
                request: layout.gallery_bank_request(),
            }),
        budget: options.memory.bytes(),
        resident_bytes: index.memory_bytes(),
        output_row_bytes: layout.output_row_bytes(bank.rows),
        resume: resume.as_ref(),
    };
    let output = compute_bank_statistics(&request, progress, |chunk| {
        let mut columns = vec![chunk.gallery.ids.clone()];
        columns.extend(layout.chunk_columns(&chunk, means.as_ref())?);
        let batch = RecordBatch::try_new(early_schema.clone(), columns)?;
        match &mut spool_sink {
            Some(spool) => spool.write(&batch)?,
            None => sink.write(&batch)?,
        }
        if let Some(checkpoint) = checkpoint.as_deref_mut() {
            checkpoint.record(&batch, chunk.gallery.first_row, chunk.activations)?;
        }
        Ok(())
    });
    let output = match (output, checkpoint) {
        (Err(HubnormError::Interrupted(message)), Some(checkpoint)) => {
            checkpoint.save_on_interrupt()?;
            return Err(HubnormError::Interrupted(message));
        }
        (output, checkpoint) => {
            let output = output?;
            // Sinkhorn's sweeps follow: keep every chunk, so that a stop
            // during them repeats only the sweeps.
            if let Some(checkpoint) = checkpoint.filter(|_| !layout.sinkhorn_methods().is_empty()) {
                checkpoint.save_now(&output)?;
            }
            output
        }
    };
    let Some(spool_sink) = spool_sink else {
        return Ok(Vec::new());
    };
    let spool = spool_sink.close_uncommitted()?;
    // Sinkhorn couples every target: its potentials come from their own
    // sweeps over the whole bank × targets, after the single-pass statistics.
    let mut reports = Vec::new();
    let mut potentials = Vec::new();
    for method in layout.sinkhorn_methods() {
        let (tau, iterations, targets) = match method {
            MethodSpec::Sinkhorn { tau, iterations } => (tau, iterations, vec![gallery]),
            MethodSpec::DualBankSinkhorn { tau, iterations } => {
                let gallery_bank = gallery_bank.ok_or_else(|| {
                    HubnormError::Usage("method dbsn needs --gallery-bank PATH".into())
                })?;
                (tau, iterations, vec![gallery, gallery_bank])
            }
            _ => unreachable!("sinkhorn_methods"),
        };
        let outcome = sinkhorn_potentials(
            &SinkhornRequest {
                sources: bank,
                targets: &targets,
                tau,
                iterations,
                tolerance: options.sinkhorn_tolerance,
                budget: options.memory.bytes(),
                resident_bytes: index.memory_bytes()
                    + potentials
                        .iter()
                        .map(|p: &Vec<f64>| p.len() * 8)
                        .sum::<usize>(),
            },
            progress,
        )?;
        let report = SinkhornReport {
            method,
            iterations: outcome.iterations,
            marginal_error: outcome.marginal_error,
            exact_column_updates: outcome.exact_column_updates,
            cached_tiles: outcome.cached,
            target_chunks: outcome.target_chunks,
            bank_blocks: outcome.source_blocks,
        };
        let key = format!("hubnorm.sinkhorn.{}", method.column_prefix());
        metadata.push((
            key,
            serde_json::to_string(&report.json())
                .map_err(|e| HubnormError::Internal(e.to_string()))?,
        ));
        reports.push(report);
        let mut f = outcome.target_potential;
        f.truncate(gallery.rows as usize);
        potentials.push(f);
    }
    let late_columns = layout.late_columns(&output, gallery.rows as usize, &potentials);
    sink.begin(schema.clone(), metadata)?;
    let reader = crate::source::open_parquet(spool.temporary_path())?
        .build()
        .map_err(|e| HubnormError::parquet(spool.temporary_path(), e))?;
    let mut row = 0usize;
    for batch in reader {
        let batch = batch?;
        let n = batch.num_rows();
        let mut columns = batch.columns().to_vec();
        columns.extend(late_columns.iter().map(|column| column.slice(row, n)));
        sink.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
        row += n;
    }
    drop(spool);
    Ok(reports)
}

/// How a Sinkhorn method's iterations ended (summary and stats metadata).
///
/// The block schedule (`cached_tiles`, `target_chunks`, `bank_blocks`)
/// depends on `--memory-limit`, not on the data, so it stays out of every
/// file: outputs are byte-identical across memory limits and thread counts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SinkhornReport {
    #[serde(skip)]
    pub method: MethodSpec,
    /// Iterations run (fewer than T when `--tol` was met).
    pub iterations: usize,
    /// Largest relative deviation of a row sum of the final plan from 1/|B|
    /// (columns are exact after the last target update).
    pub marginal_error: f64,
    /// Iterations whose target update was redone exactly because a target's
    /// mass was too small for the reused-exp form (`kernel::MIN_COLUMN_MASS`).
    /// Depends on the data only, like the potentials.
    pub exact_column_updates: usize,
    /// Whether the bank × targets similarities were cached between sweeps.
    #[serde(skip)]
    pub cached_tiles: bool,
    /// Target chunks and bank blocks each sweep streamed (more than one of
    /// either: the matrix did not fit the memory limit).
    #[serde(skip)]
    pub target_chunks: usize,
    #[serde(skip)]
    pub bank_blocks: usize,
}

impl SinkhornReport {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "iterations": self.iterations,
            "marginal_error": self.marginal_error,
            "exact_column_updates": self.exact_column_updates,
        })
    }
}

/// The scratch file beside `out` that holds the columns written per chunk.
fn spool_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!(".{name}.spool"))
}

/// The key-value metadata of a Parquet file.
pub(crate) fn file_metadata(path: &Path) -> Result<HashMap<String, String>> {
    let builder = crate::source::open_parquet(path)?;
    Ok(builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default())
}

/// The methods recorded in a `gallery_stats.parquet` file.
pub fn stats_file_methods(path: &Path) -> Result<Vec<MethodSpec>> {
    let metadata = file_metadata(path)?;
    let Some(json) = metadata.get("hubnorm.methods") else {
        return Err(HubnormError::input(
            path,
            None,
            None,
            "not a hubnorm stats file (no hubnorm.methods metadata)",
        ));
    };
    let list: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| HubnormError::input(path, None, None, format!("hubnorm.methods: {e}")))?;
    methods_from_json(&list, path, "hubnorm.methods")
}

/// Methods from a JSON list of `{"method": NAME, "parameters": {...}}` (as
/// [`methods_json`] writes them); `path` and `what` name the source in errors.
pub fn methods_from_json(
    list: &serde_json::Value,
    path: &Path,
    what: &str,
) -> Result<Vec<MethodSpec>> {
    let bad = |why: &str| HubnormError::input(path, None, None, format!("{what}: {why}"));
    let mut methods = Vec::new();
    for entry in list.as_array().ok_or_else(|| bad("not a list"))? {
        let kind: MethodKind = entry["method"]
            .as_str()
            .ok_or_else(|| bad("method name missing"))?
            .parse()?;
        let mut parameters: Vec<(String, f64)> = Vec::new();
        if let Some(object) = entry.get("parameters") {
            let object = object
                .as_object()
                .ok_or_else(|| bad("parameters must be an object"))?;
            for (name, value) in object {
                let value = value
                    .as_f64()
                    .ok_or_else(|| bad(&format!("parameter {name} of {kind} is not a number")))?;
                parameters.push((name.clone(), value));
            }
        }
        let spec = MethodSpec::with_parameters(kind, &parameters)?;
        spec.validate()?;
        methods.push(spec);
    }
    Ok(methods)
}

/// The methods of a config file (`hubnorm tune`'s `tuned.json`, or one
/// written by hand): `{"methods": [{"method": "is", "parameters": {"beta": 30}}]}`.
pub fn config_file_methods(path: &Path) -> Result<Vec<MethodSpec>> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => HubnormError::input(path, None, None, "no such file"),
        _ => HubnormError::io(path, e),
    })?;
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| HubnormError::input(path, None, None, format!("not JSON: {e}")))?;
    let list = config
        .get("methods")
        .ok_or_else(|| HubnormError::input(path, None, None, "no \"methods\" list"))?;
    methods_from_json(list, path, "methods")
}

/// Values of one stats column, aligned to gallery rows.
#[derive(Debug, Clone, PartialEq)]
enum ColumnValues {
    Float64(Vec<f64>),
    Boolean(Vec<bool>),
    /// `width` values per gallery row, row after row.
    ListFloat32 {
        values: Vec<f32>,
        width: usize,
    },
}

/// Reads columns `names` of a stats file, aligned to the gallery's rows
/// through its ids. Every gallery item must have exactly one row.
fn read_columns(path: &Path, index: &IdIndex, names: &[String]) -> Result<Vec<ColumnValues>> {
    let builder = crate::source::open_parquet(path)?;
    let schema = builder.schema().clone();
    let id_col = schema
        .index_of("gallery_id")
        .map_err(|_| HubnormError::input(path, None, Some("gallery_id"), "missing column"))?;
    let n = index.len();
    let mut positions = Vec::with_capacity(names.len());
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let col = schema.index_of(name).map_err(|_| {
            let available: Vec<String> = stats_file_methods(path)
                .unwrap_or_default()
                .iter()
                .map(|m| m.column_prefix())
                .collect();
            HubnormError::input(
                path,
                None,
                Some(name),
                format!(
                    "the stats file has no statistic for this method and parameters (it has: {}); run `hubnorm stats` with this method",
                    available.join(", ")
                ),
            )
        })?;
        positions.push(col);
        // The type each column must have, from its name's suffix.
        let expected = if name.ends_with("_active") {
            DataType::Boolean
        } else if name.ends_with("_sorted_sims") || name.ends_with("_topk") {
            DataType::List(std::sync::Arc::new(arrow::datatypes::Field::new(
                "item",
                DataType::Float32,
                false,
            )))
        } else {
            DataType::Float64
        };
        let actual = schema.field(col).data_type();
        out.push(match (actual, &expected) {
            (DataType::Float64, DataType::Float64) => ColumnValues::Float64(vec![0.0; n]),
            (DataType::Boolean, DataType::Boolean) => ColumnValues::Boolean(vec![false; n]),
            (DataType::List(item), DataType::List(_)) if item.data_type() == &DataType::Float32 => {
                ColumnValues::ListFloat32 {
                    values: Vec::new(),
                    width: 0,
                }
            }
            (other, _) => {
                return Err(HubnormError::input(
                    path,
                    None,
                    Some(name),
                    format!("has type {other}, expected {expected}"),
                ))
            }
        });
    }
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
            let error = |column: &str, message: String| {
                HubnormError::input(path, Some(row), Some(column), message)
            };
            if ids.is_null(i) {
                return Err(error("gallery_id", "null or unconvertible id".into()));
            }
            let id = id_at(ids.as_ref(), i);
            let g = index.find(id).ok_or_else(|| {
                error(
                    "gallery_id",
                    format!("id {id} is not in the gallery (stats from another gallery?)"),
                )
            })? as usize;
            if std::mem::replace(&mut seen[g], true) {
                return Err(error("gallery_id", format!("duplicate id {id}")));
            }
            for ((values, &col), name) in out.iter_mut().zip(&positions).zip(names) {
                let array = batch.column(col);
                if array.is_null(i) {
                    return Err(error(name, "null statistic".into()));
                }
                set_value(values, array, i, g, n).map_err(|m| error(name, m))?;
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

/// Stores row `i` of `array` as gallery row `g` (of `n`).
fn set_value(
    values: &mut ColumnValues,
    array: &ArrayRef,
    i: usize,
    g: usize,
    n: usize,
) -> std::result::Result<(), String> {
    match values {
        ColumnValues::Float64(v) => {
            let x = array
                .as_primitive_opt::<Float64Type>()
                .ok_or("expected Float64")?
                .value(i);
            if !x.is_finite() {
                return Err("statistic is not finite".into());
            }
            v[g] = x;
        }
        ColumnValues::Boolean(v) => {
            v[g] = array.as_boolean_opt().ok_or("expected Boolean")?.value(i);
        }
        ColumnValues::ListFloat32 { values, width } => {
            let list = array.as_list_opt::<i32>().ok_or("expected List<Float32>")?;
            let item = list.value(i);
            let item = item
                .as_primitive_opt::<Float32Type>()
                .ok_or("expected List<Float32>")?;
            if values.is_empty() {
                *width = item.len();
                *values = vec![0.0; n * *width];
            } else if item.len() != *width {
                return Err(format!(
                    "list of {} values, but earlier rows have {}",
                    item.len(),
                    width
                ));
            }
            if item.values().iter().any(|x| !x.is_finite()) {
                return Err("statistic is not finite".into());
            }
            values[g * *width..(g + 1) * *width].copy_from_slice(item.values());
        }
    }
    Ok(())
}

fn corrections(values: ColumnValues) -> Scoring {
    match values {
        ColumnValues::Float64(v) => Scoring::Subtract(v.into_iter().map(|x| x as f32).collect()),
        _ => unreachable!("correction columns are Float64"),
    }
}

fn bits(values: ColumnValues) -> Vec<bool> {
    match values {
        ColumnValues::Boolean(v) => v,
        _ => unreachable!("activation columns are Boolean"),
    }
}

/// Reads a `dn` mean from the stats file's metadata.
fn read_mean(path: &Path, metadata: &HashMap<String, String>, key: &str) -> Result<Vec<f64>> {
    let text = metadata.get(key).ok_or_else(|| {
        HubnormError::input(path, None, None, format!("metadata {key} is missing"))
    })?;
    serde_json::from_str(text)
        .map_err(|e| HubnormError::input(path, None, None, format!("metadata {key}: {e}")))
}

/// The pass 2 plan for `methods` from a stats file (`none` needs no column).
pub fn load_plan(
    path: Option<&Path>,
    index: &IdIndex,
    methods: &[MethodSpec],
) -> Result<ScoringPlan> {
    let n = index.len();
    let mut plan = ScoringPlan::default();
    let needs_raw = methods.iter().any(|m| {
        matches!(
            m.kind(),
            MethodKind::None
                | MethodKind::DynamicInvertedSoftmax
                | MethodKind::DualDynamicInvertedSoftmax
                | MethodKind::Csls
        )
    });
    let raw = needs_raw.then(|| plan.raw_scoring(n));
    let with_stats: Vec<&MethodSpec> = methods
        .iter()
        .filter(|m| m.kind().needs_bank() && m.kind() != MethodKind::SinkhornPp)
        .collect();
    if with_stats.is_empty() {
        for m in methods {
            plan.methods.push(MethodRule {
                spec: *m,
                selection: match m.kind() {
                    MethodKind::SinkhornPp => Selection::SingleQuery,
                    _ => Selection::Fixed(raw.expect("none needs the raw scoring")),
                },
                query_term: QueryTerm::None,
            });
        }
        return Ok(plan);
    }
    let Some(path) = path else {
        return Err(HubnormError::Usage(
            "--stats FILE is needed for every method but 'none'".into(),
        ));
    };
    // Every column any method needs, read in one pass over the file.
    let mut names: Vec<String> = Vec::new();
    let mut column = |name: String| -> usize {
        names.iter().position(|n| *n == name).unwrap_or_else(|| {
            names.push(name);
            names.len() - 1
        })
    };
    let mut wanted: Vec<Vec<usize>> = Vec::new();
    for m in methods {
        let p = m.column_prefix();
        let mut c = |suffix: &str| column(format!("{p}_{suffix}"));
        wanted.push(match m.kind() {
            MethodKind::None => vec![],
            MethodKind::GloballyCorrected => vec![c("sorted_sims")],
            MethodKind::DualSoftmax => vec![c("log_normaliser")],
            MethodKind::SinkhornPp => vec![],
            MethodKind::DynamicInvertedSoftmax => vec![c("correction"), c("active")],
            MethodKind::DualDynamicInvertedSoftmax => vec![
                c("correction"),
                c("query_correction"),
                c("gallery_correction"),
                c("query_active"),
                c("gallery_active"),
            ],
            _ => vec![c("correction")],
        });
    }
    let mut values: Vec<Option<ColumnValues>> = read_columns(path, index, &names)?
        .into_iter()
        .map(Some)
        .collect();
    let mut take = |i: usize| values[i].take().expect("each column used once");
    let metadata = file_metadata(path)?;
    for (m, columns) in methods.iter().zip(wanted) {
        let rule = |selection, query_term| MethodRule {
            spec: *m,
            selection,
            query_term,
        };
        let rule = match *m {
            MethodSpec::None => rule(Selection::Fixed(raw.expect("raw")), QueryTerm::None),
            MethodSpec::GloballyCorrected => {
                let (values, width) = match take(columns[0]) {
                    ColumnValues::ListFloat32 { values, width } => (values, width),
                    _ => unreachable!("gc's column is a list"),
                };
                let s = plan.add_scoring(Scoring::BankRank {
                    sorted: values,
                    width,
                });
                rule(Selection::Fixed(s), QueryTerm::None)
            }
            MethodSpec::SinkhornPp { .. } => rule(Selection::SingleQuery, QueryTerm::None),
            MethodSpec::DualSoftmax { theta } => {
                let log_normaliser = match take(columns[0]) {
                    ColumnValues::Float64(v) => v,
                    _ => unreachable!("dsl's column is Float64"),
                };
                // Transductive: the test queries (q among them) are the bank;
                // otherwise the softmax is over B ∪ {q}.
                let transductive = metadata
                    .get("hubnorm.transductive")
                    .is_some_and(|v| v == "true");
                let s = plan.add_scoring(Scoring::DualSoftmax {
                    log_normaliser,
                    inv_theta: 1.0 / theta,
                    include_query: !transductive,
                });
                rule(Selection::Fixed(s), QueryTerm::None)
            }
            MethodSpec::DynamicInvertedSoftmax { .. } => {
                let corrected = plan.add_scoring(corrections(take(columns[0])));
                let raw = raw.expect("raw");
                rule(
                    Selection::Gated {
                        raw,
                        sets: vec![bits(take(columns[1]))],
                        choices: vec![raw, corrected],
                    },
                    QueryTerm::None,
                )
            }
            MethodSpec::DualDynamicInvertedSoftmax { .. } => {
                let both = plan.add_scoring(corrections(take(columns[0])));
                let query_only = plan.add_scoring(corrections(take(columns[1])));
                let gallery_only = plan.add_scoring(corrections(take(columns[2])));
                let raw = raw.expect("raw");
                rule(
                    Selection::Gated {
                        raw,
                        sets: vec![bits(take(columns[3])), bits(take(columns[4]))],
                        choices: vec![raw, query_only, gallery_only, both],
                    },
                    QueryTerm::None,
                )
            }
            MethodSpec::Csls { k } => {
                let s = plan.add_scoring(corrections(take(columns[0])));
                rule(
                    Selection::Fixed(s),
                    QueryTerm::HalfNeighbourMean {
                        raw: raw.expect("raw"),
                        k,
                    },
                )
            }
            MethodSpec::DistributionNormalisation { lambda } => {
                let s = plan.add_scoring(corrections(take(columns[0])));
                let query_bank = read_mean(path, &metadata, DN_QUERY_BANK_MEAN_KEY)?;
                let gallery_mean = read_mean(path, &metadata, DN_GALLERY_MEAN_KEY)?;
                let constant = lambda
                    * lambda
                    * query_bank
                        .iter()
                        .zip(&gallery_mean)
                        .map(|(a, b)| a * b)
                        .sum::<f64>();
                rule(
                    Selection::Fixed(s),
                    QueryTerm::DistributionShift {
                        lambda,
                        gallery_mean,
                        constant,
                    },
                )
            }
            MethodSpec::InvertedSoftmax { .. }
            | MethodSpec::NearestNeighbour { .. }
            | MethodSpec::DualInvertedSoftmax { .. }
            | MethodSpec::Sinkhorn { .. }
            | MethodSpec::DualBankSinkhorn { .. } => {
                let s = plan.add_scoring(corrections(take(columns[0])));
                rule(Selection::Fixed(s), QueryTerm::None)
            }
        };
        plan.methods.push(rule);
    }
    Ok(plan)
}
