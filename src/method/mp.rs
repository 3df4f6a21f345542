//! `mp`: Gaussian mutual proximity (Schnitzer et al. 2012; scikit-hubness
//! `MutualProximity(method="normal")`), stated for retrieval with a bank
//! (METHODS.md, "Methods of the hubness toolkits, with banks"):
//!
//! score(q, g) = log Φ((s − μ_B(g))/σ_B(g)) + log Φ((s − μ(q))/σ(q)),
//!
//! the log-probability that s is large both among g's similarities to the
//! bank and among q's similarities to the gallery bank (or the gallery).
//! Neither needs a pass over pairs: with the mean m and covariance Σ of a
//! set (its second moment C = Σ + m mᵀ), the mean and variance of s(y, ·)
//! over it are ⟨y, m⟩ and yᵀΣy = yᵀCy − ⟨y, m⟩² ([`crate::bank::Moments`];
//! Σ is kept rather than C so that a small variance is not the difference
//! of two large numbers). Pass 1 stores μ_B(g), σ_B(g)
//! and the bank size per gallery item (which merge across bank parts by
//! weighted sums), and the gallery side's moments in the file's metadata
//! for pass 2, which computes each query's Gaussian as its block arrives.

use std::sync::Arc;

use arrow::array::ArrayRef;

use super::columns::f64_array;
use super::{
    BankMoments, BankNeeds, ChunkContext, Export, GalleryBankUse, Method, MethodSpec, PlanContext,
    StatColumn, StoredRows,
};
use crate::bank::Moments;
use crate::error::{HubnormError, Result};
use crate::query::method::MIN_STD;
use crate::query::{MethodRule, QueryTerm, Scoring, Selection};

/// Metadata key of the moments each query's Gaussian comes from: those of
/// the gallery side (the gallery bank, or the gallery), which the query's
/// similarities are taken against. The name is the key's on disk.
pub const QUERY_SIDE_MOMENTS_KEY: &str = "hubnorm.mp.query_side_moments";

const COLUMNS: [StatColumn; 3] = [
    StatColumn::f64("bank_mean"),
    StatColumn::f64("bank_std"),
    StatColumn::f64("bank_rows"),
];

/// One gallery item's Gaussian of bank similarities, over `rows` bank rows.
#[derive(Debug, Clone, Copy, PartialEq)]
struct BankGaussian {
    mean: f64,
    std: f64,
    rows: f64,
}

impl BankGaussian {
    /// The Gaussian over the union of the two bank parts (Chan et al.'s
    /// pairwise update: the means weighted by counts, the sums of squared
    /// deviations added with δ²·n_a·n_b/n).
    fn merge(self, other: BankGaussian) -> BankGaussian {
        let rows = self.rows + other.rows;
        if other.rows == 0.0 {
            return self;
        }
        if self.rows == 0.0 {
            return other;
        }
        let delta = other.mean - self.mean;
        let squares = self.rows * self.std * self.std
            + other.rows * other.std * other.std
            + delta * delta * self.rows * other.rows / rows;
        BankGaussian {
            mean: self.mean + delta * other.rows / rows,
            std: (squares / rows).sqrt(),
            rows,
        }
    }
}

fn columns_of(gaussians: &[BankGaussian]) -> Vec<ArrayRef> {
    vec![
        f64_array(gaussians.iter().map(|g| g.mean).collect()),
        f64_array(gaussians.iter().map(|g| g.std).collect()),
        f64_array(gaussians.iter().map(|g| g.rows).collect()),
    ]
}

fn stored(spec: &MethodSpec, rows: &StoredRows<'_>) -> Result<Vec<BankGaussian>> {
    let mean = rows.floats(&spec.column("bank_mean"))?;
    let std = rows.floats(&spec.column("bank_std"))?;
    let count = rows.floats(&spec.column("bank_rows"))?;
    Ok(mean
        .into_iter()
        .zip(std)
        .zip(count)
        .map(|((mean, std), rows)| BankGaussian { mean, std, rows })
        .collect())
}

/// Gaussian mutual proximity.
pub struct MutualProximity;

impl Method for MutualProximity {
    fn name(&self) -> &'static str {
        "mp"
    }
    fn summary(&self) -> &'static str {
        "Gaussian mutual proximity: log Φ of s among g's bank similarities plus among q's gallery(-bank) similarities (Schnitzer et al. 2012)"
    }
    fn gallery_bank(&self) -> GalleryBankUse {
        GalleryBankUse::Optional
    }
    fn request(&self, _spec: &MethodSpec, needs: &mut BankNeeds) {
        needs.covariances();
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        COLUMNS.to_vec()
    }
    fn file_metadata(&self, _spec: &MethodSpec, moments: &BankMoments) -> Vec<(String, String)> {
        vec![(QUERY_SIDE_MOMENTS_KEY.into(), moments.gallery.to_metadata())]
    }
    fn chunk_columns(&self, _spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let bank = &chunk.moments().query_bank;
        let (data, dim) = chunk.gallery_block();
        let gaussians: Vec<BankGaussian> = bank
            .similarity_moments(data, dim)
            .into_iter()
            .map(|(mean, std)| BankGaussian {
                mean,
                std,
                rows: bank.rows as f64,
            })
            .collect();
        columns_of(&gaussians)
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
        let mut gaussians = stored(spec, a)?;
        if let Some(b) = b {
            for (g, other) in gaussians.iter_mut().zip(stored(spec, b)?) {
                *g = g.merge(other);
            }
        }
        Ok(columns_of(&gaussians))
    }
    /// Its score is not s − h(g) (a product of Gaussian tails).
    fn screened_search(&self) -> bool {
        false
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        vec!["bank_mean", "bank_std"]
    }
    /// The scoring from the stored Gaussians and the gallery side's moments;
    /// a σ_B below 1e-12 is refused with the gallery row named (a query's
    /// σ, when its block is searched).
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let mean = ctx.take(0).into_f64();
        let std = ctx.take(1).into_f64();
        if let Some(g) = std.iter().position(|&s| s.is_nan() || s < MIN_STD) {
            return Err(HubnormError::Usage(format!(
                "method {}: the bank similarities of gallery row {g} have standard deviation {:e} (below {MIN_STD:e}), which it cannot divide by",
                spec.kind(),
                std[g]
            )));
        }
        let text = ctx.metadata_text(QUERY_SIDE_MOMENTS_KEY)?;
        let query_side = Moments::from_metadata(text)
            .ok()
            .filter(|m| m.covariance.is_some())
            .ok_or_else(|| {
                ctx.metadata_error(QUERY_SIDE_MOMENTS_KEY, "not the moments of a set")
            })?;
        let s = ctx.add_scoring(Scoring::MutualProximity {
            mean,
            inv_std: std.iter().map(|s| 1.0 / s).collect(),
            query_side: Arc::new(query_side),
        });
        Ok(MethodRule {
            spec: *spec,
            selection: Selection::Fixed(s),
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused("a log-probability of two Gaussian tails, not an additive correction")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_gaussians_equal_the_union() {
        let values = [0.1f64, 0.4, -0.2, 0.7, 0.3];
        let gaussian = |v: &[f64]| {
            let n = v.len() as f64;
            let mean = v.iter().sum::<f64>() / n;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
            BankGaussian {
                mean,
                std: var.sqrt(),
                rows: n,
            }
        };
        let merged = gaussian(&values[..2]).merge(gaussian(&values[2..]));
        let whole = gaussian(&values);
        assert!((merged.mean - whole.mean).abs() < 1e-15);
        assert!((merged.std - whole.std).abs() < 1e-15);
        assert_eq!(merged.rows, 5.0);
    }
}
