//! The two passes as streaming SQL table functions:
//!
//! ```sql
//! SELECT * FROM hubnorm_stats('gallery/', 'bank/', 'is,nnn', 'beta=30,nnn.k=64');
//! SELECT * FROM hubnorm_search('queries/', 'gallery/', 'gallery_stats.parquet', 'is', 10);
//! ```
//!
//! Each returns a [`PassTable`] ([`super::pass`]): its batches stream as
//! the pass makes them, so they compose with joins, filters, `LIMIT` and
//! `COPY ... TO`. On one machine the pass is one partition; on a cluster,
//! it is cut into shards, one task each: `hubnorm_stats` into shards of
//! gallery rows, `hubnorm_search` into shards of query rows.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::logical_expr::Expr;

use crate::error::HubnormError;
use crate::options::{MethodKind, MethodSpec};
use crate::pipeline::{self, SearchJob, StatsJob};

use super::pass::{PassSpec, PassTable};
use super::{external, Placement, SqlOptions};

// ------------------------------------------------------------------ arguments

fn literal<'a>(function: &str, args: &'a [Expr], i: usize, what: &str) -> Result<&'a ScalarValue> {
    match args.get(i) {
        Some(Expr::Literal(value, _)) if !value.is_null() => Ok(value),
        Some(other) => plan_err!(
            "{function}: argument {} ({what}) must be a literal, got {other}",
            i + 1
        ),
        None => plan_err!("{function}: argument {} ({what}) is missing", i + 1),
    }
}

fn text(function: &str, args: &[Expr], i: usize, what: &str) -> Result<String> {
    match literal(function, args, i, what)? {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Ok(s.clone()),
        other => plan_err!(
            "{function}: argument {} ({what}) must be a string, got {other}",
            i + 1
        ),
    }
}

/// A literal argument that must be a whole number ≥ 1: `2.5` is refused,
/// not truncated (a cast to an integer type would truncate it).
fn whole_number(function: &str, args: &[Expr], i: usize, what: &str) -> Result<usize> {
    let value = literal(function, args, i, what)?;
    let whole = match value.cast_to(&datafusion::arrow::datatypes::DataType::Float64) {
        Ok(ScalarValue::Float64(Some(v)))
            if v >= 1.0 && v.fract() == 0.0 && v <= u32::MAX as f64 =>
        {
            Some(v as usize)
        }
        _ => None,
    };
    match whole {
        Some(v) => Ok(v),
        None => plan_err!(
            "{function}: argument {} ({what}) must be a whole number ≥ 1, got {value}",
            i + 1
        ),
    }
}

/// Methods named `"is,nnn"` with parameters `"beta=30,nnn.k=64"`: a bare
/// name applies to every listed method that has it, `method.name` to one.
pub fn parse_methods(methods: &str, parameters: &str) -> crate::Result<Vec<MethodSpec>> {
    let mut assignments: Vec<(Option<MethodKind>, String, f64)> = Vec::new();
    for item in parameters
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| HubnormError::Usage(format!("parameter '{item}' is not NAME=VALUE")))?;
        let value: f64 = value.trim().parse().map_err(|_| {
            HubnormError::Usage(format!("parameter '{item}': '{value}' is not a number"))
        })?;
        let (kind, name) = match name.trim().split_once('.') {
            Some((method, name)) => (Some(method.parse::<MethodKind>()?), name.to_owned()),
            None => (None, name.trim().to_owned()),
        };
        assignments.push((kind, name, value));
    }
    let kinds: Vec<MethodKind> = methods
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<crate::Result<_>>()?;
    if kinds.is_empty() {
        return Err(HubnormError::Usage("no method named".into()));
    }
    let mut used = vec![false; assignments.len()];
    let mut specs = Vec::new();
    for kind in kinds {
        let known: Vec<&str> = MethodSpec::from_kind(kind, &Default::default())
            .parameters()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let mut own = Vec::new();
        for (i, (target, name, value)) in assignments.iter().enumerate() {
            let applies = match target {
                Some(t) => *t == kind,
                None => known.contains(&name.as_str()),
            };
            if applies {
                own.push((name.clone(), *value));
                used[i] = true;
            }
        }
        let spec = MethodSpec::with_parameters(kind, &own)?;
        spec.validate()?;
        specs.push(spec);
    }
    if let Some(i) = used.iter().position(|u| !u) {
        let (_, name, _) = &assignments[i];
        return Err(HubnormError::Usage(format!(
            "parameter '{name}' belongs to none of the methods '{methods}'"
        )));
    }
    Ok(specs)
}

