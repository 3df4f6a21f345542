//! The fused tile drivers: one GEMM tile at a time, consumed by an epilogue
//! while it is still in cache.
//!
//! * [`column_log_sum_exp`] (pass 1): for each column (gallery item), the
//!   log-sum-exp of β·s over the rows (bank queries), for several β at once.
//! * [`search_block`] (pass 2): for each row (query) and each scoring method,
//!   the top-k of s − h(col), and the counts needed for the full-gallery rank
//!   of the query's ground truth.
//!
//! Pass-2 tiles are `TILE_ROWS × TILE_COLS`, pass-1 tiles
//! `BANK_TILE_ROWS × BANK_TILE_COLS`; rayon runs one strip of tiles per task
//! and each task owns the state it updates, so results do not depend on the
//! thread count. Tile and block boundaries are aligned to the tile shape by the
//! callers, so results do not depend on the memory limit either.
//!
//! Before touching the epilogues, run `cargo bench --bench kernel`.

use std::f32::consts::LOG2_E;

use rayon::prelude::*;

use super::exp::fast_exp2;
use super::gemm::similarity_tile;
use super::lse::{raise_column_maxima, LogSumExp};
use super::topk::{Candidate, TieBreak, TopK, TopValues};

/// Rows of one similarity tile (queries or bank rows).
///
/// Measured with `examples/gemm_shapes.rs` (d = 512, 2048 × 8192, two threads,
/// one strip of tiles per task; this shared machine varies by ±30% between
/// runs): 512 × 1024 tiles 124–168 GFLOP/s, 1024 × 1024 138–200, 512 × 2048
/// 153–174, one large GEMM parallelised inside `gemm` 110–126. On one thread,
/// 256-row tiles were up to 40% slower than 512-row ones. 512 rows keep two
/// strips busy for query blocks of a few hundred rows.
pub const TILE_ROWS: usize = 512;

/// Column folds (log-sum-exp over rows) take the rows of a tile in groups of
/// this many: each group's column maxima shift its exps, which are summed in
/// f32 over the group (each ≤ 1) before joining the f64 sums. Tiles and bank
/// blocks start at multiples of it, so the groups are the same global rows
/// however the matrix is cut, and results do not depend on block sizes.
pub const GROUP_ROWS: usize = 128;
const _: () = assert!(
    TILE_ROWS.is_multiple_of(GROUP_ROWS) && BANK_TILE_ROWS.is_multiple_of(GROUP_ROWS),
    "tiles start on group boundaries"
);

/// The Sinkhorn column folds take the columns of a group in blocks of this
/// many, so the group's second read (the exps after the maxima) hits L2: 128
/// rows × 256 columns × 4 bytes = 128 KiB.
pub(super) const COLUMN_BLOCK: usize = 256;

/// Columns the pass-1 fold keeps in registers at a time (four 16-lane
/// vectors; see [`bodies::fold_group_lse`]).
const FOLD_COLUMNS: usize = 64;

/// Columns of one similarity tile (gallery items). A 512 × 2048 f32 tile is 4 MiB.
pub const TILE_COLS: usize = 2048;

/// Rows (bank items) of one pass-1 tile. Pass 1 has many more rows than a
/// query block, so its tiles are tall and narrow: the `gemm` crate packs the
/// gallery side of every tile it is given (the bank side is read in place), so
/// the packing costs 1/(2·rows) of the tile's work. Measured on the Xeon of
/// `benches/runs/2026-11-25-xeon` (100k gallery × 30k bank, d = 384, one
/// thread, `perf`): packing took 5.7% of the pass at 512 × 2048 tiles and
/// 2.2% at 2048 × 512 (2.4% at 2048 × 1024). With [`strip_bounds`] and the
/// banks read beside the first gallery chunk, 100k × 100k went from 46.6 to 44.3 s on one thread
/// and from 23.7 to 22.1 s on two (medians of 3, alternating, same bits).
pub const BANK_TILE_ROWS: usize = 2048;

/// Columns (gallery items) of one pass-1 tile: the width of one strip, one
/// task. A 2048 × 512 f32 tile is 4 MiB, as in pass 2. Narrow strips also
/// make many tasks, so two threads end together (see [`strip_bounds`]).
pub const BANK_TILE_COLS: usize = 512;

/// Lanes processed together by the epilogues (one AVX-512 register of f32).
const LANES: usize = 16;

/// Per-thread cache buffer the `gemm` crate keeps for packing (its L2 slab,
/// the size of the L2 cache: 1 MiB here); 2 MiB covers common CPUs.
const GEMM_THREAD_SLAB_BYTES: usize = 2 << 20;
/// Upper bound of the depth `gemm` packs at once (measured: 384 at d = 768).
const GEMM_MAX_DEPTH: usize = 512;

