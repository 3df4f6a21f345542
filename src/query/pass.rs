//! Pass 2 driver: for each query block that fits the budget, stream the
//! gallery (cached when it fits) and keep k candidates per query and method.

use std::ops::Range;

use crate::bank::pass::dimension_error;
use crate::cache::TableBlocks;
use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::kernel::{
    search_block_screened, strip_scratch_bytes, ColumnScoring, Positives, QueryState, Rows, Screen,
    ScreenCounts, ScreenedRows, TILE_COLS, TILE_ROWS,
};
use crate::options::Precision;

/// Memory a screened search holds besides its blocks: per thread, its
/// strip's scratch ([`crate::kernel::screen`]), and the gallery copy's
/// last panel (rows rounded up to 16).
fn screen_scratch_bytes(dim: usize, scorings: usize) -> usize {
    rayon::current_num_threads() * strip_scratch_bytes(TILE_ROWS, TILE_COLS, scorings)
        + 16 * ScreenedRows::bytes_per_row(dim)
}
use crate::plan::PlanRequest;
use crate::progress::{Progress, RowProgress};
use crate::query::method::{Scoring, ScoringPlan};
use crate::query::targets::{resolve_targets, target_scores};
use crate::source::{EmbeddingBlock, EmbeddingTable};

/// What pass 2 needs besides the tables.
pub struct SearchRequest<'a> {
    pub queries: &'a EmbeddingTable,
    /// The query rows searched (all of them, or a cluster task's shard).
    pub query_rows: Range<u64>,
    pub gallery: &'a EmbeddingTable,
    /// The gallery's ids (for ground truth lookups).
    pub gallery_index: &'a IdIndex,
    pub scorings: &'a [Scoring],
    /// Candidates kept per query and scoring.
    pub k: usize,
    pub budget: usize,
    /// Memory the caller holds for the whole pass (index, corrections, counts).
    pub resident_bytes: usize,
    /// Bytes per query the caller needs to turn a block into output rows.
    pub output_row_bytes: usize,
    /// Whether the tiles are screened in bf16 ([`screens`]).
    pub screen: bool,
}

/// Whether a pass 2 of `plan` screens its tiles under `precision`
/// (`Screened` where it cannot is refused).
pub fn screens(precision: Precision, plan: &ScoringPlan) -> Result<bool> {
    precision.screens(&plan.method_specs())
}

/// The finished results of one query block.
#[derive(Debug)]
pub struct QueryBlockResult<'a> {
    /// The queries (ids and embeddings).
    pub queries: &'a EmbeddingBlock,
    /// `rows × scorings` states, row-major (one row per query).
    pub states: &'a [QueryState],
    pub scorings: usize,
    /// Each query's ground-truth gallery rows.
    pub positives: &'a Positives,
    /// What the screen did for this block (zeros when not screened).
    pub screen: ScreenCounts,
}

