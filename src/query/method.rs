//! Methods as pass 2 sees them.
//!
//! The kernel computes a few *scorings* per query (an additive correction
//! s − h(g), `gc`'s rank among the bank, `dsl`'s dual softmax, `ls`'s or
//! `nicdm`'s per-item scale, or `mp`'s Gaussians) in one stream over
//! the gallery. A method then reports one of them per query: always the
//! same one, or, for DIS and DualDIS, the one its activation sets select
//! from the query's raw top-1. Reported scores may also subtract a term that
//! depends only on the query (CSLS's r_G(q), DN's shift), which never
//! changes a ranking.

use std::sync::Arc;

use crate::bank::Moments;
pub use crate::kernel::{ColumnScoring, QueryGaussian};
use crate::options::MethodSpec;

/// One scoring the kernel computes for every (query, gallery item).
#[derive(Debug, Clone, PartialEq)]
pub enum Scoring {
    /// s − h(g), one f32 correction per gallery row (zeros: the raw score).
    Subtract(Vec<f32>),
    /// −|{b : s(b, g) > s}| from each gallery row's `width` bank
    /// similarities, sorted ascending, row after row (`gc`).
    BankRank { sorted: Vec<f32>, width: usize },
    /// Dual softmax (`dsl`): s · exp(s/θ − L(g)), see
    /// [`ColumnScoring::DualSoftmax`].
    DualSoftmax {
        log_normaliser: Vec<f64>,
        inv_theta: f64,
        include_query: bool,
    },
    /// Local scaling (`ls`): −d(q, g)²/σ(g), see [`ColumnScoring::LocalScaling`].
    LocalScaling { inv_scale: Vec<f64> },
    /// NICDM: −d(q, g)/sqrt(r(g)), see [`ColumnScoring::Nicdm`].
    Nicdm { inv_scale: Vec<f64> },
    /// Gaussian mutual proximity (`mp`), see
    /// [`ColumnScoring::MutualProximity`]: each gallery item's Gaussian of
    /// bank similarities, and the moments of the set each query's Gaussian
    /// comes from (the gallery bank, or the gallery).
    MutualProximity {
        mean: Vec<f64>,
        inv_std: Vec<f64>,
        query_side: Arc<Moments>,
    },
}

/// The smallest standard deviation `mp` divides by.
pub const MIN_STD: f64 = 1e-12;

impl Scoring {
    /// The raw inner product.
    pub fn raw(gallery_rows: usize) -> Self {
        Scoring::Subtract(vec![0.0; gallery_rows])
    }

