//! Sinkhorn potentials out of core (METHODS.md, `sn` and `dbsn`).
//!
//! Unlike the single-pass statistics, Sinkhorn couples every target: each
//! iteration needs the source potentials over the *whole* target set, then
//! the target potentials over the whole bank, so gallery shards cannot be
//! normalised separately and merged. Each iteration is therefore two sweeps
//! over bank × targets, chunk by chunk within the memory limit. When the
//! whole similarity matrix fits in half the limit, the first sweep caches its
//! tiles (f32), and every later iteration is one fused pass over the cache
//! (each group of source rows: its row update, then its share of the column
//! update while it is in cache) instead of two GEMM sweeps.
//!
//! The column update reuses the row update's exps (`kernel::RowWeight`):
//! one exp per cell per iteration instead of two. Where a column's mass is
//! too small for that form to be exact (`MIN_COLUMN_MASS`, early iterations
//! at small τ), the iteration's column update is redone exactly. After the
//! first iteration the row update shifts its exps by a bound on each row's
//! max (`RowsByStrip::bounds`) instead of finding the max, so each cell is
//! read once per iteration.

use std::ops::Range;

use crate::error::Result;
use crate::kernel::{LogSumExp, MIN_COLUMN_MASS};
use crate::progress::Progress;
use crate::source::EmbeddingTable;

mod sweeper;

use sweeper::{SweepKind, Sweeper};

/// What to normalise and how.
#[derive(Debug, Clone, Copy)]
pub struct SinkhornRequest<'a> {
    /// The sources (the query bank, or the test queries when transductive).
    pub sources: &'a EmbeddingTable,
    /// The targets, concatenated in this order (the gallery, then the gallery
    /// bank for `dbsn`).
    pub targets: &'a [&'a EmbeddingTable],
    /// Temperature τ (the plan is exp((s − g − f)/τ)).
    pub tau: f64,
    /// Iterations T (each a source update, then a target update).
    pub iterations: usize,
    /// Stop early once the row marginals are within this relative error.
    pub tolerance: Option<f64>,
    pub budget: usize,
    /// Memory the caller holds for the whole pass.
    pub resident_bytes: usize,
}

/// Where Sinkhorn's iterations stand after a full iteration: what a
/// checkpoint saves.
#[derive(Debug, Clone, Copy)]
pub struct SinkhornProgress<'a> {
    /// Full iterations run.
    pub iterations: usize,
    /// f(t), one per target row.
    pub target_potential: &'a [f64],
    /// g(b), one per source row.
    pub source_potential: &'a [f64],
    pub exact_column_updates: usize,
    pub marginal_error: f64,
    /// The iterations ended: these are the final potentials.
    pub finished: bool,
    /// Per strip of targets and source row, the row's last log-sum-exp,
    /// and the target shifts of that update: where the next update's
    /// bounds on the rows' maxima start (empty and `None` before the first).
    pub row_lse: &'a [Vec<f32>],
    pub col_shift: Option<&'a [f32]>,
}

/// Sinkhorn's iterations as a checkpoint saved them: where a resumed pass
/// goes on from.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkhornResume {
    pub iterations: usize,
    pub target_potential: Vec<f64>,
    pub source_potential: Vec<f64>,
    pub exact_column_updates: usize,
    pub marginal_error: f64,
    /// The iterations had ended: nothing is left to compute.
    pub finished: bool,
    pub row_lse: Vec<Vec<f32>>,
    pub col_shift: Option<Vec<f32>>,
}

/// The potentials and how far the plan is from its marginals.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkhornOutcome {
    /// f(t), one per target row (all target tables, concatenated).
    pub target_potential: Vec<f64>,
    /// g(b), one per source row.
    pub source_potential: Vec<f64>,
    /// Iterations run (fewer than asked when the tolerance was met).
    pub iterations: usize,
    /// max over sources of |‖row‖₁·|B| − 1| for the returned potentials
    /// (columns sum to 1/|T| exactly after the last target update).
    pub marginal_error: f64,
    /// Whether the similarity tiles were cached between sweeps.
    pub cached: bool,
    /// Iterations whose column update was redone exactly because a column's
    /// mass was below `kernel::MIN_COLUMN_MASS`.
    pub exact_column_updates: usize,
    /// Target chunks and source blocks each sweep streamed.
    pub target_chunks: usize,
    pub source_blocks: usize,
}

