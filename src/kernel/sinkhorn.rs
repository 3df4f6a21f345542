//! Log-domain Sinkhorn sweeps over similarity tiles (METHODS.md, `sn` and
//! `dbsn`).
//!
//! A sweep streams the tiles of source rows (bank) × target columns
//! (gallery, and the gallery bank for `dbsn`) and folds (s − shift)/τ into a
//! log-sum-exp per row (the source update, shifted by the target potentials)
//! or per column (the target update, shifted by the source potentials).
//! The column update has two forms: exact, with per-column shifts, and the
//! exp-reuse form ([`RowWeight`]) that rebuilds the row update's exps and
//! weights them, which the fused iteration ([`fused_group`]) takes from each
//! row's exps while they are in cache. After the first iteration the row
//! update may shift its exps by a bound on the row's max instead of the max
//! ([`MIN_BOUNDED_SUM`]), which saves the pass that finds it.
//! Tiles come from the GEMM, or from a cache filled on the first sweep when
//! the whole bank × targets matrix fits the memory limit, so later sweeps
//! cost a memory pass instead of a GEMM.
//!
//! Strips of [`TILE_COLS`] columns run in parallel; row states are merged
//! from per-strip partials in strip order, so results do not depend on the
//! thread count.

use rayon::prelude::*;

use super::exp::{add_exps, add_mapped_exps, fast_exp, EXP_CHUNK};
use super::fused::{Rows, COLUMN_BLOCK, GROUP_ROWS, TILE_COLS, TILE_ROWS};
use super::gemm::similarity_tile;
use super::lse::{raise_column_maxima, LogSumExp};

/// Which potential a sweep prepares.
#[derive(Debug, Clone, Copy)]
pub enum Sweep<'a> {
    /// For every row: LSE over the columns of (s − `col_shift[j]`) / τ.
    /// `row_bound[strip][row]`, when given: an upper bound of the row's max
    /// over each strip of [`TILE_COLS`] columns, used as the shift of its
    /// exps where it is tight enough (see [`MIN_BOUNDED_SUM`]).
    Rows {
        col_shift: &'a [f32],
        row_bound: Option<&'a [&'a [f32]]>,
    },
    /// For every column: LSE over the rows of (s − `row_shift[i]`) / τ.
    Columns { row_shift: &'a [f32] },
    /// For every column: the same LSE in the exp-reuse form (see
    /// [`RowWeight`]): the max is `col_shift[j]`·inv_tau and the sum
    /// Σ_i weight · max(e, floor). `weights[strip][row]`: one slice per
    /// strip of [`TILE_COLS`] columns, one weight per row of the block.
    WeightedColumns {
        col_shift: &'a [f32],
        weights: &'a [&'a [RowWeight]],
    },
}

/// Where a block's similarities come from.
#[derive(Debug)]
pub enum TileSource<'a> {
    /// Computed by the GEMM each time.
    Compute,
    /// Computed by the GEMM and stored into this buffer (`rows × cols`,
    /// strip after strip) for later sweeps.
    Fill(&'a mut [f32]),
    /// Read from a buffer filled by an earlier sweep.
    Cached(&'a [f32]),
}

/// Runs one sweep over the block `rows × cols`. `row_states` has one entry
/// per row of the block, `col_states` one per column; the sweep folds into
/// them (so blocks accumulate). A row sweep returns, per strip of
/// [`TILE_COLS`] columns, each row's state over the strip (its `max` is the
/// shift of the row's exps, which [`RowWeight`] needs, and its value the
/// base of the next iteration's bound); other sweeps return nothing.
///
/// # Panics
/// When the shapes disagree.
pub fn lse_sweep(
    rows: Rows<'_>,
    cols: Rows<'_>,
    source: TileSource<'_>,
    sweep: Sweep<'_>,
    inv_tau: f32,
    row_states: &mut [LogSumExp],
    col_states: &mut [LogSumExp],
) -> Vec<Vec<LogSumExp>> {
    let (nr, nc) = (rows.rows, cols.rows);
    let strips = nc.div_ceil(TILE_COLS);
    match sweep {
        Sweep::Rows {
            col_shift,
            row_bound,
        } => {
            assert_eq!(col_shift.len(), nc, "one shift per column");
            assert_eq!(row_states.len(), nr, "one state per row");
            if let Some(bound) = row_bound {
                assert_eq!(bound.len(), strips, "one bound slice per strip");
                assert!(bound.iter().all(|b| b.len() == nr), "one bound per row");
            }
        }
        Sweep::Columns { row_shift } => {
            assert_eq!(row_shift.len(), nr, "one shift per row");
            assert_eq!(col_states.len(), nc, "one state per column");
        }
        Sweep::WeightedColumns { col_shift, weights } => {
            assert_eq!(col_shift.len(), nc, "one shift per column");
            assert_eq!(col_states.len(), nc, "one state per column");
            assert_eq!(weights.len(), strips, "one weight slice per strip");
            assert!(weights.iter().all(|w| w.len() == nr), "one weight per row");
        }
    }
    if nr == 0 || nc == 0 {
        return Vec::new();
    }
    // Each strip's part of the cache: `nr × strip width`, contiguous.
    let mut caches: Vec<TileSource<'_>> = match source {
        TileSource::Compute => (0..strips).map(|_| TileSource::Compute).collect(),
        TileSource::Fill(buffer) => buffer[..nr * nc]
            .chunks_mut(nr * TILE_COLS)
            .map(TileSource::Fill)
            .collect(),
        TileSource::Cached(buffer) => buffer[..nr * nc]
            .chunks(nr * TILE_COLS)
            .map(TileSource::Cached)
            .collect(),
    };
    let mut col_parts: Vec<&mut [LogSumExp]> = if col_states.is_empty() {
        (0..strips).map(|_| <&mut [LogSumExp]>::default()).collect()
    } else {
        col_states.chunks_mut(TILE_COLS).collect()
    };
    let tasks: Vec<_> = caches
        .drain(..)
        .zip(col_parts.drain(..))
        .enumerate()
        .collect();
    let row_partials: Vec<Option<Vec<LogSumExp>>> = tasks
        .into_par_iter()
        .map(|(strip, (cache, col_part))| {
            let c0 = strip * TILE_COLS;
            let c1 = (c0 + TILE_COLS).min(nc);
            let strip_cols = Rows {
                data: &cols.data[c0 * cols.dim..c1 * cols.dim],
                rows: c1 - c0,
                dim: cols.dim,
            };
            sweep_strip(rows, strip_cols, strip, c0, cache, sweep, inv_tau, col_part)
        })
        .collect();
    let mut strip_states = Vec::new();
    for part in row_partials.into_iter().flatten() {
        for (state, p) in row_states.iter_mut().zip(&part) {
            state.merge(p);
        }
        strip_states.push(part);
    }
    strip_states
}

