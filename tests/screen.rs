//! The bf16 screen's bound (kernel::bf16::ScreenBound) against the f32
//! GEMM's scores, on inputs chosen to break it: rounding boundaries lined
//! up so that every error has the same sign, large dimensions, scales far
//! from 1 without normalisation, denormals, cancellation, and the narrow
//! similarity band of some models. Every screened score must lie within
//! the bound of the f32 score; where the inputs are built to reach the
//! bound's main term, the error must come close to it (the bound is not
//! loose by construction).

mod common;

use hubnorm::kernel::bf16::{convert_rows, row_norms, screen_tile, ScreenBound};
use hubnorm::kernel::gemm::similarity_tile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The largest |screened − f32| / bound over the tile of `q` × `g` (both
/// row-major, `dim` values per row); panics where the bound fails.
fn worst_ratio(q: &[f32], g: &[f32], dim: usize, label: &str) -> f64 {
    let (m, n) = (q.len() / dim, g.len() / dim);
    let mut exact = vec![0.0f32; m * n];
    similarity_tile(&mut exact, n, q, m, g, n, dim);
    let (qb, gb) = (
        convert_rows(q).expect("finite"),
        convert_rows(g).expect("finite"),
    );
    let mut screened = vec![0.0f32; m * n];
    screen_tile(&mut screened, n, &qb, m, &gb, n, dim);
    let bound = ScreenBound::new(dim);
    let (qn, gn) = (row_norms(q, dim), row_norms(g, dim));
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let e = bound.of(&qn[i], &gn[j]);
            // The rows' own rounding never makes the bound worse than the
            // worst case of their norms, (2u + u²)‖q‖‖g‖ and the rest.
            let worst_case = bound.worst_case(qn[i].norm, gn[j].norm);
            assert!(
                e <= worst_case * (1.0 + 1e-12),
                "{label}: bound {e:e} over the worst case {worst_case:e}"
            );
            let error = (screened[i * n + j] as f64 - exact[i * n + j] as f64).abs();
            assert!(
                error <= e,
                "{label}: ({i}, {j}) screened {} vs f32 {}: error {error:e} over the bound {e:e}",
                screened[i * n + j],
                exact[i * n + j]
            );
            worst = worst.max(error / e);
        }
    }
    worst
}

