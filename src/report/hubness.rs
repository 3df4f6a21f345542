//! k-occurrence and its skewness (REPORTS.md).

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

    /// The asymmetric fixture of spec/hubness-fixture.json (6 queries, 5 items, k = 2).
    #[test]
    fn reproduces_the_fixture_skewness() {
        let nn = [[0, 1], [0, 2], [0, 1], [0, 3], [1, 0], [2, 0]];
        let mut occ = KOccurrence::new(2, 5);
        nn.iter().for_each(|l| occ.add_list(l.iter().copied()));
        assert_eq!(occ.counts, vec![6, 3, 2, 1, 0]);
        assert!((occ.skewness() - 0.6927284074925395).abs() < 1e-9);
    }
}
