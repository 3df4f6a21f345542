//! Reading a table block by block: each part's record batches validated
//! (ids, finite values, dimension), converted to f32, normalised when asked,
//! and copied into contiguous row-major blocks.

use std::path::{Path, PathBuf};

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, GenericListArray, OffsetSizeTrait,
};
use arrow::datatypes::{DataType, Float16Type, Float32Type, Float64Type};
use arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelectionPolicy,
    RowSelector,
};

use super::*;
use crate::error::{HubnormError, Result};

/// Reads a table block by block. Rows are validated, converted to f32 and
/// (optionally) normalised as they are copied into the block's buffer.
pub struct BlockReader<'a> {
    table: &'a EmbeddingTable,
    block_rows: usize,
    ids_only: bool,
    /// Stop after learning the dimension of a List column (used by `open`).
    pub(super) peek_dimension: bool,
    pub(super) next_part: usize,
    /// Rows of the next part to skip (a reader started mid-table).
    pub(super) skip_in_next_part: u64,
    current: Option<PartReader>,
    pub(super) next_global_row: u64,
    /// The row the reader stops before (the table's end unless a range was asked).
    pub(super) end_row: u64,
    /// A finished block's buffer for the next block: a fresh allocation of
    /// a block's size is mapped anew and its pages faulted in one by one.
    spare: Option<Vec<f32>>,
}

struct PartReader {
    path: PathBuf,
    /// Table row of the part's first row.
    table_first_row: u64,
    reader: PartBatches,
    /// The object read, when remote (see [`decode_error`]).
    probe: Option<crate::storage::RemoteFile>,
    columns: Columns,
    /// Batch being consumed and how far.
    pending: Option<(RecordBatch, usize)>,
    /// Row within the part of the pending batch's first row.
    batch_first_row: u64,
    /// What [`first_undecodable_row`] needs to decode a failed batch again:
    /// the Parquet columns read (roots, in file order) and the rows per
    /// batch (none and 0 for an in-memory part).
    roots: Vec<usize>,
    batch_rows: u64,
}

impl<'a> BlockReader<'a> {
    pub(super) fn new(table: &'a EmbeddingTable, block_rows: usize, ids_only: bool) -> Self {
        BlockReader {
            table,
            block_rows,
            ids_only,
            peek_dimension: false,
            next_part: 0,
            skip_in_next_part: 0,
            current: None,
            next_global_row: 0,
            end_row: u64::MAX,
            spare: None,
        }
    }

    /// Hands back a block the caller is done with, so that the next block
    /// is read into its buffer.
    pub fn recycle(&mut self, block: EmbeddingBlock) {
        self.spare = Some(block.data);
    }

