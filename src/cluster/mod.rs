//! hubnorm on an Apache DataFusion Ballista cluster (feature `cluster`).
//!
//! The `hubnorm` binary is its own scheduler ([`scheduler`]) and executor
//! ([`executor`]): the stock Ballista binaries cannot load hubnorm's
//! functions. A client ([`session`]) plans SQL into a logical plan and sends
//! it to the scheduler, which plans it physically, splits it into stages and
//! hands their tasks to the executors; the client then fetches the result
//! partitions from the executors over Arrow Flight. So every side must agree
//! on three things, each with one home here:
//!
//! - **the codecs** ([`codec`]): the logical one between client and
//!   scheduler, the physical one between scheduler and executors; Ballista's
//!   own, wrapped to carry hubnorm's passes ([`crate::sql::pass`]);
//! - **the functions** ([`server_state`]): plans name the `hub_*` scalar and
//!   aggregate functions, which the scheduler's sessions and the executors'
//!   function registry resolve by name;
//! - **the scheduling policy** ([`SCHEDULING`]): pull, on both sides.
//!
//! Paths travel inside the plans and are opened by the scheduler (listing
//! files) and the executors (reading them), so every process gets hubnorm's
//! object-store registry and the client makes local paths absolute. The
//! design and what is not done yet: docs/cluster.md.

pub mod codec;
mod contact;
pub mod executor;
mod logging;
pub mod passes;
pub mod scheduler;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::{SessionConfigExt, SessionContextExt};
use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::extension::{
    ballista_aggregate_functions, ballista_scalar_functions, ballista_window_functions,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use crate::error::{HubnormError, Result};
use crate::sql::{self, Placement, SqlOptions, StoreRegistry};

pub use executor::{run_executor, ExecutorOptions, ExecutorStart};
pub use logging::log_to_stderr;
pub use scheduler::{run_scheduler, SchedulerOptions};

/// The port a scheduler listens on unless told otherwise.
pub const DEFAULT_SCHEDULER_PORT: u16 = 50050;

/// How the scheduler hands out tasks, on the scheduler and every executor
/// (Ballista refuses an executor whose policy differs). Pull: each executor
/// asks for work when it has a free slot, and heartbeats with every ask.
/// Against push: an executor runs no gRPC server of its own (other
/// processes reach only its Arrow Flight port), and its last heartbeat is
/// never more than 5 s old (push: 60 s), so a short timeout can declare a
/// lost executor lost without false alarms. Push would save the idle poll
/// interval (50 ms) per task, which hubnorm's long tasks do not notice.
pub const SCHEDULING: TaskSchedulingPolicy = TaskSchedulingPolicy::PullStaged;

/// The logical extension codec of the client and the scheduler.
pub fn logical_codec() -> Arc<dyn LogicalExtensionCodec> {
    Arc::new(codec::LogicalCodec::default())
}

/// The physical extension codec of the scheduler and the executors (and
/// of the client, which Ballista asks for it).
pub fn physical_codec() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(codec::PhysicalCodec::default())
}

/// The address of a cluster's scheduler: `df://HOST:PORT` (`--cluster`), or
/// `HOST:PORT` (an executor's `--scheduler`). The port defaults to 50050.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerAddress {
    host: String,
    port: u16,
}

impl SchedulerAddress {
    /// The host name or IP address (IPv6 in brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The scheduler's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of its gRPC service, for a client of Ballista's scheduler API.
    pub(crate) fn grpc_url(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }
}

impl From<SocketAddr> for SchedulerAddress {
    fn from(addr: SocketAddr) -> Self {
        let host = match addr {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        SchedulerAddress {
            host,
            port: addr.port(),
        }
    }
}

impl FromStr for SchedulerAddress {
    type Err = HubnormError;