/// One column strip of a sweep; returns the strip's row states for
/// `Sweep::Rows`.
#[allow(clippy::too_many_arguments)]
fn sweep_strip(
    rows: Rows<'_>,
    cols: Rows<'_>,
    strip: usize,
    c0: usize,
    mut cache: TileSource<'_>,
    sweep: Sweep<'_>,
    inv_tau: f32,
    col_states: &mut [LogSumExp],
) -> Option<Vec<LogSumExp>> {
    let nc = cols.rows;
    let mut tile = match cache {
        TileSource::Compute => vec![0f32; TILE_ROWS * nc],
        TileSource::Fill(_) | TileSource::Cached(_) => Vec::new(),
    };
    let mut row_out = match sweep {
        Sweep::Rows { .. } => Some(vec![LogSumExp::default(); rows.rows]),
        Sweep::Columns { .. } | Sweep::WeightedColumns { .. } => None,
    };
    let mut max: Vec<f64> = col_states.iter().map(|s| s.max).collect();
    let mut sum: Vec<f64> = col_states.iter().map(|s| s.sum).collect();
    let mut r0 = 0;
    while r0 < rows.rows {
        let r1 = (r0 + TILE_ROWS).min(rows.rows);
        let nr = r1 - r0;
        let similarities: &[f32] = match &mut cache {
            TileSource::Cached(buffer) => &buffer[r0 * nc..r1 * nc],
            // The GEMM writes straight into the cache (no copy of the tile).
            TileSource::Fill(buffer) => {
                let cells = &mut buffer[r0 * nc..r1 * nc];
                let a = &rows.data[r0 * rows.dim..r1 * rows.dim];
                similarity_tile(cells, nc, a, nr, cols.data, nc, cols.dim);
                cells
            }
            TileSource::Compute => {
                let a = &rows.data[r0 * rows.dim..r1 * rows.dim];
                similarity_tile(&mut tile, nc, a, nr, cols.data, nc, cols.dim);
                &tile[..nr * nc]
            }
        };
        match sweep {
            Sweep::Rows {
                col_shift,
                row_bound,
            } => {
                let shifts = &col_shift[c0..c0 + nc];
                let out = row_out.as_mut().expect("row sweep");
                for (i, state) in out[r0..r1].iter_mut().enumerate() {
                    *state = super::dispatch::shifted_row_lse(
                        &similarities[i * nc..(i + 1) * nc],
                        shifts,
                        inv_tau,
                        row_bound.map(|b| b[strip][r0 + i]),
                    );
                }
            }
            Sweep::Columns { row_shift } => fold_columns(
                similarities,
                nc,
                nc,
                &row_shift[r0..r1],
                inv_tau,
                &mut max,
                &mut sum,
            ),
            Sweep::WeightedColumns { col_shift, weights } => fold_weighted_columns(
                similarities,
                nc,
                nc,
                &weights[strip][r0..r1],
                &col_shift[c0..c0 + nc],
                inv_tau,
                &mut sum,
            ),
        }
        r0 = r1;
    }
    if let Sweep::WeightedColumns { col_shift, .. } = sweep {
        for (m, &c) in max.iter_mut().zip(&col_shift[c0..c0 + nc]) {
            *m = c as f64 * inv_tau as f64;
        }
    }
    for (j, state) in col_states.iter_mut().enumerate() {
        *state = LogSumExp {
            max: max[j],
            sum: sum[j],
        };
    }
    row_out
}

/// Folds `row_shift.len()` rows of `width` columns, `stride` floats apart,
/// into per-column log-sum-exp states (`max`, `sum`) of (s − g_i)·inv_tau.
/// The rows must start at a multiple of [`GROUP_ROWS`] of the whole matrix.
///
/// Per group of rows and block of columns: the column maxima, the running
/// maxima raised (sums rescaled), then the shifted exps summed in f32 over
/// the group (each ≤ 1, at most 128 of them) and added to the f64 sums. A
/// column's arithmetic depends only on its values and the global groups, so
/// the recomputed and the cached sweep give the same bits, whatever the
/// block sizes and column splits. (The exact column update: the iterations
/// use [`fold_weighted_columns`] and fall back to this one.)
pub(crate) fn fold_columns(
    cells: &[f32],
    stride: usize,
    width: usize,
    row_shift: &[f32],
    inv_tau: f32,
    max: &mut [f64],
    sum: &mut [f64],
) {
    let mut group_max = [0f32; COLUMN_BLOCK];
    let mut shift = [0f32; COLUMN_BLOCK];
    let mut group_sum = [0f32; COLUMN_BLOCK];
    for (g, shifts) in row_shift.chunks(GROUP_ROWS).enumerate() {
        let group = &cells[g * GROUP_ROWS * stride..];
        for c0 in (0..width).step_by(COLUMN_BLOCK) {
            let w = COLUMN_BLOCK.min(width - c0);
            let block = &group[c0..];
            super::dispatch::shifted_column_max(
                block,
                stride,
                w,
                shifts,
                inv_tau,
                &mut group_max[..w],
            );
            raise_column_maxima(
                &group_max[..w],
                1.0,
                &mut max[c0..c0 + w],
                &mut sum[c0..c0 + w],
                &mut shift[..w],
            );
            super::dispatch::shifted_exp_sum_columns(
                block,
                stride,
                w,
                shifts,
                inv_tau,
                &shift[..w],
                &mut group_sum[..w],
            );
            for (acc, &part) in sum[c0..c0 + w].iter_mut().zip(&group_sum[..w]) {
                *acc += part as f64;
            }
        }
    }
}

