//! Block sizes from the memory limit (DESIGN.md, decision 3).
//!
//! Each pass holds an *outer* block (whose per-row state lives in memory) and
//! streams an *inner* table past it. When the whole inner table fits in half
//! of what is left after fixed costs, it is read once and cached; otherwise
//! outer and inner blocks share the budget and the inner table is re-read for
//! every outer block. Block sizes are multiples of the tile shape, so results
//! do not depend on the limit.

use std::cell::RefCell;
use std::sync::Arc;

use crate::error::{HubnormError, Result};
use crate::kernel::tile_workspace_bytes;
use crate::options::human_bytes;

/// Where a pass's plans report the memory they will use, so that a caller
/// that set aside the whole budget (a SQL table function, from the query's
/// memory pool) can hand back what the plan leaves over.
pub trait PlanLedger: Send + Sync {
    /// A plan of the pass will use `bytes` (of its budget).
    fn planned(&self, bytes: usize) -> Result<()>;
}

thread_local! {
    static LEDGER: RefCell<Option<Arc<dyn PlanLedger>>> = const { RefCell::new(None) };
}

/// Runs `f` with `ledger` receiving the plans made on this thread and on
/// the worker threads of the pools it starts ([`crate::inputs`]).
pub fn with_ledger<T>(ledger: Option<Arc<dyn PlanLedger>>, f: impl FnOnce() -> T) -> T {
    let previous = set_ledger(ledger);
    let out = f();
    set_ledger(previous);
    out
}

/// Makes `ledger` this thread's; returns the one it replaces.
pub(crate) fn set_ledger(ledger: Option<Arc<dyn PlanLedger>>) -> Option<Arc<dyn PlanLedger>> {
    LEDGER.with(|current| current.replace(ledger))
}

/// This thread's ledger.
pub(crate) fn current_ledger() -> Option<Arc<dyn PlanLedger>> {
    LEDGER.with(|current| current.borrow().clone())
}

/// Buffers not tracked row by row: the Parquet writer's row-group buffer
/// ([`crate::sink::WRITER_BUFFER_BYTES`]) and allocator slack.
pub const FIXED_OVERHEAD_BYTES: usize = crate::sink::WRITER_BUFFER_BYTES + (1 << 20);
/// Largest Parquet record batch read at once.
const MAX_BATCH_ROWS: usize = 4096;
const MIN_BATCH_ROWS: usize = 64;

/// What a pass needs to know to size its blocks.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    pub budget: usize,
    pub threads: usize,
    /// Embedding dimension.
    pub dim: usize,
    /// Memory held for the whole run whatever the blocks (id index, corrections, counts).
    pub resident_bytes: usize,
    /// Bytes per row of the outer block (embedding and state).
    pub outer_row_bytes: usize,
    /// Bytes per row of the inner block.
    pub inner_row_bytes: usize,
    pub outer_total_rows: usize,
    pub inner_total_rows: usize,
    /// Outer and inner block sizes must be multiples of these.
    pub outer_align: usize,
    pub inner_align: usize,
}

/// The block sizes a pass uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockPlan {
    pub outer_rows: usize,
    pub inner_rows: usize,
    /// Whether the inner table is read once and kept in memory.
    pub cache_inner: bool,
    /// Whether a streamed inner table's next block is read on a thread of its
    /// own while the current one is worked on (two blocks are then held, so
    /// each is half the size it would have been).
    pub read_ahead: bool,
    /// Rows per Parquet record batch.
    pub batch_rows: usize,
    /// What one more Parquet reader decoding at the same time would need.
    pub reader_bytes: usize,
    /// Budget left over once the blocks are sized (blocks are capped at the
    /// whole table, so a small input leaves room).
    pub spare_bytes: usize,
}

impl BlockPlan {
    /// Whether a second reader may decode alongside the first within the
    /// budget.
    pub fn allows_second_reader(&self) -> bool {
        self.spare_bytes >= self.reader_bytes
    }
}

fn round_down(x: usize, align: usize) -> usize {
    x / align * align
}

