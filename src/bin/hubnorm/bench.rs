//! `hubnorm bench`: throughput of the kernel and of both passes on generated
//! data, in GFLOP/s (2·rows·cols·dim per second), medians of several runs.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use clap::Args;
use hubnorm::kernel::bf16::{pack_gallery_panels, pack_query_rows, screen_packed};
use hubnorm::kernel::{
    column_log_sum_exp, column_statistics, column_statistics_screened, gemm::similarity_tile,
    has_avx512, lse_sweep, search_block, search_block_screened, ColumnScoring, ColumnStates,
    ColumnStatsRequest, LogSumExp, Positives, QueryState, RowWeight, Rows, Screen, ScreenedRows,
    Sweep, TileSource, TILE_COLS, TILE_ROWS,
};
use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions};
use hubnorm::pipeline;
use hubnorm::{HubnormError, Result};
use rayon::prelude::*;

/// The 2-core AVX-512 FMA peak DESIGN.md gives for the Zen 5 machine it measured.
const DESIGN_PEAK_GFLOPS: f64 = 418.0;

/// f32 FMA throughput of this machine: 12 independent FMA chains per thread
/// (enough to hide the FMA latency) of its widest vectors, 16 lanes with
/// AVX-512 and 8 with AVX2 and FMA, on every worker thread at once; `None`
/// without FMA.
fn measured_peak_gflops(pool: &rayon::ThreadPool) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        /// `$name(iterations)`: 12 independent chains of `$fmadd` on
        /// `$lanes`-lane vectors, their lanes summed at the end.
        macro_rules! fma_chains {
            ($name:ident, $features:literal, $vector:ty, $lanes:literal, $set1:ident, $fmadd:ident) => {
                #[target_feature(enable = $features)]
                fn $name(iterations: u64) -> f32 {
                    use std::arch::x86_64::*;
                    let x = $set1(0.999_999);
                    let y = $set1(1e-7);
                    let mut acc = [$set1(1.0); 12];
                    for _ in 0..iterations {
                        for a in acc.iter_mut() {
                            *a = $fmadd(*a, x, y);
                        }
                    }
                    acc.iter()
                        .map(|&a| {
                            // SAFETY: the vector is `$lanes` f32 lanes, the layout of the array.
                            let lanes: [f32; $lanes] =
                                unsafe { std::mem::transmute::<$vector, _>(a) };
                            lanes.iter().sum::<f32>()
                        })
                        .sum()
                }
            };
        }
        fma_chains!(
            fma_chains_512,
            "avx512f",
            __m512,
            16,
            _mm512_set1_ps,
            _mm512_fmadd_ps
        );
        fma_chains!(
            fma_chains_256,
            "avx2,fma",
            __m256,
            8,
            _mm256_set1_ps,
            _mm256_fmadd_ps
        );
        // 12 chains, one multiply and one add per lane each.
        if has_avx512() {
            // SAFETY: AVX-512F was detected.
            return Some(chains_gflops(pool, 12.0 * 16.0 * 2.0, |n| unsafe {
                fma_chains_512(n)
            }));
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA were detected.
            return Some(chains_gflops(pool, 12.0 * 8.0 * 2.0, |n| unsafe {
                fma_chains_256(n)
            }));
        }
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// GFLOP/s of `chains(iterations)` run on every worker thread at once,
/// each iteration `flops` floating-point operations.
#[cfg(target_arch = "x86_64")]
fn chains_gflops(pool: &rayon::ThreadPool, flops: f64, chains: impl Fn(u64) -> f32 + Sync) -> f64 {
    let iterations = 20_000_000u64;
    let threads = pool.current_num_threads();
    let t = Instant::now();
    let sum: f32 = pool.install(|| {
        (0..threads)
            .into_par_iter()
            .map(|_| chains(std::hint::black_box(iterations)))
            .sum()
    });
    std::hint::black_box(sum);
    threads as f64 * iterations as f64 * flops / t.elapsed().as_secs_f64() / 1e9
}