const fn min(a: usize, b: usize) -> usize {
    if a < b {
        a
    } else {
        b
    }
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// Scratch memory one worker thread needs at dimension `dim`: the tile, the
/// per-strip state copies, and the GEMM's buffers (the packed operands,
/// `(TILE_ROWS + TILE_COLS) × kc` floats with a depth kc that `gemm` caps
/// below 512, and its per-thread slab).
/// The memory plan counts this once per thread; `tests/memory.rs` checks the
/// GEMM really allocates no more.
pub const fn tile_workspace_bytes(dim: usize) -> usize {
    let search = shape_workspace_bytes(TILE_ROWS, TILE_COLS, dim);
    let bank = shape_workspace_bytes(BANK_TILE_ROWS, BANK_TILE_COLS, dim);
    max(search, bank)
}

/// [`tile_workspace_bytes`] for tiles of `rows × cols`.
const fn shape_workspace_bytes(rows: usize, cols: usize, dim: usize) -> usize {
    let f32_bytes = std::mem::size_of::<f32>();
    // The tile with its row padding and alignment (`TileBuffer`).
    (rows + 1) * (cols + 2 * LINE_CELLS) * f32_bytes
        + cols * 64
        + (rows + cols) * min(dim, GEMM_MAX_DEPTH) * f32_bytes
        + GEMM_THREAD_SLAB_BYTES
}

/// A borrowed row-major block of embeddings.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub dim: usize,
}

impl<'a> Rows<'a> {
    pub fn new(data: &'a [f32], dim: usize) -> Self {
        let rows = data.len().checked_div(dim).unwrap_or(0);
        Rows { data, rows, dim }
    }

    fn slice(&self, start: usize, end: usize) -> Rows<'a> {
        Rows {
            data: &self.data[start * self.dim..end * self.dim],
            rows: end - start,
            dim: self.dim,
        }
    }
}

/// What pass 1 keeps from each tile of bank rows × gallery columns. Every
/// field is optional, so one GEMM tile feeds every statistic requested.
#[derive(Debug, Clone, Copy, Default)]
pub struct ColumnStatsRequest<'a> {
    /// Log-sum-exp of β·s over the rows of each column, for each β (IS, DIS,
    /// DualIS).
    pub betas: &'a [f32],
    /// The `column_top_k` largest similarities of each column (NNN, CSLS; 0: none).
    pub column_top_k: usize,
    /// Every similarity of each column (GC).
    pub keep_all: bool,
    /// The `row_top_k` best columns of each row (DIS activation sets; 0: none).
    pub row_top_k: usize,
}

impl ColumnStatsRequest<'_> {
    /// Whether any statistic needs the similarity tiles at all.
    pub fn needs_tiles(&self) -> bool {
        !self.betas.is_empty() || self.column_top_k > 0 || self.keep_all || self.row_top_k > 0
    }
}

/// Per-column states of a block of columns, filled by [`column_statistics`].
#[derive(Debug, Clone, Default)]
pub struct ColumnStates {
    /// `cols × betas` log-sum-exp states, one row per column.
    pub lse: Vec<LogSumExp>,
    /// One bounded top-k per column (empty when not requested).
    pub top: Vec<TopValues>,
    /// Every similarity per column, in row order (empty when not requested).
    pub all: Vec<Vec<f32>>,
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
            all: if request.keep_all {
                (0..cols)
                    .map(|_| Vec::with_capacity(all_capacity))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}

/// Pass 1 kernel (inverted softmax only): for each column `j` of `cols` and
/// each `betas[b]`, folds β·⟨rows_i, cols_j⟩ for every row `i` into
/// `states[j * betas.len() + b]`. See [`column_statistics`].
///
/// # Panics
/// When the dimensions differ, `states.len() != cols.rows * betas.len()`, or a β is not positive.
pub fn column_log_sum_exp(rows: Rows<'_>, cols: Rows<'_>, betas: &[f32], states: &mut [LogSumExp]) {
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
    column_statistics(rows, cols, 0, &request, &mut column_states);
    states.copy_from_slice(&column_states.lse);
}

/// Pass 1 kernel. Streams the similarity tiles of `rows` (bank items) ×
/// `cols` (gallery items) through the statistics `request` names, folding
/// them into `states` (one entry per column). Returns, when
/// `request.row_top_k > 0`, the best columns of each row of this block (global
/// column = `first_col` + local column), else an empty vector.
///
/// Rows are folded one group of [`GROUP_ROWS`] at a time in order, and each
/// column on its own, so the result is the same for any split of the rows into
/// blocks whose sizes are multiples of `GROUP_ROWS`, for any strip width, and
/// for any thread count.
///
/// # Panics
/// When the dimensions differ, the states were not made for this request and
/// column count, or a β is not positive.
pub fn column_statistics(
    rows: Rows<'_>,
    cols: Rows<'_>,
    first_col: u32,
    request: &ColumnStatsRequest<'_>,
    states: &mut ColumnStates,
) -> Vec<TopK> {
    let nb = request.betas.len();
    assert_eq!(rows.dim, cols.dim, "dimension mismatch");
    assert_eq!(
        states.lse.len(),
        cols.rows * nb,
        "one state per column and β"
    );
    assert!(states.top.is_empty() || states.top.len() == cols.rows);
    assert!(states.all.is_empty() || states.all.len() == cols.rows);
    assert!(request.betas.iter().all(|&b| b > 0.0), "β must be positive");
    if !request.needs_tiles() || rows.rows == 0 || cols.rows == 0 {
        return Vec::new();
    }
    let bounds = strip_bounds(cols.rows, rayon::current_num_threads());
    let lse = split_strips(&mut states.lse, &bounds, nb);
    let top = split_strips(&mut states.top, &bounds, 1);
    let all = split_strips(&mut states.all, &bounds, 1);
    let tasks: Vec<_> = bounds.windows(2).zip(lse).zip(top).zip(all).collect();
    let row_tops = tasks
        .into_par_iter()
        .map(|(((columns, lse), top), all)| {
            let (c0, c1) = (columns[0], columns[1]);
            let strip_cols = cols.slice(c0, c1);
            let strip_states = StripStates { lse, top, all };
            column_strip(
                rows,
                strip_cols,
                first_col + c0 as u32,
                request,
                strip_states,
            )
        })
        .reduce(
            || None,
            |a: Option<Vec<TopK>>, b| match (a, b) {
                (Some(mut a), Some(b)) => {
                    a.iter_mut().zip(&b).for_each(|(x, y)| x.merge(y));
                    Some(a)
                }
                (a, b) => a.or(b),
            },
        );
    row_tops.unwrap_or_default()
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
        super::dispatch::fold_group_lse(group, stride, nc, betas, max, sum);
    }
}

