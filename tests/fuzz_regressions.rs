//! Regression tests of the fuzz targets (fuzz/README.md): the committed seed
//! corpus, mutated copies of it and every minimised crash under
//! tests/fixtures/fuzz/, through the same paths as the targets. Any input
//! may be refused with an `Err`; none may panic.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use hubnorm::options::ReadOptions;
use hubnorm::source::{EmbeddingBlock, EmbeddingTable};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The files of a directory, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Reads every block of `table`, checking the shapes the passes rely on;
/// whether the end was reached without an error.
fn read_to_end(blocks: impl Iterator<Item = hubnorm::Result<EmbeddingBlock>>) -> bool {
    for block in blocks {
        let Ok(b) = block else { return false };
        assert_eq!(b.data.len(), b.rows * b.dim, "block data length");
        assert_eq!(b.ids.len(), b.rows, "one id per row");
        if let Some(targets) = &b.targets {
            assert_eq!(targets.len(), b.rows, "one target per row");
        }
        let _ = b.view();
    }
    true
}

/// fuzz/fuzz_targets/read_embeddings.rs: open as a gallery (and as queries,
/// with the target column), read every block, the ids alone, the second
/// half (a resumed pass), and a seeded sample and its complement. Returns
/// whether every read succeeded.
fn read_table(spec: &str) -> bool {
    let mut all_ok = true;
    for want_targets in [false, true] {
        let options = ReadOptions::default();
        let table = match EmbeddingTable::open("gallery", spec, &options, want_targets) {
            Ok(t) => t,
            Err(e) => {
                let _ = e.to_string();
                all_ok = false;
                continue;
            }
        };
        all_ok &= read_to_end(table.blocks(4096));
        all_ok &= table.read_all_ids().is_ok();
        // Every other row read alone (the rows between skipped).
        let alternate: Vec<u64> = (0..table.rows.min(10_000)).step_by(2).collect();
        all_ok &= table.read_rows(&alternate).is_ok();
        all_ok &= match table.blocks_from(4096, table.rows / 2) {
            Ok(reader) => read_to_end(reader),
            Err(_) => false,
        };
        if table.rows >= 2 {
            let rows = (table.rows / 2).min(3);
            if let Ok(sample) = table.sampled(rows, 7) {
                all_ok &= read_to_end(sample.blocks(4096));
            }
            if let Ok(rest) = table.sampled_complement(rows, 7) {
                all_ok &= read_to_end(rest.blocks(4096));
            }
        }
    }
    all_ok
}

/// Writes `bytes` as a `.parquet` file and reads it; a panic is reported
/// with `name` rather than aborting the other cases.
fn check_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<bool, String> {
    let path = dir.join("input.parquet");
    std::fs::write(&path, bytes).unwrap();
    let spec = path.to_str().unwrap().to_owned();
    catch_unwind(AssertUnwindSafe(|| read_table(&spec))).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{name}: panicked: {message}")
    })
}

/// Truncations and single-byte flips at fixed positions (spread over the
/// file and dense over the footer, where the metadata lives).
fn mutations(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let n = bytes.len();
    let mut out = Vec::new();
    let mut cuts = vec![0, 1, 4, 8, n / 4, n / 2, 3 * n / 4];
    cuts.extend([12, 8, 4, 1].iter().filter(|&&c| c <= n).map(|c| n - c));
    for cut in cuts {
        out.push((format!("truncated at {cut}"), bytes[..cut].to_vec()));
    }
    let mut positions: Vec<usize> = (0..16).map(|i| i * n / 16).collect();
    positions.extend((1..=32.min(n)).map(|back| n - back));
    for pos in positions {
        for mask in [0xff, 0x01] {
            let mut copy = bytes.to_vec();
            copy[pos] ^= mask;
            out.push((format!("byte {pos} ^ {mask:#04x}"), copy));
        }
    }
    out
}

#[test]
fn committed_seeds_read_or_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = files(&repo("fuzz/seeds/read_embeddings"));
    assert!(seeds.len() >= 5, "the seed corpus is missing");
    let mut readable = 0;
    for seed in &seeds {
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(seed).unwrap();
        let ok = check_bytes(dir.path(), &name, &bytes).unwrap();
        // The seeds are named for what they hold: `bad_*` tables are refused.
        assert_eq!(ok, !name.starts_with("bad_"), "{name}");
        readable += ok as usize;
    }
    assert!(readable >= 5);
}

#[test]
fn mutated_seeds_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut panics = Vec::new();
    let mut cases = 0;
    for seed in files(&repo("fuzz/seeds/read_embeddings")) {
        let name = seed.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&seed).unwrap();
        for (what, mutated) in mutations(&bytes) {
            cases += 1;
            if let Err(panic) = check_bytes(dir.path(), &format!("{name}, {what}"), &mutated) {
                panics.push(panic);
            }
        }
    }
    assert!(cases > 500, "{cases} cases");
    assert!(
        panics.is_empty(),
        "{} of {cases} inputs panicked:\n{}",
        panics.len(),
        panics.join("\n")
    );
}

/// Where a minimised crash must now fail.
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// `EmbeddingTable::open` refuses the file.
    Open,
    /// The file opens; reading it ends in an error.
    Read,
    /// The file opens; reading from its second row on (a resumed pass,
    /// `blocks_from`) ends in an error.
    ResumedRead,
}

