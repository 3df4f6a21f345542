//! Command-line arguments (clap derive; the doc comments are the help text)
//! and their conversion into library options.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};
use hubnorm::method::names_where;
use hubnorm::options::{
    BankSample, MemoryBudget, MethodKind, MethodParams, MethodSpec, PassOptions, Precision,
    ReadOptions,
};
use hubnorm::report::QualityOptions;

/// Hubness reduction for embedding retrieval: querybank normalisation as a
/// streaming job over Parquet.
///
/// Exit codes: 0 success, 1 internal or I/O failure, 2 bad input or usage, 130 stopped by Ctrl-C or SIGTERM.
#[derive(Debug, Parser)]
#[command(name = "hubnorm", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// An option of the object stores PATHs may name (s3://, gs://, az://,
    /// http(s)://), beside their standard environment (AWS_*, GOOGLE_*,
    /// AZURE_*): KEY=VALUE, repeatable, e.g. aws_endpoint=http://127.0.0.1:9000,
    /// aws_allow_http=true, retry_timeout=30s, max_retries=3.
    #[arg(long = "storage-option", value_name = "KEY=VALUE", global = true)]
    pub storage_options: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Both passes: bank statistics, then corrected top-k search, plus a summary.
    Run(RunArgs),
    /// Pass 1: per-gallery statistics from the query bank (gallery_stats.parquet).
    Stats(StatsArgs),
    /// Pass 2: corrected top-k search with statistics from `hubnorm stats`.
    Search(SearchArgs),
    /// Every method (or a list) on the same data in one table: quality with
    /// bootstrap intervals, hubness, and the change from the baseline.
    Compare(CompareArgs),
    /// Hubness (and, with ground truth, R@K) report of any results file.
    Report(ReportArgs),
    /// Choose hyperparameters by grid search on a validation split (never
    /// the test queries); writes a config `run --config` accepts.
    Tune(TuneArgs),
    /// Write gallery vectors with the correction h(g) appended (d + 1 values),
    /// so any inner-product index serves corrected results (queries get −1 appended).
    Export(ExportArgs),
    /// Run SQL over Parquet tables and a run's inputs and outputs, with every
    /// hubnorm function (hub_* UDFs and UDAFs, hubnorm_stats/hubnorm_search
    /// table functions) installed.
    Sql(SqlArgs),
    /// Measure kernel and pass throughput on generated data.
    Bench(crate::bench::BenchArgs),
    /// Run a process of an Apache DataFusion Ballista cluster with every
    /// hubnorm function: a scheduler, or an executor (feature `cluster`).
    Cluster(ClusterArgs),
}

/// `hubnorm cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub role: ClusterRole,
}

/// The processes of a cluster. Both log to stderr (RUST_LOG=warn|info|debug
/// or directives such as warn,hubnorm=info; default info) and stop on
/// SIGINT or SIGTERM with exit code 0. Ballista has no authentication: keep
/// their ports reachable only from a trusted network.
#[derive(Debug, Subcommand)]
pub enum ClusterRole {
    /// The scheduler: plans the queries clients send (`hubnorm sql --cluster
    /// df://HOST:PORT`) and hands their tasks to executors.
    Scheduler(SchedulerArgs),
    /// An executor: registers with the scheduler, runs tasks, and serves
    /// their results over Arrow Flight.
    Executor(ExecutorArgs),
}

/// `hubnorm cluster scheduler`.
#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Address to listen on (gRPC, and /healthz and /readyz over HTTP); port
    /// 0 takes a free port, printed at start-up. Another address than
    /// 127.0.0.1 makes the scheduler reachable from other machines.
    #[arg(long, default_value = "127.0.0.1:50050")]
    pub bind: std::net::SocketAddr,
    /// Seconds without a heartbeat after which an executor counts as lost
    /// and its tasks run again on the others (executors heartbeat at least
    /// every 5 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub executor_timeout: u64,
}

