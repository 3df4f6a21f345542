//! `hubnorm._hubnorm`: the Rust side of the Python package. Each function
//! runs one hubnorm job (the library's `pipeline`, as the command-line tool
//! does) on a worker thread while the calling thread, with the GIL released,
//! waits for it, reports progress and checks for Ctrl-C; the public,
//! documented API is the Python package around it (`hubnorm/__init__.py`).

use std::path::PathBuf;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use hubnorm::checkpoint::CheckpointOptions;
use hubnorm::error::{HubnormError, Location};
use hubnorm::evaluate::{self, CompareJob, ReportJob, REPORT_OUTPUTS};
use hubnorm::export::ExportJob;
use hubnorm::options::{
    BankSample, MemoryBudget, MethodKind, MethodParams, MethodSpec, PassOptions, Precision,
    ReadOptions,
};
use hubnorm::pipeline::{self, RunJob, SearchJob, StatsJob};
use hubnorm::progress::Progress;
use hubnorm::sink::{DeclaredTables, TableFormat};
use hubnorm::sql::{run_sql, OutputFormat, SqlJob, SqlOptions};
use pyo3::exceptions::{PyKeyboardInterrupt, PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// How often the waiting thread looks for Ctrl-C and draws progress.
const POLL: Duration = Duration::from_millis(100);

/// Progress of the running job, written by the worker and read by the
/// waiting thread (which alone may call into Python).
#[derive(Default)]
struct Shared {
    state: Mutex<ProgressState>,
}

#[derive(Default, Clone)]
struct ProgressState {
    phase: String,
    done: u64,
    total: u64,
    status: String,
}

impl Progress for Shared {
    fn start(&self, phase: &str, total: u64) {
        let mut state = self.state.lock().expect("progress lock");
        *state = ProgressState {
            phase: phase.to_owned(),
            total,
            ..ProgressState::default()
        };
    }
    fn advance(&self, n: u64) {
        self.state.lock().expect("progress lock").done += n;
    }
    fn status(&self, text: &str) {
        self.state.lock().expect("progress lock").status = text.to_owned();
    }
    fn finish(&self) {
        let mut state = self.state.lock().expect("progress lock");
        state.done = state.total;
    }
}

/// Whether the worker has finished, with the condition the waiting thread
/// sleeps on (both `Sync`: the wait runs without the GIL, on the caller's
/// thread, so that Ctrl-C reaches it there).
#[derive(Default)]
struct Done {
    finished: Mutex<bool>,
    wake: Condvar,
}

impl Done {
    fn set(&self) {
        *self.finished.lock().expect("done lock") = true;
        self.wake.notify_all();
    }

    /// Waits up to `timeout`; whether the worker has finished.
    fn wait(&self, timeout: Duration) -> bool {
        let finished = self.finished.lock().expect("done lock");
        let (finished, _) = self
            .wake
            .wait_timeout_while(finished, timeout, |finished| !*finished)
            .expect("done lock");
        *finished
    }
}

/// Runs `job` on a worker thread; meanwhile, with the GIL released, waits
/// for it, hands progress to `on_progress(phase, done, total, status)`
/// and, on Ctrl-C (a pending signal), asks the job to stop, waits for it
/// to unwind (nothing is committed) and raises `KeyboardInterrupt` with the
/// job's message (what a checkpoint saved).
///
/// Ctrl-C stops every job running in the process (`hubnorm::cancel`), as
/// it stops the CLI; an exception from the callback stops this job only.
fn run_job<T: Send>(
    py: Python<'_>,
    on_progress: Option<&Bound<'_, PyAny>>,
    job: impl FnOnce(&dyn Progress) -> hubnorm::Result<T> + Send,
) -> PyResult<T> {
    let shared = Shared::default();
    let done = Done::default();
    let stop = hubnorm::cancel::JobStop::new();
    std::thread::scope(|scope| {
        let worker = {
            let (shared, done, stop) = (&shared, &done, &stop);
            scope.spawn(move || {
                let outcome = stop.run(|| job(shared));
                done.set();
                outcome
            })
        };
        let mut drawn = None;
        loop {
            // A worker that panicked never sets `done`: it has finished too.
            let finished = py.detach(|| done.wait(POLL)) || worker.is_finished();
            // Ctrl-C, or an exception from the progress callback (Ctrl-C
            // can land there too): stop the job and raise it.
            // The error, and whether a signal handler raised it.
            let mut step = || -> Result<(), (PyErr, bool)> {
                if let Some(callback) = on_progress {
                    let state = shared.state.lock().expect("progress lock").clone();
                    let key = (
                        state.phase.clone(),
                        state.done,
                        state.total,
                        state.status.clone(),
                    );
                    if drawn.as_ref() != Some(&key) && !state.phase.is_empty() {
                        callback
                            .call1((state.phase, state.done, state.total, state.status))
                            .map_err(|e| (e, false))?;
                        drawn = Some(key);
                    }
                }
                py.check_signals().map_err(|e| (e, true))
            };
            if let Err((raised, from_signal)) = step() {
                // A signal (Ctrl-C, or a handler's exception) stops every
                // job, as the CLI's; the callback's own exception, its job.
                let interrupt = raised.is_instance_of::<PyKeyboardInterrupt>(py);
                let everywhere = interrupt || from_signal;
                if everywhere {
                    hubnorm::cancel::request();
                } else {
                    stop.request();
                }
                let stopped = py.detach(|| worker.join());
                if everywhere {
                    hubnorm::cancel::reset();
                }
                if interrupt {
                    // Ctrl-C carries the job's own word on how it stopped
                    // (what its checkpoint saved, and how to go on).
                    if let Ok(Err(error @ HubnormError::Interrupted(_))) = stopped {
                        return Err(to_python(py, error));
                    }
                }
                return Err(raised);
            }
            if finished {
                break;
            }
        }
        let outcome = py.detach(|| worker.join()).map_err(|_| {
            PyRuntimeError::new_err("hubnorm: internal error: the worker thread panicked")
        })?;
        outcome.map_err(|e| to_python(py, e))
    })
}

/// The command line's flags in `message` as the package's keywords:
/// `--k 500` → `k=500`, `--stats FILE` → `stats=FILE`, `--nnn-k` →
/// `nnn_k`, a switch → `name=True` (`--no-normalize` → `normalize=False`).
fn as_keywords(message: &str) -> String {
    const SWITCHES: [&str; 5] = [
        "resume",
        "overwrite",
        "append",
        "transductive",
        "skip-missing",
    ];
    let message = message
        .replace(
            "run the same command with --resume",
            "call again with resume=True",
        )
        .replace("--format delta", "format='delta'")
        .replace("--no-normalize", "normalize=False")
        .replace("--tol ", "tolerance ");
    let mut out = String::with_capacity(message.len());
    let mut rest = message.as_str();
    while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let len = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(after.len());
        let flag = &after[..len];
        rest = &after[len..];
        // A flag starts a word; `--` inside one is part of a path or a name
        // (`/data/a--b/x.parquet`) and stays as it is.
        let starts_word = out
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || matches!(c, '`' | '(' | '\'' | '"' | '['));
        if !starts_word || !flag.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.push_str("--");
            out.push_str(flag);
            continue;
        }
        out.push_str(&flag.replace('-', "_"));
        if SWITCHES.contains(&flag) {
            out.push_str("=True");
            continue;
        }
        // The flag's value, when one follows: a number or a placeholder (FILE).
        let Some(value) = rest.strip_prefix(' ') else {
            continue;
        };
        let end = value
            .find(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | ')' | ':'))
            .unwrap_or(value.len());
        let word = value[..end].strip_suffix('.').unwrap_or(&value[..end]);
        let numeric = word.starts_with(|c: char| c.is_ascii_digit());
        let placeholder = !word.is_empty() && word.chars().all(|c| c.is_ascii_uppercase());
        if numeric || placeholder {
            out.push('=');
            out.push_str(word);
            rest = &value[word.len()..];
        }
    }
    out.push_str(rest);
    out
}