    fn from_str(text: &str) -> Result<Self> {
        // Never echoed when it may carry a password.
        let shown = if text.contains('@') {
            "<address>"
        } else {
            text
        };
        let bad = |why: &str| {
            HubnormError::Usage(format!(
                "{shown}: not a scheduler address ({why}); expected df://HOST:PORT"
            ))
        };
        let with_scheme = if text.contains("://") {
            text.to_owned()
        } else {
            format!("df://{text}")
        };
        let url = url::Url::parse(&with_scheme).map_err(|e| bad(&e.to_string()))?;
        if url.scheme() != "df" {
            return Err(bad(&format!("the scheme is '{}', not 'df'", url.scheme())));
        }
        if !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
            || !matches!(url.path(), "" | "/")
        {
            return Err(bad("only a host and a port"));
        }
        let host = match url.host() {
            Some(url::Host::Domain(name)) if !name.is_empty() => name.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
            _ => return Err(bad("no host")),
        };
        Ok(SchedulerAddress {
            host,
            port: url.port().unwrap_or(DEFAULT_SCHEDULER_PORT),
        })
    }
}

impl fmt::Display for SchedulerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "df://{}:{}", self.host, self.port)
    }
}

/// A warning for a server bound to `addr` when other machines can reach
/// it: Ballista has no authentication, and an executor runs any plan that
/// reaches it. `None` for a loopback address.
pub fn exposure_warning(role: &str, addr: SocketAddr) -> Option<String> {
    (!addr.ip().is_loopback()).then(|| {
        format!(
            "the {role} listens on {addr}, beyond this machine. Ballista has no authentication: anyone who can reach this port can run plans on the cluster and read what its executors can read. Make the cluster's ports reachable only from a trusted network."
        )
    })
}

/// `builder` with Ballista's function lists (as its own binaries build
/// them) extended with hubnorm's scalar and aggregate functions. These
/// lists replace those `with_default_features` set.
fn with_functions(builder: SessionStateBuilder) -> SessionStateBuilder {
    let mut scalars = ballista_scalar_functions();
    scalars.extend(sql::scalar_functions().into_iter().map(Arc::new));
    let mut aggregates = ballista_aggregate_functions();
    aggregates.extend(sql::aggregate_functions().into_iter().map(Arc::new));
    builder
        .with_scalar_functions(scalars)
        .with_aggregate_functions(aggregates)
        .with_window_functions(ballista_window_functions())
}

/// The session state of the scheduler (one per client session) and the
/// source of the executors' function registry: Ballista's default session
/// with hubnorm's scalar and aggregate functions added, and hubnorm's
/// object stores, so that `s3://` and the other URLs the rest of hubnorm
/// reads resolve here too.
pub fn server_state(config: SessionConfig) -> datafusion::common::Result<SessionState> {
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(StoreRegistry::default()))
        .build_arc()?;
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_optimizer_rules(ballista_core::optimizer::ballista_default_optimizer_rules());
    Ok(with_functions(builder).build())
}

/// The configuration a client session sends with its queries: Ballista's
/// (which the scheduler's sessions and the executors start from too), one
/// partition per `options.threads` in each stage, and the codecs.
fn client_config(options: &SqlOptions) -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_target_partitions(options.partitions())
        .with_information_schema(true)
        .with_ballista_job_name("hubnorm sql")
        // One partition per task: a pass's shard is one task, with the
        // memory of one slot (the default packs a task with as many
        // partitions as the executor has free slots).
        .set_usize("ballista.scheduler.max_partitions_per_task", 1)
        // Pull job tracking: the scheduler answers the submission with the
        // job's id, so a client stopped by Ctrl-C can cancel the job at
        // once. With push tracking the id comes with the first status
        // update, which waits for the job's planning: a job stopped before
        // then ran on to its end (polling adds at most 50 ms a job).
        .set_bool("ballista.client.pull", true)
        .with_ballista_logical_extension_codec(logical_codec())
        .with_ballista_physical_extension_codec(physical_codec())
}

