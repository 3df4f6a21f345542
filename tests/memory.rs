//! Peak heap stays under `--memory-limit` plus a fixed overhead while the
//! gallery and the bank are each several times larger than the limit.
mod common;

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions};
use hubnorm::pipeline::{self, RunJob, StatsJob};
use hubnorm::progress::Silent;

/// Counts live heap bytes and their peak.
struct Tracking;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size > layout.size() {
                let now = CURRENT.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                    - layout.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// The counters are process-wide: tests in this file take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Heap the run may use beyond the limit: what the plan does not count row by
/// row (Parquet footers and page indexes, rayon's job queues, Arrow schema
/// objects, the summary). Stated in the README.
const FIXED_OVERHEAD: usize = 4 << 20;

/// Runs `f` and returns its result with the peak heap it added.
fn peak_heap_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

/// Fails when `peak` exceeds the limit plus [`FIXED_OVERHEAD`].
fn assert_heap_within(what: &str, peak: usize, limit: usize) {
    eprintln!(
        "{what}: peak heap {:.1} MiB for a {:.1} MiB limit",
        peak as f64 / (1 << 20) as f64,
        limit as f64 / (1 << 20) as f64
    );
    assert!(
        peak <= limit + FIXED_OVERHEAD,
        "{what}: peak heap {peak} exceeds limit {limit} + overhead {FIXED_OVERHEAD}"
    );
}

/// `is` with β = 20.
fn is() -> MethodSpec {
    MethodSpec::new("is", &[("beta", 20.0)]).unwrap()
}

/// A run of `methods` over the inputs [`write_inputs`] wrote to `dir`, on
/// two threads within `limit`, into `dir/out`.
fn run_in(dir: &std::path::Path, methods: Vec<MethodSpec>, limit: usize) -> RunJob {
    RunJob {
        methods,
        options: PassOptions {
            memory: MemoryBudget(limit),
            threads: 2,
            ..PassOptions::default()
        },
        ..RunJob::new(
            dir.join("queries.parquet").display().to_string(),
            dir.join("gallery.parquet").display().to_string(),
            dir.join("bank.parquet").display().to_string(),
            dir.join("out"),
        )
    }
}

/// Writes each `(name, table)` to `dir/name.parquet` as fixed-size lists of f32.
fn write_inputs(dir: &std::path::Path, tables: &[(&str, &Table)]) {
    for (name, table) in tables {
        write_table(
            &dir.join(format!("{name}.parquet")),
            table,
            Layout::FixedF32,
            false,
        );
    }
}

#[test]
fn peak_heap_follows_the_memory_limit_not_the_input_size() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let limit: usize = 48 << 20;
    let dim = 768;
    let mut r = rng(31);
    // 48,000 × 768 f32 = 147 MB (2.9 × the limit) and 32,000 × 768 = 98 MB (1.9 ×).
    let gallery = random_table(&mut r, "g", 48_000, dim);
    let bank = random_table(&mut r, "b", 32_000, dim);
    let queries = queries_near(&mut r, &gallery, 3_000, 0.5);
    write_inputs(
        dir.path(),
        &[
            ("gallery", &gallery),
            ("bank", &bank),
            ("queries", &queries),
        ],
    );
    drop((gallery, bank, queries));
    let job = run_in(dir.path(), vec![is()], limit);
    let (summary, peak) = peak_heap_of(|| pipeline::run(&job, &Silent).unwrap());
    assert_eq!(summary.queries, 3_000);
    assert!(
        summary.methods[1]
            .quality
            .as_ref()
            .unwrap()
            .recall_at(1)
            .unwrap()
            > 0.5,
        "the run did real work"
    );
    assert_heap_within("run", peak, limit);
    // The inputs did not fit: the bound is not trivially met.
    assert!(
        std::fs::metadata(dir.path().join("gallery.parquet"))
            .unwrap()
            .len() as usize
            > 2 * limit
    );
}

