//! SQL on a Ballista cluster (feature `cluster`), against the same SQL in
//! one process: in Ballista's in-process standalone mode through the
//! library, and on a real cluster of `hubnorm cluster` processes (a
//! scheduler and two one-slot executors on 127.0.0.1, started and stopped
//! by [`common::cluster`]) through `hubnorm sql --cluster`.
//!
//! Rows must be the same, in the same order. Floating-point values may
//! differ in their last bits where an aggregate merges partial states whose
//! split depends on the partitions (the log-sum-exp of hub_is_correction,
//! the skewness of hub_hubness): those are compared to 1e-9 relative,
//! everything else exactly.

mod common;

use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use common::cluster::{Cluster, Env};
use common::s3::{S3Server, SECRET_KEY};
use common::{
    hubnorm, parquet_metadata, queries_near, random_table, read_parquet, read_results,
    recorded_precision, rng, write_table, Layout, ResultRow, TestOutput,
};
use hubnorm::options::MethodSpec;
use hubnorm::options::{ClusterJob, PassOptions, ReportOptions};
use hubnorm::pipeline::{run, run_search, run_search_on, RunJob, SearchJob};
use hubnorm::progress::Silent;
use hubnorm::sql::SqlOptions;

/// The queries compared, by name: a GROUP BY aggregate, joins, the hub_*
/// scalar functions and the hub_* aggregates.
const QUERIES: [(&str, &str); 5] = [
    (
        "group by",
        "SELECT method, count(*) AS n, min(score) AS lowest, max(score) AS highest, \
         count(DISTINCT gallery_id) AS items FROM results GROUP BY method ORDER BY method",
    ),
    (
        "udf over a three-way join",
        "SELECT r.method, r.query_id, r.rank, r.gallery_id, \
         hub_cosine(q.embedding, g.embedding) AS cosine, r.raw_score \
         FROM results r JOIN queries q ON r.query_id = q.id JOIN gallery g ON r.gallery_id = g.id \
         WHERE r.rank <= 3 ORDER BY r.method, r.query_id, r.rank",
    ),
    (
        "udafs over a cross join",
        "SELECT g.id AS gallery_id, \
         hub_is_correction(hub_dot(hub_l2_normalize(b.embedding), hub_l2_normalize(g.embedding)), 20.0) AS h, \
         hub_topk_mean(hub_cosine(b.embedding, g.embedding), 5) AS top5 \
         FROM bank b CROSS JOIN gallery g GROUP BY g.id ORDER BY g.id",
    ),
    (
        "hubness udaf",
        "SELECT method, hub_hubness(gallery_id, 'skewness', 10, 300) AS skewness, \
         hub_hubness(gallery_id, 'robin_hood', 10, 300) AS robin_hood \
         FROM results GROUP BY method ORDER BY method",
    ),
    (
        "join with the stats file",
        "SELECT r.query_id, r.gallery_id, \
         hub_corrected_score(r.raw_score, s.\"is_beta20_correction\") AS corrected, r.score \
         FROM results r JOIN gallery_stats s USING (gallery_id) \
         WHERE r.method = 'is' AND r.rank = 1 ORDER BY r.query_id",
    ),
];

/// The data: `queries.parquet`, `gallery/` (two parts), `bank.parquet`,
/// and the outputs of a local `run` (is, nnn) in `run/`, which records the
/// three inputs. Returns the run directory.
fn write_data(dir: &Path) -> PathBuf {
    let mut r = rng(29);
    let gallery = random_table(&mut r, "g", 300, 16);
    let queries = queries_near(&mut r, &gallery, 60, 0.2);
    let bank = random_table(&mut r, "b", 200, 16);
    std::fs::create_dir_all(dir.join("gallery")).unwrap();
    write_table(
        &dir.join("queries.parquet"),
        &queries,
        Layout::FixedF32,
        false,
    );
    write_table(&dir.join("bank.parquet"), &bank, Layout::FixedF32, false);
    let gallery_bank = random_table(&mut r, "gb", 150, 16);
    write_table(
        &dir.join("gallery_bank.parquet"),
        &gallery_bank,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.join("gallery/part-0.parquet"),
        &gallery.slice(0, 170),
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.join("gallery/part-1.parquet"),
        &gallery.slice(170, 300),
        Layout::FixedF32,
        false,
    );
    let out = dir.join("run");
    let path = |p: &str| dir.join(p).display().to_string();
    let job = RunJob {
        methods: vec![
            MethodSpec::new("is", &[("beta", 20.0)]).unwrap(),
            MethodSpec::new("nnn", &[]).unwrap(),
        ],
        ..RunJob::new(
            path("queries.parquet"),
            path("gallery"),
            path("bank.parquet"),
            &out,
        )
    };
    run(&job, &Silent).unwrap();
    out
}

/// CSV rows as fields (no field of these queries holds a comma).
fn rows(csv: &str) -> Vec<Vec<String>> {
    csv.lines()
        .map(|line| line.split(',').map(str::to_owned).collect())
        .collect()
}