/// Runs T iterations of log-domain Sinkhorn with uniform marginals.
pub fn sinkhorn_potentials(
    request: &SinkhornRequest<'_>,
    progress: &dyn Progress,
) -> Result<SinkhornOutcome> {
    sinkhorn_potentials_from(request, progress, None, &mut |_| Ok(()))
}

/// [`sinkhorn_potentials`] from the iteration `resume` saved (when given),
/// handing the state after each iteration, and the final one, to
/// `on_iteration`. A resumed run gives the uninterrupted run's potentials
/// bit for bit: an iteration depends only on the potentials before it.
pub fn sinkhorn_potentials_from(
    request: &SinkhornRequest<'_>,
    progress: &dyn Progress,
    resume: Option<SinkhornResume>,
    on_iteration: &mut dyn FnMut(&SinkhornProgress<'_>) -> Result<()>,
) -> Result<SinkhornOutcome> {
    if let Some(saved) = resume.as_ref().filter(|saved| saved.finished) {
        return Ok(SinkhornOutcome {
            target_potential: saved.target_potential.clone(),
            source_potential: saved.source_potential.clone(),
            iterations: saved.iterations,
            marginal_error: saved.marginal_error,
            cached: false,
            exact_column_updates: saved.exact_column_updates,
            target_chunks: 0,
            source_blocks: 0,
        });
    }
    let sources = request.sources;
    let whole: Vec<(&EmbeddingTable, Range<u64>)> =
        request.targets.iter().map(|t| (*t, 0..t.rows)).collect();
    let mut sweeps = Sweeper::new(
        sources,
        &whole,
        request.tau,
        request.budget,
        request.resident_bytes,
    )?;
    let cache = sweeps.cache;
    let m = sources.rows as usize;
    let n = sweeps.target_rows;
    let tau = request.tau;
    let mut f = vec![0f64; n];
    let mut g = vec![0f64; m];
    let mut iterations = 0;
    let mut exact_column_updates = 0;
    let mut marginal_error = f64::INFINITY;
    if let Some(saved) = resume {
        if saved.target_potential.len() != n || saved.source_potential.len() != m {
            return Err(crate::error::HubnormError::Internal(
                "saved Sinkhorn potentials of another shape".into(),
            ));
        }
        f = saved.target_potential;
        g = saved.source_potential;
        sweeps.restore(saved.row_lse, saved.col_shift)?;
        iterations = saved.iterations;
        exact_column_updates = saved.exact_column_updates;
        marginal_error = saved.marginal_error;
    }
    progress.start("pass 1: sinkhorn sweeps", 2 * request.iterations as u64 + 1);
    progress.advance(2 * iterations as u64);
    let log_m = (m as f64).ln();
    let log_n = (n as f64).ln();
    // The source update from a row sweep: the new g, and the relative
    // row-marginal error of the plan with the old g, since
    // |B|·Σ_t π(b, t) = exp((g_new(b) − g(b))/τ).
    let potential = |row: &LogSumExp| tau * row.value() + tau * log_m;
    // g/τ, the log of a source row's mass (weights of the column update).
    let log_mass = |row: &LogSumExp| row.value() + log_m;
    let source_update = |rows: Vec<LogSumExp>, g: &[f64]| -> (Vec<f64>, f64) {
        let g_new: Vec<f64> = rows.iter().map(potential).collect();
        let error = g_new
            .iter()
            .zip(g)
            .map(|(new, old)| (((new - old) / tau).exp() - 1.0).abs())
            .fold(0.0, f64::max);
        (g_new, error)
    };
    let mut stopped_early = false;
    let resumed_iterations = iterations;
    for it in resumed_iterations..request.iterations {
        crate::cancel::check()?;
        // Once the tiles are cached, both updates share one read of them.
        let (rows, fused_cols) = if sweeps.fused_ready() {
            let (rows, cols) = sweeps.fused_iteration(&f, &log_mass)?;
            (rows, Some(cols))
        } else {
            (sweeps.sweep(SweepKind::Rows, &f, &[], &[])?, None)
        };
        progress.advance(1);
        let log_masses: Vec<f64> = rows.iter().map(log_mass).collect();
        let (g_new, error) = source_update(rows, &g);
        if it > 0 {
            marginal_error = error;
            progress.status(&format!("marginal error {error:.2e}"));
            if request.tolerance.is_some_and(|tol| error <= tol) {
                stopped_early = true;
                break;
            }
        }
        g = g_new;
        let mut cols = match fused_cols {
            Some(cols) => cols,
            None => sweeps.sweep(SweepKind::WeightedColumns, &f, &g, &log_masses)?,
        };
        if cols
            .iter()
            .any(|c| c.sum.is_nan() || c.sum < MIN_COLUMN_MASS)
        {
            // A column with (almost) no mass: its reused exps sit at their
            // floor, so redo this column update with per-column shifts.
            cols = sweeps.sweep(SweepKind::Columns, &f, &g, &[])?;
            exact_column_updates += 1;
        }
        progress.advance(1);
        f = cols.iter().map(|s| tau * s.value() + tau * log_n).collect();
        iterations = it + 1;
        on_iteration(&SinkhornProgress {
            iterations,
            target_potential: &f,
            source_potential: &g,
            exact_column_updates,
            marginal_error,
            finished: false,
            row_lse: &sweeps.rows_by_strip.lse,
            col_shift: sweeps.rows_by_strip.col_shift.as_deref(),
        })?;
    }
    if !stopped_early && iterations > 0 {
        // Measure the final plan's row marginals (one more row sweep).
        let rows = sweeps.sweep(SweepKind::Rows, &f, &g, &[])?;
        marginal_error = source_update(rows, &g).1;
        progress.status(&format!("marginal error {marginal_error:.2e}"));
    }
    on_iteration(&SinkhornProgress {
        iterations,
        target_potential: &f,
        source_potential: &g,
        exact_column_updates,
        marginal_error,
        finished: true,
        row_lse: &[],
        col_shift: None,
    })?;
    progress.finish();
    Ok(SinkhornOutcome {
        target_potential: f,
        source_potential: g,
        iterations,
        marginal_error,
        cached: cache,
        exact_column_updates,
        target_chunks: sweeps.target_chunks(),
        source_blocks: sweeps.source_blocks,
    })
}

/// One round of Sinkhorn over a shard of the targets: what a cluster task
/// computes ([`sinkhorn_in_rounds`]).
#[derive(Debug, Clone)]
pub struct SinkhornRoundRequest<'a> {
    pub sources: &'a EmbeddingTable,
    /// The target tables, concatenated in this order.
    pub targets: &'a [&'a EmbeddingTable],
    /// The shard: rows of the concatenated targets.
    pub target_rows: Range<u64>,
    pub tau: f64,
    /// g(b) of every source after the last round; `None` in the first
    /// round (f ≡ 0).
    pub source_potential: Option<&'a [f64]>,
    pub budget: usize,
    pub resident_bytes: usize,
}