/// `hubnorm cluster executor`.
#[derive(Debug, Args)]
pub struct ExecutorArgs {
    /// The scheduler: HOST:PORT (or df://HOST:PORT).
    #[arg(long, value_name = "HOST:PORT")]
    pub scheduler: String,
    /// Address of the executor's Arrow Flight service, from which clients
    /// and other executors fetch results; port 0 takes a free port. On
    /// several machines, an address they can reach.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub bind: std::net::SocketAddr,
    /// Task slots: tasks run at once, each on one thread (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Memory pool shared by the running tasks, e.g. 2GiB.
    #[arg(long, default_value = "2GiB", value_parser = parse_memory)]
    pub memory_limit: MemoryBudget,
    /// Shuffle and result files, and spills (default: a fresh folder under
    /// the system's temporary directory, removed at exit).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

/// Column names, normalisation, memory and threads.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Name of the id column (strings, or integers that fit Int64; plain or dictionary-encoded).
    #[arg(long, default_value = "id")]
    pub id_column: String,
    /// Name of the embedding column (FixedSizeList, List or LargeList of Float16/32/64).
    #[arg(long, default_value = "embedding")]
    pub embedding_column: String,
    /// Name of the ground-truth column of the queries (a gallery id or a
    /// list of them) [default: target_id, read when present]. A column named
    /// here must be there.
    #[arg(long, value_name = "TARGET_COLUMN")]
    pub target_column: Option<String>,
    /// Keep raw dot products instead of L2-normalising every row (cosine).
    #[arg(long)]
    pub no_normalize: bool,
    /// Peak memory to stay within, e.g. 256MiB or 2GiB. Block sizes follow from it.
    #[arg(long, default_value = "2GiB", value_parser = parse_memory)]
    pub memory_limit: MemoryBudget,
    /// Worker threads (0 = one per core). A table streamed block by block is
    /// read on one more thread while they work. Results do not depend on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// How the tabular outputs are written.
#[derive(Debug, Clone, Args)]
pub struct TableArgs {
    /// Tabular outputs as Parquet files, or as Delta Lake tables (feature
    /// `delta`): a folder with `_delta_log/` at each output's path, every
    /// write one atomic commit (a new table, or a new version with
    /// --overwrite or --append).
    #[arg(long, default_value = "parquet", value_parser = ["parquet", "delta"])]
    pub format: String,
    /// With --format delta: add the rows to existing tables as a new version
    /// (without it, an existing table is refused; --overwrite replaces its rows).
    #[arg(long, conflicts_with = "overwrite")]
    pub append: bool,
}

impl TableArgs {
    /// The format `--format` and `--append` name.
    pub fn format(&self) -> hubnorm::Result<hubnorm::sink::TableFormat> {
        hubnorm::sink::TableFormat::new(&self.format, self.append)
    }

