//! Evaluation jobs on top of the passes: `hubnorm compare` (many methods on
//! the same data, one table) and `hubnorm report` (the hubness and quality
//! report of any results file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type};
use parquet::arrow::ProjectionMask;

use crate::error::{HubnormError, Result};
use crate::ids::{id_at, IdIndex, IdValue};
use crate::inputs::{input_sizes, open_table};
use crate::options::{MethodKind, MethodSpec, PassOptions};
use crate::pipeline::{
    commit_all, run_uncommitted, MethodOutcome, RunJob, RunSummary, RUN_OUTPUTS,
};
use crate::progress::Progress;
use crate::query::targets::resolve_targets;
use crate::report::compare::{Comparison, MethodFigures};
use crate::report::files::{read_corrections, read_text_column, ReportFiles};
use crate::report::html::{self, HubRow, MethodPage, PageInput, RecallBar, TuningCurve};
use crate::report::{KOccurrence, RankList};
use crate::sink::refuse_existing;
use crate::sink::write_text_atomically;
use crate::source::{normalise_ids, open_parquet, CheckedBatches, ACCEPTED_ID_TYPES};

/// Files `hubnorm compare` writes besides `hubnorm run`'s.
pub const COMPARE_OUTPUTS: [&str; 4] = [
    "compare.parquet",
    "compare.md",
    "report.parquet",
    "gallery_report.parquet",
];

/// Files `hubnorm report` writes.
pub const REPORT_OUTPUTS: [&str; 2] = ["report.parquet", "gallery_report.parquet"];

/// Inputs and options of `hubnorm compare`.
#[derive(Debug, Clone)]
pub struct CompareJob {
    /// The run; with `methods` empty, every method the inputs allow, each
    /// with its defaults.
    pub run: RunJob,
    /// The gallery column shown beside the hubs (used when present).
    pub text_column: String,
    /// Also write a self-contained HTML page here.
    pub html: Option<PathBuf>,
}

/// What `hubnorm compare` produced.
#[derive(Debug, Clone)]
pub struct CompareOutcome {
    pub summary: RunSummary,
    pub comparison: Comparison,
    /// Methods of the default list left out, with why.
    pub left_out: Vec<String>,
}

/// Every method the inputs allow, with its defaults (the baseline first),
/// and the methods left out with the reason: a method that needs a gallery
/// bank without one, or whose own input checks fail (k above the bank,
/// statistics above the memory limit, a protocol above its cost limit).
fn default_methods(job: &RunJob) -> Result<(Vec<MethodSpec>, Vec<String>)> {
    crate::pipeline::check_bank_choice(job)?;
    let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
    let bank_spec = if job.transductive {
        &job.queries
    } else {
        &job.bank
    };
    let bank = open_table("bank", bank_spec, &job.options, false)?;
    let bank = match job.bank_sample {
        Some(s) => bank.sampled(s.rows, s.seed)?,
        None => bank,
    };
    let queries = open_table("queries", &job.queries, &job.options, false)?;
    let sizes = input_sizes(&bank, &gallery, Some(&queries), &job.options);
    let (mut methods, mut left_out) = (Vec::new(), Vec::new());
    for kind in MethodKind::all() {
        let spec = MethodSpec::default_for(kind);
        if job.transductive && !kind.has_transductive_variant() {
            continue;
        }
        if kind.needs_gallery_bank() && job.gallery_bank.is_none() {
            left_out.push(format!("{kind}: needs --gallery-bank"));
            continue;
        }
        let check = kind.method().check_inputs(&spec, &sizes);
        match check {
            Ok(()) => methods.push(spec),
            Err(e) => left_out.push(format!("{kind}: {e}")),
        }
    }
    Ok((methods, left_out))
}

/// A method's display label: its name, with its parameters when another
/// method of the same kind is in the list.
fn label(spec: &MethodSpec, all: &[MethodSpec]) -> String {
    let same_kind = all.iter().filter(|m| m.kind() == spec.kind()).count();
    if same_kind <= 1 || spec.parameters().is_empty() {
        return spec.kind().name().to_owned();
    }
    let params: Vec<String> = spec
        .parameters()
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    format!("{} {}", spec.kind().name(), params.join(","))
}

/// The figures of each method of a run.
pub fn figures_of(outcomes: &[MethodOutcome], options: &PassOptions) -> Vec<MethodFigures> {
    let specs: Vec<MethodSpec> = outcomes.iter().map(|o| o.spec).collect();
    outcomes
        .iter()
        .map(|o| MethodFigures {
            label: label(&o.spec, &specs),
            method: o.spec.kind().name().to_owned(),
            parameters: serde_json::Value::Object(crate::stats_file::parameters_json(&o.spec))
                .to_string(),
            occurrence: o.occurrence.clone(),
            hubness: o.occurrence.measures(options.report.top_hubs),
            quality: o.ranks.summary(&options.report.quality),
        })
        .collect()
}

