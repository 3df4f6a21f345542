//! Embedding tables: Parquet files, directories of parts, or globs, read in
//! record batches into contiguous row-major f32 blocks, validated on the way.
//!
//! Accepted layouts: an id column of strings or integers, plain or
//! dictionary-encoded (ids come out as Utf8 or Int64), and an embedding column that is a
//! FixedSizeList, List or LargeList of Float16, Float32 or Float64. Every
//! problem is reported with the file, the row within that file and the column.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::DataType;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;

use crate::error::{HubnormError, Result};
use crate::options::ReadOptions;

mod blocks;
mod files;
mod footer;
pub mod memory;
mod parts;

pub(crate) use blocks::CheckedBatches;
pub use blocks::{normalise_ids, BlockReader};
pub use files::{expand_spec, expand_spec_identified, resolve_spec, ResolvedSpec};
#[cfg(feature = "cloud")]
pub(crate) use files::{
    is_unasked_hidden, refuse_empty_file, refuse_files_of_delta_table, DELTA_LOG_DIR,
    SKIPPED_HIDDEN,
};
pub use parts::{PartRecord, TablePart};

/// The kind of ids a table has, after normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum IdKind {
    Int64,
    Utf8,
}

impl IdKind {
    pub fn data_type(self) -> DataType {
        match self {
            IdKind::Int64 => DataType::Int64,
            IdKind::Utf8 => DataType::Utf8,
        }
    }

    /// The kind a column of `data_type` normalises to, if it can hold ids.
    /// Dictionary-encoded columns (a pandas categorical, written to Parquet
    /// by pyarrow, reads back as one) count as their values' type.
    pub(crate) fn of(data_type: &DataType) -> Option<IdKind> {
        match data_type {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(IdKind::Utf8),
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => Some(IdKind::Int64),
            DataType::Dictionary(_, values) => IdKind::of(values),
            _ => None,
        }
    }
}

/// The id column types hubnorm reads, as messages list them.
pub const ACCEPTED_ID_TYPES: &str = "strings (Utf8, LargeUtf8, Utf8View) or integers (Int8 to Int64, UInt8 to UInt64 below 2^63), plain or dictionary-encoded";

/// An embedding table: its parts, dimension and column layout. Opening reads
/// only the footers (and, for List embeddings, one row to learn the dimension).
#[derive(Debug, Clone)]
pub struct EmbeddingTable {
    /// What this table is to the job ("gallery", "queries", "bank", ...), for messages.
    pub role: String,
    /// The path, directory or glob the user gave.
    pub spec: String,
    pub parts: Vec<TablePart>,
    pub dim: usize,
    pub rows: u64,
    pub id_kind: IdKind,
    /// Whether the table has the ground-truth column (queries only).
    pub has_targets: bool,
    /// The version read, when the table is a Delta table.
    pub delta_version: Option<u64>,
    options: ReadOptions,
    /// The rows kept by [`EmbeddingTable::sampled`] (all when `None`).
    sample: Option<Arc<RowSample>>,
    /// Held while a table with parts in an object store lives, so that
    /// memory plans count the ranged reads' windows.
    _remote: Option<Arc<crate::storage::RemoteTable>>,
}

/// A subset of a table's rows, as a bitset over the file rows.
#[derive(Debug, Clone)]
struct RowSample {
    words: Vec<u64>,
}

impl RowSample {
    fn contains(&self, row: u64) -> bool {
        self.words[(row / 64) as usize] >> (row % 64) & 1 == 1
    }
}

/// A block of consecutive rows of a table.
#[derive(Debug, Clone)]
pub struct EmbeddingBlock {
    /// Global row index of the first row.
    pub first_row: u64,
    pub rows: usize,
    pub dim: usize,
    /// Row-major `rows × dim` embeddings (normalised when the options say so).
    pub data: Vec<f32>,
    /// The ids, as Utf8 or Int64.
    pub ids: ArrayRef,
    /// The ground-truth column as read (scalar or list of ids), when requested.
    pub targets: Option<ArrayRef>,
}

