//! Every PATH may be an object-store URL: the commands end to end on
//! `s3://` inputs and outputs of a real S3-compatible server (moto, started
//! by [`common::s3`] on 127.0.0.1), against the same commands on local
//! files; SQL over `s3://` tables; and the faults (a missing key or bucket,
//! refused credentials, a lost server) with nothing partial left behind and
//! no secret in any output or message.
//!
//! Outputs on S3 carry the same rows and the same metadata as the local
//! run's, but for the recorded input paths (`hubnorm.*.path`,
//! `hubnorm.*.parts`: URLs there, local paths here) and the run's
//! fingerprint (`hubnorm.run`, a hash that covers those paths), so Parquet
//! outputs are compared by their data and the rest of their metadata, and
//! `summary.json` byte for byte once its `run` field is taken out.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::s3::{S3Server, SECRET_KEY};
use common::*;

const BUCKET: &str = "lake";

/// A case of parts: `queries.parquet`, `gallery/` with two parts (beside a
/// `_SUCCESS` marker and a hidden file that must be skipped) and `bank/`
/// with two parts (read through a glob).
fn write_lake(dir: &Path) {
    let mut r = rng(7);
    let gallery = random_table(&mut r, "g", 900, 16);
    let queries = queries_near(&mut r, &gallery, 120, 0.2);
    let bank = random_table(&mut r, "b", 700, 16);
    std::fs::create_dir_all(dir.join("gallery/year=2026")).unwrap();
    std::fs::create_dir_all(dir.join("bank")).unwrap();
    write_table(
        &dir.join("queries.parquet"),
        &queries,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.join("gallery/part-0.parquet"),
        &gallery.slice(0, 500),
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.join("gallery/year=2026/part-1.parquet"),
        &gallery.slice(500, 900),
        Layout::ListF32,
        false,
    );
    std::fs::write(dir.join("gallery/_SUCCESS"), b"").unwrap();
    std::fs::write(dir.join("gallery/.part-2.parquet.crc"), b"junk").unwrap();
    write_table(
        &dir.join("bank/part-0.parquet"),
        &bank.slice(0, 400),
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.join("bank/part-1.parquet"),
        &bank.slice(400, 700),
        Layout::FixedF16,
        false,
    );
}

/// A server with the lake uploaded under `s3://lake/emb/`.
fn lake_server(test: &str, local: &Path) -> Option<S3Server> {
    let server = S3Server::start_or_skip(test)?;
    write_lake(local);
    server.create_bucket(BUCKET);
    server.put_dir(BUCKET, "emb", local);
    Some(server)
}

/// A temporary folder, the lake written into its `lake/`, and the server
/// holding it; `None` (the test skips) without a server.
fn lake(test: &str) -> Option<(tempfile::TempDir, std::path::PathBuf, S3Server)> {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("lake");
    let server = lake_server(test, &local)?;
    Some((dir, local, server))
}

/// `hubnorm ARGS` with the server's environment.
fn hubnorm_on(server: &S3Server, args: &[&str]) -> TestCommand {
    let mut command = hubnorm(args);
    for (k, v) in server.env() {
        command.env(k, v);
    }
    command
}

/// `hubnorm ARGS` with the server's environment, checked for the secret.
fn run_with(server: &S3Server, args: &[&str]) -> TestOutput {
    let output = hubnorm_on(server, args).output();
    assert!(
        !output.stdout().contains(SECRET_KEY) && !output.stderr().contains(SECRET_KEY),
        "the secret key was printed: {}{}",
        output.stdout(),
        output.stderr()
    );
    output
}

/// The metadata of a Parquet file but the recorded input paths.
fn metadata_without_paths(path: &Path) -> BTreeMap<String, String> {
    parquet_metadata(path)
        .into_iter()
        .filter(|(k, _)| !k.ends_with(".path") && !k.ends_with(".parts") && k != "hubnorm.run")
        .collect()
}

/// Two Parquet outputs hold the same rows and metadata (but recorded paths).
fn assert_same_output(remote: &Path, local: &Path) {
    assert_eq!(
        read_parquet(remote),
        read_parquet(local),
        "rows of {} differ",
        remote.display()
    );
    assert_eq!(
        metadata_without_paths(remote),
        metadata_without_paths(local),
        "metadata of {}",
        remote.display()
    );
}

/// Uploads the tables `names` of a case in `dir` to `in/NAME.parquet`.
fn upload_case(server: &S3Server, dir: &Path, names: &[&str]) {
    server.create_bucket(BUCKET);
    for name in names {
        server.put_file(
            BUCKET,
            &format!("in/{name}.parquet"),
            &dir.join(format!("{name}.parquet")),
        );
    }
}

