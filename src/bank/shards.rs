//! Pass 1 in shards of gallery rows, as a cluster computes it: the rows a
//! shard sends, and how the client puts the whole pass back together.
//!
//! A gallery row's early columns depend on every bank row and no other
//! gallery row, so a shard computes them as the whole pass does. The
//! activation sets of `dis` and `dual-dis` need each bank item's top-k_A
//! over the whole gallery: a shard sends each bank item's top-k_A over its
//! own rows (after its early rows, one row per bank item), and the client
//! merges them (top-k lists merge exactly, ties broken by gallery row as in
//! one pass) before it appends the activation columns to the early rows it
//! kept in a scratch file, as the one-machine pass does with its own.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, Float32Array, Float64Array, ListArray, RecordBatch,
    StructArray, UInt32Array, UInt64Array, UInt8Array,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{
    DataType, Field, Fields, Float32Type, Float64Type, Schema, SchemaRef, UInt32Type, UInt64Type,
    UInt8Type,
};

use crate::bank::driver::{join_late_columns, StatsPlan, StatsSink};
use crate::bank::sinkhorn::SinkhornRound;
use crate::bank::{ActivationBank, ActivationShape, ActivationState, BankPassOutput, StatsLayout};
use crate::error::{HubnormError, Result};
use crate::kernel::{Candidate, LogSumExp};
use crate::sink::ParquetSink;
use crate::source::IdKind;

/// The columns a shard adds after the early ones: for a bank item's row,
/// which bank (0: query bank, 1: gallery bank), its row, and its top-k_A
/// gallery items over the shard (null on the gallery rows).
fn activation_fields() -> Vec<Field> {
    vec![
        Field::new("hubnorm_bank", DataType::UInt8, true),
        Field::new("hubnorm_bank_row", DataType::UInt32, true),
        Field::new(
            "hubnorm_top",
            DataType::List(Arc::new(candidate_item())),
            true,
        ),
    ]
}

fn candidate_fields() -> Fields {
    Fields::from(vec![
        Field::new("gallery_row", DataType::UInt32, false),
        Field::new("score", DataType::Float32, false),
        Field::new("raw_score", DataType::Float32, false),
    ])
}

fn candidate_item() -> Field {
    Field::new("item", DataType::Struct(candidate_fields()), false)
}

/// The rows a shard sends when the client merges activation states: the
/// early columns (nullable, null on a bank item's row), then the
/// activation columns.
pub fn shard_schema(layout: &StatsLayout, gallery_ids: IdKind) -> SchemaRef {
    let full = layout.schema(gallery_ids);
    let early = 1 + layout.columns().0.len();
    let mut fields: Vec<Field> = full.fields()[..early]
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.extend(activation_fields());
    Arc::new(Schema::new(fields))
}

/// A batch of early rows as rows of `shard_schema` (activation columns null).
pub fn early_rows(batch: &RecordBatch, shard_schema: &SchemaRef) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    for field in activation_fields() {
        columns.push(new_null_array(field.data_type(), batch.num_rows()));
    }
    Ok(RecordBatch::try_new(shard_schema.clone(), columns)?)
}

/// Code of a bank in the `hubnorm_bank` column.
fn bank_code(bank: ActivationBank) -> u8 {
    match bank {
        ActivationBank::Query => 0,
        ActivationBank::Gallery => 1,
    }
}

