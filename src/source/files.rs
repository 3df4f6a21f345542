//! Which Parquet files a table PATH names: a file, a folder of parts
//! (recursively), a glob, an object-store URL (prefix or glob on keys), or
//! the files of one version of a Delta table.
//!
//! A folder or glob that reaches into a Delta table is refused: the table's
//! folder holds the files of every version, so reading them as Parquet
//! would include rows later versions removed. A file of 0 bytes is refused
//! too (an interrupted copy): it is no Parquet file, and a SQL query would
//! otherwise read it as an empty part.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{HubnormError, Result};

use super::memory;

/// The folder of a Delta table's transaction log, under the table's root.
pub(crate) const DELTA_LOG_DIR: &str = "_delta_log";

/// Expands a path, directory or glob into the Parquet files it names, sorted.
/// An object-store URL names an object, a prefix (a directory of parts) or
/// a glob on keys ([`crate::storage`]); its files are URLs too. A Delta
/// table (feature `delta`) names the files of the version asked for
/// ([`crate::delta`]).
pub fn expand_spec(spec: &str) -> Result<Vec<PathBuf>> {
    Ok(resolve_spec(spec)?.files)
}

/// The Parquet files a table PATH names, and the Delta table version they
/// are (when it names a Delta table).
#[derive(Debug, Clone)]
pub struct ResolvedSpec {
    pub files: Vec<PathBuf>,
    pub delta_version: Option<u64>,
}

/// [`expand_spec`], with the Delta table version read.
pub fn resolve_spec(spec: &str) -> Result<ResolvedSpec> {
    #[cfg(feature = "delta")]
    if let Some(table) = crate::delta::parse_spec(spec) {
        let found = crate::delta::files(&table)?;
        return Ok(ResolvedSpec {
            files: found.files,
            delta_version: Some(found.version),
        });
    }
    Ok(ResolvedSpec {
        files: expand_files(spec)?,
        delta_version: None,
    })
}

/// [`expand_spec`] with what tells each file's version from another: a
/// local file's size and time, an object's size, time and ETag from the
/// listing (no request per object). A Delta table's files carry none: a
/// version's files are never rewritten, and another version names others.
pub fn expand_spec_identified(
    spec: &str,
) -> Result<Vec<(PathBuf, Option<crate::storage::Identity>)>> {
    let unidentified = |files: Vec<PathBuf>| files.into_iter().map(|f| (f, None)).collect();
    #[cfg(feature = "delta")]
    if crate::delta::parse_spec(spec).is_some() {
        return Ok(unidentified(expand_spec(spec)?));
    }
    if memory::is_memory(Path::new(spec)) {
        return Ok(unidentified(expand_files(spec)?));
    }
    if crate::storage::is_url(spec) {
        if let crate::storage::Location::Remote(url) = crate::storage::locate(Path::new(spec))? {
            return Ok(crate::storage::expand_remote_identified(&url)?
                .into_iter()
                .map(|(f, identity)| (f, Some(identity)))
                .collect());
        }
    }
    expand_files(spec)?
        .into_iter()
        .map(|f| {
            let identity = crate::storage::read_identity(&f)?;
            Ok((f, Some(identity)))
        })
        .collect()
}

fn expand_files(spec: &str) -> Result<Vec<PathBuf>> {
    if memory::is_memory(Path::new(spec)) {
        memory::lookup(Path::new(spec))?;
        return Ok(vec![PathBuf::from(spec)]);
    }
    if crate::storage::is_url(spec) {
        match crate::storage::locate(Path::new(spec))? {
            crate::storage::Location::Remote(url) => return crate::storage::expand_remote(&url),
            crate::storage::Location::Local(local) => {
                return expand_local(&local.to_string_lossy())
            }
        }
    }
    expand_local(spec)
}

fn expand_local(spec: &str) -> Result<Vec<PathBuf>> {
    let path = Path::new(spec);
    let mut files = Vec::new();
    if path.is_dir() {
        if let Some(table) = local_delta_table_holding(path) {
            return Err(refuse_files_of_delta_table(spec, &table.to_string_lossy()));
        }
        collect_parquet_files(spec, path, &mut files)?;
        if files.is_empty() {
            return Err(HubnormError::input(
                path,
                None,
                None,
                "directory holds no .parquet files",
            ));
        }
    } else if path.is_file() {
        refuse_empty_file(path, file_len(path)?)?;
        files.push(path.to_path_buf());
    } else if spec.contains(['*', '?', '[']) {
        let paths =
            glob::glob(spec).map_err(|e| HubnormError::Usage(format!("bad glob '{spec}': {e}")))?;
        // The glob's literal folder and the pattern below it.
        let first_wildcard = spec.find(['*', '?', '[']).unwrap_or(spec.len());
        let (literal, below) = match spec[..first_wildcard].rfind('/') {
            Some(slash) => (&spec[..slash], &spec[slash + 1..]),
            None => ("", spec),
        };
        // The Delta table holding each folder a match lies in, looked up once.
        let mut tables: HashMap<PathBuf, Option<PathBuf>> = HashMap::new();
        for entry in paths {
            let p = entry.map_err(|e| {
                let path = e.path().to_path_buf();
                HubnormError::io(path, e.into())
            })?;
            let parts = p.strip_prefix(literal).unwrap_or(&p).iter();
            if p.is_file() && !is_unasked_hidden(below, parts.map(|part| part.to_string_lossy())) {
                let folder = p.parent().unwrap_or(Path::new("")).to_path_buf();
                let table = tables
                    .entry(folder)
                    .or_insert_with_key(|folder| local_delta_table_holding(folder));
                if let Some(table) = table {
                    return Err(refuse_files_of_delta_table(spec, &table.to_string_lossy()));
                }
                refuse_empty_file(&p, file_len(&p)?)?;
                files.push(p);
            }
        }
        if files.is_empty() {
            return Err(HubnormError::input(
                spec,
                None,
                None,
                format!("no file matches this glob{SKIPPED_HIDDEN}"),
            ));
        }
    } else {
        // Not there, or not reachable (a folder above it this user may not
        // enter): say which.
        return Err(match std::fs::metadata(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => HubnormError::io(path, e),
            _ => HubnormError::input(spec, None, None, "no such file or directory"),
        });
    }
    files.sort();
    Ok(files)
}

