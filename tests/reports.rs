//! Hubness measures against the REPORTS.md fixture and a naive reference;
//! `hubnorm report`, `hubnorm compare` and `hubnorm tune` end to end.

mod common;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int32Array, StringArray};
use arrow::datatypes::{Float64Type, UInt32Type};
use common::{
    queries_near, random_table, read_parquet, rng, write_columns, write_table, Layout, Table,
};
use hubnorm::evaluate::{compare, report, CompareJob, ReportJob};
use hubnorm::options::{MethodKind, MethodSpec, PassOptions};
use hubnorm::pipeline::{run, RunJob};
use hubnorm::progress::Silent;
use hubnorm::report::KOccurrence;
use hubnorm::tune::{tune, GridAxis, SelectionMetric, TuneJob, Validation};
use rand::Rng;

/// spec/hubness-fixture.json (6 queries, 5 gallery items, k = 2): every
/// value it gives, to 1e-9. The fixture is copied under tests/fixtures; when
/// ../shared is present, the copy must still equal the spec's.
#[test]
fn the_fixture_values_are_reproduced_to_1e_9() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(here.join("tests/fixtures/hubness-fixture.json")).unwrap();
    let spec = here.join("../shared/spec/hubness-fixture.json");
    if spec.exists() {
        let original: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(spec).unwrap()).unwrap();
        let copy: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(original, copy, "tests/fixtures copy differs from the spec");
    }
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let k = fixture["k"].as_u64().unwrap() as usize;
    let n = fixture["n_gallery"].as_u64().unwrap() as usize;
    let mut occurrence = KOccurrence::new(k, n);
    for list in fixture["nn"].as_array().unwrap() {
        occurrence.add_list(
            list.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32),
        );
    }
    let m = occurrence.measures(3);
    let e = &fixture["expected"];
    let want = |key: &str| e[key].as_f64().unwrap();
    let checks = [
        ("mean_nk", m.mean),
        ("skewness_biased_g1", m.skewness),
        ("kurtosis_excess_biased", m.kurtosis),
        ("gini", m.gini),
        ("robinhood", m.robin_hood),
        ("atkinson_eps0.5", m.atkinson),
        ("antihub_rate", m.antihub_rate),
        ("hub_occurrence_ge_2k_per_query_slots", m.hub_occurrence),
        (
            "hub_occurrence_ge_2mean_per_query_slots",
            m.hub_occurrence_relative,
        ),
        ("max_k_occurrence", m.max as f64),
        ("groupie_ratio_max_over_nq_k", m.groupie_ratio),
        ("n_queries", m.queries as f64),
        ("n_gallery", m.gallery_items as f64),
    ];
    for (key, got) in checks {
        assert!(
            (got - want(key)).abs() < 1e-9,
            "{key}: {got} vs {}",
            want(key)
        );
    }
    assert_eq!(
        m.top_hubs[0].0 as u64,
        e["argmax_k_occurrence"].as_u64().unwrap()
    );
    let histogram: Vec<(u32, u64)> = e["nk_histogram"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(v, c)| (v.parse().unwrap(), c.as_u64().unwrap()))
        .collect();
    let mut sorted = histogram.clone();
    sorted.sort();
    assert_eq!(occurrence.histogram(), sorted);
}

