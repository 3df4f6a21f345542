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
use common::{hubnorm, queries_near, random_table, read_parquet, rng, write_table, Layout};
use hubnorm::options::MethodSpec;
use hubnorm::pipeline::{run, RunJob};
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
        let refused = cluster
            .sql("SELECT * FROM hubnorm_stats('gallery', 'bank.parquet', 'is')")
            .await
            .map(|_| ())
            .unwrap_err();
        let message = hubnorm::sql::sql_error(refused, None);
        assert_eq!(message.exit_code(), 2, "{message}");
        assert!(
            message
                .to_string()
                .contains("hubnorm_stats runs on one machine only"),
            "{message}"
        );
    });
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
/// `COPY ... TO` a relative path writes where the client means); the table
/// functions are refused with exit code 2; and SIGTERM (the executors) and
/// SIGINT (the scheduler) stop every process with exit code 0.
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
    let local = hubnorm(["sql"]).args(relative).current_dir(&data).output();
    local.assert_success();
    let remote = hubnorm(["sql", "--cluster", &url])
        .args(relative)
        .current_dir(&data)
        .output();
    remote.assert_success();
    assert_eq!(local.stdout(), remote.stdout(), "relative paths");

    // COPY ... TO a relative path: planned by the scheduler and written by
    // the executors, where the client means it.
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

    // The table functions are refused, not run on the client.
    let refused = sql(
        &data,
        Some(&url),
        &["SELECT * FROM hubnorm_stats('gallery', 'bank.parquet', 'is')"],
    );
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains("hubnorm_stats runs on one machine only"),
        "{}",
        refused.stderr()
    );

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
#[test]
fn unreachable_or_malformed_scheduler_addresses_are_errors() {
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

    // An executor waits for its scheduler, and SIGTERM stops it meanwhile.
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
    common::signal(&executor, "TERM");
    let status = executor.wait().unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(&log).unwrap()
    );
}
