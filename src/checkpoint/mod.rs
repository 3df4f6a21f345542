//! Checkpoints, so that `hubnorm stats --resume` and `hubnorm run --resume`
//! continue an interrupted job instead of starting again.
//!
//! Pass 1 finishes the gallery chunk by chunk: once the banks have streamed
//! past a chunk, its rows of the stats file are final. A checkpoint keeps
//! those rows, the one state that spans chunks (each bank item's top-k_A
//! gallery items, for `dis` and `dual-dis`), and the Sinkhorn potentials
//! after the last saved iteration of `sn` and `dbsn`, in a folder beside the
//! output:
//!
//! ```text
//! gallery_stats.parquet.checkpoint/
//!   manifest.json                  inputs (paths, sizes, modification times), parameters, resume tag
//!   rows-<first>-<end>.parquet     finished rows of gallery rows [first, end)
//!   activation-<end>.parquet       activation states after gallery row `end`
//!   sweeps-<method>.parquet        Sinkhorn potentials of the method-th Sinkhorn method
//! ```
//!
//! Pass 2 finishes query block by query block; [`run`] keeps its rows the
//! same way (the `rows-` files then count query rows).
//!
//! The folder may be a prefix in an object store, beside an output there
//! (each file is then an object, uploaded once complete).
//!
//! Every file is written under a temporary name and renamed when complete;
//! an activation file is renamed before the rows it goes with, so a crash at
//! any point leaves a consistent prefix. A resume refuses a checkpoint whose
//! manifest differs from the current inputs and parameters, and replays the
//! saved rows, so its outputs are byte-identical to an uninterrupted run's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, Float32Array, RecordBatch, UInt32Array, UInt8Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::bank::pass::{BankPassOutput, ResumePoint};
use crate::bank::states::ActivationState;
use crate::error::{HubnormError, Result};
use crate::kernel::{Candidate, ScreenCounts};
use crate::sink::{write_text_atomically, ParquetSink};

pub mod run;
mod sweeps;

/// How `hubnorm stats` checkpoints its progress.
#[derive(Debug, Clone, Default)]
pub struct CheckpointOptions {
    /// Save the finished gallery chunks at most this often (`Some(0)`: after
    /// every chunk); `None`: no checkpoints.
    pub interval: Option<Duration>,
    /// Continue from the checkpoint an interrupted run left (start afresh
    /// when there is none).
    pub resume: bool,
}

impl CheckpointOptions {
    /// The default of the command-line tool: a save at most once a minute.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
}

/// The checkpoint folder of a stats file at `out`.
pub fn checkpoint_dir(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!("{name}.checkpoint"))
}

const MANIFEST: &str = "manifest.json";
const VERSION: u64 = 1;

/// Which bank an activation row belongs to (the `bank` column).
const QUERY_BANK: u8 = 0;
const GALLERY_BANK: u8 = 1;

/// A checkpoint being written (and possibly resumed from).
pub struct Checkpoint {
    dir: PathBuf,
    interval: Duration,
    last_saved: Instant,
    /// Gallery rows whose stats rows are saved.
    saved_rows: u64,
    /// Gallery rows taken from the checkpoint when the run started.
    resumed_rows: u64,
    /// Whether the layout has activation columns (their state is saved too).
    saves_activation: bool,
    /// Rows finished since the last save, in an uncommitted file.
    segment: Option<Segment>,
    /// Saved rows files, in gallery order, when resuming.
    resumed_segments: Vec<PathBuf>,
    /// The activation file of the resume point.
    resumed_activation: Option<PathBuf>,
    /// The manifest's resume tag.
    resume_tag: Option<String>,
    /// What pass 1's screen had done by the last chunk recorded (its
    /// pass reports a running total; each segment keeps its own share).
    pass1_screen: ScreenCounts,
}

struct Segment {
    first_row: u64,
    end_row: u64,
    sink: ParquetSink,
    /// What pass 2's screen did for these rows (kept in the file's footer).
    screen: ScreenCounts,
}

