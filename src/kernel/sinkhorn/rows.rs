//! The row (source) update of a Sinkhorn sweep: per row, the log-sum-exp of
//! (s − shift)·inv_tau over a strip of targets, shifted by the row's max or
//! by an upper bound of it ([`MIN_BOUNDED_SUM`]), optionally keeping the
//! exps for the exp-reuse column update.

use super::super::dispatch::dispatched;
use super::super::exp::{fast_exp, EXP_CHUNK};
use super::super::lse::LogSumExp;

/// Epilogue body: LSE over one row of (s − shift)·inv_tau, with f32 lanes
/// summed into f64 at the end. With a `bound` (an upper bound of the row's
/// max, see [`MIN_BOUNDED_SUM`]) the exps are shifted by it and the max pass
/// is skipped; the returned state's `max` is the shift used.
#[inline(always)]
fn shifted_row_lse_body(
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
fn shifted_row_lse_store_body(
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

dispatched! {
    pub(super) fn shifted_row_lse(scores: &[f32], shifts: &[f32], inv_tau: f32, bound: Option<f32>)
        -> LogSumExp = shifted_row_lse_body;
    pub(super) fn shifted_row_lse_store(
        scores: &[f32],
        shifts: &[f32],
        inv_tau: f32,
        bound: Option<f32>,
        exps: &mut [f32]
    ) -> LogSumExp = shifted_row_lse_store_body;
}