    fn open_part(&mut self) -> Result<bool> {
        let table = self.table;
        let Some(part) = table.parts.get(self.next_part) else {
            return Ok(false);
        };
        self.next_part += 1;
        if memory::is_memory(&part.path) {
            return self.open_memory_part(part);
        }
        let (builder, probe) = open_parquet_probed(&part.path)?;
        let columns = locate_columns(
            &part.path,
            builder.schema(),
            &table.options,
            table.has_targets,
        )?;
        let mut roots = vec![columns.id];
        if !self.ids_only {
            roots.push(columns.embedding);
            roots.extend(columns.target);
        }
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        // The projected batch keeps the file's column order.
        roots.sort_unstable();
        let position = |c: usize| roots.iter().position(|&r| r == c).expect("projected");
        let projected = Columns {
            id: position(columns.id),
            embedding: if self.ids_only {
                usize::MAX
            } else {
                position(columns.embedding)
            },
            target: if self.ids_only {
                None
            } else {
                columns.target.map(position)
            },
        };
        let batch_rows = if self.peek_dimension {
            1
        } else {
            table.options.batch_rows.min(self.block_rows).max(1)
        };
        if let Some(remote) = &probe {
            aim_remote_reads(remote, &builder, &roots, batch_rows * table.dim.max(1) * 4);
        }
        let skip = std::mem::take(&mut self.skip_in_next_part);
        let mut builder = builder.with_projection(mask).with_batch_size(batch_rows);
        // Row groups that end before `skip` are not read at all. The rows of
        // the next one before `skip` are decoded and dropped: the parquet
        // crate's record skipping (a RowSelection) panics on some damaged
        // page headers (tests/fixtures/fuzz/damaged_page_header.parquet).
        let mut batch_first_row = 0u64;
        if skip > 0 {
            let mut kept = Vec::new();
            for (i, group) in builder.metadata().row_groups().iter().enumerate() {
                let group_rows = group.num_rows() as u64;
                if kept.is_empty() && batch_first_row + group_rows <= skip {
                    batch_first_row += group_rows;
                } else {
                    kept.push(i);
                }
            }
            builder = builder.with_row_groups(kept);
        }
        let mut reader = PartBatches::Parquet(build_reader(builder, &part.path, probe.as_ref())?);
        let mut pending = None;
        while batch_first_row < skip {
            match reader.next_batch() {
                Some(Ok(batch)) if batch_first_row + batch.num_rows() as u64 <= skip => {
                    batch_first_row += batch.num_rows() as u64;
                }
                Some(Ok(batch)) => {
                    pending = Some((batch, (skip - batch_first_row) as usize));
                    break;
                }
                Some(Err(e)) => {
                    self.next_part = table.parts.len();
                    return Err(parquet_decode_error(
                        &part.path,
                        &roots,
                        batch_first_row..batch_first_row + batch_rows as u64,
                        e,
                        probe.as_ref(),
                    ));
                }
                None => break,
            }
        }
        self.current = Some(PartReader {
            path: part.path.clone(),
            table_first_row: part.first_row,
            reader,
            probe,
            columns: projected,
            pending,
            batch_first_row,
            roots,
            batch_rows: batch_rows as u64,
        });
        Ok(true)
    }

    /// Opens an in-memory part: its batches are sliced, never copied, and
    /// the rows before a resumed reader's start are skipped without reading.
    fn open_memory_part(&mut self, part: &TablePart) -> Result<bool> {
        let table = memory::lookup(&part.path)?;
        let columns = locate_columns(
            &part.path,
            &table.schema,
            &self.table.options,
            self.table.has_targets,
        )?;
        let skip = std::mem::take(&mut self.skip_in_next_part);
        let mut next = 0;
        let mut batch_first_row = 0u64;
        let mut pending = None;
        while batch_first_row < skip {
            let Some(batch) = table.batches.get(next) else {
                break;
            };
            next += 1;
            let rows = batch.num_rows() as u64;
            if batch_first_row + rows <= skip {
                batch_first_row += rows;
            } else {
                pending = Some((batch.clone(), (skip - batch_first_row) as usize));
                break;
            }
        }
        self.current = Some(PartReader {
            path: part.path.clone(),
            table_first_row: part.first_row,
            reader: PartBatches::Memory { table, next },
            probe: None,
            columns,
            pending,
            batch_first_row,
            roots: Vec::new(),
            batch_rows: 0,
        });
        Ok(true)
    }

