//! Cooperative cancellation. The command-line tool's signal handler (SIGINT,
//! SIGTERM) calls [`request`]; the passes call [`check`] before every block
//! they read, so a stopped run unwinds through the normal error path: its
//! temporary files are removed, nothing is renamed into place, and a
//! statistics checkpoint stays for `--resume`.
//!
//! A [`JobStop`] stops one job of a process that runs several (the Python
//! package's threads), where [`request`] stops them all.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::error::{HubnormError, Result};

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// When the stop was requested.
static REQUESTED_AT: Mutex<Option<Instant>> = Mutex::new(None);
/// How many [`finishing`] scopes are open.
static FINISHING: AtomicUsize = AtomicUsize::new(0);
/// How long after a stop [`finishing`] work may still wait on an object
/// store (its requests' own timeouts are minutes).
const FINISHING_GRACE: Duration = Duration::from_secs(20);

/// Asks the running work to stop at its next block. Returns whether a stop
/// had already been requested (a second Ctrl-C: the caller may exit at once).
pub fn request() -> bool {
    let before = REQUESTED.swap(true, Ordering::SeqCst);
    if !before {
        *REQUESTED_AT.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
    before
}

/// Whether a stop has been requested, for the whole process or for the job
/// this thread works for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed) || job_stop_requested_at().is_some()
}

/// `Err(Interrupted)` once a stop has been requested.
pub fn check() -> Result<()> {
    if REQUESTED.load(Ordering::Relaxed) {
        Err(HubnormError::Interrupted(
            "stopped by a signal before the work finished; no output was written".into(),
        ))
    } else if job_stop_requested_at().is_some() {
        Err(HubnormError::Interrupted(
            "stopped by its caller before the work finished; no output was written".into(),
        ))
    } else {
        Ok(())
    }
}

/// Runs `work`, the saving or clearing up of stopped work (its finished
/// blocks into the checkpoint, an empty checkpoint or a scratch file
/// removed), with a requested stop not cutting its object-store requests
/// short ([`check_requests`]) for `FINISHING_GRACE` (20 s) after the stop.
/// Local writes are not stopped anyway.
pub fn finishing<T>(work: impl FnOnce() -> T) -> T {
    struct Open;
    impl Drop for Open {
        fn drop(&mut self) {
            FINISHING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    FINISHING.fetch_add(1, Ordering::SeqCst);
    let _open = Open;
    work()
}

/// [`check`] for a request to an object store: `Err(Interrupted)` once a
/// stop has been requested, unless the request belongs to [`finishing`]
/// work and the stop is less than `FINISHING_GRACE` old.
pub fn check_requests() -> Result<()> {
    if FINISHING.load(Ordering::SeqCst) > 0 {
        let at = *REQUESTED_AT.lock().unwrap_or_else(|e| e.into_inner());
        if at
            .or_else(job_stop_requested_at)
            .is_none_or(|at| at.elapsed() < FINISHING_GRACE)
        {
            return Ok(());
        }
    }
    check()
}

/// Clears a stop request once the stopped work has unwound, so that the
/// same process can run more work (the Python package, after Ctrl-C).
pub fn reset() {
    *REQUESTED_AT.lock().unwrap_or_else(|e| e.into_inner()) = None;
    REQUESTED.store(false, Ordering::SeqCst);
}

/// A stop request for one job: the job's checks ([`check`], [`requested`])
/// see it on the thread that runs it ([`JobStop::run`]), on the worker
/// pools and reading threads it starts, and in its object-store requests.
#[derive(Clone, Default)]
pub struct JobStop(Arc<Mutex<Option<Instant>>>);

thread_local! {
    static JOB_STOP: RefCell<Option<JobStop>> = const { RefCell::new(None) };
}

impl JobStop {
    pub fn new() -> Self {
        JobStop::default()
    }

    /// Asks the job to stop at its next block.
    pub fn request(&self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
    }

    fn requested_at(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `work` as the job this stop concerns.
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        let previous = set_job_stop(Some(self.clone()));
        let out = work();
        set_job_stop(previous);
        out
    }
}

/// The stop of the job this thread works for.
pub(crate) fn current_job_stop() -> Option<JobStop> {
    JOB_STOP.with(|current| current.borrow().clone())
}

/// Makes `stop` this thread's; returns the one it replaces. For threads a
/// job starts: they take its [`current_job_stop`].
pub(crate) fn set_job_stop(stop: Option<JobStop>) -> Option<JobStop> {
    JOB_STOP.with(|current| current.replace(stop))
}

fn job_stop_requested_at() -> Option<Instant> {
    JOB_STOP.with(|current| current.borrow().as_ref().and_then(JobStop::requested_at))
}

/// `future` polled as work of the job this thread works for (it may run on
/// another thread: the object-store runtime's).
pub(crate) fn in_this_job<F: Future>(future: F) -> impl Future<Output = F::Output> {
    InJob {
        stop: current_job_stop(),
        future: Box::pin(future),
    }
}

struct InJob<F> {
    stop: Option<JobStop>,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for InJob<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let previous = set_job_stop(this.stop.clone());
        let out = this.future.as_mut().poll(context);
        set_job_stop(previous);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_stop_stops_its_job_only() {
        let (stopped, other) = (JobStop::new(), JobStop::new());
        stopped.request();
        assert!(stopped.run(check).is_err());
        let message = stopped.run(check).unwrap_err().to_string();
        assert!(message.contains("stopped by its caller"), "{message}");
        assert!(other.run(check).is_ok());
        assert!(check().is_ok(), "no job on this thread");
        // Threads the job starts take its stop.
        let seen = stopped.run(|| {
            let stop = current_job_stop();
            std::thread::spawn(move || {
                set_job_stop(stop);
                requested()
            })
            .join()
            .unwrap()
        });
        assert!(seen);
        // So do its futures, wherever they are polled.
        let future = stopped.run(|| in_this_job(async { requested() }));
        let seen = std::thread::spawn(move || {
            let mut future = std::pin::pin!(future);
            future
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()))
        })
        .join()
        .unwrap();
        assert_eq!(seen, Poll::Ready(true));
    }
}
