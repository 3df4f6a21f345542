//! Arbitrary command lines through the CLI's clap definitions and every
//! library-side parser and validator they reach.
//!
//! The input is split on NUL bytes into arguments (lossy UTF-8) after
//! `hubnorm`, parsed with the binary's own `Cli` (src/bin/hubnorm/cli.rs,
//! included as is), and on success converted into the library's jobs the
//! way src/bin/hubnorm/{run,evaluate,sql}.rs do, then handed to the library
//! entry points. Those check methods, hyperparameters, k, the transductive
//! and protocol rules, the metric and the grid before they open any table;
//! every path and table spec is placed under a directory that does not
//! exist, so a glob is still parsed but nothing is read, walked or written,
//! and every entry point must end in a typed error. Nothing may panic.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use clap::Parser;
use hubnorm::options::{MethodKind, MethodSpec, PassOptions};
use hubnorm::progress::Silent;
use hubnorm::{HubnormError, Result};
use libfuzzer_sys::fuzz_target;

#[allow(dead_code, unused_imports)]
#[path = "../../src/bin/hubnorm/bench.rs"]
mod bench;
#[allow(dead_code, unused_imports)]
#[path = "../../src/bin/hubnorm/cli.rs"]
mod cli;

use cli::{Cli, Command, MethodArgs};

/// A directory that does not exist: every path and table spec goes under it.
fn nowhere() -> &'static str {
    static NOWHERE: OnceLock<String> = OnceLock::new();
    NOWHERE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!(
            "hubnorm-fuzz-nowhere-{}/does-not-exist",
            std::process::id()
        ));
        assert!(!dir.exists(), "{} must not exist", dir.display());
        dir.to_str().expect("temporary path is UTF-8").to_owned()
    })
}

/// A table spec (path, directory or glob) under [`nowhere`]: globs are
/// parsed, and match nothing.
fn spec(s: &str) -> String {
    format!("{}/{s}", nowhere())
}

fn path(p: &Path) -> PathBuf {
    PathBuf::from(spec(&p.to_string_lossy()))
}

/// An error is fine; its message and exit code must be computable.
fn settle<T>(r: Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            let _ = e.to_string();
            let _ = e.exit_code();
            None
        }
    }
}

/// An entry point that opens tables under [`nowhere`]: it must fail.
fn must_fail<T>(what: &str, r: Result<T>) {
    assert!(settle(r).is_none(), "{what} succeeded without its inputs");
}

/// Options with one worker thread (the pool is built for every input).
fn one_thread(mut options: PassOptions) -> PassOptions {
    options.threads = 1;
    options
}

/// Everything a method list goes through besides the passes themselves.
fn exercise_specs(specs: &[MethodSpec]) {
    for m in specs {
        let _ = m.column_prefix();
        let params: Vec<(String, f64)> = m
            .parameters()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        settle(MethodSpec::with_parameters(m.kind(), &params));
        settle(m.validate());
    }
    // The stats file's method metadata, written and read back.
    let json = hubnorm::stats_file::methods_json(specs);
    if let Ok(list) = serde_json::from_str::<serde_json::Value>(&json) {
        settle(hubnorm::stats_file::methods_from_json(
            &list,
            Path::new("fuzz"),
            "hubnorm.methods",
        ));
    }
}

/// `MethodArgs::specs`, with `--config` under [`nowhere`].
fn specs(method: &MethodArgs, default: MethodKind) -> Result<Vec<MethodSpec>> {
    let mut method = method.clone();
    method.config = method.config.as_deref().map(path);
    let specs = method.specs(default)?;
    exercise_specs(&specs);
    Ok(specs)
}

/// The binary's `MethodArgs::specs_for_stats` with a stats file that holds
/// no method (reading one is the file system's business).
fn methods_without_stats(method: &MethodArgs) -> Result<Vec<MethodSpec>> {
    let mut method = method.clone();
    method.config = method.config.as_deref().map(path);
    let specs = method.specs_for_stats(&[])?;
    exercise_specs(&specs);
    Ok(specs)
}

/// The binary's `RunArgs::job`, every path under [`nowhere`], one thread.
fn run_job(args: &cli::RunArgs, methods: Vec<MethodSpec>) -> Result<hubnorm::pipeline::RunJob> {
    let mut job = args.job(methods)?;
    job.queries = spec(&job.queries);
    job.gallery = spec(&job.gallery);
    job.bank = spec(&job.bank);
    job.gallery_bank = job.gallery_bank.as_deref().map(spec);
    job.out_dir = path(&job.out_dir);
    job.options = one_thread(job.options);
    Ok(job)
}

