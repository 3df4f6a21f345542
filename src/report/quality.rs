//! Retrieval quality from full-gallery ranks (REPORTS.md): R@K with
//! percentile-bootstrap intervals, median and mean rank, MRR.

use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::ser::{Serialize, SerializeMap, Serializer};

/// How quality is summarised.
#[derive(Debug, Clone, PartialEq)]
pub struct QualityOptions {
    /// The K of R@K (default 1, 5, 10).
    pub recall_at: Vec<usize>,
    /// Bootstrap resamples over queries for the R@K intervals (0 = none).
    pub bootstrap: usize,
    /// Seed of the resamples.
    pub seed: u64,
}

impl Default for QualityOptions {
    fn default() -> Self {
        QualityOptions {
            recall_at: vec![1, 5, 10],
            bootstrap: 1000,
            seed: 0,
        }
    }
}

/// Full-gallery ranks of the ground truth (1-based, ties counted as half),
/// one per query in query order, and the queries without a usable target.
/// A monoid over consecutive query blocks: `Default` is empty and `merge`
/// appends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankList {
    pub ranks: Vec<f64>,
    /// Queries skipped because no target was in the gallery (`--skip-missing`).
    pub skipped: u64,
}

impl RankList {
    pub fn add_rank(&mut self, rank: f64) {
        self.ranks.push(rank);
    }

    pub fn add_skipped(&mut self) {
        self.skipped += 1;
    }

    /// Appends the ranks of the queries that follow this list's.
    pub fn merge(&mut self, other: &RankList) {
        self.ranks.extend_from_slice(&other.ranks);
        self.skipped += other.skipped;
    }

    /// The summary figures; `None` when no query had ground truth.
    pub fn summary(&self, options: &QualityOptions) -> Option<QualityReport> {
        if self.ranks.is_empty() {
            return None;
        }
        let n = self.ranks.len() as f64;
        let mut sorted = self.ranks.clone();
        sorted.sort_unstable_by(f64::total_cmp);
        let intervals = bootstrap_recall(&self.ranks, &options.recall_at, options);
        let recall = options
            .recall_at
            .iter()
            .zip(intervals)
            .map(|(&k, interval)| RecallAt {
                k,
                value: self.ranks.iter().filter(|&&r| r <= k as f64).count() as f64 / n,
                interval,
            })
            .collect();
        Some(QualityReport {
            queries: self.ranks.len() as u64,
            skipped: self.skipped,
            recall,
            median_rank: percentile(&sorted, 0.5),
            mean_rank: self.ranks.iter().sum::<f64>() / n,
            mrr: self.ranks.iter().map(|r| 1.0 / r).sum::<f64>() / n,
            truncated_at: None,
        })
    }
}

/// R@K as a fraction, with its 95% percentile-bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecallAt {
    pub k: usize,
    pub value: f64,
    /// (low, high); `None` without resamples.
    pub interval: Option<(f64, f64)>,
}

/// Quality of one method's ranking. Fractions in [0, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct QualityReport {
    /// Queries with a target in the gallery.
    pub queries: u64,
    /// Queries skipped because none of their targets is in the gallery.
    pub skipped: u64,
    pub recall: Vec<RecallAt>,
    /// MdR (the median of the ranks).
    pub median_rank: f64,
    /// MnR.
    pub mean_rank: f64,
    /// MRR, the mean of 1/rank.
    pub mrr: f64,
    /// Set when the ranks come from top-k lists (`hubnorm report`): a
    /// target beyond the list counts 0 in MRR (MRR@k), and MnR (and MdR when
    /// half the targets are beyond) is unknown (NaN).
    pub truncated_at: Option<usize>,
}

impl QualityReport {
    /// Marks ranks taken from lists of `k` items, where a miss is a rank
    /// somewhere beyond k (infinite here): unknown figures become NaN.
    pub fn truncated_at(mut self, k: usize) -> Self {
        self.truncated_at = Some(k);
        if !self.mean_rank.is_finite() {
            self.mean_rank = f64::NAN;
        }
        if !self.median_rank.is_finite() {
            self.median_rank = f64::NAN;
        }
        self
    }

    /// The name of the MRR figure: `mrr`, or `mrr_at_k` from top-k lists.
    pub fn mrr_name(&self) -> String {
        match self.truncated_at {
            Some(k) => format!("mrr_at_{k}"),
            None => "mrr".into(),
        }
    }

    /// R@K for this K, when it was asked for.
    pub fn recall_at(&self, k: usize) -> Option<f64> {
        self.recall.iter().find(|r| r.k == k).map(|r| r.value)
    }

    /// (name, value) of every known figure, snake_case, for tables and
    /// Parquet: `recall_at_K` with `recall_at_K_low`/`_high`, `median_rank`,
    /// `mean_rank`, `mrr` (or `mrr_at_k`).
    pub fn values(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for r in &self.recall {
            out.push((format!("recall_at_{}", r.k), r.value));
            if let Some((low, high)) = r.interval {
                out.push((format!("recall_at_{}_low", r.k), low));
                out.push((format!("recall_at_{}_high", r.k), high));
            }
        }
        out.push(("median_rank".into(), self.median_rank));
        out.push(("mean_rank".into(), self.mean_rank));
        out.push((self.mrr_name(), self.mrr));
        out.retain(|(_, v)| !v.is_nan());
        out
    }
}

