//! `sn` and `dbsn` (METHODS.md, log-domain Sinkhorn) against a dense f64
//! log-domain reference written here: scores to 1e-5 and identical rankings,
//! with the tiles cached and with the gallery and the bank streamed in
//! several chunks by a small memory limit; the plan's marginals after enough
//! iterations; one target update from g ≡ 0 equals `is` with β = 1/τ; `--tol`
//! stops early; the transductive bank.
mod common;

use std::path::Path;

use common::reference::log_sum_exp;
use common::*;
use hubnorm::bank::sinkhorn::{
    sinkhorn_in_rounds, sinkhorn_potentials, sinkhorn_round, RoundsRequest, SinkhornRequest,
    SinkhornRoundRequest,
};
use hubnorm::bank::sinkhorn::{sinkhorn_potentials_from, SinkhornResume};
use hubnorm::kernel::{lse_sweep, LogSumExp, Rows, Sweep, TileSource, TILE_COLS, TILE_ROWS};
use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions, ReadOptions};
use hubnorm::pipeline::{self, RunJob, RunSummary};
use hubnorm::progress::Silent;
use hubnorm::source::EmbeddingTable;

/// The dense reference: T iterations from f ≡ 0, source update first.
/// Returns (f over the targets, g over the sources).
fn reference_sinkhorn(s: &[Vec<f64>], tau: f64, iterations: usize) -> (Vec<f64>, Vec<f64>) {
    let (m, n) = (s.len(), s[0].len());
    let mut f = vec![0.0; n];
    let mut g = vec![0.0; m];
    for _ in 0..iterations {
        for b in 0..m {
            let row = (0..n).map(|t| s[b][t] - f[t]);
            g[b] = tau * log_sum_exp(row, 1.0 / tau) + tau * (m as f64).ln();
        }
        for t in 0..n {
            let column = (0..m).map(|b| s[b][t] - g[b]);
            f[t] = tau * log_sum_exp(column, 1.0 / tau) + tau * (n as f64).ln();
        }
    }
    (f, g)
}

/// Opens `dir/name.parquet` through the library, with the default options.
fn open_table(dir: &Path, name: &str) -> EmbeddingTable {
    let path = dir.join(format!("{name}.parquet"));
    EmbeddingTable::open(
        name,
        &path.display().to_string(),
        &ReadOptions::default(),
        false,
    )
    .unwrap()
}

fn similarities(rows: &[Vec<f64>], cols: &[Vec<f64>]) -> Vec<Vec<f64>> {
    rows.iter()
        .map(|r| cols.iter().map(|c| dot(r, c)).collect())
        .collect()
}

struct Case {
    queries: Table,
    gallery: Table,
    bank: Table,
    gallery_bank: Table,
}

fn case(seed: u64, nq: usize, ng: usize, nb: usize, ngb: usize, dim: usize) -> Case {
    let mut r = rng(seed);
    let gallery = random_table(&mut r, "g", ng, dim);
    let queries = queries_near(&mut r, &gallery, nq, 0.8);
    let bank = random_table(&mut r, "b", nb, dim);
    let gallery_bank = random_table(&mut r, "gb", ngb, dim);
    Case {
        queries,
        gallery,
        bank,
        gallery_bank,
    }
}

fn write_case(dir: &Path, c: &Case) {
    for (name, table) in [
        ("queries", &c.queries),
        ("gallery", &c.gallery),
        ("bank", &c.bank),
        ("gallery_bank", &c.gallery_bank),
    ] {
        write_table(
            &dir.join(format!("{name}.parquet")),
            table,
            Layout::FixedF32,
            false,
        );
    }
}

fn job(dir: &Path, out: &str, methods: Vec<MethodSpec>, memory: &str, threads: usize) -> RunJob {
    let path = |n: &str| dir.join(n).display().to_string();
    RunJob {
        queries: path("queries.parquet"),
        gallery: path("gallery.parquet"),
        bank: path("bank.parquet"),
        gallery_bank: Some(path("gallery_bank.parquet")),
        bank_sample: None,
        transductive: false,
        methods,
        k: 10,
        out_dir: dir.join(out),
        overwrite: false,
        options: PassOptions {
            memory: memory.parse::<MemoryBudget>().unwrap(),
            threads,
            ..PassOptions::default()
        },
        cluster: None,
        checkpoint: Default::default(),
    }
}

