//! `dsl`: dual softmax (Cheng et al. 2021, CAMoE). score = s · exp(s/θ − L),
//! L(g) = log Σ exp(s(x, g)/θ) over the bank and the query itself (or over
//! the test queries when transductive). The state is L's log-sum-exp,
//! which merges across bank parts.

use arrow::array::ArrayRef;

use super::columns::merge_lse;
use super::sinkhorn::TEMPERATURES;
use super::{
    BankNeeds, ChunkContext, Domain, Export, Method, MethodSpec, Parameter, PlanContext,
    StatColumn, StoredRows,
};
use crate::error::Result;
use crate::query::{MethodRule, QueryTerm, Scoring, Selection};

const THETA: Parameter =
    Parameter::new("theta", "θ: exp(s/θ)", 0.01, Domain::Positive).grid(TEMPERATURES);

/// Dual softmax.
pub struct DualSoftmax;

impl Method for DualSoftmax {
    fn name(&self) -> &'static str {
        "dsl"
    }
    fn summary(&self) -> &'static str {
        "dual softmax: s times the column softmax over the bank and the query (Cheng et al. 2021)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[THETA]
    }
    fn transductive(&self) -> bool {
        true
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_lse(1.0 / spec.get("theta"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        vec![
            StatColumn::f64("log_normaliser"),
            StatColumn::f64("lse_max"),
            StatColumn::f64("lse_sum"),
        ]
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        // L(g) = LSE_b s(b, g)/θ, the log of the column softmax's denominator.
        let beta = 1.0 / spec.get("theta");
        chunk.lse_columns(|i| chunk.bank_lse(beta, i), |s| s.value())
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
        merge_lse(spec, a, b, |s| s.value())
    }
    /// Its score is not s − h(g) (dual softmax: s · exp(s/θ − L(g))).
    fn screened_search(&self) -> bool {
        false
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        vec!["log_normaliser"]
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let log_normaliser = ctx.take(0).into_f64();
        // Transductive: the test queries (q among them) are the bank;
        // otherwise the softmax is over B ∪ {q}.
        let transductive = ctx.metadata(crate::stats_file::TRANSDUCTIVE_KEY) == Some("true");
        let s = ctx.add_scoring(Scoring::DualSoftmax {
            log_normaliser,
            inv_theta: 1.0 / spec.get("theta"),
            include_query: !transductive,
        });
        Ok(MethodRule {
            spec: *spec,
            selection: Selection::Fixed(s),
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused("multiplicative")
    }
}
