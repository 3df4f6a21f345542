//! Single-thread throughput of the exact passes' tiles: the `gemm` crate's
//! whole tiles against hubnorm's AVX-512 slab kernel computing them a slab
//! of rows at a time (same bits), three rounds.
//!
//! - `pass1`: a 2048 bank rows × 512 gallery columns tile, slabs of 128 rows.
//! - `sinkhorn`: a strip of 2048 columns packed once, four tiles of 512 rows
//!   each, slabs of 32 or 128 rows.
//!
//! Run: `cargo run --release --example slab_speed -- 384 [pass1|sinkhorn]`
use hubnorm::kernel::gemm::{similarity_tile, slab_depth, SlabTiles};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dim: usize = args
        .next()
        .map(|s| s.parse().expect("a dimension"))
        .unwrap_or(384);
    let shape = args.next().unwrap_or_else(|| "pass1".into());
    let (m, n, tile_rows) = match shape.as_str() {
        "pass1" => (2048usize, 512usize, 2048usize),
        "sinkhorn" => (2048, 2048, 512),
        other => panic!("unknown shape {other}: pass1 or sinkhorn"),
    };
    let a: Vec<f32> = (0..m * dim)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0)
        .collect();
    let b: Vec<f32> = (0..n * dim)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 100.0)
        .collect();
    let ld = n + 16;
    let flops = 2.0 * (m * n * dim) as f64;
    let kc = slab_depth(dim).expect("a CPU with the crate's micro-kernel");
    if SlabTiles::new().is_none() {
        println!("no AVX-512 here: no slab kernel");
        return;
    }
    let reps = 10;
    let time = |run: &mut dyn FnMut(&mut [f32])| {
        let mut out = vec![0f32; tile_rows * ld];
        let start = Instant::now();
        for _ in 0..reps {
            run(&mut out);
        }
        flops * reps as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    // Slabs of `slab_rows` rows (the strip packed once per repetition).
    let (a, b) = (&a, &b);
    let slabs = |slab_rows: usize| {
        move |out: &mut [f32]| {
            let mut tiles = SlabTiles::new().expect("AVX-512");
            tiles.pack_columns(b, n, dim);
            for g0 in (0..m).step_by(slab_rows) {
                let rows = &a[g0 * dim..(g0 + slab_rows) * dim];
                tiles.slab(&mut out[..slab_rows * ld], ld, rows, slab_rows, kc);
            }
        }
    };
    for round in 0..3 {
        let crate_gflops = time(&mut |out| {
            for t0 in (0..m).step_by(tile_rows) {
                let rows = &a[t0 * dim..(t0 + tile_rows) * dim];
                similarity_tile(out, ld, rows, tile_rows, b, n, dim);
            }
        });
        let mut line = format!(
            "round {round}, {shape}, d = {dim}, depth block {kc}: gemm crate {crate_gflops:.1}"
        );
        let slab_rows: &[usize] = if shape == "pass1" { &[128] } else { &[32, 128] };
        for &rows in slab_rows {
            let gflops = time(&mut slabs(rows));
            line += &format!(", slabs of {rows} rows {gflops:.1}");
        }
        println!("{line} GFLOP/s");
    }
}