/// bf16 dot-product throughput of this machine (AVX512_BF16): 12
/// independent chains of `vdpbf16ps` per thread, each instruction 16 lanes ×
/// 2 products and 2 additions (4 flops), on every worker thread at once.
fn measured_bf16_peak_gflops(pool: &rayon::ThreadPool) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if !hubnorm::kernel::bf16::has_avx512_bf16() {
            return None;
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
        fn dot_chains(iterations: u64) -> f32 {
            use std::arch::x86_64::*;
            // SAFETY: plain bit patterns of 32 bf16 values.
            let (x, y) = unsafe {
                (
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(0x3f80)),
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(0x3400)),
                )
            };
            let mut acc = [_mm512_set1_ps(1.0); 12];
            for _ in 0..iterations {
                for a in acc.iter_mut() {
                    *a = _mm512_dpbf16_ps(*a, x, y);
                }
            }
            acc.iter().map(|a| _mm512_reduce_add_ps(*a)).sum()
        }
        // 12 chains of 16 lanes, two products and two additions each.
        // SAFETY: AVX512_BF16 was detected above.
        Some(chains_gflops(pool, 12.0 * 16.0 * 4.0, |n| unsafe {
            dot_chains(n)
        }))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Embedding dimensions to measure.
    #[arg(long, value_delimiter = ',', default_value = "384,512")]
    pub dims: Vec<usize>,
    /// Rows of the query (and bank) block in the kernel benchmarks.
    #[arg(long, default_value_t = 4096)]
    pub rows: usize,
    /// Columns (gallery items) of the kernel benchmarks.
    #[arg(long, default_value_t = 16384)]
    pub cols: usize,
    /// Queries, gallery items and bank rows of the end-to-end passes.
    #[arg(long, default_value_t = 20000)]
    pub pass_rows: usize,
    /// Gallery items and bank rows of the sn-versus-is comparison (its
    /// similarity matrix must fit half the default limit to be cached).
    #[arg(long, default_value_t = 10000)]
    pub sinkhorn_rows: usize,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Skip the end-to-end passes (kernel only).
    #[arg(long)]
    pub kernel_only: bool,
    /// Only the sn-versus-is pass-1 comparison (no kernel or pass benchmarks).
    #[arg(long, conflicts_with = "kernel_only")]
    pub sinkhorn_only: bool,
    /// Only measure the f32 FMA peak and print `peak_gflops=X threads=N`
    /// (for scripts such as benches/peers).
    #[arg(long)]
    pub peak_only: bool,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

/// Times `f` `repeats` times; returns the median seconds and all samples.
fn time(repeats: usize, mut f: impl FnMut()) -> (f64, Vec<f64>) {
    f(); // warm-up: page faults, pool start, CPU frequency
    let samples: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    // A stop request cuts pass 1's strips short (their Interrupted errors
    // are dropped by the closures): a time measured across one is not a
    // figure to print.
    if hubnorm::cancel::requested() {
        eprintln!("error: stopped by a signal; this measurement is not printed");
        std::process::exit(130);
    }
    (median(samples.clone()), samples)
}

fn random_rows(rows: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut data: Vec<f32> = (0..rows * dim)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    for row in data.chunks_exact_mut(dim) {
        let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        row.iter_mut().for_each(|v| *v /= n);
    }
    data
}

fn report(peak: f64, name: &str, dim: usize, flops: f64, (secs, samples): (f64, Vec<f64>)) {
    let gflops = flops / secs / 1e9;
    let spread: Vec<String> = samples.iter().map(|s| format!("{:.3}", s)).collect();
    println!(
        "{name:<36} d={dim:<4} {:>7.1} GFLOP/s  {:>5.1}% of this machine's peak  {:>5.1}% of DESIGN's  median {:.3}s  [{}]",
        gflops,
        100.0 * gflops / peak,
        100.0 * gflops / DESIGN_PEAK_GFLOPS,
        secs,
        spread.join(" ")
    );
}

/// The similarity tiles alone (`tile`: the GEMM's or the bf16 screen's),
/// with the same tiling and parallelism as the passes.
fn tiles_only<T: Sync>(
    a: &[T],
    b: &[T],
    n: usize,
    dim: usize,
    tile: impl Fn(&mut [f32], usize, &[T], usize, &[T], usize, usize) + Sync,
) -> f32 {
    a.par_chunks(TILE_ROWS * dim)
        .map(|strip| {
            let rows = strip.len() / dim;
            let mut out = vec![0f32; rows * TILE_COLS];
            let mut checksum = 0f32;
            for c0 in (0..n).step_by(TILE_COLS) {
                let nc = TILE_COLS.min(n - c0);
                // To the end: packed bf16 columns are padded to whole panels.
                tile(&mut out, nc, strip, rows, &b[c0 * dim..], nc, dim);
                checksum += out[0];
            }
            checksum
        })
        .sum::<f32>()
}