/// `bytes` rounded up to what [`human_bytes`] shows (a tenth of its unit),
/// so that the figure, given back as a limit, is not below `bytes`.
fn round_up_as_shown(bytes: usize) -> usize {
    let mut unit = 1f64;
    while bytes as f64 >= unit * 1024.0 && unit < 1024f64.powi(4) {
        unit *= 1024.0;
    }
    if unit == 1.0 {
        return bytes;
    }
    // One byte over, against the parse of the decimal figure rounding down.
    let tenths = ((bytes as f64 + 1.0) / (unit / 10.0)).ceil();
    (tenths * unit / 10.0).ceil() as usize
}

fn round_up(x: usize, align: usize) -> usize {
    x.div_ceil(align) * align
}

impl PlanRequest {
    /// The record batch rows, one reader's bytes and the bytes held
    /// whatever the blocks, under `budget` (a larger budget reads larger
    /// batches).
    fn fixed_bytes(&self, budget: usize) -> (usize, usize, usize) {
        let row_bytes = self.dim.max(1) * 4;
        let batch_rows = (budget / 32 / row_bytes).clamp(MIN_BATCH_ROWS, MAX_BATCH_ROWS);
        // A decoded batch, its repetition/definition levels and one page
        // buffer; with object-store inputs, the ranged reads' windows too.
        let reader_bytes = 4 * batch_rows * row_bytes
            + (1 << 20)
            + crate::storage::read_buffer_bytes(batch_rows * row_bytes);
        let fixed = FIXED_OVERHEAD_BYTES
            + reader_bytes
            + self.threads.max(1) * tile_workspace_bytes(self.dim)
            + self.resident_bytes;
        (batch_rows, reader_bytes, fixed)
    }

    /// The smallest budget holding the fixed bytes and one aligned block of
    /// each side under `budget`.
    fn minimum_under(&self, budget: usize) -> usize {
        self.fixed_bytes(budget).2
            + self.outer_align * self.outer_row_bytes
            + self.inner_align * self.inner_row_bytes
    }

