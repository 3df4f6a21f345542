//! What a cluster job's inputs were when the client opened them. Each
//! task lists its input tables again when it starts, on its own executor:
//! a folder that gains a part, or a Delta table that takes a new version,
//! while the job runs would give shards (or passes, or Sinkhorn rounds) of
//! different snapshots, stitched into one output without a word. So the
//! client takes [`ClusterInputs`] once per job, from the tables it opened:
//! each Delta input pinned to the version it read, and every input file
//! recorded. Every pass it sends carries them; each task checks the files
//! before and after its rows, and a change fails the job, naming the file.

use serde::{Deserialize, Serialize};

use crate::error::{HubnormError, Result};
use crate::source::{expand_spec_identified, EmbeddingTable};
use crate::sql::Placement;

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
    /// The table's path as the spec names it (absolute, pinned).
    table: String,
    files: Vec<FileSnapshot>,
}

impl InputSnapshot {
    /// The files `table` names now (see [`expand_spec_identified`]). A file
    /// whose size and time cannot be read is an error of its own, not a
    /// change.
    fn now(table: &str) -> Result<Self> {
        let files = expand_spec_identified(table)?
            .into_iter()
            .map(|(path, identity)| {
                let identity = identity.unwrap_or_default();
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
                    "{how} while the cluster job ran (input {}): its tasks would read different rows; run the job again once the input holds still",
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

/// A cluster job's embedding tables as the client opened them, taken once
/// for every pass the job sends: each as the user named it, pinned to the
/// Delta version read, and its files.
#[derive(Debug, Clone, Default)]
pub struct ClusterInputs {
    tables: Vec<PinnedTable>,
}

#[derive(Debug, Clone)]
struct PinnedTable {
    /// As the job names it.
    given: String,
    /// As every task reads it: absolute, at the Delta version read.
    pinned: String,
    snapshot: InputSnapshot,
}

impl ClusterInputs {
    /// The inputs of a job that opened `tables` (`None`: a table the job
    /// has not, such as an absent gallery bank).
    pub fn of<'a>(tables: impl IntoIterator<Item = Option<&'a EmbeddingTable>>) -> Result<Self> {
        let mut pinned_tables = Vec::new();
        for table in tables.into_iter().flatten() {
            if pinned_tables
                .iter()
                .any(|p: &PinnedTable| p.given == table.spec)
            {
                continue;
            }
            let at_version = match table.delta_version {
                #[cfg(feature = "delta")]
                Some(version) => crate::delta::at_version(&table.spec, &version.to_string()),
                _ => table.spec.clone(),
            };
            let pinned = Placement::Cluster.path(at_version)?;
            pinned_tables.push(PinnedTable {
                given: table.spec.clone(),
                snapshot: InputSnapshot::now(&pinned)?,
                pinned,
            });
        }
        Ok(ClusterInputs {
            tables: pinned_tables,
        })
    }

    fn find(&self, given: &str) -> Option<&PinnedTable> {
        self.tables.iter().find(|t| t.given == given)
    }
}

impl PassSpec {
    /// This spec for a cluster's processes: its local paths made absolute
    /// (their working directories are not this one's), the embedding
    /// tables the job opened pinned as `inputs` took them, and every input
    /// file recorded (those of tables `inputs` does not hold, such as a
    /// stats file, as they are now), for each task to check
    /// ([`PassSpec::check_inputs_unchanged`]).
    pub fn for_cluster(mut self, inputs: &ClusterInputs) -> Result<Self> {
        for path in self.inputs.embedding_tables_mut() {
            if let Some(table) = inputs.find(path) {
                *path = table.pinned.clone();
            }
        }
        // The pinned paths are absolute already.
        self = self.with_absolute_paths()?;
        self.snapshots = self
            .inputs
            .tables()
            .into_iter()
            .map(
                |(_, table)| match inputs.tables.iter().find(|t| t.pinned == table) {
                    Some(pinned) => Ok(pinned.snapshot.clone()),
                    None => InputSnapshot::now(table),
                },
            )
            .collect::<Result<_>>()?;
        Ok(self)
    }

    /// Fails, naming the file, when an input recorded by
    /// `PassSpec::for_cluster` has changed.
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
