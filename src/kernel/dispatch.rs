//! Runtime CPU dispatch for the epilogues: the same bodies compiled for the
//! baseline target, for AVX2 + FMA and for AVX-512, picked once per call by
//! feature detection, so a binary built for generic x86-64 still runs 16-lane
//! loops where the CPU has them. All three give the same bits (IEEE
//! arithmetic in the same order; `mul_add` is fused everywhere). The GEMM
//! itself dispatches inside the `gemm` crate.

use super::fused::{bodies, QueryState};
use super::lse::LogSumExp;
use super::sinkhorn::RowWeight;
use super::topk::TopValues;

/// Whether the AVX-512 versions run on this CPU.
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX2 + FMA versions run on this CPU (8 lanes, and the exp's
/// fused multiply-adds in hardware rather than libm's).
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

macro_rules! dispatched {
    ($(fn $name:ident($($arg:ident : $ty:ty),*) $(-> $ret:ty)? = $body:path;)*) => {
        $(
            #[inline]
            pub(super) fn $name($($arg: $ty),*) $(-> $ret)? {
                #[cfg(target_arch = "x86_64")]
                {
                    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
                    fn wide($($arg: $ty),*) $(-> $ret)? {
                        $body($($arg),*)
                    }
                    if has_avx512() {
                        // SAFETY: the features `wide` was compiled for were detected above.
                        return unsafe { wide($($arg),*) };
                    }
                    #[target_feature(enable = "avx2,fma")]
                    fn fused($($arg: $ty),*) $(-> $ret)? {
                        $body($($arg),*)
                    }
                    if has_avx2_fma() {
                        // SAFETY: as above.
                        return unsafe { fused($($arg),*) };
                    }
                }
                $body($($arg),*)
            }
        )*
    };
}

dispatched! {
    fn fold_group_lse(
        cells: &[f32],
        stride: usize,
        width: usize,
        betas: &[f32],
        max: &mut [Vec<f64>],
        sum: &mut [Vec<f64>]
    ) = bodies::fold_group_lse;
    fn scan_row(scores: &[f32], h: &[f32], col0: u32, state: &mut QueryState) = bodies::scan_row;
    fn column_top_values(
        tile: &[f32],
        stride: usize,
        nc: usize,
        thresholds: &mut [f32],
        tops: &mut [TopValues]
    ) = bodies::column_top_values;
    fn shifted_row_lse(scores: &[f32], shifts: &[f32], inv_tau: f32, bound: Option<f32>)
        -> LogSumExp = super::sinkhorn::shifted_row_lse_body;
    fn shifted_row_lse_store(
        scores: &[f32],
        shifts: &[f32],
        inv_tau: f32,
        bound: Option<f32>,
        exps: &mut [f32]
    ) -> LogSumExp = super::sinkhorn::shifted_row_lse_store_body;
    fn add_weighted_exps(acc: &mut [f32], exps: &[f32], weight: RowWeight)
        = super::sinkhorn::add_weighted_exps_body;
    fn weighted_exp_sum_columns(
        cells: &[f32],
        stride: usize,
        width: usize,
        weights: &[RowWeight],
        col_shift: &[f32],
        inv_tau: f32,
        sum: &mut [f32]
    ) = super::sinkhorn::weighted_exp_sum_columns_body;
    fn shifted_column_max(
        cells: &[f32],
        stride: usize,
        width: usize,
        row_shift: &[f32],
        inv_tau: f32,
        out: &mut [f32]
    ) = super::sinkhorn::shifted_column_max_body;
    fn shifted_exp_sum_columns(
        cells: &[f32],
        stride: usize,
        width: usize,
        row_shift: &[f32],
        inv_tau: f32,
        shift: &[f32],
        sum: &mut [f32]
    ) = super::sinkhorn::shifted_exp_sum_columns_body;
    fn stack_column_max(row: &[f32], g: f32, inv_tau: f32, max: &mut [f32])
        = super::sinkhorn::stack_column_max_body;
    fn stack_column_exp_add(row: &[f32], g: f32, inv_tau: f32, max: &[f32], sum: &mut [f32])
        = super::sinkhorn::stack_column_exp_add_body;
}
