//! The mergeable per-gallery (and per-bank-item) states of pass 1 that are
//! not kernel types. Each is a plain struct with `Default` (the empty state)
//! and an associative `merge`, so partial results of bank chunks, gallery
//! chunks or machines combine into the result of one pass.
//! (The others: [`crate::kernel::LogSumExp`] for IS/DIS/DualIS,
//! [`crate::kernel::TopValues`] for NNN/CSLS.)

use crate::kernel::{Candidate, TopK};

/// Every bank similarity of one gallery item, sorted ascending (`gc`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SortedSimilarities {
    values: Vec<f32>,
}

impl SortedSimilarities {
    /// From similarities in any order.
    pub fn from_unsorted(mut values: Vec<f32>) -> Self {
        values.sort_unstable_by(f32::total_cmp);
        SortedSimilarities { values }
    }

    /// The similarities, ascending.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Number of bank similarities strictly above `s`.
    pub fn count_above(&self, s: f32) -> usize {
        crate::kernel::count_above(&self.values, s)
    }

    /// Merges two sorted lists (the bank split in two).
    pub fn merge(&mut self, other: &SortedSimilarities) {
        let mut merged = Vec::with_capacity(self.values.len() + other.values.len());
        let (a, b) = (&self.values, &other.values);
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            if a[i].total_cmp(&b[j]).is_le() {
                merged.push(a[i]);
                i += 1;
            } else {
                merged.push(b[j]);
                j += 1;
            }
        }
        merged.extend_from_slice(&a[i..]);
        merged.extend_from_slice(&b[j..]);
        self.values = merged;
    }
}

/// The sum and count of embedding rows, in f64: the mean of a bank (`dn`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VectorMean {
    sum: Vec<f64>,
    count: u64,
}

impl VectorMean {
    /// Adds the rows of a row-major block of dimension `dim`.
    pub fn add_rows(&mut self, data: &[f32], dim: usize) {
        if dim == 0 {
            return;
        }
        if self.sum.is_empty() {
            self.sum = vec![0.0; dim];
        }
        for row in data.chunks_exact(dim) {
            for (acc, &v) in self.sum.iter_mut().zip(row) {
                *acc += v as f64;
            }
            self.count += 1;
        }
    }

    pub fn merge(&mut self, other: &VectorMean) {
        if self.sum.is_empty() {
            self.sum = vec![0.0; other.sum.len()];
        }
        for (a, b) in self.sum.iter_mut().zip(&other.sum) {
            *a += b;
        }
        self.count += other.count;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The mean row (empty when no row was added).
    pub fn mean(&self) -> Vec<f64> {
        let n = self.count.max(1) as f64;
        self.sum.iter().map(|s| s / n).collect()
    }
}

/// Each bank item's best gallery items so far (DIS activation sets). The
/// gallery arrives in chunks, so a bank item's top-k_A is only final after
/// the last chunk: this state holds one bounded [`TopK`] per bank item
/// (m × k_A candidates, never the bank × gallery matrix) and merges across
/// gallery chunks element by element.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActivationState {
    per_bank_item: Vec<TopK>,
}

impl ActivationState {
    /// Empty state for `bank_rows` bank items and activation k `k`.
    pub fn new(bank_rows: usize, k: usize) -> Self {
        ActivationState {
            per_bank_item: vec![TopK::new(k); bank_rows],
        }
    }

    /// Merges the top-k of bank items `first..first + tops.len()` over some
    /// gallery columns.
    pub fn merge_rows(&mut self, first: usize, tops: &[TopK]) {
        if self.per_bank_item.len() < first + tops.len() {
            self.per_bank_item
                .resize(first + tops.len(), TopK::default());
        }
        for (state, top) in self.per_bank_item[first..].iter_mut().zip(tops) {
            state.merge(top);
        }
    }

    /// Merges another partial state (another gallery chunk, or bank items
    /// appended when `other` is longer).
    pub fn merge(&mut self, other: &ActivationState) {
        self.merge_rows(0, &other.per_bank_item);
    }

    /// The same state keeping only the best `k` items per bank item.
    pub fn truncated(&self, k: usize) -> ActivationState {
        ActivationState {
            per_bank_item: self
                .per_bank_item
                .iter()
                .map(|top| {
                    let mut kept = TopK::new(k);
                    top.sorted().into_iter().for_each(|c| kept.push(c));
                    kept
                })
                .collect(),
        }
    }

    /// Bank items tracked.
    pub fn rows(&self) -> usize {
        self.per_bank_item.len()
    }

    /// Every kept (bank row, candidate) pair, bank rows ascending and each
    /// bank row's candidates best first (a checkpoint's contents).
    pub fn entries(&self) -> impl Iterator<Item = (u32, Candidate)> + '_ {
        self.per_bank_item
            .iter()
            .enumerate()
            .flat_map(|(row, top)| top.sorted().into_iter().map(move |c| (row as u32, c)))
    }

    /// Offers `candidate` to bank row `row` (restoring a checkpoint).
    pub fn offer(&mut self, row: usize, candidate: Candidate) {
        self.per_bank_item[row].push(candidate);
    }

    /// The activation set: whether each of `gallery_rows` items is in the
    /// top-k_A of at least one bank item.
    pub fn activated(&self, gallery_rows: usize) -> Vec<bool> {
        let mut active = vec![false; gallery_rows];
        for top in &self.per_bank_item {
            for c in top.sorted() {
                active[c.row as usize] = true;
            }
        }
        active
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Candidate;

    #[test]
    fn sorted_similarities_merge_and_count() {
        let mut a = SortedSimilarities::from_unsorted(vec![0.5, -0.2, 0.9]);
        let b = SortedSimilarities::from_unsorted(vec![0.1, 0.9, 0.3]);
        a.merge(&b);
        assert_eq!(a.values(), &[-0.2, 0.1, 0.3, 0.5, 0.9, 0.9]);
        assert_eq!(a.count_above(0.5), 2);
        assert_eq!(a.count_above(0.9), 0);
        assert_eq!(a.count_above(-1.0), 6);
    }

    #[test]
    fn means_merge() {
        let mut a = VectorMean::default();
        a.add_rows(&[1.0, 2.0, 3.0, 4.0], 2);
        let mut b = VectorMean::default();
        b.add_rows(&[5.0, 6.0], 2);
        a.merge(&b);
        assert_eq!(a.mean(), vec![3.0, 4.0]);
        assert_eq!(a.count(), 3);
    }

    #[test]
    fn activation_merges_across_gallery_chunks() {
        let cand = |score, row| Candidate {
            score,
            raw: score,
            row,
        };
        let mut chunk1 = ActivationState::new(2, 1);
        let mut t = TopK::new(1);
        t.push(cand(0.9, 0));
        let mut u = TopK::new(1);
        u.push(cand(0.1, 1));
        chunk1.merge_rows(0, &[t, u]);
        let mut chunk2 = ActivationState::new(2, 1);
        let mut t = TopK::new(1);
        t.push(cand(0.5, 4));
        let mut u = TopK::new(1);
        u.push(cand(0.7, 3));
        chunk2.merge_rows(0, &[t, u]);
        chunk1.merge(&chunk2);
        assert_eq!(chunk1.activated(5), vec![true, false, false, true, false]);
    }
}
