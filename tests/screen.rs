//! The bf16 screen's bound (kernel::bf16::ScreenBound) against the f32
//! GEMM's scores, on inputs chosen to break it: rounding boundaries lined
//! up so that every error has the same sign, large dimensions, scales far
//! from 1 without normalisation, denormals, cancellation, and the narrow
//! similarity band of some models. Every screened score must lie within
//! the bound of the f32 score; where the inputs are built to reach the
//! bound's main term, the error must come close to it (the bound is not
//! loose by construction).

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
    let (qb, gb) = (convert_rows(q).expect("finite"), convert_rows(g).expect("finite"));
    let mut screened = vec![0.0f32; m * n];
    screen_tile(&mut screened, n, &qb, m, &gb, n, dim);
    let bound = ScreenBound::new(dim);
    let (qn, gn) = (row_norms(q, dim), row_norms(g, dim));
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let e = bound.of(qn[i], gn[j]) as f64;
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
    let band = |rng: &mut StdRng, rows: usize| {
        let noise = gaussian_rows(rng, rows, dim, true);
        let mut data: Vec<f32> = noise
            .chunks_exact(dim)
            .flat_map(|row| row.iter().zip(&centre).map(|(n, c)| 0.89 * c + 0.46 * n))
            .collect();
        for row in data.chunks_exact_mut(dim) {
            let norm = row.iter().map(|&v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= norm);
        }
        data
    };
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
        let sign = |i: usize| if (i * 7 / 3) % 2 == 0 { 1.0 } else { -1.0 };
        let q: Vec<f32> = (0..4 * dim).map(|i| sign(i % dim) * below_half * 2f32.powi(-5)).collect();
        let g: Vec<f32> = (0..6 * dim).map(|i| sign(i % dim) * below_half * 2f32.powi(-4)).collect();
        let ratio = worst_ratio(&q, &g, dim, &format!("rounding boundaries, dim {dim}"));
        eprintln!("dim {dim}: the error reaches {ratio:.3} of the bound");
        // The conversion term is attained; the accumulation terms (≈ d·2⁻²⁴
        // each) are not, since those roundings have both signs.
        assert!(ratio > 0.9, "dim {dim}: the error reaches only {ratio:.3} of the bound");
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
    let q: Vec<f32> = (0..10 * dim).map(|i| 1e-20 * if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
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