fn exercise(command: Command) -> Result<()> {
    match command {
        Command::Run(args) => {
            let methods = specs(&args.method, MethodKind::default())?;
            let job = run_job(&args, methods)?;
            must_fail("run", hubnorm::pipeline::run(&job, &Silent));
        }
        Command::Stats(args) => {
            let mut args = args;
            args.method.config = args.method.config.as_deref().map(path);
            let mut job = args.job()?;
            exercise_specs(&job.methods);
            job.gallery = spec(&job.gallery);
            job.bank = spec(&job.bank);
            job.gallery_bank = job.gallery_bank.as_deref().map(spec);
            job.out = path(&job.out);
            job.options = one_thread(job.options);
            if args.update {
                must_fail(
                    "stats --update",
                    hubnorm::update::update_stats(&job, &Silent),
                );
            } else {
                // Checks the methods alone, then the whole pass.
                must_fail("stats", hubnorm::pipeline::stats_methods(&job));
                must_fail("stats", hubnorm::pipeline::run_stats(&job, &Silent));
            }
        }
        Command::Search(args) => {
            let methods = methods_without_stats(&args.method)?;
            settle(hubnorm::pipeline::stats_file_methods(&path(
                args.stats.as_deref().unwrap_or(Path::new("stats.parquet")),
            )));
            let job = hubnorm::pipeline::SearchJob {
                queries: spec(&args.queries),
                gallery: spec(&args.gallery),
                stats: args.stats.as_deref().map(path),
                methods,
                k: args.k,
                out: path(&args.out),
                overwrite: args.overwrite,
                options: one_thread(args.quality.apply(args.common.pass_options())?),
            };
            must_fail("search", hubnorm::pipeline::run_search(&job, &Silent));
        }
        Command::Compare(args) => {
            let method = &args.run.method;
            let methods =
                if method.method.is_some() || !method.methods.is_empty() || method.config.is_some()
                {
                    specs(method, MethodKind::baseline())?
                } else {
                    Vec::new()
                };
            if args.hubness_k == 0 {
                return Err(HubnormError::Usage("--hubness-k must be at least 1".into()));
            }
            let mut run = run_job(&args.run, methods)?;
            run.options.report.hubness_k = args.hubness_k;
            let job = hubnorm::evaluate::CompareJob {
                run,
                text_column: args.text_column,
                html: args.html.as_deref().map(path),
            };
            must_fail("compare", hubnorm::evaluate::compare(&job, &Silent));
        }
        Command::Report(args) => {
            let mut options = one_thread(args.quality.apply(args.common.pass_options())?);
            options.report.hubness_k = args.k;
            let job = hubnorm::evaluate::ReportJob {
                results: path(&args.results),
                gallery: spec(&args.gallery),
                queries: args.queries.as_deref().map(spec),
                stats: args.stats.as_deref().map(path),
                k: args.k,
                out_dir: path(&args.out),
                html: args.html.as_deref().map(path),
                text_column: args.text_column,
                overwrite: args.overwrite,
                options,
            };
            must_fail("report", hubnorm::evaluate::report(&job, &Silent));
        }
        Command::Tune(args) => {
            use hubnorm::tune::{grid_of, GridAxis, TuneJob, Validation};
            let validation = match (&args.validation, args.validation_split) {
                (Some(s), _) => Validation::Queries(spec(s)),
                (None, Some(fraction)) => Validation::SplitBank {
                    fraction,
                    seed: args.seed,
                    gallery: args.validation_gallery.as_deref().map(spec),
                },
                (None, None) => unreachable!("clap requires one"),
            };
            let methods = args
                .methods
                .iter()
                .map(|m| m.parse::<MethodKind>())
                .collect::<Result<Vec<_>>>()?;
            let grid = args
                .grid
                .iter()
                .map(|g| g.parse::<GridAxis>())
                .collect::<Result<Vec<_>>>()?;
            let metric = args.metric.parse()?;
            // The grid tune evaluates once its tables are open.
            let kinds = if methods.is_empty() {
                MethodKind::all().collect()
            } else {
                methods.clone()
            };
            for kind in kinds {
                if let Some(points) = settle(grid_of(kind, &grid)) {
                    exercise_specs(&points);
                }
            }
            let mut options = one_thread(args.quality.apply(args.common.pass_options())?);
            options.sinkhorn_tolerance = args.tol;
            let job = TuneJob {
                gallery: spec(&args.gallery),
                bank: spec(&args.bank),
                gallery_bank: args.gallery_bank.as_deref().map(spec),
                validation,
                methods,
                grid,
                metric,
                out_dir: path(&args.out),
                html: args.html.as_deref().map(path),
                overwrite: args.overwrite,
                options,
            };
            let _ = job.metric.name();
            must_fail("tune", hubnorm::tune::tune(&job, &Silent));
        }
        Command::Export(args) => {
            let methods = methods_without_stats(&args.method)?;
            let [method] = methods[..] else {
                return Err(HubnormError::Usage("export takes one method".into()));
            };
            let job = hubnorm::export::ExportJob {
                gallery: spec(&args.gallery),
                stats: path(&args.stats),
                method,
                out: path(&args.out),
                overwrite: args.overwrite,
                options: one_thread(args.common.pass_options()),
            };
            must_fail("export", hubnorm::export::export(&job, &Silent));
        }
        Command::Sql(args) => {
            // The SQL face is not built here (no `sql` feature); its options
            // are checked as src/bin/hubnorm/sql.rs does before the engine.
            for t in &args.tables {
                match t.split_once('=') {
                    Some((name, p)) if !name.is_empty() && !p.is_empty() => {}
                    _ => return Err(HubnormError::Usage(format!("--table {t}"))),
                }
            }
            let _ = args.memory_limit.to_string();
        }
        // Parsing is all: running it would benchmark.
        Command::Bench(_) => {}
        // Parsing is all: the cluster's processes serve until stopped.
        Command::Cluster(_) => {}
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let args = data
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let cli = match Cli::try_parse_from(std::iter::once("hubnorm".to_owned()).chain(args)) {
        Ok(cli) => cli,
        Err(e) => {
            // Usage errors, --help and --version render without panicking.
            let _ = e.render().to_string();
            return;
        }
    };
    settle(exercise(cli.command));
});
