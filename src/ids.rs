//! The gallery's ids in memory: one Arrow array plus a sorted permutation for
//! lookups (4 bytes per item, no per-id allocation). Finds duplicates.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type};

use crate::error::{HubnormError, Result};
use crate::source::EmbeddingTable;

/// One id value, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IdValue<'a> {
    Int(i64),
    Str(&'a str),
}

impl std::fmt::Display for IdValue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdValue::Int(v) => write!(f, "{v}"),
            IdValue::Str(s) => write!(f, "'{s}'"),
        }
    }
}

/// The value at `row` of an Int64 or Utf8 array.
pub fn id_at(ids: &dyn Array, row: usize) -> IdValue<'_> {
    match ids.data_type() {
        DataType::Int64 => IdValue::Int(ids.as_primitive::<Int64Type>().value(row)),
        DataType::Utf8 => IdValue::Str(ids.as_string::<i32>().value(row)),
        other => panic!("ids are normalised to Int64 or Utf8, found {other}"),
    }
}

/// All ids of a table with a lookup from id to row.
#[derive(Debug, Clone)]
pub struct IdIndex {
    ids: ArrayRef,
    /// Rows sorted by id.
    order: Vec<u32>,
}

impl IdIndex {
    /// Reads the ids of `table` and indexes them; duplicate ids are an input
    /// error naming the file and row of the second occurrence.
    pub fn build(table: &EmbeddingTable) -> Result<Self> {
        if table.rows > u32::MAX as u64 {
            return Err(HubnormError::Usage(format!(
                "the {} has {} rows; at most {} are supported",
                table.role,
                table.rows,
                u32::MAX
            )));
        }
        let ids = table.read_all_ids()?;
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_by(|&a, &b| {
            id_at(&ids, a as usize)
                .cmp(&id_at(&ids, b as usize))
                .then(a.cmp(&b))
        });
        for w in order.windows(2) {
            let (a, b) = (w[0] as usize, w[1] as usize);
            if id_at(&ids, a) == id_at(&ids, b) {
                let column = table.options().id_column.clone();
                let (first_path, first_row) = table.locate(a as u64);
                let message = format!(
                    "duplicate id {} (first seen in {}, row {first_row})",
                    id_at(&ids, b),
                    first_path.display()
                );
                return Err(table.row_error(b as u64, &column, message));
            }
        }
        Ok(IdIndex { ids, order })
    }

    /// The ids in table order.
    pub fn ids(&self) -> &ArrayRef {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Row of `id`, if present.
    pub fn find(&self, id: IdValue<'_>) -> Option<u32> {
        let ids = &self.ids;
        self.order
            .binary_search_by(|&row| id_at(ids, row as usize).cmp(&id))
            .ok()
            .map(|i| self.order[i])
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.ids.get_array_memory_size() + self.order.capacity() * 4
    }
}