impl EmbeddingBlock {
    /// A view of the embeddings as an `rows × dim` matrix.
    pub fn view(&self) -> ndarray::ArrayView2<'_, f32> {
        ndarray::ArrayView2::from_shape((self.rows, self.dim), &self.data).expect("block shape")
    }
}

/// Column positions of one part, checked against the expected layout.
#[derive(Debug, Clone, Copy)]
struct Columns {
    id: usize,
    embedding: usize,
    target: Option<usize>,
}

impl EmbeddingTable {
    /// Opens a table and checks its schema. `want_targets` reads the
    /// ground-truth column when the table has it.
    pub fn open(role: &str, spec: &str, options: &ReadOptions, want_targets: bool) -> Result<Self> {
        let ResolvedSpec {
            files,
            delta_version,
        } = resolve_spec(spec)?;
        let mut parts = Vec::with_capacity(files.len());
        let mut rows = 0u64;
        let mut id_kind = None;
        let mut dim = None;
        let mut has_targets = None;
        for path in files {
            let (schema, part_rows) = part_schema(&path)?;
            let columns = locate_columns(&path, &schema, options, want_targets)?;
            let kind = IdKind::of(schema.field(columns.id).data_type())
                .expect("checked by locate_columns");
            if let Some(previous) = id_kind {
                if previous != kind {
                    return Err(HubnormError::input(
                        &path,
                        None,
                        Some(&options.id_column),
                        format!("id type {kind:?} differs from {previous:?} in the other parts of the {role}"),
                    ));
                }
            }
            id_kind = Some(kind);
            if let Some(previous) = has_targets {
                if previous != columns.target.is_some() {
                    return Err(HubnormError::input(
                        &path,
                        None,
                        Some(&options.target_column),
                        "only some parts of the table have this column",
                    ));
                }
            }
            has_targets = Some(columns.target.is_some());
            if let DataType::FixedSizeList(_, n) = schema.field(columns.embedding).data_type() {
                check_dim(&path, 0, &options.embedding_column, *n as usize, &mut dim)?;
            }
            parts.push(TablePart {
                path,
                rows: part_rows,
                first_row: rows,
            });
            rows += part_rows;
        }
        if rows == 0 {
            return Err(HubnormError::input(
                &parts[0].path,
                None,
                None,
                format!(
                    "the {role} table is empty (0 rows in {} file(s))",
                    parts.len()
                ),
            ));
        }
        let mut table = EmbeddingTable {
            role: role.to_owned(),
            spec: spec.to_owned(),
            parts,
            dim: dim.unwrap_or(0),
            rows,
            id_kind: id_kind.expect("at least one part"),
            has_targets: has_targets.unwrap_or(false),
            delta_version,
            options: options.clone(),
            sample: None,
            _remote: crate::storage::is_remote(Path::new(spec))
                .then(crate::storage::RemoteTable::new),
        };
        if dim.is_none() {
            table.dim = table.peek_list_dimension()?;
        }
        Ok(table)
    }

    /// The same table, read in record batches of `batch_rows` rows.
    pub fn with_batch_rows(&self, batch_rows: usize) -> EmbeddingTable {
        let mut table = self.clone();
        table.options.batch_rows = batch_rows.max(1);
        table
    }

    /// A seeded uniform sample of `rows` rows of the table, read in file
    /// order (the whole table when it has no more rows). Every row is still
    /// read and validated; rows of the sample are numbered 0.. in file order.
    pub fn sampled(&self, rows: u64, seed: u64) -> Result<EmbeddingTable> {
        self.sample_rows(rows, seed, false)
    }

    /// The rows [`EmbeddingTable::sampled`] leaves out with the same `rows`
    /// and `seed`: the two are a seeded split of the table.
    pub fn sampled_complement(&self, rows: u64, seed: u64) -> Result<EmbeddingTable> {
        self.sample_rows(rows, seed, true)
    }

