//! The sweeps of Sinkhorn over bank × targets within the memory limit: the
//! plan, the cached tiles or the streamed chunks, and what each update
//! leaves for the next (see the module above).

use std::ops::Range;

use crate::cache::TableBlocks;
use crate::error::Result;
use crate::kernel::{
    fused_group, fused_group_scratch, lse_sweep, sweep_packing_bytes, LogSumExp, RowWeight, Rows,
    StripRows, Sweep, TileSource, GROUP_ROWS, TILE_COLS, TILE_ROWS,
};
use crate::plan::PlanRequest;
use crate::source::EmbeddingTable;

/// One chunk of targets: its first global target row and its size.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    offset: usize,
    rows: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SweepKind {
    /// Per source: LSE over the targets of (s − f)/τ.
    Rows,
    /// Per target: LSE over the sources of (s − g)/τ, with per-column shifts.
    Columns,
    /// The same as `Columns`, from the last row sweep's exps
    /// (`kernel::RowWeight`).
    WeightedColumns,
}

/// The tables, the tile cache and the chunk shapes shared by the sweeps.
pub(super) struct Sweeper<'a> {
    sources: &'a EmbeddingTable,
    /// The target tables and the rows of each taken.
    targets: Vec<(EmbeddingTable, Range<u64>)>,
    /// Rows of all targets.
    pub(super) target_rows: usize,
    bank: TableBlocks,
    chunk_rows: usize,
    inv_tau: f32,
    pub(super) cache: bool,
    /// Tiles of each (chunk, bank block) pair in sweep order, once filled.
    tiles: Vec<Vec<f32>>,
    /// Target chunks seen by the first sweep.
    chunks: Vec<Chunk>,
    /// The target columns of each strip (`TILE_COLS` of a table's rows,
    /// fewer at its end): the chunks are cut at multiples of `TILE_COLS`,
    /// so the strips do not depend on the memory limit.
    strips: Vec<Range<usize>>,
    /// Source blocks per target chunk.
    pub(super) source_blocks: usize,
    /// What the last source update left per strip and source row.
    pub(super) rows_by_strip: RowsByStrip,
    /// The target chunks' embeddings (in `chunks` order), kept after the
    /// first streamed sweep when they all fit one chunk.
    kept_targets: Option<Vec<Vec<f32>>>,
}

/// Per strip of targets (all chunks, in order), per source row, what the
/// last source update (row sweep or fused iteration) left: the shift of the
/// row's exps over the strip, which the weighted column update needs, and
/// the row's log-sum-exp over it, from which the next update's bound on the
/// row's max starts (`kernel::MIN_BOUNDED_SUM`).
#[derive(Debug, Default)]
pub(super) struct RowsByStrip {
    /// `shift[strip][row]`.
    shift: Vec<Vec<f32>>,
    /// `lse[strip][row]`.
    pub(super) lse: Vec<Vec<f32>>,
    /// The target potentials (as f32 shifts) of that update.
    pub(super) col_shift: Option<Vec<f32>>,
}

impl RowsByStrip {
    /// Makes room for `strips` strips of `rows` source rows.
    fn reserve(&mut self, strips: usize, rows: usize) {
        if self.shift.len() < strips {
            self.shift.resize(strips, vec![0f32; rows]);
            self.lse.resize(strips, vec![0f32; rows]);
        }
    }

    /// Records the strip states of the rows `first_row..` of strips
    /// `first_strip..` (one `Vec` per strip, as the kernel returns them).
    fn record(&mut self, first_strip: usize, first_row: usize, strips: &[Vec<LogSumExp>]) {
        for (k, states) in strips.iter().enumerate() {
            let range = first_row..first_row + states.len();
            let shift = &mut self.shift[first_strip + k][range.clone()];
            let lse = &mut self.lse[first_strip + k][range];
            for ((sh, l), state) in shift.iter_mut().zip(lse.iter_mut()).zip(states) {
                *sh = state.max as f32;
                *l = state.value() as f32;
            }
        }
    }

    /// Upper bounds of every row's max over every strip of
    /// (s − f_new)·inv_tau, for the next source update: its last
    /// log-sum-exp there (≥ its max) plus the most any of the strip's
    /// targets' shift fell, max_t (f_old − f_new)·inv_tau. `None` before
    /// the first update. Both paths (fused and swept) use these same bounds,
    /// so they still give the same bits.
    fn bounds(
        &self,
        strips: &[Range<usize>],
        col_shift: &[f32],
        inv_tau: f32,
    ) -> Option<Vec<Vec<f32>>> {
        let last = self.col_shift.as_ref()?;
        let mut bounds = Vec::with_capacity(self.lse.len());
        for (columns, lse) in strips.iter().zip(&self.lse) {
            let fall = last[columns.clone()]
                .iter()
                .zip(&col_shift[columns.clone()])
                .map(|(&old, &new)| (old - new) * inv_tau)
                .fold(f32::NEG_INFINITY, f32::max);
            bounds.push(lse.iter().map(|&l| l + fall).collect());
        }
        Some(bounds)
    }
}

