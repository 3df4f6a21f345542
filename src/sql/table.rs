//! The two passes as streaming SQL table functions:
//!
//! ```sql
//! SELECT * FROM hubnorm_stats('gallery/', 'bank/', 'is,nnn', 'beta=30,nnn.k=64');
//! SELECT * FROM hubnorm_search('queries/', 'gallery/', 'gallery_stats.parquet', 'is', 10);
//! ```
//!
//! Each is a [`StreamingTable`] over one [`PartitionStream`] that runs the
//! native pass on a blocking thread and hands its record batches over a
//! bounded channel as they are made (a finished gallery chunk for stats, a
//! query block for search), so they compose with joins, filters, `LIMIT`
//! and `COPY ... TO`. Before starting, the pass reserves its memory budget
//! from the session's memory pool and runs within it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::streaming::PartitionStream;

use crate::error::HubnormError;
use crate::options::{MemoryBudget, MethodKind, MethodSpec, PassOptions};
use crate::pipeline::{self, SearchJob, StatsJob};
use crate::progress::Silent;
use crate::stats_file::StatsSink;

use super::{external, SqlOptions};

/// Which pass a table function runs.
#[derive(Debug, Clone)]
enum Pass {
    Stats(StatsJob),
    Search(SearchJob),
}

impl Pass {
    fn name(&self) -> &'static str {
        match self {
            Pass::Stats(_) => "hubnorm_stats",
            Pass::Search(_) => "hubnorm_search",
        }
    }

    fn options_mut(&mut self) -> &mut PassOptions {
        match self {
            Pass::Stats(job) => &mut job.options,
            Pass::Search(job) => &mut job.options,
        }
    }
}

/// One pass as a partition stream.
#[derive(Debug)]
struct PassStream {
    schema: SchemaRef,
    pass: Pass,
    /// Bytes reserved from the session's pool, and the pass's budget.
    budget: usize,
}

/// Scratch files of streamed stats passes get distinct names.
static SPOOLS: AtomicUsize = AtomicUsize::new(0);

impl PartitionStream for PassStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        // Two batches in flight: the pass waits when the consumer is slower.
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), 2);
        let tx = builder.tx();
        let pool = ctx.memory_pool().clone();
        let mut pass = self.pass.clone();
        let budget = self.budget;
        builder.spawn_blocking(move || {
            let reservation = MemoryConsumer::new(pass.name()).register(&pool);
            reservation.try_grow(budget)?;
            pass.options_mut().memory = MemoryBudget(budget);
            let closed = || HubnormError::Interrupted("the query stopped reading".into());
            let mut send =
                |batch: &RecordBatch| tx.blocking_send(Ok(batch.clone())).map_err(|_| closed());
            let outcome = match &pass {
                Pass::Stats(job) => {
                    let spool = std::env::temp_dir().join(format!(
                        "hubnorm-sql-{}-{}.spool",
                        std::process::id(),
                        SPOOLS.fetch_add(1, Ordering::Relaxed)
                    ));
                    let mut sink = ChannelSink { send: &mut send };
                    pipeline::stream_stats(job, &spool, &Silent, &mut sink)
                }
                Pass::Search(job) => pipeline::stream_search(job, &Silent, &mut send),
            };
            match outcome {
                // A consumer that stopped early (LIMIT) is not an error.
                Err(HubnormError::Interrupted(_)) if tx.is_closed() => Ok(()),
                other => other.map_err(external),
            }
        });
        builder.build()
    }
}

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

fn provider(schema: SchemaRef, pass: Pass, options: &SqlOptions) -> Result<Arc<dyn TableProvider>> {
    let stream = PassStream {
        schema: schema.clone(),
        pass,
        budget: options.pass_budget(),
    };
    Ok(Arc::new(StreamingTable::try_new(
        schema,
        vec![Arc::new(stream)],
    )?))
}

// ------------------------------------------------------------------ arguments

fn literal<'a>(function: &str, args: &'a [Expr], i: usize, what: &str) -> Result<&'a ScalarValue> {
    match args.get(i) {
        Some(Expr::Literal(value, _)) if !value.is_null() => Ok(value),
        Some(other) => plan_err!(
            "{function}: argument {} ({what}) must be a literal, got {other}",
            i + 1
        ),
        None => plan_err!("{function}: argument {} ({what}) is missing", i + 1),
    }
}

fn text(function: &str, args: &[Expr], i: usize, what: &str) -> Result<String> {
    match literal(function, args, i, what)? {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Ok(s.clone()),
        other => plan_err!(
            "{function}: argument {} ({what}) must be a string, got {other}",
            i + 1
        ),
    }
}

fn whole_number(function: &str, args: &[Expr], i: usize, what: &str) -> Result<usize> {
    let value = literal(function, args, i, what)?;
    match value.cast_to(&datafusion::arrow::datatypes::DataType::Int64)? {
        ScalarValue::Int64(Some(v)) if v >= 1 => Ok(v as usize),
        _ => plan_err!(
            "{function}: argument {} ({what}) must be a whole number ≥ 1, got {value}",
            i + 1
        ),
    }
}