/// The Python exception for a hubnorm error: the classes of
/// `hubnorm._errors`, with the CLI's message in the package's words.
fn to_python(py: Python<'_>, error: HubnormError) -> PyErr {
    let message = as_keywords(&error.to_string());
    let raise = |class: &str, extra: Option<&Location>| -> PyResult<PyErr> {
        let module = py.import("hubnorm._errors")?;
        let class = module.getattr(class)?;
        let kwargs = PyDict::new(py);
        if let Some(location) = extra {
            kwargs.set_item("file", location.file.display().to_string())?;
            kwargs.set_item("row", location.row)?;
            kwargs.set_item("column", location.column.clone())?;
        }
        let value = class.call((message.clone(),), Some(&kwargs))?;
        Ok(PyErr::from_value(value))
    };
    let made = match &error {
        HubnormError::Input { location, .. } => raise("InputError", Some(location)),
        HubnormError::Usage(_) => raise("UsageError", None),
        HubnormError::Budget(_) => raise("MemoryLimitError", None),
        HubnormError::Interrupted(_) => Ok(PyKeyboardInterrupt::new_err(message.clone())),
        HubnormError::Io { .. } => Ok(PyOSError::new_err(message.clone())),
        _ => raise("HubnormError", None),
    };
    made.unwrap_or_else(|e| e)
}

