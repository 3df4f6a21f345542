//! `hubnorm sql`: SQL text over Parquet tables and a run's outputs.
//!
//! Tables come from `NAME=PATH` pairs (a Parquet file, a directory of parts
//! or a glob) and from a run directory ([`run_tables`]): its outputs, and
//! the inputs its files recorded. Statements run in order; the rows of the
//! last one are the output (an aligned table, CSV, or Parquet written
//! atomically).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::catalog::view::ViewTable;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::DFParser;
use futures::StreamExt;

use crate::error::{HubnormError, Result};
use crate::sink::{AtomicFile, ParquetSink};

use super::{session, sql_error, SqlOptions};

/// How `hubnorm sql` prints or writes the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// An aligned text table (the rows are gathered before printing, up to
    /// [`SqlJob::max_table_rows`]).
    #[default]
    Table,
    /// CSV with a header line, streamed.
    Csv,
    /// A Parquet file (needs an output path), streamed.
    Parquet,
    /// Record batches kept in [`SqlOutcome::batches`], for the library's
    /// callers (the Python package); not a command-line choice.
    Batches,
}

impl std::str::FromStr for OutputFormat {
    type Err = HubnormError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "table" => Ok(OutputFormat::Table),
            "csv" => Ok(OutputFormat::Csv),
            "parquet" => Ok(OutputFormat::Parquet),
            other => Err(HubnormError::Usage(format!(
                "unknown format '{other}' (table, csv or parquet)"
            ))),
        }
    }
}

/// Inputs and options of `hubnorm sql`.
#[derive(Debug, Clone, Default)]
pub struct SqlJob {
    /// `NAME=PATH` tables; they replace run tables of the same name.
    pub tables: Vec<(String, String)>,
    /// An output directory of `hubnorm run` (or compare, report, tune).
    pub run_dir: Option<PathBuf>,
    /// One or more statements separated by `;`.
    pub sql: String,
    /// The file the SQL came from (named in errors).
    pub source: Option<PathBuf>,
    pub format: OutputFormat,
    /// Rows an aligned table may have (0: no limit): a table is gathered in
    /// memory before it is printed, so a larger result is refused, with the
    /// way to stream it instead.
    pub max_table_rows: usize,
    /// Output file; standard output when `None` (not for Parquet).
    pub out: Option<PathBuf>,
    pub overwrite: bool,
    pub options: SqlOptions,
    /// The scheduler of a cluster to run the queries on (`df://HOST:PORT`),
    /// instead of this process. Needs the `cluster` feature.
    pub cluster: Option<String>,
}

/// What `hubnorm sql` did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SqlOutcome {
    /// Rows of the last statement.
    pub rows: usize,
    /// The tables registered (name, path).
    pub tables: Vec<(String, String)>,
    /// Recorded inputs that could not be registered, and why.
    pub skipped: Vec<String>,
    /// The last statement's schema and rows, with [`OutputFormat::Batches`].
    pub batches: Option<(datafusion::arrow::datatypes::SchemaRef, Vec<RecordBatch>)>,
}

/// Output files of the commands a run directory may hold, as table names.
pub const RUN_OUTPUT_TABLES: [(&str, &str); 5] = [
    ("results", "results.parquet"),
    ("gallery_stats", "gallery_stats.parquet"),
    ("report", "report.parquet"),
    ("gallery_report", "gallery_report.parquet"),
    ("tune", "tune.parquet"),
];

/// Input tables a run records in its files' metadata: (table, file, key).
const RUN_INPUT_TABLES: [(&str, &str, &str); 4] = [
    ("queries", "results.parquet", "hubnorm.queries.path"),
    ("gallery", "results.parquet", "hubnorm.gallery.path"),
    ("bank", "gallery_stats.parquet", "hubnorm.bank.path"),
    (
        "gallery_bank",
        "gallery_stats.parquet",
        "hubnorm.gallery_bank.path",
    ),
];

/// Tables as (name, path), in registration order.
pub type NamedTables = Vec<(String, String)>;

