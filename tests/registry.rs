//! Every registered method, through the stages that loop over the registry:
//! the statistics columns it declares are the ones pass 1 writes, in the
//! same order and types; merging a file's rows with nothing gives back the
//! very columns written (so the merge reads and writes the declared order);
//! the columns pass 2 reads are declared ones; and `stats` then `search`
//! gives exactly what `run` gives; `--precision screened` serves a
//! method exactly when its registry entry says it can; and the docs' lists
//! of methods by property are the registry's.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use arrow::array::Array;
use common::{
    random_table, read_parquet, read_results, write_case, write_table, CaseShape, Layout,
};
use hubnorm::bank::StatsLayout;
use hubnorm::method::{Export, MethodKind, MethodSpec, StatColumn, StoredRows, REGISTRY};
use hubnorm::options::{PassOptions, Precision};
use hubnorm::pipeline::{self, RunJob, SearchJob, StatsJob};
use hubnorm::progress::Silent;

/// Every method with a gallery statistic, at its defaults (`nnn` with a k
/// the small bank holds).
fn methods_with_statistics() -> Vec<MethodSpec> {
    MethodKind::all()
        .filter(|k| k.method().has_statistics())
        .map(|k| match k.name() {
            "nnn" => MethodSpec::new("nnn", &[("k", 16.0)]).unwrap(),
            _ => MethodSpec::default_for(k),
        })
        .collect()
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// A case that crosses the pass-1 tile (2048 bank rows × 512 gallery
/// columns) and pass-2 tile (512 queries) boundaries in one dimension each.
fn write_inputs(dir: &Path) {
    let mut rng = write_case(
        dir,
        &CaseShape {
            seed: 27,
            gallery: 700,
            queries: 530,
            bank: 90,
            dim: 12,
            noise: 0.6,
        },
    );
    let gallery_bank = random_table(&mut rng, "h", 70, 12);
    write_table(
        &dir.join("gallery_bank.parquet"),
        &gallery_bank,
        Layout::FixedF32,
        false,
    );
}

#[test]
fn every_method_writes_reads_and_merges_its_declared_columns_in_one_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_inputs(d);
    let methods = methods_with_statistics();
    assert!(
        methods.len() >= 12,
        "the registry lost methods: {methods:?}"
    );
    for spec in &methods {
        let name = spec.kind().name();
        let out = d.join(format!("{name}.stats.parquet"));
        let job = StatsJob {
            methods: vec![*spec],
            gallery_bank: Some(path(d, "gallery_bank.parquet")),
            ..StatsJob::new(path(d, "gallery.parquet"), path(d, "bank.parquet"), &out)
        };
        pipeline::run_stats(&job, &Silent).unwrap_or_else(|e| panic!("{name}: {e}"));
        let batch = read_parquet(&out);
        let schema = batch.schema();

        // Declared columns: the prefix, each suffix, early before late.
        let declared = spec.method().columns(spec);
        let (early, late): (Vec<&StatColumn>, Vec<&StatColumn>) =
            declared.iter().partition(|c| !c.late);
        let expected: Vec<(String, arrow::datatypes::DataType)> = early
            .iter()
            .chain(&late)
            .map(|c| (spec.column(c.suffix), c.kind.data_type()))
            .collect();
        let written: Vec<(String, arrow::datatypes::DataType)> = schema
            .fields()
            .iter()
            .skip(1)
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect();
        assert_eq!(
            written, expected,
            "{name}: written columns differ from the declared ones"
        );
        let (layout_early, layout_late) = StatsLayout::new(&[*spec]).columns();
        let layout_names: Vec<String> = layout_early
            .into_iter()
            .chain(layout_late)
            .map(|(n, _)| n)
            .collect();
        let written_names: Vec<String> = written.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(layout_names, written_names, "{name}: layout order");

        // Pass 2 reads declared columns only.
        for suffix in spec.method().search_columns(spec) {
            assert!(
                declared.iter().any(|c| c.suffix == suffix),
                "{name}: searches with undeclared {suffix}"
            );
        }

        // Merging with nothing rebuilds each early column from the state
        // columns, as the merge reads them: a swap of two columns in the
        // write or merge order shows as a difference.
        if spec.method().mergeable() {
            assert!(
                late.is_empty(),
                "{name}: a mergeable method has no late column"
            );
            let merged = spec
                .method()
                .merge(spec, &StoredRows::new(&batch), None)
                .unwrap();
            assert_eq!(merged.len(), early.len(), "{name}: merge column count");
            for (i, column) in merged.iter().enumerate() {
                let stored = batch.column(1 + i);
                assert_eq!(
                    column.to_data(),
                    stored.to_data(),
                    "{name}: merged column {} differs",
                    schema.field(1 + i).name()
                );
            }
        }

        // stats → search gives exactly what run gives.
        let searched = d.join(format!("{name}.search.parquet"));
        let search = SearchJob {
            methods: vec![*spec],
            ..SearchJob::new(
                path(d, "queries.parquet"),
                path(d, "gallery.parquet"),
                Some(out.clone()),
                &searched,
            )
        };
        pipeline::run_search(&search, &Silent).unwrap_or_else(|e| panic!("{name} search: {e}"));
        let run_dir = d.join(format!("{name}.run"));
        let run = RunJob {
            methods: vec![*spec],
            gallery_bank: Some(path(d, "gallery_bank.parquet")),
            ..RunJob::new(
                path(d, "queries.parquet"),
                path(d, "gallery.parquet"),
                path(d, "bank.parquet"),
                &run_dir,
            )
        };
        pipeline::run(&run, &Silent).unwrap_or_else(|e| panic!("{name} run: {e}"));
        let from_run: Vec<_> = read_results(&run_dir.join("results.parquet"))
            .into_iter()
            .filter(|r| r.method == name)
            .collect();
        let from_search = read_results(&searched);
        assert_eq!(from_run.len(), 530 * 10, "{name}: result rows");
        assert_eq!(
            from_search, from_run,
            "{name}: stats → search differs from run"
        );
    }
}