/// Random top-k lists with n_q ≠ n_g (both ways): each measure equals its
/// definition computed naively (Gini over all pairs, O(n²)).
#[test]
fn measures_match_their_definitions_when_queries_and_gallery_differ() {
    let mut r = rng(41);
    for (queries, gallery, k) in [(37usize, 53usize, 3usize), (90, 20, 5), (8, 200, 10)] {
        let mut occurrence = KOccurrence::new(k, gallery);
        for _ in 0..queries {
            // Skewed picks: low rows are hubs.
            let mut list: Vec<u32> = Vec::new();
            while list.len() < k {
                let g = (r.random::<f64>().powi(3) * gallery as f64) as u32;
                if !list.contains(&g) {
                    list.push(g);
                }
            }
            occurrence.add_list(list);
        }
        let n: Vec<f64> = occurrence.counts.iter().map(|&c| c as f64).collect();
        let ng = gallery as f64;
        let slots = (k * queries) as f64;
        let mu = slots / ng;
        let moment = |p: i32| n.iter().map(|v| (v - mu).powi(p)).sum::<f64>() / ng;
        let pairs: f64 = n
            .iter()
            .flat_map(|a| n.iter().map(move |b| (a - b).abs()))
            .sum();
        let want = [
            ("skewness", moment(3) / moment(2).powf(1.5)),
            ("kurtosis", moment(4) / moment(2).powi(2) - 3.0),
            ("max", n.iter().cloned().fold(0.0, f64::max)),
            (
                "antihub_rate",
                n.iter().filter(|&&v| v == 0.0).count() as f64 / ng,
            ),
            (
                "hub_occurrence",
                n.iter().filter(|&&v| v >= 2.0 * k as f64).sum::<f64>() / slots,
            ),
            (
                "hub_occurrence_relative",
                n.iter().filter(|&&v| v >= 2.0 * mu).sum::<f64>() / slots,
            ),
            (
                "robin_hood",
                0.5 * n.iter().map(|v| (v - mu).abs()).sum::<f64>() / slots,
            ),
            ("gini", pairs / (2.0 * ng * slots)),
            (
                "atkinson",
                1.0 - (n.iter().map(|v| v.sqrt()).sum::<f64>() / ng).powi(2) / mu,
            ),
            (
                "groupie_ratio",
                n.iter().cloned().fold(0.0, f64::max) / slots,
            ),
        ];
        let got = occurrence.measures(5);
        for ((name, value), (got_name, got_value)) in want.iter().zip(got.values()) {
            assert_eq!(*name, got_name);
            assert!(
                (value - got_value).abs() < 1e-9,
                "{queries} queries × {gallery} items: {name} {got_value} vs {value}"
            );
        }
        assert_eq!(got.queries, queries as u64);
    }
}

struct Data {
    dir: tempfile::TempDir,
}