/// A similarity tile: rows of `cols` cells, `stride` apart and
/// starting on 64-byte boundaries. The stride is the width rounded up to
/// whole cache lines, plus one line: with a power-of-two stride (2048 floats = 8 KiB)
/// every row of a column block falls into the same few L1 sets, so the
/// GEMM's stores and the fold's column reads would evict each other.
struct TileBuffer {
    data: Vec<f32>,
    offset: usize,
    stride: usize,
}

/// f32 cells per 64-byte cache line.
const LINE_CELLS: usize = 16;

impl TileBuffer {
    fn new(rows: usize, cols: usize) -> Self {
        let stride = cols.next_multiple_of(LINE_CELLS) + LINE_CELLS;
        let data = vec![0f32; rows * stride + LINE_CELLS];
        let offset = data.as_ptr().align_offset(64).min(LINE_CELLS);
        TileBuffer {
            data,
            offset,
            stride,
        }
    }

    fn cells_mut(&mut self) -> &mut [f32] {
        &mut self.data[self.offset..]
    }
}

/// One column strip of pass 1, run by one thread.
fn column_strip(
    rows: Rows<'_>,
    cols: Rows<'_>,
    first_col: u32,
    request: &ColumnStatsRequest<'_>,
    states: StripStates<'_>,
) -> Option<Vec<TopK>> {
    let (nc, betas) = (cols.rows, request.betas);
    let nb = betas.len();
    // Structure-of-arrays copies of the states, per β, so the loops vectorise.
    let mut max: Vec<Vec<f64>> = (0..nb)
        .map(|b| (0..nc).map(|j| states.lse[j * nb + b].max).collect())
        .collect();
    let mut sum: Vec<Vec<f64>> = (0..nb)
        .map(|b| (0..nc).map(|j| states.lse[j * nb + b].sum).collect())
        .collect();
    let mut top_thresholds: Vec<f32> = states.top.iter().map(TopValues::threshold).collect();
    let mut row_tops: Vec<QueryState> = if request.row_top_k > 0 {
        (0..rows.rows)
            .map(|_| QueryState::new(request.row_top_k, None))
            .collect()
    } else {
        Vec::new()
    };
    let zeros = vec![0f32; if row_tops.is_empty() { 0 } else { nc }];
    let mut buffer = TileBuffer::new(BANK_TILE_ROWS.min(rows.rows), nc);
    let ld = buffer.stride;
    let mut r0 = 0;
    while r0 < rows.rows {
        let r1 = (r0 + BANK_TILE_ROWS).min(rows.rows);
        let tile_rows = r1 - r0;
        let tile = &mut buffer.cells_mut()[..tile_rows * ld];
        similarity_tile(
            tile,
            ld,
            &rows.data[r0 * rows.dim..r1 * rows.dim],
            tile_rows,
            cols.data,
            nc,
            cols.dim,
        );
        let tile = &*tile;
        fold_exp_columns(tile, ld, nc, betas, &mut max, &mut sum);
        if !states.top.is_empty() {
            super::dispatch::column_top_values(tile, ld, nc, &mut top_thresholds, states.top);
        }
        if !states.all.is_empty() {
            for row in tile.chunks_exact(ld) {
                for (values, &s) in states.all.iter_mut().zip(&row[..nc]) {
                    values.push(s);
                }
            }
        }
        let tracked = row_tops.len();
        for (i, state) in row_tops[r0.min(tracked)..r1.min(tracked)]
            .iter_mut()
            .enumerate()
        {
            super::dispatch::scan_row(&tile[i * ld..i * ld + nc], &zeros, first_col, state);
        }
        r0 = r1;
    }
    for j in 0..nc {
        for b in 0..nb {
            states.lse[j * nb + b] = LogSumExp {
                max: max[b][j],
                sum: sum[b][j],
            };
        }
    }
    (!row_tops.is_empty()).then(|| row_tops.into_iter().map(|s| s.top).collect())
}

