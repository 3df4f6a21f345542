//! `hubnorm tune`: hyperparameters chosen by grid search on a validation
//! split, never on the test queries.
//!
//! Every grid point of every method is one [`MethodSpec`]; the whole grid
//! runs as one multi-method evaluation (one stream over bank × gallery for
//! pass 1, one over validation × gallery for pass 2, with identical
//! statistics and scorings shared), and each method keeps the point with
//! the best selection metric.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use serde::Serialize;

use crate::error::{HubnormError, Result};
use crate::evaluate::figures_of;
use crate::inputs::{input_sizes, open_table};
use crate::options::{MethodKind, MethodSpec, PassOptions};
use crate::pipeline::{commit_all, evaluate_methods};
use crate::progress::Progress;
use crate::report::compare::MethodFigures;
use crate::report::files::write_batch;
use crate::report::html::TuningCurve;
use crate::sink::refuse_existing;
use crate::sink::write_text_atomically;
use crate::source::EmbeddingTable;

/// Where the validation queries come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Validation {
    /// A query table with ground truth in the gallery (`--validation`).
    Queries(String),
    /// A seeded fraction of the bank (rows with `target_id`), searched in
    /// `gallery` (default: the gallery); the rest stays the bank
    /// (`--validation-split`).
    SplitBank {
        fraction: f64,
        seed: u64,
        gallery: Option<String>,
    },
}

/// The values one parameter takes in the grid: for one method, or (kind
/// `None`) for every method that has the parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct GridAxis {
    pub method: Option<MethodKind>,
    pub parameter: String,
    pub values: Vec<f64>,
}

impl std::str::FromStr for GridAxis {
    type Err = HubnormError;

    /// `beta=5,10,20` or `nnn.k=16,64,128`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            HubnormError::Usage(format!(
                "--grid '{s}': expected PARAMETER=V1,V2,... or METHOD.PARAMETER=V1,V2,... (e.g. beta=10,20,30 or nnn.k=32,128)"
            ))
        };
        let (name, values) = s.split_once('=').ok_or_else(bad)?;
        let (method, parameter) = match name.split_once('.') {
            Some((m, p)) => (Some(m.parse::<MethodKind>()?), p),
            None => (None, name),
        };
        let values = values
            .split(',')
            .map(|v| v.trim().parse::<f64>().map_err(|_| bad()))
            .collect::<Result<Vec<f64>>>()?;
        if values.is_empty() || parameter.is_empty() {
            return Err(bad());
        }
        Ok(GridAxis {
            method,
            parameter: parameter.to_owned(),
            values,
        })
    }
}

/// The metric a grid point is chosen by (higher is better).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectionMetric {
    RecallAt(usize),
    Mrr,
}

impl std::str::FromStr for SelectionMetric {
    type Err = HubnormError;

    /// `r1`, `r5`, `recall_at_10`, `mrr`.
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        if lower == "mrr" {
            return Ok(SelectionMetric::Mrr);
        }
        let k = lower
            .strip_prefix("recall_at_")
            .or_else(|| lower.strip_prefix("r@"))
            .or_else(|| lower.strip_prefix('r'))
            .and_then(|k| k.parse::<usize>().ok())
            .filter(|&k| k > 0);
        k.map(SelectionMetric::RecallAt).ok_or_else(|| {
            HubnormError::Usage(format!(
                "unknown metric '{s}' (use r1, r5, r10, recall_at_K or mrr)"
            ))
        })
    }
}

impl SelectionMetric {
    pub fn name(self) -> String {
        match self {
            SelectionMetric::RecallAt(k) => format!("R@{k}"),
            SelectionMetric::Mrr => "MRR".into(),
        }
    }

    fn of(self, figures: &MethodFigures) -> f64 {
        let Some(q) = &figures.quality else {
            return f64::NAN;
        };
        match self {
            SelectionMetric::RecallAt(k) => q.recall_at(k).unwrap_or(f64::NAN),
            SelectionMetric::Mrr => q.mrr,
        }
    }
}

