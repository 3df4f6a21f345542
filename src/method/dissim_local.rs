//! `dissim-local`: DisSimLocal (Hara et al. 2016; scikit-hubness
//! `DisSimLocal`), stated for retrieval with a bank (METHODS.md, "Methods of
//! the hubness toolkits, with banks").
//!
//! The squared-distance form ‖q − g‖² − ‖q − c_k(q)‖² − ‖g − c_k(g)‖², with
//! c_k(g) the centroid of g's k nearest bank queries N_k(g), ranks like
//! s(q, g) − h(g) with h(g) = (‖g‖² − ‖g − c_k(g)‖²)/2 = ⟨g, c⟩ − ‖c‖²/2,
//! once the terms of the query alone are dropped: an additive correction,
//! exportable like `is`. Pass 1 keeps each gallery item's k best bank rows
//! (ties to the smaller row) and then gathers their vectors in one more read
//! of the bank.
//!
//! Not merged by `stats --update` (recomputed in full): the union of two
//! bank parts' neighbourhoods needs the neighbours' vectors, which a stats
//! file does not hold.

use arrow::array::ArrayRef;

use super::local::LOCAL_K;
use super::{
    BankNeeds, ChunkContext, Export, InputSizes, Method, MethodSpec, Parameter, PlanContext,
    StatColumn,
};
use crate::error::Result;
use crate::query::MethodRule;

/// DisSimLocal.
pub struct DissimLocal;

/// h(g) = ⟨g, c⟩ − ‖c‖²/2, in f64.
fn correction(g: &[f32], c: &[f64]) -> f64 {
    g.iter()
        .zip(c)
        .map(|(&g, &c)| g as f64 * c - 0.5 * c * c)
        .sum()
}

impl Method for DissimLocal {
    fn name(&self) -> &'static str {
        "dissim-local"
    }
    fn summary(&self) -> &'static str {
        "DisSimLocal: s − (‖g‖² − ‖g − c_k(g)‖²)/2, c_k(g) the centroid of g's k nearest bank queries (Hara et al. 2016)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[LOCAL_K]
    }
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        super::nnn::check_k_within_bank(spec, "ls-k", sizes)
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_neighbour_mean(spec.count("k"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        vec![StatColumn::f64("correction")]
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let k = spec.count("k");
        vec![chunk.f64s(|i| correction(chunk.gallery_row(i), chunk.bank_neighbour_mean(k, i)))]
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        Ok(ctx.subtract_column(spec, 0))
    }
    fn export(&self) -> Export {
        Export::Additive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correction_is_half_the_squared_distance_saved() {
        let g = [0.6f32, 0.8];
        let c = [0.2f64, -0.4];
        let norm2 = |v: [f64; 2]| v[0] * v[0] + v[1] * v[1];
        let want = (norm2([0.6, 0.8]) - norm2([0.6 - 0.2, 0.8 + 0.4])) / 2.0;
        assert!((correction(&g, &c) - want).abs() < 1e-7);
    }
}
