//! The DataFusion side of a pass: [`PassTable`] (what the table functions
//! return), its plan [`PassExec`], one partition per shard, and the
//! reservation each partition takes from the task's memory pool before it
//! runs (see the module above for the data flow).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, AsArray, RecordBatch, UInt32Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::TableType;
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::TryStreamExt;

use crate::error::HubnormError;
use crate::kernel::ScreenCounts;
use crate::options::{human_bytes, MemoryBudget};
use crate::sql::external;

use super::PassSpec;

/// A pass as a table (what the table functions return).
#[derive(Debug)]
pub struct PassTable {
    spec: PassSpec,
    schema: SchemaRef,
}

impl PassTable {
    pub fn new(spec: PassSpec) -> crate::Result<Self> {
        let schema = spec.schema()?;
        Ok(PassTable { spec, schema })
    }

    pub fn spec(&self) -> &PassSpec {
        &self.spec
    }
}

#[async_trait]
impl TableProvider for PassTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(PassExec::new(
            self.spec.clone(),
            projection.cloned(),
        )?))
    }
}

/// The plan of a [`PassTable`]: one partition per shard.
///
/// Its child is the list of shards, an in-memory table with one row (the
/// shard's number) per partition: a cluster's scheduler restricts each
/// task's plan to the partitions it runs by slicing such tables (it cannot
/// slice a plan it does not know), so a task gets the shards it must run
/// and no other. Partition `p` runs the shards of its child's partition `p`
/// (one, unless something between them regrouped the list).
#[derive(Debug)]
pub struct PassExec {
    spec: PassSpec,
    /// The columns kept, by index into the spec's schema (all when `None`).
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    shards: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

/// The column of the shard list.
const SHARD_LIST_COLUMN: &str = "shard";

impl PassExec {
    /// The plan of every shard of `spec`.
    pub fn new(spec: PassSpec, projection: Option<Vec<usize>>) -> Result<Self> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            SHARD_LIST_COLUMN,
            DataType::UInt32,
            false,
        )]));
        let partitions = (0..spec.partitions())
            .map(|shard| {
                let column = Arc::new(UInt32Array::from(vec![shard as u32]));
                Ok(vec![RecordBatch::try_new(schema.clone(), vec![column])?])
            })
            .collect::<Result<Vec<_>>>()?;
        let shards = MemorySourceConfig::try_new_exec(&partitions, schema, None)?;
        Self::over(spec, projection, shards)
    }

    /// The plan of the shards that `shards` (a shard list) lists.
    pub fn over(
        spec: PassSpec,
        projection: Option<Vec<usize>>,
        shards: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        let full = spec.schema().map_err(external)?;
        let schema = match &projection {
            Some(columns) => Arc::new(full.project(columns)?),
            None => full,
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(
                shards.properties().output_partitioning().partition_count(),
            ),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(PassExec {
            spec,
            projection,
            schema,
            shards,
            properties: Arc::new(properties),
        })
    }

    pub fn spec(&self) -> &PassSpec {
        &self.spec
    }

    pub fn projection(&self) -> Option<&[usize]> {
        self.projection.as_deref()
    }
}

impl DisplayAs for PassExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "PassExec: {}, {} of {} shard(s)",
            self.spec.name(),
            self.properties.output_partitioning().partition_count(),
            self.spec.partitions()
        )
    }
}

/// The columns [`SHARD_COLUMNS`] of a batch of `rows` rows of shard `tag`:
/// the screen's `counts` on its last row when given, null elsewhere.
fn shard_columns(tag: u32, rows: usize, counts: Option<ScreenCounts>) -> [ArrayRef; 3] {
    let on_last_row = |count: Option<u64>| -> ArrayRef {
        Arc::new(UInt64Array::from_iter(
            (0..rows).map(|row| count.filter(|_| row + 1 == rows)),
        ))
    };
    [
        Arc::new(UInt32Array::from_value(tag, rows)),
        on_last_row(counts.map(|c| c.screened)),
        on_last_row(counts.map(|c| c.rescored)),
    ]
}