/// SIGKILLs `child` once an object whose key starts with `saved` (a
/// checkpoint's file) is in the bucket; fails if the child ends first.
fn kill_once_saved(server: &S3Server, mut child: std::process::Child, saved: &str) {
    let start = Instant::now();
    while !server.keys(BUCKET).iter().any(|k| k.starts_with(saved)) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the command ended before saving {saved}* (give it more work or a smaller limit)"
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "nothing saved under {saved}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// No object of the bucket holds the secret, and no multipart upload is pending.
fn assert_clean_bucket(server: &S3Server) {
    for key in server.keys(BUCKET) {
        let data = server.get(BUCKET, &key).unwrap();
        assert!(
            !data
                .windows(SECRET_KEY.len())
                .any(|w| w == SECRET_KEY.as_bytes()),
            "{key} holds the secret key"
        );
    }
    assert_eq!(server.pending_uploads(BUCKET), Vec::<String>::new());
}

#[test]
fn run_stats_and_search_on_s3_match_the_local_run() {
    let Some((dir, local, server)) = lake("run_stats_and_search_on_s3_match_the_local_run") else {
        return;
    };
    let l = |p: &str| local.join(p).display().to_string();
    let out = dir.path().join("out");
    let o = |p: &str| out.join(p).display().to_string();
    let methods = "is,nnn,dis";

    // Local: the reference.
    run_with(
        &server,
        &[
            "run",
            "--queries",
            &l("queries.parquet"),
            "--gallery",
            &l("gallery"),
            "--bank",
            &l("bank/*.parquet"),
            "--methods",
            methods,
            "--memory-limit",
            "48MiB",
            "--out",
            &o("run"),
        ],
    )
    .assert_success();
    // The same on S3: a directory of parts, a glob on keys, outputs to a prefix.
    let result = run_with(
        &server,
        &[
            "run",
            "--queries",
            "s3://lake/emb/queries.parquet",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--bank",
            "s3://lake/emb/bank/*.parquet",
            "--methods",
            methods,
            "--memory-limit",
            "48MiB",
            "--out",
            "s3://lake/out/run",
        ],
    );
    result.assert_success();
    assert!(
        result.stdout().contains("s3://lake/out/run"),
        "{}",
        result.stdout()
    );
    let fetched = dir.path().join("fetched");
    std::fs::create_dir_all(&fetched).unwrap();
    for name in ["results.parquet", "gallery_stats.parquet", "summary.json"] {
        server.get_file(BUCKET, &format!("out/run/{name}"), &fetched.join(name));
    }
    let without_run = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        let run = text
            .lines()
            .find(|l| l.contains("\"run\":"))
            .unwrap()
            .to_owned();
        text.replace(&format!("{run}\n"), "")
    };
    assert_eq!(
        without_run(&fetched.join("summary.json")),
        without_run(&out.join("run/summary.json"))
    );
    assert_same_output(
        &fetched.join("results.parquet"),
        &out.join("run/results.parquet"),
    );
    assert_same_output(
        &fetched.join("gallery_stats.parquet"),
        &out.join("run/gallery_stats.parquet"),
    );
    // The recorded paths are the URLs, with no credentials.
    let recorded: BTreeMap<String, String> = parquet_metadata(&fetched.join("results.parquet"))
        .into_iter()
        .collect();
    assert_eq!(recorded["hubnorm.gallery.path"], "s3://lake/emb/gallery/");
    assert!(
        recorded["hubnorm.gallery.parts"]
            .contains("s3://lake/emb/gallery/year=2026/part-1.parquet")
            && recorded["hubnorm.gallery.parts"].contains("\"etag\""),
        "{}",
        recorded["hubnorm.gallery.parts"]
    );
    assert!(!recorded["hubnorm.gallery.parts"].contains("_SUCCESS"));

    // stats, then search with the statistics read from S3.
    run_with(
        &server,
        &[
            "stats",
            "--gallery",
            "s3://lake/emb/gallery",
            "--bank",
            "s3://lake/emb/bank/*.parquet",
            "--methods",
            methods,
            "--out",
            "s3://lake/out/gallery_stats.parquet",
        ],
    )
    .assert_success();
    run_with(
        &server,
        &[
            "stats",
            "--gallery",
            &l("gallery"),
            "--bank",
            &l("bank/*.parquet"),
            "--methods",
            methods,
            "--out",
            &o("gallery_stats.parquet"),
        ],
    )
    .assert_success();
    server.get_file(
        BUCKET,
        "out/gallery_stats.parquet",
        &fetched.join("stats.parquet"),
    );
    assert_same_output(
        &fetched.join("stats.parquet"),
        &out.join("gallery_stats.parquet"),
    );
    run_with(
        &server,
        &[
            "search",
            "--queries",
            "s3://lake/emb/queries.parquet",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--stats",
            "s3://lake/out/gallery_stats.parquet",
            "--method",
            "nnn",
            "--out",
            "s3://lake/out/results.parquet",
        ],
    )
    .assert_success();
    run_with(
        &server,
        &[
            "search",
            "--queries",
            &l("queries.parquet"),
            "--gallery",
            &l("gallery"),
            "--stats",
            &o("gallery_stats.parquet"),
            "--method",
            "nnn",
            "--out",
            &o("results.parquet"),
        ],
    )
    .assert_success();
    server.get_file(
        BUCKET,
        "out/results.parquet",
        &fetched.join("search.parquet"),
    );
    assert_same_output(
        &fetched.join("search.parquet"),
        &out.join("results.parquet"),
    );

    // A run folder holding another run's results (as a run that failed
    // between its uploads could leave it) is refused by its readers.
    server.put_file(
        BUCKET,
        "out/run/results.parquet",
        &out.join("run/results.parquet"),
    );
    let mixed = run_with(
        &server,
        &[
            "sql",
            "--run",
            "s3://lake/out/run",
            "SELECT count(*) FROM results",
        ],
    );
    assert_eq!(mixed.code(), Some(2), "{}", mixed.stderr());
    assert!(
        mixed.stderr().contains("come from different runs"),
        "{}",
        mixed.stderr()
    );
    let mixed = run_with(
        &server,
        &[
            "report",
            "--results",
            "s3://lake/out/run/results.parquet",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--stats",
            "s3://lake/out/run/gallery_stats.parquet",
            "--out",
            "s3://lake/out/report",
        ],
    );
    assert_eq!(mixed.code(), Some(2), "{}", mixed.stderr());
    assert!(
        mixed.stderr().contains("come from different runs"),
        "{}",
        mixed.stderr()
    );
    let mixed = run_with(
        &server,
        &[
            "search",
            "--queries",
            &l("queries.parquet"),
            "--gallery",
            &l("gallery"),
            "--stats",
            "s3://lake/out/run/gallery_stats.parquet",
            "--method",
            "nnn",
            "--out",
            &o("mixed.parquet"),
        ],
    );
    assert_eq!(mixed.code(), Some(2), "{}", mixed.stderr());
    assert!(
        mixed.stderr().contains("come from different runs"),
        "{}",
        mixed.stderr()
    );

    // The output rules hold for URLs: no silent replacement, nothing
    // written inside an input.
    let again = run_with(
        &server,
        &[
            "stats",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--bank",
            "s3://lake/emb/bank/",
            "--out",
            "s3://lake/out/gallery_stats.parquet",
        ],
    );
    assert_eq!(again.code(), Some(2), "{}", again.stderr());
    assert!(
        again.stderr().contains("already exists"),
        "{}",
        again.stderr()
    );
    let inside = run_with(
        &server,
        &[
            "stats",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--bank",
            "s3://lake/emb/bank/",
            "--out",
            "s3://lake/emb/gallery/stats.parquet",
        ],
    );
    assert_eq!(inside.code(), Some(2), "{}", inside.stderr());
    assert!(
        inside.stderr().contains("is inside the gallery input"),
        "{}",
        inside.stderr()
    );
    assert!(server.get(BUCKET, "emb/gallery/stats.parquet").is_none());
    assert_clean_bucket(&server);
}

