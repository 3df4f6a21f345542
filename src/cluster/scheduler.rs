//! `hubnorm cluster scheduler`: Ballista's scheduler with hubnorm's
//! functions, codecs and object stores.
//!
//! It plans the jobs clients send (listing their input files), splits them
//! into stages and hands the tasks to executors that poll for them. gRPC,
//! and `/healthz` and `/readyz` over HTTP (`ready: N executors
//! registered`), share one port. It keeps its state in memory: a scheduler
//! that stops loses its jobs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::{create_scheduler, start_grpc_service_with_listener};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};

use crate::error::{HubnormError, Result};

use super::{ballista_error, logical_codec, physical_codec, server_state, SCHEDULING};

/// Options of `hubnorm cluster scheduler`.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Where to listen (port 0: any free port, reported to `on_listening`).
    pub bind: SocketAddr,
    /// How long an executor may go without a heartbeat before it counts as
    /// lost (its tasks, and the outputs it held, are then run again on the
    /// others). Executors heartbeat with every poll for work, at least every
    /// 5 s, so Ballista's 180 s would only delay recovery.
    pub executor_timeout: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            bind: SocketAddr::from(([127, 0, 0, 1], super::DEFAULT_SCHEDULER_PORT)),
            executor_timeout: Duration::from_secs(30),
        }
    }
}

/// Runs a scheduler until SIGINT or SIGTERM, then returns `Ok` (exit code
/// 0). `on_listening` is called with the bound address once the port is
/// open, before any executor can register.
pub fn run_scheduler(
    options: &SchedulerOptions,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    let runtime = super::runtime(0)?;
    let outcome = runtime.block_on(serve(options, on_listening));
    // The scheduler's event loops end with the runtime; nothing of theirs
    // needs to finish.
    runtime.shutdown_timeout(Duration::from_secs(5));
    outcome
}

async fn serve(options: &SchedulerOptions, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
    let stop = super::stop_signal()?;
    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|e| HubnormError::io(options.bind.to_string(), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| HubnormError::io(options.bind.to_string(), e))?;
    let config = SchedulerConfig {
        bind_host: addr.ip().to_string(),
        bind_port: addr.port(),
        external_host: addr.ip().to_string(),
        scheduling_policy: SCHEDULING,
        override_session_builder: Some(Arc::new(server_state)),
        override_logical_codec: Some(logical_codec()),
        override_physical_codec: Some(physical_codec()),
        executor_timeout_seconds: options.executor_timeout.as_secs().max(1),
        // Look for lost executors a few times per timeout.
        expire_dead_executor_interval_seconds: (options.executor_timeout.as_secs() / 3)
            .clamp(1, 15),
        ..SchedulerConfig::default()
    };
    config
        .validate()
        .map_err(|e| ballista_error("scheduler configuration", e))?;
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| ballista_error("scheduler state", e))?;
    let server = create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, Arc::new(config))
        .await
        .map_err(|e| ballista_error("starting the scheduler", e))?;
    on_listening(addr);
    tokio::select! {
        served = start_grpc_service_with_listener(listener, server) => {
            served.map_err(|e| ballista_error(&format!("scheduler on {addr}"), e))
        }
        signal = stop => {
            log::info!("{signal}: the scheduler stops");
            Ok(())
        }
    }
}