    /// The kernel's view of gallery rows `start..end`.
    pub fn columns(&self, start: usize, end: usize) -> ColumnScoring<'_> {
        match self {
            Scoring::Subtract(h) => ColumnScoring::Subtract(&h[start..end]),
            Scoring::BankRank { sorted, width } => ColumnScoring::BankRank {
                sorted: &sorted[start * width..end * width],
                width: *width,
            },
            Scoring::DualSoftmax {
                log_normaliser,
                inv_theta,
                include_query,
            } => ColumnScoring::DualSoftmax {
                log_normaliser: &log_normaliser[start..end],
                inv_theta: *inv_theta,
                include_query: *include_query,
            },
            Scoring::LocalScaling { inv_scale } => ColumnScoring::LocalScaling {
                inv_scale: &inv_scale[start..end],
            },
            Scoring::Nicdm { inv_scale } => ColumnScoring::Nicdm {
                inv_scale: &inv_scale[start..end],
            },
            Scoring::MutualProximity { mean, inv_std, .. } => ColumnScoring::MutualProximity {
                mean: &mean[start..end],
                inv_std: &inv_std[start..end],
                queries: &[],
            },
        }
    }

    /// The per-query parameters of the queries of a row-major block (`mp`:
    /// each query's Gaussian); empty for scorings that have none. Err
    /// names the first query row (of the block) it cannot serve, and why
    /// (`mp`: a σ below [`MIN_STD`]).
    pub fn query_parameters(
        &self,
        queries: &[f32],
        dim: usize,
    ) -> std::result::Result<Vec<QueryGaussian>, (usize, String)> {
        let Scoring::MutualProximity { query_side, .. } = self else {
            return Ok(Vec::new());
        };
        query_side
            .similarity_moments(queries, dim)
            .into_iter()
            .enumerate()
            .map(|(i, (mean, std))| {
                if std >= MIN_STD {
                    Ok(QueryGaussian {
                        mean,
                        inv_std: 1.0 / std,
                    })
                } else {
                    Err((i, format!(
                        "mp: the similarities of this query have standard deviation {std:e} (below {MIN_STD:e}) over the gallery side, which it cannot divide by"
                    )))
                }
            })
            .collect()
    }

    /// Gallery rows covered.
    pub fn rows(&self) -> usize {
        match self {
            Scoring::Subtract(h) => h.len(),
            Scoring::BankRank { sorted, width } => sorted.len().checked_div(*width).unwrap_or(0),
            Scoring::DualSoftmax { log_normaliser, .. } => log_normaliser.len(),
            Scoring::LocalScaling { inv_scale } | Scoring::Nicdm { inv_scale } => inv_scale.len(),
            Scoring::MutualProximity { mean, .. } => mean.len(),
        }
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        match self {
            Scoring::Subtract(h) => h.capacity() * 4,
            Scoring::BankRank { sorted, .. } => sorted.capacity() * 4,
            Scoring::DualSoftmax { log_normaliser, .. } => log_normaliser.capacity() * 8,
            Scoring::LocalScaling { inv_scale } | Scoring::Nicdm { inv_scale } => {
                inv_scale.capacity() * 8
            }
            Scoring::MutualProximity {
                mean,
                inv_std,
                query_side,
            } => {
                (mean.capacity() + inv_std.capacity() + query_side.mean.len()) * 8
                    + query_side.covariance.as_ref().map_or(0, |c| c.len() * 8)
            }
        }
    }
}

/// Which scoring a method reports for a query.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// No shared scoring: each query is normalised on its own
    /// (`sinkhorn-pp`, see [`crate::query::sinkhorn_pp`]).
    SingleQuery,
    /// Always scoring `0`.
    Fixed(usize),
    /// DIS-style gating on the query's raw top-1 g* (from scoring `raw`):
    /// bit i of the choice is set when g* is in activation set `sets[i]`,
    /// and `choices[bits]` is the scoring reported (`choices[0]` = raw).
    Gated {
        raw: usize,
        sets: Vec<Vec<bool>>,
        choices: Vec<usize>,
    },
}

/// A term subtracted from every reported score of a query.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryTerm {
    None,
    /// CSLS: ½·mean of the query's `k` largest raw similarities over the
    /// gallery, read from scoring `raw`'s top-k.
    HalfNeighbourMean {
        raw: usize,
        k: usize,
    },
    /// DN: λ·⟨q, μ_G⟩ − λ²·⟨μ_Q, μ_G⟩, so the score is ⟨q − λμ_Q, g − λμ_G⟩.
    DistributionShift {
        lambda: f64,
        gallery_mean: Vec<f64>,
        constant: f64,
    },
}

/// A method's rule for turning scorings into its reported results.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodRule {
    pub spec: MethodSpec,
    pub selection: Selection,
    pub query_term: QueryTerm,
}

impl MethodRule {
    /// Whether the bf16 screen leaves its results exact: every scoring it
    /// reports from (and its query term's raw scoring) is a subtraction
    /// s − h(g), the one form whose order the screen's bound carries over,
    /// or it reports from none (a single-query method has states of its own).
    pub fn fits_screen(&self, scorings: &[Scoring]) -> bool {
        let subtracts = |i: usize| matches!(scorings[i], Scoring::Subtract(_));
        let selected = match &self.selection {
            Selection::SingleQuery => true,
            Selection::Fixed(i) => subtracts(*i),
            Selection::Gated { raw, choices, .. } => {
                subtracts(*raw) && choices.iter().all(|&i| subtracts(i))
            }
        };
        selected
            && match self.query_term {
                QueryTerm::HalfNeighbourMean { raw, .. } => subtracts(raw),
                QueryTerm::None | QueryTerm::DistributionShift { .. } => true,
            }
    }
}