/// The activation rows of a shard into `emit`: one per bank item of each
/// of `shapes`, with its top-k_A over the shard in `output`, in batches of
/// at most `batch_rows` rows.
pub fn activation_rows(
    output: &BankPassOutput,
    shapes: &[ActivationShape],
    shard_schema: &SchemaRef,
    batch_rows: usize,
    emit: &mut dyn FnMut(&RecordBatch) -> Result<()>,
) -> Result<()> {
    let early = shard_schema.fields().len() - activation_fields().len();
    for shape in shapes {
        let state = shape.bank.state(output);
        let mut start = 0;
        while start < shape.rows {
            let end = (start + batch_rows.max(1)).min(shape.rows);
            let n = end - start;
            let tops: Vec<Vec<Candidate>> = (start..end).map(|row| state.top_of(row)).collect();
            let candidates = tops.iter().flatten();
            let items = StructArray::new(
                candidate_fields(),
                vec![
                    Arc::new(UInt32Array::from_iter_values(
                        candidates.clone().map(|c| c.row),
                    )),
                    Arc::new(Float32Array::from_iter_values(
                        candidates.clone().map(|c| c.score),
                    )),
                    Arc::new(Float32Array::from_iter_values(candidates.map(|c| c.raw))),
                ],
                None,
            );
            let list = ListArray::new(
                Arc::new(candidate_item()),
                OffsetBuffer::from_lengths(tops.iter().map(Vec::len)),
                Arc::new(items),
                None,
            );
            let mut columns: Vec<ArrayRef> = shard_schema.fields()[..early]
                .iter()
                .map(|f| new_null_array(f.data_type(), n))
                .collect();
            columns.push(Arc::new(UInt8Array::from(vec![bank_code(shape.bank); n])));
            columns.push(Arc::new(UInt32Array::from_iter_values(
                start as u32..end as u32,
            )));
            columns.push(Arc::new(list));
            emit(&RecordBatch::try_new(shard_schema.clone(), columns)?)?;
            start = end;
        }
    }
    Ok(())
}

/// The rows a shard of `gallery_rows` rows sends under `shapes`.
pub fn shard_row_count(gallery_rows: u64, shapes: &[ActivationShape]) -> u64 {
    gallery_rows + shapes.iter().map(|s| s.rows as u64).sum::<u64>()
}

/// The client's side: takes the shards' rows in shard order, keeps the
/// early rows in a scratch file and merges the activation states; at the
/// end writes the whole pass's rows into a sink.
pub struct ShardMerge {
    spool: ParquetSink,
    early_schema: SchemaRef,
    output: BankPassOutput,
    gallery_rows: usize,
}

impl ShardMerge {
    /// For `plan` over a gallery of `gallery_rows` rows with activation
    /// states of `shapes`, the early rows kept at `spool`.
    pub fn new(
        plan: &StatsPlan,
        shapes: &[ActivationShape],
        gallery_rows: usize,
        spool: &Path,
    ) -> Result<Self> {
        let early_schema = plan.early_schema();
        let mut output = BankPassOutput::default();
        for shape in shapes {
            *shape.bank.state_mut(&mut output) = ActivationState::new(shape.rows, shape.k);
        }
        Ok(ShardMerge {
            spool: ParquetSink::create(spool, early_schema.clone(), Vec::new(), true)?,
            early_schema,
            output,
            gallery_rows,
        })
    }

    /// Takes a batch of a shard's rows (without the shard column).
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let early = self.early_schema.fields().len();
        let malformed = || {
            HubnormError::Cluster(
                "the cluster returned stats rows without their activation columns".into(),
            )
        };
        if batch.num_columns() != early + activation_fields().len() {
            return Err(malformed());
        }
        let banks = batch
            .column(early)
            .as_primitive_opt::<UInt8Type>()
            .ok_or_else(malformed)?;
        if banks.null_count() == batch.num_rows() {
            let rows =
                RecordBatch::try_new(self.early_schema.clone(), batch.columns()[..early].to_vec())?;
            return self.spool.write(&rows);
        }
        if banks.null_count() > 0 {
            // A shard's last early rows and its first bank items in one
            // batch (an operator between the pass and the client may have
            // coalesced them): each part on its own, early rows first.
            let is_bank_item = arrow::compute::is_not_null(banks)?;
            let gallery_rows = arrow::compute::not(&is_bank_item)?;
            self.push(&arrow::compute::filter_record_batch(batch, &gallery_rows)?)?;
            return self.push(&arrow::compute::filter_record_batch(batch, &is_bank_item)?);
        }
        let bank_rows = batch
            .column(early + 1)
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(malformed)?;
        let tops = batch
            .column(early + 2)
            .as_list_opt::<i32>()
            .ok_or_else(malformed)?;
        for i in 0..batch.num_rows() {
            if banks.is_null(i) || bank_rows.is_null(i) || tops.is_null(i) {
                return Err(malformed());
            }
            let bank = match banks.value(i) {
                0 => ActivationBank::Query,
                1 => ActivationBank::Gallery,
                _ => return Err(malformed()),
            };
            let state = bank.state_mut(&mut self.output);
            let row = bank_rows.value(i) as usize;
            if row >= state.rows() {
                return Err(malformed());
            }
            let items = tops.value(i);
            let items = items.as_struct_opt().ok_or_else(malformed)?;
            let gallery = items
                .column(0)
                .as_primitive_opt::<UInt32Type>()
                .ok_or_else(malformed)?;
            let score = items
                .column(1)
                .as_primitive_opt::<Float32Type>()
                .ok_or_else(malformed)?;
            let raw = items
                .column(2)
                .as_primitive_opt::<Float32Type>()
                .ok_or_else(malformed)?;
            for j in 0..items.len() {
                state.offer(
                    row,
                    Candidate {
                        score: score.value(j),
                        raw: raw.value(j),
                        row: gallery.value(j),
                    },
                );
            }
        }
        Ok(())
    }

    /// Writes every row, with the activation columns of the merged states
    /// and the Sinkhorn methods' `potentials` (in the order of
    /// [`StatsLayout::sinkhorn_methods`]), into `sink` (begun with `plan`'s
    /// schema and metadata).
    pub fn finish(
        self,
        plan: &StatsPlan,
        potentials: &[Vec<f64>],
        sink: &mut dyn StatsSink,
    ) -> Result<()> {
        let spool = self.spool.close_uncommitted()?;
        let late = plan
            .layout
            .late_columns(&self.output, self.gallery_rows, potentials);
        sink.begin(plan.schema.clone(), plan.metadata.clone())?;
        join_late_columns(spool.temporary_path(), &plan.schema, &late, sink)
    }
}