/// The footer key of a segment's screen counts (`screened rescored`).
const SCREEN_KEY: &str = "hubnorm.checkpoint.screen";

impl Checkpoint {
    /// Opens the checkpoint of the stats file `out` computed from inputs and
    /// parameters `manifest`. Refuses to start afresh over a checkpoint left
    /// by an interrupted run (unless `resume`), and to resume one made with
    /// other inputs or parameters. `None` when checkpoints are off.
    pub fn open(
        out: &Path,
        manifest: &BTreeMap<String, String>,
        options: &CheckpointOptions,
        saves_activation: bool,
    ) -> Result<Option<Checkpoint>> {
        let checkpoint = Self::open_dir(
            &checkpoint_dir(out),
            "stats",
            manifest,
            options,
            saves_activation,
        )?;
        if let Some(tag) = checkpoint.as_ref().and_then(|c| c.resume_tag.as_deref()) {
            crate::sink::tag_delta_outputs(out, tag);
        }
        Ok(checkpoint)
    }

    /// Opens the checkpoint folder `dir` of `hubnorm COMMAND`, as [`Self::open`].
    pub fn open_dir(
        dir: &Path,
        command: &'static str,
        manifest: &BTreeMap<String, String>,
        options: &CheckpointOptions,
        saves_activation: bool,
    ) -> Result<Option<Checkpoint>> {
        let interval = match (options.interval, options.resume) {
            (Some(interval), _) => interval,
            (None, true) => CheckpointOptions::DEFAULT_INTERVAL,
            (None, false) => return Ok(None),
        };
        let dir = dir.to_path_buf();
        let mut checkpoint = Checkpoint {
            dir: dir.clone(),
            interval,
            last_saved: Instant::now(),
            saved_rows: 0,
            resumed_rows: 0,
            saves_activation,
            segment: None,
            resumed_segments: Vec::new(),
            resumed_activation: None,
            resume_tag: None,
            pass1_screen: ScreenCounts::default(),
        };
        // A folder without its manifest was being made (the manifest comes
        // before any rows) or removed (it goes first): nothing in it counts.
        if crate::storage::is_dir(&dir)? && !crate::storage::exists(&dir.join(MANIFEST))? {
            crate::storage::remove_dir_all(&dir)?;
        }
        if crate::storage::is_dir(&dir)? {
            if !options.resume {
                return Err(HubnormError::Usage(format!(
                    "an interrupted `hubnorm {command}` left a checkpoint at {}: pass --resume to continue it, or delete that folder to start afresh",
                    dir.display()
                )));
            }
            checkpoint.resume_tag = check_manifest(&dir, manifest)?;
            checkpoint.find_resume_point()?;
            checkpoint.resumed_rows = checkpoint.saved_rows;
        } else {
            checkpoint.resume_tag = Some(write_manifest(&dir, manifest)?);
        }
        Ok(Some(checkpoint))
    }

    /// The checkpoint's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Gallery rows a resumed pass skips (0 when starting afresh).
    pub fn resumed_rows(&self) -> u64 {
        self.resumed_rows
    }

    /// Gallery rows whose stats rows are saved so far.
    pub fn saved_rows(&self) -> u64 {
        self.saved_rows
    }

