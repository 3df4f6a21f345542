//! Log-domain Sinkhorn sweeps over similarity tiles (METHODS.md, `sn` and
//! `dbsn`).
//!
//! A sweep streams the tiles of source rows (bank) × target columns
//! (gallery, and the gallery bank for `dbsn`) and folds (s − shift)/τ into a
//! log-sum-exp per row (the source update, shifted by the target potentials)
//! or per column (the target update, shifted by the source potentials).
//! The column update has two forms: exact, with per-column shifts, and the
//! exp-reuse form ([`RowWeight`]) that rebuilds the row update's exps and
//! weights them, which the fused iteration computes from stored exps.
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
    /// For every row: LSE over the columns of (s − col_shift[j]) / τ.
    Rows { col_shift: &'a [f32] },
    /// For every column: LSE over the rows of (s − row_shift[i]) / τ.
    Columns { row_shift: &'a [f32] },
    /// For every column: the same LSE in the exp-reuse form (see
    /// [`RowWeight`]): the max is col_shift[j]·inv_tau and the sum
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
/// [`TILE_COLS`] columns, each row's max over the strip (the shift of its
/// exps, which [`RowWeight`] needs); other sweeps return nothing.
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
) -> Vec<Vec<f32>> {
    let (nr, nc) = (rows.rows, cols.rows);
    let strips = nc.div_ceil(TILE_COLS);
    match sweep {
        Sweep::Rows { col_shift } => {
            assert_eq!(col_shift.len(), nc, "one shift per column");
            assert_eq!(row_states.len(), nr, "one state per row");
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
    let mut strip_max = Vec::new();
    for part in row_partials.into_iter().flatten() {
        for (state, p) in row_states.iter_mut().zip(&part) {
            state.merge(p);
        }
        strip_max.push(part.iter().map(|p| p.max as f32).collect());
    }
    strip_max
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
            Sweep::Rows { col_shift } => {
                let shifts = &col_shift[c0..c0 + nc];
                let out = row_out.as_mut().expect("row sweep");
                for (i, state) in out[r0..r1].iter_mut().enumerate() {
                    *state = super::dispatch::shifted_row_lse(
                        &similarities[i * nc..(i + 1) * nc],
                        shifts,
                        inv_tau,
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
/// row-major, for the targets `first_col..first_col + width`.
#[derive(Debug, Clone, Copy)]
pub struct StripRows<'a> {
    pub cells: &'a [f32],
    pub width: usize,
    pub first_col: usize,
}

/// Rows of a group handled by one task of the fused row update.
const FUSED_ROW_TASK: usize = 16;
/// Columns of a strip handled by one task of the fused column update.
const FUSED_COLUMN_TASK: usize = 512;

/// One Sinkhorn iteration over one group of cached rows (at most
/// [`GROUP_ROWS`], starting at a multiple of it), while the group is in
/// cache: the rows' log-sum-exp over every target of (s − f)·inv_tau, with
/// the exps kept in `exps` (`rows × Σ strip widths`, scratch), then the
/// group's share of the column update from those exps, weighted by the new
/// source potentials (`log_mass(row state)` = g/τ; see [`RowWeight`]),
/// added to `col_sum` (one per target). One exp per cell per iteration.
///
/// `strips` covers the targets in order. Row states are merged strip after
/// strip and the columns summed as [`fold_weighted_columns`] sums them, so
/// the result is bit-identical to a row sweep followed by a
/// [`Sweep::WeightedColumns`] sweep (cached or recomputed).
#[allow(clippy::too_many_arguments)]
pub fn fused_group(
    strips: &[StripRows<'_>],
    rows: usize,
    col_shift: &[f32],
    inv_tau: f32,
    log_mass: &(dyn Fn(&LogSumExp) -> f64 + Sync),
    exps: &mut [f32],
    col_sum: &mut [f64],
) -> Vec<LogSumExp> {
    let total: usize = strips.iter().map(|s| s.width).sum();
    let exps = &mut exps[..rows * total];
    // Row update: each task takes a few rows across every strip.
    let row_results: Vec<(LogSumExp, Vec<f32>)> = exps
        .par_chunks_mut(FUSED_ROW_TASK * total.max(1))
        .enumerate()
        .flat_map_iter(|(task, task_exps)| {
            let r0 = task * FUSED_ROW_TASK;
            task_exps
                .chunks_mut(total.max(1))
                .enumerate()
                .map(move |(k, row_exps)| {
                    let r = r0 + k;
                    let mut state = LogSumExp::default();
                    let mut strip_max = Vec::with_capacity(strips.len());
                    let mut offset = 0;
                    for strip in strips {
                        let row = &strip.cells[r * strip.width..(r + 1) * strip.width];
                        let shifts = &col_shift[strip.first_col..strip.first_col + strip.width];
                        let part = super::dispatch::shifted_row_lse_store(
                            row,
                            shifts,
                            inv_tau,
                            &mut row_exps[offset..offset + strip.width],
                        );
                        state.merge(&part);
                        strip_max.push(part.max as f32);
                        offset += strip.width;
                    }
                    (state, strip_max)
                })
        })
        .collect();
    let exps: &[f32] = exps;
    let weights: Vec<Vec<RowWeight>> = (0..strips.len())
        .map(|s| {
            row_results
                .iter()
                .map(|(state, maxima)| RowWeight::new(maxima[s], log_mass(state)))
                .collect()
        })
        .collect();
    // Column update: tasks over column blocks of every strip.
    let mut tasks = Vec::new();
    let mut sum_rest = col_sum;
    let mut offset = 0;
    for (s, strip) in strips.iter().enumerate() {
        for c0 in (0..strip.width).step_by(FUSED_COLUMN_TASK) {
            let w = FUSED_COLUMN_TASK.min(strip.width - c0);
            let (sum_part, rest) = std::mem::take(&mut sum_rest).split_at_mut(w);
            sum_rest = rest;
            tasks.push((offset + c0, w, &weights[s], sum_part));
        }
        offset += strip.width;
    }
    tasks
        .into_par_iter()
        .for_each(|(first, width, weights, sum)| {
            let mut group_sum = vec![0f32; width];
            super::dispatch::weighted_sum_columns(
                &exps[first..],
                total,
                width,
                weights,
                &mut group_sum,
            );
            for (acc, &part) in sum.iter_mut().zip(&group_sum) {
                *acc += part as f64;
            }
        });
    row_results.into_iter().map(|(state, _)| state).collect()
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
            let lse = super::dispatch::shifted_row_lse(row(r), &f, inv_tau);
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
/// summed into f64 at the end.
#[inline(always)]
pub(super) fn shifted_row_lse_body(scores: &[f32], shifts: &[f32], inv_tau: f32) -> LogSumExp {
    row_lse::<false>(scores, shifts, inv_tau, &mut [])
}

/// Epilogue body: [`shifted_row_lse_body`], also writing each exp
/// exp((s − shift)·inv_tau − max) to `exps` (same bits as the sum used).
#[inline(always)]
pub(super) fn shifted_row_lse_store_body(
    scores: &[f32],
    shifts: &[f32],
    inv_tau: f32,
    exps: &mut [f32],
) -> LogSumExp {
    row_lse::<true>(scores, shifts, inv_tau, exps)
}

/// The row LSE, storing the exps when `STORE`. Fixed-size lane arrays (no
/// indexing) so the compiler keeps both passes in 16-lane registers.
#[inline(always)]
fn row_lse<const STORE: bool>(
    scores: &[f32],
    shifts: &[f32],
    inv_tau: f32,
    exps_out: &mut [f32],
) -> LogSumExp {
    const LANES: usize = 16;
    let n = scores.len().min(shifts.len());
    let (scores, shifts) = (&scores[..n], &shifts[..n]);
    let exps_out = if STORE {
        &mut exps_out[..n]
    } else {
        &mut exps_out[..0]
    };
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
    LogSumExp {
        max: m as f64,
        sum: total,
    }
}

/// How one source row's exps over one strip of targets enter the target
/// update without a second exp (the exp-reuse form of the column update).
///
/// The row update computed e = exp((s − f_t)·inv_tau − shift) with the
/// strip's max as `shift`, and the row's log mass g/τ = LSE + log |B|. The
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

    /// From the row's max over the strip of (s − f)·inv_tau (its exps'
    /// shift) and the row's log mass g/τ.
    pub fn new(strip_max: f32, log_mass: f64) -> Self {
        let weight = (strip_max as f64 - log_mass).exp();
        if weight >= Self::MIN_WEIGHT {
            RowWeight {
                shift: strip_max,
                weight: weight as f32,
                floor: (2e-38 / weight) as f32,
            }
        } else {
            RowWeight {
                shift: strip_max,
                weight: 0.0,
                floor: 0.0,
            }
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

/// Epilogue body: per column, Σ over the rows (`stride` apart) of
/// weight_i · max(e, floor_i), where e are the rows' stored exps.
#[inline(always)]
pub(super) fn weighted_sum_columns_body(
    exps: &[f32],
    stride: usize,
    width: usize,
    weights: &[RowWeight],
    sum: &mut [f32],
) {
    let sum = &mut sum[..width];
    sum.fill(0.0);
    for (i, w) in weights.iter().enumerate() {
        let row = &exps[i * stride..i * stride + width];
        for (acc, &e) in sum.iter_mut().zip(row) {
            *acc += w.apply(e);
        }
    }
}

/// Epilogue body: as [`weighted_sum_columns_body`], recomputing the exps
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
/// the whole matrix: per group, the products are summed in f32 in row order
/// and added to the f64 sums, as [`fused_group`] does from stored exps.
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
    for (g, group_weights) in weights.chunks(GROUP_ROWS).enumerate() {
        let group = &cells[g * GROUP_ROWS * stride..];
        for c0 in (0..width).step_by(COLUMN_BLOCK) {
            let w = COLUMN_BLOCK.min(width - c0);
            super::dispatch::weighted_exp_sum_columns(
                &group[c0..],
                stride,
                w,
                group_weights,
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

    /// The fused iteration over cached strips gives the same bits as a row
    /// sweep followed by a weighted column sweep with the new potentials
    /// (cached and recomputed), for groups that end mid-tile and strips of
    /// uneven width; and the weighted column update equals the exact one.
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
        let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));
        let mut cache = vec![0f32; nr * nc];
        let mut by_row = vec![LogSumExp::default(); nr];
        let strip_max = lse_sweep(
            rows,
            cols,
            TileSource::Fill(&mut cache),
            Sweep::Rows { col_shift: &f },
            inv_tau,
            &mut by_row,
            &mut [],
        );
        let masses: Vec<f64> = by_row.iter().map(log_mass).collect();
        let weights = RowWeight::per_strip(strip_max.iter().map(Vec::as_slice), &masses);
        let weight_slices: Vec<&[RowWeight]> = weights.iter().map(|w| w.as_slice()).collect();
        let weighted = Sweep::WeightedColumns {
            col_shift: &f,
            weights: &weight_slices,
        };
        let mut by_col = vec![LogSumExp::default(); nc];
        lse_sweep(
            rows,
            cols,
            TileSource::Compute,
            weighted,
            inv_tau,
            &mut [],
            &mut by_col,
        );
        let mut by_col_cached = vec![LogSumExp::default(); nc];
        let cached = TileSource::Cached(&cache);
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

        // The exact column update with g as f32 shifts, as the fallback runs it.
        let g: Vec<f32> = by_row
            .iter()
            .map(|s| (log_mass(s) / inv_tau as f64) as f32)
            .collect();
        let mut exact = vec![LogSumExp::default(); nc];
        lse_sweep(
            rows,
            cols,
            TileSource::Compute,
            Sweep::Columns { row_shift: &g },
            inv_tau,
            &mut [],
            &mut exact,
        );
        for (j, (w, e)) in by_col.iter().zip(&exact).enumerate() {
            assert!(w.sum >= MIN_COLUMN_MASS, "column {j} mass {}", w.sum);
            assert!(
                (w.value() - e.value()).abs() < 1e-4,
                "column {j}: {} vs {}",
                w.value(),
                e.value()
            );
        }

        let mut sum = vec![0f64; nc];
        let mut fused_rows = Vec::new();
        let mut exps = vec![0f32; GROUP_ROWS * nc];
        for g0 in (0..nr).step_by(GROUP_ROWS) {
            let g1 = (g0 + GROUP_ROWS).min(nr);
            let strips: Vec<StripRows<'_>> = (0..nc)
                .step_by(TILE_COLS)
                .map(|c0| {
                    let width = TILE_COLS.min(nc - c0);
                    let base = c0 * nr;
                    StripRows {
                        cells: &cache[base + g0 * width..base + g1 * width],
                        width,
                        first_col: c0,
                    }
                })
                .collect();
            fused_rows.extend(fused_group(
                &strips,
                g1 - g0,
                &f,
                inv_tau,
                &log_mass,
                &mut exps,
                &mut sum,
            ));
        }
        assert_eq!(fused_rows, by_row);
        let fused_sums: Vec<f64> = by_col.iter().map(|c| c.sum).collect();
        assert_eq!(sum, fused_sums);
    }
}