#[test]
fn update_merges_new_parts_of_an_s3_prefix() {
    let Some((dir, local, server)) = lake("update_merges_new_parts_of_an_s3_prefix") else {
        return;
    };
    let l = |p: &str| local.join(p).display().to_string();
    let stats_local = dir.path().join("stats.parquet").display().to_string();
    let stats_remote = "s3://lake/out/stats.parquet";
    for (gallery, bank, out) in [
        (l("gallery"), l("bank"), stats_local.as_str()),
        (
            "s3://lake/emb/gallery/".into(),
            "s3://lake/emb/bank/".into(),
            stats_remote,
        ),
    ] {
        run_with(
            &server,
            &[
                "stats",
                "--gallery",
                &gallery,
                "--bank",
                &bank,
                "--methods",
                "is,nnn",
                "--out",
                out,
            ],
        )
        .assert_success();
    }
    // Nothing new: up to date, the stored object untouched.
    let before = server.get(BUCKET, "out/stats.parquet").unwrap();
    let same = run_with(
        &server,
        &[
            "stats",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--bank",
            "s3://lake/emb/bank/",
            "--update",
            "--out",
            stats_remote,
        ],
    );
    same.assert_success();
    assert!(same.stdout().contains("up to date"), "{}", same.stdout());
    assert_eq!(server.get(BUCKET, "out/stats.parquet").unwrap(), before);

    // A new bank part, locally and on S3: both updates merge it.
    let mut r = rng(8);
    let extra = random_table(&mut r, "x", 300, 16);
    write_table(
        &local.join("bank/part-2.parquet"),
        &extra,
        Layout::FixedF32,
        false,
    );
    server.put_file(
        BUCKET,
        "emb/bank/part-2.parquet",
        &local.join("bank/part-2.parquet"),
    );
    for (gallery, bank, out) in [
        (l("gallery"), l("bank"), stats_local.as_str()),
        (
            "s3://lake/emb/gallery/".into(),
            "s3://lake/emb/bank/".into(),
            stats_remote,
        ),
    ] {
        let merged = run_with(
            &server,
            &[
                "stats",
                "--gallery",
                &gallery,
                "--bank",
                &bank,
                "--update",
                "--out",
                out,
            ],
        );
        merged.assert_success();
        assert!(
            merged.stdout().contains("merged 1 new bank part"),
            "{}",
            merged.stdout()
        );
    }
    let fetched = dir.path().join("fetched.parquet");
    server.get_file(BUCKET, "out/stats.parquet", &fetched);
    assert_same_output(&fetched, Path::new(&stats_local));

    // A part that changed (same key, new bytes): refused, the object kept.
    let changed = random_table(&mut r, "y", 300, 16);
    write_table(
        &local.join("changed.parquet"),
        &changed,
        Layout::FixedF32,
        false,
    );
    server.put_file(
        BUCKET,
        "emb/bank/part-2.parquet",
        &local.join("changed.parquet"),
    );
    let refused = run_with(
        &server,
        &[
            "stats",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--bank",
            "s3://lake/emb/bank/",
            "--update",
            "--out",
            stats_remote,
        ],
    );
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains("s3://lake/emb/bank/part-2.parquet changed"),
        "{}",
        refused.stderr()
    );
    assert_eq!(
        server.get(BUCKET, "out/stats.parquet").unwrap(),
        std::fs::read(&fetched).unwrap()
    );
    assert_clean_bucket(&server);
}

#[test]
fn sql_reads_s3_tables_and_copies_to_s3() {
    let Some((dir, local, server)) = lake("sql_reads_s3_tables_and_copies_to_s3") else {
        return;
    };
    let counted = run_with(
        &server,
        &[
            "sql",
            "--table",
            "g=s3://lake/emb/gallery/",
            "--table",
            "b=s3://lake/emb/bank/*.parquet",
            "--format",
            "csv",
            "SELECT (SELECT count(*) FROM g) AS gallery, (SELECT count(*) FROM b) AS bank",
        ],
    );
    counted.assert_success();
    assert_eq!(counted.stdout(), "gallery,bank\n900,700\n");

    // COPY ... TO an object (hubnorm's writer, through the same stores).
    run_with(
        &server,
        &[
            "sql",
            "--table",
            "g=s3://lake/emb/gallery/",
            "COPY (SELECT id FROM g ORDER BY id) TO 's3://lake/copy/ids.parquet' STORED AS PARQUET",
        ],
    )
    .assert_success();
    server.get_file(BUCKET, "copy/ids.parquet", &dir.path().join("ids.parquet"));
    assert_eq!(
        read_parquet(&dir.path().join("ids.parquet")).num_rows(),
        900
    );

    // COPY goes through hubnorm's writers: a URL with a query string (a
    // signature) is refused without echoing it, and nothing is written.
    let signed = run_with(
        &server,
        &[
            "sql",
            "--table",
            "g=s3://lake/emb/gallery/",
            "COPY (SELECT id FROM g) TO 's3://lake/copy/q.parquet?sig=Sig123' STORED AS PARQUET",
        ],
    );
    assert_eq!(signed.code(), Some(2), "{}", signed.stderr());
    assert!(!signed.stderr().contains("Sig123"), "{}", signed.stderr());
    // An output that names a bucket alone.
    let keyless = run_with(
        &server,
        &[
            "sql",
            "--format",
            "csv",
            "--out",
            "s3://lake",
            "SELECT 1 AS a",
        ],
    );
    assert_eq!(keyless.code(), Some(2), "{}", keyless.stderr());
    assert!(
        keyless
            .stderr()
            .contains("needs a key that names an object"),
        "{}",
        keyless.stderr()
    );
    assert!(!server.keys(BUCKET).iter().any(|k| k.starts_with("copy/q")));
    // Keys as Spark writes them (`%3A`, a space) are read as listed.
    server.put_file(
        BUCKET,
        "hive/ts=2026-01-01 00%3A00%3A00/part-00000.parquet",
        &local.join("gallery/part-0.parquet"),
    );
    let spark = run_with(
        &server,
        &[
            "sql",
            "--table",
            "h=s3://lake/hive/",
            "--format",
            "csv",
            "SELECT count(*) AS n FROM h",
        ],
    );
    spark.assert_success();
    assert_eq!(spark.stdout(), "n\n500\n");
    // So is a glob whose literal part holds such a key's `%` (written %25).
    let spark_glob = run_with(
        &server,
        &[
            "sql",
            "--table",
            "h=s3://lake/hive/ts=2026-01-01 00%253A00%253A00/*.parquet",
            "--format",
            "csv",
            "SELECT count(*) AS n FROM h",
        ],
    );
    spark_glob.assert_success();
    assert_eq!(spark_glob.stdout(), "n\n500\n");

    // --out to an object, large enough for a multipart upload (> 8 MiB of
    // incompressible doubles).
    run_with(
        &server,
        &[
            "sql",
            "--format",
            "parquet",
            "--out",
            "s3://lake/copy/random.parquet",
            "SELECT random() AS x, random() AS y FROM generate_series(1, 800000)",
        ],
    )
    .assert_success();
    let big = server.get(BUCKET, "copy/random.parquet").unwrap();
    assert!(big.len() > 8 << 20, "{} bytes: not multipart", big.len());
    std::fs::write(dir.path().join("random.parquet"), &big).unwrap();
    assert_eq!(
        read_parquet(&dir.path().join("random.parquet")).num_rows(),
        800_000
    );

    // A run directory on S3: its outputs and recorded inputs as tables.
    run_with(
        &server,
        &[
            "run",
            "--queries",
            "s3://lake/emb/queries.parquet",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--bank",
            "s3://lake/emb/bank/",
            "--out",
            "s3://lake/runs/a",
        ],
    )
    .assert_success();
    let joined = run_with(
        &server,
        &[
            "sql",
            "--run",
            "s3://lake/runs/a",
            "--format",
            "csv",
            "SELECT count(*) AS n FROM results r JOIN gallery g ON r.gallery_id = g.id",
        ],
    );
    joined.assert_success();
    assert_eq!(joined.stdout(), format!("n\n{}\n", 120 * 10 * 2));
    assert_clean_bucket(&server);
}