/// Two CSV outputs (header first) hold the same rows in the same order:
/// text fields equal, numbers within 1e-9 relative.
fn assert_same_rows(what: &str, local: &str, cluster: &str) {
    let (local, cluster) = (rows(local), rows(cluster));
    assert!(local.len() > 1, "{what}: the local query returned no rows");
    assert_eq!(local.len(), cluster.len(), "{what}: row counts differ");
    for (i, (a, b)) in local.iter().zip(&cluster).enumerate() {
        assert_eq!(a.len(), b.len(), "{what}, row {i}: {a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            if x == y {
                continue;
            }
            let close = match (x.parse::<f64>(), y.parse::<f64>()) {
                (Ok(x), Ok(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
                _ => false,
            };
            assert!(close, "{what}, row {i}: local {a:?}, cluster {b:?}");
        }
    }
}

/// Record batches as CSV with a header.
fn csv(batches: &[RecordBatch]) -> String {
    let mut out = Vec::new();
    {
        let mut writer = arrow::csv::WriterBuilder::new()
            .with_header(true)
            .build(&mut out);
        for batch in batches {
            writer.write(batch).unwrap();
        }
    }
    String::from_utf8(out).unwrap()
}

/// The run's tables and inputs, as `hubnorm sql --run` registers them.
fn tables(data: &Path) -> [(&'static str, PathBuf); 5] {
    [
        ("results", data.join("run/results.parquet")),
        ("gallery_stats", data.join("run/gallery_stats.parquet")),
        ("queries", data.join("queries.parquet")),
        ("gallery", data.join("gallery")),
        ("bank", data.join("bank.parquet")),
    ]
}

/// Ballista's standalone mode (a scheduler and an executor in this
/// process, plans through the codecs and functions resolved by name as on
/// a real cluster) gives the local session's rows, and refuses the table
/// functions with the reason.
#[test]
fn standalone_cluster_answers_like_a_local_session() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let options = SqlOptions {
            threads: 2,
            ..SqlOptions::default()
        };
        let local = hubnorm::sql::session(&options).unwrap();
        let cluster = hubnorm::cluster::standalone_session(&options)
            .await
            .unwrap();
        for ctx in [&local, &cluster] {
            for (name, path) in tables(dir.path()) {
                ctx.register_parquet(
                    name,
                    path.to_str().unwrap(),
                    datafusion::prelude::ParquetReadOptions::default(),
                )
                .await
                .unwrap();
            }
        }
        for (name, sql) in QUERIES {
            let mut outputs = Vec::new();
            for ctx in [&local, &cluster] {
                let frame = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{name}: {e}"));
                let batches = frame
                    .collect()
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                outputs.push(csv(&batches));
            }
            assert_same_rows(name, &outputs[0], &outputs[1]);
        }
        // hubnorm_stats travels as a PassTable and, on the executor, as a
        // PassExec of two shards (one per partition): the rows of the local pass.
        let path = |name: &str| dir.path().join(name).display().to_string();
        let stats = format!(
            "SELECT gallery_id, is_beta20_correction FROM hubnorm_stats('{}', '{}', 'is') ORDER BY gallery_id",
            path("gallery"),
            path("bank.parquet")
        );
        let mut outputs = Vec::new();
        for ctx in [&local, &cluster] {
            let frame = ctx.sql(&stats).await.unwrap();
            outputs.push(csv(&frame.collect().await.unwrap()));
        }
        assert_eq!(outputs[0], outputs[1], "hubnorm_stats");
        // hubnorm_search too: two shards of query rows, the local rows.
        let search = format!(
            "SELECT * FROM hubnorm_search('{}', '{}', '', 'none', 4) ORDER BY query_id, rank",
            path("queries.parquet"),
            path("gallery")
        );
        let mut outputs = Vec::new();
        for ctx in [&local, &cluster] {
            let frame = ctx.sql(&search).await.unwrap();
            outputs.push(csv(&frame.collect().await.unwrap()));
        }
        assert_eq!(outputs[0].lines().count(), 1 + 60 * 4, "{}", outputs[0]);
        assert_eq!(outputs[0], outputs[1], "hubnorm_search");
    });
}

/// Pass 2 on the cluster of `url` over the data in `data` (60 queries with
/// ground truth, 300 gallery rows in two parts): `hubnorm search --cluster`
/// in 7 shards of query rows prints the local summary, and through the
/// library writes the local results file bit for bit with the local
/// summary, field for field: every hubness measure (at k = 12 and 10,
/// deeper than the k = 3 results, so the shards' rows must go deeper than
/// the file's), the ranks of the ground truth, and the fraction of queries
/// the gated `dis` corrected (its statistics computed on this machine,
/// since `dis` cannot run pass 1 on a cluster). `hubnorm_search` under
/// `sql --cluster` gives the local rows.
fn search_on_cluster_is_local_search(data: &Path, url: &str) {
    let stats = data.join("search_stats.parquet");
    hubnorm([
        "stats",
        "--gallery",
        "gallery",
        "--bank",
        "bank.parquet",
        "--quiet",
    ])
    .args(["--methods", "is,nnn,dis,mp,csls", "--out"])
    .arg(&stats)
    .current_dir(data)
    .output()
    .assert_success();
    let path = |name: &str| data.join(name).display().to_string();
    let mut methods = vec![MethodSpec::new("none", &[]).unwrap()];
    methods.extend(hubnorm::stats_file::stats_file_methods(&stats).unwrap());
    let job = |out: &str| SearchJob {
        methods: methods.clone(),
        k: 3,
        options: PassOptions {
            report: ReportOptions {
                hubness_k: 12,
                ..ReportOptions::default()
            },
            ..PassOptions::default()
        },
        ..SearchJob::new(
            path("queries.parquet"),
            path("gallery"),
            Some(stats.clone()),
            data.join(out),
        )
    };
    let local = run_search(&job("search_local.parquet"), &Silent).unwrap();
    let cluster = ClusterJob {
        scheduler: url.to_owned(),
        shards: 7,
    };
    let remote = run_search_on(&job("search_cluster.parquet"), &cluster).unwrap();
    assert_eq!(local, remote, "the summaries differ");
    assert!(local.methods.iter().all(|m| m.quality.is_some()));
    assert!(local
        .methods
        .iter()
        .any(|m| m.normalised_fraction.is_some()));
    let bytes = |name: &str| std::fs::read(data.join(name)).unwrap();
    assert!(
        bytes("search_local.parquet") == bytes("search_cluster.parquet"),
        "the cluster's results file differs from the local one"
    );
    assert_eq!(
        read_parquet(&data.join("search_cluster.parquet")).num_rows(),
        60 * 6 * 3
    );

    let search = [
        "--queries",
        "queries.parquet",
        "--gallery",
        "gallery",
        "--stats",
        "search_stats.parquet",
        "--methods",
        "is,nnn,mp",
        "--k",
        "5",
        "--overwrite",
        "--out",
        "search_cli.parquet",
    ];
    let local = hubnorm(["search"]).args(search).current_dir(data).output();
    local.assert_success();
    let local_bytes = bytes("search_cli.parquet");
    assert_same_stdout("search", data, url, "search", &search);
    assert!(
        local_bytes == bytes("search_cli.parquet"),
        "search --cluster wrote other bytes"
    );

    let query = "SELECT * FROM hubnorm_search('queries.parquet', 'gallery', 'search_stats.parquet', 'is,mp', 5) \
                 ORDER BY method, query_id, rank";
    assert_same_stdout(
        "hubnorm_search",
        data,
        url,
        "sql",
        &["--threads", "3", query],
    );
}