/// What a round of a shard sends back.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkhornRound {
    /// f(t) of the shard's targets: the target update from the round's g
    /// (zeros in the first round).
    pub target_potential: Vec<f64>,
    /// Per source row, the log-sum-exp over the shard's targets of
    /// (s − f)/τ with that f: partial states, which merge over the shards
    /// into the next source update.
    pub rows: Vec<LogSumExp>,
    /// Whether the tiles were cached between the two sweeps.
    pub cached: bool,
}

/// A shard's round: the target update of its targets from the sources'
/// potentials (every source, with per-column shifts: exact at any mass),
/// then its share of every source row's update with the new f (shifted by
/// each row's max). Two sweeps over the shard × the sources, the tiles
/// cached between them when they fit the budget.
pub fn sinkhorn_round(request: &SinkhornRoundRequest<'_>) -> Result<SinkhornRound> {
    let total: u64 = request.targets.iter().map(|t| t.rows).sum();
    if request.target_rows.end > total || request.target_rows.start > request.target_rows.end {
        return Err(crate::error::HubnormError::Internal(format!(
            "Sinkhorn round over target rows {:?} of {total}",
            request.target_rows
        )));
    }
    // The shard's rows in each target table.
    let mut offset = 0;
    let mut parts = Vec::new();
    for table in request.targets {
        let start = request.target_rows.start.clamp(offset, offset + table.rows) - offset;
        let end = request.target_rows.end.clamp(offset, offset + table.rows) - offset;
        parts.push((*table, start..end));
        offset += table.rows;
    }
    let m = request.sources.rows as usize;
    if let Some(g) = request.source_potential {
        if g.len() != m {
            return Err(crate::error::HubnormError::Internal(format!(
                "Sinkhorn round with {} source potentials for {m} sources",
                g.len()
            )));
        }
    }
    let mut sweeps = Sweeper::new(
        request.sources,
        &parts,
        request.tau,
        request.budget,
        request.resident_bytes + m * 16,
    )?;
    let n = sweeps.target_rows;
    let tau = request.tau;
    let log_n = (total as f64).ln();
    let f = match request.source_potential {
        Some(g) => sweeps
            .sweep(SweepKind::Columns, &vec![0f64; n], g, &[])?
            .iter()
            .map(|column| tau * column.value() + tau * log_n)
            .collect(),
        None => vec![0f64; n],
    };
    crate::cancel::check()?;
    let rows = sweeps.sweep(SweepKind::Rows, &f, &[], &[])?;
    Ok(SinkhornRound {
        target_potential: f,
        rows,
        cached: sweeps.cache,
    })
}