/// Long lists (k = 1000): pass 2's result rows, not its similarities, fill
/// the budget, and the plan counts what a row costs while its batch is
/// built (ids included; the batch's vectors are allocated once).
#[test]
fn long_result_lists_stay_within_the_limit() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let limit: usize = 256 << 20;
    let mut r = rng(37);
    let gallery = random_table(&mut r, "gallery-item-", 20_000, 128);
    let bank = random_table(&mut r, "b", 1_000, 128);
    let queries = queries_near(&mut r, &gallery, 8_000, 0.5);
    write_inputs(
        dir.path(),
        &[
            ("gallery", &gallery),
            ("bank", &bank),
            ("queries", &queries),
        ],
    );
    let job = RunJob {
        k: 1000,
        ..run_in(dir.path(), vec![is()], limit)
    };
    let (summary, peak) = peak_heap_of(|| pipeline::run(&job, &Silent).unwrap());
    assert_eq!(summary.queries, 8_000);
    assert_heap_within("run, k = 1000", peak, limit);
    // 16 million result rows (is and the baseline), 36 bytes each at the
    // least while built: twice the limit.
    use parquet::file::reader::FileReader;
    let results = std::fs::File::open(dir.path().join("out/results.parquet")).unwrap();
    let rows = parquet::file::reader::SerializedFileReader::new(results)
        .unwrap()
        .metadata()
        .file_metadata()
        .num_rows();
    assert_eq!(rows, 16_000_000);
}

/// Pass 1 with a bank small enough to be cached: the gallery (several times
/// the limit) is read in pieces of half the plan's chunk, the next one read
/// ahead while the current one is worked on, so two pieces fit the room of
/// one chunk.
#[test]
fn stats_holds_one_gallery_chunk_at_a_time() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // Large enough that a gallery chunk (about 75 MB) outweighs what the plan
    // reserves and does not use (GEMM workspace estimates): two whole chunks
    // held at the same time would show.
    let limit: usize = 128 << 20;
    let dim = 384;
    let mut r = rng(37);
    // 120,000 × 384 f32 = 184 MB (1.4 × the limit, six pieces); the bank
    // (4.6 MB) is cached.
    let gallery = random_table(&mut r, "g", 120_000, dim);
    let bank = random_table(&mut r, "b", 3_000, dim);
    write_inputs(dir.path(), &[("gallery", &gallery), ("bank", &bank)]);
    drop((gallery, bank));
    let job = StatsJob {
        methods: vec![MethodSpec::new("is", &[("beta", 20.0)]).unwrap()],
        options: PassOptions {
            memory: MemoryBudget(limit),
            threads: 2,
            ..PassOptions::default()
        },
        ..StatsJob::new(
            dir.path().join("gallery.parquet").display().to_string(),
            dir.path().join("bank.parquet").display().to_string(),
            dir.path().join("gallery_stats.parquet"),
        )
    };
    let (_, peak) = peak_heap_of(|| pipeline::run_stats(&job, &Silent).unwrap());
    assert_heap_within("stats", peak, limit);
}

/// The toolkit methods' own states (`mp`'s covariances and per-query
/// Gaussians, `dissim-local`'s neighbour rows and centroids, `ls`'s top
/// lists) are counted in the plan: a run of all three over a gallery and a
/// bank each larger than the limit stays within it.
#[test]
fn toolkit_methods_stay_within_the_limit() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let limit: usize = 48 << 20;
    let dim = 384;
    let mut r = rng(39);
    // 40,000 × 384 f32 = 61 MB (1.3 × the limit); the bank 20,000 rows (31 MB).
    let gallery = random_table(&mut r, "g", 40_000, dim);
    let bank = random_table(&mut r, "b", 20_000, dim);
    let queries = queries_near(&mut r, &gallery, 600, 0.5);
    write_inputs(
        dir.path(),
        &[
            ("gallery", &gallery),
            ("bank", &bank),
            ("queries", &queries),
        ],
    );
    drop((gallery, bank, queries));
    let methods = ["mp", "dissim-local", "ls"]
        .iter()
        .map(|m| MethodSpec::new(m, &[]).unwrap())
        .collect();
    let job = run_in(dir.path(), methods, limit);
    let (summary, peak) = peak_heap_of(|| pipeline::run(&job, &Silent).unwrap());
    assert_eq!(summary.methods.len(), 4);
    assert_heap_within("run of mp, dissim-local, ls", peak, limit);
}

