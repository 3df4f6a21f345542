//! The inner table of a pass: kept in memory when the plan says it fits,
//! otherwise re-read block by block every time it is needed (the next block
//! read on a thread of its own while the current one is worked on, when the
//! plan says so).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use crate::error::{HubnormError, Result};
use crate::plan::BlockPlan;
use crate::source::{BlockReader, EmbeddingBlock, EmbeddingTable};

/// Blocks of a table, cached or streamed.
pub struct TableBlocks {
    table: EmbeddingTable,
    block_rows: usize,
    cached: Option<Vec<EmbeddingBlock>>,
    read_ahead: bool,
    /// Whether the plan has room for a second Parquet reader.
    second_reader: bool,
}

impl TableBlocks {
    /// The inner table of `plan`: read into memory now when the plan caches
    /// it.
    pub fn new(table: &EmbeddingTable, plan: &BlockPlan) -> Result<Self> {
        let table = table.with_batch_rows(plan.batch_rows);
        let cached = if plan.cache_inner {
            Some(table.blocks(plan.inner_rows).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        Ok(TableBlocks {
            table,
            block_rows: plan.inner_rows,
            cached,
            read_ahead: plan.read_ahead,
            second_reader: plan.allows_second_reader(),
        })
    }

    /// Folds every block into a state made by `start`: the blocks of the
    /// table's first half on this thread and those of its second half on one
    /// more at the same time, when the table is streamed with a read-ahead
    /// and the plan has room for a second reader (a pass that only reads,
    /// whose caller would otherwise wait); else every block into one state.
    /// Returns the states in table order. The halves split on a block
    /// boundary, so the blocks are those [`TableBlocks::for_each`] hands
    /// over; an error in the first half is returned before one in the second.
    pub fn fold_halves<S: Send>(
        &mut self,
        start: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, &EmbeddingBlock) -> Result<()> + Sync,
    ) -> Result<Vec<S>> {
        let rows = self.table.rows;
        let blocks = rows.div_ceil(self.block_rows as u64);
        let split = blocks / 2 * self.block_rows as u64;
        if self.cached.is_some()
            || !(self.read_ahead && self.second_reader)
            || blocks < 2
            || self.table.is_sampled()
        {
            let mut state = start();
            self.for_each(|block| f(&mut state, block))?;
            return Ok(vec![state]);
        }
        // The first half's failure stops the second at its next block; the
        // second's cannot stop the first, which may still meet an earlier one.
        let first_failed = AtomicBool::new(false);
        let fold = |rows: Range<u64>| -> Result<S> {
            let second_half = rows.start > 0;
            let mut state = start();
            let mut reader = self.table.blocks_in(self.block_rows, rows)?;
            while !(second_half && first_failed.load(Ordering::Relaxed)) {
                let Some(block) = reader.next_block()? else {
                    break;
                };
                f(&mut state, &block)?;
                reader.recycle(block);
            }
            Ok(state)
        };
        std::thread::scope(|scope| {
            let second = spawn_reader(scope, || fold(split..rows))?;
            let first = fold(0..split);
            if first.is_err() {
                first_failed.store(true, Ordering::Relaxed);
            }
            let second = second
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Ok(vec![first?, second?])
        })
    }

    /// The table's rows.
    pub fn rows(&self) -> u64 {
        self.table.rows
    }

    /// The rows of each block (the last one may be shorter).
    pub fn block_rows(&self) -> usize {
        self.block_rows
    }

    /// The embeddings of `rows` (ascending, distinct table rows, at most
    /// [`TableBlocks::block_rows`] of them), row after row, read alone when
    /// the table is streamed ([`EmbeddingTable::read_rows`]). `None` when
    /// the table is cached (its blocks are at hand), cannot be read so, or
    /// the read failed: the caller then goes through the blocks, which
    /// report a failure with its row.
    pub fn rows_alone(&self, rows: &[u64]) -> Option<Vec<f32>> {
        debug_assert!(rows.len() <= self.block_rows);
        if self.cached.is_some() {
            return None;
        }
        self.table.read_rows(rows).ok().flatten()
    }

    /// Calls `f` on every block in table order.
    pub fn for_each(&mut self, mut f: impl FnMut(&EmbeddingBlock) -> Result<()>) -> Result<()> {
        match &self.cached {
            Some(blocks) => blocks.iter().try_for_each(|block| {
                crate::cancel::check()?;
                f(block)
            }),
            None if self.read_ahead => {
                let open = || Ok(self.table.blocks(self.block_rows));
                read_ahead(open, || Ok(()), |_, b| f(b))
            }
            None => {
                let mut reader = self.table.blocks(self.block_rows);
                while let Some(block) = reader.next_block()? {
                    f(&block)?;
                    reader.recycle(block);
                }
                Ok(())
            }
        }
    }
}

/// Calls `f` on every block of the reader `open` makes, in order, while a
/// thread of its own (which opens it) reads the next one. The hand-over
/// waits for both sides, so at most two blocks are held: the one `f` works
/// on and the one being read (into the buffer of the block `f` finished
/// before). The reader stops at its first error, which `f`'s side returns in
/// turn; when `f` (or `start`) fails, the reader's next hand-over fails and
/// it stops too. `start` runs on the calling thread while the first block is
/// read, and makes the state `f` works with.
pub fn read_ahead<'t, S>(
    open: impl FnOnce() -> Result<BlockReader<'t>> + Send,
    start: impl FnOnce() -> Result<S>,
    mut f: impl FnMut(&mut S, &EmbeddingBlock) -> Result<()>,
) -> Result<()> {
    std::thread::scope(|scope| {
        let (hand_over, blocks) = mpsc::sync_channel::<Result<EmbeddingBlock>>(0);
        let (give_back, finished) = mpsc::channel::<EmbeddingBlock>();
        spawn_reader(scope, move || {
            let mut reader = match open() {
                Ok(reader) => reader,
                Err(e) => {
                    let _ = hand_over.send(Err(e));
                    return;
                }
            };
            loop {
                // `f`'s side gives a block back before it takes the next,
                // so the one before the last hand-over is here by now.
                while let Ok(block) = finished.try_recv() {
                    reader.recycle(block);
                }
                let Some(next) = reader.next_block().transpose() else {
                    break;
                };
                let failed = next.is_err();
                if hand_over.send(next).is_err() || failed {
                    break;
                }
            }
        })?;
        let mut state = start()?;
        for block in blocks {
            let block = block?;
            f(&mut state, &block)?;
            // The reader may have stopped already (at the table's end).
            let _ = give_back.send(block);
        }
        Ok(())
    })
}

