//! `ls` and `nicdm`: the local scaling methods of the hubness toolkits
//! (scikit-hubness `LocalScaling`), stated for retrieval with a bank
//! (METHODS.md, "Methods of the hubness toolkits, with banks").
//!
//! Both rescale the distance d(q, g) = sqrt(max(0, 2 − 2s)) (unit rows) by
//! the gallery item's own neighbourhood in the bank, N_k(g), the k bank
//! queries most similar to g:
//! - `ls` (Zelnik-Manor & Perona 2005): −d(q, g)² / σ_k(g), σ_k(g) the
//!   distance to the k-th nearest bank query;
//! - `nicdm` (Jégou et al. 2010): −d(q, g) / sqrt(r_k(g)), r_k(g) the mean
//!   distance to the k nearest bank queries.
//!
//! The query's own scale multiplies all its scores alike, so it is left
//! out. The state is the k largest bank similarities (as `nnn`'s), which
//! merges across bank parts. The distances come from similarities of unit
//! rows, so both refuse `--no-normalize`.

use arrow::array::ArrayRef;

use super::columns::{f64_array, list_array, merge_top_lists};
use super::{
    BankNeeds, ChunkContext, Domain, Export, InputSizes, Method, MethodSpec, Parameter,
    PlanContext, StatColumn, StoredRows,
};
use crate::error::{HubnormError, Result};
use crate::kernel::TopValues;
use crate::query::{MethodRule, QueryTerm, Scoring, Selection};

/// k of the local methods (ls, nicdm) and of dissim-local: the bank
/// neighbourhood of each gallery item (flag `--ls-k`, the first user's name).
pub const NEIGHBOURHOOD_K: Parameter = Parameter::new(
    "k",
    "k: the bank neighbourhood of each gallery item",
    5.0,
    Domain::Count { min: 1 },
)
.flag("ls-k")
.grid(&[3.0, 5.0, 10.0, 20.0, 50.0]);

/// The smallest scale accepted: a gallery item whose k nearest bank
/// queries coincide with it has no neighbourhood to scale by. Coincide
/// within rounding: a similarity of unit rows computed in f32 may be off by
/// some units in the last place of 1 (2⁻²⁴ each; 64 is a 4096-term dot
/// product's error in practice), and a distance sqrt(2 − 2s) below
/// sqrt(2 · 64 · 2⁻²⁴) = 2⁻⁸·⁵ ≈ 2.8e-3 is not told from 0.
const MIN_SCALE: f64 = 0.002_762_135_864_009_951_5;

const COLUMNS: [StatColumn; 2] = [StatColumn::f64("scale"), StatColumn::list("topk")];

/// Unit-row distance from a similarity: sqrt(max(0, 2 − 2s)).
pub(crate) fn distance(s: f32) -> f64 {
    (2.0 - 2.0 * s as f64).max(0.0).sqrt()
}

/// σ_k(g) of `ls`: the distance to the k-th nearest bank query, from the
/// similarities kept, descending.
fn kth_distance(top: &[f32], k: usize) -> f64 {
    top.get(k - 1).map_or(0.0, |&s| distance(s))
}

/// r_k(g) of `nicdm`: the mean distance to the k nearest bank queries.
fn mean_distance(top: &[f32], k: usize) -> f64 {
    let take = k.min(top.len());
    top[..take].iter().map(|&s| distance(s)).sum::<f64>() / take.max(1) as f64
}

/// The two local methods: which scale they divide by.
pub struct Local {
    /// `nicdm` (mean distance, square-rooted) rather than `ls` (k-th distance).
    nicdm: bool,
}

/// `ls`: −d(q, g)² / the distance to g's k-th nearest bank query.
pub const LS: Local = Local { nicdm: false };
/// `nicdm`: −d(q, g) / sqrt(the mean distance to g's k nearest bank queries).
pub const NICDM: Local = Local { nicdm: true };

impl Local {
    /// The scale column from descending top lists.
    fn scales<'a>(&self, k: usize, tops: impl Iterator<Item = &'a [f32]>) -> Vec<f64> {
        let scale = if self.nicdm {
            mean_distance
        } else {
            kth_distance
        };
        tops.map(|top| scale(top, k)).collect()
    }

    /// The scale column and the k largest similarities, from descending lists.
    fn state_columns(&self, k: usize, mut rows: Vec<Vec<f32>>) -> Vec<ArrayRef> {
        rows.iter_mut().for_each(|row| row.truncate(k));
        let scale = self.scales(k, rows.iter().map(Vec::as_slice));
        vec![f64_array(scale), list_array(rows)]
    }
}

