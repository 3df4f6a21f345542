//! Pass 1's tile driver ([`column_statistics`]): one GEMM tile of bank rows ×
//! gallery columns at a time, consumed by the column epilogues while it is
//! still in cache. For each column (gallery item): the log-sum-exp of β·s
//! over the rows (bank queries), for several β at once; its largest
//! similarities (with their rows, when asked); every similarity; and, for
//! each row, its best columns.
//!
//! Statistics made only of top-k lists (`nnn`, `csls`, `ls`, `nicdm`,
//! `dissim-local`) can take their tiles from the bf16 screen instead
//! ([`column_statistics_screened`]): each similarity that could enter a
//! column's top-k is re-scored in f32 with the f32 tile's bits, so the
//! lists come out as the exact pass's.
//!
//! rayon runs one strip of tiles per task and each task owns the state it
//! updates, so results do not depend on the thread count. Tile and block
//! boundaries are aligned to the tile shape by the callers, so results do not
//! depend on the memory limit either.
//!
//! Before touching the epilogues, run `cargo bench --bench kernel`.

use std::f32::consts::LOG2_E;

use rayon::prelude::*;

use super::dispatch::dispatched;
use super::exp::fast_exp2;
use super::gemm::{similarity_tile, slab_depth, SlabTiles, TileScorer};
use super::lse::{raise_column_maxima, LogSumExp};
use super::screen::{floor_below, Screen, ScreenCounts};
use super::search::{scan_row, QueryState};
use super::tile::{Rows, TileBuffer, BANK_TILE_COLS, BANK_TILE_ROWS, GROUP_ROWS, LANES, SLAB_ROWS};
use super::topk::{Candidate, TopK, TopValues};
use crate::error::Result;

/// Columns the pass-1 fold keeps in registers at a time (four 16-lane
/// vectors; see [`bodies::fold_group_lse`]).
const FOLD_COLUMNS: usize = 64;

/// What pass 1 keeps from each tile of bank rows × gallery columns. Every
/// field is optional, so one GEMM tile feeds every statistic requested.
#[derive(Debug, Clone, Copy, Default)]
pub struct ColumnStatsRequest<'a> {
    /// Log-sum-exp of β·s over the rows of each column, for each β (IS, DIS,
    /// DualIS).
    pub betas: &'a [f32],
    /// The `column_top_k` largest similarities of each column (NNN, CSLS; 0: none).
    pub column_top_k: usize,
    /// The `column_top_rows` largest similarities of each column with their
    /// rows, ties to the smaller row (the neighbours of `dissim-local`; 0: none).
    pub column_top_rows: usize,
    /// For each k here, pass 1 (not this kernel) gathers the mean of the
    /// rows of each column's k largest similarities, from those top rows.
    pub neighbour_means: &'a [usize],
    /// Every similarity of each column (GC).
    pub keep_all: bool,
    /// The `row_top_k` best columns of each row (DIS activation sets; 0: none).
    pub row_top_k: usize,
}

impl ColumnStatsRequest<'_> {
    /// Whether every statistic asked for is a column top-k, which the
    /// bf16 screen can serve exactly ([`column_statistics_screened`]).
    pub fn screenable(&self) -> bool {
        self.betas.is_empty()
            && !self.keep_all
            && self.row_top_k == 0
            && (self.column_top_k > 0 || self.column_top_rows > 0)
    }

    /// Whether any statistic needs the similarity tiles at all.
    pub fn needs_tiles(&self) -> bool {
        !self.betas.is_empty()
            || self.column_top_k > 0
            || self.column_top_rows > 0
            || self.keep_all
            || self.row_top_k > 0
    }
}

/// Per-column states of a block of columns, filled by [`column_statistics`].
#[derive(Debug, Clone, Default)]
pub struct ColumnStates {
    /// `cols × betas` log-sum-exp states, one row per column.
    pub lse: Vec<LogSumExp>,
    /// One bounded top-k per column (empty when not requested).
    pub top: Vec<TopValues>,
    /// One bounded top-k of (similarity, global row) per column (empty when
    /// not requested).
    pub top_rows: Vec<TopK>,
    /// Every similarity per column, in row order (empty when not requested).
    pub all: Vec<Vec<f32>>,
    /// For each k of [`ColumnStatsRequest::neighbour_means`]: the mean of
    /// the rows of each column's k largest similarities, `cols × dim`,
    /// filled by pass 1 once the whole bank has passed.
    pub neighbour_means: Vec<(usize, Vec<f64>)>,
}

