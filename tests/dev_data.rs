//! The figures of `../shared/dev-data/wordnet-minilm` (metrics.json): baseline
//! and β = 20 inverted softmax, R@K to 1e-4 and skewness to 1e-3. Skipped,
//! with a message, when the development data is absent (a user's clone).
use std::path::PathBuf;

use hubnorm::options::{Beta, MemoryBudget, MethodSpec, PassOptions};
use hubnorm::pipeline::{self, RunJob};
use hubnorm::progress::Silent;

fn dev_data() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/dev-data/wordnet-minilm");
    if dir.join("metrics.json").exists() {
        Some(dir)
    } else {
        eprintln!("skipped: {} is absent", dir.display());
        None
    }
}

fn check(direction: &str, queries: &str, gallery: &str, bank: &str, memory: MemoryBudget) {
    let Some(dir) = dev_data() else { return };
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("metrics.json")).unwrap()).unwrap();
    let expected = &metrics[direction];
    let out = tempfile::tempdir().unwrap();
    let mut options = PassOptions {
        memory,
        ..PassOptions::default()
    };
    options.read.target_column = "target_id".into();
    let job = RunJob {
        queries: dir.join(queries).display().to_string(),
        gallery: dir.join(gallery).display().to_string(),
        bank: dir.join(bank).display().to_string(),
        gallery_bank: None,
        bank_sample: None,
        methods: vec![MethodSpec::InvertedSoftmax {
            beta: Beta(expected["beta"].as_f64().unwrap()),
        }],
        k: 10,
        out_dir: out.path().join("run"),
        overwrite: false,
        options,
    };
    let summary = pipeline::run(&job, &Silent).unwrap();
    for (ours, key) in summary.methods.iter().zip(["baseline", "inverted_softmax"]) {
        let want = &expected[key];
        let q = ours.quality.as_ref().unwrap();
        eprintln!(
            "{direction} {key}: R@1 {:.4} R@5 {:.4} R@10 {:.4} MRR {:.4} skew {:.4}",
            q.r1, q.r5, q.r10, q.mrr, ours.k_occurrence_skewness
        );
        for (got, name) in [(q.r1, "R@1"), (q.r5, "R@5"), (q.r10, "R@10")] {
            let w = want[name].as_f64().unwrap();
            assert!(
                (got - w).abs() <= 1e-4,
                "{direction} {key} {name}: {got} vs {w}"
            );
        }
        let w = want["MRR"].as_f64().unwrap();
        assert!(
            (q.mrr - w).abs() <= 1e-4,
            "{direction} {key} MRR: {} vs {w}",
            q.mrr
        );
        let w = want["skew_N10"].as_f64().unwrap();
        assert!(
            (ours.k_occurrence_skewness - w).abs() <= 1e-3,
            "{direction} {key} skewness: {} vs {w}",
            ours.k_occurrence_skewness
        );
    }
}

#[test]
fn text_to_gallery_figures() {
    check(
        "text_to_gallery",
        "queries.parquet",
        "gallery.parquet",
        "bank.parquet",
        MemoryBudget::DEFAULT,
    );
}

/// Same figures with a limit small enough to force several chunks and blocks.
#[test]
fn text_to_gallery_figures_out_of_core() {
    check(
        "text_to_gallery",
        "queries.parquet",
        "gallery.parquet",
        "bank.parquet",
        "40MiB".parse().unwrap(),
    );
}
