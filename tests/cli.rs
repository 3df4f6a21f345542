//! End-to-end tests of the `hubnorm` binary on the project's own sample data.
mod common;

use std::path::PathBuf;

use common::*;

fn samples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data-samples")
}

/// The README's main command, on data-samples/: every method in one run, all
/// three outputs with the documented schemas, and a summary where inverted
/// softmax reduces hubness.
#[test]
fn run_on_samples_writes_documented_outputs() {
    let out = tempfile::tempdir().unwrap();
    let s = |n: &str| samples().join(n).display().to_string();
    let dir = out.path().join("run");
    let result = hubnorm([
        "run",
        "--queries",
        &s("queries.parquet"),
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--gallery-bank",
        &s("gallery_bank.parquet"),
        "--methods",
        "is,dis,nnn,csls,gc,dn,dual-is,dual-dis",
        "--out",
        &dir.display().to_string(),
    ])
    .output();
    let stdout = result.stdout();
    result.assert_success();
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
    let stats_schema = schema_of("gallery_stats.parquet");
    assert_eq!(
        stats_schema[..4],
        [
            "gallery_id:Utf8",
            "is_beta20_correction:Float64",
            "is_beta20_lse_max:Float64",
            "is_beta20_lse_sum:Float64"
        ]
    );
    for column in [
        "nnn_alpha0.75_k128_correction:Float64",
        "gc_sorted_sims:List(non-null Float32)",
        "dis_beta20_ka1_active:Boolean",
        "dual_dis_beta1_20_beta2_1_ka1_gallery_active:Boolean",
    ] {
        assert!(
            stats_schema.iter().any(|c| c == column),
            "{column} missing from {stats_schema:?}"
        );
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let methods = summary["methods"].as_array().unwrap();
    let names: Vec<&str> = methods
        .iter()
        .map(|m| m["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["none", "is", "dis", "nnn", "csls", "gc", "dn", "dual-is", "dual-dis"]
    );
    for key in ["k_occurrence_skewness", "R@1", "R@5", "R@10", "MRR"] {
        assert!(methods[1][key].is_number(), "summary has {key}");
    }
    assert!(
        methods[1]["k_occurrence_skewness"].as_f64() < methods[0]["k_occurrence_skewness"].as_f64()
    );
    // Every query has k = 10 results under each method.
    assert_eq!(
        read_results(&dir.join("results.parquet")).len(),
        600 * 9 * 10
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
    let r = hubnorm([
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
    ])
    .output();
    r.assert_success();
    // Without --beta, search takes the statistic the stats file holds (β = 30).
    let r = hubnorm([
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
    ])
    .output();
    r.assert_success();
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

/// Method flags reach the statistics; a method that needs a gallery bank
/// and `gc` beyond the memory limit are refused with exit code 2 and a
/// message saying what to do; `--bank-sample` makes `gc` fit.
#[test]
fn method_flags_gallery_bank_and_bank_sample() {
    let out = tempfile::tempdir().unwrap();
    let s = |n: &str| samples().join(n).display().to_string();
    let stats = out.path().join("stats.parquet");
    let stats_arg = stats.display().to_string();
    let common = [
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--quiet",
    ];
    let stats_with = |extra: &[&str]| {
        let mut args = vec!["stats"];
        args.extend(common);
        args.extend(extra);
        args.extend(["--out", &stats_arg, "--overwrite"]);
        hubnorm(&args).output()
    };
    let r = stats_with(&[
        "--methods",
        "nnn,csls",
        "--alpha",
        "0.5",
        "--nnn-k",
        "16",
        "--csls-k",
        "4",
    ]);
    r.assert_success();
    let names: Vec<String> = {
        let f = std::fs::File::open(&stats).unwrap();
        let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
        b.schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    };
    assert_eq!(
        names,
        [
            "gallery_id",
            "nnn_alpha0.5_k16_correction",
            "nnn_alpha0.5_k16_topk",
            "csls_k4_correction",
            "csls_k4_topk"
        ]
    );
    let before = std::fs::read(&stats).unwrap();
    let r = stats_with(&["--method", "dual-is"]);
    assert_eq!(r.code(), Some(2));
    assert!(r.stderr().contains("--gallery-bank"));
    let r = stats_with(&["--method", "nnn", "--nnn-k", "5000"]);
    assert_eq!(r.code(), Some(2));
    assert!(r.stderr().contains("larger than the bank"));
    // gc: 1000 bank × 600 gallery × 4 bytes = 2.3 MiB, more than half of 4 MiB.
    let r = stats_with(&["--method", "gc", "--memory-limit", "4MiB"]);
    assert_eq!(r.code(), Some(2));
    let err = r.stderr();
    assert!(
        err.contains("2.3 MiB") && err.contains("--bank-sample"),
        "{err}"
    );
    // Refused jobs leave the earlier output (even with --overwrite) untouched.
    assert_eq!(std::fs::read(&stats).unwrap(), before);
    let r = stats_with(&[
        "--method",
        "gc",
        "--memory-limit",
        "40MiB",
        "--bank-sample",
        "300",
        "--seed",
        "7",
    ]);
    r.assert_success();
    let meta = parquet_metadata(&stats);
    let get = |k: &str| {
        meta.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("hubnorm.bank.rows").as_deref(), Some("300"));
    assert_eq!(get("hubnorm.bank_sample.seed").as_deref(), Some("7"));
}

/// A `file://` URL names the local path: `run` (checkpointed, as by
/// default) and `stats` write there the files a plain path gets, and
/// nothing lands under a `file:` folder of the working directory.
#[test]
fn file_urls_are_local_paths() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = |n: &str| samples().join(n).display().to_string();
    let inputs = |command: &str| {
        let mut args = vec![command.to_owned()];
        if command == "run" {
            args.extend(["--queries".into(), s("queries.parquet")]);
        }
        args.extend([
            "--gallery".into(),
            s("gallery.parquet"),
            "--bank".into(),
            s("bank.parquet"),
            "--methods".into(),
            "is,nnn".into(),
            "--quiet".into(),
            "--out".into(),
        ]);
        args
    };
    for (command, name) in [("run", "run"), ("stats", "stats.parquet")] {
        let plain = d.join(format!("plain-{name}"));
        let url = d.join(format!("url-{name}"));
        let mut args = inputs(command);
        args.push(plain.display().to_string());
        hubnorm(&args).current_dir(d).output().assert_success();
        let mut args = inputs(command);
        args.push(format!("file://{}", url.display()));
        hubnorm(&args).current_dir(d).output().assert_success();
        // The same files (their metadata records the paths, so not bytes).
        let names = |path: &std::path::Path| -> Vec<String> {
            if path.is_file() {
                return vec![String::new()];
            }
            let mut names: Vec<_> = std::fs::read_dir(path)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert!(plain.exists() && url.exists(), "{command}");
        assert_eq!(names(&plain), names(&url), "{command}");
        assert!(!d.join("file:").exists(), "{command} wrote under ./file:");
        assert!(!url.with_extension("parquet.checkpoint").exists());
    }
}

/// A search asking for a statistic the stats file lacks names the ones it
/// holds with the flags that choose them.
#[test]
fn a_missing_statistic_names_the_flags_of_those_stored() {
    let dir = tempfile::tempdir().unwrap();
    let s = |n: &str| samples().join(n).display().to_string();
    let (queries, gallery) = (s("queries.parquet"), s("gallery.parquet"));
    let stats = dir.path().join("stats.parquet").display().to_string();
    hubnorm([
        "stats",
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--method",
        "is",
        "--beta",
        "30",
        "--quiet",
        "--out",
        &stats,
    ])
    .output()
    .assert_success();
    let search = |extra: &[&str]| {
        let results = dir.path().join("results.parquet").display().to_string();
        let mut args = vec![
            "search",
            "--queries",
            &queries,
            "--gallery",
            &gallery,
            "--stats",
            &stats,
            "--method",
            "is",
            "--quiet",
            "--overwrite",
            "--out",
            &results,
        ];
        args.extend_from_slice(extra);
        hubnorm(&args).output()
    };
    let refused = search(&["--beta", "20"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains("it has: is_beta30 (--method is --beta 30)"),
        "{}",
        refused.stderr()
    );
    search(&["--beta", "30"]).assert_success();
    // A flag of a method the search does not compute is refused, as in `run`.
    let refused = search(&["--beta", "30", "--csls-k", "5"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains("--csls-k is a parameter of csls, none of which is among the methods (is)"),
        "{}",
        refused.stderr()
    );
}

/// A parameter flag that none of the named methods has is refused, naming
/// the methods that have it; one that some named method has is taken.
#[test]
fn a_flag_no_method_uses_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = |n: &str| samples().join(n).display().to_string();
    let (gallery, bank) = (s("gallery.parquet"), s("bank.parquet"));
    let stats = |extra: &[&str]| {
        let out = dir.path().join("stats.parquet").display().to_string();
        let mut args = vec![
            "stats",
            "--gallery",
            &gallery,
            "--bank",
            &bank,
            "--quiet",
            "--overwrite",
            "--out",
            &out,
        ];
        args.extend_from_slice(extra);
        hubnorm(&args).output()
    };
    let refused = stats(&["--method", "is", "--nnn-k", "5"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains("--nnn-k is a parameter of nnn, none of which is among the methods (is)"),
        "{}",
        refused.stderr()
    );
    stats(&["--methods", "is,nnn", "--nnn-k", "5"]).assert_success();
    // The default method is a method too.
    let refused = stats(&["--nnn-k", "5"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused.stderr().contains("among the methods (is)"),
        "{}",
        refused.stderr()
    );
    // So is the Sinkhorn tolerance, which only the iterating methods read,
    // and which must be a positive relative error.
    let refused = stats(&["--method", "is", "--tol", "0.01"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused.stderr().contains(
            "--tol stops the iterations of sn and dbsn, none of which is among the methods (is)"
        ),
        "{}",
        refused.stderr()
    );
    for bad in ["nan", "0", "-1"] {
        let refused = stats(&["--method", "sn", &format!("--tol={bad}")]);
        assert_eq!(refused.code(), Some(2), "{bad}: {}", refused.stderr());
        assert!(
            refused.stderr().contains("must be a positive number"),
            "{}",
            refused.stderr()
        );
    }
    stats(&["--methods", "is,sn", "--tol", "0.01"]).assert_success();
    // A search reads finished statistics: --tol has nothing to stop.
    let stats_file = dir.path().join("stats.parquet").display().to_string();
    let out = dir.path().join("results.parquet").display().to_string();
    let queries = s("queries.parquet");
    let refused = hubnorm([
        "search",
        "--queries",
        &queries,
        "--gallery",
        &gallery,
        "--stats",
        &stats_file,
        "--tol",
        "0.01",
        "--out",
        &out,
    ])
    .output();
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains("this command reads finished statistics"),
        "{}",
        refused.stderr()
    );
    // compare without methods runs each at its defaults: a parameter is refused.
    let refused = hubnorm([
        "compare",
        "--queries",
        &queries,
        "--gallery",
        &gallery,
        "--bank",
        &bank,
        "--beta",
        "30",
        "--out",
        &dir.path().join("compare").display().to_string(),
    ])
    .output();
    assert_eq!(refused.code(), Some(2), "{}", refused.stderr());
    assert!(
        refused
            .stderr()
            .contains("name the methods whose parameters you set"),
        "{}",
        refused.stderr()
    );
    assert!(!dir.path().join("compare").exists());
}

/// Common slips get a usage error (exit 2) that says what to write: a file
/// output named as a folder, and a run given neither a bank nor
/// `--transductive`.
#[test]
fn common_slips_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = |n: &str| samples().join(n).display().to_string();
    let folder = format!("{}/", dir.path().join("newdir").display());
    let slash = hubnorm([
        "stats",
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--out",
        &folder,
    ])
    .output();
    assert_eq!(slash.code(), Some(2), "{}", slash.stderr());
    assert!(
        slash.stderr().contains("ends in '/', naming a folder"),
        "{}",
        slash.stderr()
    );
    assert!(!dir.path().join("newdir").exists());

    let bankless = hubnorm([
        "run",
        "--queries",
        &s("queries.parquet"),
        "--gallery",
        &s("gallery.parquet"),
        "--out",
        &dir.path().join("run").display().to_string(),
    ])
    .output();
    assert_eq!(bankless.code(), Some(2), "{}", bankless.stderr());
    assert!(
        bankless.stderr().contains("<--bank <BANK>|--transductive>"),
        "{}",
        bankless.stderr()
    );
}
