//! `hubnorm stats --update`: merge new Parquet parts into a stored
//! `gallery_stats.parquet` instead of recomputing it.
//!
//! Every stats file records the parts it was computed from (path, rows,
//! size, modification time) for the gallery and each bank. An update opens
//! the inputs again and sorts their parts into those already counted (which
//! must be unchanged) and new ones. For the mergeable methods:
//! - new bank parts update every gallery item's state: a pass of (whole
//!   gallery) × (new bank parts), merged row by row into the stored state;
//! - new gallery parts get their state from the whole bank: the stored rows
//!   cover the old bank, so a pass of (new gallery) × (old bank parts) is
//!   merged with the first pass's rows for them.
//!
//! Then each correction is finished from its merged state. The mergeable
//! methods are `is`, `nnn`, `csls`, `gc` and `dsl` (log-sum-exp, top-k and
//! sorted-list states: merging equals one pass, up to the rounding of the
//! log-sum-exp sums). The others are recomputed in full from all inputs,
//! because their statistic couples all rows: `sn` and `dbsn` (Sinkhorn
//! potentials), `dis` and `dual-dis` (activation sets: a new gallery item
//! can displace an old one from a bank item's top-k), `dual-is` and `dn`
//! (two banks, or the bank means). The new file replaces the stored one
//! atomically, only once complete.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float32Array, Float64Array, ListArray, RecordBatch};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Float32Type, Float64Type, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::bank::{SortedSimilarities, StatsLayout};
use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::kernel::{LogSumExp, TopValues};
use crate::options::{MethodKind, MethodSpec};
use crate::pipeline::{self, StatsJob};
use crate::progress::Progress;
use crate::sink::ParquetSink;
use crate::source::{EmbeddingTable, TablePart};
use crate::stats_file::{file_metadata, stats_file_methods, write_stats, StatsInputs};

/// One input part as a stats file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    /// The canonical path.
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub modified_ns: u128,
}

impl PartRecord {
    fn of(part: &TablePart) -> PartRecord {
        let path = std::fs::canonicalize(&part.path).unwrap_or_else(|_| part.path.clone());
        let meta = std::fs::metadata(&part.path).ok();
        PartRecord {
            path: path.display().to_string(),
            rows: part.rows,
            bytes: meta.as_ref().map_or(0, |m| m.len()),
            modified_ns: meta
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos()),
        }
    }

    /// The parts of `table` as the JSON stored in the metadata.
    pub fn list_json(table: &EmbeddingTable) -> String {
        let list: Vec<PartRecord> = table.parts.iter().map(PartRecord::of).collect();
        serde_json::to_string(&list).expect("plain data")
    }
}

/// Whether a method's state merges across bank and gallery parts.
pub fn is_mergeable(kind: MethodKind) -> bool {
    matches!(
        kind,
        MethodKind::InvertedSoftmax
            | MethodKind::NearestNeighbour
            | MethodKind::Csls
            | MethodKind::GloballyCorrected
            | MethodKind::DualSoftmax
    )
}

/// What an update did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateSummary {
    /// New parts merged: gallery, bank.
    pub new_gallery_parts: usize,
    pub new_bank_parts: usize,
    pub new_gallery_bank_parts: usize,
    /// Gallery rows in the updated file, and of those, new.
    pub gallery_rows: u64,
    pub new_gallery_rows: u64,
    /// Methods merged, and methods recomputed in full.
    pub merged: Vec<MethodSpec>,
    pub recomputed: Vec<MethodSpec>,
}

