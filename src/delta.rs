//! Delta Lake tables (feature `delta`), in and out, through delta-rs.
//!
//! **In:** any table PATH may name a Delta table: a folder or an
//! object-store prefix holding `_delta_log/`, read at its latest version,
//! or at `PATH@VERSION` or `PATH@TIMESTAMP` (RFC 3339; the last version
//! committed at or before it). The table's log lists the Parquet files of
//! that version; hubnorm reads them as the parts of the table, in path
//! order, as it reads a folder of parts, and records the version read in its
//! outputs (`hubnorm.ROLE.delta_version`). Tables whose files need more than
//! the Parquet (deletion vectors, column mapping) are refused by name.
//!
//! **Out:** with `--format delta`, each tabular output is written as a
//! Parquet file of its own (as always, by [`crate::sink`]) and then
//! committed to the Delta table at the output's path: the file is placed in
//! the table's folder and one commit of the log adds it (and, when
//! overwriting, removes the files of the version it replaces). A write that
//! stops before the commit leaves an unreferenced file and no visible row.
//! Types Delta lacks are written as the nearest Delta type (unsigned
//! integers as the next wider signed one, fixed-size lists as lists).
//!
//! **Log:** [`changes`] reads the commits between two versions, which
//! `stats --update` uses to tell new files from rewritten ones.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use deltalake_core::kernel::transaction::CommitBuilder;
use deltalake_core::kernel::{Action, Add, MetadataExt, Remove, StructType};
use deltalake_core::logstore::{LogStore, LogStoreFactory, ObjectStoreRef, StorageConfig};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use url::Url;

use crate::error::{HubnormError, Result};
use crate::sink::{DeltaMode, DeltaOutput};
use crate::source::DELTA_LOG_DIR as LOG_DIR;

/// The commit-info key holding the resume tag of the checkpointed job that
/// wrote a commit ([`DeltaOutput::resume_tag`]).
const RESUME_TAG_KEY: &str = "hubnorm.checkpoint";

/// Which version of a Delta table to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum At {
    Latest,
    Version(u64),
    /// RFC 3339: the last version committed at or before this time.
    Timestamp(String),
}

/// A table PATH that names a Delta table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaSpec {
    /// The table's folder or prefix, as given (without the `@...`).
    pub root: String,
    pub at: At,
}

/// The Parquet files of one version of a Delta table.
#[derive(Debug, Clone)]
pub struct DeltaFiles {
    pub files: Vec<PathBuf>,
    pub version: u64,
}

/// Whether `path` is a Delta table: a folder or prefix with a `_delta_log/`.
pub fn is_table(path: &str) -> bool {
    if path.contains(['*', '?', '[']) {
        return false;
    }
    let log = Path::new(path).join(LOG_DIR);
    crate::storage::is_dir(&log).unwrap_or(false)
}

/// The Delta table `spec` names, with the version asked for (`PATH@N`,
/// `PATH@TIMESTAMP`), or `None` when it names no Delta table.
pub fn parse_spec(spec: &str) -> Option<DeltaSpec> {
    if is_table(spec) {
        return Some(DeltaSpec {
            root: spec.to_owned(),
            at: At::Latest,
        });
    }
    let (root, suffix) = spec.rsplit_once('@')?;
    let at = if !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) {
        At::Version(suffix.parse().ok()?)
    } else if chrono_like(suffix) {
        At::Timestamp(suffix.to_owned())
    } else {
        return None;
    };
    is_table(root).then(|| DeltaSpec {
        root: root.to_owned(),
        at,
    })
}

/// `spec` at `version` when it names a Delta table at its latest version
/// (`PATH@VERSION`); as given otherwise (a version named already, or no
/// table).
pub fn at_version(spec: &str, version: &str) -> String {
    match parse_spec(spec) {
        Some(DeltaSpec { at: At::Latest, .. }) => format!("{spec}@{version}"),
        _ => spec.to_owned(),
    }
}

/// Whether `text` looks like an RFC 3339 time (checked for real when the
/// table is loaded).
fn chrono_like(text: &str) -> bool {
    text.len() >= 10 && text.as_bytes()[4] == b'-' && text[..4].bytes().all(|b| b.is_ascii_digit())
}

