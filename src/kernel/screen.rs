//! Pass 2's screened tiles (`--precision screened`): a tile's similarities
//! from the bf16 screen ([`super::bf16`]), each known to within its bound;
//! only the items whose interval reaches a query's top-k (or straddles its
//! ground truth's score) are re-scored in f32, with the bits the f32 tile
//! would have had ([`super::gemm::tile_score`]). The states come out as the
//! exact search's: the same lists, scores and counts. docs/precision.md
//! gives the argument.

use super::bf16::{convert_rows, row_norms, screen_tile, ScreenBound};
use super::gemm::{reproducible, tile_score};
use super::search::{compare_to_target, ColumnScoring, Positives, QueryState};
use super::tile::Rows;
use super::topk::Candidate;

/// The bf16 copies and norms of one query block and one gallery block.
#[derive(Debug, Clone)]
pub struct ScreenData {
    queries: Vec<u16>,
    gallery: Vec<u16>,
    query_norms: Vec<f64>,
    gallery_norms: Vec<f64>,
    bound: ScreenBound,
}

impl ScreenData {
    /// The screen's inputs, or `None` when a value does not fit bf16's
    /// range (the block is then searched in f32 only).
    pub fn prepare(queries: Rows<'_>, gallery: Rows<'_>) -> Option<ScreenData> {
        Some(ScreenData {
            queries: convert_rows(queries.data)?,
            gallery: convert_rows(gallery.data)?,
            query_norms: row_norms(queries.data, queries.dim),
            gallery_norms: row_norms(gallery.data, gallery.dim),
            bound: ScreenBound::new(queries.dim),
        })
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

/// One tile of a strip, screened: queries `q0..q1` × gallery columns
/// `c0..c1` of the block. `tile` (stride `ld`) is scratch for the screened
/// values. Returns `false`, doing nothing, when the f32 tile of this shape
/// is not one whose bits [`tile_score`] reproduces: the caller then runs
/// the exact tile.
#[allow(clippy::too_many_arguments)] // the tile's place, its inputs and its states
pub(super) fn screened_tile(
    screen: &ScreenData,
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
    counts: &mut ScreenCounts,
) -> bool {
    let (m, nc, dim) = (q1 - q0, c1 - c0, queries.dim);
    if !reproducible(m, nc, dim) {
        return false;
    }
    screen_tile(
        tile,
        ld,
        &screen.queries[q0 * dim..q1 * dim],
        m,
        &screen.gallery[c0 * dim..c1 * dim],
        nc,
        dim,
    );
    let nm = corrections.len();
    let mut margins = vec![0f64; nc];
    let mut lower = vec![0f64; nc];
    let mut upper = vec![0f64; nc];
    let mut order = Vec::with_capacity(nc);
    // Exact similarities of this row, computed on demand (NaN: not yet).
    let mut exact = vec![f32::NAN; nc];
    let mut rescored = 0u64;
    for i in 0..m {
        let q = q0 + i;
        let q_row = &queries.data[q * dim..(q + 1) * dim];
        let screened = &tile[i * ld..i * ld + nc];
        for (j, margin) in margins.iter_mut().enumerate() {
            *margin = screen
                .bound
                .of(screen.query_norms[q], screen.gallery_norms[c0 + j])
                as f64;
        }
        exact.fill(f32::NAN);
        let mut rescore = |j: usize| -> f32 {
            if exact[j].is_nan() {
                let g_row = &gallery.data[(c0 + j) * dim..(c0 + j + 1) * dim];
                exact[j] = tile_score(q_row, g_row, m, nc).expect("checked reproducible");
                rescored += 1;
            }
            exact[j]
        };
        for (k, scoring) in corrections.iter().enumerate() {
            let ColumnScoring::Subtract(h) = scoring.columns(c0, c1) else {
                unreachable!("screenable() holds")
            };
            let state = &mut strip_states[i * nm + k];
            // c = fl(s − h) lies in [lower, upper]: the screen's bound, plus
            // the rounding of c and of this f64 arithmetic, with room.
            for j in 0..nc {
                let (s, hj, e) = (screened[j] as f64, h[j] as f64, margins[j]);
                let slack = e + (s.abs() + hj.abs() + e) * 2f64.powi(-22) + 1e-37;
                lower[j] = s - hj - slack;
                upper[j] = s - hj + slack;
            }
            // τ: the k-th best lower end (this tile's, or the scores kept).
            let k_best = state.top.k();
            let mut tau = state.top.threshold() as f64;
            if k_best > 0 && nc >= k_best {
                order.clear();
                order.extend_from_slice(&lower);
                let (_, kth, _) = order.select_nth_unstable_by(k_best - 1, |a, b| b.total_cmp(a));
                tau = tau.max(*kth);
            }
            let target = state.target as f64;
            let counting = !state.target.is_nan();
            let mut threshold = state.top.threshold();
            for j in 0..nc {
                let offer = upper[j] >= tau;
                let mut v = None;
                if counting {
                    if lower[j] > target {
                        state.greater += 1;
                    } else if upper[j] >= target {
                        let score = rescore(j) - h[j];
                        state.greater += (score > state.target) as u64;
                        state.equal += (score == state.target) as u64;
                        v = Some(score);
                    }
                }
                if offer {
                    let s = rescore(j);
                    let score = v.unwrap_or(s - h[j]);
                    if score > threshold {
                        state.top.push(Candidate {
                            score,
                            raw: s,
                            row: col0 + j as u32,
                        });
                        threshold = state.top.threshold();
                    }
                }
            }
            // The ground truth is not counted against itself.
            if counting {
                for &p in positives.of(q) {
                    if p >= col0 && ((p - col0) as usize) < nc {
                        let j = (p - col0) as usize;
                        let s = rescore(j);
                        let scoring = ColumnScoring::Subtract(h);
                        match compare_to_target(scoring.score(j, s), s, &scoring, state) {
                            std::cmp::Ordering::Greater => state.greater -= 1,
                            std::cmp::Ordering::Equal => state.equal -= 1,
                            std::cmp::Ordering::Less => {}
                        }
                    }
                }
            }
        }
    }
    counts.rescored += rescored;
    counts.screened += (m * nc * nm) as u64;
    true
}
