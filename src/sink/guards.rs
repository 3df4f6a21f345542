//! What keeps a job's outputs apart from the user's data and from other
//! jobs: refusals of existing outputs and of outputs inside an input, the
//! advisory lock on an output, and the output folder prepared before the
//! work starts.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::missing_dirs;
use crate::error::{HubnormError, Result};

/// Refuses an output file at `path` that exists (unless `overwrite`), or
/// that cannot be one: a read-only URL, or one that names no object.
pub fn refuse_existing(path: &Path, overwrite: bool) -> Result<()> {
    if let crate::storage::Location::Remote(url) = crate::storage::locate(path)? {
        url.check_writable()?;
        url.check_names_object()?;
    }
    // A file output where a folder is (a Delta table written by --format
    // delta, or any folder), or named as one: refused now, not after the work.
    if super::delta_output_of(path).is_none() {
        if crate::storage::is_dir(path)? {
            return Err(HubnormError::Usage(format!(
                "{} is a folder (a Delta table, with --format delta?), where the output is a Parquet file",
                path.display()
            )));
        }
        if path.to_string_lossy().ends_with('/') {
            return Err(HubnormError::Usage(format!(
                "{} ends in '/', naming a folder, where the output is a Parquet file: give the file's name (e.g. {}out.parquet)",
                path.display(),
                path.display()
            )));
        }
    }
    if !overwrite && crate::storage::exists(path)? {
        return Err(HubnormError::Usage(format!(
            "{} already exists (pass --overwrite to replace it)",
            path.display()
        )));
    }
    Ok(())
}

/// Refuses an output at `out` that is one of the `inputs` ((role, spec)
/// pairs), lies inside an input directory, or matches an input glob: a later
/// run would read it as another part of that input, and `--overwrite` would
/// replace the user's data.
pub(crate) fn refuse_output_in_inputs(out: &Path, inputs: &[(&str, &str)]) -> Result<()> {
    let out = &crate::storage::local_or_url(out)?;
    let out_abs = absolute(out);
    // An in-memory table is no place an output could be written to.
    let files = inputs
        .iter()
        .filter(|(_, spec)| !spec.is_empty() && !crate::source::memory::is_memory(Path::new(spec)));
    for &(role, spec) in files {
        // A Delta table read at a version or time (`t@3`): its folder (an
        // `@` before a `/`, as in `abfss://container@account/...`, is not one).
        #[cfg(feature = "delta")]
        let table = spec
            .rsplit_once('@')
            .is_some_and(|(_, at)| !at.contains('/'))
            .then(|| crate::delta::parse_spec(spec))
            .flatten();
        #[cfg(feature = "delta")]
        let spec = table.as_ref().map_or(spec, |table| table.root.as_str());
        let local_spec = crate::storage::local_or_url(Path::new(spec))?;
        let spec_path = local_spec.as_path();
        let spec_text = spec_path.to_string_lossy().into_owned();
        let spec = spec_text.as_str();
        let clash = if crate::storage::is_remote(out) || crate::storage::is_remote(spec_path) {
            // URLs compare as text (an alias scheme as the one it stands
            // for): the same object, an object under an input prefix (any
            // URL may name one), or a key the glob matches.
            let out_text = crate::storage::canonical_url_text(&out.to_string_lossy());
            let spec = crate::storage::canonical_url_text(spec);
            let prefix = format!("{}/", spec.trim_end_matches('/'));
            out_text == spec
                || out_text.starts_with(&prefix)
                || (spec.contains(['*', '?', '['])
                    && glob::Pattern::new(&spec)
                        .map(|p| p.matches(&out_text))
                        .unwrap_or(false))
        } else if spec_path.is_dir() {
            out_abs.starts_with(absolute(spec_path))
        } else if spec.contains(['*', '?', '[']) {
            glob::Pattern::new(spec)
                .map(|p| p.matches_path(out) || p.matches_path(&out_abs))
                .unwrap_or(false)
        } else {
            out_abs == absolute(spec_path)
        };
        if clash {
            return Err(HubnormError::Usage(format!(
                "the output {} is inside the {role} input {spec}: a later run would read it as part of the {role}, and --overwrite would replace input data; write it elsewhere",
                out.display()
            )));
        }
    }
    Ok(())
}

