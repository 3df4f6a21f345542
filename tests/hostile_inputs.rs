//! A corpus of hostile inputs, generated here, run through the binary. Each
//! case names the error class it must get (the prefix of the message), the
//! file, row and column where one applies, and a phrase; every refusal exits
//! with code 2 and leaves every file in the folder as it was (no output
//! created, none changed). Odd but valid inputs (strange ids) must work.
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, FixedSizeListArray, Float32Array, Float64Array, ListArray, StringArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field};
use common::*;

/// The error classes of `HubnormError` that mean "the user can fix it"
/// (exit code 2), by the prefix of their message.
#[derive(Debug, Clone, Copy)]
enum Class {
    /// `bad input at FILE, row R, column 'C': …`
    Input,
    /// `invalid usage: …`
    Usage,
}

impl Class {
    fn prefix(self) -> &'static str {
        match self {
            Class::Input => "error: bad input at ",
            Class::Usage => "error: invalid usage: ",
        }
    }
}

struct Expected<'a> {
    class: Class,
    file: Option<&'a str>,
    row: Option<u64>,
    column: Option<&'a str>,
    phrase: &'a str,
}

/// The gallery size and dimension of `common::valid_case`.
const GALLERY_ROWS: usize = 40;
const DIM: i32 = 4;

/// Every file under `dir` (recursively) with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.insert(path.clone(), b"<dir>".to_vec());
                stack.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// `hubnorm run` on the case in `dir` with `extra` arguments.
fn run_args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let p = |n: &str| dir.join(n).display().to_string();
    let mut args: Vec<String> = [
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
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Runs `args`, and checks the refusal against `expected` and that nothing
/// in `dir` was created or changed.
fn assert_refused(case: &str, dir: &Path, args: &[String], expected: Expected<'_>) {
    let before = snapshot(dir);
    let out = hubnorm(args).output();
    let stderr = out.stderr();
    assert_eq!(out.code(), Some(2), "{case}: exit code; stderr: {stderr}");
    assert!(
        stderr.starts_with(expected.class.prefix()),
        "{case}: error class {:?}: {stderr}",
        expected.class
    );
    if let Some(file) = expected.file {
        assert!(
            stderr.contains(file),
            "{case}: names the file {file}: {stderr}"
        );
    }
    if let Some(row) = expected.row {
        assert!(
            stderr.contains(&format!("row {row}")),
            "{case}: names row {row}: {stderr}"
        );
    }
    if let Some(column) = expected.column {
        assert!(
            stderr.contains(&format!("column '{column}'")),
            "{case}: names column {column}: {stderr}"
        );
    }
    assert!(
        stderr.contains(expected.phrase),
        "{case}: says '{}': {stderr}",
        expected.phrase
    );
    assert!(!stderr.contains("panicked"), "{case}: panicked: {stderr}");
    assert_eq!(
        snapshot(dir).keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "{case}: files created or removed"
    );
    assert!(snapshot(dir) == before, "{case}: a file changed");
}

fn ids(n: usize, prefix: &str) -> ArrayRef {
    Arc::new(StringArray::from(
        (0..n).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>(),
    ))
}

fn fixed(values: Vec<f32>, dim: i32) -> ArrayRef {
    Arc::new(
        FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            dim,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .unwrap(),
    )
}

/// The gallery replaced by `columns`.
fn gallery_with(dir: &Path, columns: Vec<(&str, ArrayRef)>) {
    write_columns(&dir.join("gallery.parquet"), columns);
}

/// One case: a fresh valid folder, `mutate` breaks it, then the refusal is checked.
fn case(
    name: &str,
    mutate: impl FnOnce(&Path),
    args: impl FnOnce(&Path) -> Vec<String>,
    expected: Expected<'_>,
) {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    mutate(dir.path());
    let args = args(dir.path());
    assert_refused(name, dir.path(), &args, expected);
}

fn input<'a>(
    file: &'a str,
    row: Option<u64>,
    column: Option<&'a str>,
    phrase: &'a str,
) -> Expected<'a> {
    Expected {
        class: Class::Input,
        file: Some(file),
        row,
        column,
        phrase,
    }
}

fn usage(phrase: &str) -> Expected<'_> {
    Expected {
        class: Class::Usage,
        file: None,
        row: None,
        column: None,
        phrase,
    }
}

fn default_run(dir: &Path) -> Vec<String> {
    run_args(dir, &[])
}