impl Data {
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// Gallery (with a text column), bank, gallery bank and queries with targets.
fn data(seed: u64) -> Data {
    let mut r = rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let gallery = random_table(&mut r, "g", 150, 12);
    let bank = random_table(&mut r, "b", 200, 12);
    let gallery_bank = random_table(&mut r, "gb", 180, 12);
    let queries = queries_near(&mut r, &gallery, 90, 0.9);
    write_gallery_with_text(&dir.path().join("gallery.parquet"), &gallery);
    write_table(
        &dir.path().join("bank.parquet"),
        &bank,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.path().join("gallery_bank.parquet"),
        &gallery_bank,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.path().join("queries.parquet"),
        &queries,
        Layout::FixedF32,
        false,
    );
    Data { dir }
}

fn write_gallery_with_text(path: &Path, gallery: &Table) {
    let plain = path.with_extension("plain.parquet");
    write_table(&plain, gallery, Layout::FixedF32, false);
    let batch = read_parquet(&plain);
    std::fs::remove_file(&plain).unwrap();
    let text: ArrayRef = Arc::new(StringArray::from_iter_values(
        gallery.ids.iter().map(|id| format!("item <{id}> & text")),
    ));
    write_columns(
        path,
        vec![
            ("id", batch.column_by_name("id").unwrap().clone()),
            ("text", text),
            (
                "embedding",
                batch.column_by_name("embedding").unwrap().clone(),
            ),
        ],
    );
}

fn run_job(d: &Data, out: &str, methods: Vec<MethodSpec>) -> RunJob {
    RunJob {
        queries: d.path("queries.parquet"),
        gallery: d.path("gallery.parquet"),
        bank: d.path("bank.parquet"),
        gallery_bank: Some(d.path("gallery_bank.parquet")),
        bank_sample: None,
        transductive: false,
        methods,
        k: 10,
        out_dir: d.dir.path().join(out),
        overwrite: false,
        options: PassOptions::default(),
        cluster: None,
        checkpoint: Default::default(),
    }
}

/// `compare` writes one row per method, the baseline first, and its files
/// agree with each other and with `run`: report.parquet holds every
/// measure, gallery_report.parquet the k-occurrence, text and corrections;
/// `report` on compare's own results file gives the same hubness measures
/// and R@K (with the same bootstrap intervals).
#[test]
fn compare_and_report_agree_with_run_and_with_each_other() {
    let d = data(7);
    let methods = vec![
        MethodSpec::new("is", &[("beta", 20.0)]).unwrap(),
        MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 16.0)]).unwrap(),
        MethodSpec::new("dual-is", &[("beta1", 20.0), ("beta2", 1.0)]).unwrap(),
    ];
    let job = CompareJob {
        run: run_job(&d, "compare", methods.clone()),
        text_column: "text".into(),
        html: Some(d.dir.path().join("compare/page.html")),
    };
    let outcome = compare(&job, &Silent).unwrap();
    let out = d.dir.path().join("compare");
    for name in [
        "results.parquet",
        "gallery_stats.parquet",
        "summary.json",
        "compare.parquet",
        "compare.md",
        "report.parquet",
        "gallery_report.parquet",
        "page.html",
    ] {
        assert!(out.join(name).exists(), "{name}");
    }
    // The same as a plain run.
    let plain = run(&run_job(&d, "run", methods), &Silent).unwrap();
    assert_eq!(plain.methods, outcome.summary.methods);

    let table = read_parquet(&out.join("compare.parquet"));
    let names: Vec<&str> = table
        .column(0)
        .as_string::<i32>()
        .iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(names, ["none", "is", "nnn", "dual-is"]);
    let r1 = table
        .column_by_name("recall_at_1")
        .unwrap()
        .as_primitive::<Float64Type>();
    let delta = table
        .column_by_name("delta_recall_at_1")
        .unwrap()
        .as_primitive::<Float64Type>();
    let skew = table
        .column_by_name("skewness")
        .unwrap()
        .as_primitive::<Float64Type>();
    for m in 0..4 {
        let summary = &plain.methods[m];
        assert_eq!(
            r1.value(m),
            summary.quality.as_ref().unwrap().recall_at(1).unwrap()
        );
        assert!((delta.value(m) - (r1.value(m) - r1.value(0))).abs() < 1e-15);
        assert_eq!(skew.value(m), summary.hubness.skewness);
        assert_eq!(summary.hubness.skewness, summary.k_occurrence_skewness);
    }
    assert_eq!(delta.value(0), 0.0);
    let markdown = std::fs::read_to_string(out.join("compare.md")).unwrap();
    assert!(
        markdown.lines().nth(2).unwrap().starts_with("| none |"),
        "{markdown}"
    );

    // report.parquet: one row per method × measure.
    let rows = read_parquet(&out.join("report.parquet"));
    let measures: Vec<&str> = rows
        .column(1)
        .as_string::<i32>()
        .iter()
        .map(Option::unwrap)
        .collect();
    for name in hubnorm::report::HubnessMeasures::NAMES {
        assert_eq!(measures.iter().filter(|m| **m == name).count(), 4, "{name}");
    }

    // gallery_report.parquet: k-occurrence per method sums to k·n_q.
    let gallery = read_parquet(&out.join("gallery_report.parquet"));
    assert_eq!(gallery.num_rows(), 150);
    assert_eq!(
        gallery
            .column_by_name("text")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "item <g0> & text"
    );
    for stem in ["none", "is", "nnn", "dual_is"] {
        let counts = gallery
            .column_by_name(&format!("k_occurrence_{stem}"))
            .unwrap_or_else(|| panic!("k_occurrence_{stem}"))
            .as_primitive::<UInt32Type>();
        assert_eq!(counts.values().iter().map(|&c| c as u64).sum::<u64>(), 900);
    }
    assert!(gallery.column_by_name("is_beta20_correction").is_some());

    // `report` from the results file alone.
    let report_job = ReportJob {
        results: out.join("results.parquet"),
        gallery: d.path("gallery.parquet"),
        queries: Some(d.path("queries.parquet")),
        stats: Some(out.join("gallery_stats.parquet")),
        k: 10,
        out_dir: d.dir.path().join("report"),
        html: None,
        text_column: "text".into(),
        overwrite: false,
        options: PassOptions::default(),
    };
    let reported = report(&report_job, &Silent).unwrap();
    for (figures, summary) in reported.figures.iter().zip(&plain.methods) {
        assert_eq!(figures.method, summary.method);
        let mut want = summary.hubness.clone();
        let mut got = figures.hubness.clone();
        want.top_hubs.clear();
        got.top_hubs.clear();
        assert_eq!(got, want, "{}", summary.method);
        let (got, want) = (
            figures.quality.as_ref().unwrap(),
            summary.quality.as_ref().unwrap(),
        );
        assert_eq!(got.recall, want.recall, "{}", summary.method);
    }
    let again = read_parquet(&d.dir.path().join("report/gallery_report.parquet"));
    assert_eq!(
        again.column_by_name("k_occurrence_nnn").unwrap(),
        gallery.column_by_name("k_occurrence_nnn").unwrap()
    );
}

