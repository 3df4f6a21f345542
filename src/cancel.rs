//! Cooperative cancellation. The command-line tool's signal handler (SIGINT,
//! SIGTERM) calls [`request`]; the passes call [`check`] before every block
//! they read, so a stopped run unwinds through the normal error path: its
//! temporary files are removed, nothing is renamed into place, and a
//! statistics checkpoint stays for `--resume`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
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

/// Whether a stop has been requested.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// `Err(Interrupted)` once a stop has been requested.
pub fn check() -> Result<()> {
    if requested() {
        Err(HubnormError::Interrupted(
            "stopped by a signal before the work finished; no output was written".into(),
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
        if at.is_none_or(|at| at.elapsed() < FINISHING_GRACE) {
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