impl Method for Local {
    fn name(&self) -> &'static str {
        if self.nicdm {
            "nicdm"
        } else {
            "ls"
        }
    }
    fn summary(&self) -> &'static str {
        if self.nicdm {
            "NICDM: −d(q, g) / sqrt(the mean distance to g's k nearest bank queries) (Jégou et al. 2010)"
        } else {
            "local scaling: −d(q, g)² / the distance to g's k-th nearest bank query (Zelnik-Manor & Perona 2005)"
        }
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[NEIGHBOURHOOD_K]
    }
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        if !sizes.normalized {
            return Err(HubnormError::Usage(format!(
                "method {} measures distances between unit rows and cannot run with --no-normalize",
                spec.kind()
            )));
        }
        super::nnn::check_k_within_bank(spec, "ls-k", sizes)
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_top_k(spec.count("k"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        COLUMNS.to_vec()
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let sorted = chunk.bank_top().iter().map(TopValues::sorted).collect();
        self.state_columns(spec.count("k"), sorted)
    }
    fn mergeable(&self) -> bool {
        true
    }
    fn merge(
        &self,
        spec: &MethodSpec,
        a: &StoredRows<'_>,
        b: Option<&StoredRows<'_>>,
    ) -> Result<Vec<ArrayRef>> {
        let k = spec.count("k");
        Ok(self.state_columns(k, merge_top_lists(&spec.column("topk"), k, a, b)?))
    }
    /// Its score is not s − h(g) (a distance scaled per item).
    fn screened_search(&self) -> bool {
        false
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        vec!["scale"]
    }
    /// The scoring from the stored scales; a scale of zero is refused with
    /// the gallery row named.
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let scale = ctx.take(0).into_f64();
        if let Some(g) = scale.iter().position(|&s| s.is_nan() || s < MIN_SCALE) {
            return Err(HubnormError::Usage(format!(
                "method {}: gallery row {g} has a bank neighbourhood of scale {} (its {} nearest bank queries coincide with it, within f32 rounding: below {MIN_SCALE:.1e}), which it cannot divide by",
                spec.kind(),
                scale[g],
                spec.count("k")
            )));
        }
        let scoring = if self.nicdm {
            Scoring::Nicdm {
                inv_scale: scale.iter().map(|r| 1.0 / r.sqrt()).collect(),
            }
        } else {
            Scoring::LocalScaling {
                inv_scale: scale.iter().map(|s| 1.0 / s).collect(),
            }
        };
        let s = ctx.add_scoring(scoring);
        Ok(MethodRule {
            spec: *spec,
            selection: Selection::Fixed(s),
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused("a per-item scale, not an additive correction")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_come_from_the_kth_and_the_mean_distance() {
        let top = [1.0f32, 0.5, 0.0];
        assert_eq!(kth_distance(&top, 1), 0.0);
        assert!((kth_distance(&top, 2) - 1.0).abs() < 1e-12);
        assert!((kth_distance(&top, 3) - 2f64.sqrt()).abs() < 1e-12);
        assert!((mean_distance(&top, 3) - (1.0 + 2f64.sqrt()) / 3.0).abs() < 1e-12);
        // Similarities a hair above 1 (rounding) give distance 0, not NaN.
        assert_eq!(distance(1.000_000_1), 0.0);
    }

    #[test]
    fn a_neighbourhood_within_rounding_of_the_item_has_no_scale() {
        // Three copies of a unit row, whose self-similarity came out one
        // unit in the last place below 1.
        let copies = [1.0f32 - f32::EPSILON / 2.0; 3];
        assert!(kth_distance(&copies, 3) < MIN_SCALE);
        assert!(mean_distance(&copies, 3) < MIN_SCALE);
        // 64 units away: the threshold; a real neighbour is farther.
        assert!(distance(1.0 - 64.0 * f32::EPSILON / 2.0) >= MIN_SCALE * (1.0 - 1e-9));
        assert!(distance(0.999) > MIN_SCALE);
    }
}
