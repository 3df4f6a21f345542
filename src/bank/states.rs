//! The mergeable per-gallery (and per-bank-item) states of pass 1 that are
//! not kernel types. Each is a plain struct with `Default` (the empty state)
//! and an associative `merge`, so partial results of bank chunks, gallery
//! chunks or machines combine into the result of one pass.
//! (The others: [`crate::kernel::LogSumExp`] for IS/DIS/DualIS,
//! [`crate::kernel::TopValues`] for NNN/CSLS.)

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView1, Axis};

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

/// Rows converted to f64 at a time by the moment computations: their only
/// memory beyond the d × d matrices (two copies of 256 × d f64).
const MOMENT_ROWS: usize = 256;

/// The mean of embedding rows and, when asked for, the sum of their
/// centred outer products M = Σ (x − m)(x − m)ᵀ, in f64: the mean of a bank
/// (`dn`) and its covariance (`mp`). Blocks and parts merge by Chan et
/// al.'s pairwise update, so a variance is never the difference of two
/// large second moments: a set of copies of one row has covariance exactly
/// 0, and small variances keep their digits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowMoments {
    count: u64,
    mean: Vec<f64>,
    /// M, d × d, when the covariance is tracked.
    centred: Option<Array2<f64>>,
}

impl RowMoments {
    /// An empty state that tracks the covariance too.
    pub fn with_covariance() -> Self {
        RowMoments {
            centred: Some(Array2::zeros((0, 0))),
            ..RowMoments::default()
        }
    }

    /// Adds the rows of a row-major block of dimension `dim`, a few hundred
    /// at a time (the f64 copy of a slice is all the extra memory).
    pub fn add_rows(&mut self, data: &[f32], dim: usize) {
        if dim == 0 {
            return;
        }
        for slice in data.chunks(MOMENT_ROWS * dim) {
            self.add_slice(slice, dim);
        }
    }

    fn add_slice(&mut self, data: &[f32], dim: usize) {
        let rows = data.len() / dim;
        if rows == 0 {
            return;
        }
        let mut x = Array2::from_shape_fn((rows, dim), |(i, j)| data[i * dim + j] as f64);
        let mean = x.mean_axis(Axis(0)).expect("rows").to_vec();
        let centred = self.centred.as_ref().map(|_| {
            x -= &ArrayView1::from(&mean);
            let mut m = Array2::zeros((dim, dim));
            general_mat_mul(1.0, &x.t(), &x, 0.0, &mut m);
            m
        });
        self.merge(&RowMoments {
            count: rows as u64,
            mean,
            centred,
        });
    }

    /// Adds another part's rows (Chan et al.: the means weighted by counts,
    /// M_a + M_b + δδᵀ·n_a·n_b/n with δ the difference of the means).
    pub fn merge(&mut self, other: &RowMoments) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            let tracked = self.centred.is_some();
            *self = other.clone();
            if !tracked {
                self.centred = None;
            }
            return;
        }
        let (na, nb) = (self.count as f64, other.count as f64);
        let n = na + nb;
        let delta: Vec<f64> = other
            .mean
            .iter()
            .zip(&self.mean)
            .map(|(b, a)| b - a)
            .collect();
        if let (Some(m), Some(theirs)) = (&mut self.centred, &other.centred) {
            *m += theirs;
            let d = ArrayView1::from(&delta);
            let outer = d
                .view()
                .insert_axis(Axis(1))
                .dot(&d.view().insert_axis(Axis(0)));
            m.scaled_add(na * nb / n, &outer);
        }
        for (a, d) in self.mean.iter_mut().zip(&delta) {
            *a += d * nb / n;
        }
        self.count += other.count;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The mean row (empty when no row was added).
    pub fn mean(&self) -> Vec<f64> {
        self.mean.clone()
    }

    /// M = Σ (x − m)(x − m)ᵀ, when tracked (d × d; 0 × 0 before any row).
    pub fn centred(&self) -> Option<&Array2<f64>> {
        self.centred.as_ref()
    }

    /// A state from its parts (as [`RowMoments::count`], [`RowMoments::mean`]
    /// and [`RowMoments::centred`] give them), e.g. a partial state read back.
    pub fn from_parts(count: u64, mean: Vec<f64>, centred: Option<Array2<f64>>) -> Self {
        RowMoments {
            count,
            mean,
            centred,
        }
    }

    /// The mean row and, when tracked, the covariance (1/n)·M.
    pub fn finish(&self) -> Moments {
        let n = self.count.max(1) as f64;
        Moments {
            rows: self.count,
            mean: self.mean.clone(),
            // Symmetric bit for bit, as the file's upper triangle stores it.
            covariance: self.centred.as_ref().map(|m| (m + &m.t()) / (2.0 * n)),
        }
    }
}

/// The mean row m and covariance Σ of a set of rows X (the second moment
/// C = Σ + m mᵀ): the mean and variance of s(y, x) over x ∈ X are ⟨y, m⟩
/// and yᵀΣy (METHODS.md, `mp`), with no pass over the pairs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Moments {
    pub rows: u64,
    pub mean: Vec<f64>,
    /// Σ, d × d (absent when only the mean was tracked).
    pub covariance: Option<Array2<f64>>,
}

