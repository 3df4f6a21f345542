//! Log-domain Sinkhorn sweeps over similarity tiles (METHODS.md, `sn` and
//! `dbsn`).
//!
//! A sweep streams the tiles of source rows (bank) × target columns
//! (gallery, and the gallery bank for `dbsn`) and folds (s − shift)/τ into a
//! log-sum-exp per row (the source update, shifted by the target potentials)
//! or per column (the target update, shifted by the source potentials).
//! Tiles come from the GEMM, or from a cache filled on the first sweep when
//! the whole bank × targets matrix fits the memory limit, so later sweeps
//! cost a memory pass instead of a GEMM.
//!
//! Strips of [`TILE_COLS`] columns run in parallel; row states are merged
//! from per-strip partials in strip order, so results do not depend on the
//! thread count.

use rayon::prelude::*;

use super::exp::{add_exps, fast_exp, EXP_CHUNK};
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

/// Runs one sweep over the block `rows × cols` (the rows' first global row
/// is `row_offset` within `row_states`, used only for `Sweep::Rows`).
/// `row_states` has one entry per row of the block, `col_states` one per
/// column; the sweep folds into them (so blocks accumulate).
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
) {
    let (nr, nc) = (rows.rows, cols.rows);
    match sweep {
        Sweep::Rows { col_shift } => {
            assert_eq!(col_shift.len(), nc, "one shift per column");
            assert_eq!(row_states.len(), nr, "one state per row");
        }
        Sweep::Columns { row_shift } => {
            assert_eq!(row_shift.len(), nr, "one shift per row");
            assert_eq!(col_states.len(), nc, "one state per column");
        }
    }
    if nr == 0 || nc == 0 {
        return;
    }
    let strips = nc.div_ceil(TILE_COLS);
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
            sweep_strip(rows, strip_cols, c0, cache, sweep, inv_tau, col_part)
        })
        .collect();
    for part in row_partials.into_iter().flatten() {
        for (state, p) in row_states.iter_mut().zip(&part) {
            state.merge(p);
        }
    }
}

