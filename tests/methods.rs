//! The methods of METHODS.md beyond `none` and `is` (dis, nnn, csls, gc, dn,
//! dual-is, dual-dis) against the dense f64 reference of
//! tests/common/reference.rs: scores to 1e-5, identical rankings (up to
//! near-ties f32 may swap), raw scores, the row order of results.parquet, and
//! the summary's R@1/5/10, MRR and k-occurrence skewness, with all methods of
//! a case in one run (the single-pass multi-method job). Then the spec's
//! golden NNN example, CSLS ranking like NNN with α = ½, DIS and dual-DIS
//! gating on explicit vectors, DN's two gallery means, and the refusals: the
//! dual methods without a gallery bank, gc beyond the memory limit (and its
//! seeded `--bank-sample` way out).
mod common;

use std::collections::HashMap;
use std::path::Path;

use arrow::record_batch::RecordBatch;
use common::reference::{rank_bounds, top_k, Dense, Method, Scores};
use common::*;
use hubnorm::kernel::{TILE_COLS, TILE_ROWS};
use hubnorm::options::{BankSample, MethodKind, MethodSpec, PassOptions};
use hubnorm::pipeline::{self, RunJob, RunSummary, StatsJob};
use hubnorm::progress::Silent;
use hubnorm::HubnormError;

/// Absolute tolerance on every score (similarity units).
const TOL: f64 = 1e-5;

/// The methods this file covers, in registry order.
const KINDS: [&str; 12] = [
    "is",
    "dis",
    "nnn",
    "csls",
    "gc",
    "dn",
    "dual-is",
    "dual-dis",
    "mp",
    "ls",
    "nicdm",
    "dissim-local",
];

// ------------------------------------------------------------------ helpers

/// The reference's view of a library method (and so of its parameters).
fn reference_of(spec: &MethodSpec) -> Method {
    let (get, count) = (|n: &str| spec.get(n), |n: &str| spec.count(n));
    match spec.kind().name() {
        "none" => Method::None,
        "is" => Method::Is { beta: get("beta") },
        "dis" => Method::Dis {
            beta: get("beta"),
            activation_k: count("ka"),
        },
        "nnn" => Method::Nnn {
            alpha: get("alpha"),
            k: count("k"),
        },
        "csls" => Method::Csls { k: count("k") },
        "gc" => Method::Gc,
        "dn" => Method::Dn {
            lambda: get("lambda"),
        },
        "dual-is" => Method::DualIs {
            beta1: get("beta1"),
            beta2: get("beta2"),
        },
        "dual-dis" => Method::DualDis {
            beta1: get("beta1"),
            beta2: get("beta2"),
            activation_k: count("ka"),
        },
        "mp" => Method::Mp,
        "ls" => Method::Ls { k: count("k") },
        "nicdm" => Method::Nicdm { k: count("k") },
        "dissim-local" => Method::DissimLocal { k: count("k") },
        other => panic!("no reference for {other}"),
    }
}

/// Every covered method at its defaults (METHODS.md's where it gives them).
fn defaults() -> Vec<MethodSpec> {
    KINDS
        .into_iter()
        .map(|name| MethodSpec::new(name, &[]).unwrap())
        .collect()
}

/// Every covered method with its defaults, except `nnn` with a smaller k
/// (the default 128 needs at least 128 bank rows).
fn defaults_with_nnn_k(k: usize) -> Vec<MethodSpec> {
    defaults()
        .into_iter()
        .map(|m| match m.kind().name() {
            "nnn" => MethodSpec::new("nnn", &[("alpha", m.get("alpha")), ("k", k as f64)]).unwrap(),
            _ => m,
        })
        .collect()
}

/// Every covered method with parameters away from the defaults, so that a
/// parameter the library ignores (or a default it hard-codes) shows.
fn non_default_methods() -> Vec<MethodSpec> {
    vec![
        MethodSpec::new("is", &[("beta", 12.0)]).unwrap(),
        MethodSpec::new("dis", &[("beta", 10.0), ("ka", 2.0)]).unwrap(),
        MethodSpec::new("nnn", &[("alpha", 0.6), ("k", 16.0)]).unwrap(),
        MethodSpec::new("csls", &[("k", 5.0)]).unwrap(),
        MethodSpec::new("dn", &[("lambda", 0.3)]).unwrap(),
        MethodSpec::new("dual-is", &[("beta1", 10.0), ("beta2", 2.0)]).unwrap(),
        MethodSpec::new("dual-dis", &[("beta1", 10.0), ("beta2", 2.0), ("ka", 3.0)]).unwrap(),
        MethodSpec::new("mp", &[]).unwrap(),
        MethodSpec::new("ls", &[("k", 7.0)]).unwrap(),
        MethodSpec::new("nicdm", &[("k", 3.0)]).unwrap(),
        MethodSpec::new("dissim-local", &[("k", 2.0)]).unwrap(),
    ]
}

/// The non-default methods whose pass-1 rows are finished chunk by chunk
/// (no activation sets, no Sinkhorn potentials): those a cluster shard
/// computes alone.
fn chunk_by_chunk_methods() -> Vec<MethodSpec> {
    non_default_methods()
        .into_iter()
        .filter(|m| !m.has_late_columns())
        .collect()
}

struct Case {
    queries: Table,
    gallery: Table,
    bank: Table,
    gallery_bank: Option<Table>,
}

impl Case {
    /// Gallery and banks in the cone of `random_table`; queries near a random
    /// gallery item, which is their target, with noise growing with the
    /// dimension so that R@1 stays well below 1. No gallery bank when `ngb` is 0.
    fn random(seed: u64, nq: usize, ng: usize, nb: usize, ngb: usize, dim: usize) -> Case {
        let mut r = rng(seed);
        let gallery = random_table(&mut r, "g", ng, dim);
        let queries = queries_near(&mut r, &gallery, nq, 0.25 * (dim as f32).sqrt());
        let bank = random_table(&mut r, "b", nb, dim);
        let gallery_bank = (ngb > 0).then(|| random_table(&mut r, "h", ngb, dim));
        Case {
            queries,
            gallery,
            bank,
            gallery_bank,
        }
    }

    fn write(&self, dir: &Path) {
        write_table(
            &dir.join("queries.parquet"),
            &self.queries,
            Layout::FixedF32,
            false,
        );
        write_table(
            &dir.join("gallery.parquet"),
            &self.gallery,
            Layout::FixedF32,
            false,
        );
        write_table(
            &dir.join("bank.parquet"),
            &self.bank,
            Layout::FixedF32,
            false,
        );
        if let Some(h) = &self.gallery_bank {
            write_table(
                &dir.join("gallery_bank.parquet"),
                h,
                Layout::FixedF32,
                false,
            );
        }
    }

