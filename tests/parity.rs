//! `none` and `is` against the dense f64 reference of tests/common: scores to
//! 1e-5, identical rankings, full-gallery ranks, at and around the tile sizes,
//! with k ≥ gallery size, a single query, several chunks forced by a small
//! memory limit, multi-file inputs, and 1 vs 2 threads.
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::ArrayRef;

use common::*;
use hubnorm::bank::{ActivationState, RowMoments, SortedSimilarities};
use hubnorm::kernel::{
    column_log_sum_exp, column_statistics, ColumnStates, ColumnStatsRequest, LogSumExp, Rows, TopK,
    TopValues, TILE_COLS, TILE_ROWS,
};
use hubnorm::options::{MemoryBudget, MethodKind, MethodSpec, PassOptions};
use hubnorm::pipeline::{self, RunJob, RunSummary, SearchJob, StatsJob};
use hubnorm::progress::Silent;

const BETA: f64 = 20.0;

struct Case {
    queries: Table,
    gallery: Table,
    bank: Table,
}

fn case(seed: u64, nq: usize, ng: usize, nb: usize, dim: usize) -> Case {
    let mut r = rng(seed);
    let gallery = random_table(&mut r, "g", ng, dim);
    let queries = queries_near(&mut r, &gallery, nq, 0.8);
    let bank = random_table(&mut r, "b", nb, dim);
    Case {
        queries,
        gallery,
        bank,
    }
}

fn write_case(dir: &Path, c: &Case) {
    write_table(
        &dir.join("queries.parquet"),
        &c.queries,
        Layout::FixedF32,
        false,
    );
    write_table(
        &dir.join("gallery.parquet"),
        &c.gallery,
        Layout::FixedF32,
        false,
    );
    write_table(&dir.join("bank.parquet"), &c.bank, Layout::FixedF32, false);
}

fn run_job(dir: &Path, out: &str, k: usize, memory: MemoryBudget, threads: usize) -> RunJob {
    RunJob {
        queries: dir.join("queries.parquet").display().to_string(),
        gallery: dir.join("gallery.parquet").display().to_string(),
        bank: dir.join("bank.parquet").display().to_string(),
        gallery_bank: None,
        bank_sample: None,
        transductive: false,
        methods: vec![MethodSpec::new("is", &[("beta", BETA)]).unwrap()],
        k,
        out_dir: dir.join(out),
        overwrite: false,
        options: PassOptions {
            memory,
            threads,
            ..PassOptions::default()
        },
        cluster: None,
        checkpoint: Default::default(),
    }
}

/// Compares a run's results and summary with the dense reference.
fn check_against_reference(c: &Case, out_dir: &Path, summary: &RunSummary, k: usize) {
    let q = to_f64(&c.queries, true);
    let g = to_f64(&c.gallery, true);
    let b = to_f64(&c.bank, true);
    let zeros = vec![0.0; g.len()];
    let h_is = reference_is_corrections(&b, &g, BETA);
    let results = read_results(&out_dir.join("results.parquet"));
    let gallery_row = |id: &str| c.gallery.ids.iter().position(|x| x == id).unwrap();
    for (m, (method, h)) in [("none", &zeros), ("is", &h_is)].into_iter().enumerate() {
        let scores = reference_scores(&q, &g, h);
        let mut counts = vec![0f64; g.len()];
        let mut hits = [0usize; 3];
        for (qi, qid) in c.queries.ids.iter().enumerate() {
            let ours: Vec<(usize, f32)> = results
                .iter()
                .filter(|r| r.method == method && &r.query_id == qid)
                .map(|r| (gallery_row(&r.gallery_id), r.score))
                .collect();
            let ranks: Vec<i32> = results
                .iter()
                .filter(|r| r.method == method && &r.query_id == qid)
                .map(|r| r.rank)
                .collect();
            assert_eq!(
                ranks,
                (1..=ours.len() as i32).collect::<Vec<_>>(),
                "ranks are 1..k"
            );
            assert_ranking_matches(
                &ours,
                &scores[qi],
                k.min(g.len()),
                1e-5,
                &format!("{method} query {qid}"),
            );
            for r in results
                .iter()
                .filter(|r| r.method == method && &r.query_id == qid)
            {
                let raw = dot(&q[qi], &g[gallery_row(&r.gallery_id)]);
                assert!(
                    (r.raw_score as f64 - raw).abs() < 1e-5,
                    "raw score {} vs {raw}",
                    r.raw_score
                );
            }
            for gi in reference_topk(&scores[qi], 10) {
                counts[gi] += 1.0;
            }
            let target = gallery_row(&c.queries.targets.as_ref().unwrap()[qi]);
            let rank = reference_rank(&scores[qi], target);
            for (h, cut) in hits.iter_mut().zip([1.0, 5.0, 10.0]) {
                *h += (rank <= cut) as usize;
            }
        }
        let s = &summary.methods[m];
        assert_eq!(s.method, method);
        let quality = s.quality.as_ref().expect("queries have targets");
        let n = c.queries.rows() as f64;
        for (got, want) in [1, 5, 10]
            .map(|k| quality.recall_at(k).unwrap())
            .into_iter()
            .zip(hits)
        {
            assert!(
                (got - want as f64 / n).abs() < 1e-12,
                "{method}: recall {got} vs {}",
                want as f64 / n
            );
        }
        let skew = reference_skewness(&counts);
        assert!(
            (s.k_occurrence_skewness - skew).abs() < 1e-9,
            "{method}: skewness {} vs {skew}",
            s.k_occurrence_skewness
        );
    }
}