/// The sizes and settings of Sinkhorn run as rounds ([`sinkhorn_in_rounds`]).
#[derive(Debug, Clone, Copy)]
pub struct RoundsRequest {
    /// Rows of the sources (|B|) and of all targets (|T|).
    pub sources: usize,
    pub targets: usize,
    pub tau: f64,
    pub iterations: usize,
    pub tolerance: Option<f64>,
}

/// T iterations of log-domain Sinkhorn as T + 1 rounds over shards of the
/// targets (a cluster's plan). Round r hands g_r to every shard
/// (`run_round`: `None` in round 0); each updates its targets' f from it
/// and sends its share of every source row with that f, and the merged
/// rows give g_{r+1} and the marginal error of (f_r, g_r). So round r
/// ends iteration r − 1 of [`sinkhorn_potentials`], and the last round is
/// its final check of the row marginals; `--tol` stops at the same
/// iteration. `run_round` returns the f of every target (shards in order)
/// and the rows merged over the shards.
///
/// The potentials agree with [`sinkhorn_potentials`]'s within rounding,
/// not bit for bit: one machine reuses the row update's exps for the
/// column update and shifts rows by a bound on their max, while a round
/// computes every update in the exact form (so no column update is ever
/// redone: `exact_column_updates` is 0).
pub fn sinkhorn_in_rounds(
    request: &RoundsRequest,
    progress: &dyn Progress,
    mut run_round: impl FnMut(Option<&[f64]>) -> Result<(Vec<f64>, Vec<LogSumExp>)>,
) -> Result<SinkhornOutcome> {
    let tau = request.tau;
    let log_m = (request.sources as f64).ln();
    let check = |f: &[f64], rows: &[LogSumExp]| -> Result<()> {
        if f.len() != request.targets || rows.len() != request.sources {
            return Err(crate::error::HubnormError::Internal(format!(
                "a Sinkhorn round returned {} target potentials and {} source rows for {} and {}",
                f.len(),
                rows.len(),
                request.targets,
                request.sources
            )));
        }
        Ok(())
    };
    progress.start("pass 1: sinkhorn rounds", request.iterations as u64 + 1);
    let (f0, rows) = run_round(None)?;
    check(&f0, &rows)?;
    progress.advance(1);
    let mut f = f0;
    let mut g: Vec<f64> = rows.iter().map(|r| tau * r.value() + tau * log_m).collect();
    let mut iterations = 0;
    let mut marginal_error = f64::INFINITY;
    for round in 1..=request.iterations {
        crate::cancel::check()?;
        let (f_round, rows) = run_round(Some(&g))?;
        check(&f_round, &rows)?;
        progress.advance(1);
        let g_next: Vec<f64> = rows.iter().map(|r| tau * r.value() + tau * log_m).collect();
        marginal_error = g_next
            .iter()
            .zip(&g)
            .map(|(new, old)| (((new - old) / tau).exp() - 1.0).abs())
            .fold(0.0, f64::max);
        progress.status(&format!("marginal error {marginal_error:.2e}"));
        f = f_round;
        iterations = round;
        let converged = request.tolerance.is_some_and(|tol| marginal_error <= tol);
        if round == request.iterations || converged {
            break;
        }
        g = g_next;
    }
    progress.finish();
    Ok(SinkhornOutcome {
        target_potential: f,
        source_potential: g,
        iterations,
        marginal_error,
        cached: false,
        exact_column_updates: 0,
        target_chunks: 0,
        source_blocks: 0,
    })
}