    fn dense(&self, normalize: bool) -> Dense {
        Dense::new(
            &self.queries,
            &self.gallery,
            &self.bank,
            self.gallery_bank.as_ref(),
            normalize,
        )
    }

    /// A job over the files `write` wrote (the gallery bank when the case has one).
    fn job(&self, dir: &Path, methods: Vec<MethodSpec>, k: usize, out: &str) -> RunJob {
        let path = |n: &str| dir.join(n).display().to_string();
        RunJob {
            queries: path("queries.parquet"),
            gallery: path("gallery.parquet"),
            bank: path("bank.parquet"),
            gallery_bank: self
                .gallery_bank
                .as_ref()
                .map(|_| path("gallery_bank.parquet")),
            bank_sample: None,
            transductive: false,
            methods,
            k,
            out_dir: dir.join(out),
            overwrite: false,
            options: PassOptions::default(),
            cluster: None,
            checkpoint: Default::default(),
        }
    }
}

/// Fails unless `dense` gates every query of DIS/dual-DIS with a margin: a
/// fixture where f32 rounding could flip a gating decision proves nothing.
fn assert_gating_is_robust(dense: &Dense, methods: &[MethodSpec]) {
    for m in methods {
        let activation_k = match reference_of(m) {
            Method::Dis { activation_k, .. } | Method::DualDis { activation_k, .. } => activation_k,
            _ => continue,
        };
        let fragile = dense.fragile_gating(activation_k, 1e-6);
        assert_eq!(
            fragile, 0,
            "fixture: {fragile} queries' gating is decided by a near-tie; choose another seed"
        );
    }
}

/// Which gating branches the fixture exercises, per dis/dual-dis method.
fn gating_branches(dense: &Dense, spec: &MethodSpec) -> Option<[usize; 4]> {
    let activation_k = match reference_of(spec) {
        Method::Dis { activation_k, .. } | Method::DualDis { activation_k, .. } => activation_k,
        _ => return None,
    };
    let mut n = [0usize; 4]; // (A_Q, A_G): both, only A_Q, only A_G, neither
    for g in dense.gating(activation_k) {
        n[match g {
            (true, true) => 0,
            (true, false) => 1,
            (false, true) => 2,
            (false, false) => 3,
        }] += 1;
    }
    Some(n)
}

/// Fails unless the fixture exercises every gating branch of `spec`: both of
/// dis (top-1 in A or not), all four of dual-dis.
fn assert_branches_exercised(spec: &MethodSpec, b: [usize; 4]) {
    let ok = match spec.kind().name() {
        "dual-dis" => b.iter().all(|&n| n > 0),
        _ => b[0] + b[1] > 0 && b[2] + b[3] > 0,
    };
    assert!(
        ok,
        "fixture: {} gating branches (both, only A_Q, only A_G, neither) = {b:?}",
        spec.kind()
    );
}

/// Compares a run's results.parquet and summary with the reference, for the
/// baseline and every method of `methods` (in that order, as `run` writes
/// them). `k` must be at least 10: the skewness is over the top-10 lists.
fn check_against_reference(
    case: &Case,
    dense: &Dense,
    out_dir: &Path,
    summary: &RunSummary,
    methods: &[MethodSpec],
    k: usize,
) {
    let n = case.gallery.rows();
    let nq = case.queries.rows();
    assert!(k >= 10 && n >= 10, "the check needs top-10 lists");
    let mut all = vec![Method::None];
    all.extend(methods.iter().map(reference_of));
    let names: Vec<&str> = all.iter().map(|m| m.name()).collect();
    let summary_names: Vec<&str> = summary.methods.iter().map(|m| m.method.as_str()).collect();
    assert_eq!(
        summary_names, names,
        "summary: baseline first, then the job's methods in order"
    );
    assert_eq!(summary.queries, nq as u64);
    assert_eq!(summary.gallery, n as u64);
    assert_eq!(summary.k, k);

    // Row order: query → method (job order, baseline first) → rank.
    let rows = read_results(&out_dir.join("results.parquet"));
    let per = k.min(n);
    let nm = names.len();
    assert_eq!(
        rows.len(),
        nq * nm * per,
        "one row per query, method and rank"
    );
    for (i, row) in rows.iter().enumerate() {
        let (q, m, r) = (i / (nm * per), i / per % nm, i % per);
        assert!(
            row.query_id == case.queries.ids[q] && row.method == names[m] && row.rank == r as i32 + 1,
            "results row {i} is ({}, {}, rank {}); expected ({}, {}, rank {}): rows go query → method → rank",
            row.query_id,
            row.method,
            row.rank,
            case.queries.ids[q],
            names[m],
            r + 1
        );
    }

    let gallery_row: HashMap<&str, usize> = case
        .gallery
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let targets = case.queries.targets.as_ref().expect("queries have targets");
    for (m, method) in all.iter().enumerate() {
        let scores = dense.scores(*method);
        let mut reference_counts = vec![0f64; n];
        let mut our_counts = vec![0f64; n];
        let mut same_top10 = true;
        // The reference's rank of each target, and bounds on it where another
        // item is within f32 rounding of the target (the library may then
        // rank the target either way).
        let mut ranks: Vec<(f64, f64, f64)> = Vec::with_capacity(nq);
        for q in 0..nq {
            let start = (q * nm + m) * per;
            let ours: Vec<(usize, f32, f32)> = rows[start..start + per]
                .iter()
                .map(|r| (gallery_row[r.gallery_id.as_str()], r.score, r.raw_score))
                .collect();
            let context = format!("{} query {}", method.name(), case.queries.ids[q]);
            for &(g, _, raw) in &ours {
                let s = dense.qg[q][g];
                assert!(
                    (raw as f64 - s).abs() <= TOL,
                    "{context}: raw_score {raw} of gallery row {g}, but s(q, g) = {s}"
                );
            }
            let target = gallery_row[targets[q].as_str()];
            let (top10, rank, (lowest, highest)) = match &scores {
                Scores::Real(s) => {
                    let pairs: Vec<(usize, f32)> =
                        ours.iter().map(|&(g, score, _)| (g, score)).collect();
                    assert_ranking_matches(&pairs, &s[q], per, TOL, &context);
                    (
                        top_k(&s[q], 10),
                        reference_rank(&s[q], target),
                        rank_bounds(&s[q], target, 1e-6),
                    )
                }
                Scores::Gc(gc) => {
                    gc.assert_ranking_matches(q, &ours, per, TOL, &context);
                    (
                        gc.topk(q, 10),
                        gc.rank(q, target),
                        gc.rank_bounds(q, target),
                    )
                }
            };
            let mut ours10: Vec<usize> = ours[..10].iter().map(|&(g, _, _)| g).collect();
            let mut want10 = top10.clone();
            for &g in &want10 {
                reference_counts[g] += 1.0;
            }
            for &g in &ours10 {
                our_counts[g] += 1.0;
            }
            ours10.sort_unstable();
            want10.sort_unstable();
            same_top10 &= ours10 == want10;
            ranks.push((rank, lowest, highest));
        }

        let s = &summary.methods[m];
        let name = method.name();
        let quality = s
            .quality
            .as_ref()
            .expect("queries have targets, so the summary has R@K");
        let nqf = nq as f64;
        let uncertain = ranks.iter().filter(|r| r.1 != r.2).count();
        let within = |label: &str, got: f64, f: &dyn Fn(f64) -> f64| {
            // f is monotone in the rank: its mean over the bounds brackets the truth.
            let exact = ranks.iter().map(|r| f(r.0)).sum::<f64>() / nqf;
            let a = ranks.iter().map(|r| f(r.1)).sum::<f64>() / nqf;
            let b = ranks.iter().map(|r| f(r.2)).sum::<f64>() / nqf;
            let (lo, hi) = (a.min(b), a.max(b));
            assert!(
                got >= lo - 1e-9 && got <= hi + 1e-9,
                "{name}: {label} {got} vs reference {exact} (bounds {lo}..{hi} from {uncertain} targets within rounding of another item)"
            );
        };
        within("R@1", quality.recall_at(1).unwrap(), &|r| {
            (r <= 1.0) as u8 as f64
        });
        within("R@5", quality.recall_at(5).unwrap(), &|r| {
            (r <= 5.0) as u8 as f64
        });
        within("R@10", quality.recall_at(10).unwrap(), &|r| {
            (r <= 10.0) as u8 as f64
        });
        within("MRR", quality.mrr, &|r| 1.0 / r);
        within("MnR", quality.mean_rank, &|r| r);
        let (skew, of) = if same_top10 {
            (
                reference_skewness(&reference_counts),
                "the reference's top-10 lists",
            )
        } else {
            // A near-tie moved an item across rank 10 (allowed above): the
            // summary must still describe the lists that were written.
            (reference_skewness(&our_counts), "the written top-10 lists")
        };
        assert!(
            (s.k_occurrence_skewness - skew).abs() < 1e-9,
            "{name}: k-occurrence skewness {} vs {skew} of {of}",
            s.k_occurrence_skewness
        );
        eprintln!(
            "{name:9} R@1 {:.4} R@10 {:.4} MRR {:.4} skew {:.3} (targets within rounding of another item: {uncertain}, same top-10: {same_top10})",
            quality.recall_at(1).unwrap(), quality.recall_at(10).unwrap(), quality.mrr, s.k_occurrence_skewness
        );
    }
}