/// Sorts `table`'s parts into recorded (unchanged) and new; a recorded part
/// that changed or disappeared is refused.
fn split_parts(
    table: &EmbeddingTable,
    stats: &Path,
    metadata: &HashMap<String, String>,
    key: &str,
) -> Result<Vec<bool>> {
    let Some(json) = metadata.get(&format!("hubnorm.{key}.parts")) else {
        return Err(HubnormError::input(
            stats,
            None,
            None,
            format!("records no {key} parts (written by an older hubnorm?); recompute it without --update"),
        ));
    };
    let recorded: Vec<PartRecord> = serde_json::from_str(json)
        .map_err(|e| HubnormError::input(stats, None, None, format!("hubnorm.{key}.parts: {e}")))?;
    let current: Vec<PartRecord> = table.parts.iter().map(PartRecord::of).collect();
    for old in &recorded {
        match current.iter().find(|c| c.path == old.path) {
            Some(now) if now == old => {}
            Some(_) => {
                return Err(HubnormError::Usage(format!(
                "{key} part {} changed since {} was computed (size, rows or modification time); \
                     --update only adds new parts: recompute without --update",
                old.path,
                stats.display()
            )))
            }
            None => {
                return Err(HubnormError::Usage(format!(
                    "{key} part {} that {} was computed from is gone; recompute without --update",
                    old.path,
                    stats.display()
                )))
            }
        }
    }
    Ok(current
        .iter()
        .map(|c| !recorded.iter().any(|r| r.path == c.path))
        .collect())
}

/// The parts of `table` for which `keep` is true, as a table (`None` when
/// they hold no row).
fn subset(table: &EmbeddingTable, keep: &[bool]) -> Option<EmbeddingTable> {
    let mut sub = table.clone();
    sub.parts.clear();
    let mut rows = 0;
    for (part, &k) in table.parts.iter().zip(keep) {
        if k {
            sub.parts.push(TablePart {
                path: part.path.clone(),
                rows: part.rows,
                first_row: rows,
            });
            rows += part.rows;
        }
    }
    sub.rows = rows;
    (rows > 0).then_some(sub)
}

/// Reads a Parquet file's rows in order, `n` at a time.
struct RowCursor {
    reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
    pending: Option<RecordBatch>,
    path: PathBuf,
}

impl RowCursor {
    fn open(path: &Path) -> Result<Self> {
        let reader = crate::source::open_parquet(path)?
            .build()
            .map_err(|e| HubnormError::parquet(path, e))?;
        Ok(RowCursor {
            reader,
            pending: None,
            path: path.to_path_buf(),
        })
    }

    /// The next `n` rows (fewer only at the end of the file).
    fn take(&mut self, n: usize) -> Result<RecordBatch> {
        let mut parts = Vec::new();
        let mut have = 0;
        while have < n {
            let batch = match self.pending.take() {
                Some(b) => b,
                None => match self.reader.next() {
                    Some(b) => b?,
                    None => break,
                },
            };
            let want = n - have;
            if batch.num_rows() > want {
                self.pending = Some(batch.slice(want, batch.num_rows() - want));
                parts.push(batch.slice(0, want));
                have = n;
            } else {
                have += batch.num_rows();
                parts.push(batch);
            }
        }
        if parts.is_empty() {
            return Err(HubnormError::input(
                &self.path,
                None,
                None,
                "has fewer rows than the gallery parts it records",
            ));
        }
        Ok(arrow::compute::concat_batches(&parts[0].schema(), &parts)?)
    }
}

fn floats(batch: &RecordBatch, name: &str) -> Result<Vec<f64>> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| HubnormError::Internal(format!("stats rows lack column {name}")))?;
    Ok(column.as_primitive::<Float64Type>().values().to_vec())
}

fn lists(batch: &RecordBatch, name: &str) -> Result<Vec<Vec<f32>>> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| HubnormError::Internal(format!("stats rows lack column {name}")))?;
    let list = column.as_list::<i32>();
    Ok((0..list.len())
        .map(|i| {
            list.value(i)
                .as_primitive::<Float32Type>()
                .values()
                .to_vec()
        })
        .collect())
}

fn list_array(rows: Vec<Vec<f32>>) -> ArrayRef {
    let lengths = rows.iter().map(Vec::len).collect::<Vec<_>>();
    Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(Float32Array::from(rows.concat())),
        None,
    ))
}

