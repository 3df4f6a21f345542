//! Pass 2's tile driver ([`search_block`]): one GEMM tile of queries ×
//! gallery columns at a time, consumed while it is still in cache. For each
//! row (query) and each scoring method: the top-k of the scores (s − h(col),
//! or another [`ColumnScoring`]), and the counts needed for the full-gallery
//! rank of the query's ground truth.
//!
//! rayon runs one strip of tiles per task and each task owns the state it
//! updates, so results do not depend on the thread count. Tile and block
//! boundaries are aligned to the tile shape by the callers, so results do not
//! depend on the memory limit either.
//!
//! Before touching the epilogues, run `cargo bench --bench kernel`.

use rayon::prelude::*;

use super::dispatch::dispatched;
use super::gemm::{similarity_tile, slab_depth, SlabTiles};
use super::normal::log_normal_cdf;
use super::screen::{Screen, ScreenCounts, StripScreen};
use super::tile::{Rows, TileBuffer, LANES, SLAB_COLS, SLAB_ROWS, TILE_COLS, TILE_ROWS};
use super::topk::{Candidate, TieBreak, TopK};

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

/// The Gaussian of one query's similarities (`mp`): their mean over the
/// gallery bank (or the gallery), and one over their standard deviation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryGaussian {
    pub mean: f64,
    pub inv_std: f64,
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
    /// Gaussian mutual proximity (`mp`): the sum of log Φ((s − `mean[j]`)·
    /// `inv_std[j]`) and log Φ((s − μ(q))/σ(q)), the query's Gaussian the
    /// first of `queries` (see [`ColumnScoring::for_query`]). Computed in f64.
    MutualProximity {
        mean: &'a [f64],
        inv_std: &'a [f64],
        queries: &'a [QueryGaussian],
    },
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
            ColumnScoring::MutualProximity {
                mean,
                inv_std,
                queries,
            } => ColumnScoring::MutualProximity {
                mean: &mean[start..end],
                inv_std: &inv_std[start..end],
                queries,
            },
        }
    }

    /// The scoring with the per-query parameters of a block of queries
    /// (`mp`'s Gaussians, one per query row); other scorings have none.
    pub fn with_queries(self, gaussians: &'a [QueryGaussian]) -> ColumnScoring<'a> {
        match self {
            ColumnScoring::MutualProximity { mean, inv_std, .. } => {
                ColumnScoring::MutualProximity {
                    mean,
                    inv_std,
                    queries: gaussians,
                }
            }
            other => other,
        }
    }

    /// The scoring of query row `i` of the block (its per-query parameters
    /// first); the same scoring when it has none.
    #[inline]
    pub fn for_query(&self, i: usize) -> ColumnScoring<'a> {
        match *self {
            ColumnScoring::MutualProximity {
                mean,
                inv_std,
                queries,
            } => ColumnScoring::MutualProximity {
                mean,
                inv_std,
                queries: &queries[i..i + 1],
            },
            other => other,
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
            ColumnScoring::MutualProximity { mean, .. } => mean.len(),
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
            ColumnScoring::MutualProximity {
                mean,
                inv_std,
                queries,
            } => {
                let (s, q) = (s as f64, queries[0]);
                (log_normal_cdf((s - mean[j]) * inv_std[j])
                    + log_normal_cdf((s - q.mean) * q.inv_std)) as f32
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
    search_block_screened(
        queries,
        gallery,
        first_row,
        corrections,
        positives,
        states,
        None,
    );
}

/// [`search_block`], screening the tiles with `screen` (of these
/// `queries` and `gallery` rows; `None`: exact) where every scoring
/// allows it ([`super::screen::screenable`]): the same states, with what
/// the screen did.
pub fn search_block_screened(
    queries: Rows<'_>,
    gallery: Rows<'_>,
    first_row: u32,
    corrections: &[ColumnScoring<'_>],
    positives: &Positives,
    states: &mut [QueryState],
    screen: Option<Screen<'_>>,
) -> ScreenCounts {
    let screen = screen.filter(|_| super::screen::screenable(corrections));
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
        return ScreenCounts::default();
    }
    let counts = std::sync::Mutex::new(ScreenCounts::default());
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
                    screen,
                    counts: &counts,
                };
                ctx.run(strip * TILE_ROWS, 0..gallery.rows, strip_states);
            });
        return counts.into_inner().expect("no task panicked");
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
                screen,
                counts: &counts,
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
    counts.into_inner().expect("no task panicked")
}