impl<'a> Sweeper<'a> {
    /// The sweeps of `sources` × `targets` (each a table and the range of
    /// its rows taken, concatenated in this order) at temperature `tau`,
    /// planned within `budget` beside `resident_bytes` the caller holds:
    /// the tiles cached when they fit.
    pub(super) fn new(
        sources: &'a EmbeddingTable,
        targets: &[(&EmbeddingTable, Range<u64>)],
        tau: f64,
        budget: usize,
        resident_bytes: usize,
    ) -> Result<Self> {
        let dim = sources.dim;
        for (t, _) in targets {
            if t.dim != dim {
                return Err(crate::bank::pass::dimension_error(t, sources));
            }
        }
        let m = sources.rows as usize;
        let n: usize = targets
            .iter()
            .map(|(_, rows)| (rows.end - rows.start) as usize)
            .sum();
        let matrix_bytes = m * n * 4;
        // Per source and per target: the potential (f64), its f32 copy, the
        // sweep's log-sum-exp state and the next potential; per target the last
        // row update's f32 shift; per source and strip of targets, the shift of
        // the row's exps (for the column update), its log-sum-exp and the next
        // update's bound on its max (`RowsByStrip`).
        let strips = n.div_ceil(TILE_COLS) + targets.len();
        let potential_bytes = (m + n) * 36 + n * 4 + m * strips * 12;
        let threads = rayon::current_num_threads();
        // The fused iteration's scratch: a group's f32 mass sums, and one row
        // of exps per running task.
        let fused_scratch_bytes = (fused_group_scratch(GROUP_ROWS.min(m), n) + threads * n) * 4;
        // Each sweep task's strip of targets packed for the slab kernel.
        let packing_bytes = threads * sweep_packing_bytes(dim);
        let free = budget.saturating_sub(resident_bytes + potential_bytes + packing_bytes);
        let request_for = |cache: bool| PlanRequest {
            budget,
            threads,
            dim,
            resident_bytes: resident_bytes
                + potential_bytes
                + packing_bytes
                + if cache {
                    matrix_bytes + fused_scratch_bytes
                } else {
                    0
                },
            // A target row: embedding, column state and its working copies.
            outer_row_bytes: dim * 4 + 48,
            // A source row: embedding, one row state per strip task.
            inner_row_bytes: dim * 4 + 16 * (threads + 1),
            outer_total_rows: n,
            inner_total_rows: m,
            outer_align: TILE_COLS,
            inner_align: TILE_ROWS,
        };
        // Cache the tiles when they fit half of what is free and the blocks
        // still fit beside them; otherwise recompute them every sweep.
        let cached_plan = (matrix_bytes + fused_scratch_bytes <= free / 2)
            .then(|| request_for(true).plan().ok())
            .flatten();
        let cache = cached_plan.is_some();
        let plan = match cached_plan {
            Some(plan) => plan,
            None => request_for(false).plan()?,
        };
        let mut strips = Vec::new();
        let mut offset = 0;
        for (_, rows) in targets {
            let rows = (rows.end - rows.start) as usize;
            strips.extend(
                (0..rows)
                    .step_by(TILE_COLS)
                    .map(|c| offset + c..offset + (c + TILE_COLS).min(rows)),
            );
            offset += rows;
        }
        Ok(Sweeper {
            sources,
            targets: targets
                .iter()
                .map(|(t, rows)| (t.with_batch_rows(plan.batch_rows), rows.clone()))
                .collect(),
            target_rows: n,
            bank: TableBlocks::new(sources, &plan)?,
            chunk_rows: plan.outer_rows,
            inv_tau: (1.0 / tau) as f32,
            cache,
            tiles: Vec::new(),
            chunks: Vec::new(),
            strips,
            source_blocks: 0,
            rows_by_strip: RowsByStrip::default(),
            kept_targets: None,
        })
    }

