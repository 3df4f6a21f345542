//! `is`: inverted softmax over the query bank (Smith et al. 2017, as used by
//! QB-Norm). h(g) = (1/β)·LSE_b β·s(b, g); the state is the log-sum-exp
//! (max, sum), which merges across bank parts.

use arrow::array::ArrayRef;

use super::columns::merge_lse;
use super::{
    BankNeeds, ChunkContext, Domain, Export, Method, MethodSpec, Parameter, PlanContext,
    StatColumn, StoredRows,
};
use crate::error::Result;
use crate::query::MethodRule;

/// β of `is` and `dis`: exp(β·s).
pub const BETA: Parameter = Parameter::new("beta", "β: exp(β·s)", 20.0, Domain::Positive)
    .grid(&[5.0, 10.0, 20.0, 30.0, 50.0, 100.0]);

/// The columns of a method whose statistic is (1/β)·LSE_b β·s(b, g).
pub(crate) const LSE_COLUMNS: [StatColumn; 3] = [
    StatColumn::f64("correction"),
    StatColumn::f64("lse_max"),
    StatColumn::f64("lse_sum"),
];

/// Inverted softmax.
pub struct InvertedSoftmax;

impl Method for InvertedSoftmax {
    fn name(&self) -> &'static str {
        "is"
    }
    fn summary(&self) -> &'static str {
        "inverted softmax over the query bank (Smith et al. 2017; QB-Norm)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[BETA]
    }
    fn transductive(&self) -> bool {
        true
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_lse(spec.get("beta"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        LSE_COLUMNS.to_vec()
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let beta = spec.get("beta");
        chunk.lse_columns(|i| chunk.bank_lse(beta, i), |s| s.value() / beta)
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
        let beta = spec.get("beta");
        merge_lse(spec, a, b, |s| s.value() / beta)
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        Ok(ctx.subtract_column(spec, 0))
    }
    fn export(&self) -> Export {
        Export::Additive
    }
}