    /// The next block, or `None` at the end of the table.
    pub fn next_block(&mut self) -> Result<Option<EmbeddingBlock>> {
        crate::cancel::check()?;
        let dim = self.table.dim;
        let capacity = if self.ids_only {
            0
        } else {
            self.block_rows * dim
        };
        let mut data = match self.spare.take() {
            Some(mut spare) if spare.capacity() >= capacity => {
                spare.clear();
                spare
            }
            _ => Vec::with_capacity(capacity),
        };
        let mut ids: Vec<ArrayRef> = Vec::new();
        let mut targets: Vec<ArrayRef> = Vec::new();
        let mut rows = 0usize;
        let first_row = self.next_global_row;
        let mut block_dim = if self.peek_dimension { None } else { Some(dim) };
        let block_rows = self
            .block_rows
            .min(usize::try_from(self.end_row.saturating_sub(first_row)).unwrap_or(usize::MAX));
        while rows < block_rows {
            if self.current.is_none() && !self.open_part()? {
                break;
            }
            let part = self.current.as_mut().expect("opened above");
            if part.pending.is_none() {
                match part.reader.next_batch() {
                    Some(Ok(batch)) => part.pending = Some((batch, 0)),
                    Some(Err(e)) => {
                        let err = parquet_decode_error(
                            &part.path,
                            &part.roots,
                            part.batch_first_row..part.batch_first_row + part.batch_rows,
                            e,
                            part.probe.as_ref(),
                        );
                        // The decoder may be left inconsistent: read no further.
                        self.current = None;
                        self.next_part = self.table.parts.len();
                        return Err(err);
                    }
                    None => {
                        self.current = None;
                        continue;
                    }
                }
            }
            let (batch, offset) = part.pending.as_ref().expect("set above");
            let take = (batch.num_rows() - offset).min(block_rows - rows);
            let slice = batch.slice(*offset, take);
            let slice_first_row = part.batch_first_row + *offset as u64;
            let opts = &self.table.options;
            // Rows of a sampled table that are kept (all rows otherwise).
            let keep = self.table.sample.as_ref().map(|sample| {
                let first = part.table_first_row + slice_first_row;
                arrow::array::BooleanArray::from_iter(
                    (0..take as u64).map(|i| Some(sample.contains(first + i))),
                )
            });
            let kept = keep.as_ref().map_or(take, |k| k.true_count());
            let id = slice.column(part.columns.id);
            check_ids(id, &part.path, slice_first_row, &opts.id_column)?;
            let id = normalise_ids(id)?;
            ids.push(match &keep {
                Some(k) => arrow::compute::filter(&id, k)?,
                None => id,
            });
            if !self.ids_only {
                let embedding = slice.column(part.columns.embedding);
                let start = data.len();
                append_embeddings(
                    embedding,
                    &part.path,
                    slice_first_row,
                    &opts.embedding_column,
                    &mut block_dim,
                    opts.normalize,
                    &mut data,
                )?;
                if let (Some(k), Some(d)) = (&keep, block_dim) {
                    // Compact the kept rows in place (every row was validated).
                    let mut write = start;
                    for (i, keep_row) in k.values().iter().enumerate() {
                        if keep_row {
                            let read = start + i * d;
                            data.copy_within(read..read + d, write);
                            write += d;
                        }
                    }
                    data.truncate(write);
                }
                if let Some(t) = part.columns.target {
                    let column = slice.column(t).clone();
                    targets.push(match &keep {
                        Some(k) => arrow::compute::filter(&column, k)?,
                        None => column,
                    });
                }
            }
            rows += kept;
            let new_offset = offset + take;
            if new_offset == batch.num_rows() {
                part.batch_first_row += batch.num_rows() as u64;
                part.pending = None;
            } else {
                part.pending.as_mut().expect("pending").1 = new_offset;
            }
            if self.peek_dimension {
                break;
            }
        }
        if rows == 0 {
            return Ok(None);
        }
        self.next_global_row += rows as u64;
        let concat = |pieces: &[ArrayRef]| -> Result<ArrayRef> {
            if pieces.len() == 1 {
                return Ok(pieces[0].clone());
            }
            let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
            Ok(arrow::compute::concat(&refs)?)
        };
        Ok(Some(EmbeddingBlock {
            first_row,
            rows,
            dim: block_dim.unwrap_or(dim),
            data,
            ids: concat(&ids)?,
            targets: if targets.is_empty() {
                None
            } else {
                Some(concat(&targets)?)
            },
        }))
    }
}

/// The reader `builder` makes, or the error naming the part at `path`.
fn build_reader(
    builder: ParquetRecordBatchReaderBuilder<InputFile>,
    path: &Path,
    probe: Option<&crate::storage::RemoteFile>,
) -> Result<ParquetRecordBatchReader> {
    builder
        .build()
        .map_err(|e| decode_error(path, None, format!("cannot read: {e}"), probe))
}

