//! Pass 2 starts here: the scoring plan of a set of methods, from the
//! columns of a stats file that each method's module names.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::method::{ColumnKind, MethodSpec, PlanContext};
use crate::query::ScoringPlan;
use crate::stats_file::{check_same_normalize, file_metadata, read_columns};

/// The pass 2 plan for `methods` from the stats file at `path` (needed
/// unless no method has a gallery statistic).
pub fn load_plan(
    path: Option<&Path>,
    index: &IdIndex,
    methods: &[MethodSpec],
    normalize: bool,
) -> Result<ScoringPlan> {
    let n = index.len();
    let mut plan = ScoringPlan::default();
    let raw = methods
        .iter()
        .any(|m| m.method().needs_raw(m))
        .then(|| plan.raw_scoring(n));
    let with_stats = methods.iter().any(|m| m.method().has_statistics());
    let path = match path {
        Some(path) if with_stats => Some(path),
        None if with_stats => {
            return Err(HubnormError::Usage(format!(
                "--stats FILE is needed for every method with a gallery statistic (all but {})",
                crate::method::names_where(|m| !m.method().has_statistics())
            )))
        }
        _ => None,
    };
    // Every column any method needs, read in one pass over the file.
    let mut names: Vec<(String, ColumnKind)> = Vec::new();
    let mut wanted: Vec<Vec<usize>> = Vec::new();
    for m in methods {
        let declared = m.method().columns(m);
        let mut indices = Vec::new();
        for suffix in m.method().search_columns(m) {
            let kind = declared
                .iter()
                .find(|c| c.suffix == suffix)
                .unwrap_or_else(|| {
                    panic!(
                        "method {} searches with an undeclared column {suffix}",
                        m.kind()
                    )
                })
                .kind;
            let name = m.column(suffix);
            let i = names
                .iter()
                .position(|(n, _)| *n == name)
                .unwrap_or_else(|| {
                    names.push((name, kind));
                    names.len() - 1
                });
            indices.push(i);
        }
        wanted.push(indices);
    }
    let (mut values, metadata) = match path {
        Some(path) => {
            let metadata = file_metadata(path)?;
            check_same_normalize(path, &metadata, normalize)?;
            let columns = read_columns(path, index, &names)?;
            (columns.into_iter().map(Some).collect::<Vec<_>>(), metadata)
        }
        None => (Vec::new(), HashMap::new()),
    };
    for (m, indices) in methods.iter().zip(wanted) {
        let mut context = PlanContext {
            plan: &mut plan,
            raw,
            values: indices.iter().map(|&i| values[i].take()).collect(),
            metadata: &metadata,
            path,
        };
        let rule = m.method().rule(m, &mut context)?;
        // The registry's word decides whether a search is screened; the
        // screen's bound holds only for subtractions.
        if m.method().screened_search() && !rule.fits_screen(&plan.scorings) {
            return Err(HubnormError::Internal(format!(
                "method {} is registered as screenable but scores other than s − h(g)",
                m.kind()
            )));
        }
        plan.methods.push(rule);
    }
    Ok(plan)
}
