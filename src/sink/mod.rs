//! Parquet outputs, written atomically: to a hidden temporary file beside the
//! destination, renamed into place only when complete, so a failed or
//! interrupted run never leaves a half-written file under the final name.
//!
//! An output in an object store is written the same way to a local
//! temporary file (in the system's temporary folder), and uploaded on
//! commit: in one PUT, or a multipart upload completed at the end and
//! aborted on failure or Ctrl-C, so the object appears under its name only
//! once complete, and the temporary file stays readable until then (`run`
//! reads its statistics back before committing).

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::error::{HubnormError, Result};

mod guards;
#[cfg(feature = "delta")]
pub(crate) use guards::same_place;
pub use guards::{refuse_existing, FolderLock, OutputLock};
pub(crate) use guards::{refuse_output_in_inputs, PreparedOutputDir};

/// How a `--format delta` output meets a Delta table already at its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaMode {
    /// A new table; an existing one is refused.
    Create,
    /// A new version holding only the new rows (`--overwrite`).
    Overwrite,
    /// A new version adding the new rows to the table's (`--append`).
    Append,
}

/// How one output is written as a Delta table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaOutput {
    pub mode: DeltaMode,
    /// The checkpoint of the job writing it ([`tag_delta_outputs`]): each
    /// commit carries the tag, so that a resumed job finds the tables the
    /// stopped one already committed and does not commit them twice.
    pub resume_tag: Option<String>,
}

/// The outputs this process writes as Delta tables (`--format delta`), by
/// final path. Every other Parquet file (checkpoints, spools, scratch
/// files, and outputs when none is declared) is a plain file.
static DELTA_OUTPUTS: std::sync::Mutex<Vec<(PathBuf, DeltaOutput)>> =
    std::sync::Mutex::new(Vec::new());

/// Declares `paths` as outputs to write as Delta tables (feature `delta`):
/// each [`ParquetSink`] and [`AtomicFile`] created for one of them while
/// the returned declaration lives commits its rows to the table at that
/// path as a new version.
pub fn write_as_delta_tables(
    paths: impl IntoIterator<Item = PathBuf>,
    mode: DeltaMode,
) -> Result<DeclaredTables> {
    if !cfg!(feature = "delta") {
        return Err(HubnormError::Usage(
            "--format delta needs a hubnorm built with the cargo feature `delta`".into(),
        ));
    }
    let mut outputs = DELTA_OUTPUTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut declared = Vec::new();
    for path in paths {
        outputs.retain(|(p, _)| *p != path);
        let output = DeltaOutput {
            mode,
            resume_tag: None,
        };
        outputs.push((path.clone(), output));
        declared.push(path);
    }
    Ok(DeclaredTables {
        paths: declared,
        replaces: false,
    })
}

/// Outputs declared as Delta tables ([`write_as_delta_tables`],
/// [`TableFormat::declare`]); when dropped, their paths are plain files
/// again, so that a long-lived process (Python's) declares per call.
#[must_use = "the declaration ends when this is dropped"]
#[derive(Debug, Default)]
pub struct DeclaredTables {
    paths: Vec<PathBuf>,
    replaces: bool,
}

impl DeclaredTables {
    /// Whether existing outputs may be written to: `overwrite`, or a new
    /// version added to a table (`--append`).
    pub fn replaces(&self) -> bool {
        self.replaces
    }

    /// Keeps the declarations for the rest of the process (the command
    /// line's one job) and returns [`DeclaredTables::replaces`].
    pub fn for_process(mut self) -> bool {
        self.paths.clear();
        self.replaces
    }

    /// These declarations and `other`'s, ending together.
    pub fn and(mut self, mut other: DeclaredTables) -> DeclaredTables {
        self.paths.append(&mut other.paths);
        self.replaces |= other.replaces;
        self
    }
}

impl Drop for DeclaredTables {
    fn drop(&mut self) {
        if self.paths.is_empty() {
            return;
        }
        let mut outputs = DELTA_OUTPUTS.lock().unwrap_or_else(|e| e.into_inner());
        outputs.retain(|(p, _)| !self.paths.contains(p));
    }
}

/// How a command writes its tabular outputs (`--format`, `--append`):
/// Parquet files, or Delta tables (feature `delta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TableFormat {
    #[default]
    Parquet,
    /// A new table each, or with `append` a new version adding the rows to
    /// an existing one.
    Delta { append: bool },
}