/// Whether `a` and `b` name the same file, folder or object (local paths
/// made absolute, URLs compared as text with alias schemes resolved).
#[cfg(feature = "delta")]
pub(crate) fn same_place(a: &Path, b: &Path) -> Result<bool> {
    let (a, b) = (
        crate::storage::local_or_url(a)?,
        crate::storage::local_or_url(b)?,
    );
    Ok(
        if crate::storage::is_remote(&a) || crate::storage::is_remote(&b) {
            let text = |p: &Path| {
                crate::storage::canonical_url_text(p.to_string_lossy().trim_end_matches('/'))
            };
            text(&a) == text(&b)
        } else {
            absolute(&a) == absolute(&b)
        },
    )
}

/// `path` made absolute with symbolic links resolved as far as it exists.
fn absolute(path: &Path) -> PathBuf {
    if let Ok(canonical) = path.canonicalize() {
        return canonical;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            absolute(parent).join(name)
        }
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// An advisory lock on an output (a file or a run's directory, local):
/// while one hubnorm process holds it, another given the same output is
/// refused at start (exit code 2), with the holder named, instead of
/// interleaving its writes. The lock is the kernel's (`flock`) on a hidden
/// file beside the output, `.NAME.hubnorm-lock`: released on any exit, even
/// SIGKILL; the file is removed on a clean release. Outputs in object
/// stores are not locked (no advisory locks there).
#[derive(Debug)]
pub struct OutputLock {
    /// The lock file and its open handle; `None` for a remote output.
    held: Option<(PathBuf, File)>,
}

impl OutputLock {
    /// Takes the lock of the output file `output`, or fails with the
    /// holder's description.
    pub fn acquire(output: &Path) -> Result<OutputLock> {
        OutputLock::acquire_at(output, false)
    }

    /// [`OutputLock::acquire`] for `output`, resolved as a place: its
    /// folder's symbolic links and `..`, and, for a folder output
    /// (`whole`), the path itself (a link to a run folder is that folder;
    /// a link to a file is replaced, not its target).
    fn acquire_at(output: &Path, whole: bool) -> Result<OutputLock> {
        if let crate::storage::Location::Remote(_) = crate::storage::locate(output)? {
            return Ok(OutputLock { held: None });
        }
        let output = crate::storage::local_or_url(output)?;
        let dir = output
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        crate::storage::create_local_dir_all(dir)?;
        // One lock per place, however it is named.
        let place = whole
            .then(|| std::fs::canonicalize(&output).ok())
            .flatten()
            .or_else(|| {
                let name = output.file_name().unwrap_or_default();
                std::fs::canonicalize(dir).ok().map(|d| d.join(name))
            })
            .unwrap_or_else(|| output.clone());
        let name = place
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let dir = place.parent().unwrap_or(dir);
        let path = dir.join(format!(".{name}.hubnorm-lock"));
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| {
                    HubnormError::Usage(format!(
                        "cannot write the output {} (its lock file {}): {e}",
                        output.display(),
                        path.display()
                    ))
                })?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let holder = holder.trim();
                    let this_process = format!("process {},", std::process::id());
                    let writer = if holder.starts_with(&this_process) {
                        // A library caller's other thread (the Python package).
                        "another job of this process".to_owned()
                    } else if holder.is_empty() {
                        "another hubnorm process (its lock is held)".to_owned()
                    } else {
                        format!("another hubnorm process ({holder})")
                    };
                    return Err(HubnormError::Usage(format!(
                        "{} is being written by {writer}; wait for it to finish, or choose \
                         another output",
                        output.display(),
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(HubnormError::io(&path, e)),
            }
            // A holder that finished between our open and our lock removed
            // the file we opened: lock the one that now bears the name.
            if same_file(&file, &path) {
                let mut file = file;
                describe_holder(&mut file).map_err(|e| HubnormError::io(&path, e))?;
                return Ok(OutputLock {
                    held: Some((path, file)),
                });
            }
        }
    }
}

/// The locks of an output folder and of each of the files a job writes in
/// it: a job writing one of those files alone (`stats --out DIR/FILE`)
/// takes that file's lock, and so meets the folder's writer. Made by
/// [`OutputLock::acquire_folder`].
#[derive(Debug)]
pub struct FolderLock {
    files: Vec<OutputLock>,
    /// The folder, when taking the locks made it (removed again if still
    /// empty when the locks go).
    made: Option<PathBuf>,
    folder: OutputLock,
}

impl OutputLock {
    /// The locks of the output folder `dir` and of its files `names`
    /// (none for a folder in an object store, which has no locks).
    pub fn acquire_folder(dir: &Path, names: &[&str]) -> Result<FolderLock> {
        let mut lock = FolderLock {
            files: Vec::new(),
            made: None,
            folder: OutputLock::acquire_at(dir, true)?,
        };
        if lock.folder.held.is_none() {
            return Ok(lock);
        }
        let local = crate::storage::local_or_url(dir)?;
        if !local.exists() {
            crate::storage::create_local_dir_all(&local)?;
            lock.made = Some(local.clone());
        }
        for name in names {
            lock.files.push(OutputLock::acquire(&local.join(name))?);
        }
        Ok(lock)
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        // The files' locks (and lock files) first, then the folder when it
        // is empty, then (as a field) the folder's lock.
        self.files.clear();
        if let Some(dir) = &self.made {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        if let Some((path, file)) = self.held.take() {
            // Removed while still locked, so no other process can lock the
            // old file and believe it holds the output (see `acquire`).
            let _ = std::fs::remove_file(&path);
            drop(file);
        }
    }
}

/// Whether `file` is the file `path` names now.
fn same_file(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        true
    }
}

/// Writes who holds the lock into the lock file, for a refused process to
/// name: the process id and the command line.
fn describe_holder(file: &mut File) -> std::io::Result<()> {
    use std::io::Write;
    let command: Vec<String> = std::env::args().take(2).collect();
    file.set_len(0)?;
    write!(
        file,
        "process {}, `{}`",
        std::process::id(),
        command.join(" ")
    )?;
    file.flush()
}

/// A job's local output folder, made (with the missing folders above it)
/// and checked writable before the work starts, so that a long job cannot
/// fail at its very end for want of permission.
pub(crate) struct PreparedOutputDir {
    /// The folders made, deepest first.
    made: Vec<PathBuf>,
}

impl PreparedOutputDir {
    /// Prepares `dir` (nothing to do on an object store).
    pub(crate) fn prepare(dir: &Path) -> Result<Self> {
        if crate::storage::is_remote(dir) {
            return Ok(PreparedOutputDir { made: Vec::new() });
        }
        let dir = &crate::storage::local_or_url(dir)?;
        let made = missing_dirs(dir);
        crate::storage::create_local_dir_all(dir)?;
        let prepared = PreparedOutputDir { made };
        let probe = dir.join(format!(".hubnorm-probe-{}", std::process::id()));
        if let Err(e) = std::fs::File::create(&probe) {
            prepared.remove_if_empty();
            return Err(HubnormError::Usage(format!(
                "cannot write into the output folder {}: {e}",
                dir.display()
            )));
        }
        let _ = std::fs::remove_file(&probe);
        Ok(prepared)
    }

    /// After a failure: removes the folders made that are still empty, so
    /// that a refusal leaves no trace.
    pub(crate) fn remove_if_empty(self) {
        for dir in &self.made {
            // remove_dir refuses a folder that is not empty.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_in_the_same_process_is_told_so() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("results.parquet");
        let held = OutputLock::acquire(&output).unwrap();
        let Err(err) = OutputLock::acquire(&output) else {
            panic!("the lock is held");
        };
        let message = err.to_string();
        assert!(
            message.contains("is being written by another job of this process"),
            "{message}"
        );
        assert_eq!(err.exit_code(), 2);
        drop(held);
        OutputLock::acquire(&output).expect("free again");
    }
}
