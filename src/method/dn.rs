//! `dn`: distribution normalisation (Zhou et al. 2023). Scores
//! ⟨q − λμ_Q, g − λμ_G⟩ with μ_Q the query-bank mean and μ_G the gallery
//! bank's (or the gallery's): h(g) = λ·⟨μ_Q, g⟩, and a query term
//! λ·⟨q, μ_G⟩ − λ²·⟨μ_Q, μ_G⟩. The means are in the stats file's metadata.

use arrow::array::ArrayRef;

use super::{
    BankMoments, BankNeeds, ChunkContext, Domain, Export, GalleryBankUse, Method, MethodSpec,
    Parameter, PlanContext, StatColumn,
};
use crate::error::Result;
use crate::query::{MethodRule, QueryTerm};
use crate::stats_file::floats_json;

/// Metadata key of the query-bank mean used by `dn`.
pub const QUERY_BANK_MEAN_KEY: &str = "hubnorm.dn.query_bank_mean";
/// Metadata key of the gallery(-bank) mean used by `dn`.
pub const GALLERY_MEAN_KEY: &str = "hubnorm.dn.gallery_mean";

const LAMBDA: Parameter = Parameter::new(
    "lambda",
    "λ: the share of the bank means subtracted",
    0.5,
    Domain::Finite,
)
.grid(&[0.25, 0.5, 0.75, 1.0]);

/// Distribution normalisation.
pub struct DistributionNormalisation;

impl Method for DistributionNormalisation {
    fn name(&self) -> &'static str {
        "dn"
    }
    fn summary(&self) -> &'static str {
        "distribution normalisation: subtract λ × the bank means from both sides (Zhou et al. 2023)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[LAMBDA]
    }
    fn gallery_bank(&self) -> GalleryBankUse {
        GalleryBankUse::Optional
    }
    fn request(&self, _spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.means();
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        vec![StatColumn::f64("correction")]
    }
    fn file_metadata(&self, _spec: &MethodSpec, moments: &BankMoments) -> Vec<(String, String)> {
        vec![
            (
                QUERY_BANK_MEAN_KEY.into(),
                floats_json(&moments.query_bank.mean),
            ),
            (GALLERY_MEAN_KEY.into(), floats_json(&moments.gallery.mean)),
        ]
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let lambda = spec.get("lambda");
        let mean = &chunk.moments().query_bank.mean;
        vec![chunk.f64s(|i| {
            lambda
                * chunk
                    .gallery_row(i)
                    .iter()
                    .zip(mean)
                    .map(|(&a, b)| a as f64 * b)
                    .sum::<f64>()
        })]
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let lambda = spec.get("lambda");
        let query_bank = ctx.metadata_floats(QUERY_BANK_MEAN_KEY)?;
        let gallery_mean = ctx.metadata_floats(GALLERY_MEAN_KEY)?;
        let constant = lambda
            * lambda
            * query_bank
                .iter()
                .zip(&gallery_mean)
                .map(|(a, b)| a * b)
                .sum::<f64>();
        let mut rule = ctx.subtract_column(spec, 0);
        rule.query_term = QueryTerm::DistributionShift {
            lambda,
            gallery_mean,
            constant,
        };
        Ok(rule)
    }
    fn export(&self) -> Export {
        Export::Additive
    }
}