impl TableFormat {
    /// From `--format parquet|delta` and `--append`.
    pub fn new(format: &str, append: bool) -> Result<Self> {
        match (format, append) {
            ("parquet", false) => Ok(TableFormat::Parquet),
            ("parquet", true) => Err(HubnormError::Usage(
                "--append adds a version to a Delta table: it needs --format delta".into(),
            )),
            ("delta", append) => Ok(TableFormat::Delta { append }),
            (other, _) => Err(HubnormError::Usage(format!(
                "the table format is 'parquet' or 'delta', not '{other}'"
            ))),
        }
    }

    /// Declares `outputs` written in this format (Parquet needs no
    /// declaration), in the mode `overwrite` and `--append` give.
    pub fn declare(self, outputs: Vec<PathBuf>, overwrite: bool) -> Result<DeclaredTables> {
        let append = match self {
            TableFormat::Parquet => {
                return Ok(DeclaredTables {
                    paths: Vec::new(),
                    replaces: overwrite,
                })
            }
            TableFormat::Delta { append } => append,
        };
        let mode = match (append, overwrite) {
            (true, _) => DeltaMode::Append,
            (false, true) => DeltaMode::Overwrite,
            (false, false) => DeltaMode::Create,
        };
        let mut declared = write_as_delta_tables(outputs, mode)?;
        declared.replaces = overwrite || append;
        Ok(declared)
    }
}

/// Marks the Delta outputs at or under `path` as written by the checkpointed
/// job whose checkpoint carries `tag` (see [`DeltaOutput::resume_tag`]).
pub fn tag_delta_outputs(path: &Path, tag: &str) {
    let mut outputs = DELTA_OUTPUTS.lock().unwrap_or_else(|e| e.into_inner());
    for (_, output) in outputs.iter_mut().filter(|(p, _)| p.starts_with(path)) {
        output.resume_tag = Some(tag.to_owned());
    }
}

/// How the output at `destination` is written as a Delta table, if it is one.
pub fn delta_output_of(destination: &Path) -> Option<DeltaOutput> {
    DELTA_OUTPUTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(p, _)| p == destination)
        .map(|(_, output)| output.clone())
}

/// A Delta output being written (only a `delta` build commits one).
#[derive(Debug)]
#[cfg_attr(not(feature = "delta"), allow(dead_code))]
struct DeltaTarget {
    output: DeltaOutput,
    /// The stopped job that this one resumes committed the table already
    /// (found by the resume tag when the output was started).
    committed_before: bool,
}

/// A file that appears under its final name only when [`AtomicFile::commit`]
/// is called; dropped without commit, its temporary file is removed.
#[derive(Debug)]
pub struct AtomicFile {
    temporary: PathBuf,
    destination: PathBuf,
    /// The object the destination names, when it is a URL.
    remote: Option<crate::storage::ObjectUrl>,
    /// Committed as a new version of the Delta table at the destination.
    delta: Option<DeltaTarget>,
    /// Whether the destination may be replaced: without, a file that
    /// appears there while the job runs is kept and the commit refused.
    overwrite: bool,
    committed: bool,
}

impl AtomicFile {
    /// Creates the temporary file for `destination`. Fails when the
    /// destination exists and `overwrite` is false.
    pub fn create(destination: &Path, overwrite: bool) -> Result<(Self, File)> {
        if let Some(output) = delta_output_of(destination) {
            #[cfg(feature = "delta")]
            let committed_before = crate::delta::check_output(destination, &output)?;
            #[cfg(not(feature = "delta"))]
            let committed_before = false;
            // The table's folder may exist: the file is written beside it.
            let (mut file, handle) = Self::create_plain(destination, true)?;
            file.delta = Some(DeltaTarget {
                output,
                committed_before,
            });
            return Ok((file, handle));
        }
        Self::create_plain(destination, overwrite)
    }