/// The tables of a run directory: every output file present, and the
/// inputs its files recorded (when they still resolve), with the recorded
/// inputs that do not.
pub fn run_tables(dir: &Path) -> Result<(NamedTables, Vec<String>)> {
    if !crate::storage::is_dir(dir)? {
        return Err(HubnormError::input(dir, None, None, "not a directory"));
    }
    let mut tables = Vec::new();
    let mut skipped = Vec::new();
    for (name, file) in RUN_OUTPUT_TABLES {
        let path = dir.join(file);
        if crate::source::holds_table(&path)? {
            tables.push((name.to_owned(), path.display().to_string()));
        }
    }
    if tables.is_empty() {
        return Err(HubnormError::input(
            dir,
            None,
            None,
            "holds none of the files hubnorm writes (results.parquet, gallery_stats.parquet, ...)",
        ));
    }
    // The outputs must come from one run (see `pipeline::run_fingerprint`).
    // A Delta table that `--append` grew holds several runs' files: its rows
    // are a table, but it records no one run's inputs.
    let mut written = Vec::new();
    let mut appended = Vec::new();
    for file in ["results.parquet", "gallery_stats.parquet", "summary.json"] {
        let path = dir.join(file);
        match crate::source::table_files(&path)? {
            0 => {}
            1 => written.push(path),
            _ => appended.push(path),
        }
    }
    crate::pipeline::check_same_run(&written.iter().map(|p| p.as_path()).collect::<Vec<_>>())?;
    for path in &appended {
        skipped.push(format!(
            "{} is a Delta table of several appended runs: its rows are a table, but the inputs it \
             records are not read (name them with --table)",
            path.display()
        ));
    }
    for (name, file, key) in RUN_INPUT_TABLES {
        let path = dir.join(file);
        if !written.contains(&path) {
            continue;
        }
        let metadata = crate::stats_file::file_metadata(&path)?;
        let Some(spec) = metadata.get(key).cloned() else {
            continue;
        };
        // A Delta input at the version the run read, not at its latest.
        #[cfg(feature = "delta")]
        let spec = match metadata.get(&key.replace(".path", ".delta_version")) {
            Some(version) => crate::delta::at_version(&spec, version),
            None => spec,
        };
        match crate::source::expand_spec(&spec) {
            Ok(_) => tables.push((name.to_owned(), spec)),
            Err(e) => skipped.push(format!(
                "table {name}: {} records input {spec}, which does not resolve from here ({e})",
                path.display()
            )),
        }
    }
    Ok((tables, skipped))
}

