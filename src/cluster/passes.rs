//! The client side of a pass on a cluster: the pass goes to the scheduler
//! as a sharded [`PassTable`], and its rows come back here, shard after
//! shard, into the same sinks as a one-machine run (so the outputs are
//! committed here, once every task has finished).
//!
//! Ballista hands a job's result partitions over in the order their tasks
//! finished, so each row carries its shard ([`SHARD_COLUMNS`]): the rows of
//! the next shard due go straight to the sink, those of later shards wait
//! in scratch Arrow files and follow in turn. The last row of each shard
//! also carries what its bf16 screen did, summed here for the summary.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::execution_plans::DistributedQueryExec;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::CancelJobParams;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Schema, SchemaRef, UInt32Type, UInt64Type};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::protobuf::LogicalPlanNode;
use futures::StreamExt;

use crate::error::{HubnormError, Result};
use crate::kernel::ScreenCounts;
use crate::sql::pass::{PassSpec, PassTable, SHARD_COLUMNS};
use crate::sql::SqlOptions;

use super::SchedulerAddress;

/// How long a client tries to cancel its job on the scheduler after a stop.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the sharded pass `spec` on the cluster of `scheduler`, hands its
/// rows to `emit` in shard order, without the shard columns, and returns
/// what the executors' bf16 screens did, summed. `spec` must be sharded
/// with [`PassSpec::shard_column`] set; `expected` holds the rows each
/// shard makes (a shard is complete, and the next one's turn, when they
/// are all in).
pub fn pass_rows(
    scheduler: &SchedulerAddress,
    spec: PassSpec,
    expected: Vec<u64>,
    options: &SqlOptions,
    emit: &mut dyn FnMut(&RecordBatch) -> Result<()>,
) -> Result<ScreenCounts> {
    if spec.shards.is_empty() || !spec.shard_column || expected.len() != spec.partitions() {
        return Err(HubnormError::Internal(
            "a pass sent to a cluster must be sharded with its shard column".into(),
        ));
    }
    super::runtime(options.threads)?.block_on(async {
        let ctx = super::session(scheduler, options).await?;
        // A task's hubnorm error (bad input, say) arrives as text.
        let cluster_error = |e: datafusion::error::DataFusionError| {
            let text = e.strip_backtrace();
            HubnormError::from_carried(&text)
                .unwrap_or_else(|| HubnormError::Cluster(format!("{scheduler}: {text}")))
        };
        let frame = ctx
            .read_table(Arc::new(PassTable::new(spec.clone())?))
            .map_err(cluster_error)?;
        let plan = frame.create_physical_plan().await.map_err(cluster_error)?;
        let mut stream = plan.execute(0, ctx.task_ctx()).map_err(cluster_error)?;
        let mut order = ShardOrder::new(expected, plan.schema())?;
        loop {
            let next = match crate::storage::unless_stopped(stream.next()).await {
                Ok(next) => next,
                Err(stop) => {
                    cancel(scheduler, plan.as_ref(), &mut stream).await;
                    return Err(stop);
                }
            };
            match next {
                Some(batch) => order.push(batch.map_err(cluster_error)?, emit)?,
                None => break,
            }
        }
        order.finish()
    })
}

/// Asks the scheduler to cancel the job of `plan`, whose rows `stream`
/// brings (best effort: the stop is what the user sees, whether or not the
/// scheduler answers).
pub(crate) async fn cancel(
    scheduler: &SchedulerAddress,
    plan: &dyn ExecutionPlan,
    stream: &mut SendableRecordBatchStream,
) {
    let request = async {
        let job_id = job_id(plan, stream).await?;
        let mut client = SchedulerGrpcClient::connect(scheduler.grpc_url())
            .await
            .ok()?;
        client.cancel_job(CancelJobParams { job_id }).await.ok()
    };
    if tokio::time::timeout(CANCEL_TIMEOUT, request)
        .await
        .ok()
        .flatten()
        .is_none()
    {
        log::warn!("could not cancel the job on {scheduler}");
    }
}

/// The scheduler's id of the job of `plan`. It is known once the
/// scheduler's first answer has come back through `stream`, which may be
/// after the job's tasks started: until then the stream is kept going (its
/// rows dropped) and the id looked for every 20 ms.
async fn job_id(
    plan: &dyn ExecutionPlan,
    stream: &mut SendableRecordBatchStream,
) -> Option<String> {
    let query = plan.downcast_ref::<DistributedQueryExec<LogicalPlanNode>>()?;
    loop {
        if let Some(id) = query.job_id() {
            return Some(id.to_string());
        }
        // A timed-out `next` leaves the stream where it was.
        if let Ok(None) = tokio::time::timeout(Duration::from_millis(20), stream.next()).await {
            return query.job_id().map(|id| id.to_string());
        }
    }
}