    /// A temporary file beside a local destination, or in the system's
    /// temporary folder for an object (spooled, then uploaded).
    fn create_plain(destination: &Path, overwrite: bool) -> Result<(Self, File)> {
        refuse_existing(destination, overwrite)?;
        let file_name = |path: &Path| {
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let (dir, name, destination, remote) = match crate::storage::locate(destination)? {
            crate::storage::Location::Remote(url) => {
                // One temporary file per destination URL and process: the
                // name carries a hash of the URL, so equal file names in two
                // buckets differ.
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                url.to_string().hash(&mut hasher);
                let name = format!(
                    "hubnorm-{:016x}-{}",
                    hasher.finish(),
                    file_name(destination)
                );
                (
                    std::env::temp_dir(),
                    name,
                    destination.to_path_buf(),
                    Some(url),
                )
            }
            crate::storage::Location::Local(local) => {
                let dir = local
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."))
                    .to_path_buf();
                create_output_dir(&dir)?;
                (dir, file_name(&local), local, None)
            }
        };
        remove_stale_temporaries(&dir, &name);
        let temporary = dir.join(format!(".{name}{TEMPORARY_INFIX}{}", std::process::id()));
        let file = File::create(&temporary).map_err(|e| HubnormError::io(&temporary, e))?;
        Ok((
            AtomicFile {
                temporary,
                destination,
                remote,
                delta: None,
                overwrite,
                committed: false,
            },
            file,
        ))
    }

    /// Flushes the finished file to disk and moves it to its destination, so
    /// that after a crash the final name holds either the old file or the
    /// whole new one.
    pub fn commit(mut self) -> Result<PathBuf> {
        if let Some(target) = self.delta.take() {
            injected_fault("sink-commit", &self.destination)?;
            // Else the table holds these rows already (the file is dropped).
            #[cfg(feature = "delta")]
            if !target.committed_before {
                crate::delta::commit_file(&self.temporary, &self.destination, &target.output)?;
            }
            #[cfg(not(feature = "delta"))]
            let _ = target;
            self.committed = true;
            let _ = std::fs::remove_file(&self.temporary);
            return Ok(self.destination.clone());
        }
        if let Some(url) = &self.remote {
            crate::storage::upload(&self.temporary, url)?;
            self.committed = true;
            let _ = std::fs::remove_file(&self.temporary);
            return Ok(self.destination.clone());
        }
        File::open(&self.temporary)
            .and_then(|f| f.sync_all())
            .map_err(|e| HubnormError::io(&self.temporary, e))?;
        injected_fault("sink-commit", &self.destination)?;
        let renamed = if self.overwrite {
            std::fs::rename(&self.temporary, &self.destination)
        } else {
            rename_no_replace(&self.temporary, &self.destination)
        };
        renamed.map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => HubnormError::Usage(format!(
                "{} appeared while this job ran (another process wrote it?) and is kept; pass --overwrite to replace it",
                self.destination.display()
            )),
            _ => HubnormError::io(&self.destination, e),
        })?;
        self.committed = true;
        // Make the rename itself durable (best effort: not every platform
        // can open a directory).
        if let Some(dir) = self
            .destination
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
        {
            if let Ok(dir) = File::open(dir) {
                let _ = dir.sync_all();
            }
        }
        Ok(self.destination.clone())
    }

    /// Commits under another final name (in the same folder or bucket).
    pub fn commit_as(mut self, destination: &Path) -> Result<PathBuf> {
        (self.destination, self.remote) = match crate::storage::locate(destination)? {
            crate::storage::Location::Remote(url) => (destination.to_path_buf(), Some(url)),
            // A file:// URL is renamed to as its path.
            crate::storage::Location::Local(path) => (path, None),
        };
        self.commit()
    }

    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// Where the file is until it is committed (to read it back before then).
    pub fn temporary_path(&self) -> &Path {
        &self.temporary
    }
}

/// Temporary files are named `.<final name>.tmp-<process id>`.
const TEMPORARY_INFIX: &str = ".tmp-";
/// While several outputs are committed together, each one they replace is
/// kept as `.<final name>.prev-<process id>` (a second link to it).
const PREVIOUS_INFIX: &str = ".prev-";

/// Commits `files` in order. When a commit fails, the outputs already
/// renamed are put back as they were (the previous file restored, or the
/// new one removed where there was none), so a failing disk or a
/// permission change leaves either every new output or every previous one.
/// (A SIGKILL in between can still leave a mix, which the run fingerprint
/// in each output tells apart.) Object-store outputs are uploaded in turn
/// without this undo (the error names those uploaded), and a Delta table
/// keeps the version it committed (a resumed run finds it by its resume tag
/// and does not commit it again).
pub fn commit_together(files: Vec<AtomicFile>) -> Result<()> {
    // (final name, the link keeping the file it replaced)
    let mut committed: Vec<(PathBuf, Option<PathBuf>)> = Vec::new();
    let mut uploaded: Vec<PathBuf> = Vec::new();
    let mut result = Ok(());
    for file in files {
        let destination = file.destination().to_path_buf();
        let remote = file.remote.is_some();
        let previous = if file.remote.is_none() && destination.is_file() {
            let link = previous_link(&destination);
            let _ = std::fs::remove_file(&link);
            match std::fs::hard_link(&destination, &link) {
                Ok(()) => Some(link),
                Err(e) => {
                    result = Err(HubnormError::io(&destination, e));
                    break;
                }
            }
        } else {
            None
        };
        match file.commit() {
            Ok(_) if remote => uploaded.push(destination),
            Ok(_) => committed.push((destination, previous)),
            Err(e) => {
                if let Some(link) = previous {
                    let _ = std::fs::remove_file(link);
                }
                result = Err(e);
                break;
            }
        }
    }
    let failed = result.is_err();
    for (destination, previous) in committed.into_iter().rev() {
        match (failed, previous) {
            (true, Some(link)) => {
                let _ = std::fs::rename(&link, &destination);
            }
            (true, None) => {
                let _ = std::fs::remove_file(&destination);
            }
            (false, Some(link)) => {
                let _ = std::fs::remove_file(&link);
            }
            (false, None) => {}
        }
    }
    match result {
        Err(e) if !uploaded.is_empty() => Err(after_partial_upload(e, &uploaded)),
        result => result,
    }
}