impl ColumnStates {
    /// Empty states for `cols` columns; `all_capacity` is the expected
    /// number of rows (the bank size) when every similarity is kept.
    pub fn new(cols: usize, request: &ColumnStatsRequest<'_>, all_capacity: usize) -> Self {
        ColumnStates {
            lse: vec![LogSumExp::default(); cols * request.betas.len()],
            top: if request.column_top_k > 0 {
                vec![TopValues::new(request.column_top_k); cols]
            } else {
                Vec::new()
            },
            top_rows: if request.column_top_rows > 0 {
                vec![TopK::new(request.column_top_rows); cols]
            } else {
                Vec::new()
            },
            all: if request.keep_all {
                (0..cols)
                    .map(|_| Vec::with_capacity(all_capacity))
                    .collect()
            } else {
                Vec::new()
            },
            neighbour_means: Vec::new(),
        }
    }
}

/// Pass 1 kernel (inverted softmax only): for each column `j` of `cols` and
/// each `betas[b]`, folds β·⟨rows_i, cols_j⟩ for every row `i` into
/// `states[j * betas.len() + b]`. See [`column_statistics`].
///
/// An error only when a stop was requested ([`column_statistics`]).
///
/// # Panics
/// When the dimensions differ, `states.len() != cols.rows * betas.len()`, or a β is not positive.
pub fn column_log_sum_exp(
    rows: Rows<'_>,
    cols: Rows<'_>,
    betas: &[f32],
    states: &mut [LogSumExp],
) -> Result<()> {
    assert_eq!(
        states.len(),
        cols.rows * betas.len(),
        "one state per column and β"
    );
    let request = ColumnStatsRequest {
        betas,
        ..ColumnStatsRequest::default()
    };
    let mut column_states = ColumnStates {
        lse: states.to_vec(),
        ..ColumnStates::default()
    };
    column_statistics(rows, cols, 0, 0, &request, &mut column_states)?;
    states.copy_from_slice(&column_states.lse);
    Ok(())
}

/// Pass 1 kernel. Streams the similarity tiles of `rows` (bank items) ×
/// `cols` (gallery items) through the statistics `request` names, folding
/// them into `states` (one entry per column; the rows of `top_rows` are
/// global: `first_row` + local row). Returns, when `request.row_top_k > 0`,
/// the best columns of each row of this block (global column = `first_col`
/// + local column), else an empty vector.
///
/// Rows are folded one group of [`GROUP_ROWS`] at a time in order, and each
/// column on its own, so the result is the same for any split of the rows into
/// blocks whose sizes are multiples of `GROUP_ROWS`, for any strip width, and
/// for any thread count.
///
/// Once a stop is requested ([`crate::cancel::request`]) the rows left are
/// skipped and the call returns [`crate::error::HubnormError::Interrupted`]: the states
/// are then partial, to be dropped.
///
/// # Panics
/// When the dimensions differ, the states were not made for this request and
/// column count, or a β is not positive.
pub fn column_statistics(
    rows: Rows<'_>,
    cols: Rows<'_>,
    first_row: u32,
    first_col: u32,
    request: &ColumnStatsRequest<'_>,
    states: &mut ColumnStates,
) -> Result<Vec<TopK>> {
    column_statistics_screened(rows, cols, (first_row, first_col), request, states, None)
        .map(|(tops, _)| tops)
}