/// The Parquet files of the version of the table `spec` asks for, sorted by
/// path. Refuses tables whose rows are not just their files' rows.
pub fn files(spec: &DeltaSpec) -> Result<DeltaFiles> {
    let found = checked_files(&load(spec)?, spec)?;
    if found.files.is_empty() {
        return Err(HubnormError::input(
            shown(spec, found.version),
            None,
            None,
            "the Delta table holds no file at this version",
        ));
    }
    Ok(found)
}

/// The files of a loaded table (none for an emptied table, which SQL reads
/// as zero rows), checked as [`files`] says.
fn checked_files(table: &DeltaTable, spec: &DeltaSpec) -> Result<DeltaFiles> {
    let state = table.snapshot().map_err(|e| error(&spec.root, e))?;
    let version = state.version();
    let shown = shown(spec, version);
    if let Some(mode) = state
        .metadata()
        .configuration()
        .get("delta.columnMapping.mode")
        .filter(|m| m.as_str() != "none")
    {
        return Err(HubnormError::input(
            &shown,
            None,
            None,
            format!("the Delta table uses column mapping (mode {mode}), which hubnorm does not read; rewrite it without column mapping"),
        ));
    }
    let mut files = Vec::new();
    for file in state.log_data().iter() {
        if file.deletion_vector_descriptor().is_some() {
            return Err(HubnormError::input(
                &shown,
                None,
                None,
                format!(
                    "file {} has deleted rows (a deletion vector), which hubnorm does not read; run OPTIMIZE (or REORG ... APPLY (PURGE)) on the table first",
                    file.path()
                ),
            ));
        }
        files.push(file_path(table, &file.object_store_path()));
    }
    files.sort();
    Ok(DeltaFiles { files, version })
}

/// The table `spec` names as a DataFusion table (delta-rs's provider, which
/// reads partition columns and follows the table's schema), for `hubnorm sql`.
pub fn table_provider(spec: &DeltaSpec) -> Result<Arc<dyn datafusion::catalog::TableProvider>> {
    let table = load(spec)?;
    // The same checks as every other input.
    checked_files(&table, spec)?;
    let root = spec.root.clone();
    crate::storage::block_on_io(async move { table.table_provider().await })?.map_err(|e| {
        HubnormError::input(
            &root,
            None,
            None,
            format!("Delta table: {}", crate::storage::redact(&e.to_string())),
        )
    })
}

/// `root@version`, as messages show a table at a version.
fn shown(spec: &DeltaSpec, version: u64) -> String {
    format!("{}@{version}", spec.root)
}

/// A data file of `table` as hubnorm opens it: a local path, or a URL.
fn file_path(table: &DeltaTable, location: &deltalake_core::Path) -> PathBuf {
    let uri = table.log_store().to_uri(location);
    match Url::parse(&uri) {
        Ok(url) if url.scheme() == "file" => url.to_file_path().unwrap_or_else(|_| uri.into()),
        _ => PathBuf::from(uri),
    }
}

/// What one commit did to a table's files.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub version: u64,
    /// The operation the writer recorded (WRITE, DELETE, OPTIMIZE, ...).
    pub operation: String,
    /// Files added, with whether they carry new rows (`dataChange`); a
    /// compaction's files carry none.
    pub added: Vec<(PathBuf, bool)>,
    /// Files removed, with `dataChange` (false for a compaction).
    pub removed: Vec<(PathBuf, bool)>,
}

/// The commits after version `from` up to `to`, in order, read from the
/// table's log.
pub fn changes(root: &str, from: u64, to: u64) -> Result<Vec<Change>> {
    let spec = DeltaSpec {
        root: root.to_owned(),
        at: At::Version(to),
    };
    let table = load(&spec)?;
    let mut out = Vec::new();
    for version in from + 1..=to {
        let actions = commit_actions(&table, root, version)?.ok_or_else(|| {
            HubnormError::input(
                root,
                None,
                None,
                format!("the log no longer holds version {version} (removed by log retention)"),
            )
        })?;
        let mut change = Change {
            version,
            ..Change::default()
        };
        for action in actions {
            match action {
                Action::Add(add) => change.added.push((
                    file_path(&table, &deltalake_core::Path::from(add.path.as_str())),
                    add.data_change,
                )),
                Action::Remove(remove) => change.removed.push((
                    file_path(&table, &deltalake_core::Path::from(remove.path.as_str())),
                    remove.data_change,
                )),
                Action::CommitInfo(info) => {
                    change.operation = info.operation.unwrap_or_default();
                }
                _ => {}
            }
        }
        out.push(change);
    }
    Ok(out)
}

