//! `gc`: globally corrected retrieval (Dinu et al. 2015). A gallery item is
//! ranked by the query's rank among the bank queries' similarities to it:
//! score = −|{b : s(b, g) > s(q, g)}|. The state is every bank similarity,
//! sorted, which merges across bank parts.

use arrow::array::ArrayRef;

use super::columns::list_array;
use super::{
    BankNeeds, ChunkContext, Export, InputSizes, Method, MethodSpec, PlanContext, StatColumn,
    StoredRows,
};
use crate::bank::SortedSimilarities;
use crate::error::{HubnormError, Result};
use crate::options::human_bytes;
use crate::query::{MethodRule, QueryTerm, Scoring, Selection};

/// Globally corrected retrieval.
pub struct GloballyCorrected;

impl Method for GloballyCorrected {
    fn name(&self) -> &'static str {
        "gc"
    }
    fn summary(&self) -> &'static str {
        "globally corrected: the query's rank among the bank's similarities to each item (Dinu et al. 2015)"
    }
    /// The sorted similarities are held whole: bank × gallery × 4 bytes
    /// must fit half the memory limit.
    fn check_inputs(&self, _spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        let needed = sizes
            .bank_rows
            .saturating_mul(sizes.gallery_rows)
            .saturating_mul(4);
        let allowed = sizes.memory_bytes as u64 / 2;
        if needed > allowed {
            let fits = (allowed / (sizes.gallery_rows.max(1) * 4)).max(1);
            return Err(HubnormError::Budget(format!(
                "method gc keeps every bank similarity of every gallery item: {} bank × {} gallery × 4 bytes = {}, more than half of --memory-limit {}; raise the limit or pass --bank-sample N (N ≤ {fits} fits)",
                sizes.bank_rows,
                sizes.gallery_rows,
                human_bytes(needed),
                human_bytes(sizes.memory_bytes as u64)
            )));
        }
        Ok(())
    }
    fn request(&self, _spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.every_bank_similarity();
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        vec![StatColumn::list("sorted_sims")]
    }
    fn chunk_columns(&self, _spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        vec![list_array(chunk.bank_all().to_vec())]
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
        let name = spec.column("sorted_sims");
        let mut rows = a.lists(&name)?;
        if let Some(b) = b {
            for (row, extra) in rows.iter_mut().zip(b.lists(&name)?) {
                let mut merged = SortedSimilarities::from_unsorted(std::mem::take(row));
                merged.merge(&SortedSimilarities::from_unsorted(extra));
                *row = merged.values().to_vec();
            }
        }
        Ok(vec![list_array(rows)])
    }
    /// Its score is not s − h(g) (a rank among bank similarities).
    fn screened_search(&self) -> bool {
        false
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        vec!["sorted_sims"]
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let (sorted, width) = ctx.take(0).into_lists();
        let s = ctx.add_scoring(Scoring::BankRank { sorted, width });
        Ok(MethodRule {
            spec: *spec,
            selection: Selection::Fixed(s),
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused("a rank among bank similarities")
    }
}