/// The rows a shard of a Sinkhorn round sends
/// ([`crate::bank::sinkhorn::sinkhorn_round`]): one per target of the
/// shard (side 0: its row among all targets, its potential f), then one per
/// source row (side 1: its row, its partial log-sum-exp as max and sum).
pub fn round_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("hubnorm_side", DataType::UInt8, false),
        Field::new("hubnorm_row", DataType::UInt64, false),
        Field::new("hubnorm_value", DataType::Float64, false),
        Field::new("hubnorm_sum", DataType::Float64, false),
    ]))
}

/// Side codes of [`round_schema`].
const TARGET_SIDE: u8 = 0;
const SOURCE_SIDE: u8 = 1;

/// Rows of a shard's round: its targets from `first_target` on, then every
/// source, in batches of at most `batch_rows`.
pub fn round_rows(
    round: &SinkhornRound,
    first_target: u64,
    batch_rows: usize,
    emit: &mut dyn FnMut(&RecordBatch) -> Result<()>,
) -> Result<()> {
    let schema = round_schema();
    let step = batch_rows.max(1);
    let mut send = |side: u8, rows: Range<u64>, value: Vec<f64>, sum: Vec<f64>| {
        emit(&RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(UInt8Array::from_value(side, value.len())),
                Arc::new(UInt64Array::from_iter_values(rows)),
                Arc::new(Float64Array::from(value)),
                Arc::new(Float64Array::from(sum)),
            ],
        )?)
    };
    for (i, f) in round.target_potential.chunks(step).enumerate() {
        let first = first_target + (i * step) as u64;
        let rows = first..first + f.len() as u64;
        send(TARGET_SIDE, rows, f.to_vec(), vec![0.0; f.len()])?;
    }
    for (i, states) in round.rows.chunks(step).enumerate() {
        let first = (i * step) as u64;
        let rows = first..first + states.len() as u64;
        let (max, sum) = states.iter().map(|s| (s.max, s.sum)).unzip();
        send(SOURCE_SIDE, rows, max, sum)?;
    }
    Ok(())
}

/// The client's side of a round: every shard's target potentials put in
/// place, and its source rows merged in the order the shards arrive (shard
/// order, so the merge is the same every run).
pub struct RoundMerge {
    pub target_potential: Vec<f64>,
    seen: Vec<bool>,
    pub rows: Vec<LogSumExp>,
}

impl RoundMerge {
    /// For `targets` targets and `sources` sources.
    pub fn new(targets: usize, sources: usize) -> Self {
        RoundMerge {
            target_potential: vec![0.0; targets],
            seen: vec![false; targets],
            rows: vec![LogSumExp::default(); sources],
        }
    }