/// The actions of commit `version` of `table` (at `root`), or `None` when
/// the log no longer holds it.
fn commit_actions(table: &DeltaTable, root: &str, version: u64) -> Result<Option<Vec<Action>>> {
    let store = table.log_store();
    let bytes = crate::storage::block_on_io(async move { store.read_commit_entry(version).await })?
        .map_err(|e| error(root, e))?;
    bytes
        .map(|bytes| deltalake_core::logstore::get_actions(version, &bytes))
        .transpose()
        .map_err(|e| error(root, e))
}

/// The version of the table at `root` committed with the resume tag `tag`
/// (by a job that was stopped and is now resumed), if any. The tag begins
/// with its time in Unix milliseconds (see `checkpoint::new_resume_tag`).
fn committed_with(root: &str, tag: &str) -> Result<Option<u64>> {
    if !is_table(root) {
        return Ok(None);
    }
    let since = tag
        .split('-')
        .next()
        .and_then(|t| t.parse::<i64>().ok())
        .unwrap_or(0);
    recent_commit(root, since, |actions| {
        actions.iter().any(|a| match a {
            Action::CommitInfo(info) => {
                info.info.get(RESUME_TAG_KEY).and_then(|v| v.as_str()) == Some(tag)
            }
            _ => false,
        })
    })
}

/// The newest version of the table at `root` whose actions satisfy
/// `wanted`, among the commits from the newest back to those made before
/// `since_ms` (Unix milliseconds, with ten minutes' room for other
/// writers' clocks).
fn recent_commit(
    root: &str,
    since_ms: i64,
    wanted: impl Fn(&[Action]) -> bool,
) -> Result<Option<u64>> {
    const CLOCK_SKEW_MS: i64 = 10 * 60 * 1000;
    if !has_commits(root)? {
        return Ok(None);
    }
    let table = load(&DeltaSpec {
        root: root.to_owned(),
        at: At::Latest,
    })?;
    let latest = table.version().unwrap_or(0) as u64;
    for version in (0..=latest).rev() {
        let Some(actions) = commit_actions(&table, root, version)? else {
            break;
        };
        if wanted(&actions) {
            return Ok(Some(version));
        }
        let made = actions.iter().find_map(|a| match a {
            Action::CommitInfo(info) => info.timestamp,
            _ => None,
        });
        if made.is_some_and(|t| t < since_ms - CLOCK_SKEW_MS) {
            break;
        }
    }
    Ok(None)
}

/// Loads the table `spec` names at the version it asks for.
fn load(spec: &DeltaSpec) -> Result<DeltaTable> {
    let builder = builder(&spec.root)?;
    let mut asked_time = None;
    let builder = match &spec.at {
        At::Latest => builder,
        At::Version(v) => builder.with_version(*v),
        At::Timestamp(t) => {
            let time = chrono::DateTime::parse_from_rfc3339(t).map_err(|e| {
                HubnormError::Usage(format!(
                    "{}@{t}: not a time (RFC 3339, e.g. 2026-11-27T08:00:00Z): {e}",
                    spec.root
                ))
            })?;
            asked_time = Some((t, time));
            builder.with_timestamp(time.to_utc())
        }
    };
    let table = crate::storage::block_on_io(builder.load())?.map_err(|e| match &spec.at {
        At::Version(v) => {
            let message = match latest_version(&spec.root) {
                Some(latest) if *v > latest => {
                    format!("the Delta table has no version {v}: its latest is {latest}")
                }
                _ => format!(
                    "cannot read version {v} of the Delta table: {}",
                    crate::storage::redact(&e.to_string())
                ),
            };
            HubnormError::input(&spec.root, None, None, message)
        }
        _ => error(&spec.root, e),
    })?;
    if let Some((text, time)) = asked_time {
        check_committed_by(&table, &spec.root, text, time.timestamp_millis())?;
    }
    Ok(table)
}

