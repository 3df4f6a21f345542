//! Pure, synchronous, Arrow-free compute: the similarity tile (GEMM), the
//! vectorised exp, bounded top-k, streaming log-sum-exp, and the fused tile
//! drivers of pass 1 (column statistics), pass 2 (search) and the Sinkhorn
//! sweeps.

pub mod bf16;
pub mod column_stats;
mod dispatch;
pub mod exp;
pub mod gemm;
pub mod lse;
pub mod normal;
pub mod screen;
pub mod search;
pub mod sinkhorn;
#[cfg(test)]
mod test_values;
pub mod tile;
pub mod topk;

pub use column_stats::{
    column_log_sum_exp, column_statistics, column_statistics_screened, ColumnStates,
    ColumnStatsRequest,
};
pub use dispatch::has_avx512;
pub use lse::LogSumExp;
pub use screen::{strip_scratch_bytes, Screen, ScreenCounts, ScreenedRows};
pub use search::{
    count_above, search_block, search_block_screened, ColumnScoring, Positives, QueryGaussian,
    QueryState,
};
pub use sinkhorn::{
    fused_group, fused_group_scratch, lse_sweep, stack_column_potential, RowWeight, StripRows,
    Sweep, TileSource, MIN_COLUMN_MASS,
};
pub use tile::{
    sweep_packing_bytes, tile_workspace_bytes, Rows, BANK_TILE_COLS, BANK_TILE_ROWS, GROUP_ROWS,
    SLAB_COLS, SLAB_ROWS, TILE_COLS, TILE_ROWS,
};
pub use topk::{Candidate, TieBreak, TopK, TopValues};