/// Listings are checked as local folders are: a prefix or glob that
/// reaches into a Delta table (its files, a prefix holding it, a prefix
/// inside it) is refused naming the table, an object of 0 bytes is refused
/// naming it (but a glob skips `_SUCCESS`-like markers, as a folder does),
/// and an output under an input prefix is refused when the two
/// URLs spell the scheme differently (`s3a://` for `s3://`).
#[cfg(feature = "delta")]
#[test]
fn delta_prefixes_empty_objects_and_scheme_aliases() {
    let Some((dir, local, server)) = lake("delta_prefixes_empty_objects_and_scheme_aliases") else {
        return;
    };
    let d = dir.path();
    // A Delta table in two versions (the second replaces the first's rows),
    // with a copy of a data file in a folder inside it.
    let table = d.join("ids");
    common::delta::write_replaced_ids_table(&local.join("gallery"), &table);
    let part = std::fs::read_dir(&table)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .unwrap();
    std::fs::create_dir(table.join("sub")).unwrap();
    std::fs::copy(&part, table.join("sub/part.parquet")).unwrap();
    server.put_dir(BUCKET, "dl/ids", &table);
    let count = |spec: &str| {
        run_with(
            &server,
            &[
                "sql",
                "--format",
                "csv",
                "--table",
                &format!("t={spec}"),
                "SELECT count(*) AS n FROM t",
            ],
        )
    };
    let read = count("s3://lake/dl/ids");
    read.assert_success();
    assert_eq!(read.stdout(), "n\n4\n");
    let named = format!(
        "s3://lake/dl/ids/{}",
        part.file_name().unwrap().to_string_lossy()
    );
    count(&named).assert_success();
    for spec in [
        "s3://lake/dl/ids/*.parquet",
        "s3://lake/dl/",
        "s3://lake/dl/ids/sub/",
    ] {
        let out = count(spec);
        assert_eq!(out.code(), Some(2), "{spec}: {}", out.stderr());
        assert!(
            out.stderr().contains(&format!(
                "bad input at {spec}: reaches into the Delta table s3://lake/dl/ids,"
            )),
            "{spec}: {}",
            out.stderr()
        );
    }

    // Objects of 0 bytes, named alone or in a prefix.
    let empty = d.join("empty.parquet");
    std::fs::write(&empty, b"").unwrap();
    server.put_file(BUCKET, "zero/b.parquet", &empty);
    server.put_file(BUCKET, "zero/a.parquet", &part);
    for (spec, object) in [
        ("s3://lake/zero/b.parquet", "s3://lake/zero/b.parquet"),
        ("s3://lake/zero/", "s3://lake/zero/b.parquet"),
        ("s3://lake/zero/*.parquet", "s3://lake/zero/b.parquet"),
    ] {
        let out = count(spec);
        assert_eq!(out.code(), Some(2), "{spec}: {}", out.stderr());
        assert!(
            out.stderr()
                .contains(&format!("bad input at {object}: is empty (0 bytes)")),
            "{spec}: {}",
            out.stderr()
        );
    }

    // Marker and hidden files beside the parts (`_SUCCESS` of 0 bytes, a
    // `.crc`): a glob skips them as a folder's listing does, here and locally.
    let globbed = count("s3://lake/emb/gallery/*");
    globbed.assert_success();
    assert_eq!(globbed.stdout(), "n\n500\n");
    let local_glob = format!("{}/*", local.join("gallery").display());
    let globbed = count(&local_glob);
    globbed.assert_success();
    assert_eq!(globbed.stdout(), "n\n500\n");

    // An output under an input prefix named with the other scheme.
    let keys = server.keys(BUCKET);
    for (gallery, out) in [
        (
            "s3a://lake/emb/gallery",
            "s3://lake/emb/gallery/results.parquet",
        ),
        (
            "s3://lake/emb/gallery/",
            "s3a://lake/emb/gallery/results.parquet",
        ),
    ] {
        let refused = run_with(
            &server,
            &[
                "search",
                "--queries",
                "s3://lake/emb/queries.parquet",
                "--gallery",
                gallery,
                "--out",
                out,
            ],
        );
        assert_eq!(
            refused.code(),
            Some(2),
            "{gallery} -> {out}: {}",
            refused.stderr()
        );
        assert!(
            refused.stderr().contains("is inside the gallery input"),
            "{}",
            refused.stderr()
        );
    }
    assert_eq!(server.keys(BUCKET), keys, "nothing written");
}