    fn sample_rows(&self, rows: u64, seed: u64, complement: bool) -> Result<EmbeddingTable> {
        if complement && (rows == 0 || rows >= self.rows || self.sample.is_some()) {
            return Err(HubnormError::Usage(format!(
                "cannot split {} rows of the {} ({} rows) from the rest",
                rows, self.role, self.rows
            )));
        }
        if rows == 0 {
            return Err(HubnormError::Usage(format!(
                "--bank-sample must be at least 1 (the {} has {} rows)",
                self.role, self.rows
            )));
        }
        if rows >= self.rows || self.sample.is_some() {
            return Ok(self.clone());
        }
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let total = usize::try_from(self.rows).map_err(|_| {
            HubnormError::Usage(format!("the {} is too large to sample", self.role))
        })?;
        let mut words = vec![0u64; total.div_ceil(64)];
        for i in rand::seq::index::sample(&mut rng, total, rows as usize) {
            words[i / 64] |= 1 << (i % 64);
        }
        let mut kept = rows;
        if complement {
            for (w, word) in words.iter_mut().enumerate() {
                let valid = (total - w * 64).min(64);
                let mask = if valid == 64 {
                    u64::MAX
                } else {
                    (1u64 << valid) - 1
                };
                *word = !*word & mask;
            }
            kept = self.rows - rows;
        }
        let mut table = self.clone();
        table.rows = kept;
        table.sample = Some(Arc::new(RowSample { words }));
        Ok(table)
    }

    /// The read options this table was opened with.
    pub fn options(&self) -> &ReadOptions {
        &self.options
    }

    /// The part holding global row `row`, and the row's index within it.
    pub fn locate(&self, row: u64) -> (&Path, u64) {
        let i = self.parts.partition_point(|p| p.first_row + p.rows <= row);
        let part = &self.parts[i.min(self.parts.len() - 1)];
        (&part.path, row - part.first_row)
    }

    /// An input error about global row `row`.
    pub fn row_error(&self, row: u64, column: &str, message: impl Into<String>) -> HubnormError {
        let (path, local) = self.locate(row);
        HubnormError::input(path, Some(local), Some(column), message)
    }

    /// Refuses `rows` (a cluster task's shard) unless the table has them:
    /// it changed after the job was planned.
    pub fn check_shard(&self, rows: &Range<u64>) -> Result<()> {
        if rows.start <= rows.end && rows.end <= self.rows {
            return Ok(());
        }
        Err(HubnormError::input(
            &self.spec,
            None,
            None,
            format!(
                "the {} has {} rows, but this shard is rows {}..{}: it changed after the job was planned",
                self.role, self.rows, rows.start, rows.end
            ),
        ))
    }

