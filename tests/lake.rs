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
use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions};
use hubnorm::pipeline::{run_search, run_stats, SearchJob, StatsJob};
use hubnorm::progress::Silent;
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

fn unit(v: &[f32]) -> Vec<f64> {
    let n = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|&x| x as f64 / n).collect()
}

/// A plain inner-product top-k over the exported (d + 1)-vectors, with −1
/// appended to each normalised query, reproduces `hubnorm search` for every
/// exportable method: the same lists (but at near-ties), and the same
/// scores up to the query-only term (CSLS, DN). Gated methods are refused.
#[test]
fn export_reproduces_search_with_a_plain_inner_product() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut r = rng(72);
    let gallery = random_table(&mut r, "g", 150, 10);
    let queries = random_table(&mut r, "q", 40, 10);
    let bank = random_table(&mut r, "b", 120, 10);
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
    let methods = vec![
        MethodSpec::new("is", &[("beta", 20.0)]).unwrap(),
        MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 16.0)]).unwrap(),
        MethodSpec::new("csls", &[("k", 10.0)]).unwrap(),
        MethodSpec::new("dn", &[("lambda", 0.5)]).unwrap(),
        MethodSpec::new("dual-is", &[("beta1", 20.0), ("beta2", 1.0)]).unwrap(),
        MethodSpec::new("sn", &[("tau", 0.05), ("t", 10.0)]).unwrap(),
        MethodSpec::new("dissim-local", &[("k", 5.0)]).unwrap(),
    ];
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
    let gallery_row: HashMap<&str, usize> = gallery
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    for method in &methods {
        let name = method.kind().name();
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
            // CSLS and DN also subtract a term of the query alone.
            let offset = scores[ours[0].0] - ours[0].1 as f64;
            if !matches!(method.kind().name(), "csls" | "dn") {
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
}