/// Parameter flags (`beta`, `activation_k`, `nnn_k`, …: the CLI's flags with `_` for
/// `-`) with their values.
fn method_params(params: &Bound<'_, PyDict>) -> PyResult<MethodParams> {
    let flags = MethodParams::flags();
    let mut out = MethodParams::default();
    for (name, value) in params.iter() {
        let name: String = name.extract()?;
        let flag = name.replace('_', "-");
        let parameter = flags.iter().find(|p| p.flag == flag).ok_or_else(|| {
            let known: Vec<String> = flags.iter().map(|p| p.flag.replace('-', "_")).collect();
            usage(
                params.py(),
                format!(
                    "no method takes a parameter {name}; the parameters are {}",
                    known.join(", ")
                ),
            )
        })?;
        let value = value.extract::<f64>().map_err(|_| {
            usage(
                params.py(),
                format!(
                    "{name} must be a number, not {}",
                    value
                        .repr()
                        .map_or_else(|_| "that".into(), |r| r.to_string())
                ),
            )
        })?;
        out.set(parameter.flag, value);
    }
    Ok(out)
}

fn usage(py: Python<'_>, message: String) -> PyErr {
    to_python(py, HubnormError::Usage(message))
}

/// The method kinds named.
fn method_kinds(py: Python<'_>, names: &[String]) -> PyResult<Vec<MethodKind>> {
    names
        .iter()
        .map(|name| name.parse().map_err(|e| to_python(py, e)))
        .collect()
}

/// The methods named, with the parameters (every method takes those it has).
fn method_specs(
    py: Python<'_>,
    names: Vec<String>,
    params: &Bound<'_, PyDict>,
) -> PyResult<Vec<MethodSpec>> {
    let params = method_params(params)?;
    let kinds = method_kinds(py, &names)?;
    // No names: every method the inputs allow, at its defaults (compare).
    if kinds.is_empty() && !params.is_empty() {
        return Err(usage(
            py,
            "compare without methods runs every method at its defaults; name the methods whose parameters you set (e.g. methods=\"is\", beta=30)".into(),
        ));
    }
    params.refuse_unused(&kinds).map_err(|e| to_python(py, e))?;
    Ok(kinds
        .into_iter()
        .map(|kind| MethodSpec::from_kind(kind, &params))
        .collect())
}

/// The options every job shares, as the package passes them (a dict).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct Options {
    memory_limit: String,
    threads: usize,
    normalize: bool,
    /// `sn`/`dbsn`: stop once the marginals are within it.
    tolerance: Option<f64>,
    /// Bank rows drawn with `seed` (all when `None`).
    bank_sample: Option<u64>,
    seed: u64,
    /// The passes' arithmetic: `exact`, `screened` or `auto` (`--precision`).
    precision: String,
    /// Skip (and count) queries none of whose targets is in the gallery
    /// (`--skip-missing`).
    skip_missing: bool,
    /// The tables' column names (`--id-column`, `--embedding-column`,
    /// `--target-column`; the target column is read when present unless named).
    id_column: String,
    embedding_column: String,
    target_column: Option<String>,
}

