//! Shared test helpers: Parquet tables in every accepted layout, reading
//! results back, running the `hubnorm` binary ([`hubnorm`]), and a dense f64
//! reference implementation of the spec (METHODS.md `none` and `is`,
//! REPORTS.md rank and skewness), written independently of the library.
#![allow(dead_code)]

pub mod cluster;
pub mod delta;
pub mod s3;

use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float16Array, Float32Array, Float64Array,
    Int64Array, LargeListArray, ListArray, RecordBatch, StringArray,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Float32Type, Int32Type, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The `hubnorm` binary under test with `args`, to add to (more arguments,
/// environment, working directory) and then run: [`TestCommand::output`]
/// to the end, or [`TestCommand::spawn`] for a test that signals it.
pub fn hubnorm<I, S>(args: I) -> TestCommand
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(env!("CARGO_BIN_EXE_hubnorm"));
    command.args(args);
    TestCommand { command }
}

/// A command line of the binary under test (see [`hubnorm`]).
#[derive(Debug)]
pub struct TestCommand {
    command: Command,
}

impl TestCommand {
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.command.arg(arg);
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.command.env(key, value);
        self
    }

    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        self.command.env_remove(key);
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.command.current_dir(dir);
        self
    }

    /// Runs it to the end (no stdin), its output captured.
    pub fn output(&mut self) -> TestOutput {
        let output = self.command.output().expect("run hubnorm");
        TestOutput {
            status: output.status,
            stdout: output.stdout,
            stderr: output.stderr,
        }
    }

    /// [`TestCommand::output`] of a command that may not end by itself
    /// (a server): killed, and the test failed with its stderr, after `limit`.
    pub fn output_within(&mut self, limit: Duration) -> TestOutput {
        let mut child = self.spawn();
        // Read while it runs, so that a full pipe cannot stall it.
        let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        };
        let stdout = drain(Box::new(child.stdout.take().unwrap()));
        let stderr = drain(Box::new(child.stderr.take().unwrap()));
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
                panic!("hubnorm still ran after {limit:?}; its stderr:\n{stderr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        TestOutput {
            status,
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        }
    }

    /// Starts it with stdout and stderr piped, for a test that waits on,
    /// signals or kills the child itself.
    pub fn spawn(&mut self) -> Child {
        self.command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hubnorm")
    }
}

/// What a finished run of the binary left: its exit status and streams.
#[derive(Debug)]
pub struct TestOutput {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl TestOutput {
    pub fn status(&self) -> ExitStatus {
        self.status
    }

    /// The exit code (`None` when a signal ended it).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// stdout as text (invalid UTF-8 replaced).
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stdout as it was written.
    pub fn stdout_bytes(&self) -> &[u8] {
        &self.stdout
    }

    /// stderr as text (invalid UTF-8 replaced).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Panics, with stderr, unless the run succeeded.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.success(),
            "hubnorm failed ({}): {}",
            self.status,
            self.stderr()
        );
        self
    }
}

/// How the embedding column is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Layout {
    FixedF32,
    FixedF16,
    FixedF64,
    ListF32,
    LargeListF64,
}

/// An in-memory embedding table.
#[derive(Debug, Clone)]
pub struct Table {
    pub ids: Vec<String>,
    pub dim: usize,
    pub data: Vec<f32>,
    /// Ground truth (gallery ids), one per row, when present.
    pub targets: Option<Vec<String>>,
}