/// Whether the log of the table at `root` holds a commit.
fn has_commits(root: &str) -> Result<bool> {
    let table = builder(root)?.build().map_err(|e| error(root, e))?;
    crate::storage::block_on_io(async move { table.verify_deltatable_existence().await })?
        .map_err(|e| error(root, e))
}

/// The latest version of the table at `root`, if it can be read.
fn latest_version(root: &str) -> Option<u64> {
    let table = crate::storage::block_on_io(builder(root).ok()?.load())
        .ok()?
        .ok()?;
    table.version()
}

/// Refuses a table loaded for `PATH@TIME` (`time`, at `asked_ms`) whose
/// version was committed after that time: delta-rs gives the first version
/// when none is older, which would read rows that did not exist then.
fn check_committed_by(table: &DeltaTable, root: &str, time: &str, asked_ms: i64) -> Result<()> {
    let Some(version) = table.version() else {
        return Ok(());
    };
    let committed = table
        .snapshot()
        .ok()
        .and_then(|state| state.version_timestamp(version));
    match committed {
        Some(ms) if ms > asked_ms => {
            let when = chrono::DateTime::from_timestamp_millis(ms)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .unwrap_or_else(|| format!("{ms} ms after 1970"));
            Err(HubnormError::input(
                root,
                None,
                None,
                format!(
                    "the Delta table has no version committed at or before {time}: \
                     its first, version {version}, was committed at {when}"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// A delta-rs builder of the table at `root`, on hubnorm's own object store
/// (with its `--storage-option`s) when `root` is a URL.
fn builder(root: &str) -> Result<DeltaTableBuilder> {
    let url = table_url(root)?;
    let mut builder = DeltaTableBuilder::from_url(url.clone()).map_err(|e| error(root, e))?;
    if crate::storage::is_remote(Path::new(root)) {
        register_log_stores();
        builder = builder.with_storage_backend(crate::storage::store_for_url(&url)?, url);
    }
    Ok(builder)
}

/// The URL delta-rs opens the table at `root` by (a folder's `file://` URL).
fn table_url(root: &str) -> Result<Url> {
    match crate::storage::locate(Path::new(root))? {
        crate::storage::Location::Local(path) => {
            let absolute = std::path::absolute(&path).map_err(|e| HubnormError::io(&path, e))?;
            Url::from_directory_path(&absolute).map_err(|()| {
                HubnormError::Usage(format!("{}: not a usable folder path", path.display()))
            })
        }
        crate::storage::Location::Remote(_) => {
            let text = format!("{}/", root.trim_end_matches('/'));
            Url::parse(&text).map_err(|e| HubnormError::Usage(format!("{root}: {e}")))
        }
    }
}

/// delta-rs's log stores for the object stores hubnorm builds itself (its
/// own factories ship in further crates, with their own clients). delta-rs
/// keys them by `scheme://`, which http(s) cannot be: Delta tables over
/// plain HTTP are not read.
fn register_log_stores() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        let registry = deltalake_core::logstore::logstore_factories();
        for scheme in ["s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure"] {
            let key = Url::parse(&format!("{scheme}://")).expect("a scheme URL");
            if !registry.contains_key(&key) {
                registry.insert(key, Arc::new(PlainLogStores));
            }
        }
    });
}

/// Log stores that commit with the store's conditional put (create if
/// absent), which S3, GCS and Azure all offer.
struct PlainLogStores;

impl LogStoreFactory for PlainLogStores {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> deltalake_core::DeltaResult<Arc<dyn LogStore>> {
        Ok(deltalake_core::logstore::default_logstore(
            prefixed_store,
            root_store,
            location,
            options,
        ))
    }
}

fn error(root: &str, e: DeltaTableError) -> HubnormError {
    match e {
        DeltaTableError::NotATable(_) | DeltaTableError::InvalidTableLocation(_) => {
            HubnormError::input(root, None, None, "not a Delta table")
        }
        other => HubnormError::input(
            root,
            None,
            None,
            format!(
                "Delta table: {}",
                crate::storage::redact(&other.to_string())
            ),
        ),
    }
}

/// A commit to the table at `root` that failed: its store could not take
/// the write (a full disk, a lost connection, a conflicting writer), which
/// is not bad input.
fn write_error(root: &str, e: DeltaTableError) -> HubnormError {
    HubnormError::Storage {
        url: root.to_owned(),
        message: format!(
            "the Delta commit failed: {}",
            crate::storage::redact(&e.to_string())
        ),
        exit_code: 1,
    }
}

// ------------------------------------------------------------------ writing

/// The schema an output has in a Delta table: the types Delta lacks
/// replaced by the nearest it has (unsigned integers by the next wider
/// signed type, fixed-size lists by lists).
pub fn output_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(delta_type(f.data_type())))
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Delta has no unsigned integers and no fixed-size lists: unsigned
/// integers widen to the next signed type (u64 to i64, checked when cast),
/// fixed-size lists become lists.
fn delta_type(data_type: &DataType) -> DataType {
    match data_type {
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 | DataType::UInt64 => DataType::Int64,
        DataType::FixedSizeList(item, _) | DataType::List(item) | DataType::LargeList(item) => {
            DataType::List(Arc::new(
                item.as_ref()
                    .clone()
                    .with_data_type(delta_type(item.data_type())),
            ))
        }
        other => other.clone(),
    }
}

/// `batch` with the columns of `schema` (from [`output_schema`]).
pub fn to_output(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch.clone());
    }
    let options = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| arrow::compute::cast_with_options(c, f.data_type(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Refuses to start an output at `path` that `output` cannot write: an
/// existing table without `--overwrite`/`--append` (unless the stopped run
/// that a resumed one continues created it), or something that is not a
/// Delta table. Returns whether the stopped job whose resume tag `output`
/// carries already committed these rows to the table (the resumed job then
/// commits nothing: no other writer can add its tag meanwhile).
pub fn check_output(path: &Path, output: &DeltaOutput) -> Result<bool> {
    let text = path.to_string_lossy();
    if is_table(&text) {
        let resumed = match &output.resume_tag {
            Some(tag) => committed_with(text.trim_end_matches('/'), tag)?.is_some(),
            None => false,
        };
        if output.mode == DeltaMode::Create && !resumed {
            return Err(HubnormError::Usage(format!(
                "{} is already a Delta table (pass --overwrite to write a new version with only these rows, or --append to add them; in a SQL COPY, the option 'mode' 'overwrite' or 'append')",
                path.display()
            )));
        }
        if !resumed {
            // Before the work, not only at its commit.
            let root = text.trim_end_matches('/');
            let table = load(&DeltaSpec {
                root: root.to_owned(),
                at: At::Latest,
            })?;
            let state = table.snapshot().map_err(|e| error(root, e))?;
            refuse_unkept_layout(root, state.metadata())?;
            refuse_overwrite_of_append_only(root, state.metadata(), output.mode)?;
        }
        return Ok(resumed);
    }
    // An empty folder is no one's data (a failed first commit removes the
    // folder it made, but a user may have made one).
    let occupied = if crate::storage::is_dir(path)? {
        !is_empty_dir(path)
    } else {
        crate::storage::exists(path)?
    };
    if occupied {
        return Err(HubnormError::Usage(format!(
            "{} exists and is not a Delta table; remove it or choose another path for a --format delta output",
            path.display()
        )));
    }
    Ok(false)
}

fn is_empty_dir(path: &Path) -> bool {
    crate::storage::list_dir(path).is_ok_and(|l| l.is_empty())
}

/// Commits the finished Parquet file `finished` as the rows of a new version
/// of the Delta table at `table` (created when absent): the file moves into
/// the table's folder, then one log commit adds it (and removes the previous
/// files when overwriting), with `output`'s resume tag. Returns the version
/// written.
pub fn commit_file(finished: &Path, table: &Path, output: &DeltaOutput) -> Result<u64> {
    let root = table.to_string_lossy().trim_end_matches('/').to_owned();
    let (schema, rows) = parquet_schema_and_rows(finished)?;
    let name = format!("part-00000-{}-c000.zstd.parquet", random_uuid());
    let data_path = Path::new(&root).join(&name);
    let size = std::fs::metadata(finished)
        .map_err(|e| HubnormError::io(finished, e))?
        .len();
    // The table's folder, when this commit makes it (removed again if the
    // commit fails, so that a retry does not meet a folder that is no table).
    let mut made_dir = None;
    match crate::storage::locate(&data_path)? {
        crate::storage::Location::Local(local) => {
            let dir = Path::new(&root);
            if !dir.exists() {
                made_dir = Some(dir);
            }
            std::fs::create_dir_all(dir).map_err(|e| HubnormError::io(dir, e))?;
            std::fs::rename(finished, &local).map_err(|e| HubnormError::io(&local, e))?;
        }
        crate::storage::Location::Remote(url) => crate::storage::upload(finished, &url)?,
    }
    let add = Add {
        path: name.clone(),
        partition_values: HashMap::new(),
        size: size as i64,
        modification_time: now_ms(),
        data_change: true,
        stats: Some(format!("{{\"numRecords\":{rows}}}")),
        ..Default::default()
    };
    let started = now_ms();
    let committed = crate::sink::injected_fault("delta-commit", table)
        .and_then(|()| commit_add(&root, add, &schema, output))
        .and_then(|version| {
            crate::sink::injected_fault("delta-after-commit", table).map(|()| version)
        });
    let Err(failure) = committed else {
        return committed;
    };
    // A commit can fail after its log entry landed (in the steps that follow
    // it: the new snapshot, a checkpoint): the file is then the table's.
    match recent_commit(&root, started, |actions| adds_file(actions, &name)) {
        Ok(Some(version)) => Ok(version),
        Ok(None) => {
            // Never referenced by the log: remove it (a leftover would be invisible).
            let _ = crate::storage::remove_file(&data_path);
            if let Some(dir) = made_dir {
                remove_uncommitted_log(dir);
                let _ = std::fs::remove_dir(dir);
            }
            Err(failure)
        }
        // Unknown whether the log names it: the file stays.
        Err(_) => Err(failure),
    }
}

/// Whether `actions` add the data file `name`.
fn adds_file(actions: &[Action], name: &str) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::Add(add) if add.path == name))
}