/// Points a remote part's ranged reads at the column chunks of `roots`
/// (the columns read) only, in windows the size of a decoded batch of
/// `batch_bytes` (what the plan counted).
fn aim_remote_reads(
    remote: &crate::storage::RemoteFile,
    builder: &ParquetRecordBatchReaderBuilder<InputFile>,
    roots: &[usize],
    batch_bytes: usize,
) {
    let schema = builder.parquet_schema();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&leaf| roots.contains(&schema.get_column_root_idx(leaf)))
        .collect();
    let chunks = builder
        .metadata()
        .row_groups()
        .iter()
        .flat_map(|g| leaves.iter().map(move |&leaf| g.column(leaf).byte_range()))
        .map(|(start, length)| start..start.saturating_add(length))
        .collect();
    remote.set_chunks(chunks);
    remote.set_window_bytes(crate::storage::window_bytes_for(batch_bytes));
}

/// The embeddings of table rows `rows` (ascending, distinct), row after
/// row, with the values [`BlockReader`] gives them: only these rows are
/// decoded, Parquet's record skipping (a `RowSelection`) passes over the
/// others' values. `None` for a sampled table or one with an in-memory
/// part. An error names the file but not the row: a caller that must
/// report it reads the table in blocks instead.
pub(super) fn read_selected_rows(table: &EmbeddingTable, rows: &[u64]) -> Result<Option<Vec<f32>>> {
    debug_assert!(rows.windows(2).all(|w| w[0] < w[1]), "ascending, distinct");
    if table.is_sampled() || table.parts.iter().any(|p| memory::is_memory(&p.path)) {
        return Ok(None);
    }
    let dim = table.dim;
    let mut out = Vec::with_capacity(rows.len() * dim);
    let mut rest = rows;
    for part in &table.parts {
        let in_part = rest.partition_point(|&r| r < part.first_row + part.rows);
        let (wanted, later) = rest.split_at(in_part);
        rest = later;
        if wanted.is_empty() {
            continue;
        }
        let (builder, probe) = open_parquet_probed(&part.path)?;
        let columns = locate_columns(&part.path, builder.schema(), &table.options, false)?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), [columns.embedding]);
        // The row groups holding wanted rows; the selection counts the rows
        // of those groups only.
        let (mut groups, mut selectors) = (Vec::new(), Vec::new());
        let mut wanted = wanted.iter().map(|&r| r - part.first_row).peekable();
        let mut group_start = 0u64;
        for (index, group) in builder.metadata().row_groups().iter().enumerate() {
            let group_end = group_start + group.num_rows() as u64;
            let mut at = group_start;
            while let Some(row) = wanted.next_if(|&r| r < group_end) {
                selectors.push(RowSelector::skip((row - at) as usize));
                selectors.push(RowSelector::select(1));
                at = row + 1;
            }
            if at > group_start {
                selectors.push(RowSelector::skip((group_end - at) as usize));
                groups.push(index);
            }
            group_start = group_end;
        }
        let batch_rows = table.options.batch_rows.max(1);
        if let Some(remote) = &probe {
            aim_remote_reads(
                remote,
                &builder,
                &[columns.embedding],
                batch_rows * dim.max(1) * 4,
            );
        }
        let builder = builder
            .with_projection(mask)
            .with_row_groups(groups)
            .with_row_selection(selectors.into_iter().collect::<RowSelection>())
            // Skipped, not decoded and filtered, however dense the rows are.
            .with_row_selection_policy(RowSelectionPolicy::Selectors)
            .with_batch_size(batch_rows);
        let mut reader = PartBatches::Parquet(build_reader(builder, &part.path, probe.as_ref())?);
        let mut block_dim = Some(dim);
        while let Some(batch) = reader.next_batch() {
            crate::cancel::check()?;
            let batch = batch.map_err(|e| {
                decode_error(
                    &part.path,
                    None,
                    format!("cannot decode Parquet data: {e}"),
                    probe.as_ref(),
                )
            })?;
            append_embeddings(
                batch.column(0),
                &part.path,
                0,
                &table.options.embedding_column,
                &mut block_dim,
                table.options.normalize,
                &mut out,
            )?;
        }
    }
    if out.len() != rows.len() * dim {
        return Err(HubnormError::Internal(format!(
            "{} of {} selected rows read",
            out.len() / dim.max(1),
            rows.len()
        )));
    }
    Ok(Some(out))
}