#[test]
fn faults_name_the_url_and_leave_nothing_behind() {
    let Some((_dir, _local, mut server)) = lake("faults_name_the_url_and_leave_nothing_behind")
    else {
        return;
    };
    let run_args = |queries: &'static str, gallery: &'static str| {
        vec![
            "run",
            "--queries",
            queries,
            "--gallery",
            gallery,
            "--bank",
            "s3://lake/emb/bank/",
            "--out",
            "s3://lake/out/run",
        ]
    };
    // A missing key, a missing prefix, a missing bucket: bad input (2), naming the URL.
    for (queries, gallery, named) in [
        (
            "s3://lake/emb/nope.parquet",
            "s3://lake/emb/gallery/",
            "s3://lake/emb/nope.parquet",
        ),
        (
            "s3://lake/emb/queries.parquet",
            "s3://lake/emb/galleries/",
            "s3://lake/emb/galleries/",
        ),
        (
            "s3://lake/emb/queries.parquet",
            "s3://no-such-bucket/g/",
            "s3://no-such-bucket/g/",
        ),
    ] {
        let output = run_with(&server, &run_args(queries, gallery));
        assert_eq!(output.code(), Some(2), "{}", output.stderr());
        assert!(output.stderr().contains(named), "{}", output.stderr());
    }
    // Secrets in a URL are refused before anything is sent, and not echoed.
    let output = run_with(
        &server,
        &run_args(
            "s3://lake/emb/queries.parquet?X-Amz-Signature=hubnorm-secret-s3cr3t-value-7f3a9c",
            "s3://lake/emb/gallery/",
        ),
    );
    assert_eq!(output.code(), Some(2), "{}", output.stderr());
    assert!(
        output.stderr().contains("must not carry"),
        "{}",
        output.stderr()
    );
    // Nor when the URL does not parse, or a storage option is mistyped.
    for (out, option) in [
        (
            "s3://AKIAUSER:hubnorm-secret-pw-4c1e@lake:99999/x.parquet",
            "retry_timeout=5s",
        ),
        (
            "s3://AKIAUSER:hubnorm-secret-pw-4c1e@[lake/x.parquet?sig=hubnorm-secret-sig-77",
            "retry_timeout=5s",
        ),
        (
            "s3://lake/out/x.parquet",
            "aws_secret_access_key:hubnorm-secret-mistyped-91d2",
        ),
    ] {
        let mut args = run_args("s3://lake/emb/queries.parquet", "s3://lake/emb/gallery/");
        *args.last_mut().unwrap() = out;
        args.extend(["--storage-option", option]);
        let output = run_with(&server, &args);
        let stderr = output.stderr();
        assert_eq!(output.code(), Some(2), "{stderr}");
        assert!(!stderr.contains("hubnorm-secret"), "{stderr}");
        assert!(
            stderr.contains("<redacted>") || stderr.contains("not shown: it may hold a secret"),
            "{stderr}"
        );
    }
    // http(s) is read-only.
    let output = run_with(
        &server,
        &[
            "stats",
            "--gallery",
            "s3://lake/emb/gallery/",
            "--bank",
            "s3://lake/emb/bank/",
            "--out",
            &format!("{}/lake/out/stats.parquet", server.endpoint()),
        ],
    );
    assert_eq!(output.code(), Some(2), "{}", output.stderr());
    assert!(output.stderr().contains("read-only"), "{}", output.stderr());
    assert!(server.keys(BUCKET).iter().all(|k| !k.starts_with("out/")));
    assert_clean_bucket(&server);

    // Refused credentials (a server checking them): a message naming the
    // URL, no secret, no output.
    if let Some(refusing) = S3Server::start_refusing("faults (403)") {
        let mut command = hubnorm(run_args(
            "s3://lake/emb/queries.parquet",
            "s3://lake/emb/gallery/",
        ));
        for (k, v) in refusing.env() {
            command.env(k, v);
        }
        command.args(["--storage-option", "retry_timeout=5s"]);
        let output = command.output();
        let stderr = output.stderr();
        assert!(matches!(output.code(), Some(1 | 2)), "{stderr}");
        assert!(
            stderr.contains("s3://lake/") && stderr.contains("access denied"),
            "{stderr}"
        );
        assert!(!stderr.contains(SECRET_KEY), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    // A lost server: a failure (1) naming the URL once the retries are spent.
    server.stop();
    let mut command = hubnorm(run_args(
        "s3://lake/emb/queries.parquet",
        "s3://lake/emb/gallery/",
    ));
    for (k, v) in server.env() {
        command.env(k, v);
    }
    command.args([
        "--storage-option",
        "retry_timeout=2s",
        "--storage-option",
        "max_retries=2",
    ]);
    let output = command.output();
    let stderr = output.stderr();
    assert_eq!(output.code(), Some(1), "{stderr}");
    assert!(stderr.contains("s3://lake/"), "{stderr}");
    assert!(
        !stderr.contains(SECRET_KEY) && !stderr.contains("panicked"),
        "{stderr}"
    );
    // Nor a password in the endpoint, which the client's message repeats.
    command.env(
        "AWS_ENDPOINT",
        format!(
            "http://user:hubnorm-secret-endpoint@127.0.0.1:{}",
            server.port
        ),
    );
    let output = command.output();
    let stderr = output.stderr();
    assert_eq!(output.code(), Some(1), "{stderr}");
    assert!(stderr.contains("<redacted>@127.0.0.1"), "{stderr}");
    assert!(!stderr.contains("hubnorm-secret-endpoint"), "{stderr}");
}

#[test]
fn a_server_lost_mid_read_or_mid_write_leaves_no_output() {
    let Some((dir, _local, server)) = lake("a_server_lost_mid_read_or_mid_write_leaves_no_output")
    else {
        return;
    };
    // A gallery of 5 MB: several ranged reads.
    let mut r = rng(9);
    let big = random_table(&mut r, "g", 80_000, 16);
    write_table(
        &dir.path().join("big.parquet"),
        &big,
        Layout::FixedF32,
        false,
    );
    server.put_file(
        BUCKET,
        "big/gallery.parquet",
        &dir.path().join("big.parquet"),
    );
    let through = |proxy: &common::s3::CutProxy, args: &[&str]| {
        let mut command = hubnorm(args);
        for (k, v) in server.env() {
            command.env(k, v);
        }
        command.env("AWS_ENDPOINT", proxy.endpoint());
        command.args([
            "--storage-option",
            "retry_timeout=2s",
            "--storage-option",
            "max_retries=2",
        ]);
        let output = command.output();
        let stderr = output.stderr();
        assert!(
            !stderr.contains(SECRET_KEY) && !stderr.contains("panicked"),
            "{stderr}"
        );
        eprintln!("hubnorm said: {stderr}");
        output
    };

    // Lost after 2 MB of the gallery were read.
    let proxy = common::s3::CutProxy::start(server.port, usize::MAX, 2 << 20);
    let output = through(
        &proxy,
        &[
            "stats",
            "--gallery",
            "s3://lake/big/gallery.parquet",
            "--bank",
            "s3://lake/emb/bank/",
            "--no-checkpoint",
            "--out",
            "s3://lake/out/big_stats.parquet",
        ],
    );
    let stderr = output.stderr();
    assert!(
        proxy.was_cut(),
        "the read finished before the cut: {:?}: {stderr}",
        proxy.traffic()
    );
    assert_eq!(output.code(), Some(1), "{stderr}");
    // Gallery and bank are read side by side: the message names the one
    // whose request failed first.
    assert!(
        stderr.contains("s3://lake/big/gallery.parquet")
            || stderr.contains("s3://lake/emb/bank/part-"),
        "{stderr}"
    );
    assert!(server.get(BUCKET, "out/big_stats.parquet").is_none());

    // Lost after 10 MB of a 12 MB output were uploaded: the multipart
    // upload is never completed, so no object appears.
    let proxy = common::s3::CutProxy::start(server.port, 10 << 20, usize::MAX);
    let output = through(
        &proxy,
        &[
            "sql",
            "--format",
            "parquet",
            "--out",
            "s3://lake/out/cut.parquet",
            "SELECT random() AS x, random() AS y FROM generate_series(1, 800000)",
        ],
    );
    let stderr = output.stderr();
    assert!(
        proxy.was_cut(),
        "the upload finished before the cut: {:?}: {stderr}",
        proxy.traffic()
    );
    assert_eq!(output.code(), Some(1), "{:?}: {stderr}", output.status());
    assert!(stderr.contains("s3://lake/out/cut.parquet"), "{stderr}");
    assert!(server.get(BUCKET, "out/cut.parquet").is_none());
    // The abort could not reach the store either: the started upload stays
    // pending on the server (a lifecycle rule's job); nothing else does.
    let pending = server.pending_uploads(BUCKET);
    assert!(
        pending.iter().all(|k| k == "out/cut.parquet"),
        "{pending:?}"
    );
    eprintln!("pending multipart uploads after the cut: {pending:?}");
}

/// `template` with `{in}` and `{out}` replaced by where the inputs and
/// outputs live.
fn fill(template: &[&str], inputs: &str, outputs: &str) -> Vec<String> {
    template
        .iter()
        .map(|a| a.replace("{in}", inputs).replace("{out}", outputs))
        .collect()
}

/// A text output with its places written as `{in}` and `{out}` (local
/// `inputs`/`outputs`, or the bucket's), without the run's fingerprint.
fn text_with_places(path: &Path, inputs: &str, outputs: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .replace(inputs, "{in}")
        .replace(outputs, "{out}")
        .replace("s3://lake/emb", "{in}")
        .replace("s3://lake/out", "{out}")
        .lines()
        .filter(|l| !l.contains("\"run\":"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn compare_tune_export_and_config_on_s3_match_the_local_run() {
    let Some((dir, local, server)) =
        lake("compare_tune_export_and_config_on_s3_match_the_local_run")
    else {
        return;
    };
    let (local_in, local_out) = (local.display().to_string(), dir.path().join("out"));
    let local_out_text = local_out.display().to_string();
    let fetched = dir.path().join("fetched");
    // Each command on local paths, then on URLs; every output fetched and
    // compared with the local one.
    let commands: [(&[&str], &[&str]); 4] = [
        (
            &[
                "tune",
                "--validation",
                "{in}/queries.parquet",
                "--gallery",
                "{in}/gallery/",
                "--bank",
                "{in}/bank/",
                "--methods",
                "is",
                "--grid",
                "beta=10,30",
                "--bootstrap",
                "50",
                "--out",
                "{out}/tune",
            ],
            &["tune/tune.parquet", "tune/tuned.json"],
        ),
        (
            &[
                "compare",
                "--queries",
                "{in}/queries.parquet",
                "--gallery",
                "{in}/gallery/",
                "--bank",
                "{in}/bank/",
                "--config",
                "{out}/tune/tuned.json",
                "--bootstrap",
                "50",
                "--out",
                "{out}/compare",
            ],
            &[
                "compare/compare.parquet",
                "compare/compare.md",
                "compare/report.parquet",
                "compare/gallery_report.parquet",
                "compare/results.parquet",
            ],
        ),
        (
            &[
                "export",
                "--gallery",
                "{in}/gallery/",
                "--stats",
                "{out}/compare/gallery_stats.parquet",
                "--config",
                "{out}/tune/tuned.json",
                "--out",
                "{out}/export.parquet",
            ],
            &["export.parquet"],
        ),
        (
            &[
                "report",
                "--results",
                "{out}/compare/results.parquet",
                "--gallery",
                "{in}/gallery/",
                "--queries",
                "{in}/queries.parquet",
                "--out",
                "{out}/report",
            ],
            &["report/report.parquet", "report/gallery_report.parquet"],
        ),
    ];
    for (template, outputs) in commands {
        let on_disk = fill(template, &local_in, &local_out_text);
        run_with(
            &server,
            &on_disk.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .assert_success();
        let remote = fill(template, "s3://lake/emb", "s3://lake/out");
        run_with(
            &server,
            &remote.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .assert_success();
        for name in outputs {
            let got = fetched.join(name);
            std::fs::create_dir_all(got.parent().unwrap()).unwrap();
            server.get_file(BUCKET, &format!("out/{name}"), &got);
            if name.ends_with(".parquet") {
                assert_same_output(&got, &local_out.join(name));
            } else {
                let text = |path: &Path| text_with_places(path, &local_in, &local_out_text);
                assert_eq!(text(&got), text(&local_out.join(name)), "{name}");
            }
        }
    }
    assert_clean_bucket(&server);
}

#[test]
fn ctrl_c_during_an_upload_aborts_it() {
    let Some(server) = S3Server::start_or_skip("ctrl_c_during_an_upload_aborts_it") else {
        return;
    };
    server.create_bucket(BUCKET);
    // The connection that carries the 10th MB of a 12 MB output stalls, so
    // the upload is in progress, and cannot end by itself, when Ctrl-C comes.
    let proxy = common::s3::CutProxy::stalling(server.port, 10 << 20);
    let mut command = hubnorm([
        "sql",
        "--format",
        "parquet",
        "--out",
        "s3://lake/out/stopped.parquet",
        "SELECT random() AS x, random() AS y FROM generate_series(1, 800000)",
    ]);
    for (k, v) in server.env() {
        command.env(k, v);
    }
    command.env("AWS_ENDPOINT", proxy.endpoint());
    let mut child = command.spawn();
    wait_for("the upload stalled", &mut child, || proxy.was_cut());
    let interrupted = Instant::now();
    signal(&child, "INT");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        interrupted.elapsed() < Duration::from_secs(15),
        "the stop waited for the stalled request: {:?}",
        interrupted.elapsed()
    );
    assert!(!stderr.contains(SECRET_KEY), "{stderr}");
    // Aborted: no object, and no parts left on the server.
    assert!(server.get(BUCKET, "out/stopped.parquet").is_none());
    assert_eq!(server.pending_uploads(BUCKET), Vec::<String>::new());
}

/// Ctrl-C while `run` uploads its outputs, after the first went up: the
/// message says which output is already the new one (not "no output was
/// written") and how to resume, and the resumed run completes the set.
#[test]
fn ctrl_c_between_a_runs_uploads_names_what_was_replaced() {
    let Some(server) =
        S3Server::start_or_skip("ctrl_c_between_a_runs_uploads_names_what_was_replaced")
    else {
        return;
    };
    server.create_bucket(BUCKET);
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples");
    let sample = |name: &str| {
        samples
            .join(format!("{name}.parquet"))
            .display()
            .to_string()
    };
    let (queries, gallery, bank) = (sample("queries"), sample("gallery"), sample("bank"));
    let run = |endpoint: &str, out: &str, extra: &[&str]| {
        let mut command = hubnorm(["run", "--queries", &queries, "--gallery", &gallery]);
        command.args([
            "--bank",
            &bank,
            "--methods",
            "is,dis,nnn,csls",
            "--k",
            "100",
        ]);
        command
            .args(["--checkpoint-interval", "0", "--out", out])
            .args(extra);
        for (k, v) in server.env() {
            command.env(k, v);
        }
        command.env("AWS_ENDPOINT", endpoint);
        command
    };
    // The bytes a whole run sends, results.parquet (megabytes) near their end.
    let counting = common::s3::CutProxy::start(server.port, usize::MAX, usize::MAX);
    run(&counting.endpoint(), "s3://lake/whole", &[])
        .output()
        .assert_success();
    let (sent, _) = counting.traffic();
    let results = server.get(BUCKET, "whole/results.parquet").unwrap().len();
    assert!(results > 1 << 20, "results.parquet has {results} bytes");

    // The same run stalls halfway through uploading results.parquet.
    let proxy = common::s3::CutProxy::stalling(server.port, sent - results / 2);
    let mut child = run(&proxy.endpoint(), "s3://lake/mix", &[]).spawn();
    wait_for("the upload stalled", &mut child, || proxy.was_cut());
    signal(&child, "INT");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("s3://lake/mix/gallery_stats.parquet already replaced by this job's"),
        "{stderr}"
    );
    assert!(!stderr.contains("no output was written"), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    assert!(server.get(BUCKET, "mix/gallery_stats.parquet").is_some());
    assert!(server.get(BUCKET, "mix/results.parquet").is_none());

    run(&server.endpoint(), "s3://lake/mix", &["--resume"])
        .output()
        .assert_success();
    let dir = tempfile::tempdir().unwrap();
    for name in ["gallery_stats.parquet", "results.parquet"] {
        let (resumed, whole) = (dir.path().join("resumed"), dir.path().join("whole"));
        server.get_file(BUCKET, &format!("mix/{name}"), &resumed);
        server.get_file(BUCKET, &format!("whole/{name}"), &whole);
        assert_same_output(&resumed, &whole);
    }
}

#[test]
fn a_checkpoint_on_s3_resumes_to_the_same_bytes() {
    let Some(server) = S3Server::start_or_skip("a_checkpoint_on_s3_resumes_to_the_same_bytes")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        &CaseShape {
            seed: 4242,
            gallery: 12_000,
            queries: 10,
            bank: 8_000,
            dim: 64,
            noise: 0.3,
        },
    );
    upload_case(&server, dir.path(), &["gallery", "bank"]);
    let stats_of = |methods: &str, memory: &str, out: &str, extra: &[&str]| {
        let mut args = vec![
            "stats",
            "--gallery",
            "s3://lake/in/gallery.parquet",
            "--bank",
            "s3://lake/in/bank.parquet",
            "--methods",
            methods,
            "--memory-limit",
            memory,
            "--threads",
            "1",
            "--out",
            out,
        ];
        args.extend(extra);
        hubnorm_on(&server, &args)
    };
    let stats = |out: &str, extra: &[&str]| stats_of("is,dis,nnn", "36M", out, extra);
    stats("s3://lake/out/reference.parquet", &["--no-checkpoint"])
        .output()
        .assert_success();

    // Killed once a chunk is saved under the checkpoint prefix.
    let child = stats(
        "s3://lake/out/stats.parquet",
        &["--checkpoint-interval", "0"],
    )
    .spawn();
    kill_once_saved(&server, child, "out/stats.parquet.checkpoint/rows-");
    assert!(server.get(BUCKET, "out/stats.parquet").is_none());

    let resumed = stats("s3://lake/out/stats.parquet", &["--resume"]).output();
    resumed.assert_success();
    assert!(
        resumed.stdout().contains("resumed after"),
        "{}",
        resumed.stdout()
    );
    assert_eq!(
        server.get(BUCKET, "out/stats.parquet").unwrap(),
        server.get(BUCKET, "out/reference.parquet").unwrap(),
        "the resumed run's bytes differ from an uninterrupted run's"
    );
    assert!(
        server
            .keys(BUCKET)
            .iter()
            .all(|k| !k.contains(".checkpoint/")),
        "the checkpoint outlived the run: {:?}",
        server.keys(BUCKET)
    );

    // Ctrl-C four fifths of the way (timed by a run without a stop), with
    // no save due (an hour's interval): the stop does not cut the requests
    // that keep the finished chunks (or, with none finished, remove the
    // checkpoint); a checkpoint of a manifest alone would refuse every later
    // run without --resume. (Methods without activation sets, whose chunks
    // are saved at a stop.)
    let stop_job = |out: &str, extra: &[&str]| stats_of("is,nnn", "32M", out, extra);
    let started = Instant::now();
    stop_job("s3://lake/out/whole.parquet", &["--no-checkpoint"])
        .output()
        .assert_success();
    let whole = started.elapsed();
    let prefix = "out/stopped.parquet.checkpoint/";
    let mut child = stop_job(
        "s3://lake/out/stopped.parquet",
        &["--checkpoint-interval", "3600"],
    )
    .spawn();
    let manifest = format!("{prefix}manifest.json");
    wait_for("the checkpoint's manifest", &mut child, || {
        server.get(BUCKET, &manifest).is_some()
    });
    std::thread::sleep(whole * 4 / 5);
    signal(&child, "INT");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        // This machine finished before the stop came: nothing to check.
        eprintln!("the stopped job ended before its stop");
        return;
    }
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    let left: Vec<String> = server
        .keys(BUCKET)
        .into_iter()
        .filter(|k| k.starts_with(prefix))
        .collect();
    eprintln!(
        "after Ctrl-C at {:?} of {whole:?}: {left:?}\n{stderr}",
        whole * 4 / 5
    );
    assert!(
        left.is_empty()
            || left
                .iter()
                .any(|k| k.starts_with(&format!("{prefix}rows-"))),
        "a checkpoint without its saved chunks: {left:?}"
    );
    stop_job("s3://lake/out/stopped.parquet", &["--resume"])
        .output()
        .assert_success();
    assert_eq!(
        server.get(BUCKET, "out/stopped.parquet").unwrap(),
        server.get(BUCKET, "out/whole.parquet").unwrap(),
    );
}

/// `run --resume` with its outputs (and so its checkpoint) in a bucket:
/// SIGKILLed once a pass-2 query block is saved under
/// `OUT/run.checkpoint/pass2/`, the same command with `--resume` writes
/// every output with the bytes of an uninterrupted run's, and removes the
/// checkpoint's objects.
#[test]
fn a_run_on_s3_resumes_to_the_same_bytes() {
    let Some(server) = S3Server::start_or_skip("a_run_on_s3_resumes_to_the_same_bytes") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        &CaseShape {
            seed: 4243,
            gallery: 8_000,
            queries: 3_000,
            bank: 4_000,
            dim: 64,
            noise: 0.3,
        },
    );
    upload_case(&server, dir.path(), &["queries", "gallery", "bank"]);
    let run = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            "--queries",
            "s3://lake/in/queries.parquet",
            "--gallery",
            "s3://lake/in/gallery.parquet",
            "--bank",
            "s3://lake/in/bank.parquet",
            "--methods",
            "is,dis,nnn",
            // Many query blocks, each saved as its own object.
            "--memory-limit",
            "32M",
            "--threads",
            "1",
            "--quiet",
            "--out",
        ];
        args.push(out);
        args.extend(extra);
        hubnorm_on(&server, &args)
    };
    run("s3://lake/reference", &["--no-checkpoint"])
        .output()
        .assert_success();
    let outputs = ["results.parquet", "gallery_stats.parquet", "summary.json"];

    let child = run("s3://lake/out", &["--checkpoint-interval", "0"]).spawn();
    kill_once_saved(&server, child, "out/run.checkpoint/pass2/rows-");
    for name in outputs {
        assert!(
            server.get(BUCKET, &format!("out/{name}")).is_none(),
            "{name}"
        );
    }

    run("s3://lake/out", &["--resume"])
        .output()
        .assert_success();
    for name in outputs {
        assert!(
            server.get(BUCKET, &format!("out/{name}"))
                == server.get(BUCKET, &format!("reference/{name}")),
            "the resumed run's {name} differs from an uninterrupted run's"
        );
    }
    assert!(
        server
            .keys(BUCKET)
            .iter()
            .all(|k| !k.contains("run.checkpoint/")),
        "the checkpoint outlived the run: {:?}",
        server.keys(BUCKET)
    );
}

/// `http(s)://` inputs are read by ranges from any HTTP server (here a
/// minimal one of the test's), and give the local run's results.
#[test]
fn http_inputs_are_read_by_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("lake");
    std::fs::create_dir_all(&local).unwrap();
    write_lake(&local);
    let port = common::s3::serve_http(&local);
    let url = |p: &str| format!("http://127.0.0.1:{port}/{p}");
    let out = dir.path().join("out");
    for (queries, gallery, bank, to) in [
        (
            url("queries.parquet"),
            url("gallery/part-0.parquet"),
            url("bank/part-0.parquet"),
            "http",
        ),
        (
            local.join("queries.parquet").display().to_string(),
            local.join("gallery/part-0.parquet").display().to_string(),
            local.join("bank/part-0.parquet").display().to_string(),
            "local",
        ),
    ] {
        hubnorm([
            "run",
            "--queries",
            &queries,
            "--gallery",
            &gallery,
            "--bank",
            &bank,
            "--skip-missing",
            "--out",
            &out.join(to).display().to_string(),
        ])
        .output()
        .assert_success();
    }
    assert_same_output(
        &out.join("http/results.parquet"),
        &out.join("local/results.parquet"),
    );

    // A server that answers range requests with the whole file: refused
    // (exit 2) with what to do, by the run and by SQL, nothing written.
    let whole = common::s3::serve_http_ignoring_ranges(&local);
    let url = |p: &str| format!("http://127.0.0.1:{whole}/{p}");
    let refused = hubnorm([
        "search",
        "--queries",
        &url("queries.parquet"),
        "--gallery",
        &url("gallery/part-0.parquet"),
        "--skip-missing",
        "--out",
        &out.join("whole.parquet").display().to_string(),
    ])
    .output();
    let sql = hubnorm([
        "sql",
        "--table",
        &format!("g={}", url("gallery/part-0.parquet")),
        "SELECT count(*) FROM g",
    ])
    .output();
    for out in [refused, sql] {
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(
            out.stderr()
                .contains("the server ignores byte-range requests"),
            "{}",
            out.stderr()
        );
    }
    assert!(!out.join("whole.parquet").exists());

    // A folder or a glob needs a listing, which a plain web server does
    // not give (405 to WebDAV's PROPFIND): refused (exit 2) with what to do.
    let url = |p: &str| format!("http://127.0.0.1:{port}/{p}");
    for gallery in [url("gallery/"), url("gallery/*.parquet")] {
        let refused = hubnorm(["search", "--queries", &url("queries.parquet")])
            .args(["--gallery", &gallery, "--skip-missing"])
            .args(["--out", &out.join("listed.parquet").display().to_string()])
            .output();
        assert_eq!(refused.code(), Some(2), "{gallery}: {}", refused.stderr());
        assert!(
            refused.stderr().contains(
                "the HTTP server does not list folders (it answers WebDAV's PROPFIND with 405 Method Not Allowed)"
            ),
            "{gallery}: {}",
            refused.stderr()
        );
        assert!(!out.join("listed.parquet").exists());
    }
    // A file the server does not have is named missing, whatever it says
    // to a listing.
    let missing = hubnorm(["search", "--queries", &url("queries.parquet")])
        .args([
            "--gallery",
            &url("gallery/nosuch.parquet"),
            "--skip-missing",
        ])
        .args(["--out", &out.join("missing.parquet").display().to_string()])
        .output();
    assert_eq!(missing.code(), Some(2), "{}", missing.stderr());
    assert!(
        missing.stderr().contains(&format!(
            "bad input at {}: no such object",
            url("gallery/nosuch.parquet")
        )),
        "{}",
        missing.stderr()
    );
}