fn run_and_check(seed: u64, nq: usize, ng: usize, nb: usize, dim: usize, k: usize) {
    let dir = tempfile::tempdir().unwrap();
    let c = case(seed, nq, ng, nb, dim);
    write_case(dir.path(), &c);
    let summary = pipeline::run(
        &run_job(dir.path(), "out", k, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap();
    check_against_reference(&c, &dir.path().join("out"), &summary, k);
}

#[test]
fn matches_reference_around_tile_sizes() {
    // Below, at and above the tile shape in each direction (queries and bank
    // rows against TILE_ROWS, gallery items against TILE_COLS).
    run_and_check(1, TILE_ROWS - 1, TILE_COLS - 1, TILE_ROWS + 1, 12, 10);
    run_and_check(2, TILE_ROWS + 1, TILE_COLS + 1, TILE_ROWS, 16, 10);
    run_and_check(3, TILE_ROWS, TILE_COLS, TILE_ROWS - 1, 8, 3);
}

#[test]
fn single_query_and_k_equal_to_gallery_size() {
    run_and_check(4, 1, 50, 40, 8, 10);
    // k = the gallery size: every item, ranked.
    run_and_check(5, 30, 7, 20, 8, 7);
    run_and_check(6, 3, 5, 9, 4, 5);
    // Above it: refused (a smaller gallery than meant, most likely).
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), &case(6, 3, 5, 9, 4));
    let err = pipeline::run(
        &run_job(dir.path(), "out", 6, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("--k 6 is larger than the gallery (5 items"),
        "{err}"
    );
    assert!(!dir.path().join("out").exists());
}

fn results_of(dir: &Path, out: &str) -> Vec<ResultRow> {
    read_results(&dir.join(out).join("results.parquet"))
}

#[test]
fn results_do_not_depend_on_memory_limit_or_threads() {
    let dir = tempfile::tempdir().unwrap();
    // dim 64: with a 16 MiB limit and one thread, pass 1 runs three gallery
    // chunks, and pass 2 two query blocks that each stream three gallery blocks.
    let c = case(7, 700, 5000, 3000, 64);
    write_case(dir.path(), &c);
    let small_limit: MemoryBudget = "16MiB".parse().unwrap();
    let two_threads = pipeline::run(
        &run_job(dir.path(), "two", 10, MemoryBudget::DEFAULT, 2),
        &Silent,
    )
    .unwrap();
    let one_thread = pipeline::run(
        &run_job(dir.path(), "one", 10, MemoryBudget::DEFAULT, 1),
        &Silent,
    )
    .unwrap();
    let small = pipeline::run(&run_job(dir.path(), "small", 10, small_limit, 1), &Silent).unwrap();
    assert_eq!(two_threads, one_thread);
    assert_eq!(two_threads, small);
    let reference = results_of(dir.path(), "two");
    for other in ["one", "small"] {
        let rows = results_of(dir.path(), other);
        let diffs: Vec<_> = reference
            .iter()
            .zip(&rows)
            .filter(|(a, b)| a != b)
            .take(5)
            .collect();
        assert!(
            diffs.is_empty() && reference.len() == rows.len(),
            "{other} is not bit-identical: {diffs:?}"
        );
    }
    check_against_reference(&c, &dir.path().join("small"), &small, 10);
}

/// A gallery too large for the limit streams in blocks read ahead on a
/// thread of their own (each read into the buffer of the block before), and
/// the ground-truth pass reads the positive rows alone: the same bits as the
/// cached gallery, whose scores come from its blocks. (dim 64, 20,000
/// gallery rows and a 24 MiB limit: on 1 thread the plan streams the
/// gallery in blocks of 8,192 rows, on 2 threads in blocks of 2,048, both
/// read ahead; the positives' tiles are those of these blocks.)
#[test]
fn a_gallery_read_ahead_gives_the_cached_results() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(9, 700, 20_000, 3000, 64);
    write_case(dir.path(), &c);
    let limit: MemoryBudget = "24MiB".parse().unwrap();
    let cached = pipeline::run(
        &run_job(dir.path(), "cached", 10, MemoryBudget::DEFAULT, 1),
        &Silent,
    )
    .unwrap();
    for threads in [1, 2] {
        let out = format!("streamed{threads}");
        let streamed =
            pipeline::run(&run_job(dir.path(), &out, 10, limit, threads), &Silent).unwrap();
        assert_eq!(cached, streamed, "{out}");
        assert_eq!(
            results_of(dir.path(), "cached"),
            results_of(dir.path(), &out),
            "{out}"
        );
    }
}

