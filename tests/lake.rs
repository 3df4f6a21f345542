//! Data-lake workflows: `stats --update` merging new Parquet parts, and
//! `export` to inner-product indexes.

mod common;

use std::collections::HashMap;
use std::path::Path;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type};
use common::{
    hubnorm, parquet_metadata, random_table, read_parquet, read_results, rng, write_table, Layout,
    Table,
};
use hubnorm::export::{export, ExportJob};
use hubnorm::ids::IdIndex;
use hubnorm::method::Export;
use hubnorm::options::MethodKind;
use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions};
use hubnorm::pipeline::{run_search, run_stats, SearchJob, StatsJob};
use hubnorm::progress::Silent;
use hubnorm::query::{load_plan, QueryTerm};
use hubnorm::source::EmbeddingTable;
use hubnorm::update::{is_mergeable, update_stats};

fn stats_job(dir: &Path, methods: &[MethodSpec], out: &Path) -> StatsJob {
    StatsJob {
        gallery: dir.join("gallery").display().to_string(),
        bank: dir.join("bank").display().to_string(),
        gallery_bank: None,
        bank_sample: None,
        methods: methods.to_vec(),
        out: out.to_path_buf(),
        overwrite: true,
        options: PassOptions {
            // Small enough that the passes stream the gallery in chunks.
            memory: MemoryBudget(24 << 20),
            ..PassOptions::default()
        },
        checkpoint: Default::default(),
    }
}

/// Every column of two stats files agrees: ids, lists and flags exactly;
/// floats to 1e-6 relative. The log-sum-exp terms are f32 exps relative to
/// each block's own maximum (≤ 3e-7 relative each), and new parts cut the
/// bank into other blocks than one pass does (as tests/parity.rs's
/// partition test measures), so they agree to ~1e-7, not bitwise.
fn assert_same_stats(updated: &RecordBatch, full: &RecordBatch, context: &str) {
    assert_eq!(
        updated.schema().fields(),
        full.schema().fields(),
        "{context}: schema"
    );
    assert_eq!(updated.num_rows(), full.num_rows(), "{context}: rows");
    for (field, (a, b)) in full
        .schema()
        .fields()
        .iter()
        .zip(updated.columns().iter().zip(full.columns()))
    {
        match field.data_type() {
            DataType::Float64 => {
                let (a, b) = (
                    a.as_primitive::<Float64Type>(),
                    b.as_primitive::<Float64Type>(),
                );
                for i in 0..a.len() {
                    let (x, y) = (a.value(i), b.value(i));
                    assert!(
                        (x - y).abs() <= 1e-6 * y.abs().max(1.0),
                        "{context}: {} row {i}: updated {x} vs full {y}",
                        field.name()
                    );
                }
            }
            _ => assert_eq!(a, b, "{context}: column {}", field.name()),
        }
    }
}

/// The hubnorm metadata keys of a Parquet file, sorted.
fn hubnorm_keys(path: &Path) -> Vec<String> {
    let mut keys: Vec<String> = parquet_metadata(path)
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("hubnorm."))
        .collect();
    keys.sort();
    keys
}

fn write_part(dir: &Path, name: &str, table: &Table) {
    std::fs::create_dir_all(dir).unwrap();
    write_table(&dir.join(name), table, Layout::FixedF32, false);
}

/// New bank parts and new gallery parts merged by `--update` give what a
/// full recomputation gives, for every mergeable method (and the others,
/// which are recomputed); nothing new leaves the file untouched; a changed
/// or removed part is refused and the stored file kept.
#[test]
fn update_then_finish_equals_a_full_recomputation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = rng(71);
    let gallery = random_table(&mut r, "g", 130, 12);
    let bank = random_table(&mut r, "b", 290, 12);
    let methods = vec![
        MethodSpec::new("is", &[("beta", 20.0)]).unwrap(),
        MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 9.0)]).unwrap(),
        MethodSpec::new("csls", &[("k", 4.0)]).unwrap(),
        MethodSpec::new("gc", &[]).unwrap(),
        MethodSpec::new("dsl", &[("theta", 0.05)]).unwrap(),
        MethodSpec::new("mp", &[]).unwrap(),
        MethodSpec::new("ls", &[("k", 4.0)]).unwrap(),
        MethodSpec::new("nicdm", &[("k", 6.0)]).unwrap(),
        MethodSpec::new("dissim-local", &[("k", 3.0)]).unwrap(),
        MethodSpec::new("dis", &[("beta", 20.0), ("ka", 1.0)]).unwrap(),
        MethodSpec::new("sn", &[("tau", 0.05), ("t", 5.0)]).unwrap(),
    ];
    let mergeable = methods.len() - 2;
    assert!(methods[..mergeable].iter().all(|m| is_mergeable(m.kind())));
    assert!(methods[mergeable..].iter().all(|m| !is_mergeable(m.kind())));
    let stored = d.join("out/gallery_stats.parquet");
    let full = d.join("full.parquet");

    write_part(&d.join("gallery"), "part-0.parquet", &gallery.slice(0, 80));
    write_part(&d.join("bank"), "part-0.parquet", &bank.slice(0, 150));
    run_stats(&stats_job(d, &methods, &stored), &Silent).unwrap();

    // New bank rows and new gallery items arrive together.
    write_part(&d.join("bank"), "part-1.parquet", &bank.slice(150, 230));
    write_part(
        &d.join("gallery"),
        "part-1.parquet",
        &gallery.slice(80, 130),
    );
    let summary = update_stats(&stats_job(d, &[], &stored), &Silent).unwrap();
    assert_eq!((summary.new_bank_parts, summary.new_gallery_parts), (1, 1));
    assert_eq!(summary.new_gallery_rows, 50);
    assert_eq!(summary.merged.len(), mergeable);
    assert_eq!(summary.recomputed.len(), 2);
    run_stats(&stats_job(d, &methods, &full), &Silent).unwrap();
    assert_same_stats(
        &read_parquet(&stored),
        &read_parquet(&full),
        "bank + gallery",
    );
    // Whatever a method records in the metadata (its moments, its
    // iterations' report) is there after the update as after a full pass.
    assert_eq!(hubnorm_keys(&stored), hubnorm_keys(&full));
    // mp's gallery-side moments are of the grown gallery.
    let moments = |path: &Path| {
        let text = parquet_metadata(path)
            .into_iter()
            .find(|(k, _)| k == "hubnorm.mp.query_side_moments")
            .expect("mp's moments in the metadata")
            .1;
        hubnorm::bank::Moments::from_metadata(&text).unwrap()
    };
    let (updated, whole) = (moments(&stored), moments(&full));
    assert_eq!(updated.rows, 130);
    assert_eq!(updated, whole);

    // Only new bank rows.
    write_part(&d.join("bank"), "part-2.parquet", &bank.slice(230, 260));
    update_stats(&stats_job(d, &[], &stored), &Silent).unwrap();
    run_stats(&stats_job(d, &methods, &full), &Silent).unwrap();
    assert_same_stats(&read_parquet(&stored), &read_parquet(&full), "bank only");

    // A new bank part listed before the counted ones: their rows move up,
    // and the stored neighbour rows (dissim-local) are renumbered.
    write_part(&d.join("bank"), "a-first.parquet", &bank.slice(260, 290));
    update_stats(&stats_job(d, &[], &stored), &Silent).unwrap();
    run_stats(&stats_job(d, &methods, &full), &Silent).unwrap();
    assert_same_stats(
        &read_parquet(&stored),
        &read_parquet(&full),
        "a part listed first",
    );

    // Nothing new: the file is not rewritten.
    let before = std::fs::read(&stored).unwrap();
    let summary = update_stats(&stats_job(d, &[], &stored), &Silent).unwrap();
    assert_eq!((summary.new_bank_parts, summary.new_gallery_parts), (0, 0));
    assert_eq!(std::fs::read(&stored).unwrap(), before);

    // A counted part gone, or changed: refused, and the stored file is kept.
    std::fs::remove_file(d.join("bank/part-2.parquet")).unwrap();
    let err = update_stats(&stats_job(d, &[], &stored), &Silent).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().contains("part-2.parquet") && err.to_string().contains("gone"),
        "{err}"
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_part(&d.join("bank"), "part-2.parquet", &bank.slice(230, 259));
    let err = update_stats(&stats_job(d, &[], &stored), &Silent).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().contains("part-2.parquet") && err.to_string().contains("changed"),
        "{err}"
    );
    assert_eq!(std::fs::read(&stored).unwrap(), before);
    let leftovers: Vec<_> = std::fs::read_dir(d.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "gallery_stats.parquet")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Every method with a gallery statistic, at its defaults and with a