fn gaussian_rows(rng: &mut StdRng, rows: usize, dim: usize, normalise: bool) -> Vec<f32> {
    let mut data: Vec<f32> = (0..rows * dim)
        .map(|_| {
            // Box–Muller: rand's own normal lives in rand_distr.
            let (u, v): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect();
    if normalise {
        for row in data.chunks_exact_mut(dim) {
            let norm = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32;
            row.iter_mut().for_each(|v| *v /= norm);
        }
    }
    data
}

/// Unit rows near `centre` (unit, of the rows' dimension): similarities in
/// a narrow band around 0.79, as some models' (E5's) are.
fn band_rows(rng: &mut StdRng, centre: &[f32], rows: usize) -> Vec<f32> {
    let dim = centre.len();
    let noise = gaussian_rows(rng, rows, dim, true);
    let mut data: Vec<f32> = noise
        .chunks_exact(dim)
        .flat_map(|row| row.iter().zip(centre).map(|(n, c)| 0.89 * c + 0.46 * n))
        .collect();
    for row in data.chunks_exact_mut(dim) {
        let norm = row.iter().map(|&v| v * v).sum::<f32>().sqrt();
        row.iter_mut().for_each(|v| *v /= norm);
    }
    data
}

#[test]
fn random_unit_vectors_stay_within_the_bound() {
    let mut rng = StdRng::seed_from_u64(31);
    for dim in [2, 3, 31, 32, 33, 384, 768, 1024, 4096] {
        let q = gaussian_rows(&mut rng, 40, dim, true);
        let g = gaussian_rows(&mut rng, 70, dim, true);
        worst_ratio(&q, &g, dim, &format!("unit, dim {dim}"));
    }
}

#[test]
fn a_narrow_similarity_band_stays_within_the_bound() {
    // E5-like: every vector near one direction, similarities 0.79 ± 0.02.
    let mut rng = StdRng::seed_from_u64(32);
    let dim = 768;
    let centre = gaussian_rows(&mut rng, 1, dim, true);
    let band = |rng: &mut StdRng, rows: usize| band_rows(rng, &centre, rows);
    let q = band(&mut rng, 50);
    let g = band(&mut rng, 90);
    worst_ratio(&q, &g, dim, "narrow band");
}

#[test]
fn errors_lined_up_at_rounding_boundaries_reach_the_bound_but_not_past_it() {
    // Every value just below a bf16 halfway point rounds down by almost
    // 2⁻⁸ of itself; with all signs equal, the errors add up to nearly
    // 2u·‖q‖‖g‖, the bound's main term.
    for dim in [384, 4096] {
        let below_half = f32::from_bits((1.0f32 + 2f32.powi(-8)).to_bits() - 1);
        // Equal magnitudes with one sign pattern: every product positive and
        // Σ|qg| = ‖q‖‖g‖; powers of two keep the significand (the rounding).
        let sign = |i: usize| {
            if (i * 7 / 3).is_multiple_of(2) {
                1.0
            } else {
                -1.0
            }
        };
        let q: Vec<f32> = (0..4 * dim)
            .map(|i| sign(i % dim) * below_half * 2f32.powi(-5))
            .collect();
        let g: Vec<f32> = (0..6 * dim)
            .map(|i| sign(i % dim) * below_half * 2f32.powi(-4))
            .collect();
        let ratio = worst_ratio(&q, &g, dim, &format!("rounding boundaries, dim {dim}"));
        eprintln!("dim {dim}: the error reaches {ratio:.3} of the bound");
        // The conversion term is attained; the accumulation terms (≈ d·2⁻²⁴
        // each) are not, since those roundings have both signs.
        assert!(
            ratio > 0.9,
            "dim {dim}: the error reaches only {ratio:.3} of the bound"
        );
    }
    // Exactly halfway, ties to even: 1 + 2⁻⁸ rounds down to 1 as well.
    let dim = 768;
    let half = 1.0f32 + 2f32.powi(-8);
    let q = vec![half; 2 * dim];
    let g = vec![half; 3 * dim];
    worst_ratio(&q, &g, dim, "ties");
}

#[test]
fn unnormalised_scales_denormals_and_cancellation_stay_within_the_bound() {
    let mut rng = StdRng::seed_from_u64(33);
    let dim = 384;
    for scale in [1e-30f32, 1e-12, 1e6, 1e15] {
        let mut q = gaussian_rows(&mut rng, 20, dim, false);
        let g = gaussian_rows(&mut rng, 30, dim, false);
        q.iter_mut().for_each(|v| *v *= scale);
        worst_ratio(&q, &g, dim, &format!("scale {scale:e}"));
    }
    // Denormal query values against large gallery values: the conversion
    // flushes them, the f32 path does not.
    let q: Vec<f32> = (0..10 * dim).map(|i| 1e-39 * (1 + i % 7) as f32).collect();
    let g: Vec<f32> = (0..20 * dim).map(|i| 1e30 * (1 + i % 11) as f32).collect();
    worst_ratio(&q, &g, dim, "denormals × large");
    // Tiny products whose partial sums the instruction flushes.
    let q: Vec<f32> = (0..10 * dim)
        .map(|i| 1e-20 * if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let g: Vec<f32> = (0..20 * dim).map(|_| 3e-19).collect();
    worst_ratio(&q, &g, dim, "flushed partial sums");
    // Cancellation: a score near zero from large terms of both signs.
    let q = gaussian_rows(&mut rng, 16, dim, true);
    let mut g = q.clone();
    for row in g.chunks_exact_mut(dim) {
        row[..dim / 2].iter_mut().for_each(|v| *v = -*v);
    }
    worst_ratio(&q, &g, dim, "cancellation");
}

#[test]
fn values_beyond_bf16_range_are_refused() {
    assert!(convert_rows(&[0.5, 3.4e38]).is_none());
    assert!(convert_rows(&[0.5, f32::INFINITY]).is_none());
    assert!(convert_rows(&[0.5, 1e38]).is_some());
}

use hubnorm::kernel::{
    search_block, search_block_screened, ColumnScoring, Positives, QueryState, Rows, Screen,
    ScreenedRows,
};

/// One state's list (score bits, raw bits, row) and counts (greater, equal).
type Outcome = (Vec<(u32, u32, u32)>, u64, u64);

/// The states' lists and counts, for comparing.
fn outcome(states: &[QueryState]) -> Vec<Outcome> {
    states
        .iter()
        .map(|s| {
            let list = s
                .top
                .sorted()
                .iter()
                .map(|c| (c.score.to_bits(), c.raw.to_bits(), c.row))
                .collect();
            (list, s.greater, s.equal)
        })
        .collect()
}

/// Searches `queries` × `gallery` exactly and screened with the scorings
/// `hs` (one correction vector each) and top-`k`; ground truth: each
/// query's target score is that of its exact 3rd-best item under the first
/// scoring, its positive the 7th. Asserts identical states; returns the
/// screen's counts.
fn screened_equals_exact(
    queries: &[f32],
    gallery: &[f32],
    dim: usize,
    hs: &[Vec<f32>],
    k: usize,
) -> (u64, u64) {
    let (q, g) = (Rows::new(queries, dim), Rows::new(gallery, dim));
    let scorings: Vec<ColumnScoring<'_>> = hs.iter().map(|h| ColumnScoring::Subtract(h)).collect();
    let fresh = |targets: Option<&[f32]>| -> Vec<QueryState> {
        (0..q.rows)
            .flat_map(|i| (0..hs.len()).map(move |_| QueryState::new(k, targets.map(|t| t[i]))))
            .collect()
    };
    // The lists without ground truth give the targets and positives.
    let mut probe = fresh(None);
    search_block(q, g, 0, &scorings, &Positives::none(q.rows), &mut probe);
    let firsts: Vec<Vec<_>> = probe.chunks(hs.len()).map(|s| s[0].top.sorted()).collect();
    let targets: Vec<f32> = firsts
        .iter()
        .map(|l| l.get(2).map_or(f32::NAN, |c| c.score))
        .collect();
    let positives = Positives::from_lists(
        firsts
            .iter()
            .map(|l| l.get(6).map(|c| vec![c.row]).unwrap_or_default()),
    );
    let mut exact = fresh(Some(&targets));
    search_block(q, g, 7, &scorings, &positives, &mut exact);
    let (sq, sg) = (
        ScreenedRows::queries(q).expect("in bf16 range"),
        ScreenedRows::gallery(g).expect("in bf16 range"),
    );
    let mut screened = fresh(Some(&targets));
    let screen = Some(Screen::new(&sq, &sg));
    let counts = search_block_screened(q, g, 7, &scorings, &positives, &mut screened, screen);
    let (a, b) = (outcome(&exact), outcome(&screened));
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "query {}, scoring {}", i / hs.len(), i % hs.len());
    }
    (counts.screened, counts.rescored)
}

#[test]
fn screened_search_equals_the_exact_search() {
    if !hubnorm::kernel::gemm::reproducible() {
        eprintln!("SKIPPED: the f32 tiles' bits are not reproduced on this CPU (no FMA)");
        return;
    }
    let mut rng = StdRng::seed_from_u64(34);
    // Two query strips (512 + 88), three gallery tiles (2048, 2048, 904).
    for dim in [384, 100] {
        let queries = gaussian_rows(&mut rng, 600, dim, true);
        let mut gallery = gaussian_rows(&mut rng, 5000, dim, true);
        // Exact duplicates: ties broken by row, across tiles.
        for (from, to) in [(5, 3000), (5, 4100), (2047, 2048)] {
            let row = gallery[from * dim..(from + 1) * dim].to_vec();
            gallery[to * dim..(to + 1) * dim].copy_from_slice(&row);
        }
        let zeros = vec![0.0f32; 5000];
        let h: Vec<f32> = (0..5000).map(|_| rng.random_range(-0.05..0.05)).collect();
        // Corrections that make near-ties of the corrected scores.
        let coarse: Vec<f32> = h.iter().map(|v| (v * 64.0).round() / 64.0).collect();
        for k in [1, 10, 100] {
            let (screened, rescored) = screened_equals_exact(
                &queries,
                &gallery,
                dim,
                &[zeros.clone(), h.clone(), coarse.clone()],
                k,
            );
            eprintln!("dim {dim}, k {k}: re-scored {rescored} of {screened} pairs");
            assert!(rescored < screened, "the screen ruled nothing out");
        }
    }
}

/// A gallery of many tiles: each query's pool of undecided candidates
/// fills, is pruned by its k-th best lower end and, where it cannot be
/// pruned enough (k beyond what the pool holds), decided early.
#[test]
fn screened_search_over_many_tiles_equals_the_exact_search() {
    if !common::screen_comparable() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(37);
    let dim = 64;
    let queries = gaussian_rows(&mut rng, 520, dim, true);
    let gallery = gaussian_rows(&mut rng, 41_000, dim, true);
    let h: Vec<f32> = (0..41_000).map(|_| rng.random_range(-0.02..0.02)).collect();
    for (k, scorings) in [(10, 1), (100, 1), (300, 1), (10, 4), (100, 4)] {
        let hs: Vec<Vec<f32>> = (0..scorings)
            .map(|s| h.iter().map(|v| v * s as f32).collect())
            .collect();
        let (screened, rescored) = screened_equals_exact(&queries, &gallery, dim, &hs, k);
        eprintln!(
            "many tiles, k {k}, {scorings} scorings: re-scored {rescored} of {screened} pairs"
        );
        if scorings == 1 && k == 10 {
            // The pools leave about the k best and the band around them.
            assert!(rescored * 100 < screened, "{rescored} of {screened}");
        }
    }
}

#[test]
fn screened_search_of_a_narrow_band_equals_the_exact_search() {
    if !hubnorm::kernel::gemm::reproducible() {
        eprintln!("SKIPPED: the f32 tiles' bits are not reproduced on this CPU (no FMA)");
        return;
    }
    let mut rng = StdRng::seed_from_u64(35);
    let dim = 768;
    let centre = gaussian_rows(&mut rng, 1, dim, true);
    let band = |rng: &mut StdRng, rows: usize| band_rows(rng, &centre, rows);
    let queries = band(&mut rng, 130);
    let gallery = band(&mut rng, 3000);
    let h: Vec<f32> = (0..3000).map(|_| rng.random_range(-0.01..0.01)).collect();
    let (screened, rescored) = screened_equals_exact(&queries, &gallery, dim, &[h], 10);
    eprintln!("narrow band: re-scored {rescored} of {screened} pairs");
}

/// `run --precision screened` writes the exact run's lists and figures
/// (methods of every additive family, several query and gallery blocks
/// under a small memory limit), records the choice, and reports what the
/// screen did; methods it cannot bound are refused when asked for, and run
/// exact under `auto`. Pass 1's top-k statistics are screened under
/// `auto` whatever pass 2 does; with `--no-normalize` too. Without
/// AVX512_BF16 the screen runs in scalar code (allowed for this process).
#[test]
fn screened_runs_write_the_exact_runs_results() {
    use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions, Precision};
    use hubnorm::pipeline::{self, RunJob};
    use hubnorm::progress::Silent;
    if !common::screen_in_process() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    common::write_case(
        dir.path(),
        &common::CaseShape {
            seed: 36,
            gallery: 5000,
            queries: 700,
            bank: 1500,
            dim: 64,
            noise: 0.3,
        },
    );
    let job = |methods: &str, precision: Precision, out: &str| RunJob {
        queries: dir.path().join("queries.parquet").display().to_string(),
        gallery: dir.path().join("gallery.parquet").display().to_string(),
        bank: dir.path().join("bank.parquet").display().to_string(),
        gallery_bank: None,
        bank_sample: None,
        transductive: false,
        methods: methods
            .split(',')
            .map(|m| MethodSpec::new(m, &[]).unwrap())
            .collect(),
        k: 10,
        out_dir: dir.path().join(out),
        overwrite: false,
        options: PassOptions {
            // Two query blocks, each streaming the gallery in blocks.
            memory: MemoryBudget(18 << 20),
            threads: 1,
            precision,
            ..PassOptions::default()
        },
        cluster: None,
        checkpoint: Default::default(),
    };
    let methods = "is,nnn,csls,dis";
    let exact = pipeline::run(&job(methods, Precision::Exact, "exact"), &Silent).unwrap();
    let screened = pipeline::run(&job(methods, Precision::Screened, "screened"), &Silent).unwrap();
    assert_eq!(exact.methods, screened.methods);
    let rows = |out: &str| common::read_results(&dir.path().join(out).join("results.parquet"));
    assert_eq!(rows("exact"), rows("screened"));
    assert!(exact.screen.is_none());
    let screen = screened.screen.expect("screened");
    eprintln!(
        "re-scored {} of {} pairs",
        screen.rescored_pairs, screen.screened_pairs
    );
    // Every pair of every scoring (equal scorings are searched once).
    assert_eq!(screen.screened_pairs % (700 * 5000), 0, "{screen:?}");
    assert!(screen.screened_pairs >= 700 * 5000 * 4, "{screen:?}");
    assert!(
        screen.rescored_pairs < screen.screened_pairs / 4,
        "{screen:?}"
    );
    let precision =
        |out: &str| common::recorded_precision(&dir.path().join(out).join("results.parquet"));
    assert_eq!(precision("exact").as_deref(), Some("exact"));
    assert_eq!(precision("screened").as_deref(), Some("screened"));

    // gc keeps every bank similarity: a larger limit.
    let roomy = |precision: Precision, out: &str| {
        let mut j = job("is,gc", precision, out);
        j.options.memory = MemoryBudget(128 << 20);
        j
    };
    let refused = pipeline::run(&roomy(Precision::Screened, "refused"), &Silent).unwrap_err();
    assert!(refused.to_string().contains("gc"), "{refused}");
    assert_eq!(refused.exit_code(), 2);
    assert!(!dir.path().join("refused").join("results.parquet").exists());
    let auto = pipeline::run(&roomy(Precision::Auto, "auto"), &Silent).unwrap();
    assert!(auto.screen.is_none());
    assert!(
        auto.bank_screen.is_none(),
        "is and gc need every similarity"
    );
    assert_eq!(precision("auto").as_deref(), Some("exact"));

    // Pass 1 of the top-k statistics: screened under auto, though pass 2
    // of ls and nicdm is not.
    let stats_precision =
        |out: &str| common::recorded_precision(&dir.path().join(out).join("gallery_stats.parquet"));
    let same_stats = |a: &str, b: &str| {
        let read =
            |out: &str| common::read_parquet(&dir.path().join(out).join("gallery_stats.parquet"));
        let (a, b) = (read(a), read(b));
        assert_eq!(a.num_columns(), b.num_columns());
        for (i, field) in a.schema().fields().iter().enumerate() {
            assert!(
                a.column(i).to_data() == b.column(i).to_data(),
                "column {}",
                field.name()
            );
        }
    };
    let top_k = "nnn,csls,ls,nicdm,dissim-local";
    let exact = pipeline::run(&job(top_k, Precision::Exact, "top-exact"), &Silent).unwrap();
    let auto = pipeline::run(&job(top_k, Precision::Auto, "top-auto"), &Silent).unwrap();
    assert_eq!(exact.methods, auto.methods);
    assert_eq!(rows("top-exact"), rows("top-auto"));
    same_stats("top-exact", "top-auto");
    assert!(exact.bank_screen.is_none() && auto.screen.is_none());
    let bank_screen = auto.bank_screen.expect("pass 1 screened");
    eprintln!("pass 1: re-scored {bank_screen:?}");
    assert_eq!(bank_screen.screened_pairs, 1500 * 5000, "{bank_screen:?}");
    // nnn keeps 128 of 1500 bank rows per item: any top-k pass offers a
    // column its first 128 rows and about k·ln(N/k) ≈ 315 more, a fifth.
    assert!(
        bank_screen.rescored_pairs < bank_screen.screened_pairs / 2,
        "{bank_screen:?}"
    );
    assert_eq!(stats_precision("top-exact").as_deref(), Some("exact"));
    assert_eq!(stats_precision("top-auto").as_deref(), Some("screened"));

    // Without normalisation: the raw rows, of norms far from 1, screened
    // in both passes.
    let raw = |precision: Precision, out: &str| {
        let mut j = job("nnn,csls", precision, out);
        j.options.read.normalize = false;
        j
    };
    let exact = pipeline::run(&raw(Precision::Exact, "raw-exact"), &Silent).unwrap();
    let screened = pipeline::run(&raw(Precision::Screened, "raw-screened"), &Silent).unwrap();
    assert_eq!(exact.methods, screened.methods);
    assert_eq!(rows("raw-exact"), rows("raw-screened"));
    same_stats("raw-exact", "raw-screened");
    assert!(screened.screen.is_some() && screened.bank_screen.is_some());
}