/// `e`, the failure of a commit that had uploaded `uploaded`, saying so:
/// those outputs are the new job's, the others the previous ones (or none).
fn after_partial_upload(e: HubnormError, uploaded: &[PathBuf]) -> HubnormError {
    let names: Vec<String> = uploaded.iter().map(|p| p.display().to_string()).collect();
    let note = format!(
        "{} already replaced by this job's (the other outputs are the previous ones, or absent; \
         the run fingerprint in each output tells them apart)",
        names.join(", ")
    );
    match e {
        HubnormError::Interrupted(_) => {
            HubnormError::Interrupted(format!("stopped while the outputs were uploaded: {note}"))
        }
        HubnormError::Input { location, message } => HubnormError::Input {
            location,
            message: format!("{message}; {note}"),
        },
        HubnormError::Usage(message) => HubnormError::Usage(format!("{message}; {note}")),
        HubnormError::Internal(message) => HubnormError::Internal(format!("{message}; {note}")),
        HubnormError::Storage {
            url,
            message,
            exit_code,
        } => HubnormError::Storage {
            url,
            message: format!("{message}; {note}"),
            exit_code,
        },
        other => other,
    }
}

/// Renames `from` to `to` unless `to` exists (then an `AlreadyExists`
/// error): atomically with `renameat2(RENAME_NOREPLACE)` on Linux, else
/// (or where the filesystem lacks it) with a hard link, else by checking
/// first.
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let c_path = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
        };
        let (from_c, to_c) = (c_path(from)?, c_path(to)?);
        // SAFETY: both paths are NUL-terminated strings that outlive the call.
        let done = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from_c.as_ptr(),
                libc::AT_FDCWD,
                to_c.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if done == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if !matches!(
            error.raw_os_error(),
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
        ) {
            return Err(error);
        }
    }
    match std::fs::hard_link(from, to) {
        Ok(()) => {
            let _ = std::fs::remove_file(from);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(e),
        Err(_) if to.exists() => Err(std::io::ErrorKind::AlreadyExists.into()),
        Err(_) => std::fs::rename(from, to),
    }
}

/// The name that keeps `destination`'s previous file while outputs are
/// committed together.
fn previous_link(destination: &Path) -> PathBuf {
    let name = destination
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    destination.with_file_name(format!(".{name}{PREVIOUS_INFIX}{}", std::process::id()))
}

/// Removes the temporary files for `name` in `dir` that a killed run left
/// behind (their process is gone). Linux only: elsewhere they stay, hidden.
fn remove_stale_temporaries(dir: &Path, name: &str) {
    let prefixes = [
        format!(".{name}{TEMPORARY_INFIX}"),
        format!(".{name}{PREVIOUS_INFIX}"),
    ];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| prefixes.iter().find_map(|p| n.strip_prefix(p.as_str())))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        if cfg!(target_os = "linux") && !alive && pid != std::process::id() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Folders this process created for its outputs, deepest first; a failed
/// run removes those left empty, so a refusal leaves no trace.
static CREATED_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Makes the local folder `dir` and the missing ones above it, recorded
/// in [`CREATED_DIRS`].
fn create_output_dir(dir: &Path) -> Result<()> {
    let missing = missing_dirs(dir);
    crate::storage::create_local_dir_all(dir)?;
    CREATED_DIRS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(missing);
    Ok(())
}