    /// Hands the saved rows to `each` in order, as batches of `schema`
    /// (the columns the pass recorded).
    pub fn replay(
        &self,
        schema: &SchemaRef,
        mut each: impl FnMut(RecordBatch) -> Result<()>,
    ) -> Result<()> {
        for path in &self.resumed_segments {
            let reader = crate::source::open_parquet(path)?
                .build()
                .map_err(|e| HubnormError::parquet(path, e))?;
            for batch in crate::source::CheckedBatches::new(reader, path) {
                let batch = batch?;
                let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec())
                    .map_err(|_| {
                        HubnormError::input(
                            path,
                            None,
                            None,
                            "corrupt checkpoint: unexpected columns",
                        )
                    })?;
                each(batch)?;
            }
        }
        Ok(())
    }

    /// Where the pass restarts, with the activation states restored for
    /// banks of `bank` and `gallery_bank` rows at activation k `(rows, k)`.
    pub fn resume_point(
        &self,
        bank: Option<(usize, usize)>,
        gallery_bank: Option<(usize, usize)>,
    ) -> Result<Option<ResumePoint>> {
        if self.saved_rows == 0 {
            return Ok(None);
        }
        let new_state = |shape: Option<(usize, usize)>| {
            shape.map_or_else(ActivationState::default, |(rows, k)| {
                ActivationState::new(rows, k)
            })
        };
        let mut point = ResumePoint {
            gallery_rows: self.saved_rows,
            bank_activation: new_state(bank),
            gallery_bank_activation: new_state(gallery_bank),
        };
        if let Some(path) = &self.resumed_activation {
            read_activation(path, &mut point)?;
        }
        Ok(Some(point))
    }

    /// Records the finished rows `batch` of gallery rows starting at
    /// `first_row`, with the pass's state after them (`activations`, whose
    /// screen counts run over the chunks this process computed); saves when
    /// the interval has passed.
    pub fn record(
        &mut self,
        batch: &RecordBatch,
        first_row: u64,
        activations: &BankPassOutput,
    ) -> Result<()> {
        let end_row = first_row + batch.num_rows() as u64;
        let screen = activations.screen.since(self.pass1_screen);
        self.pass1_screen = activations.screen;
        self.record_rows(batch, first_row..end_row, Some(activations), screen)
    }

    /// Records `batch`, the finished rows of pass 2's query rows `rows`
    /// (several rows per query), and what the screen did for them; saves
    /// when the interval has passed.
    pub fn record_queries(
        &mut self,
        batch: &RecordBatch,
        rows: std::ops::Range<u64>,
        screen: ScreenCounts,
    ) -> Result<()> {
        self.record_rows(batch, rows, None, screen)
    }

    fn record_rows(
        &mut self,
        batch: &RecordBatch,
        rows: std::ops::Range<u64>,
        activations: Option<&BankPassOutput>,
        screen: ScreenCounts,
    ) -> Result<()> {
        if self.segment.is_none() {
            let first_row = rows.start;
            let path = self.dir.join(format!("rows-{first_row:020}.open.parquet"));
            self.segment = Some(Segment {
                first_row,
                end_row: first_row,
                sink: ParquetSink::create(&path, batch.schema(), Vec::new(), true)?,
                screen: ScreenCounts::default(),
            });
        }
        let segment = self.segment.as_mut().expect("opened above");
        if rows.start != segment.end_row {
            return Err(HubnormError::Internal(format!(
                "checkpoint rows out of order: {} after {}",
                rows.start, segment.end_row
            )));
        }
        segment.sink.write(batch)?;
        segment.end_row = rows.end;
        segment.screen.add(screen);
        if self.last_saved.elapsed() >= self.interval {
            self.save(activations)?;
        }
        Ok(())
    }

    /// Saves pass 2's rows recorded since the last save now.
    pub fn save_queries_now(&mut self) -> Result<()> {
        self.save(None)
    }

    /// What the screen did for the resumed rows (their files' footers).
    pub fn resumed_screen_counts(&self) -> Result<ScreenCounts> {
        let mut total = ScreenCounts::default();
        for path in &self.resumed_segments {
            let builder = crate::source::open_parquet(path)?;
            let Some(value) = builder
                .metadata()
                .file_metadata()
                .key_value_metadata()
                .and_then(|kv| kv.iter().find(|e| e.key == SCREEN_KEY))
                .and_then(|e| e.value.clone())
            else {
                continue;
            };
            let counts: Option<Vec<u64>> = value.split(' ').map(|n| n.parse().ok()).collect();
            match counts.as_deref() {
                Some([screened, rescored]) => total.add(ScreenCounts {
                    screened: *screened,
                    rescored: *rescored,
                }),
                _ => {
                    return Err(HubnormError::input(
                        path,
                        None,
                        None,
                        "corrupt checkpoint: unreadable screen counts",
                    ))
                }
            }
        }
        Ok(total)
    }

    /// Saves the rows recorded since the last save now, with `activations`.
    pub fn save_now(&mut self, activations: &BankPassOutput) -> Result<()> {
        self.save(Some(activations))
    }

    /// Saves the rows recorded since the last save, when that needs no
    /// activation state (a pass stopped mid-chunk has none consistent with
    /// its finished rows). Called when the pass is interrupted.
    pub fn save_on_interrupt(&mut self) -> Result<()> {
        if self.saves_activation {
            return Ok(());
        }
        self.save(None)
    }

    fn save(&mut self, activations: Option<&BankPassOutput>) -> Result<()> {
        let Some(segment) = self.segment.take() else {
            return Ok(());
        };
        let Segment {
            first_row,
            end_row,
            mut sink,
            screen,
        } = segment;
        if screen != ScreenCounts::default() {
            sink.append_metadata(
                SCREEN_KEY,
                format!("{} {}", screen.screened, screen.rescored),
            );
        }
        let file = sink.close_uncommitted()?;
        let previous_activation = self.activation_path(self.saved_rows);
        if self.saves_activation {
            let activations = activations.ok_or_else(|| {
                HubnormError::Internal("an activation checkpoint needs the states".into())
            })?;
            write_activation(&self.activation_path(end_row), activations)?;
        }
        // Committed straight under the name with its range: the rows count
        // only once complete.
        file.commit_as(&self.rows_path(first_row, end_row))?;
        if self.saves_activation && self.saved_rows > 0 {
            let _ = crate::storage::remove_file(&previous_activation);
        }
        self.saved_rows = end_row;
        self.last_saved = Instant::now();
        Ok(())
    }

    /// Deletes the checkpoint (the stats file is complete): its manifest
    /// first, so that a removal cut short leaves a folder a later run
    /// knows to be garbage.
    pub fn remove(self) -> Result<()> {
        let dir = self.dir.clone();
        drop(self);
        crate::storage::remove_file(&dir.join(MANIFEST))?;
        crate::storage::remove_dir_all(&dir)
    }

    fn rows_path(&self, first: u64, end: u64) -> PathBuf {
        self.dir.join(format!("rows-{first:020}-{end:020}.parquet"))
    }

    fn activation_path(&self, end: u64) -> PathBuf {
        self.dir.join(format!("activation-{end:020}.parquet"))
    }
}

