//! What a cluster pass's inputs were when the client checked them. Each
//! task lists its input tables again when it starts, on its own executor:
//! a folder that gains a part, or a Delta table that takes a new version,
//! while the job runs would give shards of different snapshots, stitched
//! into one output without a word. So the client pins each Delta input to
//! the version it checked and records every input file; each task checks
//! the files before and after its rows, and a change fails the job,
//! naming the file.

use serde::{Deserialize, Serialize};

use crate::error::{HubnormError, Result};
use crate::source::expand_spec;

use super::PassSpec;

/// One input file as the client saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct FileSnapshot {
    path: String,
    bytes: u64,
    modified_ns: u128,
    etag: Option<String>,
}

/// The files of one input table of a pass, as the client saw them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSnapshot {
    /// The table's path as the spec names it.
    table: String,
    files: Vec<FileSnapshot>,
}

impl InputSnapshot {
    /// The files `table` names now.
    fn now(table: &str) -> Result<Self> {
        let files = expand_spec(table)?
            .into_iter()
            .map(|path| {
                let identity = crate::storage::identity(&path).unwrap_or_default();
                FileSnapshot {
                    path: path.display().to_string(),
                    bytes: identity.bytes,
                    modified_ns: identity.modified_ns,
                    etag: identity.etag,
                }
            })
            .collect();
        Ok(InputSnapshot {
            table: table.to_owned(),
            files,
        })
    }

    /// Fails, naming the first file that differs, unless `table` still
    /// names the same files, unchanged.
    fn check_unchanged(&self) -> Result<()> {
        let now = InputSnapshot::now(&self.table)?;
        if now == *self {
            return Ok(());
        }
        let changed = |path: &str, how: &str| {
            HubnormError::input(
                path,
                None,
                None,
                format!(
                    "{how} while the cluster job ran (input {}): its tasks would read different rows; run the job again once the input holds still, or name a Delta table's version (PATH@VERSION)",
                    self.table
                ),
            )
        };
        for file in &self.files {
            match now.files.iter().find(|f| f.path == file.path) {
                None => return Err(changed(&file.path, "removed")),
                Some(f) if f != file => return Err(changed(&file.path, "changed")),
                Some(_) => {}
            }
        }
        let added = now
            .files
            .iter()
            .find(|f| !self.files.iter().any(|s| s.path == f.path))
            .map_or(self.table.as_str(), |f| f.path.as_str());
        Err(changed(added, "added"))
    }
}

impl PassSpec {
    /// This spec with its Delta inputs pinned to the versions they are at
    /// (`PATH@VERSION`) and every input file recorded, for tasks on a
    /// cluster to check ([`PassSpec::check_inputs_unchanged`]).
    pub(super) fn pinned(mut self) -> Result<Self> {
        #[cfg(feature = "delta")]
        for path in self.inputs.tables_mut() {
            if let Some(version) = crate::source::resolve_spec(path)?.delta_version {
                *path = crate::delta::at_version(path, &version.to_string());
            }
        }
        self.snapshots = self
            .inputs
            .tables()
            .into_iter()
            .map(|(_, table)| InputSnapshot::now(table))
            .collect::<Result<_>>()?;
        Ok(self)
    }

    /// Fails, naming the file, when an input recorded by
    /// `PassSpec::pinned` has changed.
    pub fn check_inputs_unchanged(&self) -> Result<()> {
        self.snapshots
            .iter()
            .try_for_each(InputSnapshot::check_unchanged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part that is added, rewritten or removed after the snapshot fails
    /// the check, naming that file; an untouched folder passes.
    #[test]
    fn a_changed_input_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let part = |name: &str| dir.path().join(name);
        // The listing looks at names and sizes, not at the Parquet inside.
        std::fs::write(part("a.parquet"), b"first").unwrap();
        let table = dir.path().display().to_string();
        let snapshot = InputSnapshot::now(&table).unwrap();
        snapshot.check_unchanged().unwrap();

        std::fs::write(part("b.parquet"), b"second").unwrap();
        let err = snapshot.check_unchanged().unwrap_err().to_string();
        assert!(err.contains("b.parquet") && err.contains("added"), "{err}");
        std::fs::remove_file(part("b.parquet")).unwrap();

        std::fs::write(part("a.parquet"), b"rewritten").unwrap();
        let err = snapshot.check_unchanged().unwrap_err().to_string();
        assert!(
            err.contains("a.parquet") && err.contains("changed"),
            "{err}"
        );

        std::fs::write(part("c.parquet"), b"third").unwrap();
        let snapshot = InputSnapshot::now(&table).unwrap();
        std::fs::remove_file(part("c.parquet")).unwrap();
        let err = snapshot.check_unchanged().unwrap_err().to_string();
        assert!(
            err.contains("c.parquet") && err.contains("removed"),
            "{err}"
        );
    }
}