/// `hubnorm run --cluster` and `hubnorm compare --cluster` (both passes on
/// the cluster, 5 shards each, `dis` and `sinkhorn-pp` among the methods:
/// its shards of queries draw the same pseudo-test queries from the bank)
/// write the local outputs byte for byte (the stats, results, summary,
/// comparison table and report) and print the local summary; outputs in
/// object storage are refused before any output.
fn run_and_compare_on_cluster_are_local(data: &Path, url: &str) {
    for command in ["run", "compare"] {
        let args = |out: &str| {
            let mut args: Vec<String> = [
                command,
                "--queries",
                "queries.parquet",
                "--gallery",
                "gallery",
                "--bank",
                "bank.parquet",
                "--methods",
                "is,nnn,csls,mp,dsl,dis,sinkhorn-pp",
                "--k",
                "4",
                "--out",
                out,
            ]
            .map(String::from)
            .to_vec();
            if command == "compare" {
                args.extend(["--hubness-k", "5"].map(String::from));
            }
            args
        };
        let local_dir = format!("{command}_local");
        let remote_dir = format!("{command}_cluster");
        let local = hubnorm(args(&local_dir)).current_dir(data).output();
        local.assert_success();
        let remote = hubnorm(args(&remote_dir))
            .args(["--cluster", url, "--shards", "5"])
            .current_dir(data)
            .output();
        remote.assert_success();
        assert_eq!(
            local.stdout().replace(&local_dir, &remote_dir),
            remote.stdout(),
            "{command}: the printed summaries differ"
        );
        let mut names: Vec<_> = std::fs::read_dir(data.join(&local_dir))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert!(names.len() >= 3, "{command} wrote {names:?}");
        for name in names {
            let bytes = |dir: &str| std::fs::read(data.join(dir).join(&name)).unwrap();
            assert!(
                bytes(&local_dir) == bytes(&remote_dir),
                "{command} --cluster: {} differs from the local one",
                name.to_string_lossy()
            );
        }
    }
    // A run on a cluster cannot write to object storage.
    let out = "s3://bucket/run";
    let refused = hubnorm([
        "run",
        "--queries",
        "queries.parquet",
        "--gallery",
        "gallery",
    ])
    .args(["--bank", "bank.parquet", "--methods", "is", "--out", out])
    .args(["--cluster", url])
    .current_dir(data)
    .output();
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused.stderr().contains("not to object storage"),
        "{}",
        refused.stderr()
    );
    assert!(!data.join(out).exists());
    // Bad input that only an executor reads (an embedding value, row 17 of
    // a gallery part): the message and exit code 2 of the local run, with
    // the path as the user gave it (the executors read it made absolute).
    let mut bad = random_table(&mut rng(31), "n", 50, 16);
    bad.data[17 * 16 + 3] = f32::NAN;
    std::fs::create_dir_all(data.join("bad_gallery")).unwrap();
    write_table(
        &data.join("bad_gallery/part-0.parquet"),
        &bad,
        Layout::FixedF32,
        false,
    );
    let bad_run = |out: &str, cluster: &[&str]| {
        hubnorm([
            "run",
            "--queries",
            "queries.parquet",
            "--gallery",
            "bad_gallery",
        ])
        .args(["--bank", "bank.parquet", "--methods", "is", "--out", out])
        .args(cluster)
        .current_dir(data)
        .output()
    };
    let local = bad_run("bad_local", &[]);
    let remote = bad_run("bad_cluster", &["--cluster", url]);
    for (what, output) in [("local", &local), ("cluster", &remote)] {
        eprintln!("bad input, {what}: {}", output.stderr());
        assert_eq!(output.code(), Some(2), "{what}: {}", output.stderr());
        assert!(
            output
                .stderr()
                .contains("bad input at bad_gallery/part-0.parquet, row 17, column 'embedding'"),
            "{what}: {}",
            output.stderr()
        );
    }
    assert!(!data.join("bad_cluster").exists());
}

/// The f64 values of column `name` of `batch`.
fn f64_values(batch: &RecordBatch, name: &str) -> Vec<f64> {
    use arrow::array::AsArray;
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_primitive::<arrow::datatypes::Float64Type>()
        .values()
        .to_vec()
}

/// Asserts that the potentials `a` and `b` agree within 1e-6 of the
/// scores' scale: scores of unit vectors are at most 1 in size, and the f32
/// kernel's rounding is relative to them (a potential can be much smaller).
fn assert_close(what: &str, a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = a.iter().map(|v| v.abs()).fold(1.0, f64::max);
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-6 * scale,
        "{what}: off by {worst} (scale {scale})"
    );
}

/// Sinkhorn's sweeps on the cluster of `url` over the data in `data`: T + 1
/// rounds, each in 7 shards of the targets' rows (across the gallery's two
/// parts and, for `dbsn`, into the gallery bank). `stats --cluster` writes
/// every column but the potentials bit for bit (`is` and the merged
/// activation sets of `dis` beside them), the potentials within 1e-6 of
/// the scores' scale (one machine reuses exps and bounds row maxima, a round
/// computes every update exactly), after the same iterations; `run
/// --cluster` with `sn` and `dbsn` gives the local lists, scores to the
/// same tolerance, and the local summary but for the marginal error's
/// last digits.
fn sinkhorn_on_cluster_is_local(data: &Path, url: &str) {
    let methods = "is,sn,dbsn,dis";
    let stats = |cluster: Option<&str>, out: &str| {
        let mut command = hubnorm([
            "stats",
            "--gallery",
            "gallery",
            "--bank",
            "bank.parquet",
            "--gallery-bank",
            "gallery_bank.parquet",
            "--methods",
            methods,
            "--iterations",
            "6",
            "--out",
            out,
            "--quiet",
        ]);
        if let Some(url) = cluster {
            command.args(["--cluster", url, "--shards", "7"]);
        }
        command.current_dir(data).output()
    };
    stats(None, "sn_local.parquet").assert_success();
    stats(Some(url), "sn_cluster.parquet").assert_success();
    let (local, remote) = (
        read_parquet(&data.join("sn_local.parquet")),
        read_parquet(&data.join("sn_cluster.parquet")),
    );
    assert_eq!(local.schema(), remote.schema());
    let mut potentials = 0;
    for (i, field) in local.schema().fields().iter().enumerate() {
        let name = field.name();
        if name.starts_with("sn_") || name.starts_with("dbsn_") {
            assert_close(name, &f64_values(&local, name), &f64_values(&remote, name));
            potentials += 1;
        } else {
            assert_eq!(local.column(i), remote.column(i), "column {name}");
        }
    }
    assert_eq!(potentials, 2, "{:?}", local.schema());
    // The same iterations, and the scratch files of the rounds are gone.
    let reports = |name: &str| -> Vec<(String, serde_json::Value)> {
        parquet_metadata(&data.join(name))
            .into_iter()
            .filter(|(k, _)| k.starts_with("hubnorm.sinkhorn."))
            .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
            .collect()
    };
    let (local_reports, remote_reports) =
        (reports("sn_local.parquet"), reports("sn_cluster.parquet"));
    assert_eq!(local_reports.len(), 2, "{local_reports:?}");
    for ((key, a), (other, b)) in local_reports.iter().zip(&remote_reports) {
        assert_eq!(key, other);
        assert_eq!(a["iterations"], 6, "{key}: {a}");
        assert_eq!(a["iterations"], b["iterations"], "{key}");
        let (ea, eb) = (
            a["marginal_error"].as_f64().unwrap(),
            b["marginal_error"].as_f64().unwrap(),
        );
        assert!(
            (ea - eb).abs() <= 1e-3 * ea,
            "{key}: marginal error {ea} vs {eb}"
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("sinkhorn"))
        .collect();
    assert!(leftovers.is_empty(), "scratch files left: {leftovers:?}");

    // Both passes: the local lists, and the local summary.
    let run = |cluster: Option<&str>, out: &str| {
        let mut command = hubnorm([
            "run",
            "--queries",
            "queries.parquet",
            "--gallery",
            "gallery",
            "--bank",
            "bank.parquet",
            "--gallery-bank",
            "gallery_bank.parquet",
            "--methods",
            "is,sn,dbsn",
            "--k",
            "4",
            "--out",
            out,
        ]);
        if let Some(url) = cluster {
            command.args(["--cluster", url, "--shards", "5"]);
        }
        command.current_dir(data).output()
    };
    run(None, "sn_run_local").assert_success();
    run(Some(url), "sn_run_cluster").assert_success();
    let (local, remote) = (
        read_results(&data.join("sn_run_local/results.parquet")),
        read_results(&data.join("sn_run_cluster/results.parquet")),
    );
    assert_eq!(local.len(), remote.len());
    for (a, b) in local.iter().zip(&remote) {
        let key = |r: &ResultRow| {
            (
                r.method.clone(),
                r.query_id.clone(),
                r.rank,
                r.gallery_id.clone(),
                r.raw_score,
            )
        };
        assert_eq!(key(a), key(b));
        assert!(
            (a.score - b.score).abs() <= 1e-6,
            "{:?} {} vs {}",
            key(a),
            a.score,
            b.score
        );
    }
    let summary = |dir: &str| -> serde_json::Value {
        let mut json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(data.join(dir).join("summary.json")).unwrap(),
        )
        .unwrap();
        for method in json["methods"].as_array_mut().unwrap() {
            if let Some(report) = method.get_mut("sinkhorn").filter(|r| !r.is_null()) {
                let error = report["marginal_error"].as_f64().unwrap();
                // Rounding in the last digits of the potentials moves it.
                report["marginal_error"] = format!("{error:.3e}").into();
            }
        }
        json
    };
    assert_eq!(summary("sn_run_local"), summary("sn_run_cluster"));
}