impl Options {
    fn pass_options(&self, py: Python<'_>) -> PyResult<PassOptions> {
        let memory: MemoryBudget = self.memory_limit.parse().map_err(|e| to_python(py, e))?;
        let precision: Precision = self.precision.parse().map_err(|e| to_python(py, e))?;
        Ok(PassOptions {
            memory,
            threads: self.threads,
            precision,
            sinkhorn_tolerance: self.tolerance,
            read: ReadOptions {
                normalize: self.normalize,
                skip_missing_targets: self.skip_missing,
                ..ReadOptions::with_columns(
                    &self.id_column,
                    &self.embedding_column,
                    self.target_column.as_deref(),
                )
            },
            ..PassOptions::default()
        })
    }

    fn bank_sample(&self) -> Option<BankSample> {
        self.bank_sample.map(|rows| BankSample {
            rows,
            seed: self.seed,
        })
    }
}

/// The tables and choices of a `run` (and of `compare`'s run), as the
/// package passes them (a dict).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct RunArgs {
    queries: String,
    gallery: String,
    bank: Option<String>,
    gallery_bank: Option<String>,
    methods: Vec<String>,
    k: usize,
    transductive: bool,
    out_dir: PathBuf,
    overwrite: bool,
    /// Seconds between checkpoint saves (`None`: no checkpoint).
    checkpoint_interval: Option<f64>,
    resume: bool,
    /// `parquet` or `delta`, as `--format`.
    format: String,
    /// Add a version to existing Delta tables, as `--append`.
    append: bool,
}

/// The checkpointing of a job (`checkpoint_interval` seconds between saves,
/// `None` for none; `resume` continues an interrupted job and keeps saving,
/// once a minute unless told otherwise), as `--checkpoint-interval` and
/// `--resume` set it.
fn checkpoint_options(
    py: Python<'_>,
    interval: Option<f64>,
    resume: bool,
) -> PyResult<CheckpointOptions> {
    let interval = match interval {
        Some(seconds) if !(seconds.is_finite() && seconds >= 0.0) => {
            return Err(usage(
                py,
                format!("checkpoint_interval must be a number of seconds ≥ 0, not {seconds}"),
            ));
        }
        Some(seconds) => Some(Duration::try_from_secs_f64(seconds).map_err(|_| {
            usage(
                py,
                format!("checkpoint_interval {seconds:e} is too large a number of seconds"),
            )
        })?),
        None => resume.then_some(CheckpointOptions::DEFAULT_INTERVAL),
    };
    Ok(CheckpointOptions { interval, resume })
}

/// The format of a call's tabular outputs (`format`, `append`), as
/// `--format` and `--append` give it.
fn table_format(py: Python<'_>, format: &str, append: bool) -> PyResult<TableFormat> {
    TableFormat::new(format, append).map_err(|e| to_python(py, e))
}

/// `outputs` declared in the call's `table` format (`format`, `append`)
/// for as long as the result lives.
fn declare_tables(
    py: Python<'_>,
    table: &(String, bool),
    outputs: Vec<PathBuf>,
    overwrite: bool,
) -> PyResult<DeclaredTables> {
    table_format(py, &table.0, table.1)?
        .declare(outputs, overwrite)
        .map_err(|e| to_python(py, e))
}

impl RunArgs {
    /// The run these arguments describe, with `params` and `options`, and
    /// its outputs declared in their format for the call.
    fn job(
        self,
        py: Python<'_>,
        params: &Bound<'_, PyDict>,
        options: &Options,
    ) -> PyResult<(RunJob, DeclaredTables)> {
        let format = table_format(py, &self.format, self.append)?;
        let tables = pipeline::declare_run_tables(format, &self.out_dir, self.overwrite)
            .map_err(|e| to_python(py, e))?;
        let job = RunJob {
            queries: self.queries,
            gallery: self.gallery,
            bank: self.bank.unwrap_or_default(),
            gallery_bank: self.gallery_bank,
            bank_sample: options.bank_sample(),
            transductive: self.transductive,
            methods: method_specs(py, self.methods, params)?,
            k: self.k,
            out_dir: self.out_dir,
            overwrite: tables.replaces(),
            options: options.pass_options(py)?,
            cluster: None,
            checkpoint: checkpoint_options(py, self.checkpoint_interval, self.resume)?,
        };
        Ok((job, tables))
    }
}