/// Runs `job` with `threads` under (within 64 KiB of) the smallest memory
/// limit the library accepts, found by bisection, so that every pass works in
/// the smallest blocks its plan allows (several gallery chunks, bank blocks
/// and query blocks) whatever per-row state the methods need. The outputs
/// left in `job.out_dir` are those of the returned run.
fn run_under_tightest_limit(job: &mut RunJob, threads: usize) -> RunSummary {
    job.options.threads = threads;
    job.overwrite = true;
    let attempt = |job: &mut RunJob, kib: usize| -> Option<RunSummary> {
        job.options.memory = format!("{kib}KiB").parse().unwrap();
        match pipeline::run(job, &Silent) {
            Ok(summary) => Some(summary),
            Err(HubnormError::Budget(_)) => None,
            Err(other) => panic!("--memory-limit {kib}KiB: {other}"),
        }
    };
    let (mut refused, mut accepted) = (1024usize, 64 * 1024usize);
    assert!(attempt(job, refused).is_none(), "1 MiB cannot be enough");
    attempt(job, accepted).expect("64 MiB is enough for this job");
    while accepted - refused > 64 {
        let mid = (refused + accepted) / 2;
        match attempt(job, mid) {
            Some(_) => accepted = mid,
            None => refused = mid,
        }
    }
    eprintln!("smallest accepted --memory-limit: {accepted}KiB");
    attempt(job, accepted).expect("accepted before")
}

fn results_in(dir: &Path, out: &str) -> Vec<ResultRow> {
    read_results(&dir.join(out).join("results.parquet"))
}

/// Rows of one method and query, in rank order.
fn list<'a>(rows: &'a [ResultRow], method: &str, query: &str) -> Vec<&'a ResultRow> {
    rows.iter()
        .filter(|r| r.method == method && r.query_id == query)
        .collect()
}

/// A small table of explicit rows.
fn explicit(prefix: &str, rows: &[&[f32]]) -> Table {
    Table {
        ids: (0..rows.len()).map(|i| format!("{prefix}{i}")).collect(),
        dim: rows[0].len(),
        data: rows.iter().flat_map(|r| r.iter().copied()).collect(),
        targets: None,
    }
}

fn raw_dot_products() -> PassOptions {
    let mut options = PassOptions::default();
    options.read.normalize = false;
    options
}

// ------------------------------------------------------------------ tests

#[test]
fn defaults_and_names_follow_the_spec() {
    let expected = [
        Method::Is { beta: 20.0 },
        Method::Dis {
            beta: 20.0,
            activation_k: 1,
        },
        Method::Nnn {
            alpha: 0.75,
            k: 128,
        },
        Method::Csls { k: 10 },
        Method::Gc,
        Method::Dn { lambda: 0.5 },
        Method::DualIs {
            beta1: 20.0,
            beta2: 1.0,
        },
        Method::DualDis {
            beta1: 20.0,
            beta2: 1.0,
            activation_k: 1,
        },
        Method::Mp,
        Method::Ls { k: 5 },
        Method::Nicdm { k: 5 },
        Method::DissimLocal { k: 5 },
    ];
    assert_eq!(defaults().len(), expected.len());
    for (spec, want) in defaults().iter().zip(expected) {
        assert_eq!(
            reference_of(spec),
            want,
            "default parameters of {:?}",
            spec.kind()
        );
        assert_eq!(spec.kind().name(), want.name());
    }
}

/// Every method in one run, sizes just past the tile shape in every direction
/// (queries and both banks against TILE_ROWS, the gallery against
/// TILE_COLS), defaults everywhere (nnn with its k = 128).
#[test]
fn every_method_matches_reference_past_the_tile_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(
        101,
        TILE_ROWS + 2,
        TILE_COLS + 1,
        TILE_ROWS + 3,
        TILE_ROWS + 5,
        28,
    );
    case.write(dir.path());
    let dense = case.dense(true);
    let methods = defaults();
    assert_gating_is_robust(&dense, &methods);
    for m in &methods {
        if let Some(b) = gating_branches(&dense, m) {
            eprintln!(
                "{}: gating (both, only A_Q, only A_G, neither) = {b:?}",
                m.kind().name()
            );
            assert_branches_exercised(m, b);
        }
    }
    let summary =
        pipeline::run(&case.job(dir.path(), methods.clone(), 10, "out"), &Silent).unwrap();
    check_against_reference(
        &case,
        &dense,
        &dir.path().join("out"),
        &summary,
        &methods,
        10,
    );
}

