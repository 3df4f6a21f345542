//! The SQL face: every hubnorm function in a DataFusion session, and
//! `hubnorm sql`.
//!
//! [`session`] builds the one [`SessionContext`] hubnorm uses, with a memory
//! pool sized from `--memory-limit`, and installs every function of
//! [`catalogue`] through [`register_functions`]:
//! - scalar functions over embeddings and scores ([`scalar`]);
//! - aggregates over long-format similarity or result tables that adapt the
//!   native pass's mergeable statistics ([`aggregate`]);
//! - the two passes as streaming table functions ([`table`]), partitioned
//!   plans that a cluster can run ([`pass`]).
//!
//! [`job`] runs SQL text with a run's inputs and outputs registered as tables.

/// Returns early with a bad-input error (exit code 2): the data handed to a
/// function is wrong, as the native passes would say.
macro_rules! bad_input {
    ($($arg:tt)*) => {
        Err($crate::sql::external($crate::error::HubnormError::Usage(format!($($arg)*))))
    };
}

pub mod aggregate;
pub mod job;
pub mod pass;
pub mod scalar;
pub mod table;

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::catalog::TableFunctionImpl;
use datafusion::common::DataFusionError;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::prelude::{SessionConfig, SessionContext};
use object_store::ObjectStore;

use crate::error::{HubnormError, Result};
use crate::options::{MemoryBudget, PassOptions, ReadOptions};

pub use job::{run_sql, OutputFormat, SqlJob};

/// What a SQL session may use.
#[derive(Debug, Clone, Default)]
pub struct SqlOptions {
    /// The session's memory pool (`--memory-limit`). A table function's pass
    /// reserves half of it as its budget; the rest is for the operators
    /// around it (joins, sorts, aggregates).
    pub memory: MemoryBudget,
    /// Worker threads (0 = one per core): DataFusion's partitions and the passes' rayon pool.
    pub threads: usize,
    /// How the table functions read embedding tables.
    pub read: ReadOptions,
}

impl SqlOptions {
    /// The memory budget of one table function's pass.
    pub fn pass_budget(&self) -> usize {
        self.memory.bytes() / 2
    }

    /// Pass options for a table function.
    pub fn pass_options(&self) -> PassOptions {
        PassOptions {
            read: self.read.clone(),
            memory: MemoryBudget(self.pass_budget()),
            threads: self.threads,
            ..PassOptions::default()
        }
    }

    /// DataFusion's target partitions: one per thread.
    pub(crate) fn partitions(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// The kind of a SQL function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionKind {
    Scalar,
    Aggregate,
    Table,
}

impl FunctionKind {
    pub fn name(self) -> &'static str {
        match self {
            FunctionKind::Scalar => "scalar",
            FunctionKind::Aggregate => "aggregate",
            FunctionKind::Table => "table",
        }
    }
}

/// The one-line SQL documentation of a function (README, `hubnorm sql --functions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionDoc {
    pub name: &'static str,
    pub kind: FunctionKind,
    pub description: &'static str,
    pub syntax: &'static str,
    pub example: &'static str,
}

/// A function and how it is installed.
enum Implementation {
    Scalar(ScalarUDF),
    Aggregate(AggregateUDF),
    Table(Arc<dyn TableFunctionImpl>),
}

impl Implementation {
    fn name(&self) -> String {
        match self {
            Implementation::Scalar(f) => f.name().to_owned(),
            Implementation::Aggregate(f) => f.name().to_owned(),
            Implementation::Table(_) => String::new(),
        }
    }
}

/// Where a session's queries run, which decides how its table functions
/// are installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// In this process: the table functions stream the native passes.
    #[default]
    Local,
    /// On a cluster (`hubnorm sql --cluster`): the scalar and aggregate
    /// functions run on the executors, which install them by name
    /// ([`scalar_functions`], [`aggregate_functions`]); `hubnorm_stats` is
    /// cut into shards of gallery rows, one task each ([`pass`]);
    /// `hubnorm_search` refuses to run (it is not sharded yet).
    Cluster,
}