/// Every registered method under `--precision screened`: one the registry
/// calls screenable (`Method::screened_search`) writes the exact run's
/// results and records the screen; any other is refused before any pass,
/// naming it alone, and writes nothing. A method whose pass-2 rule does not
/// score by subtraction while its entry says it can be screened fails its
/// plan here. Without AVX512_BF16 the screen runs in scalar code.
#[test]
fn every_method_is_screened_exactly_when_the_registry_says_so() {
    if !common::screen_in_process() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_inputs(d);
    let precision_of = |out: &Path| common::recorded_precision(&out.join("results.parquet"));
    let (mut screened_methods, mut refused_methods) = (0, 0);
    for kind in MethodKind::all() {
        let name = kind.name();
        let spec = match name {
            "nnn" => MethodSpec::new("nnn", &[("k", 16.0)]).unwrap(),
            _ => MethodSpec::default_for(kind),
        };
        let run = |precision: Precision, out: &Path| RunJob {
            methods: vec![spec],
            gallery_bank: Some(path(d, "gallery_bank.parquet")),
            options: PassOptions {
                precision,
                ..PassOptions::default()
            },
            ..RunJob::new(
                path(d, "queries.parquet"),
                path(d, "gallery.parquet"),
                path(d, "bank.parquet"),
                out,
            )
        };
        let (exact_dir, screened_dir) = (
            d.join(format!("{name}.exact")),
            d.join(format!("{name}.screened")),
        );
        let screened = pipeline::run(&run(Precision::Screened, &screened_dir), &Silent);
        if spec.method().screened_search() {
            screened_methods += 1;
            let screened = screened.unwrap_or_else(|e| panic!("{name} screened: {e}"));
            pipeline::run(&run(Precision::Exact, &exact_dir), &Silent)
                .unwrap_or_else(|e| panic!("{name} exact: {e}"));
            assert!(screened.screen.is_some(), "{name}: no screen summary");
            assert_eq!(
                read_results(&screened_dir.join("results.parquet")),
                read_results(&exact_dir.join("results.parquet")),
                "{name}: screened results differ from exact"
            );
            assert_eq!(
                precision_of(&screened_dir).as_deref(),
                Some("screened"),
                "{name}"
            );
        } else {
            refused_methods += 1;
            let refused = match screened {
                Ok(_) => panic!("{name}: screened though its score is not s − h(g)"),
                Err(e) => e,
            };
            assert_eq!(refused.exit_code(), 2, "{name}: {refused}");
            assert!(
                refused
                    .to_string()
                    .contains(&format!("--precision screened: {name} score other")),
                "{name}: {refused}"
            );
            assert!(
                !screened_dir.join("results.parquet").exists(),
                "{name}: a refused run wrote results"
            );
        }
    }
    assert!(
        screened_methods >= 10 && refused_methods >= 4,
        "the registry lost methods: {screened_methods} screenable, {refused_methods} not"
    );
}