/// A gallery and banks below one tile, k equal to the gallery size (every list
/// is the whole gallery, so gc's many tied counts are ordered by the raw score
/// through the end), nnn with k = 16 of a 24-row bank.
#[test]
fn every_method_matches_reference_on_a_small_case_with_full_lists() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(102, 9, 60, 24, 20, 24);
    case.write(dir.path());
    let dense = case.dense(true);
    let methods = defaults_with_nnn_k(16);
    assert_gating_is_robust(&dense, &methods);
    let summary =
        pipeline::run(&case.job(dir.path(), methods.clone(), 60, "out"), &Silent).unwrap();
    check_against_reference(
        &case,
        &dense,
        &dir.path().join("out"),
        &summary,
        &methods,
        60,
    );
}

/// Several gallery chunks, bank blocks and query blocks: the tightest memory
/// limit the library accepts, one thread, parameters away from the defaults.
/// gc is left out: its sorted bank similarities (1543 × 4196) would set the
/// limit instead.
#[test]
fn every_method_matches_reference_out_of_core() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(
        103,
        TILE_ROWS + 40,
        2 * TILE_COLS + 100,
        3 * TILE_ROWS + 7,
        TILE_ROWS + 20,
        40,
    );
    case.write(dir.path());
    let dense = case.dense(true);
    let methods = non_default_methods();
    assert_gating_is_robust(&dense, &methods);
    for m in &methods {
        if let Some(b) = gating_branches(&dense, m) {
            eprintln!(
                "{}: gating (both, only A_Q, only A_G, neither) = {b:?}",
                m.kind().name()
            );
            assert_branches_exercised(m, b);
        }
    }
    let mut job = case.job(dir.path(), methods.clone(), 10, "out");
    let summary = run_under_tightest_limit(&mut job, 1);
    check_against_reference(
        &case,
        &dense,
        &dir.path().join("out"),
        &summary,
        &methods,
        10,
    );
}

/// README: results are bit-identical whatever the memory limit and the thread
/// count. The tightest accepted limit on one thread against the default limit
/// on two, for every method but gc.
#[test]
fn every_method_is_independent_of_memory_limit_and_threads() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(
        104,
        TILE_ROWS + 40,
        2 * TILE_COLS + 100,
        3 * TILE_ROWS + 7,
        TILE_ROWS + 20,
        32,
    );
    case.write(dir.path());
    let mut methods = defaults_with_nnn_k(16);
    methods.retain(|m| *m != MethodSpec::new("gc", &[]).unwrap());
    let mut tight = case.job(dir.path(), methods.clone(), 10, "tight");
    let tight_summary = run_under_tightest_limit(&mut tight, 1);
    let mut wide = case.job(dir.path(), methods, 10, "wide");
    wide.options.threads = 2;
    let wide_summary = pipeline::run(&wide, &Silent).unwrap();
    assert_eq!(tight_summary, wide_summary);
    let (a, b) = (
        results_in(dir.path(), "tight"),
        results_in(dir.path(), "wide"),
    );
    assert_eq!(a.len(), b.len());
    let diffs: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).take(5).collect();
    assert!(
        diffs.is_empty(),
        "results differ between memory limits/threads: {diffs:?}"
    );
}

/// A pair's similarity has the same bits in every tile, so the rows of a
/// cluster task's shard are those of the whole pass whatever the shard's
/// size: pass 1 over shards of one, five and 64 gallery rows against a
/// bank whose last tile has 40 rows, pass 2 over shards of one and three
/// queries (k rows each), at a depth beyond 512, exact and screened. (The `gemm` crate
/// sums one-row and one-column tiles, tiles of at most 256 elements and,
/// at such depths, tiles of at most 64 × 64 in other orders.)
#[test]
fn shards_of_any_size_give_the_whole_pass_rows() {
    use hubnorm::options::Precision;
    use hubnorm::pipeline::SearchJob;
    use hubnorm::query::results::ResultRows;
    if !hubnorm::kernel::gemm::reproducible() {
        eprintln!("SKIPPED: without FMA the gemm crate's small kernels sum in other orders");
        return;
    }
    // Without AVX512_BF16 the screen runs in scalar code: the same lists.
    hubnorm::kernel::bf16::allow_scalar_screen();
    let dir = tempfile::tempdir().unwrap();
    let (gallery_rows, query_rows, k) = (70u64, 9u64, 20usize);
    let bank_rows = hubnorm::kernel::tile::BANK_TILE_ROWS + 40;
    let case = Case::random(
        107,
        query_rows as usize,
        gallery_rows as usize,
        bank_rows,
        50,
        768,
    );
    case.write(dir.path());
    let methods = chunk_by_chunk_methods();
    let path = |n: &str| dir.path().join(n).display().to_string();
    let concat = |batches: &[RecordBatch]| {
        arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap()
    };
    for precision in [Precision::Exact, Precision::Screened] {
        let stats_rows = |rows: std::ops::Range<u64>| {
            let mut job = StatsJob::new(path("gallery.parquet"), path("bank.parquet"), "unused");
            job.gallery_bank = Some(path("gallery_bank.parquet"));
            job.methods = methods.clone();
            job.options.precision = precision;
            let mut batches: Vec<RecordBatch> = Vec::new();
            pipeline::stream_stats_rows(&job, rows, false, &Silent, &mut |b| {
                batches.push(b.clone());
                Ok(())
            })
            .unwrap();
            batches
        };
        let whole = concat(&stats_rows(0..gallery_rows));
        for (start, rows) in [(0, 1), (33, 1), (69, 1), (5, 5), (65, 5), (0, 64), (6, 64)] {
            let shard = concat(&stats_rows(start..start + rows));
            let expected = whole.slice(start as usize, rows as usize);
            assert_eq!(
                shard, expected,
                "{precision:?} pass 1, rows {start}..+{rows}"
            );
        }
        let search_rows = |rows: std::ops::Range<u64>| {
            let mut job = SearchJob::new(
                path("queries.parquet"),
                path("gallery.parquet"),
                None,
                "unused",
            );
            job.methods = vec![MethodSpec::new("none", &[]).unwrap()];
            job.k = k;
            job.options.precision = precision;
            let mut batches: Vec<RecordBatch> = Vec::new();
            pipeline::stream_search(
                &job,
                Some(rows),
                ResultRows::TopK,
                None,
                &Silent,
                &mut |b| {
                    batches.push(b.clone());
                    Ok(())
                },
            )
            .unwrap();
            batches
        };
        let whole = concat(&search_rows(0..query_rows));
        for (start, queries) in [(0, 1), (4, 1), (8, 1), (0, 3), (6, 3)] {
            let shard = concat(&search_rows(start..start + queries));
            let expected = whole.slice(start as usize * k, queries as usize * k);
            assert_eq!(
                shard, expected,
                "{precision:?} pass 2, queries {start}..+{queries}"
            );
        }
    }
}