/// `hubnorm run`: both passes into `out_dir`; returns summary.json's text.
#[pyfunction]
#[pyo3(signature = (args, params, options, on_progress))]
fn run(
    py: Python<'_>,
    args: RunArgs,
    params: &Bound<'_, PyDict>,
    options: Options,
    on_progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let (job, _tables) = args.job(py, params, &options)?;
    run_job(py, on_progress, |progress| pipeline::run(&job, progress))?;
    hubnorm::storage::read_to_string(&job.out_dir.join("summary.json"))
        .map_err(|e| to_python(py, e))
}

/// `hubnorm stats`: pass 1 into `out`; returns the path written.
#[pyfunction]
#[pyo3(signature = (gallery, bank, gallery_bank, methods, params, out, overwrite, format,
    checkpoint_interval, resume, options, on_progress))]
#[allow(clippy::too_many_arguments)]
fn stats(
    py: Python<'_>,
    gallery: String,
    bank: String,
    gallery_bank: Option<String>,
    methods: Vec<String>,
    params: &Bound<'_, PyDict>,
    out: PathBuf,
    overwrite: bool,
    format: String,
    checkpoint_interval: Option<f64>,
    resume: bool,
    options: Options,
    on_progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let tables = pipeline::declare_stats_table(table_format(py, &format, false)?, &out, overwrite)
        .map_err(|e| to_python(py, e))?;
    let job = StatsJob {
        gallery,
        bank,
        gallery_bank,
        bank_sample: options.bank_sample(),
        methods: method_specs(py, methods, params)?,
        out,
        overwrite: tables.replaces(),
        options: options.pass_options(py)?,
        checkpoint: checkpoint_options(py, checkpoint_interval, resume)?,
    };
    let outcome = run_job(py, on_progress, |progress| {
        pipeline::run_stats(&job, progress)
    })?;
    Ok(outcome.path.display().to_string())
}

/// `hubnorm search`: pass 2 into `out`; returns the summary as JSON.
#[pyfunction]
#[pyo3(signature = (queries, gallery, stats, methods, params, k, out, overwrite, table,
    options, on_progress))]
#[allow(clippy::too_many_arguments)]
fn search(
    py: Python<'_>,
    queries: String,
    gallery: String,
    stats: Option<PathBuf>,
    methods: Vec<String>,
    params: &Bound<'_, PyDict>,
    k: usize,
    out: PathBuf,
    overwrite: bool,
    table: (String, bool),
    options: Options,
    on_progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    let tables = declare_tables(py, &table, vec![out.clone()], overwrite)?;
    // Without parameters, each method takes the statistic the file holds.
    let from_file = match &stats {
        Some(path) => pipeline::stats_file_methods(path).map_err(|e| to_python(py, e))?,
        None => Vec::new(),
    };
    let kinds = method_kinds(py, &methods)?;
    let methods =
        hubnorm::stats_file::methods_for_stats_file(&kinds, &method_params(params)?, &from_file);
    let job = SearchJob {
        queries,
        gallery,
        stats,
        methods,
        k,
        out,
        overwrite: tables.replaces(),
        options: options.pass_options(py)?,
    };
    let summary = run_job(py, on_progress, |progress| {
        pipeline::run_search(&job, progress)
    })?;
    serde_json::to_string(&summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// `hubnorm compare`: a run of `methods` (every method the inputs allow
/// when empty) into `out_dir` with the comparison files; returns the
/// summary as JSON and the methods left out, with why.
#[pyfunction]
#[pyo3(signature = (args, params, hubness_k, html, overwrite_html, options, on_progress))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    args: RunArgs,
    params: &Bound<'_, PyDict>,
    hubness_k: usize,
    html: Option<PathBuf>,
    overwrite_html: bool,
    options: Options,
    on_progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<(String, Vec<String>)> {
    if hubness_k == 0 {
        return Err(usage(py, "hubness_k must be at least 1".into()));
    }
    // The run's outputs may go to a scratch folder that needs no
    // permission to overwrite; the page goes where the user said.
    if let Some(page) = &html {
        hubnorm::sink::refuse_existing(page, overwrite_html).map_err(|e| to_python(py, e))?;
    }
    let (mut run, _tables) = args.job(py, params, &options)?;
    run.options.report.hubness_k = hubness_k;
    let job = CompareJob {
        run,
        text_column: "text".into(),
        html,
    };
    let outcome = run_job(py, on_progress, |progress| {
        evaluate::compare(&job, progress)
    })?;
    let summary = serde_json::to_string(&outcome.summary)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok((summary, outcome.left_out))
}

/// `hubnorm report`: hubness and quality of a results file (anyone's) into
/// `out_dir`.
#[pyfunction]
#[pyo3(signature = (results, gallery, queries, stats, k, out_dir, html, overwrite, table,
    options, on_progress))]