impl Placement {
    /// `path` as every process of the pass must name it: on a cluster, a
    /// local path made absolute (the executors' working directories are
    /// not the client's); URLs as they are.
    pub(crate) fn path(self, path: String) -> Result<String> {
        if self == Placement::Local || crate::storage::is_url(&path) {
            return Ok(path);
        }
        let absolute =
            std::path::absolute(&path).map_err(|e| HubnormError::io(path.as_str(), e))?;
        absolute
            .to_str()
            .map(str::to_owned)
            .ok_or_else(|| HubnormError::Usage(format!("{path}: the path is not valid UTF-8")))
    }
}

/// Every hubnorm SQL function with its documentation: the single list
/// [`register_functions`] installs.
fn functions(options: &SqlOptions, placement: Placement) -> Vec<(FunctionDoc, Implementation)> {
    let docs = catalogue();
    let mut implementations: Vec<Implementation> = Vec::new();
    implementations.extend(scalar::functions().into_iter().map(Implementation::Scalar));
    implementations.extend(
        aggregate::functions()
            .into_iter()
            .map(Implementation::Aggregate),
    );
    implementations.push(Implementation::Table(Arc::new(table::StatsFunction {
        options: options.clone(),
        placement,
    })));
    implementations.push(Implementation::Table(Arc::new(table::SearchFunction {
        options: options.clone(),
        placement,
    })));
    docs.into_iter().zip(implementations).collect()
}

/// The hubnorm scalar functions (`hub_dot`, ...), for a session built
/// elsewhere: a cluster's scheduler and executors install them beside
/// DataFusion's, so that plans naming them decode there.
pub fn scalar_functions() -> Vec<ScalarUDF> {
    scalar::functions()
}

/// The hubnorm aggregate functions (`hub_is_correction`, ...), for a
/// session built elsewhere (see [`scalar_functions`]).
pub fn aggregate_functions() -> Vec<AggregateUDF> {
    aggregate::functions()
}