/// The error for a batch (`rows` of the Parquet part at `path`, columns
/// `roots`) that failed to decode: it names the row where decoding fails
/// ([`first_undecodable_row`]), or the batch's first row when decoding
/// again does not fail.
fn parquet_decode_error(
    path: &Path,
    roots: &[usize],
    rows: Range<u64>,
    error: String,
    probe: Option<&crate::storage::RemoteFile>,
) -> HubnormError {
    // A failed read of an object is reported as such (by `decode_error`),
    // and not read again.
    let row = match probe.and_then(|p| p.failure()) {
        Some(_) => rows.start,
        None => first_undecodable_row(path, roots, rows.clone()).unwrap_or(rows.start),
    };
    // A page decodes whole, so the row is the first of the damaged page
    // (or of the batch), not necessarily the damaged value's.
    decode_error(
        path,
        Some(row),
        format!("cannot decode Parquet data from this row on (the first row of the page that fails): {error}"),
        probe,
    )
}

/// Rows per batch while looking for the row group that fails to decode.
const GROUP_SEARCH_BATCH_ROWS: usize = 4096;

/// The first row of the failed batch `rows` at which the Parquet part at
/// `path` fails to decode its columns `roots`, found by reading them again
/// (only after a failure): a batch spans many rows, often several row
/// groups, and the decoder's error names none of them. The row groups
/// holding the batch's rows are decoded in large batches until one fails,
/// then that group a row at a time, so the row is the first of the damaged
/// page. `None` when nothing fails this time or the part cannot be opened
/// again.
fn first_undecodable_row(path: &Path, roots: &[usize], rows: Range<u64>) -> Option<u64> {
    let (builder, _) = open_parquet_probed(path).ok()?;
    let group_rows: Vec<u64> = builder
        .metadata()
        .row_groups()
        .iter()
        .map(|group| group.num_rows() as u64)
        .collect();
    drop(builder);
    // Decodes row group `index` in batches of `batch_rows`: the rows decoded
    // before the first failure, or `None` when the whole group decodes.
    let failure_in_group = |index: usize, batch_rows: usize| -> Option<Option<u64>> {
        let (builder, _) = open_parquet_probed(path).ok()?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let mut reader = builder
            .with_projection(mask)
            .with_row_groups(vec![index])
            .with_batch_size(batch_rows)
            .build()
            .ok()?;
        let mut decoded = 0;
        while let Some(next) = next_parquet_batch(&mut reader) {
            match next {
                Ok(batch) => decoded += batch.num_rows() as u64,
                Err(_) => return Some(Some(decoded)),
            }
        }
        Some(None)
    };
    let mut group_start = 0;
    for (index, group) in group_rows.into_iter().enumerate() {
        if group_start >= rows.end {
            break;
        }
        let group_end = group_start + group;
        if group_end > rows.start && failure_in_group(index, GROUP_SEARCH_BATCH_ROWS)?.is_some() {
            let decoded = failure_in_group(index, 1)??;
            return Some((group_start + decoded).max(rows.start));
        }
        group_start = group_end;
    }
    None
}

/// Where a part's record batches come from.
enum PartBatches {
    Parquet(ParquetRecordBatchReader),
    /// An in-memory table, from its batch `next` on.
    Memory {
        table: std::sync::Arc<memory::MemoryTable>,
        next: usize,
    },
}

impl PartBatches {
    fn next_batch(&mut self) -> Option<std::result::Result<RecordBatch, String>> {
        match self {
            PartBatches::Parquet(reader) => next_parquet_batch(reader),
            PartBatches::Memory { table, next } => {
                let batch = table.batches.get(*next)?.clone();
                *next += 1;
                Some(Ok(batch))
            }
        }
    }
}