#[test]
fn multi_file_inputs_in_every_layout_give_the_same_results() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(8, 120, 900, 600, 16);
    write_case(dir.path(), &c);
    let single = pipeline::run(
        &run_job(dir.path(), "single", 10, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap();
    // Gallery: a directory of three parts in three layouts. Bank: a glob over
    // two parts, one List<f32>, one LargeList<f64>. Queries: FixedSizeList<f64>.
    let parts = dir.path().join("gallery_parts");
    std::fs::create_dir_all(parts.join("sub")).unwrap();
    write_table(
        &parts.join("a.parquet"),
        &c.gallery.slice(0, 300),
        Layout::FixedF32,
        false,
    );
    write_table(
        &parts.join("b.parquet"),
        &c.gallery.slice(300, 301),
        Layout::ListF32,
        false,
    );
    write_table(
        &parts.join("sub").join("c.parquet"),
        &c.gallery.slice(301, 900),
        Layout::FixedF64,
        false,
    );
    std::fs::write(parts.join("_SUCCESS"), b"").unwrap();
    write_table(
        &dir.path().join("bank-0.parquet"),
        &c.bank.slice(0, 250),
        Layout::ListF32,
        false,
    );
    write_table(
        &dir.path().join("bank-1.parquet"),
        &c.bank.slice(250, 600),
        Layout::LargeListF64,
        false,
    );
    write_table(
        &dir.path().join("q64.parquet"),
        &c.queries,
        Layout::FixedF64,
        false,
    );
    let mut job = run_job(dir.path(), "multi", 10, MemoryBudget::DEFAULT, 0);
    job.gallery = parts.display().to_string();
    job.bank = dir.path().join("bank-*.parquet").display().to_string();
    job.queries = dir.path().join("q64.parquet").display().to_string();
    let multi = pipeline::run(&job, &Silent).unwrap();
    assert_eq!(single, multi);
    assert_eq!(
        results_of(dir.path(), "single"),
        results_of(dir.path(), "multi")
    );
}

/// Writes `table` with its ids (and targets) as the arrays `ids` makes of
/// their strings.
fn write_with_ids(path: &Path, table: &Table, ids: impl Fn(&[String]) -> ArrayRef) {
    let mut columns = vec![
        ("id", ids(&table.ids)),
        ("embedding", embedding_array(table, Layout::FixedF32)),
    ];
    if let Some(targets) = &table.targets {
        columns.push(("target_id", ids(targets)));
    }
    write_columns(path, columns);
}

#[test]
fn dictionary_encoded_and_unsigned_ids_are_read_as_their_values() {
    use arrow::array::{DictionaryArray, UInt64Array};
    use arrow::datatypes::Int32Type;
    let dir = tempfile::tempdir().unwrap();
    let c = case(10, 40, 300, 200, 8);
    write_case(dir.path(), &c);
    let plain = pipeline::run(
        &run_job(dir.path(), "plain", 10, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap();
    let digits = |s: &String| {
        s.trim_start_matches(|ch: char| !ch.is_ascii_digit())
            .parse::<u64>()
            .unwrap()
    };
    // Unsigned ids come back as Int64: the plain results' ids as digits.
    let as_digits = |rows: Vec<ResultRow>| -> Vec<ResultRow> {
        rows.into_iter()
            .map(|mut r| {
                r.query_id = digits(&r.query_id).to_string();
                r.gallery_id = digits(&r.gallery_id).to_string();
                r
            })
            .collect()
    };
    type Ids = Box<dyn Fn(&[String]) -> ArrayRef>;
    let layouts: [(&str, Ids); 2] = [
        (
            "dictionary",
            Box::new(|ids| {
                Arc::new(DictionaryArray::<Int32Type>::from_iter(
                    ids.iter().map(String::as_str),
                ))
            }),
        ),
        (
            "unsigned",
            Box::new(move |ids| Arc::new(UInt64Array::from_iter_values(ids.iter().map(digits)))),
        ),
    ];
    for (name, ids) in layouts {
        let inputs = dir.path().join(name);
        std::fs::create_dir(&inputs).unwrap();
        write_with_ids(&inputs.join("queries.parquet"), &c.queries, &ids);
        write_with_ids(&inputs.join("gallery.parquet"), &c.gallery, &ids);
        write_with_ids(&inputs.join("bank.parquet"), &c.bank, &ids);
        let summary = pipeline::run(
            &run_job(&inputs, "out", 10, MemoryBudget::DEFAULT, 0),
            &Silent,
        )
        .unwrap();
        assert_eq!(plain, summary, "{name}");
        let (want, got) = (results_of(dir.path(), "plain"), results_of(&inputs, "out"));
        if name == "unsigned" {
            assert_eq!(as_digits(want), got, "{name}");
        } else {
            assert_eq!(want, got, "{name}");
        }
    }
}

/// A list of targets that names one gallery id twice counts it once: the
/// same figures and lists as the single id (it was excluded from its own
/// rank count twice: an overflow).
#[test]
fn a_target_list_repeating_an_id_counts_it_once() {
    use arrow::array::{ListBuilder, StringBuilder};
    let dir = tempfile::tempdir().unwrap();
    let c = case(12, 40, 300, 200, 8);
    write_case(dir.path(), &c);
    let plain = pipeline::run(
        &run_job(dir.path(), "plain", 10, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap();
    let inputs = dir.path().join("repeated");
    std::fs::create_dir(&inputs).unwrap();
    let mut lists = ListBuilder::new(StringBuilder::new());
    for target in c.queries.targets.as_ref().unwrap() {
        lists.values().append_value(target);
        lists.values().append_value(target);
        lists.append(true);
    }
    write_columns(
        &inputs.join("queries.parquet"),
        vec![
            (
                "id",
                Arc::new(arrow::array::StringArray::from(c.queries.ids.clone())) as ArrayRef,
            ),
            ("embedding", embedding_array(&c.queries, Layout::FixedF32)),
            ("target_id", Arc::new(lists.finish()) as ArrayRef),
        ],
    );
    for name in ["gallery", "bank"] {
        let from = dir.path().join(format!("{name}.parquet"));
        std::fs::copy(from, inputs.join(format!("{name}.parquet"))).unwrap();
    }
    let repeated = pipeline::run(
        &run_job(&inputs, "out", 10, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap();
    assert_eq!(plain, repeated);
    assert_eq!(results_of(dir.path(), "plain"), results_of(&inputs, "out"));
}

#[test]
fn half_precision_and_integer_ids_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = case(9, 60, 300, 200, 8);
    // Round the data to f16 first so the reference sees the same values.
    for t in [&mut c.queries, &mut c.gallery, &mut c.bank] {
        for v in t.data.iter_mut() {
            *v = <arrow::datatypes::Float16Type as arrow::datatypes::ArrowPrimitiveType>::Native::from_f32(*v).to_f32();
        }
    }
    write_table(
        &dir.path().join("queries.parquet"),
        &c.queries,
        Layout::FixedF16,
        true,
    );
    write_table(
        &dir.path().join("gallery.parquet"),
        &c.gallery,
        Layout::FixedF16,
        true,
    );
    write_table(
        &dir.path().join("bank.parquet"),
        &c.bank,
        Layout::FixedF16,
        true,
    );
    let summary = pipeline::run(
        &run_job(dir.path(), "out", 10, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap();
    // Integer ids come back as Int64; the helper prints them as digits.
    for id in c.gallery.ids.iter_mut().chain(c.queries.ids.iter_mut()) {
        *id = id
            .trim_start_matches(|ch: char| !ch.is_ascii_digit())
            .to_owned();
    }
    for t in c.queries.targets.as_mut().unwrap() {
        *t = t
            .trim_start_matches(|ch: char| !ch.is_ascii_digit())
            .to_owned();
    }
    check_against_reference(&c, &dir.path().join("out"), &summary, 10);
}

#[test]
fn stats_then_search_equals_run_and_records_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(10, 80, 400, 300, 8);
    write_case(dir.path(), &c);
    pipeline::run(
        &run_job(dir.path(), "run", 10, MemoryBudget::DEFAULT, 0),
        &Silent,
    )
    .unwrap();
    let path = |n: &str| dir.path().join(n).display().to_string();
    let stats_path: PathBuf = dir.path().join("stats.parquet");
    let methods = vec![MethodSpec::new("is", &[("beta", BETA)]).unwrap()];
    pipeline::run_stats(
        &StatsJob {
            methods: methods.clone(),
            ..StatsJob::new(
                path("gallery.parquet"),
                path("bank.parquet"),
                stats_path.clone(),
            )
        },
        &Silent,
    )
    .unwrap();
    let search = |methods: Vec<MethodSpec>, out: &str| SearchJob {
        methods,
        ..SearchJob::new(
            path("queries.parquet"),
            path("gallery.parquet"),
            Some(stats_path.clone()),
            dir.path().join(out),
        )
    };
    pipeline::run_search(&search(methods.clone(), "is.parquet"), &Silent).unwrap();
    let from_run: Vec<ResultRow> = results_of(dir.path(), "run")
        .into_iter()
        .filter(|r| r.method == "is")
        .collect();
    assert_eq!(read_results(&dir.path().join("is.parquet")), from_run);
    // The stats file matches the run's, and records what produced it.
    let meta = parquet_metadata(&stats_path);
    let get = |k: &str| {
        meta.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(get("hubnorm.methods").contains("\"beta\":20.0"), "{meta:?}");
    assert_eq!(get("hubnorm.bank.rows"), "300");
    assert_eq!(get("hubnorm.gallery.rows"), "400");
    let meta = parquet_metadata(&dir.path().join("is.parquet"));
    let get = |k: &str| {
        meta.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(get("hubnorm.queries.rows"), "80");
    assert_eq!(get("hubnorm.k"), "10");
    assert!(get("hubnorm.queries.path").ends_with("queries.parquet"));
    // A β the stats file does not hold is refused with what it does hold.
    let err = pipeline::run_search(
        &search(
            vec![MethodSpec::new("is", &[("beta", 5.0)]).unwrap()],
            "x.parquet",
        ),
        &Silent,
    )
    .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("is_beta5_correction"), "{err}");
}

/// Every method in one `run` (one stream over the banks, one over the
/// gallery) equals `stats` then `search` with the same methods, and the
/// stats file has one column per statistic, named by method and parameters.
#[test]
fn every_method_stats_then_search_equals_run() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(13, 120, 700, 400, 12);
    write_case(dir.path(), &c);
    let mut r = rng(14);
    let gallery_bank = random_table(&mut r, "gb", 350, 12);
    write_table(
        &dir.path().join("gallery_bank.parquet"),
        &gallery_bank,
        Layout::FixedF32,
        false,
    );
    let path = |n: &str| dir.path().join(n).display().to_string();
    // Every method with a gallery statistic (sinkhorn-pp has none: `run` only).
    let methods: Vec<MethodSpec> = MethodKind::all()
        .map(MethodSpec::default_for)
        .filter(|m| m.method().single_query(m).is_none())
        .map(|m| match m.kind().name() {
            "nnn" => MethodSpec::new("nnn", &[("alpha", m.get("alpha")), ("k", 32.0)]).unwrap(),
            _ => m,
        })
        .collect();
    let mut job = run_job(dir.path(), "run", 10, "32MiB".parse().unwrap(), 2);
    job.methods = methods.clone();
    job.gallery_bank = Some(path("gallery_bank.parquet"));
    let summary = pipeline::run(&job, &Silent).unwrap();
    let names: Vec<&str> = summary.methods.iter().map(|m| m.method.as_str()).collect();
    let registered: Vec<&str> = methods.iter().map(|m| m.kind().name()).collect();
    assert_eq!(
        names, registered,
        "every method with a statistic runs, in registry order"
    );
    let stats_path = dir.path().join("stats.parquet");
    pipeline::run_stats(
        &StatsJob {
            gallery_bank: Some(path("gallery_bank.parquet")),
            methods: methods.clone(),
            ..StatsJob::new(
                path("gallery.parquet"),
                path("bank.parquet"),
                stats_path.clone(),
            )
        },
        &Silent,
    )
    .unwrap();
    pipeline::run_search(
        &SearchJob {
            methods: methods.clone(),
            ..SearchJob::new(
                path("queries.parquet"),
                path("gallery.parquet"),
                Some(stats_path.clone()),
                dir.path().join("search.parquet"),
            )
        },
        &Silent,
    )
    .unwrap();
    assert_eq!(
        read_results(&dir.path().join("search.parquet")),
        results_of(dir.path(), "run")
    );
    let columns: Vec<String> = {
        let file = std::fs::File::open(&stats_path).unwrap();
        let builder =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        builder
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    };
    for expected in [
        "gallery_id",
        "is_beta20_correction",
        "dis_beta20_ka1_active",
        "nnn_alpha0.75_k32_topk",
        "csls_k10_correction",
        "gc_sorted_sims",
        "dn_lambda0.5_correction",
        "dual_is_beta1_20_beta2_1_gallery_lse_sum",
        "dual_dis_beta1_20_beta2_1_ka1_query_active",
        "sn_tau0.01_t10_correction",
        "dbsn_tau0.01_t10_correction",
        "dsl_theta0.01_log_normaliser",
        "mp_bank_std",
        "ls_k5_scale",
        "nicdm_k5_topk",
        "dissim_local_k5_correction",
    ] {
        assert!(
            columns.iter().any(|c| c == expected),
            "{expected} not in {columns:?}"
        );
    }
}

/// DESIGN.md decision 2: the inverted-softmax state is a monoid. Splitting the
/// bank into uneven partitions (one empty, one of a single row) and merging
/// in different orders equals one pass.
#[test]
fn inverted_softmax_state_merges_like_one_pass() {
    let mut r = rng(11);
    let dim = 16;
    let gallery = random_table(&mut r, "g", 1500, dim);
    let bank = random_table(&mut r, "b", 700, dim);
    let norm = |t: &Table| -> Vec<f32> {
        to_f64(t, true)
            .into_iter()
            .flatten()
            .map(|v| v as f32)
            .collect()
    };
    let (g, b) = (norm(&gallery), norm(&bank));
    let betas = [20.0f32, 1.0];
    let pass = |rows: std::ops::Range<usize>| {
        let mut states = vec![LogSumExp::default(); gallery.rows() * betas.len()];
        column_log_sum_exp(
            Rows::new(&b[rows.start * dim..rows.end * dim], dim),
            Rows::new(&g, dim),
            &betas,
            &mut states,
        )
        .unwrap();
        states
    };
    let whole = pass(0..700);
    let cuts = [0, 0, 1, 300, 301, 700]; // empty, single row, 299, single row, 399
    let parts: Vec<Vec<LogSumExp>> = cuts.windows(2).map(|w| pass(w[0]..w[1])).collect();
    let orders: [Vec<usize>; 3] = [
        vec![0, 1, 2, 3, 4],
        vec![4, 3, 2, 1, 0],
        vec![2, 0, 4, 1, 3],
    ];
    for order in orders {
        let mut merged = vec![LogSumExp::default(); whole.len()];
        for &p in &order {
            merged
                .iter_mut()
                .zip(&parts[p])
                .for_each(|(m, s)| m.merge(s));
        }
        for (m, w) in merged.iter().zip(&whole) {
            // Each block's terms are f32 exps relative to that block's own max
            // (error ≤ 3e-7 relative each), and that max is an f32 (β s up to
            // 20, one ulp 1.9e-6 there), so partitions cut off the tile grid
            // agree with one pass to within an ulp of the max, not bitwise
            // (the AVX2 kernel's rounding reaches 1.01e-6).
            assert!(
                (m.value() - w.value()).abs() <= f32::EPSILON as f64 * w.value().abs().max(1.0),
                "order {order:?}: {} vs {}",
                m.value(),
                w.value()
            );
        }
    }
    // Tree-shaped merging too: (p0 ⊕ p1) ⊕ (p2 ⊕ (p3 ⊕ p4)).
    let merge = |a: &[LogSumExp], b: &[LogSumExp]| -> Vec<LogSumExp> {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                let mut z = *x;
                z.merge(y);
                z
            })
            .collect()
    };
    let tree = merge(
        &merge(&parts[0], &parts[1]),
        &merge(&parts[2], &merge(&parts[3], &parts[4])),
    );
    for (m, w) in tree.iter().zip(&whole) {
        assert!((m.value() - w.value()).abs() <= f32::EPSILON as f64 * w.value().abs().max(1.0));
    }
}

/// Issue 3: every other per-gallery state (bounded top-k values for NNN and
/// CSLS, the sorted similarities of GC, the bank means of DN) merges over
/// the same uneven bank partitions in any order into one pass's state, and
/// the DIS activation state (per bank item, over the gallery) merges over
/// gallery chunks, one of them cut off the tile grid.
#[test]
fn every_bank_state_merges_like_one_pass() {
    let mut r = rng(12);
    let dim = 16;
    let (ng, nb) = (TILE_COLS + 300, 700);
    let gallery = random_table(&mut r, "g", ng, dim);
    let bank = random_table(&mut r, "b", nb, dim);
    let norm = |t: &Table| -> Vec<f32> {
        to_f64(t, true)
            .into_iter()
            .flatten()
            .map(|v| v as f32)
            .collect()
    };
    let (g, b) = (norm(&gallery), norm(&bank));
    let request = ColumnStatsRequest {
        betas: &[20.0],
        column_top_k: 16,
        column_top_rows: 5,
        neighbour_means: &[],
        keep_all: true,
        row_top_k: 2,
    };
    // One pass over bank rows `rows` and gallery columns `cols`.
    let pass = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
        let mut states = ColumnStates::new(cols.len(), &request, rows.len());
        let row_tops = column_statistics(
            Rows::new(&b[rows.start * dim..rows.end * dim], dim),
            Rows::new(&g[cols.start * dim..cols.end * dim], dim),
            rows.start as u32,
            cols.start as u32,
            &request,
            &mut states,
        )
        .unwrap();
        (states, row_tops)
    };
    let (whole, whole_tops) = pass(0..nb, 0..ng);
    let cuts = [0, 0, 1, 300, 301, nb];
    let parts: Vec<ColumnStates> = cuts.windows(2).map(|w| pass(w[0]..w[1], 0..ng).0).collect();
    for order in [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]] {
        let mut top = vec![TopValues::default(); ng];
        let mut neighbours = vec![TopK::new(5); ng];
        let mut sims = vec![SortedSimilarities::default(); ng];
        let mut moments = RowMoments::with_covariance();
        for &p in &order {
            for j in 0..ng {
                top[j].merge(&parts[p].top[j]);
                neighbours[j].merge(&parts[p].top_rows[j]);
                sims[j].merge(&SortedSimilarities::from_unsorted(parts[p].all[j].clone()));
            }
            let (r0, r1) = (cuts[p], cuts[p + 1]);
            let mut part = RowMoments::with_covariance();
            part.add_rows(&b[r0 * dim..r1 * dim], dim);
            moments.merge(&part);
        }
        // The GEMM may round a similarity differently (by an ulp) when the
        // bank rows are cut off the tile grid, as here: equal within 1e-6.
        let close = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6)
        };
        for j in 0..ng {
            assert_eq!(top[j].len(), 16);
            assert!(
                close(&top[j].sorted(), &whole.top[j].sorted()),
                "order {order:?} column {j}: top-k differs"
            );
            let rows = |t: &TopK| t.sorted().iter().map(|c| c.row).collect::<Vec<_>>();
            assert_eq!(
                rows(&neighbours[j]),
                rows(&whole.top_rows[j]),
                "order {order:?} column {j}: neighbour rows differ"
            );
            let one = SortedSimilarities::from_unsorted(whole.all[j].clone());
            assert!(
                close(sims[j].values(), one.values()),
                "order {order:?} column {j}: sorted similarities differ"
            );
        }
        let mut one = RowMoments::with_covariance();
        one.add_rows(&b, dim);
        let (merged, one) = (moments.finish(), one.finish());
        assert_eq!(merged.rows, one.rows);
        for (x, y) in merged.mean.iter().zip(&one.mean) {
            assert!((x - y).abs() < 1e-12);
        }
        let (c, c1) = (merged.covariance.unwrap(), one.covariance.unwrap());
        assert_eq!(c.dim(), (dim, dim));
        assert!(c.iter().zip(&c1).all(|(x, y)| (x - y).abs() < 1e-12));
    }
    // Activation: the bank against gallery chunks [0, 1000), [1000, ng) and back to front.
    let mut one = ActivationState::new(nb, 2);
    one.merge_rows(0, &whole_tops);
    for chunks in [vec![0..1000, 1000..ng], vec![1000..ng, 0..1000]] {
        let mut merged = ActivationState::default();
        for cols in chunks {
            let mut part = ActivationState::new(nb, 2);
            part.merge_rows(0, &pass(0..nb, cols).1);
            merged.merge(&part);
        }
        assert_eq!(merged.activated(ng), one.activated(ng));
        assert_eq!(merged, one);
    }
    assert!(one.activated(ng).iter().filter(|&&a| a).count() >= 2);
}

/// A query block smaller than one strip on two threads: the gallery columns
/// are split between tasks and merged. Same results as one thread, and as the
/// reference.
#[test]
fn small_query_block_split_over_gallery_columns_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(12, 30, 2 * TILE_COLS + 5, 300, 16);
    write_case(dir.path(), &c);
    let two = pipeline::run(
        &run_job(dir.path(), "two", 10, MemoryBudget::DEFAULT, 2),
        &Silent,
    )
    .unwrap();
    let one = pipeline::run(
        &run_job(dir.path(), "one", 10, MemoryBudget::DEFAULT, 1),
        &Silent,
    )
    .unwrap();
    assert_eq!(two, one);
    assert_eq!(results_of(dir.path(), "two"), results_of(dir.path(), "one"));
    check_against_reference(&c, &dir.path().join("two"), &two, 10);
}