/// The documentation of every function, in registration order.
pub fn catalogue() -> Vec<FunctionDoc> {
    use FunctionKind::*;
    let doc = |name, kind, description, syntax, example| FunctionDoc {
        name,
        kind,
        description,
        syntax,
        example,
    };
    vec![
        doc("hub_dot", Scalar,
            "inner product of two embeddings (any list layout; f64 accumulation)",
            "hub_dot(a, b)",
            "SELECT q.id, g.id, hub_dot(q.embedding, g.embedding) FROM queries q CROSS JOIN gallery g"),
        doc("hub_cosine", Scalar,
            "cosine similarity of two embeddings",
            "hub_cosine(a, b)",
            "SELECT hub_cosine(q.embedding, g.embedding) FROM queries q JOIN gallery g ON q.target_id = g.id"),
        doc("hub_l2_normalize", Scalar,
            "the embedding divided by its L2 norm (f32; fixed-size lists stay fixed-size)",
            "hub_l2_normalize(v)",
            "SELECT id, hub_l2_normalize(embedding) AS embedding FROM gallery"),
        doc("hub_corrected_score", Scalar,
            "raw score minus a gallery item's correction h(g): the score is, nnn, csls, dn, dual-is, sn, dbsn and dissim-local rank by",
            "hub_corrected_score(raw_score, correction)",
            "SELECT r.query_id, r.gallery_id, hub_corrected_score(r.raw_score, s.\"is_beta20_correction\") FROM results r JOIN gallery_stats s USING (gallery_id)"),
        doc("hub_is_correction", Aggregate,
            "inverted-softmax correction h(g) = log Σ exp(β·s) / β over a group's scores (a constant β)",
            "hub_is_correction(score, beta)",
            "SELECT gallery_id, hub_is_correction(score, 20.0) FROM bank_sims GROUP BY gallery_id"),
        doc("hub_topk_mean", Aggregate,
            "mean of a group's k largest scores: the NNN/CSLS statistic (a constant k)",
            "hub_topk_mean(score, k)",
            "SELECT gallery_id, 0.75 * hub_topk_mean(score, 128) AS nnn_correction FROM bank_sims GROUP BY gallery_id"),
        doc("hub_hubness", Aggregate,
            "a hubness measure of REPORTS.md (skewness, kurtosis, max, antihub_rate, hub_occurrence, hub_occurrence_relative, robin_hood, gini, atkinson, groupie_ratio) from result rows; never-retrieved items count as 0",
            "hub_hubness(gallery_id, measure, k, gallery_size)",
            "SELECT method, hub_hubness(gallery_id, 'skewness', 10, 600) FROM results WHERE rank <= 10 GROUP BY method"),
        doc("hub_moments", Aggregate,
            "the mean row and covariance (and second moment C = Σ + m mᵀ, row-major d × d lists) of a group's embeddings, in f64: mp's statistic",
            "hub_moments(embedding)",
            "SELECT hub_moments(hub_l2_normalize(embedding))['mean'] FROM bank"),
        doc("hubnorm_stats", Table,
            "pass 1 as a streaming table: gallery_stats rows (gallery_id, corrections, mergeable states); parameters 'beta=30,nnn.k=64'",
            "hubnorm_stats(gallery, bank, methods [, parameters [, gallery_bank]])",
            "SELECT * FROM hubnorm_stats('gallery/', 'bank/', 'is,nnn', 'beta=30')"),
        doc("hubnorm_search", Table,
            "pass 2 as a streaming table: corrected top-k rows (method, query_id, rank, gallery_id, score, raw_score)",
            "hubnorm_search(queries, gallery, stats, method [, k [, parameters]])",
            "SELECT * FROM hubnorm_search('queries/', 'gallery/', 'gallery_stats.parquet', 'is', 10)"),
    ]
}

/// Installs every hubnorm function into `ctx`, for queries that run in
/// this process. Refuses (and installs nothing) when a name would be
/// registered twice or would replace a function the session already has.
pub fn register_functions(ctx: &SessionContext, options: &SqlOptions) -> Result<()> {
    register_functions_for(ctx, options, Placement::Local)
}

/// Installs every hubnorm function into `ctx`, for queries that run where
/// `placement` says (see [`register_functions`]).
pub fn register_functions_for(
    ctx: &SessionContext,
    options: &SqlOptions,
    placement: Placement,
) -> Result<()> {
    let functions = functions(options, placement);
    let state = ctx.state();
    let mut seen = HashSet::new();
    for (doc, implementation) in &functions {
        let implemented = implementation.name();
        if !implemented.is_empty() && implemented != doc.name {
            return Err(HubnormError::Internal(format!(
                "SQL catalogue out of order: {} documented where {implemented} is implemented",
                doc.name
            )));
        }
        let taken = state.scalar_functions().contains_key(doc.name)
            || state.aggregate_functions().contains_key(doc.name)
            || state.window_functions().contains_key(doc.name)
            || state.table_functions().contains_key(doc.name);
        if !seen.insert(doc.name) || taken {
            return Err(HubnormError::Internal(format!(
                "SQL function {} would be registered twice",
                doc.name
            )));
        }
    }
    for (doc, implementation) in functions {
        match implementation {
            Implementation::Scalar(f) => ctx.register_udf(f),
            Implementation::Aggregate(f) => ctx.register_udaf(f),
            Implementation::Table(f) => ctx.register_udtf(doc.name, f),
        }
    }
    Ok(())
}

/// The session hubnorm runs SQL in: a memory pool of `options.memory`,
/// one partition per thread, and every hubnorm function.
pub fn session(options: &SqlOptions) -> Result<SessionContext> {
    let runtime = runtime_env(options)?;
    let config = SessionConfig::new()
        .with_target_partitions(options.partitions())
        .with_information_schema(true);
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    register_functions(&ctx, options)?;
    Ok(ctx)
}

