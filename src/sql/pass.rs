//! A pass as a partitioned DataFusion table: [`PassTable`] and its plan
//! [`PassExec`], built from a [`PassSpec`] that every process of a cluster
//! can rebuild them from.
//!
//! Partition `i` of a sharded spec computes the rows of shard `i` alone:
//! for `hubnorm_stats`, gallery rows `shards[i]..shards[i + 1]` against the
//! whole banks (a gallery row's statistics need every bank row and no other
//! gallery row, for the methods whose columns are known per chunk: see
//! [`crate::bank::driver::StatsPlan::rows_are_independent`]). So a
//! scheduler spreads the shards over executors as one task each, and their
//! rows are those of the one-machine pass bit for bit. An unsharded spec has
//! one partition that runs the whole pass, as on one machine.
//!
//! Each partition runs the native pass on a blocking thread and hands its
//! record batches over a bounded channel as they are made (a finished
//! gallery chunk for stats, a query block for search). Before starting, the
//! pass reserves its budget from the task's memory pool, half of it (the rest
//! is for the operators around it; less when other partitions of the query
//! share the pool), and runs within it: on one machine the session's
//! `--memory-limit`, on an executor its `--memory-limit` shared among its
//! task slots.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, AsArray, RecordBatch, UInt32Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableType;
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use crate::error::HubnormError;
use crate::inputs::open_table;
use crate::kernel::ScreenCounts;
use crate::options::{
    human_bytes, BankSample, MemoryBudget, MethodSpec, PassOptions, Precision, ReadOptions,
};
use crate::pipeline::{self, ProtocolBank, SearchJob, StatsJob};
use crate::progress::Silent;
use crate::query::results::{rows_schema, ResultRows};
use crate::source::IdKind;
use crate::stats_file::{methods_from_json, methods_json, StatsSink};

use super::{external, Placement};

/// The column a sharded pass adds when asked, the shard of each row, so
/// that a client can put the shards back in order.
pub const SHARD_COLUMN: &str = "hubnorm_shard";

/// With [`SHARD_COLUMN`], the pairs a shard's bf16 screen screened and
/// re-scored ([`ScreenCounts`]): null but on the last row of each shard,
/// which carries the shard's counts. A client sums them for its summary;
/// rows are the only channel from a task back to it.
pub const SCREENED_PAIRS_COLUMN: &str = "hubnorm_screened_pairs";
/// See [`SCREENED_PAIRS_COLUMN`].
pub const RESCORED_PAIRS_COLUMN: &str = "hubnorm_rescored_pairs";
/// The columns after a pass's own rows with [`PassSpec::shard_column`].
pub const SHARD_COLUMNS: [&str; 3] = [SHARD_COLUMN, SCREENED_PAIRS_COLUMN, RESCORED_PAIRS_COLUMN];

/// Which pass, on which inputs: paths (absolute, or URLs) and methods.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "pass", rename_all = "snake_case")]
pub enum PassInputs {
    /// Pass 1 (`hubnorm_stats`).
    Stats {
        gallery: String,
        bank: String,
        gallery_bank: Option<String>,
        bank_sample: Option<BankSample>,
        /// As [`methods_json`] writes them.
        methods: String,
        gallery_ids: IdKind,
        /// For a client that merges the shards' activation states: each
        /// shard's rows in [`crate::bank::shards::shard_schema`], followed by
        /// its states.
        #[serde(default)]
        activation_rows: bool,
    },
    /// Pass 2 (`hubnorm_search`).
    Search {
        queries: String,
        gallery: String,
        stats: Option<String>,
        methods: String,
        k: usize,
        query_ids: IdKind,
        gallery_ids: IdKind,
        /// For a client that rebuilds the run's summary from the rows: the
        /// rows go down to this rank and carry the report columns
        /// ([`ResultRows::WithReportColumns`]). `None`: the results' rows.
        #[serde(default)]
        report_depth: Option<usize>,
        /// Where `sinkhorn-pp` draws its pseudo-test queries from, when it
        /// is among the methods (a shard of `run`; not a table function).
        #[serde(default)]
        protocol_bank: Option<ProtocolBank>,
    },
    /// A round of one Sinkhorn method's sweeps (`sn`, `dbsn`), sharded over
    /// the rows of its targets (the gallery, then the gallery bank):
    /// [`crate::bank::sinkhorn::sinkhorn_round`], in
    /// [`crate::bank::shards::round_schema`]. For `stats --cluster` only,
    /// not a table function.
    SinkhornRound {
        gallery: String,
        bank: String,
        gallery_bank: Option<String>,
        bank_sample: Option<BankSample>,
        /// The one method, as [`methods_json`] writes it.
        methods: String,
        /// The Parquet file of the sources' potentials g that the client
        /// wrote for this round (one `potential` column); `None` in the
        /// first round.
        source_potentials: Option<String>,
    },
}

