//! `hubnorm cluster executor`: Ballista's executor with hubnorm's functions,
//! codecs and object stores.
//!
//! It registers with the scheduler by polling it for tasks, runs them with
//! `threads` slots (concurrent tasks) and a memory pool of `memory` split
//! between them, writes their shuffle and result partitions as Arrow IPC
//! under its work directory, and serves those over Arrow Flight on its port.

use std::fs::{File, TryLockError};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::RuntimeProducer;
use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_executor::health::ExecutorHealth;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionConfig;

use crate::error::{HubnormError, Result};
use crate::options::MemoryBudget;
use crate::sql::StoreRegistry;

use super::{
    ballista_error, logical_codec, physical_codec, server_state, SchedulerAddress, SCHEDULING,
};

/// How long a stopping executor may take to tell the scheduler and finish
/// its running tasks before the process ends anyway.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// How long an executor keeps trying to reach its scheduler at start-up
/// (so that the processes of a cluster may start in any order). hubnorm
/// waits itself: Ballista 55.0.0's own retry loop never ends (it measures
/// the time since an `Instant` it has just taken).
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

/// Options of `hubnorm cluster executor`.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler to register with.
    pub scheduler: SchedulerAddress,
    /// Where the Arrow Flight service listens (port 0: a free port, chosen
    /// before start-up). Clients and other executors fetch partitions here,
    /// so on several machines this is an address they can reach.
    pub bind: SocketAddr,
    /// Task slots, and the runtime's worker threads (0 = one per core).
    pub threads: usize,
    /// The memory pool, shared by the running tasks.
    pub memory: MemoryBudget,
    /// Shuffle and result partitions, and spill files; a fresh folder under
    /// the system's temporary directory, removed at exit, when `None`.
    pub work_dir: Option<PathBuf>,
}

/// What an executor is about to start with, for its start-up message.
#[derive(Debug, Clone)]
pub struct ExecutorStart {
    /// The Arrow Flight address (port 0 resolved).
    pub flight: SocketAddr,
    /// The task slots.
    pub slots: usize,
    /// The work directory, absolute.
    pub work_dir: PathBuf,
}

/// The least memory a task slot is given: a pass's plan needs some tens of
/// MiB at least (the refusal it makes below that names its own minimum).
const MIN_SLOT_MEMORY: usize = 16 << 20;

