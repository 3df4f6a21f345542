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

use super::columns::{f64_array, list_array, merge_top_lists, top_lists};
use super::{
    BankNeeds, ChunkContext, Domain, Export, InputSizes, Method, MethodSpec, Parameter,
    PlanContext, StatColumn, StoredRows,
};
use crate::error::{HubnormError, Result};
use crate::kernel::TopValues;
use crate::query::{MethodRule, QueryTerm, Scoring, Selection};

/// k of the local methods: the bank neighbourhood of each gallery item.
pub const LOCAL_K: Parameter = Parameter::new(
    "k",
    "k of the local scaling methods: the bank neighbourhood of each gallery item",
    5.0,
    Domain::Count { min: 1 },
)
.flag("ls-k")
.grid(&[3.0, 5.0, 10.0, 20.0, 50.0]);

/// The smallest scale accepted: a gallery item whose k nearest bank
/// queries coincide with it has no neighbourhood to scale by.
const MIN_SCALE: f64 = 1e-12;

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

fn check(spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
    if !sizes.normalized {
        return Err(HubnormError::Usage(format!(
            "method {} measures distances between unit rows and cannot run with --no-normalize",
            spec.kind()
        )));
    }
    super::nnn::check_k_within_bank(spec, "ls-k", sizes)
}

/// The scale column of `spec` from descending top lists.
fn scales<'a>(spec: &MethodSpec, tops: impl Iterator<Item = &'a [f32]>) -> Vec<f64> {
    let k = spec.count("k");
    let scale = if spec.kind().name() == "ls" {
        kth_distance
    } else {
        mean_distance
    };
    tops.map(|top| scale(top, k)).collect()
}

fn chunk_columns(spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
    let k = spec.count("k");
    let sorted: Vec<Vec<f32>> = chunk.bank_top().iter().map(TopValues::sorted).collect();
    vec![
        f64_array(scales(spec, sorted.iter().map(Vec::as_slice))),
        top_lists(chunk.bank_top(), k),
    ]
}

fn merge(
    spec: &MethodSpec,
    a: &StoredRows<'_>,
    b: Option<&StoredRows<'_>>,
) -> Result<Vec<ArrayRef>> {
    let rows = merge_top_lists(&spec.column("topk"), spec.count("k"), a, b)?;
    let scale = scales(spec, rows.iter().map(Vec::as_slice));
    Ok(vec![f64_array(scale), list_array(rows)])
}

/// The scoring of `spec` from its stored scales; a scale of zero is refused
/// with the gallery row named.
fn rule(spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
    let scale = ctx.take(0).into_f64();
    if let Some(g) = scale.iter().position(|&s| s.is_nan() || s < MIN_SCALE) {
        return Err(HubnormError::Usage(format!(
            "method {}: gallery row {g} has a bank neighbourhood of scale {} (its {} nearest bank queries coincide with it), which it cannot divide by",
            spec.kind(),
            scale[g],
            spec.count("k")
        )));
    }
    let scoring = if spec.kind().name() == "ls" {
        Scoring::LocalScaling {
            inv_scale: scale.iter().map(|s| 1.0 / s).collect(),
        }
    } else {
        Scoring::Nicdm {
            inv_scale: scale.iter().map(|r| 1.0 / r.sqrt()).collect(),
        }
    };
    let s = ctx.add_scoring(scoring);
    Ok(MethodRule {
        spec: *spec,
        selection: Selection::Fixed(s),
        query_term: QueryTerm::None,
    })
}

macro_rules! local_method {
    ($type:ident, $name:literal, $summary:literal) => {
        #[doc = $summary]
        pub struct $type;

        impl Method for $type {
            fn name(&self) -> &'static str {
                $name
            }
            fn summary(&self) -> &'static str {
                $summary
            }
            fn parameters(&self) -> &'static [Parameter] {
                &[LOCAL_K]
            }
            fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
                check(spec, sizes)
            }
            fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
                needs.bank_top_k(spec.count("k"));
            }
            fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
                COLUMNS.to_vec()
            }
            fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
                chunk_columns(spec, chunk)
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
                merge(spec, a, b)
            }
            fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
                vec!["scale"]
            }
            fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
                rule(spec, ctx)
            }
            fn export(&self) -> Export {
                Export::Refused("a per-item scale, not an additive correction")
            }
        }
    };
}

local_method!(
    LocalScaling,
    "ls",
    "local scaling: −d(q, g)² / the distance to g's k-th nearest bank query (Zelnik-Manor & Perona 2005)"
);
local_method!(
    Nicdm,
    "nicdm",
    "NICDM: −d(q, g) / sqrt(the mean distance to g's k nearest bank queries) (Jégou et al. 2010)"
);

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
}
