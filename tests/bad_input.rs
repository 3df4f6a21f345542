//! Every bad input of the streaming-engine issue, through the binary: exit
//! code 2, a message that names the file, the row and the column, and no
//! output (nor output folder) left behind.
mod common;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, ListArray, StringArray};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field};
use common::*;

/// `hubnorm run` on the case in `dir` into `dir/out`, with `extra` flags.
fn run_case(dir: &Path, extra: &[&str]) -> TestOutput {
    let p = |n: &str| dir.join(n).display().to_string();
    let mut args = vec![
        "run".to_owned(),
        "--queries".into(),
        p("queries.parquet"),
        "--gallery".into(),
        p("gallery.parquet"),
        "--bank".into(),
        p("bank.parquet"),
        "--out".into(),
        p("out"),
        "--quiet".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    hubnorm(args).output()
}

/// Runs `hubnorm run` and checks the failure is reported as bad input at
/// `file`, `row`, `column`, with `phrase` in the message, and that nothing was written.
fn assert_refused(dir: &Path, file: &str, row: Option<u64>, column: Option<&str>, phrase: &str) {
    let out = dir.join("out");
    let run = run_case(dir, &[]);
    let (code, stderr) = (run.code(), run.stderr());
    assert_eq!(code, Some(2), "exit code for {phrase}: {stderr}");
    assert!(
        stderr.contains(file),
        "message names the file {file}: {stderr}"
    );
    if let Some(row) = row {
        assert!(
            stderr.contains(&format!("row {row}")),
            "message names row {row}: {stderr}"
        );
    }
    if let Some(column) = column {
        assert!(
            stderr.contains(&format!("column '{column}'")),
            "message names column {column}: {stderr}"
        );
    }
    assert!(stderr.contains(phrase), "message says '{phrase}': {stderr}");
    let left: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "no output left behind: {left:?}");
    // Not even the folder the run would have made for them.
    assert!(!out.exists(), "{} is left behind", out.display());
}

fn ids(n: usize, prefix: &str) -> ArrayRef {
    Arc::new(StringArray::from(
        (0..n).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>(),
    ))
}

fn fixed(values: Vec<f32>, dim: i32, nulls: Option<Vec<bool>>) -> ArrayRef {
    Arc::new(
        FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            dim,
            Arc::new(Float32Array::from(values)),
            nulls.map(NullBuffer::from),
        )
        .unwrap(),
    )
}

fn gallery_with(dir: &Path, embedding: ArrayRef, rows: usize) {
    write_columns(
        &dir.join("gallery.parquet"),
        vec![("id", ids(rows, "g")), ("embedding", embedding)],
    );
}

#[test]
fn null_embedding() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let mut valid = vec![true; 40];
    valid[17] = false;
    gallery_with(dir.path(), fixed(vec![0.5; 160], 4, Some(valid)), 40);
    assert_refused(
        dir.path(),
        "gallery.parquet",
        Some(17),
        Some("embedding"),
        "null embedding",
    );
}

#[test]
fn null_value_inside_an_embedding() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let values: Vec<Option<f32>> = (0..160)
        .map(|i| if i == 4 * 9 + 2 { None } else { Some(0.5) })
        .collect();
    let emb: ArrayRef = Arc::new(
        FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            4,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .unwrap(),
    );
    gallery_with(dir.path(), emb, 40);
    assert_refused(
        dir.path(),
        "gallery.parquet",
        Some(9),
        Some("embedding"),
        "null value",
    );
}

#[test]
fn ragged_list_embedding() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    // 40 rows of 4 values, except row 23 which has 3.
    let mut offsets = vec![0i32];
    for i in 0..40 {
        offsets.push(offsets[i] + if i == 23 { 3 } else { 4 });
    }
    let total = *offsets.last().unwrap() as usize;
    let emb: ArrayRef = Arc::new(
        ListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Arc::new(Float32Array::from(vec![0.25f32; total])),
            None,
        )
        .unwrap(),
    );
    gallery_with(dir.path(), emb, 40);
    assert_refused(
        dir.path(),
        "gallery.parquet",
        Some(23),
        Some("embedding"),
        "ragged embedding",
    );
}