/// [`column_statistics`], from the bf16 screen of `rows` (packed as
/// queries) × `cols` (packed as gallery) when one is given, for a request
/// that is [`ColumnStatsRequest::screenable`]: every cell whose screened
/// value, plus the screen's bound, could pass its column's top-k threshold
/// is re-scored in f32 with the bits its f32 tile would have had
/// ([`TileScorer`]) and offered as the exact pass offers it; no other cell
/// could have entered. The states come out bit for bit as
/// [`column_statistics`] makes them. Tiles whose f32 bits are not
/// reproduced here (small shapes, a system BLAS) run exact. Returns the
/// rows' best columns as [`column_statistics`] does, and the cells screened
/// and re-scored (or, as it does, Interrupted once a stop is requested).
///
/// # Panics
/// As [`column_statistics`], and, with a screen, when the request is not
/// screenable or the screen's operands are not these rows.
pub fn column_statistics_screened(
    rows: Rows<'_>,
    cols: Rows<'_>,
    (first_row, first_col): (u32, u32),
    request: &ColumnStatsRequest<'_>,
    states: &mut ColumnStates,
    screen: Option<Screen<'_>>,
) -> Result<(Vec<TopK>, ScreenCounts)> {
    if let Some(screen) = &screen {
        assert!(
            request.screenable(),
            "a request with more than column top-k lists"
        );
        assert!(
            screen.shape() == (rows.rows, cols.rows, rows.dim),
            "a screen of other blocks"
        );
    }
    let nb = request.betas.len();
    assert_eq!(rows.dim, cols.dim, "dimension mismatch");
    assert_eq!(
        states.lse.len(),
        cols.rows * nb,
        "one state per column and β"
    );
    assert!(states.top.is_empty() || states.top.len() == cols.rows);
    assert!(states.top_rows.is_empty() || states.top_rows.len() == cols.rows);
    assert!(states.all.is_empty() || states.all.len() == cols.rows);
    assert!(request.betas.iter().all(|&b| b > 0.0), "β must be positive");
    if !request.needs_tiles() || rows.rows == 0 || cols.rows == 0 {
        return Ok((Vec::new(), ScreenCounts::default()));
    }
    let bounds = strip_bounds(cols.rows, rayon::current_num_threads());
    let lse = split_strips(&mut states.lse, &bounds, nb);
    let top = split_strips(&mut states.top, &bounds, 1);
    let top_rows = split_strips(&mut states.top_rows, &bounds, 1);
    let all = split_strips(&mut states.all, &bounds, 1);
    let tasks: Vec<_> = bounds
        .windows(2)
        .zip(lse)
        .zip(top)
        .zip(top_rows)
        .zip(all)
        .collect();
    let (row_tops, counts) = tasks
        .into_par_iter()
        .map(|((((columns, lse), top), top_rows), all)| {
            let (c0, c1) = (columns[0], columns[1]);
            let strip_cols = cols.slice(c0, c1);
            let strip_states = StripStates {
                lse,
                top,
                top_rows,
                all,
            };
            column_strip(
                rows,
                strip_cols,
                (first_row, first_col + c0 as u32),
                request,
                strip_states,
                screen.map(|screen| (screen, c0)),
            )
        })
        .reduce(
            || (None, ScreenCounts::default()),
            |(a, mut counts): (Option<Vec<TopK>>, ScreenCounts), (b, more)| {
                counts.add(more);
                let tops = match (a, b) {
                    (Some(mut a), Some(b)) => {
                        a.iter_mut().zip(&b).for_each(|(x, y)| x.merge(y));
                        Some(a)
                    }
                    (a, b) => a.or(b),
                };
                (tops, counts)
            },
        );
    // Strips stop early once a stop is requested: their states are partial.
    crate::cancel::check()?;
    Ok((row_tops.unwrap_or_default(), counts))
}

/// Where the pass-1 strips over `columns` columns start, then `columns`:
/// strips of at most [`BANK_TILE_COLS`] columns, starting on whole fold
/// blocks ([`FOLD_COLUMNS`]), about equal, and as many as a multiple of
/// `threads`. Every strip streams the whole bank block, so with 49 equal
/// strips on two threads one thread runs the last one alone (measured: 0.8 s
/// of a 24 s pass at 100k × 100k with 2048-column strips).
fn strip_bounds(columns: usize, threads: usize) -> Vec<usize> {
    // Room for the rounding of each start to a whole block.
    let strips = columns
        .div_ceil(BANK_TILE_COLS - FOLD_COLUMNS)
        .next_multiple_of(threads.max(1));
    let mut bounds: Vec<usize> = (0..strips)
        .map(|i| i * columns / strips / FOLD_COLUMNS * FOLD_COLUMNS)
        .collect();
    bounds.push(columns);
    bounds.dedup();
    bounds
}

/// `slice`, `per_column` elements per column, cut at the column `bounds`
/// (empty pieces when the slice is empty: a statistic not requested).
fn split_strips<'a, T>(
    mut slice: &'a mut [T],
    bounds: &[usize],
    per_column: usize,
) -> Vec<&'a mut [T]> {
    let mut pieces = Vec::with_capacity(bounds.len());
    for columns in bounds.windows(2) {
        if slice.is_empty() {
            pieces.push(<&mut [T]>::default());
        } else {
            let (piece, rest) = slice.split_at_mut((columns[1] - columns[0]) * per_column);
            pieces.push(piece);
            slice = rest;
        }
    }
    pieces
}