impl Moments {
    /// The moments as text for a file's metadata: JSON with the row count,
    /// the mean, and the upper triangle of Σ row by row as base64 of
    /// little-endian f64 (exact, and a third of the size of decimal text).
    pub fn to_metadata(&self) -> String {
        let covariance = self.covariance.as_ref().map(|c| {
            let d = c.nrows();
            let mut bytes = Vec::with_capacity(d * (d + 1) / 2 * 8);
            for i in 0..d {
                for j in i..d {
                    bytes.extend_from_slice(&c[(i, j)].to_le_bytes());
                }
            }
            BASE64.encode(bytes)
        });
        serde_json::json!({
            "rows": self.rows,
            "mean": self.mean,
            "covariance_upper_f64le": covariance,
        })
        .to_string()
    }

    /// The moments from [`Moments::to_metadata`]'s text; the error says what
    /// is wrong with it.
    pub fn from_metadata(text: &str) -> std::result::Result<Moments, String> {
        #[derive(serde::Deserialize)]
        struct Stored {
            rows: u64,
            mean: Vec<f64>,
            covariance_upper_f64le: Option<String>,
        }
        let stored: Stored = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let d = stored.mean.len();
        let covariance = match stored.covariance_upper_f64le {
            None => None,
            Some(text) => {
                let bytes = BASE64.decode(text).map_err(|e| e.to_string())?;
                if bytes.len() != d * (d + 1) / 2 * 8 {
                    return Err(format!(
                        "covariance of {} bytes, not the {} of dimension {d}",
                        bytes.len(),
                        d * (d + 1) / 2 * 8
                    ));
                }
                let mut values = bytes
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")));
                let mut c = Array2::zeros((d, d));
                for i in 0..d {
                    for j in i..d {
                        let v = values.next().expect("counted");
                        c[(i, j)] = v;
                        c[(j, i)] = v;
                    }
                }
                Some(c)
            }
        };
        Ok(Moments {
            rows: stored.rows,
            mean: stored.mean,
            covariance,
        })
    }

    /// For each row y of the row-major block `data`: the mean and the
    /// population standard deviation of s(y, x) over the set, in f64.
    ///
    /// # Panics
    /// When the covariance was not tracked.
    pub fn similarity_moments(&self, data: &[f32], dim: usize) -> Vec<(f64, f64)> {
        let covariance = self.covariance.as_ref().expect("covariance tracked");
        if dim == 0 {
            return Vec::new();
        }
        let mean = ArrayView1::from(&self.mean);
        let mut out = Vec::with_capacity(data.len() / dim);
        for slice in data.chunks(MOMENT_ROWS * dim) {
            let rows = slice.len() / dim;
            let y = Array2::from_shape_fn((rows, dim), |(i, j)| slice[i * dim + j] as f64);
            let means = y.dot(&mean);
            let spread = y.dot(covariance);
            out.extend((0..rows).map(|i| {
                let variance = y.row(i).dot(&spread.row(i));
                (means[i], variance.max(0.0).sqrt())
            }));
        }
        out
    }

    /// Bytes held (the covariance dominates: d² f64).
    pub fn memory_bytes(&self) -> usize {
        self.mean.len() * 8 + self.covariance.as_ref().map_or(0, |c| c.len() * 8)
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

    /// Bank row `row`'s kept candidates, best first.
    pub fn top_of(&self, row: usize) -> Vec<Candidate> {
        self.per_bank_item
            .get(row)
            .map_or_else(Vec::new, TopK::sorted)
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
        let mut a = RowMoments::default();
        a.add_rows(&[1.0, 2.0, 3.0, 4.0], 2);
        let mut b = RowMoments::default();
        b.add_rows(&[5.0, 6.0], 2);
        a.merge(&b);
        assert_eq!(a.mean(), vec![3.0, 4.0]);
        assert_eq!(a.count(), 3);
        assert_eq!(a.finish().covariance, None);
    }

    /// The similarity moments from m and C equal those of the pairs, and
    /// survive the metadata text exactly.
    #[test]
    fn similarity_moments_match_the_pairs() {
        let set = [0.6f32, 0.8, 0.0, 1.0, -0.28, 0.96, 0.5, -0.5];
        let mut moments = RowMoments::with_covariance();
        moments.add_rows(&set[..4], 2);
        let mut rest = RowMoments::with_covariance();
        rest.add_rows(&set[4..], 2);
        moments.merge(&rest);
        let moments = moments.finish();
        let y = [0.3f32, -0.7];
        let sims: Vec<f64> = set
            .chunks(2)
            .map(|x| x[0] as f64 * y[0] as f64 + x[1] as f64 * y[1] as f64)
            .collect();
        let mean = sims.iter().sum::<f64>() / 4.0;
        let std = (sims.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / 4.0).sqrt();
        let (m, s) = moments.similarity_moments(&y, 2)[0];
        assert!(
            (m - mean).abs() < 1e-15 && (s - std).abs() < 1e-15,
            "{m} {s}"
        );
        let text = moments.to_metadata();
        assert_eq!(Moments::from_metadata(&text).unwrap(), moments);
        assert!(Moments::from_metadata(
            "{\"rows\": 1, \"mean\": [0.0], \"covariance_upper_f64le\": \"AA==\"}"
        )
        .is_err());
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