/// Inputs and options of `hubnorm tune`.
#[derive(Debug, Clone)]
pub struct TuneJob {
    pub gallery: String,
    pub bank: String,
    pub gallery_bank: Option<String>,
    pub validation: Validation,
    /// Methods to tune (empty: every method with parameters that the inputs allow).
    pub methods: Vec<MethodKind>,
    /// Replacements of the default grid's axes.
    pub grid: Vec<GridAxis>,
    pub metric: SelectionMetric,
    pub out_dir: PathBuf,
    pub html: Option<PathBuf>,
    pub overwrite: bool,
    pub options: PassOptions,
}

/// Files `hubnorm tune` writes.
pub const TUNE_OUTPUTS: [&str; 2] = ["tune.parquet", "tuned.json"];

/// One evaluated grid point.
#[derive(Debug, Clone, PartialEq)]
pub struct GridPoint {
    pub spec: MethodSpec,
    pub figures: MethodFigures,
    /// The selection metric's value.
    pub score: f64,
    pub chosen: bool,
}

/// What `hubnorm tune` produced.
#[derive(Debug, Clone)]
pub struct TuneOutcome {
    /// Every grid point, grouped by method in grid order.
    pub grid: Vec<GridPoint>,
    /// The chosen spec per method, the baseline first.
    pub chosen: Vec<MethodSpec>,
    pub validation_queries: u64,
    pub curves: Vec<TuningCurve>,
}

/// The default grid of a method: each parameter's candidate values, as
/// its module declares them (values around the METHODS.md defaults, as the
/// papers sweep them).
pub fn default_grid(kind: MethodKind) -> Vec<(&'static str, Vec<f64>)> {
    kind.method()
        .parameters()
        .iter()
        .filter(|p| !p.grid.is_empty())
        .map(|p| (p.name, p.grid.to_vec()))
        .collect()
}