/// Checks every method's results against s(q, g) − f(g) with the reference f.
fn check(c: &Case, dir: &Path, out: &str, summary: &RunSummary, expected: &[(&str, Vec<f64>)]) {
    let q = to_f64(&c.queries, true);
    let g = to_f64(&c.gallery, true);
    let rows = read_results(&dir.join(out).join("results.parquet"));
    let gallery_row = |id: &str| c.gallery.ids.iter().position(|x| x == id).unwrap();
    for (name, f) in expected {
        let scores = reference_scores(&q, &g, &f[..g.len()]);
        for (qi, qid) in c.queries.ids.iter().enumerate() {
            let ours: Vec<(usize, f32)> = rows
                .iter()
                .filter(|r| r.method == *name && &r.query_id == qid)
                .map(|r| (gallery_row(&r.gallery_id), r.score))
                .collect();
            assert_ranking_matches(&ours, &scores[qi], 10, 1e-5, &format!("{name} query {qi}"));
        }
        let ours = summary.methods.iter().find(|m| m.method == *name).unwrap();
        let report = ours.sinkhorn.as_ref().expect("sinkhorn report");
        assert_eq!(report.iterations, 10);
        assert!(report.marginal_error.is_finite());
    }
}

/// sn and dbsn with τ = 0.05 (10 iterations move f far from IS), sizes past
/// the tile shape, against the reference: once with every tile cached, once
/// under a limit where neither the gallery nor the bank fits, so every sweep
/// streams several gallery chunks against several bank blocks and
/// recomputes the GEMM. Both give the reference's results.
#[test]
fn sn_and_dbsn_match_the_dense_reference_cached_and_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 256;
    let c = case(
        21,
        60,
        TILE_COLS * 2 + 7,
        TILE_ROWS * 3 + 3,
        TILE_COLS + 5,
        dim,
    );
    write_case(dir.path(), &c);
    let tau = 0.05;
    let methods = vec![
        MethodSpec::new("sn", &[("tau", tau), ("t", 10.0)]).unwrap(),
        MethodSpec::new("dbsn", &[("tau", tau), ("t", 10.0)]).unwrap(),
    ];
    let g = to_f64(&c.gallery, true);
    let b = to_f64(&c.bank, true);
    let gb = to_f64(&c.gallery_bank, true);
    let (f_sn, _) = reference_sinkhorn(&similarities(&b, &g), tau, 10);
    let targets: Vec<Vec<f64>> = g.iter().chain(&gb).cloned().collect();
    let (f_dbsn, _) = reference_sinkhorn(&similarities(&b, &targets), tau, 10);
    let expected = [("sn", f_sn), ("dbsn", f_dbsn)];

    let cached = pipeline::run(
        &job(dir.path(), "cached", methods.clone(), "2GiB", 2),
        &Silent,
    )
    .unwrap();
    for m in &cached.methods[1..] {
        let report = m.sinkhorn.as_ref().unwrap();
        assert!(
            report.cached_tiles && report.bank_blocks == 1,
            "{}: {report:?}",
            m.method
        );
    }
    check(&c, dir.path(), "cached", &cached, &expected);

    // 18.5 MiB on one thread at d = 256: the 1539-row bank (1.6 MB) no longer
    // fits beside a 2048-item gallery chunk, nor does any matrix.
    let streamed = pipeline::run(
        &job(dir.path(), "streamed", methods, "18944KiB", 1),
        &Silent,
    )
    .unwrap();
    for m in &streamed.methods[1..] {
        let report = m.sinkhorn.as_ref().unwrap();
        assert!(
            !report.cached_tiles && report.target_chunks >= 3 && report.bank_blocks >= 2,
            "{}: {report:?}",
            m.method
        );
    }
    check(&c, dir.path(), "streamed", &streamed, &expected);
}

