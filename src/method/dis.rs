//! `dis`: dynamic inverted softmax (QB-Norm, Bogolin et al. 2022). Scores a
//! query with `is` only when its raw top-1 is in the activation set A (the
//! gallery items in the top-k_A of some bank query); raw otherwise.

use arrow::array::ArrayRef;

use super::is::{BETA, LSE_COLUMNS};
use super::{
    BankNeeds, ChunkContext, Domain, Export, InputSizes, LateContext, Method, MethodSpec,
    Parameter, PlanContext, StatColumn,
};
use crate::error::{HubnormError, Result};
use crate::query::{MethodRule, QueryTerm, Selection};

/// k_A of `dis` and `dual-dis`.
pub const ACTIVATION_K: Parameter = Parameter::new(
    "ka",
    "k_A: a gallery item is activated when it is in the top-k_A of some bank item",
    1.0,
    Domain::Count { min: 1 },
)
.flag("activation-k")
.grid(&[1.0, 2.0, 5.0, 10.0]);

/// Refuses a k_A larger than the gallery: a bank item's top-k_A is among
/// the gallery items (and the activation states grow with k_A).
pub(crate) fn check_activation_k_within_gallery(
    spec: &MethodSpec,
    sizes: &InputSizes,
) -> Result<()> {
    // As given: a count beyond usize would print saturated.
    let ka = spec.get("ka");
    if ka > sizes.gallery_rows as f64 {
        return Err(HubnormError::Usage(format!(
            "--activation-k {ka} is larger than the gallery ({} rows); method {} activates the gallery items in each bank item's top-k_A",
            sizes.gallery_rows,
            spec.kind()
        )));
    }
    Ok(())
}

/// Dynamic inverted softmax.
pub struct DynamicInvertedSoftmax;

impl Method for DynamicInvertedSoftmax {
    fn name(&self) -> &'static str {
        "dis"
    }
    fn summary(&self) -> &'static str {
        "inverted softmax for queries whose raw top-1 is activated by the bank (QB-Norm)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[BETA, ACTIVATION_K]
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_lse(spec.get("beta"));
        needs.bank_activation(spec.count("ka"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        let mut columns = LSE_COLUMNS.to_vec();
        columns.push(StatColumn::late_bool("active"));
        columns
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let beta = spec.get("beta");
        chunk.lse_columns(|i| chunk.bank_lse(beta, i), |s| s.value() / beta)
    }
    fn late_columns(&self, spec: &MethodSpec, late: &LateContext<'_>) -> Vec<ArrayRef> {
        vec![late.bank_activation(spec.count("ka"))]
    }
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        check_activation_k_within_gallery(spec, sizes)
    }
    fn needs_raw(&self, _spec: &MethodSpec) -> bool {
        true
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        vec!["correction", "active"]
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let correction = ctx.take(0).into_subtract();
        let corrected = ctx.add_scoring(correction);
        let raw = ctx.raw();
        let selection = Selection::Gated {
            raw,
            sets: vec![ctx.take(1).into_bits()],
            choices: vec![raw, corrected],
        };
        Ok(MethodRule {
            spec: *spec,
            selection,
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused("gated on the query's raw top-1")
    }
}
