//! Cooperative cancellation. The command-line tool's signal handler (SIGINT,
//! SIGTERM) calls [`request`]; the passes call [`check`] before every block
//! they read, so a stopped run unwinds through the normal error path: its
//! temporary files are removed, nothing is renamed into place, and a
//! statistics checkpoint stays for `--resume`.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{HubnormError, Result};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks the running work to stop at its next block. Returns whether a stop
/// had already been requested (a second Ctrl-C: the caller may exit at once).
pub fn request() -> bool {
    REQUESTED.swap(true, Ordering::SeqCst)
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

/// Clears a stop request once the stopped work has unwound, so that the
/// same process can run more work (the Python package, after Ctrl-C).
pub fn reset() {
    REQUESTED.store(false, Ordering::SeqCst);
}