#[test]
fn the_registry_names_each_method_once_with_its_docs_line() {
    let mut names: Vec<&str> = REGISTRY.iter().map(|m| m.name()).collect();
    for m in REGISTRY {
        assert!(!m.summary().is_empty(), "{} has no docs line", m.name());
    }
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/methods.md")).unwrap();
    for name in &names {
        assert!(
            docs.contains(&format!("`{name}`")),
            "docs/methods.md does not describe `{name}`"
        );
    }
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "a method name is registered twice");
}

/// The registered names written in backticks in `text` from the first
/// `start` (included) to the next `end` after it (other backticked words
/// ignored).
fn names_between(text: &str, start: &str, end: &str, file: &str) -> BTreeSet<String> {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("{file} no longer has `{start}`"));
    let to = from
        + start.len()
        + text[from + start.len()..]
            .find(end)
            .unwrap_or_else(|| panic!("{file}: no `{end}` after `{start}`"));
    text[from..to]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| MethodKind::named(word).is_ok())
        .map(str::to_owned)
        .collect()
}

fn names_where(keep: impl Fn(MethodKind) -> bool) -> BTreeSet<String> {
    MethodKind::all()
        .filter(|&m| keep(m))
        .map(|m| m.name().to_owned())
        .collect()
}

/// The prose that sorts methods by a property (which ones `export` serves
/// and refuses, which ones `stats --update` merges and recomputes) names
/// exactly the methods the registry gives that property: a method added or
/// changed in the registry fails here until its docs say so.
#[test]
fn the_docs_lists_of_methods_by_property_are_the_registry_s() {
    let read = |file: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
    };
    let readme = read("README.md");
    let exported = names_where(|m| matches!(m.method().export(), Export::Additive));
    let refused = names_where(|m| {
        m != MethodKind::baseline() && matches!(m.method().export(), Export::Refused(_))
    });
    let synopsis: BTreeSet<String> = readme
        .lines()
        .find_map(|line| line.strip_prefix("hubnorm export "))
        .and_then(|line| line.split("--method ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("README's export synopsis")
        .split('|')
        .map(str::to_owned)
        .collect();
    assert_eq!(
        synopsis, exported,
        "README: hubnorm export --method A|B|..."
    );
    assert_eq!(
        names_between(
            &readme,
            "Methods: `none`",
            "**[docs/methods.md]",
            "README.md"
        ),
        names_where(|_| true),
        "README: every method"
    );
    assert_eq!(
        names_between(
            &readme,
            "h(g). Methods:",
            "A term of the query",
            "README.md"
        ),
        exported,
        "README: the methods export serves"
    );
    assert_eq!(
        names_between(
            &readme,
            "never changes a ranking.",
            "are refused",
            "README.md"
        ),
        refused,
        "README: the methods export refuses"
    );
    // The SQL function for the same scores, in its table row (plain words).
    let corrected: BTreeSet<String> = readme
        .lines()
        .find(|line| line.starts_with("| `hub_corrected_score("))
        .and_then(|line| line.split("the score ").nth(1))
        .and_then(|rest| rest.split(" rank by").next())
        .expect("README's hub_corrected_score row")
        .replace(" and ", ", ")
        .split(", ")
        .map(str::to_owned)
        .collect();
    assert_eq!(corrected, exported, "README: hub_corrected_score's methods");

    let incremental = read("docs/incremental.md");
    let with_statistics = |mergeable: bool| {
        names_where(|m| m.method().has_statistics() && m.method().mergeable() == mergeable)
    };
    assert_eq!(
        names_between(
            &incremental,
            "For the mergeable methods,",
            "new bank parts",
            "docs/incremental.md"
        ),
        with_statistics(true),
        "docs/incremental.md: the methods --update merges"
    );
    assert_eq!(
        names_between(
            &incremental,
            "**Not incremental**",
            "summary line says",
            "docs/incremental.md"
        ),
        with_statistics(false),
        "docs/incremental.md: the methods --update recomputes"
    );
}