    /// Declares `outputs` in that format for this process. Returns whether
    /// existing outputs may be written to (`--overwrite`, or a new version
    /// by `--append`).
    pub fn apply(&self, outputs: Vec<PathBuf>, overwrite: bool) -> hubnorm::Result<bool> {
        Ok(self.format()?.declare(outputs, overwrite)?.for_process())
    }
}

/// Which methods, and their hyperparameters (defaults as in METHODS.md
/// where it gives them).
#[derive(Debug, Clone, Args)]
pub struct MethodArgs {
    /// One method by name (every method is listed in docs/methods.md).
    #[arg(long, conflicts_with = "methods")]
    pub method: Option<String>,
    /// Methods and parameters from a JSON config (e.g. `hubnorm tune`'s
    /// tuned.json: {"methods": [{"method": "is", "parameters": {"beta": 30}}]}).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["method", "methods"])]
    pub config: Option<PathBuf>,
    /// Several methods, comma separated, computed together: in one read of
    /// each input (e.g. is,dis,nnn,csls).
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// The parameter flags of every registered method (`--beta`, `--nnn-k`, ...).
    #[command(flatten)]
    pub parameters: ParameterFlags,
    #[arg(long, help = tol_help())]
    pub tol: Option<f64>,
}

/// How quality and hubness are reported.
#[derive(Debug, Clone, Args)]
pub struct QualityArgs {
    /// The K of R@K, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    pub recall_at: Vec<usize>,
    /// Bootstrap resamples over queries for the 95% intervals of R@K (0 = none).
    #[arg(long, default_value_t = 1000)]
    pub bootstrap: usize,
    /// Seed of the bootstrap resamples.
    #[arg(long, default_value_t = 0)]
    pub bootstrap_seed: u64,
    /// Skip (and count) queries none of whose targets is in the gallery,
    /// instead of refusing them.
    #[arg(long)]
    pub skip_missing: bool,
}

/// How the passes compute similarities (commands that compute them).
#[derive(Debug, Clone, Args)]
pub struct PrecisionArgs {
    #[arg(long, default_value = "exact", value_parser = parse_precision, help = precision_help())]
    pub precision: Precision,
}

// Help texts that name methods by a property are built from the registry,
// so that a new method appears in them without an edit here.

fn tol_help() -> String {
    format!(
        "{}: stop iterating once every row of the plan sums to 1/|B| within this relative error \
         (the columns are exact after each iteration)",
        names_where(|m| m.method().sinkhorn(m).is_some())
    )
}

fn precision_help() -> String {
    format!(
        "How similarities are computed: exact (f32 tiles), screened (a bf16 screen, re-scoring \
         in f32 every item it cannot rule out: the same lists and scores; needs AVX512_BF16; for \
         searches of methods scoring s − h(g) and pass 1's top-k statistics: {}), or auto \
         (screened where the CPU and methods allow). docs/precision.md",
        names_where(MethodSpec::screens_bank_pass)
    )
}

fn gallery_bank_help() -> String {
    format!(
        "Gallery bank: items of the gallery modality from the training split (needed by {}; \
         used by {} when given)",
        names_where(|m| m.kind().needs_gallery_bank()),
        names_where(|m| m.kind().uses_gallery_bank() && !m.kind().needs_gallery_bank()),
    )
}

fn transductive_help() -> String {
    format!(
        "Use the test queries themselves as the bank ({}). This PEEKS AT THE TEST SET: legitimate \
         only for offline re-ranking of a query set known in advance (e.g. a query log), never for \
         evaluating a deployable system",
        names_where(|m| m.kind().takes_queries_as_bank())
    )
}

/// `stats --update`'s help, naming the methods whose statistics merge.
fn update_help() -> String {
    let merging: Vec<&str> = hubnorm::method::REGISTRY
        .iter()
        .filter(|m| m.mergeable())
        .map(|m| m.name())
        .collect();
    format!(
        "Merge new gallery and bank parts into the existing --out file instead of recomputing \
         (its methods are kept; {} merge, the others are recomputed in full)",
        merging.join(", ")
    )
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    s.parse().map_err(|e: hubnorm::HubnormError| e.to_string())
}

impl PrecisionArgs {
    /// This choice applied to `options`.
    pub fn apply(&self, mut options: PassOptions) -> PassOptions {
        options.precision = self.precision;
        options
    }
}

impl QualityArgs {
    /// These choices applied to `options`.
    pub fn apply(&self, mut options: PassOptions) -> hubnorm::Result<PassOptions> {
        if self.recall_at.contains(&0) {
            return Err(hubnorm::HubnormError::Usage(
                "--recall-at values must be at least 1".into(),
            ));
        }
        options.read.skip_missing_targets = self.skip_missing;
        options.report.quality = QualityOptions {
            recall_at: self.recall_at.clone(),
            bootstrap: self.bootstrap,
            seed: self.bootstrap_seed,
        };
        Ok(options)
    }
}

/// The banks of pass 1 besides the query bank.
#[derive(Debug, Clone, Args)]
pub struct BankArgs {
    #[arg(long, help = gallery_bank_help())]
    pub gallery_bank: Option<String>,
    /// Use a seeded uniform sample of N rows of each bank (e.g. to make gc fit).
    #[arg(long, value_name = "N")]
    pub bank_sample: Option<u64>,
    /// Seed of --bank-sample and of sinkhorn-pp's pseudo-test set.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl BankArgs {
    /// The bank sample asked for; without `--bank-sample`, a sample of
    /// every row that only carries the seed (for sinkhorn-pp).
    pub fn sample(&self) -> Option<BankSample> {
        match (self.bank_sample, self.seed) {
            (Some(rows), seed) => Some(BankSample { rows, seed }),
            (None, 0) => None,
            (None, seed) => Some(BankSample {
                rows: u64::MAX,
                seed,
            }),
        }
    }
}

#[derive(Debug, Args)]
// One bank source: a bank, or the queries themselves (--transductive).
#[command(group(ArgGroup::new("bank_source").required(true).args(["bank", "transductive"])))]
pub struct RunArgs {
    /// Test queries: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub queries: String,
    /// Gallery to search: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub gallery: String,
    /// Query bank (training-split queries, never the test queries).
    #[arg(long)]
    pub bank: Option<String>,
    #[arg(long, help = transductive_help())]
    pub transductive: bool,
    #[command(flatten)]
    pub banks: BankArgs,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Results per query.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    #[command(flatten)]
    pub quality: QualityArgs,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    /// Replace outputs that already exist.
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub table: TableArgs,
    /// Output directory (results.parquet, gallery_stats.parquet, summary.json;
    /// compare adds compare.parquet, compare.md, report.parquet and
    /// gallery_report.parquet).
    #[arg(long)]
    pub out: PathBuf,
    /// Continue an interrupted run from its checkpoint (OUT/run.checkpoint/):
    /// finished gallery chunks, Sinkhorn iterations and query blocks are
    /// kept, the rest is computed. The inputs and options must be the same;
    /// starts afresh when there is no checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Save finished work to OUT/run.checkpoint/ at most every SECONDS (0:
    /// after every chunk, iteration and query block; the folder is removed
    /// once the outputs are written).
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub checkpoint_interval: f64,
    /// Write no checkpoint.
    #[arg(long, conflicts_with_all = ["resume", "checkpoint_interval"])]
    pub no_checkpoint: bool,
    #[command(flatten)]
    pub cluster: ClusterJobArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Gallery: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub gallery: String,
    /// Query bank (training-split queries).
    #[arg(long)]
    pub bank: String,
    #[command(flatten)]
    pub banks: BankArgs,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Replace the output if it exists.
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub table: TableArgs,
    // Help from the registry: which methods merge is each method's to say.
    #[arg(long, conflicts_with = "overwrite", help = update_help())]
    pub update: bool,
    /// Continue an interrupted run from its checkpoint (OUT.checkpoint/):
    /// finished gallery chunks are kept, the rest is computed. The inputs and
    /// options must be the same; starts afresh when there is no checkpoint.
    #[arg(long, conflicts_with = "update")]
    pub resume: bool,
    /// Save finished gallery chunks to OUT.checkpoint/ at most every SECONDS
    /// (0: after every chunk; the folder is removed once OUT is written).
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub checkpoint_interval: f64,
    /// Write no checkpoint.
    #[arg(long, conflicts_with_all = ["resume", "checkpoint_interval"])]
    pub no_checkpoint: bool,
    /// Output file (gallery_stats.parquet).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    #[command(flatten)]
    pub cluster: ClusterJobArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Running a pass on a cluster instead of this process.
#[derive(Debug, Clone, Args)]
pub struct ClusterJobArgs {
    /// Compute the pass on a cluster (`hubnorm cluster scheduler` and
    /// executors) instead of this process; the output is written here, the
    /// same file bit for bit (sn and dbsn, run as T + 1 sharded rounds:
    /// potentials within 1e-6). Inputs must be readable from every executor
    /// (shared storage or URLs).
    #[arg(long, value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
    /// With --cluster: shards, one task each: of gallery rows for stats
    /// (each reads the banks once), of query rows for search (each reads
    /// the gallery once). More shards than executor slots balance the load.
    #[arg(long, default_value_t = 16, requires = "cluster", value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: u32,
}

impl ClusterJobArgs {
    /// The cluster to run on, when one is named.
    pub fn job(&self) -> Option<hubnorm::options::ClusterJob> {
        self.cluster
            .as_ref()
            .map(|scheduler| hubnorm::options::ClusterJob {
                scheduler: scheduler.clone(),
                shards: self.shards as usize,
            })
    }
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Test queries: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub queries: String,
    /// Gallery: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub gallery: String,
    /// gallery_stats.parquet from `hubnorm stats` (not needed for --method none).
    #[arg(long)]
    pub stats: Option<PathBuf>,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Results per query.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    #[command(flatten)]
    pub quality: QualityArgs,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    /// Replace the output if it exists.
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub table: TableArgs,
    /// Output file (results.parquet).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub cluster: ClusterJobArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `hubnorm compare`: a `run` (its arguments; without method flags, every
/// method the inputs allow) and how its report is made.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// The k of the k-occurrence hubness measures.
    #[arg(long, default_value_t = 10)]
    pub hubness_k: usize,
    /// Gallery column shown beside the top hubs (used when present).
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// Also write a self-contained HTML page (plots, top hubs, R@K bars).
    #[arg(long)]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A results file (query_id, gallery_id; method and rank used when present).
    #[arg(long)]
    pub results: PathBuf,
    /// The gallery searched (every item counts, retrieved or not).
    #[arg(long)]
    pub gallery: String,
    /// The queries: queries without result rows count, and their
    /// `target_id` gives R@K for K ≤ k.
    #[arg(long)]
    pub queries: Option<String>,
    /// A gallery_stats.parquet whose per-item corrections join gallery_report.parquet.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// The k of the k-occurrence (only list positions ≤ k count).
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    #[command(flatten)]
    pub quality: QualityArgs,
    /// Gallery column shown beside the top hubs (used when present).
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// Also write a self-contained HTML page.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Replace outputs that already exist.
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub table: TableArgs,
    /// Output directory (report.parquet, gallery_report.parquet).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Gallery searched by the validation queries.
    #[arg(long)]
    pub gallery: String,
    /// Query bank (training-split queries).
    #[arg(long)]
    pub bank: String,
    #[arg(long, help = gallery_bank_help())]
    pub gallery_bank: Option<String>,
    /// Validation queries with ground truth (never the test queries).
    #[arg(
        long,
        required_unless_present = "validation_split",
        conflicts_with = "validation_split"
    )]
    pub validation: Option<String>,
    /// Instead of --validation: hold out this fraction of the bank (rows
    /// with target_id) as validation queries, seeded by --seed; the rest is the bank.
    #[arg(long, value_name = "FRACTION")]
    pub validation_split: Option<f64>,
    /// The gallery the held-out bank rows' targets live in (default: --gallery).
    #[arg(long, requires = "validation_split")]
    pub validation_gallery: Option<String>,
    /// Seed of --validation-split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Methods to tune (default: every method with parameters the inputs allow).
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// Replace a grid axis: PARAMETER=V1,V2,... for every method that has it,
    /// or METHOD.PARAMETER=...; repeatable (e.g. --grid beta=10,20,40 --grid nnn.k=16,64).
    #[arg(long)]
    pub grid: Vec<String>,
    /// Selection metric: r1, r5, r10 (any R@K among --recall-at) or mrr.
    #[arg(long, default_value = "r1")]
    pub metric: String,
    #[arg(long, help = tol_help())]
    pub tol: Option<f64>,
    #[command(flatten)]
    pub quality: QualityArgs,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    /// Also write a self-contained HTML page with the tuning curves.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Replace outputs that already exist.
    #[arg(long)]
    pub overwrite: bool,
    /// Output directory (tune.parquet, tuned.json).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `hubnorm export`: one method, so `--methods` is not offered.
#[derive(Debug, Args)]
#[command(mut_arg("methods", |methods| methods.hide(true)))]
pub struct ExportArgs {
    /// Gallery: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub gallery: String,
    /// gallery_stats.parquet holding the method's statistic.
    #[arg(long)]
    pub stats: PathBuf,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Replace the output if it exists.
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub table: TableArgs,
    /// Output file: id, embedding (d + 1 values: the normalised embedding, then h(g)).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `hubnorm sql`.
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The SQL: one or more statements separated by `;` (the last one's rows are output).
    #[arg(required_unless_present_any = ["file", "functions"], conflicts_with = "file")]
    pub query: Option<String>,
    /// Read the SQL from a file (e.g. one of queries/*.sql).
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// A table: NAME=PATH, PATH a Parquet file, a directory of parts, a glob,
    /// or a Delta table (PATH@VERSION for an older version; repeatable;
    /// replaces a run table of the same name).
    #[arg(long = "table", value_name = "NAME=PATH")]
    pub tables: Vec<String>,
    /// A run's output directory: registers results, gallery_stats, report,
    /// gallery_report and tune (those present) and the inputs the run
    /// recorded: queries, gallery, bank, gallery_bank.
    #[arg(long, value_name = "DIR")]
    pub run: Option<PathBuf>,
    /// Output: an aligned table, CSV, Parquet (needs --out), or a Delta Lake
    /// table (needs --out; feature `delta`): a new table, or a new version
    /// with --overwrite or --append.
    #[arg(long, default_value = "table", value_parser = ["table", "csv", "parquet", "delta"])]
    pub format: String,
    /// With --format delta: add the rows to an existing table as a new version.
    #[arg(long, conflicts_with = "overwrite")]
    pub append: bool,
    /// Write the rows to this file (atomically) instead of standard output.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Rows --format table prints at most (it gathers them in memory first);
    /// a larger result is refused (csv and parquet stream any number). 0: no limit.
    #[arg(long, default_value_t = 10_000, value_name = "ROWS")]
    pub max_table_rows: usize,
    /// Replace --out if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// List every hubnorm SQL function with its syntax and an example, and exit.
    #[arg(long)]
    pub functions: bool,
    /// Memory pool of the SQL session, e.g. 2GiB; a table function's pass reserves half of what is free and keeps what its plan uses.
    #[arg(long, default_value = "2GiB", value_parser = parse_memory)]
    pub memory_limit: MemoryBudget,
    /// Worker threads (0 = one per core); with --cluster, the partitions of
    /// each stage (0 = one per core of this machine).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Run the queries on a cluster (`hubnorm cluster scheduler` and
    /// executors) instead of this process; the rows come back here. Paths
    /// must be readable from every executor. hubnorm_stats and
    /// hubnorm_search run in shards, one task per partition (--threads).
    #[arg(long, value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
}

fn parse_memory(s: &str) -> Result<MemoryBudget, String> {
    s.parse().map_err(|e: hubnorm::HubnormError| e.to_string())
}

impl CommonArgs {
    pub fn pass_options(&self) -> PassOptions {
        PassOptions {
            read: ReadOptions {
                normalize: !self.no_normalize,
                ..ReadOptions::with_columns(
                    &self.id_column,
                    &self.embedding_column,
                    self.target_column.as_deref(),
                )
            },
            memory: self.memory_limit,
            threads: self.threads,
            ..PassOptions::default()
        }
    }
}

impl MethodArgs {
    /// The method kinds named, in order, without repeats; `default` when none is named.
    pub fn kinds(&self, default: MethodKind) -> hubnorm::Result<Vec<MethodKind>> {
        let names: Vec<&str> = match &self.method {
            Some(m) => vec![m.as_str()],
            None => self.methods.iter().map(String::as_str).collect(),
        };
        let mut kinds = Vec::new();
        for name in names {
            let kind: MethodKind = name.parse()?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if kinds.is_empty() {
            kinds.push(default);
        }
        Ok(kinds)
    }

    /// Hyperparameters given on the command line (by flag).
    pub fn params(&self) -> MethodParams {
        self.parameters.0.clone()
    }

    /// The pass options, with the Sinkhorn tolerance.
    pub fn pass_options(&self, common: &CommonArgs) -> PassOptions {
        PassOptions {
            sinkhorn_tolerance: self.tol,
            ..common.pass_options()
        }
    }

    /// Whether any hyperparameter was given on the command line.
    pub fn any_parameter(&self) -> bool {
        !self.parameters.0.is_empty()
    }

    /// The methods with their parameters (from `--config` when given).
    pub fn specs(&self, default: MethodKind) -> hubnorm::Result<Vec<MethodSpec>> {
        if let Some(path) = &self.config {
            if self.any_parameter() {
                return Err(hubnorm::HubnormError::Usage(
                    "--config sets every method's parameters; drop the parameter flags or the config".into(),
                ));
            }
            return hubnorm::stats_file::config_file_methods(path);
        }
        let params = self.params();
        let kinds = self.kinds(default)?;
        params.refuse_unused(&kinds)?;
        Ok(kinds
            .into_iter()
            .map(|k| MethodSpec::from_kind(k, &params))
            .collect())
    }
}

// ------------------------------------------------ arguments -> library jobs
// Here rather than beside each command, so that the fuzz target (which
// includes this file) converts exactly as the binary does.

impl RunArgs {
    /// The run these arguments describe, with `methods`.
    pub fn job(&self, methods: Vec<MethodSpec>) -> hubnorm::Result<hubnorm::pipeline::RunJob> {
        let overwrite =
            hubnorm::pipeline::declare_run_tables(self.table.format()?, &self.out, self.overwrite)?
                .for_process();
        Ok(hubnorm::pipeline::RunJob {
            queries: self.queries.clone(),
            gallery: self.gallery.clone(),
            bank: self.bank.clone().unwrap_or_default(),
            gallery_bank: self.banks.gallery_bank.clone(),
            bank_sample: self.banks.sample(),
            transductive: self.transductive,
            methods,
            k: self.k,
            out_dir: self.out.clone(),
            overwrite,
            options: self
                .quality
                .apply(self.precision.apply(self.method.pass_options(&self.common)))?,
            cluster: self.cluster.job(),
            checkpoint: checkpoint_options(
                !self.no_checkpoint && self.cluster.job().is_none(),
                self.checkpoint_interval,
                self.resume,
            )?,
        })
    }
}

/// The checkpoints of `--checkpoint-interval SECONDS` (when `save`) and `--resume`.
fn checkpoint_options(
    save: bool,
    seconds: f64,
    resume: bool,
) -> hubnorm::Result<hubnorm::checkpoint::CheckpointOptions> {
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(hubnorm::HubnormError::Usage(format!(
            "--checkpoint-interval must be a number of seconds ≥ 0, not {seconds}"
        )));
    }
    let interval = std::time::Duration::try_from_secs_f64(seconds).map_err(|_| {
        hubnorm::HubnormError::Usage(format!(
            "--checkpoint-interval {seconds:e} is too large a number of seconds"
        ))
    })?;
    Ok(hubnorm::checkpoint::CheckpointOptions {
        interval: save.then_some(interval),
        resume,
    })
}

impl StatsArgs {
    /// The stats job these arguments describe (`--update` keeps the stored
    /// file's methods, so it takes no method flag).
    pub fn job(&self) -> hubnorm::Result<hubnorm::pipeline::StatsJob> {
        let method_named = self.method.method.is_some()
            || !self.method.methods.is_empty()
            || self.method.config.is_some()
            || self.method.any_parameter()
            || self.method.tol.is_some();
        if self.update && method_named {
            return Err(hubnorm::HubnormError::Usage(
                "--update keeps the stored file's methods and parameters; drop the method flags"
                    .into(),
            ));
        }
        let methods = if self.update {
            vec![]
        } else {
            self.method.specs(MethodKind::default())?
        };
        let checkpoint = checkpoint_options(
            !self.no_checkpoint && !self.update,
            self.checkpoint_interval,
            self.resume,
        )?;
        let options = self.precision.apply(self.method.pass_options(&self.common));
        Ok(hubnorm::pipeline::StatsJob {
            gallery: self.gallery.clone(),
            bank: self.bank.clone(),
            gallery_bank: self.banks.gallery_bank.clone(),
            bank_sample: self.banks.sample(),
            methods,
            out: self.out.clone(),
            // --update writes a new version of a Delta stats table.
            overwrite: hubnorm::pipeline::declare_stats_table(
                self.table.format()?,
                &self.out,
                self.overwrite || self.update,
            )?
            .for_process()
                && !self.update,
            options,
            checkpoint,
        })
    }
}

impl MethodArgs {
    /// The methods named for a command that reads a stats file recording
    /// `from_file`: without parameter flags, each takes the statistic the
    /// file holds for it (when it holds exactly one).
    pub fn specs_for_stats(&self, from_file: &[MethodSpec]) -> hubnorm::Result<Vec<MethodSpec>> {
        if self.config.is_some() {
            return self.specs(MethodKind::default());
        }
        let kinds = self.kinds(MethodKind::default())?;
        let params = self.params();
        params.refuse_unused(&kinds)?;
        Ok(hubnorm::stats_file::methods_for_stats_file(
            &kinds, &params, from_file,
        ))
    }
}

/// The parameter flags of the registry's methods, one per distinct flag
/// (methods that share a flag, like `--beta`, share its value). Built from
/// [`MethodParams::flags`], so a new method's flags appear without an edit here.
#[derive(Debug, Clone, Default)]
pub struct ParameterFlags(pub MethodParams);

impl clap::FromArgMatches for ParameterFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut params = MethodParams::default();
        for p in MethodParams::flags() {
            if let Some(value) = matches.get_one::<f64>(p.flag) {
                params.set(p.flag, *value);
            }
        }
        Ok(ParameterFlags(params))
    }
    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for ParameterFlags {
    fn augment_args(command: clap::Command) -> clap::Command {
        MethodParams::flags()
            .into_iter()
            .fold(command, |command, p| {
                let users: Vec<&str> = hubnorm::method::REGISTRY
                    .iter()
                    .filter(|m| m.parameters().iter().any(|q| q.flag == p.flag))
                    .map(|m| m.name())
                    .collect();
                command.arg(
                    clap::Arg::new(p.flag)
                        .long(p.flag)
                        .value_name(p.flag_value)
                        .value_parser(clap::value_parser!(f64))
                        .allow_negative_numbers(true)
                        .help_heading("Method parameters")
                        .help(format!(
                            "{} [{}]. Default {}",
                            p.help,
                            users.join(", "),
                            p.default - p.flag_offset
                        )),
                )
            })
    }
    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    fn argument<'a>(command: &'a clap::Command, name: &str) -> &'a clap::Arg {
        command
            .get_arguments()
            .find(|a| a.get_id() == name)
            .unwrap_or_else(|| panic!("no --{name}"))
    }

    #[test]
    fn export_offers_one_method_and_the_others_several() {
        let cli = Cli::command();
        let shown =
            |sub: &str| !argument(cli.find_subcommand(sub).unwrap(), "methods").is_hide_set();
        assert!(!shown("export"));
        assert!(shown("run") && shown("stats") && shown("search"));
    }

    #[test]
    fn an_offset_flag_names_the_value_it_takes() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").unwrap();
        let value = |flag: &str| argument(run, flag).get_value_names().unwrap()[0].to_string();
        // sinkhorn-pp's m is --pseudo-queries + 1.
        assert_eq!(value("pseudo-queries"), "m-1");
        assert_eq!(value("beta"), "beta");
    }
}