/// Registers the Parquet files of `spec` (file, directory or glob), the
/// Delta table or the in-memory table it names, as `name`.
async fn register_parquet(ctx: &SessionContext, name: &str, spec: &str) -> Result<()> {
    if crate::source::memory::is_memory(Path::new(spec)) {
        let table = crate::source::memory::lookup(Path::new(spec))?;
        // The batches are shared, not copied.
        let table = datafusion::datasource::MemTable::try_new(
            table.schema.clone(),
            vec![table.batches.clone()],
        )
        .map_err(|e| sql_error(e, None))?;
        ctx.register_table(name, Arc::new(table))
            .map_err(|e| sql_error(e, None))?;
        return Ok(());
    }
    #[cfg(feature = "delta")]
    if let Some(table) = crate::delta::parse_spec(spec) {
        // delta-rs's own provider: partition columns and the table's schema.
        let provider = crate::delta::table_provider(&table)?;
        ctx.register_table(name, provider)
            .map_err(|e| sql_error(e, None))?;
        return Ok(());
    }
    let files = crate::source::expand_spec(spec)?;
    let urls = files
        .iter()
        .map(|f| {
            // Objects by their URL (the session's registry opens their
            // store), local files by their absolute path.
            let text = if crate::storage::is_remote(f) {
                f.to_string_lossy().into_owned()
            } else {
                let absolute = std::path::absolute(f).map_err(|e| HubnormError::io(f, e))?;
                absolute.to_string_lossy().into_owned()
            };
            ListingTableUrl::parse(text)
                .map_err(|e| HubnormError::input(f, None, None, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension("");
    let state = ctx.state();
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .infer_schema(&state)
        .await
        .map_err(|e| {
            let message = crate::storage::redact(&e.to_string());
            let hint = crate::storage::range_refusal_hint(&message).unwrap_or_default();
            HubnormError::input(
                spec,
                None,
                None,
                format!("cannot read as Parquet: {message}{hint}"),
            )
        })?;
    let table = ListingTable::try_new(config).map_err(|e| sql_error(e, None))?;
    ctx.register_table(name, Arc::new(table))
        .map_err(|e| sql_error(e, None))?;
    Ok(())
}

/// Runs `job`, printing to `stdout` unless `job.out` is set.
pub fn run_sql(job: &SqlJob, stdout: &mut dyn Write) -> Result<SqlOutcome> {
    if job.format == OutputFormat::Parquet && job.out.is_none() {
        return Err(HubnormError::Usage(
            "--format parquet needs --out FILE".into(),
        ));
    }
    if let Some(out) = &job.out {
        crate::sink::refuse_existing(out, job.overwrite)?;
    }
    let _lock = job
        .out
        .as_deref()
        .map(crate::sink::OutputLock::acquire)
        .transpose()?;
    crate::inputs::check_threads(job.options.threads)?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if job.options.threads > 0 {
        builder.worker_threads(job.options.threads);
    }
    let runtime = builder
        .enable_all()
        // DataFusion reads and writes object stores on these threads.
        .on_thread_start(crate::storage::block_sigpipe_on_this_thread)
        .build()
        .map_err(|e| HubnormError::Internal(format!("cannot start the SQL runtime: {e}")))?;
    runtime.block_on(run_async(job, stdout))
}

/// The session the job's queries run in: this process's, or a cluster's.
async fn open_session(job: &SqlJob) -> Result<SessionContext> {
    match &job.cluster {
        None => session(&job.options),
        #[cfg(feature = "cluster")]
        Some(url) => crate::cluster::session(&url.parse()?, &job.options).await,
        #[cfg(not(feature = "cluster"))]
        Some(url) => Err(crate::pipeline::without_cluster(url)),
    }
}

async fn run_async(job: &SqlJob, stdout: &mut dyn Write) -> Result<SqlOutcome> {
    let ctx = open_session(job).await?;
    let mut outcome = SqlOutcome::default();
    let mut tables: Vec<(String, String)> = Vec::new();
    if let Some(dir) = &job.run_dir {
        let (found, skipped) = run_tables(dir)?;
        tables = found;
        outcome.skipped = skipped;
    }
    for (name, path) in &job.tables {
        tables.retain(|(n, _)| n != name);
        tables.push((name.clone(), path.clone()));
    }
    for (name, path) in &tables {
        register_parquet(&ctx, name, path).await?;
    }
    let table_inputs: Vec<(String, String)> = tables
        .iter()
        .map(|(name, spec)| (format!("table {name}"), spec.clone()))
        .collect();
    if let Some(out) = &job.out {
        refuse_output_in_inputs(out, &table_inputs, &[], false)?;
    }

    let source = job.source.as_deref();
    let statements = DFParser::parse_sql(&job.sql).map_err(|e| sql_error(e, source))?;
    if statements.is_empty() {
        return Err(HubnormError::Usage("no SQL statement given".into()));
    }
    let last = statements.len() - 1;
    for (i, statement) in statements.into_iter().enumerate() {
        // `COPY ... TO`: its query's rows go to hubnorm's own writers (atomic,
        // an existing target refused, URLs checked), the count to the output.
        let (statement, copy) = copy_of(statement, source)?;
        // A table's location is checked as every path is (no secrets in URLs).
        if let datafusion::sql::parser::Statement::CreateExternalTable(create) = &statement {
            for location in &create.locations {
                crate::storage::locate(Path::new(location))?;
            }
        }
        // A fresh state per statement: views made by earlier ones are visible.
        let plan = ctx
            .state()
            .statement_to_plan(statement)
            .await
            .map_err(|e| sql_error(e, source))?;
        // The tables the statement's table functions read are inputs too.
        let functions = function_inputs(&plan);
        if let Some(copy) = &copy {
            let delta = copy.format == CopyFormat::Delta;
            refuse_output_in_inputs(&copy.target, &table_inputs, &functions, delta)?;
        }
        if let (Some(out), true) = (&job.out, i == last) {
            refuse_output_in_inputs(out, &table_inputs, &functions, false)?;
        }
        let frame = ctx
            .execute_logical_plan(plan)
            .await
            .map_err(|e| sql_error(e, source))?;
        let plan = frame
            .create_physical_plan()
            .await
            .map_err(|e| sql_error(e, source))?;
        // The batches' schema: the physical plan's (the logical one may name
        // a narrower type than the batches carry).
        let schema = plan.schema();
        let mut copy_sink = copy
            .map(|target| target.sink(schema.clone(), job.overwrite))
            .transpose()?;
        let mut copied = 0u64;
        let schema = match &copy_sink {
            Some(_) => copy_count_schema(),
            None => schema,
        };
        let mut stream = datafusion::physical_plan::execute_stream(plan.clone(), ctx.task_ctx())
            .map_err(|e| sql_error(e, source))?;
        // Earlier statements run for their effects (views, COPY), the last
        // one's rows are the output.
        let mut output = (i == last)
            .then(|| Output::open(job, schema, stdout))
            .transpose()?;
        loop {
            let next = match crate::storage::unless_stopped(stream.next()).await {
                Ok(next) => next,
                Err(stop) => {
                    #[cfg(feature = "cluster")]
                    if let Some(url) = &job.cluster {
                        let scheduler = url.parse()?;
                        crate::cluster::passes::cancel(&scheduler, plan.as_ref(), &mut stream)
                            .await;
                    }
                    return Err(stop);
                }
            };
            let Some(batch) = next else { break };
            let batch = batch.map_err(|e| sql_error(e, source))?;
            if let Some(sink) = &mut copy_sink {
                copied += batch.num_rows() as u64;
                sink.write(batch)?;
                continue;
            }
            if let Some(output) = &mut output {
                outcome.rows += batch.num_rows();
                output.write(batch)?;
            }
        }
        if let Some(sink) = copy_sink {
            sink.finish()?;
            if let Some(output) = &mut output {
                let counted = datafusion::arrow::array::UInt64Array::from(vec![copied]);
                output.write(RecordBatch::try_new(
                    copy_count_schema(),
                    vec![Arc::new(counted)],
                )?)?;
                outcome.rows += 1;
            }
        }
        if let Some(output) = output {
            outcome.batches = output.finish()?;
        }
    }
    outcome.tables = tables;
    Ok(outcome)
}

/// Refuses an output at `out` inside one of the registered `tables` or
/// the tables of table `functions` ((role, path) pairs), as every command
/// refuses one inside an input: a later query would read it as part of
/// that table, and `--overwrite` would replace the user's data. A Delta
/// target may be a registered Delta table the query reads (`COPY (SELECT
/// ... FROM t) TO 't' STORED AS DELTA`: the query reads one version, the
/// copy commits the next), not a table function's input (its rows are
/// statistics or results, not the table's).
fn refuse_output_in_inputs(
    out: &Path,
    tables: &[(String, String)],
    functions: &[(String, String)],
    delta_target: bool,
) -> Result<()> {
    let inputs: Vec<(&str, &str)> = tables
        .iter()
        .filter(|(_, spec)| !(delta_target && reads_delta_table(spec, out)))
        .chain(functions)
        .map(|(role, spec)| (role.as_str(), spec.as_str()))
        .collect();
    crate::sink::refuse_output_in_inputs(out, &inputs)
}

/// The tables that the table functions in `plan` (`hubnorm_stats`,
/// `hubnorm_search`), and in the views it reads, read: (`FUNCTION ROLE`,
/// path) pairs.
fn function_inputs(plan: &LogicalPlan) -> Vec<(String, String)> {
    let mut found = Vec::new();
    // The closure never fails.
    let _ =
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::TableScan(scan) = node {
                if let Ok(provider) = source_as_provider(&scan.source) {
                    if let Some(pass) = provider.downcast_ref::<super::pass::PassTable>() {
                        let function = scan.table_name.table();
                        found.extend(
                            pass.spec().inputs.tables().into_iter().map(|(role, path)| {
                                (format!("{function} {role}"), path.to_owned())
                            }),
                        );
                    } else if let Some(view) = provider.downcast_ref::<ViewTable>() {
                        found.extend(function_inputs(view.logical_plan()));
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        });
    found
}

/// Whether `spec` reads (a version of) the Delta table at `table`.
fn reads_delta_table(spec: &str, table: &Path) -> bool {
    #[cfg(feature = "delta")]
    if let Some(read) = crate::delta::parse_spec(spec) {
        return crate::sink::same_place(Path::new(&read.root), table).unwrap_or(false);
    }
    let _ = (spec, table);
    false
}

/// The formats a `COPY ... TO` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyFormat {
    Parquet,
    Csv,
    Delta,
}

/// A `COPY ... TO 'PATH' [STORED AS PARQUET|CSV|DELTA] [OPTIONS ('mode' ...)]`:
/// where its rows go.
struct CopyTarget {
    target: PathBuf,
    format: CopyFormat,
    mode: crate::sink::DeltaMode,
}

impl CopyTarget {
    /// The writer of the rows; `overwrite` (`sql --overwrite`) replaces an
    /// existing target as the option `'mode' 'overwrite'` does.
    fn sink(
        self,
        schema: datafusion::arrow::datatypes::SchemaRef,
        overwrite: bool,
    ) -> Result<Output<'static>> {
        use crate::sink::DeltaMode;
        let mode = match self.mode {
            DeltaMode::Create if overwrite => DeltaMode::Overwrite,
            mode => mode,
        };
        let replace = mode == DeltaMode::Overwrite;
        Ok(match self.format {
            CopyFormat::Parquet => {
                Output::Parquet(ParquetSink::create(&self.target, schema, vec![], replace)?)
            }
            CopyFormat::Csv => {
                let (file, handle) = AtomicFile::create(&self.target, replace)?;
                Output::csv(Box::new(std::io::BufWriter::new(handle)), Some(file))
            }
            CopyFormat::Delta => {
                // The sink takes its table's mode when it is created.
                let _declared = crate::sink::write_as_delta_tables([self.target.clone()], mode)?;
                Output::Parquet(ParquetSink::create(&self.target, schema, vec![], true)?)
            }
        })
    }
}

/// The row a COPY outputs: how many rows it wrote (as DataFusion's COPY).
fn copy_count_schema() -> datafusion::arrow::datatypes::SchemaRef {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

/// `statement`, or for a COPY, the query whose rows it copies and where
/// they go. The format is STORED AS's, else the target's extension; the
/// mode is an option: `'mode'` `'error'` (the default: the target must not
/// exist), `'overwrite'`, or `'append'` (Delta tables).
fn copy_of(
    statement: datafusion::sql::parser::Statement,
    source: Option<&Path>,
) -> Result<(datafusion::sql::parser::Statement, Option<CopyTarget>)> {
    use datafusion::sql::parser::{CopyToSource, Statement};
    use datafusion::sql::sqlparser::ast::Value;
    let Statement::CopyTo(copy) = statement else {
        return Ok((statement, None));
    };
    let usage =
        |what: String| HubnormError::Usage(format!("COPY ... TO '{}': {what}", copy.target));
    let named = copy.stored_as.as_deref().map(str::to_ascii_lowercase);
    let extension = Path::new(&copy.target)
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let format = match named.as_deref().or(extension.as_deref()) {
        Some("parquet") => CopyFormat::Parquet,
        Some("csv") => CopyFormat::Csv,
        Some("delta") => CopyFormat::Delta,
        Some(other) => {
            return Err(usage(format!(
                "hubnorm writes COPY targets as PARQUET, CSV or DELTA, not {}",
                other.to_ascii_uppercase()
            )))
        }
        None => {
            return Err(usage(
                "name the format: STORED AS PARQUET, CSV or DELTA".into(),
            ))
        }
    };
    if format == CopyFormat::Delta && !cfg!(feature = "delta") {
        return Err(usage(
            "STORED AS DELTA needs a hubnorm built with the cargo feature `delta`".into(),
        ));
    }
    if !copy.partitioned_by.is_empty() {
        return Err(usage("PARTITIONED BY is not supported".into()));
    }
    if format != CopyFormat::Delta && copy.target.ends_with('/') {
        return Err(usage(
            "name a file (a folder of files is written only as a Delta table)".into(),
        ));
    }
    let mut mode = crate::sink::DeltaMode::Create;
    for (key, value) in &copy.options {
        let text = match value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.as_str(),
            other => {
                return Err(usage(format!(
                    "option {key}: expected a quoted string, not {other}"
                )))
            }
        };
        mode =
            match (
                key.to_ascii_lowercase().trim_start_matches("format."),
                text.to_ascii_lowercase().as_str(),
            ) {
                ("mode", "error") => crate::sink::DeltaMode::Create,
                ("mode", "overwrite") => crate::sink::DeltaMode::Overwrite,
                ("mode", "append") if format == CopyFormat::Delta => crate::sink::DeltaMode::Append,
                ("mode", "append") => return Err(usage(
                    "'mode' 'append' adds a version to a Delta table (STORED AS DELTA); a file is \
                     written whole"
                        .into(),
                )),
                _ => {
                    return Err(usage(format!(
                        "unknown option {key} '{text}' (only 'mode' 'error', 'overwrite' or, for \
                     Delta tables, 'append')"
                    )))
                }
            };
    }
    let query = match copy.source {
        CopyToSource::Query(query) => Statement::Statement(Box::new(
            datafusion::sql::sqlparser::ast::Statement::Query(query),
        )),
        CopyToSource::Relation(name) => DFParser::parse_sql(&format!("SELECT * FROM {name}"))
            .map_err(|e| sql_error(e, source))?
            .pop_front()
            .expect("one statement"),
    };
    Ok((
        query,
        Some(CopyTarget {
            target: PathBuf::from(copy.target),
            format,
            mode,
        }),
    ))
}

/// Where the last statement's rows go.
enum Output<'a> {
    /// Gathered (at most `limit` rows, 0: any), then printed aligned.
    Table {
        batches: Vec<RecordBatch>,
        rows: usize,
        limit: usize,
        schema: datafusion::arrow::datatypes::SchemaRef,
        writer: Box<dyn Write + 'a>,
        file: Option<AtomicFile>,
    },
    Csv {
        writer: datafusion::arrow::csv::Writer<Box<dyn Write + 'a>>,
        file: Option<AtomicFile>,
    },
    Parquet(ParquetSink),
    /// Kept for the caller.
    Batches {
        batches: Vec<RecordBatch>,
        schema: datafusion::arrow::datatypes::SchemaRef,
    },
}

impl<'a> Output<'a> {
    fn open(
        job: &SqlJob,
        schema: datafusion::arrow::datatypes::SchemaRef,
        stdout: &'a mut dyn Write,
    ) -> Result<Self> {
        let (writer, file): (Box<dyn Write + 'a>, Option<AtomicFile>) = match &job.out {
            Some(out) if matches!(job.format, OutputFormat::Table | OutputFormat::Csv) => {
                let (file, handle) = AtomicFile::create(out, job.overwrite)?;
                (Box::new(std::io::BufWriter::new(handle)), Some(file))
            }
            _ => (Box::new(stdout), None),
        };
        Ok(match job.format {
            OutputFormat::Table => Output::Table {
                batches: Vec::new(),
                rows: 0,
                limit: job.max_table_rows,
                schema,
                writer,
                file,
            },
            OutputFormat::Csv => Output::csv(writer, file),
            OutputFormat::Batches => Output::Batches {
                batches: Vec::new(),
                schema,
            },
            OutputFormat::Parquet => Output::Parquet(ParquetSink::create(
                job.out.as_deref().expect("checked"),
                schema,
                vec![],
                job.overwrite,
            )?),
        })
    }

    /// CSV with a header line into `writer`, committed as `file` if any.
    fn csv(writer: Box<dyn Write + 'a>, file: Option<AtomicFile>) -> Self {
        Output::Csv {
            writer: datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(writer),
            file,
        }
    }

    fn write(&mut self, batch: RecordBatch) -> Result<()> {
        match self {
            Output::Table {
                batches,
                rows,
                limit,
                ..
            } => {
                *rows += batch.num_rows();
                if *limit > 0 && *rows > *limit {
                    return Err(HubnormError::Usage(format!(
                        "the result has more than {limit} rows, too many for --format table (which \
                         gathers them before printing): use --format csv or parquet (streamed), \
                         a LIMIT, or raise --max-table-rows"
                    )));
                }
                batches.push(batch)
            }
            Output::Csv { writer, .. } => writer.write(&batch)?,
            Output::Parquet(sink) => sink.write(&batch)?,
            Output::Batches { batches, .. } => batches.push(batch),
        }
        Ok(())
    }

    /// Flushes and commits the output; returns the rows when they are kept.
    #[allow(clippy::type_complexity)]
    fn finish(self) -> Result<Option<(datafusion::arrow::datatypes::SchemaRef, Vec<RecordBatch>)>> {
        let io = |e: std::io::Error| HubnormError::io("standard output", e);
        match self {
            Output::Table {
                batches,
                schema,
                mut writer,
                file,
                ..
            } => {
                let text = datafusion::arrow::util::pretty::pretty_format_batches_with_schema(
                    schema, &batches,
                )?;
                writeln!(writer, "{text}").map_err(io)?;
                writer.flush().map_err(io)?;
                drop(writer);
                file.map(AtomicFile::commit).transpose()?;
            }
            Output::Csv { writer, file } => {
                let mut inner = writer.into_inner();
                inner.flush().map_err(io)?;
                drop(inner);
                file.map(AtomicFile::commit).transpose()?;
            }
            Output::Parquet(sink) => {
                sink.finish()?;
            }
            Output::Batches { batches, schema } => return Ok(Some((schema, batches))),
        }
        Ok(None)
    }
}
