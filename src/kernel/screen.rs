//! Pass 2's screened tiles (`--precision screened`): a tile's similarities
//! from the bf16 screen ([`super::bf16`]), each known to within its bound;
//! only the items whose interval reaches a query's top-k (or straddles its
//! ground truth's score) are re-scored in f32, with the bits the f32 tile
//! would have had ([`super::gemm::TileScorer`]). The states come out as the
//! exact search's: the same lists, scores and counts. docs/precision.md
//! gives the argument.
//!
//! Per row and scoring, one vectorised pass over the tile compares the
//! screened corrected scores with floors derived from the bound: above the
//! top-k floor an item is a candidate, near the ground truth's score it is
//! ambiguous, well above it it is counted. The candidates of every scoring
//! of a row are re-scored together, in interleaved chains.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::bf16::{
    pack_gallery_panels_into, pack_query_rows_into, packed_finite, screen_packed, RowNorms,
    ScreenBound, PANEL,
};
use super::gemm::TileScorer;
use super::search::{compare_to_target, ColumnScoring, Positives, QueryState};
use super::tile::Rows;
use super::topk::Candidate;

/// Which operand of the screen a [`ScreenedRows`] was packed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Queries,
    Gallery,
}

/// One operand of a screened search: bf16 copies of a block's rows,
/// packed for the kernel, and the rows' norms for the bound.
#[derive(Debug, Clone)]
pub struct ScreenedRows {
    packed: Vec<u32>,
    norms: Vec<RowNorms>,
    dim: usize,
    side: Side,
}

impl ScreenedRows {
    /// A query block's copy, or `None` when a value does not fit bf16's
    /// range (the block is then searched in f32 only).
    pub fn queries(rows: Rows<'_>) -> Option<ScreenedRows> {
        Self::queries_reusing(rows, None)
    }

    /// A gallery block's copy, or `None` as for [`ScreenedRows::queries`].
    pub fn gallery(rows: Rows<'_>) -> Option<ScreenedRows> {
        Self::gallery_reusing(rows, None)
    }

    /// [`ScreenedRows::queries`] in the buffers of `used`, a copy no
    /// longer needed (of any side and size).
    pub fn queries_reusing(rows: Rows<'_>, used: Option<ScreenedRows>) -> Option<ScreenedRows> {
        let mut buffers = used.map(|u| (u.packed, u.norms)).unwrap_or_default();
        pack_query_rows_into(rows.data, rows.dim, &mut buffers);
        Self::prepare(rows, Side::Queries, buffers)
    }

    /// [`ScreenedRows::gallery`] in the buffers of `used`, as
    /// [`ScreenedRows::queries_reusing`].
    pub fn gallery_reusing(rows: Rows<'_>, used: Option<ScreenedRows>) -> Option<ScreenedRows> {
        let mut buffers = used.map(|u| (u.packed, u.norms)).unwrap_or_default();
        pack_gallery_panels_into(rows.data, rows.dim, &mut buffers);
        Self::prepare(rows, Side::Gallery, buffers)
    }

    fn prepare(
        rows: Rows<'_>,
        side: Side,
        (packed, norms): (Vec<u32>, Vec<RowNorms>),
    ) -> Option<ScreenedRows> {
        packed_finite(&packed).then_some(ScreenedRows {
            packed,
            norms,
            dim: rows.dim,
            side,
        })
    }

    /// Bytes a copy holds per row of `dim` values (the gallery's panels
    /// round its rows up to a multiple of 16).
    pub fn bytes_per_row(dim: usize) -> usize {
        dim.div_ceil(2) * 4 + std::mem::size_of::<RowNorms>()
    }
}

/// The screen of one query block against one gallery block.
#[derive(Debug, Clone, Copy)]
pub struct Screen<'a> {
    queries: &'a ScreenedRows,
    gallery: &'a ScreenedRows,
    bound: ScreenBound,
}

impl<'a> Screen<'a> {
    /// (query rows, gallery rows, dimension) of the blocks it screens.
    pub fn shape(&self) -> (usize, usize, usize) {
        let rows = |side: &ScreenedRows| side.norms.len();
        (rows(self.queries), rows(self.gallery), self.queries.dim)
    }

