//! `sinkhorn-pp`: the single-query Sinkhorn protocol of Yakovlev et al.
//! 2023. Each test query is stacked with m − 1 bank queries and normalised
//! on its own ([`crate::query::sinkhorn_pp`]): no gallery statistic, so it
//! runs in `hubnorm run` and `hubnorm compare` (`stats`, `search` and
//! `tune` refuse it), within a cost limit.

use super::sinkhorn::{ITERATIONS, TAU};
use super::{
    Domain, Export, InputSizes, Method, MethodSpec, Parameter, PlanContext, SingleQuerySetup,
};
use crate::error::Result;
use crate::query::sinkhorn_pp::check_protocol_cost;
use crate::query::{MethodRule, QueryTerm, Selection};

const PSEUDO_QUERIES: Parameter = Parameter::new(
    "m",
    "m − 1: bank queries stacked with each test query (drawn with --seed)",
    128.0,
    Domain::Count { min: 2 },
)
.flag("pseudo-queries")
.flag_offset(1.0, "m-1");

/// The single-query Sinkhorn protocol.
pub struct SinkhornPp;

impl Method for SinkhornPp {
    fn name(&self) -> &'static str {
        "sinkhorn-pp"
    }
    fn summary(&self) -> &'static str {
        "single-query Sinkhorn protocol: each query normalised with a pseudo-test stack (Yakovlev et al. 2023)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[TAU, ITERATIONS, PSEUDO_QUERIES]
    }
    fn transductive(&self) -> bool {
        true
    }
    fn tuned_by_default(&self) -> bool {
        // O(T·m·n) per query: too costly to sweep.
        false
    }
    fn single_query(&self, spec: &MethodSpec) -> Option<SingleQuerySetup> {
        Some(SingleQuerySetup {
            pseudo_queries: spec.count("m") - 1,
            tau: spec.get("tau"),
            iterations: spec.count("t"),
        })
    }
    fn has_statistics(&self) -> bool {
        false
    }
    /// The protocol's cost, T·m·n per query, within its limit (run checks
    /// it again when it prepares the stack).
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        let m = (spec.count("m") - 1).min(sizes.bank_rows as usize) + 1;
        check_protocol_cost(
            sizes.queries_rows,
            m,
            sizes.gallery_rows as usize,
            spec.count("t"),
        )
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        Vec::new()
    }
    fn rule(&self, spec: &MethodSpec, _ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        Ok(MethodRule {
            spec: *spec,
            selection: Selection::SingleQuery,
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused("normalises each query on its own")
    }
}