/// A stats file whose statistic column has the wrong type is bad input
/// (exit code 2, the file and column named), not a panic.
#[test]
fn a_stats_column_of_the_wrong_type_is_refused() {
    use arrow::array::{ArrayRef, BooleanArray, StringArray};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let c = case(15, 5, 30, 20, 4);
    write_case(dir.path(), &c);
    let stats = dir.path().join("stats.parquet");
    let ids: ArrayRef = Arc::new(StringArray::from(c.gallery.ids.clone()));
    let flags: ArrayRef = Arc::new(BooleanArray::from(vec![true; c.gallery.rows()]));
    write_columns(
        &stats,
        vec![("gallery_id", ids), ("is_beta20_correction", flags)],
    );
    let path = |n: &str| dir.path().join(n).display().to_string();
    let err = pipeline::run_search(
        &SearchJob {
            methods: vec![MethodSpec::new("is", &[("beta", 20.0)]).unwrap()],
            k: 5,
            ..SearchJob::new(
                path("queries.parquet"),
                path("gallery.parquet"),
                Some(stats),
                dir.path().join("out.parquet"),
            )
        },
        &Silent,
    )
    .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let message = err.to_string();
    assert!(
        message.contains("is_beta20_correction") && message.contains("expected Float64"),
        "{message}"
    );
    assert!(!dir.path().join("out.parquet").exists());
}

