//! Arbitrary bytes as a Parquet embedding table.
//!
//! The input is written to a `.parquet` file and opened the way the passes
//! open the gallery, the bank and the queries (`EmbeddingTable::open` with
//! the default read options, with and without the ground-truth column), then
//! every block is read to the end, as are the ids alone, every other row
//! alone (`read_rows`), the second half
//! (`blocks_from`, a resumed pass) and a seeded sample of the rows and its
//! complement (`--bank-sample`, `tune --validation-split`). Any `Err` is a
//! correct answer; a panic, an abort or an allocation beyond libFuzzer's
//! `-rss_limit_mb` is a bug.
//!
//! A panic counts when it escapes the library. The parquet crate panics on
//! some damaged pages; `source::next_batch` catches those around the
//! decoder and returns an error, so the fuzz target replaces libFuzzer's
//! abort-at-once panic hook with one that only records the message, and
//! aborts (printing it) when a panic reaches the target.

#![no_main]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, Once, OnceLock};

use hubnorm::options::ReadOptions;
use hubnorm::source::EmbeddingTable;
use libfuzzer_sys::fuzz_target;

/// The block size the library's own whole-table scans use (stats_file's
/// bank means, sinkhorn-pp's pseudo-test set, the evaluation's targets).
const BLOCK_ROWS: usize = 4096;

/// One input file per fuzzing process, rewritten for every input.
fn input_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hubnorm-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzz input directory");
        dir.join("input.parquet")
    })
}

/// Reads every block of `table`, checking the shapes the passes rely on.
fn read_to_end(table: &EmbeddingTable) {
    for block in table.blocks(BLOCK_ROWS) {
        let Ok(block) = block else { return };
        assert_eq!(
            block.data.len(),
            block.rows * block.dim,
            "block data length"
        );
        assert_eq!(block.ids.len(), block.rows, "one id per row");
        if let Some(targets) = &block.targets {
            assert_eq!(targets.len(), block.rows, "one target per row");
        }
        let _ = block.view();
    }
}

fn read(spec: &str, want_targets: bool) {
    let options = ReadOptions::default();
    let Ok(table) = EmbeddingTable::open("gallery", spec, &options, want_targets) else {
        return;
    };
    read_to_end(&table);
    let _ = table.read_all_ids();
    // Rows read alone (the ground truth of a streamed gallery): every other row.
    let alternate: Vec<u64> = (0..table.rows.min(10_000)).step_by(2).collect();
    if let Ok(Some(values)) = table.read_rows(&alternate) {
        assert_eq!(values.len(), alternate.len() * table.dim, "rows read alone");
    }
    // A resumed pass starts mid-table (`stats --resume`).
    if let Ok(reader) = table.blocks_from(BLOCK_ROWS, table.rows / 2) {
        for block in reader {
            if block.is_err() {
                break;
            }
        }
    }
    if table.rows >= 2 {
        // `--bank-sample N` with N below the table's rows, and its complement
        // (`tune --validation-split`).
        let rows = (table.rows / 2).min(3);
        if let Ok(sample) = table.sampled(rows, 7) {
            read_to_end(&sample);
        }
        if let Ok(rest) = table.sampled_complement(rows, 7) {
            read_to_end(&rest);
        }
    }
}

/// The last panic's message and backtrace.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

fn record_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let trace = std::backtrace::Backtrace::force_capture();
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(format!("{info}\n{trace}"));
        }))
    });
}

fuzz_target!(|data: &[u8]| {
    record_panics();
    let path = input_path();
    std::fs::write(path, data).expect("write the fuzz input");
    let spec = path.to_str().expect("temporary path is UTF-8");
    let escaped = catch_unwind(AssertUnwindSafe(|| {
        read(spec, false);
        read(spec, true);
    }));
    if escaped.is_err() {
        let last = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
        eprintln!("a panic escaped the library: {}", last.unwrap_or_default());
        std::process::abort();
    }
});