/// The states of one column strip.
struct StripStates<'a> {
    lse: &'a mut [LogSumExp],
    top: &'a mut [TopValues],
    top_rows: &'a mut [TopK],
    all: &'a mut [Vec<f32>],
}

/// Folds a tile (rows `stride` apart, `nc` columns) into the per-β column
/// log-sum-exp states of β·s (`max[b]`, `sum[b]`), a group of
/// [`GROUP_ROWS`] rows at a time (see [`bodies::fold_group_lse`]).
fn fold_exp_columns(
    tile: &[f32],
    stride: usize,
    nc: usize,
    betas: &[f32],
    max: &mut [Vec<f64>],
    sum: &mut [Vec<f64>],
) {
    if betas.is_empty() {
        return;
    }
    for group in tile.chunks(GROUP_ROWS * stride) {
        fold_group_lse(group, stride, nc, betas, max, sum);
    }
}

/// One column strip of pass 1, run by one thread; `first` is the global
/// (row, column) of its first cell. With a screen (and the strip's first
/// column in the screen's gallery block), tiles come from it where
/// [`TileScorer`] reproduces their f32 bits. Otherwise, with the AVX-512
/// slab kernel ([`SlabTiles`]), each tile is computed and folded one group
/// of rows at a time, while the group is in L2; else the `gemm` crate
/// computes the whole tile.
fn column_strip(
    rows: Rows<'_>,
    cols: Rows<'_>,
    (first_row, first_col): (u32, u32),
    request: &ColumnStatsRequest<'_>,
    states: StripStates<'_>,
    screen: Option<(Screen<'_>, usize)>,
) -> (Option<Vec<TopK>>, ScreenCounts) {
    let nc = cols.rows;
    let mut folds = StripFolds::new(rows.rows, nc, (first_row, first_col), request, states);
    let mut buffer = TileBuffer::new(BANK_TILE_ROWS.min(rows.rows), nc);
    let ld = buffer.stride;
    let mut counts = ScreenCounts::default();
    let mut screened_tops = ScreenedTops::default();
    // Packing the strip's columns pays off over many rows; a bank block of
    // a few rows is left to the crate, as a few queries are in pass 2.
    let mut slabs = match screen {
        Some(_) => None,
        None if rows.rows < SLAB_ROWS => None,
        None => SlabTiles::new().map(|mut slabs| {
            slabs.pack_columns(cols.data, nc, cols.dim);
            slabs
        }),
    };
    let scorer = screen.and_then(|_| TileScorer::new(cols.dim));
    let mut r0 = 0;
    while r0 < rows.rows {
        // A strip streams the whole bank block (seconds with a large one):
        // a stop request ends it here (the call then returns Interrupted).
        if crate::cancel::requested() {
            break;
        }
        let r1 = (r0 + BANK_TILE_ROWS).min(rows.rows);
        let tile_rows = r1 - r0;
        let tile = &mut buffer.cells_mut()[..tile_rows * ld];
        if let (Some((screen, c0)), Some(scorer)) = (screen, scorer) {
            let bound = screen.column_tile((r0, r1), (c0, c0 + nc), tile, ld);
            let tile = ScreenedTile {
                values: tile,
                ld,
                bound,
                scorer,
                rows: rows.slice(r0, r1),
                cols,
                first_row: first_row + r0 as u32,
            };
            counts.rescored += screened_tops.fold(
                &tile,
                (&mut folds.top_thresholds, &mut *folds.states.top),
                (&mut folds.row_thresholds, &mut *folds.states.top_rows),
            );
            counts.screened += (tile_rows * nc) as u64;
            r0 = r1;
            continue;
        }
        let depth = slab_depth(cols.dim);
        if let (Some(slabs), Some(kc)) = (slabs.as_mut(), depth) {
            for g0 in (r0..r1).step_by(SLAB_ROWS) {
                let g1 = (g0 + SLAB_ROWS).min(r1);
                let slab = &mut tile[..(g1 - g0) * ld];
                slabs.slab(
                    slab,
                    ld,
                    &rows.data[g0 * rows.dim..g1 * rows.dim],
                    g1 - g0,
                    kc,
                );
                folds.fold(slab, ld, g0);
            }
        } else {
            similarity_tile(
                tile,
                ld,
                &rows.data[r0 * rows.dim..r1 * rows.dim],
                tile_rows,
                cols.data,
                nc,
                cols.dim,
            );
            folds.fold(tile, ld, r0);
        }
        r0 = r1;
    }
    (folds.finish(), counts)
}

/// What the exact epilogues of one strip update, in the forms their loops
/// want: the log-sum-exp states as structure-of-arrays per β (so the loops
/// vectorise), each column's top-k thresholds beside the lists, and the
/// rows' best columns.
struct StripFolds<'a> {
    betas: &'a [f32],
    max: Vec<Vec<f64>>,
    sum: Vec<Vec<f64>>,
    top_thresholds: Vec<f32>,
    row_thresholds: Vec<f32>,
    row_tops: Vec<QueryState>,
    /// The corrections `scan_row` subtracts: none in pass 1.
    zeros: Vec<f32>,
    states: StripStates<'a>,
    nc: usize,
    first_row: u32,
    first_col: u32,
}