/// With the banks in memory, pass 1 reads the gallery in pieces of at most
/// 16 strips, the next piece on a thread of its own while the current one is
/// worked on (here 4096 rows: half the room of one chunk). The rows are
/// those of the tightest limit, which reads the gallery inline, bit for
/// bit; a bad value in a later piece is reported with its file and row once
/// the pieces before it are handed on.
#[test]
fn pass_1_reads_the_gallery_ahead_in_pieces_with_the_rows_of_an_inline_read() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(
        105,
        10,
        3 * TILE_COLS + 300,
        TILE_ROWS + 9,
        TILE_ROWS + 3,
        24,
    );
    case.write(dir.path());
    let methods = chunk_by_chunk_methods();
    let path = |n: &str| dir.path().join(n).display().to_string();
    let rows_of = |gallery: &str, memory: &str, threads: usize| {
        let mut job = StatsJob::new(path(gallery), path("bank.parquet"), path("unused"));
        job.gallery_bank = Some(path("gallery_bank.parquet"));
        job.methods = methods.clone();
        job.options.memory = memory.parse().unwrap();
        job.options.threads = threads;
        let mut batches: Vec<RecordBatch> = Vec::new();
        let result =
            pipeline::stream_stats_rows(&job, 0..3 * 2048 + 300, false, &Silent, &mut |b| {
                batches.push(b.clone());
                Ok(())
            });
        (batches, result)
    };
    let sizes = |batches: &[RecordBatch]| batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>();
    let (ahead, result) = rows_of("gallery.parquet", "1GiB", 2);
    result.unwrap();
    assert_eq!(sizes(&ahead), [4096, 2348]);
    let (inline, result) = (4..64)
        .map(|mib| rows_of("gallery.parquet", &format!("{mib}MiB"), 1))
        .find(|(_, result)| !matches!(result, Err(HubnormError::Budget(_))))
        .expect("some limit under 64 MiB runs");
    result.unwrap();
    // One strip per chunk: no room for two, so read inline.
    assert_eq!(sizes(&inline), [2048, 2048, 2048, 300]);
    let concat = |batches: &[RecordBatch]| {
        arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap()
    };
    assert_eq!(concat(&ahead), concat(&inline));

    let mut bad = case.gallery.clone();
    bad.data[4101 * bad.dim + 3] = f32::NAN;
    write_table(
        &dir.path().join("bad.parquet"),
        &bad,
        Layout::FixedF32,
        false,
    );
    let (before, result) = rows_of("bad.parquet", "1GiB", 2);
    let message = result.unwrap_err().to_string();
    assert!(
        message.contains("bad.parquet") && message.contains("row 4101"),
        "{message}"
    );
    assert_eq!(sizes(&before), [4096]);
}

/// METHODS.md, nnn: the golden example from the NNN reference tests, with raw
/// dot products. Bank: each of the five queries four times, jittered by
/// +0.01/−0.01 on axis 0 and +0.01/−0.01 on axis 1 (not re-normalised).
#[test]
fn nnn_reproduces_the_golden_example() {
    let dir = tempfile::tempdir().unwrap();
    let gallery = explicit(
        "g",
        &[
            &[0.0, 1.0, 0.0, 0.0],  // e2
            &[1.0, 0.0, 0.0, 0.0],  // e1
            &[0.0, -1.0, 0.0, 0.0], // −e2
            &[-1.0, 0.0, 0.0, 0.0], // −e1
            &[0.0, 0.0, 1.0, 0.0],  // e3
        ],
    );
    let q: [[f32; 4]; 5] = [
        [0.0, 0.6, 0.8, 0.0],
        [0.6, 0.0, 0.8, 0.0],
        [0.0, -0.6, 0.8, 0.0],
        [-0.6, 0.0, 0.8, 0.0],
        [0.0, 0.0, 1.0, 0.0],
    ];
    let queries = explicit("q", &q.iter().map(|r| &r[..]).collect::<Vec<_>>());
    let mut bank_rows = Vec::new();
    for row in &q {
        for (axis, jitter) in [(0, 0.01f32), (0, -0.01), (1, 0.01), (1, -0.01)] {
            let mut b = *row;
            b[axis] += jitter;
            bank_rows.push(b);
        }
    }
    let bank = explicit("b", &bank_rows.iter().map(|r| &r[..]).collect::<Vec<_>>());
    assert_eq!(bank.rows(), 20);
    let case = Case {
        queries,
        gallery,
        bank,
        gallery_bank: None,
    };
    case.write(dir.path());
    let nnn = MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 2.0)]).unwrap();
    let mut job = case.job(dir.path(), vec![nnn], 5, "out");
    job.options = raw_dot_products();
    let summary = pipeline::run(&job, &Silent).unwrap();
    assert!(!summary.normalize);
    assert!(summary.methods[1].quality.is_none(), "no targets, no R@K");

    let expected: [(&str, [usize; 5], [f64; 5]); 2] = [
        ("none", [4, 4, 4, 4, 4], [0.8, 0.8, 0.8, 0.8, 1.0]),
        (
            "nnn",
            [0, 1, 2, 3, 4],
            [0.14625, 0.14625, 0.14625, 0.14625, 0.25],
        ),
    ];
    // The reference reproduces the golden numbers too.
    let dense = case.dense(false);
    for (method, (name, top, score)) in [Method::None, reference_of(&nnn)]
        .into_iter()
        .zip(&expected)
    {
        let Scores::Real(s) = dense.scores(method) else {
            unreachable!()
        };
        for q in 0..5 {
            let best = reference_topk(&s[q], 1)[0];
            assert_eq!(best, top[q], "reference {name} query {q}");
            assert!(
                (s[q][best] - score[q]).abs() <= 1e-6,
                "reference {name} query {q}: {}",
                s[q][best]
            );
        }
    }
    let rows = results_in(dir.path(), "out");
    for (name, top, score) in expected {
        for q in 0..5 {
            let best = list(&rows, name, &format!("q{q}"))[0];
            assert_eq!(best.rank, 1);
            assert_eq!(
                best.gallery_id,
                format!("g{}", top[q]),
                "{name} query {q}: top-1"
            );
            assert!(
                (best.score as f64 - score[q]).abs() <= 2e-5,
                "{name} query {q}: top-1 score {} vs {}",
                best.score,
                score[q]
            );
        }
    }
}

