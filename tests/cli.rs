//! End-to-end tests of the `hubnorm` binary on the project's own sample data.
mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

fn samples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data-samples")
}

fn hubnorm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hubnorm"))
        .args(args)
        .output()
        .unwrap()
}

/// The README's main command, on data-samples/: all three outputs, with the
/// documented schemas, and a summary where inverted softmax reduces hubness.
#[test]
fn run_on_samples_writes_documented_outputs() {
    let out = tempfile::tempdir().unwrap();
    let s = |n: &str| samples().join(n).display().to_string();
    let dir = out.path().join("run");
    let result = hubnorm(&[
        "run",
        "--queries",
        &s("queries.parquet"),
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--method",
        "is",
        "--beta",
        "20",
        "--out",
        &dir.display().to_string(),
    ]);
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(
        stdout.contains("skew(N10)") && stdout.contains("R@1"),
        "printed summary: {stdout}"
    );
    // Output schemas are part of the interface.
    let schema_of = |name: &str| {
        let f = std::fs::File::open(dir.join(name)).unwrap();
        let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
        b.schema()
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        schema_of("results.parquet"),
        [
            "method:Utf8",
            "query_id:Utf8",
            "rank:Int32",
            "gallery_id:Utf8",
            "score:Float32",
            "raw_score:Float32"
        ]
    );
    assert_eq!(
        schema_of("gallery_stats.parquet"),
        [
            "gallery_id:Utf8",
            "is_beta20_correction:Float64",
            "is_beta20_lse_max:Float64",
            "is_beta20_lse_sum:Float64"
        ]
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let methods = summary["methods"].as_array().unwrap();
    assert_eq!(methods[0]["method"], "none");
    assert_eq!(methods[1]["method"], "is");
    for key in ["k_occurrence_skewness", "R@1", "R@5", "R@10", "MRR"] {
        assert!(methods[1][key].is_number(), "summary has {key}");
    }
    assert!(
        methods[1]["k_occurrence_skewness"].as_f64() < methods[0]["k_occurrence_skewness"].as_f64()
    );
    // Every query has k = 10 results under each method.
    assert_eq!(
        read_results(&dir.join("results.parquet")).len(),
        600 * 2 * 10
    );
    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn stats_and_search_commands_compose() {
    let out = tempfile::tempdir().unwrap();
    let s = |n: &str| samples().join(n).display().to_string();
    let stats = out.path().join("stats.parquet").display().to_string();
    let results = out.path().join("results.parquet").display().to_string();
    let r = hubnorm(&[
        "stats",
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--beta",
        "30",
        "--out",
        &stats,
        "--quiet",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    // Without --beta, search takes the statistic the stats file holds (β = 30).
    let r = hubnorm(&[
        "search",
        "--queries",
        &s("queries.parquet"),
        "--gallery",
        &s("gallery.parquet"),
        "--stats",
        &stats,
        "--k",
        "5",
        "--out",
        &results,
        "--quiet",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let rows = read_results(std::path::Path::new(&results));
    assert_eq!(rows.len(), 600 * 5);
    assert!(rows
        .iter()
        .all(|r| r.method == "is" && r.score < r.raw_score));
    let meta = parquet_metadata(std::path::Path::new(&results));
    assert!(
        meta.iter()
            .any(|(k, v)| k == "hubnorm.methods" && v.contains("\"beta\":30.0")),
        "{meta:?}"
    );
}