    /// The target chunks the first sweep streamed.
    pub(super) fn target_chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Takes up the state a checkpoint saved after an iteration (see
    /// [`super::SinkhornProgress`]), so the next update shifts its exps as
    /// the uninterrupted run's does.
    pub(super) fn restore(
        &mut self,
        row_lse: Vec<Vec<f32>>,
        col_shift: Option<Vec<f32>>,
    ) -> Result<()> {
        let m = self.sources.rows as usize;
        let fits = match &col_shift {
            None => row_lse.is_empty(),
            Some(shift) => {
                shift.len() == self.target_rows
                    && row_lse.len() == self.strips.len()
                    && row_lse.iter().all(|lse| lse.len() == m)
            }
        };
        if !fits {
            return Err(crate::error::HubnormError::Internal(
                "saved Sinkhorn bounds of another shape".into(),
            ));
        }
        self.rows_by_strip.reserve(self.strips.len(), m);
        if col_shift.is_some() {
            self.rows_by_strip.lse = row_lse;
        }
        self.rows_by_strip.col_shift = col_shift;
        Ok(())
    }

    /// Whether every tile is cached, so an iteration can be fused.
    pub(super) fn fused_ready(&self) -> bool {
        self.cache && !self.chunks.is_empty()
    }

    /// One whole iteration over the cached tiles, a group of source rows at
    /// a time: the source update (LSE per row, shifted by f), then the target
    /// update from the same exps weighted by the new source potentials
    /// (`log_mass(row state)` = g/τ), while the group is in cache.
    /// Bit-identical to a row sweep then a weighted column sweep
    /// (`kernel::fused_group`), with one read of the tiles and one exp per
    /// cell instead of two of each.
    pub(super) fn fused_iteration(
        &mut self,
        f: &[f64],
        log_mass: &(dyn Fn(&LogSumExp) -> f64 + Sync),
    ) -> Result<(Vec<LogSumExp>, Vec<LogSumExp>)> {
        let n = f.len();
        let f32s: Vec<f32> = f.iter().map(|&v| v as f32).collect();
        let bounds = self.rows_by_strip.bounds(&self.strips, &f32s, self.inv_tau);
        let mut col_sum = vec![0f64; n];
        let mut rows = Vec::with_capacity(self.sources.rows as usize);
        let blocks = self.source_blocks;
        let chunk_rows = self.chunks[0].rows.max(1);
        let mut partials = vec![0f32; fused_group_scratch(GROUP_ROWS, n)];
        let mut block_first_row = 0;
        for block in 0..blocks {
            let block_rows = self.tiles[block].len() / chunk_rows;
            for g0 in (0..block_rows).step_by(GROUP_ROWS) {
                crate::cancel::check()?;
                let g1 = (g0 + GROUP_ROWS).min(block_rows);
                let global = block_first_row + g0..block_first_row + g1;
                let mut strips = Vec::new();
                for (c, chunk) in self.chunks.iter().enumerate() {
                    let tile = &self.tiles[c * blocks + block];
                    // The tile holds its strips one after the other, each
                    // `block_rows × width`, row-major.
                    for c0 in (0..chunk.rows).step_by(TILE_COLS) {
                        let width = TILE_COLS.min(chunk.rows - c0);
                        let base = c0 * block_rows;
                        strips.push(StripRows {
                            cells: &tile[base + g0 * width..base + g1 * width],
                            width,
                            first_col: chunk.offset + c0,
                            bound: bounds.as_ref().map(|b| &b[strips.len()][global.clone()]),
                        });
                    }
                }
                let group = fused_group(
                    &strips,
                    g1 - g0,
                    &f32s,
                    self.inv_tau,
                    log_mass,
                    &mut partials,
                    &mut col_sum,
                );
                self.rows_by_strip.record(0, global.start, &group.strips);
                rows.extend(group.states);
            }
            block_first_row += block_rows;
        }
        self.rows_by_strip.col_shift = Some(f32s.clone());
        let inv_tau = self.inv_tau as f64;
        let cols = f32s
            .iter()
            .zip(col_sum)
            .map(|(&shift, sum)| LogSumExp {
                max: shift as f64 * inv_tau,
                sum,
            })
            .collect();
        Ok((rows, cols))
    }

    /// One sweep over every (target chunk, bank block) pair: LSE per source
    /// row (`Rows`, shifted by f), per target column (`Columns`, shifted by
    /// g), or per target column from the last row sweep's exps
    /// (`WeightedColumns`, with each source row's log mass g/τ).
    pub(super) fn sweep(
        &mut self,
        kind: SweepKind,
        f: &[f64],
        g: &[f64],
        log_mass: &[f64],
    ) -> Result<Vec<LogSumExp>> {
        let m = self.sources.rows as usize;
        let n = f.len();
        let dim = self.sources.dim;
        let mut states = vec![LogSumExp::default(); if kind == SweepKind::Rows { m } else { n }];
        let g32: Vec<f32> = g.iter().map(|&v| v as f32).collect();
        let f32s: Vec<f32> = f.iter().map(|&v| v as f32).collect();
        let bounds = match kind {
            SweepKind::Rows => self.rows_by_strip.bounds(&self.strips, &f32s, self.inv_tau),
            SweepKind::Columns | SweepKind::WeightedColumns => None,
        };
        let fold_context = FoldContext {
            kind,
            f32s: &f32s,
            g32: &g32,
            log_mass,
            bounds: bounds.as_deref(),
            inv_tau: self.inv_tau,
        };
        let mut pair = 0usize;
        let mut strip_base = 0;
        if self.cache && !self.chunks.is_empty() {
            // Every tile is cached: no embedding is read.
            for &chunk in &self.chunks {
                let cols = Rows {
                    data: &[],
                    rows: chunk.rows,
                    dim: 0,
                };
                let strips = chunk.rows.div_ceil(TILE_COLS);
                let mut fold = ChunkFold::new(&fold_context, chunk, strip_base);
                let mut first_row = 0;
                while first_row < m {
                    let tile = &self.tiles[pair];
                    let rows = Rows {
                        data: &[],
                        rows: tile.len() / chunk.rows.max(1),
                        dim: 0,
                    };
                    let source = TileSource::Cached(tile);
                    let by_strip = &mut self.rows_by_strip;
                    fold.visit(rows, cols, first_row, source, &mut states, by_strip);
                    first_row += rows.rows;
                    pair += 1;
                }
                fold.finish(&mut states);
                strip_base += strips;
            }
            self.finish_sweep(kind, f32s);
            return Ok(states);
        }
        let mut chunks = Vec::new();
        let mut blocks = 0;
        if let Some(kept) = self.kept_targets.take() {
            // The targets are at hand from the first sweep.
            for (chunk, data) in self.chunks.clone().into_iter().zip(&kept) {
                let cols = Rows::new(data, dim);
                blocks +=
                    self.fold_chunk(&fold_context, chunk, cols, &mut strip_base, &mut states)?;
                chunks.push(chunk);
            }
            self.kept_targets = Some(kept);
        } else {
            // Keep the targets for the next sweeps when they fit one chunk:
            // the plan holds that much during a sweep anyway.
            let keep = !self.cache && self.chunk_rows >= self.target_rows;
            let mut kept = Vec::new();
            let mut offset = 0;
            for (table, rows) in &self.targets.clone() {
                let mut reader = table.blocks_in(self.chunk_rows, rows.clone())?;
                while let Some(block) = reader.next_block()? {
                    if block.dim != dim {
                        return Err(crate::bank::pass::dimension_error(table, self.sources));
                    }
                    let chunk = Chunk {
                        offset,
                        rows: block.rows,
                    };
                    let cols = Rows::new(&block.data, dim);
                    blocks +=
                        self.fold_chunk(&fold_context, chunk, cols, &mut strip_base, &mut states)?;
                    chunks.push(chunk);
                    offset += block.rows;
                    if keep {
                        kept.push(block.data);
                    }
                }
            }
            if keep {
                self.kept_targets = Some(kept);
            }
        }
        self.source_blocks = blocks / chunks.len().max(1);
        self.chunks = chunks;
        self.finish_sweep(kind, f32s);
        Ok(states)
    }

    /// Folds one target chunk (`cols`, the chunk's embeddings) against
    /// every bank block into `states`, filling the tile cache when it is
    /// kept; returns the bank blocks visited.
    fn fold_chunk(
        &mut self,
        fold_context: &FoldContext<'_>,
        chunk: Chunk,
        cols: Rows<'_>,
        strip_base: &mut usize,
        states: &mut [LogSumExp],
    ) -> Result<usize> {
        let m = self.sources.rows as usize;
        let dim = self.sources.dim;
        let strips = chunk.rows.div_ceil(TILE_COLS);
        self.rows_by_strip.reserve(*strip_base + strips, m);
        let mut fold = ChunkFold::new(fold_context, chunk, *strip_base);
        let (tiles, cache) = (&mut self.tiles, self.cache);
        let by_strip = &mut self.rows_by_strip;
        let mut blocks = 0;
        self.bank.for_each(|bank_block| {
            let rows = Rows::new(&bank_block.data, dim);
            let source = if cache {
                tiles.push(vec![0f32; rows.rows * chunk.rows]);
                TileSource::Fill(tiles.last_mut().expect("pushed"))
            } else {
                TileSource::Compute
            };
            fold.visit(
                rows,
                cols,
                bank_block.first_row as usize,
                source,
                states,
                by_strip,
            );
            blocks += 1;
            Ok(())
        })?;
        fold.finish(states);
        *strip_base += strips;
        Ok(blocks)
    }

    /// After a row sweep, its target shifts are the base of the next bounds.
    fn finish_sweep(&mut self, kind: SweepKind, col_shift: Vec<f32>) {
        if kind == SweepKind::Rows {
            self.rows_by_strip.col_shift = Some(col_shift);
        }
    }
}

/// What every chunk of one sweep shares.
struct FoldContext<'a> {
    kind: SweepKind,
    /// Target potentials, as the kernel's f32 shifts.
    f32s: &'a [f32],
    /// Source potentials, as the kernel's f32 shifts (`Columns`).
    g32: &'a [f32],
    /// Source log masses g/τ (`WeightedColumns`).
    log_mass: &'a [f64],
    /// `bounds[strip][row]` on each row's max, for `Rows` after the first
    /// update (see `RowsByStrip::bounds`).
    bounds: Option<&'a [Vec<f32>]>,
    inv_tau: f32,
}