/// METHODS.md, csls: with a bank, CSLS ranks exactly like NNN with α = ½ and
/// the same k; its reported score is the NNN score minus ½·r_G(q), r_G(q) the
/// mean of the query's k best raw scores.
#[test]
fn csls_ranks_like_nnn_with_half_alpha() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(105, 200, 900, 300, 0, 32);
    case.write(dir.path());
    let k = 10;
    let methods = vec![
        MethodSpec::new("csls", &[("k", k as f64)]).unwrap(),
        MethodSpec::new("nnn", &[("alpha", 0.5), ("k", k as f64)]).unwrap(),
    ];
    let summary = pipeline::run(&case.job(dir.path(), methods, 20, "out"), &Silent).unwrap();
    let rows = results_in(dir.path(), "out");
    let dense = case.dense(true);
    let Scores::Real(nnn_ref) = dense.scores(Method::Nnn { alpha: 0.5, k }) else {
        unreachable!()
    };
    let mut near_ties = 0;
    for (q, qid) in case.queries.ids.iter().enumerate() {
        let (csls, nnn, none) = (
            list(&rows, "csls", qid),
            list(&rows, "nnn", qid),
            list(&rows, "none", qid),
        );
        assert_eq!((csls.len(), nnn.len(), none.len()), (20, 20, 20));
        // r_G(q) from the baseline's own top-k raw scores.
        let r_g = none[..k].iter().map(|r| r.score as f64).sum::<f64>() / k as f64;
        let row = |id: &str| case.gallery.ids.iter().position(|x| x == id).unwrap();
        for (r, (c, n)) in csls.iter().zip(&nnn).enumerate() {
            if c.gallery_id != n.gallery_id {
                let (a, b) = (row(&c.gallery_id), row(&n.gallery_id));
                assert!(
                    (nnn_ref[q][a] - nnn_ref[q][b]).abs() <= 1e-6,
                    "query {qid} rank {}: csls has {} but nnn {}",
                    r + 1,
                    c.gallery_id,
                    n.gallery_id
                );
                near_ties += 1;
                continue;
            }
            let offset = c.score as f64 - n.score as f64;
            assert!(
                (offset + 0.5 * r_g).abs() <= TOL,
                "query {qid} rank {}: csls − nnn = {offset}, expected −r_G(q)/2 = {}",
                r + 1,
                -0.5 * r_g
            );
        }
    }
    let fragile_targets = (0..case.queries.rows()).any(|q| {
        let t = row_of(&case, &case.queries.targets.as_ref().unwrap()[q]);
        nnn_ref[q]
            .iter()
            .enumerate()
            .any(|(g, &v)| g != t && (v - nnn_ref[q][t]).abs() <= 1e-6)
    });
    if near_ties == 0 && !fragile_targets {
        let (c, n) = (&summary.methods[1], &summary.methods[2]);
        assert_eq!((c.method.as_str(), n.method.as_str()), ("csls", "nnn"));
        assert!((c.k_occurrence_skewness - n.k_occurrence_skewness).abs() < 1e-12);
        let (cq, nq) = (c.quality.as_ref().unwrap(), n.quality.as_ref().unwrap());
        for (a, b) in [
            (cq.recall_at(1), nq.recall_at(1)),
            (cq.recall_at(5), nq.recall_at(5)),
            (cq.recall_at(10), nq.recall_at(10)),
            (Some(cq.mrr), Some(nq.mrr)),
        ] {
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!((a - b).abs() < 1e-12, "csls {a} vs nnn {b}");
        }
    }
}

fn row_of(case: &Case, id: &str) -> usize {
    case.gallery.ids.iter().position(|x| x == id).unwrap()
}

/// Explicit vectors (raw dot products). Gallery g0..g3; the bank's top-1 is
/// g0 for every bank row and its top-2 {g0, g3}. Query a's raw top-1 is g0,
/// query b's g1, query c's g3. With k_A = 1, A = {g0}: a is scored by IS, b
/// and c are left raw; with k_A = 2, A = {g0, g3}: a and c by IS, b raw.
#[test]
fn dis_applies_inverted_softmax_only_when_the_raw_top1_is_activated() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case {
        gallery: explicit(
            "g",
            &[
                &[1.0, 0.0, 0.0],
                &[0.0, 1.0, 0.0],
                &[0.0, 0.0, 1.0],
                &[0.6, 0.6, 0.5],
            ],
        ),
        bank: explicit("b", &[&[0.9, 0.1, 0.0], &[0.8, 0.0, 0.3], &[0.7, 0.2, 0.1]]),
        queries: explicit("q", &[&[0.9, 0.1, 0.0], &[0.1, 0.9, 0.2], &[0.5, 0.5, 0.5]]),
        gallery_bank: None,
    };
    case.write(dir.path());
    let dense = case.dense(false);
    assert_eq!(dense.bank_activation(1), [true, false, false, false]);
    assert_eq!(dense.bank_activation(2), [true, false, false, true]);
    assert_eq!(
        (0..3).map(|q| dense.raw_top1(q)).collect::<Vec<_>>(),
        [0, 1, 3]
    );

    for (activation_k, uses_is) in [(1, [true, false, false]), (2, [true, false, true])] {
        let dis = MethodSpec::new("dis", &[("beta", 20.0), ("ka", activation_k as f64)]).unwrap();
        let is = MethodSpec::new("is", &[("beta", 20.0)]).unwrap();
        let out = format!("ka{activation_k}");
        let mut job = case.job(dir.path(), vec![is, dis], 4, &out);
        job.options = raw_dot_products();
        pipeline::run(&job, &Silent).unwrap();
        let rows = results_in(dir.path(), &out);
        let Scores::Real(is_ref) = dense.scores(reference_of(&is)) else {
            unreachable!()
        };
        let Scores::Real(dis_ref) = dense.scores(reference_of(&dis)) else {
            unreachable!()
        };
        for q in 0..3 {
            let qid = format!("q{q}");
            let score_of = |method: &str| -> HashMap<String, f64> {
                list(&rows, method, &qid)
                    .iter()
                    .map(|r| (r.gallery_id.clone(), r.score as f64))
                    .collect()
            };
            let (dis_scores, is_scores, raw_scores) =
                (score_of("dis"), score_of("is"), score_of("none"));
            assert_eq!(dis_scores.len(), 4);
            for g in 0..4 {
                let id = format!("g{g}");
                let want = if uses_is[q] {
                    is_scores[&id]
                } else {
                    raw_scores[&id]
                };
                let other = if uses_is[q] {
                    raw_scores[&id]
                } else {
                    is_scores[&id]
                };
                let context = format!("k_A = {activation_k}, query {q}, {id}");
                assert!(
                    (dis_scores[&id] - want).abs() <= TOL,
                    "{context}: dis {} should equal the {} score {want}",
                    dis_scores[&id],
                    if uses_is[q] { "is" } else { "raw" }
                );
                assert!(
                    (other - want).abs() > 0.05,
                    "{context}: fixture separates is from raw"
                );
                assert!(
                    (dis_scores[&id] - dis_ref[q][g]).abs() <= TOL,
                    "{context}: vs reference"
                );
                assert!(
                    (is_scores[&id] - is_ref[q][g]).abs() <= TOL,
                    "{context}: is vs reference"
                );
            }
            let order: Vec<&str> = list(&rows, "dis", &qid)
                .iter()
                .map(|r| r.gallery_id.as_str())
                .collect();
            let want: Vec<String> = reference_topk(&dis_ref[q], 4)
                .iter()
                .map(|g| format!("g{g}"))
                .collect();
            assert_eq!(order, want, "k_A = {activation_k}, query {q}: dis order");
        }
    }
}

