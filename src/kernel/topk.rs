//! Bounded top-k selection with a deterministic order.
//!
//! Entries are ordered by score (higher is better) and, on equal scores, by
//! the smaller gallery row, so every result is reproducible whatever the block
//! sizes, thread count or merge order.

/// One candidate: corrected score, raw similarity, gallery row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub score: f32,
    pub raw: f32,
    pub row: u32,
}

impl Candidate {
    /// Whether `self` ranks before `other` (higher score, then smaller row).
    #[inline(always)]
    pub fn beats(&self, other: &Candidate) -> bool {
        self.score > other.score || (self.score == other.score && self.row < other.row)
    }

    /// Whether `self` ranks before `other` when equal scores are broken by
    /// the raw similarity first (globally corrected retrieval, whose scores
    /// are integer ranks), then by the smaller row.
    #[inline(always)]
    pub fn beats_by_raw(&self, other: &Candidate) -> bool {
        self.score > other.score
            || (self.score == other.score
                && (self.raw > other.raw || (self.raw == other.raw && self.row < other.row)))
    }
}

/// How equal scores are ordered in a [`TopK`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TieBreak {
    /// The smaller gallery row first (every additive method).
    #[default]
    Row,
    /// The larger raw similarity first, then the smaller row (`gc`).
    RawThenRow,
}

impl TieBreak {
    /// Whether `a` ranks before `b` under this rule.
    #[inline(always)]
    fn ranks_before(self, a: &Candidate, b: &Candidate) -> bool {
        match self {
            TieBreak::Row => a.beats(b),
            TieBreak::RawThenRow => a.beats_by_raw(b),
        }
    }
}

/// The `k` best candidates seen so far, kept as a binary min-heap whose root
/// is the worst kept entry. A plain struct with `Default` (empty, k = 0) and
/// an associative [`TopK::merge`], so partial results of blocks combine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopK {
    k: usize,
    ties: TieBreak,
    heap: Vec<Candidate>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self::with_ties(k, TieBreak::Row)
    }

    /// A top-k whose equal scores are ordered by `ties`.
    pub fn with_ties(k: usize, ties: TieBreak) -> Self {
        TopK {
            k,
            ties,
            heap: Vec::with_capacity(k),
        }
    }

    pub fn ties(&self) -> TieBreak {
        self.ties
    }

    #[inline(always)]
    fn beats(&self, a: &Candidate, b: &Candidate) -> bool {
        self.ties.ranks_before(a, b)
    }

    /// The best candidate kept, if any.
    pub fn best(&self) -> Option<Candidate> {
        let mut best: Option<Candidate> = None;
        for c in &self.heap {
            if best.is_none_or(|b| self.beats(c, &b)) {
                best = Some(*c);
            }
        }
        best
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// A score must be strictly above this to enter (−∞ until k entries are
    /// kept). Valid as a prefilter when candidates arrive in increasing row
    /// order: an equal score then always loses its tie against the kept entry.
    #[inline(always)]
    pub fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.heap.first().map_or(f32::INFINITY, |c| c.score)
        }
    }

    /// Offers one candidate.
    #[inline]
    pub fn push(&mut self, candidate: Candidate) {
        let ties = self.ties;
        offer(&mut self.heap, self.k, candidate, |a, b| {
            ties.ranks_before(a, b)
        });
    }

    /// Adds every entry of `other` (same k and tie rule). Associative and commutative.
    pub fn merge(&mut self, other: &TopK) {
        if self.k < other.k {
            self.k = other.k;
        }
        if self.heap.is_empty() {
            self.ties = other.ties;
        }
        for c in &other.heap {
            self.push(*c);
        }
    }

    /// The kept entries, best first.
    pub fn sorted(&self) -> Vec<Candidate> {
        let mut out = self.heap.clone();
        out.sort_by(|a, b| {
            if self.beats(a, b) {
                std::cmp::Ordering::Less
            } else if self.beats(b, a) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        out
    }
}

/// The `k` largest values seen so far (no rows: the bank neighbours of a
/// gallery item for NNN and CSLS), kept as a binary min-heap. A plain struct
/// with `Default` (empty, k = 0) and an associative, commutative
/// [`TopValues::merge`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopValues {
    k: usize,
    heap: Vec<f32>,
}

impl TopValues {
    pub fn new(k: usize) -> Self {
        TopValues {
            k,
            heap: Vec::with_capacity(k),
        }
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// A value must be strictly above this to change the kept set.
    #[inline(always)]
    pub fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.heap.first().map_or(f32::INFINITY, |&v| v)
        }
    }

    /// Offers one value.
    #[inline]
    pub fn push(&mut self, value: f32) {
        offer(&mut self.heap, self.k, value, |a: &f32, b: &f32| a > b);
    }

    /// Adds every value of `other`; the larger k wins.
    pub fn merge(&mut self, other: &TopValues) {
        self.k = self.k.max(other.k);
        other.heap.iter().for_each(|&v| self.push(v));
    }

    /// The kept values, largest first.
    pub fn sorted(&self) -> Vec<f32> {
        let mut out = self.heap.clone();
        out.sort_by(|a, b| b.total_cmp(a));
        out
    }

    /// Mean of the `k` largest values kept (of all kept when fewer), summed
    /// in f64 from the largest down; `None` when empty.
    pub fn mean_of_largest(&self, k: usize) -> Option<f64> {
        let sorted = self.sorted();
        let take = k.min(sorted.len());
        (take > 0).then(|| sorted[..take].iter().map(|&v| v as f64).sum::<f64>() / take as f64)
    }
}