/// gallery bank (so `dn`, the dual methods and `dbsn` are among them):
/// new bank and gallery parts merged by `--update` (or recomputed) give the
/// columns and the metadata keys of a full recomputation. The registry
/// names the methods, so a new one is covered without an edit.
#[test]
fn update_of_every_method_equals_a_full_recomputation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = rng(73);
    let gallery = random_table(&mut r, "g", 120, 10);
    // Above every default count (nnn's k = 128) in the first part alone.
    let bank = random_table(&mut r, "b", 200, 10);
    let gallery_bank = random_table(&mut r, "c", 90, 10);
    let methods: Vec<MethodSpec> = MethodKind::all()
        .filter(|k| k.method().has_statistics())
        .map(MethodSpec::default_for)
        .collect();
    let job = |methods: &[MethodSpec], out: &Path| {
        let mut job = StatsJob {
            gallery_bank: Some(d.join("gallery_bank").display().to_string()),
            ..stats_job(d, methods, out)
        };
        // Every method's statistics at once need more than the other tests'.
        job.options.memory = MemoryBudget(64 << 20);
        job
    };
    let stored = d.join("out/gallery_stats.parquet");
    let full = d.join("full.parquet");
    write_part(&d.join("gallery"), "part-0.parquet", &gallery.slice(0, 70));
    write_part(&d.join("bank"), "part-0.parquet", &bank.slice(0, 150));
    write_part(&d.join("gallery_bank"), "part-0.parquet", &gallery_bank);
    run_stats(&job(&methods, &stored), &Silent).unwrap();

    write_part(&d.join("bank"), "part-1.parquet", &bank.slice(150, 200));
    write_part(
        &d.join("gallery"),
        "part-1.parquet",
        &gallery.slice(70, 120),
    );
    let summary = update_stats(&job(&[], &stored), &Silent).unwrap();
    let mergeable = methods.iter().filter(|m| is_mergeable(m.kind())).count();
    assert_eq!(
        (summary.merged.len(), summary.recomputed.len()),
        (mergeable, methods.len() - mergeable)
    );
    run_stats(&job(&methods, &full), &Silent).unwrap();
    assert_same_stats(&read_parquet(&stored), &read_parquet(&full), "every method");
    assert_eq!(hubnorm_keys(&stored), hubnorm_keys(&full));
}

fn unit(v: &[f32]) -> Vec<f64> {
    let n = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|&x| x as f64 / n).collect()
}

/// A plain inner-product top-k over the exported (d + 1)-vectors, with −1
/// appended to each normalised query, reproduces `hubnorm search` for every
/// method the registry calls exportable, at its defaults: the same lists
/// (but at near-ties), and the same scores up to the query-only term of
/// the methods whose plan has one (CSLS, DN). Gated methods are refused.
#[test]
fn export_reproduces_search_with_a_plain_inner_product() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = rng(72);
    let gallery = random_table(&mut r, "g", 150, 10);
    let queries = random_table(&mut r, "q", 40, 10);
    // Above every default count (nnn's k = 128), so every method runs at its defaults.
    let bank = random_table(&mut r, "b", 200, 10);
    let gallery_bank = random_table(&mut r, "c", 90, 10);
    for (name, table) in [
        ("gallery.parquet", &gallery),
        ("queries.parquet", &queries),
        ("bank.parquet", &bank),
        ("gallery_bank.parquet", &gallery_bank),
    ] {
        write_table(&d.join(name), table, Layout::FixedF32, false);
    }
    let s = |n: &str| d.join(n).display().to_string();
    let methods: Vec<MethodSpec> = MethodKind::all()
        .filter(|k| matches!(k.method().export(), Export::Additive))
        .map(MethodSpec::default_for)
        .collect();
    assert!(methods.len() >= 8, "{methods:?}");
    let dis = MethodSpec::new("dis", &[("beta", 20.0), ("ka", 1.0)]).unwrap();
    let stats = d.join("stats.parquet");
    run_stats(
        &StatsJob {
            gallery: s("gallery.parquet"),
            bank: s("bank.parquet"),
            gallery_bank: Some(s("gallery_bank.parquet")),
            bank_sample: None,
            methods: methods.iter().copied().chain([dis]).collect(),
            out: stats.clone(),
            overwrite: false,
            options: PassOptions::default(),
            checkpoint: Default::default(),
        },
        &Silent,
    )
    .unwrap();
    run_search(
        &SearchJob {
            queries: s("queries.parquet"),
            gallery: s("gallery.parquet"),
            stats: Some(stats.clone()),
            methods: methods.clone(),
            k: 10,
            out: d.join("results.parquet"),
            overwrite: false,
            options: PassOptions::default(),
        },
        &Silent,
    )
    .unwrap();
    let results = read_results(&d.join("results.parquet"));
    let gallery_table =
        EmbeddingTable::open("gallery", &s("gallery.parquet"), &Default::default(), false).unwrap();
    let index = IdIndex::build(&gallery_table).unwrap();
    let gallery_row: HashMap<&str, usize> = gallery
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    for method in &methods {
        let name = method.kind().name();
        let has_query_term = load_plan(Some(&stats), &index, &[*method], true)
            .unwrap()
            .methods[0]
            .query_term
            != QueryTerm::None;
        let out = d.join(format!("export-{name}.parquet"));
        let summary = export(
            &ExportJob {
                gallery: s("gallery.parquet"),
                stats: stats.clone(),
                method: *method,
                out: out.clone(),
                overwrite: false,
                options: PassOptions::default(),
            },
            &Silent,
        )
        .unwrap();
        assert_eq!((summary.rows, summary.dim), (150, 11));
        let exported = read_parquet(&out);
        let ids = exported.column(0).as_string::<i32>();
        let vectors = exported.column(1).as_fixed_size_list();
        assert_eq!(vectors.value_length(), 11);
        let flat = vectors.values().as_primitive::<Float32Type>().values();
        for q in 0..queries.rows() {
            let mut query = unit(queries.row(q));
            query.push(-1.0);
            // The index's scores, by gallery row.
            let mut scores = vec![0.0; 150];
            for i in 0..150 {
                let v = &flat[i * 11..(i + 1) * 11];
                scores[gallery_row[ids.value(i)]] = v
                    .iter()
                    .zip(&query)
                    .map(|(&a, b)| a as f64 * b)
                    .sum::<f64>();
            }
            let ours: Vec<(usize, f32)> = results
                .iter()
                .filter(|row| row.method == name && row.query_id == queries.ids[q])
                .map(|row| (gallery_row[row.gallery_id.as_str()], row.score))
                .collect();
            // Some methods also subtract a term of the query alone.
            let offset = scores[ours[0].0] - ours[0].1 as f64;
            if !has_query_term {
                assert!(offset.abs() < 1e-5, "{name}: offset {offset}");
            }
            let shifted: Vec<(usize, f32)> = ours
                .iter()
                .map(|&(g, score)| (g, (score as f64 + offset) as f32))
                .collect();
            common::assert_ranking_matches(
                &shifted,
                &scores,
                10,
                1e-5,
                &format!("{name} query {q}"),
            );
        }
    }
    // DIS gates on the query's top-1: no single vector reproduces it.
    let err = export(
        &ExportJob {
            gallery: s("gallery.parquet"),
            stats: stats.clone(),
            method: dis,
            out: d.join("dis.parquet"),
            overwrite: false,
            options: PassOptions::default(),
        },
        &Silent,
    )
    .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("does not rank by"), "{err}");
    assert!(!d.join("dis.parquet").exists());
    // The toolkit methods that are not additive say why.
    for (name, reason) in [
        ("mp", "log-probability"),
        ("ls", "per-item scale"),
        ("nicdm", "per-item scale"),
    ] {
        let err = export(
            &ExportJob {
                gallery: s("gallery.parquet"),
                stats: stats.clone(),
                method: MethodSpec::new(name, &[]).unwrap(),
                out: d.join("refused.parquet"),
                overwrite: false,
                options: PassOptions::default(),
            },
            &Silent,
        )
        .unwrap_err();
        assert_eq!(err.exit_code(), 2, "{name}");
        assert!(err.to_string().contains(reason), "{name}: {err}");
        assert!(!d.join("refused.parquet").exists());
    }
}