/// Runs pass 2 and hands each query block's results to `on_block` in
/// order; returns what the screen did (zeros when not screened).
pub fn search(
    request: &SearchRequest<'_>,
    progress: &dyn Progress,
    mut on_block: impl FnMut(QueryBlockResult<'_>) -> Result<()>,
) -> Result<ScreenCounts> {
    let SearchRequest {
        queries,
        ref query_rows,
        gallery,
        gallery_index,
        scorings,
        k,
        screen,
        ..
    } = *request;
    let mut screened = ScreenCounts::default();
    if queries.dim != gallery.dim {
        return Err(dimension_error(queries, gallery));
    }
    queries.check_shard(query_rows)?;
    let query_count = query_rows.end - query_rows.start;
    if scorings.iter().any(|m| m.rows() as u64 != gallery.rows) {
        return Err(HubnormError::Internal(
            "one correction per gallery item expected".into(),
        ));
    }
    let dim = gallery.dim;
    let nm = scorings.len();
    let state_bytes =
        std::mem::size_of::<QueryState>() + k * std::mem::size_of::<crate::kernel::Candidate>();
    let screen_row_bytes = if screen {
        ScreenedRows::bytes_per_row(dim)
    } else {
        0
    };
    let plan = PlanRequest {
        budget: request.budget,
        threads: rayon::current_num_threads(),
        dim,
        resident_bytes: request.resident_bytes
            + if screen {
                screen_scratch_bytes(dim, nm)
            } else {
                0
            },
        // Embedding, id, target lists, and per method the state plus the
        // output rows built from it (`output_row_bytes`); screened,
        // each row's bf16 copy and norm too.
        outer_row_bytes: dim * 4
            + 48
            + nm * state_bytes
            + request.output_row_bytes
            + screen_row_bytes,
        inner_row_bytes: dim * 4 + 32 + screen_row_bytes,
        outer_total_rows: query_count as usize,
        inner_total_rows: gallery.rows as usize,
        outer_align: TILE_ROWS,
        inner_align: TILE_COLS,
    }
    .plan()?;
    let mut gallery_blocks = TableBlocks::new(gallery, &plan)?;
    let mut rows_done = RowProgress::start(progress, "pass 2: queries", query_count, gallery.rows);
    let query_table = queries.with_batch_rows(plan.batch_rows);
    let mut query_blocks = query_table.blocks_in(plan.outer_rows, query_rows.clone())?;
    // The bf16 copies of the blocks before, whose buffers the next copies reuse.
    let (mut used_queries, mut used_gallery) = (None, None);
    while let Some(block) = query_blocks.next_block()? {
        // A block with values beyond bf16's range is searched in f32.
        let screened_queries = screen
            .then(|| {
                ScreenedRows::queries_reusing(Rows::new(&block.data, dim), used_queries.take())
            })
            .flatten();
        let positives = resolve_targets(&block, queries, gallery_index)?;
        let query_parameters = scorings
            .iter()
            .map(|h| {
                h.query_parameters(&block.data, dim).map_err(|(row, why)| {
                    queries.row_error(
                        block.first_row + row as u64,
                        &queries.options().embedding_column,
                        why,
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let targets = target_scores(
            &block,
            &positives,
            &mut gallery_blocks,
            scorings,
            &query_parameters,
        )?;
        let mut states: Vec<QueryState> = targets
            .iter()
            .enumerate()
            .map(|(i, &t)| match scorings[i % nm] {
                Scoring::BankRank { .. } => QueryState::by_bank_rank(k, t),
                _ => QueryState::new(k, t.map(|(score, _)| score)),
            })
            .collect();
        let mut block_screen_counts = ScreenCounts::default();
        gallery_blocks.for_each(|g_block| {
            let start = g_block.first_row as usize;
            let block_corrections: Vec<ColumnScoring<'_>> = scorings
                .iter()
                .zip(&query_parameters)
                .map(|(h, per_query)| {
                    h.columns(start, start + g_block.rows)
                        .with_queries(per_query)
                })
                .collect();
            let (query_rows, gallery_rows) =
                (Rows::new(&block.data, dim), Rows::new(&g_block.data, dim));
            let screened_gallery = screened_queries
                .as_ref()
                .and_then(|_| ScreenedRows::gallery_reusing(gallery_rows, used_gallery.take()));
            let block_screen = screened_queries
                .as_ref()
                .zip(screened_gallery.as_ref())
                .map(|(q, g)| Screen::new(q, g));
            block_screen_counts.add(search_block_screened(
                query_rows,
                gallery_rows,
                g_block.first_row as u32,
                &block_corrections,
                &positives,
                &mut states,
                block_screen,
            ));
            used_gallery = screened_gallery;
            rows_done.advance(block.rows, g_block.rows);
            Ok(())
        })?;
        screened.add(block_screen_counts);
        on_block(QueryBlockResult {
            queries: &block,
            states: &states,
            scorings: nm,
            positives: &positives,
            screen: block_screen_counts,
        })?;
        used_queries = screened_queries;
        query_blocks.recycle(block);
    }
    rows_done.finish();
    Ok(screened)
}