    /// # Panics
    /// When the operands were not packed as queries and gallery, or their
    /// dimensions differ.
    pub fn new(queries: &'a ScreenedRows, gallery: &'a ScreenedRows) -> Screen<'a> {
        assert!(
            queries.side == Side::Queries && gallery.side == Side::Gallery,
            "screen operands packed for the other side"
        );
        assert_eq!(queries.dim, gallery.dim, "dimension mismatch");
        Screen {
            queries,
            gallery,
            bound: ScreenBound::new(queries.dim),
        }
    }
}

impl Screen<'_> {
    /// Pass 1's screened tile: the similarities of the query block's rows
    /// `r0..r1` with the gallery block's columns `c0..c1` (`c0` on a
    /// panel) into `tile` (stride `ld`), and a bound on |screened − f32|
    /// that holds for every one of them (each norm at its largest over the
    /// tile's rows and columns).
    pub(super) fn column_tile(
        &self,
        (r0, r1): (usize, usize),
        (c0, c1): (usize, usize),
        tile: &mut [f32],
        ld: usize,
    ) -> f64 {
        assert_eq!(c0 % PANEL, 0, "tiles start on a panel");
        let (dim, pairs) = (self.queries.dim, self.queries.dim.div_ceil(2));
        screen_packed(
            tile,
            ld,
            &self.queries.packed[r0 * pairs..r1 * pairs],
            r1 - r0,
            &self.gallery.packed[c0 * pairs..],
            c1 - c0,
            dim,
        );
        self.bound.of(
            &RowNorms::max_of(&self.queries.norms[r0..r1]),
            &RowNorms::max_of(&self.gallery.norms[c0..c1]),
        )
    }
}

/// The largest f32 `f` such that a screened value `s̃ ≤ f` proves, by the
/// screen's `bound`, that the f32 value `s` it screens is at most
/// `threshold` (`s ≤ s̃ + bound`); room for this f64 arithmetic.
pub(super) fn floor_below(threshold: f32, bound: f64) -> f32 {
    if threshold == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let t = threshold as f64;
    round_down(t - bound - (t.abs() + bound) * 2f64.powi(-50))
}

/// What a screened search did: the (query, item) pairs it screened and
/// those it re-scored in f32.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScreenCounts {
    pub screened: u64,
    pub rescored: u64,
}

impl ScreenCounts {
    pub fn add(&mut self, other: ScreenCounts) {
        self.screened += other.screened;
        self.rescored += other.rescored;
    }

    /// The counts added since `earlier`, a running total's value before.
    pub fn since(self, earlier: ScreenCounts) -> ScreenCounts {
        ScreenCounts {
            screened: self.screened - earlier.screened,
            rescored: self.rescored - earlier.rescored,
        }
    }
}

/// Whether a search with these scorings can be screened: every one a
/// subtraction s − h(j), whose order the screen's intervals carry over.
pub fn screenable(corrections: &[ColumnScoring<'_>]) -> bool {
    corrections.len() <= MAX_SCORINGS
        && corrections
            .iter()
            .all(|c| matches!(c, ColumnScoring::Subtract(_)))
}

/// Where a row's screened scores c̃ = s̃ − h are compared: above `top`, an
/// item may enter the top-k; above `greater`, it is certainly above the
/// ground truth's score; at least `ambiguous` and not above `greater`, it
/// must be re-scored to be counted.
#[derive(Debug, Clone, Copy)]
struct Floors {
    top: f32,
    greater: f32,
    ambiguous: f32,
}

/// An item of a query's top-k that the screen could not rule out, not yet
/// re-scored: its corrected score lies in `[lower, upper]`.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    lower: f32,
    upper: f32,
    /// The block's column.
    column: u32,
}

/// An undecided (query, column) pair to re-score, and how.
#[derive(Debug, Clone, Copy)]
struct Undecided {
    /// The strip's row.
    row: u32,
    /// The block's column.
    column: u32,
    /// The scorings whose top-k it is offered to (bit k: scoring k).
    scorings: u64,
}

/// Scorings a screened search handles at most (one bit each in
/// [`Undecided::scorings`]); searches with more run exact.
const MAX_SCORINGS: usize = 64;