#[allow(clippy::too_many_arguments)]
fn report(
    py: Python<'_>,
    results: PathBuf,
    gallery: String,
    queries: Option<String>,
    stats: Option<PathBuf>,
    k: usize,
    out_dir: PathBuf,
    html: Option<PathBuf>,
    overwrite: bool,
    table: (String, bool),
    options: Options,
    on_progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let outputs = REPORT_OUTPUTS
        .iter()
        .map(|name| out_dir.join(name))
        .collect();
    let tables = declare_tables(py, &table, outputs, overwrite)?;
    let mut pass = options.pass_options(py)?;
    pass.report.hubness_k = k;
    let job = ReportJob {
        results,
        gallery,
        queries,
        stats,
        k,
        out_dir,
        html,
        text_column: "text".into(),
        overwrite: tables.replaces(),
        options: pass,
    };
    run_job(py, on_progress, |progress| evaluate::report(&job, progress))?;
    Ok(())
}

/// `hubnorm export`: the gallery with the method's h(g) appended to every
/// vector, for an inner-product index; returns (rows, dimension).
#[pyfunction]
#[pyo3(signature = (gallery, stats, method, params, out, overwrite, table, options, on_progress))]
#[allow(clippy::too_many_arguments)]
fn export(
    py: Python<'_>,
    gallery: String,
    stats: PathBuf,
    method: String,
    params: &Bound<'_, PyDict>,
    out: PathBuf,
    overwrite: bool,
    table: (String, bool),
    options: Options,
    on_progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<(u64, usize)> {
    let tables = declare_tables(py, &table, vec![out.clone()], overwrite)?;
    let from_file = pipeline::stats_file_methods(&stats).map_err(|e| to_python(py, e))?;
    let kinds = method_kinds(py, &[method])?;
    let [method] = hubnorm::stats_file::methods_for_stats_file(
        &kinds,
        &method_params(params)?,
        &from_file,
    )[..] else {
        unreachable!("one kind, one method");
    };
    let job = ExportJob {
        gallery,
        stats,
        method,
        out,
        overwrite: tables.replaces(),
        options: options.pass_options(py)?,
    };
    let summary = run_job(py, on_progress, |progress| {
        hubnorm::export::export(&job, progress)
    })?;
    Ok((summary.rows, summary.dim))
}

/// `hubnorm tune`: each method's parameters chosen on validation queries
/// (`validation`, a table with ground truth; or `validation_split` of the
/// bank); writes `tune.parquet` and `tuned.json` into `out_dir` and returns
/// tuned.json's text.
#[pyfunction]
#[pyo3(signature = (gallery, bank, gallery_bank, validation, validation_split,
    validation_gallery, methods, grid, metric, out_dir, html, overwrite, options, on_progress))]
