//! The Parquet parts a table is made of, and how a stats file records them
//! (so that `stats --update` can tell new parts from counted ones).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::EmbeddingTable;

/// One Parquet part of a table.
#[derive(Debug, Clone)]
pub struct TablePart {
    pub path: PathBuf,
    /// Rows in this part (from the Parquet footer).
    pub rows: u64,
    /// Global row index of this part's first row.
    pub first_row: u64,
}

/// One input part as a stats file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    /// The canonical path.
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub modified_ns: u128,
    /// The object's ETag (object stores only; absent for local files, so
    /// their records read and compare as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

impl PartRecord {
    /// The record of `part` as it is on disk (or in its object store) now:
    /// a local part by its canonical path, size and modification time, an
    /// object by its URL, size, last-modified time and ETag.
    pub fn of(part: &TablePart) -> PartRecord {
        let path = if crate::storage::is_remote(&part.path) {
            part.path.clone()
        } else {
            std::fs::canonicalize(&part.path).unwrap_or_else(|_| part.path.clone())
        };
        let identity = crate::storage::identity(&part.path).unwrap_or_default();
        PartRecord {
            path: path.display().to_string(),
            rows: part.rows,
            bytes: identity.bytes,
            modified_ns: identity.modified_ns,
            etag: identity.etag,
        }
    }

    /// The parts of `table` as the JSON stored in the metadata.
    pub fn list_json(table: &EmbeddingTable) -> String {
        let list: Vec<PartRecord> = table.parts.iter().map(PartRecord::of).collect();
        serde_json::to_string(&list).expect("plain data")
    }
}
