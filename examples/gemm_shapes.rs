//! Single-thread GEMM throughput of `similarity_tile` for several tile shapes,
//! the measurement behind the kernel's TILE_ROWS × TILE_COLS choice.
//!
//! Run: `cargo run --release --example gemm_shapes`
use hubnorm::kernel::gemm::similarity_tile;
use std::time::Instant;

fn main() {
    let dim = 512;
    let total_rows = 2048;
    let total_cols = 8192;
    let a: Vec<f32> = (0..total_rows * dim)
        .map(|i| (i % 97) as f32 / 97.0 - 0.5)
        .collect();
    let b: Vec<f32> = (0..total_cols * dim)
        .map(|i| (i % 89) as f32 / 89.0 - 0.5)
        .collect();
    println!("one thread, d = {dim}, {total_rows} x {total_cols} covered by tiles of:");
    for (rows, cols) in [
        (256, 1024),
        (512, 1024),
        (1024, 1024),
        (512, 2048),
        (1024, 4096),
        (2048, 8192),
        (128, 4096),
        (256, 4096),
    ] {
        let mut out = vec![0f32; rows * cols];
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for r0 in (0..total_rows).step_by(rows) {
                for c0 in (0..total_cols).step_by(cols) {
                    similarity_tile(
                        &mut out,
                        cols,
                        &a[r0 * dim..(r0 + rows) * dim],
                        rows,
                        &b[c0 * dim..(c0 + cols) * dim],
                        cols,
                        dim,
                    );
                }
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flops = 2.0 * total_rows as f64 * total_cols as f64 * dim as f64;
        println!("{rows:>5} x {cols:<5} {:>7.1} GFLOP/s", flops / best / 1e9);
    }
    let flops = 2.0 * total_rows as f64 * total_cols as f64 * dim as f64;
    let mut out = vec![0f32; total_rows * total_cols];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        // SAFETY: shapes and strides describe the three buffers exactly.
        unsafe {
            gemm::gemm(
                total_rows,
                total_cols,
                dim,
                out.as_mut_ptr(),
                1,
                total_cols as isize,
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
                gemm::Parallelism::Rayon(2),
            );
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "one {total_rows} x {total_cols} GEMM, gemm's own 2 threads: {:>7.1} GFLOP/s",
        flops / best / 1e9
    );
    use rayon::prelude::*;
    for (rows, cols) in [(512, 1024), (1024, 1024), (512, 2048)] {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            a.par_chunks(rows * dim).for_each(|strip| {
                let mut tile = vec![0f32; rows * cols];
                for c0 in (0..total_cols).step_by(cols) {
                    similarity_tile(
                        &mut tile,
                        cols,
                        strip,
                        rows,
                        &b[c0 * dim..(c0 + cols) * dim],
                        cols,
                        dim,
                    );
                }
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "strips of {rows} x {cols} tiles on 2 rayon threads: {:>7.1} GFLOP/s",
            flops / best / 1e9
        );
    }
}

/// Two threads: our split (one tile strip per rayon task, single-threaded
/// GEMM per tile) against one large GEMM parallelised inside `gemm`.
#[allow(dead_code)]
fn two_threads() {}