use hubnorm::kernel::{
    column_statistics, column_statistics_screened, ColumnStates, ColumnStatsRequest,
};

/// One column's lists, for comparing: its top values' bits and its top
/// (score bits, row) pairs.
type ColumnOutcome = (Vec<u32>, Vec<(u32, u32)>);

fn column_outcomes(states: &ColumnStates, columns: usize) -> Vec<ColumnOutcome> {
    (0..columns)
        .map(|j| {
            let values = states.top.get(j).map_or_else(Vec::new, |t| {
                t.sorted().iter().map(|v| v.to_bits()).collect()
            });
            let rows = states.top_rows.get(j).map_or_else(Vec::new, |t| {
                t.sorted()
                    .iter()
                    .map(|c| (c.score.to_bits(), c.row))
                    .collect()
            });
            (values, rows)
        })
        .collect()
}

/// Pass 1's column top-k lists of `bank` × `gallery` (the top `top_k`
/// values and the top `top_rows` rows of each gallery column), in bank
/// blocks of `block_rows` rows, exact and screened: asserts identical
/// states and returns the screen's (screened, re-scored) cells.
fn screened_columns_equal_exact(
    bank: &[f32],
    gallery: &[f32],
    dim: usize,
    block_rows: usize,
    (top_k, top_rows): (usize, usize),
) -> (u64, u64) {
    let request = ColumnStatsRequest {
        column_top_k: top_k,
        column_top_rows: top_rows,
        ..ColumnStatsRequest::default()
    };
    assert!(request.screenable());
    let g = Rows::new(gallery, dim);
    let screened_gallery = ScreenedRows::gallery(g).expect("in bf16 range");
    let mut exact = ColumnStates::new(g.rows, &request, 0);
    let mut screened = ColumnStates::new(g.rows, &request, 0);
    let mut counts = (0, 0);
    for (b, block) in bank.chunks(block_rows * dim).enumerate() {
        let rows = Rows::new(block, dim);
        let first_row = (b * block_rows) as u32;
        column_statistics(rows, g, first_row, 7, &request, &mut exact).unwrap();
        let screened_bank = ScreenedRows::queries(rows).expect("in bf16 range");
        let screen = Screen::new(&screened_bank, &screened_gallery);
        let (_, c) = column_statistics_screened(
            rows,
            g,
            (first_row, 7),
            &request,
            &mut screened,
            Some(screen),
        )
        .unwrap();
        counts.0 += c.screened;
        counts.1 += c.rescored;
    }
    let (a, b) = (
        column_outcomes(&exact, g.rows),
        column_outcomes(&screened, g.rows),
    );
    for (j, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "gallery column {j}");
    }
    assert!(a.iter().all(|(v, r)| v.len() == top_k.min(bank.len() / dim)
        && r.len() == top_rows.min(bank.len() / dim)));
    counts
}

