//! The column (target) update of a Sinkhorn sweep, and its epilogues: the
//! exact form, a log-sum-exp per column shifted by the source potentials
//! ([`fold_columns`]), and the exp-reuse form ([`RowWeight`],
//! [`fold_weighted_columns`]), which rebuilds the row update's exps and
//! weights them; plus the column folds of a small stack held in memory
//! (`sinkhorn-pp`).

use super::super::dispatch::dispatched;
use super::super::exp::{add_exps, add_mapped_exps};
use super::super::lse::raise_column_maxima;
use super::{GROUP_ROWS, MASS_ROWS};

/// The Sinkhorn column folds take the columns of a group in blocks of this
/// many, so the group's second read (the exps after the maxima) hits L2: 128
/// rows × 256 columns × 4 bytes = 128 KiB.
const COLUMN_BLOCK: usize = 256;

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
            shifted_column_max(block, stride, w, shifts, inv_tau, &mut group_max[..w]);
            raise_column_maxima(
                &group_max[..w],
                1.0,
                &mut max[c0..c0 + w],
                &mut sum[c0..c0 + w],
                &mut shift[..w],
            );
            shifted_exp_sum_columns(
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

/// Epilogue body: per column, the max over the rows (`stride` apart) of
/// (s − g_i)·inv_tau, for the first `width` columns.
#[inline(always)]
fn shifted_column_max_body(
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
fn shifted_exp_sum_columns_body(
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
fn stack_column_max_body(row: &[f32], g: f32, inv_tau: f32, max: &mut [f32]) {
    for (c, &x) in max.iter_mut().zip(row) {
        let v = (x - g) * inv_tau;
        *c = if v > *c { v } else { *c };
    }
}

/// Epilogue body: adds exp((s − g)·inv_tau − max) per column for one row.
#[inline(always)]
fn stack_column_exp_add_body(row: &[f32], g: f32, inv_tau: f32, max: &[f32], sum: &mut [f32]) {
    let n = sum.len().min(row.len()).min(max.len());
    add_exps(&mut sum[..n], row, max, |x, c| (x - g) * inv_tau - c);
}

/// How one source row's exps over one strip of targets enter the target
/// update without a second exp (the exp-reuse form of the column update).
///
/// The row update computed e = exp((s − f_t)·inv_tau − shift) with the
/// strip's max (or a bound on it, see [`super::MIN_BOUNDED_SUM`]) as `shift`, and
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
    /// [`super::Sweep::WeightedColumns`] takes it.
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
fn add_weighted_exps_body(acc: &mut [f32], exps: &[f32], weight: RowWeight) {
    for (a, &e) in acc.iter_mut().zip(exps) {
        *a += weight.apply(e);
    }
}

/// Epilogue body: per column, Σ over the rows (`stride` apart) of
/// weight_i · max(e, floor_i) as [`add_weighted_exps_body`] adds them, recomputing the exps
/// exp((s − col_shift_j)·inv_tau − shift_i) from the similarities, with the
/// arithmetic of the row update (so the same bits).
#[inline(always)]
fn weighted_exp_sum_columns_body(
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
/// in f32 in row order and added to the f64 sums, as [`super::fused_group`] does
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
            weighted_exp_sum_columns(
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

dispatched! {
    pub(super) fn add_weighted_exps(acc: &mut [f32], exps: &[f32], weight: RowWeight)
        = add_weighted_exps_body;
    fn weighted_exp_sum_columns(
        cells: &[f32],
        stride: usize,
        width: usize,
        weights: &[RowWeight],
        col_shift: &[f32],
        inv_tau: f32,
        sum: &mut [f32]
    ) = weighted_exp_sum_columns_body;
    fn shifted_column_max(
        cells: &[f32],
        stride: usize,
        width: usize,
        row_shift: &[f32],
        inv_tau: f32,
        out: &mut [f32]
    ) = shifted_column_max_body;
    fn shifted_exp_sum_columns(
        cells: &[f32],
        stride: usize,
        width: usize,
        row_shift: &[f32],
        inv_tau: f32,
        shift: &[f32],
        sum: &mut [f32]
    ) = shifted_exp_sum_columns_body;
    pub(super) fn stack_column_max(row: &[f32], g: f32, inv_tau: f32, max: &mut [f32])
        = stack_column_max_body;
    pub(super) fn stack_column_exp_add(
        row: &[f32],
        g: f32,
        inv_tau: f32,
        max: &[f32],
        sum: &mut [f32]
    ) = stack_column_exp_add_body;
}
