//! Tables held in this process's memory: Arrow record batches registered
//! under a `memory://NAME` path, so that the passes read them like a file
//! of one part, as often as they need to, without copying them first.
//!
//! The Python package registers its in-memory inputs here (their buffers
//! stay where Python's Arrow producer put them); every other caller passes
//! files. A registration lives until its [`Registration`] is dropped.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;

use crate::error::{HubnormError, Result};

/// How an in-memory table's path starts.
pub const SCHEME: &str = "memory://";

/// Record batches of one schema, read in order.
#[derive(Debug)]
pub struct MemoryTable {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    pub rows: u64,
}

impl MemoryTable {
    /// The rows of `column` in table order (zero-copy when the table is one
    /// batch), or `None` when the table has no such column.
    pub fn column(&self, column: &str) -> Result<Option<arrow::array::ArrayRef>> {
        let Ok(index) = self.schema.index_of(column) else {
            return Ok(None);
        };
        let pieces: Vec<&dyn arrow::array::Array> = self
            .batches
            .iter()
            .map(|b| b.column(index).as_ref())
            .collect();
        Ok(Some(match self.batches.as_slice() {
            [] => arrow::array::new_empty_array(self.schema.field(index).data_type()),
            [one] => one.column(index).clone(),
            _ => arrow::compute::concat(&pieces)?,
        }))
    }
}

static TABLES: LazyLock<Mutex<HashMap<String, Arc<MemoryTable>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An in-memory table's place in the registry; dropping it unregisters the
/// table (jobs already reading it keep their reference).
#[derive(Debug)]
pub struct Registration {
    path: String,
}

impl Registration {
    /// The path under which the passes find the table: `memory://ROLE-N`.
    pub fn path(&self) -> &str {
        &self.path
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        registry().remove(&self.path);
    }
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<String, Arc<MemoryTable>>> {
    // The map stays consistent whatever panicked while it was held.
    TABLES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers `batches` (all of `schema`) under a fresh `memory://` path
/// named after `role` ("queries", "gallery", ...).
pub fn register(role: &str, schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<Registration> {
    if let Some(batch) = batches.iter().find(|b| b.schema() != schema) {
        return Err(HubnormError::Internal(format!(
            "a record batch of the in-memory {role} has the schema {}, not the stream's {}",
            batch.schema(),
            schema
        )));
    }
    let role: String = role
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let path = format!("{SCHEME}{role}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
    let table = MemoryTable {
        schema,
        batches,
        rows,
    };
    registry().insert(path.clone(), Arc::new(table));
    Ok(Registration { path })
}

/// Whether `path` names an in-memory table (registered or not).
pub fn is_memory(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.starts_with(SCHEME))
}

/// The table registered under `path`.
pub fn lookup(path: &Path) -> Result<Arc<MemoryTable>> {
    let text = path.to_string_lossy();
    registry().get(text.as_ref()).cloned().ok_or_else(|| {
        HubnormError::input(
            path,
            None,
            None,
            "no in-memory table of this name (memory:// paths name tables registered by this process, e.g. the Python package's inputs)",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn a_registration_lives_until_dropped() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2]))])
                .unwrap();
        let registration = register("gallery bank", schema, vec![batch.clone(), batch]).unwrap();
        let path = Path::new(registration.path()).to_path_buf();
        assert!(registration.path().starts_with("memory://gallery-bank-"));
        assert!(is_memory(&path));
        let table = lookup(&path).unwrap();
        assert_eq!(table.rows, 4);
        let ids = table.column("id").unwrap().unwrap();
        assert_eq!(ids.len(), 4);
        assert!(table.column("embedding").unwrap().is_none());
        drop(registration);
        let err = lookup(&path).unwrap_err().to_string();
        assert!(err.contains(path.to_str().unwrap()), "{err}");
    }
}