impl PassInputs {
    /// The tables the pass reads, by role (`gallery`, `bank`, ...).
    pub fn tables(&self) -> Vec<(&'static str, &str)> {
        let mut tables = Vec::new();
        match self {
            PassInputs::Stats {
                gallery,
                bank,
                gallery_bank,
                ..
            }
            | PassInputs::SinkhornRound {
                gallery,
                bank,
                gallery_bank,
                ..
            } => {
                tables.push(("gallery", gallery.as_str()));
                tables.push(("bank", bank.as_str()));
                tables.extend(gallery_bank.as_deref().map(|g| ("gallery bank", g)));
            }
            PassInputs::Search {
                queries,
                gallery,
                stats,
                ..
            } => {
                tables.push(("queries", queries.as_str()));
                tables.push(("gallery", gallery.as_str()));
                tables.extend(stats.as_deref().map(|s| ("stats", s)));
            }
        }
        tables
    }
}

/// Everything a process needs to run a pass's partitions: what travels
/// inside a cluster's plans (see `cluster::codec`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassSpec {
    pub inputs: PassInputs,
    pub read: ReadOptions,
    /// Worker threads of each partition's pass (0 = one per core).
    pub threads: usize,
    /// Shard bounds: partition `i` computes rows `shards[i]..shards[i + 1]`
    /// (gallery rows for stats, query rows for search). Empty: one partition, the whole pass.
    pub shards: Vec<u64>,
    /// Whether every batch carries its shard and the shard's screen counts
    /// in last columns ([`SHARD_COLUMNS`]).
    pub shard_column: bool,
    /// `--precision`, applied by each process that runs partitions on its
    /// own CPU (`auto` screens where that CPU can).
    #[serde(default)]
    pub precision: Precision,
}

impl PassSpec {
    /// Pass 1 of `job`, whole, with its methods checked, and the gallery's
    /// row count (reads the gallery's footers).
    pub fn for_stats(job: &StatsJob) -> crate::Result<(Self, u64)> {
        let methods = pipeline::stats_methods(job)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        Ok((Self::stats(job, &methods, gallery.id_kind), gallery.rows))
    }

    /// Pass 2 of `job`, whole, and the queries' row count (reads the
    /// tables' footers).
    pub fn for_search(job: &SearchJob) -> crate::Result<(Self, u64)> {
        let queries = open_table("queries", &job.queries, &job.options, false)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        Ok((
            Self::search(job, queries.id_kind, gallery.id_kind),
            queries.rows,
        ))
    }

    /// Pass 1 of `job` with `methods` (checked), whole. `sinkhorn-pp`, which
    /// has no statistic (a `run`'s pass 2 normalises each query), is left out.
    pub fn stats(job: &StatsJob, methods: &[MethodSpec], gallery_ids: IdKind) -> Self {
        let with_statistics: Vec<MethodSpec> = methods
            .iter()
            .filter(|m| !m.method().single_query())
            .copied()
            .collect();
        PassSpec {
            inputs: PassInputs::Stats {
                gallery: job.gallery.clone(),
                bank: job.bank.clone(),
                gallery_bank: job.gallery_bank.clone(),
                bank_sample: job.bank_sample,
                methods: methods_json(&with_statistics),
                gallery_ids,
                activation_rows: false,
            },
            read: job.options.read.clone(),
            threads: job.options.threads,
            shards: Vec::new(),
            shard_column: false,
            precision: job.options.precision,
        }
    }