/// Per-query, per-method search state of pass 2.
#[derive(Debug, Clone, Default)]
pub struct QueryState {
    /// Best candidates so far under this method's scores.
    pub top: TopK,
    /// Score of the best ground-truth item under this method (NaN: no ground truth).
    pub target: f32,
    /// Raw similarity of that item (used when equal scores are ordered by it, `gc`).
    pub target_raw: f32,
    /// Gallery items (ground truth excluded) scored strictly above `target`.
    pub greater: u64,
    /// Gallery items (ground truth excluded) scored exactly `target`.
    pub equal: u64,
}

impl QueryState {
    pub fn new(k: usize, target: Option<f32>) -> Self {
        QueryState {
            top: TopK::new(k),
            target: target.unwrap_or(f32::NAN),
            target_raw: f32::NAN,
            greater: 0,
            equal: 0,
        }
    }

    /// The state of a [`ColumnScoring::BankRank`] scoring, whose equal scores
    /// are ordered by the raw similarity; `target` is (score, raw) of the
    /// best ground-truth item.
    pub fn by_bank_rank(k: usize, target: Option<(f32, f32)>) -> Self {
        let (score, raw) = target.unwrap_or((f32::NAN, f32::NAN));
        QueryState {
            top: TopK::with_ties(k, TieBreak::RawThenRow),
            target: score,
            target_raw: raw,
            greater: 0,
            equal: 0,
        }
    }

    /// The same targets with no candidates and no counts yet.
    fn fresh(&self) -> Self {
        QueryState {
            top: TopK::with_ties(self.top.k(), self.top.ties()),
            greater: 0,
            equal: 0,
            ..*self
        }
    }

    /// Full-gallery rank of the ground truth: 1 + items above + half the ties.
    pub fn rank(&self) -> Option<f64> {
        (!self.target.is_nan()).then_some(1.0 + self.greater as f64 + 0.5 * self.equal as f64)
    }
}

/// Ground-truth gallery rows of each query, in compressed-row form.
#[derive(Debug, Clone, Default)]
pub struct Positives {
    offsets: Vec<usize>,
    rows: Vec<u32>,
}

impl Positives {
    /// No query has ground truth.
    pub fn none(queries: usize) -> Self {
        Positives {
            offsets: vec![0; queries + 1],
            rows: vec![],
        }
    }

    /// From one list of gallery rows per query.
    pub fn from_lists<I: IntoIterator<Item = Vec<u32>>>(lists: I) -> Self {
        let mut p = Positives {
            offsets: vec![0],
            rows: vec![],
        };
        for list in lists {
            p.rows.extend(list);
            p.offsets.push(p.rows.len());
        }
        p
    }

    pub fn of(&self, query: usize) -> &[u32] {
        &self.rows[self.offsets[query]..self.offsets[query + 1]]
    }

    pub fn queries(&self) -> usize {
        self.offsets.len() - 1
    }
}

/// Number of values of an ascending list strictly above `s` (`gc`'s rank
/// of a query among the bank).
#[inline]
pub fn count_above(sorted: &[f32], s: f32) -> usize {
    sorted.len() - sorted.partition_point(|&b| b <= s)
}