/// Puts the rows of a sharded pass back in shard order.
struct ShardOrder {
    /// What the shards' screens did, summed over the rows in so far.
    screen: ScreenCounts,
    /// Rows each shard must have.
    expected: Vec<u64>,
    received: Vec<u64>,
    /// The shard whose rows go to the sink now.
    next: usize,
    /// Rows of shards that came early, by shard.
    waiting: Vec<Option<(PathBuf, FileWriter<File>)>>,
    scratch: tempfile::TempDir,
    /// The rows' schema without the shard columns.
    schema: SchemaRef,
}

impl ShardOrder {
    fn new(expected: Vec<u64>, schema: SchemaRef) -> Result<Self> {
        let shards = expected.len();
        let own = schema.fields().len().saturating_sub(SHARD_COLUMNS.len());
        let tail: Vec<&str> = schema.fields()[own..]
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        if tail != SHARD_COLUMNS {
            return Err(HubnormError::Internal(format!(
                "the cluster's rows do not end in the columns {}",
                SHARD_COLUMNS.join(", ")
            )));
        }
        let fields = schema.fields()[..own].to_vec();
        let scratch = tempfile::Builder::new()
            .prefix("hubnorm-shards-")
            .tempdir()
            .map_err(|e| HubnormError::io(std::env::temp_dir(), e))?;
        Ok(ShardOrder {
            screen: ScreenCounts::default(),
            expected,
            received: vec![0; shards],
            next: 0,
            waiting: (0..shards).map(|_| None).collect(),
            scratch,
            schema: Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        })
    }

    /// Takes one batch from the cluster (all its rows from one shard).
    fn push(
        &mut self,
        batch: RecordBatch,
        emit: &mut dyn FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let own = self.schema.fields().len();
        let tags = batch.column(own).as_primitive::<UInt32Type>();
        let count = |column: usize| -> u64 {
            let counts = batch.column(column).as_primitive::<UInt64Type>();
            counts.iter().flatten().sum()
        };
        self.screen.add(ScreenCounts {
            screened: count(own + 1),
            rescored: count(own + 2),
        });
        let shard = tags.value(0) as usize;
        if shard >= self.expected.len() || tags.iter().any(|t| t != Some(shard as u32)) {
            return Err(HubnormError::Cluster(format!(
                "the cluster returned a batch with rows of shard {shard} mixed with others, or of a shard that does not exist"
            )));
        }
        self.received[shard] += batch.num_rows() as u64;
        if self.received[shard] > self.expected[shard] {
            return Err(HubnormError::Cluster(format!(
                "the cluster returned more than the {} rows of shard {shard} (a task ran twice?)",
                self.expected[shard]
            )));
        }
        let rows = RecordBatch::try_new(self.schema.clone(), batch.columns()[..own].to_vec())?;
        if shard == self.next {
            emit(&rows)?;
        } else {
            self.wait(shard, &rows)?;
        }
        self.advance(emit)
    }

    /// Keeps `rows` of `shard` in its scratch file until its turn.
    fn wait(&mut self, shard: usize, rows: &RecordBatch) -> Result<()> {
        if self.waiting[shard].is_none() {
            let path = self.scratch.path().join(format!("shard-{shard}.arrow"));
            let file = File::create(&path).map_err(|e| HubnormError::io(&path, e))?;
            let writer = FileWriter::try_new(file, &self.schema)?;
            self.waiting[shard] = Some((path, writer));
        }
        let (_, writer) = self.waiting[shard].as_mut().expect("created above");
        writer.write(rows)?;
        Ok(())
    }

    /// Moves on past every complete shard, emitting the rows that waited for
    /// the shards that are due.
    fn advance(&mut self, emit: &mut dyn FnMut(&RecordBatch) -> Result<()>) -> Result<()> {
        while self.next < self.expected.len()
            && self.received[self.next] == self.expected[self.next]
        {
            self.next += 1;
            if let Some((path, mut writer)) = self.waiting.get_mut(self.next).and_then(Option::take)
            {
                writer.finish()?;
                drop(writer);
                let file = File::open(&path).map_err(|e| HubnormError::io(&path, e))?;
                for rows in FileReader::try_new(file, None)? {
                    emit(&rows?)?;
                }
                std::fs::remove_file(&path).map_err(|e| HubnormError::io(&path, e))?;
            }
        }
        Ok(())
    }

    /// Checks that every shard came back whole; what their screens did.
    fn finish(self) -> Result<ScreenCounts> {
        match (0..self.expected.len()).find(|&s| self.received[s] != self.expected[s]) {
            None => Ok(self.screen),
            Some(shard) => Err(HubnormError::Cluster(format!(
                "the cluster returned {} of the {} rows of shard {shard}",
                self.received[shard], self.expected[shard]
            ))),
        }
    }
}
