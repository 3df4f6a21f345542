//! `hubnorm cluster scheduler|executor`: arguments in, a cluster process
//! until SIGINT or SIGTERM, its log on stderr.

use hubnorm::Result;

use crate::cli::ClusterArgs;

#[cfg(feature = "cluster")]
pub fn cluster(args: ClusterArgs) -> Result<()> {
    use hubnorm::cluster::{
        exposure_warning, log_to_stderr, run_executor, run_scheduler, ExecutorOptions,
        SchedulerAddress, SchedulerOptions,
    };

    use crate::cli::ClusterRole;

    for warning in log_to_stderr() {
        eprintln!("warning: {warning}");
    }
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