impl<'a> StripFolds<'a> {
    fn new(
        rows: usize,
        nc: usize,
        (first_row, first_col): (u32, u32),
        request: &ColumnStatsRequest<'a>,
        states: StripStates<'a>,
    ) -> Self {
        let nb = request.betas.len();
        let row_tops: Vec<QueryState> = if request.row_top_k > 0 {
            (0..rows)
                .map(|_| QueryState::new(request.row_top_k, None))
                .collect()
        } else {
            Vec::new()
        };
        StripFolds {
            betas: request.betas,
            max: (0..nb)
                .map(|b| (0..nc).map(|j| states.lse[j * nb + b].max).collect())
                .collect(),
            sum: (0..nb)
                .map(|b| (0..nc).map(|j| states.lse[j * nb + b].sum).collect())
                .collect(),
            top_thresholds: states.top.iter().map(TopValues::threshold).collect(),
            row_thresholds: states.top_rows.iter().map(TopK::threshold).collect(),
            zeros: vec![0f32; if row_tops.is_empty() { 0 } else { nc }],
            row_tops,
            states,
            nc,
            first_row,
            first_col,
        }
    }

    /// Folds the f32 similarities of the strip's rows from `r0` (`tile`,
    /// rows `ld` apart, starting on a group boundary) into every statistic
    /// asked for.
    fn fold(&mut self, tile: &[f32], ld: usize, r0: usize) {
        let nc = self.nc;
        let r1 = r0 + tile.len() / ld;
        fold_exp_columns(tile, ld, nc, self.betas, &mut self.max, &mut self.sum);
        if !self.states.top.is_empty() {
            column_top_values(tile, ld, nc, &mut self.top_thresholds, self.states.top);
        }
        if !self.states.top_rows.is_empty() {
            let tile_row = self.first_row + r0 as u32;
            column_top_rows(
                tile,
                ld,
                nc,
                tile_row,
                &mut self.row_thresholds,
                self.states.top_rows,
            );
        }
        if !self.states.all.is_empty() {
            for row in tile.chunks_exact(ld) {
                for (values, &s) in self.states.all.iter_mut().zip(&row[..nc]) {
                    values.push(s);
                }
            }
        }
        let tracked = self.row_tops.len();
        for (i, state) in self.row_tops[r0.min(tracked)..r1.min(tracked)]
            .iter_mut()
            .enumerate()
        {
            let row = &tile[i * ld..i * ld + nc];
            if state.top.k() == 1 {
                // The usual activation sets (k_A = 1): one vectorised pass.
                if let Some((j, s)) = row_best(row, state.top.threshold()) {
                    state.top.push(Candidate {
                        score: s,
                        raw: s,
                        row: self.first_col + j as u32,
                    });
                }
            } else {
                scan_row(row, &self.zeros, self.first_col, state);
            }
        }
    }

    /// Writes the log-sum-exp states back; returns the rows' best columns
    /// when they were asked for.
    fn finish(self) -> Option<Vec<TopK>> {
        let nb = self.betas.len();
        for j in 0..self.nc {
            for b in 0..nb {
                self.states.lse[j * nb + b] = LogSumExp {
                    max: self.max[b][j],
                    sum: self.sum[b][j],
                };
            }
        }
        (!self.row_tops.is_empty()).then(|| self.row_tops.into_iter().map(|s| s.top).collect())
    }
}