/// The folders from `dir` up that do not exist, deepest first.
pub(super) fn missing_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut missing = Vec::new();
    let mut ancestor = Some(dir);
    while let Some(d) = ancestor.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        missing.push(d.to_path_buf());
        ancestor = d.parent();
    }
    missing
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed && self.remote.is_some() {
            let _ = std::fs::remove_file(&self.temporary);
        } else if !self.committed {
            let _ = std::fs::remove_file(&self.temporary);
            let mut dirs = CREATED_DIRS.lock().unwrap_or_else(|e| e.into_inner());
            // Only empty folders go (remove_dir refuses the others).
            dirs.retain(|d| d.exists() && std::fs::remove_dir(d).is_err());
        }
    }
}

/// Bytes a sink buffers, its pending unit and its row group together
/// (counted in the plan's fixed overhead).
pub const WRITER_BUFFER_BYTES: usize = 1 << 20;

/// Writes record batches to a Parquet file atomically, with the run's
/// options recorded in the key-value metadata.
///
/// Rows reach the writer in units of a fixed number of rows, whatever the
/// sizes of the batches the caller hands in: page and row-group boundaries
/// then depend only on the data, so the file's bytes do not change with the
/// block schedule (`--memory-limit`, thread count, a resumed pass).
pub struct ParquetSink {
    file: AtomicFile,
    writer: ArrowWriter<File>,
    schema: SchemaRef,
    /// Rows per unit handed to the writer, fixed by the first row.
    unit_rows: Option<usize>,
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    /// Rows are cast to this schema's types before writing (a Delta
    /// table's, which lack unsigned integers and fixed-size lists).
    #[cfg_attr(not(feature = "delta"), allow(dead_code))]
    cast_to: Option<SchemaRef>,
}

impl ParquetSink {
    /// Opens a sink. `metadata` pairs are stored in the footer (`hubnorm.*` keys).
    pub fn create(
        destination: &Path,
        schema: SchemaRef,
        metadata: Vec<(String, String)>,
        overwrite: bool,
    ) -> Result<Self> {
        let (file, handle) = AtomicFile::create(destination, overwrite)?;
        #[cfg(feature = "delta")]
        let (schema, cast_to) = match &file.delta {
            Some(_) => {
                let delta = crate::delta::output_schema(&schema);
                (delta.clone(), Some(delta))
            }
            None => (schema, None),
        };
        #[cfg(not(feature = "delta"))]
        let cast_to = None;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("valid level"),
            ))
            // Bounded row groups keep the writer's buffer small (memory limit).
            .set_max_row_group_row_count(Some(65_536))
            // Ids and floats are (nearly) unique, so dictionaries only cost
            // time (40% of writing gc's similarity lists); `method` repeats.
            .set_dictionary_enabled(false)
            .set_column_dictionary_enabled(ColumnPath::from("method"), true)
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_key_value_metadata(Some(
                metadata
                    .into_iter()
                    .map(|(k, v)| KeyValue::new(k, v))
                    .collect(),
            ))
            .build();
        let writer = ArrowWriter::try_new(handle, schema.clone(), Some(props))
            .map_err(|e| HubnormError::parquet(file.destination(), e))?;
        Ok(ParquetSink {
            file,
            writer,
            schema,
            unit_rows: None,
            pending: Vec::new(),
            pending_rows: 0,
            cast_to,
        })
    }

    /// Appends `batch`'s rows (any number, including none).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        #[cfg(feature = "delta")]
        if let Some(schema) = &self.cast_to {
            let cast = crate::delta::to_output(batch, schema)?;
            return self.write_rows(&cast);
        }
        self.write_rows(batch)
    }

    fn write_rows(&mut self, batch: &RecordBatch) -> Result<()> {
        let unit = *self
            .unit_rows
            .get_or_insert_with(|| unit_rows_for(&batch.slice(0, 1)));
        let mut offset = 0;
        while offset < batch.num_rows() {
            let take = (unit - self.pending_rows).min(batch.num_rows() - offset);
            self.pending.push(batch.slice(offset, take));
            self.pending_rows += take;
            offset += take;
            if self.pending_rows == unit {
                self.write_pending()?;
            }
        }
        Ok(())
    }

    /// Hands the pending rows to the writer as one batch.
    fn write_pending(&mut self) -> Result<()> {
        if self.pending_rows == 0 {
            return Ok(());
        }
        let unit = arrow::compute::concat_batches(&self.schema, &self.pending)?;
        self.pending.clear();
        self.pending_rows = 0;
        let path = self.file.destination();
        injected_fault("sink-write", path)?;
        self.writer
            .write(&unit)
            .map_err(|e| HubnormError::parquet(path, e))?;
        // Flush row groups early so buffered rows stay bounded: half the
        // buffer here, the other half for the pending unit.
        if self.writer.in_progress_size() > WRITER_BUFFER_BYTES / 2 {
            self.writer
                .flush()
                .map_err(|e| HubnormError::parquet(path, e))?;
        }
        Ok(())
    }

    /// Adds a `key = value` pair to the footer's metadata.
    pub fn append_metadata(&mut self, key: &str, value: String) {
        self.writer
            .append_key_value_metadata(KeyValue::new(key.to_owned(), value));
    }

    /// Writes the footer and renames the file into place.
    pub fn finish(self) -> Result<PathBuf> {
        self.close_uncommitted()?.commit()
    }

    /// Finishes the file under its temporary name, to be committed later with
    /// other outputs of the same run.
    pub fn close_uncommitted(mut self) -> Result<AtomicFile> {
        self.write_pending()?;
        let ParquetSink { file, writer, .. } = self;
        injected_fault("sink-close", file.destination())?;
        writer
            .close()
            .map_err(|e| HubnormError::parquet(file.destination(), e))?;
        Ok(file)
    }
}