/// The commands: `export` on the sample data writes 600 vectors of 385
/// values; `stats --update` with nothing new says so, and refuses method
/// flags (its methods are the stored file's).
#[test]
fn export_and_update_commands_on_the_samples() {
    let dir = tempfile::tempdir().unwrap();
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples");
    let s = |n: &str| samples.join(n).display().to_string();
    let stats = dir.path().join("stats.parquet");
    let stats_s = stats.display().to_string();
    let out = hubnorm([
        "stats",
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--methods",
        "is,nnn",
        "--quiet",
        "--out",
        &stats_s,
    ])
    .output();
    out.assert_success();
    let export_path = dir.path().join("gallery_nnn.parquet");
    let out = hubnorm([
        "export",
        "--gallery",
        &s("gallery.parquet"),
        "--stats",
        &stats_s,
        "--method",
        "nnn",
        "--out",
        export_path.to_str().unwrap(),
    ])
    .output();
    out.assert_success();
    let exported = read_parquet(&export_path);
    assert_eq!(exported.num_rows(), 600);
    assert_eq!(exported.column(1).as_fixed_size_list().value_length(), 385);

    let out = hubnorm([
        "stats",
        "--update",
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--out",
        &stats_s,
    ])
    .output();
    out.assert_success();
    assert!(out.stdout().contains("up to date"));
    let out = hubnorm([
        "stats",
        "--update",
        "--method",
        "is",
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--out",
        &stats_s,
    ])
    .output();
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr().contains("stored file's methods"));

    // mp's gallery side is the gallery bank when one was given: an update
    // reads the same one, or is refused.
    let update = |stats: &str, gallery_bank: Option<&str>| {
        let mut args = vec![
            "stats".to_owned(),
            "--gallery".into(),
            s("gallery.parquet"),
            "--bank".into(),
            s("bank.parquet"),
            "--out".into(),
            stats.into(),
        ];
        if let Some(gb) = gallery_bank {
            args.extend(["--gallery-bank".into(), gb.into()]);
        }
        args.push("--update".into());
        hubnorm(&args).output()
    };
    let gallery_bank = s("gallery_bank.parquet");
    let with_bank = dir.path().join("with_bank.parquet").display().to_string();
    hubnorm([
        "stats",
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--gallery-bank",
        &gallery_bank,
        "--methods",
        "mp",
        "--quiet",
        "--out",
        &with_bank,
    ])
    .output()
    .assert_success();
    let before = std::fs::read(&with_bank).unwrap();
    for (stats, given, refusal) in [
        (&with_bank, None, "was computed with a gallery bank"),
        (
            &stats_s,
            Some(gallery_bank.as_str()),
            "was computed without a gallery bank",
        ),
    ] {
        let out = update(stats, given);
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(out.stderr().contains(refusal), "{}", out.stderr());
    }
    assert_eq!(std::fs::read(&with_bank).unwrap(), before);
    let out = update(&with_bank, Some(&gallery_bank));
    out.assert_success();
    assert!(out.stdout().contains("up to date"), "{}", out.stdout());
}

/// Delta Lake tables (feature `delta`), made, changed and read back by a
/// client no one here wrote ([`common::delta`]).
#[cfg(feature = "delta")]
mod delta {
    use super::*;

    use common::delta::{client, python, write_delta_case};
    use common::valid_case;
    use serde_json::Value;

    fn path(p: &Path) -> String {
        p.display().to_string()
    }