/// The top-k candidates of each (row, scoring) of a strip, kept across its
/// tiles: re-scored only when the strip ends or a pool fills, by which
/// time the k-th best lower end has ruled most of them out. Deferring
/// costs nothing in exactness: [`super::topk::TopK::push`] orders equal
/// scores by row whatever the order of the pushes.
#[derive(Debug, Default)]
struct Pools {
    /// Entries per pool.
    capacity: usize,
    entries: Vec<Pending>,
    len: Vec<usize>,
    /// A lower bound on each pool's k-th best score (−∞: none yet).
    floor: Vec<f32>,
}

/// Pending candidates a strip keeps at most, over all its pools (1.5 MiB).
const POOL_ENTRIES: usize = 1 << 17;

/// Undecided pairs for the ground truth's counts that a strip collects
/// before it re-scores them (a tile's rows are taken in groups that fill
/// it, plus one row's).
const RESCORE_PAIRS: usize = 1 << 13;

/// Bytes a strip's screen holds besides its tile: the pools, the
/// undecided pairs (the limit plus one row's, as a list entry, a pair and
/// an f32 each) and per row and scoring the lists' spans.
pub fn strip_scratch_bytes(rows: usize, columns: usize, scorings: usize) -> usize {
    let pools = POOL_ENTRIES.max(rows * scorings * MIN_POOL) * std::mem::size_of::<Pending>()
        + rows * scorings * 12;
    let pairs = (RESCORE_PAIRS + 2 * columns * scorings) * (4 + 16);
    pools + pairs + rows * scorings * std::mem::size_of::<std::ops::Range<usize>>() + columns * 4
}

/// The smallest pool: room to prune a few candidates at a time.
const MIN_POOL: usize = 16;

/// The screen of one strip of queries (`q0..q1` of the block) against the
/// block's gallery, tile after tile ([`StripScreen::tile`]), then
/// [`StripScreen::finish`].
pub(super) struct StripScreen<'a> {
    screen: Screen<'a>,
    queries: Rows<'a>,
    gallery: Rows<'a>,
    q0: usize,
    q1: usize,
    /// The gallery row of the block's first column.
    first_row: u32,
    corrections: &'a [ColumnScoring<'a>],
    positives: &'a Positives,
    /// The re-scorer, with the exact tiles' bits.
    scorer: TileScorer,
    pools: Pools,
    /// The ambiguous columns of each (row, scoring), one after the other,
    /// and where each lies.
    ambiguous: Vec<u32>,
    lists: Vec<std::ops::Range<usize>>,
    /// The ambiguous pairs to re-score and their f32 similarities.
    undecided: Vec<Undecided>,
    exact: Vec<f32>,
    /// The same for the candidates of pools being decided.
    deciding: Vec<Undecided>,
    decided: Vec<f32>,
    /// A row's candidates from the filter.
    candidates: Vec<u32>,
    /// The k largest screened scores of a row (for a pool's first tile).
    largest: BinaryHeap<Reverse<u32>>,
    pub(super) counts: ScreenCounts,
}

