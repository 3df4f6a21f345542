//! The optional system BLAS (`HUBNORM_BLAS`): tiles equal to a dense
//! reference, whole runs equal to the `gemm` crate's except in the last bits,
//! reproducible runs, and a clear refusal of a library that cannot be used.
//!
//! The library tried is `HUBNORM_TEST_BLAS` when set (e.g. MKL's
//! `libmkl_rt.so`), else Debian's OpenBLAS (`libopenblas0-serial`, which
//! `.ci/run` installs). Without either these tests skip, unless
//! `HUBNORM_REQUIRE_BLAS=1` (set by `.ci/run` once OpenBLAS is installed).
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;
use hubnorm::kernel::{gemm, TILE_COLS, TILE_ROWS};

const SYSTEM_OPENBLAS: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
];

/// The BLAS these tests use, or `None` (skip) when there is none.
fn test_blas() -> Option<PathBuf> {
    let found = match std::env::var_os("HUBNORM_TEST_BLAS") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => SYSTEM_OPENBLAS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists()),
    };
    if found.is_none() {
        assert!(
            std::env::var_os("HUBNORM_REQUIRE_BLAS").is_none(),
            "HUBNORM_REQUIRE_BLAS is set but no BLAS was found (HUBNORM_TEST_BLAS or {SYSTEM_OPENBLAS:?})"
        );
        eprintln!("skipped: no BLAS (set HUBNORM_TEST_BLAS or install libopenblas0-serial)");
    }
    found
}

/// Loads the test BLAS into this process once; every in-process test shares it.
fn loaded_blas() -> Option<&'static hubnorm::kernel::gemm::blas::Blas> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = *LOADED.get_or_init(|| match test_blas() {
        Some(path) => {
            gemm::use_blas(&path).unwrap_or_else(|e| panic!("{e}"));
            true
        }
        None => false,
    });
    loaded.then(|| gemm::blas().expect("a BLAS was loaded"))
}

#[test]
fn blas_tiles_match_a_dense_reference_at_tile_edges() {
    let Some(blas) = loaded_blas() else { return };
    assert_eq!(
        gemm::backend_name(),
        format!("blas:{}", blas.path().display())
    );
    let mut r = rng(5);
    for (m, n, dim, pad) in [
        (1, 1, 1, 0),
        (1, TILE_COLS, 384, 3),
        (7, 5, 13, 4),
        (8, 8, 64, 0),
        (TILE_ROWS + 1, 33, 48, 1),
        (3, TILE_COLS + 5, 16, 0),
    ] {
        let a = random_table(&mut r, "a", m, dim).data;
        let b = random_table(&mut r, "b", n, dim).data;
        let ld = n + pad;
        let mut out = vec![f32::NAN; m * ld];
        gemm::similarity_tile(&mut out, ld, &a, m, &b, n, dim);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..dim)
                    .map(|t| a[i * dim + t] as f64 * b[j * dim + t] as f64)
                    .sum();
                let got = out[i * ld + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{m}x{n}x{dim} cell ({i},{j}): {got} vs {want}"
                );
            }
            // The padding past the tile width is not written.
            assert!(out[i * ld + n..(i + 1) * ld].iter().all(|v| v.is_nan()));
        }
    }
    // Where the library promises it, a cell's bits do not depend on the shape
    // of the product it was computed in (the tile edges move with the memory
    // limit).
    let (m, n, dim) = (300, 1500, 384);
    let a = random_table(&mut r, "a", m, dim).data;
    let b = random_table(&mut r, "b", n, dim).data;
    let mut whole = vec![0f32; m * n];
    gemm::similarity_tile(&mut whole, n, &a, m, &b, n, dim);
    let mut same_bits = true;
    for (rows, cols) in [(1, n), (8, 8), (37, 100), (m, 17)] {
        let mut part = vec![0f32; rows * cols];
        gemm::similarity_tile(&mut part, cols, &a, rows, &b, cols, dim);
        for i in 0..rows {
            same_bits &= part[i * cols..(i + 1) * cols] == whole[i * n..i * n + cols];
        }
    }
    if blas.shape_independent() {
        assert!(
            same_bits,
            "{}: bits depend on the product's shape",
            blas.path().display()
        );
    } else {
        eprintln!(
            "{}: shape-dependent bits: {}",
            blas.path().display(),
            !same_bits
        );
    }
    // One BLAS per process: a second choice is refused.
    let again = gemm::use_blas(blas.path()).unwrap_err().to_string();
    assert!(again.contains("already in use"), "{again}");
}

/// `hubnorm run` on the case in `dir` into `dir/out`, with the system BLAS
/// `blas` (`HUBNORM_BLAS`) or the `gemm` crate (`HUBNORM_BLAS` unset).
fn run_with_blas(dir: &Path, blas: Option<&Path>, extra: &[&str], out: &str) -> PathBuf {
    let p = |n: &str| dir.join(n).display().to_string();
    let out_dir = dir.join(out);
    let mut command = hubnorm(["run", "--queries", &p("queries.parquet")]);
    command.env_remove("HUBNORM_BLAS");
    if let Some(path) = blas {
        command.env("HUBNORM_BLAS", path);
    }
    command
        .args([
            "--gallery",
            &p("gallery.parquet"),
            "--bank",
            &p("bank.parquet"),
        ])
        .args(["--methods", "none,is,dis,nnn,csls,sn", "--quiet"])
        .args(extra)
        .args(["--out", &out_dir.display().to_string()])
        .output()
        .assert_success();
    out_dir
}