/// Runs an executor until SIGINT or SIGTERM (or the scheduler asks it to
/// stop), then returns `Ok` (exit code 0): on a signal it tells the
/// scheduler it is leaving, so its tasks go elsewhere, and waits for its
/// running tasks up to 30 s. `on_start` is called before it connects.
pub fn run_executor(
    options: &ExecutorOptions,
    on_start: impl FnOnce(&ExecutorStart),
) -> Result<()> {
    crate::inputs::check_threads(options.threads)?;
    let slots = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // Ballista reads a pool of 0 as unbounded, and one below a byte per
    // slot as a configuration error: both are refused in hubnorm's words.
    let per_slot = options.memory.bytes() / slots;
    if per_slot < MIN_SLOT_MEMORY {
        return Err(HubnormError::Usage(format!(
            "--memory-limit {} for {slots} task slots leaves {} per slot; an executor needs at least {} per slot (--memory-limit {} or more, or fewer --threads)",
            crate::options::human_bytes(options.memory.bytes() as u64),
            crate::options::human_bytes(per_slot as u64),
            crate::options::human_bytes(MIN_SLOT_MEMORY as u64),
            crate::options::human_bytes((MIN_SLOT_MEMORY * slots) as u64),
        )));
    }
    let flight = resolve_port(options.bind)?;
    let work_dir = WorkDir::open(options.work_dir.as_deref(), flight.port())?;
    let start = ExecutorStart {
        flight,
        slots,
        work_dir: work_dir.path.clone(),
    };
    let health = ExecutorHealth::new();
    let config = executor_config(options, &start, health.clone())?;
    on_start(&start);
    let runtime = super::runtime(slots)?;
    let outcome = runtime.block_on(async {
        let stop = super::stop_signal()?;
        tokio::pin!(stop);
        tokio::select! {
            reached = super::contact::reach(&options.scheduler, CONNECT_PATIENCE) => reached?,
            signal = &mut stop => {
                log::info!("{signal}: the executor stops before it registered");
                return Ok(());
            }
        }
        tokio::spawn(super::contact::watch(options.scheduler.clone(), health.clone()));
        let executor = start_executor_process(Arc::new(config));
        tokio::pin!(executor);
        tokio::select! {
            ended = &mut executor => ended.map_err(|e| ballista_error("executor", e)),
            signal = &mut stop => {
                // Ballista heard the signal too, once it was registered: it
                // tells the scheduler and drains its tasks. Out of touch with
                // the scheduler (still connecting, or lost it) there is no
                // one to tell.
                if !health.is_ready() {
                    log::info!("{signal}: the executor stops; it is not in touch with its scheduler");
                    return Ok(());
                }
                log::info!("{signal}: the executor leaves the cluster");
                match tokio::time::timeout(STOP_GRACE, executor).await {
                    Ok(ended) => ended.map_err(|e| ballista_error("executor", e)),
                    Err(_) => {
                        log::warn!("running tasks did not finish within {STOP_GRACE:?}; stopping anyway");
                        Ok(())
                    }
                }
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    drop(work_dir);
    outcome
}

/// Ballista's executor configuration for `options`.
fn executor_config(
    options: &ExecutorOptions,
    start: &ExecutorStart,
    health: ExecutorHealth,
) -> Result<ExecutorProcessConfig> {
    let work_dir = start
        .work_dir
        .to_str()
        .ok_or_else(|| {
            HubnormError::Usage(format!(
                "--work-dir {}: the path is not valid UTF-8",
                start.work_dir.display()
            ))
        })?
        .to_owned();
    let registry = server_state(SessionConfig::default())
        .map(|state| BallistaFunctionRegistry::from(&state))
        .map_err(|e| HubnormError::Internal(format!("the executor's functions: {e}")))?;
    let spill_dir = work_dir.clone();
    // Each task's runtime: hubnorm's object stores and spill files under the
    // work directory; Ballista adds the task's share of the memory pool.
    let runtime: RuntimeProducer = Arc::new(move |_: &SessionConfig| {
        RuntimeEnvBuilder::new()
            .with_temp_file_path(spill_dir.clone())
            .with_object_store_registry(Arc::new(StoreRegistry::default()))
            .build_arc()
    });
    let ip = start.flight.ip();
    Ok(ExecutorProcessConfig {
        bind_host: ip.to_string(),
        // What the scheduler tells clients and other executors to fetch
        // from; for an unspecified address (0.0.0.0), the address the
        // scheduler sees the executor's polls come from.
        external_host: (!ip.is_unspecified()).then(|| ip.to_string()),
        port: start.flight.port(),
        scheduler_host: options.scheduler.host().to_owned(),
        scheduler_port: options.scheduler.port(),
        // One attempt: the scheduler answered just before (see `reach`).
        scheduler_connect_timeout_seconds: 0,
        task_scheduling_policy: SCHEDULING,
        vcores: start.slots,
        memory_pool_size: Some(options.memory.bytes() as u64),
        work_dir: Some(work_dir),
        override_function_registry: Some(Arc::new(registry)),
        override_runtime_producer: Some(runtime),
        override_logical_codec: Some(logical_codec()),
        override_physical_codec: Some(physical_codec()),
        health,
        ..ExecutorProcessConfig::default()
    })
}

/// `bind` with port 0 replaced by a port that is free now. Ballista binds
/// its Flight service itself and announces the configured port, so the
/// port must be known before start-up; another process could take it in
/// between, and start-up then fails with "address in use".
fn resolve_port(bind: SocketAddr) -> Result<SocketAddr> {
    let listener =
        std::net::TcpListener::bind(bind).map_err(|e| HubnormError::io(bind.to_string(), e))?;
    listener
        .local_addr()
        .map_err(|e| HubnormError::io(bind.to_string(), e))
}

/// The executor's work directory: the one given (created if missing, kept),
/// or a fresh one under the system's temporary directory, removed on drop.
/// Either way it holds a lock file, locked while the executor runs: the
/// kernel releases it when the process ends, however it ends, so a later
/// executor can tell the folders of killed ones and remove them.
struct WorkDir {
    path: PathBuf,
    remove: bool,
    _lock: File,
}

/// The prefix of a fresh work directory's name (then the process id and
/// the Flight port).
const FRESH_PREFIX: &str = "hubnorm-executor-";

/// The lock file in a work directory.
const LOCK_FILE: &str = ".executor.lock";

/// How old a lock file must be before an unlocked one counts as left by a
/// killed executor (a starting one creates the file, then locks it).
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

impl WorkDir {
    fn open(given: Option<&Path>, port: u16) -> Result<WorkDir> {
        let (path, remove) = match given {
            Some(dir) => (
                std::path::absolute(dir).map_err(|e| HubnormError::io(dir, e))?,
                false,
            ),
            None => {
                let temp = std::env::temp_dir();
                remove_abandoned_work_dirs(&temp);
                let name = format!("{FRESH_PREFIX}{}-{port}", std::process::id());
                (temp.join(name), true)
            }
        };
        std::fs::create_dir_all(&path).map_err(|e| HubnormError::io(&path, e))?;
        let lock_path = path.join(LOCK_FILE);
        let lock = File::create(&lock_path).map_err(|e| HubnormError::io(&lock_path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(HubnormError::Usage(format!(
                    "--work-dir {}: another executor is using it; give each executor its own",
                    path.display()
                )))
            }
            Err(TryLockError::Error(e)) => return Err(HubnormError::io(&lock_path, e)),
        }
        Ok(WorkDir {
            path,
            remove,
            _lock: lock,
        })
    }
}

/// Removes the fresh work directories under `temp` that executors left
/// when they were killed (SIGKILL, out of memory): those whose lock file
/// nobody holds. Best effort: what cannot be read or removed is left.
fn remove_abandoned_work_dirs(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let fresh = entry
            .file_name()
            .to_string_lossy()
            .starts_with(FRESH_PREFIX);
        if !fresh || !dir.is_dir() {
            continue;
        }
        let Ok(lock) = File::open(dir.join(LOCK_FILE)) else {
            continue;
        };
        let settled = lock
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age >= LOCK_GRACE));
        if settled && lock.try_lock().is_ok() {
            drop(lock);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => log::info!(
                    "removed {}, the work directory of an executor that was killed",
                    dir.display()
                ),
                Err(e) => log::warn!("could not remove {}: {e}", dir.display()),
            }
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.remove {
            if let Err(e) = std::fs::remove_dir_all(&self.path) {
                log::warn!("could not remove {}: {e}", self.path.display());
            }
        }
    }
}