impl<'a> StripScreen<'a> {
    #[allow(clippy::too_many_arguments)] // the strip's place and inputs
    pub(super) fn new(
        screen: Screen<'a>,
        queries: Rows<'a>,
        gallery: Rows<'a>,
        (q0, q1): (usize, usize),
        first_row: u32,
        corrections: &'a [ColumnScoring<'a>],
        positives: &'a Positives,
        k: usize,
    ) -> Option<StripScreen<'a>> {
        let scorer = TileScorer::new(queries.dim)?;
        let pools = (q1 - q0) * corrections.len();
        // Room for the k best and the band around them, so that a pool is
        // decided rarely before the strip ends.
        let capacity = (4 * k + 256).min(POOL_ENTRIES / pools.max(1)).max(MIN_POOL);
        Some(StripScreen {
            screen,
            queries,
            gallery,
            q0,
            q1,
            first_row,
            corrections,
            positives,
            scorer,
            pools: Pools {
                capacity,
                entries: vec![Pending::default(); pools * capacity],
                len: vec![0; pools],
                floor: vec![f32::NEG_INFINITY; pools],
            },
            ambiguous: Vec::new(),
            lists: Vec::new(),
            undecided: Vec::new(),
            exact: Vec::new(),
            deciding: Vec::new(),
            decided: Vec::new(),
            candidates: Vec::new(),
            largest: BinaryHeap::new(),
            counts: ScreenCounts::default(),
        })
    }

    fn corrections_of(&self, k: usize, (c0, c1): (usize, usize)) -> &'a [f32] {
        match self.corrections[k].columns(c0, c1) {
            ColumnScoring::Subtract(h) => h,
            _ => unreachable!("screenable() holds"),
        }
    }

    /// Screens the strip's tile of block columns `c0..c1` (`c0` on a
    /// panel); `tile` (stride `ld`) is scratch for the screened values.
    pub(super) fn tile(
        &mut self,
        (c0, c1): (usize, usize),
        states: &mut [QueryState],
        tile: &mut [f32],
        ld: usize,
    ) {
        let (m, nc, dim) = (self.q1 - self.q0, c1 - c0, self.queries.dim);
        assert_eq!(c0 % PANEL, 0, "tiles start on a panel");
        let pairs = dim.div_ceil(2);
        screen_packed(
            tile,
            ld,
            &self.screen.queries.packed[self.q0 * pairs..self.q1 * pairs],
            m,
            &self.screen.gallery.packed[c0 * pairs..],
            nc,
            dim,
        );
        let nm = self.corrections.len();
        // One bound for the whole tile: each norm at its largest over the columns.
        let gallery_norms = RowNorms::max_of(&self.screen.gallery.norms[c0..c1]);
        let h_max: Vec<f64> = (0..nm)
            .map(|k| {
                let h = self.corrections_of(k, (c0, c1));
                h.iter().fold(0f64, |a, &v| a.max(v.abs() as f64))
            })
            .collect();
        // Rows in groups whose ambiguous pairs fill the scratch at most (plus
        // one row's), so that its size does not depend on the data.
        let mut start = 0;
        while start < m {
            self.ambiguous.clear();
            self.lists.clear();
            self.undecided.clear();
            let mut end = start;
            while end < m && self.undecided.len() < RESCORE_PAIRS {
                let i = end;
                end += 1;
                let screened = &tile[i * ld..i * ld + nc];
                let query_norms = &self.screen.queries.norms[self.q0 + i];
                let e = self.screen.bound.of(query_norms, &gallery_norms);
                // |s| ≤ ‖q‖‖g‖, so |s̃| ≤ that + e.
                let s_max = query_norms.norm * gallery_norms.norm;
                let first = self.undecided.len();
                for (k, &h_max) in h_max.iter().enumerate() {
                    let h = self.corrections_of(k, (c0, c1));
                    let pool = i * nm + k;
                    let k_best = states[pool].top.k();
                    // c = fl(s − h) and c̃ = fl(s̃ − h) differ by at most e plus
                    // both roundings (2⁻²⁴ of |s| + |h| each), with room for
                    // this f64.
                    let slack = e + (s_max + 2.0 * e + h_max) * 2f64.powi(-22) + 1e-37;
                    if self.pools.floor[pool] == f32::NEG_INFINITY
                        && states[pool].top.len() < k_best
                        && k_best <= nc
                    {
                        // The pool's first tile: the k-th largest c̃ minus the
                        // slack is at most the k-th largest c.
                        let kth = kth_largest(screened, h, k_best, &mut self.largest);
                        self.pools.floor[pool] = round_down(kth as f64 - slack);
                    }
                    let state = &mut states[pool];
                    let floors = floors(state, self.pools.floor[pool], slack);
                    let a_start = self.ambiguous.len();
                    self.candidates.clear();
                    state.greater += filter_row(
                        screened,
                        h,
                        floors,
                        &mut self.candidates,
                        &mut self.ambiguous,
                    );
                    self.lists.push(a_start..self.ambiguous.len());
                    for &j in &self.ambiguous[a_start..] {
                        self.undecided.push(Undecided {
                            row: i as u32,
                            column: (c0 + j as usize) as u32,
                            scorings: 0,
                        });
                    }
                    for at in 0..self.candidates.len() {
                        let j = self.candidates[at] as usize;
                        let v = (screened[j] - h[j]) as f64;
                        let entry = Pending {
                            lower: round_down(v - slack),
                            upper: round_up(v + slack),
                            column: (c0 + j) as u32,
                        };
                        if !self.pools.add(pool, entry, k_best) {
                            // Full of candidates that it cannot rule out: decide them.
                            self.decide_pool(i, k, states);
                            self.pools.add(pool, entry, k_best);
                        }
                    }
                }
                if nm > 1 {
                    let row_pairs = &mut self.undecided[first..];
                    row_pairs.sort_unstable_by_key(|u| u.column);
                    let unique = dedup_sorted_by_key(row_pairs, |u| u.column);
                    self.undecided.truncate(first + unique);
                }
            }
            let mut exact = std::mem::take(&mut self.exact);
            rescore(self, &self.undecided, &mut exact);
            self.exact = exact;
            self.counts.rescored += self.undecided.len() as u64;
            // The ambiguous pairs counted, and the ground truth taken out.
            for i in start..end {
                let span = self.row_span(i);
                for k in 0..nm {
                    let h = self.corrections_of(k, (c0, c1));
                    let state = &mut states[i * nm + k];
                    for &j in &self.ambiguous[self.lists[(i - start) * nm + k].clone()] {
                        let column = (c0 + j as usize) as u32;
                        let at = span.start
                            + self.undecided[span.clone()]
                                .binary_search_by_key(&column, |u| u.column)
                                .expect("re-scored");
                        let score = self.exact[at] - h[j as usize];
                        state.greater += (score > state.target) as u64;
                        state.equal += (score == state.target) as u64;
                    }
                    if !state.target.is_nan() {
                        self.exclude_positives(i, (c0, c1), h, state);
                    }
                }
            }
            start = end;
        }
        self.counts.screened += (m * nc * nm) as u64;
    }

    /// Where row `i`'s pairs lie in `undecided` (rows in order).
    fn row_span(&self, i: usize) -> std::ops::Range<usize> {
        let row = i as u32;
        let start = self.undecided.partition_point(|u| u.row < row);
        let end = self.undecided.partition_point(|u| u.row <= row);
        start..end
    }

    /// The ground truth is not counted against itself: undo the counts of
    /// row `i`'s positives that fall in the tile of columns `c0..c1`.
    fn exclude_positives(
        &self,
        i: usize,
        (c0, c1): (usize, usize),
        h: &[f32],
        state: &mut QueryState,
    ) {
        let (q, dim) = (self.q0 + i, self.queries.dim);
        let col0 = self.first_row + c0 as u32;
        for &p in self.positives.of(q) {
            if p >= col0 && ((p - col0) as usize) < c1 - c0 {
                let j = (p - col0) as usize;
                let mut s = [0f32];
                self.scorer.scores(
                    &[(
                        &self.queries.data[q * dim..(q + 1) * dim],
                        &self.gallery.data[(c0 + j) * dim..(c0 + j + 1) * dim],
                    )],
                    &mut s,
                );
                let scoring = ColumnScoring::Subtract(h);
                match compare_to_target(scoring.score(j, s[0]), s[0], &scoring, state) {
                    std::cmp::Ordering::Greater => state.greater -= 1,
                    std::cmp::Ordering::Equal => state.equal -= 1,
                    std::cmp::Ordering::Less => {}
                }
            }
        }
    }

    /// Re-scores the candidates of pool (row `i`, scoring `k`) that it
    /// cannot rule out, offers them to the state, and empties the pool.
    fn decide_pool(&mut self, i: usize, k: usize, states: &mut [QueryState]) {
        self.deciding.clear();
        self.take_survivors(i, k, states);
        self.offer_deciding(states);
    }

    /// Moves the entries of pool (row `i`, scoring `k`) that may still
    /// enter its top-k to `deciding`, and empties the pool.
    fn take_survivors(&mut self, i: usize, k: usize, states: &[QueryState]) {
        let pool = i * self.corrections.len() + k;
        let (deciding, state) = (&mut self.deciding, &states[pool]);
        self.pools
            .survivors(pool, state.top.k(), state.top.threshold(), |entry| {
                deciding.push(Undecided {
                    row: i as u32,
                    column: entry.column,
                    scorings: 1 << k,
                })
            });
        self.pools.len[pool] = 0;
    }

    /// Decides every pool: the strip's columns are done.
    pub(super) fn finish(&mut self, states: &mut [QueryState]) {
        let nm = self.corrections.len();
        self.deciding.clear();
        for i in 0..self.q1 - self.q0 {
            let first = self.deciding.len();
            for k in 0..nm {
                self.take_survivors(i, k, states);
            }
            // One re-score per pair, offered to every scoring that kept it.
            let row_pairs = &mut self.deciding[first..];
            row_pairs.sort_unstable_by_key(|u| u.column);
            let mut unique = 0;
            for at in 0..row_pairs.len() {
                if unique > 0 && row_pairs[unique - 1].column == row_pairs[at].column {
                    row_pairs[unique - 1].scorings |= row_pairs[at].scorings;
                } else {
                    row_pairs[unique] = row_pairs[at];
                    unique += 1;
                }
            }
            self.deciding.truncate(first + unique);
        }
        self.offer_deciding(states);
    }

    /// Re-scores `deciding` and offers each pair to the scorings it names.
    fn offer_deciding(&mut self, states: &mut [QueryState]) {
        let mut decided = std::mem::take(&mut self.decided);
        rescore(self, &self.deciding, &mut decided);
        self.decided = decided;
        let nm = self.corrections.len();
        let whole = (0, self.gallery.rows);
        for (u, &s) in self.deciding.iter().zip(&self.decided) {
            for k in (0..nm).filter(|k| u.scorings >> k & 1 == 1) {
                let h = self.corrections_of(k, whole);
                states[u.row as usize * nm + k].top.push(Candidate {
                    score: s - h[u.column as usize],
                    raw: s,
                    row: self.first_row + u.column,
                });
            }
        }
        self.counts.rescored += self.deciding.len() as u64;
    }
}