/// Runs `hubnorm COMMAND ARGS` in `cwd`, on this machine and with
/// `--cluster url`, and asserts that both succeed with the same output.
fn assert_same_stdout(what: &str, cwd: &Path, url: &str, command: &str, args: &[&str]) {
    let local = hubnorm([command]).args(args).current_dir(cwd).output();
    local.assert_success();
    let remote = hubnorm([command, "--cluster", url])
        .args(args)
        .current_dir(cwd)
        .output();
    remote.assert_success();
    assert_eq!(local.stdout(), remote.stdout(), "{what}");
}

/// `hubnorm sql` with `args`, as CSV on 2 partitions, in `cwd`.
fn sql(cwd: &Path, cluster: Option<&str>, args: &[&str]) -> common::TestOutput {
    let mut command = hubnorm(["sql", "--format", "csv", "--threads", "2"]);
    if let Some(url) = cluster {
        command.args(["--cluster", url]);
    }
    command.args(args).current_dir(cwd).output()
}

/// A scheduler and two one-slot executors, each a `hubnorm cluster`
/// process started in a folder of its own (not the client's), answer every
/// query of `hubnorm sql --cluster` as a local `hubnorm sql` does, over a
/// run directory and over tables given by paths relative to the client (and
/// `COPY ... TO` a relative path writes where the client means); pass 1
/// (`hubnorm stats --cluster`, `hubnorm_stats`) gives the local rows, bit
/// for bit; and SIGTERM (the executors) and SIGINT (the scheduler) stop
/// every process with exit code 0.
#[test]
fn cluster_of_hubnorm_processes_answers_like_local_sql() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run_dir = write_data(&data);
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let cluster = Cluster::start(
        &elsewhere,
        &dir.path().join("logs"),
        &vec![],
        &[vec![], vec![]],
    );
    let url = cluster.url();
    let run_arg = run_dir.display().to_string();

    for (name, query) in QUERIES {
        let local = sql(&data, None, &["--run", &run_arg, query]);
        local.assert_success();
        let remote = sql(&data, Some(&url), &["--run", &run_arg, query]);
        remote.assert_success();
        assert_same_rows(name, &local.stdout(), &remote.stdout());
    }

    // Paths relative to the client's directory, which the scheduler and the
    // executors do not share; and the default output, an aligned table.
    let relative = [
        "--table",
        "g=gallery",
        "--table",
        "q=queries.parquet",
        "SELECT q.id, count(*) AS near FROM q JOIN g ON hub_cosine(q.embedding, g.embedding) > 0.5 \
         GROUP BY q.id ORDER BY q.id",
    ];
    assert_same_stdout("relative paths", &data, &url, "sql", &relative);

    // COPY ... TO a relative path: the rows computed on the cluster, the
    // file written by the client where it means it.
    let copied = sql(
        &data,
        Some(&url),
        &[
            "--table",
            "g=gallery",
            "COPY (SELECT id FROM g) TO 'copied.parquet' STORED AS PARQUET",
        ],
    );
    copied.assert_success();
    assert_eq!(read_parquet(&data.join("copied.parquet")).num_rows(), 300);
    assert!(!elsewhere.join("copied.parquet").exists());

    // Pass 1 on the cluster: `hubnorm stats --cluster` in shards of gallery
    // rows that cross the gallery's two parts (170 rows, then 130) at rows
    // that are not multiples of any tile, with paths relative to the client:
    // the file is the local one, bit for bit, with the activation sets of
    // dis and dual-dis merged from the shards' partial states.
    let methods = "is,nnn,csls,gc,dn,mp,ls,nicdm,dissim-local,dsl,dis,dual-is,dual-dis";
    let stats = |cluster: Option<&str>, out: &str| {
        let mut command = hubnorm([
            "stats",
            "--gallery",
            "gallery",
            "--bank",
            "bank.parquet",
            "--gallery-bank",
            "gallery_bank.parquet",
            "--methods",
            methods,
            "--out",
            out,
            "--quiet",
        ]);
        if let Some(url) = cluster {
            command.args(["--cluster", url, "--shards", "7"]);
        }
        command.current_dir(&data).output()
    };
    stats(None, "local_stats.parquet").assert_success();
    stats(Some(&url), "cluster_stats.parquet").assert_success();
    let bytes = |name: &str| std::fs::read(data.join(name)).unwrap();
    assert!(
        bytes("local_stats.parquet") == bytes("cluster_stats.parquet"),
        "the cluster's stats file differs from the local one"
    );
    sinkhorn_on_cluster_is_local(&data, &url);

    // The table function hubnorm_stats runs on the cluster too (one task
    // per shard, two shards with --threads 2), with the local rows.
    let query =
        "SELECT * FROM hubnorm_stats('gallery', 'bank.parquet', 'is,nnn,gc') ORDER BY gallery_id";
    assert_same_stdout(
        "hubnorm_stats",
        &data,
        &url,
        "sql",
        &["--threads", "2", query],
    );
    // Pass 2 on the cluster, in shards of query rows; then both passes.
    search_on_cluster_is_local_search(&data, &url);
    run_and_compare_on_cluster_are_local(&data, &url);

    // Both executors ran tasks, and each process stops with exit code 0: the
    // executors on SIGTERM after leaving the cluster, the scheduler on SIGINT.
    for (role, status, log) in cluster.stop() {
        assert!(status.success(), "{role} stopped with {status}:\n{log}");
        if role.starts_with("executor") {
            assert!(log.contains("Finished task"), "{role} ran no task:\n{log}");
            assert!(
                log.contains("Executor stopped"),
                "{role} did not leave:\n{log}"
            );
        }
    }
}