    /// Pass 2 of `job`, whole.
    pub fn search(job: &SearchJob, query_ids: IdKind, gallery_ids: IdKind) -> Self {
        PassSpec {
            inputs: PassInputs::Search {
                queries: job.queries.clone(),
                gallery: job.gallery.clone(),
                stats: job.stats.as_ref().map(|p| p.display().to_string()),
                methods: methods_json(&job.methods),
                k: job.k,
                query_ids,
                gallery_ids,
                report_depth: None,
                protocol_bank: None,
            },
            read: job.options.read.clone(),
            threads: job.options.threads,
            shards: Vec::new(),
            shard_column: false,
            precision: job.options.precision,
        }
    }

    /// A round of the Sinkhorn `method` of `job`, whole (shard it over the
    /// targets' rows), from the source potentials in `source_potentials`.
    pub fn sinkhorn_round(
        job: &StatsJob,
        method: &MethodSpec,
        source_potentials: Option<&std::path::Path>,
    ) -> Self {
        PassSpec {
            inputs: PassInputs::SinkhornRound {
                gallery: job.gallery.clone(),
                bank: job.bank.clone(),
                gallery_bank: job.gallery_bank.clone(),
                bank_sample: job.bank_sample,
                methods: methods_json(std::slice::from_ref(method)),
                source_potentials: source_potentials.map(|p| p.display().to_string()),
            },
            read: job.options.read.clone(),
            threads: job.options.threads,
            shards: Vec::new(),
            shard_column: false,
            precision: job.options.precision,
        }
    }

    /// This stats spec for a client that merges the shards' activation
    /// states (see [`crate::bank::shards`]).
    pub fn with_activation_rows(mut self) -> Self {
        if let PassInputs::Stats {
            activation_rows, ..
        } = &mut self.inputs
        {
            *activation_rows = true;
        }
        self
    }

    /// This search spec for a client that rebuilds the summary from its
    /// rows: lists down to rank `depth`, with the report columns.
    pub fn with_report_depth(mut self, depth: usize) -> Self {
        if let PassInputs::Search { report_depth, .. } = &mut self.inputs {
            *report_depth = Some(depth);
        }
        self
    }

    /// This search spec with `sinkhorn-pp`'s bank (see
    /// [`pipeline::stream_search`]).
    pub fn with_protocol_bank(mut self, bank: Option<ProtocolBank>) -> Self {
        if let PassInputs::Search { protocol_bank, .. } = &mut self.inputs {
            *protocol_bank = bank;
        }
        self
    }

    /// This spec cut into `count` shards of `rows` rows as even as can be
    /// (at most one shard per row).
    pub fn sharded(mut self, rows: u64, count: usize) -> Self {
        let count = (count.max(1) as u64).min(rows.max(1));
        self.shards = (0..=count).map(|i| rows * i / count).collect();
        self
    }

