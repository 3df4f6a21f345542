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
//! Then each correction is finished from its merged state, by the method's
//! own [`crate::method::Method::merge`]. A method declares whether it is
//! mergeable (log-sum-exp, top-k and sorted-list states: merging equals one
//! pass, up to the rounding of the log-sum-exp sums); the others are
//! recomputed in full from all inputs, because their statistic couples all
//! rows: Sinkhorn potentials, activation sets (a new gallery item can
//! displace an old one from a bank item's top-k), two banks, or the bank
//! means. The new file replaces the stored one atomically, only once
//! complete.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;

use crate::bank::driver::bank_moments;
use crate::bank::StatsLayout;
use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::inputs::{open_banks, open_table, with_threads};
use crate::method::{BankRowMap, MethodKind, MethodSpec, StoredRows};
use crate::pipeline::StatsJob;
use crate::progress::Progress;
use crate::sink::ParquetSink;
use crate::source::{EmbeddingTable, PartRecord, TablePart};
use crate::stats_file::{
    check_same_normalize, file_metadata, stats_file_methods, write_stats, StatsInputs,
};

/// Whether a method's state merges across bank and gallery parts.
pub fn is_mergeable(kind: MethodKind) -> bool {
    kind.method().mergeable()
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
    /// Whether a Delta input was compacted since the stored file's version
    /// (the same rows in other files: nothing to compute for them).
    pub compacted: bool,
}

/// Whether `method`'s stored state lists bank rows by number.
fn stores_bank_rows(method: &MethodSpec) -> bool {
    let (early, late) = StatsLayout::new(&[*method]).columns();
    early
        .iter()
        .chain(&late)
        .any(|(_, kind)| *kind == crate::method::ColumnKind::ListUInt64)
}

/// Sorts `table`'s parts into recorded (unchanged) and new; a recorded part
/// that changed or disappeared is refused.
fn split_parts(
    table: &EmbeddingTable,
    stats: &Path,
    metadata: &HashMap<String, String>,
    key: &str,
    rewritten: &Rewritten,
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
            None if rewritten.removed(&old.path) => {}
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
        .map(|c| !recorded.iter().any(|r| r.path == c.path) && !rewritten.added(&c.path))
        .collect())
}

/// Files of a Delta input that a compaction rewrote since the stats file's
/// version: the rows of the removed files are those of the added ones, so
/// neither counts as new (file names: unique within a Delta table).
#[derive(Debug, Default)]
struct Rewritten {
    removed: std::collections::HashSet<String>,
    added: std::collections::HashSet<String>,
}