/// Iterations resumed from a saved state give the uninterrupted
/// iterations' potentials, marginal error and counts bit for bit, with the
/// tiles cached and recomputed, over several strips of targets (the next
/// update's shifts start from the saved log-sum-exps); the resumed run
/// computes only the iterations after the saved one, and a finished state
/// computes nothing.
#[test]
fn resumed_iterations_equal_the_uninterrupted_ones() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(31, 10, 2 * TILE_COLS + 700, 900, 10, 16);
    write_case(dir.path(), &c);
    let (gallery, bank) = (
        open_table(dir.path(), "gallery"),
        open_table(dir.path(), "bank"),
    );
    let targets = [&gallery];
    for (budget, cached) in [(1usize << 30, true), (24 << 20, false)] {
        let request = SinkhornRequest {
            sources: &bank,
            targets: &targets,
            tau: 0.05,
            iterations: 9,
            tolerance: None,
            budget,
            resident_bytes: 0,
        };
        let mut saved: Vec<SinkhornResume> = Vec::new();
        let whole = sinkhorn_potentials_from(&request, &Silent, None, &mut |p| {
            saved.push(SinkhornResume {
                iterations: p.iterations,
                target_potential: p.target_potential.to_vec(),
                source_potential: p.source_potential.to_vec(),
                exact_column_updates: p.exact_column_updates,
                marginal_error: p.marginal_error,
                finished: p.finished,
                row_lse: p.row_lse.to_vec(),
                col_shift: p.col_shift.map(<[f32]>::to_vec),
            });
            Ok(())
        })
        .unwrap();
        assert_eq!(saved.len(), 10, "nine iterations and the end");
        assert_eq!(whole.cached, cached, "budget {budget}");
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for from in [1usize, 4, 8] {
            let mut seen = Vec::new();
            let resumed = sinkhorn_potentials_from(
                &request,
                &Silent,
                Some(saved[from - 1].clone()),
                &mut |p| {
                    seen.push(p.iterations);
                    Ok(())
                },
            )
            .unwrap();
            let label = format!("resumed after iteration {from} (budget {budget})");
            assert_eq!(
                bits(&resumed.target_potential),
                bits(&whole.target_potential),
                "{label}: f"
            );
            assert_eq!(
                bits(&resumed.source_potential),
                bits(&whole.source_potential),
                "{label}: g"
            );
            assert_eq!(
                resumed.marginal_error.to_bits(),
                whole.marginal_error.to_bits(),
                "{label}"
            );
            assert_eq!(resumed.iterations, whole.iterations, "{label}");
            assert_eq!(
                resumed.exact_column_updates, whole.exact_column_updates,
                "{label}"
            );
            let expected: Vec<usize> = (from + 1..=9).chain([9]).collect();
            assert_eq!(seen, expected, "{label}: iterations computed");
        }
        let mut seen = 0;
        let done = sinkhorn_potentials_from(&request, &Silent, saved.last().cloned(), &mut |_| {
            seen += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, 0, "a finished state computes nothing");
        assert_eq!(bits(&done.target_potential), bits(&whole.target_potential));
    }
}

/// Streamed sweeps whose targets fit one chunk keep them between sweeps
/// rather than read them again; the potentials are those of a smaller limit
/// that reads several chunks every sweep, bit for bit (the strips and bank
/// blocks do not depend on the limit), for one target table (`sn`) and for
/// two (`dbsn`: each table a chunk of its own, kept in order).
#[test]
fn kept_targets_give_the_potentials_of_targets_read_every_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(
        41,
        10,
        TILE_COLS * 2 + 7,
        TILE_ROWS * 3 + 3,
        TILE_COLS + 5,
        256,
    );
    write_case(dir.path(), &c);
    let (gallery, gallery_bank, bank) = (
        open_table(dir.path(), "gallery"),
        open_table(dir.path(), "gallery_bank"),
        open_table(dir.path(), "bank"),
    );
    // The first index where two potentials differ in any bit.
    let first_difference = |a: &[f64], b: &[f64]| {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .position(|(x, y)| x.to_bits() != y.to_bits())
    };
    for targets in [vec![&gallery], vec![&gallery, &gallery_bank]] {
        let request = |budget| SinkhornRequest {
            sources: &bank,
            targets: &targets,
            tau: 0.05,
            iterations: 6,
            tolerance: None,
            budget,
            resident_bytes: 0,
        };
        // 48 MiB: the matrix (1539 × 4103 or × 6156: 25 or 38 MB) is not
        // cached and the targets (at most 6.6 MB) fit one chunk; near the
        // smallest limit that runs they take several.
        let kept = sinkhorn_potentials(&request(48 << 20), &Silent).unwrap();
        let read = (16..64usize)
            .find_map(|mib| sinkhorn_potentials(&request(mib << 20), &Silent).ok())
            .expect("some limit under 64 MiB runs");
        let label = format!("{} target tables", targets.len());
        assert!(!kept.cached && !read.cached, "{label}");
        assert_eq!(kept.target_chunks, targets.len(), "{label}");
        assert!(
            read.target_chunks > targets.len(),
            "{label}: {}",
            read.target_chunks
        );
        assert_eq!(
            first_difference(&kept.target_potential, &read.target_potential),
            None,
            "{label}: f"
        );
        assert_eq!(
            first_difference(&kept.source_potential, &read.source_potential),
            None,
            "{label}: g"
        );
        assert_eq!(kept.marginal_error.to_bits(), read.marginal_error.to_bits());
    }
}