/// How pass 2 turns a similarity s(q, j) into a score, for the columns of one
/// gallery block.
#[derive(Debug, Clone, Copy)]
pub enum ColumnScoring<'a> {
    /// s − h(j), one correction per column (every additive method; zeros for
    /// the raw baseline).
    Subtract(&'a [f32]),
    /// −|{b : s(b, j) > s}|, the rank of the query among the bank (`gc`),
    /// from each column's `width` bank similarities sorted ascending; equal
    /// scores are ordered by s.
    BankRank { sorted: &'a [f32], width: usize },
    /// Dual softmax: s · exp(s/θ − L), L = `log_normaliser[j]` (the log of
    /// Σ exp(s(b, j)/θ) over the bank, or over the test queries when
    /// transductive), with exp(s/θ) added to it when `include_query`
    /// (the softmax over B ∪ {q}). Computed in f64.
    DualSoftmax {
        log_normaliser: &'a [f64],
        inv_theta: f64,
        include_query: bool,
    },
    /// Local scaling (`ls`): −(2 − 2s)·`inv_scale[j]`, that is −d(q, g)²/σ(g)
    /// for unit rows. Computed in f64.
    LocalScaling { inv_scale: &'a [f64] },
    /// NICDM: −sqrt(max(0, 2 − 2s))·`inv_scale[j]`, that is
    /// −d(q, g)/sqrt(r(g)) for unit rows. Computed in f64.
    Nicdm { inv_scale: &'a [f64] },
}

impl<'a> ColumnScoring<'a> {
    /// The scoring of columns `start..end` only.
    pub fn columns(&self, start: usize, end: usize) -> ColumnScoring<'a> {
        match *self {
            ColumnScoring::Subtract(h) => ColumnScoring::Subtract(&h[start..end]),
            ColumnScoring::BankRank { sorted, width } => ColumnScoring::BankRank {
                sorted: &sorted[start * width..end * width],
                width,
            },
            ColumnScoring::DualSoftmax {
                log_normaliser,
                inv_theta,
                include_query,
            } => ColumnScoring::DualSoftmax {
                log_normaliser: &log_normaliser[start..end],
                inv_theta,
                include_query,
            },
            ColumnScoring::LocalScaling { inv_scale } => ColumnScoring::LocalScaling {
                inv_scale: &inv_scale[start..end],
            },
            ColumnScoring::Nicdm { inv_scale } => ColumnScoring::Nicdm {
                inv_scale: &inv_scale[start..end],
            },
        }
    }

    /// Number of columns described.
    pub fn len(&self) -> usize {
        match *self {
            ColumnScoring::Subtract(h) => h.len(),
            ColumnScoring::BankRank { sorted, width } => {
                sorted.len().checked_div(width).unwrap_or(0)
            }
            ColumnScoring::DualSoftmax { log_normaliser, .. } => log_normaliser.len(),
            ColumnScoring::LocalScaling { inv_scale } | ColumnScoring::Nicdm { inv_scale } => {
                inv_scale.len()
            }
        }
    }

    /// Whether no column is described.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The score of similarity `s` in column `j`.
    #[inline]
    pub fn score(&self, j: usize, s: f32) -> f32 {
        match *self {
            ColumnScoring::Subtract(h) => s - h[j],
            ColumnScoring::BankRank { sorted, width } => {
                -(count_above(&sorted[j * width..(j + 1) * width], s) as f32)
            }
            ColumnScoring::DualSoftmax {
                log_normaliser,
                inv_theta,
                include_query,
            } => {
                let x = s as f64 * inv_theta;
                let l = log_normaliser[j];
                let l = if include_query {
                    // log(e^l + e^x), stably.
                    l.max(x) + (-(l - x).abs()).exp().ln_1p()
                } else {
                    l
                };
                (s as f64 * (x - l).exp()) as f32
            }
            ColumnScoring::LocalScaling { inv_scale } => {
                (-(2.0 - 2.0 * s as f64).max(0.0) * inv_scale[j]) as f32
            }
            ColumnScoring::Nicdm { inv_scale } => {
                (-(2.0 - 2.0 * s as f64).max(0.0).sqrt() * inv_scale[j]) as f32
            }
        }
    }
}

/// Pass 2 kernel. For each query row `q` of `queries` and each scoring `m`
/// (one [`ColumnScoring`] per scoring, covering this block's columns), offers
/// the candidates of this gallery block to `states[q * scorings.len() + m]`,
/// and counts the items above the query's ground-truth score. `first_row` is
/// the global gallery row of the block's first column; blocks must be offered
/// in increasing row order.
///
/// # Panics
/// When the dimensions differ or a slice has the wrong length.
pub fn search_block(
    queries: Rows<'_>,
    gallery: Rows<'_>,
    first_row: u32,
    corrections: &[ColumnScoring<'_>],
    positives: &Positives,
    states: &mut [QueryState],
) {
    let nm = corrections.len();
    assert_eq!(queries.dim, gallery.dim, "dimension mismatch");
    assert_eq!(
        states.len(),
        queries.rows * nm,
        "one state per query and method"
    );
    assert_eq!(
        positives.queries(),
        queries.rows,
        "one positives list per query"
    );
    assert!(
        corrections.iter().all(|h| h.len() == gallery.rows),
        "one correction per gallery column"
    );
    if nm == 0 || queries.rows == 0 || gallery.rows == 0 {
        return;
    }
    let strips = queries.rows.div_ceil(TILE_ROWS);
    let column_tiles = gallery.rows.div_ceil(TILE_COLS);
    // Few query strips (a small query block) would leave threads idle: then
    // the gallery columns are split too, each part searched with fresh states
    // and merged in column order. Top-k merges exactly and the counts add, so
    // results are the same either way.
    let parts = rayon::current_num_threads()
        .div_ceil(strips)
        .min(column_tiles)
        .max(1);
    if parts == 1 {
        states
            .par_chunks_mut(TILE_ROWS * nm)
            .enumerate()
            .for_each(|(strip, strip_states)| {
                let ctx = StripSearch {
                    queries,
                    gallery,
                    first_row,
                    corrections,
                    positives,
                };
                ctx.run(strip * TILE_ROWS, 0..gallery.rows, strip_states);
            });
        return;
    }
    let tiles_per_part = column_tiles.div_ceil(parts);
    let tasks: Vec<(usize, std::ops::Range<usize>)> = (0..strips)
        .flat_map(|strip| {
            (0..parts).filter_map(move |p| {
                let c0 = p * tiles_per_part * TILE_COLS;
                let c1 = ((p + 1) * tiles_per_part * TILE_COLS).min(gallery.rows);
                (c0 < c1).then_some((strip, c0..c1))
            })
        })
        .collect();
    let partial: Vec<Vec<QueryState>> = tasks
        .par_iter()
        .map(|(strip, columns)| {
            let q0 = strip * TILE_ROWS;
            let q1 = (q0 + TILE_ROWS).min(queries.rows);
            let mut fresh: Vec<QueryState> = states[q0 * nm..q1 * nm]
                .iter()
                .map(QueryState::fresh)
                .collect();
            let ctx = StripSearch {
                queries,
                gallery,
                first_row,
                corrections,
                positives,
            };
            ctx.run(q0, columns.clone(), &mut fresh);
            fresh
        })
        .collect();
    for ((strip, _), part) in tasks.iter().zip(&partial) {
        let q0 = strip * TILE_ROWS;
        for (state, p) in states[q0 * nm..].iter_mut().zip(part) {
            state.top.merge(&p.top);
            state.greater += p.greater;
            state.equal += p.equal;
        }
    }
}

/// The inputs of one strip search (a helper of [`search_block`]).
struct StripSearch<'a> {
    queries: Rows<'a>,
    gallery: Rows<'a>,
    first_row: u32,
    corrections: &'a [ColumnScoring<'a>],
    positives: &'a Positives,
}

impl StripSearch<'_> {
    /// Offers gallery columns `columns` (a range starting on a tile boundary)
    /// to the queries of the strip starting at row `q0`, whose states are
    /// `strip_states`. Columns are visited in increasing order.
    fn run(&self, q0: usize, columns: std::ops::Range<usize>, strip_states: &mut [QueryState]) {
        let (queries, gallery) = (self.queries, self.gallery);
        let nm = self.corrections.len();
        let q1 = (q0 + TILE_ROWS).min(queries.rows);
        let mut buffer = TileBuffer::new(q1 - q0, TILE_COLS.min(columns.len()));
        let ld = buffer.stride;
        let mut c0 = columns.start;
        while c0 < columns.end {
            let c1 = (c0 + TILE_COLS).min(columns.end);
            let nc = c1 - c0;
            let tile = &mut buffer.cells_mut()[..(q1 - q0) * ld];
            similarity_tile(
                tile,
                ld,
                &queries.data[q0 * queries.dim..q1 * queries.dim],
                q1 - q0,
                &gallery.data[c0 * gallery.dim..c1 * gallery.dim],
                nc,
                gallery.dim,
            );
            let col0 = self.first_row + c0 as u32;
            let tile = &*tile;
            for (m, scoring) in self.corrections.iter().enumerate() {
                let scoring = scoring.columns(c0, c1);
                match scoring {
                    ColumnScoring::Subtract(h) => {
                        for (i, row_states) in strip_states.chunks_mut(nm).enumerate() {
                            let scores = &tile[i * ld..i * ld + nc];
                            super::dispatch::scan_row(scores, h, col0, &mut row_states[m]);
                        }
                    }
                    ColumnScoring::BankRank { .. } => {
                        scan_bank_rank(tile, ld, nc, &scoring, col0, strip_states, m, nm)
                    }
                    ColumnScoring::DualSoftmax { .. }
                    | ColumnScoring::LocalScaling { .. }
                    | ColumnScoring::Nicdm { .. } => {
                        for (i, row_states) in strip_states.chunks_mut(nm).enumerate() {
                            let scores = &tile[i * ld..i * ld + nc];
                            scan_transformed(scores, &scoring, col0, &mut row_states[m]);
                        }
                    }
                }
                for (i, row_states) in strip_states.chunks_mut(nm).enumerate() {
                    let scores = &tile[i * ld..i * ld + nc];
                    let positives = self.positives.of(q0 + i);
                    exclude_positives(scores, &scoring, col0, positives, &mut row_states[m]);
                }
            }
            c0 = c1;
        }
    }
}