/// The f32 similarities of `pairs` (of `strip`'s rows and block columns)
/// into `exact`, a batch of [`TileScorer::BATCH`] at a time.
fn rescore(strip: &StripScreen<'_>, pairs: &[Undecided], exact: &mut Vec<f32>) {
    let dim = strip.queries.dim;
    exact.resize(pairs.len(), 0.0);
    const BATCH: usize = TileScorer::BATCH;
    let mut start = 0;
    while start < pairs.len() {
        let end = (start + BATCH).min(pairs.len());
        let batch = &pairs[start..end];
        let rows: [(&[f32], &[f32]); BATCH] = std::array::from_fn(|l| {
            let u = batch[l.min(batch.len() - 1)];
            let (q, c) = (strip.q0 + u.row as usize, u.column as usize);
            (
                &strip.queries.data[q * dim..(q + 1) * dim],
                &strip.gallery.data[c * dim..(c + 1) * dim],
            )
        });
        strip
            .scorer
            .scores(&rows[..batch.len()], &mut exact[start..end]);
        start = end;
    }
}

impl Pools {
    fn entries(&self, pool: usize) -> &[Pending] {
        let base = pool * self.capacity;
        &self.entries[base..base + self.len[pool]]
    }

    /// Adds `entry` to `pool` (of a top-`k`), pruning it when full;
    /// `false` when it is full of entries that it cannot rule out.
    fn add(&mut self, pool: usize, entry: Pending, k: usize) -> bool {
        if entry.upper < self.floor[pool] {
            return true;
        }
        if self.len[pool] == self.capacity {
            self.prune(pool, k);
            if self.len[pool] > self.capacity / 4 * 3 {
                return false;
            }
        }
        let base = pool * self.capacity;
        self.entries[base + self.len[pool]] = entry;
        self.len[pool] += 1;
        true
    }