/// Removes the `_delta_log/` that a failed first commit began in the local
/// folder `table`, which this process made (under the output's lock), so
/// that the path is free again rather than a table without versions; a log
/// holding a commit (another writer's table) stays.
fn remove_uncommitted_log(table: &Path) {
    let log = table.join(LOG_DIR);
    let Ok(entries) = std::fs::read_dir(&log) else {
        return;
    };
    // Commits and checkpoints are named by their 20-digit version.
    let committed = entries.filter_map(|e| e.ok()).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.len() > 20 && name.as_bytes()[..20].iter().all(u8::is_ascii_digit)
    });
    if !committed {
        let _ = std::fs::remove_dir_all(&log);
    }
}

fn commit_add(root: &str, add: Add, schema: &SchemaRef, output: &DeltaOutput) -> Result<u64> {
    let mode = output.mode;
    let app_metadata: HashMap<String, serde_json::Value> = output
        .resume_tag
        .iter()
        .map(|tag| (RESUME_TAG_KEY.to_owned(), tag.as_str().into()))
        .collect();
    let delta_schema: StructType = {
        use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
        schema
            .as_ref()
            .try_into_kernel()
            .map_err(|e| HubnormError::Internal(format!("no Delta schema for the output: {e}")))?
    };
    let mut table = builder(root)?.build().map_err(|e| error(root, e))?;
    let exists = crate::storage::block_on_io(async move {
        let found = table.verify_deltatable_existence().await?;
        if found {
            table.load().await?;
        }
        Ok::<_, DeltaTableError>((table, found))
    })?
    .map_err(|e| error(root, e));
    let (table, exists) = exists?;
    if !exists {
        let create = CreateBuilder::new()
            .with_log_store(table.log_store())
            .with_columns(delta_schema.fields().cloned())
            .with_actions([Action::Add(add)])
            .with_save_mode(SaveMode::ErrorIfExists)
            .with_commit_properties(
                // No retry: a retried creation would land as the next
                // version of a table another writer created meanwhile.
                deltalake_core::kernel::transaction::CommitProperties::default()
                    .with_metadata(app_metadata)
                    .with_max_retries(0),
            );
        let created = crate::storage::block_on_io(create.into_future())?.map_err(|e| {
            if has_commits(root).unwrap_or(false) {
                HubnormError::Usage(format!(
                    "{root} was made a Delta table by another writer while this one was writing; nothing was added to it (pass --append or --overwrite to write into it; in a SQL COPY, the option 'mode' 'append' or 'overwrite')"
                ))
            } else {
                write_error(root, e)
            }
        })?;
        return Ok(created.version().unwrap_or(0) as u64);
    }
    let state = table.snapshot().map_err(|e| error(root, e))?;
    refuse_unkept_layout(root, state.metadata())?;
    refuse_overwrite_of_append_only(root, state.metadata(), mode)?;
    let mut actions = Vec::new();
    let same_schema = state.schema().as_ref() == &delta_schema;
    let appendable = fits_columns(&delta_schema, state.schema().as_ref());
    match mode {
        DeltaMode::Create => {
            return Err(HubnormError::Usage(format!(
                "{root} is already a Delta table (pass --overwrite or --append; in a SQL COPY, the option 'mode' 'overwrite' or 'append')"
            )))
        }
        DeltaMode::Append if !appendable => {
            return Err(HubnormError::Usage(format!(
                "{root}: these rows' columns differ from the Delta table's, so they cannot be appended (pass --overwrite to replace the table's rows and columns)"
            )))
        }
        DeltaMode::Append => {}
        DeltaMode::Overwrite => {
            if !same_schema {
                let metadata = state
                    .metadata()
                    .clone()
                    .with_schema(&delta_schema)
                    .map_err(|e| error(root, e.into()))?;
                actions.push(Action::Metadata(metadata));
            }
            let deleted = now_ms();
            for file in state.log_data().iter() {
                actions.push(Action::Remove(Remove {
                    path: file.path().into_owned(),
                    data_change: true,
                    deletion_timestamp: Some(deleted),
                    extended_file_metadata: Some(true),
                    partition_values: Some(file.partition_values_map()),
                    size: Some(file.size()),
                    ..Default::default()
                }));
            }
        }
    }
    actions.push(Action::Add(add));
    let operation = DeltaOperation::Write {
        mode: match mode {
            DeltaMode::Append => SaveMode::Append,
            _ => SaveMode::Overwrite,
        },
        partition_by: None,
        predicate: None,
    };
    let log_store = table.log_store();
    let commit = async move {
        let state = table.snapshot()?;
        CommitBuilder::default()
            .with_actions(actions)
            .with_app_metadata(app_metadata)
            .build(Some(state), log_store, operation)
            .await
            .map(|done| done.version())
    };
    let version = crate::storage::block_on_io(commit)?.map_err(|e| write_error(root, e))?;
    Ok(version as u64)
}

