//! Pass 1 driver: for each gallery chunk that fits the budget, stream every
//! bank block past it (the query bank, then the gallery bank when one is
//! used) and fold the similarity tiles into per-item state.

use std::ops::Range;

use rayon::prelude::*;

use crate::bank::states::ActivationState;
use crate::cache::{read_ahead, TableBlocks};
use crate::error::{HubnormError, Result};
use crate::kernel::{
    column_statistics_screened, Candidate, ColumnStates, ColumnStatsRequest, QueryState, Rows,
    Screen, ScreenCounts, ScreenedRows, TopK, TopValues, TILE_COLS, TILE_ROWS,
};
use crate::plan::PlanRequest;
use crate::progress::{Progress, RowProgress};
use crate::source::{EmbeddingBlock, EmbeddingTable};

/// Rows of a gallery chunk read ahead while the banks are in memory (16
/// strips of targets): the first chunk's decoding, which nothing overlaps,
/// stays short, and a chunk still has tiles enough for every worker.
const PIPELINED_CHUNK_ROWS: usize = 16 * TILE_COLS;

/// One bank and what to compute from its similarities with the gallery.
#[derive(Debug, Clone, Copy)]
pub struct BankInput<'a> {
    pub table: &'a EmbeddingTable,
    pub request: ColumnStatsRequest<'a>,
}

/// What pass 1 needs besides the progress sink.
#[derive(Debug, Clone)]
pub struct BankPassRequest<'a> {
    pub gallery: &'a EmbeddingTable,
    /// The gallery rows to compute: all of them, or a cluster task's shard.
    pub gallery_rows: Range<u64>,
    /// The query bank (B) and its statistics.
    pub bank: Option<BankInput<'a>>,
    /// The gallery bank (G_B) and its statistics.
    pub gallery_bank: Option<BankInput<'a>>,
    pub budget: usize,
    /// Memory the caller holds for the whole pass (counted against the
    /// budget; the pass adds its own activation states).
    pub resident_bytes: usize,
    /// Bytes per gallery item the caller needs while it turns a chunk into
    /// output rows.
    pub output_row_bytes: usize,
    /// Where a resumed pass starts (gallery rows before it are finished).
    pub resume: Option<&'a ResumePoint>,
    /// Whether banks whose statistics are all column top-k lists take them
    /// from the bf16 screen ([`column_statistics_screened`]: the same lists).
    pub screen: bool,
}

impl BankPassRequest<'_> {
    /// Whether some bank's statistics come from the bf16 screen.
    pub fn screens_a_bank(&self) -> bool {
        self.screen
            && [self.bank, self.gallery_bank]
                .iter()
                .flatten()
                .any(|b| b.request.screenable())
    }
}

/// The state of a pass stopped after its first `gallery_rows` gallery rows,
/// restored from a checkpoint.
#[derive(Debug, Default)]
pub struct ResumePoint {
    pub gallery_rows: u64,
    pub bank_activation: ActivationState,
    pub gallery_bank_activation: ActivationState,
}

/// The statistics of one gallery chunk, handed to the caller as soon as the
/// banks have streamed past it.
#[derive(Debug)]
pub struct StatsChunk<'a> {
    /// The gallery rows of the chunk (ids and embeddings).
    pub gallery: &'a EmbeddingBlock,
    /// States from the query bank (empty when there is none); every
    /// similarity kept (`all`) is sorted ascending.
    pub bank: &'a ColumnStates,
    /// States from the gallery bank (empty when there is none).
    pub gallery_bank: &'a ColumnStates,
    /// The activation states over every gallery row up to the chunk's end
    /// (what a checkpoint needs to resume after this chunk).
    pub activations: &'a BankPassOutput,
}

/// What is only known once every gallery chunk is done.
#[derive(Debug, Default)]
pub struct BankPassOutput {
    /// Each query-bank item's top-k_A gallery items (when requested).
    pub bank_activation: ActivationState,
    /// Each gallery-bank item's top-k_A gallery items (when requested).
    pub gallery_bank_activation: ActivationState,
    /// The bank × gallery cells the screen screened and re-scored, over
    /// the chunks this pass computed (none when it did not screen).
    pub screen: ScreenCounts,
}