/// Delta tables in an object store (feature `delta`): tables deltalake
/// wrote, uploaded to the server, are read at their latest version and at
/// `@VERSION`; `--format delta` outputs are committed there, new table and
/// appended version, and deltalake and polars read them (downloaded) as the
/// rows the same run on local files writes.
#[cfg(feature = "delta")]
#[test]
fn delta_tables_in_an_object_store() {
    use common::delta::{client, python, write_delta_case};
    let test = "delta_tables_in_an_object_store";
    let Some(py) = python(test) else { return };
    let Some(server) = S3Server::start_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_delta_case(&py, d);
    let local = |p: &str| d.join(p).display().to_string();
    server.create_bucket(BUCKET);
    server.put_dir(BUCKET, "delta", &d.join("lake"));

    let run = |queries: &str, gallery: &str, bank: &str, out: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            "--queries",
            queries,
            "--gallery",
            gallery,
            "--bank",
            bank,
            "--methods",
            "is,nnn",
            "--nnn-k",
            "5",
            "--skip-missing",
            "--quiet",
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        run_with(&server, &args)
    };
    let url = |p: &str| format!("s3://{BUCKET}/{p}");
    run(
        &url("delta/queries"),
        &url("delta/gallery"),
        &url("delta/bank"),
        &url("out"),
        &["--format", "delta"],
    )
    .assert_success();
    run(
        &local("lake/queries"),
        &local("lake/gallery"),
        &local("lake/bank"),
        &local("local"),
        &[],
    )
    .assert_success();
    let download = |prefix: &str, to: &Path| {
        let _ = std::fs::remove_dir_all(to);
        for key in server.keys(BUCKET) {
            if let Some(rest) = key.strip_prefix(prefix) {
                let file = to.join(rest);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                server.get_file(BUCKET, &key, &file);
            }
        }
    };
    let down = d.join("down");
    download("out/", &down);
    let read = client(
        &py,
        &["read", &down.join("results.parquet").display().to_string()],
    );
    let rows = read["rows"].as_array().unwrap().len();
    assert_eq!(rows, read_results(&d.join("local/results.parquet")).len());
    let out = run_with(
        &server,
        &[
            "sql",
            "SELECT count(*) AS n FROM r",
            "--format",
            "csv",
            "--table",
            &format!("r={}", url("out/results.parquet")),
        ],
    );
    out.assert_success();
    assert_eq!(out.stdout(), format!("n\n{rows}\n"));

    // Version 0 of the gallery, appended to the output table as version 1.
    run(
        &url("delta/queries"),
        &url("delta/gallery@0"),
        &url("delta/bank"),
        &url("out"),
        &["--format", "delta", "--append"],
    )
    .assert_success();
    download("out/", &down);
    let appended = client(
        &py,
        &["read", &down.join("results.parquet").display().to_string()],
    );
    assert_eq!(appended["version"], 1);
    assert_eq!(appended["files"], 2);
    assert!(appended["rows"].as_array().unwrap().len() > rows);
    assert_clean_bucket(&server);
}
