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

use super::gemm::{similarity_tile, slab_depth, SlabTiles};
use super::lse::LogSumExp;
use super::tile::{Rows, GROUP_ROWS, SLAB_ROWS, TILE_COLS, TILE_ROWS};

mod columns;
mod rows;
#[cfg(test)]
mod tests;

use columns::{add_weighted_exps, fold_columns, fold_weighted_columns};
use columns::{stack_column_exp_add, stack_column_max};
pub use columns::{RowWeight, MIN_COLUMN_MASS};
pub use rows::MIN_BOUNDED_SUM;
use rows::{shifted_row_lse, shifted_row_lse_store};

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
/// `Sweep::Rows`. Tiles of [`TILE_ROWS`] rows come from the cache, or from
/// the AVX-512 slab kernel ([`SlabTiles`], the strip's columns packed once
/// for all the rows), which computes and folds them [`SLAB_ROWS`] rows at a
/// time with the `gemm` crate's bits for the whole tile, or else from the
/// crate, whole. The folds take rows in groups of [`GROUP_ROWS`] (a slab is
/// one), so the results are the same either way.
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
    let mut slabs = match cache {
        TileSource::Cached(_) => None,
        // As in the other passes: packing pays off over many rows.
        TileSource::Compute | TileSource::Fill(_) if rows.rows < SLAB_ROWS => None,
        TileSource::Compute | TileSource::Fill(_) => SlabTiles::new().map(|mut slabs| {
            slabs.pack_columns(cols.data, nc, cols.dim);
            slabs
        }),
    };
    // Recomputed tiles: grown to the rows of the largest piece (a slab,
    // or a whole tile for the crate).
    let mut tile = Vec::new();
    let mut row_out = match sweep {
        Sweep::Rows { .. } => Some(vec![LogSumExp::default(); rows.rows]),
        Sweep::Columns { .. } | Sweep::WeightedColumns { .. } => None,
    };
    let mut max: Vec<f64> = col_states.iter().map(|s| s.max).collect();
    let mut sum: Vec<f64> = col_states.iter().map(|s| s.sum).collect();
    for r0 in (0..rows.rows).step_by(TILE_ROWS) {
        let r1 = (r0 + TILE_ROWS).min(rows.rows);
        let mut slab_kernel = slabs.as_mut().zip(slab_depth(cols.dim));
        let piece_rows = if slab_kernel.is_some() {
            SLAB_ROWS
        } else {
            TILE_ROWS
        };
        for g0 in (r0..r1).step_by(piece_rows) {
            let g1 = (g0 + piece_rows).min(r1);
            let a = &rows.data[g0 * rows.dim..g1 * rows.dim];
            let mut compute = |cells: &mut [f32]| match slab_kernel.as_mut() {
                Some((slabs, kc)) => slabs.slab(cells, nc, a, g1 - g0, *kc),
                None => similarity_tile(cells, nc, a, g1 - g0, cols.data, nc, cols.dim),
            };
            let similarities: &[f32] = match &mut cache {
                TileSource::Cached(buffer) => &buffer[g0 * nc..g1 * nc],
                // The GEMM writes straight into the cache (no copy of the tile).
                TileSource::Fill(buffer) => {
                    let cells = &mut buffer[g0 * nc..g1 * nc];
                    compute(cells);
                    cells
                }
                TileSource::Compute => {
                    if tile.len() < (g1 - g0) * nc {
                        tile.resize((g1 - g0) * nc, 0f32);
                    }
                    let cells = &mut tile[..(g1 - g0) * nc];
                    compute(cells);
                    cells
                }
            };
            match sweep {
                Sweep::Rows {
                    col_shift,
                    row_bound,
                } => {
                    let shifts = &col_shift[c0..c0 + nc];
                    let out = row_out.as_mut().expect("row sweep");
                    for (i, state) in out[g0..g1].iter_mut().enumerate() {
                        *state = shifted_row_lse(
                            &similarities[i * nc..(i + 1) * nc],
                            shifts,
                            inv_tau,
                            row_bound.map(|b| b[strip][g0 + i]),
                        );
                    }
                }
                Sweep::Columns { row_shift } => fold_columns(
                    similarities,
                    nc,
                    nc,
                    &row_shift[g0..g1],
                    inv_tau,
                    &mut max,
                    &mut sum,
                ),
                Sweep::WeightedColumns { col_shift, weights } => fold_weighted_columns(
                    similarities,
                    nc,
                    nc,
                    &weights[strip][g0..g1],
                    &col_shift[c0..c0 + nc],
                    inv_tau,
                    &mut sum,
                ),
            }
        }
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
                        let part = shifted_row_lse_store(
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
                        add_weighted_exps(
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
            let lse = shifted_row_lse(row(r), &f, inv_tau, None);
            *g_r = tau * lse.value() as f32 + tau * log_m;
        }
        // Columns: f_t = τ·LSE_r (s − g_r)/τ + τ·log n.
        column_max.fill(f32::NEG_INFINITY);
        for (r, &g_r) in g.iter().enumerate() {
            stack_column_max(row(r), g_r, inv_tau, &mut column_max);
        }
        column_sum.fill(0.0);
        for (r, &g_r) in g.iter().enumerate() {
            stack_column_exp_add(row(r), g_r, inv_tau, &column_max, &mut column_sum);
        }
        for ((fv, &c), &sum) in f.iter_mut().zip(&column_max).zip(&column_sum) {
            *fv = tau * (c + sum.ln()) + tau * log_n;
        }
    }
    f
}