    /// Reads blocks of at most `block_rows` rows, in table order.
    pub fn blocks(&self, block_rows: usize) -> BlockReader<'_> {
        BlockReader::new(self, block_rows.max(1), false)
    }

    /// Whether the table is a sample of its file's rows (read from its first
    /// row only).
    pub fn is_sampled(&self) -> bool {
        self.sample.is_some()
    }

    /// Reads blocks of at most `block_rows` rows from global row `start`
    /// on (a resumed pass). Row groups before `start` in its part are
    /// skipped, not read; the rest of the rows before it are decoded and
    /// dropped. Not for sampled tables (their rows are picked as read).
    pub fn blocks_from(&self, block_rows: usize, start: u64) -> Result<BlockReader<'_>> {
        if self.is_sampled() && start > 0 {
            return Err(HubnormError::Internal(
                "a sampled table is always read from its first row".into(),
            ));
        }
        let mut reader = BlockReader::new(self, block_rows.max(1), false);
        if start >= self.rows {
            reader.next_part = self.parts.len();
        } else if start > 0 {
            let part = self
                .parts
                .partition_point(|p| p.first_row + p.rows <= start);
            reader.next_part = part;
            reader.skip_in_next_part = start - self.parts[part].first_row;
        }
        reader.next_global_row = start;
        Ok(reader)
    }

    /// Reads blocks of at most `block_rows` rows of global rows `rows` (a
    /// shard of the table), as [`EmbeddingTable::blocks_from`] reads from
    /// its start; the last block ends at the range's end.
    pub fn blocks_in(&self, block_rows: usize, rows: Range<u64>) -> Result<BlockReader<'_>> {
        let mut reader = self.blocks_from(block_rows, rows.start)?;
        reader.end_row = rows.end;
        Ok(reader)
    }

    /// The embeddings of rows `rows` (ascending, distinct), row after row,
    /// decoded alone (the other rows are skipped, not decoded); `None` for a
    /// sampled table or one with an in-memory part. An error names the file
    /// but not the row: to report it, read the rows in blocks.
    pub fn read_rows(&self, rows: &[u64]) -> Result<Option<Vec<f32>>> {
        blocks::read_selected_rows(self, rows)
    }

    /// Reads only the id column of the whole table (no embedding is decoded).
    pub fn read_all_ids(&self) -> Result<ArrayRef> {
        let mut reader = BlockReader::new(self, self.options.batch_rows.max(1), true);
        let mut pieces = Vec::new();
        while let Some(block) = reader.next_block()? {
            pieces.push(block.ids);
        }
        let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
        Ok(arrow::compute::concat(&refs)?)
    }

    fn peek_list_dimension(&self) -> Result<usize> {
        let mut reader = BlockReader::new(self, 1, false);
        reader.peek_dimension = true;
        let block = reader.next_block()?;
        Ok(block.map_or(0, |b| b.dim))
    }
}

/// The largest embedding dimension accepted. Real models stay far below it;
/// a larger value is almost surely a mislabelled column, and would make
/// single rows too big for the block planner's minimum block.
pub const MAX_DIMENSION: usize = 65_536;

fn check_dim(
    path: &Path,
    row: u64,
    column: &str,
    found: usize,
    dim: &mut Option<usize>,
) -> Result<()> {
    if found == 0 || found > MAX_DIMENSION {
        return Err(HubnormError::input(
            path,
            Some(row),
            Some(column),
            format!(
                "embedding has dimension {found}; supported dimensions are 1 to {MAX_DIMENSION}"
            ),
        ));
    }
    match *dim {
        Some(d) if d != found => Err(HubnormError::input(
            path,
            Some(row),
            Some(column),
            format!("embedding has dimension {found}, but earlier rows have {d}"),
        )),
        _ => {
            *dim = Some(found);
            Ok(())
        }
    }
}

/// A Parquet file being read: a local file (read as before, through the
/// parquet crate's file reader), or an object read by ranges
/// ([`crate::storage::RemoteFile`]).
#[derive(Debug)]
pub enum InputFile {
    Local(File),
    Remote(crate::storage::RemoteFile),
}

/// A reader from an offset of an [`InputFile`].
pub enum InputRead {
    Local(std::io::BufReader<File>),
    Remote(crate::storage::RemoteRead),
}

impl std::io::Read for InputRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            InputRead::Local(r) => r.read(buf),
            InputRead::Remote(r) => r.read(buf),
        }
    }
}

impl parquet::file::reader::Length for InputFile {
    fn len(&self) -> u64 {
        match self {
            InputFile::Local(f) => f.len(),
            InputFile::Remote(r) => r.len(),
        }
    }
}