/// `hubnorm_stats(gallery, bank, methods [, parameters [, gallery_bank]])`.
#[derive(Debug)]
pub(super) struct StatsFunction {
    pub options: SqlOptions,
    pub placement: Placement,
}

impl TableFunctionImpl for StatsFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        const NAME: &str = "hubnorm_stats";
        if !(3..=5).contains(&args.len()) {
            return plan_err!(
                "{NAME}(gallery, bank, methods [, parameters [, gallery_bank]]) takes 3 to 5 arguments, got {}",
                args.len()
            );
        }
        let parameters = if args.len() > 3 {
            text(NAME, args, 3, "parameters")?
        } else {
            String::new()
        };
        let methods =
            parse_methods(&text(NAME, args, 2, "methods")?, &parameters).map_err(external)?;
        let job = StatsJob {
            gallery: text(NAME, args, 0, "gallery")?,
            bank: text(NAME, args, 1, "bank")?,
            gallery_bank: if args.len() > 4 {
                Some(text(NAME, args, 4, "gallery_bank")?)
            } else {
                None
            },
            bank_sample: None,
            methods,
            out: PathBuf::new(),
            overwrite: false,
            options: self.options.pass_options(),
            checkpoint: Default::default(),
        };
        let (spec, rows) = PassSpec::for_stats(&job).map_err(external)?;
        let spec = match self.placement {
            Placement::Local => spec,
            Placement::Cluster => {
                pipeline::check_shardable(&job.methods).map_err(external)?;
                spec.sharded(rows, self.options.partitions())
                    .for_cluster(&Default::default())
                    .map_err(external)?
            }
        };
        Ok(Arc::new(PassTable::new(spec).map_err(external)?))
    }
}

/// `hubnorm_search(queries, gallery, stats, method [, k [, parameters]])`.
#[derive(Debug)]
pub(super) struct SearchFunction {
    pub options: SqlOptions,
    pub placement: Placement,
}

impl TableFunctionImpl for SearchFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        const NAME: &str = "hubnorm_search";
        if !(4..=6).contains(&args.len()) {
            return plan_err!(
                "{NAME}(queries, gallery, stats, method [, k [, parameters]]) takes 4 to 6 arguments, got {}",
                args.len()
            );
        }
        let k = if args.len() > 4 {
            whole_number(NAME, args, 4, "k")?
        } else {
            10
        };
        let stats = text(NAME, args, 2, "stats")?;
        let methods_arg = text(NAME, args, 3, "method")?;
        let methods = if args.len() > 5 {
            parse_methods(&methods_arg, &text(NAME, args, 5, "parameters")?).map_err(external)?
        } else {
            // Without parameters, take the statistic the stats file holds
            // (as `hubnorm search` does).
            methods_from_stats_file(&methods_arg, &stats).map_err(external)?
        };
        let job = SearchJob {
            queries: text(NAME, args, 0, "queries")?,
            gallery: text(NAME, args, 1, "gallery")?,
            stats: (!stats.is_empty()).then(|| PathBuf::from(&stats)),
            methods,
            k,
            out: PathBuf::new(),
            overwrite: false,
            options: self.options.pass_options(),
        };
        let (spec, rows) = PassSpec::for_search(&job).map_err(external)?;
        let spec = match self.placement {
            Placement::Local => spec,
            Placement::Cluster => spec
                .sharded(rows, self.options.partitions())
                .for_cluster(&Default::default())
                .map_err(external)?,
        };
        Ok(Arc::new(PassTable::new(spec).map_err(external)?))
    }
}

/// Each named method with the parameters the stats file holds for it (the
/// defaults when the file holds none or several).
fn methods_from_stats_file(methods: &str, stats: &str) -> crate::Result<Vec<MethodSpec>> {
    let defaults = parse_methods(methods, "")?;
    let in_file = if stats.is_empty() {
        Vec::new()
    } else {
        pipeline::stats_file_methods(std::path::Path::new(stats))?
    };
    Ok(defaults
        .into_iter()
        .map(|spec| {
            let same: Vec<&MethodSpec> =
                in_file.iter().filter(|m| m.kind() == spec.kind()).collect();
            match same.as_slice() {
                [only] => **only,
                _ => spec,
            }
        })
        .collect())
}