/// Rows per unit handed to the writer: about half [`WRITER_BUFFER_BYTES`] of
/// rows the size of `first_row` (the file's first row, the same in every run on
/// the same data), so wide rows (gc's similarity lists) flush early.
fn unit_rows_for(first_row: &RecordBatch) -> usize {
    let row_bytes: usize = first_row
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(64))
        .sum();
    (WRITER_BUFFER_BYTES / 2 / row_bytes.max(1)).clamp(1, 8192)
}

/// Writes a small text file (JSON) atomically.
pub fn write_text_atomically(
    destination: &Path,
    text: &str,
    overwrite: bool,
) -> Result<AtomicFile> {
    use std::io::Write;
    let (file, mut handle) = AtomicFile::create(destination, overwrite)?;
    injected_fault("sink-write", file.destination())?;
    handle
        .write_all(text.as_bytes())
        .and_then(|_| handle.sync_all())
        .map_err(|e| HubnormError::io(file.destination(), e))?;
    Ok(file)
}

/// A test hook of every output: with the feature `failpoints`, the
/// environment's `FAILPOINTS` (the `fail` crate's syntax, e.g.
/// `FAILPOINTS=sink-write=2*off->return(enospc)`) makes a sink's write
/// (`sink-write`), its footer (`sink-close`) or its rename into place
/// (`sink-commit`) fail with the error named: `eio` (the default),
/// `enospc` or `eacces`. Without the feature this is nothing.
pub(crate) fn injected_fault(point: &str, path: &Path) -> Result<()> {
    let _ = (point, path);
    fail::fail_point!(point, |kind: Option<String>| {
        let code = match kind.as_deref() {
            Some("enospc") => libc::ENOSPC,
            Some("eacces") => libc::EACCES,
            _ => libc::EIO,
        };
        Err(HubnormError::io(
            path,
            std::io::Error::from_raw_os_error(code),
        ))
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_declarations_end_with_their_guard_unless_kept_for_the_process() {
        let (scoped, kept) = (
            PathBuf::from("/nowhere/scoped.parquet"),
            PathBuf::from("/nowhere/kept.parquet"),
        );
        let delta = TableFormat::new("delta", false).unwrap();
        if !cfg!(feature = "delta") {
            assert!(delta.declare(vec![scoped], false).is_err());
            return;
        }
        let declared = delta.declare(vec![scoped.clone()], true).unwrap();
        assert!(declared.replaces());
        assert_eq!(
            delta_output_of(&scoped).map(|o| o.mode),
            Some(DeltaMode::Overwrite)
        );
        drop(declared);
        assert_eq!(delta_output_of(&scoped), None);

        let append = TableFormat::new("delta", true).unwrap();
        assert!(append
            .declare(vec![kept.clone()], false)
            .unwrap()
            .for_process());
        assert_eq!(
            delta_output_of(&kept).map(|o| o.mode),
            Some(DeltaMode::Append)
        );
        let parquet = TableFormat::new("parquet", false).unwrap();
        assert!(!parquet
            .declare(vec![scoped.clone()], false)
            .unwrap()
            .replaces());
        assert_eq!(delta_output_of(&scoped), None);
        assert!(TableFormat::new("parquet", true).is_err());
        assert!(TableFormat::new("csv", false).is_err());
    }
}