/// Pass 1's top-k statistics (`nnn`, `csls`, `ls`, `nicdm`: values;
/// `dissim-local`: rows) from the screen equal the exact pass's: bank
/// blocks of several row tiles (2048 + 2048 + rest) and a short one,
/// several column strips, duplicated bank rows (ties, kept to the smaller
/// row), a narrow band, and rows far from unit length.
#[test]
fn screened_column_top_k_equals_the_exact_pass() {
    if !hubnorm::kernel::gemm::reproducible() {
        eprintln!("SKIPPED: the f32 tiles' bits are not reproduced on this CPU (no FMA)");
        return;
    }
    let mut rng = StdRng::seed_from_u64(38);
    for (dim, block_rows) in [(384, 4800), (100, 2100)] {
        let mut bank = gaussian_rows(&mut rng, 5000, dim, true);
        let gallery = gaussian_rows(&mut rng, 1300, dim, true);
        // Exact duplicates, across tiles and blocks: equal scores, kept by row.
        for (from, to) in [(5, 3000), (5, 4900), (2047, 2048)] {
            let row = bank[from * dim..(from + 1) * dim].to_vec();
            bank[to * dim..(to + 1) * dim].copy_from_slice(&row);
        }
        for ks in [(10, 0), (0, 10), (1, 50), (100, 7)] {
            let (screened, rescored) =
                screened_columns_equal_exact(&bank, &gallery, dim, block_rows, ks);
            eprintln!("dim {dim}, k {ks:?}: re-scored {rescored} of {screened} cells");
            assert_eq!(screened, 5000 * 1300, "every tile screened");
            assert!(rescored * 5 < screened, "{rescored} of {screened}");
        }
    }
    // E5-like band: the screen rules out less, the lists stay exact.
    let dim = 768;
    let centre = gaussian_rows(&mut rng, 1, dim, true);
    let bank = band_rows(&mut rng, &centre, 2500);
    let gallery = band_rows(&mut rng, &centre, 600);
    let (screened, rescored) = screened_columns_equal_exact(&bank, &gallery, dim, 2500, (10, 10));
    eprintln!("narrow band: re-scored {rescored} of {screened} cells");
    // Without normalisation: scales far from 1 on both sides.
    let dim = 64;
    let mut bank = gaussian_rows(&mut rng, 3000, dim, false);
    let mut gallery = gaussian_rows(&mut rng, 700, dim, false);
    bank.iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v *= [1e-3f32, 1.0, 40.0][i / dim % 3]);
    gallery
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v *= [1e4f32, 0.5][i / dim % 2]);
    screened_columns_equal_exact(&bank, &gallery, dim, 3000, (10, 10));
}

