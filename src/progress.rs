//! Progress reporting. The library never prints; it tells a [`Progress`]
//! implementation what it is doing, and the binary decides how to show it.

/// Receives progress events from the passes. Implementations must be cheap:
/// `advance` is called once per block.
pub trait Progress: Send + Sync {
    /// A phase starts; `total` rows of work are expected.
    fn start(&self, phase: &str, total: u64);
    /// `rows` more rows of the current phase are done.
    fn advance(&self, rows: u64);
    /// The current phase is over.
    fn finish(&self);
    /// A short status of the current phase (e.g. Sinkhorn's marginal error).
    fn status(&self, _status: &str) {}
}

/// Shows nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// Converts work done in (outer row × inner row) pairs into whole outer rows,
/// so a pass can report progress after every inner block in the unit users
/// think in (queries searched, gallery items finished).
#[derive(Debug)]
pub struct RowProgress<'a> {
    progress: &'a dyn Progress,
    inner_total: u128,
    pairs: u128,
    reported: u64,
}

impl<'a> RowProgress<'a> {
    /// Starts `phase` with `outer_total` rows, each needing `inner_total` pairs.
    pub fn start(
        progress: &'a dyn Progress,
        phase: &str,
        outer_total: u64,
        inner_total: u64,
    ) -> Self {
        progress.start(phase, outer_total);
        RowProgress {
            progress,
            inner_total: inner_total.max(1) as u128,
            pairs: 0,
            reported: 0,
        }
    }

    /// `outer_rows × inner_rows` more pairs are done.
    pub fn advance(&mut self, outer_rows: usize, inner_rows: usize) {
        self.pairs += outer_rows as u128 * inner_rows as u128;
        let rows = (self.pairs / self.inner_total) as u64;
        if rows > self.reported {
            self.progress.advance(rows - self.reported);
            self.reported = rows;
        }
    }

    pub fn finish(self) {
        self.progress.finish();
    }
}

impl std::fmt::Debug for dyn Progress + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}