#[test]
fn damaged_files() {
    let bytes = |dir: &Path| std::fs::read(dir.join("gallery.parquet")).unwrap();
    case(
        "truncated Parquet file",
        |d| {
            let b = bytes(d);
            std::fs::write(d.join("gallery.parquet"), &b[..b.len() / 2]).unwrap();
        },
        default_run,
        input("gallery.parquet", None, None, "not a readable Parquet file"),
    );
    case(
        "Parquet file cut just before its footer's end",
        |d| {
            let b = bytes(d);
            std::fs::write(d.join("gallery.parquet"), &b[..b.len() - 3]).unwrap();
        },
        default_run,
        input("gallery.parquet", None, None, "not a readable Parquet file"),
    );
    case(
        "empty (0-byte) file",
        |d| std::fs::write(d.join("gallery.parquet"), b"").unwrap(),
        default_run,
        input(
            "gallery.parquet",
            None,
            None,
            "is empty (0 bytes), not a Parquet file",
        ),
    );
    case(
        "not a Parquet file",
        |d| {
            std::fs::write(
                d.join("gallery.parquet"),
                b"id,embedding\ng0,\"[1,2,3,4]\"\n",
            )
            .unwrap()
        },
        default_run,
        input("gallery.parquet", None, None, "not a readable Parquet file"),
    );
    case(
        "corrupted page headers (footer intact)",
        |d| {
            let mut b = bytes(d);
            // The first page header follows the 4-byte magic.
            for byte in &mut b[4..40] {
                *byte = 0xff;
            }
            std::fs::write(d.join("gallery.parquet"), &b).unwrap();
        },
        default_run,
        input(
            "gallery.parquet",
            Some(0),
            None,
            "cannot decode Parquet data",
        ),
    );
    case(
        "a damaged page in a later row group (one batch spans them all)",
        |d| {
            // Three row groups of 700 rows (write_columns): rows 1400 on are damaged.
            let n = 2100;
            let values = (0..n * DIM as usize)
                .map(|i| 1.0 + (i % 7) as f32)
                .collect();
            gallery_with(
                d,
                vec![("id", ids(n, "g")), ("embedding", fixed(values, DIM))],
            );
            break_row_groups(&d.join("gallery.parquet"), 2);
        },
        default_run,
        input(
            "gallery.parquet",
            Some(1400),
            None,
            "cannot decode Parquet data",
        ),
    );
}