/// The ground truth is not counted against itself: undo the counts of the
/// positive columns that fall in this tile.
fn exclude_positives(
    scores: &[f32],
    scoring: &ColumnScoring<'_>,
    col0: u32,
    positives: &[u32],
    state: &mut QueryState,
) {
    if state.target.is_nan() {
        return;
    }
    for &p in positives {
        if p >= col0 && ((p - col0) as usize) < scores.len() {
            let j = (p - col0) as usize;
            match compare_to_target(scoring.score(j, scores[j]), scores[j], scoring, state) {
                std::cmp::Ordering::Greater => state.greater -= 1,
                std::cmp::Ordering::Equal => state.equal -= 1,
                std::cmp::Ordering::Less => {}
            }
        }
    }
}

/// How a candidate (score `v`, raw similarity `s`) compares with the query's
/// ground truth under `scoring`'s order.
#[inline]
fn compare_to_target(
    v: f32,
    s: f32,
    scoring: &ColumnScoring<'_>,
    state: &QueryState,
) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let by_score = v.partial_cmp(&state.target).unwrap_or(Ordering::Less);
    match (scoring, by_score) {
        (ColumnScoring::BankRank { .. }, Ordering::Equal) => {
            s.partial_cmp(&state.target_raw).unwrap_or(Ordering::Less)
        }
        _ => by_score,
    }
}