/// `hubnorm stats --precision`: `screened` where the CPU cannot screen is
/// refused (exit 2, nothing written) unless `HUBNORM_SCALAR_SCREEN=1`
/// allows the scalar screen; the screened file holds the exact file's
/// rows and records the choice; `auto` runs exact where it cannot screen.
#[test]
fn stats_precision_on_the_command_line() {
    if !common::screen_comparable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    common::valid_case(dir.path());
    let stats = |precision: &str, out: &str, scalar: bool| {
        let mut command = common::hubnorm(["stats", "--method", "csls", "--precision", precision]);
        command
            .arg("--gallery")
            .arg(dir.path().join("gallery.parquet"))
            .arg("--bank")
            .arg(dir.path().join("bank.parquet"))
            .arg("--out")
            .arg(dir.path().join(out))
            .arg("--quiet")
            .env_remove("HUBNORM_BLAS");
        if scalar {
            command.env("HUBNORM_SCALAR_SCREEN", "1");
        } else {
            command.env_remove("HUBNORM_SCALAR_SCREEN");
        }
        command.output()
    };
    let precision_of = |out: &str| common::recorded_precision(&dir.path().join(out));
    let bf16 = hubnorm::kernel::bf16::has_avx512_bf16();
    let exact = stats("exact", "exact.parquet", false);
    assert!(exact.success(), "{exact:?}");
    assert_eq!(precision_of("exact.parquet").as_deref(), Some("exact"));
    let auto = stats("auto", "auto.parquet", false);
    assert!(auto.success(), "{auto:?}");
    let auto_choice = if bf16 { "screened" } else { "exact" };
    assert_eq!(precision_of("auto.parquet").as_deref(), Some(auto_choice));
    if !bf16 {
        let refused = stats("screened", "refused.parquet", false);
        assert_eq!(refused.code(), Some(2), "{refused:?}");
        assert!(refused.stderr().contains("AVX512_BF16"), "{refused:?}");
        assert!(!dir.path().join("refused.parquet").exists());
    }
    let screened = stats("screened", "screened.parquet", true);
    assert!(screened.success(), "{screened:?}");
    assert_eq!(
        precision_of("screened.parquet").as_deref(),
        Some("screened")
    );
    let (a, b) = (
        common::read_parquet(&dir.path().join("exact.parquet")),
        common::read_parquet(&dir.path().join("screened.parquet")),
    );
    assert_eq!(a.num_rows(), b.num_rows());
    for i in 0..a.num_columns() {
        assert!(a.column(i).to_data() == b.column(i).to_data(), "column {i}");
    }
}