/// Offers `item` to a bounded binary min-heap of at most `k` entries whose
/// root is the worst kept entry under `better` (a strict order): pushed while
/// there is room, otherwise it replaces the root when it is better.
#[inline]
fn offer<T: Copy>(heap: &mut Vec<T>, k: usize, item: T, better: impl Fn(&T, &T) -> bool) {
    if heap.len() < k {
        heap.push(item);
        // Move up while the parent is better (the root holds the worst).
        let mut i = heap.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if better(&heap[parent], &heap[i]) {
                heap.swap(parent, i);
                i = parent;
            } else {
                break;
            }
        }
    } else if k > 0 && better(&item, &heap[0]) {
        heap[0] = item;
        let n = heap.len();
        let mut i = 0;
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut worst = i;
            if l < n && better(&heap[worst], &heap[l]) {
                worst = l;
            }
            if r < n && better(&heap[worst], &heap[r]) {
                worst = r;
            }
            if worst == i {
                break;
            }
            heap.swap(i, worst);
            i = worst;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(scores: &[f32]) -> Vec<Candidate> {
        scores
            .iter()
            .enumerate()
            .map(|(row, &score)| Candidate {
                score,
                raw: score,
                row: row as u32,
            })
            .collect()
    }

    /// Full sort with the same tie rule: the reference.
    fn reference(all: &[Candidate], k: usize) -> Vec<Candidate> {
        let mut v = all.to_vec();
        v.sort_by(|a, b| {
            b.score
                .partial_cmp(&a.score)
                .unwrap()
                .then(a.row.cmp(&b.row))
        });
        v.truncate(k);
        v
    }

    #[test]
    fn matches_full_sort_with_ties() {
        // Scores on a coarse grid so that ties are frequent.
        let scores: Vec<f32> = (0..500).map(|i| ((i * 7919) % 13) as f32 / 4.0).collect();
        let all = candidates(&scores);
        for k in [0, 1, 3, 10, 37, 499, 500, 600] {
            let mut top = TopK::new(k);
            all.iter().for_each(|c| top.push(*c));
            assert_eq!(top.sorted(), reference(&all, k), "k = {k}");
        }
    }

    #[test]
    fn merge_in_any_order_equals_one_pass() {
        let scores: Vec<f32> = (0..300).map(|i| ((i * 104_729) % 17) as f32).collect();
        let all = candidates(&scores);
        let mut one = TopK::new(12);
        all.iter().for_each(|c| one.push(*c));
        // Uneven parts, one empty and one single row, merged back to front.
        let cuts = [0, 0, 1, 90, 91, 300];
        let mut merged = TopK::default();
        for w in cuts.windows(2).rev() {
            let mut part = TopK::new(12);
            all[w[0]..w[1]].iter().for_each(|c| part.push(*c));
            merged.merge(&part);
        }
        assert_eq!(merged.sorted(), one.sorted());
    }

    #[test]
    fn top_values_keep_the_largest_and_merge() {
        let values: Vec<f32> = (0..200).map(|i| ((i * 7919) % 101) as f32).collect();
        let mut expected = values.clone();
        expected.sort_by(|a, b| b.total_cmp(a));
        let mut one = TopValues::new(16);
        values.iter().for_each(|&v| one.push(v));
        assert_eq!(one.sorted(), expected[..16].to_vec());
        let mut merged = TopValues::default();
        for part in values.chunks(37).rev() {
            let mut p = TopValues::new(16);
            part.iter().for_each(|&v| p.push(v));
            merged.merge(&p);
        }
        assert_eq!(merged.sorted(), one.sorted());
        let mean = expected[..4].iter().map(|&v| v as f64).sum::<f64>() / 4.0;
        assert_eq!(one.mean_of_largest(4), Some(mean));
    }

    #[test]
    fn raw_tie_break_orders_equal_scores_by_raw_then_row() {
        let cands = [(1.0, 0.5, 3), (1.0, 0.7, 4), (1.0, 0.7, 2), (2.0, 0.1, 9)];
        let mut top = TopK::with_ties(3, TieBreak::RawThenRow);
        for (score, raw, row) in cands {
            top.push(Candidate { score, raw, row });
        }
        let rows: Vec<u32> = top.sorted().iter().map(|c| c.row).collect();
        assert_eq!(rows, vec![9, 2, 4]);
        assert_eq!(top.best().unwrap().row, 9);
    }
}