    /// This spec with its local paths made absolute, for processes whose
    /// working directories are not this one's (a cluster's).
    pub fn with_absolute_paths(mut self) -> crate::Result<Self> {
        let absolute = |path: &mut String| -> crate::Result<()> {
            *path = Placement::Cluster.path(std::mem::take(path))?;
            Ok(())
        };
        match &mut self.inputs {
            PassInputs::Stats {
                gallery,
                bank,
                gallery_bank,
                ..
            } => {
                absolute(gallery)?;
                absolute(bank)?;
                gallery_bank.as_mut().map(absolute).transpose()?;
            }
            PassInputs::Search {
                queries,
                gallery,
                stats,
                protocol_bank,
                ..
            } => {
                absolute(queries)?;
                absolute(gallery)?;
                stats.as_mut().map(absolute).transpose()?;
                if let Some(protocol) = protocol_bank {
                    absolute(&mut protocol.bank)?;
                }
            }
            PassInputs::SinkhornRound {
                gallery,
                bank,
                gallery_bank,
                source_potentials,
                ..
            } => {
                absolute(gallery)?;
                absolute(bank)?;
                gallery_bank.as_mut().map(absolute).transpose()?;
                source_potentials.as_mut().map(absolute).transpose()?;
            }
        }
        Ok(self)
    }

    /// The function a user calls for this pass.
    pub fn name(&self) -> &'static str {
        match self.inputs {
            PassInputs::Stats { .. } => "hubnorm_stats",
            PassInputs::Search { .. } => "hubnorm_search",
            PassInputs::SinkhornRound { .. } => "hubnorm_sinkhorn_round",
        }
    }

    /// Partitions of the plan: one per shard, one when unsharded.
    pub fn partitions(&self) -> usize {
        self.shards.len().saturating_sub(1).max(1)
    }

    /// The rows of partition `partition`: `None` for the whole pass.
    fn shard(&self, partition: usize) -> Option<Range<u64>> {
        (!self.shards.is_empty()).then(|| self.shards[partition]..self.shards[partition + 1])
    }

    fn methods(&self) -> crate::Result<Vec<MethodSpec>> {
        let json = match &self.inputs {
            PassInputs::Stats { methods, .. }
            | PassInputs::Search { methods, .. }
            | PassInputs::SinkhornRound { methods, .. } => methods,
        };
        let list: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| HubnormError::Internal(format!("the pass's methods: {e}")))?;
        methods_from_json(&list, std::path::Path::new(self.name()), "methods")
    }

    /// The rows' schema, without reading a file.
    pub fn schema(&self) -> crate::Result<SchemaRef> {
        let schema = match &self.inputs {
            PassInputs::Stats {
                gallery_ids,
                activation_rows,
                ..
            } => {
                let layout = crate::bank::StatsLayout::new(&self.methods()?);
                match activation_rows {
                    true => crate::bank::shards::shard_schema(&layout, *gallery_ids),
                    false => layout.schema(*gallery_ids),
                }
            }
            PassInputs::Search {
                query_ids,
                gallery_ids,
                report_depth,
                ..
            } => rows_schema(*query_ids, *gallery_ids, result_rows(*report_depth)),
            PassInputs::SinkhornRound { .. } => crate::bank::shards::round_schema(),
        };
        if !self.shard_column {
            return Ok(schema);
        }
        let mut fields = schema.fields().to_vec();
        fields.push(Arc::new(Field::new(SHARD_COLUMN, DataType::UInt32, false)));
        for counts in [SCREENED_PAIRS_COLUMN, RESCORED_PAIRS_COLUMN] {
            fields.push(Arc::new(Field::new(counts, DataType::UInt64, true)));
        }
        Ok(Arc::new(Schema::new_with_metadata(
            fields,
            schema.metadata().clone(),
        )))
    }

    /// The spec as bytes (JSON), for a plan sent to other processes.
    pub fn to_bytes(&self) -> crate::Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| HubnormError::Internal(format!("a pass's spec: {e}")))
    }

    /// The spec from [`PassSpec::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> crate::Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| {
            HubnormError::Internal(format!(
                "a pass's spec from another hubnorm process does not parse (are all processes the same hubnorm version?): {e}"
            ))
        })
    }

    /// Runs partition `partition` with `budget` bytes, handing its batches
    /// (in this spec's schema before the shard columns) to `emit`, and
    /// returns what the bf16 screen did. An executor logs that too.
    fn run(
        &self,
        partition: usize,
        budget: usize,
        emit: &mut (dyn FnMut(&RecordBatch) -> crate::Result<()> + Send),
    ) -> crate::Result<ScreenCounts> {
        let screen = self.run_partition(partition, budget, emit)?;
        #[cfg(feature = "cluster")]
        if screen.screened > 0 {
            log::info!(
                "partition {partition}: bf16 screen ({}): re-scored {} of {} pairs in f32",
                self.precision.name(),
                screen.rescored,
                screen.screened
            );
        }
        Ok(screen)
    }

    /// [`run`](Self::run) without the log: what the screen did.
    fn run_partition(
        &self,
        partition: usize,
        budget: usize,
        emit: &mut (dyn FnMut(&RecordBatch) -> crate::Result<()> + Send),
    ) -> crate::Result<ScreenCounts> {
        self.precision.check_available()?;
        let options = PassOptions {
            read: self.read.clone(),
            memory: MemoryBudget(budget),
            threads: self.threads,
            precision: self.precision,
            ..PassOptions::default()
        };
        let methods = self.methods()?;
        match (&self.inputs, self.shard(partition)) {
            (
                PassInputs::Stats {
                    gallery,
                    bank,
                    gallery_bank,
                    bank_sample,
                    activation_rows,
                    ..
                },
                rows,
            ) => {
                let job = stats_job(gallery, bank, gallery_bank, *bank_sample, methods, options);
                match rows {
                    Some(rows) => {
                        pipeline::stream_stats_rows(&job, rows, *activation_rows, &Silent, emit)
                    }
                    None => {
                        let spool = std::env::temp_dir().join(format!(
                            "hubnorm-sql-{}-{}.spool",
                            std::process::id(),
                            SPOOLS.fetch_add(1, Ordering::Relaxed)
                        ));
                        let mut sink = ChannelSink { send: emit };
                        pipeline::stream_stats(&job, &spool, &Silent, &mut sink)?;
                        Ok(ScreenCounts::default())
                    }
                }
            }
            (
                PassInputs::Search {
                    queries,
                    gallery,
                    stats,
                    k,
                    report_depth,
                    protocol_bank,
                    ..
                },
                rows,
            ) => {
                let job = SearchJob {
                    queries: queries.clone(),
                    gallery: gallery.clone(),
                    stats: stats.as_ref().map(PathBuf::from),
                    methods,
                    k: *k,
                    out: PathBuf::new(),
                    overwrite: false,
                    options,
                };
                pipeline::stream_search(
                    &job,
                    rows,
                    result_rows(*report_depth),
                    protocol_bank.as_ref(),
                    &Silent,
                    emit,
                )
            }
            (
                PassInputs::SinkhornRound {
                    gallery,
                    bank,
                    gallery_bank,
                    bank_sample,
                    source_potentials,
                    ..
                },
                rows,
            ) => {
                let job = stats_job(gallery, bank, gallery_bank, *bank_sample, methods, options);
                let potentials = source_potentials.as_ref().map(std::path::Path::new);
                pipeline::stream_sinkhorn_round(&job, rows, potentials, emit)?;
                Ok(ScreenCounts::default())
            }
        }
    }
}

