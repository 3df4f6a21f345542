//! Kernel benchmarks, one per kernel, the naive baseline beside the tuned one.
//! Throughput is reported in elements/s where one element is one floating-point
//! operation (2·rows·cols·dim per tile), so "Gelem/s" reads as GFLOP/s.
//!
//! Run: `cargo bench --bench kernel`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hubnorm::kernel::gemm::{naive_similarity_tile, similarity_tile};
use hubnorm::kernel::{
    column_log_sum_exp, search_block, ColumnScoring, LogSumExp, Positives, QueryState, Rows,
};

fn rows(n: usize, dim: usize, seed: u32) -> Vec<f32> {
    (0..n * dim)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32
                - 0.5
        })
        .collect()
}

fn tile(c: &mut Criterion) {
    let (m, n) = (256, 1024);
    let mut group = c.benchmark_group("similarity_tile");
    for dim in [384, 512] {
        let (a, b) = (rows(m, dim, 1), rows(n, dim, 2));
        let mut out = vec![0f32; m * n];
        group.throughput(Throughput::Elements((2 * m * n * dim) as u64));
        group.bench_with_input(BenchmarkId::new("gemm", dim), &dim, |bench, &dim| {
            bench.iter(|| similarity_tile(&mut out, n, &a, m, &b, n, dim))
        });
        group.sample_size(10);
        group.bench_with_input(BenchmarkId::new("naive", dim), &dim, |bench, &dim| {
            bench.iter(|| naive_similarity_tile(&mut out, n, &a, m, &b, n, dim))
        });
    }
    group.finish();
}

fn fused(c: &mut Criterion) {
    let (m, n, dim) = (2048, 8192, 384);
    let (a, b) = (rows(m, dim, 3), rows(n, dim, 4));
    let corrections = vec![0.01f32; n];
    let mut group = c.benchmark_group("fused_block");
    group.sample_size(10);
    group.throughput(Throughput::Elements((2 * m * n * dim) as u64));
    for k in [10, 100] {
        group.bench_with_input(BenchmarkId::new("search_topk", k), &k, |bench, &k| {
            bench.iter(|| {
                let mut states: Vec<QueryState> =
                    (0..m).map(|_| QueryState::new(k, None)).collect();
                search_block(
                    Rows::new(&a, dim),
                    Rows::new(&b, dim),
                    0,
                    &[ColumnScoring::Subtract(&corrections)],
                    &Positives::none(m),
                    &mut states,
                );
                states
            })
        });
    }
    group.bench_function("column_log_sum_exp", |bench| {
        bench.iter(|| {
            let mut states = vec![LogSumExp::default(); n];
            column_log_sum_exp(Rows::new(&a, dim), Rows::new(&b, dim), &[20.0], &mut states)
                .unwrap();
            states
        })
    });
    group.finish();
}

criterion_group!(benches, tile, fused);
criterion_main!(benches);