/// Anyone's results file: only query_id and gallery_id, in list order,
/// with more rows per query than k; queries absent from the file count.
#[test]
fn report_reads_a_foreign_results_file() {
    let d = data(8);
    let path = d.dir.path().join("foreign.parquet");
    // Query i lists gallery items i, i+1, ..., i+11 (12 rows; k = 10 counts 10).
    let (mut queries, mut gallery) = (Vec::new(), Vec::new());
    for q in 0..80 {
        for j in 0..12 {
            queries.push(format!("q{q}"));
            gallery.push(format!("g{}", (q + j) % 150));
        }
    }
    write_columns(
        &path,
        vec![
            ("query_id", Arc::new(StringArray::from(queries)) as ArrayRef),
            (
                "gallery_id",
                Arc::new(StringArray::from(gallery)) as ArrayRef,
            ),
        ],
    );
    let job = ReportJob {
        results: path.clone(),
        gallery: d.path("gallery.parquet"),
        queries: Some(d.path("queries.parquet")),
        stats: None,
        k: 10,
        out_dir: d.dir.path().join("report"),
        html: Some(d.dir.path().join("report/page.html")),
        text_column: "text".into(),
        overwrite: false,
        options: PassOptions::default(),
    };
    let outcome = report(&job, &Silent).unwrap();
    let f = &outcome.figures[0];
    assert_eq!(f.method, "results");
    // 90 queries (10 without rows), 800 slots filled.
    assert_eq!(f.occurrence.queries, 90);
    assert_eq!(
        f.occurrence.counts.iter().map(|&c| c as u64).sum::<u64>(),
        800
    );
    assert_eq!(f.occurrence.counts[0], 1);
    assert_eq!(f.occurrence.counts[9], 10);
    let q = f.quality.as_ref().unwrap();
    assert_eq!(q.truncated_at, Some(10));
    assert!(q.mean_rank.is_nan());
    // Malformed lists are refused with file, row and column: a gallery id
    // the gallery lacks, one listed twice for a query (it would count twice
    // in N_k), a rank below 1, and a rank given twice.
    let refusals = [
        (
            vec!["g1", "nope"],
            vec![1, 2],
            "gallery_id",
            "is not in the gallery",
        ),
        (
            vec!["g1", "g1"],
            vec![1, 2],
            "gallery_id",
            "'g1' is in the list of query 'q0' twice",
        ),
        (
            vec!["g1", "g2"],
            vec![1, 0],
            "rank",
            "rank 0: ranks start at 1",
        ),
    ];
    for (i, (listed, ranks, column, phrase)) in refusals.into_iter().enumerate() {
        let bad = d.dir.path().join("bad.parquet");
        write_columns(
            &bad,
            vec![
                (
                    "query_id",
                    Arc::new(StringArray::from(vec!["q0"; listed.len()])) as ArrayRef,
                ),
                (
                    "gallery_id",
                    Arc::new(StringArray::from(listed)) as ArrayRef,
                ),
                ("rank", Arc::new(Int32Array::from(ranks)) as ArrayRef),
            ],
        );
        let out_dir = d.dir.path().join(format!("refused{i}"));
        let err = report(
            &ReportJob {
                results: bad,
                out_dir: out_dir.clone(),
                html: None,
                k: 2,
                ..job.clone()
            },
            &Silent,
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("bad.parquet")
                && message.contains("row 1")
                && message.contains(&format!("column '{column}'"))
                && message.contains(phrase),
            "{message}"
        );
        assert_eq!(err.exit_code(), 2);
        assert!(!out_dir.join("report.parquet").exists());
    }
    // Three rows at ranks 1 and 2 of a k = 2 list: a rank given twice.
    let bad = d.dir.path().join("bad.parquet");
    write_columns(
        &bad,
        vec![
            (
                "query_id",
                Arc::new(StringArray::from(vec!["q0"; 3])) as ArrayRef,
            ),
            (
                "gallery_id",
                Arc::new(StringArray::from(vec!["g1", "g2", "g3"])) as ArrayRef,
            ),
            (
                "rank",
                Arc::new(Int32Array::from(vec![1, 2, 2])) as ArrayRef,
            ),
        ],
    );
    let err = report(
        &ReportJob {
            results: bad,
            out_dir: d.dir.path().join("refused-rank"),
            html: None,
            k: 2,
            ..job
        },
        &Silent,
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("row 2") && message.contains("a rank given twice"),
        "{message}"
    );
}