/// A stats job over these tables, for a task (no output file, no checkpoint).
fn stats_job(
    gallery: &str,
    bank: &str,
    gallery_bank: &Option<String>,
    bank_sample: Option<BankSample>,
    methods: Vec<MethodSpec>,
    options: PassOptions,
) -> StatsJob {
    StatsJob {
        gallery: gallery.to_owned(),
        bank: bank.to_owned(),
        gallery_bank: gallery_bank.clone(),
        bank_sample,
        methods,
        out: PathBuf::new(),
        overwrite: false,
        options,
        checkpoint: Default::default(),
    }
}

/// The rows a search pass makes for `report_depth`.
fn result_rows(report_depth: Option<usize>) -> ResultRows {
    match report_depth {
        Some(depth) => ResultRows::WithReportColumns { depth },
        None => ResultRows::TopK,
    }
}

/// Scratch files of streamed stats passes get distinct names.
static SPOOLS: AtomicUsize = AtomicUsize::new(0);

/// Stats rows into the channel (the schema is known before the pass).
struct ChannelSink<'a> {
    send: &'a mut (dyn FnMut(&RecordBatch) -> crate::Result<()> + Send),
}

impl StatsSink for ChannelSink<'_> {
    fn begin(&mut self, _: SchemaRef, _: Vec<(String, String)>) -> crate::Result<()> {
        Ok(())
    }
    fn write(&mut self, batch: &RecordBatch) -> crate::Result<()> {
        (self.send)(batch)
    }
}