/// The sweep of one target chunk against every bank block.
struct ChunkFold<'a> {
    context: &'a FoldContext<'a>,
    chunk: Chunk,
    /// The chunk's first strip among all the targets' strips.
    first_strip: usize,
    /// f of the chunk's targets, as the kernel's f32 shifts.
    col_shift: &'a [f32],
    col_states: Vec<LogSumExp>,
}

impl<'a> ChunkFold<'a> {
    fn new(context: &'a FoldContext<'a>, chunk: Chunk, first_strip: usize) -> Self {
        ChunkFold {
            context,
            chunk,
            first_strip,
            col_shift: &context.f32s[chunk.offset..chunk.offset + chunk.rows],
            col_states: if context.kind == SweepKind::Rows {
                Vec::new()
            } else {
                vec![LogSumExp::default(); chunk.rows]
            },
        }
    }

    /// Folds the bank rows `first_row..first_row + rows.rows` into the
    /// states. `by_strip` is written by row sweeps and read by weighted
    /// column sweeps.
    fn visit(
        &mut self,
        rows: Rows<'_>,
        cols: Rows<'_>,
        first_row: usize,
        source: TileSource<'_>,
        states: &mut [LogSumExp],
        by_strip: &mut RowsByStrip,
    ) {
        let range = first_row..first_row + rows.rows;
        let inv_tau = self.context.inv_tau;
        let strips = self.chunk.rows.div_ceil(TILE_COLS);
        match self.context.kind {
            SweepKind::Rows => {
                let bounds: Option<Vec<&[f32]>> = self.context.bounds.map(|bounds| {
                    bounds[self.first_strip..self.first_strip + strips]
                        .iter()
                        .map(|b| &b[range.clone()])
                        .collect()
                });
                let strip_states = lse_sweep(
                    rows,
                    cols,
                    source,
                    Sweep::Rows {
                        col_shift: self.col_shift,
                        row_bound: bounds.as_deref(),
                    },
                    inv_tau,
                    &mut states[range.clone()],
                    &mut [],
                );
                by_strip.record(self.first_strip, first_row, &strip_states);
            }
            SweepKind::Columns => {
                lse_sweep(
                    rows,
                    cols,
                    source,
                    Sweep::Columns {
                        row_shift: &self.context.g32[range],
                    },
                    inv_tau,
                    &mut [],
                    &mut self.col_states,
                );
            }
            SweepKind::WeightedColumns => {
                let weights = RowWeight::per_strip(
                    by_strip.shift[self.first_strip..self.first_strip + strips]
                        .iter()
                        .map(|shifts| &shifts[range.clone()]),
                    &self.context.log_mass[range.clone()],
                );
                let weights: Vec<&[RowWeight]> = weights.iter().map(|w| w.as_slice()).collect();
                lse_sweep(
                    rows,
                    cols,
                    source,
                    Sweep::WeightedColumns {
                        col_shift: self.col_shift,
                        weights: &weights,
                    },
                    inv_tau,
                    &mut [],
                    &mut self.col_states,
                );
            }
        }
    }

    /// Stores the chunk's column states (target sweeps).
    fn finish(self, states: &mut [LogSumExp]) {
        if self.context.kind != SweepKind::Rows {
            states[self.chunk.offset..self.chunk.offset + self.chunk.rows]
                .copy_from_slice(&self.col_states);
        }
    }
}