/// One row group's part of one cached strip: `rows × width` similarities,
/// row-major, for the targets `first_col..first_col + width`, and
/// optionally an upper bound of each row's max over it (as
/// [`Sweep::Rows`]'s `row_bound`).
#[derive(Debug, Clone, Copy)]
pub struct StripRows<'a> {
    pub cells: &'a [f32],
    pub width: usize,
    pub first_col: usize,
    pub bound: Option<&'a [f32]>,
}

/// The source update of one group of rows: each row's state over all the
/// targets, and `strips[strip][row]`, its state over each strip (as a row
/// sweep returns them).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRows {
    pub states: Vec<LogSumExp>,
    pub strips: Vec<Vec<LogSumExp>>,
}

/// Rows whose shares of the column masses (reused-exp column update) are
/// summed in f32 before they join each column's f64 mass: the update's unit
/// of summation order. Groups start at multiples of [`GROUP_ROWS`], a
/// multiple of this, so the units are the same global rows however the
/// matrix is cut, and the fused and the swept updates give the same bits.
pub const MASS_ROWS: usize = 16;
const _: () = assert!(
    GROUP_ROWS.is_multiple_of(MASS_ROWS),
    "units tile the groups"
);

/// Columns per task when the units' f32 sums join the f64 masses.
const MASS_MERGE_COLUMNS: usize = 4096;

/// Scratch floats [`fused_group`] needs for a group of `rows` rows over
/// `targets` targets: one f32 mass sum per unit of [`MASS_ROWS`] rows.
/// (Each running task also holds one row of exps, `targets` floats.)
pub fn fused_group_scratch(rows: usize, targets: usize) -> usize {
    rows.div_ceil(MASS_ROWS) * targets
}