/// Everything pass 2 computes: the scorings and the methods reported from them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScoringPlan {
    pub scorings: Vec<Scoring>,
    pub methods: Vec<MethodRule>,
}

impl ScoringPlan {
    /// Adds a scoring and returns its index; an identical scoring already
    /// there is reused (e.g. `is` and `dis` with the same β), so the kernel
    /// computes it once.
    pub fn add_scoring(&mut self, scoring: Scoring) -> usize {
        if let Some(i) = self.scorings.iter().position(|s| *s == scoring) {
            return i;
        }
        self.scorings.push(scoring);
        self.scorings.len() - 1
    }

    /// The index of the raw scoring, adding it when absent.
    pub fn raw_scoring(&mut self, gallery_rows: usize) -> usize {
        self.add_scoring(Scoring::raw(gallery_rows))
    }

    /// Its methods, in order.
    pub fn method_specs(&self) -> Vec<MethodSpec> {
        self.methods.iter().map(|m| m.spec).collect()
    }

    /// The largest k any query term needs from the raw top-k.
    pub fn neighbours_needed(&self) -> usize {
        self.methods
            .iter()
            .map(|m| match m.query_term {
                QueryTerm::HalfNeighbourMean { k, .. } => k,
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// Bytes held (corrections, sorted similarities, activation sets).
    pub fn memory_bytes(&self) -> usize {
        self.scorings
            .iter()
            .map(Scoring::memory_bytes)
            .sum::<usize>()
            + self
                .methods
                .iter()
                .map(|m| match &m.selection {
                    Selection::Gated { sets, .. } => sets.iter().map(Vec::len).sum(),
                    Selection::Fixed(_) | Selection::SingleQuery => 0,
                })
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_scorings_are_computed_once() {
        let mut plan = ScoringPlan::default();
        let raw = plan.raw_scoring(3);
        let is = plan.add_scoring(Scoring::Subtract(vec![0.1, 0.2, 0.3]));
        assert_eq!(plan.add_scoring(Scoring::Subtract(vec![0.1, 0.2, 0.3])), is);
        assert_eq!(plan.raw_scoring(3), raw);
        assert_ne!(raw, is);
        assert_eq!(plan.scorings.len(), 2);
    }

    #[test]
    fn a_rule_fits_the_screen_only_when_every_scoring_it_reads_subtracts() {
        let spec = MethodSpec::new("is", &[]).unwrap();
        let scorings = vec![
            Scoring::raw(2),
            Scoring::Subtract(vec![0.1, 0.2]),
            Scoring::BankRank {
                sorted: vec![0.0; 2],
                width: 1,
            },
        ];
        let rule = |selection, query_term| MethodRule {
            spec,
            selection,
            query_term,
        };
        let gated = |choices: Vec<usize>| Selection::Gated {
            raw: 0,
            sets: vec![vec![true, false]],
            choices,
        };
        let neighbours = |raw| QueryTerm::HalfNeighbourMean { raw, k: 1 };
        let fitting = [
            rule(Selection::Fixed(1), QueryTerm::None),
            rule(gated(vec![0, 1]), QueryTerm::None),
            rule(Selection::Fixed(1), neighbours(0)),
            rule(Selection::SingleQuery, QueryTerm::None),
        ];
        let otherwise = [
            rule(Selection::Fixed(2), QueryTerm::None),
            rule(gated(vec![0, 2]), QueryTerm::None),
            rule(Selection::Fixed(1), neighbours(2)),
        ];
        for r in &fitting {
            assert!(r.fits_screen(&scorings), "{r:?}");
        }
        for r in &otherwise {
            assert!(!r.fits_screen(&scorings), "{r:?}");
        }
    }
}