    /// Takes a batch of [`round_schema`] rows (without the shard column).
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let malformed =
            || HubnormError::Cluster("the cluster returned malformed Sinkhorn round rows".into());
        if batch.num_columns() != 4 {
            return Err(malformed());
        }
        let side = batch
            .column(0)
            .as_primitive_opt::<UInt8Type>()
            .ok_or_else(malformed)?;
        let row = batch
            .column(1)
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(malformed)?;
        let value = batch
            .column(2)
            .as_primitive_opt::<Float64Type>()
            .ok_or_else(malformed)?;
        let sum = batch
            .column(3)
            .as_primitive_opt::<Float64Type>()
            .ok_or_else(malformed)?;
        for i in 0..batch.num_rows() {
            let r = row.value(i) as usize;
            match side.value(i) {
                TARGET_SIDE if r < self.seen.len() && !self.seen[r] => {
                    self.target_potential[r] = value.value(i);
                    self.seen[r] = true;
                }
                SOURCE_SIDE if r < self.rows.len() => self.rows[r].merge(&LogSumExp {
                    max: value.value(i),
                    sum: sum.value(i),
                }),
                _ => return Err(malformed()),
            }
        }
        Ok(())
    }

    /// f of every target and the merged source rows, once every target was
    /// sent.
    pub fn finish(self) -> Result<(Vec<f64>, Vec<LogSumExp>)> {
        if self.seen.iter().any(|seen| !seen) {
            return Err(HubnormError::Cluster(
                "a Sinkhorn round came back without some targets' potentials".into(),
            ));
        }
        Ok((self.target_potential, self.rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::method::MethodSpec;

    /// A batch holding a shard's last gallery rows and its first bank
    /// items (as a coalescing operator would hand it over) is taken apart:
    /// the gallery rows go to the scratch file, the bank items' lists into
    /// the states.
    #[test]
    fn mixed_batches_are_split() {
        let methods = [MethodSpec::new("dis", &[]).unwrap()];
        let layout = StatsLayout::new(&methods);
        let schema = shard_schema(&layout, IdKind::Int64);
        let early = schema.fields().len() - activation_fields().len();
        let early_schema = Arc::new(Schema::new(
            schema.fields()[..early]
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(false))
                .collect::<Vec<_>>(),
        ));
        // Two gallery rows with made-up early values.
        let gallery: Vec<ArrayRef> = early_schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Int64 => Arc::new(arrow::array::Int64Array::from(vec![7, 8])) as ArrayRef,
                DataType::Float64 => Arc::new(arrow::array::Float64Array::from(vec![0.5, 0.25])),
                other => panic!("an early column of type {other}"),
            })
            .collect();
        let gallery = early_rows(
            &RecordBatch::try_new(early_schema.clone(), gallery).unwrap(),
            &schema,
        )
        .unwrap();
        let mut state = BankPassOutput {
            bank_activation: ActivationState::new(1, 1),
            ..BankPassOutput::default()
        };
        state.bank_activation.offer(
            0,
            Candidate {
                score: 0.9,
                raw: 0.9,
                row: 1,
            },
        );
        let shapes = [ActivationShape {
            bank: ActivationBank::Query,
            rows: 1,
            k: 1,
        }];
        let mut bank = Vec::new();
        activation_rows(&state, &shapes, &schema, 16, &mut |b| {
            bank.push(b.clone());
            Ok(())
        })
        .unwrap();
        let mixed = arrow::compute::concat_batches(&schema, [&gallery, &bank[0]]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("early.parquet");
        let mut merge = ShardMerge {
            spool: ParquetSink::create(&spool, early_schema.clone(), Vec::new(), true).unwrap(),
            early_schema,
            output: BankPassOutput {
                bank_activation: ActivationState::new(1, 1),
                ..BankPassOutput::default()
            },
            gallery_rows: 2,
        };
        merge.push(&mixed).unwrap();
        assert_eq!(
            merge.output.bank_activation.top_of(0),
            state.bank_activation.top_of(0)
        );
        let file = merge.spool.close_uncommitted().unwrap();
        let rows: usize = crate::source::open_parquet(file.temporary_path())
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap().num_rows())
            .sum();
        assert_eq!(rows, 2);
    }
}