/// Starts `read` on a thread of `scope` named for what it does.
fn spawn_reader<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    read: impl FnOnce() -> T + Send + 'scope,
) -> Result<std::thread::ScopedJoinHandle<'scope, T>> {
    let stop = crate::cancel::current_job_stop();
    std::thread::Builder::new()
        .name("hubnorm-read".into())
        .spawn_scoped(scope, move || {
            crate::cancel::set_job_stop(stop);
            read()
        })
        .map_err(|e| HubnormError::Internal(format!("cannot start a reading thread: {e}")))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int64Array, ListArray,
    };
    use arrow::buffer::OffsetBuffer;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use parquet::file::properties::WriterProperties;

    use super::*;
    use crate::options::ReadOptions;

    const DIM: usize = 4;

    /// A Parquet table of `rows` rows (id `i`, embedding `[i+1, 1, 2, 3]`),
    /// whose rows `nan_rows` hold a NaN.
    fn table(dir: &std::path::Path, rows: usize, nan_rows: &[usize]) -> EmbeddingTable {
        let path = dir.join(format!("table-{rows}-{nan_rows:?}.parquet"));
        write_part(&path, 0..rows, nan_rows, false, usize::MAX);
        open(&path)
    }

    fn open(path: &std::path::Path) -> EmbeddingTable {
        EmbeddingTable::open(
            "gallery",
            path.to_str().unwrap(),
            &ReadOptions::default(),
            false,
        )
        .unwrap()
    }

    /// Writes rows `rows` of the tables above to `path` in row groups of
    /// `group_rows`, the embeddings as `List<f64>` when `as_list`.
    fn write_part(
        path: &std::path::Path,
        rows: std::ops::Range<usize>,
        nan_rows: &[usize],
        as_list: bool,
        group_rows: usize,
    ) {
        let values: Vec<f32> = rows
            .clone()
            .flat_map(|i| {
                let first = if nan_rows.contains(&i) {
                    f32::NAN
                } else {
                    i as f32 + 1.0
                };
                [first, 1.0, 2.0, 3.0]
            })
            .collect();
        let (embedding, field): (ArrayRef, Field) = if as_list {
            let item = Arc::new(Field::new("item", DataType::Float64, false));
            let values = Float64Array::from_iter_values(values.iter().map(|&v| v as f64));
            let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(DIM, rows.len()));
            let list = ListArray::new(item.clone(), offsets, Arc::new(values), None);
            (
                Arc::new(list),
                Field::new("embedding", DataType::List(item), false),
            )
        } else {
            let item = Arc::new(Field::new("item", DataType::Float32, false));
            let list = FixedSizeListArray::new(
                item.clone(),
                DIM as i32,
                Arc::new(Float32Array::from(values)),
                None,
            );
            let data_type = DataType::FixedSizeList(item, DIM as i32);
            (Arc::new(list), Field::new("embedding", data_type, false))
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            field,
        ]));
        let ids = Int64Array::from_iter_values(rows.map(|i| i as i64));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), embedding]).unwrap();
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group_rows))
            // Several pages per row group.
            .set_data_page_row_count_limit(50)
            .set_write_batch_size(50)
            .build();
        let mut writer = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(path).unwrap(),
            schema,
            Some(properties),
        )
        .unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    fn plan(read_ahead: bool) -> BlockPlan {
        BlockPlan {
            outer_rows: 128,
            inner_rows: 128,
            cache_inner: false,
            read_ahead,
            batch_rows: 50,
            reader_bytes: 0,
            spare_bytes: 0,
        }
    }

    /// A block as handed over: its first row, ids and values.
    type Seen = (u64, Vec<i64>, Vec<f32>);

    /// Each block's first row, ids and values, as `for_each` handed them
    /// over until `stop_at` blocks (when `f` fails), and the call's result.
    fn blocks_seen(
        table: &EmbeddingTable,
        read_ahead: bool,
        stop_at: usize,
    ) -> (Vec<Seen>, Result<()>) {
        let mut seen = Vec::new();
        let result = TableBlocks::new(table, &plan(read_ahead))
            .unwrap()
            .for_each(|block| {
                if seen.len() == stop_at {
                    return Err(HubnormError::Internal("stopped by the caller".into()));
                }
                let ids = block.ids.as_any().downcast_ref::<Int64Array>().unwrap();
                seen.push((block.first_row, ids.values().to_vec(), block.data.clone()));
                Ok(())
            });
        (seen, result)
    }

    #[test]
    fn reading_ahead_hands_over_the_same_blocks_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let good = table(dir.path(), 1000, &[]);
        let (ahead, result) = blocks_seen(&good, true, usize::MAX);
        result.unwrap();
        assert_eq!(ahead, blocks_seen(&good, false, usize::MAX).0);
        assert_eq!(ahead.len(), 8);
        // Blocks read into the buffers of earlier ones hold what fresh ones do.
        let fresh: Vec<Vec<f32>> = good.blocks(128).map(|b| b.unwrap().data).collect();
        assert!(ahead.iter().map(|b| &b.2).eq(&fresh));
        let first_rows: Vec<u64> = ahead.iter().map(|b| b.0).collect();
        assert_eq!(first_rows, (0..8).map(|b| b * 128).collect::<Vec<_>>());
        assert_eq!(ahead[7].1, (896..1000).collect::<Vec<_>>());

        // A bad value in the sixth block: the five before it are worked on,
        // then the reader's error, naming the file and row, is returned.
        let bad = table(dir.path(), 1000, &[700]);
        let (ahead, result) = blocks_seen(&bad, true, usize::MAX);
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("table-1000-[700].parquet") && err.contains("row 700"),
            "{err}"
        );
        let (inline, inline_result) = blocks_seen(&bad, false, usize::MAX);
        assert_eq!(err, inline_result.unwrap_err().to_string());
        assert_eq!((ahead.len(), inline.len()), (5, 5));
        assert_eq!(ahead, inline);

        // The caller's error ends the reading and is what is returned.
        let (ahead, result) = blocks_seen(&good, true, 2);
        assert_eq!(ahead.len(), 2);
        assert!(result
            .unwrap_err()
            .to_string()
            .contains("stopped by the caller"));
    }

    #[test]
    fn reading_ahead_a_range_hands_over_its_blocks_to_the_started_state() {
        let dir = tempfile::tempdir().unwrap();
        let good = table(dir.path(), 1000, &[]);
        // Rows 300..900 in blocks of 128, folded into the state `start` made.
        let mut seen = Vec::new();
        read_ahead(
            || good.blocks_in(128, 300..900),
            || Ok(vec![u64::MAX]),
            |state, block| {
                state.push(block.first_row);
                seen.push((state.clone(), block.data.clone()));
                Ok(())
            },
        )
        .unwrap();
        let firsts: Vec<u64> = (300..900).step_by(128).collect();
        let inline: Vec<Vec<f32>> = good
            .blocks_in(128, 300..900)
            .unwrap()
            .map(|b| b.unwrap().data)
            .collect();
        assert_eq!(seen.len(), firsts.len());
        let last = &seen.last().unwrap().0;
        assert_eq!(last[0], u64::MAX);
        assert_eq!(last[1..], firsts);
        assert!(seen.iter().map(|s| &s.1).eq(&inline));
        // A failing start is returned, and no block is worked on.
        let mut worked = 0;
        let result = read_ahead(
            || Ok(good.blocks(128)),
            || Err::<(), _>(HubnormError::Internal("no state".into())),
            |_, _| {
                worked += 1;
                Ok(())
            },
        );
        assert!(result.unwrap_err().to_string().contains("no state"));
        assert_eq!(worked, 0);
    }

    /// First rows of the blocks each state of `fold_halves` saw.
    fn halves_seen(table: &EmbeddingTable, read_ahead: bool) -> Result<Vec<Vec<u64>>> {
        TableBlocks::new(table, &plan(read_ahead))
            .unwrap()
            .fold_halves(Vec::new, |seen, block| {
                seen.push(block.first_row);
                Ok(())
            })
    }

    #[test]
    fn folding_halves_splits_on_a_block_boundary_and_reports_the_first_error() {
        let dir = tempfile::tempdir().unwrap();
        let good = table(dir.path(), 1000, &[]);
        let rows = |blocks: std::ops::Range<u64>| blocks.map(|b| b * 128).collect::<Vec<_>>();
        assert_eq!(halves_seen(&good, true).unwrap(), [rows(0..4), rows(4..8)]);
        assert_eq!(halves_seen(&good, false).unwrap(), [rows(0..8)]);
        // An error in either half names its row; with one in each, the
        // first half's is returned, as reading in order would, even when the
        // second half's comes first (row 515 is in its first block, row 450 in
        // the first half's last).
        let late = halves_seen(&table(dir.path(), 1000, &[700]), true).unwrap_err();
        assert!(late.to_string().contains("row 700"), "{late}");
        let early = halves_seen(&table(dir.path(), 1000, &[450, 515]), true).unwrap_err();
        assert!(early.to_string().contains("row 450"), "{early}");
    }

    #[test]
    fn rows_read_alone_are_the_rows_of_the_blocks() {
        let dir = tempfile::tempdir().unwrap();
        // Two parts (FixedSizeList<f32> in row groups of 256, List<f64> in
        // groups of 128), pages of 50 rows.
        let write = |name: &str, nan_rows: &[usize]| {
            let parts = dir.path().join(name);
            std::fs::create_dir(&parts).unwrap();
            write_part(&parts.join("a.parquet"), 0..700, nan_rows, false, 256);
            write_part(&parts.join("b.parquet"), 700..1000, nan_rows, true, 128);
            open(&parts)
        };
        let good = write("good", &[]);
        let all: Vec<f32> = good.blocks(1000).flat_map(|b| b.unwrap().data).collect();
        let rows = [
            0u64, 1, 49, 50, 255, 256, 257, 511, 699, 700, 701, 827, 828, 999,
        ];
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| all[r as usize * DIM..(r as usize + 1) * DIM].to_vec())
            .collect();
        let streamed = TableBlocks::new(&good, &plan(true)).unwrap();
        assert_eq!(streamed.rows_alone(&rows), Some(want.clone()));
        assert_eq!(
            streamed.rows_alone(&rows[9..10]),
            Some(want[9 * DIM..10 * DIM].to_vec())
        );
        let cached = BlockPlan {
            cache_inner: true,
            ..plan(false)
        };
        assert_eq!(
            TableBlocks::new(&good, &cached).unwrap().rows_alone(&rows),
            None
        );

        // A bad value is only met where it is read; then the blocks say where.
        let bad = TableBlocks::new(&write("bad", &[300, 800]), &plan(true)).unwrap();
        assert_eq!(
            bad.rows_alone(&[299, 301, 799, 801]).map(|v| v.len()),
            Some(4 * DIM)
        );
        assert_eq!(bad.rows_alone(&[300]), None);
        assert_eq!(bad.rows_alone(&[100, 800]), None);
    }
}