/// The next record batch of `reader`. The parquet crate (59) panics on
/// some damaged pages instead of failing, e.g. on a dictionary index bit
/// width over 32 (`BitReader::get_batch`,
/// tests/fixtures/fuzz/dictionary_bit_width.parquet); such a panic is
/// caught here and is a decoding error like the others, reported by
/// hubnorm alone (the panic's own text is not printed). The reader must
/// not be used after an error.
fn next_parquet_batch(
    reader: &mut ParquetRecordBatchReader,
) -> Option<std::result::Result<RecordBatch, String>> {
    silence_decoder_panics();
    DECODING.set(true);
    let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next()));
    DECODING.set(false);
    match next {
        Ok(next) => next.map(|batch| batch.map_err(|e| e.to_string())),
        Err(_) => Some(Err("the decoder failed on damaged data".into())),
    }
}

/// The record batches of a Parquet reader built outside [`BlockReader`]
/// (stats, results, checkpoint and spool files), each decoding failure (the
/// decoder's panics on damaged pages included, see [`next_parquet_batch`])
/// an input error naming the file and where the failed batch starts;
/// nothing after the first error.
pub(crate) struct CheckedBatches {
    reader: Option<ParquetRecordBatchReader>,
    path: PathBuf,
    first_row: u64,
}

impl CheckedBatches {
    /// The batches of `reader`, which reads the file at `path`.
    pub(crate) fn new(reader: ParquetRecordBatchReader, path: &Path) -> Self {
        CheckedBatches {
            reader: Some(reader),
            path: path.to_path_buf(),
            first_row: 0,
        }
    }
}

impl Iterator for CheckedBatches {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        match next_parquet_batch(self.reader.as_mut()?)? {
            Ok(batch) => {
                self.first_row += batch.num_rows() as u64;
                Some(Ok(batch))
            }
            Err(e) => {
                self.reader = None;
                Some(Err(HubnormError::input(
                    &self.path,
                    None,
                    None,
                    format!(
                        "cannot decode Parquet data (the batch from row {} on): {e}",
                        self.first_row
                    ),
                )))
            }
        }
    }
}

thread_local! {
    /// Whether this thread is inside [`next_parquet_batch`]'s decoder call.
    static DECODING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Installs, once, a panic hook that stays silent for the panics
/// [`next_parquet_batch`] catches and hands every other panic to the hook
/// that was there before.
fn silence_decoder_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !DECODING.get() {
                previous(info);
            }
        }));
    });
}

impl Iterator for BlockReader<'_> {
    type Item = Result<EmbeddingBlock>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_block().transpose()
    }
}

fn check_ids(ids: &ArrayRef, path: &Path, first_row: u64, column: &str) -> Result<()> {
    let error = |i: usize, message: String| {
        HubnormError::input(path, Some(first_row + i as u64), Some(column), message)
    };
    if ids.null_count() > 0 {
        let i = (0..ids.len())
            .find(|&i| ids.is_null(i))
            .expect("a null exists");
        return Err(error(i, "null id".into()));
    }
    // Ids come out as Int64, so an unsigned id must fit one.
    let unsigned = match ids.data_type() {
        DataType::UInt64 => Some(ids.clone()),
        DataType::Dictionary(_, values) if **values == DataType::UInt64 => {
            Some(arrow::compute::cast(ids, &DataType::UInt64)?)
        }
        _ => None,
    };
    if let Some(unsigned) = unsigned {
        let values = unsigned.as_primitive::<arrow::datatypes::UInt64Type>();
        if let Some(i) = values.values().iter().position(|&v| v > i64::MAX as u64) {
            return Err(error(
                i,
                format!(
                    "id {} is larger than 2^63 − 1, the largest id hubnorm keeps (as Int64)",
                    values.value(i)
                ),
            ));
        }
    }
    Ok(())
}

