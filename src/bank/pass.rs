//! Pass 1 driver: for each gallery chunk that fits the budget, stream every
//! bank block past it and fold the similarities into per-item state.

use arrow::array::ArrayRef;

use crate::cache::TableBlocks;
use crate::error::{HubnormError, Result};
use crate::kernel::{column_log_sum_exp, LogSumExp, Rows, TILE_COLS, TILE_ROWS};
use crate::plan::PlanRequest;
use crate::progress::{Progress, RowProgress};
use crate::source::EmbeddingTable;

/// The statistics of one gallery chunk, handed to the caller as soon as the
/// whole bank has streamed past it.
#[derive(Debug)]
pub struct StatsChunk<'a> {
    /// Global gallery row of the chunk's first item.
    pub first_row: u64,
    pub ids: &'a ArrayRef,
    /// `rows × betas.len()` states, row-major (one row per gallery item).
    pub states: &'a [LogSumExp],
}

/// Computes LSE_b β·s(b, g) for every gallery item g and every β, streaming
/// bank × gallery blocks within `budget` bytes. `resident_bytes` is memory the
/// caller holds for the whole pass (counted against the budget).
pub fn compute_bank_statistics(
    gallery: &EmbeddingTable,
    bank: &EmbeddingTable,
    betas: &[f32],
    budget: usize,
    resident_bytes: usize,
    progress: &dyn Progress,
    mut on_chunk: impl FnMut(StatsChunk<'_>) -> Result<()>,
) -> Result<()> {
    if gallery.dim != bank.dim {
        return Err(dimension_error(bank, gallery));
    }
    let dim = gallery.dim;
    let nb = betas.len();
    let plan = PlanRequest {
        budget,
        threads: rayon::current_num_threads(),
        dim,
        resident_bytes,
        // Embedding, id, states and their per-strip working copies.
        outer_row_bytes: dim * 4 + 32 + nb * 32,
        inner_row_bytes: dim * 4 + 32,
        outer_total_rows: gallery.rows as usize,
        inner_total_rows: bank.rows as usize,
        outer_align: TILE_COLS,
        inner_align: TILE_ROWS,
    }
    .plan()?;
    let mut bank_blocks =
        TableBlocks::new(bank, plan.inner_rows, plan.batch_rows, plan.cache_inner)?;
    let mut rows_done =
        RowProgress::start(progress, "pass 1: gallery items", gallery.rows, bank.rows);
    let gallery_chunks = gallery.with_batch_rows(plan.batch_rows);
    let mut chunks = gallery_chunks.blocks(plan.outer_rows);
    while let Some(chunk) = chunks.next_block()? {
        let mut states = vec![LogSumExp::default(); chunk.rows * nb];
        bank_blocks.for_each(|block| {
            if block.dim != dim {
                return Err(dimension_error(bank, gallery));
            }
            column_log_sum_exp(
                Rows::new(&block.data, dim),
                Rows::new(&chunk.data, dim),
                betas,
                &mut states,
            );
            rows_done.advance(chunk.rows, block.rows);
            Ok(())
        })?;
        on_chunk(StatsChunk {
            first_row: chunk.first_row,
            ids: &chunk.ids,
            states: &states,
        })?;
    }
    rows_done.finish();
    Ok(())
}

/// The error for two tables whose embeddings have different dimensions.
pub(crate) fn dimension_error(table: &EmbeddingTable, reference: &EmbeddingTable) -> HubnormError {
    let column = table.options().embedding_column.clone();
    table.row_error(
        0,
        &column,
        format!(
            "the {} has dimension {} but the {} has dimension {}",
            table.role, table.dim, reference.role, reference.dim
        ),
    )
}
