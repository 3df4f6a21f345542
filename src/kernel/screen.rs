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
    pack_gallery_panels, pack_query_rows, packed_finite, screen_packed, RowNorms, ScreenBound,
    PANEL,
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
        Self::prepare(rows, Side::Queries, pack_query_rows(rows.data, rows.dim))
    }

    /// A gallery block's copy, or `None` as for [`ScreenedRows::queries`].
    pub fn gallery(rows: Rows<'_>) -> Option<ScreenedRows> {
        Self::prepare(
            rows,
            Side::Gallery,
            pack_gallery_panels(rows.data, rows.dim),
        )
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
}

/// Whether a search with these scorings can be screened: every one a
/// subtraction s − h(j), whose order the screen's intervals carry over.
pub fn screenable(corrections: &[ColumnScoring<'_>]) -> bool {
    corrections
        .iter()
        .all(|c| matches!(c, ColumnScoring::Subtract(_)))
}

/// A strip's scratch for its screened tiles, kept from tile to tile.
#[derive(Debug, Default)]
pub(super) struct TileScratch {
    /// Every row's and scoring's top-k candidates and ambiguous items
    /// (columns of the tile, increasing), one after the other.
    candidates: Vec<u32>,
    ambiguous: Vec<u32>,
    /// Where each (row, scoring)'s lists lie in those.
    lists: Vec<Lists>,
    /// The (row, column) pairs to re-score (each row's once each, rows in
    /// order, columns increasing within a row), where each row's lie, and
    /// their f32 similarities.
    needed: Vec<(u32, u32)>,
    row_needed: Vec<std::ops::Range<usize>>,
    exact: Vec<f32>,
    /// The k largest screened scores of a row (for the first tile).
    largest: BinaryHeap<Reverse<u32>>,
}

/// The spans of one (row, scoring)'s candidates and ambiguous items.
#[derive(Debug, Clone)]
struct Lists {
    candidates: std::ops::Range<usize>,
    ambiguous: std::ops::Range<usize>,
}

/// Undecided pairs a [`TileScratch`] collects before it re-scores them (a
/// tile's rows are taken in groups that fill it).
const RESCORE_PAIRS: usize = 1 << 16;

/// Bytes of one [`TileScratch`] for tiles of `rows` × `columns` with
/// `scorings`: the undecided pairs of a group of rows (the limit, plus
/// one row's at most), each in a list (u32) and needed (a pair and its
/// f32); the lists' spans; the heap of the largest.
pub fn tile_scratch_bytes(rows: usize, columns: usize, scorings: usize) -> usize {
    let pairs = RESCORE_PAIRS + 2 * columns * scorings;
    pairs * (2 * 4 + 12) + rows * (scorings * std::mem::size_of::<Lists>() + 24) + columns * 4
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

/// One tile of a strip, screened: queries `q0..q1` × gallery columns
/// `c0..c1` of the block (`c0` on a panel). `tile` (stride `ld`) is
/// scratch for the screened values. Returns `false`, doing nothing, when
/// the f32 tile of this shape is not one whose bits [`TileScorer`]
/// reproduces: the caller then runs the exact tile.
#[allow(clippy::too_many_arguments)] // the tile's place, its inputs and its states
pub(super) fn screened_tile(
    screen: Screen<'_>,
    queries: Rows<'_>,
    gallery: Rows<'_>,
    (q0, q1): (usize, usize),
    (c0, c1): (usize, usize),
    col0: u32,
    corrections: &[ColumnScoring<'_>],
    positives: &Positives,
    strip_states: &mut [QueryState],
    tile: &mut [f32],
    ld: usize,
    scratch: &mut TileScratch,
    counts: &mut ScreenCounts,
) -> bool {
    let (m, nc, dim) = (q1 - q0, c1 - c0, queries.dim);
    let Some(scorer) = TileScorer::new(m, nc, dim) else {
        return false;
    };
    assert_eq!(c0 % PANEL, 0, "tiles start on a panel");
    let pairs = dim.div_ceil(2);
    screen_packed(
        tile,
        ld,
        &screen.queries.packed[q0 * pairs..q1 * pairs],
        m,
        &screen.gallery.packed[c0 * pairs..],
        nc,
        dim,
    );
    let nm = corrections.len();
    let h_of = |k: usize| match corrections[k].columns(c0, c1) {
        ColumnScoring::Subtract(h) => h,
        _ => unreachable!("screenable() holds"),
    };
    // One bound for the whole tile: each norm at its largest over the columns.
    let gallery_norms = RowNorms::max_of(&screen.gallery.norms[c0..c1]);
    let h_max: Vec<f64> = (0..nm)
        .map(|k| h_of(k).iter().fold(0f64, |a, &v| a.max(v.abs() as f64)))
        .collect();
    let TileScratch {
        candidates,
        ambiguous,
        lists,
        needed,
        row_needed,
        exact,
        largest,
    } = scratch;
    // Rows in groups whose undecided pairs fill the scratch at most (plus
    // one row's), so that its size does not depend on the data.
    let mut start = 0;
    while start < m {
        (candidates.clear(), ambiguous.clear(), lists.clear());
        (needed.clear(), row_needed.clear());
        let mut end = start;
        // Each row's screened scores against its floors: the lists, and the
        // items certainly above the ground truth's score counted.
        while end < m && needed.len() < RESCORE_PAIRS {
            let i = end;
            end += 1;
            let q = q0 + i;
            let screened = &tile[i * ld..i * ld + nc];
            let query_norms = &screen.queries.norms[q];
            let e = screen.bound.of(query_norms, &gallery_norms);
            // |s| ≤ ‖q‖‖g‖, so |s̃| ≤ that + e.
            let s_max = query_norms.norm * gallery_norms.norm;
            let first_needed = needed.len();
            for k in 0..nm {
                let h = h_of(k);
                let state = &mut strip_states[i * nm + k];
                // c = fl(s − h) and c̃ = fl(s̃ − h) differ by at most e plus both
                // roundings (2⁻²⁴ of |s| + |h| each), with room for this f64.
                let slack = e + (s_max + 2.0 * e + h_max[k]) * 2f64.powi(-22) + 1e-37;
                let floors = floors(state, screened, h, slack, largest);
                let (c_start, a_start) = (candidates.len(), ambiguous.len());
                state.greater += filter_row(screened, h, floors, candidates, ambiguous);
                lists.push(Lists {
                    candidates: c_start..candidates.len(),
                    ambiguous: a_start..ambiguous.len(),
                });
                let row = i as u32;
                needed.extend(candidates[c_start..].iter().map(|&j| (row, j)));
                needed.extend(ambiguous[a_start..].iter().map(|&j| (row, j)));
            }
            let row_pairs = &mut needed[first_needed..];
            if nm > 1 || lists[(i - start) * nm].ambiguous.start < ambiguous.len() {
                row_pairs.sort_unstable();
                let unique = dedup_sorted(row_pairs);
                needed.truncate(first_needed + unique);
            }
            row_needed.push(first_needed..needed.len());
        }
        // Every pair that the screen could not decide, in f32, batch after batch.
        exact.resize(needed.len(), 0.0);
        const BATCH: usize = TileScorer::BATCH;
        for (pairs, out) in needed.chunks(BATCH).zip(exact.chunks_mut(BATCH)) {
            let rows: [(&[f32], &[f32]); BATCH] = std::array::from_fn(|l| {
                let (i, j) = pairs[l.min(pairs.len() - 1)];
                let (q, c) = (q0 + i as usize, c0 + j as usize);
                (
                    &queries.data[q * dim..(q + 1) * dim],
                    &gallery.data[c * dim..(c + 1) * dim],
                )
            });
            scorer.scores(&rows[..pairs.len()], out);
        }
        // The decided pairs into each row's states, in column order: ties are
        // broken by row.
        for i in start..end {
            let q = q0 + i;
            let span = row_needed[i - start].clone();
            let (row_pairs, row_exact) = (&needed[span.clone()], &exact[span]);
            let exact_of = |j: u32| {
                let at = row_pairs
                    .binary_search_by_key(&j, |&(_, c)| c)
                    .expect("re-scored");
                row_exact[at]
            };
            for k in 0..nm {
                let h = h_of(k);
                let state = &mut strip_states[i * nm + k];
                let lists = &lists[(i - start) * nm + k];
                let (candidates, ambiguous) = (
                    &candidates[lists.candidates.clone()],
                    &ambiguous[lists.ambiguous.clone()],
                );
                let mut threshold = state.top.threshold();
                let (mut a, mut b) = (0, 0);
                while a < candidates.len() || b < ambiguous.len() {
                    let next_candidate = candidates.get(a).copied().unwrap_or(u32::MAX);
                    let next_ambiguous = ambiguous.get(b).copied().unwrap_or(u32::MAX);
                    let j = next_candidate.min(next_ambiguous);
                    let s = exact_of(j);
                    let score = s - h[j as usize];
                    if next_ambiguous == j {
                        state.greater += (score > state.target) as u64;
                        state.equal += (score == state.target) as u64;
                        b += 1;
                    }
                    if next_candidate == j {
                        if score > threshold {
                            state.top.push(Candidate {
                                score,
                                raw: s,
                                row: col0 + j,
                            });
                            threshold = state.top.threshold();
                        }
                        a += 1;
                    }
                }
                // The ground truth is not counted against itself.
                if !state.target.is_nan() {
                    let q_row = &queries.data[q * dim..(q + 1) * dim];
                    for &p in positives.of(q) {
                        if p >= col0 && ((p - col0) as usize) < nc {
                            let j = (p - col0) as usize;
                            let g_row = &gallery.data[(c0 + j) * dim..(c0 + j + 1) * dim];
                            let mut s = [0f32];
                            scorer.scores(&[(q_row, g_row)], &mut s);
                            let scoring = ColumnScoring::Subtract(h);
                            match compare_to_target(scoring.score(j, s[0]), s[0], &scoring, state) {
                                std::cmp::Ordering::Greater => state.greater -= 1,
                                std::cmp::Ordering::Equal => state.equal -= 1,
                                std::cmp::Ordering::Less => {}
                            }
                        }
                    }
                }
            }
        }
        counts.rescored += needed.len() as u64;
        start = end;
    }
    counts.screened += (m * nc * nm) as u64;
    true
}

/// Moves the distinct values of a sorted slice to its front; returns how
/// many there are.
fn dedup_sorted<T: PartialEq + Copy>(values: &mut [T]) -> usize {
    let mut unique = 0;
    for i in 0..values.len() {
        if unique == 0 || values[i] != values[unique - 1] {
            values[unique] = values[i];
            unique += 1;
        }
    }
    unique
}

/// The floors of one row and scoring (see [`Floors`]), each rounded the
/// safe way to an f32; `slack` bounds |c − c̃| for every item of the row.
fn floors(
    state: &QueryState,
    screened: &[f32],
    h: &[f32],
    slack: f64,
    largest: &mut BinaryHeap<Reverse<u32>>,
) -> Floors {
    let k = state.top.k();
    let top = if state.top.len() >= k {
        // An item enters only above the k-th score kept: c > threshold,
        // which needs c̃ > threshold − slack.
        round_down(state.top.threshold() as f64 - slack)
    } else if k <= screened.len() {
        // Nothing kept yet (the strip's first tile): the k-th largest c̃
        // minus the slack is at most the k-th largest c, and an item below
        // it cannot enter; c̃ ≥ kth − 2·slack keeps every other.
        let kth = kth_largest(screened, h, k, largest) as f64;
        round_down(kth - 2.0 * slack).next_down()
    } else {
        f32::NEG_INFINITY
    };
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