/// Ids as Utf8 or Int64, whatever string or integer type the file used
/// (dictionary-encoded ones decoded). An unsigned id beyond Int64 is an
/// error, not a null.
pub fn normalise_ids(ids: &ArrayRef) -> Result<ArrayRef> {
    let target = IdKind::of(ids.data_type())
        .ok_or_else(|| HubnormError::Internal(format!("unexpected id type {}", ids.data_type())))?
        .data_type();
    if ids.data_type() == &target {
        Ok(ids.clone())
    } else {
        let strict = arrow::compute::CastOptions {
            safe: false,
            ..Default::default()
        };
        Ok(arrow::compute::cast_with_options(ids, &target, &strict)?)
    }
}

/// Validates an embedding column slice and appends it, converted to f32, to
/// `out`; normalises each appended row when asked.
fn append_embeddings(
    column: &ArrayRef,
    path: &Path,
    first_row: u64,
    name: &str,
    dim: &mut Option<usize>,
    normalize: bool,
    out: &mut Vec<f32>,
) -> Result<()> {
    let err = |row: usize, message: String| {
        HubnormError::input(path, Some(first_row + row as u64), Some(name), message)
    };
    if column.null_count() > 0 {
        let i = (0..column.len())
            .find(|&i| column.is_null(i))
            .expect("a null exists");
        return Err(err(i, "null embedding".into()));
    }
    let start = out.len();
    let values: &ArrayRef = match column.data_type() {
        DataType::FixedSizeList(_, n) => {
            let n = *n as usize;
            if let Some(d) = *dim {
                if d != n {
                    return Err(err(0, format!("embedding has dimension {n}, expected {d}")));
                }
            }
            *dim = Some(n);
            let fsl: &FixedSizeListArray = column.as_fixed_size_list();
            fsl.values()
        }
        DataType::List(_) => {
            return append_list(
                column.as_list::<i32>(),
                path,
                first_row,
                name,
                dim,
                normalize,
                out,
            )
        }
        DataType::LargeList(_) => {
            return append_list(
                column.as_list::<i64>(),
                path,
                first_row,
                name,
                dim,
                normalize,
                out,
            )
        }
        other => return Err(err(0, format!("unsupported embedding type {other}"))),
    };
    let d = dim.expect("set above");
    append_values(values, 0, values.len(), out)
        .map_err(|i| err(i / d.max(1), "null value inside the embedding".into()))?;
    finish_rows(&mut out[start..], d, normalize).map_err(|(row, msg)| err(row, msg))
}

fn append_list<O: OffsetSizeTrait>(
    list: &GenericListArray<O>,
    path: &Path,
    first_row: u64,
    name: &str,
    dim: &mut Option<usize>,
    normalize: bool,
    out: &mut Vec<f32>,
) -> Result<()> {
    let err = |row: usize, message: String| {
        HubnormError::input(path, Some(first_row + row as u64), Some(name), message)
    };
    let offsets = list.value_offsets();
    for i in 0..list.len() {
        let len = (offsets[i + 1] - offsets[i]).as_usize();
        match *dim {
            None if len == 0 || len > MAX_DIMENSION => {
                return Err(err(
                    i,
                    format!("embedding has dimension {len}; supported dimensions are 1 to {MAX_DIMENSION}"),
                ));
            }
            None => *dim = Some(len),
            Some(d) if d != len => {
                return Err(err(
                    i,
                    format!("ragged embedding: {len} values, expected {d}"),
                ));
            }
            _ => {}
        }
    }
    let d = dim.unwrap_or(0);
    let start = out.len();
    let (lo, hi) = (offsets[0].as_usize(), offsets[list.len()].as_usize());
    append_values(list.values(), lo, hi, out)
        .map_err(|i| err(i / d.max(1), "null value inside the embedding".into()))?;
    finish_rows(&mut out[start..], d, normalize).map_err(|(row, msg)| err(row, msg))
}