impl Table {
    pub fn rows(&self) -> usize {
        self.ids.len()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Rows `range` as a new table.
    pub fn slice(&self, start: usize, end: usize) -> Table {
        Table {
            ids: self.ids[start..end].to_vec(),
            dim: self.dim,
            data: self.data[start * self.dim..end * self.dim].to_vec(),
            targets: self.targets.as_ref().map(|t| t[start..end].to_vec()),
        }
    }
}

/// Random vectors with a shared offset (a "cone", as real embeddings are),
/// which makes some items hubs. Ids are `{prefix}{i}`.
pub fn random_table(rng: &mut StdRng, prefix: &str, rows: usize, dim: usize) -> Table {
    let offset: Vec<f32> = (0..dim)
        .map(|d| if d % 3 == 0 { 0.6 } else { 0.0 })
        .collect();
    let data = (0..rows * dim)
        .map(|i| rng.random_range(-1.0f32..1.0) + offset[i % dim])
        .collect();
    Table {
        ids: (0..rows).map(|i| format!("{prefix}{i}")).collect(),
        dim,
        data,
        targets: None,
    }
}

/// The shape of a generated case: `queries` queries near the gallery (each
/// with its `target_id`), `gallery` items and `bank` rows of dimension `dim`.
pub struct CaseShape {
    pub seed: u64,
    pub gallery: usize,
    pub queries: usize,
    pub bank: usize,
    pub dim: usize,
    pub noise: f32,
}

/// Writes queries.parquet, gallery.parquet and bank.parquet of `shape` into
/// `dir` (FixedSizeList<f32>); returns the generator for further tables.
pub fn write_case(dir: &Path, shape: &CaseShape) -> StdRng {
    let mut r = rng(shape.seed);
    let gallery = random_table(&mut r, "g", shape.gallery, shape.dim);
    let queries = queries_near(&mut r, &gallery, shape.queries, shape.noise);
    let bank = random_table(&mut r, "b", shape.bank, shape.dim);
    for (name, table) in [
        ("queries", &queries),
        ("gallery", &gallery),
        ("bank", &bank),
    ] {
        write_table(
            &dir.join(format!("{name}.parquet")),
            table,
            Layout::FixedF32,
            false,
        );
    }
    r
}

/// A valid small case in `dir` (queries with targets, gallery of 40, bank
/// of 30, dimension 4); the bad-input tests replace one table with a bad one.
pub fn valid_case(dir: &Path) {
    write_case(
        dir,
        &CaseShape {
            seed: 21,
            gallery: 40,
            queries: 10,
            bank: 30,
            dim: 4,
            noise: 0.1,
        },
    );
}

pub fn rng(seed: u64) -> StdRng {
    eprintln!("random seed: {seed}");
    StdRng::seed_from_u64(seed)
}

/// Queries whose target is a random gallery item, placed near it.
pub fn queries_near(rng: &mut StdRng, gallery: &Table, rows: usize, noise: f32) -> Table {
    let dim = gallery.dim;
    let mut data = Vec::with_capacity(rows * dim);
    let mut targets = Vec::with_capacity(rows);
    for _ in 0..rows {
        let t = rng.random_range(0..gallery.rows());
        targets.push(gallery.ids[t].clone());
        data.extend(
            gallery
                .row(t)
                .iter()
                .map(|v| v + noise * rng.random_range(-1.0f32..1.0)),
        );
    }
    Table {
        ids: (0..rows).map(|i| format!("q{i}")).collect(),
        dim,
        data,
        targets: Some(targets),
    }
}

/// The embedding column of `table` in `layout`.
pub fn embedding_array(table: &Table, layout: Layout) -> ArrayRef {
    let n = table.rows();
    let d = table.dim as i32;
    let item = |t: DataType| Arc::new(Field::new("item", t, true));
    match layout {
        Layout::FixedF32 => Arc::new(
            FixedSizeListArray::try_new(item(DataType::Float32), d, Arc::new(Float32Array::from(table.data.clone())), None)
                .unwrap(),
        ),
        Layout::FixedF16 => Arc::new(
            FixedSizeListArray::try_new(
                item(DataType::Float16),
                d,
                Arc::new(Float16Array::from_iter_values(table.data.iter().map(|&v| <arrow::datatypes::Float16Type as arrow::datatypes::ArrowPrimitiveType>::Native::from_f32(v)))),
                None,
            )
            .unwrap(),
        ),
        Layout::FixedF64 => Arc::new(
            FixedSizeListArray::try_new(
                item(DataType::Float64),
                d,
                Arc::new(Float64Array::from_iter_values(table.data.iter().map(|&v| v as f64))),
                None,
            )
            .unwrap(),
        ),
        Layout::ListF32 => Arc::new(
            ListArray::try_new(
                item(DataType::Float32),
                OffsetBuffer::new(ScalarBuffer::from((0..=n as i32).map(|i| i * d).collect::<Vec<_>>())),
                Arc::new(Float32Array::from(table.data.clone())),
                None,
            )
            .unwrap(),
        ),
        Layout::LargeListF64 => Arc::new(
            LargeListArray::try_new(
                item(DataType::Float64),
                OffsetBuffer::new(ScalarBuffer::from((0..=n as i64).map(|i| i * d as i64).collect::<Vec<_>>())),
                Arc::new(Float64Array::from_iter_values(table.data.iter().map(|&v| v as f64))),
                None,
            )
            .unwrap(),
        ),
    }
}

/// Writes `table` with string ids (or Int64 ids when `int_ids`).
pub fn write_table(path: &Path, table: &Table, layout: Layout, int_ids: bool) {
    let ids: ArrayRef = if int_ids {
        Arc::new(Int64Array::from_iter_values(table.ids.iter().map(|s| {
            s.trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse::<i64>()
                .unwrap()
        })))
    } else {
        Arc::new(StringArray::from(table.ids.clone()))
    };
    let mut columns = vec![("id", ids), ("embedding", embedding_array(table, layout))];
    if let Some(t) = &table.targets {
        let targets: ArrayRef = if int_ids {
            Arc::new(Int64Array::from_iter_values(t.iter().map(|s| {
                s.trim_start_matches(|c: char| !c.is_ascii_digit())
                    .parse::<i64>()
                    .unwrap()
            })))
        } else {
            Arc::new(StringArray::from(t.clone()))
        };
        columns.push(("target_id", targets));
    }
    write_columns(path, columns);
}

/// Writes arbitrary columns (nullable fields) to one Parquet file.
pub fn write_columns(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(700))
        .build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Makes the row groups of the Parquet file at `path` from `first_group` on
/// unreadable (each column chunk's first page header overwritten), keeping
/// the file's size and modification time (a checkpoint still takes it for
/// the same input) and its footer.
pub fn break_row_groups(path: &Path, first_group: usize) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use std::io::{Seek, SeekFrom, Write};
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    let starts: Vec<u64> = {
        let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
        let groups = reader.metadata().row_groups().to_vec();
        assert!(
            groups.len() > first_group,
            "{} has {} row groups",
            path.display(),
            groups.len()
        );
        groups[first_group..]
            .iter()
            .flat_map(|group| group.columns().iter().map(|c| c.byte_range().0))
            .collect()
    };
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for start in starts {
        file.seek(SeekFrom::Start(start)).unwrap();
        file.write_all(&[0xff; 16]).unwrap();
    }
    file.set_modified(modified).unwrap();
}

