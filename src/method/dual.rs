//! DBNorm (Wang et al. 2023): inverted softmax over both banks.
//!
//! - `dual-is`: h(g) = (LSE_b β₁·s(b, g) + LSE_ĝ β₂·s(ĝ, g)) / (β₁ + β₂),
//!   from the query bank B and the gallery bank G_B.
//! - `dual-dis`: each factor gated as in `dis` by its own activation set;
//!   a query reports the raw score, either single-bank correction, or both,
//!   as its raw top-1 is in neither, one or both sets.

use arrow::array::ArrayRef;

use super::dis::{check_activation_k_within_gallery, ACTIVATION_K};
use super::{
    BankNeeds, ChunkContext, Domain, Export, GalleryBankUse, InputSizes, LateContext, Method,
    MethodSpec, Parameter, PlanContext, StatColumn,
};
use crate::error::Result;
use crate::query::{MethodRule, QueryTerm, Selection};

const BETA1: Parameter =
    Parameter::new("beta1", "β₁: the query-bank factor", 20.0, Domain::Positive)
        .grid(&[10.0, 20.0, 50.0]);
const BETA2: Parameter = Parameter::new(
    "beta2",
    "β₂: the gallery-bank factor",
    1.0,
    Domain::Positive,
)
.grid(&[1.0, 5.0, 20.0]);

/// k_A of `dual-dis`: as `dis`'s, but kept fixed by `tune` (the grid sweeps the two β).
const DUAL_ACTIVATION_K: Parameter = Parameter {
    grid: &[],
    ..ACTIVATION_K
};

fn betas(spec: &MethodSpec) -> (f64, f64) {
    (spec.get("beta1"), spec.get("beta2"))
}

fn request_both(spec: &MethodSpec, needs: &mut BankNeeds) {
    let (b1, b2) = betas(spec);
    needs.bank_lse(b1);
    needs.gallery_bank_lse(b2);
}

/// The states of both banks: query max/sum, gallery max/sum.
fn state_columns(spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
    let (b1, b2) = betas(spec);
    vec![
        chunk.f64s(|i| chunk.bank_lse(b1, i).max),
        chunk.f64s(|i| chunk.bank_lse(b1, i).sum),
        chunk.f64s(|i| chunk.gallery_bank_lse(b2, i).max),
        chunk.f64s(|i| chunk.gallery_bank_lse(b2, i).sum),
    ]
}

/// h(g) of both factors.
fn both_correction(spec: &MethodSpec, chunk: &ChunkContext<'_>) -> ArrayRef {
    let (b1, b2) = betas(spec);
    chunk.f64s(|i| {
        (chunk.bank_lse(b1, i).value() + chunk.gallery_bank_lse(b2, i).value()) / (b1 + b2)
    })
}

const STATES: [StatColumn; 4] = [
    StatColumn::f64("query_lse_max"),
    StatColumn::f64("query_lse_sum"),
    StatColumn::f64("gallery_lse_max"),
    StatColumn::f64("gallery_lse_sum"),
];

/// DBNorm's dual inverted softmax.
pub struct DualInvertedSoftmax;

impl Method for DualInvertedSoftmax {
    fn name(&self) -> &'static str {
        "dual-is"
    }
    fn summary(&self) -> &'static str {
        "DBNorm's dual inverted softmax over the query bank and the gallery bank (Wang et al. 2023)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[BETA1, BETA2]
    }
    fn gallery_bank(&self) -> GalleryBankUse {
        GalleryBankUse::Required
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        request_both(spec, needs);
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        let mut columns = vec![StatColumn::f64("correction")];
        columns.extend(STATES);
        columns
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let mut columns = vec![both_correction(spec, chunk)];
        columns.extend(state_columns(spec, chunk));
        columns
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        Ok(ctx.subtract_column(spec, 0))
    }
    fn export(&self) -> Export {
        Export::Additive
    }
}

/// Dual inverted softmax with DIS gating per factor.
pub struct DualDynamicInvertedSoftmax;

impl Method for DualDynamicInvertedSoftmax {
    fn name(&self) -> &'static str {
        "dual-dis"
    }
    fn summary(&self) -> &'static str {
        "dual inverted softmax with each factor gated by its activation set (Wang et al. 2023)"
    }
    fn parameters(&self) -> &'static [Parameter] {
        &[BETA1, BETA2, DUAL_ACTIVATION_K]
    }
    fn gallery_bank(&self) -> GalleryBankUse {
        GalleryBankUse::Required
    }
    fn request(&self, spec: &MethodSpec, needs: &mut BankNeeds) {
        request_both(spec, needs);
        needs.bank_activation(spec.count("ka"));
        needs.gallery_bank_activation(spec.count("ka"));
    }
    fn check_inputs(&self, spec: &MethodSpec, sizes: &InputSizes) -> Result<()> {
        check_activation_k_within_gallery(spec, sizes)
    }
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        let mut columns = vec![
            StatColumn::f64("correction"),
            StatColumn::f64("query_correction"),
            StatColumn::f64("gallery_correction"),
        ];
        columns.extend(STATES);
        columns.extend([
            StatColumn::late_bool("query_active"),
            StatColumn::late_bool("gallery_active"),
        ]);
        columns
    }
    fn chunk_columns(&self, spec: &MethodSpec, chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        let (b1, b2) = betas(spec);
        let mut columns = vec![
            both_correction(spec, chunk),
            chunk.f64s(|i| chunk.bank_lse(b1, i).value() / b1),
            chunk.f64s(|i| chunk.gallery_bank_lse(b2, i).value() / b2),
        ];
        columns.extend(state_columns(spec, chunk));
        columns
    }
    fn late_columns(&self, spec: &MethodSpec, late: &LateContext<'_>) -> Vec<ArrayRef> {
        let k = spec.count("ka");
        vec![late.bank_activation(k), late.gallery_bank_activation(k)]
    }
    fn needs_raw(&self, _spec: &MethodSpec) -> bool {
        true
    }
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        vec![
            "correction",
            "query_correction",
            "gallery_correction",
            "query_active",
            "gallery_active",
        ]
    }
    fn rule(&self, spec: &MethodSpec, ctx: &mut PlanContext<'_>) -> Result<MethodRule> {
        let scoring = |ctx: &mut PlanContext<'_>, i: usize| {
            let correction = ctx.take(i).into_subtract();
            ctx.add_scoring(correction)
        };
        let both = scoring(ctx, 0);
        let query_only = scoring(ctx, 1);
        let gallery_only = scoring(ctx, 2);
        let raw = ctx.raw();
        let selection = Selection::Gated {
            raw,
            sets: vec![ctx.take(3).into_bits(), ctx.take(4).into_bits()],
            choices: vec![raw, query_only, gallery_only, both],
        };
        Ok(MethodRule {
            spec: *spec,
            selection,
            query_term: QueryTerm::None,
        })
    }
    fn export(&self) -> Export {
        Export::Refused("gated on the query's raw top-1")
    }
}