/// Which bank an activation state belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationBank {
    /// The query bank (`dis`).
    Query,
    /// The gallery bank (`dual-dis`).
    Gallery,
}

impl ActivationBank {
    /// Its state in `output`.
    pub fn state(self, output: &BankPassOutput) -> &ActivationState {
        match self {
            ActivationBank::Query => &output.bank_activation,
            ActivationBank::Gallery => &output.gallery_bank_activation,
        }
    }

    /// Its state in `output`, to merge into.
    pub fn state_mut(self, output: &mut BankPassOutput) -> &mut ActivationState {
        match self {
            ActivationBank::Query => &mut output.bank_activation,
            ActivationBank::Gallery => &mut output.gallery_bank_activation,
        }
    }
}

/// One activation state a pass keeps: each of a bank's `rows` items' top
/// `k` gallery items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationShape {
    pub bank: ActivationBank,
    pub rows: usize,
    pub k: usize,
}

/// Per-gallery-item bytes of the column states for `request` with a bank
/// of `rows` rows and embeddings of dimension `dim`.
fn column_state_bytes(request: &ColumnStatsRequest<'_>, rows: u64, dim: usize) -> usize {
    // Log-sum-exp states and their structure-of-arrays working copies.
    let mut bytes = request.betas.len() * 32;
    if request.column_top_k > 0 {
        bytes += std::mem::size_of::<TopValues>() + request.column_top_k * 4 + 4;
    }
    if request.column_top_rows > 0 {
        // The top-k, its threshold, the (row, column) pairs gathered, and
        // one f64 mean per k.
        bytes += std::mem::size_of::<TopK>()
            + request.column_top_rows * (std::mem::size_of::<Candidate>() + 8)
            + 4
            + request.neighbour_means.len() * dim * 8;
    }
    if request.keep_all {
        bytes += std::mem::size_of::<Vec<f32>>() + rows as usize * 4;
    }
    bytes
}

/// Per-bank-item bytes of a block's row top-k (one partial per worker, plus
/// the one being merged).
fn row_state_bytes(request: &ColumnStatsRequest<'_>, threads: usize) -> usize {
    if request.row_top_k == 0 {
        return 0;
    }
    (std::mem::size_of::<QueryState>() + request.row_top_k * std::mem::size_of::<Candidate>())
        * (threads + 1)
}

/// Bytes pass 1 holds for the whole run for the activation states of a bank.
fn activation_bytes(input: &Option<BankInput<'_>>) -> usize {
    input.as_ref().map_or(0, |b| {
        if b.request.row_top_k == 0 {
            0
        } else {
            b.table.rows as usize
                * (std::mem::size_of::<TopK>()
                    + b.request.row_top_k * std::mem::size_of::<Candidate>())
        }
    })
}