/// Refuses to write into a table whose layout hubnorm's one-file commits
/// would not keep: partitioned (the rows would lose their partition
/// values), with mapped column names (the file's columns would not be the
/// table's), or with constraints, generated or identity columns (which
/// hubnorm does not enforce). Such a table's own writer must add the rows.
/// Refuses to overwrite a table whose owner made it append-only
/// (`delta.appendOnly`): delta-rs would refuse the commit after the work,
/// as a failed write.
fn refuse_overwrite_of_append_only(
    root: &str,
    metadata: &deltalake_core::kernel::Metadata,
    mode: DeltaMode,
) -> Result<()> {
    let append_only = metadata
        .configuration()
        .get("delta.appendOnly")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if append_only && mode == DeltaMode::Overwrite {
        return Err(HubnormError::Usage(format!(
            "{root} is append-only (delta.appendOnly = true): hubnorm can add rows to it (--append) but not replace them"
        )));
    }
    Ok(())
}

fn refuse_unkept_layout(root: &str, metadata: &deltalake_core::kernel::Metadata) -> Result<()> {
    let mut reasons = Vec::new();
    let partitions = metadata.partition_columns();
    if !partitions.is_empty() {
        reasons.push(format!("it is partitioned by {}", partitions.join(", ")));
    }
    let config = metadata.configuration();
    if let Some(mode) = config
        .get("delta.columnMapping.mode")
        .filter(|m| !m.eq_ignore_ascii_case("none"))
    {
        reasons.push(format!(
            "its columns are mapped (delta.columnMapping.mode = {mode})"
        ));
    }
    let mut constraints: Vec<&str> = config
        .keys()
        .filter_map(|k| k.strip_prefix("delta.constraints."))
        .collect();
    constraints.sort_unstable();
    if !constraints.is_empty() {
        reasons.push(format!(
            "it has CHECK constraints ({})",
            constraints.join(", ")
        ));
    }
    if let Ok(schema) = metadata.parse_schema() {
        let computed: Vec<&str> = schema
            .fields()
            .filter(|f| {
                f.metadata()
                    .keys()
                    .any(|k| k == "delta.generationExpression" || k.starts_with("delta.identity."))
            })
            .map(|f| f.name().as_str())
            .collect();
        if !computed.is_empty() {
            reasons.push(format!(
                "its columns {} are generated or identity columns",
                computed.join(", ")
            ));
        }
    }
    if reasons.is_empty() {
        return Ok(());
    }
    Err(HubnormError::Usage(format!(
        "{root}: hubnorm writes plain Delta tables and cannot write into this one: {}; write the rows to a new table, or add them with the table's own writer",
        reasons.join("; ")
    )))
}

