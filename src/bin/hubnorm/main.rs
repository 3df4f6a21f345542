//! The `hubnorm` command: a thin layer over the library.

mod bench;
mod cli;
mod cluster;
mod evaluate;
mod progress;
mod run;
mod sql;

use std::process::ExitCode;

use clap::Parser;

/// The environment variable that names a system BLAS for the similarity tiles.
const BLAS_VARIABLE: &str = "HUBNORM_BLAS";

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so printing into a closed pipe (`| head`) would
    // panic; the default action ends the process quietly, as Unix tools do.
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_DFL before any thread
    // starts has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Test builds only (`failpoints`): faults the environment asks for.
    let _faults = fail::FailScenario::setup();
    let cli = cli::Cli::parse();
    // The cluster's servers listen for SIGINT and SIGTERM themselves (and
    // Ballista's executor too), to leave the cluster cleanly.
    if !matches!(cli.command, cli::Command::Cluster(_)) {
        cancel_on_signals();
    }
    scalar_screen_from_env();
    let outcome = blas_from_env()
        .and_then(|()| storage_options(&cli.storage_options))
        .and_then(|()| match cli.command {
            cli::Command::Run(args) => run::run(args),
            cli::Command::Stats(args) => run::stats(args),
            cli::Command::Search(args) => run::search(args),
            cli::Command::Compare(args) => evaluate::compare(args),
            cli::Command::Report(args) => evaluate::report(args),
            cli::Command::Tune(args) => evaluate::tune(args),
            cli::Command::Export(args) => run::export(args),
            cli::Command::Sql(args) => sql::sql(args),
            cli::Command::Bench(args) => bench::bench(args),
            cli::Command::Cluster(args) => cluster::cluster(args),
        });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Print the chain of causes, but for those the message already
            // quotes (an I/O error's text is part of hubnorm's own).
            let mut message = format!("error: {err}");
            let mut source = std::error::Error::source(&err);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !message.contains(&text) {
                    message.push_str(&format!("\n  caused by: {text}"));
                }
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::from(err.exit_code() as u8)
        }
    }
}

/// Ctrl-C (or SIGTERM) asks the passes to stop at their next block, so
/// temporary files are removed and nothing half-written is renamed into
/// place; a second one exits at once.
fn cancel_on_signals() {
    let installed = ctrlc::set_handler(|| {
        if hubnorm::cancel::request() {
            std::process::exit(130);
        }
        eprintln!("\nstopping after the current block (Ctrl-C again to stop at once)");
    });
    if let Err(err) = installed {
        eprintln!(
            "warning: no Ctrl-C handler ({err}); an interrupted run may leave temporary files"
        );
    }
}

/// `--storage-option KEY=VALUE`s, for every object store a PATH names.
fn storage_options(options: &[String]) -> hubnorm::Result<()> {
    let pairs = options
        .iter()
        .map(|o| hubnorm::storage::parse_option(o))
        .collect::<hubnorm::Result<Vec<_>>>()?;
    hubnorm::storage::configure(&pairs)
}

/// `HUBNORM_SCALAR_SCREEN=1`: `--precision screened` and `auto` screen
/// on CPUs without AVX512_BF16 too, in slow scalar code, so that the
/// screened path can be tested anywhere (the results are the exact ones).
fn scalar_screen_from_env() {
    if std::env::var_os("HUBNORM_SCALAR_SCREEN").is_some_and(|v| v == "1") {
        hubnorm::kernel::bf16::allow_scalar_screen();
    }
}

/// `HUBNORM_BLAS=/path/to/libmkl_rt.so` (or OpenBLAS, BLIS): every similarity
/// tile is computed by that library's `cblas_sgemm` instead of the `gemm` crate.
/// Unset or empty: the `gemm` crate.
fn blas_from_env() -> hubnorm::Result<()> {
    match std::env::var_os(BLAS_VARIABLE) {
        Some(path) if !path.is_empty() => {
            hubnorm::kernel::gemm::use_blas(std::path::Path::new(&path)).map_err(|err| {
                hubnorm::HubnormError::Usage(format!("{BLAS_VARIABLE}={}: {err}", path.display()))
            })
        }
        _ => Ok(()),
    }
}