/// The potentials of the library, through its API, define a plan whose rows
/// and columns sum to the uniform marginals within 1e-3 after enough
/// iterations (checked densely here), and the reported marginal error is the
/// plan's own; with `tolerance` the iterations stop early.
#[test]
fn plan_marginals_converge_and_tolerance_stops_early() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 12;
    let c = case(22, 10, 900, 300, 10, dim);
    write_case(dir.path(), &c);
    let (gallery, bank) = (
        open_table(dir.path(), "gallery"),
        open_table(dir.path(), "bank"),
    );
    let tau = 0.1;
    let targets = [&gallery];
    let request = |iterations, tolerance| SinkhornRequest {
        sources: &bank,
        targets: &targets,
        tau,
        iterations,
        tolerance,
        budget: 1 << 30,
        resident_bytes: 0,
    };
    let outcome = sinkhorn_potentials(&request(300, None), &Silent).unwrap();
    let s = similarities(&to_f64(&c.bank, true), &to_f64(&c.gallery, true));
    let (m, n) = (s.len(), s[0].len());
    let plan = |b: usize, t: usize| {
        ((s[b][t] - outcome.source_potential[b] - outcome.target_potential[t]) / tau).exp()
    };
    let worst_row = (0..m)
        .map(|b| ((0..n).map(|t| plan(b, t)).sum::<f64>() * m as f64 - 1.0).abs())
        .fold(0.0, f64::max);
    let worst_column = (0..n)
        .map(|t| ((0..m).map(|b| plan(b, t)).sum::<f64>() * n as f64 - 1.0).abs())
        .fold(0.0, f64::max);
    assert!(worst_row < 1e-3, "row marginals off by {worst_row}");
    assert!(
        worst_column < 1e-3,
        "column marginals off by {worst_column}"
    );
    // The reported error is the plan's row error (up to the f32 similarities).
    assert!(
        (outcome.marginal_error - worst_row).abs() < 1e-4,
        "{}",
        outcome.marginal_error
    );
    // After 2 iterations the plan is far from converged; a tolerance of 10×
    // the 300-iteration error stops before 300 with an error within it.
    let early = sinkhorn_potentials(&request(2, None), &Silent).unwrap();
    assert!(early.marginal_error > 10.0 * outcome.marginal_error);
    let tolerance = (outcome.marginal_error * 10.0).max(1e-6);
    let stopped = sinkhorn_potentials(&request(300, Some(tolerance)), &Silent).unwrap();
    assert!(
        stopped.iterations < 300 && stopped.iterations > 2,
        "{}",
        stopped.iterations
    );
    assert!(stopped.marginal_error <= tolerance);
    // The tile cache is taken only when the blocks still fit beside it: at
    // the smallest limit that runs at all, the sweeps run uncached (rather
    // than the job being refused for a cache it does not need), and every
    // larger limit runs too, cached once the 1 MB matrix fits.
    let mut first_fit = None;
    let mut last = None;
    for quarter_mib in 16..160usize {
        let mut r = request(1, None);
        r.budget = quarter_mib << 18;
        match (sinkhorn_potentials(&r, &Silent), first_fit) {
            (Ok(outcome), None) => {
                assert!(
                    !outcome.cached,
                    "cached at the smallest limit, {quarter_mib}/4 MiB"
                );
                first_fit = Some(quarter_mib);
            }
            (Ok(outcome), Some(_)) => last = Some(outcome),
            (Err(_), None) => {}
            (Err(e), Some(fit)) => {
                panic!("{quarter_mib}/4 MiB refused after {fit}/4 MiB fitted: {e}")
            }
        }
    }
    assert!(first_fit.is_some() && last.expect("larger limits ran").cached);
}

