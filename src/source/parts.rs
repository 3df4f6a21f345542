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
}

impl PartRecord {
    /// The record of `part` as it is on disk now.
    pub fn of(part: &TablePart) -> PartRecord {
        let path = std::fs::canonicalize(&part.path).unwrap_or_else(|_| part.path.clone());
        let meta = std::fs::metadata(&part.path).ok();
        PartRecord {
            path: path.display().to_string(),
            rows: part.rows,
            bytes: meta.as_ref().map_or(0, |m| m.len()),
            modified_ns: meta
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos()),
        }
    }

    /// The parts of `table` as the JSON stored in the metadata.
    pub fn list_json(table: &EmbeddingTable) -> String {
        let list: Vec<PartRecord> = table.parts.iter().map(PartRecord::of).collect();
        serde_json::to_string(&list).expect("plain data")
    }
}