/// The shard numbers a partition of a shard list holds (each below `count`).
fn shards_of(list: SendableRecordBatchStream, count: usize) -> Result<Vec<usize>> {
    let batches: Vec<RecordBatch> = futures::executor::block_on(list.try_collect())?;
    let mut shards = Vec::new();
    for batch in &batches {
        let column = batch
            .column(0)
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| DataFusionError::Internal("a shard list of another type".into()))?;
        for shard in column.values().iter().map(|&s| s as usize) {
            if shard >= count {
                return Err(DataFusionError::Internal(format!(
                    "shard {shard} of a pass of {count} shards"
                )));
            }
            shards.push(shard);
        }
    }
    Ok(shards)
}

/// One pass's share of the query's memory pool: reserved whole when the
/// pass starts (half of what the pool has left, half of its limit when it
/// is free), then cut down to what its plans use as soon as it has planned
/// ([`crate::plan::PlanLedger`]), so that the operators around it and the
/// other passes sharing the pool (partitions of one query, or several table
/// functions) get the rest. Passes take their budgets in turn: each starts
/// once the one before it has planned, so the free share it sees is real.
struct PassReservation {
    name: String,
    reservation: std::sync::Mutex<Option<MemoryReservation>>,
    /// The most any plan of the pass uses; `None` before the first plan.
    planned: std::sync::Mutex<Option<usize>>,
    /// Whether this pass still holds the planning turn.
    holds_turn: std::sync::atomic::AtomicBool,
}

/// Whether some pass holds the planning turn, and its waiters.
static PLANNING_TURN: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

fn take_planning_turn() {
    let (held, released) = &PLANNING_TURN;
    let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
    while *held {
        held = released.wait(held).unwrap_or_else(|e| e.into_inner());
    }
    *held = true;
}

fn give_back_planning_turn() {
    let (held, released) = &PLANNING_TURN;
    *held.lock().unwrap_or_else(|e| e.into_inner()) = false;
    released.notify_one();
}

impl PassReservation {
    /// Reserves a pass's budget from `pool` (after the passes before it have
    /// planned): refused only when the budget is below a sixteenth of the
    /// limit, where the pool is mostly taken.
    fn reserve(pool: &Arc<dyn MemoryPool>, name: &str) -> Result<(Arc<PassReservation>, usize)> {
        take_planning_turn();
        let limit = match pool.memory_limit() {
            MemoryLimit::Finite(bytes) => bytes,
            _ => MemoryBudget::DEFAULT.bytes(),
        };
        let free = limit.saturating_sub(pool.reserved());
        let budget = (limit / 2).min(free / 2);
        let reservation = MemoryConsumer::new(name).register(pool);
        let reserved = if budget < limit / 16 {
            Err(DataFusionError::ResourcesExhausted(format!(
                "{name} needs half of what is free in the memory pool, at least a sixteenth of it ({}), and only {} of it are free; raise --memory-limit",
                human_bytes(limit as u64 / 16),
                human_bytes(free as u64)
            )))
        } else {
            reservation.try_grow(budget)
        };
        if let Err(e) = reserved {
            give_back_planning_turn();
            return Err(e);
        }
        let pass = PassReservation {
            name: name.to_owned(),
            reservation: std::sync::Mutex::new(Some(reservation)),
            planned: std::sync::Mutex::new(None),
            holds_turn: std::sync::atomic::AtomicBool::new(true),
        };
        Ok((Arc::new(pass), budget))
    }

    fn give_back_turn(&self) {
        if self.holds_turn.swap(false, Ordering::AcqRel) {
            give_back_planning_turn();
        }
    }