/// The plan counts `tile_workspace_bytes(dim)` per thread (and, in a
/// Sinkhorn sweep, `sweep_packing_bytes(dim)` more); the GEMM's own
/// allocations (packing buffers, its per-thread slab), with the slab
/// kernel's packed columns beside them, must fit inside it.
#[test]
fn gemm_workspace_estimate_covers_its_allocations() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    use hubnorm::kernel::{
        gemm::{similarity_tile, slab_depth, SlabTiles},
        sweep_packing_bytes, tile_workspace_bytes, BANK_TILE_COLS, BANK_TILE_ROWS, SLAB_COLS,
        SLAB_ROWS, TILE_COLS, TILE_ROWS,
    };
    // Pass 2's query tiles (columns packed a piece at a time), pass 1's
    // bank tiles (a strip packed), a sweep's tiles (a strip packed).
    let shapes = [
        ("search", TILE_ROWS, TILE_COLS, SLAB_COLS, 0),
        ("pass 1", BANK_TILE_ROWS, BANK_TILE_COLS, BANK_TILE_COLS, 0),
        ("sweep", TILE_ROWS, TILE_COLS, TILE_COLS, 1),
    ];
    for (pass, rows, cols, packed, sweeps) in shapes {
        for dim in [16, 384, 768, 1536, 4096] {
            let a = vec![0.5f32; rows * dim];
            let b = vec![0.25f32; cols * dim];
            let mut out = vec![0f32; rows * cols];
            // Run on a fresh thread so its first-use slab is counted too;
            // the crate's buffers stay with the thread while the slab
            // kernel's packed columns are alive.
            let ((), used) = peak_heap_of(|| {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        similarity_tile(&mut out, cols, &a, rows, &b, cols, dim);
                        if let Some(mut slabs) = SlabTiles::new() {
                            slabs.pack_columns(&b, packed, dim);
                            let kc = slab_depth(dim).expect("a micro-kernel CPU");
                            slabs.slab(&mut out, cols, &a, SLAB_ROWS, kc);
                        }
                    });
                })
            });
            let tile = rows * cols * 4;
            let estimate = tile_workspace_bytes(dim) + sweeps * sweep_packing_bytes(dim);
            eprintln!(
                "{pass}, {rows} × {cols}, dim {dim}: the GEMMs allocated {used} bytes; estimate {}",
                estimate - tile
            );
            assert!(
                used + tile <= estimate,
                "{pass}, {rows} × {cols}, dim {dim}: {used} bytes"
            );
        }
    }
}

/// The same bound with every input read from an object store (a real
/// S3-compatible server, see tests/common/s3.rs) and the outputs uploaded
/// there: ranged reads with their prefetches are counted in the plan.
#[test]
fn object_store_inputs_stay_within_the_limit() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(server) =
        common::s3::S3Server::start_or_skip("object_store_inputs_stay_within_the_limit")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let limit: usize = 64 << 20;
    let dim = 768;
    let mut r = rng(41);
    // 40,000 × 768 f32 = 123 MB (1.8 × the limit).
    let gallery = random_table(&mut r, "g", 40_000, dim);
    let bank = random_table(&mut r, "b", 12_000, dim);
    let queries = queries_near(&mut r, &gallery, 1_000, 0.5);
    write_inputs(
        dir.path(),
        &[
            ("gallery", &gallery),
            ("bank", &bank),
            ("queries", &queries),
        ],
    );
    drop((gallery, bank, queries));
    server.create_bucket("mem");
    for name in ["gallery", "bank", "queries"] {
        let file = dir.path().join(format!("{name}.parquet"));
        server.put_file("mem", &format!("in/{name}.parquet"), &file);
    }
    let options: Vec<(String, String)> = [
        ("aws_endpoint", server.endpoint()),
        ("aws_allow_http", "true".into()),
        ("aws_region", "us-east-1".into()),
        ("aws_access_key_id", common::s3::ACCESS_KEY.into()),
        ("aws_secret_access_key", common::s3::SECRET_KEY.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    hubnorm::storage::configure(&options).unwrap();
    let job = RunJob {
        methods: vec![MethodSpec::new("is", &[("beta", 20.0)]).unwrap()],
        options: PassOptions {
            memory: MemoryBudget(limit),
            threads: 2,
            ..PassOptions::default()
        },
        ..RunJob::new(
            "s3://mem/in/queries.parquet",
            "s3://mem/in/gallery.parquet",
            "s3://mem/in/bank.parquet",
            "s3://mem/out",
        )
    };
    let (summary, peak) = peak_heap_of(|| pipeline::run(&job, &Silent).unwrap());
    hubnorm::storage::configure(&[]).unwrap();
    assert_eq!(summary.queries, 1_000);
    assert!(server.get("mem", "out/results.parquet").is_some());
    assert_heap_within("run on s3://", peak, limit);
}