/// `hubnorm compare`: runs every method on the same data (one pass 1 and
/// one pass 2 shared by all), then writes the run's files plus the
/// comparison (`compare.parquet`, `compare.md`), `report.parquet`,
/// `gallery_report.parquet` and, when asked, the HTML page. Nothing takes
/// its final name unless everything was written.
pub fn compare(job: &CompareJob, progress: &dyn Progress) -> Result<CompareOutcome> {
    let outputs: Vec<&str> = RUN_OUTPUTS
        .iter()
        .chain(&COMPARE_OUTPUTS)
        .copied()
        .collect();
    let _locks = crate::sink::OutputLock::acquire_folder(&job.run.out_dir, &outputs)?;
    let mut run_job = job.run.clone();
    let mut left_out = Vec::new();
    if run_job.methods.is_empty() {
        (run_job.methods, left_out) = default_methods(&run_job)?;
    }
    if let Some(html) = &job.html {
        refuse_existing(html, run_job.overwrite)?;
    }
    let products = run_uncommitted(&run_job, "compare", &COMPARE_OUTPUTS, progress)?;
    let figures = figures_of(&products.outcomes, &run_job.options);
    let comparison = Comparison::new(&figures);
    let gallery = open_table("gallery", &run_job.gallery, &run_job.options, false)?;
    let text = read_text_column(&gallery, &job.text_column)?;
    let corrections = read_corrections(products.stats_path(), &products.index)?;
    let files = ReportFiles {
        figures: &figures,
        gallery_ids: products.index.ids(),
        text: text.as_ref(),
        corrections: &corrections,
        metadata: vec![("hubnorm.version".into(), env!("CARGO_PKG_VERSION").into())],
    };
    let dir = &run_job.out_dir;
    let mut written = Vec::new();
    written.extend(files.write_comparison(&comparison, dir, products.overwrite)?);
    written.extend(files.write_reports(dir, products.overwrite)?);
    if let Some(path) = &job.html {
        let summary = &products.summary;
        let context = vec![
            format!(
                "{} queries × {} gallery items, dimension {}; bank {} rows{}",
                summary.queries,
                summary.gallery,
                summary.dim,
                summary.bank.unwrap_or(0),
                summary
                    .gallery_bank
                    .map(|b| format!(", gallery bank {b} rows"))
                    .unwrap_or_default()
            ),
            format!("queries: {}", run_job.queries),
            format!("gallery: {}", run_job.gallery),
        ];
        let page = page_input(
            "hubnorm compare",
            context,
            &figures,
            products.index.ids(),
            text.as_ref(),
            run_job.options.report.hubness_k,
            Vec::new(),
        );
        written.push(write_text_atomically(
            path,
            &html::render(&page),
            products.overwrite,
        )?);
    }
    let summary = products.summary.clone();
    products.commit(written)?;
    Ok(CompareOutcome {
        summary,
        comparison,
        left_out,
    })
}

/// An id as plain text (no quotes).
fn id_text(ids: &dyn Array, row: usize) -> String {
    match id_at(ids, row) {
        IdValue::Int(v) => v.to_string(),
        IdValue::Str(s) => s.to_owned(),
    }
}

/// The HTML page's input from the figures (the first is the baseline).
pub fn page_input(
    title: &str,
    context: Vec<String>,
    figures: &[MethodFigures],
    gallery_ids: &ArrayRef,
    text: Option<&ArrayRef>,
    k: usize,
    tuning: Vec<TuningCurve>,
) -> PageInput {
    let methods = figures
        .iter()
        .map(|f| MethodPage {
            name: f.label.clone(),
            histogram: f.occurrence.histogram(),
            recall: f
                .quality
                .as_ref()
                .map(|q| {
                    q.recall
                        .iter()
                        .map(|r| {
                            let (low, high) = r.interval.unwrap_or((r.value, r.value));
                            RecallBar {
                                k: r.k,
                                value: r.value,
                                low,
                                high,
                            }
                        })
                        .collect()
                })
                .unwrap_or_default(),
            measures: f
                .hubness
                .values()
                .iter()
                .map(|(n, v)| (n.to_string(), *v))
                .collect(),
        })
        .collect();
    let top_hubs = figures
        .first()
        .map(|base| {
            base.hubness
                .top_hubs
                .iter()
                .map(|&(row, _)| HubRow {
                    gallery_id: id_text(gallery_ids.as_ref(), row as usize),
                    text: text
                        .filter(|t| !t.is_null(row as usize))
                        .map(|t| t.as_string::<i32>().value(row as usize).to_owned()),
                    counts: figures
                        .iter()
                        .map(|f| f.occurrence.counts[row as usize])
                        .collect(),
                })
                .collect()
        })
        .unwrap_or_default();
    PageInput {
        title: title.to_owned(),
        context,
        k,
        methods,
        top_hubs,
        tuning,
    }
}

