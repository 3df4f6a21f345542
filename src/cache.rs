//! The inner table of a pass: kept in memory when the plan says it fits,
//! otherwise re-read block by block every time it is needed.

use crate::error::Result;
use crate::source::{EmbeddingBlock, EmbeddingTable};

/// Blocks of a table, cached or streamed.
pub struct TableBlocks {
    table: EmbeddingTable,
    block_rows: usize,
    cached: Option<Vec<EmbeddingBlock>>,
}

impl TableBlocks {
    /// Reads the table into memory now when `cache` is true.
    pub fn new(
        table: &EmbeddingTable,
        block_rows: usize,
        batch_rows: usize,
        cache: bool,
    ) -> Result<Self> {
        let table = table.with_batch_rows(batch_rows);
        let cached = if cache {
            Some(table.blocks(block_rows).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        Ok(TableBlocks {
            table,
            block_rows,
            cached,
        })
    }

    /// Calls `f` on every block in table order.
    pub fn for_each(&mut self, mut f: impl FnMut(&EmbeddingBlock) -> Result<()>) -> Result<()> {
        match &self.cached {
            Some(blocks) => blocks.iter().try_for_each(|block| {
                crate::cancel::check()?;
                f(block)
            }),
            None => {
                let mut reader = self.table.blocks(self.block_rows);
                while let Some(block) = reader.next_block()? {
                    f(&block)?;
                }
                Ok(())
            }
        }
    }
}