/// The inputs of one strip search (a helper of [`search_block`]).
struct StripSearch<'a> {
    queries: Rows<'a>,
    gallery: Rows<'a>,
    first_row: u32,
    corrections: &'a [ColumnScoring<'a>],
    positives: &'a Positives,
    /// The bf16 screen, when the search is screened.
    screen: Option<Screen<'a>>,
    counts: &'a std::sync::Mutex<ScreenCounts>,
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
        // Packing a piece's columns pays off over a slab's rows; a strip of a
        // few queries goes to `similarity_tile`, which reads them in place.
        let mut slabs = SlabTiles::new().filter(|_| q1 - q0 >= SLAB_ROWS);
        // No screen where the re-score cannot give the exact tiles' bits.
        let mut screen = self.screen.and_then(|screen| {
            let k = strip_states.iter().map(|s| s.top.k()).max().unwrap_or(0);
            StripScreen::new(
                screen,
                queries,
                gallery,
                (q0, q1),
                self.first_row,
                self.corrections,
                self.positives,
                k,
            )
        });
        while c0 < columns.end {
            let c1 = (c0 + TILE_COLS).min(columns.end);
            let nc = c1 - c0;
            let tile = &mut buffer.cells_mut()[..(q1 - q0) * ld];
            if let Some(screen) = screen.as_mut() {
                screen.tile((c0, c1), strip_states, tile, ld);
                c0 = c1;
                continue;
            }
            let depth = slabs.as_ref().and_then(|_| slab_depth(gallery.dim));
            if let (Some(slabs), Some(kc)) = (slabs.as_mut(), depth) {
                // Pieces of the tile that stay in L2 while they are scanned;
                // each query still sees its columns in increasing order.
                for p0 in (c0..c1).step_by(SLAB_COLS) {
                    let p1 = (p0 + SLAB_COLS).min(c1);
                    let piece = &gallery.data[p0 * gallery.dim..p1 * gallery.dim];
                    slabs.pack_columns(piece, p1 - p0, gallery.dim);
                    for g0 in (q0..q1).step_by(SLAB_ROWS) {
                        let g1 = (g0 + SLAB_ROWS).min(q1);
                        let slab = &mut tile[..(g1 - g0) * ld];
                        let rows = &queries.data[g0 * queries.dim..g1 * queries.dim];
                        slabs.slab(slab, ld, rows, g1 - g0, kc);
                        let states = &mut strip_states[(g0 - q0) * nm..(g1 - q0) * nm];
                        self.scan(slab, ld, g0, (p0, p1), states);
                    }
                }
            } else {
                similarity_tile(
                    tile,
                    ld,
                    &queries.data[q0 * queries.dim..q1 * queries.dim],
                    q1 - q0,
                    &gallery.data[c0 * gallery.dim..c1 * gallery.dim],
                    nc,
                    gallery.dim,
                );
                self.scan(tile, ld, q0, (c0, c1), strip_states);
            }
            c0 = c1;
        }
        if let Some(mut screen) = screen {
            screen.finish(strip_states);
            self.counts
                .lock()
                .expect("no task panicked")
                .add(screen.counts);
        }
    }
}