#[allow(clippy::too_many_arguments)]
fn tune(
    py: Python<'_>,
    gallery: String,
    bank: String,
    gallery_bank: Option<String>,
    validation: Option<String>,
    validation_split: Option<f64>,
    validation_gallery: Option<String>,
    methods: Vec<String>,
    grid: Vec<String>,
    metric: &str,
    out_dir: PathBuf,
    html: Option<PathBuf>,
    overwrite: bool,
    options: Options,
    on_progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<String> {
    use hubnorm::tune::{GridAxis, TuneJob, Validation};
    let validation = match (validation, validation_split) {
        (Some(queries), None) => Validation::Queries(queries),
        (None, Some(fraction)) => Validation::SplitBank {
            fraction,
            seed: options.seed,
            gallery: validation_gallery,
        },
        _ => {
            return Err(usage(
                py,
                "tune takes validation queries or a validation_split of the bank, one of them"
                    .into(),
            ))
        }
    };
    let grid = grid
        .iter()
        .map(|axis| axis.parse::<GridAxis>())
        .collect::<hubnorm::Result<Vec<_>>>()
        .map_err(|e| to_python(py, e))?;
    let job = TuneJob {
        gallery,
        bank,
        gallery_bank,
        validation,
        methods: method_kinds(py, &methods)?,
        grid,
        metric: metric.parse().map_err(|e| to_python(py, e))?,
        out_dir: out_dir.clone(),
        html,
        overwrite,
        options: options.pass_options(py)?,
    };
    run_job(py, on_progress, |progress| {
        hubnorm::tune::tune(&job, progress)
    })?;
    let tuned = hubnorm::storage::read_to_string(&out_dir.join("tuned.json"))
        .map_err(|e| to_python(py, e))?;
    with_keywords(&tuned).map_err(|e| PyRuntimeError::new_err(format!("tuned.json: {e}")))
}

/// tuned.json's text with, beside each chosen method's `parameters` (named
/// as in stats files and `--config`), the same values as `keywords`: what
/// `hubnorm.run(..., methods=[method], **keywords)` takes.
fn with_keywords(tuned: &str) -> Result<String, String> {
    let mut config: serde_json::Value = serde_json::from_str(tuned).map_err(|e| e.to_string())?;
    let methods = config
        .get_mut("methods")
        .and_then(|m| m.as_array_mut())
        .ok_or("no methods")?;
    for entry in methods {
        let kind: MethodKind = entry
            .get("method")
            .and_then(|m| m.as_str())
            .ok_or("a method without a name")?
            .parse()
            .map_err(|e: HubnormError| e.to_string())?;
        let mut keywords = serde_json::Map::new();
        if let Some(values) = entry.get("parameters").and_then(|p| p.as_object()) {
            for p in kind.method().parameters() {
                if let Some(value) = values.get(p.name).and_then(|v| v.as_f64()) {
                    keywords.insert(p.flag.replace('-', "_"), (value - p.flag_offset).into());
                }
            }
        }
        entry["keywords"] = keywords.into();
    }
    serde_json::to_string(&config).map_err(|e| e.to_string())
}

/// `hubnorm sql`: `sql` (statements separated by `;`) over `tables` (name,
/// path) and the tables of `run_dir`, with hubnorm's functions installed.
/// Returns the last statement's rows as a `pyarrow.Table`, handed over
/// through the Arrow C data interface (no copy).
#[pyfunction]
#[pyo3(signature = (sql, tables, run_dir, options, on_progress))]
fn sql<'py>(
    py: Python<'py>,
    sql: String,
    tables: Vec<(String, String)>,
    run_dir: Option<PathBuf>,
    options: Options,
    on_progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    use arrow_pyarrow::IntoPyArrow;
    let pass = options.pass_options(py)?;
    let job = SqlJob {
        tables,
        run_dir,
        sql,
        source: None,
        format: OutputFormat::Batches,
        max_table_rows: 0,
        out: None,
        overwrite: false,
        options: SqlOptions {
            memory: pass.memory,
            threads: pass.threads,
            read: pass.read,
        },
        cluster: None,
    };
    let outcome = run_job(py, on_progress, |_| run_sql(&job, &mut std::io::sink()))?;
    let (schema, batches) = outcome.batches.expect("kept by OutputFormat::Batches");
    // DataFusion's batches may carry less field metadata than the plan's schema.
    let batches = batches
        .into_iter()
        .map(|batch| batch.with_schema(schema.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    arrow_pyarrow::Table::try_new(batches, schema)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
        .into_pyarrow(py)
}

/// The registry: each method's name, summary, parameters (flag, default,
/// help) and the properties the package's docstrings list methods by.
#[pyfunction]
fn methods(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    hubnorm::method::REGISTRY
        .iter()
        .map(|m| {
            let entry = PyDict::new(py);
            entry.set_item("name", m.name())?;
            entry.set_item("summary", m.summary())?;
            let parameters: Vec<(String, f64, &str)> = m
                .parameters()
                .iter()
                // The keyword's default, as for the CLI flag (`pseudo_queries` is m − 1).
                .map(|p| (p.flag.replace('-', "_"), p.default - p.flag_offset, p.help))
                .collect();
            entry.set_item("parameters", parameters)?;
            // The properties the docstrings list methods by.
            let kind = MethodKind::named(m.name()).expect("a registered name");
            let spec = MethodSpec::default_for(kind);
            entry.set_item("transductive", kind.takes_queries_as_bank())?;
            entry.set_item("iterating", m.sinkhorn(&spec).is_some())?;
            entry.set_item("screened_bank_pass", spec.screens_bank_pass())?;
            Ok(entry)
        })
        .collect()
}

/// An Arrow table handed over by Python, readable by the jobs under
/// `path` (`memory://ROLE-N`) until this object is dropped. Its record
/// batches are imported through the Arrow C stream interface: they share
/// the producer's buffers (pyarrow, polars, numpy through pyarrow), and
/// nothing is copied. A one-shot stream is drained here, since the passes
/// read their inputs several times; its batches are then held in memory.
#[pyclass(frozen, module = "hubnorm._hubnorm")]
struct InMemoryTable {
    registration: hubnorm::source::memory::Registration,
    rows: u64,
}

#[pymethods]
impl InMemoryTable {
    #[new]
    fn new(py: Python<'_>, data: &Bound<'_, PyAny>, role: &str) -> PyResult<Self> {
        use arrow::record_batch::RecordBatchReader;
        use arrow_pyarrow::FromPyArrow;
        let describe = |message: String| {
            let location = Location {
                file: format!("the in-memory {role}").into(),
                row: None,
                column: None,
            };
            to_python(py, HubnormError::Input { location, message })
        };
        let reader = arrow::ffi_stream::ArrowArrayStreamReader::from_pyarrow_bound(data)
            .map_err(|e| describe(format!("not an Arrow stream: {e}")))?;
        let schema = reader.schema();
        let batches = reader
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| describe(format!("reading its Arrow stream failed: {e}")))?;
        let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
        let registration = hubnorm::source::memory::register(role, schema, batches)
            .map_err(|e| to_python(py, e))?;
        Ok(InMemoryTable { registration, rows })
    }

    /// The path the jobs read the table by.
    #[getter]
    fn path(&self) -> &str {
        self.registration.path()
    }

    /// The table's rows.
    #[getter]
    fn rows(&self) -> u64 {
        self.rows
    }

    /// The addresses of every buffer the table's columns hold (children
    /// included): how the tests see that the producer's buffers are shared.
    fn buffer_addresses(&self) -> PyResult<Vec<usize>> {
        fn collect(data: &arrow::array::ArrayData, out: &mut Vec<usize>) {
            out.extend(data.buffers().iter().map(|b| b.as_ptr() as usize));
            data.child_data()
                .iter()
                .for_each(|child| collect(child, out));
        }
        let table = hubnorm::source::memory::lookup(std::path::Path::new(self.path()))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let mut out = Vec::new();
        for batch in &table.batches {
            for column in batch.columns() {
                collect(&column.to_data(), &mut out);
            }
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!("<InMemoryTable {} ({} rows)>", self.path(), self.rows)
    }
}

#[pymodule]
fn _hubnorm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(search, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(report, m)?)?;
    m.add_function(wrap_pyfunction!(export, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(sql, m)?)?;
    m.add_function(wrap_pyfunction!(methods, m)?)?;
    m.add_class::<InMemoryTable>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