/// A SQL session whose queries run on the cluster of `scheduler`, with every
/// hubnorm function (placed as [`Placement::Cluster`] says). Fails when
/// the scheduler does not accept connections (exit code 1) or the server
/// there is not a Ballista scheduler (exit code 2); Ballista itself
/// connects at the first query.
pub async fn session(scheduler: &SchedulerAddress, options: &SqlOptions) -> Result<SessionContext> {
    contact::reach(scheduler, Duration::ZERO).await?;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(client_config(options))
        .with_runtime_env(sql::runtime_env(options)?)
        .build();
    // Ballista replaces the session's scalar and aggregate functions with its
    // defaults: hubnorm's are installed after.
    let ctx = SessionContext::remote_with_state(&scheduler.to_string(), state)
        .await
        .map_err(|e| HubnormError::Cluster(format!("{scheduler}: {e}")))?;
    sql::register_functions_for(&ctx, options, Placement::Cluster)?;
    Ok(ctx)
}

/// A SQL session on an in-process cluster: Ballista's standalone mode, a
/// scheduler and an executor on ports of `localhost` that live as long as
/// the tokio runtime. Its plans take the same way as on a real cluster
/// (codecs, functions by name, shuffles over Arrow Flight), so tests use it.
pub async fn standalone_session(options: &SqlOptions) -> Result<SessionContext> {
    // The scheduler and the executor take this state as it is (its functions
    // and stores); the client's copy is upgraded by Ballista, which drops
    // hubnorm's functions, installed again below.
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(client_config(options))
        .with_runtime_env(sql::runtime_env(options)?);
    let state = with_functions(builder).build();
    let ctx = SessionContext::standalone_with_state(state)
        .await
        .map_err(|e| HubnormError::Cluster(format!("in-process cluster: {e}")))?;
    sql::register_functions_for(&ctx, options, Placement::Cluster)?;
    Ok(ctx)
}

/// A tokio runtime for a cluster process: `threads` workers (0 = one per
/// core), SIGPIPE blocked on them (see
/// [`crate::storage::block_sigpipe_on_this_thread`]).
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        builder.worker_threads(threads);
    }
    builder
        .enable_all()
        .on_thread_start(crate::storage::block_sigpipe_on_this_thread)
        .build()
        .map_err(|e| HubnormError::Internal(format!("cannot start the runtime: {e}")))
}

/// Resolves on SIGINT or SIGTERM. The listeners are registered when this
/// is called (not when first polled): from then on these signals no
/// longer end the process by their default action.
fn stop_signal() -> Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind| {
        signal(kind).map_err(|e| HubnormError::Internal(format!("cannot listen for signals: {e}")))
    };
    let mut interrupt = listen(SignalKind::interrupt())?;
    let mut terminate = listen(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        }
    })
}

/// A Ballista error as a hubnorm error.
fn ballista_error(context: &str, e: ballista_core::error::BallistaError) -> HubnormError {
    HubnormError::Cluster(format!("{context}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_addresses_parse_with_or_without_the_scheme() {
        let a: SchedulerAddress = "df://10.0.0.5:6000".parse().unwrap();
        assert_eq!((a.host(), a.port()), ("10.0.0.5", 6000));
        let b: SchedulerAddress = "sched.local".parse().unwrap();
        assert_eq!(b.to_string(), "df://sched.local:50050");
        let c: SchedulerAddress = "df://[::1]:7000".parse().unwrap();
        assert_eq!(c.to_string(), "df://[::1]:7000");
        for bad in [
            "http://h:1",
            "df://",
            "df://h:1/path",
            "df://user:secret@h:1",
            "df://h:99999",
        ] {
            let err = bad.parse::<SchedulerAddress>().unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
            assert!(!err.to_string().contains("secret@"), "{err}");
        }
    }

    #[test]
    fn only_addresses_beyond_loopback_are_warned_about() {
        assert!(exposure_warning("scheduler", "127.0.0.1:1".parse().unwrap()).is_none());
        assert!(exposure_warning("scheduler", "[::1]:1".parse().unwrap()).is_none());
        let warning = exposure_warning("executor", "0.0.0.0:1".parse().unwrap()).unwrap();
        assert!(warning.contains("no authentication"), "{warning}");
    }
}
