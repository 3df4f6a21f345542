//! Single-thread time of the tile shapes the `gemm` crate sums in another
//! order than its large tiles (one row, one column, at most 256 elements,
//! at most 64 × 64 at depths beyond 512): the crate's own kernels for them
//! against `similarity_tile`, which computes them in the large tiles'
//! order (`TileScorer` chains) so that a pair's bits do not depend on the
//! tile holding it. Best of five rounds.
//!
//! Run: `cargo run --release --example small_tiles`
use hubnorm::kernel::gemm::similarity_tile;
use std::time::{Duration, Instant};

/// The crate's product as `similarity_tile` calls it, whatever the shape.
fn crate_tile(out: &mut [f32], a: &[f32], m: usize, b: &[f32], n: usize, dim: usize) {
    assert!(a.len() >= m * dim && b.len() >= n * dim && out.len() >= m * n);
    // SAFETY: the assert bounds every index the strides describe.
    unsafe {
        gemm::gemm(
            m,
            n,
            dim,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            dim as isize,
            b.as_ptr(),
            dim as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The best time of one call over five rounds of `reps`.
fn best_of(reps: usize, mut call: impl FnMut()) -> Duration {
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..reps {
                call();
            }
            start.elapsed() / reps as u32
        })
        .min()
        .expect("five rounds")
}

fn main() {
    println!("shape (m × n × d): the crate's kernel | similarity_tile, one thread");
    for (m, n, dim) in [
        (1usize, 2048usize, 384usize),
        (1, 2048, 768),
        (2048, 1, 384),
        (12, 16, 384),
        (40, 64, 768),
    ] {
        let a: Vec<f32> = (0..m * dim)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0)
            .collect();
        let b: Vec<f32> = (0..n * dim)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 100.0)
            .collect();
        let mut out = vec![0f32; m * n];
        let reps = 2000;
        let theirs = best_of(reps, || crate_tile(&mut out, &a, m, &b, n, dim));
        let ours = best_of(reps, || similarity_tile(&mut out, n, &a, m, &b, n, dim));
        let gflops = |t: Duration| 2.0 * (m * n * dim) as f64 / t.as_secs_f64() / 1e9;
        println!(
            "{m} × {n} × {dim}: {:.1} µs ({:.1} GFLOP/s) | {:.1} µs ({:.1} GFLOP/s)",
            theirs.as_secs_f64() * 1e6,
            gflops(theirs),
            ours.as_secs_f64() * 1e6,
            gflops(ours)
        );
    }
}