// ------------------------------------------------------------------ report

/// Inputs and options of `hubnorm report`.
#[derive(Debug, Clone)]
pub struct ReportJob {
    /// A results file: ours or anyone's with `query_id` and `gallery_id`
    /// columns (`method` and `rank` used when present).
    pub results: PathBuf,
    pub gallery: String,
    /// The queries: every query counts (one with no result rows has an empty
    /// list), and their ground truth gives R@K for K ≤ k.
    pub queries: Option<String>,
    /// A stats file whose per-item corrections join gallery_report.parquet.
    pub stats: Option<PathBuf>,
    /// The k of the k-occurrence.
    pub k: usize,
    pub out_dir: PathBuf,
    pub html: Option<PathBuf>,
    pub text_column: String,
    pub overwrite: bool,
    pub options: PassOptions,
}

/// What `hubnorm report` produced.
#[derive(Debug, Clone)]
pub struct ReportOutcome {
    pub figures: Vec<MethodFigures>,
    pub comparison: Comparison,
}

/// A query id, owned (results files and query tables are matched by value).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum QueryKey {
    Int(i64),
    Str(Box<str>),
}

impl QueryKey {
    fn of(ids: &dyn Array, row: usize) -> Self {
        match id_at(ids, row) {
            IdValue::Int(v) => QueryKey::Int(v),
            IdValue::Str(s) => QueryKey::Str(s.into()),
        }
    }
}

/// One method's lists as read from a results file.
struct ListsOfMethod {
    name: String,
    occurrence: KOccurrence,
    /// Per query: its list as read so far.
    queries: HashMap<QueryKey, ListSoFar>,
    /// The longest list's last position.
    longest: i64,
}

/// One query's list in a results file, as read so far.
#[derive(Default)]
struct ListSoFar {
    /// Rows read.
    rows: u32,
    /// The best list position of a target.
    best_target: Option<u32>,
    /// The gallery rows at positions 1..=k: each counts once in N_k, so
    /// one twice, or more than k of them, is a malformed list.
    top: Vec<u32>,
}