    /// Chooses block sizes, or explains how much memory would be needed.
    pub fn plan(&self) -> Result<BlockPlan> {
        let (batch_rows, reader_bytes, fixed) = self.fixed_bytes(self.budget);
        if self.budget < self.minimum_under(self.budget) {
            // The figure quoted must be enough: a larger budget reads larger
            // batches, so the minimum is the least budget that covers its own.
            let mut needed = round_up_as_shown(self.minimum_under(self.budget));
            while self.minimum_under(needed) > needed {
                needed = round_up_as_shown(self.minimum_under(needed));
            }
            return Err(HubnormError::Budget(format!(
                "--memory-limit {} is below the {} this pass needs at least ({} of it held for the whole run: ids, corrections, counts); raise the limit",
                human_bytes(self.budget as u64),
                human_bytes(needed as u64),
                human_bytes(self.resident_bytes as u64),
            )));
        }
        let available = self.budget - fixed;
        let outer_needed = round_up(self.outer_total_rows.max(1), self.outer_align);
        let inner_needed = round_up(self.inner_total_rows.max(1), self.inner_align);
        let inner_bytes = inner_needed * self.inner_row_bytes;
        let (outer_rows, inner_rows, cache_inner) = if inner_bytes <= available / 2 {
            let outer = round_down(
                (available - inner_bytes) / self.outer_row_bytes.max(1),
                self.outer_align,
            );
            (outer, inner_needed, true)
        } else {
            let outer = round_down(
                available / 2 / self.outer_row_bytes.max(1),
                self.outer_align,
            );
            let inner = round_down(
                available / 2 / self.inner_row_bytes.max(1),
                self.inner_align,
            );
            (outer, inner, false)
        };
        let outer_rows = outer_rows.clamp(self.outer_align, outer_needed);
        let mut inner_rows = inner_rows.clamp(self.inner_align, inner_needed);
        // A streamed table is read while the blocks are worked on, in two
        // blocks that share the room of one: reading can take a tenth of a
        // screened search's time, which every worker would otherwise wait for.
        let read_ahead = !cache_inner && inner_rows >= 2 * self.inner_align;
        let inner_blocks = if read_ahead {
            inner_rows = round_down(inner_rows / 2, self.inner_align);
            2
        } else {
            1
        };
        let used = fixed
            + outer_rows * self.outer_row_bytes
            + inner_blocks * inner_rows * self.inner_row_bytes;
        if let Some(ledger) = current_ledger() {
            ledger.planned(used.min(self.budget))?;
        }
        Ok(BlockPlan {
            outer_rows,
            inner_rows,
            cache_inner,
            read_ahead,
            batch_rows,
            reader_bytes,
            spare_bytes: self.budget.saturating_sub(used),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(budget: usize) -> PlanRequest {
        PlanRequest {
            budget,
            threads: 2,
            dim: 128,
            resident_bytes: 1 << 20,
            outer_row_bytes: 600,
            inner_row_bytes: 512,
            outer_total_rows: 1_000_000,
            inner_total_rows: 1_000_000,
            outer_align: 256,
            inner_align: 1024,
        }
    }

    /// The minimum a refusal quotes is enough, whatever the limit refused:
    /// a larger limit reads larger batches, so the first figure once rose
    /// with each limit the user tried.
    #[test]
    fn the_quoted_minimum_is_a_limit_that_plans() {
        for dim in [8, 128, 384, 4096] {
            let refused = [1usize << 10, 8 << 20, 20 << 20, 40 << 20];
            for budget in refused {
                let request = PlanRequest {
                    dim,
                    budget,
                    ..request(budget)
                };
                let Err(err) = request.plan() else { continue };
                let message = err.to_string();
                let quoted = message
                    .split("below the ")
                    .nth(1)
                    .and_then(|rest| rest.split(" this pass").next())
                    .unwrap_or_else(|| panic!("{message}"));
                let limit: crate::options::MemoryBudget = quoted.replace(' ', "").parse().unwrap();
                let at_quoted = PlanRequest {
                    budget: limit.bytes(),
                    ..request.clone()
                };
                assert!(at_quoted.plan().is_ok(), "d = {dim}: {message}");
                // Not far above the least that plans.
                let less = PlanRequest {
                    budget: limit.bytes() * 98 / 100,
                    ..request.clone()
                };
                assert!(
                    less.plan().is_err(),
                    "d = {dim}: {message} is not the least"
                );
            }
        }
    }

    #[test]
    fn blocks_fit_the_budget_and_are_aligned() {
        for budget in [48 << 20, 128 << 20, 1 << 30] {
            let p = request(budget).plan().unwrap();
            assert_eq!(p.outer_rows % 256, 0);
            assert_eq!(p.inner_rows % 1024, 0);
            assert!(p.outer_rows * 600 + p.inner_rows * 512 < budget, "{p:?}");
        }
        assert!(request(1 << 30).plan().unwrap().cache_inner);
        assert!(!request(128 << 20).plan().unwrap().cache_inner);
        // A streamed table is read ahead in two blocks that fit the room of one.
        let streamed = request(128 << 20).plan().unwrap();
        assert!(streamed.read_ahead && !request(1 << 30).plan().unwrap().read_ahead);
        assert!(
            streamed.outer_rows * 600 + 2 * streamed.inner_rows * 512 < 128 << 20,
            "{streamed:?}"
        );
        // Too little room for two aligned blocks: one, not read ahead.
        let tight = (1..)
            .find_map(|quarters: usize| request(quarters << 18).plan().ok())
            .unwrap();
        assert_eq!(
            (tight.inner_rows, tight.read_ahead),
            (1024, false),
            "{tight:?}"
        );
        // The blocks use the budget up unless the tables are smaller.
        assert!(!request(128 << 20).plan().unwrap().allows_second_reader());
        let mut small = request(1 << 30);
        small.outer_total_rows = 10_000;
        let p = small.plan().unwrap();
        assert!(p.allows_second_reader(), "{p:?}");
        assert!(p.spare_bytes + p.outer_rows * 600 + p.inner_rows * 512 < 1 << 30);
    }

    #[test]
    fn too_small_a_budget_is_refused_with_the_size_needed() {
        let err = request(2 << 20).plan().unwrap_err().to_string();
        assert!(err.contains("needs at least"), "{err}");
    }
}