/// A new checkpoint's resume tag: the time it was made (Unix milliseconds)
/// and 64 random bits, the same for every resume of the checkpoint and
/// different for every fresh start. Delta outputs carry it in their commits
/// ([`crate::sink::DeltaOutput::resume_tag`]).
fn new_resume_tag() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{now}-{:016x}", rand::random::<u64>())
}

/// Creates the checkpoint folder `dir` with its manifest; returns the new
/// checkpoint's resume tag.
fn write_manifest(dir: &Path, manifest: &BTreeMap<String, String>) -> Result<String> {
    crate::storage::create_dir_all(dir)?;
    let tag = new_resume_tag();
    let text = serde_json::to_string_pretty(&serde_json::json!({
        "version": VERSION,
        "resume_tag": tag,
        "inputs_and_parameters": manifest,
    }))
    .map_err(|e| HubnormError::Internal(e.to_string()))?;
    write_text_atomically(&dir.join(MANIFEST), &text, false)?.commit()?;
    Ok(tag)
}

/// Refuses the checkpoint folder `dir` unless its manifest is `current`;
/// returns the checkpoint's resume tag (none in a manifest written before
/// there were tags).
fn check_manifest(dir: &Path, current: &BTreeMap<String, String>) -> Result<Option<String>> {
    let path = dir.join(MANIFEST);
    let text = crate::storage::read_to_string(&path)?;
    let stored: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        HubnormError::input(&path, None, None, format!("not a checkpoint manifest: {e}"))
    })?;
    if stored["version"].as_u64() != Some(VERSION) {
        return Err(HubnormError::input(
            &path,
            None,
            None,
            "written by another version of hubnorm; delete the checkpoint to start afresh",
        ));
    }
    let tag = stored["resume_tag"].as_str().map(str::to_owned);
    let stored: BTreeMap<String, String> =
        serde_json::from_value(stored["inputs_and_parameters"].clone()).map_err(|e| {
            HubnormError::input(&path, None, None, format!("not a checkpoint manifest: {e}"))
        })?;
    let keys: std::collections::BTreeSet<&String> = stored.keys().chain(current.keys()).collect();
    let changed: Vec<String> = keys
        .into_iter()
        .filter(|k| stored.get(*k) != current.get(*k))
        .map(|k| describe_key(k))
        .collect();
    if changed.is_empty() {
        return Ok(tag);
    }
    Err(HubnormError::Usage(format!(
            "cannot resume from {}: it was made with other inputs or parameters ({}); run with the same ones, or delete the checkpoint to start afresh",
            dir.display(),
            changed.join("; ")
        )))
}