/// Explicit vectors (raw dot products), gallery = the four axes. A_Q = {g0,
/// g1} (bank top-1s), A_G = {g0, g2} (gallery-bank top-1s); query i's raw
/// top-1 is g_i, so the four queries take the four branches of dual-dis:
/// both factors (= dual-is), only the query bank (= is with β₁), only the
/// gallery bank (s − LSE β₂ s(ĝ, g)/β₂), neither (= raw).
#[test]
fn dual_dis_applies_each_factor_only_when_activated() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case {
        gallery: explicit(
            "g",
            &[
                &[1.0, 0.0, 0.0, 0.0],
                &[0.0, 1.0, 0.0, 0.0],
                &[0.0, 0.0, 1.0, 0.0],
                &[0.0, 0.0, 0.0, 1.0],
            ],
        ),
        bank: explicit("b", &[&[0.9, 0.1, 0.05, 0.0], &[0.1, 0.8, 0.2, 0.1]]),
        gallery_bank: Some(explicit(
            "h",
            &[&[0.7, 0.2, 0.1, 0.1], &[0.1, 0.2, 0.9, 0.2]],
        )),
        queries: explicit(
            "q",
            &[
                &[0.9, 0.3, 0.2, 0.1],
                &[0.3, 0.9, 0.2, 0.1],
                &[0.2, 0.3, 0.9, 0.1],
                &[0.1, 0.2, 0.3, 0.9],
            ],
        ),
    };
    case.write(dir.path());
    let dense = case.dense(false);
    assert_eq!(
        dense.gating(1),
        [(true, true), (true, false), (false, true), (false, false)]
    );
    let is = MethodSpec::new("is", &[("beta", 20.0)]).unwrap();
    let dual_is = MethodSpec::default_for(MethodKind::named("dual-is").unwrap());
    let dual_dis = MethodSpec::default_for(MethodKind::named("dual-dis").unwrap());
    let mut job = case.job(dir.path(), vec![is, dual_is, dual_dis], 4, "out");
    job.options = raw_dot_products();
    pipeline::run(&job, &Silent).unwrap();
    let rows = results_in(dir.path(), "out");
    let Scores::Real(want) = dense.scores(reference_of(&dual_dis)) else {
        unreachable!()
    };
    for (q, same_as) in ["dual-is", "is", "", "none"].into_iter().enumerate() {
        let qid = format!("q{q}");
        let scores = |method: &str| -> HashMap<String, f64> {
            list(&rows, method, &qid)
                .iter()
                .map(|r| (r.gallery_id.clone(), r.score as f64))
                .collect()
        };
        let ours = scores("dual-dis");
        assert_eq!(ours.len(), 4);
        for (g, &expected) in want[q].iter().enumerate() {
            let id = format!("g{g}");
            assert!(
                (ours[&id] - expected).abs() <= TOL,
                "query {q}, {id}: dual-dis {} vs reference {expected}",
                ours[&id],
            );
            if !same_as.is_empty() {
                let other = scores(same_as)[&id];
                assert!(
                    (ours[&id] - other).abs() <= TOL,
                    "query {q}, {id}: dual-dis {} should equal {same_as} {other}",
                    ours[&id]
                );
            }
        }
        let order: Vec<&str> = list(&rows, "dual-dis", &qid)
            .iter()
            .map(|r| r.gallery_id.as_str())
            .collect();
        let want_order: Vec<String> = reference_topk(&want[q], 4)
            .iter()
            .map(|g| format!("g{g}"))
            .collect();
        assert_eq!(order, want_order, "query {q}: dual-dis order");
    }
    // The four branches really give four different corrections for g0.
    let g0: Vec<f64> = (0..4).map(|q| want[q][0] - dense.qg[q][0]).collect();
    for i in 0..4 {
        for j in 0..i {
            assert!(
                (g0[i] - g0[j]).abs() > 0.005,
                "fixture: branches {i} and {j} differ: {g0:?}"
            );
        }
    }
}

#[test]
fn dual_methods_without_a_gallery_bank_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(106, 10, 40, 30, 0, 8);
    case.write(dir.path());
    for kind in [
        MethodKind::named("dual-is").unwrap(),
        MethodKind::named("dual-dis").unwrap(),
    ] {
        let out = format!("out-{}", kind.name());
        let job = case.job(dir.path(), vec![MethodSpec::default_for(kind)], 10, &out);
        assert!(job.gallery_bank.is_none());
        let err = pipeline::run(&job, &Silent).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{kind}: {err}");
        assert!(err.to_string().contains("--gallery-bank"), "{kind}: {err}");
        assert!(!dir.path().join(&out).join("results.parquet").exists());
    }
}

/// Whether `message` states a size such as "38.1 MiB" or "40000000 bytes".
fn states_a_size(message: &str) -> bool {
    let words: Vec<&str> = message
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',' || c == ';')
        .collect();
    let is_number = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit() || c == '.');
    let units = ["B", "bytes", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB"];
    words
        .windows(2)
        .any(|w| is_number(w[0]) && units.contains(&w[1]))
        || words.iter().any(|w| {
            units.iter().any(|u| {
                w.strip_suffix(u)
                    .is_some_and(|n| is_number(n) && n.chars().any(|c| c.is_ascii_digit()))
            })
        })
}

