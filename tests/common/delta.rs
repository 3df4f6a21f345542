//! The Delta Lake tests' other side: a client no one here wrote, the
//! Python `deltalake` package with polars and pyiceberg
//! (tests/fixtures/delta_client.py), in the virtual environment
//! `.venv-delta` that `.ci/run` creates (or `HUBNORM_DELTA_PYTHON`). Without
//! it the tests say so loudly and pass, unless `HUBNORM_REQUIRE_DELTA=1`
//! (set by `.ci/run`), which makes it a failure.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The environment's Python, or `None` (after a loud note).
pub fn python(test: &str) -> Option<PathBuf> {
    let python = std::env::var_os("HUBNORM_DELTA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-delta/bin/python"));
    if python.is_file() {
        return Some(python);
    }
    if std::env::var("HUBNORM_REQUIRE_DELTA").is_ok_and(|v| v == "1") {
        panic!(
            "{test}: HUBNORM_REQUIRE_DELTA=1 but {} is missing",
            python.display()
        );
    }
    eprintln!(
        "\n*** SKIPPED {test}: no {} (python3 -m venv .venv-delta && .venv-delta/bin/pip install deltalake polars pyarrow 'pyiceberg[sql-sqlite]')\n",
        python.display()
    );
    None
}

/// Runs the client with `args`; its one line of JSON.
pub fn client(python: &Path, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/delta_client.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "delta_client {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// [`super::valid_case`]'s tables as Delta tables in `dir/lake/`, written
/// by the client: `gallery` in two versions (rows 0..25, then 25..40
/// appended), `bank` and `queries` in one each.
pub fn write_delta_case(python: &Path, dir: &Path) {
    super::valid_case(dir);
    let file = |name: &str| dir.join(format!("{name}.parquet")).display().to_string();
    let table = |name: &str| dir.join("lake").join(name).display().to_string();
    let versions = [
        ("gallery", vec!["--rows", "0:25"]),
        ("gallery", vec!["--rows", "25:40", "--mode", "append"]),
        ("bank", vec![]),
        ("queries", vec![]),
    ];
    for (name, extra) in versions {
        let (table, file) = (table(name), file(name));
        let mut args = vec!["write", table.as_str(), file.as_str()];
        args.extend(extra);
        client(python, &args);
    }
    assert_eq!(client(python, &["info", &table("gallery")])["version"], 1);
}

/// A Delta table at `table` written by hubnorm itself (`sql ... COPY ...
/// STORED AS DELTA`): version 0 holds the first 10 ids of the Parquet
/// table at `source`, version 1 replaces them with its first 4, so the
/// table's folder holds a data file its latest version removed.
pub fn write_replaced_ids_table(source: &Path, table: &Path) {
    for (limit, mode) in [(10, "error"), (4, "overwrite")] {
        super::hubnorm([
            "sql",
            "--table",
            &format!("g={}", source.display()),
            &format!(
                "COPY (SELECT id FROM g LIMIT {limit}) TO '{}' STORED AS DELTA OPTIONS ('mode' '{mode}')",
                table.display()
            ),
        ])
        .output()
        .assert_success();
    }
}
