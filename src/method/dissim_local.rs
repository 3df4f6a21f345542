//! `dissim-local`: DisSimLocal (Hara et al. 2016; scikit-hubness
//! `DisSimLocal`), stated for retrieval with a bank (METHODS.md, "Methods of
//! the hubness toolkits, with banks").
//!
//! The squared-distance form ‖q − g‖² − ‖q − c_k(q)‖² − ‖g − c_k(g)‖², with
//! c_k(g) the centroid of g's k nearest bank queries N_k(g), ranks like
//! s(q, g) − h(g) with h(g) = (‖g‖² − ‖g − c_k(g)‖²)/2 = ⟨g, c⟩ − ‖c‖²/2,
//! once the terms of the query alone are dropped: an additive correction,
//! exportable like `is`. ⟨g, c⟩ is the mean of g's k largest bank
//! similarities. Pass 1 keeps each gallery item's k best bank rows (ties to
//! the smaller row) and then gathers their vectors in one more read of the
//! bank for c.
//!
//! The state is those rows with their similarities. Two bank parts' states
//! merge into the union's k best (`stats --update`), whose centroid is
//! gathered again from the bank: the stored rows are renumbered to the
//! current bank's ([`super::BankRowMap`]).

use arrow::array::ArrayRef;

use super::columns::{f64_array, list_array, rows_array};
use super::local::NEIGHBOURHOOD_K;
use super::{
    BankNeeds, ChunkContext, Export, InputSizes, Method, MethodSpec, Parameter, PlanContext,
    StatColumn, StoredRows,
};
use crate::bank::pass::neighbour_means;
use crate::error::{HubnormError, Result};
use crate::kernel::{Candidate, TopK};
use crate::query::MethodRule;

/// DisSimLocal.
pub struct DissimLocal;

const COLUMNS: [StatColumn; 3] = [
    StatColumn::f64("correction"),
    StatColumn::list("neighbour_similarities"),
    StatColumn::rows("neighbour_rows"),
];

/// Bank rows per block of an update's gather.
const GATHER_BLOCK_ROWS: usize = 1024;

/// h(g) = ⟨g, c⟩ − ‖c‖²/2 in f64, ⟨g, c⟩ the mean of the neighbours'
/// similarities `sims`, c their centroid.
fn correction(sims: &[f32], c: &[f64]) -> f64 {
    let mean = sims.iter().map(|&s| s as f64).sum::<f64>() / sims.len().max(1) as f64;
    mean - 0.5 * c.iter().map(|x| x * x).sum::<f64>()
}

/// The columns from each gallery item's neighbours (similarities and bank
/// rows, nearest first) and their centroids (`dim` values each).
fn columns_of(
    sims: Vec<Vec<f32>>,
    rows: Vec<Vec<u64>>,
    centroids: &[f64],
    dim: usize,
) -> Vec<ArrayRef> {
    let h = sims
        .iter()
        .enumerate()
        .map(|(i, s)| correction(s, &centroids[i * dim..(i + 1) * dim]))
        .collect();
    vec![f64_array(h), list_array(sims), rows_array(rows)]
}

impl Method for DissimLocal {
    fn name(&self) -> &'static str {
        "dissim-local"
    }
    fn summary(&self) -> &'static str {
        "DisSimLocal: s − (‖g‖² − ‖g − c_k(g)‖²)/2, c_k(g) the centroid of g's k nearest bank queries (Hara et al. 2016)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[NEIGHBOURHOOD_K]
    }
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        super::nnn::check_k_within_bank(spec, "ls-k", sizes)
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.bank_neighbour_mean(spec.count("k"));
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        COLUMNS.to_vec()
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let k = spec.count("k");
        let (mut sims, mut rows) = (Vec::new(), Vec::new());
        for top in chunk.bank_top_rows() {
            let best: Vec<Candidate> = top.sorted().into_iter().take(k).collect();
            sims.push(best.iter().map(|c| c.score).collect());
            rows.push(best.iter().map(|c| c.row as u64).collect());
        }
        let (_, dim) = chunk.gallery_block();
        let centroids: Vec<f64> = (0..chunk.rows())
            .flat_map(|i| chunk.bank_neighbour_mean(k, i).iter().copied())
            .collect();
        columns_of(sims, rows, &centroids, dim)
    }
    fn mergeable(&self) -> bool {
        true
    }
    /// The union's k best neighbours, and their centroid gathered again
    /// from the bank; with nothing to merge, the stored columns (the rows
    /// renumbered to the current bank's).
    fn merge(
        &self,
        spec: &MethodSpec,
        a: &StoredRows<'_>,
        b: Option<&StoredRows<'_>>,
    ) -> Result<Vec<ArrayRef>> {
        let k = spec.count("k");
        let (sims_name, rows_name) = (
            spec.column("neighbour_similarities"),
            spec.column("neighbour_rows"),
        );
        let mut sims = a.lists(&sims_name)?;
        let mut rows = a.bank_rows(&rows_name)?;
        let Some(b) = b else {
            let h = a.floats(&spec.column("correction"))?;
            return Ok(vec![f64_array(h), list_array(sims), rows_array(rows)]);
        };
        for ((s, r), (bs, br)) in sims.iter_mut().zip(rows.iter_mut()).zip(
            b.lists(&sims_name)?
                .into_iter()
                .zip(b.bank_rows(&rows_name)?),
        ) {
            let mut top = TopK::new(k);
            for (&score, &row) in s.iter().chain(&bs).zip(r.iter().chain(&br)) {
                top.push(Candidate {
                    score,
                    raw: score,
                    row: row as u32,
                });
            }
            let best = top.sorted();
            *s = best.iter().map(|c| c.score).collect();
            *r = best.iter().map(|c| c.row as u64).collect();
        }
        let bank = a.bank().ok_or_else(|| {
            HubnormError::Internal("dissim-local merges need the bank to gather from".into())
        })?;
        let dim = bank.table.dim;
        let (_, centroids) = neighbour_means(&rows, &[k], dim, |f| {
            let mut blocks = bank.table.blocks(GATHER_BLOCK_ROWS);
            while let Some(block) = blocks.next_block()? {
                f(&block)?;
            }
            Ok(())
        })?
        .remove(0);
        Ok(columns_of(sims, rows, &centroids, dim))
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

    /// g = (0.6, 0.8) and neighbours b₁ = (1, 0), b₂ = (0, 1): the mean
    /// similarity is ⟨g, c⟩ with c = (0.5, 0.5), and h is half the squared
    /// distance to c that g saves.
    #[test]
    fn correction_is_half_the_squared_distance_saved() {
        let sims = [0.6f32, 0.8];
        let c = [0.5f64, 0.5];
        let norm2 = |v: [f64; 2]| v[0] * v[0] + v[1] * v[1];
        let want = (norm2([0.6, 0.8]) - norm2([0.6 - 0.5, 0.8 - 0.5])) / 2.0;
        assert!((correction(&sims, &c) - want).abs() < 1e-7);
    }
}