/// A pass as a table (what the table functions return).
#[derive(Debug)]
pub struct PassTable {
    spec: PassSpec,
    schema: SchemaRef,
}

impl PassTable {
    pub fn new(spec: PassSpec) -> crate::Result<Self> {
        let schema = spec.schema()?;
        Ok(PassTable { spec, schema })
    }

    pub fn spec(&self) -> &PassSpec {
        &self.spec
    }
}

#[async_trait]
impl TableProvider for PassTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(PassExec::new(
            self.spec.clone(),
            projection.cloned(),
        )?))
    }
}

/// The plan of a [`PassTable`]: one partition per shard.
///
/// Its child is the list of shards, an in-memory table with one row (the
/// shard's number) per partition: a cluster's scheduler restricts each
/// task's plan to the partitions it runs by slicing such tables (it cannot
/// slice a plan it does not know), so a task gets the shards it must run
/// and no other. Partition `p` runs the shards of its child's partition `p`
/// (one, unless something between them regrouped the list).
#[derive(Debug)]
pub struct PassExec {
    spec: PassSpec,
    /// The columns kept, by index into the spec's schema (all when `None`).
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    shards: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

/// The column of the shard list.
const SHARD_LIST_COLUMN: &str = "shard";

impl PassExec {
    /// The plan of every shard of `spec`.
    pub fn new(spec: PassSpec, projection: Option<Vec<usize>>) -> Result<Self> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            SHARD_LIST_COLUMN,
            DataType::UInt32,
            false,
        )]));
        let partitions = (0..spec.partitions())
            .map(|shard| {
                let column = Arc::new(UInt32Array::from(vec![shard as u32]));
                Ok(vec![RecordBatch::try_new(schema.clone(), vec![column])?])
            })
            .collect::<Result<Vec<_>>>()?;
        let shards = MemorySourceConfig::try_new_exec(&partitions, schema, None)?;
        Self::over(spec, projection, shards)
    }

    /// The plan of the shards that `shards` (a shard list) lists.
    pub fn over(
        spec: PassSpec,
        projection: Option<Vec<usize>>,
        shards: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        let full = spec.schema().map_err(external)?;
        let schema = match &projection {
            Some(columns) => Arc::new(full.project(columns)?),
            None => full,
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(
                shards.properties().output_partitioning().partition_count(),
            ),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(PassExec {
            spec,
            projection,
            schema,
            shards,
            properties: Arc::new(properties),
        })
    }

    pub fn spec(&self) -> &PassSpec {
        &self.spec
    }

    pub fn projection(&self) -> Option<&[usize]> {
        self.projection.as_deref()
    }
}

impl DisplayAs for PassExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "PassExec: {}, {} of {} shard(s)",
            self.spec.name(),
            self.properties.output_partitioning().partition_count(),
            self.spec.partitions()
        )
    }
}

/// The columns [`SHARD_COLUMNS`] of a batch of `rows` rows of shard `tag`:
/// the screen's `counts` on its last row when given, null elsewhere.
fn shard_columns(tag: u32, rows: usize, counts: Option<ScreenCounts>) -> [ArrayRef; 3] {
    let on_last_row = |count: Option<u64>| -> ArrayRef {
        Arc::new(UInt64Array::from_iter(
            (0..rows).map(|row| count.filter(|_| row + 1 == rows)),
        ))
    };
    [
        Arc::new(UInt32Array::from_value(tag, rows)),
        on_last_row(counts.map(|c| c.screened)),
        on_last_row(counts.map(|c| c.rescored)),
    ]
}