/// Refuses a `--grid` axis no method tuned takes (a typo, or a method left
/// out of `--methods`), which would otherwise be ignored.
fn check_axes_apply(axes: &[GridAxis], kinds: &[MethodKind]) -> Result<()> {
    let names = || {
        kinds
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for axis in axes {
        let takes = |kind: &MethodKind| {
            kind.method()
                .parameters()
                .iter()
                .any(|p| p.name == axis.parameter)
        };
        match axis.method {
            Some(kind) if !kinds.contains(&kind) => {
                return Err(HubnormError::Usage(format!(
                    "--grid {kind}.{}: {kind} is not among the methods tuned ({})",
                    axis.parameter,
                    names()
                )))
            }
            None if !kinds.iter().any(takes) => {
                return Err(HubnormError::Usage(format!(
                    "--grid {}: none of the methods tuned ({}) has a parameter '{}'",
                    axis.parameter,
                    names(),
                    axis.parameter
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The most points a method's grid may have.
pub const MAX_GRID_POINTS: usize = 10_000;

/// The grid points of `kind`: the default axes with `overrides` applied,
/// as a Cartesian product; refused above [`MAX_GRID_POINTS`].
pub fn grid_of(kind: MethodKind, overrides: &[GridAxis]) -> Result<Vec<MethodSpec>> {
    let mut axes: Vec<(String, Vec<f64>)> = default_grid(kind)
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v))
        .collect();
    for o in overrides {
        if o.method.is_some_and(|m| m != kind) {
            continue;
        }
        let has_parameter = kind
            .method()
            .parameters()
            .iter()
            .any(|p| p.name == o.parameter);
        match axes.iter_mut().find(|(n, _)| *n == o.parameter) {
            Some(axis) => axis.1 = o.values.clone(),
            // An override may add an axis the default grid fixes (`t` of
            // sn); a method-specific one is checked by the spec below.
            None if has_parameter || o.method == Some(kind) => {
                axes.push((o.parameter.clone(), o.values.clone()))
            }
            None => {}
        }
    }
    // Each point is a full pass over the validation data: a grid this large
    // is a typo, and building it would exhaust memory before any work.
    let size = axes
        .iter()
        .try_fold(1usize, |n, (_, values)| n.checked_mul(values.len()))
        .filter(|&n| n <= MAX_GRID_POINTS);
    if size.is_none() {
        return Err(HubnormError::Usage(format!(
            "the grid of {kind} has more than {MAX_GRID_POINTS} points ({}); give fewer values per parameter",
            axes.iter()
                .map(|(name, values)| format!("{} {name}", values.len()))
                .collect::<Vec<_>>()
                .join(" × ")
        )));
    }
    let mut points: Vec<Vec<(String, f64)>> = vec![vec![]];
    for (name, values) in &axes {
        points = points
            .into_iter()
            .flat_map(|p| {
                values.iter().map(move |&v| {
                    let mut q = p.clone();
                    q.push((name.clone(), v));
                    q
                })
            })
            .collect();
    }
    points
        .iter()
        .map(|p| {
            let spec = MethodSpec::with_parameters(kind, p)?;
            spec.validate()?;
            Ok(spec)
        })
        .collect()
}

/// Refuses validation queries read from a file of the bank: each would be
/// scored against statistics it is part of, which flatters the methods
/// that use the bank most.
fn refuse_validation_in_bank(queries: &EmbeddingTable, bank: &EmbeddingTable) -> Result<()> {
    // Object-store parts do not canonicalise and compare as written.
    let place = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let bank_parts: Vec<PathBuf> = bank.parts.iter().map(|b| place(&b.path)).collect();
    match queries
        .parts
        .iter()
        .find(|q| bank_parts.contains(&place(&q.path)))
    {
        Some(shared) => Err(HubnormError::Usage(format!(
            "--validation and --bank share {}: its queries would be validated against a bank that holds them; hold bank rows out with --validation-split, or validate on another table",
            shared.path.display()
        ))),
        None => Ok(()),
    }
}

/// The validation queries, the bank and the gallery they are searched in.
fn validation_tables(job: &TuneJob) -> Result<(EmbeddingTable, EmbeddingTable, EmbeddingTable)> {
    let options = &job.options;
    let gallery = open_table("gallery", &job.gallery, options, false)?;
    let bank = open_table("bank", &job.bank, options, false)?;
    match &job.validation {
        Validation::Queries(spec) => {
            let queries = open_table("validation queries", spec, options, true)?;
            require_targets(&queries)?;
            refuse_validation_in_bank(&queries, &bank)?;
            Ok((queries, bank, gallery))
        }
        Validation::SplitBank {
            fraction,
            seed,
            gallery: validation_gallery,
        } => {
            if !(*fraction > 0.0 && *fraction < 1.0) {
                return Err(HubnormError::Usage(format!(
                    "--validation-split {fraction}: expected a fraction strictly between 0 and 1"
                )));
            }
            let held_out = ((bank.rows as f64 * fraction).round() as u64).clamp(1, bank.rows - 1);
            let queries = open_table("bank (validation part)", &job.bank, options, true)?;
            require_targets(&queries)?;
            let queries = queries.sampled(held_out, *seed)?;
            let bank = bank.sampled_complement(held_out, *seed)?;
            let gallery = match validation_gallery {
                Some(spec) => open_table("validation gallery", spec, options, false)?,
                None => gallery,
            };
            Ok((queries, bank, gallery))
        }
    }
}

fn require_targets(queries: &EmbeddingTable) -> Result<()> {
    if queries.has_targets {
        return Ok(());
    }
    Err(HubnormError::input(
        &queries.parts[0].path,
        None,
        Some(&queries.options().target_column),
        format!(
            "tuning needs ground truth in the {} to choose parameters by (a target column)",
            queries.role
        ),
    ))
}

/// The methods tuned by default: every method with parameters the inputs
/// allow (the gallery-bank methods only with a gallery bank; not the
/// sinkhorn-pp protocol, which is too costly to sweep).
fn default_methods(has_gallery_bank: bool) -> Vec<MethodKind> {
    MethodKind::all()
        .filter(|k| k.method().tuned_by_default())
        .filter(|k| has_gallery_bank || !k.needs_gallery_bank())
        .collect()
}

/// `hubnorm tune`: evaluates the grid, prints nothing, writes
/// `tune.parquet` (every point) and `tuned.json` (the chosen parameters, a
/// config `hubnorm run --config` reads), and the page with the tuning curves
/// when asked.
pub fn tune(job: &TuneJob, progress: &dyn Progress) -> Result<TuneOutcome> {
    let _locks = crate::sink::OutputLock::acquire_folder(&job.out_dir, &TUNE_OUTPUTS)?;
    for name in TUNE_OUTPUTS {
        refuse_existing(&job.out_dir.join(name), job.overwrite)?;
    }
    if let Some(html) = &job.html {
        refuse_existing(html, job.overwrite)?;
    }
    let kinds = if job.methods.is_empty() {
        default_methods(job.gallery_bank.is_some())
    } else {
        job.methods.clone()
    };
    check_axes_apply(&job.grid, &kinds)?;
    if let SelectionMetric::RecallAt(k) = job.metric {
        if !job.options.report.quality.recall_at.contains(&k) {
            return Err(HubnormError::Usage(format!(
                "--metric R@{k} needs {k} among --recall-at"
            )));
        }
    }
    let (queries, bank, gallery) = validation_tables(job)?;
    let gallery_bank = job
        .gallery_bank
        .as_deref()
        .map(|spec| open_table("gallery bank", spec, &job.options, false))
        .transpose()?;
    let none = MethodKind::baseline();
    let mut specs = vec![MethodSpec::default_for(none)];
    let sizes = input_sizes(&bank, &gallery, Some(&queries), &job.options);
    for kind in kinds.iter().filter(|k| **k != none) {
        for spec in grid_of(*kind, &job.grid)? {
            // Points the bank cannot serve (k above its size) are skipped.
            let fits = !matches!(
                spec.method().check_inputs(&spec, &sizes),
                Err(HubnormError::Usage(_))
            );
            if fits && !specs.contains(&spec) {
                specs.push(spec);
            }
        }
    }
    crate::storage::create_dir_all(&job.out_dir)?;
    let outcomes = evaluate_methods(
        &queries,
        &gallery,
        bank,
        gallery_bank,
        &specs,
        &job.options,
        &job.out_dir,
        progress,
    )?;
    let figures = figures_of(&outcomes, &job.options);
    let mut grid: Vec<GridPoint> = outcomes
        .iter()
        .zip(figures)
        .map(|(o, f)| GridPoint {
            spec: o.spec,
            score: job.metric.of(&f),
            figures: f,
            chosen: false,
        })
        .collect();
    // Per method the best point; ties go to the earlier grid point (the
    // smaller values, as the default grids are ascending).
    let mut chosen = Vec::new();
    for kind in std::iter::once(none).chain(kinds.iter().copied()) {
        let best = (0..grid.len())
            .filter(|&i| grid[i].spec.kind() == kind && !grid[i].score.is_nan())
            .fold(None, |best: Option<usize>, i| match best {
                Some(b) if grid[b].score >= grid[i].score => Some(b),
                _ => Some(i),
            });
        if let Some(b) = best {
            if !chosen.contains(&grid[b].spec) {
                grid[b].chosen = true;
                chosen.push(grid[b].spec);
            }
        }
    }
    let curves = tuning_curves(&grid, job.metric);
    let config = config_json(&chosen, job);
    let mut files = vec![
        write_batch(
            &job.out_dir.join("tune.parquet"),
            &grid_batch(&grid)?,
            vec![("hubnorm.metric".into(), job.metric.name())],
            job.overwrite,
        )?,
        write_text_atomically(&job.out_dir.join("tuned.json"), &config, job.overwrite)?,
    ];
    if let Some(path) = &job.html {
        let chosen_figures: Vec<MethodFigures> = grid
            .iter()
            .filter(|p| p.chosen)
            .map(|p| p.figures.clone())
            .collect();
        let index = crate::ids::IdIndex::build(&gallery)?;
        let page = crate::evaluate::page_input(
            "hubnorm tune",
            vec![format!(
                "{} validation queries; chosen by {} (the chosen points below; the curves show every point)",
                queries.rows,
                job.metric.name()
            )],
            &chosen_figures,
            index.ids(),
            None,
            job.options.report.hubness_k,
            curves.clone(),
        );
        files.push(write_text_atomically(
            path,
            &crate::report::html::render(&page),
            job.overwrite,
        )?);
    }
    commit_all(files)?;
    Ok(TuneOutcome {
        grid,
        chosen,
        validation_queries: queries.rows,
        curves,
    })
}

/// For each method and parameter, the metric along that parameter with the
/// other parameters at their chosen values.
fn tuning_curves(grid: &[GridPoint], metric: SelectionMetric) -> Vec<TuningCurve> {
    let mut curves = Vec::new();
    for chosen in grid.iter().filter(|p| p.chosen) {
        let params = chosen.spec.parameters();
        for (axis, (name, value)) in params.iter().enumerate() {
            let mut points: Vec<(f64, f64)> = grid
                .iter()
                .filter(|p| p.spec.kind() == chosen.spec.kind())
                .filter(|p| {
                    let q = p.spec.parameters();
                    q.iter()
                        .enumerate()
                        .all(|(i, (_, v))| i == axis || *v == params[i].1)
                })
                .map(|p| (p.spec.parameters()[axis].1, p.score))
                .collect();
            if points.len() < 2 {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            curves.push(TuningCurve {
                method: chosen.spec.kind().name().to_owned(),
                parameter: name.to_string(),
                metric: metric.name(),
                points,
                chosen: *value,
            });
        }
    }
    curves
}

/// The chosen parameters as a config file `hubnorm run --config` accepts.
fn config_json(chosen: &[MethodSpec], job: &TuneJob) -> String {
    #[derive(Serialize)]
    struct Config {
        methods: serde_json::Value,
        tuned: serde_json::Value,
    }
    let methods: serde_json::Value =
        serde_json::from_str(&crate::stats_file::methods_json(chosen)).expect("valid JSON");
    let validation = match &job.validation {
        Validation::Queries(spec) => serde_json::json!({ "queries": spec }),
        Validation::SplitBank {
            fraction,
            seed,
            gallery,
        } => serde_json::json!({
            "split_of_bank": job.bank, "fraction": fraction, "seed": seed,
            "gallery": gallery.as_deref().unwrap_or(&job.gallery),
        }),
    };
    let config = Config {
        methods,
        tuned: serde_json::json!({
            "by": "hubnorm tune",
            "version": env!("CARGO_PKG_VERSION"),
            "metric": job.metric.name(),
            "validation": validation,
            "bank": job.bank,
            "gallery": job.gallery,
        }),
    };
    serde_json::to_string_pretty(&config).expect("serialisable")
}

/// `tune.parquet`: one row per grid point: `method`, `parameters` (JSON),
/// one Float64 column per parameter name (null where a method lacks it), the
/// quality figures, skewness, `score` and `chosen`.
fn grid_batch(grid: &[GridPoint]) -> Result<RecordBatch> {
    let mut parameter_names: Vec<&str> = Vec::new();
    for p in grid {
        for (name, _) in p.spec.parameters() {
            if !parameter_names.contains(&name) {
                parameter_names.push(name);
            }
        }
    }
    let mut figure_names: Vec<String> = Vec::new();
    for p in grid {
        for (name, _) in p.figures.values() {
            if !figure_names.contains(&name) {
                figure_names.push(name);
            }
        }
    }
    let mut fields = vec![
        Field::new("method", DataType::Utf8, false),
        Field::new("parameters", DataType::Utf8, false),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            grid.iter().map(|p| p.spec.kind().name()),
        )),
        Arc::new(StringArray::from_iter_values(
            grid.iter().map(|p| p.figures.parameters.clone()),
        )),
    ];
    for name in &parameter_names {
        fields.push(Field::new(*name, DataType::Float64, true));
        let values: Float64Array = grid
            .iter()
            .map(|p| {
                p.spec
                    .parameters()
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| *v)
            })
            .collect();
        columns.push(Arc::new(values));
    }
    for name in &figure_names {
        fields.push(Field::new(name, DataType::Float64, true));
        let values: Float64Array = grid
            .iter()
            .map(|p| {
                p.figures
                    .values()
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| *v)
            })
            .collect();
        columns.push(Arc::new(values));
    }
    fields.push(Field::new("score", DataType::Float64, true));
    columns.push(Arc::new(Float64Array::from_iter(
        grid.iter().map(|p| Some(p.score).filter(|s| !s.is_nan())),
    )));
    fields.push(Field::new("chosen", DataType::Boolean, false));
    columns.push(Arc::new(BooleanArray::from_iter(
        grid.iter().map(|p| Some(p.chosen)),
    )));
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// The grid as an aligned table: method, parameters, the metric, skewness;
/// `*` marks the chosen points.
pub fn grid_table(grid: &[GridPoint], metric: SelectionMetric) -> String {
    let labels: Vec<String> = grid
        .iter()
        .map(|p| {
            let params: Vec<String> = p
                .spec
                .parameters()
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            format!(
                "{}{} {}",
                if p.chosen { "*" } else { " " },
                p.spec.kind().name(),
                params.join(",")
            )
        })
        .collect();
    let width = labels
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut out = format!("{:<width$} {:>8} {:>8}\n", " method", metric.name(), "skew");
    for (p, label) in grid.iter().zip(&labels) {
        let score = if p.score.is_nan() {
            "-".to_owned()
        } else if matches!(metric, SelectionMetric::Mrr) {
            format!("{:.4}", p.score)
        } else {
            format!("{:.2}", 100.0 * p.score)
        };
        out += &format!(
            "{:<width$} {:>8} {:>8.3}\n",
            label, score, p.figures.hubness.skewness
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grid_axis_no_method_tuned_takes_is_refused() {
        let kind = |name: &str| MethodKind::named(name).unwrap();
        let axes = |text: &str| vec![text.parse::<GridAxis>().unwrap()];
        let (is, nnn) = (kind("is"), kind("nnn"));
        assert!(check_axes_apply(&axes("beta=10,20"), &[is]).is_ok());
        assert!(check_axes_apply(&axes("nnn.k=8,16"), &[is, nnn]).is_ok());
        let typo = check_axes_apply(&axes("bta=10,20"), &[is, nnn]).unwrap_err();
        assert!(
            typo.to_string()
                .contains("none of the methods tuned (is, nnn) has a parameter 'bta'"),
            "{typo}"
        );
        let left_out = check_axes_apply(&axes("nnn.k=8,16"), &[is]).unwrap_err();
        assert!(
            left_out
                .to_string()
                .contains("nnn is not among the methods tuned (is)"),
            "{left_out}"
        );
        assert_eq!(left_out.exit_code(), 2);
    }

    /// An axis without a method sets the parameter of every method that
    /// has it, also where the default grid keeps it fixed (`t` of sn),
    /// as the method-specific form does.
    #[test]
    fn an_axis_without_a_method_adds_a_fixed_parameter() {
        let sn = MethodKind::named("sn").unwrap();
        for text in ["t=5", "sn.t=5"] {
            let points = grid_of(sn, &[text.parse::<GridAxis>().unwrap()]).unwrap();
            assert!(!points.is_empty(), "{text}");
            assert!(
                points.iter().all(|p| p.count("t") == 5),
                "{text}: {points:?}"
            );
        }
        // A method without the parameter keeps its grid.
        let is = MethodKind::named("is").unwrap();
        let points = grid_of(is, &["t=5".parse::<GridAxis>().unwrap()]).unwrap();
        assert_eq!(points, grid_of(is, &[]).unwrap());
    }
}
