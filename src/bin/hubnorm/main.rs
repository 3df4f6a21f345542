//! The `hubnorm` command: a thin layer over the library.

mod bench;
mod cli;
mod evaluate;
mod progress;
mod run;
mod sql;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let outcome = match cli.command {
        cli::Command::Run(args) => run::run(args),
        cli::Command::Stats(args) => run::stats(args),
        cli::Command::Search(args) => run::search(args),
        cli::Command::Compare(args) => evaluate::compare(args),
        cli::Command::Report(args) => evaluate::report(args),
        cli::Command::Tune(args) => evaluate::tune(args),
        cli::Command::Export(args) => run::export(args),
        cli::Command::Sql(args) => sql::sql(args),
        cli::Command::Bench(args) => bench::bench(args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Print the whole chain of causes.
            let mut message = format!("error: {err}");
            let mut source = std::error::Error::source(&err);
            while let Some(cause) = source {
                message.push_str(&format!("\n  caused by: {cause}"));
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::from(err.exit_code() as u8)
        }
    }
}