/// `s3://` tables on a cluster: every process resolves them through
/// hubnorm's object-store registry with its own environment, so the
/// executors read them as the client does. An executor that cannot read an
/// object (here: its environment points at another S3 server, which has no
/// such bucket) fails the query with exit code 1 and a message naming the
/// object; no process prints the secret key.
#[test]
fn cluster_reads_object_storage_and_names_what_an_executor_cannot() {
    let test = "cluster_reads_object_storage_and_names_what_an_executor_cannot";
    let Some(lake) = S3Server::start_or_skip(test) else {
        return;
    };
    let Some(elsewhere) = S3Server::start_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_data(&data);
    lake.create_bucket("lake");
    lake.put_dir("lake", "emb/gallery", &data.join("gallery"));
    lake.put_file("lake", "emb/queries.parquet", &data.join("queries.parquet"));
    let query = [
        "--table",
        "g=s3://lake/emb/gallery/",
        "--table",
        "q=s3://lake/emb/queries.parquet",
        "SELECT q.id, max(hub_dot(q.embedding, g.embedding)) AS best FROM q CROSS JOIN g \
         GROUP BY q.id ORDER BY q.id",
    ];
    let with_env = |command: &mut common::TestCommand, env: &Env| {
        for (k, v) in env {
            command.env(k, v);
        }
        command.output()
    };
    let no_secret = |what: &str, text: &str| {
        assert!(
            !text.contains(SECRET_KEY),
            "{what} shows the secret key:\n{text}"
        );
    };

    let local = with_env(
        hubnorm(["sql", "--format", "csv"])
            .args(query)
            .current_dir(&data),
        &lake.env(),
    );
    local.assert_success();
    let cluster = Cluster::start(
        &data,
        &dir.path().join("logs-lake"),
        &lake.env(),
        &[lake.env()],
    );
    let remote = with_env(
        hubnorm(["sql", "--format", "csv", "--cluster", &cluster.url()])
            .args(query)
            .current_dir(&data),
        &lake.env(),
    );
    remote.assert_success();
    assert_same_rows("s3 tables", &local.stdout(), &remote.stdout());
    no_secret("a log", &cluster.logs());
    drop(cluster);

    // The scheduler (which lists the files) reaches the lake; the executor
    // (which reads them) reaches a server without it.
    let cluster = Cluster::start(
        &data,
        &dir.path().join("logs-elsewhere"),
        &lake.env(),
        &[elsewhere.env()],
    );
    let failed = with_env(
        hubnorm(["sql", "--cluster", &cluster.url()])
            .args(query)
            .current_dir(&data),
        &lake.env(),
    );
    assert_eq!(failed.code(), Some(1), "{}", failed.stderr());
    assert!(
        failed.stderr().contains("emb/gallery/part-0.parquet")
            || failed.stderr().contains("emb/gallery/part-1.parquet")
            || failed.stderr().contains("emb/queries.parquet"),
        "the error does not name the object: {}",
        failed.stderr()
    );
    no_secret("the client", &failed.stderr());
    no_secret("a log", &cluster.logs());
}