impl parquet::file::reader::ChunkReader for InputFile {
    type T = InputRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<InputRead> {
        Ok(match self {
            InputFile::Local(f) => InputRead::Local(f.get_read(start)?),
            InputFile::Remote(r) => InputRead::Remote(r.get_read(start)?),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        match self {
            InputFile::Local(f) => f.get_bytes(start, length),
            InputFile::Remote(r) => r.get_bytes(start, length),
        }
    }
}

impl InputFile {
    /// The object, when this is one (to ask it how its requests went).
    pub fn remote(&self) -> Option<&crate::storage::RemoteFile> {
        match self {
            InputFile::Local(_) => None,
            InputFile::Remote(r) => Some(r),
        }
    }
}

/// The Arrow schema and row count of one part: a Parquet file's footer,
/// or an in-memory table's.
fn part_schema(path: &Path) -> Result<(arrow::datatypes::SchemaRef, u64)> {
    if memory::is_memory(path) {
        let table = memory::lookup(path)?;
        return Ok((table.schema.clone(), table.rows));
    }
    let builder = open_parquet(path)?;
    let rows = builder.metadata().file_metadata().num_rows() as u64;
    Ok((builder.schema().clone(), rows))
}

/// Whether `path` holds a Parquet file or a Delta table (an output hubnorm
/// wrote in either format).
pub fn holds_table(path: &Path) -> Result<bool> {
    if crate::storage::is_file(path)? {
        return Ok(true);
    }
    #[cfg(feature = "delta")]
    if crate::delta::is_table(&path.to_string_lossy()) {
        return Ok(true);
    }
    Ok(false)
}

/// How many Parquet files the table at `path` holds: 1 for a file, the
/// files of its latest version for a Delta table, 0 when there is none.
pub fn table_files(path: &Path) -> Result<usize> {
    if crate::storage::is_file(path)? {
        return Ok(1);
    }
    #[cfg(feature = "delta")]
    if crate::delta::is_table(&path.to_string_lossy()) {
        return Ok(resolve_spec(&path.to_string_lossy())?.files.len());
    }
    Ok(0)
}

/// The one Parquet file of the Delta table at `path` (hubnorm's own
/// one-file outputs, e.g. a stats file written with `--format delta`).
fn single_file_of_table(path: &Path) -> Result<PathBuf> {
    let spec = path.to_string_lossy();
    let files = match resolve_spec(&spec) {
        Ok(resolved) if resolved.delta_version.is_some() => resolved.files,
        _ => {
            return Err(HubnormError::input(
                path,
                None,
                None,
                "is a folder, not a Parquet file",
            ))
        }
    };
    match <[PathBuf; 1]>::try_from(files) {
        Ok([file]) => Ok(file),
        Err(files) => Err(HubnormError::input(
            path,
            None,
            None,
            format!(
                "is a Delta table of {} files, read here as one file (write it with --overwrite, not --append)",
                files.len()
            ),
        )),
    }
}

/// Opens a Parquet file (or object) for reading. A missing or unreadable
/// file is bad input (exit code 2), naming the file. A Delta table of one
/// file opens as that file.
pub(crate) fn open_parquet(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<InputFile>> {
    Ok(open_parquet_probed(path)?.0)
}

/// [`open_parquet`], with the object it reads (when remote), whose failed
/// requests tell a lost store from damaged data.
pub(crate) fn open_parquet_probed(
    path: &Path,
) -> Result<(
    ParquetRecordBatchReaderBuilder<InputFile>,
    Option<crate::storage::RemoteFile>,
)> {
    let input = match crate::storage::locate(path)? {
        crate::storage::Location::Local(local) if local.is_dir() => {
            return open_parquet_probed(&single_file_of_table(path)?);
        }
        crate::storage::Location::Local(local) => {
            InputFile::Local(File::open(&local).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    HubnormError::input(path, None, None, "no such file")
                }
                _ => HubnormError::io(path, e),
            })?)
        }
        crate::storage::Location::Remote(url) => match crate::storage::RemoteFile::open(&url) {
            Ok(file) => InputFile::Remote(file),
            // A prefix: a Delta table written by hubnorm (a stats file)?
            Err(e) => match single_file_of_table(path) {
                Ok(file) => return open_parquet_probed(&file),
                Err(_) => return Err(e),
            },
        },
    };
    let unreadable = |why: String, input: &InputFile| {
        // A failed request is the store's failure, not bad data.
        if let Some(failure) = input.remote().and_then(|r| r.failure()) {
            return HubnormError::Storage {
                url: path.display().to_string(),
                message: failure,
                exit_code: 1,
            };
        }
        HubnormError::input(
            path,
            None,
            None,
            format!("not a readable Parquet file: {why}"),
        )
    };
    // The footer first, without the embedded Arrow schema, so that values
    // the parquet crate would panic on are refused before it sees them.
    let options = ArrowReaderOptions::new();
    let footer = ArrowReaderMetadata::load(&input, options.clone().with_skip_arrow_metadata(true))
        .map_err(|e| unreadable(e.to_string(), &input))?;
    footer::check(footer.metadata()).map_err(|e| unreadable(e, &input))?;
    let metadata = ArrowReaderMetadata::try_new(footer.metadata().clone(), options)
        .map_err(|e| unreadable(e.to_string(), &input))?;
    if let Some(remote) = input.remote() {
        // Ranged reads stop at column-chunk ends (checked by footer::check).
        let chunks = metadata
            .metadata()
            .row_groups()
            .iter()
            .flat_map(|g| g.columns())
            .map(|c| {
                let (start, length) = c.byte_range();
                start..start.saturating_add(length)
            })
            .collect();
        remote.set_chunks(chunks);
    }
    let probe = input.remote().cloned();
    Ok((
        ParquetRecordBatchReaderBuilder::new_with_metadata(input, metadata),
        probe,
    ))
}