/// `summary.json` keeps the names the papers print: `R@1`, `R@1_95ci`,
/// `MdR`, `MnR`, `MRR`.
impl Serialize for QualityReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for r in &self.recall {
            map.serialize_entry(&format!("R@{}", r.k), &r.value)?;
            if let Some((low, high)) = r.interval {
                map.serialize_entry(&format!("R@{}_95ci", r.k), &[low, high])?;
            }
        }
        if !self.median_rank.is_nan() {
            map.serialize_entry("MdR", &self.median_rank)?;
        }
        if !self.mean_rank.is_nan() {
            map.serialize_entry("MnR", &self.mean_rank)?;
        }
        match self.truncated_at {
            Some(k) => map.serialize_entry(&format!("MRR@{k}"), &self.mrr)?,
            None => map.serialize_entry("MRR", &self.mrr)?,
        }
        map.serialize_entry("queries_with_target", &self.queries)?;
        if self.skipped > 0 {
            map.serialize_entry("queries_skipped", &self.skipped)?;
        }
        map.end()
    }
}

/// Percentile-bootstrap 95% intervals of R@K for each K: `options.bootstrap`
/// resamples of the queries with replacement, each drawn from its own seeded
/// generator so the result does not depend on the thread count.
fn bootstrap_recall(
    ranks: &[f64],
    cutoffs: &[usize],
    options: &QualityOptions,
) -> Vec<Option<(f64, f64)>> {
    if options.bootstrap == 0 || ranks.is_empty() {
        return vec![None; cutoffs.len()];
    }
    let n = ranks.len();
    let resamples: Vec<Vec<f64>> = (0..options.bootstrap)
        .into_par_iter()
        .map(|b| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(resample_seed(options.seed, b as u64));
            let mut hits = vec![0u64; cutoffs.len()];
            for _ in 0..n {
                let rank = ranks[rng.random_range(0..n)];
                for (hit, &k) in hits.iter_mut().zip(cutoffs) {
                    *hit += (rank <= k as f64) as u64;
                }
            }
            hits.iter().map(|&h| h as f64 / n as f64).collect()
        })
        .collect();
    (0..cutoffs.len())
        .map(|c| {
            let mut values: Vec<f64> = resamples.iter().map(|r| r[c]).collect();
            values.sort_unstable_by(f64::total_cmp);
            Some((percentile(&values, 0.025), percentile(&values, 0.975)))
        })
        .collect()
}

/// SplitMix64 of (seed, resample): independent streams per resample.
fn resample_seed(seed: u64, resample: u64) -> u64 {
    let mut z = seed ^ resample.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The q-quantile of ascending `sorted` with linear interpolation between
/// order statistics (numpy's default), so the median of an even count is the
/// mean of the middle two.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let position = q * (sorted.len() - 1) as f64;
    let below = position.floor() as usize;
    let above = position.ceil() as usize;
    let weight = position - below as f64;
    sorted[below] + (sorted[above] - sorted[below]) * weight
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary_of(ranks: &[f64], options: &QualityOptions) -> QualityReport {
        let mut list = RankList::default();
        ranks.iter().for_each(|&r| list.add_rank(r));
        list.summary(options).unwrap()
    }

    #[test]
    fn half_ties_miss_recall_at_one() {
        let s = summary_of(&[1.0, 1.5, 3.0, 12.0], &QualityOptions::default());
        assert_eq!(
            (s.recall_at(1), s.recall_at(5), s.recall_at(10)),
            (Some(0.25), Some(0.75), Some(0.75))
        );
        assert!((s.mrr - (1.0 + 1.0 / 1.5 + 1.0 / 3.0 + 1.0 / 12.0) / 4.0).abs() < 1e-12);
        assert_eq!(s.median_rank, 2.25);
        assert_eq!(s.mean_rank, 17.5 / 4.0);
    }

    #[test]
    fn bootstrap_interval_brackets_the_estimate_and_is_seeded() {
        let ranks: Vec<f64> = (0..500).map(|i| (i % 7) as f64 + 1.0).collect();
        let options = QualityOptions::default();
        let a = summary_of(&ranks, &options);
        let b = summary_of(&ranks, &options);
        assert_eq!(a, b, "same seed, same intervals");
        for r in &a.recall {
            let (low, high) = r.interval.unwrap();
            assert!(low <= r.value && r.value <= high, "{r:?}");
        }
        // R@1 = 1/7 of 500 queries: the binomial standard error is ~0.0157,
        // so the 95% interval is ~±0.031 wide on each side.
        let (low, high) = a.recall[0].interval.unwrap();
        assert!((high - low) > 0.04 && (high - low) < 0.09, "{low} {high}");
        let other = summary_of(
            &ranks,
            &QualityOptions {
                seed: 1,
                ..options.clone()
            },
        );
        assert_ne!(a.recall[0].interval, other.recall[0].interval);
    }

    #[test]
    fn percentile_interpolates_like_numpy() {
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.25), 1.75);
        assert_eq!(percentile(&[5.0], 0.975), 5.0);
    }
}