/// Crashes the fuzzer found, minimised (`cargo fuzz tmin`), each with the
/// error it must now get.
#[test]
fn fuzz_crashes_are_typed_errors() {
    let cases = [
        // The Arrow schema a writer embeds in the footer (ARROW:schema) with
        // a field of type NONE: arrow-ipc's conversion panicked
        // ("not implemented: Type NONE not supported") while the parquet
        // crate opened the file.
        (
            "arrow_schema_type_none.parquet",
            Stage::Open,
            "embedded Arrow schema",
        ),
        // A column chunk whose offset in the file is negative (one bit of
        // the footer flipped): `ColumnChunkMetaData::byte_range` asserted
        // ("column start and length should not be negative") when the
        // first batch was read.
        (
            "negative_column_offset.parquet",
            Stage::Open,
            "column chunk",
        ),
        // A data page header without its DataPageHeader: the parquet
        // crate's record skipping (a RowSelection, as `blocks_from` used)
        // unwrapped it ("called `Option::unwrap()` on a `None` value").
        (
            "damaged_page_header.parquet",
            Stage::ResumedRead,
            "cannot decode Parquet data",
        ),
        // A dictionary-encoded data page whose index bit width is 228: the
        // parquet crate asserted (`BitReader::get_batch`: "num_bits <=
        // size_of::<T>() * 8") while decoding the ids. The panic is caught
        // around the decoder (`source::next_batch`).
        (
            "dictionary_bit_width.parquet",
            Stage::Read,
            "decoder failed on damaged data",
        ),
    ];
    for (name, stage, phrase) in cases {
        let path = repo("tests/fixtures/fuzz").join(name);
        let spec = path.to_str().unwrap();
        for want_targets in [false, true] {
            let table =
                EmbeddingTable::open("gallery", spec, &ReadOptions::default(), want_targets);
            let err = match stage {
                Stage::Open => table.expect_err(name),
                Stage::Read | Stage::ResumedRead => {
                    let table = table.unwrap_or_else(|e| panic!("{name}: {e}"));
                    let start = if matches!(stage, Stage::Read) { 0 } else { 1 };
                    assert!(table.rows > start, "{name}");
                    // Reading rows alone skips the others with a RowSelection,
                    // which met the damaged page header's panic: an error now.
                    let mut rows = vec![start, table.rows - 1];
                    rows.dedup();
                    let alone = table.read_rows(&rows);
                    if name == "damaged_page_header.parquet" {
                        assert!(alone.is_err(), "{name}: rows read alone");
                    }
                    let mut reader = table.blocks_from(4096, start).unwrap();
                    let err = reader
                        .find_map(|block| block.err())
                        .unwrap_or_else(|| panic!("{name}: read without an error"));
                    // Nothing is read after the error.
                    assert!(reader.next().is_none(), "{name}");
                    err
                }
            };
            let message = err.to_string();
            assert_eq!(err.exit_code(), 2, "{name}: {message}");
            assert!(message.contains(name), "{name}: {message}");
            assert!(message.contains(phrase), "{name}: {message}");
        }
    }
    // Every fixture is listed above.
    let mut listed: Vec<_> = cases
        .iter()
        .map(|(n, _, _)| repo("tests/fixtures/fuzz").join(n))
        .collect();
    listed.sort();
    assert_eq!(files(&repo("tests/fixtures/fuzz")), listed);
}

/// The files a pass reads without the block reader (stats, results and
/// checkpoint files: `source::CheckedBatches`) catch the decoder's panics
/// on damaged pages too: here the results reader that `hubnorm report` and
/// `compare` use, on the fixture whose ids hold a dictionary bit width of
/// 228.
#[test]
fn files_read_batch_by_batch_refuse_damaged_pages_with_an_error() {
    let fixture = repo("tests/fixtures/fuzz/dictionary_bit_width.parquet");
    let read = catch_unwind(|| hubnorm::report::files::read_file_columns(&fixture, &["id"]));
    let err = read
        .expect("a typed error, not a panic")
        .expect_err("damaged ids");
    let message = err.to_string();
    assert_eq!(err.exit_code(), 2, "{message}");
    assert!(
        message.contains("dictionary_bit_width.parquet"),
        "{message}"
    );
    assert!(
        message.contains("decoder failed on damaged data") && message.contains("from row 0"),
        "{message}"
    );
}

/// A decoder panic caught at the boundary reaches the user as hubnorm's
/// error alone: exit code 2, the file named, no panic message, no output.
#[test]
fn a_caught_decoder_panic_prints_only_the_hubnorm_error() {
    let fixture = repo("tests/fixtures/fuzz/dictionary_bit_width.parquet");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("results.parquet");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_hubnorm"))
        .args(["search", "--queries"])
        .arg(&fixture)
        .arg("--gallery")
        .arg(&fixture)
        .args(["--method", "none", "--k", "1", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("decoder failed on damaged data"),
        "{stderr}"
    );
    assert!(stderr.contains("dictionary_bit_width.parquet"), "{stderr}");
    for panic_text in ["panicked", "num_bits", "RUST_BACKTRACE"] {
        assert!(!stderr.contains(panic_text), "{panic_text}: {stderr}");
    }
    assert!(!out.exists());
}
