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

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::HubnormError;
use crate::inputs::open_table;
use crate::kernel::ScreenCounts;
use crate::options::{BankSample, MemoryBudget, MethodSpec, PassOptions, Precision, ReadOptions};
use crate::pipeline::{self, ProtocolBank, SearchJob, StatsJob};
use crate::progress::Silent;
use crate::query::results::{rows_schema, ResultRows};
use crate::source::IdKind;
use crate::stats_file::{methods_from_json, methods_json, StatsSink};

use super::Placement;

mod plan;
mod snapshot;
pub use plan::{PassExec, PassTable};
pub use snapshot::{ClusterInputs, InputSnapshot};

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
    /// The paths of the embedding tables among [`PassInputs::tables`]
    /// (not a stats file), to pin.
    fn embedding_tables_mut(&mut self) -> Vec<&mut String> {
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
            } => [Some(gallery), Some(bank), gallery_bank.as_mut()]
                .into_iter()
                .flatten()
                .collect(),
            PassInputs::Search {
                queries,
                gallery,
                protocol_bank,
                ..
            } => [
                Some(queries),
                Some(gallery),
                protocol_bank.as_mut().map(|p| &mut p.bank),
            ]
            .into_iter()
            .flatten()
            .collect(),
        }
    }

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
                protocol_bank,
                ..
            } => {
                tables.push(("queries", queries.as_str()));
                tables.push(("gallery", gallery.as_str()));
                tables.extend(stats.as_deref().map(|s| ("stats", s)));
                tables.extend(protocol_bank.as_ref().map(|p| ("bank", p.bank.as_str())));
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
    /// The input files as the client checked them, for a cluster's tasks
    /// to check ([`PassSpec::for_cluster`]); empty on one machine.
    #[serde(default)]
    pub snapshots: Vec<InputSnapshot>,
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
            .filter(|m| m.method().single_query(m).is_none())
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
            snapshots: Vec::new(),
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
            snapshots: Vec::new(),
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
            snapshots: Vec::new(),
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

    /// This spec with its local paths made absolute (see
    /// [`PassSpec::for_cluster`]).
    fn with_absolute_paths(mut self) -> crate::Result<Self> {
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
        // Before and after its rows: the input it read was the client's.
        self.check_inputs_unchanged()?;
        let screen = self
            .run_partition(partition, budget, emit)
            .map_err(|e| match e {
                // The limit a pass names is its task's, not a flag's value.
                HubnormError::Budget(message) => HubnormError::Budget(format!(
                    "{message} (the --memory-limit here is this task's budget, {}: half of its share of the process's --memory-limit, an executor's shared among its task slots)",
                    crate::options::human_bytes(budget as u64)
                )),
                e => e,
            })?;
        self.check_inputs_unchanged()?;
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