#[test]
fn wrong_types_and_values() {
    let n = GALLERY_ROWS;
    case(
        "embedding stored as text",
        |d| {
            let text: ArrayRef = Arc::new(StringArray::from(vec!["[0.1, 0.2, 0.3, 0.4]"; n]));
            gallery_with(d, vec![("id", ids(n, "g")), ("embedding", text)]);
        },
        default_run,
        input(
            "gallery.parquet",
            None,
            Some("embedding"),
            "embedding column has type Utf8",
        ),
    );
    case(
        "embedding as a list of integers",
        |d| {
            let values = arrow::array::Int32Array::from(vec![1; n * 4]);
            let list = ListArray::new(
                Arc::new(Field::new("item", DataType::Int32, true)),
                OffsetBuffer::from_lengths(vec![4; n]),
                Arc::new(values),
                None,
            );
            gallery_with(d, vec![("id", ids(n, "g")), ("embedding", Arc::new(list))]);
        },
        default_run,
        input(
            "gallery.parquet",
            None,
            Some("embedding"),
            "expected FixedSizeList or List of Float16, Float32 or Float64",
        ),
    );
    case(
        "float ids",
        |d| {
            let id: ArrayRef = Arc::new(Float64Array::from(
                (0..n).map(|i| i as f64).collect::<Vec<_>>(),
            ));
            gallery_with(
                d,
                vec![("id", id), ("embedding", fixed(vec![0.5; n * 4], 4))],
            );
        },
        default_run,
        input(
            "gallery.parquet",
            None,
            Some("id"),
            "id column has type Float64",
        ),
    );
    case(
        "binary ids that are not UTF-8",
        |d| {
            let raw: Vec<Vec<u8>> = (0..n).map(|i| vec![0xff, 0xfe, i as u8]).collect();
            let id: ArrayRef = Arc::new(BinaryArray::from_iter_values(raw));
            gallery_with(
                d,
                vec![("id", id), ("embedding", fixed(vec![0.5; n * 4], 4))],
            );
        },
        default_run,
        input(
            "gallery.parquet",
            None,
            Some("id"),
            "id column has type Binary",
        ),
    );
    case(
        "null inside an embedding (nested null)",
        |d| {
            let mut values: Vec<Option<f32>> = vec![Some(0.5); n * 4];
            values[9 * 4 + 2] = None;
            let list = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                4,
                Arc::new(Float32Array::from(values)),
                None,
            )
            .unwrap();
            gallery_with(d, vec![("id", ids(n, "g")), ("embedding", Arc::new(list))]);
        },
        default_run,
        input(
            "gallery.parquet",
            Some(9),
            Some("embedding"),
            "null value inside the embedding",
        ),
    );
    case(
        "null embedding",
        |d| {
            let list = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                4,
                Arc::new(Float32Array::from(vec![0.5; n * 4])),
                Some(NullBuffer::from((0..n).map(|i| i != 6).collect::<Vec<_>>())),
            )
            .unwrap();
            gallery_with(d, vec![("id", ids(n, "g")), ("embedding", Arc::new(list))]);
        },
        default_run,
        input(
            "gallery.parquet",
            Some(6),
            Some("embedding"),
            "null embedding",
        ),
    );
    for (name, value, row) in [
        ("NaN", f32::NAN, 3u64),
        ("+inf", f32::INFINITY, 17),
        ("-inf", f32::NEG_INFINITY, 29),
    ] {
        case(
            &format!("{name} in an embedding"),
            |d| {
                let mut values = vec![0.5; n * 4];
                values[row as usize * 4 + 1] = value;
                gallery_with(
                    d,
                    vec![("id", ids(n, "g")), ("embedding", fixed(values, 4))],
                );
            },
            default_run,
            input(
                "gallery.parquet",
                Some(row),
                Some("embedding"),
                "is not finite",
            ),
        );
    }
    case(
        "mixed dimensions in one list column",
        |d| {
            let mut lengths = vec![4usize; n];
            lengths[21] = 5;
            let total: usize = lengths.iter().sum();
            let list = ListArray::new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                OffsetBuffer::from_lengths(lengths),
                Arc::new(Float32Array::from(vec![0.5; total])),
                None,
            );
            gallery_with(d, vec![("id", ids(n, "g")), ("embedding", Arc::new(list))]);
        },
        default_run,
        input(
            "gallery.parquet",
            Some(21),
            Some("embedding"),
            "ragged embedding",
        ),
    );
    case(
        "dimension 0",
        |d| {
            // Size 0: the row count comes from the (all-valid) null buffer.
            let list = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                0,
                Arc::new(Float32Array::from(Vec::<f32>::new())),
                Some(NullBuffer::new_valid(n)),
            )
            .unwrap();
            gallery_with(d, vec![("id", ids(n, "g")), ("embedding", Arc::new(list))]);
        },
        default_run,
        input(
            "gallery.parquet",
            None,
            Some("embedding"),
            "embedding has dimension 0; supported dimensions are 1 to 65536",
        ),
    );
    case(
        "dimension 0 in a list column",
        |d| {
            let list = ListArray::new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                OffsetBuffer::new(ScalarBuffer::from(vec![0i32; n + 1])),
                Arc::new(Float32Array::from(Vec::<f32>::new())),
                None,
            );
            gallery_with(d, vec![("id", ids(n, "g")), ("embedding", Arc::new(list))]);
        },
        default_run,
        input(
            "gallery.parquet",
            Some(0),
            Some("embedding"),
            "embedding has dimension 0",
        ),
    );
    case(
        "a very large dimension",
        |d| {
            let dim = 100_000;
            gallery_with(
                d,
                vec![
                    ("id", ids(2, "g")),
                    ("embedding", fixed(vec![0.5; 2 * dim], dim as i32)),
                ],
            );
        },
        default_run,
        input(
            "gallery.parquet",
            None,
            Some("embedding"),
            "embedding has dimension 100000; supported dimensions are 1 to 65536",
        ),
    );
    case(
        "dimensions differ between tables",
        |d| {
            gallery_with(
                d,
                vec![
                    ("id", ids(n, "g")),
                    ("embedding", fixed(vec![0.5; n * 8], 8)),
                ],
            )
        },
        default_run,
        input("queries.parquet", None, Some("embedding"), "dimension"),
    );
}