/// One row of results.parquet.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRow {
    pub method: String,
    pub query_id: String,
    pub rank: i32,
    pub gallery_id: String,
    pub score: f32,
    pub raw_score: f32,
}

fn string_at(a: &dyn Array, i: usize) -> String {
    match a.data_type() {
        DataType::Utf8 => a.as_string::<i32>().value(i).to_owned(),
        DataType::Int64 => a
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(i)
            .to_string(),
        other => panic!("unexpected id type {other}"),
    }
}

/// Reads every row of a results file.
pub fn read_results(path: &Path) -> Vec<ResultRow> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let b = batch.unwrap();
        for i in 0..b.num_rows() {
            out.push(ResultRow {
                method: b.column(0).as_string::<i32>().value(i).to_owned(),
                query_id: string_at(b.column(1).as_ref(), i),
                rank: b.column(2).as_primitive::<Int32Type>().value(i),
                gallery_id: string_at(b.column(3).as_ref(), i),
                score: b.column(4).as_primitive::<Float32Type>().value(i),
                raw_score: b.column(5).as_primitive::<Float32Type>().value(i),
            });
        }
    }
    out
}

/// Every row of a Parquet file in one batch.
pub fn read_parquet(path: &Path) -> RecordBatch {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// The key-value metadata of a Parquet file.
pub fn parquet_metadata(path: &Path) -> Vec<(String, String)> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// Files under `dir`, recursively, sorted.
pub fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The precision an output records (`hubnorm.precision`), if any.
pub fn recorded_precision(path: &Path) -> Option<String> {
    parquet_metadata(path)
        .into_iter()
        .find(|(k, _)| k == "hubnorm.precision")
        .map(|(_, v)| v)
}

/// Whether the screened path can be compared with the exact one here: the
/// re-scoring reproduces the f32 tiles' bits only with FMA (printed as a
/// skip otherwise).
pub fn screen_comparable() -> bool {
    let comparable = hubnorm::kernel::gemm::reproducible();
    if !comparable {
        eprintln!("SKIPPED: the f32 tiles' bits are not reproduced on this CPU (no FMA)");
    }
    comparable
}

/// [`screen_comparable`], with the scalar screen allowed in this process
/// where the CPU lacks AVX512_BF16.
pub fn screen_in_process() -> bool {
    if !hubnorm::kernel::bf16::has_avx512_bf16() {
        hubnorm::kernel::bf16::allow_scalar_screen();
    }
    screen_comparable()
}

// ------------------------------------------------------------------ reference

/// Rows in f64, L2-normalised when `normalize`.
pub fn to_f64(table: &Table, normalize: bool) -> Vec<Vec<f64>> {
    (0..table.rows())
        .map(|i| {
            let row: Vec<f64> = table.row(i).iter().map(|&v| v as f64).collect();
            if normalize {
                let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
                row.iter().map(|v| v / norm).collect()
            } else {
                row
            }
        })
        .collect()
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// h(g) = (1/β) · log Σ_b exp(β s(b, g)), with max subtraction.
pub fn reference_is_corrections(bank: &[Vec<f64>], gallery: &[Vec<f64>], beta: f64) -> Vec<f64> {
    gallery
        .iter()
        .map(|g| {
            let xs: Vec<f64> = bank.iter().map(|b| beta * dot(b, g)).collect();
            let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            (m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()) / beta
        })
        .collect()
}

/// Full score matrix s(q, g) − h(g).
pub fn reference_scores(queries: &[Vec<f64>], gallery: &[Vec<f64>], h: &[f64]) -> Vec<Vec<f64>> {
    queries
        .iter()
        .map(|q| {
            gallery
                .iter()
                .zip(h)
                .map(|(g, hg)| dot(q, g) - hg)
                .collect()
        })
        .collect()
}

/// Indices of the k best scores, ties broken by the smaller index.
pub fn reference_topk(scores: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// REPORTS.md rank: 1 + items strictly above the positive + half the ties.
pub fn reference_rank(scores: &[f64], positive: usize) -> f64 {
    let t = scores[positive];
    let greater = scores.iter().filter(|&&s| s > t).count();
    let ties = scores
        .iter()
        .enumerate()
        .filter(|&(j, &s)| j != positive && s == t)
        .count();
    1.0 + greater as f64 + 0.5 * ties as f64
}

/// Biased skewness of the k-occurrence counts.
pub fn reference_skewness(counts: &[f64]) -> f64 {
    let n = counts.len() as f64;
    let mean = counts.iter().sum::<f64>() / n;
    let m2 = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / n;
    let m3 = counts.iter().map(|c| (c - mean).powi(3)).sum::<f64>() / n;
    if m2 == 0.0 {
        0.0
    } else {
        m3 / m2.powf(1.5)
    }
}

/// Checks one query's result list against the reference scores: every score
/// within `tol`, and the order identical except where the reference itself
/// has a near-tie (|Δ| ≤ 1e-6), where f32 rounding may legitimately swap.
pub fn assert_ranking_matches(
    ours: &[(usize, f32)],
    reference_row: &[f64],
    k: usize,
    tol: f64,
    context: &str,
) {
    let expected = reference_topk(reference_row, k);
    assert_eq!(ours.len(), expected.len(), "{context}: list length");
    for (r, (&(got, score), &want)) in ours.iter().zip(&expected).enumerate() {
        let ref_score = reference_row[got];
        assert!(
            (score as f64 - ref_score).abs() <= tol,
            "{context}: rank {r}: score {score} vs reference {ref_score} for gallery row {got}"
        );
        if got != want {
            assert!(
                (reference_row[got] - reference_row[want]).abs() <= 1e-6,
                "{context}: rank {r}: got gallery row {got} ({}) but reference has {want} ({})",
                reference_row[got],
                reference_row[want]
            );
        }
    }
}

pub mod reference;

/// Sends signal `name` to `child` (which may have ended already).
pub fn signal(child: &Child, name: &str) {
    Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .stderr(Stdio::null())
        .status()
        .unwrap();
}

/// Waits until `ready` holds (polled every few milliseconds), or panics.
pub fn wait_for(what: &str, child: &mut Child, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before {what}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(3));
    }
}