#[test]
fn dimension_differs_between_tables() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let mut r = rng(22);
    write_table(
        &dir.path().join("bank.parquet"),
        &random_table(&mut r, "b", 30, 5),
        Layout::FixedF32,
        false,
    );
    assert_refused(
        dir.path(),
        "bank.parquet",
        Some(0),
        Some("embedding"),
        "dimension 5",
    );
}

#[test]
fn dimension_differs_between_parts_of_a_table() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let parts = dir.path().join("gallery.parquet"); // becomes a directory of parts
    std::fs::remove_file(&parts).unwrap();
    std::fs::create_dir(&parts).unwrap();
    let mut r = rng(23);
    let mut g = random_table(&mut r, "g", 40, 4);
    g.targets = None;
    write_table(
        &parts.join("part-0.parquet"),
        &g.slice(0, 20),
        Layout::FixedF32,
        false,
    );
    let mut wide = random_table(&mut r, "h", 20, 6);
    wide.targets = None;
    write_table(
        &parts.join("part-1.parquet"),
        &wide,
        Layout::FixedF32,
        false,
    );
    assert_refused(
        dir.path(),
        "part-1.parquet",
        Some(0),
        Some("embedding"),
        "dimension 6",
    );
}

#[test]
fn nan_and_infinite_values() {
    for (bad, phrase) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf")] {
        let dir = tempfile::tempdir().unwrap();
        valid_case(dir.path());
        let mut values = vec![0.5f32; 160];
        values[4 * 31 + 1] = bad;
        gallery_with(dir.path(), fixed(values, 4, None), 40);
        assert_refused(
            dir.path(),
            "gallery.parquet",
            Some(31),
            Some("embedding"),
            phrase,
        );
    }
}

#[test]
fn zero_vector_when_normalising() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let mut values = vec![0.5f32; 160];
    values[4 * 5..4 * 6].fill(0.0);
    gallery_with(dir.path(), fixed(values, 4, None), 40);
    assert_refused(
        dir.path(),
        "gallery.parquet",
        Some(5),
        Some("embedding"),
        "zero vector",
    );
}

#[test]
fn empty_table() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    write_columns(
        &dir.path().join("bank.parquet"),
        vec![("id", ids(0, "b")), ("embedding", fixed(vec![], 4, None))],
    );
    assert_refused(dir.path(), "bank.parquet", None, None, "empty");
}

#[test]
fn missing_column() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    write_columns(
        &dir.path().join("queries.parquet"),
        vec![
            ("id", ids(40, "q")),
            ("vector", fixed(vec![0.5; 160], 4, None)),
        ],
    );
    assert_refused(
        dir.path(),
        "queries.parquet",
        None,
        Some("embedding"),
        "missing column",
    );
}

/// A ground-truth column named with `--target-column` must be there: a
/// typo would otherwise give an evaluation without its figures. Unnamed,
/// the default `target_id` is read only when present.
#[test]
fn a_named_target_column_that_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let run = run_case(dir.path(), &["--target-column", "target"]);
    let stderr = run.stderr();
    assert_eq!(run.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("queries.parquet") && stderr.contains("column 'target'"),
        "{stderr}"
    );
    assert!(
        stderr.contains("missing column (the file has: "),
        "{stderr}"
    );
    assert!(!dir.path().join("out").exists());

    run_case(dir.path(), &["--target-column", "target_id"]).assert_success();
    let summary = std::fs::read_to_string(dir.path().join("out/summary.json")).unwrap();
    assert!(summary.contains("queries_with_target"), "{summary}");
}

