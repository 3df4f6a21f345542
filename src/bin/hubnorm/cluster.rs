//! `hubnorm cluster scheduler|executor`: arguments in, a cluster process
//! until SIGINT or SIGTERM, its log on stderr.

use hubnorm::Result;

use crate::cli::ClusterArgs;

#[cfg(feature = "cluster")]
pub fn cluster(args: ClusterArgs) -> Result<()> {
    use hubnorm::cluster::{
        exposure_warning, run_executor, run_scheduler, ExecutorOptions, SchedulerAddress,
        SchedulerOptions,
    };

    use crate::cli::ClusterRole;

    log_to_stderr();
    match args.role {
        ClusterRole::Scheduler(args) => {
            if let Some(warning) = exposure_warning("scheduler", args.bind) {
                eprintln!("warning: {warning}");
            }
            let options = SchedulerOptions {
                bind: args.bind,
                executor_timeout: std::time::Duration::from_secs(args.executor_timeout),
            };
            run_scheduler(&options, |addr| {
                eprintln!(
                    "hubnorm cluster scheduler listening on {addr} (clients: --cluster {}, executors: --scheduler {addr})",
                    SchedulerAddress::from(addr)
                );
            })
        }
        ClusterRole::Executor(args) => {
            let options = ExecutorOptions {
                scheduler: args.scheduler.parse::<SchedulerAddress>()?,
                bind: args.bind,
                threads: args.threads,
                memory: args.memory_limit,
                work_dir: args.work_dir,
            };
            if let Some(warning) = exposure_warning("executor", args.bind) {
                eprintln!("warning: {warning}");
            }
            run_executor(&options, |start| {
                eprintln!(
                    "hubnorm cluster executor serving Arrow Flight on {} with {} task slots and {} MiB, work directory {}; registering with {}",
                    start.flight,
                    start.slots,
                    options.memory.bytes() >> 20,
                    start.work_dir.display(),
                    options.scheduler
                );
            })
        }
    }
}

#[cfg(not(feature = "cluster"))]
pub fn cluster(_: ClusterArgs) -> Result<()> {
    Err(hubnorm::HubnormError::Usage(
        "this hubnorm was built without the `cluster` feature (cargo build --release --features cluster)"
            .into(),
    ))
}

/// Sends the records of Ballista (and of everything else that logs through
/// the `log` crate) to stderr, one line each with the time, the level and
/// the module: at `RUST_LOG`'s level (off, error, warn, info, debug or
/// trace), info when unset.
#[cfg(feature = "cluster")]
fn log_to_stderr() {
    let level = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => text.trim().parse().unwrap_or_else(|_| {
            eprintln!("warning: RUST_LOG={text} is not a level (off, error, warn, info, debug, trace); logging at info");
            log::LevelFilter::Info
        }),
        _ => log::LevelFilter::Info,
    };
    if log::set_boxed_logger(Box::new(StderrLog { level })).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(feature = "cluster")]
struct StderrLog {
    level: log::LevelFilter,
}

#[cfg(feature = "cluster")]
impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            use std::io::Write;
            // A closed stderr must not stop a server: the line is lost.
            let _ = writeln!(
                std::io::stderr().lock(),
                "{} {:<5} {}: {}",
                humantime::format_rfc3339_millis(std::time::SystemTime::now()),
                record.level(),
                record.target(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}