/// At a small τ some targets get (almost) no mass in the first iterations:
/// the column update from the row update's exps cannot represent them, so
/// those iterations redo it exactly. The potentials still match the dense
/// reference, cached and streamed, and later iterations use the fast form.
/// (Without the exact redo, f is off by 1.4e-3 here.)
#[test]
fn tiny_column_masses_fall_back_to_the_exact_column_update() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 8;
    // A 1100 × 2100 matrix (9 MB): cached under 1 GiB, streamed near the
    // smallest limit that runs at all.
    let c = case(31, 10, 2100, 1100, 10, dim);
    write_case(dir.path(), &c);
    let (gallery, bank) = (
        open_table(dir.path(), "gallery"),
        open_table(dir.path(), "bank"),
    );
    let (tau, iterations) = (0.001, 4);
    let targets = [&gallery];
    let s = similarities(&to_f64(&c.bank, true), &to_f64(&c.gallery, true));
    let (f_ref, g_ref) = reference_sinkhorn(&s, tau, iterations);
    let request = |budget| SinkhornRequest {
        sources: &bank,
        targets: &targets,
        tau,
        iterations,
        tolerance: None,
        budget,
        resident_bytes: 0,
    };
    let cached = sinkhorn_potentials(&request(1 << 30), &Silent).unwrap();
    let streamed = (16..64usize)
        .find_map(|mib| sinkhorn_potentials(&request(mib << 20), &Silent).ok())
        .expect("some limit under 64 MiB runs");
    assert!(cached.cached && !streamed.cached);
    for outcome in [cached, streamed] {
        assert!(
            outcome.exact_column_updates >= 1 && outcome.exact_column_updates < iterations,
            "exact column updates: {} of {iterations}",
            outcome.exact_column_updates
        );
        let worst_f = f_ref
            .iter()
            .zip(&outcome.target_potential)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        let worst_g = g_ref
            .iter()
            .zip(&outcome.source_potential)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            worst_f < 1e-5 && worst_g < 1e-5,
            "f off by {worst_f}, g by {worst_g}"
        );
    }
}