/// The shard numbers a partition of a shard list holds (each below `count`).
fn shards_of(list: SendableRecordBatchStream, count: usize) -> Result<Vec<usize>> {
    let batches: Vec<RecordBatch> = futures::executor::block_on(list.try_collect())?;
    let mut shards = Vec::new();
    for batch in &batches {
        let column = batch
            .column(0)
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| DataFusionError::Internal("a shard list of another type".into()))?;
        for shard in column.values().iter().map(|&s| s as usize) {
            if shard >= count {
                return Err(DataFusionError::Internal(format!(
                    "shard {shard} of a pass of {count} shards"
                )));
            }
            shards.push(shard);
        }
    }
    Ok(shards)
}

/// One pass's share of the query's memory pool: reserved whole when the
/// pass starts (half of what the pool has left, half of its limit when it
/// is free), then cut down to what its plans use as soon as it has planned
/// ([`crate::plan::PlanLedger`]), so that the operators around it and the
/// other passes sharing the pool (partitions of one query, or several table
/// functions) get the rest. Passes take their budgets in turn: each starts
/// once the one before it has planned, so the free share it sees is real.
struct PassReservation {
    name: String,
    reservation: std::sync::Mutex<Option<MemoryReservation>>,
    /// The most any plan of the pass uses; `None` before the first plan.
    planned: std::sync::Mutex<Option<usize>>,
    /// Whether this pass still holds the planning turn.
    holds_turn: std::sync::atomic::AtomicBool,
}

/// Whether some pass holds the planning turn, and its waiters.
static PLANNING_TURN: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

fn take_planning_turn() {
    let (held, released) = &PLANNING_TURN;
    let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
    while *held {
        held = released.wait(held).unwrap_or_else(|e| e.into_inner());
    }
    *held = true;
}

fn give_back_planning_turn() {
    let (held, released) = &PLANNING_TURN;
    *held.lock().unwrap_or_else(|e| e.into_inner()) = false;
    released.notify_one();
}

impl PassReservation {
    /// Reserves a pass's budget from `pool` (after the passes before it have
    /// planned): refused only when the budget is below a sixteenth of the
    /// limit, where the pool is mostly taken.
    fn reserve(pool: &Arc<dyn MemoryPool>, name: &str) -> Result<(Arc<PassReservation>, usize)> {
        take_planning_turn();
        let limit = match pool.memory_limit() {
            MemoryLimit::Finite(bytes) => bytes,
            _ => MemoryBudget::DEFAULT.bytes(),
        };
        let free = limit.saturating_sub(pool.reserved());
        let budget = (limit / 2).min(free / 2);
        let reservation = MemoryConsumer::new(name).register(pool);
        let reserved = if budget < limit / 16 {
            Err(DataFusionError::ResourcesExhausted(format!(
                "{name} needs half of what is free in the memory pool, at least a sixteenth of it ({}), and only {} of it are free; raise --memory-limit",
                human_bytes(limit as u64 / 16),
                human_bytes(free as u64)
            )))
        } else {
            reservation.try_grow(budget)
        };
        if let Err(e) = reserved {
            give_back_planning_turn();
            return Err(e);
        }
        let pass = PassReservation {
            name: name.to_owned(),
            reservation: std::sync::Mutex::new(Some(reservation)),
            planned: std::sync::Mutex::new(None),
            holds_turn: std::sync::atomic::AtomicBool::new(true),
        };
        Ok((Arc::new(pass), budget))
    }

    fn give_back_turn(&self) {
        if self.holds_turn.swap(false, Ordering::AcqRel) {
            give_back_planning_turn();
        }
    }

