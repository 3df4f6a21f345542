//! `nnn` and `csls`: corrections from the mean of each gallery item's k most
//! similar bank queries, r_B(g). Their state is the k largest bank
//! similarities, which merges across bank parts.
//!
//! - `nnn` (nearest-neighbour normalisation, Chowdhury et al. 2024):
//!   h(g) = α·r_B(g).
//! - `csls` (Conneau et al. 2018): h(g) = ½·r_B(g), and the query term
//!   ½·r_G(q) (the mean of the query's k most similar gallery items), which
//!   never changes a ranking but is part of the reported score.

use arrow::array::ArrayRef;

use super::columns::{f64_array, list_array, mean_of_list, merge_top_lists, top_lists};
use super::{
    BankNeeds, ChunkContext, Domain, Export, InputSizes, Method, MethodSpec, Parameter,
    PlanContext, StatColumn, StoredRows,
};
use crate::error::{HubnormError, Result};
use crate::query::{MethodRule, QueryTerm, Selection};

const ALPHA: Parameter = Parameter::new(
    "alpha",
    "α: the weight of the neighbours' mean",
    0.75,
    Domain::NonNegative,
)
.grid(&[0.25, 0.5, 0.75, 1.0]);
const NNN_K: Parameter = Parameter::new(
    "k",
    "k: bank neighbours averaged",
    128.0,
    Domain::Count { min: 1 },
)
.flag("nnn-k")
.grid(&[8.0, 32.0, 128.0]);
const CSLS_K: Parameter = Parameter::new(
    "k",
    "k: bank neighbours averaged (and the query's gallery neighbours)",
    10.0,
    Domain::Count { min: 1 },
)
.flag("csls-k")
.grid(&[1.0, 5.0, 10.0, 20.0, 50.0]);

const COLUMNS: [StatColumn; 2] = [StatColumn::f64("correction"), StatColumn::list("topk")];

/// Refuses a k larger than the bank: the mean of the k most similar bank
/// items needs k of them.
pub(crate) fn check_k_within_bank(spec: &MethodSpec, flag: &str, sizes: &InputSizes) -> Result<()> {
    let k = spec.count("k");
    if k as u64 > sizes.bank_rows {
        return Err(HubnormError::Usage(format!(
            "--{flag} {k} is larger than the bank ({} rows); method {} averages the k most similar bank items",
            sizes.bank_rows,
            spec.kind()
        )));
    }
    Ok(())
}

/// The shared body of `nnn` and `csls`: h(g) = weight · r_B(g).
fn top_k_columns(weight: f64, k: usize, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
    let tops = chunk.bank_top();
    vec![
        chunk.f64s(|i| weight * tops[i].mean_of_largest(k).unwrap_or(0.0)),
        top_lists(tops, k),
    ]
}

fn merge_top_k(
    spec: &MethodSpec,
    weight: f64,
    a: &StoredRows<'_>,
    b: Option<&StoredRows<'_>>,
) -> Result<Vec<ArrayRef>> {
    let k = spec.count("k");
    let rows = merge_top_lists(&spec.column("topk"), k, a, b)?;
    let h = rows
        .iter()
        .map(|row| weight * mean_of_list(row, k))
        .collect();
    Ok(vec![f64_array(h), list_array(rows)])
}

/// Nearest-neighbour normalisation.
pub struct NearestNeighbour;

impl Method for NearestNeighbour {
    fn name(&self) -> &'static str {
        "nnn"
    }
    fn summary(&self) -> &'static str {
        "nearest-neighbour normalisation: α × the mean of the k most similar bank queries (Chowdhury et al. 2024)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[ALPHA, NNN_K]
    }
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        check_k_within_bank(spec, "nnn-k", sizes)
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_top_k(spec.count("k"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        COLUMNS.to_vec()
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        top_k_columns(spec.get("alpha"), spec.count("k"), chunk)
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
        merge_top_k(spec, spec.get("alpha"), a, b)
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        Ok(ctx.subtract_column(spec, 0))
    }
    fn export(&self) -> Export {
        Export::Additive
    }
}

/// Cross-domain similarity local scaling.
pub struct Csls;

impl Method for Csls {
    fn name(&self) -> &'static str {
        "csls"
    }
    fn summary(&self) -> &'static str {
        "cross-domain similarity local scaling: ½ × the bank and gallery neighbourhood means (Conneau et al. 2018)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[CSLS_K]
    }
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        check_k_within_bank(spec, "csls-k", sizes)
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_top_k(spec.count("k"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        COLUMNS.to_vec()
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        top_k_columns(0.5, spec.count("k"), chunk)
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
        merge_top_k(spec, 0.5, a, b)
    }
    fn needs_raw(&self, _spec: &MethodSpec) -> bool {
        true
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let correction = ctx.take(0).into_subtract();
        let s = ctx.add_scoring(correction);
        let query_term = QueryTerm::HalfNeighbourMean {
            raw: ctx.raw(),
            k: spec.count("k"),
        };
        Ok(MethodRule {
            spec: *spec,
            selection: Selection::Fixed(s),
            query_term,
        })
    }
    fn export(&self) -> Export {
        Export::Additive
    }
}