/// One column strip of a sweep; returns the strip's row states for
/// `Sweep::Rows`.
fn sweep_strip(
    rows: Rows<'_>,
    cols: Rows<'_>,
    c0: usize,
    mut cache: TileSource<'_>,
    sweep: Sweep<'_>,
    inv_tau: f32,
    col_states: &mut [LogSumExp],
) -> Option<Vec<LogSumExp>> {
    let nc = cols.rows;
    let mut tile = vec![0f32; TILE_ROWS * nc];
    let mut row_out = match sweep {
        Sweep::Rows { .. } => Some(vec![LogSumExp::default(); rows.rows]),
        Sweep::Columns { .. } => None,
    };
    let mut max: Vec<f64> = col_states.iter().map(|s| s.max).collect();
    let mut sum: Vec<f64> = col_states.iter().map(|s| s.sum).collect();
    let mut r0 = 0;
    while r0 < rows.rows {
        let r1 = (r0 + TILE_ROWS).min(rows.rows);
        let nr = r1 - r0;
        let similarities: &[f32] = match &mut cache {
            TileSource::Cached(buffer) => &buffer[r0 * nc..r1 * nc],
            TileSource::Compute | TileSource::Fill(_) => {
                similarity_tile(
                    &mut tile,
                    nc,
                    &rows.data[r0 * rows.dim..r1 * rows.dim],
                    nr,
                    cols.data,
                    nc,
                    cols.dim,
                );
                if let TileSource::Fill(buffer) = &mut cache {
                    buffer[r0 * nc..r1 * nc].copy_from_slice(&tile[..nr * nc]);
                }
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
        }
        r0 = r1;
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
/// the recomputed sweep, the cached sweep and the fused iteration give the
/// same bits, whatever the block sizes and column splits.
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
/// cache: the rows' log-sum-exp over every target of (s − f)·inv_tau, then,
/// with the new source potentials `potential(row state)`, the group folded
/// into the column states (`col_max`, `col_sum`, one per target).
///
/// `strips` covers the targets in order. Row states are merged strip after
/// strip and columns folded by [`fold_columns`], exactly as a row sweep
/// followed by a column sweep would, so the result is bit-identical to the
/// two sweeps (and to their recomputed form) at half the memory traffic.
pub fn fused_group(
    strips: &[StripRows<'_>],
    rows: usize,
    col_shift: &[f32],
    inv_tau: f32,
    potential: &(dyn Fn(&LogSumExp) -> f32 + Sync),
    col_max: &mut [f64],
    col_sum: &mut [f64],
) -> Vec<LogSumExp> {
    // Row update: each task takes a few rows across every strip.
    let row_states: Vec<LogSumExp> = (0..rows.div_ceil(FUSED_ROW_TASK))
        .into_par_iter()
        .flat_map_iter(|task| {
            let r0 = task * FUSED_ROW_TASK;
            let r1 = (r0 + FUSED_ROW_TASK).min(rows);
            (r0..r1).map(|r| {
                let mut state = LogSumExp::default();
                for strip in strips {
                    let row = &strip.cells[r * strip.width..(r + 1) * strip.width];
                    let shifts = &col_shift[strip.first_col..strip.first_col + strip.width];
                    state.merge(&super::dispatch::shifted_row_lse(row, shifts, inv_tau));
                }
                state
            })
        })
        .collect();
    let row_shift: Vec<f32> = row_states.iter().map(potential).collect();
    // Column update: tasks over column blocks of every strip.
    let mut tasks = Vec::new();
    let (mut max_rest, mut sum_rest) = (col_max, col_sum);
    for strip in strips {
        for c0 in (0..strip.width).step_by(FUSED_COLUMN_TASK) {
            let w = FUSED_COLUMN_TASK.min(strip.width - c0);
            let (max_part, m) = std::mem::take(&mut max_rest).split_at_mut(w);
            let (sum_part, s) = std::mem::take(&mut sum_rest).split_at_mut(w);
            (max_rest, sum_rest) = (m, s);
            tasks.push((&strip.cells[c0..], strip.width, w, max_part, sum_part));
        }
    }
    tasks
        .into_par_iter()
        .for_each(|(cells, stride, width, max, sum)| {
            fold_columns(cells, stride, width, &row_shift, inv_tau, max, sum)
        });
    row_states
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
/// summed into f64 at the end. Fixed-size lane arrays (no indexing) so the
/// compiler keeps both passes in 16-lane registers.
#[inline(always)]
pub(super) fn shifted_row_lse_body(scores: &[f32], shifts: &[f32], inv_tau: f32) -> LogSumExp {
    const LANES: usize = 16;
    let n = scores.len().min(shifts.len());
    let (scores, shifts) = (&scores[..n], &shifts[..n]);
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
    for (s, c) in scores[..wide]
        .chunks_exact(EXP_CHUNK)
        .zip(shifts[..wide].chunks_exact(EXP_CHUNK))
    {
        let s: &[f32; EXP_CHUNK] = s.try_into().expect("exp chunk");
        let c: &[f32; EXP_CHUNK] = c.try_into().expect("exp chunk");
        for l in 0..EXP_CHUNK {
            exps[l] = fast_exp((s[l] - c[l]) * inv_tau - m);
        }
        for part in exps.chunks_exact(LANES) {
            for l in 0..LANES {
                lane_sum[l] += part[l];
            }
        }
    }
    for (s, c) in scores[wide..full]
        .chunks_exact(LANES)
        .zip(shifts[wide..full].chunks_exact(LANES))
    {
        let s: &[f32; LANES] = s.try_into().expect("lane chunk");
        let c: &[f32; LANES] = c.try_into().expect("lane chunk");
        for l in 0..LANES {
            lane_sum[l] += fast_exp((s[l] - c[l]) * inv_tau - m);
        }
    }
    let mut total: f64 = lane_sum.iter().map(|&v| v as f64).sum();
    for (&s, &c) in scores[full..].iter().zip(&shifts[full..]) {
        total += fast_exp((s - c) * inv_tau - m) as f64;
    }
    LogSumExp {
        max: m as f64,
        sum: total,
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
    /// sweep followed by a column sweep with the new potentials, for groups
    /// that end mid-tile and strips of uneven width.
    #[test]
    fn fused_group_equals_a_row_sweep_then_a_column_sweep() {
        let dim = 5;
        let (nr, nc) = (2 * GROUP_ROWS + 37, 2 * TILE_COLS + 300);
        let a = pseudo_random(nr * dim, 13);
        let b = pseudo_random(nc * dim, 14);
        let f: Vec<f32> = pseudo_random(nc, 15).iter().map(|v| v * 0.1).collect();
        let inv_tau = 40.0f32;
        let potential = |s: &LogSumExp| (0.025 * s.value() + 0.3) as f32;
        let (rows, cols) = (Rows::new(&a, dim), Rows::new(&b, dim));
        let mut cache = vec![0f32; nr * nc];
        let mut by_row = vec![LogSumExp::default(); nr];
        lse_sweep(
            rows,
            cols,
            TileSource::Fill(&mut cache),
            Sweep::Rows { col_shift: &f },
            inv_tau,
            &mut by_row,
            &mut [],
        );
        let g: Vec<f32> = by_row.iter().map(potential).collect();
        let mut by_col = vec![LogSumExp::default(); nc];
        lse_sweep(
            rows,
            cols,
            TileSource::Compute,
            Sweep::Columns { row_shift: &g },
            inv_tau,
            &mut [],
            &mut by_col,
        );

        let (mut max, mut sum) = (vec![f64::NEG_INFINITY; nc], vec![0f64; nc]);
        let mut fused_rows = Vec::new();
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
                &potential,
                &mut max,
                &mut sum,
            ));
        }
        assert_eq!(fused_rows, by_row);
        let fused_cols: Vec<LogSumExp> = max
            .into_iter()
            .zip(sum)
            .map(|(max, sum)| LogSumExp { max, sum })
            .collect();
        assert_eq!(fused_cols, by_col);
    }
}
