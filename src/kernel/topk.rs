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
}

/// The `k` best candidates seen so far, kept as a binary min-heap whose root
/// is the worst kept entry. A plain struct with `Default` (empty, k = 0) and
/// an associative [`TopK::merge`], so partial results of blocks combine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopK {
    k: usize,
    heap: Vec<Candidate>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        TopK {
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
        if self.heap.len() < self.k {
            self.heap.push(candidate);
            self.sift_up(self.heap.len() - 1);
        } else if self.k > 0 && candidate.beats(&self.heap[0]) {
            self.heap[0] = candidate;
            self.sift_down(0);
        }
    }

    /// Adds every entry of `other` (same k). Associative and commutative.
    pub fn merge(&mut self, other: &TopK) {
        if self.k < other.k {
            self.k = other.k;
        }
        for c in &other.heap {
            self.push(*c);
        }
    }

    /// The kept entries, best first.
    pub fn sorted(&self) -> Vec<Candidate> {
        let mut out = self.heap.clone();
        out.sort_by(|a, b| {
            if a.beats(b) {
                std::cmp::Ordering::Less
            } else if b.beats(a) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        out
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            // The root holds the worst entry: move up while we lose to the parent.
            if self.heap[parent].beats(&self.heap[i]) {
                self.heap.swap(parent, i);
                i = parent;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut worst = i;
            if l < n && self.heap[worst].beats(&self.heap[l]) {
                worst = l;
            }
            if r < n && self.heap[worst].beats(&self.heap[r]) {
                worst = r;
            }
            if worst == i {
                break;
            }
            self.heap.swap(i, worst);
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
}