#[test]
fn unsigned_id_beyond_int64() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    // Ids come out as Int64; 2^63 does not fit one and must not become a
    // null or a negative id.
    let unsigned: Vec<u64> = (0..40).map(|i| if i == 17 { 1 << 63 } else { i }).collect();
    write_columns(
        &dir.path().join("gallery.parquet"),
        vec![
            ("id", Arc::new(arrow::array::UInt64Array::from(unsigned))),
            ("embedding", fixed(vec![0.5; 160], 4, None)),
        ],
    );
    assert_refused(
        dir.path(),
        "gallery.parquet",
        Some(17),
        Some("id"),
        "id 9223372036854775808 is larger than 2^63 − 1",
    );
}

/// Ten queries of `valid_case`'s dimension with these targets.
fn queries_with_targets(dir: &Path, targets: ArrayRef) {
    write_columns(
        &dir.join("queries.parquet"),
        vec![
            ("id", ids(10, "q")),
            ("embedding", fixed(vec![0.5; 40], 4, None)),
            ("target_id", targets),
        ],
    );
}

#[test]
fn target_not_in_gallery() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let targets: Vec<String> = (0..10)
        .map(|i| {
            if i == 6 {
                "nowhere".into()
            } else {
                format!("g{i}")
            }
        })
        .collect();
    queries_with_targets(dir.path(), Arc::new(StringArray::from(targets)));
    assert_refused(
        dir.path(),
        "queries.parquet",
        Some(6),
        Some("target_id"),
        "not in the gallery",
    );
}

/// A null target is refused with the way out, and skipped with
/// `--skip-missing` (a query without a label); a target of another type
/// than the gallery's ids says so.
#[test]
fn null_and_mistyped_targets() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let targets: Vec<Option<String>> = (0..10).map(|i| (i != 4).then(|| format!("g{i}"))).collect();
    queries_with_targets(dir.path(), Arc::new(StringArray::from(targets)));
    assert_refused(
        dir.path(),
        "queries.parquet",
        Some(4),
        Some("target_id"),
        "null target id (pass --skip-missing",
    );
    let skipped = run_case(dir.path(), &["--methods", "none", "--skip-missing"]);
    assert_eq!(skipped.code(), Some(0), "{}", skipped.stderr());
    let summary = std::fs::read_to_string(dir.path().join("out/summary.json")).unwrap();
    assert!(summary.contains("\"queries_skipped\": 1"), "{summary}");
    std::fs::remove_dir_all(dir.path().join("out")).unwrap();

    // Integer targets against string gallery ids cast; string targets
    // against integer gallery ids do not.
    write_columns(
        &dir.path().join("gallery.parquet"),
        vec![
            (
                "id",
                Arc::new(arrow::array::Int64Array::from_iter_values(0..10)) as ArrayRef,
            ),
            ("embedding", fixed(vec![0.5; 40], 4, None)),
        ],
    );
    queries_with_targets(dir.path(), ids(10, "g"));
    assert_refused(
        dir.path(),
        "queries.parquet",
        Some(0),
        Some("target_id"),
        "target id g0 (Utf8) cannot be matched with the gallery's ids (Int64)",
    );
}

#[test]
fn missing_file_and_unreadable_file() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    std::fs::write(dir.path().join("gallery.parquet"), b"this is not parquet").unwrap();
    assert_refused(
        dir.path(),
        "gallery.parquet",
        None,
        None,
        "not a readable Parquet file",
    );
    std::fs::remove_file(dir.path().join("gallery.parquet")).unwrap();
    assert_refused(dir.path(), "gallery.parquet", None, None, "no such file");
}