/// Sinkhorn as a cluster runs it (`sinkhorn_in_rounds`): T + 1 rounds over
/// shards of the targets, each shard updating its own f and sending its
/// share of every source row, merged here. Over [gallery; gallery bank]
/// with shard bounds that cut tiles and the boundary between the two
/// tables, some shards streamed by a small budget, and the tiny column
/// masses of a small τ (which one machine redoes exactly, and a round
/// always computes exactly): f and g equal the one-machine potentials
/// within 1e-6 of their magnitude (both are f32 kernels, ~3e-7 from the
/// f64 reference at τ = 0.001, in different forms) and the dense reference
/// within 1e-5, and `--tol` stops at the same iteration.
#[test]
fn rounds_over_target_shards_equal_one_machine() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 8;
    let c = case(41, 10, 2 * TILE_COLS + 37, 1500, 1500, dim);
    write_case(dir.path(), &c);
    let (gallery, bank, gallery_bank) = (
        open_table(dir.path(), "gallery"),
        open_table(dir.path(), "bank"),
        open_table(dir.path(), "gallery_bank"),
    );
    let targets = [&gallery, &gallery_bank];
    let n = (gallery.rows + gallery_bank.rows) as usize;
    let m = bank.rows as usize;
    let all = [to_f64(&c.gallery, true), to_f64(&c.gallery_bank, true)].concat();
    let s = similarities(&to_f64(&c.bank, true), &all);
    // Shards: inside the first tile, across tiles, across the two tables,
    // and the gallery bank's tail.
    let bounds = [0, 5, TILE_COLS + 3, gallery.rows as usize + 40, n];
    let mut streamed = false;
    for (tau, iterations, tolerance) in [(0.001, 4, None), (0.05, 6, None), (0.05, 200, Some(1e-4))]
    {
        let local = sinkhorn_potentials(
            &SinkhornRequest {
                sources: &bank,
                targets: &targets,
                tau,
                iterations,
                tolerance,
                budget: 1 << 30,
                resident_bytes: 0,
            },
            &Silent,
        )
        .unwrap();
        let rounds = sinkhorn_in_rounds(
            &RoundsRequest {
                sources: m,
                targets: n,
                tau,
                iterations,
                tolerance,
            },
            &Silent,
            |g| {
                let mut f = Vec::new();
                let mut rows = vec![LogSumExp::default(); m];
                for (i, shard) in bounds.windows(2).enumerate() {
                    let request = |budget| SinkhornRoundRequest {
                        sources: &bank,
                        targets: &targets,
                        target_rows: shard[0] as u64..shard[1] as u64,
                        tau,
                        source_potential: g,
                        budget,
                        resident_bytes: 0,
                    };
                    // Every other shard within the smallest limit it runs
                    // in (the last one streamed, its tiles not cached).
                    let round = match i % 2 {
                        0 => sinkhorn_round(&request(1 << 30))?,
                        _ => (16..64usize)
                            .find_map(|mib| sinkhorn_round(&request(mib << 20)).ok())
                            .expect("some limit under 64 MiB runs"),
                    };
                    streamed |= !round.cached;
                    f.extend(round.target_potential);
                    for (row, part) in rows.iter_mut().zip(&round.rows) {
                        row.merge(part);
                    }
                }
                Ok((f, rows))
            },
        )
        .unwrap();
        assert_eq!(rounds.iterations, local.iterations, "τ = {tau}");
        assert_eq!(rounds.exact_column_updates, 0);
        let worst = |a: &[f64], b: &[f64]| {
            assert_eq!(a.len(), b.len());
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        let (df, dg) = (
            worst(&rounds.target_potential, &local.target_potential),
            worst(&rounds.source_potential, &local.source_potential),
        );
        // The largest potential sets the scale of the kernel's f32 rounding.
        let scale = local
            .target_potential
            .iter()
            .chain(&local.source_potential)
            .map(|v| v.abs())
            .fold(0.0, f64::max);
        assert!(
            df <= 1e-6 * scale && dg <= 1e-6 * scale,
            "τ = {tau}: f off by {df}, g by {dg}, scale {scale}"
        );
        // The marginal error is max |exp(Δg/τ) − 1| over the change Δg of
        // the last iteration: rounding in g reaches it through 1/τ.
        let marginal = (rounds.marginal_error - local.marginal_error).abs();
        assert!(
            marginal <= 2e-6 * scale / tau,
            "τ = {tau}: marginal error {} vs {}",
            rounds.marginal_error,
            local.marginal_error
        );
        assert!(streamed, "no shard was streamed");
        if tolerance.is_none() {
            let (f_ref, g_ref) = reference_sinkhorn(&s, tau, iterations);
            let (df, dg) = (
                worst(&rounds.target_potential, &f_ref),
                worst(&rounds.source_potential, &g_ref),
            );
            assert!(
                df < 1e-5 && dg < 1e-5,
                "τ = {tau}: reference f off by {df}, g by {dg}"
            );
        }
    }
}

/// METHODS.md: with the source update skipped (g ≡ 0), one target update is
/// f(t) = τ·LSE_b s(b, t)/τ + τ·log|T|, i.e. `is` with β = 1/τ plus a constant.
#[test]
fn one_target_update_without_the_source_update_is_inverted_softmax() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 10;
    let c = case(23, 30, TILE_COLS + 3, TILE_ROWS + 1, 10, dim);
    write_case(dir.path(), &c);
    let tau = 0.0625; // β = 16 exactly
    let mut j = job(
        dir.path(),
        "is",
        vec![MethodSpec::new("is", &[("beta", 1.0 / tau)]).unwrap()],
        "2GiB",
        2,
    );
    j.gallery_bank = None;
    pipeline::run(&j, &Silent).unwrap();
    let stats = dir.path().join("is").join("gallery_stats.parquet");
    let file = std::fs::File::open(&stats).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut h = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        use arrow::array::AsArray;
        let column = batch.column_by_name("is_beta16_correction").unwrap();
        h.extend(
            column
                .as_primitive::<arrow::datatypes::Float64Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    let norm = |t: &Table| -> Vec<f32> {
        to_f64(t, true)
            .into_iter()
            .flatten()
            .map(|v| v as f32)
            .collect()
    };
    let (g, b) = (norm(&c.gallery), norm(&c.bank));
    let n = c.gallery.rows();
    let mut states = vec![LogSumExp::default(); n];
    lse_sweep(
        Rows::new(&b, dim),
        Rows::new(&g, dim),
        TileSource::Compute,
        Sweep::Columns {
            row_shift: &vec![0.0; c.bank.rows()],
        },
        (1.0 / tau) as f32,
        &mut [],
        &mut states,
    );
    for t in 0..n {
        let f = tau * states[t].value() + tau * (n as f64).ln();
        let expected = h[t] + tau * (n as f64).ln();
        assert!((f - expected).abs() < 1e-6, "target {t}: {f} vs {expected}");
    }
}