    /// Raises `pool`'s floor to its k-th best lower end and drops the
    /// entries whose upper end is below it: k others are certainly better.
    fn prune(&mut self, pool: usize, k: usize) {
        let base = pool * self.capacity;
        let entries = &mut self.entries[base..base + self.len[pool]];
        if k == 0 || entries.len() < k {
            return;
        }
        let (_, kth, _) = entries.select_nth_unstable_by(k - 1, |a, b| b.lower.total_cmp(&a.lower));
        let floor = self.floor[pool].max(kth.lower);
        self.floor[pool] = floor;
        let mut kept = 0;
        for at in 0..entries.len() {
            if entries[at].upper >= floor {
                entries[kept] = entries[at];
                kept += 1;
            }
        }
        self.len[pool] = kept;
    }

    /// Calls `each` with the entries of `pool` (of a top-`k` whose k-th
    /// score so far is `threshold`: an item enters only above it) that may
    /// still enter the top-k.
    fn survivors(&mut self, pool: usize, k: usize, threshold: f32, mut each: impl FnMut(&Pending)) {
        self.prune(pool, k);
        let floor = self.floor[pool];
        for entry in self.entries(pool) {
            if entry.upper >= floor && entry.upper > threshold {
                each(entry);
            }
        }
    }
}

/// Moves the first of each run of equal keys of a sorted slice to its
/// front; returns how many runs there are.
fn dedup_sorted_by_key<T: Copy, K: PartialEq>(values: &mut [T], key: impl Fn(&T) -> K) -> usize {
    let mut unique = 0;
    for i in 0..values.len() {
        if unique == 0 || key(&values[i]) != key(&values[unique - 1]) {
            values[unique] = values[i];
            unique += 1;
        }
    }
    unique
}

