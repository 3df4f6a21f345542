//! k-occurrence and the hubness measures of REPORTS.md.

use serde::Serialize;

/// N_k(g): how many queries have gallery item g in their top-k list, over
/// all gallery items (items never retrieved count as 0). A monoid: `Default`
/// is empty and [`KOccurrence::merge`] adds counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KOccurrence {
    /// The k of the top-k lists counted.
    pub k: usize,
    /// Queries counted.
    pub queries: u64,
    /// One count per gallery item.
    pub counts: Vec<u32>,
}

impl KOccurrence {
    pub fn new(k: usize, gallery_items: usize) -> Self {
        KOccurrence {
            k,
            queries: 0,
            counts: vec![0; gallery_items],
        }
    }

    /// Counts one query's top-k list (gallery rows, best first; only the
    /// first `k` are counted).
    pub fn add_list(&mut self, rows: impl IntoIterator<Item = u32>) {
        for row in rows.into_iter().take(self.k) {
            self.counts[row as usize] += 1;
        }
        self.queries += 1;
    }

    pub fn merge(&mut self, other: &KOccurrence) {
        if self.counts.is_empty() {
            *self = other.clone();
            return;
        }
        assert_eq!(self.counts.len(), other.counts.len(), "same gallery");
        self.queries += other.queries;
        self.counts
            .iter_mut()
            .zip(&other.counts)
            .for_each(|(a, b)| *a += b);
    }

    /// Skewness of the k-occurrence distribution (biased, population moments).
    pub fn skewness(&self) -> f64 {
        skewness(self.counts.iter().map(|&c| c as f64))
    }

    /// Every measure of REPORTS.md, with the `top_hubs` most retrieved items.
    pub fn measures(&self, top_hubs: usize) -> HubnessMeasures {
        HubnessMeasures::new(self, top_hubs)
    }

    /// (N_k value, gallery items with that value), ascending, only values
    /// that occur: the k-occurrence distribution as the papers plot it.
    pub fn histogram(&self) -> Vec<(u32, u64)> {
        let mut sorted = self.counts.clone();
        sorted.sort_unstable();
        let mut histogram: Vec<(u32, u64)> = Vec::new();
        for c in sorted {
            match histogram.last_mut() {
                Some((value, items)) if *value == c => *items += 1,
                _ => histogram.push((c, 1)),
            }
        }
        histogram
    }
}

/// The hubness measures of one set of top-k lists (REPORTS.md). Correct when
/// the number of queries differs from the number of gallery items: the mean
/// μ = Σ N_k / n_g, which is k·n_q / n_g when every list holds k items.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HubnessMeasures {
    pub k: usize,
    pub queries: u64,
    pub gallery_items: u64,
    /// μ, the mean k-occurrence.
    pub mean: f64,
    /// m₃ / m₂^{3/2} (biased), as `scipy.stats.skew`.
    pub skewness: f64,
    /// m₄ / m₂² − 3 (excess, biased).
    pub kurtosis: f64,
    /// max_g N_k(g).
    pub max: u32,
    /// |{g : N_k(g) = 0}| / n_g.
    pub antihub_rate: f64,
    /// Σ_{g: N_k(g) ≥ 2k} N_k(g) / (k·n_q).
    pub hub_occurrence: f64,
    /// The same with threshold 2μ.
    pub hub_occurrence_relative: f64,
    /// ½·Σ_g |N_k(g) − μ| / Σ_g N_k(g).
    pub robin_hood: f64,
    /// Σᵢ Σⱼ |Nᵢ − Nⱼ| / (2·n_g·Σ N), by sorting.
    pub gini: f64,
    /// 1 − mean(√N)² / μ (ε = 0.5).
    pub atkinson: f64,
    /// max N_k / (k·n_q).
    pub groupie_ratio: f64,
    /// The most retrieved gallery rows with their N_k, most first (ties by row).
    pub top_hubs: Vec<(u32, u32)>,
}

impl HubnessMeasures {
    /// The measures' names as in REPORTS.md (snake_case), in report order.
    pub const NAMES: [&'static str; 10] = [
        "skewness",
        "kurtosis",
        "max",
        "antihub_rate",
        "hub_occurrence",
        "hub_occurrence_relative",
        "robin_hood",
        "gini",
        "atkinson",
        "groupie_ratio",
    ];