/// `hubnorm report`: the hubness measures of every method's top-k lists in
/// a results file and, with ground truth, R@K for K ≤ k (from the lists:
/// a target beyond the written top-k counts as a miss, so MRR is MRR@k and
/// the mean rank is unknown).
pub fn report(job: &ReportJob, _progress: &dyn Progress) -> Result<ReportOutcome> {
    if job.k == 0 {
        return Err(HubnormError::Usage("--k must be at least 1".into()));
    }
    let _locks = crate::sink::OutputLock::acquire_folder(&job.out_dir, &REPORT_OUTPUTS)?;
    for name in REPORT_OUTPUTS {
        refuse_existing(&job.out_dir.join(name), job.overwrite)?;
    }
    if let Some(html) = &job.html {
        refuse_existing(html, job.overwrite)?;
    }
    // A run's results with another run's statistics would join corrections
    // to lists they did not produce.
    if let Some(stats) = &job.stats {
        crate::pipeline::check_same_run(&[&job.results, stats])?;
    }
    let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
    let index = IdIndex::build(&gallery)?;
    let targets = match &job.queries {
        Some(spec) => Some(query_targets(spec, &index, &job.options)?),
        None => None,
    };
    let mut methods = read_lists(
        &job.results,
        &index,
        job.k,
        targets.as_ref().map(|t| &t.positives),
    )?;
    // The baseline first.
    if let Some(i) = methods
        .iter()
        .position(|m| m.name == MethodKind::baseline().name())
    {
        let base = methods.remove(i);
        methods.insert(0, base);
    }
    let mut quality_options = job.options.report.quality.clone();
    quality_options.recall_at.retain(|&k| k <= job.k);
    let figures: Vec<MethodFigures> = methods
        .into_iter()
        .map(|mut m| {
            let mut ranks = RankList::default();
            if let Some(t) = &targets {
                // Queries without result rows still count, with empty lists.
                for key in &t.order {
                    if !m.queries.contains_key(key) {
                        m.occurrence.queries += 1;
                    }
                }
                for key in t.order.iter().filter(|_| t.has_targets) {
                    if t.positives[key].is_empty() {
                        ranks.add_skipped();
                        continue;
                    }
                    // A target beyond the written list has an unknown rank > k.
                    let best = m.queries.get(key).and_then(|list| list.best_target);
                    ranks.add_rank(best.map_or(f64::INFINITY, |p| p as f64));
                }
            }
            let quality = ranks
                .summary(&quality_options)
                .map(|q| q.truncated_at(job.k));
            MethodFigures {
                hubness: m.occurrence.measures(job.options.report.top_hubs),
                label: m.name.clone(),
                method: m.name,
                parameters: "{}".into(),
                occurrence: m.occurrence,
                quality,
            }
        })
        .collect();
    let comparison = Comparison::new(&figures);
    let text = read_text_column(&gallery, &job.text_column)?;
    let corrections = match &job.stats {
        Some(path) => read_corrections(path, &index)?,
        None => Vec::new(),
    };
    let files = ReportFiles {
        figures: &figures,
        gallery_ids: index.ids(),
        text: text.as_ref(),
        corrections: &corrections,
        metadata: vec![
            ("hubnorm.version".into(), env!("CARGO_PKG_VERSION").into()),
            (
                "hubnorm.results.path".into(),
                job.results.display().to_string(),
            ),
            ("hubnorm.k".into(), job.k.to_string()),
        ],
    };
    let mut written = files.write_reports(&job.out_dir, job.overwrite)?;
    if let Some(path) = &job.html {
        let page = page_input(
            "hubnorm report",
            vec![format!(
                "{} ({} gallery items, k = {})",
                job.results.display(),
                index.len(),
                job.k
            )],
            &figures,
            index.ids(),
            text.as_ref(),
            job.k,
            Vec::new(),
        );
        written.push(write_text_atomically(
            path,
            &html::render(&page),
            job.overwrite,
        )?);
    }
    commit_all(written)?;
    Ok(ReportOutcome {
        figures,
        comparison,
    })
}

/// Each query's ground-truth gallery rows (empty when none is in the
/// gallery and `--skip-missing` is on), and whether the table has targets.
fn query_targets(spec: &str, index: &IdIndex, options: &PassOptions) -> Result<QueryTargets> {
    let queries = open_table("queries", spec, options, true)?;
    let mut out = QueryTargets {
        order: Vec::with_capacity(queries.rows as usize),
        positives: HashMap::with_capacity(queries.rows as usize),
        has_targets: queries.has_targets,
    };
    let mut blocks = queries.blocks(4096);
    while let Some(block) = blocks.next_block()? {
        let positives = resolve_targets(&block, &queries, index)?;
        for q in 0..block.rows {
            let key = QueryKey::of(block.ids.as_ref(), q);
            out.order.push(key.clone());
            out.positives.insert(key, positives.of(q).to_vec());
        }
    }
    Ok(out)
}

/// The queries of `hubnorm report --queries`, in table order (so the
/// bootstrap resamples the same sequence as `hubnorm run`).
struct QueryTargets {
    order: Vec<QueryKey>,
    /// Ground-truth gallery rows of each query (empty: skipped or none).
    positives: HashMap<QueryKey, Vec<u32>>,
    has_targets: bool,
}