/// A scheduler address that is not one is refused with exit code 2; one
/// nobody listens on fails the query with exit code 1 and names it, and an
/// executor waits for it (stopping on SIGTERM with exit code 0 meanwhile).
/// An executor's memory limit too small for its slots is refused.
/// Addresses that do not lead to a scheduler: malformed (exit code 2), no
/// server there (exit code 1), another server there, which a client and an
/// executor name at once (exit code 2) instead of failing at the first
/// query or polling it without end.
#[test]
fn unreachable_malformed_or_wrong_scheduler_addresses_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let malformed = sql(dir.path(), Some("http://127.0.0.1:1"), &["SELECT 1"]);
    assert_eq!(malformed.code(), Some(2), "{}", malformed.stderr());
    assert!(
        malformed.stderr().contains("not a scheduler address"),
        "{}",
        malformed.stderr()
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = sql(
        dir.path(),
        Some(&format!("df://127.0.0.1:{port}")),
        &["SELECT 1"],
    );
    assert_eq!(unreachable.code(), Some(1), "{}", unreachable.stderr());
    assert!(
        unreachable.stderr().contains(&format!(
            "cannot reach the scheduler at df://127.0.0.1:{port}"
        )),
        "{}",
        unreachable.stderr()
    );

    // Another server on the port: an HTTP/1 server, and an executor's
    // Arrow Flight port (gRPC without the scheduler's service).
    let http = not_grpc_server();
    let cluster = Cluster::start(dir.path(), &dir.path().join("logs"), &vec![], &[vec![]]);
    let flight = cluster.executor_flight_port(0);
    for (port, says) in [
        (http, "the server there does not speak gRPC"),
        (
            flight,
            "the server there speaks gRPC but not the scheduler's service",
        ),
    ] {
        let address = format!("127.0.0.1:{port}");
        let client = sql(dir.path(), Some(&format!("df://{address}")), &["SELECT 1"]);
        let executor = common::hubnorm(["cluster", "executor", "--bind", "127.0.0.1:0"])
            .args([
                "--threads",
                "1",
                "--memory-limit",
                "64MiB",
                "--scheduler",
                &address,
            ])
            .output_within(std::time::Duration::from_secs(60));
        for (who, output) in [("client", client), ("executor", executor)] {
            assert_eq!(output.code(), Some(2), "{who}: {}", output.stderr());
            let expected = format!("df://{address} is not a Ballista scheduler: {says}");
            assert!(
                output.stderr().contains(&expected),
                "{who}: {}",
                output.stderr()
            );
            // Refused before Ballista's executor started polling.
            assert!(
                !output.stderr().contains("poll work loop failed"),
                "{who}: {}",
                output.stderr()
            );
        }
    }
    // A port that accepts connections and closes them unanswered (a proxy
    // with nothing behind it): not reachable (exit code 1), not refused.
    let closer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closing = closer.local_addr().unwrap().port();
    std::thread::spawn(move || for _ in closer.incoming() {});
    let client = sql(
        dir.path(),
        Some(&format!("df://127.0.0.1:{closing}")),
        &["SELECT 1"],
    );
    assert_eq!(client.code(), Some(1), "{}", client.stderr());
    assert!(
        client.stderr().contains(&format!(
            "cannot reach the scheduler at df://127.0.0.1:{closing}"
        )),
        "{}",
        client.stderr()
    );
    for (role, status, log) in cluster.stop() {
        assert!(status.success(), "the {role} ended with {status}:\n{log}");
    }

    // An executor's memory pool: 0 (Ballista's "unbounded") and a few
    // bytes per slot are refused before it starts.
    for limit in ["0", "1B", "20MiB"] {
        let refused = common::hubnorm([
            "cluster",
            "executor",
            "--bind",
            "127.0.0.1:0",
            "--threads",
            "2",
            "--memory-limit",
            limit,
            "--scheduler",
            &format!("127.0.0.1:{port}"),
        ])
        .output();
        assert_eq!(refused.code(), Some(2), "{limit}: {}", refused.stderr());
        assert!(
            refused
                .stderr()
                .contains("an executor needs at least 16.0 MiB per slot"),
            "{limit}: {}",
            refused.stderr()
        );
    }

    // An executor waits for its scheduler, and SIGTERM stops it meanwhile;
    // its --work-dir is its own while it runs.
    let work_dir = dir.path().join("work");
    let log = dir.path().join("executor.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut executor = std::process::Command::new(env!("CARGO_BIN_EXE_hubnorm"))
        .args([
            "cluster",
            "executor",
            "--bind",
            "127.0.0.1:0",
            "--threads",
            "1",
        ])
        .args(["--scheduler", &format!("127.0.0.1:{port}")])
        .arg("--work-dir")
        .arg(&work_dir)
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    common::wait_for("the executor to retry", &mut executor, || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("cannot reach the scheduler")
    });
    let second = common::hubnorm(["cluster", "executor", "--bind", "127.0.0.1:0"])
        .args([
            "--threads",
            "1",
            "--scheduler",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--work-dir")
        .arg(&work_dir)
        .output_within(std::time::Duration::from_secs(60));
    assert_eq!(second.code(), Some(2), "{}", second.stderr());
    assert!(
        second.stderr().contains("another executor is using it"),
        "{}",
        second.stderr()
    );
    common::signal(&executor, "TERM");
    let status = executor.wait().unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(&log).unwrap()
    );
}

/// The port of a server on 127.0.0.1 that answers every connection with
/// an HTTP/1.1 error, for as long as the test runs.
fn not_grpc_server() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            // Each connection on its own thread: a client that keeps one
            // open must not hold back its next attempt (a busy machine
            // makes a probe retry).
            std::thread::spawn(move || {
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
                // Closed as HTTP servers close: what the client sent after is
                // read first (unread bytes would make the close a reset).
                let _ = stream.shutdown(std::net::Shutdown::Write);
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let _ = std::io::copy(&mut stream, &mut std::io::sink());
            });
        }
    });
    port
}