    /// Returns the pass's memory to the pool (the pass ended).
    fn release(&self) {
        self.give_back_turn();
        self.reservation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

impl crate::plan::PlanLedger for PassReservation {
    fn planned(&self, bytes: usize) -> crate::Result<()> {
        let mut planned = self.planned.lock().unwrap_or_else(|e| e.into_inner());
        let most = planned.map_or(bytes, |p| p.max(bytes));
        if let Some(reservation) = self
            .reservation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            reservation.try_resize(most).map_err(|e| {
                HubnormError::Budget(format!(
                    "{}: the query's memory pool cannot hold this pass's plan ({e}); raise --memory-limit",
                    self.name
                ))
            })?;
        }
        *planned = Some(most);
        drop(planned);
        self.give_back_turn();
        Ok(())
    }
}

/// Releases a pass's reservation however the pass ends (a panic too).
struct ReleaseOnDrop(Arc<PassReservation>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl ExecutionPlan for PassExec {
    fn name(&self) -> &str {
        "PassExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.shards]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // One partition per shard already: regrouping the list gains nothing.
        vec![false]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [shards] = <[_; 1]>::try_from(children).map_err(|_| {
            DataFusionError::Internal("PassExec has one child, its shard list".into())
        })?;
        Ok(Arc::new(Self::over(
            self.spec.clone(),
            self.projection.clone(),
            shards,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let shard_list = self.shards.execute(partition, ctx.clone())?;
        // Two batches in flight: the pass waits when the consumer is slower.
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), 2);
        let tx = builder.tx();
        let pool = ctx.memory_pool().clone();
        let spec = self.spec.clone();
        let projection = self.projection.clone();
        let schema = self.schema.clone();
        builder.spawn_blocking(move || {
            let shards = shards_of(shard_list, spec.partitions())?;
            let (reservation, budget) = PassReservation::reserve(&pool, spec.name())?;
            let _release = ReleaseOnDrop(reservation.clone());
            let ledger: Arc<dyn crate::plan::PlanLedger> = reservation;
            for shard in shards {
                let tag = spec.shard_column.then_some(shard as u32);
                let closed = || HubnormError::Interrupted("the query stopped reading".into());
                // `counts` goes on the batch's last row, with the shard columns.
                let deliver = |batch: &RecordBatch, counts: Option<ScreenCounts>| {
                    let mut columns = batch.columns().to_vec();
                    if let Some(tag) = tag {
                        columns.extend(shard_columns(tag, batch.num_rows(), counts));
                    }
                    if let Some(indices) = &projection {
                        columns = indices.iter().map(|&i| columns[i].clone()).collect();
                    }
                    // No column projected (`count(*)`): the rows still count.
                    let rows = datafusion::arrow::array::RecordBatchOptions::new()
                        .with_row_count(Some(batch.num_rows()));
                    let batch = RecordBatch::try_new_with_options(schema.clone(), columns, &rows)?;
                    tx.blocking_send(Ok(batch)).map_err(|_| closed())
                };
                // With shard columns, the shard's last batch waits for the
                // counts, known once the shard has run.
                let mut last: Option<RecordBatch> = None;
                let mut send = |batch: &RecordBatch| match tag {
                    None => deliver(batch, None),
                    Some(_) if batch.num_rows() == 0 => Ok(()),
                    Some(_) => match last.replace(batch.clone()) {
                        Some(earlier) => deliver(&earlier, None),
                        None => Ok(()),
                    },
                };
                let ran = crate::plan::with_ledger(Some(ledger.clone()), || {
                    spec.run(shard, budget, &mut send)
                })
                .and_then(|counts| match &last {
                    Some(batch) => deliver(batch, Some(counts)),
                    None => Ok(()),
                });
                match ran {
                    // A consumer that stopped early (LIMIT) is not an error.
                    Err(HubnormError::Interrupted(_)) if tx.is_closed() => return Ok(()),
                    other => other.map_err(external)?,
                }
            }
            Ok(())
        });
        Ok(builder.build())
    }
}