/// METHODS.md, gc: exact only when the sorted bank similarities of every
/// gallery item fit the memory budget; otherwise refuse, naming the size and
/// suggesting `--bank-sample`. A seeded sample makes it fit, and the same
/// seed gives the same results.
#[test]
fn gc_beyond_the_memory_limit_is_refused_and_a_bank_sample_fits() {
    let dir = tempfile::tempdir().unwrap();
    // 2000 × 3000 bank similarities: 24 MB in f32, beyond a 16 MiB limit.
    let case = Case::random(107, 20, 3000, 2000, 0, 32);
    case.write(dir.path());
    let tight = |out: &str, sample: Option<BankSample>| {
        let mut job = case.job(
            dir.path(),
            vec![MethodSpec::new("gc", &[]).unwrap()],
            10,
            out,
        );
        job.options.memory = "16MiB".parse().unwrap();
        job.options.threads = 1;
        job.bank_sample = sample;
        job
    };
    let err = pipeline::run(&tight("full", None), &Silent).unwrap_err();
    let message = err.to_string();
    assert_eq!(err.exit_code(), 2, "{message}");
    assert!(message.contains("--bank-sample"), "{message}");
    assert!(
        states_a_size(&message),
        "the message should state the size needed: {message}"
    );
    assert!(!dir.path().join("full").join("results.parquet").exists());

    let rows = 32u64;
    let sample = |seed| Some(BankSample { rows, seed });
    let first = pipeline::run(&tight("s5a", sample(5)), &Silent).unwrap();
    let again = pipeline::run(&tight("s5b", sample(5)), &Silent).unwrap();
    assert_eq!(first, again);
    let a = results_in(dir.path(), "s5a");
    assert_eq!(a.len(), 20 * 2 * 10);
    assert_eq!(a, results_in(dir.path(), "s5b"), "same seed, same results");

    // Whole lists (default limit): scores count at most the sampled rows, and
    // another seed samples other rows.
    let whole = |out: &str, seed: u64| {
        let mut job = case.job(
            dir.path(),
            vec![MethodSpec::new("gc", &[]).unwrap()],
            3000,
            out,
        );
        job.bank_sample = sample(seed);
        pipeline::run(&job, &Silent).unwrap();
        results_in(dir.path(), out)
            .into_iter()
            .filter(|r| r.method == "gc")
            .collect::<Vec<_>>()
    };
    let (w5, w6) = (whole("w5", 5), whole("w6", 6));
    for list in [&w5, &w6] {
        assert_eq!(list.len(), 20 * 3000);
        let lowest = list.iter().map(|r| r.score).fold(f32::INFINITY, f32::min);
        assert!(
            lowest >= -(rows as f32),
            "a gc score of {lowest} counts more than the {rows} sampled rows"
        );
        assert!(
            lowest <= -(rows as f32) / 2.0,
            "lowest gc score {lowest}: the sample seems unused"
        );
        assert!(list
            .iter()
            .all(|r| r.score == r.score.round() && r.score <= 0.0));
    }
    assert_ne!(w5, w6, "seeds 5 and 6 should sample different rows");
    // The same seed under both limits gives the same top-10.
    let top10 = |rows: &[ResultRow]| -> Vec<(String, String)> {
        rows.iter()
            .filter(|r| r.method == "gc" && r.rank <= 10)
            .map(|r| (r.query_id.clone(), r.gallery_id.clone()))
            .collect()
    };
    assert_eq!(top10(&a), top10(&w5));
}

/// METHODS.md, dn: μ_G is the mean of the gallery bank when one is given,
/// else of the gallery. The gallery bank here is shifted away from the
/// gallery, so the two means (and the scores) differ.
#[test]
fn dn_centres_the_gallery_on_the_gallery_bank_or_else_the_gallery() {
    let dir = tempfile::tempdir().unwrap();
    let mut case = Case::random(108, 150, 700, 400, 350, 32);
    let h = case.gallery_bank.as_mut().unwrap();
    let dim = h.dim;
    for (i, v) in h.data.iter_mut().enumerate() {
        if (i % dim) % 3 == 1 {
            *v += 0.8;
        }
    }
    case.write(dir.path());
    let dn = vec![MethodSpec::new("dn", &[("lambda", 0.5)]).unwrap()];
    let with_bank = case.dense(true);
    let summary = pipeline::run(&case.job(dir.path(), dn.clone(), 10, "with"), &Silent).unwrap();
    check_against_reference(
        &case,
        &with_bank,
        &dir.path().join("with"),
        &summary,
        &dn,
        10,
    );

    let gallery_bank = case.gallery_bank.take();
    let without_bank = case.dense(true);
    let summary = pipeline::run(&case.job(dir.path(), dn.clone(), 10, "without"), &Silent).unwrap();
    check_against_reference(
        &case,
        &without_bank,
        &dir.path().join("without"),
        &summary,
        &dn,
        10,
    );

    // The fixture makes the two definitions disagree by far more than the tolerance.
    let (Scores::Real(a), Scores::Real(b)) = (
        with_bank.scores(reference_of(&dn[0])),
        without_bank.scores(reference_of(&dn[0])),
    ) else {
        unreachable!()
    };
    let gap = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(
        gap > 0.01,
        "fixture: dn with and without the gallery bank differ by {gap}"
    );
    assert!(gallery_bank.is_some());
}

/// `ls` and `nicdm` measure distances between unit rows: raw dot products
/// are refused before any pass, naming the flag.
#[test]
fn local_scaling_methods_refuse_raw_dot_products() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::random(105, 5, 30, 12, 0, 8);
    case.write(dir.path());
    for name in ["ls", "nicdm"] {
        let mut job = case.job(
            dir.path(),
            vec![MethodSpec::new(name, &[]).unwrap()],
            5,
            name,
        );
        job.options = raw_dot_products();
        let err = pipeline::run(&job, &Silent).unwrap_err();
        assert!(matches!(err, HubnormError::Usage(_)), "{name}: {err}");
        assert!(err.to_string().contains("--no-normalize"), "{name}: {err}");
        assert!(
            !dir.path().join(name).exists(),
            "{name}: no output after a refusal"
        );
    }
}

/// `mp` divides by standard deviations: a gallery item whose bank
/// similarities are all equal (a bank of one row) is refused naming the
/// gallery row, a query whose similarities to the gallery bank are all
/// equal (a gallery bank of copies of one row) naming the query file and
/// row; neither leaves an output behind.
#[test]
fn mutual_proximity_refuses_a_zero_deviation() {
    let dir = tempfile::tempdir().unwrap();
    let mut case = Case::random(107, 5, 30, 12, 0, 8);
    case.bank = case.bank.slice(0, 1);
    case.write(dir.path());
    let job = case.job(
        dir.path(),
        vec![MethodSpec::new("mp", &[]).unwrap()],
        5,
        "one-row-bank",
    );
    let err = pipeline::run(&job, &Silent).unwrap_err().to_string();
    assert!(
        err.contains("gallery row 0") && err.contains("standard deviation"),
        "{err}"
    );
    assert!(!dir.path().join("one-row-bank").exists());

    let mut case = Case::random(108, 5, 30, 12, 3, 8);
    let h = case.gallery_bank.as_mut().unwrap();
    let first = h.data[..h.dim].to_vec();
    h.data = first.repeat(3);
    case.write(dir.path());
    let job = case.job(
        dir.path(),
        vec![MethodSpec::new("mp", &[]).unwrap()],
        5,
        "one-point-gallery-bank",
    );
    let err = pipeline::run(&job, &Silent).unwrap_err().to_string();
    assert!(
        err.contains("queries.parquet")
            && err.contains("row 0")
            && err.contains("standard deviation"),
        "{err}"
    );
    assert!(!dir.path().join("one-point-gallery-bank").exists());
}