/// The runtime of a session in this process: a memory pool of
/// `options.memory`, and hubnorm's object stores.
pub(crate) fn runtime_env(options: &SqlOptions) -> Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new()
        .with_memory_limit(options.memory.bytes(), 1.0)
        .with_object_store_registry(Arc::new(StoreRegistry::default()))
        .build_arc()
        .map_err(|e| sql_error(e, None))
}

/// The session's object stores: those registered with it (local files
/// among them), and for any other URL the store the native passes use,
/// built on demand from the URL, the environment and `--storage-option`s
/// ([`crate::storage`]), so `--table NAME=s3://...` and `COPY ... TO
/// 's3://...'` reach the same stores as `hubnorm run`.
#[derive(Debug, Default)]
pub(crate) struct StoreRegistry {
    registered: DefaultObjectStoreRegistry,
}

impl ObjectStoreRegistry for StoreRegistry {
    fn register_store(
        &self,
        url: &url::Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.registered.register_store(url, store)
    }

    fn deregister_store(&self, url: &url::Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        self.registered.deregister_store(url)
    }

    fn get_store(&self, url: &url::Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.registered.get_store(url) {
            return Ok(store);
        }
        crate::storage::store_for_url(url).map_err(external)
    }
}

/// A hubnorm error as DataFusion carries it: kept whole, so that a local
/// query hands it back as it was ([`sql_error`]), under a context line
/// that carries its message and exit code as text, which is all that
/// crosses a cluster ([`HubnormError::carried`]).
pub(crate) fn external(e: HubnormError) -> DataFusionError {
    DataFusionError::Context(
        e.carried(),
        Box::new(DataFusionError::External(Box::new(e))),
    )
}

/// A DataFusion error as a hubnorm error: a hubnorm error inside is
/// returned as it was; planning errors (bad SQL, unknown table or column)
/// are usage errors (exit code 2), the others failures (1). `source` names
/// the SQL file in the message.
pub fn sql_error(e: DataFusionError, source: Option<&std::path::Path>) -> HubnormError {
    if matches!(e.find_root(), DataFusionError::External(inner) if inner.is::<HubnormError>()) {
        return unwrap_nested(e);
    }
    // A hubnorm error from a cluster's executor arrives as text.
    if let Some(carried) = HubnormError::from_carried(&e.to_string()) {
        return carried;
    }
    let usage = matches!(
        e.find_root(),
        DataFusionError::SQL(..)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_)
            | DataFusionError::Configuration(_)
    );
    let prefix = source
        .map(|p| format!("{}: ", p.display()))
        .unwrap_or_default();
    HubnormError::Sql {
        // DataFusion repeats table names and locations as they were typed.
        message: crate::storage::redact(&format!("{prefix}{e}")),
        exit_code: if usage { 2 } else { 1 },
    }
}

/// The hubnorm error at the root of a chain of DataFusion contexts; where
/// a layer kept only its text (an Arrow error around it, a shared one), the
/// error that text carries.
fn unwrap_nested(e: DataFusionError) -> HubnormError {
    let as_text = |text: String| {
        HubnormError::from_carried(&text).unwrap_or(HubnormError::Sql {
            message: text,
            exit_code: 1,
        })
    };
    match e {
        DataFusionError::Context(_, inner) => unwrap_nested(*inner),
        DataFusionError::Diagnostic(_, inner) => unwrap_nested(*inner),
        DataFusionError::Shared(inner) => match Arc::try_unwrap(inner) {
            Ok(inner) => unwrap_nested(inner),
            Err(shared) => as_text(shared.to_string()),
        },
        DataFusionError::External(inner) => match inner.downcast::<HubnormError>() {
            Ok(e) => *e,
            Err(other) => as_text(other.to_string()),
        },
        other => as_text(other.to_string()),
    }
}