impl Checkpoint {
    /// The longest run of saved rows from gallery row 0 (with its activation
    /// file, when one is needed); files past it are removed.
    fn find_resume_point(&mut self) -> Result<()> {
        let entries = crate::storage::list_dir(&self.dir)?;
        let mut segments: BTreeMap<u64, (u64, PathBuf)> = BTreeMap::new();
        let mut activations: BTreeMap<u64, PathBuf> = BTreeMap::new();
        let mut other: Vec<PathBuf> = Vec::new();
        for path in entries {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let numbers = |prefix: &str| -> Option<Vec<u64>> {
                name.strip_prefix(prefix)?
                    .strip_suffix(".parquet")?
                    .split('-')
                    .map(|n| n.parse().ok())
                    .collect()
            };
            match (numbers("rows-"), numbers("activation-")) {
                (Some(r), _) if r.len() == 2 && r[0] < r[1] => {
                    segments.insert(r[0], (r[1], path));
                }
                (_, Some(a)) if a.len() == 1 => {
                    activations.insert(a[0], path);
                }
                _ if name == MANIFEST => {}
                // Written only once every chunk is saved.
                _ if numbers("sweeps-").is_some_and(|n| n.len() == 1) => {}
                _ => other.push(path),
            }
        }
        // Follow the chain 0 → end → end' …, keeping the last end that has
        // its activation file (or every end, when none is needed).
        let mut chain = Vec::new();
        let mut end = 0;
        while let Some((next, path)) = segments.get(&end) {
            chain.push((*next, path.clone()));
            end = *next;
        }
        while let Some((end, _)) = chain.last() {
            if !self.saves_activation || activations.contains_key(end) {
                break;
            }
            chain.pop();
        }
        self.saved_rows = chain.last().map_or(0, |(end, _)| *end);
        self.resumed_activation = activations.get(&self.saved_rows).cloned();
        self.resumed_segments = chain.iter().map(|(_, p)| p.clone()).collect();
        // Leftovers: rows past the resume point, stale activation states,
        // the open segment of the interrupted run.
        for (_, (_, path)) in segments {
            if !self.resumed_segments.contains(&path) {
                other.push(path);
            }
        }
        for (end, path) in activations {
            if end != self.saved_rows || !self.saves_activation {
                other.push(path);
            }
        }
        for path in other {
            let _ = crate::storage::remove_file(&path);
        }
        Ok(())
    }
}