/// Streams bank × gallery blocks within the budget, calling `on_chunk` with
/// the finished statistics of each gallery chunk in gallery order.
pub fn compute_bank_statistics(
    request: &BankPassRequest<'_>,
    progress: &dyn Progress,
    mut on_chunk: impl FnMut(StatsChunk<'_>) -> Result<()>,
) -> Result<BankPassOutput> {
    let gallery = request.gallery;
    let dim = gallery.dim;
    // (bank, whether it is the query bank), for the banks whose tiles are needed.
    let banks: Vec<(BankInput<'_>, bool)> = [(request.bank, true), (request.gallery_bank, false)]
        .into_iter()
        .filter_map(|(b, query)| b.map(|b| (b, query)))
        .filter(|(b, _)| b.request.needs_tiles())
        .collect();
    for (b, _) in &banks {
        if b.table.dim != dim {
            return Err(dimension_error(b.table, gallery));
        }
    }
    let threads = rayon::current_num_threads();
    let screened = |b: &BankInput<'_>| request.screen && b.request.screenable();
    // The bf16 copies of a gallery chunk and of a bank block, when screened.
    let screen_row_bytes = if request.screens_a_bank() {
        ScreenedRows::bytes_per_row(dim)
    } else {
        0
    };
    let outer_row_bytes = dim * 4
        + 32
        + screen_row_bytes
        + request.output_row_bytes
        + banks
            .iter()
            .map(|(b, _)| column_state_bytes(&b.request, b.table.rows, dim))
            .sum::<usize>();
    let inner_row_bytes = dim * 4
        + 32
        + screen_row_bytes
        + banks
            .iter()
            .map(|(b, _)| row_state_bytes(&b.request, threads))
            .max()
            .unwrap_or(0);
    let inner_total: u64 = banks.iter().map(|(b, _)| b.table.rows).sum();
    let plan = PlanRequest {
        budget: request.budget,
        threads,
        dim,
        // The activation states live for the whole pass.
        resident_bytes: request.resident_bytes
            + activation_bytes(&request.bank)
            + activation_bytes(&request.gallery_bank),
        outer_row_bytes,
        inner_row_bytes,
        outer_total_rows: (request.gallery_rows.end - request.gallery_rows.start) as usize,
        inner_total_rows: inner_total as usize,
        outer_align: TILE_COLS,
        inner_align: TILE_ROWS,
    }
    .plan()?;
    let mut output = BankPassOutput::default();
    let activation_of = |input: &Option<BankInput<'_>>| {
        input.as_ref().map_or_else(ActivationState::default, |b| {
            ActivationState::new(b.table.rows as usize, b.request.row_top_k)
        })
    };
    output.bank_activation = activation_of(&request.bank);
    output.gallery_bank_activation = activation_of(&request.gallery_bank);
    let mut start_row = request.gallery_rows.start;
    if let Some(resume) = &request.resume {
        start_row = start_row.max(resume.gallery_rows);
        output.bank_activation.merge(&resume.bank_activation);
        output
            .gallery_bank_activation
            .merge(&resume.gallery_bank_activation);
    }
    let mut rows_done = RowProgress::start(
        progress,
        "pass 1: gallery items",
        request.gallery_rows.end - request.gallery_rows.start,
        inner_total.max(1),
    );
    rows_done.advance(
        (start_row - request.gallery_rows.start) as usize,
        inner_total.max(1) as usize,
    );
    if start_row >= request.gallery_rows.end {
        // A resumed pass whose every chunk was saved: nothing is left to
        // stream, so neither bank is read again (a long read for a large bank).
        rows_done.finish();
        return Ok(output);
    }
    let gallery_chunks = gallery.with_batch_rows(plan.batch_rows);
    let gallery_left = start_row..request.gallery_rows.end;
    let read_banks = || {
        banks
            .iter()
            .map(|(b, _)| TableBlocks::new(b.table, &plan))
            .collect::<Result<Vec<_>>>()
    };
    let empty = ColumnStatsRequest::default();
    // The bf16 copies of the chunk and bank block before, whose buffers the
    // next copies reuse.
    let (mut used_chunk_copy, mut used_block_copy) = (None, None);
    let mut work_on = |chunk: &EmbeddingBlock, streams: &mut [TableBlocks]| -> Result<()> {
        let mut states: Vec<ColumnStates> = Vec::with_capacity(2);
        let gallery_rows = Rows::new(&chunk.data, dim);
        // A chunk with a value beyond bf16's range runs exact.
        let screened_chunk = banks
            .iter()
            .any(|(b, _)| screened(b))
            .then(|| ScreenedRows::gallery_reusing(gallery_rows, used_chunk_copy.take()))
            .flatten();
        for ((input, is_query_bank), stream) in banks.iter().zip(streams.iter_mut()) {
            let mut chunk_states =
                ColumnStates::new(chunk.rows, &input.request, input.table.rows as usize);
            stream.for_each(|block| {
                if block.dim != dim {
                    return Err(dimension_error(input.table, gallery));
                }
                let bank_rows = Rows::new(&block.data, dim);
                // The bf16 copies of the block and of the chunk, when screened.
                let copies = screened_chunk
                    .as_ref()
                    .filter(|_| screened(input))
                    .and_then(|chunk| {
                        let rows = ScreenedRows::queries_reusing(bank_rows, used_block_copy.take());
                        Some((rows?, chunk))
                    });
                let (row_tops, counts) = column_statistics_screened(
                    bank_rows,
                    gallery_rows,
                    (block.first_row as u32, chunk.first_row as u32),
                    &input.request,
                    &mut chunk_states,
                    copies.as_ref().map(|(rows, cols)| Screen::new(rows, cols)),
                )?;
                output.screen.add(counts);
                used_block_copy = copies.map(|(rows, _)| rows);
                if !row_tops.is_empty() {
                    let activation = if *is_query_bank {
                        &mut output.bank_activation
                    } else {
                        &mut output.gallery_bank_activation
                    };
                    activation.merge_rows(block.first_row as usize, &row_tops);
                }
                rows_done.advance(chunk.rows, block.rows);
                Ok(())
            })?;
            if !input.request.neighbour_means.is_empty() {
                gather_neighbour_means(stream, &mut chunk_states, input, dim)?;
            }
            // Every similarity kept (gc): sorted per column, in parallel.
            chunk_states
                .all
                .par_iter_mut()
                .for_each(|column| column.sort_unstable_by(f32::total_cmp));
            states.push(chunk_states);
        }
        if banks.is_empty() {
            rows_done.advance(chunk.rows, 1);
        }
        let mut states = states.into_iter();
        let state_of = |input: &Option<BankInput<'_>>,
                        states: &mut std::vec::IntoIter<ColumnStates>| {
            match input {
                Some(b) if b.request.needs_tiles() => states.next().expect("one per bank"),
                _ => ColumnStates::new(chunk.rows, &empty, 0),
            }
        };
        let bank_states = state_of(&request.bank, &mut states);
        let gallery_bank_states = state_of(&request.gallery_bank, &mut states);
        on_chunk(StatsChunk {
            gallery: chunk,
            bank: &bank_states,
            gallery_bank: &gallery_bank_states,
            activations: &output,
        })?;
        used_chunk_copy = screened_chunk;
        Ok(())
    };
    // With the banks in memory, a gallery read whole before the first tile
    // would leave every core but one idle while it decodes: it is read in
    // pieces of at most `PIPELINED_CHUNK_ROWS` instead, the next one on a
    // thread of its own while the current one is worked on. Two chunks then
    // share the room the plan made for one.
    let pipelined_rows = (plan.outer_rows / 2 / TILE_COLS * TILE_COLS).min(PIPELINED_CHUNK_ROWS);
    if plan.cache_inner
        && pipelined_rows >= TILE_COLS
        && gallery_left.end - gallery_left.start > pipelined_rows as u64
    {
        // The banks are read while the first chunk is, when the budget has
        // room for both readers.
        let mut streams = None;
        if !plan.allows_second_reader() {
            streams = Some(read_banks()?);
        }
        let start = || match streams {
            Some(streams) => Ok(streams),
            None => read_banks(),
        };
        let open = || gallery_chunks.blocks_in(pipelined_rows, gallery_left);
        read_ahead(open, start, |streams, chunk| work_on(chunk, streams))?;
    } else {
        let mut chunks = gallery_chunks.blocks_in(plan.outer_rows, gallery_left)?;
        // The banks (read whole when they are cached) and the first gallery
        // chunk are decoded side by side when the budget has room for the
        // second reader: no tile can start before both are in memory.
        let (mut streams, mut next) = if plan.cache_inner && plan.allows_second_reader() {
            let (streams, first_chunk) = rayon::join(read_banks, || chunks.next_block());
            (streams?, first_chunk?)
        } else {
            let streams = read_banks()?;
            (streams, chunks.next_block()?)
        };
        // Each later chunk is read once the previous one and its states are
        // dropped: the plan has room for one chunk only.
        while let Some(chunk) = next {
            work_on(&chunk, &mut streams)?;
            chunks.recycle(chunk);
            next = chunks.next_block()?;
        }
    }
    rows_done.finish();
    Ok(output)
}

/// Fills `states.neighbour_means` from its top rows with one more read of
/// the bank (see [`neighbour_means`]).
fn gather_neighbour_means(
    bank: &mut TableBlocks,
    states: &mut ColumnStates,
    input: &BankInput<'_>,
    dim: usize,
) -> Result<()> {
    let lists: Vec<Vec<u64>> = states
        .top_rows
        .iter()
        .map(|top| top.sorted().iter().map(|c| c.row as u64).collect())
        .collect();
    states.neighbour_means = neighbour_means(&lists, input.request.neighbour_means, dim, |f| {
        bank.for_each(f)
    })?;
    Ok(())
}

/// For each k of `ks`, the mean of the bank vectors of the first k rows of
/// each list of `lists` (a gallery item's nearest bank rows, nearest first),
/// `lists.len() × dim` values, from one read of the bank by `for_each_block`
/// (blocks in row order). Summed in f64 in bank-row order, so the result
/// does not depend on how the bank is cut into blocks.
pub(crate) fn neighbour_means(
    lists: &[Vec<u64>],
    ks: &[usize],
    dim: usize,
    for_each_block: impl FnOnce(&mut dyn FnMut(&EmbeddingBlock) -> Result<()>) -> Result<()>,
) -> Result<Vec<(usize, Vec<f64>)>> {
    // (bank row, list, rank in the list), in row order.
    let mut wanted: Vec<(u64, u32, u32)> = lists
        .iter()
        .enumerate()
        .flat_map(|(j, rows)| {
            rows.iter()
                .enumerate()
                .map(move |(rank, &row)| (row, j as u32, rank as u32))
        })
        .collect();
    wanted.sort_unstable();
    let mut sums: Vec<Vec<f64>> = ks.iter().map(|_| vec![0.0; lists.len() * dim]).collect();
    let mut next = 0;
    for_each_block(&mut |block: &EmbeddingBlock| {
        let end = block.first_row + block.rows as u64;
        while next < wanted.len() && wanted[next].0 < end {
            let (row, j, rank) = wanted[next];
            let local = (row - block.first_row) as usize;
            let vector = &block.data[local * dim..(local + 1) * dim];
            for (sum, &k) in sums.iter_mut().zip(ks) {
                if (rank as usize) < k {
                    let j = j as usize;
                    for (acc, &v) in sum[j * dim..(j + 1) * dim].iter_mut().zip(vector) {
                        *acc += v as f64;
                    }
                }
            }
            next += 1;
        }
        Ok(())
    })?;
    if next < wanted.len() {
        return Err(HubnormError::Internal(format!(
            "bank row {} is past the end of the bank",
            wanted[next].0
        )));
    }
    Ok(ks
        .iter()
        .zip(sums)
        .map(|(&k, mut sum)| {
            for (j, rows) in lists.iter().enumerate() {
                let n = rows.len().min(k).max(1) as f64;
                sum[j * dim..(j + 1) * dim].iter_mut().for_each(|x| *x /= n);
            }
            (k, sum)
        })
        .collect())
}

/// The error for two tables whose embeddings have different dimensions.
pub(crate) fn dimension_error(table: &EmbeddingTable, reference: &EmbeddingTable) -> HubnormError {
    let column = table.options().embedding_column.clone();
    table.row_error(
        0,
        &column,
        format!(
            "embeddings of dimension {} in the {}, but {} in the {} ({})",
            table.dim,
            table.role,
            reference.dim,
            reference.role,
            reference
                .parts
                .first()
                .map_or_else(String::new, |p| p.path.display().to_string())
        ),
    )
}