/// The floors of one row and scoring (see [`Floors`]), each rounded the
/// safe way to an f32; `slack` bounds |c − c̃| for every item of the row,
/// `pool_floor` is at most the row's k-th best score.
fn floors(state: &QueryState, pool_floor: f32, slack: f64) -> Floors {
    // An item enters only above the k-th score kept (c > threshold, which
    // needs c̃ > threshold − slack), and not below the pool's floor
    // (c̃ ≥ floor − slack).
    let kept = if state.top.len() >= state.top.k() {
        round_down(state.top.threshold() as f64 - slack)
    } else {
        f32::NEG_INFINITY
    };
    let top = kept.max(round_down(pool_floor as f64 - slack).next_down());
    if state.target.is_nan() {
        return Floors {
            top,
            greater: f32::INFINITY,
            ambiguous: f32::INFINITY,
        };
    }
    let target = state.target as f64;
    Floors {
        top,
        greater: round_up(target + slack),
        ambiguous: round_down(target - slack),
    }
}

/// The k-th largest of fl(s̃ − h) over the row (1 ≤ k ≤ its length).
fn kth_largest(screened: &[f32], h: &[f32], k: usize, heap: &mut BinaryHeap<Reverse<u32>>) -> f32 {
    // Keys that order finite f32 values as integers.
    let key = |v: f32| {
        let bits = v.to_bits();
        if bits >> 31 == 1 {
            !bits
        } else {
            bits | 1 << 31
        }
    };
    let value = |key: u32| {
        f32::from_bits(if key >> 31 == 1 {
            key & !(1 << 31)
        } else {
            !key
        })
    };
    heap.clear();
    for (s, c) in screened.iter().zip(h) {
        let v = key(s - c);
        if heap.len() < k {
            heap.push(Reverse(v));
        } else if v > heap.peek().expect("k ≥ 1").0 {
            heap.pop();
            heap.push(Reverse(v));
        }
    }
    value(heap.peek().expect("k ≥ 1").0)
}

/// The largest f32 at most `x`.
fn round_down(x: f64) -> f32 {
    let y = x as f32;
    if (y as f64) > x {
        y.next_down()
    } else {
        y
    }
}

/// The smallest f32 at least `x`.
fn round_up(x: f64) -> f32 {
    let y = x as f32;
    if (y as f64) < x {
        y.next_up()
    } else {
        y
    }
}

/// One pass over a row's screened similarities `screened` with the
/// corrections `h`: appends the columns above the top-k floor to
/// `candidates` and the ambiguous ones to `ambiguous` (in column order),
/// and returns how many are certainly above the ground truth's score.
fn filter_row(
    screened: &[f32],
    h: &[f32],
    floors: Floors,
    candidates: &mut Vec<u32>,
    ambiguous: &mut Vec<u32>,
) -> u64 {
    assert_eq!(screened.len(), h.len(), "one correction per column");
    #[cfg(target_arch = "x86_64")]
    if super::dispatch::has_avx512() {
        // SAFETY: the features were detected; the lengths were checked.
        return unsafe { avx512::filter_row(screened, h, floors, candidates, ambiguous) };
    }
    let mut greater = 0;
    for (j, (s, c)) in screened.iter().zip(h).enumerate() {
        greater += keep(j, s - c, floors, candidates, ambiguous) as u64;
    }
    greater
}