/// A tile of screened similarities and what re-scores its cells.
struct ScreenedTile<'a> {
    /// The screened values, rows `ld` apart.
    values: &'a [f32],
    ld: usize,
    /// |screened − f32| ≤ `bound` for every cell.
    bound: f64,
    /// The f32 tile's bits of a cell.
    scorer: TileScorer,
    rows: Rows<'a>,
    cols: Rows<'a>,
    /// The global row of the tile's first row.
    first_row: u32,
}

/// A strip's scratch for the screened column top-k lists, kept across its
/// tiles.
#[derive(Debug, Default)]
struct ScreenedTops {
    /// Per column, the screened value at or below which no cell can pass
    /// the column's thresholds ([`floor_below`] the lower of them).
    floors: Vec<f32>,
    /// A row's columns above their floors, and their f32 similarities.
    candidates: Vec<u32>,
    exact: Vec<f32>,
}

impl ScreenedTops {
    /// Offers the cells of `tile` that could pass their column's threshold
    /// to the top-k values (`top`, when kept) and to the top-k rows
    /// (`top_rows`, when kept), with their f32 similarities, row after row
    /// as the exact pass offers every cell. A cell left out had a screened
    /// value at most its column's floor, so an f32 value at most the
    /// threshold, which the exact pass's strict test turns away too; the
    /// thresholds therefore move exactly as there. Returns the cells
    /// re-scored.
    fn fold(
        &mut self,
        tile: &ScreenedTile<'_>,
        (top_thresholds, top): (&mut [f32], &mut [TopValues]),
        (row_thresholds, top_rows): (&mut [f32], &mut [TopK]),
    ) -> u64 {
        let (nc, dim) = (tile.cols.rows, tile.cols.dim);
        let floor_of = |j: usize, top_thresholds: &[f32], row_thresholds: &[f32]| {
            let lowest = match (top_thresholds.get(j), row_thresholds.get(j)) {
                (Some(&a), Some(&b)) => a.min(b),
                (Some(&a), None) | (None, Some(&a)) => a,
                (None, None) => unreachable!("a screened request keeps a top-k"),
            };
            floor_below(lowest, tile.bound)
        };
        self.floors.clear();
        self.floors
            .extend((0..nc).map(|j| floor_of(j, top_thresholds, row_thresholds)));
        let mut rescored = 0;
        let mut pairs: Vec<(&[f32], &[f32])> = Vec::new();
        for (i, values) in tile.values.chunks(tile.ld).take(tile.rows.rows).enumerate() {
            self.candidates.clear();
            above_floors(&values[..nc], &self.floors, &mut self.candidates);
            if self.candidates.is_empty() {
                continue;
            }
            let row = &tile.rows.data[i * dim..(i + 1) * dim];
            pairs.clear();
            pairs.extend(self.candidates.iter().map(|&j| {
                (
                    row,
                    &tile.cols.data[j as usize * dim..(j as usize + 1) * dim],
                )
            }));
            self.exact.resize(pairs.len(), 0.0);
            tile.scorer.scores(&pairs, &mut self.exact);
            rescored += pairs.len() as u64;
            let global = tile.first_row + i as u32;
            for (&j, &s) in self.candidates.iter().zip(&self.exact) {
                let j = j as usize;
                if !top.is_empty() && s > top_thresholds[j] {
                    top[j].push(s);
                    top_thresholds[j] = top[j].threshold();
                }
                if !top_rows.is_empty() && s > row_thresholds[j] {
                    top_rows[j].push(Candidate {
                        score: s,
                        raw: s,
                        row: global,
                    });
                    row_thresholds[j] = top_rows[j].threshold();
                }
                self.floors[j] = floor_of(j, top_thresholds, row_thresholds);
            }
        }
        rescored
    }
}

