//! `sn` and `dbsn`: Sinkhorn normalisation (Pan et al. 2025). h(g) is the
//! target potential f(g) of T log-domain Sinkhorn iterations over the bank
//! (sources) and the gallery (targets; `dbsn`: the gallery and the gallery
//! bank), known only after the last sweep. The potentials couple every
//! item, so `--update` recomputes them.

use arrow::array::ArrayRef;

use super::{
    Domain, Export, GalleryBankUse, LateContext, Method, MethodSpec, Parameter, PlanContext,
    SinkhornSetup, StatColumn,
};
use crate::error::Result;
use crate::query::MethodRule;

/// The temperatures `tune` sweeps for τ and θ.
pub(crate) const TEMPERATURES: &[f64] = &[0.005, 0.01, 0.02, 0.05, 0.1];

/// τ of the Sinkhorn methods: the plan is exp((s − g − f)/τ).
pub const TAU: Parameter =
    Parameter::new("tau", "τ: exp(s/τ)", 0.01, Domain::Positive).grid(TEMPERATURES);
/// Iterations T of the Sinkhorn methods.
pub const ITERATIONS: Parameter = Parameter::new(
    "t",
    "T: Sinkhorn iterations",
    10.0,
    Domain::Count { min: 1 },
)
.flag("iterations");

/// Sinkhorn normalisation: `sn` when the targets are the gallery, `dbsn`
/// when they are the gallery and the gallery bank.
pub struct Sinkhorn {
    dual_bank: bool,
}

/// `sn`: over the query bank and the gallery.
pub const SN: Sinkhorn = Sinkhorn { dual_bank: false };
/// `dbsn`: targets are the gallery and the gallery bank.
pub const DBSN: Sinkhorn = Sinkhorn { dual_bank: true };

impl Method for Sinkhorn {
    fn name(&self) -> &'static str {
        if self.dual_bank {
            "dbsn"
        } else {
            "sn"
        }
    }
    fn summary(&self) -> &'static str {
        if self.dual_bank {
            "dual-bank Sinkhorn: targets are the gallery and the gallery bank (Pan et al. 2025)"
        } else {
            "Sinkhorn normalisation: the target potential of an entropic transport from the bank (Pan et al. 2025)"
        }
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[TAU, ITERATIONS]
    }
    fn gallery_bank(&self) -> GalleryBankUse {
        if self.dual_bank {
            GalleryBankUse::Required
        } else {
            GalleryBankUse::Unused
        }
    }
    fn transductive(&self) -> bool {
        !self.dual_bank
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        vec![StatColumn::late_f64("correction")]
    }
    fn sinkhorn(&self, spec: &MethodSpec) -> Option<SinkhornSetup> {
        Some(SinkhornSetup {
            tau: spec.get("tau"),
            iterations: spec.count("t"),
            with_gallery_bank: self.dual_bank,
        })
    }
    fn late_columns(&self, _spec: &MethodSpec, late: &LateContext<'_>) -> Vec<ArrayRef> {
        vec![late.potential()]
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        Ok(ctx.subtract_column(spec, 0))
    }
    fn export(&self) -> Export {
        Export::Additive
    }
}