/// `table`'s rows in record batches of the given sizes, cycled (0 included:
/// an empty batch must be skipped).
fn in_batches(
    table: &arrow::array::RecordBatch,
    sizes: &[usize],
) -> Vec<arrow::array::RecordBatch> {
    let mut batches = Vec::new();
    let mut start = 0;
    for &size in sizes.iter().cycle() {
        if start >= table.num_rows() {
            break;
        }
        let size = size.min(table.num_rows() - start);
        batches.push(table.slice(start, size));
        start += size;
    }
    batches
}

#[test]
fn in_memory_tables_read_like_their_files() {
    use hubnorm::source::{memory, EmbeddingTable};
    let dir = tempfile::tempdir().unwrap();
    // With a 16 MiB limit and one thread, pass 1 streams the gallery in
    // chunks and pass 2 its blocks: reads resume inside the batches.
    let c = case(9, 700, 5000, 3000, 64);
    write_case(dir.path(), &c);
    let small_limit: MemoryBudget = "16MiB".parse().unwrap();
    let job = run_job(dir.path(), "files", 10, small_limit, 1);
    let from_files = pipeline::run(&job, &Silent).unwrap();
    let register = |name: &str, sizes: &[usize]| {
        let table = read_parquet(&dir.path().join(format!("{name}.parquet")));
        memory::register(name, table.schema(), in_batches(&table, sizes)).unwrap()
    };
    let queries = register("queries", &[97, 0, 1, 300]);
    let gallery = register("gallery", &[1000, 7, 0, 2500, 13]);
    let bank = register("bank", &[3000]);
    let in_memory = RunJob {
        queries: queries.path().to_owned(),
        gallery: gallery.path().to_owned(),
        bank: bank.path().to_owned(),
        ..run_job(dir.path(), "memory", 10, small_limit, 1)
    };
    let from_memory = pipeline::run(&in_memory, &Silent).unwrap();
    assert_eq!(from_files.methods, from_memory.methods);
    assert_eq!(
        results_of(dir.path(), "files"),
        results_of(dir.path(), "memory")
    );

    // Reads from a row inside a batch, over a range, and of a sample.
    let options = hubnorm::options::ReadOptions::default();
    let file = EmbeddingTable::open("gallery", &job.gallery, &options, false).unwrap();
    let held = EmbeddingTable::open("gallery", gallery.path(), &options, false).unwrap();
    assert_eq!((held.rows, held.dim), (file.rows, file.dim));
    let rows_of = |table: &EmbeddingTable, range: std::ops::Range<u64>| {
        let blocks = table.blocks_in(333, range).unwrap();
        let blocks: Vec<_> = blocks.map(|b| b.unwrap()).collect();
        let data: Vec<f32> = blocks.iter().flat_map(|b| b.data.clone()).collect();
        let ids: Vec<_> = blocks.iter().map(|b| b.ids.to_data()).collect();
        (
            data,
            ids.len(),
            blocks.iter().map(|b| b.first_row).collect::<Vec<_>>(),
        )
    };
    for range in [0..5000, 1003..1010, 1007..4321, 4999..5000] {
        assert_eq!(rows_of(&file, range.clone()), rows_of(&held, range));
    }
    let sampled = |table: &EmbeddingTable| {
        let sample = table.sampled(700, 3).unwrap();
        let ids: Vec<_> = sample
            .blocks(256)
            .map(|b| b.unwrap().ids.to_data())
            .collect();
        ids
    };
    assert_eq!(sampled(&file), sampled(&held));

    // A bad row is named by the table's path, with the row in the table.
    let table = read_parquet(&dir.path().join("gallery.parquet"));
    let mut batches = in_batches(&table, &[1000, 7]);
    let bad_row = 1003;
    let position = table.schema().index_of("embedding").unwrap();
    let mut columns = batches[1].columns().to_vec();
    let values: Vec<f32> = {
        use arrow::array::AsArray;
        let list = columns[position].as_fixed_size_list();
        let mut v = list
            .values()
            .as_primitive::<arrow::datatypes::Float32Type>()
            .values()
            .to_vec();
        v[(bad_row - 1000) * 64 + 5] = f32::NAN;
        v
    };
    columns[position] = std::sync::Arc::new(
        arrow::array::FixedSizeListArray::try_new(
            std::sync::Arc::new(arrow::datatypes::Field::new(
                "item",
                arrow::datatypes::DataType::Float32,
                true,
            )),
            64,
            std::sync::Arc::new(arrow::array::Float32Array::from(values)),
            None,
        )
        .unwrap(),
    );
    batches[1] = arrow::array::RecordBatch::try_new(batches[1].schema(), columns).unwrap();
    let bad = memory::register("gallery", table.schema(), batches).unwrap();
    let failed = pipeline::run(
        &RunJob {
            gallery: bad.path().to_owned(),
            ..run_job(dir.path(), "bad", 10, small_limit, 1)
        },
        &Silent,
    )
    .unwrap_err();
    let message = failed.to_string();
    assert!(
        message.contains(bad.path())
            && message.contains("row 1003")
            && message.contains("embedding"),
        "{message}"
    );
    assert!(!dir.path().join("bad").join("results.parquet").exists());
}