/// Streams a results file into per-method k-occurrence counts (and, with
/// targets, each query's best list position of a target).
fn read_lists(
    path: &Path,
    index: &IdIndex,
    k: usize,
    targets: Option<&HashMap<QueryKey, Vec<u32>>>,
) -> Result<Vec<ListsOfMethod>> {
    let builder = open_parquet(path)?;
    let schema = builder.schema().clone();
    let required = |name: &str| {
        schema.index_of(name).map_err(|_| {
            HubnormError::input(
                path,
                None,
                Some(name),
                "missing column (a results file needs query_id and gallery_id)",
            )
        })
    };
    let query_col = required("query_id")?;
    let gallery_col = required("gallery_id")?;
    let method_col = schema.index_of("method").ok();
    let rank_col = schema.index_of("rank").ok();
    let mut roots: Vec<usize> = [Some(query_col), Some(gallery_col), method_col, rank_col]
        .into_iter()
        .flatten()
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
    roots.sort_unstable();
    let position = |c: usize| roots.iter().position(|&r| r == c).expect("projected");
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| HubnormError::input(path, None, None, format!("cannot read: {e}")))?;
    let mut methods: Vec<ListsOfMethod> = Vec::new();
    let mut first_row = 0u64;
    let bad = |row: u64, column: &str, why: String| {
        HubnormError::input(path, Some(row), Some(column), why)
    };
    for batch in CheckedBatches::new(reader, path) {
        let batch = batch?;
        let ids = |column: usize, name: &str| {
            normalise_ids(batch.column(position(column)))
                .map_err(|_| bad(first_row, name, format!("ids must be {ACCEPTED_ID_TYPES}")))
        };
        let query_ids = ids(query_col, "query_id")?;
        let gallery_ids = ids(gallery_col, "gallery_id")?;
        let method_values = match method_col {
            Some(c) => Some(arrow::compute::cast(
                batch.column(position(c)),
                &DataType::Utf8,
            )?),
            None => None,
        };
        let ranks = match rank_col {
            Some(c) => Some(arrow::compute::cast(
                batch.column(position(c)),
                &DataType::Int64,
            )?),
            None => None,
        };
        for row in 0..batch.num_rows() {
            let global = first_row + row as u64;
            if query_ids.is_null(row) {
                return Err(bad(global, "query_id", "null id".into()));
            }
            if gallery_ids.is_null(row) {
                return Err(bad(global, "gallery_id", "null id".into()));
            }
            let name = match &method_values {
                Some(m) if m.is_null(row) => {
                    return Err(bad(global, "method", "null method".into()))
                }
                Some(m) => m.as_string::<i32>().value(row),
                None => "results",
            };
            let g = index
                .find(id_at(gallery_ids.as_ref(), row))
                .ok_or_else(|| {
                    bad(
                        global,
                        "gallery_id",
                        format!("{} is not in the gallery", id_at(gallery_ids.as_ref(), row)),
                    )
                })?;
            let m = match methods.iter().position(|m| m.name == name) {
                Some(m) => m,
                None => {
                    methods.push(ListsOfMethod {
                        name: name.to_owned(),
                        occurrence: KOccurrence::new(k, index.len()),
                        queries: HashMap::new(),
                        longest: 0,
                    });
                    methods.len() - 1
                }
            };
            let lists = &mut methods[m];
            let key = QueryKey::of(query_ids.as_ref(), row);
            if let Some(t) = targets {
                if !t.contains_key(&key) {
                    return Err(bad(
                        global,
                        "query_id",
                        format!(
                            "{} is not in the queries table",
                            id_at(query_ids.as_ref(), row)
                        ),
                    ));
                }
            }
            let entry = lists.queries.entry(key.clone()).or_insert_with(|| {
                lists.occurrence.queries += 1;
                ListSoFar::default()
            });
            entry.rows += 1;
            // The list position: the rank column when present, else the row order.
            let position = match &ranks {
                Some(r) if r.is_null(row) => return Err(bad(global, "rank", "null rank".into())),
                Some(r) => r.as_primitive::<Int64Type>().value(row),
                None => entry.rows as i64,
            };
            if position < 1 {
                return Err(bad(
                    global,
                    "rank",
                    format!("rank {position}: ranks start at 1"),
                ));
            }
            lists.longest = lists.longest.max(position);
            if position as usize > k {
                continue;
            }
            let query = || id_at(query_ids.as_ref(), row);
            if entry.top.contains(&g) {
                return Err(bad(
                    global,
                    "gallery_id",
                    format!(
                        "{} is in the list of query {} twice",
                        id_at(gallery_ids.as_ref(), row),
                        query()
                    ),
                ));
            }
            if entry.top.len() == k {
                return Err(bad(
                    global,
                    "rank",
                    format!(
                        "query {} has more than {k} rows at ranks 1 to {k} (a rank given twice)",
                        query()
                    ),
                ));
            }
            entry.top.push(g);
            lists.occurrence.counts[g as usize] += 1;
            if let Some(t) = targets {
                if t[&key].contains(&g) && entry.best_target.is_none_or(|b| position < b as i64) {
                    entry.best_target = Some(position as u32);
                }
            }
        }
        first_row += batch.num_rows() as u64;
    }
    if methods.is_empty() {
        return Err(HubnormError::input(
            path,
            None,
            None,
            "the results file has no rows",
        ));
    }
    // Lists shorter than k would have their k-occurrence counted at their
    // length and reported as at k.
    if let Some(short) = methods.iter().find(|m| m.longest < k as i64) {
        return Err(HubnormError::Usage(format!(
            "--k {k} is longer than the lists in {} ({}: {} entries per query at most); pass --k {} or less",
            path.display(),
            short.name,
            short.longest,
            short.longest.max(1),
        )));
    }
    Ok(methods)
}