/// Whether rows of schema `rows` can be appended to a table of schema
/// `table`: the same columns in the same order, of the same types, none
/// that may be null where the table's may not (non-null rows go into
/// columns that allow nulls, as every Delta writer lets them).
fn fits_columns(rows: &StructType, table: &StructType) -> bool {
    use deltalake_core::kernel::DataType as T;
    fn fits_type(rows: &T, table: &T) -> bool {
        match (rows, table) {
            (T::Array(r), T::Array(t)) => {
                (t.contains_null() || !r.contains_null())
                    && fits_type(r.element_type(), t.element_type())
            }
            (T::Map(r), T::Map(t)) => {
                (t.value_contains_null() || !r.value_contains_null())
                    && fits_type(r.key_type(), t.key_type())
                    && fits_type(r.value_type(), t.value_type())
            }
            (T::Struct(r), T::Struct(t)) => fits_columns(r, t),
            _ => rows == table,
        }
    }
    rows.fields().len() == table.fields().len()
        && rows.fields().zip(table.fields()).all(|(r, t)| {
            r.name() == t.name()
                && (t.is_nullable() || !r.is_nullable())
                && fits_type(r.data_type(), t.data_type())
        })
}

/// The Arrow schema and row count of a finished Parquet file.
fn parquet_schema_and_rows(path: &Path) -> Result<(SchemaRef, i64)> {
    let file = std::fs::File::open(path).map_err(|e| HubnormError::io(path, e))?;
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| HubnormError::parquet(path, e))?;
    let rows = builder.metadata().file_metadata().num_rows();
    Ok((builder.schema().clone(), rows))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A random (version 4) UUID, as Delta writers name their files.