fn write_bench_table(path: &Path, rows: usize, dim: usize, seed: u64) -> Result<()> {
    let data = random_rows(rows, dim, seed);
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(item.clone(), dim as i32),
            false,
        ),
    ]));
    let emb =
        FixedSizeListArray::try_new(item, dim as i32, Arc::new(Float32Array::from(data)), None)?;
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows as i64)),
            Arc::new(emb),
        ],
    )?;
    let file = std::fs::File::create(path).map_err(|e| HubnormError::Io {
        path: path.into(),
        source: e,
    })?;
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).map_err(|e| {
        HubnormError::Parquet {
            path: path.into(),
            source: e,
        }
    })?;
    w.write(&batch)
        .and_then(|_| w.close().map(|_| ()))
        .map_err(|e| HubnormError::Parquet {
            path: path.into(),
            source: e,
        })?;
    Ok(())
}

pub fn bench(args: BenchArgs) -> Result<()> {
    hubnorm::inputs::check_threads(args.threads)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .map_err(|e| HubnormError::Internal(e.to_string()))?;
    if args.peak_only {
        // Best of three: the machine is shared, and a peak is an upper bound.
        let best = (0..3)
            .filter_map(|_| measured_peak_gflops(&pool))
            .fold(None, |best: Option<f64>, p| {
                Some(best.map_or(p, |b| b.max(p)))
            });
        return match best {
            Some(peak) => {
                let bf16 = (0..3)
                    .filter_map(|_| measured_bf16_peak_gflops(&pool))
                    .fold(None, |best: Option<f64>, p| {
                        Some(best.map_or(p, |b| b.max(p)))
                    });
                let bf16 = bf16.map_or(String::new(), |p| format!(" bf16_peak_gflops={p:.1}"));
                println!(
                    "peak_gflops={peak:.1} threads={}{bf16}",
                    pool.current_num_threads()
                );
                Ok(())
            }
            None => Err(HubnormError::Internal(
                "no FMA on this CPU: the peak loop needs AVX-512 or AVX2 with FMA".into(),
            )),
        };
    }
    let peak = measured_peak_gflops(&pool).unwrap_or(DESIGN_PEAK_GFLOPS);
    let bf16_peak = measured_bf16_peak_gflops(&pool);
    println!(
        "threads {}, AVX-512 {}, GEMM: {}, measured FMA peak {peak:.1} GFLOP/s, bf16 dot peak {} (DESIGN.md's machine: {DESIGN_PEAK_GFLOPS})",
        pool.current_num_threads(),
        if has_avx512() { "on" } else { "off" },
        hubnorm::kernel::gemm::backend_name(),
        bf16_peak.map_or("n/a (no AVX512_BF16)".into(), |p| format!("{p:.1} GFLOP/s")),
    );
    for &dim in &args.dims {
        if args.sinkhorn_only {
            let dir = tempfile_dir()?;
            let outcome = sinkhorn_cost(&dir, args.sinkhorn_rows, dim, &args);
            let _ = std::fs::remove_dir_all(&dir);
            outcome?;
            continue;
        }
        let (m, n) = (args.rows, args.cols);
        let a = random_rows(m, dim, 1);
        let b = random_rows(n, dim, 2);
        let flops = 2.0 * m as f64 * n as f64 * dim as f64;
        pool.install(|| {
            report(
                peak,
                "gemm tiles only",
                dim,
                flops,
                time(args.repeats, || {
                    std::hint::black_box(tiles_only(&a, &b, n, dim, similarity_tile));
                }),
            );
            if let Some(bf16_peak) = bf16_peak {
                // The kernel's operands as a search packs them, once per block.
                let (a16, b16) = (pack_query_rows(&a, dim).0, pack_gallery_panels(&b, dim).0);
                let pairs = dim.div_ceil(2);
                let (secs, samples) = time(args.repeats, || {
                    std::hint::black_box(tiles_only(
                        &a16,
                        &b16,
                        n,
                        pairs,
                        |out, ld, q, m, g, n, _| screen_packed(out, ld, q, m, g, n, dim),
                    ));
                });
                report(peak, "bf16 screen tiles only", dim, flops, (secs, samples));
                println!(
                    "{:<36} {:>5.1}% of this machine's bf16 dot peak ({bf16_peak:.1} GFLOP/s)",
                    "",
                    100.0 * flops / secs / 1e9 / bf16_peak
                );
            }
            let corrections = vec![0.01f32; n];
            for k in [10, 100] {
                report(
                    peak,
                    &format!("fused tile + top-{k} (search)"),
                    dim,
                    flops,
                    time(args.repeats, || {
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
                        std::hint::black_box(&states);
                    }),
                );
                if bf16_peak.is_some() {
                    report(
                        peak,
                        &format!("screened tile + top-{k} (search)"),
                        dim,
                        flops,
                        time(args.repeats, || {
                            let mut states: Vec<QueryState> =
                                (0..m).map(|_| QueryState::new(k, None)).collect();
                            let (q, g) = (Rows::new(&a, dim), Rows::new(&b, dim));
                            let (sq, sg) = (
                                ScreenedRows::queries(q).expect("finite"),
                                ScreenedRows::gallery(g).expect("finite"),
                            );
                            search_block_screened(
                                q,
                                g,
                                0,
                                &[ColumnScoring::Subtract(&corrections)],
                                &Positives::none(m),
                                &mut states,
                                Some(Screen::new(&sq, &sg)),
                            );
                            std::hint::black_box(&states);
                        }),
                    );
                }
            }
            report(
                peak,
                "fused tile + log-sum-exp (stats)",
                dim,
                flops,
                time(args.repeats, || {
                    let mut states = vec![LogSumExp::default(); n];
                    column_log_sum_exp(
                        Rows::new(&a, dim),
                        Rows::new(&b, dim),
                        &[20.0],
                        &mut states,
                    )
                    .ok();
                    std::hint::black_box(&states);
                }),
            );
            // Pass 1's column top-k lists (csls's k = 10), exact and screened.
            let request = ColumnStatsRequest {
                column_top_k: 10,
                ..ColumnStatsRequest::default()
            };
            let (bank, gallery) = (Rows::new(&a, dim), Rows::new(&b, dim));
            report(
                peak,
                "fused tile + column top-10 (stats)",
                dim,
                flops,
                time(args.repeats, || {
                    let mut states = ColumnStates::new(n, &request, 0);
                    column_statistics(bank, gallery, 0, 0, &request, &mut states).ok();
                    std::hint::black_box(&states);
                }),
            );
            if bf16_peak.is_some() {
                report(
                    peak,
                    "screened tile + column top-10 (stats)",
                    dim,
                    flops,
                    time(args.repeats, || {
                        let mut states = ColumnStates::new(n, &request, 0);
                        let (sb, sg) = (
                            ScreenedRows::queries(bank).expect("finite"),
                            ScreenedRows::gallery(gallery).expect("finite"),
                        );
                        let screen = Screen::new(&sb, &sg);
                        column_statistics_screened(
                            bank,
                            gallery,
                            (0, 0),
                            &request,
                            &mut states,
                            Some(screen),
                        )
                        .ok();
                        std::hint::black_box(&states);
                    }),
                );
            }
        });
        if args.kernel_only {
            continue;
        }
        let dir = tempfile_dir()?;
        let rows = args.pass_rows;
        for (name, seed) in [("queries", 3), ("gallery", 4), ("bank", 5)] {
            write_bench_table(&dir.join(format!("{name}.parquet")), rows, dim, seed)?;
        }
        let flops = 2.0 * rows as f64 * rows as f64 * dim as f64;
        let path = |name: &str| dir.join(name).display().to_string();
        let methods = vec![MethodSpec::new("is", &[("beta", 20.0)])?];
        let options = PassOptions {
            memory: MemoryBudget::DEFAULT,
            threads: args.threads,
            ..PassOptions::default()
        };
        let stats = pipeline::StatsJob {
            gallery: path("gallery.parquet"),
            bank: path("bank.parquet"),
            gallery_bank: None,
            bank_sample: None,
            methods: methods.clone(),
            out: dir.join("stats.parquet"),
            overwrite: true,
            options: options.clone(),
            checkpoint: Default::default(),
        };
        let mut failure = None;
        report(
            peak,
            &format!("pass 1 end to end ({rows}²)"),
            dim,
            flops,
            time(args.repeats, || {
                if let Err(e) = pipeline::run_stats(&stats, &hubnorm::progress::Silent) {
                    failure = Some(e);
                }
            }),
        );
        let search = pipeline::SearchJob {
            queries: path("queries.parquet"),
            gallery: path("gallery.parquet"),
            stats: Some(dir.join("stats.parquet")),
            methods,
            k: 10,
            out: dir.join("results.parquet"),
            overwrite: true,
            options,
        };
        report(
            peak,
            &format!("pass 2 end to end ({rows}², top-10)"),
            dim,
            flops,
            time(args.repeats, || {
                if let Err(e) = pipeline::run_search(&search, &hubnorm::progress::Silent) {
                    failure = Some(e);
                }
            }),
        );
        if let Err(e) = sinkhorn_cost(&dir, rows.min(args.sinkhorn_rows), dim, &args) {
            failure = Some(e);
        }
        let _ = std::fs::remove_dir_all(&dir);
        if let Some(e) = failure {
            return Err(e);
        }
    }
    Ok(())
}