/// A scan for scorings that are not a vectorisable subtraction (`dsl`,
/// `ls`, `nicdm`):
/// each score computed by [`ColumnScoring::score`], columns in increasing
/// order so the strict threshold prefilter keeps ties by row.
fn scan_transformed(
    scores: &[f32],
    scoring: &ColumnScoring<'_>,
    col0: u32,
    state: &mut QueryState,
) {
    let counting = !state.target.is_nan();
    for (j, &s) in scores.iter().enumerate() {
        let v = scoring.score(j, s);
        if counting {
            state.greater += (v > state.target) as u64;
            state.equal += (v == state.target) as u64;
        }
        if v > state.top.threshold() {
            state.top.push(Candidate {
                score: v,
                raw: s,
                row: col0 + j as u32,
            });
        }
    }
}

/// The `gc` scan of a tile for scoring `m` of `nm`: a binary search per
/// (query, column) for the number of bank similarities above s. Column by
/// column, so each column's sorted similarities stay in cache for every
/// query of the strip. Not vectorised: `gc` is the small-bank method.
#[allow(clippy::too_many_arguments)] // the tile's shape, and the state slots
fn scan_bank_rank(
    tile: &[f32],
    stride: usize,
    nc: usize,
    scoring: &ColumnScoring<'_>,
    col0: u32,
    strip_states: &mut [QueryState],
    m: usize,
    nm: usize,
) {
    for j in 0..nc {
        for (i, row_states) in strip_states.chunks_mut(nm).enumerate() {
            let state = &mut row_states[m];
            let s = tile[i * stride + j];
            let v = scoring.score(j, s);
            if !state.target.is_nan() {
                match compare_to_target(v, s, scoring, state) {
                    std::cmp::Ordering::Greater => state.greater += 1,
                    std::cmp::Ordering::Equal => state.equal += 1,
                    std::cmp::Ordering::Less => {}
                }
            }
            // Equal scores may still win on the raw similarity: `push` decides.
            if v >= state.top.threshold() {
                state.top.push(Candidate {
                    score: v,
                    raw: s,
                    row: col0 + j as u32,
                });
            }
        }
    }
}

/// The epilogue bodies, written so that the compiler vectorises them; the
/// `dispatch` module compiles them twice (baseline and AVX-512).
pub(super) mod bodies {
    use super::*;

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

    #[inline(always)]
    pub fn scan_row(scores: &[f32], h: &[f32], col0: u32, state: &mut QueryState) {
        let target = state.target;
        if !target.is_nan() {
            let (greater, equal) = count_against_target(scores, h, target);
            state.greater += greater;
            state.equal += equal;
        }
        offer_row(scores, h, col0, state);
    }

    /// How many of the row's scores `s − h` are above and equal to `target`.
    /// A plain reduction loop of its own, which LLVM vectorises with the
    /// counters in registers (the scan: 3.8% of a 10k × 100k search's
    /// samples). Counted inside the top-k loop, which may call `push`, the
    /// lanes were compared one by one (9.9%), or with per-lane counter arrays
    /// spilled to the stack (6.5%); per-lane arrays in a loop of their own were
    /// vectorised across chunks with gathers (15.8%).
    #[inline(always)]
    fn count_against_target(scores: &[f32], h: &[f32], target: f32) -> (u64, u64) {
        let (mut greater, mut equal) = (0u32, 0u32);
        for (s, c) in scores.iter().zip(h) {
            let v = s - c;
            greater += (v > target) as u32;
            equal += (v == target) as u32;
        }
        // A row is at most one tile wide (TILE_COLS): u32 cannot overflow.
        (greater as u64, equal as u64)
    }