/// A query whose target is not in the gallery is refused, naming file, row
/// and column; with skip_missing it is counted and the rest are ranked.
#[test]
fn missing_targets_are_refused_unless_skipped() {
    let mut r = rng(9);
    let dir = tempfile::tempdir().unwrap();
    let gallery = random_table(&mut r, "g", 60, 8);
    let bank = random_table(&mut r, "b", 40, 8);
    let mut queries = queries_near(&mut r, &gallery, 20, 0.5);
    queries.targets.as_mut().unwrap()[3] = "elsewhere".into();
    write_table(
        &dir.path().join("g.parquet"),
        &gallery,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.path().join("b.parquet"),
        &bank,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.path().join("q.parquet"),
        &queries,
        Layout::FixedF32,
        false,
    );
    let mut job = RunJob {
        methods: vec![MethodSpec::new("is", &[("beta", 20.0)]).unwrap()],
        k: 5,
        ..RunJob::new(
            dir.path().join("q.parquet").display().to_string(),
            dir.path().join("g.parquet").display().to_string(),
            dir.path().join("b.parquet").display().to_string(),
            dir.path().join("out"),
        )
    };
    let err = run(&job, &Silent).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("q.parquet")
            && message.contains("row 3")
            && message.contains("target_id")
            && message.contains("--skip-missing"),
        "{message}"
    );
    assert!(!job.out_dir.join("results.parquet").exists());
    job.options.read.skip_missing_targets = true;
    let summary = run(&job, &Silent).unwrap();
    for m in &summary.methods {
        let q = m.quality.as_ref().unwrap();
        assert_eq!((q.queries, q.skipped), (19, 1));
    }
    let json = std::fs::read_to_string(job.out_dir.join("summary.json")).unwrap();
    assert!(
        json.contains("\"queries_skipped\": 1") && json.contains("R@1_95ci"),
        "{json}"
    );
}