/// Files column `j`, of screened corrected score `v`, by the floors;
/// returns whether it is certainly above the ground truth's score.
#[inline(always)]
fn keep(
    j: usize,
    v: f32,
    floors: Floors,
    candidates: &mut Vec<u32>,
    ambiguous: &mut Vec<u32>,
) -> bool {
    let above = v > floors.greater;
    if v > floors.top {
        candidates.push(j as u32);
    }
    if v >= floors.ambiguous && !above {
        ambiguous.push(j as u32);
    }
    above
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{keep, Floors};
    use std::arch::x86_64::*;

    /// [`super::filter_row`], 16 columns per step: three compares and a
    /// count; lanes are visited one by one only where one is kept.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn filter_row(
        screened: &[f32],
        h: &[f32],
        floors: Floors,
        candidates: &mut Vec<u32>,
        ambiguous: &mut Vec<u32>,
    ) -> u64 {
        const LANES: usize = 16;
        let n = screened.len();
        let full = n - n % LANES;
        let (top, greater_floor, ambiguous_floor) = (
            _mm512_set1_ps(floors.top),
            _mm512_set1_ps(floors.greater),
            _mm512_set1_ps(floors.ambiguous),
        );
        let mut greater = 0u64;
        let mut j0 = 0;
        while j0 < full {
            let v = _mm512_sub_ps(
                _mm512_loadu_ps(screened.as_ptr().add(j0)),
                _mm512_loadu_ps(h.as_ptr().add(j0)),
            );
            let above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, greater_floor);
            let kept = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, top)
                | (_mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, ambiguous_floor) & !above);
            greater += above.count_ones() as u64;
            if kept != 0 {
                let mut lanes = [0f32; LANES];
                _mm512_storeu_ps(lanes.as_mut_ptr(), v);
                for (l, &v) in lanes.iter().enumerate() {
                    keep(j0 + l, v, floors, candidates, ambiguous);
                }
            }
            j0 += LANES;
        }
        for j in full..n {
            greater += keep(j, screened[j] - h[j], floors, candidates, ambiguous) as u64;
        }
        greater
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a + b` as an unevaluated sum `(s, e)` with `s + e = a + b` exactly
    /// (Knuth's TwoSum).
    fn two_sum(a: f64, b: f64) -> (f64, f64) {
        let s = a + b;
        let bb = s - a;
        (s, (a - (s - bb)) + (b - bb))
    }

    /// The floor is safe (`f + bound ≤ threshold` exactly, so a screened
    /// value at the floor cannot hide an f32 value above the threshold) and
    /// tight (the next f32 up is not: the floor gives away at most the f64
    /// room and one f32 step), over thresholds of both signs and many
    /// magnitudes, bounds from the smallest to larger than the threshold,
    /// and thresholds lying exactly `bound` above an f32.
    #[test]
    fn floors_are_safe_and_tight() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut cases = 0;
        for _ in 0..200_000 {
            let bits = next();
            let magnitude = 2f32.powi((bits % 60) as i32 - 40);
            let unit = ((bits >> 8) as u32 >> 8) as f32 / (1u32 << 24) as f32;
            let sign = if bits & 1 == 0 { 1.0 } else { -1.0 };
            let threshold = sign * magnitude * (0.5 + unit);
            let e = match (bits >> 40) % 4 {
                0 => 1e-37,
                1 => threshold.abs() as f64 * 2f64.powi(-(((bits >> 44) % 30) as i32)),
                2 => 2.0 * threshold.abs() as f64,
                // The threshold exactly `e` above an f32 value below it.
                _ => threshold as f64 - (threshold - magnitude * 2f32.powi(-10)) as f64,
            };
            let f = floor_below(threshold, e);
            let (s, err) = two_sum(f as f64, e);
            let t = threshold as f64;
            assert!(
                s < t || (s == t && err <= 0.0),
                "threshold {threshold:e}, bound {e:e}: floor {f:e} is above threshold − bound"
            );
            let room = (t.abs() + e) * 2f64.powi(-49);
            assert!(
                f.next_up() as f64 + e > t - room,
                "threshold {threshold:e}, bound {e:e}: floor {f:e} is looser than it needs"
            );
            cases += 1;
        }
        assert_eq!(floor_below(f32::NEG_INFINITY, 1.0), f32::NEG_INFINITY);
        assert_eq!(cases, 200_000);
    }
}