fn random_uuid() -> String {
    let bits: u128 = rand::random::<u128>() & !(0xf000u128 << 64) & !(0xc000u128 << 48)
        | (0x4000u128 << 64)
        | (0x8000u128 << 48);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4() {
        let id = random_uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4", "{id}");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(random_uuid(), id);
    }

    #[test]
    fn delta_types_replace_unsigned_and_fixed_lists() {
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        assert_eq!(delta_type(&DataType::UInt32), DataType::Int64);
        assert_eq!(
            delta_type(&DataType::FixedSizeList(item.clone(), 4)),
            DataType::List(item)
        );
        assert_eq!(delta_type(&DataType::Utf8), DataType::Utf8);
    }

    #[test]
    fn version_suffixes_are_read_only_for_delta_tables() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("t");
        std::fs::create_dir_all(root.join(LOG_DIR)).unwrap();
        let root = root.to_string_lossy().into_owned();
        assert_eq!(parse_spec(&root).unwrap().at, At::Latest);
        assert_eq!(parse_spec(&format!("{root}@3")).unwrap().at, At::Version(3));
        assert_eq!(
            parse_spec(&format!("{root}@2026-11-27T08:00:00Z"))
                .unwrap()
                .at,
            At::Timestamp("2026-11-27T08:00:00Z".into())
        );
        assert!(parse_spec(&format!("{root}@x")).is_none());
        let plain = dir.path().join("plain@3");
        assert!(parse_spec(&plain.to_string_lossy()).is_none());
    }
}
