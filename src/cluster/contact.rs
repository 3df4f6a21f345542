//! How clients and executors find their scheduler and keep in touch with it.
//!
//! Ballista connects lazily and retries without end, so a wrong port would
//! show only as an HTTP/2 protocol error at a client's first query, or as an
//! executor polling the wrong server 20 times a second for ever. So hubnorm
//! first waits for the port to accept connections ([`reach`]: the processes
//! of a cluster may start in any order), asks one question only a Ballista
//! scheduler answers ([`confirm`]), and while an executor runs reports when
//! it loses and regains its scheduler ([`watch`]).

use std::time::{Duration, Instant};

use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::GetJobStatusParams;
use ballista_core::utils::{create_grpc_client_connection, GrpcClientConfig};
use ballista_executor::health::ExecutorHealth;

use crate::error::{HubnormError, Result};

use super::SchedulerAddress;

/// How long one attempt to reach a scheduler, or its answer, may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a process waiting for its scheduler says it still waits.
const WAITING_NOTICE: Duration = Duration::from_secs(5);

/// Waits until `scheduler` accepts a TCP connection and answers as a
/// Ballista scheduler ([`confirm`]), trying every half second for
/// `patience` (at least once).
pub(super) async fn reach(scheduler: &SchedulerAddress, patience: Duration) -> Result<()> {
    let address = format!("{}:{}", scheduler.host(), scheduler.port());
    let start = Instant::now();
    let mut noticed: Option<Instant> = None;
    loop {
        let attempt =
            tokio::time::timeout(ANSWER_TIMEOUT, tokio::net::TcpStream::connect(&address)).await;
        let error = match attempt {
            // Closed before the question: a server that serves one
            // connection at a time would not see the next one.
            Ok(Ok(connection)) => {
                drop(connection);
                match confirm(scheduler).await? {
                    None => return Ok(()),
                    Some(error) => error,
                }
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {ANSWER_TIMEOUT:?}"),
        };
        if start.elapsed() >= patience {
            return Err(HubnormError::Cluster(format!(
                "cannot reach the scheduler at {scheduler}: {error}"
            )));
        }
        if noticed.is_none_or(|at| at.elapsed() >= WAITING_NOTICE) {
            log::warn!("cannot reach the scheduler at {scheduler} yet ({error}); retrying");
            noticed = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Asks the server at `scheduler` for the status of a job no scheduler
/// has: a Ballista scheduler answers (with no status); another server on
/// that port (an executor's Arrow Flight service, a web server) answers in
/// a way that says what it is, a usage error (exit code 2). `Some(why)`
/// when the connection failed before any answer (a proxy or a forwarded
/// port with nothing behind it yet): worth another try.
async fn confirm(scheduler: &SchedulerAddress) -> Result<Option<String>> {
    // Ballista's timeouts stay beyond hubnorm's own, which tells a silent
    // server from a failed connection.
    let config = GrpcClientConfig {
        connect_timeout_seconds: 2 * ANSWER_TIMEOUT.as_secs(),
        timeout_seconds: 2 * ANSWER_TIMEOUT.as_secs(),
        ..GrpcClientConfig::default()
    };
    let url = scheduler.grpc_url();
    let question = GetJobStatusParams {
        job_id: "hubnorm-probe".to_owned(),
    };
    let ask = async {
        let channel = match create_grpc_client_connection(url, &config).await {
            Ok(channel) => channel,
            Err(e) => return Err(e.to_string()),
        };
        Ok(SchedulerGrpcClient::new(channel)
            .get_job_status(question)
            .await)
    };
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, ask).await.map_err(|_| {
        HubnormError::Cluster(format!(
            "the server at {scheduler} accepts connections but did not answer a scheduler's question within {ANSWER_TIMEOUT:?}"
        ))
    })?;
    let wrong_server = |what: &str| {
        HubnormError::Usage(format!(
            "{scheduler} is not a Ballista scheduler: the server there {what}; give the port that `hubnorm cluster scheduler` prints at start-up"
        ))
    };
    // A connection closed before any answer may be an HTTP/1 server's
    // reply to the HTTP/2 preface, read by the connection before the
    // question went out (a race on a busy machine): asked plainly.
    let http1 = || async {
        answers_in_http1(scheduler).await.then(|| {
            wrong_server("does not speak gRPC (it answers in HTTP/1; TLS is not supported)")
        })
    };
    let status = match answer {
        Ok(Ok(_)) => return Ok(None),
        Ok(Err(status)) => status,
        Err(connection_failed) => {
            return match http1().await {
                Some(wrong) => Err(wrong),
                None => Ok(Some(connection_failed)),
            }
        }
    };
    match classify(&status) {
        Answer::Scheduler => Ok(None),
        Answer::Unreachable => match http1().await {
            Some(wrong) => Err(wrong),
            None => Ok(Some(describe(&status))),
        },
        Answer::OtherGrpcService => Err(wrong_server(
            "speaks gRPC but not the scheduler's service (an executor's Arrow Flight port?)",
        )),
        Answer::NotGrpc => Err(wrong_server(&format!(
            "does not speak gRPC ({}; TLS is not supported)",
            describe(&status)
        ))),
    }
}

/// Whether the server at `scheduler` answers the HTTP/2 connection preface
/// with an HTTP/1 status line, as a web server does (within a second).
async fn answers_in_http1(scheduler: &SchedulerAddress) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = format!("{}:{}", scheduler.host(), scheduler.port());
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(&address).await.ok()?;
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .ok()?;
        let mut start = [0u8; 5];
        stream.read_exact(&mut start).await.ok()?;
        Some(&start == b"HTTP/")
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// What the failure of the question says about the server that failed it.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// A Ballista scheduler, which answered with an error of its own.
    Scheduler,
    /// A gRPC server without the scheduler's service.
    OtherGrpcService,
    /// A server that answered, but not in gRPC.
    NotGrpc,
    /// No answer: the connection closed or failed first, or a proxy says
    /// that what is behind it is unavailable.
    Unreachable,
}

fn classify(status: &tonic::Status) -> Answer {
    let message = status.message();
    // An HTTP/2 server without gRPC: tonic maps its HTTP status to a code
    // (404 to "unimplemented", 502/503/504 to "unavailable").
    if message.starts_with("grpc-status header missing")
        || message.starts_with("protocol error: missing grpc-status")
    {
        return match status.code() {
            tonic::Code::Unavailable => Answer::Unreachable,
            _ => Answer::NotGrpc,
        };
    }
    // A status the server sent has no source; one made from a failure of
    // the connection carries the transport's error: bytes that are not
    // HTTP/2 (an HTTP/1 server), or a connection closed before any answer.
    if std::error::Error::source(status).is_some() {
        return match message.starts_with("h2 protocol error") {
            true => Answer::NotGrpc,
            false => Answer::Unreachable,
        };
    }
    match status.code() {
        tonic::Code::Unimplemented => Answer::OtherGrpcService,
        _ => Answer::Scheduler,
    }
}

/// A status's message and the chain of errors under it.
fn describe(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        let more = error.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = error.source();
    }
    text
}

/// Reports, until the process ends, when the executor whose heartbeats
/// `health` follows registers with `scheduler`, loses it and regains it
/// (Ballista warns at every failed poll; the log damps those, see
/// [`super::logging`]).
pub(super) async fn watch(scheduler: SchedulerAddress, health: ExecutorHealth) {
    let mut in_touch = false;
    // When touch was lost; `None` until the executor first registers.
    let mut lost_at: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let ready = health.is_ready();
        match (in_touch, ready, lost_at) {
            (false, true, None) => log::info!("registered with the scheduler at {scheduler}"),
            (false, true, Some(at)) => log::info!(
                "in touch with the scheduler at {scheduler} again after {} s",
                at.elapsed().as_secs()
            ),
            (true, false, _) => {
                log::warn!("lost touch with the scheduler at {scheduler}; polling it again");
                lost_at = Some(Instant::now());
            }
            _ => {}
        }
        in_touch = ready;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_question_tells_schedulers_other_servers_and_failed_connections_apart() {
        let scheduler_s_own = tonic::Status::internal("Error getting status for job");
        assert_eq!(classify(&scheduler_s_own), Answer::Scheduler);
        let no_such_service = tonic::Status::unimplemented("");
        assert_eq!(classify(&no_such_service), Answer::OtherGrpcService);
        let web_page = tonic::Status::unimplemented(
            "grpc-status header missing, mapped from HTTP status code 404",
        );
        assert_eq!(classify(&web_page), Answer::NotGrpc);
        let proxy_alone = tonic::Status::unavailable(
            "grpc-status header missing, mapped from HTTP status code 503",
        );
        assert_eq!(classify(&proxy_alone), Answer::Unreachable);
        // Failures of the connection carry its error.
        let failed = |message: &str| {
            tonic::Status::from_error(Box::new(std::io::Error::other(message.to_owned())))
        };
        let garbled = failed("h2 protocol error: http2 error");
        assert_eq!(classify(&garbled), Answer::NotGrpc);
        let closed = failed("connection closed before message completed");
        assert_eq!(classify(&closed), Answer::Unreachable);
        assert_eq!(
            describe(&closed),
            "connection closed before message completed"
        );
    }
}
