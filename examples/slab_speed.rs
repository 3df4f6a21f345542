//! Single-thread throughput of pass 1's tile (2048 bank rows × 512 gallery
//! columns): the `gemm` crate's whole tile against hubnorm's AVX-512 slab
//! kernel computing it 128 rows at a time (same bits), three rounds.
//!
//! Run: `cargo run --release --example slab_speed -- 384`
use hubnorm::kernel::gemm::{similarity_tile, slab_depth, SlabTiles};
use std::time::Instant;

fn main() {
    let dim: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("a dimension"))
        .unwrap_or(384);
    let (m, n, slab_rows) = (2048usize, 512usize, 128usize);
    let a: Vec<f32> = (0..m * dim)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0)
        .collect();
    let b: Vec<f32> = (0..n * dim)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 100.0)
        .collect();
    let ld = n + 16;
    let mut out = vec![0f32; m * ld];
    let flops = 2.0 * (m * n * dim) as f64;
    let kc = slab_depth(m, n, dim).expect("a tile the crate's micro-kernel computes");
    let reps = 10;
    for round in 0..3 {
        let start = Instant::now();
        for _ in 0..reps {
            similarity_tile(&mut out, ld, &a, m, &b, n, dim);
        }
        let crate_gflops = flops * reps as f64 / start.elapsed().as_secs_f64() / 1e9;
        let start = Instant::now();
        for _ in 0..reps {
            let Some(mut tiles) = SlabTiles::new() else {
                println!("no AVX-512 here: no slab kernel");
                return;
            };
            tiles.pack_columns(&b, n, dim);
            for g0 in (0..m).step_by(slab_rows) {
                let rows = &a[g0 * dim..(g0 + slab_rows) * dim];
                tiles.slab(&mut out[..slab_rows * ld], ld, rows, slab_rows, kc);
            }
        }
        let slab_gflops = flops * reps as f64 / start.elapsed().as_secs_f64() / 1e9;
        println!(
            "round {round}, d = {dim}, depth block {kc}: gemm crate {crate_gflops:.1} GFLOP/s, \
             slabs {slab_gflops:.1} GFLOP/s"
        );
    }
}