#[test]
fn existing_outputs_are_kept_without_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let p = |n: &str| dir.path().join(n).display().to_string();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("results.parquet"), b"precious").unwrap();
    let args = [
        "run",
        "--queries",
        &p("queries.parquet"),
        "--gallery",
        &p("gallery.parquet"),
        "--bank",
        &p("bank.parquet"),
        "--out",
        &p("out"),
        "--quiet",
    ];
    let run = hubnorm(args).output();
    let (code, stderr) = (run.code(), run.stderr());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--overwrite"), "{stderr}");
    assert_eq!(
        std::fs::read(out.join("results.parquet")).unwrap(),
        b"precious"
    );
    let mut with_overwrite = args.to_vec();
    with_overwrite.push("--overwrite");
    let run = hubnorm(&with_overwrite).output();
    let (code, stderr) = (run.code(), run.stderr());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        read_results(&out.join("results.parquet")).len(),
        2 * 10 * 10
    );
}

#[test]
fn missing_stats_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let p = |n: &str| dir.path().join(n).display().to_string();
    let run = hubnorm([
        "search",
        "--queries",
        &p("queries.parquet"),
        "--gallery",
        &p("gallery.parquet"),
        "--stats",
        &p("nowhere.parquet"),
        "--out",
        &p("results.parquet"),
        "--quiet",
    ])
    .output();
    let (code, stderr) = (run.code(), run.stderr());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("nowhere.parquet") && stderr.contains("no such file"),
        "{stderr}"
    );
    assert!(!dir.path().join("results.parquet").exists());
}

#[test]
fn usage_errors_exit_with_2() {
    let code = hubnorm(["run", "--queries", "q.parquet"]).output().code();
    assert_eq!(code, Some(2));
    let run = hubnorm([
        "stats",
        "--gallery",
        "g",
        "--bank",
        "b",
        "--out",
        "x",
        "--method",
        "bogus",
    ])
    .output();
    let (code, stderr) = (run.code(), run.stderr());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unknown method 'bogus'"), "{stderr}");
}

/// Statistics of normalised vectors do not correct raw dot products, nor
/// the reverse: `search` and `export` with the other `--no-normalize`
/// setting than `stats` are refused, naming the stats file, and write nothing.
#[test]
fn stats_read_with_the_other_normalisation_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let p = |n: &str| dir.path().join(n).display().to_string();
    let (queries, gallery, bank) = (
        p("queries.parquet"),
        p("gallery.parquet"),
        p("bank.parquet"),
    );
    let (stats_file, results, exported) = (
        p("stats.parquet"),
        p("results.parquet"),
        p("export.parquet"),
    );
    for (stats_flags, reader_flags) in [
        (vec![], vec!["--no-normalize"]),
        (vec!["--no-normalize"], vec![]),
    ] {
        let mut stats = vec![
            "stats",
            "--gallery",
            &gallery,
            "--bank",
            &bank,
            "--out",
            &stats_file,
            "--overwrite",
            "--quiet",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        stats.extend(stats_flags.iter().map(|f| f.to_string()));
        hubnorm(&stats).output().assert_success();
        let search = ["search", "--queries", &queries, "--out", &results];
        let export = ["export", "--out", &exported];
        for command in [&search[..], &export[..]] {
            let mut args: Vec<&str> = command.to_vec();
            args.extend(["--gallery", &gallery, "--stats", &stats_file, "--quiet"]);
            args.extend(reader_flags.iter().copied());
            let refused = hubnorm(&args).output();
            let stderr = refused.stderr();
            assert_eq!(refused.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains("stats.parquet holds statistics of")
                    && stderr.contains("the same --no-normalize setting"),
                "{stderr}"
            );
            for output in [&results, &exported] {
                assert!(!Path::new(output).exists(), "{output}");
            }
        }
        // The same setting as the statistics is taken.
        let mut args: Vec<&str> = search.to_vec();
        args.extend(["--gallery", &gallery, "--stats", &stats_file, "--quiet"]);
        args.extend(stats_flags.iter().copied());
        hubnorm(&args).output().assert_success();
        std::fs::remove_file(dir.path().join("results.parquet")).unwrap();
    }
}