/// Parquet files under `dir`, recursively (Hive-style partitions), skipping
/// hidden and `_`-prefixed entries such as `_SUCCESS`; a Delta table among
/// the folders is refused, naming the `spec` the user gave.
fn collect_parquet_files(spec: &str, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| HubnormError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| HubnormError::io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let p = entry.path();
        if p.is_dir() {
            if is_local_delta_table(&p) {
                return Err(refuse_files_of_delta_table(spec, &p.to_string_lossy()));
            }
            collect_parquet_files(spec, &p, out)?;
        } else if name.ends_with(".parquet") || name.ends_with(".parq") {
            refuse_empty_file(&p, file_len(&p)?)?;
            out.push(p);
        }
    }
    Ok(())
}

/// Said when a glob matched nothing to read: its hidden matches were skipped.
pub(crate) const SKIPPED_HIDDEN: &str =
    " (names starting with `_` or `.` are skipped unless the glob names them, e.g. `_*`)";

/// Whether a glob's match is, or lies in, a marker or hidden entry the glob
/// did not ask for (`_SUCCESS`, `.part-0.crc`, Spark's `_temporary/`):
/// skipped, as a folder's listing skips them (and as Spark's readers do).
/// `below` are the match's parts below the glob's literal folder, `pattern`
/// the glob from there; a pattern part that starts with `_` or `.` (or a
/// class such as `[_.]`) asks for such names.
pub(crate) fn is_unasked_hidden<S: AsRef<str>>(
    pattern: &str,
    below: impl IntoIterator<Item = S>,
) -> bool {
    let hidden = |part: &str| part.starts_with(['_', '.']) && part != "." && part != "..";
    let asks = pattern
        .split('/')
        .any(|part| hidden(part) || part.strip_prefix('[').is_some_and(hidden));
    !asks && below.into_iter().any(|part| hidden(part.as_ref()))
}

/// The error for a folder or glob (`spec`) whose files lie in the Delta
/// table at `table`.
pub(crate) fn refuse_files_of_delta_table(spec: &str, table: &str) -> HubnormError {
    let read_it = if cfg!(feature = "delta") {
        format!("read the table itself: {table} (or {table}@VERSION)")
    } else {
        format!("read the table {table} with a hubnorm built with the cargo feature `delta`")
    };
    HubnormError::input(
        spec,
        None,
        None,
        format!(
            "reaches into the Delta table {table}, whose folder holds the files of every version \
             (read as Parquet files they would include rows later versions removed); {read_it}"
        ),
    )
}

/// Refuses a file of 0 bytes at `path`.
pub(crate) fn refuse_empty_file(path: &Path, len: u64) -> Result<()> {
    if len == 0 {
        return Err(HubnormError::input(
            path,
            None,
            None,
            "is empty (0 bytes), not a Parquet file",
        ));
    }
    Ok(())
}

fn file_len(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .map_err(|e| HubnormError::io(path, e))?
        .len())
}

/// Whether the local folder `dir` is a Delta table (holds `_delta_log/`).
fn is_local_delta_table(dir: &Path) -> bool {
    dir.join(DELTA_LOG_DIR).is_dir()
}

/// The Delta table whose folder is `dir` or holds it, if any: the folders
/// of `dir`'s real path (links and `..` resolved, so a path is judged by
/// where it leads, not by how it is spelt).
fn local_delta_table_holding(dir: &Path) -> Option<PathBuf> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    // Where the real path cannot be had (a folder above it this user may
    // not search), its parents as written.
    let real = std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .ok()?;
    real.ancestors()
        .find(|folder| is_local_delta_table(folder))
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::is_unasked_hidden;

    #[test]
    fn globs_skip_hidden_entries_they_do_not_ask_for() {
        for (pattern, below, skipped) in [
            ("*", &["_SUCCESS"][..], true),
            ("*", &[".part-0.parquet.crc"], true),
            ("*.parquet", &["part-0.parquet"], false),
            ("**/*.parquet", &["_temporary", "0", "part-0.parquet"], true),
            ("*/*.parquet", &["year=2026", "part-1.parquet"], false),
            ("_*", &["_SUCCESS"], false),
            ("[_.]*", &[".hidden.parquet"], false),
            ("x/_temporary/*", &["x", "_temporary", "p.parquet"], false),
            ("*.parquet", &["..", "data", "p.parquet"], false),
        ] {
            assert_eq!(
                is_unasked_hidden(pattern, below.iter().copied()),
                skipped,
                "{pattern} {below:?}"
            );
        }
    }
}
