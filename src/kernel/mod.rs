//! Pure, synchronous, Arrow-free compute: the similarity tile (GEMM), the
//! vectorised exp, bounded top-k, streaming log-sum-exp, and the fused tile
//! drivers of pass 1 and pass 2.

pub mod blas;
mod dispatch;
pub mod exp;
pub mod fused;
pub mod gemm;
pub mod lse;
pub mod sinkhorn;
pub mod topk;

pub use dispatch::has_avx512;
pub use fused::{
    column_log_sum_exp, column_statistics, count_above, search_block, tile_workspace_bytes,
    ColumnScoring, ColumnStates, ColumnStatsRequest, Positives, QueryState, Rows, BANK_TILE_COLS,
    BANK_TILE_ROWS, GROUP_ROWS, TILE_COLS, TILE_ROWS,
};
pub use lse::LogSumExp;
pub use sinkhorn::{
    fused_group, fused_group_scratch, lse_sweep, stack_column_potential, RowWeight, StripRows,
    Sweep, TileSource, MIN_COLUMN_MASS,
};
pub use topk::{Candidate, TieBreak, TopK, TopValues};