/// Offers each cell of a tile (rows `stride` apart, `nc` columns, the first
/// row global row `first_row`) to its column's top-k of (similarity, row).
/// Rows arrive in increasing order, so the strict threshold keeps the
/// smaller row of two equal similarities. Only `dissim-local` asks for it:
/// a plain loop, with the 16-lane "any above" prefilter of
/// [`bodies::column_top_values`].
fn column_top_rows(
    tile: &[f32],
    stride: usize,
    nc: usize,
    first_row: u32,
    thresholds: &mut [f32],
    tops: &mut [TopK],
) {
    let full = nc - nc % LANES;
    for (i, row) in tile.chunks_exact(stride).enumerate() {
        let row = &row[..nc];
        let global = first_row + i as u32;
        let mut offer = |j: usize, s: f32, thresholds: &mut [f32]| {
            tops[j].push(Candidate {
                score: s,
                raw: s,
                row: global,
            });
            thresholds[j] = tops[j].threshold();
        };
        for j0 in (0..full).step_by(LANES) {
            let any = (j0..j0 + LANES).any(|j| row[j] > thresholds[j]);
            if any {
                for j in j0..j0 + LANES {
                    if row[j] > thresholds[j] {
                        offer(j, row[j], thresholds);
                    }
                }
            }
        }
        for j in full..nc {
            if row[j] > thresholds[j] {
                offer(j, row[j], thresholds);
            }
        }
    }
}

/// The epilogue bodies, written so that the compiler vectorises them;
/// [`dispatched!`] compiles them for each instruction set.
mod bodies {
    use super::*;

    /// The first column of `row` holding its highest value above
    /// `threshold`, and that value: what offering the columns in order to a
    /// top-1 list whose threshold is `threshold` keeps (a value enters
    /// only strictly above the kept one, so the first of equal maxima
    /// stays; NaN never enters). Each lane keeps its own best while the
    /// row passes, then the lanes are compared.
    #[inline(always)]
    pub fn row_best(row: &[f32], threshold: f32) -> Option<(usize, f32)> {
        let full = row.len() - row.len() % LANES;
        let mut best = [threshold; LANES];
        let mut at = [u32::MAX; LANES];
        for j0 in (0..full).step_by(LANES) {
            let values: &[f32; LANES] = row[j0..j0 + LANES].try_into().expect("a full vector");
            for l in 0..LANES {
                let better = values[l] > best[l];
                best[l] = if better { values[l] } else { best[l] };
                at[l] = if better { (j0 + l) as u32 } else { at[l] };
            }
        }
        let mut found: Option<(usize, f32)> = None;
        for l in 0..LANES {
            let (j, value) = (at[l] as usize, best[l]);
            if at[l] != u32::MAX
                && found.is_none_or(|(k, kept)| value > kept || (value == kept && j < k))
            {
                found = Some((j, value));
            }
        }
        // The tail's columns come after every lane's.
        for (j, &value) in row.iter().enumerate().skip(full) {
            if value > found.map_or(threshold, |(_, kept)| kept) {
                found = Some((j, value));
            }
        }
        found
    }

    /// Folds one group of rows (`cells`, rows `stride` apart) of `width`
    /// columns into the per-β column states: [`FOLD_COLUMNS`] columns at a
    /// time, their maxima over the group first, then per β the running maxima
    /// raised and exp(β·s − max) summed in f32 over the group and added to the
    /// f64 sums. A block of 64 columns keeps its maxima and sums in four
    /// registers, and its rows (32 KiB for a full group) stay in L1 between
    /// the two reads. Each column gets the same arithmetic in the same order
    /// whatever its block, so the last columns, taken a vector or one at a
    /// time, give the bits they would in a full block.
    #[inline(always)]
    pub fn fold_group_lse(
        cells: &[f32],
        stride: usize,
        width: usize,
        betas: &[f32],
        max: &mut [Vec<f64>],
        sum: &mut [Vec<f64>],
    ) {
        let blocks = width - width % FOLD_COLUMNS;
        let vectors = width - width % LANES;
        for c0 in (0..blocks).step_by(FOLD_COLUMNS) {
            fold_column_block::<FOLD_COLUMNS>(cells, stride, c0, betas, max, sum);
        }
        for c0 in (blocks..vectors).step_by(LANES) {
            fold_column_block::<LANES>(cells, stride, c0, betas, max, sum);
        }
        for c0 in vectors..width {
            fold_column_block::<1>(cells, stride, c0, betas, max, sum);
        }
    }

    /// The `W` cells from `start`.
    #[inline(always)]
    fn block_row<const W: usize>(cells: &[f32], start: usize) -> &[f32; W] {
        cells[start..start + W].try_into().expect("W cells")
    }