#[test]
fn empty_inputs_and_bad_ids() {
    let n = GALLERY_ROWS;
    case(
        "empty table",
        |d| {
            write_columns(
                &d.join("bank.parquet"),
                vec![("id", ids(0, "b")), ("embedding", fixed(vec![], 4))],
            )
        },
        default_run,
        input("bank.parquet", None, None, "the bank table is empty"),
    );
    case(
        "empty directory",
        |d| std::fs::create_dir(d.join("empty")).unwrap(),
        |d| {
            let mut args = default_run(d);
            let i = args.iter().position(|a| a == "--bank").unwrap();
            args[i + 1] = d.join("empty").display().to_string();
            args
        },
        input("empty", None, None, "directory holds no .parquet files"),
    );
    case(
        "a glob that matches only a marker",
        |d| std::fs::write(d.join("_SUCCESS"), b"").unwrap(),
        |d| {
            let mut args = default_run(d);
            let i = args.iter().position(|a| a == "--bank").unwrap();
            args[i + 1] = format!("{}/*SUCCESS", d.display());
            args
        },
        input(
            "*SUCCESS",
            None,
            None,
            "no file matches this glob (names starting with `_` or `.` are skipped",
        ),
    );
    for (name, spec) in [
        ("a part of 0 bytes in a folder", ""),
        ("a part of 0 bytes matched by a glob", "/*.parquet"),
    ] {
        case(
            name,
            |d| {
                std::fs::create_dir(d.join("parts")).unwrap();
                std::fs::rename(d.join("bank.parquet"), d.join("parts/a.parquet")).unwrap();
                std::fs::write(d.join("parts/b.parquet"), b"").unwrap();
            },
            |d| {
                let mut args = default_run(d);
                let i = args.iter().position(|a| a == "--bank").unwrap();
                args[i + 1] = format!("{}{spec}", d.join("parts").display());
                args
            },
            input(
                "b.parquet",
                None,
                None,
                "is empty (0 bytes), not a Parquet file",
            ),
        );
    }
    case(
        "duplicate ids",
        |d| {
            let mut names: Vec<String> = (0..n).map(|i| format!("g{i}")).collect();
            names[33] = "g7".into();
            gallery_with(
                d,
                vec![
                    ("id", Arc::new(StringArray::from(names))),
                    ("embedding", fixed(vec![0.5; n * 4], 4)),
                ],
            );
        },
        default_run,
        input("gallery.parquet", Some(33), Some("id"), "duplicate id 'g7'"),
    );
    case(
        "null id",
        |d| {
            let names: Vec<Option<String>> =
                (0..n).map(|i| (i != 12).then(|| format!("g{i}"))).collect();
            gallery_with(
                d,
                vec![
                    ("id", Arc::new(StringArray::from(names))),
                    ("embedding", fixed(vec![0.5; n * 4], 4)),
                ],
            );
        },
        default_run,
        input("gallery.parquet", Some(12), Some("id"), "null id"),
    );
}