/// One Sinkhorn iteration over one group of cached rows (at most
/// [`GROUP_ROWS`], starting at a multiple of it), one unit of [`MASS_ROWS`]
/// rows per task: each row's log-sum-exp over every target of
/// (s − f)·inv_tau, its exps kept in a row buffer (L2-resident), then at
/// once the row's share of every column mass from those exps, weighted by
/// its new source potential (`log_mass(row state)` = g/τ; see
/// [`RowWeight`]), summed in f32 per unit. The units' sums are added to
/// `col_sum` (one f64 per target) in row order. One exp per cell per
/// iteration, and the exps never leave the core's cache.
///
/// `strips` covers the targets in order (with the rows' bounds, if any);
/// `partials` is scratch of at least [`fused_group_scratch`] floats. Row
/// states are merged strip after strip and the columns summed as
/// `fold_weighted_columns` sums them, so the result is bit-identical to a
/// row sweep with the same bounds followed by a [`Sweep::WeightedColumns`]
/// sweep (cached or recomputed).
#[allow(clippy::too_many_arguments)]
pub fn fused_group(
    strips: &[StripRows<'_>],
    rows: usize,
    col_shift: &[f32],
    inv_tau: f32,
    log_mass: &(dyn Fn(&LogSumExp) -> f64 + Sync),
    partials: &mut [f32],
    col_sum: &mut [f64],
) -> GroupRows {
    let total: usize = strips.iter().map(|s| s.width).sum();
    if rows == 0 || total == 0 {
        return GroupRows {
            states: vec![LogSumExp::default(); rows],
            strips: vec![vec![LogSumExp::default(); rows]; strips.len()],
        };
    }
    let units = rows.div_ceil(MASS_ROWS);
    let partials = &mut partials[..units * total];
    // Per unit: its rows' states, and their strip states row after row.
    let unit_rows: Vec<(Vec<LogSumExp>, Vec<LogSumExp>)> = partials
        .par_chunks_mut(total)
        .enumerate()
        .map(|(unit, mass)| {
            let r0 = unit * MASS_ROWS;
            let r1 = (r0 + MASS_ROWS).min(rows);
            let mut row_exps = vec![0f32; total];
            let mut strip_states = Vec::with_capacity((r1 - r0) * strips.len());
            mass.fill(0.0);
            let states = (r0..r1)
                .map(|r| {
                    let first_part = strip_states.len();
                    let mut state = LogSumExp::default();
                    let mut offset = 0;
                    for strip in strips {
                        let row = &strip.cells[r * strip.width..(r + 1) * strip.width];
                        let shifts = &col_shift[strip.first_col..strip.first_col + strip.width];
                        let part = super::dispatch::shifted_row_lse_store(
                            row,
                            shifts,
                            inv_tau,
                            strip.bound.map(|b| b[r]),
                            &mut row_exps[offset..offset + strip.width],
                        );
                        state.merge(&part);
                        strip_states.push(part);
                        offset += strip.width;
                    }
                    let log_mass = log_mass(&state);
                    let mut offset = 0;
                    for (strip, part) in strips.iter().zip(&strip_states[first_part..]) {
                        let range = offset..offset + strip.width;
                        super::dispatch::add_weighted_exps(
                            &mut mass[range.clone()],
                            &row_exps[range],
                            RowWeight::new(part.max as f32, log_mass),
                        );
                        offset += strip.width;
                    }
                    state
                })
                .collect();
            (states, strip_states)
        })
        .collect();
    // The units' f32 sums join the f64 masses in row order; columns in parallel.
    let partials: &[f32] = partials;
    col_sum[..total]
        .par_chunks_mut(MASS_MERGE_COLUMNS)
        .enumerate()
        .for_each(|(k, sums)| {
            let c0 = k * MASS_MERGE_COLUMNS;
            for unit in partials.chunks_exact(total) {
                for (acc, &part) in sums.iter_mut().zip(&unit[c0..]) {
                    *acc += part as f64;
                }
            }
        });
    let mut group = GroupRows {
        states: Vec::with_capacity(rows),
        strips: vec![Vec::with_capacity(rows); strips.len()],
    };
    for (states, strip_states) in unit_rows {
        group.states.extend(states);
        for row in strip_states.chunks_exact(strips.len()) {
            for (column, &part) in group.strips.iter_mut().zip(row) {
                column.push(part);
            }
        }
    }
    group
}

/// T iterations of log-domain Sinkhorn (row update, then column update,
/// uniform marginals) on a small stack of `n`-wide rows held in memory:
/// `first` and then `others` (row-major). Returns the column potential f
/// (`sinkhorn-pp`: one such stack per test query).
pub fn stack_column_potential(
    first: &[f32],
    others: &[f32],
    tau: f32,
    iterations: usize,
) -> Vec<f32> {
    let n = first.len();
    let m = 1 + others.len() / n.max(1);
    let row = |r: usize| -> &[f32] {
        if r == 0 {
            first
        } else {
            &others[(r - 1) * n..r * n]
        }
    };
    let inv_tau = 1.0 / tau;
    let (log_m, log_n) = ((m as f32).ln(), (n as f32).ln());
    let mut f = vec![0f32; n];
    let mut g = vec![0f32; m];
    let mut column_max = vec![0f32; n];
    let mut column_sum = vec![0f32; n];
    for _ in 0..iterations {
        // Rows: g_r = τ·LSE_t (s − f)/τ + τ·log m.
        for (r, g_r) in g.iter_mut().enumerate() {
            let lse = super::dispatch::shifted_row_lse(row(r), &f, inv_tau, None);
            *g_r = tau * lse.value() as f32 + tau * log_m;
        }
        // Columns: f_t = τ·LSE_r (s − g_r)/τ + τ·log n.
        column_max.fill(f32::NEG_INFINITY);
        for (r, &g_r) in g.iter().enumerate() {
            super::dispatch::stack_column_max(row(r), g_r, inv_tau, &mut column_max);
        }
        column_sum.fill(0.0);
        for (r, &g_r) in g.iter().enumerate() {
            super::dispatch::stack_column_exp_add(
                row(r),
                g_r,
                inv_tau,
                &column_max,
                &mut column_sum,
            );
        }
        for ((fv, &c), &sum) in f.iter_mut().zip(&column_max).zip(&column_sum) {
            *fv = tau * (c + sum.ln()) + tau * log_n;
        }
    }
    f
}

/// Epilogue body: per column, the max over the rows (`stride` apart) of
/// (s − g_i)·inv_tau, for the first `width` columns.
#[inline(always)]
pub(super) fn shifted_column_max_body(
    cells: &[f32],
    stride: usize,
    width: usize,
    row_shift: &[f32],
    inv_tau: f32,
    out: &mut [f32],
) {
    let out = &mut out[..width];
    out.fill(f32::NEG_INFINITY);
    for (i, &g) in row_shift.iter().enumerate() {
        let row = &cells[i * stride..i * stride + width];
        for (m, &s) in out.iter_mut().zip(row) {
            let v = (s - g) * inv_tau;
            *m = if v > *m { v } else { *m };
        }
    }
}

/// Epilogue body: per column, Σ over the rows (`stride` apart) of
/// exp((s − g_i)·inv_tau − shift_j) in f32, for the first `width` columns.
#[inline(always)]
pub(super) fn shifted_exp_sum_columns_body(
    cells: &[f32],
    stride: usize,
    width: usize,
    row_shift: &[f32],
    inv_tau: f32,
    shift: &[f32],
    sum: &mut [f32],
) {
    let (sum, shift) = (&mut sum[..width], &shift[..width]);
    sum.fill(0.0);
    for (i, &g) in row_shift.iter().enumerate() {
        let row = &cells[i * stride..i * stride + width];
        add_exps(sum, row, shift, |s, m| (s - g) * inv_tau - m);
    }
}

/// Epilogue body: running max per column of (s − g)·inv_tau for one row.
#[inline(always)]
pub(super) fn stack_column_max_body(row: &[f32], g: f32, inv_tau: f32, max: &mut [f32]) {
    for (c, &x) in max.iter_mut().zip(row) {
        let v = (x - g) * inv_tau;
        *c = if v > *c { v } else { *c };
    }
}

/// Epilogue body: adds exp((s − g)·inv_tau − max) per column for one row.
#[inline(always)]
pub(super) fn stack_column_exp_add_body(
    row: &[f32],
    g: f32,
    inv_tau: f32,
    max: &[f32],
    sum: &mut [f32],
) {
    let n = sum.len().min(row.len()).min(max.len());
    add_exps(&mut sum[..n], row, max, |x, c| (x - g) * inv_tau - c);
}

/// Epilogue body: LSE over one row of (s − shift)·inv_tau, with f32 lanes
/// summed into f64 at the end. With a `bound` (an upper bound of the row's
/// max, see [`MIN_BOUNDED_SUM`]) the exps are shifted by it and the max pass
/// is skipped; the returned state's `max` is the shift used.
#[inline(always)]
pub(super) fn shifted_row_lse_body(
    scores: &[f32],
    shifts: &[f32],
    inv_tau: f32,
    bound: Option<f32>,
) -> LogSumExp {
    row_lse::<false>(scores, shifts, inv_tau, bound, &mut [])
}

/// Epilogue body: [`shifted_row_lse_body`], also writing each exp
/// exp((s − shift)·inv_tau − max) to `exps` (same bits as the sum used).
#[inline(always)]
pub(super) fn shifted_row_lse_store_body(
    scores: &[f32],
    shifts: &[f32],
    inv_tau: f32,
    bound: Option<f32>,
    exps: &mut [f32],
) -> LogSumExp {
    row_lse::<true>(scores, shifts, inv_tau, bound, exps)
}

/// A row's exps over a strip may be shifted by an upper bound of its max
/// instead of the max itself (the last iteration's log-sum-exp plus how far
/// the target potentials fell, see `bank::sinkhorn`), which saves the pass
/// that finds the max: about a third of the row update. The bound is kept
/// when the exps sum to at least this (the bound is at most ln(1e18) ≈ 41
/// above the max); below, the strip is redone with its exact max. Cells
/// whose exp clamps at e⁻⁸⁷ then err by at most 2e-38 each against a sum
/// of at least 1e-18: a relative error below 1e-16 per target.
pub const MIN_BOUNDED_SUM: f64 = 1e-18;

/// The row LSE, storing the exps when `STORE`, shifted by `bound` when it
/// holds (see [`MIN_BOUNDED_SUM`]) and by the row's max otherwise.
#[inline(always)]
fn row_lse<const STORE: bool>(
    scores: &[f32],
    shifts: &[f32],
    inv_tau: f32,
    bound: Option<f32>,
    exps_out: &mut [f32],
) -> LogSumExp {
    let n = scores.len().min(shifts.len());
    let (scores, shifts) = (&scores[..n], &shifts[..n]);
    let exps_out = if STORE {
        &mut exps_out[..n]
    } else {
        &mut exps_out[..0]
    };
    if let Some(bound) = bound {
        let sum = shifted_exp_sum::<STORE>(scores, shifts, inv_tau, bound, exps_out);
        // Exps above e (a sum above n·e) would mean the bound is below the
        // max beyond rounding: never for a true bound, but checked.
        if sum >= MIN_BOUNDED_SUM && sum <= n as f64 * std::f64::consts::E {
            return LogSumExp {
                max: bound as f64,
                sum,
            };
        }
    }
    let max = shifted_row_max(scores, shifts, inv_tau);
    LogSumExp {
        max: max as f64,
        sum: shifted_exp_sum::<STORE>(scores, shifts, inv_tau, max, exps_out),
    }
}

/// Lanes of the row loops (one AVX-512 register of f32).
const ROW_LANES: usize = 16;

/// max over the row of (s − shift)·inv_tau. Fixed-size lane arrays (no
/// indexing) so the compiler keeps the loop in 16-lane registers.
#[inline(always)]
fn shifted_row_max(scores: &[f32], shifts: &[f32], inv_tau: f32) -> f32 {
    const LANES: usize = ROW_LANES;
    let n = scores.len();
    let full = n - n % LANES;
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    for (s, c) in scores[..full]
        .chunks_exact(LANES)
        .zip(shifts[..full].chunks_exact(LANES))
    {
        let s: &[f32; LANES] = s.try_into().expect("lane chunk");
        let c: &[f32; LANES] = c.try_into().expect("lane chunk");
        for l in 0..LANES {
            let v = (s[l] - c[l]) * inv_tau;
            lane_max[l] = if v > lane_max[l] { v } else { lane_max[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in &lane_max {
        m = if v > m { v } else { m };
    }
    for (&s, &c) in scores[full..].iter().zip(&shifts[full..]) {
        let v = (s - c) * inv_tau;
        m = if v > m { v } else { m };
    }
    m
}

/// Σ over the row of exp((s − shift)·inv_tau − m), summed in f32 lanes and
/// then in f64; each exp also written to `exps_out` when `STORE`.
#[inline(always)]
fn shifted_exp_sum<const STORE: bool>(
    scores: &[f32],
    shifts: &[f32],
    inv_tau: f32,
    m: f32,
    exps_out: &mut [f32],
) -> f64 {
    const LANES: usize = ROW_LANES;
    let n = scores.len();
    let full = n - n % LANES;
    // The exps of EXP_CHUNK values at once (several vectors in flight), then
    // added lane-wise chunk after chunk: the order of the one-vector loop.
    let mut lane_sum = [0f32; LANES];
    let wide = n - n % EXP_CHUNK;
    let mut exps = [0f32; EXP_CHUNK];
    for (k, (s, c)) in scores[..wide]
        .chunks_exact(EXP_CHUNK)
        .zip(shifts[..wide].chunks_exact(EXP_CHUNK))
        .enumerate()
    {
        let s: &[f32; EXP_CHUNK] = s.try_into().expect("exp chunk");
        let c: &[f32; EXP_CHUNK] = c.try_into().expect("exp chunk");
        for l in 0..EXP_CHUNK {
            exps[l] = fast_exp((s[l] - c[l]) * inv_tau - m);
        }
        if STORE {
            exps_out[k * EXP_CHUNK..(k + 1) * EXP_CHUNK].copy_from_slice(&exps);
        }
        for part in exps.chunks_exact(LANES) {
            for l in 0..LANES {
                lane_sum[l] += part[l];
            }
        }
    }
    for (j, (&s, &c)) in scores[wide..full]
        .iter()
        .zip(&shifts[wide..full])
        .enumerate()
    {
        // One lane at a time in the tail: the same lane, the same order.
        let e = fast_exp((s - c) * inv_tau - m);
        if STORE {
            exps_out[wide + j] = e;
        }
        lane_sum[j % LANES] += e;
    }
    let mut total: f64 = lane_sum.iter().map(|&v| v as f64).sum();
    for (j, (&s, &c)) in scores[full..].iter().zip(&shifts[full..]).enumerate() {
        let e = fast_exp((s - c) * inv_tau - m);
        if STORE {
            exps_out[full + j] = e;
        }
        total += e as f64;
    }
    total
}

/// How one source row's exps over one strip of targets enter the target
/// update without a second exp (the exp-reuse form of the column update).
///
/// The row update computed e = exp((s − f_t)·inv_tau − shift) with the
/// strip's max (or a bound on it, see [`MIN_BOUNDED_SUM`]) as `shift`, and
/// the row's log mass g/τ = LSE + log |B|. The
/// column update needs exp((s − g)/τ) = e · exp(shift − g/τ) · exp(f_t/τ), so
/// each column sums e · `weight` and keeps f_t/τ as its log-sum-exp max.
///
/// `floor`: e is raised to it before the product, so every product is a
/// normal f32 (a denormal costs a microcode assist, ~100 cycles, per lane
/// on x86) and at least 2e-38: an absolute error below 2e-38 per cell,
/// negligible next to the column masses the caller accepts (it falls back
/// to the exact update for columns below `MIN_COLUMN_MASS`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RowWeight {
    pub shift: f32,
    pub weight: f32,
    pub floor: f32,
}

impl RowWeight {
    /// Weights below this drop the row's contribution to the strip
    /// (≤ 1e-36 per cell).
    const MIN_WEIGHT: f64 = 1e-36;

    /// From the shift of the row's exps over the strip (its max of
    /// (s − f)·inv_tau, or an upper bound of it) and the row's log mass g/τ.
    pub fn new(strip_max: f32, log_mass: f64) -> Self {
        let weight = (strip_max as f64 - log_mass).exp();
        if weight < Self::MIN_WEIGHT {
            return RowWeight {
                shift: strip_max,
                weight: 0.0,
                floor: 0.0,
            };
        }
        // From a weight of 1 up, every product (e ≥ e⁻⁸⁷) is normal without
        // a floor; and 2e-38/weight would itself be a denormal.
        let floor = if weight >= 1.0 { 0.0 } else { 2e-38 / weight };
        RowWeight {
            shift: strip_max,
            weight: weight as f32,
            floor: floor as f32,
        }
    }

    /// Weights for every strip and row: `strip_max` holds one slice per
    /// strip (each row's max over it, from a row sweep), `log_mass` one g/τ
    /// per row. The result is indexed `[strip][row]`, as
    /// [`Sweep::WeightedColumns`] takes it.
    pub fn per_strip<'a>(
        strip_max: impl IntoIterator<Item = &'a [f32]>,
        log_mass: &[f64],
    ) -> Vec<Vec<RowWeight>> {
        strip_max
            .into_iter()
            .map(|maxima| {
                maxima
                    .iter()
                    .zip(log_mass)
                    .map(|(&m, &mass)| RowWeight::new(m, mass))
                    .collect()
            })
            .collect()
    }

    /// The cell's share of its column mass.
    #[inline(always)]
    fn apply(&self, e: f32) -> f32 {
        (if e > self.floor { e } else { self.floor }) * self.weight
    }
}

/// Column masses below this make the reused-exp column update unreliable
/// (the cells' floors and dropped rows are within ~1e-10 of it), so the
/// caller redoes that iteration's column update exactly.
pub const MIN_COLUMN_MASS: f64 = 1e-20;

/// Epilogue body: one row's shares of the column masses,
/// `acc[j] += weight · max(exps[j], floor)` (see [`RowWeight`]).
#[inline(always)]
pub(super) fn add_weighted_exps_body(acc: &mut [f32], exps: &[f32], weight: RowWeight) {
    for (a, &e) in acc.iter_mut().zip(exps) {
        *a += weight.apply(e);
    }
}

/// Epilogue body: per column, Σ over the rows (`stride` apart) of
/// weight_i · max(e, floor_i) as [`add_weighted_exps_body`] adds them, recomputing the exps
/// exp((s − col_shift_j)·inv_tau − shift_i) from the similarities, with the
/// arithmetic of the row update (so the same bits).
#[inline(always)]
pub(super) fn weighted_exp_sum_columns_body(
    cells: &[f32],
    stride: usize,
    width: usize,
    weights: &[RowWeight],
    col_shift: &[f32],
    inv_tau: f32,
    sum: &mut [f32],
) {
    let (sum, col_shift) = (&mut sum[..width], &col_shift[..width]);
    sum.fill(0.0);
    for (i, w) in weights.iter().enumerate() {
        let row = &cells[i * stride..i * stride + width];
        let (m, w) = (w.shift, *w);
        add_mapped_exps(
            sum,
            row,
            col_shift,
            |s, c| (s - c) * inv_tau - m,
            |e| w.apply(e),
        );
    }
}

/// Folds `weights.len()` rows of `width` similarities, `stride` floats
/// apart, into per-column mass sums (the reused-exp column update; see
/// [`RowWeight`]). The rows must start at a multiple of [`GROUP_ROWS`] of
/// the whole matrix: per unit of [`MASS_ROWS`] rows, the products are summed
/// in f32 in row order and added to the f64 sums, as [`fused_group`] does
/// from its rows' exps.
pub(crate) fn fold_weighted_columns(
    cells: &[f32],
    stride: usize,
    width: usize,
    weights: &[RowWeight],
    col_shift: &[f32],
    inv_tau: f32,
    sum: &mut [f64],
) {
    let mut group_sum = [0f32; COLUMN_BLOCK];
    for (u, unit_weights) in weights.chunks(MASS_ROWS).enumerate() {
        let group = &cells[u * MASS_ROWS * stride..];
        for c0 in (0..width).step_by(COLUMN_BLOCK) {
            let w = COLUMN_BLOCK.min(width - c0);
            super::dispatch::weighted_exp_sum_columns(
                &group[c0..],
                stride,
                w,
                unit_weights,
                &col_shift[c0..c0 + w],
                inv_tau,
                &mut group_sum[..w],
            );
            for (acc, &part) in sum[c0..c0 + w].iter_mut().zip(&group_sum[..w]) {
                *acc += part as f64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    /// Both sweeps against direct f64 sums, with a cache filled and reused,
    /// across tile edges in both directions.
    #[test]
    fn sweeps_match_direct_sums_and_the_cache_changes_nothing() {
        let dim = 6;
        let (nr, nc) = (TILE_ROWS + 5, TILE_COLS + 9);
        let a = pseudo_random(nr * dim, 3);
        let b = pseudo_random(nc * dim, 4);
        let row_shift = pseudo_random(nr, 5);
        let col_shift = pseudo_random(nc, 6);
        let inv_tau = 10.0f32;
        let s = |i: usize, j: usize| -> f64 {
            (0..dim)
                .map(|d| a[i * dim + d] as f64 * b[j * dim + d] as f64)
                .sum()
        };
        let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));
        let mut cache = vec![0f32; nr * nc];
        let mut by_row = vec![LogSumExp::default(); nr];
        lse_sweep(
            rows,
            cols,
            TileSource::Fill(&mut cache),
            Sweep::Rows {
                col_shift: &col_shift,
                row_bound: None,
            },
            inv_tau,
            &mut by_row,
            &mut [],
        );
        let mut by_col = vec![LogSumExp::default(); nc];
        lse_sweep(
            rows,
            cols,
            TileSource::Cached(&cache),
            Sweep::Columns {
                row_shift: &row_shift,
            },
            inv_tau,
            &mut [],
            &mut by_col,
        );
        let mut by_col_computed = vec![LogSumExp::default(); nc];
        lse_sweep(
            rows,
            cols,
            TileSource::Compute,
            Sweep::Columns {
                row_shift: &row_shift,
            },
            inv_tau,
            &mut [],
            &mut by_col_computed,
        );
        assert_eq!(by_col, by_col_computed);
        for i in [0, 1, TILE_ROWS - 1, TILE_ROWS, nr - 1] {
            let mut direct = LogSumExp::default();
            (0..nc).for_each(|j| direct.push((s(i, j) - col_shift[j] as f64) * inv_tau as f64));
            assert!((by_row[i].value() - direct.value()).abs() < 1e-4, "row {i}");
        }
        for j in [0, 1, TILE_COLS - 1, TILE_COLS, nc - 1] {
            let mut direct = LogSumExp::default();
            (0..nr).for_each(|i| direct.push((s(i, j) - row_shift[i] as f64) * inv_tau as f64));
            assert!(
                (by_col[j].value() - direct.value()).abs() < 1e-4,
                "column {j}"
            );
        }
    }

    /// One iteration's source update and weighted target update, computed
    /// four ways (row sweep filling the cache or reading it, then a weighted
    /// column sweep recomputed or cached, and the fused pass over cached
    /// groups), asserted bit-identical. Returns the row states, their strip
    /// states `[strip][row]` and the column states.
    struct Iteration {
        rows: Vec<LogSumExp>,
        strips: Vec<Vec<LogSumExp>>,
        cols: Vec<LogSumExp>,
    }

    fn iterate_four_ways(
        (a, b, dim): (&[f32], &[f32], usize),
        cache: &mut [f32],
        f: &[f32],
        bounds: Option<&[Vec<f32>]>,
        inv_tau: f32,
        log_mass: &(dyn Fn(&LogSumExp) -> f64 + Sync),
    ) -> Iteration {
        let (rows, cols) = (Rows::new(a, dim), Rows::new(b, dim));
        let (nr, nc) = (rows.rows, cols.rows);
        let bound_slices: Option<Vec<&[f32]>> =
            bounds.map(|b| b.iter().map(Vec::as_slice).collect());
        let row_sweep = Sweep::Rows {
            col_shift: f,
            row_bound: bound_slices.as_deref(),
        };
        let mut by_row = vec![LogSumExp::default(); nr];
        let strip_states = lse_sweep(
            rows,
            cols,
            TileSource::Fill(cache),
            row_sweep,
            inv_tau,
            &mut by_row,
            &mut [],
        );
        let mut by_row_cached = vec![LogSumExp::default(); nr];
        let cached_states = lse_sweep(
            rows,
            cols,
            TileSource::Cached(cache),
            row_sweep,
            inv_tau,
            &mut by_row_cached,
            &mut [],
        );
        assert_eq!(by_row, by_row_cached);
        assert_eq!(strip_states, cached_states);

        let masses: Vec<f64> = by_row.iter().map(log_mass).collect();
        let shifts: Vec<Vec<f32>> = strip_states
            .iter()
            .map(|strip| strip.iter().map(|s| s.max as f32).collect())
            .collect();
        let weights = RowWeight::per_strip(shifts.iter().map(Vec::as_slice), &masses);
        let weight_slices: Vec<&[RowWeight]> = weights.iter().map(|w| w.as_slice()).collect();
        let weighted = Sweep::WeightedColumns {
            col_shift: f,
            weights: &weight_slices,
        };
        let mut by_col = vec![LogSumExp::default(); nc];
        let computed = TileSource::Compute;
        lse_sweep(
            rows,
            cols,
            computed,
            weighted,
            inv_tau,
            &mut [],
            &mut by_col,
        );
        let mut by_col_cached = vec![LogSumExp::default(); nc];
        let cached = TileSource::Cached(cache);
        lse_sweep(
            rows,
            cols,
            cached,
            weighted,
            inv_tau,
            &mut [],
            &mut by_col_cached,
        );
        assert_eq!(by_col, by_col_cached);

        let mut sum = vec![0f64; nc];
        let mut fused_rows = Vec::new();
        let mut fused_strips = vec![Vec::new(); nc.div_ceil(TILE_COLS)];
        let mut partials = vec![0f32; fused_group_scratch(GROUP_ROWS, nc)];
        for g0 in (0..nr).step_by(GROUP_ROWS) {
            let g1 = (g0 + GROUP_ROWS).min(nr);
            let strips: Vec<StripRows<'_>> = (0..nc)
                .step_by(TILE_COLS)
                .enumerate()
                .map(|(strip, c0)| {
                    let width = TILE_COLS.min(nc - c0);
                    let base = c0 * nr;
                    StripRows {
                        cells: &cache[base + g0 * width..base + g1 * width],
                        width,
                        first_col: c0,
                        bound: bounds.map(|b| &b[strip][g0..g1]),
                    }
                })
                .collect();
            let group = fused_group(
                &strips,
                g1 - g0,
                f,
                inv_tau,
                log_mass,
                &mut partials,
                &mut sum,
            );
            fused_rows.extend(group.states);
            for (all, part) in fused_strips.iter_mut().zip(group.strips) {
                all.extend(part);
            }
        }
        assert_eq!(fused_rows, by_row);
        assert_eq!(fused_strips, strip_states);
        let swept_sums: Vec<f64> = by_col.iter().map(|c| c.sum).collect();
        assert_eq!(sum, swept_sums);
        Iteration {
            rows: by_row,
            strips: strip_states,
            cols: by_col,
        }
    }

    /// The fused iteration over cached strips gives the same bits as a row
    /// sweep followed by a weighted column sweep with the new potentials
    /// (cached and recomputed), for groups that end mid-tile and strips of
    /// uneven width, with and without bounds on the rows' maxima; the
    /// weighted column update equals the exact one, and bounded row updates
    /// equal exact ones.
    #[test]
    fn fused_group_equals_a_row_sweep_then_a_column_sweep() {
        let dim = 5;
        let (nr, nc) = (2 * GROUP_ROWS + 37, 2 * TILE_COLS + 300);
        let a = pseudo_random(nr * dim, 13);
        let b = pseudo_random(nc * dim, 14);
        let f: Vec<f32> = pseudo_random(nc, 15).iter().map(|v| v * 0.1).collect();
        let inv_tau = 40.0f32;
        let log_m = (nr as f64).ln();
        let log_mass = |s: &LogSumExp| s.value() + log_m;
        let mut cache = vec![0f32; nr * nc];
        let tables = (a.as_slice(), b.as_slice(), dim);
        let first = iterate_four_ways(tables, &mut cache, &f, None, inv_tau, &log_mass);

        // The exact column update with g as f32 shifts, as the fallback runs it.
        let g: Vec<f32> = first
            .rows
            .iter()
            .map(|s| (log_mass(s) / inv_tau as f64) as f32)
            .collect();
        let mut exact = vec![LogSumExp::default(); nc];
        let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));
        let columns = Sweep::Columns { row_shift: &g };
        let computed = TileSource::Compute;
        lse_sweep(rows, cols, computed, columns, inv_tau, &mut [], &mut exact);
        for (j, (w, e)) in first.cols.iter().zip(&exact).enumerate() {
            assert!(w.sum >= MIN_COLUMN_MASS, "column {j} mass {}", w.sum);
            assert!(
                (w.value() - e.value()).abs() < 1e-4,
                "column {j}: {} vs {}",
                w.value(),
                e.value()
            );
        }

        // A second iteration with new target shifts, bounded as
        // `bank::sinkhorn` bounds it: last LSE plus the largest fall of f.
        let f2: Vec<f32> = f
            .iter()
            .zip(pseudo_random(nc, 16))
            .map(|(&v, d)| v + 0.05 * d)
            .collect();
        let bounds: Vec<Vec<f32>> = first
            .strips
            .iter()
            .enumerate()
            .map(|(strip, states)| {
                let columns = strip * TILE_COLS..((strip + 1) * TILE_COLS).min(nc);
                let fall = columns
                    .map(|j| (f[j] - f2[j]) * inv_tau)
                    .fold(f32::NEG_INFINITY, f32::max);
                states.iter().map(|s| s.value() as f32 + fall).collect()
            })
            .collect();
        let bounded = iterate_four_ways(tables, &mut cache, &f2, Some(&bounds), inv_tau, &log_mass);
        let unbounded = iterate_four_ways(tables, &mut cache, &f2, None, inv_tau, &log_mass);
        let mut shifted_above_max = 0;
        for (strip, (b, u)) in bounded.strips.iter().zip(&unbounded.strips).enumerate() {
            for (row, (b, u)) in b.iter().zip(u).enumerate() {
                assert!(
                    b.max >= u.max - 1e-4,
                    "strip {strip} row {row}: bound below max"
                );
                shifted_above_max += usize::from(b.max > u.max);
            }
        }
        assert!(shifted_above_max > 0, "the bounds were used");
        for (r, (b, u)) in bounded.rows.iter().zip(&unbounded.rows).enumerate() {
            let (b, u) = (b.value(), u.value());
            assert!(
                (b - u).abs() < 1e-5 * u.abs().max(1.0),
                "row {r}: {b} vs {u}"
            );
        }
        for (j, (b, u)) in bounded.cols.iter().zip(&unbounded.cols).enumerate() {
            let (b, u) = (b.value(), u.value());
            assert!(
                (b - u).abs() < 1e-5 * u.abs().max(1.0),
                "column {j}: {b} vs {u}"
            );
        }

        // A bound far above the max (its exps would sum below
        // MIN_BOUNDED_SUM) is dropped for the exact max: the same bits.
        let loose: Vec<Vec<f32>> = bounds
            .iter()
            .map(|b| b.iter().map(|v| v + 60.0).collect())
            .collect();
        let redone = iterate_four_ways(tables, &mut cache, &f2, Some(&loose), inv_tau, &log_mass);
        assert_eq!(redone.rows, unbounded.rows);
        assert_eq!(redone.strips, unbounded.strips);
    }
}