/// Each (method, query)'s list in rank order: (gallery id, score).
fn lists(results: &Path) -> BTreeMap<(String, String), Vec<(String, f32)>> {
    let mut out: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for row in read_results(results) {
        out.entry((row.method, row.query_id)).or_default().push((
            row.rank,
            row.gallery_id,
            row.score,
        ));
    }
    out.into_iter()
        .map(|(key, mut rows)| {
            rows.sort_by_key(|r| r.0);
            (key, rows.into_iter().map(|(_, id, s)| (id, s)).collect())
        })
        .collect()
}

fn generated_case(dir: &Path) {
    // A gallery wider than one tile and a bank taller than one, so the tiles
    // have ragged edges.
    write_case(
        dir,
        &CaseShape {
            seed: 31,
            gallery: TILE_COLS + 700,
            queries: 300,
            bank: TILE_ROWS * 2 + 77,
            dim: 48,
            noise: 0.2,
        },
    );
}

#[test]
fn runs_with_a_blas_equal_the_gemm_crate_runs_except_in_the_last_bits() {
    let Some(path) = test_blas() else { return };
    let dir = tempfile::tempdir().unwrap();
    generated_case(dir.path());
    let ours = run_with_blas(dir.path(), None, &[], "gemm");
    let theirs = run_with_blas(dir.path(), Some(&path), &[], "blas");

    let gemm_of = |out: &Path| {
        parquet_metadata(&out.join("results.parquet"))
            .into_iter()
            .find(|(k, _)| k == "hubnorm.gemm")
            .map(|(_, v)| v)
    };
    assert_eq!(gemm_of(&ours).as_deref(), Some("gemm crate"));
    assert_eq!(gemm_of(&theirs), Some(format!("blas:{}", path.display())));

    let (a, b) = (
        lists(&ours.join("results.parquet")),
        lists(&theirs.join("results.parquet")),
    );
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let tol = 1e-5f32;
    let mut swaps = 0;
    for (key, list_a) in &a {
        let list_b = &b[key];
        assert_eq!(list_a.len(), list_b.len(), "{key:?}");
        let score_in_a: BTreeMap<_, _> = list_a.iter().map(|(id, s)| (id, *s)).collect();
        let last_a = list_a.last().unwrap().1;
        for (rank, ((id_a, s_a), (id_b, s_b))) in list_a.iter().zip(list_b).enumerate() {
            assert!(
                (s_a - s_b).abs() <= tol,
                "{key:?} rank {rank}: {s_a} vs {s_b}"
            );
            if id_a != id_b {
                swaps += 1;
                // A swap is only allowed between near-equal scores: the other
                // list's item is in this list with a score as close, or it
                // entered at the cut-off, tied with the last item.
                let close = score_in_a
                    .get(id_b)
                    .map_or((s_b - last_a).abs() <= tol, |s| (s - s_a).abs() <= tol);
                assert!(
                    close,
                    "{key:?} rank {rank}: {id_a} ({s_a}) vs {id_b} ({s_b})"
                );
            }
        }
    }
    eprintln!("{} lists compared, {swaps} near-tie swaps", a.len());
}

#[test]
fn runs_with_a_blas_are_reproducible() {
    let Some(path) = test_blas() else { return };
    let Some(blas) = loaded_blas() else { return };
    let dir = tempfile::tempdir().unwrap();
    generated_case(dir.path());
    let read = |out: &Path| {
        ["results.parquet", "gallery_stats.parquet"]
            .map(|name| std::fs::read(out.join(name)).unwrap())
    };
    let reference = read(&run_with_blas(
        dir.path(),
        Some(&path),
        &["--threads", "1"],
        "t1",
    ));
    let again = read(&run_with_blas(
        dir.path(),
        Some(&path),
        &["--threads", "1"],
        "t1-again",
    ));
    assert!(again == reference, "two identical runs differ");
    let threads = read(&run_with_blas(
        dir.path(),
        Some(&path),
        &["--threads", "2"],
        "t2",
    ));
    // The thread count changes how a block's tiles are shared out, hence
    // their shapes too: OpenBLAS's AVX2 kernels (0.3.21 on Zen 3) round
    // such products differently, its AVX-512 ones did not.
    if blas.shape_independent() {
        assert!(threads == reference, "1 and 2 threads differ");
    } else {
        eprintln!(
            "{}: not shape-independent; thread-count bits: {}",
            path.display(),
            if threads == reference {
                "same"
            } else {
                "differ"
            }
        );
    }
    // A small limit changes the blocks, hence the tile edges: the bits stay
    // the same only where the library promises shape-independent products.
    let small = read(&run_with_blas(
        dir.path(),
        Some(&path),
        &["--threads", "2", "--memory-limit", "24MiB"],
        "small",
    ));
    if blas.shape_independent() {
        assert!(
            small == reference,
            "a smaller memory limit changed the bits"
        );
    } else {
        eprintln!(
            "{}: not shape-independent; memory-limit bits: {}",
            path.display(),
            if small == reference { "same" } else { "differ" }
        );
    }
}

#[test]
fn an_unusable_blas_is_refused_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    valid_case(dir.path());
    let p = |n: &str| dir.path().join(n).display().to_string();
    for (library, expected) in [
        ("/nonexistent/libblas.so", "cannot load"),
        // A shared library every glibc system has, without a CBLAS.
        ("libc.so.6", "no cblas_sgemm"),
    ] {
        let out = dir.path().join("out");
        let result = hubnorm(["run", "--queries", &p("queries.parquet")])
            .env("HUBNORM_BLAS", library)
            .args([
                "--gallery",
                &p("gallery.parquet"),
                "--bank",
                &p("bank.parquet"),
            ])
            .args(["--out", &out.display().to_string()])
            .output();
        let stderr = result.stderr();
        assert_eq!(result.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("HUBNORM_BLAS") && stderr.contains(library),
            "{stderr}"
        );
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!out.exists(), "an output folder was created");
    }
}