/// Waits (at most a minute) until `condition` holds, polling every 20 ms.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !condition() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Losing processes mid-job. An executor killed (SIGKILL) while it runs a
/// task of pass 2 of `hubnorm run --cluster` (having run tasks of pass 1):
/// the scheduler notices (here after `--executor-timeout 3`), runs its
/// tasks again on the other executor, and the three outputs are the local
/// ones, bit for bit. A client stopped by Ctrl-C (SIGINT) exits with code
/// 130, writes nothing, and its job is cancelled on the scheduler. The
/// scheduler killed mid-job: the client fails with exit code 1 and a
/// message naming the scheduler, and writes nothing.
#[test]
fn lost_executors_are_replaced_and_a_lost_scheduler_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut r = rng(31);
    // Enough work per shard (about a second) that a kill lands mid-task.
    write_table(
        &data.join("gallery.parquet"),
        &random_table(&mut r, "g", 12_000, 96),
        Layout::FixedF32,
        false,
    );
    write_table(
        &data.join("bank.parquet"),
        &random_table(&mut r, "b", 12_000, 96),
        Layout::FixedF32,
        false,
    );
    write_table(
        &data.join("queries.parquet"),
        &random_table(&mut r, "q", 8_000, 96),
        Layout::FixedF32,
        false,
    );
    let stats = |cluster: Option<&str>, out: &str| {
        let mut command = hubnorm([
            "stats",
            "--gallery",
            "gallery.parquet",
            "--bank",
            "bank.parquet",
            "--methods",
            "is,nnn",
            "--out",
            out,
            "--quiet",
        ]);
        if let Some(url) = cluster {
            command.args(["--cluster", url, "--shards", "8"]);
        }
        command.current_dir(&data);
        command
    };
    let run = |cluster: Option<&str>, out: &str| {
        let mut command = hubnorm(["run", "--queries", "queries.parquet"]);
        command
            .args(["--gallery", "gallery.parquet", "--bank", "bank.parquet"])
            .args(["--methods", "is,nnn,dis", "--out", out, "--quiet"]);
        if let Some(url) = cluster {
            command.args(["--cluster", url, "--shards", "8"]);
        }
        command.current_dir(&data);
        command
    };
    run(None, "local").output().assert_success();

    // The executors' work directories go to a temporary folder of the test's.
    let temp = dir.path().join("tmp");
    std::fs::create_dir_all(&temp).unwrap();
    let executor_env = vec![("TMPDIR".to_owned(), temp.display().to_string())];
    let mut cluster = Cluster::start_with(
        &data,
        &dir.path().join("logs"),
        &["--executor-timeout", "3"],
        "512MiB",
        &vec![],
        &[executor_env.clone(), executor_env.clone()],
    );
    let url = cluster.url();
    // Killed once it runs tasks of pass 2 (the run's second job).
    let client = run(Some(&url), "after_kill").spawn();
    wait_until("executor 1 to receive a task of pass 2", || {
        let log = cluster.executor_log(1);
        let jobs: std::collections::BTreeSet<&str> = log
            .split("Received task: [TID ")
            .skip(1)
            .filter_map(|task| task.split('/').next())
            .collect();
        jobs.len() >= 2
    });
    cluster.kill_executor(1);
    let killed_work_dir = cluster.executor_work_dir(1);
    let output = client.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the job did not survive the executor's loss: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        cluster.logs()
    );
    // The killed executor left its work directory; the next executor
    // started with the same temporary folder removes it (its lock is free,
    // and older than a starting executor's), not the running one's.
    assert!(killed_work_dir.is_dir(), "{}", killed_work_dir.display());
    let running_work_dir = cluster.executor_work_dir(0);
    let two_minutes_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    for work_dir in [&killed_work_dir, &running_work_dir] {
        let lock = std::fs::File::options()
            .write(true)
            .open(work_dir.join(".executor.lock"))
            .unwrap();
        lock.set_modified(two_minutes_ago).unwrap();
    }
    let mut next = hubnorm(["cluster", "executor", "--bind", "127.0.0.1:0"])
        .args(["--threads", "1", "--scheduler", "127.0.0.1:1"])
        .env("TMPDIR", &temp)
        .spawn();
    wait_until(
        "the next executor to remove the killed one's work directory",
        || !killed_work_dir.exists(),
    );
    common::signal(&next, "TERM");
    next.wait().unwrap();
    assert!(running_work_dir.is_dir(), "{}", running_work_dir.display());
    let bytes = |name: &str| std::fs::read(data.join(name)).unwrap();
    for name in ["gallery_stats.parquet", "results.parquet", "summary.json"] {
        assert!(
            bytes(&format!("local/{name}")) == bytes(&format!("after_kill/{name}")),
            "{name} computed after an executor's loss differs from the local one"
        );
    }
    assert!(
        cluster.executor_log(0).contains("Received task"),
        "the remaining executor ran nothing:\n{}",
        cluster.logs()
    );

    // Ctrl-C on a client (a search, an SQL query writing a file): exit code
    // 130, no output, and its job cancelled on the scheduler.
    let received = |cluster: &Cluster| cluster.executor_log(0).matches("Received task").count();
    let mut search = hubnorm(["search", "--queries", "queries.parquet"]);
    search
        .args(["--gallery", "gallery.parquet"])
        .args([
            "--stats",
            "local/gallery_stats.parquet",
            "--methods",
            "is,nnn",
        ])
        .args(["--out", "interrupted.parquet", "--quiet"])
        .args(["--cluster", &url, "--shards", "8"]);
    let mut query = hubnorm(["sql", "--cluster", &url, "--threads", "8"]);
    query.args(["--out", "interrupted.csv", "--format", "csv"]).arg(
        "SELECT gallery_id, is_beta20_correction FROM hubnorm_stats('gallery.parquet', 'bank.parquet', 'is')",
    );
    for (cancelled, mut client) in [search, query].into_iter().enumerate() {
        let before = received(&cluster);
        let client = client.current_dir(&data).spawn();
        wait_until("executor 0 to receive a task of the job", || {
            received(&cluster) > before
        });
        common::signal(&client, "INT");
        let output = client.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(130), "{stderr}");
        let start = std::time::Instant::now();
        while cluster.scheduler_log().matches("Job cancelled").count() <= cancelled {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "the scheduler did not cancel the job; the client said: {stderr}\n{}",
                cluster.scheduler_log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let left: Vec<_> = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains("interrupted"))
            .collect();
        assert!(left.is_empty(), "an interrupted client left {left:?}");
    }

    let before = received(&cluster);
    let client = stats(Some(&url), "after_scheduler.parquet").spawn();
    wait_until("executor 0 to receive a task of the second job", || {
        received(&cluster) > before
    });
    cluster.kill_scheduler();
    let lost_at = std::time::Instant::now();
    let output = client.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&url),
        "the error does not name the scheduler: {stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("after_scheduler"))
        .collect();
    assert!(left.is_empty(), "partial output left: {left:?}");

    // The executor left without its scheduler says so once and keeps
    // polling; Ballista's warning at each failed poll (20 a second, 60 in
    // these 3 s) is shown once a minute.
    wait_until("executor 0 to notice the scheduler's loss", || {
        cluster
            .executor_log(0)
            .contains("lost touch with the scheduler")
    });
    std::thread::sleep(std::time::Duration::from_secs(3).saturating_sub(lost_at.elapsed()));
    let log = cluster.executor_log(0);
    assert!(log.contains("registered with the scheduler at"), "{log}");
    assert_eq!(log.matches("lost touch").count(), 1, "{log}");
    // One per distinct failure (a poll cut short, then refused connections).
    let shown = log.matches("poll work loop failed").count();
    assert!(
        (1..=3).contains(&shown),
        "{shown} failed polls shown:\n{log}"
    );
}

/// An executor's memory follows its `--memory-limit`, not the input size:
/// one executor of one slot with a 64 MiB limit (a task's pass gets half)
/// computes pass 1 (`is`, `nnn`) of a 160,000 × 128 gallery (82 MB)
/// against a 10,000 × 128 bank in 4 shards; its peak resident size grows
/// by at most the limit plus 24 MiB (Ballista's and DataFusion's own
/// buffers, the task's plan) over what it held idle, and the file is the
/// local one (computed with the same 32 MiB pass budget).
#[test]
fn an_executor_stays_within_its_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut r = rng(37);
    for (name, prefix, rows) in [("gallery", "g", 160_000), ("bank", "b", 10_000)] {
        let table = random_table(&mut r, prefix, rows, 128);
        write_table(
            &data.join(format!("{name}.parquet")),
            &table,
            Layout::FixedF32,
            false,
        );
    }
    let limit: u64 = 64 << 20;
    let stats = |extra: &[&str], out: &str| {
        let mut command = hubnorm(["stats", "--gallery", "gallery.parquet"]);
        command
            .args(["--bank", "bank.parquet", "--methods", "is,nnn"])
            .args(["--memory-limit", "32MiB", "--out", out, "--quiet"])
            .args(extra)
            .current_dir(&data);
        command.output()
    };
    stats(&[], "local.parquet").assert_success();
    let cluster = Cluster::start_with(
        &data,
        &dir.path().join("logs"),
        &[],
        "64MiB",
        &vec![],
        &[vec![]],
    );
    let (idle, _) = cluster.executor_memory(0);
    let url = cluster.url();
    stats(&["--cluster", &url, "--shards", "4"], "cluster.parquet").assert_success();
    let (_, peak) = cluster.executor_memory(0);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    eprintln!(
        "executor: {:.1} MiB idle, {:.1} MiB peak, limit {:.0} MiB",
        mib(idle),
        mib(peak),
        mib(limit)
    );
    assert!(
        peak <= idle + limit + (24 << 20),
        "the executor grew from {:.1} MiB to {:.1} MiB with a {:.0} MiB limit",
        mib(idle),
        mib(peak),
        mib(limit)
    );
    let bytes = |name: &str| std::fs::read(data.join(name)).unwrap();
    assert!(bytes("local.parquet") == bytes("cluster.parquet"));
}