/// Methods named `"is,nnn"` with parameters `"beta=30,nnn.k=64"`: a bare
/// name applies to every listed method that has it, `method.name` to one.
pub fn parse_methods(methods: &str, parameters: &str) -> crate::Result<Vec<MethodSpec>> {
    let mut assignments: Vec<(Option<MethodKind>, String, f64)> = Vec::new();
    for item in parameters
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| HubnormError::Usage(format!("parameter '{item}' is not NAME=VALUE")))?;
        let value: f64 = value.trim().parse().map_err(|_| {
            HubnormError::Usage(format!("parameter '{item}': '{value}' is not a number"))
        })?;
        let (kind, name) = match name.trim().split_once('.') {
            Some((method, name)) => (Some(method.parse::<MethodKind>()?), name.to_owned()),
            None => (None, name.trim().to_owned()),
        };
        assignments.push((kind, name, value));
    }
    let kinds: Vec<MethodKind> = methods
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<crate::Result<_>>()?;
    if kinds.is_empty() {
        return Err(HubnormError::Usage("no method named".into()));
    }
    let mut used = vec![false; assignments.len()];
    let mut specs = Vec::new();
    for kind in kinds {
        let known: Vec<&str> = MethodSpec::from_kind(kind, &Default::default())
            .parameters()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let mut own = Vec::new();
        for (i, (target, name, value)) in assignments.iter().enumerate() {
            let applies = match target {
                Some(t) => *t == kind,
                None => known.contains(&name.as_str()),
            };
            if applies {
                own.push((name.clone(), *value));
                used[i] = true;
            }
        }
        let spec = MethodSpec::with_parameters(kind, &own)?;
        spec.validate()?;
        specs.push(spec);
    }
    if let Some(i) = used.iter().position(|u| !u) {
        let (_, name, _) = &assignments[i];
        return Err(HubnormError::Usage(format!(
            "parameter '{name}' belongs to none of the methods '{methods}'"
        )));
    }
    Ok(specs)
}

/// `hubnorm_stats(gallery, bank, methods [, parameters [, gallery_bank]])`.
#[derive(Debug)]
pub(super) struct StatsFunction {
    pub options: SqlOptions,
}

impl TableFunctionImpl for StatsFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        const NAME: &str = "hubnorm_stats";
        if !(3..=5).contains(&args.len()) {
            return plan_err!(
                "{NAME}(gallery, bank, methods [, parameters [, gallery_bank]]) takes 3 to 5 arguments, got {}",
                args.len()
            );
        }
        let parameters = if args.len() > 3 {
            text(NAME, args, 3, "parameters")?
        } else {
            String::new()
        };
        let methods =
            parse_methods(&text(NAME, args, 2, "methods")?, &parameters).map_err(external)?;
        let job = StatsJob {
            gallery: text(NAME, args, 0, "gallery")?,
            bank: text(NAME, args, 1, "bank")?,
            gallery_bank: if args.len() > 4 {
                Some(text(NAME, args, 4, "gallery_bank")?)
            } else {
                None
            },
            bank_sample: None,
            methods,
            out: PathBuf::new(),
            overwrite: false,
            options: self.options.pass_options(),
            checkpoint: Default::default(),
        };
        let schema = pipeline::stats_schema(&job).map_err(external)?;
        provider(schema, Pass::Stats(job), &self.options)
    }
}

/// `hubnorm_search(queries, gallery, stats, method [, k [, parameters]])`.
#[derive(Debug)]
pub(super) struct SearchFunction {
    pub options: SqlOptions,
}

impl TableFunctionImpl for SearchFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        const NAME: &str = "hubnorm_search";
        if !(4..=6).contains(&args.len()) {
            return plan_err!(
                "{NAME}(queries, gallery, stats, method [, k [, parameters]]) takes 4 to 6 arguments, got {}",
                args.len()
            );
        }
        let k = if args.len() > 4 {
            whole_number(NAME, args, 4, "k")?
        } else {
            10
        };
        let stats = text(NAME, args, 2, "stats")?;
        let methods_arg = text(NAME, args, 3, "method")?;
        let methods = if args.len() > 5 {
            parse_methods(&methods_arg, &text(NAME, args, 5, "parameters")?).map_err(external)?
        } else {
            // Without parameters, take the statistic the stats file holds
            // (as `hubnorm search` does).
            methods_from_stats_file(&methods_arg, &stats).map_err(external)?
        };
        let job = SearchJob {
            queries: text(NAME, args, 0, "queries")?,
            gallery: text(NAME, args, 1, "gallery")?,
            stats: (!stats.is_empty()).then(|| PathBuf::from(&stats)),
            methods,
            k,
            out: PathBuf::new(),
            overwrite: false,
            options: self.options.pass_options(),
        };
        let schema = pipeline::search_schema(&job).map_err(external)?;
        provider(schema, Pass::Search(job), &self.options)
    }
}

/// Each named method with the parameters the stats file holds for it (the
/// defaults when the file holds none or several).
fn methods_from_stats_file(methods: &str, stats: &str) -> crate::Result<Vec<MethodSpec>> {
    let defaults = parse_methods(methods, "")?;
    let in_file = if stats.is_empty() {
        Vec::new()
    } else {
        pipeline::stats_file_methods(std::path::Path::new(stats))?
    };
    Ok(defaults
        .into_iter()
        .map(|spec| {
            let same: Vec<&MethodSpec> =
                in_file.iter().filter(|m| m.kind() == spec.kind()).collect();
            match same.as_slice() {
                [only] => **only,
                _ => spec,
            }
        })
        .collect())
}

/// A table function that runs on one machine only, installed under its name
/// in a cluster session ([`super::Placement::Cluster`]) so that calling it
/// is refused with the reason (exit code 2) instead of running it in the
/// client or failing as an unknown function.
#[derive(Debug)]
pub(super) struct LocalOnly {
    pub name: &'static str,
}

impl TableFunctionImpl for LocalOnly {
    fn call(&self, _: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        Err(external(HubnormError::Usage(format!(
            "{} runs on one machine only for now: its pass cannot be sent to a cluster yet; run this query without --cluster",
            self.name
        ))))
    }
}