    fn samples() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples")
    }

    /// The rows of a JSON `read` as (method, query, rank, gallery id, score).
    fn result_rows(read: &Value) -> Vec<(String, String, i64, String, f64)> {
        let columns: Vec<&str> = read["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        let at = |name: &str| columns.iter().position(|c| *c == name).unwrap();
        let (m, q, r, g, s) = (
            at("method"),
            at("query_id"),
            at("rank"),
            at("gallery_id"),
            at("score"),
        );
        let mut rows: Vec<_> = read["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                (
                    row[m].as_str().unwrap().to_owned(),
                    row[q].as_str().unwrap().to_owned(),
                    row[r].as_i64().unwrap(),
                    row[g].as_str().unwrap().to_owned(),
                    // The scores are f32s; serde_json parses their decimal
                    // text to within an f64 ulp, which rounding to f32 removes.
                    row[s].as_f64().unwrap() as f32 as f64,
                )
            })
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
        rows
    }

    fn plain_rows(results: &Path) -> Vec<(String, String, i64, String, f64)> {
        let mut rows: Vec<_> = read_results(results)
            .into_iter()
            .map(|r| {
                (
                    r.method,
                    r.query_id,
                    r.rank as i64,
                    r.gallery_id,
                    r.score as f64,
                )
            })
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
        rows
    }

    fn metadata_value(file: &Path, key: &str) -> Option<String> {
        parquet_metadata(file)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// A cluster job pins its Delta inputs to the versions it opened and
    /// records every input file, once for the whole job: a version written
    /// meanwhile changes nothing a task reads, a part added to a folder
    /// fails the task that sees it, named.
    #[test]
    fn a_cluster_pass_reads_the_inputs_the_client_checked() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let gallery = samples().join("gallery.parquet");
        let table = d.join("gallery");
        let copy = |mode: &str| {
            hubnorm([
                "sql",
                "--table",
                &format!("g={}", path(&gallery)),
                &format!(
                    "COPY (SELECT * FROM g) TO '{}' STORED AS DELTA OPTIONS ('mode' '{mode}')",
                    path(&table)
                ),
            ])
            .output()
            .assert_success();
        };
        copy("error");
        let bank = d.join("bank");
        std::fs::create_dir(&bank).unwrap();
        std::fs::copy(samples().join("bank.parquet"), bank.join("part-0.parquet")).unwrap();
        let job = StatsJob {
            gallery: path(&table),
            bank: path(&bank),
            gallery_bank: None,
            bank_sample: None,
            methods: vec![MethodSpec::new("is", &[]).unwrap()],
            out: d.join("never.parquet"),
            overwrite: false,
            options: PassOptions::default(),
            checkpoint: Default::default(),
        };
        // The job opens its tables once; every pass it sends reads them so.
        let open = |spec: &str| {
            hubnorm::source::EmbeddingTable::open("t", spec, &Default::default(), false).unwrap()
        };
        let pinned = hubnorm::sql::pass::ClusterInputs::of([
            Some(&open(&job.gallery)),
            Some(&open(&job.bank)),
        ])
        .unwrap();
        let pass = || {
            let (spec, _) = hubnorm::sql::pass::PassSpec::for_stats(&job).unwrap();
            spec.for_cluster(&pinned).unwrap()
        };
        let first = pass();
        let gallery_of = |spec: &hubnorm::sql::pass::PassSpec| spec.inputs.tables()[0].1.to_owned();
        // The Delta gallery is pinned to the version the job read...
        assert_eq!(gallery_of(&first), format!("{}@0", path(&table)));
        first.check_inputs_unchanged().unwrap();
        // ...so a version written meanwhile changes nothing a task reads,
        // and a pass sent after it (a later round, pass 2) reads version 0.
        copy("overwrite");
        first.check_inputs_unchanged().unwrap();
        let later = pass();
        assert_eq!(gallery_of(&later), format!("{}@0", path(&table)));
        later.check_inputs_unchanged().unwrap();
        // A part added to the bank's folder fails the tasks of every pass,
        // those sent after it too, named.
        std::fs::copy(samples().join("bank.parquet"), bank.join("part-1.parquet")).unwrap();
        for spec in [&first, &pass()] {
            let err = spec.check_inputs_unchanged().unwrap_err();
            assert_eq!(err.exit_code(), 2);
            let message = err.to_string();
            assert!(
                message.contains("part-1.parquet")
                    && message.contains("added while the cluster job ran"),
                "{message}"
            );
        }
        // A Delta stats file is not pinned (its reader takes the table),
        // only recorded; a search spec names it as given.
        let stats_table = path(&d.join("stats"));
        hubnorm([
            "stats",
            "--gallery",
            &path(&gallery),
            "--bank",
            &path(&samples().join("bank.parquet")),
            "--format",
            "delta",
            "--quiet",
            "--out",
            &stats_table,
        ])
        .output()
        .assert_success();
        let search = SearchJob {
            queries: path(&samples().join("queries.parquet")),
            gallery: path(&gallery),
            stats: Some(d.join("stats")),
            methods: vec![MethodSpec::new("is", &[]).unwrap()],
            k: 10,
            out: d.join("never-results.parquet"),
            overwrite: false,
            options: PassOptions::default(),
        };
        let (spec, _) = hubnorm::sql::pass::PassSpec::for_search(&search).unwrap();
        let spec = spec.for_cluster(&Default::default()).unwrap();
        assert_eq!(spec.inputs.tables()[2].1, stats_table);
        spec.check_inputs_unchanged().unwrap();
    }

    /// A folder or glob that reaches into a Delta table (its files, a
    /// folder holding it, a folder inside it, a glob run from inside it) is
    /// refused, naming the table: its folder still holds the files a later
    /// version removed. A data file named alone is read as asked.
    #[test]
    fn globs_and_folders_into_a_delta_table_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let lake = d.join("lake");
        let table = lake.join("ids");
        common::delta::write_replaced_ids_table(&samples().join("gallery.parquet"), &table);
        let count = |spec: &str, dir: &Path| {
            hubnorm([
                "sql",
                "--format",
                "csv",
                "--table",
                &format!("t={spec}"),
                "SELECT count(*) AS n FROM t",
            ])
            .current_dir(dir)
            .output()
        };
        let table_out = count(&path(&table), d);
        table_out.assert_success();
        assert_eq!(table_out.stdout(), "n\n4\n");

        let inner = table.join("sub");
        std::fs::create_dir(&inner).unwrap();
        let files: Vec<_> = std::fs::read_dir(&table)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .collect();
        assert_eq!(files.len(), 2, "both versions' files: {files:?}");
        std::fs::copy(&files[0], inner.join("part.parquet")).unwrap();
        for (spec, cwd, named) in [
            (format!("{}/*.parquet", path(&table)), d, path(&table)),
            (path(&lake), d, path(&table)),
            (path(&inner), d, path(&table)),
            ("*.parquet".to_owned(), table.as_path(), path(&table)),
            ("*.parquet".to_owned(), inner.as_path(), path(&table)),
        ] {
            let out = count(&spec, cwd);
            assert_eq!(out.code(), Some(2), "{spec}: {}", out.stderr());
            let expected = format!("reaches into the Delta table {named}, ");
            assert!(out.stderr().contains(&expected), "{spec}: {}", out.stderr());
            assert!(
                out.stderr().contains(&format!("{named}@VERSION")),
                "{}",
                out.stderr()
            );
        }
        let search = hubnorm([
            "search",
            "--queries",
            &path(&samples().join("queries.parquet")),
            "--gallery",
            &format!("{}/*.parquet", path(&table)),
            "--out",
            &path(&d.join("results.parquet")),
        ])
        .output();
        assert_eq!(search.code(), Some(2), "{}", search.stderr());
        assert!(
            search.stderr().contains("reaches into the Delta table"),
            "{}",
            search.stderr()
        );
        assert!(!d.join("results.parquet").exists());

        // Judged by where a path leads: `..` out of the table is read, a
        // link into it is refused.
        std::fs::create_dir(lake.join("other")).unwrap();
        std::fs::copy(&files[0], lake.join("other/part.parquet")).unwrap();
        count("../../other", &inner).assert_success();
        count(&format!("{}/../../other/*.parquet", path(&inner)), d).assert_success();
        std::os::unix::fs::symlink(&inner, d.join("link")).unwrap();
        let linked = count(&path(&d.join("link")), d);
        assert_eq!(linked.code(), Some(2), "{}", linked.stderr());
        assert!(
            linked.stderr().contains("reaches into the Delta table"),
            "{}",
            linked.stderr()
        );

        let one = count(&path(&files[0]), d);
        one.assert_success();
        assert!(
            ["n\n4\n", "n\n10\n"].contains(&one.stdout().as_str()),
            "{}",
            one.stdout()
        );
    }

    /// `sql --run` reads a Delta input at the version the run recorded, not
    /// at a later one, and reads a results table that `--append` grew as a
    /// table, saying that its recorded inputs are not read.
    #[test]
    fn sql_over_a_run_reads_delta_inputs_at_the_recorded_version() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        valid_case(d);
        let input = |n: &str| path(&d.join(format!("{n}.parquet")));
        let gallery = d.join("gallery_table");
        let sql = |args: &[&str]| {
            let mut all = vec!["sql"];
            all.extend_from_slice(args);
            hubnorm(all).output()
        };
        let table = format!("g={}", input("gallery"));
        sql(&[
            "--table",
            &table,
            "--format",
            "delta",
            "--out",
            &path(&gallery),
            "SELECT * FROM g",
        ])
        .assert_success();
        let out = d.join("run");
        let search = |extra: &[&str]| {
            let mut args = vec![
                "search".to_owned(),
                "--queries".into(),
                input("queries"),
                "--gallery".into(),
                path(&gallery),
                "--method".into(),
                "none".into(),
                "--quiet".into(),
                "--format".into(),
                "delta".into(),
                "--out".into(),
                path(&out.join("results.parquet")),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            hubnorm(args).output()
        };
        search(&[]).assert_success();
        // Another writer adds rows to the gallery after the run.
        sql(&[
            "--table",
            &table,
            "--format",
            "delta",
            "--append",
            "--out",
            &path(&gallery),
            "SELECT concat('new-', id) AS id, embedding FROM g LIMIT 7",
        ])
        .assert_success();
        let count = |what: &str| {
            let out = sql(&[
                "--run",
                &path(&out),
                "--format",
                "csv",
                &format!("SELECT count(*) AS n FROM {what}"),
            ]);
            out.assert_success();
            (out.stdout(), out.stderr())
        };
        assert_eq!(count("gallery").0, "n\n40\n", "the version the run read");

        // A second search appended to the results: two runs' files.
        search(&["--append"]).assert_success();
        let (results, note) = count("results");
        assert_eq!(results, "n\n200\n");
        assert!(note.contains("several appended runs"), "{note}");
    }

    /// Tables deltalake wrote are read at their latest version and at
    /// `@VERSION`, as the same rows a glob over their files gives, with the
    /// version recorded; SQL registers them; a missing version is refused.
    #[test]
    fn delta_inputs_are_read_at_any_version() {
        let Some(py) = python("delta_inputs_are_read_at_any_version") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_delta_case(&py, d);
        let lake = d.join("lake");
        let table = |name: &str| path(&lake.join(name));

        let run = |gallery: &str, bank: &str, queries: &str, out: &str| {
            hubnorm([
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
                "--quiet",
                "--skip-missing",
                "--out",
                out,
            ])
            .output()
        };
        // The tables' data files copied out of their folders (a glob into
        // a table is refused): every file of the latest version, as nothing
        // was removed.
        let parts = |name: &str| {
            let to = d.join("parts").join(name);
            std::fs::create_dir_all(&to).unwrap();
            for entry in std::fs::read_dir(lake.join(name)).unwrap() {
                let entry = entry.unwrap().path();
                if entry.extension().is_some_and(|e| e == "parquet") {
                    std::fs::copy(&entry, to.join(entry.file_name().unwrap())).unwrap();
                }
            }
            path(&to)
        };
        run(
            &table("gallery"),
            &table("bank"),
            &table("queries"),
            &path(&d.join("delta")),
        )
        .assert_success();
        run(
            &parts("gallery"),
            &parts("bank"),
            &parts("queries"),
            &path(&d.join("glob")),
        )
        .assert_success();
        let results = d.join("delta/results.parquet");
        assert_eq!(
            plain_rows(&results),
            plain_rows(&d.join("glob/results.parquet"))
        );
        assert_eq!(
            metadata_value(&results, "hubnorm.gallery.delta_version").as_deref(),
            Some("1")
        );
        assert_eq!(
            metadata_value(&results, "hubnorm.gallery.rows").as_deref(),
            Some("40")
        );
        let stats = d.join("delta/gallery_stats.parquet");
        assert_eq!(
            metadata_value(&stats, "hubnorm.bank.delta_version").as_deref(),
            Some("0")
        );

        // Version 0: the first 25 items only.
        let at0 = format!("{}@0", table("gallery"));
        run(
            &at0,
            &table("bank"),
            &table("queries"),
            &path(&d.join("v0")),
        )
        .assert_success();
        let results0 = d.join("v0/results.parquet");
        assert_eq!(
            metadata_value(&results0, "hubnorm.gallery.delta_version").as_deref(),
            Some("0")
        );
        assert_eq!(
            metadata_value(&results0, "hubnorm.gallery.rows").as_deref(),
            Some("25")
        );
        assert_eq!(
            metadata_value(&results0, "hubnorm.gallery.path").as_deref(),
            Some(at0.as_str())
        );

        // SQL: both versions, and a version the table does not have.
        let count = |spec: &str| {
            let out = hubnorm([
                "sql",
                "SELECT count(*) AS n FROM g",
                "--format",
                "csv",
                "--table",
                &format!("g={spec}"),
            ])
            .output();
            out.assert_success();
            out.stdout()
        };
        assert_eq!(count(&table("gallery")), "n\n40\n");
        assert_eq!(count(&at0), "n\n25\n");
        let out = hubnorm([
            "sql",
            "SELECT count(*) FROM g",
            "--table",
            &format!("g={}@7", table("gallery")),
        ])
        .output();
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(
            out.stderr().contains("no version 7: its latest is 1")
                && out.stderr().contains("gallery"),
            "{}",
            out.stderr()
        );
        let out = run(
            &format!("{}@7", table("gallery")),
            &table("bank"),
            &table("queries"),
            &path(&d.join("v7")),
        );
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(!d.join("v7").exists());

        // A time: the last version committed by then; before the first
        // commit, none (not version 0, whose rows did not exist yet).
        assert_eq!(
            count(&format!("{}@2999-01-01T00:00:00Z", table("gallery"))),
            "n\n40\n"
        );
        let before = format!("{}@2001-01-01T00:00:00+02:00", table("gallery"));
        let out = run(
            &before,
            &table("bank"),
            &table("queries"),
            &path(&d.join("t0")),
        );
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(
            out.stderr().contains(
                "no version committed at or before 2001-01-01T00:00:00+02:00: \
                 its first, version 0, was committed at 20"
            ),
            "{}",
            out.stderr()
        );
        assert!(!d.join("t0").exists());
    }

    /// `--format delta` outputs of every command are Delta tables that
    /// deltalake and polars read as the rows the Parquet outputs hold; a new
    /// table, then new versions by `--append` and `--overwrite`; an existing
    /// table is refused without either; hubnorm reads its Delta stats back.
    #[test]
    fn delta_outputs_are_read_back_by_deltalake_and_polars() {
        let Some(py) = python("delta_outputs_are_read_back_by_deltalake_and_polars") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        valid_case(d);
        let input = |n: &str| path(&d.join(format!("{n}.parquet")));
        let (q_in, g_in, b_in) = (input("queries"), input("gallery"), input("bank"));
        let run = |out: &str, extra: &[&str]| {
            let mut args = vec![
                "run",
                "--queries",
                &q_in,
                "--gallery",
                &g_in,
                "--bank",
                &b_in,
                "--methods",
                "is,nnn,dissim-local",
                "--nnn-k",
                "5",
                "--quiet",
                "--out",
                out,
            ];
            args.extend_from_slice(extra);
            hubnorm(args).output()
        };
        let plain = d.join("plain");
        let lake = d.join("lake");
        run(&path(&plain), &[]).assert_success();
        run(&path(&lake), &["--format", "delta"]).assert_success();

        let results = lake.join("results.parquet");
        let read = client(&py, &["read", &path(&results)]);
        assert_eq!(read["version"], 0);
        assert_eq!(
            result_rows(&read),
            plain_rows(&plain.join("results.parquet"))
        );
        let plain_stats = read_parquet(&plain.join("gallery_stats.parquet"));
        let stats_read = client(&py, &["read", &path(&lake.join("gallery_stats.parquet"))]);
        assert_eq!(
            stats_read["rows"].as_array().unwrap().len(),
            plain_stats.num_rows()
        );
        let info = client(&py, &["info", &path(&lake.join("gallery_stats.parquet"))]);
        // u64 bank rows become Delta longs.
        assert!(
            info["schema"].as_str().unwrap().contains("\"long\""),
            "{info}"
        );

        // The run folder of Delta tables registers in SQL as the Parquet one does.
        let out = hubnorm([
            "sql",
            "SELECT count(*) AS n FROM results",
            "--format",
            "csv",
            "--run",
            lake.to_str().unwrap(),
        ])
        .output();
        out.assert_success();
        assert_eq!(
            out.stdout(),
            format!("n\n{}\n", plain_rows(&plain.join("results.parquet")).len())
        );

        // hubnorm reads its Delta stats table back.
        let lake_stats = path(&lake.join("gallery_stats.parquet"));
        let search = |out: &str, extra: &[&str]| {
            let mut args = vec![
                "search",
                "--queries",
                &q_in,
                "--gallery",
                &g_in,
                "--stats",
                &lake_stats,
                "--methods",
                "is,nnn,dissim-local",
                "--nnn-k",
                "5",
                "--quiet",
                "--out",
                out,
            ];
            args.extend_from_slice(extra);
            hubnorm(args).output()
        };
        let search_args = |out: &str| {
            vec![
                "search".to_owned(),
                "--queries".into(),
                input("queries"),
                "--gallery".into(),
                input("gallery"),
                "--stats".into(),
                path(&lake.join("gallery_stats.parquet")),
                "--methods".into(),
                "is,nnn,dissim-local".into(),
                "--nnn-k".into(),
                "5".into(),
                "--quiet".into(),
                "--format".into(),
                "delta".into(),
                "--append".into(),
                "--out".into(),
                out.to_owned(),
            ]
        };
        let hubnorm_with_faults =
            |args: &[String], faults: &str| hubnorm(args).env("FAILPOINTS", faults).output();
        let searched = d.join("searched.parquet");
        search(&path(&searched), &[]).assert_success();
        // The same lists as the run's (which adds the baseline's).
        let once = plain_rows(&searched);
        let mut corrected = plain_rows(&plain.join("results.parquet"));
        corrected.retain(|r| r.0 != "none");
        assert_eq!(once, corrected);

        // A second write: refused, appended, overwritten.
        let out = search(&path(&results), &["--format", "delta"]);
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(out.stderr().contains("already"), "{}", out.stderr());
        search(&path(&results), &["--format", "delta", "--append"]).assert_success();
        let appended = client(&py, &["read", &path(&results)]);
        assert_eq!(appended["version"], 1);
        assert_eq!(appended["files"], 2);
        assert_eq!(
            result_rows(&appended).len(),
            plain_rows(&plain.join("results.parquet")).len() + once.len()
        );
        search(&path(&results), &["--format", "delta", "--overwrite"]).assert_success();
        let overwritten = client(&py, &["read", &path(&results)]);
        assert_eq!(overwritten["version"], 2);
        assert_eq!(result_rows(&overwritten), once);
        let first = client(&py, &["read", &path(&results), "--version", "0"]);
        assert_eq!(
            result_rows(&first),
            plain_rows(&plain.join("results.parquet")),
            "time travel to the first version"
        );
        let out = search(&path(&results), &["--append"]);
        assert_eq!(out.code(), Some(2), "--append without --format delta");
        // A write that fails before its commit (the file written, or moved
        // into the table) adds no version, no row and no file.
        let data_files = || {
            std::fs::read_dir(&results)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .path()
                        .extension()
                        .is_some_and(|x| x == "parquet")
                })
                .count()
        };
        let files_before = data_files();
        let faults: &[&str] = if cfg!(feature = "failpoints") {
            &["sink-commit=return(enospc)", "delta-commit=return(eio)"]
        } else {
            &[]
        };
        for fault in faults {
            let out = hubnorm_with_faults(&search_args(&path(&results)), fault);
            assert_eq!(out.code(), Some(1), "{fault}: {}", out.stderr());
            let after = client(&py, &["read", &path(&results)]);
            assert_eq!(after["version"], 2, "{fault}");
            assert_eq!(result_rows(&after), once, "{fault}");
            assert_eq!(data_files(), files_before, "{fault}");
        }
        if cfg!(feature = "failpoints") {
            // A commit whose log entry landed before a later step failed
            // keeps its file: the version it added stands.
            let out = hubnorm_with_faults(
                &search_args(&path(&results)),
                "delta-after-commit=return(eio)",
            );
            out.assert_success();
            let after = client(&py, &["read", &path(&results)]);
            assert_eq!(after["version"], 3);
            assert_eq!(result_rows(&after).len(), 2 * once.len());
            assert_eq!(data_files(), files_before + 1);
        }

        // stats, export, sql and compare.
        let stats = d.join("stats_delta");
        let stats_cmd = |extra: &[&str]| {
            let mut args = vec![
                "stats",
                "--gallery",
                &g_in,
                "--bank",
                &b_in,
                "--method",
                "is",
                "--quiet",
                "--out",
                stats.to_str().unwrap(),
                "--format",
                "delta",
            ];
            args.extend_from_slice(extra);
            hubnorm(args).output()
        };
        stats_cmd(&[]).assert_success();
        let out = stats_cmd(&["--append"]);
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        stats_cmd(&["--overwrite"]).assert_success();
        assert_eq!(client(&py, &["info", &path(&stats)])["version"], 1);

        let exported = d.join("exported");
        hubnorm([
            "export",
            "--gallery",
            &g_in,
            "--stats",
            stats.to_str().unwrap(),
            "--method",
            "is",
            "--format",
            "delta",
            "--out",
            exported.to_str().unwrap(),
        ])
        .output()
        .assert_success();
        let read = client(&py, &["read", &path(&exported)]);
        let rows = read["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 40);
        assert!(
            rows.iter().all(|r| r[1].as_array().unwrap().len() == 5),
            "d + 1 values"
        );

        let queried = d.join("queried");
        hubnorm([
            "sql",
            "SELECT method, count(*) AS n FROM results GROUP BY method ORDER BY method",
            "--run",
            plain.to_str().unwrap(),
            "--format",
            "delta",
            "--out",
            queried.to_str().unwrap(),
        ])
        .output()
        .assert_success();
        let read = client(&py, &["read", &path(&queried)]);
        let ran = plain_rows(&plain.join("results.parquet"));
        let mut methods: Vec<&String> = ran.iter().map(|r| &r.0).collect();
        methods.dedup();
        assert_eq!(
            read["rows"].as_array().unwrap().len(),
            methods.len(),
            "{read}"
        );
        // COPY ... TO ... STORED AS DELTA: a new table, then an appended version.
        let copied = d.join("copied");
        let copy = |options: &str| {
            let out = hubnorm([
                "sql",
                &format!(
                    "COPY (SELECT method, query_id, gallery_id FROM results WHERE rank = 1) TO '{}' STORED AS DELTA {options}",
                    copied.display()
                ),
                "--run", plain.to_str().unwrap(), "--format", "csv",
            ])
            .output();
            out.assert_success();
            out.stdout()
        };
        let firsts = ran.iter().filter(|r| r.2 == 1).count();
        assert_eq!(copy(""), format!("count\n{firsts}\n"));
        copy("OPTIONS ('mode' 'append')");
        let read = client(&py, &["read", &path(&copied)]);
        assert_eq!(
            (
                read["version"].as_i64(),
                read["rows"].as_array().unwrap().len()
            ),
            (Some(1), 2 * firsts)
        );

        let compared = d.join("compared");
        hubnorm([
            "compare",
            "--queries",
            &q_in,
            "--gallery",
            &g_in,
            "--bank",
            &b_in,
            "--methods",
            "none,is",
            "--bootstrap",
            "10",
            "--quiet",
            "--format",
            "delta",
            "--out",
            compared.to_str().unwrap(),
        ])
        .output()
        .assert_success();
        for table in [
            "compare.parquet",
            "report.parquet",
            "gallery_report.parquet",
        ] {
            let read = client(&py, &["read", &path(&compared.join(table))]);
            assert!(
                !read["rows"].as_array().unwrap().is_empty(),
                "{table}: {read}"
            );
        }
    }

    /// `stats --update` on Delta inputs follows the log: appended files are
    /// merged (equal to a full recomputation), a compaction computes
    /// nothing, a compacted gallery's items are found again by id, and a
    /// delete is refused with the version and operation named.
    #[test]
    fn stats_update_follows_the_delta_log() {
        let Some(py) = python("stats_update_follows_the_delta_log") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut r = rng(73);
        let gallery = random_table(&mut r, "g", 130, 12);
        let bank = random_table(&mut r, "b", 290, 12);
        write_part(d, "gallery_all.parquet", &gallery);
        write_part(d, "bank_all.parquet", &bank);
        let (g_all, b_all) = (
            path(&d.join("gallery_all.parquet")),
            path(&d.join("bank_all.parquet")),
        );
        let (g, b) = (path(&d.join("lake/gallery")), path(&d.join("lake/bank")));
        client(&py, &["write", &g, &g_all, "--rows", "0:80"]);
        client(&py, &["write", &b, &b_all, "--rows", "0:150"]);
        let methods = vec![
            MethodSpec::new("is", &[("beta", 20.0)]).unwrap(),
            MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 9.0)]).unwrap(),
            MethodSpec::new("dissim-local", &[("k", 3.0)]).unwrap(),
            MethodSpec::new("sn", &[("tau", 0.05), ("t", 5.0)]).unwrap(),
        ];
        let job = |methods: &[MethodSpec], out: &Path| StatsJob {
            gallery: g.clone(),
            bank: b.clone(),
            ..stats_job(d, methods, out)
        };
        let stored = d.join("gallery_stats.parquet");
        let full = d.join("full.parquet");
        run_stats(&job(&methods, &stored), &Silent).unwrap();

        // Appended bank rows: merged.
        client(
            &py,
            &["write", &b, &b_all, "--rows", "150:230", "--mode", "append"],
        );
        let summary = update_stats(&job(&[], &stored), &Silent).unwrap();
        assert_eq!((summary.new_bank_parts, summary.new_gallery_parts), (1, 0));
        assert!(!summary.compacted);
        run_stats(&job(&methods, &full), &Silent).unwrap();
        assert_same_stats(
            &read_parquet(&stored),
            &read_parquet(&full),
            "appended bank",
        );

        // The bank compacted: nothing to compute, the file untouched.
        let compacted = client(&py, &["compact", &b]);
        assert!(
            compacted["metrics"]["numFilesRemoved"].as_i64().unwrap() >= 2,
            "{compacted}"
        );
        let before = std::fs::read(&stored).unwrap();
        let summary = update_stats(&job(&[], &stored), &Silent).unwrap();
        assert!(summary.compacted);
        assert_eq!((summary.new_bank_parts, summary.new_gallery_parts), (0, 0));
        assert_eq!(std::fs::read(&stored).unwrap(), before);

        // The gallery compacted, then new items: merged, the stored items
        // found by id in the compacted file; dissim-local, whose state
        // numbers bank rows, recomputed since the bank was compacted.
        client(
            &py,
            &["write", &g, &g_all, "--rows", "80:100", "--mode", "append"],
        );
        let summary = update_stats(&job(&[], &stored), &Silent).unwrap();
        assert!(summary.compacted);
        assert!(summary
            .recomputed
            .iter()
            .any(|m| m.kind().name() == "dissim-local"));
        run_stats(&job(&methods, &full), &Silent).unwrap();
        assert_same_stats(
            &read_parquet(&stored),
            &read_parquet(&full),
            "compacted bank + new items",
        );
        client(&py, &["compact", &g]);
        client(
            &py,
            &["write", &g, &g_all, "--rows", "100:130", "--mode", "append"],
        );
        let summary = update_stats(&job(&[], &stored), &Silent).unwrap();
        assert!(summary.compacted);
        assert_eq!((summary.new_bank_parts, summary.new_gallery_parts), (0, 1));
        run_stats(&job(&methods, &full), &Silent).unwrap();
        assert_same_stats(
            &read_parquet(&stored),
            &read_parquet(&full),
            "compacted gallery + new items",
        );

        // A real delete: refused, naming the version and the operation.
        let deleted = client(&py, &["delete", &b, "id = 'b3'"]);
        let before = std::fs::read(&stored).unwrap();
        let err = update_stats(&job(&[], &stored), &Silent).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let message = err.to_string();
        assert!(
            message.contains(&format!("version {}", deleted["version"]))
                && message.contains("DELETE")
                && message.contains("recompute without --update"),
            "{message}"
        );
        assert_eq!(std::fs::read(&stored).unwrap(), before);
    }

    /// hubnorm writes into another client's Delta table only where its
    /// one-file commits keep the table as that client made it: a
    /// partitioned table and one with a CHECK constraint are refused (exit
    /// 2, no new version), and so is an overwrite of an append-only table;
    /// non-null rows go into nullable columns; of writers racing to create
    /// one table, exactly one does.
    #[test]
    fn writes_into_other_clients_tables_keep_their_layout() {
        let Some(py) = python("writes_into_other_clients_tables_keep_their_layout") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        valid_case(d);
        let gallery = path(&d.join("gallery.parquet"));
        let copy = |table: &str, query: &str, mode: &str| {
            hubnorm([
                "sql",
                "--table",
                &format!("g={gallery}"),
                &format!("COPY ({query}) TO '{table}' STORED AS DELTA OPTIONS ('mode' '{mode}')"),
            ])
            .current_dir(d)
            .output()
        };

        let parted = path(&d.join("parted"));
        client(&py, &["write", &parted, &gallery, "--partition-by", "half"]);
        let checked = path(&d.join("checked"));
        client(&py, &["write", &checked, &gallery]);
        client(&py, &["constrain", &checked, "named", "id <> ''"]);
        for (table, query, why) in [
            (
                &parted,
                "SELECT *, 'even' AS half FROM g",
                "it is partitioned by half",
            ),
            (
                &checked,
                "SELECT id, embedding FROM g",
                "it has CHECK constraints (named)",
            ),
        ] {
            let before = client(&py, &["info", table]);
            for mode in ["append", "overwrite"] {
                let out = copy(table, query, mode);
                assert_eq!(out.code(), Some(2), "{table} {mode}: {}", out.stderr());
                assert!(out.stderr().contains(why), "{}", out.stderr());
                assert_eq!(client(&py, &["info", table]), before, "{table} {mode}");
            }
        }
        let append_only = path(&d.join("append-only"));
        client(
            &py,
            &[
                "write",
                &append_only,
                &gallery,
                "--property",
                "delta.appendOnly=true",
            ],
        );
        let before = client(&py, &["info", &append_only]);
        let out = copy(&append_only, "SELECT id, embedding FROM g", "overwrite");
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(
            out.stderr()
                .contains("is append-only (delta.appendOnly = true)"),
            "{}",
            out.stderr()
        );
        assert_eq!(client(&py, &["info", &append_only]), before);
        copy(&append_only, "SELECT id, embedding FROM g", "append").assert_success();
        assert_eq!(client(&py, &["info", &append_only])["version"], 1);

        let ids = d.join("ids.parquet");
        hubnorm([
            "sql",
            "--table",
            &format!("g={gallery}"),
            "SELECT id FROM g",
            "--format",
            "parquet",
            "--out",
            &path(&ids),
        ])
        .output()
        .assert_success();
        let nullable = path(&d.join("nullable"));
        client(&py, &["write", &nullable, &path(&ids)]);
        copy(&nullable, "SELECT 'extra' AS id", "append").assert_success();
        let read = client(&py, &["read", &nullable]);
        assert_eq!(read["version"], 1);
        assert_eq!(read["rows"].as_array().unwrap().len(), 41);
        // Emptied by a DELETE: zero rows in SQL, no embedding input.
        client(&py, &["delete", &nullable, "id IS NOT NULL"]);
        let counted = hubnorm([
            "sql",
            "--format",
            "csv",
            "--table",
            &format!("t={nullable}"),
            "SELECT count(*) AS n FROM t",
        ])
        .output();
        counted.assert_success();
        assert_eq!(counted.stdout(), "n\n0\n");
        let stats = hubnorm([
            "stats",
            "--gallery",
            &nullable,
            "--bank",
            &gallery,
            "--out",
            &path(&d.join("never.parquet")),
        ])
        .output();
        assert_eq!(stats.code(), Some(2), "{}", stats.stderr());
        assert!(
            stats.stderr().contains("holds no file"),
            "{}",
            stats.stderr()
        );

        for round in 0..4 {
            let table = format!("raced{round}");
            let writers: Vec<_> = (1..=6)
                .map(|n| {
                    hubnorm([
                        "sql",
                        "--table",
                        &format!("g={gallery}"),
                        &format!("COPY (SELECT id FROM g LIMIT {n}) TO '{table}' STORED AS DELTA"),
                    ])
                    .current_dir(d)
                    .spawn()
                })
                .collect();
            let created = writers
                .into_iter()
                .map(|w| w.wait_with_output().unwrap())
                .filter(|out| out.status.success())
                .count();
            let info = client(&py, &["info", &path(&d.join(&table))]);
            assert_eq!(
                (created, &info["version"]),
                (1, &serde_json::json!(0)),
                "{info}"
            );
        }
    }

    /// README's Iceberg recipe: pyiceberg's `add_files` registers a run's
    /// Parquet outputs in an Iceberg catalog (SQLite, in a folder), and
    /// reading the Iceberg table gives the results' rows.
    #[test]
    fn iceberg_registers_the_parquet_outputs() {
        let Some(py) = python("iceberg_registers_the_parquet_outputs") else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        valid_case(d);
        let input = |n: &str| path(&d.join(format!("{n}.parquet")));
        let (q_in, g_in, b_in) = (input("queries"), input("gallery"), input("bank"));
        let out = d.join("out");
        hubnorm([
            "run",
            "--queries",
            &q_in,
            "--gallery",
            &g_in,
            "--bank",
            &b_in,
            "--method",
            "is",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .assert_success();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/iceberg_add_files.py");
        let warehouse = d.join("warehouse");
        let ran = std::process::Command::new(&py)
            .arg(&script)
            .arg(&warehouse)
            .arg(out.join("results.parquet"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&ran.stdout);
        assert!(
            ran.status.success(),
            "{}\n{stdout}",
            String::from_utf8_lossy(&ran.stderr)
        );
        let rows = read_results(&out.join("results.parquet")).len();
        assert!(
            stdout.contains(&format!("hubnorm.results: {rows} rows")),
            "{stdout}"
        );
    }

    /// The state of a Delta table from its log alone: the latest version
    /// and the data files of that version (adds minus removes, in order).
    fn table_state(table: &Path) -> (u64, Vec<String>) {
        let log = table.join("_delta_log");
        let mut commits: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(&log)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| (p.file_stem().unwrap().to_str().unwrap().parse().unwrap(), p))
            .collect();
        commits.sort();
        let mut files = Vec::new();
        for (_, commit) in &commits {
            for line in std::fs::read_to_string(commit).unwrap().lines() {
                let action: Value = serde_json::from_str(line).unwrap();
                if let Some(path) = action["add"]["path"].as_str() {
                    files.push(path.to_owned());
                }
                if let Some(path) = action["remove"]["path"].as_str() {
                    files.retain(|f| f != path);
                }
            }
        }
        files.sort();
        (commits.last().expect("a commit").0, files)
    }

    /// A checkpointed `run --format delta` that fails between its tables'
    /// commits (the first committed, the second refused by an injected I/O
    /// error) resumes without committing any table twice: as new tables
    /// and as an `--append` to existing ones, each table ends one version
    /// past where it started, holding files with the bytes an uninterrupted
    /// run writes (two for appended results, one for replaced statistics).
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_resumed_delta_run_commits_each_table_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        valid_case(d);
        let input = |n: &str| path(&d.join(format!("{n}.parquet")));
        let run = |out: &Path, extra: &[&str], faults: &str| {
            let mut args = vec![
                "run".to_owned(),
                "--queries".into(),
                input("queries"),
                "--gallery".into(),
                input("gallery"),
                "--bank".into(),
                input("bank"),
                "--methods".into(),
                "is,nnn".into(),
                "--nnn-k".into(),
                "5".into(),
                "--quiet".into(),
                "--format".into(),
                "delta".into(),
                "--out".into(),
                path(out),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            hubnorm(args).env("FAILPOINTS", faults).output()
        };
        let tables = ["results.parquet", "gallery_stats.parquet"];
        let reference = d.join("reference");
        run(&reference, &["--no-checkpoint"], "").assert_success();
        let bytes = |table: &Path, file: &str| std::fs::read(table.join(file)).unwrap();
        let expected: Vec<Vec<u8>> = tables
            .iter()
            .map(|t| {
                let table = reference.join(t);
                let (version, files) = table_state(&table);
                assert_eq!((version, files.len()), (0, 1), "{t}");
                bytes(&table, &files[0])
            })
            .collect();
        // A Parquet output where a Delta table is: refused before any work,
        // even with --overwrite, and the table left as it was.
        let plain = hubnorm([
            "search",
            "--queries",
            &input("queries"),
            "--gallery",
            &input("gallery"),
            "--method",
            "none",
            "--quiet",
            "--overwrite",
            "--out",
            &path(&reference.join("results.parquet")),
        ])
        .output();
        assert_eq!(plain.code(), Some(2), "{}", plain.stderr());
        assert!(plain.stderr().contains("is a folder"), "{}", plain.stderr());
        assert_eq!(table_state(&reference.join("results.parquet")).0, 0);

        for append in [false, true] {
            let out = d.join(if append { "appended" } else { "created" });
            let mode: &[&str] = if append { &["--append"] } else { &[] };
            if append {
                run(&out, &["--no-checkpoint"], "").assert_success();
            }
            let first_version = u64::from(append);
            let saving = [mode, &["--checkpoint-interval", "0"]].concat();
            let stopped = run(&out, &saving, "delta-commit=1*off->return(eio)");
            assert_eq!(stopped.code(), Some(1), "{}", stopped.stderr());
            assert!(out.join("run.checkpoint").join("manifest.json").exists());
            let committed: Vec<bool> = tables
                .iter()
                .map(|t| {
                    let table = out.join(t);
                    table.join("_delta_log").exists() && table_state(&table).0 == first_version
                })
                .collect();
            assert_eq!(
                committed.iter().filter(|&&c| c).count(),
                1,
                "append {append}: one table committed before the fault: {committed:?}"
            );
            if !append {
                // The refused table's folder went with its file.
                for (t, committed) in tables.iter().zip(&committed) {
                    assert!(*committed || !out.join(t).exists(), "{t} left behind");
                }
            }

            let resuming = [mode, &["--resume"]].concat();
            run(&out, &resuming, "").assert_success();
            assert!(!out.join("run.checkpoint").exists());
            for (t, expected) in tables.iter().zip(&expected) {
                let table = out.join(t);
                let (version, files) = table_state(&table);
                assert_eq!(
                    version, first_version,
                    "append {append}: {t} committed twice"
                );
                // --append adds results; a run's statistics are replaced.
                let kept = usize::from(append && *t == "results.parquet");
                assert_eq!(files.len(), 1 + kept, "append {append}: {t}");
                for file in &files {
                    assert!(
                        bytes(&table, file) == *expected,
                        "append {append}: {t}: {file} differs from the uninterrupted run's"
                    );
                }
            }
        }
    }
}