impl Rewritten {
    fn removed(&self, path: &str) -> bool {
        self.removed.contains(file_name(path))
    }
    fn added(&self, path: &str) -> bool {
        self.added.contains(file_name(path))
    }
    fn any(&self) -> bool {
        !self.removed.is_empty()
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// For a Delta input, what its log says happened since the version the
/// stats file records: files only added (the new parts), or compacted
/// (`dataChange: false`: the same rows in other files, nothing to
/// compute). A commit that removed rows (delete, update, overwrite), or
/// compacted rows added since, is refused: merging cannot take rows out.
fn delta_rewrites(
    table: &EmbeddingTable,
    stats: &Path,
    metadata: &HashMap<String, String>,
    key: &str,
) -> Result<Rewritten> {
    #[cfg_attr(not(feature = "delta"), allow(unused_mut))]
    let mut rewritten = Rewritten::default();
    let recorded = metadata
        .get(&format!("hubnorm.{key}.delta_version"))
        .and_then(|v| v.parse::<u64>().ok());
    let (Some(from), Some(to)) = (recorded, table.delta_version) else {
        return Ok(rewritten);
    };
    if to < from {
        return Err(HubnormError::Usage(format!(
            "{} was computed from version {from} of the {key} table {}, later than the version {to} read now; recompute without --update",
            stats.display(),
            table.spec
        )));
    }
    #[cfg(feature = "delta")]
    {
        let root = crate::delta::parse_spec(&table.spec)
            .map(|s| s.root)
            .unwrap_or_else(|| table.spec.clone());
        let mut added_since = std::collections::HashSet::new();
        for change in crate::delta::changes(&root, from, to)? {
            let name = |p: &PathBuf| file_name(&p.to_string_lossy()).to_owned();
            for (path, data_change) in &change.removed {
                let refuse = |what: &str| {
                    Err(HubnormError::Usage(format!(
                        "version {} ({}) of the {key} table {root} {what}, since version {from} that {} was computed from; --update only adds rows: recompute without --update",
                        change.version,
                        if change.operation.is_empty() { "no operation recorded" } else { &change.operation },
                        stats.display()
                    )))
                };
                if *data_change {
                    return refuse("removed or rewrote rows");
                }
                if added_since.contains(&name(path)) {
                    return refuse("compacted rows added since");
                }
                rewritten.removed.insert(name(path));
            }
            for (path, data_change) in &change.added {
                if *data_change {
                    added_since.insert(name(path));
                } else {
                    rewritten.added.insert(name(path));
                }
            }
        }
    }
    Ok(rewritten)
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
    reader: Box<dyn Iterator<Item = Result<RecordBatch>>>,
    pending: Option<RecordBatch>,
    path: PathBuf,
}

impl RowCursor {
    fn open(path: &Path) -> Result<Self> {
        let reader = crate::source::open_parquet(path)?
            .build()
            .map_err(|e| HubnormError::parquet(path, e))?;
        Ok(RowCursor {
            reader: Box::new(crate::source::CheckedBatches::new(reader, path)),
            pending: None,
            path: path.to_path_buf(),
        })
    }

    /// The rows of the stats file at `path` put in the order of the old
    /// (not `new`) parts of `gallery`, matched by gallery id. Reads the
    /// whole file: one row per gallery item, as `search` holds it.
    fn reordered(
        path: &Path,
        gallery: &EmbeddingTable,
        new: &[bool],
        index: &IdIndex,
    ) -> Result<Self> {
        let mut cursor = RowCursor::open(path)?;
        let mut batches = Vec::new();
        for batch in cursor.reader.by_ref() {
            batches.push(batch?);
        }
        let Some(first) = batches.first() else {
            return Ok(cursor);
        };
        let stored = arrow::compute::concat_batches(&first.schema(), &batches)?;
        let as_text = |ids: &ArrayRef| arrow::compute::cast(ids, &arrow::datatypes::DataType::Utf8);
        let stored_ids = as_text(stored.column(0))?;
        let stored_ids = stored_ids
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .expect("utf8");
        let position: HashMap<&str, u32> = (0..stored_ids.len())
            .map(|i| (stored_ids.value(i), i as u32))
            .collect();
        let gallery_ids = as_text(index.ids())?;
        let gallery_ids = gallery_ids
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .expect("utf8");
        let mut order = Vec::with_capacity(stored.num_rows());
        for (part, &is_new) in gallery.parts.iter().zip(new) {
            if is_new {
                continue;
            }
            for row in part.first_row..part.first_row + part.rows {
                let id = gallery_ids.value(row as usize);
                let at = position.get(id).ok_or_else(|| {
                    HubnormError::input(path, None, Some("gallery_id"), format!("has no row for gallery item {id}, which the compacted gallery holds; recompute without --update"))
                })?;
                order.push(*at);
            }
        }
        let order = arrow::array::UInt32Array::from(order);
        let columns = stored
            .columns()
            .iter()
            .map(|c| arrow::compute::take(c, &order, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let batch = RecordBatch::try_new(stored.schema(), columns)?;
        cursor.reader = Box::new(std::iter::once(Ok(batch)));
        Ok(cursor)
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
            index: Some(&index),
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
    // Another process updating (or writing) the same file is refused.
    let _lock = crate::sink::OutputLock::acquire(&job.out)?;
    if job.bank_sample.is_some() {
        return Err(HubnormError::Usage(
            "--update cannot be combined with --bank-sample (a sample changes as rows arrive)"
                .into(),
        ));
    }
    let stored = job.out.as_path();
    if !crate::source::holds_table(stored)? {
        return Err(HubnormError::Usage(format!(
            "--update merges into an existing stats file, and {} does not exist",
            stored.display()
        )));
    }
    let methods = stats_file_methods(stored)?;
    let metadata = file_metadata(stored)?;
    check_same_normalize(stored, &metadata, job.options.read.normalize)?;
    if metadata
        .keys()
        .any(|k| k.starts_with("hubnorm.bank_sample."))
    {
        return Err(HubnormError::Usage(format!(
            "{} was computed from a bank sample (--bank-sample), which new rows would change; recompute without --update",
            stored.display()
        )));
    }
    // The gallery side of `mp` and `dn` is the gallery bank when one was
    // given, else the gallery: an update must use the same.
    let recorded_gallery_bank = metadata.contains_key("hubnorm.gallery_bank.parts");
    match (recorded_gallery_bank, job.gallery_bank.is_some()) {
        (true, false) => {
            return Err(HubnormError::Usage(format!(
                "{} was computed with a gallery bank; pass the same --gallery-bank to --update",
                stored.display()
            )))
        }
        (false, true) => {
            return Err(HubnormError::Usage(format!(
                "{} was computed without a gallery bank; drop --gallery-bank, or recompute it without --update",
                stored.display()
            )))
        }
        _ => {}
    }
    with_threads(job.options.threads, || {
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        let banks = open_banks(
            &job.bank,
            job.gallery_bank.as_deref(),
            None,
            &methods,
            &gallery,
            &job.options,
        )?;
        // Refuses duplicate ids across old and new parts, as a full run would.
        let index = IdIndex::build(&gallery)?;
        let gallery_rewritten = delta_rewrites(&gallery, stored, &metadata, "gallery")?;
        let bank_rewritten = delta_rewrites(&banks.bank, stored, &metadata, "bank")?;
        let new_gallery = split_parts(&gallery, stored, &metadata, "gallery", &gallery_rewritten)?;
        let new_bank = split_parts(&banks.bank, stored, &metadata, "bank", &bank_rewritten)?;
        let mut summary = UpdateSummary {
            new_gallery_parts: new_gallery.iter().filter(|&&n| n).count(),
            new_bank_parts: new_bank.iter().filter(|&&n| n).count(),
            gallery_rows: gallery.rows,
            ..UpdateSummary::default()
        };
        if let Some(gb) = &banks.gallery_bank {
            let rewritten = delta_rewrites(gb, stored, &metadata, "gallery_bank")?;
            summary.new_gallery_bank_parts =
                split_parts(gb, stored, &metadata, "gallery_bank", &rewritten)?
                    .iter()
                    .filter(|&&n| n)
                    .count();
        }
        // A compacted bank numbers its rows anew: states that store bank
        // rows (dissim-local's lists) are recomputed rather than merged.
        let (merged, recomputed): (Vec<MethodSpec>, Vec<MethodSpec>) =
            methods.iter().partition(|m| {
                m.method().mergeable() && !(bank_rewritten.any() && stores_bank_rows(m))
            });
        summary.compacted = gallery_rewritten.any() || bank_rewritten.any();
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
        let new_bank_rows = BankRowMap::of_parts(&banks.bank, &new_bank);
        let old_bank_rows = BankRowMap::of_parts(&banks.bank, &old_bank);
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
            // What the recomputed methods record of themselves (dn's means,
            // Sinkhorn's reports): every hubnorm key the common metadata
            // lacks (not Arrow's schema of that file).
            for (key, value) in file_metadata(full.temporary_path())? {
                if key.starts_with("hubnorm.") && !out_metadata.iter().any(|(k, _)| *k == key) {
                    out_metadata.push((key, value));
                }
            }
        }
        // The merged methods' moments (`mp`'s gallery side) are of the
        // current inputs: computed again, a pass over rows, not pairs.
        let merged_layout = StatsLayout::new(&merged);
        let gallery_side = banks.gallery_bank.as_ref().unwrap_or(&gallery);
        if let Some(moments) = bank_moments(&merged_layout, &banks.bank, gallery_side)? {
            for (key, value) in merged_layout.file_metadata(&moments) {
                if !out_metadata.iter().any(|(k, _)| *k == key) {
                    out_metadata.push((key, value));
                }
            }
        }
        // A compacted gallery holds the stored items in another order.
        let mut stored_rows = if gallery_rewritten.any() {
            RowCursor::reordered(stored, &gallery, &new_gallery, &index)?
        } else {
            RowCursor::open(stored)?
        };
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
                    // The stored rows and pass B's count the old bank parts,
                    // pass A's the new ones.
                    let added = added
                        .as_ref()
                        .map(|batch| StoredRows::in_bank(batch, &banks.bank, &new_bank_rows));
                    let base = StoredRows::in_bank(&base, &banks.bank, &old_bank_rows);
                    let merged_columns = m.method().merge(m, &base, added.as_ref())?;
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
