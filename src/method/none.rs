//! `none`: the raw inner product, the baseline every report compares against.

use super::{Export, Method, MethodSpec, PlanContext};
use crate::error::Result;
use crate::query::{MethodRule, QueryTerm, Selection};

/// The baseline: score = s(q, g).
pub struct None;

impl Method for None {
    fn name(&self) -> &'static str {
        "none"
    }
    fn summary(&self) -> &'static str {
        "the raw inner product (the baseline)"
    }
    fn needs_bank(&self) -> bool {
        false
    }
    fn transductive(&self) -> bool {
        true
    }
    fn needs_raw(&self, _spec: &MethodSpec) -> bool {
        true
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        Vec::new()
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        Ok(MethodRule {
            spec: *spec,
            selection: Selection::Fixed(ctx.raw()),
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused(
            "method none has no correction to export; export the embeddings as they are",
        )
    }
}
