//! Retrieval quality from full-gallery ranks (REPORTS.md): R@K, MRR.

use serde::Serialize;

/// Accumulates full-gallery ranks of the ground truth (1-based, ties counted
/// as half). A monoid: `Default` is empty and `merge` adds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetrievalMetrics {
    pub queries: u64,
    /// Queries with rank ≤ K, for K in [`RetrievalMetrics::CUTOFFS`].
    pub hits: [u64; 3],
    pub reciprocal_rank_sum: f64,
    pub rank_sum: f64,
}

/// Summary figures of [`RetrievalMetrics`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RecallSummary {
    #[serde(rename = "R@1")]
    pub r1: f64,
    #[serde(rename = "R@5")]
    pub r5: f64,
    #[serde(rename = "R@10")]
    pub r10: f64,
    #[serde(rename = "MRR")]
    pub mrr: f64,
    #[serde(rename = "MnR")]
    pub mean_rank: f64,
    pub queries: u64,
}

impl RetrievalMetrics {
    /// The K of R@K.
    pub const CUTOFFS: [f64; 3] = [1.0, 5.0, 10.0];

    pub fn add_rank(&mut self, rank: f64) {
        self.queries += 1;
        for (hit, k) in self.hits.iter_mut().zip(Self::CUTOFFS) {
            *hit += (rank <= k) as u64;
        }
        self.reciprocal_rank_sum += 1.0 / rank;
        self.rank_sum += rank;
    }

    pub fn merge(&mut self, other: &RetrievalMetrics) {
        self.queries += other.queries;
        self.hits
            .iter_mut()
            .zip(other.hits)
            .for_each(|(a, b)| *a += b);
        self.reciprocal_rank_sum += other.reciprocal_rank_sum;
        self.rank_sum += other.rank_sum;
    }

    /// Fractions in [0, 1]; `None` when no query had ground truth.
    pub fn summary(&self) -> Option<RecallSummary> {
        (self.queries > 0).then(|| {
            let n = self.queries as f64;
            RecallSummary {
                r1: self.hits[0] as f64 / n,
                r5: self.hits[1] as f64 / n,
                r10: self.hits[2] as f64 / n,
                mrr: self.reciprocal_rank_sum / n,
                mean_rank: self.rank_sum / n,
                queries: self.queries,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_ties_miss_recall_at_one() {
        let mut m = RetrievalMetrics::default();
        [1.0, 1.5, 3.0, 12.0].iter().for_each(|&r| m.add_rank(r));
        let s = m.summary().unwrap();
        assert_eq!((s.r1, s.r5, s.r10), (0.25, 0.75, 0.75));
        assert!((s.mrr - (1.0 + 1.0 / 1.5 + 1.0 / 3.0 + 1.0 / 12.0) / 4.0).abs() < 1e-12);
    }
}