    /// [`fold_group_lse`] for the `W` columns from `c0`.
    #[inline(always)]
    fn fold_column_block<const W: usize>(
        cells: &[f32],
        stride: usize,
        c0: usize,
        betas: &[f32],
        max: &mut [Vec<f64>],
        sum: &mut [Vec<f64>],
    ) {
        let rows = cells.len().div_ceil(stride);
        let row = |i: usize| block_row::<W>(cells, stride * i + c0);
        let mut block_max = *row(0);
        for i in 1..rows {
            let r = row(i);
            for l in 0..W {
                block_max[l] = if r[l] > block_max[l] {
                    r[l]
                } else {
                    block_max[l]
                };
            }
        }
        let mut shift = [0f32; W];
        for (b, &beta) in betas.iter().enumerate() {
            let (max, sum) = (&mut max[b][c0..c0 + W], &mut sum[b][c0..c0 + W]);
            raise_column_maxima(&block_max, beta, max, sum, &mut shift);
            // exp(β·s − m) = 2^(s·β·log₂e − m·log₂e): one fused multiply-add
            // for the argument, and the cheaper base-2 range reduction.
            let beta_log2e = beta * LOG2_E;
            let shift_log2e = shift.map(|m| m * LOG2_E);
            let mut group_sum = [0f32; W];
            for i in 0..rows {
                let r = row(i);
                for l in 0..W {
                    group_sum[l] += fast_exp2(r[l].mul_add(beta_log2e, -shift_log2e[l]));
                }
            }
            for (acc, &part) in sum.iter_mut().zip(&group_sum) {
                *acc += part as f64;
            }
        }
    }

    // The lanes are indexed, without a short cut, so that the "any above"
    // test is one vector comparison.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    pub fn column_top_values(
        tile: &[f32],
        stride: usize,
        nc: usize,
        thresholds: &mut [f32],
        tops: &mut [TopValues],
    ) {
        let full = nc - nc % LANES;
        for row in tile.chunks_exact(stride) {
            let row = &row[..nc];
            let mut j0 = 0;
            while j0 < full {
                let s: &[f32; LANES] = row[j0..j0 + LANES].try_into().unwrap();
                let t: &[f32; LANES] = thresholds[j0..j0 + LANES].try_into().unwrap();
                let mut any = false;
                for l in 0..LANES {
                    any |= s[l] > t[l];
                }
                if any {
                    for l in 0..LANES {
                        let j = j0 + l;
                        if s[l] > thresholds[j] {
                            tops[j].push(s[l]);
                            thresholds[j] = tops[j].threshold();
                        }
                    }
                }
                j0 += LANES;
            }
            for j in full..nc {
                if row[j] > thresholds[j] {
                    tops[j].push(row[j]);
                    thresholds[j] = tops[j].threshold();
                }
            }
        }
    }

    /// Appends to `out` the columns whose `values` lie above their
    /// `floors`, in order: 16 columns tested together, one by one only
    /// where one is (the screened pass 1's filter).
    #[inline(always)]
    pub fn above_floors(values: &[f32], floors: &[f32], out: &mut Vec<u32>) {
        let full = values.len() - values.len() % LANES;
        for j0 in (0..full).step_by(LANES) {
            let v: &[f32; LANES] = values[j0..j0 + LANES].try_into().unwrap();
            let f: &[f32; LANES] = floors[j0..j0 + LANES].try_into().unwrap();
            let mut any = false;
            for l in 0..LANES {
                any |= v[l] > f[l];
            }
            if any {
                out.extend(
                    (j0..j0 + LANES)
                        .filter(|&j| values[j] > floors[j])
                        .map(|j| j as u32),
                );
            }
        }
        out.extend(
            (full..values.len())
                .filter(|&j| values[j] > floors[j])
                .map(|j| j as u32),
        );
    }
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
    fn column_top_values(
        tile: &[f32],
        stride: usize,
        nc: usize,
        thresholds: &mut [f32],
        tops: &mut [TopValues]
    ) = bodies::column_top_values;
    fn above_floors(values: &[f32], floors: &[f32], out: &mut Vec<u32>) = bodies::above_floors;
    fn row_best(row: &[f32], threshold: f32) -> Option<(usize, f32)> = bodies::row_best;
}

#[cfg(test)]
mod tests;