/// A decoding error of `path`, or the store's failure when a request of
/// `probe` failed (the decoder only saw missing bytes).
pub(crate) fn decode_error(
    path: &Path,
    row: Option<u64>,
    message: String,
    probe: Option<&crate::storage::RemoteFile>,
) -> HubnormError {
    match probe.and_then(|p| p.failure()) {
        Some(failure) => HubnormError::Storage {
            url: path.display().to_string(),
            message: failure,
            exit_code: 1,
        },
        None => HubnormError::input(path, row, None, message),
    }
}

fn locate_columns(
    path: &Path,
    schema: &arrow::datatypes::Schema,
    options: &ReadOptions,
    want_targets: bool,
) -> Result<Columns> {
    let find = |name: &str| -> Result<usize> {
        schema.index_of(name).map_err(|_| {
            let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            HubnormError::input(
                path,
                None,
                Some(name),
                format!("missing column (the file has: {})", names.join(", ")),
            )
        })
    };
    let id = find(&options.id_column)?;
    if IdKind::of(schema.field(id).data_type()).is_none() {
        return Err(HubnormError::input(
            path,
            None,
            Some(&options.id_column),
            format!(
                "id column has type {}; expected {ACCEPTED_ID_TYPES}",
                schema.field(id).data_type()
            ),
        ));
    }
    let embedding = find(&options.embedding_column)?;
    let element = match schema.field(embedding).data_type() {
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => {
            Some(f.data_type().clone())
        }
        _ => None,
    };
    if !matches!(
        element,
        Some(DataType::Float16 | DataType::Float32 | DataType::Float64)
    ) {
        return Err(HubnormError::input(
            path,
            None,
            Some(&options.embedding_column),
            format!(
                "embedding column has type {}; expected FixedSizeList or List of Float16, Float32 or Float64",
                schema.field(embedding).data_type()
            ),
        ));
    }
    let target = match want_targets {
        true if options.target_column_named => Some(find(&options.target_column)?),
        true => schema.index_of(&options.target_column).ok(),
        false => None,
    };
    if let Some(t) = target {
        let ok = match schema.field(t).data_type() {
            DataType::List(f) | DataType::LargeList(f) => IdKind::of(f.data_type()).is_some(),
            other => IdKind::of(other).is_some(),
        };
        if !ok {
            return Err(HubnormError::input(
                path,
                None,
                Some(&options.target_column),
                format!(
                    "ground-truth column has type {}; expected an id or a list of ids",
                    schema.field(t).data_type()
                ),
            ));
        }
    }
    Ok(Columns {
        id,
        embedding,
        target,
    })
}