/// `--transductive`: the test queries are the bank, for is and sn; other
/// methods are refused.
#[test]
fn transductive_uses_the_queries_as_the_bank() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(24, 200, 500, 50, 10, 12);
    write_case(dir.path(), &c);
    let tau = 0.05;
    let mut j = job(
        dir.path(),
        "tr",
        vec![
            MethodSpec::new("is", &[("beta", 20.0)]).unwrap(),
            MethodSpec::new("sn", &[("tau", tau), ("t", 10.0)]).unwrap(),
        ],
        "2GiB",
        2,
    );
    j.transductive = true;
    j.gallery_bank = None;
    j.bank = String::new();
    let summary = pipeline::run(&j, &Silent).unwrap();
    assert!(summary.transductive);
    assert_eq!(summary.bank, Some(200));
    let q = to_f64(&c.queries, true);
    let g = to_f64(&c.gallery, true);
    let (f, _) = reference_sinkhorn(&similarities(&q, &g), tau, 10);
    let h_is = reference_is_corrections(&q, &g, 20.0);
    let rows = read_results(&dir.path().join("tr").join("results.parquet"));
    let gallery_row = |id: &str| c.gallery.ids.iter().position(|x| x == id).unwrap();
    for (name, h) in [("is", &h_is), ("sn", &f)] {
        let scores = reference_scores(&q, &g, h);
        for (qi, qid) in c.queries.ids.iter().enumerate() {
            let ours: Vec<(usize, f32)> = rows
                .iter()
                .filter(|r| r.method == name && &r.query_id == qid)
                .map(|r| (gallery_row(&r.gallery_id), r.score))
                .collect();
            assert_ranking_matches(&ours, &scores[qi], 10, 1e-5, &format!("{name} {qi}"));
        }
    }
    j.methods = vec![MethodSpec::new("nnn", &[("alpha", 0.5), ("k", 8.0)]).unwrap()];
    j.out_dir = dir.path().join("refused");
    let err = pipeline::run(&j, &Silent).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("--transductive"), "{err}");
}