/// Appends `values[lo..hi]` as f32. On a null value, returns its index relative to `lo`.
fn append_values(
    values: &ArrayRef,
    lo: usize,
    hi: usize,
    out: &mut Vec<f32>,
) -> std::result::Result<(), usize> {
    if values.null_count() > 0 {
        if let Some(i) = (lo..hi).find(|&i| values.is_null(i)) {
            return Err(i - lo);
        }
    }
    match values.data_type() {
        DataType::Float32 => {
            out.extend_from_slice(&values.as_primitive::<Float32Type>().values()[lo..hi])
        }
        DataType::Float64 => out.extend(
            values.as_primitive::<Float64Type>().values()[lo..hi]
                .iter()
                .map(|&v| v as f32),
        ),
        DataType::Float16 => out.extend(
            values.as_primitive::<Float16Type>().values()[lo..hi]
                .iter()
                .map(|v| v.to_f32()),
        ),
        other => unreachable!("element type {other} was checked when the table was opened"),
    }
    Ok(())
}

/// The largest row norm read with `--no-normalize`: the inner product of
/// two such rows, and every partial sum of it, stays within f32's range
/// (2^124 of its 2^128).
const MAX_RAW_NORM: f64 = (1u64 << 62) as f64;

/// Checks that every value is finite and, when asked, L2-normalises each row
/// (norm accumulated in f64); without, checks that no row's norm can make
/// an inner product overflow. Errors carry the row within `rows`.
fn finish_rows(
    rows: &mut [f32],
    dim: usize,
    normalize: bool,
) -> std::result::Result<(), (usize, String)> {
    if dim == 0 {
        return Ok(());
    }
    for (r, row) in rows.chunks_exact_mut(dim).enumerate() {
        if !row.iter().all(|v| v.is_finite()) {
            let j = row
                .iter()
                .position(|v| !v.is_finite())
                .expect("non-finite exists");
            return Err((
                r,
                format!("value {} at position {j} is not finite (as f32)", row[j]),
            ));
        }
        let norm = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        if !normalize {
            if norm > MAX_RAW_NORM {
                return Err((
                    r,
                    format!(
                        "norm {norm:e} is too large for f32 inner products with --no-normalize \
                         (at most 2^62 ≈ {MAX_RAW_NORM:e}); scale the embeddings down"
                    ),
                ));
            }
            continue;
        }
        if norm == 0.0 {
            return Err((
                r,
                "zero vector cannot be L2-normalised (use --no-normalize for raw dot products)"
                    .into(),
            ));
        }
        let inv = 1.0 / norm;
        if inv <= f32::MAX as f64 {
            let inv = inv as f32;
            row.iter_mut().for_each(|v| *v *= inv);
        } else {
            // A norm below 1/f32::MAX (subnormal values): 1/norm is no f32.
            row.iter_mut().for_each(|v| *v = (*v as f64 * inv) as f32);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_any_finite_norm_normalise_to_unit_rows() {
        // Subnormal values: 1/norm is beyond f32's range.
        for scale in [1.0f32, 1e-30, 1e-40, 1e-44, 1e30] {
            let mut rows: Vec<f32> = [3.0f32, 4.0, 0.0].iter().map(|v| v * scale).collect();
            finish_rows(&mut rows, 3, true).unwrap();
            let norm = rows
                .iter()
                .map(|&v| v as f64 * v as f64)
                .sum::<f64>()
                .sqrt();
            assert!((norm - 1.0).abs() < 1e-6, "scale {scale}: {rows:?}");
        }
        let mut zero = vec![0.0f32; 3];
        assert_eq!(finish_rows(&mut zero, 3, true).unwrap_err().0, 0);
    }

    #[test]
    fn raw_rows_whose_inner_products_could_overflow_are_refused() {
        let mut rows = vec![1.0f32, 2.0, 4e18, 4e18];
        let (row, message) = finish_rows(&mut rows, 2, false).unwrap_err();
        assert_eq!(row, 1);
        assert!(message.contains("--no-normalize"), "{message}");
        let mut fine = vec![1.0f32, 2.0, 3e18, 3e18];
        finish_rows(&mut fine, 2, false).unwrap();
        assert_eq!(fine, [1.0, 2.0, 3e18, 3e18]);
    }
}