/// Tuning on a seeded split of the bank (the test queries are not an
/// input): the grid's figures equal a plain run of each point on the same
/// split, the best point is chosen, and the config it writes runs.
#[test]
fn tune_chooses_the_best_point_of_a_bank_split_and_its_config_runs() {
    let mut r = rng(10);
    let dir = tempfile::tempdir().unwrap();
    let gallery = random_table(&mut r, "g", 120, 10);
    // Bank queries whose targets are gallery-bank items (a training split).
    let gallery_bank = random_table(&mut r, "t", 100, 10);
    let mut bank = queries_near(&mut r, &gallery_bank, 160, 0.8);
    bank.ids = (0..160).map(|i| format!("b{i}")).collect();
    write_table(
        &dir.path().join("g.parquet"),
        &gallery,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.path().join("t.parquet"),
        &gallery_bank,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.path().join("b.parquet"),
        &bank,
        Layout::FixedF32,
        false,
    );
    let p = |n: &str| dir.path().join(n).display().to_string();
    let job = TuneJob {
        gallery: p("g.parquet"),
        bank: p("b.parquet"),
        gallery_bank: None,
        validation: Validation::SplitBank {
            fraction: 0.25,
            seed: 3,
            gallery: Some(p("t.parquet")),
        },
        methods: vec![
            MethodKind::named("is").unwrap(),
            MethodKind::named("csls").unwrap(),
        ],
        grid: vec![
            "beta=5,20,80".parse::<GridAxis>().unwrap(),
            "csls.k=2,8".parse().unwrap(),
        ],
        metric: SelectionMetric::Mrr,
        out_dir: dir.path().join("tune"),
        html: Some(dir.path().join("tune/tune.html")),
        overwrite: false,
        options: PassOptions::default(),
    };
    let outcome = tune(&job, &Silent).unwrap();
    assert_eq!(outcome.validation_queries, 40);
    let labels: Vec<String> = outcome
        .grid
        .iter()
        .map(|g| g.figures.label.clone())
        .collect();
    assert_eq!(
        labels,
        [
            "none",
            "is beta=5",
            "is beta=20",
            "is beta=80",
            "csls k=2",
            "csls k=8"
        ]
    );
    for kind in [
        MethodKind::named("is").unwrap(),
        MethodKind::named("csls").unwrap(),
    ] {
        let points: Vec<_> = outcome
            .grid
            .iter()
            .filter(|g| g.spec.kind() == kind)
            .collect();
        let best = points.iter().map(|g| g.score).fold(f64::MIN, f64::max);
        let chosen: Vec<_> = points.iter().filter(|g| g.chosen).collect();
        assert_eq!(chosen.len(), 1);
        assert_eq!(chosen[0].score, best);
    }
    assert_eq!(outcome.curves.len(), 2);
    // Each point's MRR equals a run of that method alone on the same split.
    let sampled = |complement: bool| {
        let table = hubnorm::source::EmbeddingTable::open(
            "bank",
            &p("b.parquet"),
            &Default::default(),
            true,
        )
        .unwrap();
        if complement {
            table.sampled_complement(40, 3).unwrap()
        } else {
            table.sampled(40, 3).unwrap()
        }
    };
    let (held_out, rest) = (sampled(false), sampled(true));
    assert_eq!((held_out.rows, rest.rows), (40, 120));
    let write_rows = |table: &hubnorm::source::EmbeddingTable, name: &str| {
        let mut ids = Vec::new();
        let mut blocks = table.blocks(1000);
        while let Some(b) = blocks.next_block().unwrap() {
            for i in 0..b.rows {
                ids.push(b.ids.as_string::<i32>().value(i).to_owned());
            }
        }
        let rows: Vec<usize> = ids
            .iter()
            .map(|id| bank.ids.iter().position(|b| b == id).unwrap())
            .collect();
        let subset = Table {
            ids: rows.iter().map(|&i| bank.ids[i].clone()).collect(),
            dim: bank.dim,
            data: rows.iter().flat_map(|&i| bank.row(i).to_vec()).collect(),
            targets: Some(
                rows.iter()
                    .map(|&i| bank.targets.as_ref().unwrap()[i].clone())
                    .collect(),
            ),
        };
        write_table(&dir.path().join(name), &subset, Layout::FixedF32, false);
    };
    write_rows(&held_out, "validation.parquet");
    write_rows(&rest, "rest.parquet");
    let check = run(
        &RunJob {
            methods: outcome
                .grid
                .iter()
                .map(|g| g.spec)
                .filter(|s| s.kind() == MethodKind::named("csls").unwrap())
                .collect(),
            ..RunJob::new(
                p("validation.parquet"),
                p("t.parquet"),
                p("rest.parquet"),
                dir.path().join("check"),
            )
        },
        &Silent,
    )
    .unwrap();
    for (summary, point) in check.methods[1..].iter().zip(
        outcome
            .grid
            .iter()
            .filter(|g| g.spec.kind() == MethodKind::named("csls").unwrap()),
    ) {
        assert_eq!(summary.quality.as_ref().unwrap().mrr, point.score);
    }
    // The config names the chosen points and `run` accepts it.
    let config = dir.path().join("tune/tuned.json");
    let methods = hubnorm::stats_file::config_file_methods(&config).unwrap();
    let chosen: Vec<MethodSpec> = outcome
        .grid
        .iter()
        .filter(|g| g.chosen)
        .map(|g| g.spec)
        .collect();
    assert_eq!(methods, chosen);
    let tune_table = read_parquet(&dir.path().join("tune/tune.parquet"));
    assert_eq!(tune_table.num_rows(), 6);
    let chosen_column = tune_table.column_by_name("chosen").unwrap().as_boolean();
    assert_eq!(chosen_column.true_count(), 3);
    assert!(std::fs::read_to_string(dir.path().join("tune/tune.html"))
        .unwrap()
        .contains("data-plot=\"tuning\""));
    // Validation queries read from the bank's own file are refused: they
    // would be scored against statistics they are part of.
    let err = tune(
        &TuneJob {
            validation: Validation::Queries(p("b.parquet")),
            out_dir: dir.path().join("tune-leak"),
            html: None,
            ..job
        },
        &Silent,
    )
    .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().contains("--validation and --bank share")
            && err.to_string().contains("b.parquet"),
        "{err}"
    );
    assert!(!dir.path().join("tune-leak").exists());
}