/// The ground truth's rank compares its score with the bits the search's
/// tile gives it: with an exact copy of every gallery item under another
/// id (in another tile), each target ties with its copy, so
/// every rank is exactly 1.5, exact or screened. (A target score rounded
/// from f64 differs from the tile's f32 in the last place for many pairs,
/// and counted the copy as above or below.)
#[test]
fn a_copy_of_the_target_ties_with_it_in_the_rank() {
    use hubnorm::options::Precision;
    if !hubnorm::kernel::gemm::reproducible() {
        eprintln!("SKIPPED: the f32 tiles' bits are not reproduced on this CPU (no FMA)");
        return;
    }
    // Without AVX512_BF16 the screen runs in scalar code: the same lists.
    hubnorm::kernel::bf16::allow_scalar_screen();
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng(71);
    let mut gallery = random_table(&mut r, "g", 2048, 384);
    for i in 0..2048 {
        gallery.ids.push(format!("copy{i}"));
        let row = gallery.row(i).to_vec();
        gallery.data.extend(row);
    }
    let queries = queries_near(&mut r, &gallery, 300, 0.01);
    let path = |n: &str| dir.path().join(n);
    write_table(&path("gallery.parquet"), &gallery, Layout::FixedF32, false);
    write_table(&path("queries.parquet"), &queries, Layout::FixedF32, false);
    for precision in [Precision::Exact, Precision::Screened] {
        let out = path(&format!("{}.parquet", precision.name()));
        let job = SearchJob {
            methods: vec![MethodSpec::new("none", &[]).unwrap()],
            options: PassOptions {
                precision,
                ..PassOptions::default()
            },
            ..SearchJob::new(
                path("queries.parquet").display().to_string(),
                path("gallery.parquet").display().to_string(),
                None,
                out,
            )
        };
        let summary = pipeline::run_search(&job, &Silent).unwrap();
        let quality = summary.methods[0].quality.as_ref().expect("ground truth");
        assert_eq!(quality.queries, 300);
        assert_eq!(
            (quality.mean_rank, quality.median_rank),
            (1.5, 1.5),
            "{}",
            precision.name()
        );
    }
}