/// `dsl` against a dense reference, transductive (the column softmax over
/// every test query) and with a bank (over B ∪ {q}, under an 18 MiB limit on
/// one thread: at d = 256 pass 1 then takes the 4107-item gallery in three
/// chunks): score = s · exp(s/θ − L), L = log Σ exp(s(·, g)/θ) over that set.
#[test]
fn dual_softmax_matches_the_dense_reference_with_a_bank_and_transductive() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 256;
    let c = case(25, 300, TILE_COLS * 2 + 11, TILE_ROWS + 7, 10, dim);
    write_case(dir.path(), &c);
    let theta = 0.02;
    let q = to_f64(&c.queries, true);
    let g = to_f64(&c.gallery, true);
    let b = to_f64(&c.bank, true);
    let dense = |bank: &[Vec<f64>], include_query: bool| -> Vec<Vec<f64>> {
        let normaliser: Vec<f64> = (0..g.len())
            .map(|t| log_sum_exp(bank.iter().map(|r| dot(r, &g[t])), 1.0 / theta))
            .collect();
        q.iter()
            .map(|qv| {
                (0..g.len())
                    .map(|t| {
                        let s = dot(qv, &g[t]);
                        let x = s / theta;
                        let l = if include_query {
                            let (hi, lo) = (normaliser[t].max(x), normaliser[t].min(x));
                            hi + (lo - hi).exp().ln_1p()
                        } else {
                            normaliser[t]
                        };
                        s * (x - l).exp()
                    })
                    .collect()
            })
            .collect()
    };
    let gallery_row = |id: &str| c.gallery.ids.iter().position(|x| x == id).unwrap();
    for (out, transductive, memory, threads) in
        [("bank", false, "18MiB", 1), ("tr", true, "2GiB", 2)]
    {
        let mut j = job(
            dir.path(),
            out,
            vec![MethodSpec::new("dsl", &[("theta", theta)]).unwrap()],
            memory,
            threads,
        );
        j.gallery_bank = None;
        j.transductive = transductive;
        if transductive {
            j.bank = String::new();
        }
        let summary = pipeline::run(&j, &Silent).unwrap();
        let expected = if transductive {
            dense(&q, false)
        } else {
            dense(&b, true)
        };
        let rows = read_results(&dir.path().join(out).join("results.parquet"));
        let mut hits = 0;
        for (qi, qid) in c.queries.ids.iter().enumerate() {
            let ours: Vec<(usize, f32)> = rows
                .iter()
                .filter(|r| r.method == "dsl" && &r.query_id == qid)
                .map(|r| (gallery_row(&r.gallery_id), r.score))
                .collect();
            assert_ranking_matches(&ours, &expected[qi], 10, 1e-5, &format!("dsl {out} {qi}"));
            let target = gallery_row(&c.queries.targets.as_ref().unwrap()[qi]);
            hits += (reference_rank(&expected[qi], target) <= 1.0) as usize;
        }
        let r1 = summary.methods[1]
            .quality
            .as_ref()
            .unwrap()
            .recall_at(1)
            .unwrap();
        assert!(
            (r1 - hits as f64 / q.len() as f64).abs() < 1e-12,
            "{out}: R@1 {r1}"
        );
    }
}

/// `sinkhorn-pp`: every query stacked with the pseudo-test set (here the
/// whole 31-row bank, m = 32, so the sample is known) and normalised on its
/// own, against the dense reference run on each stack; a job above the
/// protocol's size limit is refused with the cost and a pointer to `sn`.
#[test]
fn single_query_sinkhorn_matches_the_dense_reference_and_refuses_large_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 16;
    let c = case(26, 40, TILE_COLS + 5, 31, 10, dim);
    write_case(dir.path(), &c);
    let (tau, iterations) = (0.05, 10);
    let spec = MethodSpec::new(
        "sinkhorn-pp",
        &[
            ("tau", tau),
            ("t", iterations as f64),
            ("m", (31) as f64 + 1.0),
        ],
    )
    .unwrap();
    let mut j = job(dir.path(), "pp", vec![spec], "12MiB", 1);
    j.gallery_bank = None;
    pipeline::run(&j, &Silent).unwrap();
    let q = to_f64(&c.queries, true);
    let g = to_f64(&c.gallery, true);
    let b = to_f64(&c.bank, true);
    let rows = read_results(&dir.path().join("pp").join("results.parquet"));
    let gallery_row = |id: &str| c.gallery.ids.iter().position(|x| x == id).unwrap();
    for (qi, qid) in c.queries.ids.iter().enumerate() {
        let stack: Vec<Vec<f64>> = std::iter::once(q[qi].clone())
            .chain(b.iter().cloned())
            .collect();
        let (f, _) = reference_sinkhorn(&similarities(&stack, &g), tau, iterations);
        let scores: Vec<f64> = (0..g.len()).map(|t| dot(&q[qi], &g[t]) - f[t]).collect();
        let ours: Vec<(usize, f32)> = rows
            .iter()
            .filter(|r| r.method == "sinkhorn-pp" && &r.query_id == qid)
            .map(|r| (gallery_row(&r.gallery_id), r.score))
            .collect();
        assert_ranking_matches(&ours, &scores, 10, 1e-5, &format!("sinkhorn-pp {qi}"));
    }
    j.methods = vec![MethodSpec::new(
        "sinkhorn-pp",
        &[
            ("tau", tau),
            ("t", (1_000_000_000) as f64),
            ("m", (31) as f64 + 1.0),
        ],
    )
    .unwrap()];
    j.out_dir = dir.path().join("refused");
    let err = pipeline::run(&j, &Silent).unwrap_err().to_string();
    assert!(
        err.contains("exp evaluations") && err.contains("--method sn"),
        "{err}"
    );
    assert!(!dir.path().join("refused").join("results.parquet").exists());
}