    /// Offers the row's scores `s − h` above the current threshold to the
    /// query's top-k, in column order.
    #[inline(always)]
    fn offer_row(scores: &[f32], h: &[f32], col0: u32, state: &mut QueryState) {
        let mut threshold = state.top.threshold();
        let n = scores.len();
        let full = n - n % LANES;
        let mut j0 = 0;
        while j0 < full {
            let s: &[f32; LANES] = scores[j0..j0 + LANES].try_into().unwrap();
            let c: &[f32; LANES] = h[j0..j0 + LANES].try_into().unwrap();
            let mut v = [0f32; LANES];
            let mut any = false;
            for l in 0..LANES {
                v[l] = s[l] - c[l];
                any |= v[l] > threshold;
            }
            if any {
                for l in 0..LANES {
                    if v[l] > threshold {
                        state.top.push(Candidate {
                            score: v[l],
                            raw: s[l],
                            row: col0 + (j0 + l) as u32,
                        });
                        threshold = state.top.threshold();
                    }
                }
            }
            j0 += LANES;
        }
        for j in full..n {
            let v = scores[j] - h[j];
            if v > threshold {
                state.top.push(Candidate {
                    score: v,
                    raw: scores[j],
                    row: col0 + j as u32,
                });
                threshold = state.top.threshold();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    #[test]
    fn strips_cover_the_columns_in_balanced_blocks() {
        for (columns, threads) in [
            (100_000, 2),
            (25_000, 2),
            (1_000_000, 2),
            (7_777, 3),
            (100, 2),
            (1, 2),
            (5_000, 1),
        ] {
            let bounds = strip_bounds(columns, threads);
            let strips = bounds.len() - 1;
            assert_eq!((bounds[0], bounds[strips]), (0, columns));
            for w in bounds.windows(2) {
                assert!(
                    w[0] < w[1] && w[1] - w[0] <= BANK_TILE_COLS,
                    "{columns}: {w:?}"
                );
                assert_eq!(w[0] % FOLD_COLUMNS, 0);
            }
            if columns >= threads * FOLD_COLUMNS * 8 {
                assert_eq!(
                    strips % threads,
                    0,
                    "{columns} columns on {threads} threads"
                );
            }
        }
        // 49 strips of 2048 columns before; now an even count.
        assert_eq!(strip_bounds(100_000, 2).len() - 1, 224);
    }

    #[test]
    fn column_lse_bits_do_not_depend_on_the_fold_block() {
        // Of 147 columns, 128..144 are folded as one vector and 144..147 one
        // by one (the tail after two 64-column blocks); starting the columns
        // at 19 puts them all in full blocks.
        let (nr, nc, dim) = (GROUP_ROWS + 9, 147, 7);
        let a = pseudo_random(nr * dim, 3);
        let b = pseudo_random(nc * dim, 4);
        let betas = [20.0f32];
        let mut all = vec![LogSumExp::default(); nc];
        column_log_sum_exp(Rows::new(&a, dim), Rows::new(&b, dim), &betas, &mut all);
        let mut shifted = vec![LogSumExp::default(); nc - 19];
        let b_from_19 = &b[19 * dim..];
        column_log_sum_exp(
            Rows::new(&a, dim),
            Rows::new(b_from_19, dim),
            &betas,
            &mut shifted,
        );
        assert_eq!(&all[19..], &shifted[..]);
    }

    #[test]
    fn column_lse_matches_direct_sum_across_tile_edges() {
        let dim = 5;
        let (nr, nc) = (BANK_TILE_ROWS + 3, 2 * BANK_TILE_COLS + 17);
        let a = pseudo_random(nr * dim, 1);
        let b = pseudo_random(nc * dim, 2);
        let betas = [1.0f32, 20.0];
        let mut states = vec![LogSumExp::default(); nc * 2];
        column_log_sum_exp(Rows::new(&a, dim), Rows::new(&b, dim), &betas, &mut states);
        for j in [0, 1, 63, 64, 383, 384, 447, 448, 511, 512, nc - 1] {
            for (bi, &beta) in betas.iter().enumerate() {
                let mut direct = LogSumExp::default();
                for i in 0..nr {
                    let s: f64 = (0..dim)
                        .map(|d| a[i * dim + d] as f64 * b[j * dim + d] as f64)
                        .sum();
                    direct.push(beta as f64 * s);
                }
                let got = states[j * 2 + bi].value();
                assert!(
                    (got - direct.value()).abs() < 1e-5,
                    "col {j} β {beta}: {got} vs {}",
                    direct.value()
                );
            }
        }
    }
}