/// Says in words which input or parameter a manifest key stands for.
fn describe_key(key: &str) -> String {
    let role = |k: &str| k.trim_start_matches("hubnorm.").replace('_', " ");
    if let Some(table) = key.strip_suffix(".parts") {
        format!(
            "the {} files changed (paths, sizes or modification times)",
            role(table)
        )
    } else if let Some(table) = key.strip_suffix(".rows") {
        format!("the {} has a different number of rows", role(table))
    } else if let Some(table) = key.strip_suffix(".path") {
        format!("the {} path differs", role(table))
    } else {
        format!("{} differs", key.trim_start_matches("hubnorm."))
    }
}

fn activation_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("bank", DataType::UInt8, false),
        Field::new("bank_row", DataType::UInt32, false),
        Field::new("gallery_row", DataType::UInt32, false),
        Field::new("score", DataType::Float32, false),
        Field::new("raw_score", DataType::Float32, false),
    ]))
}

fn write_activation(path: &Path, states: &BankPassOutput) -> Result<()> {
    let mut sink = ParquetSink::create(path, activation_schema(), Vec::new(), true)?;
    for (bank, state) in [
        (QUERY_BANK, &states.bank_activation),
        (GALLERY_BANK, &states.gallery_bank_activation),
    ] {
        let entries: Vec<(u32, Candidate)> = state.entries().collect();
        if entries.is_empty() {
            continue;
        }
        let batch = RecordBatch::try_new(
            activation_schema(),
            vec![
                Arc::new(UInt8Array::from(vec![bank; entries.len()])),
                Arc::new(UInt32Array::from_iter_values(entries.iter().map(|e| e.0))),
                Arc::new(UInt32Array::from_iter_values(
                    entries.iter().map(|e| e.1.row),
                )),
                Arc::new(Float32Array::from_iter_values(
                    entries.iter().map(|e| e.1.score),
                )),
                Arc::new(Float32Array::from_iter_values(
                    entries.iter().map(|e| e.1.raw),
                )),
            ],
        )?;
        sink.write(&batch)?;
    }
    sink.finish()?;
    Ok(())
}

fn read_activation(path: &Path, point: &mut ResumePoint) -> Result<()> {
    let reader = crate::source::open_parquet(path)?
        .build()
        .map_err(|e| HubnormError::parquet(path, e))?;
    let corrupt =
        |what: &str| HubnormError::input(path, None, None, format!("corrupt checkpoint: {what}"));
    for batch in crate::source::CheckedBatches::new(reader, path) {
        let batch = batch?;
        if batch.schema().fields() != activation_schema().fields() {
            return Err(corrupt("unexpected columns"));
        }
        let column = |i: usize| batch.column(i).clone();
        let bank = column(0);
        let bank = bank
            .as_any()
            .downcast_ref::<UInt8Array>()
            .expect("schema checked");
        let bank_row = column(1);
        let bank_row = bank_row
            .as_any()
            .downcast_ref::<UInt32Array>()
            .expect("schema checked");
        let gallery_row = column(2);
        let gallery_row = gallery_row
            .as_any()
            .downcast_ref::<UInt32Array>()
            .expect("schema checked");
        let score = column(3);
        let score = score
            .as_any()
            .downcast_ref::<Float32Array>()
            .expect("schema checked");
        let raw = column(4);
        let raw = raw
            .as_any()
            .downcast_ref::<Float32Array>()
            .expect("schema checked");
        for i in 0..batch.num_rows() {
            let state = match bank.value(i) {
                QUERY_BANK => &mut point.bank_activation,
                GALLERY_BANK => &mut point.gallery_bank_activation,
                _ => return Err(corrupt("unknown bank")),
            };
            let row = bank_row.value(i) as usize;
            if row >= state.rows() || gallery_row.value(i) as u64 >= point.gallery_rows {
                return Err(corrupt("row out of range"));
            }
            state.offer(
                row,
                Candidate {
                    score: score.value(i),
                    raw: raw.value(i),
                    row: gallery_row.value(i),
                },
            );
        }
    }
    Ok(())
}