/// Merges the state columns of one mergeable method from two sets of rows
/// of the same gallery items (`b` may be absent: nothing to add), and
/// finishes its correction; the columns in schema order.
fn merge_method(m: &MethodSpec, a: &RecordBatch, b: Option<&RecordBatch>) -> Result<Vec<ArrayRef>> {
    let p = m.column_prefix();
    let lse_rows = |a: &RecordBatch, b: Option<&RecordBatch>| -> Result<Vec<LogSumExp>> {
        let (max, sum) = (
            floats(a, &format!("{p}_lse_max"))?,
            floats(a, &format!("{p}_lse_sum"))?,
        );
        let mut states: Vec<LogSumExp> = max
            .iter()
            .zip(&sum)
            .map(|(&max, &sum)| LogSumExp { max, sum })
            .collect();
        if let Some(b) = b {
            let (max, sum) = (
                floats(b, &format!("{p}_lse_max"))?,
                floats(b, &format!("{p}_lse_sum"))?,
            );
            for (s, (&max, &sum)) in states.iter_mut().zip(max.iter().zip(&sum)) {
                s.merge(&LogSumExp { max, sum });
            }
        }
        Ok(states)
    };
    let f64s = |v: Vec<f64>| -> ArrayRef { Arc::new(Float64Array::from(v)) };
    let lse_columns = |states: &[LogSumExp], head: Vec<f64>| -> Vec<ArrayRef> {
        vec![
            f64s(head),
            f64s(states.iter().map(|s| s.max).collect()),
            f64s(states.iter().map(|s| s.sum).collect()),
        ]
    };
    Ok(match *m {
        MethodSpec::InvertedSoftmax { beta } => {
            let states = lse_rows(a, b)?;
            let h = states.iter().map(|s| s.value() / beta.0).collect();
            lse_columns(&states, h)
        }
        MethodSpec::DualSoftmax { .. } => {
            let states = lse_rows(a, b)?;
            let l = states.iter().map(LogSumExp::value).collect();
            lse_columns(&states, l)
        }
        MethodSpec::NearestNeighbour { k, .. } | MethodSpec::Csls { k } => {
            let weight = match *m {
                MethodSpec::NearestNeighbour { alpha, .. } => alpha,
                _ => 0.5,
            };
            let name = format!("{p}_topk");
            let mut rows = lists(a, &name)?;
            if let Some(b) = b {
                for (row, extra) in rows.iter_mut().zip(lists(b, &name)?) {
                    let mut top = TopValues::new(k);
                    row.iter().chain(&extra).for_each(|&v| top.push(v));
                    *row = top.sorted();
                }
            }
            let h = rows
                .iter()
                .map(|row| {
                    let mut top = TopValues::new(k);
                    row.iter().for_each(|&v| top.push(v));
                    weight * top.mean_of_largest(k).unwrap_or(0.0)
                })
                .collect();
            vec![f64s(h), list_array(rows)]
        }
        MethodSpec::GloballyCorrected => {
            let name = format!("{p}_sorted_sims");
            let mut rows = lists(a, &name)?;
            if let Some(b) = b {
                for (row, extra) in rows.iter_mut().zip(lists(b, &name)?) {
                    let mut merged = SortedSimilarities::from_unsorted(std::mem::take(row));
                    merged.merge(&SortedSimilarities::from_unsorted(extra));
                    *row = merged.values().to_vec();
                }
            }
            vec![list_array(rows)]
        }
        _ => unreachable!("only mergeable methods are merged"),
    })
}