/// `run --precision screened` with a method whose score is not s − h(g)
/// is refused before any input is read (a bank that does not exist is not
/// what the message names), naming that method alone; `search` refuses it
/// too, and `auto` runs it exact.
#[test]
fn unscreenable_methods_are_refused_before_pass_1() {
    let dir = tempfile::tempdir().unwrap();
    common::valid_case(dir.path());
    let path = |name: &str| dir.path().join(name).display().to_string();
    let run = |methods: &str, bank: &str, precision: &str| {
        common::hubnorm(["run", "--methods", methods, "--precision", precision])
            .args(["--queries", &path("queries.parquet")])
            .args(["--gallery", &path("gallery.parquet")])
            .args(["--bank", &path(bank)])
            .args(["--out", &path(&format!("run-{precision}")), "--quiet"])
            .env("HUBNORM_SCALAR_SCREEN", "1")
            .env_remove("HUBNORM_BLAS")
            .output()
    };
    let refused = run("is,ls,mp", "no-such-bank.parquet", "screened");
    assert_eq!(refused.code(), Some(2), "{refused:?}");
    let stderr = refused.stderr();
    assert!(
        stderr.contains("--precision screened: ls, mp score other than s − h(g)"),
        "{stderr}"
    );
    assert!(!stderr.contains("no-such-bank"), "{stderr}");
    assert!(!dir.path().join("run-screened").exists());

    let auto = run("is,ls,mp", "bank.parquet", "auto");
    assert!(auto.success(), "{auto:?}");
    let search = common::hubnorm(["search", "--methods", "ls", "--precision", "screened"])
        .args(["--queries", &path("queries.parquet")])
        .args(["--gallery", &path("gallery.parquet")])
        .args(["--stats", &path("run-auto/gallery_stats.parquet")])
        .args(["--out", &path("search.parquet"), "--quiet"])
        .env("HUBNORM_SCALAR_SCREEN", "1")
        .env_remove("HUBNORM_BLAS")
        .output();
    assert_eq!(search.code(), Some(2), "{search:?}");
    assert!(
        search.stderr().contains("score other than s − h(g)"),
        "{search:?}"
    );
    assert!(!dir.path().join("search.parquet").exists());
}