    fn new(occurrence: &KOccurrence, top_hubs: usize) -> Self {
        let counts = &occurrence.counts;
        let n = counts.len() as f64;
        // Query slots filled: k·n_q when every list has k items.
        let total: f64 = counts.iter().map(|&c| c as f64).sum();
        let mean = total / n;
        let (mut m2, mut m3, mut m4) = (0f64, 0f64, 0f64);
        for &c in counts {
            let d = c as f64 - mean;
            m2 += d * d;
            m3 += d * d * d;
            m4 += d * d * d * d;
        }
        let (m2, m3, m4) = (m2 / n, m3 / n, m4 / n);
        let constant = m2 == 0.0;
        let max = counts.iter().copied().max().unwrap_or(0);
        let occurrence_above = |threshold: f64| -> f64 {
            counts
                .iter()
                .filter(|&&c| c as f64 >= threshold)
                // A fold from +0: an empty f64 `sum()` is −0, printed as "-0.0".
                .fold(0.0, |acc, &c| acc + c as f64)
                / total
        };
        let mut sorted = counts.clone();
        sorted.sort_unstable();
        // Σᵢ Σⱼ |xᵢ − xⱼ| = 2·Σᵢ (2i − n − 1)·x₍ᵢ₎ over the ascending order (i from 1).
        let weighted: f64 = sorted
            .iter()
            .enumerate()
            .map(|(i, &x)| (2.0 * (i as f64 + 1.0) - n - 1.0) * x as f64)
            .sum();
        let root_mean = counts.iter().map(|&c| (c as f64).sqrt()).sum::<f64>() / n;
        let mut hubs: Vec<(u32, u32)> = counts
            .iter()
            .enumerate()
            .map(|(row, &c)| (row as u32, c))
            .collect();
        let top = top_hubs.min(hubs.len());
        if top > 0 && top < hubs.len() {
            hubs.select_nth_unstable_by(top - 1, |a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        }
        hubs.truncate(top);
        hubs.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        HubnessMeasures {
            k: occurrence.k,
            queries: occurrence.queries,
            gallery_items: counts.len() as u64,
            mean,
            skewness: if constant { 0.0 } else { m3 / m2.powf(1.5) },
            kurtosis: if constant { 0.0 } else { m4 / (m2 * m2) - 3.0 },
            max,
            antihub_rate: counts.iter().filter(|&&c| c == 0).count() as f64 / n,
            hub_occurrence: occurrence_above(2.0 * occurrence.k as f64),
            hub_occurrence_relative: occurrence_above(2.0 * mean),
            robin_hood: 0.5 * counts.iter().map(|&c| (c as f64 - mean).abs()).sum::<f64>() / total,
            gini: weighted / (n * total),
            atkinson: 1.0 - root_mean * root_mean / mean,
            groupie_ratio: max as f64 / total,
            top_hubs: hubs,
        }
    }

    /// (name, value) of every measure in [`HubnessMeasures::NAMES`] order.
    pub fn values(&self) -> [(&'static str, f64); 10] {
        let v = [
            self.skewness,
            self.kurtosis,
            self.max as f64,
            self.antihub_rate,
            self.hub_occurrence,
            self.hub_occurrence_relative,
            self.robin_hood,
            self.gini,
            self.atkinson,
            self.groupie_ratio,
        ];
        std::array::from_fn(|i| (Self::NAMES[i], v[i]))
    }
}

/// m₃ / m₂^{3/2} with population (biased) moments, as `scipy.stats.skew`.
/// 0 for a constant distribution.
pub fn skewness(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let (n, sum) = values
        .clone()
        .fold((0f64, 0f64), |(n, s), v| (n + 1.0, s + v));
    if n == 0.0 {
        return f64::NAN;
    }
    let mean = sum / n;
    let (m2, m3) = values.fold((0f64, 0f64), |(m2, m3), v| {
        let d = v - mean;
        (m2 + d * d, m3 + d * d * d)
    });
    let (m2, m3) = (m2 / n, m3 / n);
    if m2 == 0.0 {
        0.0
    } else {
        m3 / m2.powf(1.5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With no item at 2k or more, the hub occurrence is +0, not −0 (an empty
    /// f64 sum is −0, which the summary would print as "-0.0").
    #[test]
    fn no_hubs_give_a_positive_zero() {
        let occurrence = KOccurrence {
            k: 2,
            queries: 4,
            counts: vec![2, 2, 2, 2],
        };
        let m = occurrence.measures(0);
        assert_eq!(m.hub_occurrence.to_bits(), 0f64.to_bits());
        assert_eq!(m.hub_occurrence_relative.to_bits(), 0f64.to_bits());
    }
}