    /// Returns the pass's memory to the pool (the pass ended).
    fn release(&self) {
        self.give_back_turn();
        self.reservation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

impl crate::plan::PlanLedger for PassReservation {
    fn planned(&self, bytes: usize) -> crate::Result<()> {
        let mut planned = self.planned.lock().unwrap_or_else(|e| e.into_inner());
        let most = planned.map_or(bytes, |p| p.max(bytes));
        if let Some(reservation) = self
            .reservation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            reservation.try_resize(most).map_err(|e| {
                HubnormError::Budget(format!(
                    "{}: the query's memory pool cannot hold this pass's plan ({e}); raise --memory-limit",
                    self.name
                ))
            })?;
        }
        *planned = Some(most);
        drop(planned);
        self.give_back_turn();
        Ok(())
    }
}

/// Releases a pass's reservation however the pass ends (a panic too).
struct ReleaseOnDrop(Arc<PassReservation>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl ExecutionPlan for PassExec {
    fn name(&self) -> &str {
        "PassExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.shards]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // One partition per shard already: regrouping the list gains nothing.
        vec![false]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [shards] = <[_; 1]>::try_from(children).map_err(|_| {
            DataFusionError::Internal("PassExec has one child, its shard list".into())
        })?;
        Ok(Arc::new(Self::over(
            self.spec.clone(),
            self.projection.clone(),
            shards,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let shard_list = self.shards.execute(partition, ctx.clone())?;
        // Two batches in flight: the pass waits when the consumer is slower.
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), 2);
        let tx = builder.tx();
        let pool = ctx.memory_pool().clone();
        let spec = self.spec.clone();
        let projection = self.projection.clone();
        let schema = self.schema.clone();
        builder.spawn_blocking(move || {
            let shards = shards_of(shard_list, spec.partitions())?;
            let (reservation, budget) = PassReservation::reserve(&pool, spec.name())?;
            let _release = ReleaseOnDrop(reservation.clone());
            let ledger: Arc<dyn crate::plan::PlanLedger> = reservation;
            for shard in shards {
                let tag = spec.shard_column.then_some(shard as u32);
                let closed = || HubnormError::Interrupted("the query stopped reading".into());
                // `counts` goes on the batch's last row, with the shard columns.
                let deliver = |batch: &RecordBatch, counts: Option<ScreenCounts>| {
                    let mut columns = batch.columns().to_vec();
                    if let Some(tag) = tag {
                        columns.extend(shard_columns(tag, batch.num_rows(), counts));
                    }
                    if let Some(indices) = &projection {
                        columns = indices.iter().map(|&i| columns[i].clone()).collect();
                    }
                    // No column projected (`count(*)`): the rows still count.
                    let rows = datafusion::arrow::array::RecordBatchOptions::new()
                        .with_row_count(Some(batch.num_rows()));
                    let batch = RecordBatch::try_new_with_options(schema.clone(), columns, &rows)?;
                    tx.blocking_send(Ok(batch)).map_err(|_| closed())
                };
                // With shard columns, the shard's last batch waits for the
                // counts, known once the shard has run.
                let mut last: Option<RecordBatch> = None;
                let mut send = |batch: &RecordBatch| match tag {
                    None => deliver(batch, None),
                    Some(_) if batch.num_rows() == 0 => Ok(()),
                    Some(_) => match last.replace(batch.clone()) {
                        Some(earlier) => deliver(&earlier, None),
                        None => Ok(()),
                    },
                };
                let ran = crate::plan::with_ledger(Some(ledger.clone()), || {
                    spec.run(shard, budget, &mut send)
                })
                .and_then(|counts| match &last {
                    Some(batch) => deliver(batch, Some(counts)),
                    None => Ok(()),
                });
                match ran {
                    // A consumer that stopped early (LIMIT) is not an error.
                    Err(HubnormError::Interrupted(_)) if tx.is_closed() => return Ok(()),
                    other => other.map_err(external)?,
                }
            }
            Ok(())
        });
        Ok(builder.build())
    }
}