/// The stats file of `job.methods` over `gallery` × `bank` into a scratch
/// file beside `near` (removed when the returned guard drops).
fn partial_stats(
    gallery: &EmbeddingTable,
    bank: &EmbeddingTable,
    gallery_bank: Option<&EmbeddingTable>,
    methods: &[MethodSpec],
    job: &StatsJob,
    name: &str,
    progress: &dyn Progress,
) -> Result<crate::sink::AtomicFile> {
    let index = IdIndex::build(gallery)?;
    let scratch = job.out.with_file_name(format!(
        ".{}.{name}",
        job.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let (file, _) = write_stats(
        &StatsInputs {
            gallery,
            bank,
            gallery_bank,
            index: &index,
        },
        methods,
        &scratch,
        true,
        &job.options,
        vec![],
        progress,
        None,
    )?;
    Ok(file)
}

/// `hubnorm stats --update`: merges the new parts of `job.gallery` and
/// `job.bank` into the stats file at `job.out`, replacing it atomically.
/// The methods are the stored file's.
pub fn update_stats(job: &StatsJob, progress: &dyn Progress) -> Result<UpdateSummary> {
    if job.bank_sample.is_some() {
        return Err(HubnormError::Usage(
            "--update cannot be combined with --bank-sample (a sample changes as rows arrive)"
                .into(),
        ));
    }
    let stored = job.out.as_path();
    if !stored.is_file() {
        return Err(HubnormError::Usage(format!(
            "--update merges into an existing stats file, and {} does not exist",
            stored.display()
        )));
    }
    let methods = stats_file_methods(stored)?;
    let metadata = file_metadata(stored)?;
    let normalize = job.options.read.normalize.to_string();
    if metadata
        .get("hubnorm.normalize")
        .is_some_and(|n| *n != normalize)
    {
        return Err(HubnormError::Usage(format!(
            "{} was computed with normalize={}, and this update asks for normalize={normalize}; use the same --no-normalize setting",
            stored.display(),
            metadata["hubnorm.normalize"]
        )));
    }
    if metadata
        .keys()
        .any(|k| k.starts_with("hubnorm.bank_sample."))
    {
        return Err(HubnormError::Usage(format!(
            "{} was computed from a bank sample (--bank-sample), which new rows would change; recompute without --update",
            stored.display()
        )));
    }
    pipeline::with_threads(job.options.threads, || {
        let gallery = pipeline::open_table("gallery", &job.gallery, &job.options, false)?;
        let banks = pipeline::open_banks(
            &job.bank,
            job.gallery_bank.as_deref(),
            None,
            &methods,
            &gallery,
            &job.options,
        )?;
        // Refuses duplicate ids across old and new parts, as a full run would.
        let index = IdIndex::build(&gallery)?;
        let new_gallery = split_parts(&gallery, stored, &metadata, "gallery")?;
        let new_bank = split_parts(&banks.bank, stored, &metadata, "bank")?;
        let mut summary = UpdateSummary {
            new_gallery_parts: new_gallery.iter().filter(|&&n| n).count(),
            new_bank_parts: new_bank.iter().filter(|&&n| n).count(),
            gallery_rows: gallery.rows,
            ..UpdateSummary::default()
        };
        if let Some(gb) = &banks.gallery_bank {
            summary.new_gallery_bank_parts = split_parts(gb, stored, &metadata, "gallery_bank")?
                .iter()
                .filter(|&&n| n)
                .count();
        }
        let (merged, recomputed): (Vec<MethodSpec>, Vec<MethodSpec>) =
            methods.iter().partition(|m| is_mergeable(m.kind()));
        summary.merged = merged.clone();
        if summary.new_gallery_parts == 0
            && summary.new_bank_parts == 0
            && summary.new_gallery_bank_parts == 0
        {
            return Ok(summary); // Up to date: the stored file is left as it is.
        }
        summary.recomputed = recomputed.clone();

        // Pass A: (whole gallery) × (new bank parts); pass B: (new gallery) × (old bank).
        let bank_new = subset(&banks.bank, &new_bank);
        let old_bank: Vec<bool> = new_bank.iter().map(|n| !n).collect();
        let bank_old = subset(&banks.bank, &old_bank);
        let gallery_new = subset(&gallery, &new_gallery);
        summary.new_gallery_rows = gallery_new.as_ref().map_or(0, |g| g.rows);
        let pass_a = match (&bank_new, merged.is_empty()) {
            (Some(bank), false) => Some(partial_stats(
                &gallery, bank, None, &merged, job, "new-bank", progress,
            )?),
            _ => None,
        };
        let pass_b = match (&gallery_new, &bank_old, merged.is_empty()) {
            (Some(g), Some(bank), false) => Some(partial_stats(
                g,
                bank,
                None,
                &merged,
                job,
                "new-gallery",
                progress,
            )?),
            _ => None,
        };
        // The others, in full over every input.
        let full = if recomputed.is_empty() {
            None
        } else {
            Some(partial_stats(
                &gallery,
                &banks.bank,
                banks.gallery_bank.as_ref(),
                &recomputed,
                job,
                "recomputed",
                progress,
            )?)
        };

        // Output: the layout of every method, rows in the current gallery order.
        let layout = StatsLayout::new(&methods);
        let schema: SchemaRef = layout.schema(gallery.id_kind);
        let mut out_metadata = banks.stats_metadata(&gallery, None, &job.options);
        out_metadata.push((
            "hubnorm.methods".into(),
            crate::stats_file::methods_json(layout.methods()),
        ));
        if let Some(full) = &full {
            // dn's means and Sinkhorn's reports come with the recomputed methods.
            for (key, value) in file_metadata(full.temporary_path())? {
                if key.starts_with("hubnorm.dn.") || key.starts_with("hubnorm.sinkhorn.") {
                    out_metadata.push((key, value));
                }
            }
        }
        let mut stored_rows = RowCursor::open(stored)?;
        let mut a_rows = pass_a
            .as_ref()
            .map(|f| RowCursor::open(f.temporary_path()))
            .transpose()?;
        let mut b_rows = pass_b
            .as_ref()
            .map(|f| RowCursor::open(f.temporary_path()))
            .transpose()?;
        let mut full_rows = full
            .as_ref()
            .map(|f| RowCursor::open(f.temporary_path()))
            .transpose()?;
        let mut sink = ParquetSink::create(stored, schema.clone(), out_metadata, true)?;
        const STEP: usize = 8192;
        let mut row = 0usize;
        for (part, &is_new) in gallery.parts.iter().zip(&new_gallery) {
            let mut left = part.rows as usize;
            while left > 0 {
                let n = left.min(STEP);
                left -= n;
                let added = a_rows.as_mut().map(|a| a.take(n)).transpose()?;
                let whole = full_rows.as_mut().map(|f| f.take(n)).transpose()?;
                // The rows the merge starts from: stored (old items) or pass B
                // (new items); with nothing to merge, the recomputed rows.
                let base = match (merged.is_empty(), is_new, &mut b_rows) {
                    (true, _, _) => whole.clone().expect("recomputed methods"),
                    (false, false, _) => stored_rows.take(n)?,
                    (false, true, Some(b)) => b.take(n)?,
                    (false, true, None) => {
                        return Err(HubnormError::Usage(
                            "the bank parts the stored file counted hold no rows; recompute without --update".into(),
                        ))
                    }
                };
                // Every source must hold these very gallery items, in order.
                let expected = index.ids().slice(row, n);
                for other in std::iter::once(&base).chain(added.iter()).chain(&whole) {
                    if other.column(0).as_ref() != expected.as_ref() {
                        return Err(HubnormError::input(
                            stored,
                            Some(row as u64),
                            Some("gallery_id"),
                            "the stored rows do not follow the gallery's counted parts in order (was the gallery given another way?); recompute without --update",
                        ));
                    }
                }
                row += n;
                let mut columns: HashMap<String, ArrayRef> = HashMap::new();
                for m in &merged {
                    let (early, _) = StatsLayout::new(&[*m]).columns();
                    let merged_columns = merge_method(m, &base, added.as_ref())?;
                    for ((name, _), column) in early.into_iter().zip(merged_columns) {
                        columns.insert(name, column);
                    }
                }
                if let Some(whole) = &whole {
                    for (field, column) in whole.schema().fields().iter().zip(whole.columns()) {
                        columns.insert(field.name().clone(), column.clone());
                    }
                }
                let mut ordered = vec![base.column(0).clone()];
                for field in schema.fields().iter().skip(1) {
                    ordered.push(columns.remove(field.name()).ok_or_else(|| {
                        HubnormError::Internal(format!("update lost column {}", field.name()))
                    })?);
                }
                sink.write(&RecordBatch::try_new(schema.clone(), ordered)?)?;
            }
        }
        sink.finish()?;
        Ok(summary)
    })
}