impl StripSearch<'_> {
    /// Offers the similarities of queries `q0..` (`tile`, rows `ld` apart,
    /// one per state row of `states`) × gallery columns `c0..c1` (block
    /// positions) to every scoring's states.
    fn scan(
        &self,
        tile: &[f32],
        ld: usize,
        q0: usize,
        (c0, c1): (usize, usize),
        states: &mut [QueryState],
    ) {
        let nm = self.corrections.len();
        let nc = c1 - c0;
        let col0 = self.first_row + c0 as u32;
        for (m, scoring) in self.corrections.iter().enumerate() {
            let scoring = scoring.columns(c0, c1);
            match scoring {
                ColumnScoring::Subtract(h) => {
                    for (i, row_states) in states.chunks_mut(nm).enumerate() {
                        let scores = &tile[i * ld..i * ld + nc];
                        scan_row(scores, h, col0, &mut row_states[m]);
                    }
                }
                ColumnScoring::BankRank { .. } => {
                    scan_bank_rank(tile, ld, nc, &scoring, col0, states, m, nm)
                }
                ColumnScoring::DualSoftmax { .. }
                | ColumnScoring::LocalScaling { .. }
                | ColumnScoring::Nicdm { .. }
                | ColumnScoring::MutualProximity { .. } => {
                    for (i, row_states) in states.chunks_mut(nm).enumerate() {
                        let scores = &tile[i * ld..i * ld + nc];
                        let scoring = scoring.for_query(q0 + i);
                        scan_transformed(scores, &scoring, col0, &mut row_states[m]);
                    }
                }
            }
            for (i, row_states) in states.chunks_mut(nm).enumerate() {
                let scores = &tile[i * ld..i * ld + nc];
                let positives = self.positives.of(q0 + i);
                let scoring = scoring.for_query(q0 + i);
                exclude_positives(scores, &scoring, col0, positives, &mut row_states[m]);
            }
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
pub(super) fn compare_to_target(
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
/// `ls`, `nicdm`, `mp`):
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

/// The epilogue bodies, written so that the compiler vectorises them;
/// [`dispatched!`] compiles them for each instruction set.
mod bodies {
    use super::*;

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

dispatched! {
    pub(super) fn scan_row(scores: &[f32], h: &[f32], col0: u32, state: &mut QueryState)
        = bodies::scan_row;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::test_values::pseudo_random;

    /// The exact search from slabs (pieces of 128 queries × 512 columns,
    /// on AVX-512) leaves every state as whole `gemm` crate tiles scanned
    /// in one piece do: the same lists in the same order, the same counts
    /// against the ground truth, across strip, tile, piece and slab edges.
    #[test]
    #[allow(clippy::print_stderr)] // says what the test compares
    fn search_from_slabs_is_that_of_whole_tiles() {
        if SlabTiles::new().is_none() {
            eprintln!("no AVX-512 here: both sides are the crate's tiles");
        }
        let (nq, ng, dim) = (TILE_ROWS + SLAB_ROWS + 37, TILE_COLS + SLAB_COLS + 99, 385);
        let queries = pseudo_random(nq * dim, 1);
        let gallery = pseudo_random(ng * dim, 2);
        let h: Vec<f32> = pseudo_random(ng, 3).iter().map(|x| x * 0.1).collect();
        let zeros = vec![0f32; ng];
        let corrections = [ColumnScoring::Subtract(&h), ColumnScoring::Subtract(&zeros)];
        let nm = corrections.len();
        let positives =
            Positives::from_lists((0..nq).map(|q| vec![(q * 7 % ng) as u32, (q * 13 % ng) as u32]));
        let (queries, gallery) = (Rows::new(&queries, dim), Rows::new(&gallery, dim));
        let first_row = 1000;
        let fresh = || -> Vec<QueryState> {
            (0..nq * nm)
                .map(|i| QueryState::new(10, (i % 3 != 0).then_some(0.05 * (i % 5) as f32)))
                .collect()
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let mut got = fresh();
        pool.install(|| {
            search_block(
                queries,
                gallery,
                first_row,
                &corrections,
                &positives,
                &mut got,
            )
        });

        let mut expected = fresh();
        let counts = std::sync::Mutex::new(ScreenCounts::default());
        let ctx = StripSearch {
            queries,
            gallery,
            first_row,
            corrections: &corrections,
            positives: &positives,
            screen: None,
            counts: &counts,
        };
        for q0 in (0..nq).step_by(TILE_ROWS) {
            let q1 = (q0 + TILE_ROWS).min(nq);
            let mut buffer = TileBuffer::new(q1 - q0, TILE_COLS);
            let ld = buffer.stride;
            for c0 in (0..ng).step_by(TILE_COLS) {
                let c1 = (c0 + TILE_COLS).min(ng);
                let tile = &mut buffer.cells_mut()[..(q1 - q0) * ld];
                let rows = &queries.data[q0 * dim..q1 * dim];
                let cols = &gallery.data[c0 * dim..c1 * dim];
                similarity_tile(tile, ld, rows, q1 - q0, cols, c1 - c0, dim);
                ctx.scan(tile, ld, q0, (c0, c1), &mut expected[q0 * nm..q1 * nm]);
            }
        }

        let summary = |states: &[QueryState]| -> Vec<_> {
            states
                .iter()
                .map(|s| {
                    let top: Vec<_> = s
                        .top
                        .sorted()
                        .iter()
                        .map(|c| (c.score.to_bits(), c.row))
                        .collect();
                    (top, s.greater, s.equal)
                })
                .collect()
        };
        assert_eq!(summary(&got), summary(&expected));
        assert!(expected.iter().any(|s| s.greater > 0 && s.equal == 0));
    }
}