#[test]
fn bad_options() {
    let with = |extra: &'static [&'static str]| move |d: &Path| run_args(d, extra);
    let none = |_: &Path| {};
    case(
        "k = 0",
        none,
        with(&["--k", "0"]),
        usage("--k must be at least 1"),
    );
    case(
        "k larger than the gallery",
        none,
        with(&["--k", "41"]),
        usage("--k 41 is larger than the gallery (40 items"),
    );
    case(
        "unknown method",
        none,
        with(&["--method", "bogus"]),
        usage("unknown method 'bogus'"),
    );
    case(
        "beta = 0",
        none,
        with(&["--method", "is", "--beta", "0"]),
        usage("--beta must be a positive number"),
    );
    case(
        "beta < 0",
        none,
        with(&["--method", "is", "--beta=-2"]),
        usage("--beta must be a positive number"),
    );
    case(
        "tau = 0",
        none,
        with(&["--method", "sn", "--tau", "0"]),
        usage("--tau must be a positive number"),
    );
    case(
        "tau < 0",
        none,
        with(&["--method", "sn", "--tau=-0.1"]),
        usage("--tau must be a positive number"),
    );
    case(
        "alpha < 0",
        none,
        with(&["--method", "nnn", "--alpha=-0.5"]),
        usage("--alpha must be a non-negative number"),
    );
    case(
        "a tuning grid of more than 10 000 points",
        none,
        |d| {
            let p = |n: &str| d.join(n).display().to_string();
            let betas: Vec<String> = (1..=10_001).map(|b| b.to_string()).collect();
            let grid = format!("beta={}", betas.join(","));
            [
                "tune",
                "--gallery",
                &p("gallery.parquet"),
                "--bank",
                &p("bank.parquet"),
                "--validation",
                &p("queries.parquet"),
                "--methods",
                "is",
                "--grid",
                &grid,
                "--out",
                &p("tuned"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        },
        usage("the grid of is has more than 10000 points (10001 beta)"),
    );
    case(
        "NNN k larger than the bank",
        none,
        with(&["--method", "nnn", "--nnn-k", "31"]),
        usage("--nnn-k 31 is larger than the bank (30 rows)"),
    );
    // Not a multiply overflow deep in pass 1, nor a memory estimate of
    // terabytes.
    case(
        "DIS k_A larger than the gallery",
        none,
        with(&["--method", "dis", "--activation-k", "100000000000000000000"]),
        usage("--activation-k 100000000000000000000 is larger than the gallery (40 rows)"),
    );
    case(
        "a checkpoint interval beyond any duration",
        none,
        with(&["--method", "is", "--checkpoint-interval", "1e300"]),
        usage("--checkpoint-interval 1e300 is too large a number of seconds"),
    );
}

#[test]
fn outputs_that_would_clobber_inputs_or_results() {
    let none = |_: &Path| {};
    // The gallery as a folder of parts, and the output inside it.
    let into_folder = |d: &Path| {
        std::fs::create_dir(d.join("gallery")).unwrap();
        std::fs::rename(
            d.join("gallery.parquet"),
            d.join("gallery").join("part-0.parquet"),
        )
        .unwrap();
    };
    case(
        "run output inside an input folder",
        into_folder,
        |d| {
            let mut args = default_run(d);
            let gallery = args.iter().position(|a| a == "--gallery").unwrap();
            args[gallery + 1] = d.join("gallery").display().to_string();
            let out = args.iter().position(|a| a == "--out").unwrap();
            args[out + 1] = d.join("gallery").join("out").display().to_string();
            args
        },
        usage("is inside the gallery input"),
    );
    case(
        "stats written over its own bank, even with --overwrite",
        none,
        |d| {
            let p = |n: &str| d.join(n).display().to_string();
            [
                "stats",
                "--gallery",
                &p("gallery.parquet"),
                "--bank",
                &p("bank.parquet"),
                "--out",
                &p("bank.parquet"),
                "--overwrite",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        },
        usage("is inside the bank input"),
    );
    case(
        "search results matching the gallery glob",
        none,
        |d| {
            let p = |n: &str| d.join(n).display().to_string();
            [
                "search",
                "--queries",
                &p("queries.parquet"),
                "--gallery",
                &p("gal*.parquet"),
                "--method",
                "none",
                "--out",
                &p("gallery_results.parquet"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        },
        usage("is inside the gallery input"),
    );
    case(
        "an output that exists, without --overwrite",
        |d| {
            std::fs::create_dir(d.join("out")).unwrap();
            std::fs::write(d.join("out").join("summary.json"), b"{\"precious\": true}").unwrap();
        },
        default_run,
        usage("already exists (pass --overwrite to replace it)"),
    );
}

#[test]
fn odd_but_valid_ids_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let mut r = rng(5);
    let mut gallery = random_table(&mut r, "g", GALLERY_ROWS, DIM as usize);
    // Control characters, a NUL, quotes, separators, right-to-left text,
    // emoji, and a 100 000-character id.
    let odd = [
        "tab\tnew\nline".to_string(),
        "nul\0byte".to_string(),
        "quote\"'`,;".to_string(),
        "עברית ← rtl".to_string(),
        "🦀 emoji".to_string(),
        "x".repeat(100_000),
        String::new() + " ",
    ];
    for (i, id) in odd.iter().enumerate() {
        gallery.ids[i] = id.clone();
    }
    let mut queries = queries_near(&mut r, &gallery, 20, 0.05);
    queries.targets = Some(
        (0..20)
            .map(|i| gallery.ids[i % odd.len()].clone())
            .collect(),
    );
    for i in 0..20 {
        let row = gallery.row(i % odd.len()).to_vec();
        queries.data[i * DIM as usize..(i + 1) * DIM as usize].copy_from_slice(&row);
    }
    write_table(
        &dir.path().join("gallery.parquet"),
        &gallery,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.path().join("queries.parquet"),
        &queries,
        Layout::FixedF32,
        false,
    );
    hubnorm(run_args(dir.path(), &["--method", "none", "--k", "1"]))
        .output()
        .assert_success();
    let results = read_results(&dir.path().join("out").join("results.parquet"));
    // Each query is its target's own vector: the top-1 is that odd id, byte for byte.
    for (i, row) in results.iter().enumerate() {
        assert_eq!(row.gallery_id, odd[i % odd.len()], "query {i}");
    }
}