/// The cost of `sn` (T = 10) relative to `is` in pass 1 on `rows` gallery
/// items × `rows` bank rows: with the similarity tiles cached (the default
/// limit holds them) and streamed (a limit that cannot hold them).
///
/// `is` and cached `sn` run in alternating pairs and the ratio reported is
/// the median of the per-pair ratios: the load on this shared machine drifts
/// by 2× within minutes, and a pair sees the same load. The streamed run (tens
/// of seconds each) is timed at most 3 times after the pairs.
fn sinkhorn_cost(dir: &Path, rows: usize, dim: usize, args: &BenchArgs) -> Result<()> {
    sweep_cost(rows, dim, args)?;
    for (name, seed) in [("sn_gallery", 6), ("sn_bank", 7)] {
        write_bench_table(&dir.join(format!("{name}.parquet")), rows, dim, seed)?;
    }
    let matrix = (rows * rows * 4) as u64;
    let stats_once = |method: MethodSpec, memory: MemoryBudget| -> Result<f64> {
        let job = pipeline::StatsJob {
            gallery: dir.join("sn_gallery.parquet").display().to_string(),
            bank: dir.join("sn_bank.parquet").display().to_string(),
            gallery_bank: None,
            bank_sample: None,
            methods: vec![method],
            out: dir.join("sn_stats.parquet"),
            overwrite: true,
            options: PassOptions {
                memory,
                threads: args.threads,
                ..PassOptions::default()
            },
            checkpoint: Default::default(),
        };
        let started = Instant::now();
        pipeline::run_stats(&job, &hubnorm::progress::Silent)?;
        Ok(started.elapsed().as_secs_f64())
    };
    let is = MethodSpec::new("is", &[("beta", 20.0)])?;
    let sn = MethodSpec::new("sn", &[("tau", 0.01), ("t", 10.0)])?;
    // Warm-up: page faults, the thread pool, the input files in the page cache.
    stats_once(is, MemoryBudget::DEFAULT)?;
    stats_once(sn, MemoryBudget::DEFAULT)?;
    let repeats = args.repeats.max(1);
    let (mut is_secs, mut sn_secs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..repeats {
        let a = stats_once(is, MemoryBudget::DEFAULT)?;
        let b = stats_once(sn, MemoryBudget::DEFAULT)?;
        is_secs.push(a);
        sn_secs.push(b);
        ratios.push(b / a);
    }
    // Half the matrix: too small to cache it, so every sweep recomputes the GEMM.
    let streamed_budget = MemoryBudget((matrix / 2).max(64 << 20) as usize);
    let streamed_samples = (0..repeats.min(3))
        .map(|_| stats_once(sn, streamed_budget))
        .collect::<Result<Vec<f64>>>()?;
    let (is, cached, streamed) = (median(is_secs), median(sn_secs), median(streamed_samples));
    println!(
        "pass 1 sn (T = 10) vs is, {rows}² d={dim}: is {is:.3}s, sn cached {cached:.3}s ({:.2}× is: median of {repeats} alternating pairs' ratios), sn streamed {streamed:.3}s ({:.2}× is, median of {})",
        median(ratios),
        streamed / is,
        repeats.min(3)
    );
    Ok(())
}

/// Cached row sweeps and cached column sweeps of `rows`² similarities
/// (the halves of a Sinkhorn iteration once the tiles are cached), in ms and
/// in elements per ns: the row update with a max pass (the first iteration)
/// and shifted by a bound on the max (the later ones); the column update in
/// its exact form (a max pass and an exp per element) and in the exp-reuse
/// form the iterations use (weighted by the row sweep's results; the fused
/// iteration takes the row's exps while they are in cache instead of
/// recomputing them).
fn sweep_cost(rows: usize, dim: usize, args: &BenchArgs) -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .map_err(|e| HubnormError::Internal(e.to_string()))?;
    let a = random_rows(rows, dim, 8);
    let b = random_rows(rows, dim, 9);
    let (sources, targets) = (Rows::new(&a, dim), Rows::new(&b, dim));
    let shifts = vec![0.0f32; rows];
    let inv_tau = 100.0;
    let mut cache = vec![0f32; rows * rows];
    pool.install(|| {
        let mut row_states = vec![LogSumExp::default(); rows];
        let strip_states = lse_sweep(
            sources,
            targets,
            TileSource::Fill(&mut cache),
            Sweep::Rows {
                col_shift: &shifts,
                row_bound: None,
            },
            inv_tau,
            &mut row_states,
            &mut [],
        );
        let log_m = (rows as f64).ln();
        let masses: Vec<f64> = row_states.iter().map(|row| row.value() + log_m).collect();
        let by_strip = |value: fn(&LogSumExp) -> f32| -> Vec<Vec<f32>> {
            strip_states
                .iter()
                .map(|strip| strip.iter().map(value).collect())
                .collect()
        };
        // The later iterations' bound on a row's max: its last LSE (plus
        // the fall of f, here none).
        let bounds = by_strip(|s| s.value() as f32);
        let bounds: Vec<&[f32]> = bounds.iter().map(Vec::as_slice).collect();
        let shifts_used = by_strip(|s| s.max as f32);
        let weights = RowWeight::per_strip(shifts_used.iter().map(Vec::as_slice), &masses);
        let weights: Vec<&[RowWeight]> = weights.iter().map(|w| w.as_slice()).collect();
        let cached = |sweep: Sweep<'_>| {
            time(args.repeats, || {
                let (mut by_row, mut by_col) = match sweep {
                    Sweep::Rows { .. } => (vec![LogSumExp::default(); rows], Vec::new()),
                    Sweep::Columns { .. } | Sweep::WeightedColumns { .. } => {
                        (Vec::new(), vec![LogSumExp::default(); rows])
                    }
                };
                lse_sweep(
                    sources,
                    targets,
                    TileSource::Cached(&cache),
                    sweep,
                    inv_tau,
                    &mut by_row,
                    &mut by_col,
                );
                std::hint::black_box((by_row, by_col));
            })
        };
        let (by_rows, _) = cached(Sweep::Rows {
            col_shift: &shifts,
            row_bound: None,
        });
        let (bounded_rows, _) = cached(Sweep::Rows {
            col_shift: &shifts,
            row_bound: Some(&bounds),
        });
        let (by_cols, _) = cached(Sweep::Columns { row_shift: &shifts });
        let (weighted, _) = cached(Sweep::WeightedColumns {
            col_shift: &shifts,
            weights: &weights,
        });
        let elements = (rows * rows) as f64;
        let rate = |secs: f64| elements / secs / 1e9;
        println!(
            "cached sinkhorn sweeps, {rows}²: rows {:.1} ms ({:.2} elements/ns), rows shifted by a bound (no max pass) {:.1} ms ({:.2} elements/ns), columns exact {:.1} ms ({:.2} elements/ns), columns from the rows' weights {:.1} ms ({:.2} elements/ns); median of {}",
            by_rows * 1e3,
            rate(by_rows),
            bounded_rows * 1e3,
            rate(bounded_rows),
            by_cols * 1e3,
            rate(by_cols),
            weighted * 1e3,
            rate(weighted),
            args.repeats
        );
    });
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("hubnorm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| HubnormError::Io {
        path: dir.clone(),
        source: e,
    })?;
    Ok(dir)
}