/// `--precision` travels to the executors, and each applies it on its own
/// CPU: an executor with the screen (`HUBNORM_SCALAR_SCREEN=1` where the CPU
/// lacks AVX512_BF16) screens pass 1's top-k lists under `auto` and pass 2
/// under `screened`, logging what it re-scored, and the files hold the
/// local exact values with the precision asked for recorded; the client's
/// summary sums the executors' counts (as many pairs screened as a local
/// screened run); an executor without the screen computes `auto` exact
/// and fails a `screened` task with the reason, writing nothing.
#[test]
fn precision_travels_to_each_executor() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_data(&data);
    // A command on the data with the scalar screen's model (`extra` last).
    let command = |args: &[&str], extra: &[&str]| {
        hubnorm(args)
            .args(extra)
            .env("HUBNORM_SCALAR_SCREEN", "1")
            .current_dir(&data)
            .output()
    };
    let queries = ["--queries", "queries.parquet", "--gallery", "gallery"];
    let stats = |extra: &[&str], methods: &str, out: &str| {
        let base = ["stats", "--gallery", "gallery", "--bank", "bank.parquet"];
        command(
            &[&base[..], &["--methods", methods, "--out", out]].concat(),
            extra,
        )
    };
    let search = |extra: &[&str], out: &str| {
        let stats = ["--stats", "local_stats.parquet", "--methods", "nnn,csls"];
        let rest = ["--k", "5", "--out", out];
        command(&[&["search"], &queries[..], &stats, &rest].concat(), extra)
    };
    let run = |extra: &[&str], out: &str| {
        let bank = ["--bank", "bank.parquet", "--methods", "nnn,csls"];
        let rest = ["--k", "5", "--out", out];
        command(&[&["run"], &queries[..], &bank, &rest].concat(), extra)
    };
    // (re-scored, screened) of the summary's line "`label`: re-scored R of S ...".
    let counts_of = |output: &TestOutput, label: &str| -> Option<(u64, u64)> {
        let line = output
            .stdout()
            .lines()
            .find(|l| l.starts_with(&format!("{label}:")))?
            .to_owned();
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "re-scored")?;
        Some((words[at + 1].parse().ok()?, words[at + 3].parse().ok()?))
    };
    let screen_counts = |output: &TestOutput| counts_of(output, "bf16 screen");
    let precision = |out: &str| recorded_precision(&data.join(out)).unwrap_or_default();
    let assert_same_values = |local: &str, cluster: &str| {
        let (a, b) = (
            read_parquet(&data.join(local)),
            read_parquet(&data.join(cluster)),
        );
        assert_eq!(a.num_rows(), b.num_rows(), "{cluster}");
        assert!(a.columns() == b.columns(), "{cluster} differs from {local}");
    };
    stats(&[], "nnn,csls", "local_stats.parquet").assert_success();
    search(&[], "local_results.parquet").assert_success();
    assert_eq!(precision("local_stats.parquet"), "exact");
    let local_screen = |output: TestOutput| {
        output.assert_success();
        screen_counts(&output).expect("a local screened run reports its screen")
    };
    let screened = ["--precision", "screened"];
    let (_, local_bank_pairs) = local_screen(stats(&screened, "nnn,csls", "ls.parquet"));
    let (_, local_query_pairs) = local_screen(search(&screened, "lr.parquet"));
    // `run` prints both passes' screens: pass 1's, then pass 2's.
    let run_counts = |output: &TestOutput| {
        (
            counts_of(output, "bf16 screen, pass 1"),
            counts_of(output, "bf16 screen"),
        )
    };
    let local_run = run(&screened, "local_run");
    local_run.assert_success();
    let (Some((_, local_run_bank_pairs)), Some((_, local_run_query_pairs))) =
        run_counts(&local_run)
    else {
        panic!(
            "a local screened run reports both screens:\n{}",
            local_run.stdout()
        );
    };

    let screening = Cluster::start(
        &data,
        &dir.path().join("logs-screen"),
        &vec![],
        &[vec![("HUBNORM_SCALAR_SCREEN".into(), "1".into())]],
    );
    let url = screening.url();
    let on =
        |precision: &'static str| ["--cluster", &url, "--shards", "3", "--precision", precision];
    let on_cluster = |output: TestOutput, local_pairs: u64| {
        output.assert_success();
        let (rescored, pairs) = screen_counts(&output)
            .unwrap_or_else(|| panic!("no screen in the summary:\n{}", output.stdout()));
        assert_eq!(pairs, local_pairs, "{}", output.stdout());
        assert!(0 < rescored && rescored <= pairs, "{}", output.stdout());
    };
    on_cluster(
        stats(&on("auto"), "nnn,csls", "auto_stats.parquet"),
        local_bank_pairs,
    );
    assert_same_values("local_stats.parquet", "auto_stats.parquet");
    assert_eq!(precision("auto_stats.parquet"), "auto");
    on_cluster(
        search(&on("screened"), "screened_results.parquet"),
        local_query_pairs,
    );
    assert_same_values("local_results.parquet", "screened_results.parquet");
    assert_eq!(precision("screened_results.parquet"), "screened");
    let cluster_run = run(&on("screened"), "cluster_run");
    cluster_run.assert_success();
    let (Some(bank), Some(query)) = run_counts(&cluster_run) else {
        panic!("no screens in the run's summary:\n{}", cluster_run.stdout());
    };
    for ((rescored, pairs), local_pairs) in
        [(bank, local_run_bank_pairs), (query, local_run_query_pairs)]
    {
        assert_eq!(pairs, local_pairs, "{}", cluster_run.stdout());
        assert!(
            0 < rescored && rescored <= pairs,
            "{}",
            cluster_run.stdout()
        );
    }
    assert_same_values("local_run/results.parquet", "cluster_run/results.parquet");
    // `is` needs every similarity: nothing to screen, recorded as exact.
    let is_stats = stats(&on("screened"), "is", "is_stats.parquet");
    is_stats.assert_success();
    assert_eq!(screen_counts(&is_stats), None);
    assert_eq!(precision("is_stats.parquet"), "exact");
    let log = screening.executor_log(0);
    for precision in ["auto", "screened"] {
        assert!(
            log.contains(&format!("bf16 screen ({precision}): re-scored")),
            "the executor logged no screen under {precision}:\n{log}"
        );
    }
    drop(screening);

    let plain = Cluster::start(&data, &dir.path().join("logs-plain"), &vec![], &[vec![]]);
    let url = plain.url();
    let on =
        |precision: &'static str| ["--cluster", &url, "--shards", "3", "--precision", precision];
    stats(&on("auto"), "nnn,csls", "plain_stats.parquet").assert_success();
    assert_same_values("local_stats.parquet", "plain_stats.parquet");
    if hubnorm::kernel::bf16::has_avx512_bf16() {
        eprintln!("this CPU has AVX512_BF16: every executor screens, none refuses");
        return;
    }
    assert!(!plain.executor_log(0).contains("bf16 screen"));
    let refused = stats(&on("screened"), "nnn,csls", "refused_stats.parquet");
    assert!(!refused.success());
    assert!(
        refused.stderr().contains("AVX512_BF16"),
        "{}",
        refused.stderr()
    );
    assert!(!data.join("refused_stats.parquet").exists());
}
