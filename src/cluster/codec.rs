//! hubnorm's plan nodes through Ballista: the passes as tables
//! ([`PassTable`], between client and scheduler) and as plans
//! ([`PassExec`], between scheduler and executors), each sent as its
//! [`PassSpec`]. Ballista's codecs have no hook to add nodes to, so these
//! wrap them and hand everything else to them.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{internal_err, DataFusionError, Result, TableReference};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde::{Deserialize, Serialize};

use crate::sql::external;
use crate::sql::pass::{PassExec, PassSpec, PassTable};

/// The first bytes of an encoded [`PassTable`] (Ballista's own codec
/// encodes no table provider, so nothing else starts with them).
const PASS_TABLE: &[u8] = b"hubnorm-pass-table\0";

/// The logical codec of clients and schedulers.
#[derive(Debug, Default)]
pub struct LogicalCodec {
    ballista: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        self.ballista.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        let Some(spec) = buf.strip_prefix(PASS_TABLE) else {
            return self
                .ballista
                .try_decode_table_provider(buf, table_ref, schema, ctx);
        };
        let table =
            PassTable::new(PassSpec::from_bytes(spec).map_err(external)?).map_err(external)?;
        Ok(Arc::new(table))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        match node.downcast_ref::<PassTable>() {
            Some(table) => {
                buf.extend_from_slice(PASS_TABLE);
                buf.extend(table.spec().to_bytes().map_err(external)?);
                Ok(())
            }
            None => self
                .ballista
                .try_encode_table_provider(table_ref, node, buf),
        }
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn FileFormatFactory>> {
        self.ballista.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> Result<()> {
        self.ballista.try_encode_file_format(buf, node)
    }
}

/// A [`PassExec`] as it travels.
#[derive(Serialize, Deserialize)]
struct EncodedPassExec {
    spec: PassSpec,
    projection: Option<Vec<usize>>,
}

/// The tag byte before each node this codec encodes.
const BALLISTA_NODE: u8 = 0;
const PASS_EXEC: u8 = 1;

/// The physical codec of schedulers and executors (and of clients, which
/// Ballista asks for one).
#[derive(Debug, Default)]
pub struct PhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match buf.split_first() {
            Some((&PASS_EXEC, rest)) => {
                let node: EncodedPassExec = serde_json::from_slice(rest)
                    .map_err(|e| DataFusionError::Internal(format!("a PassExec: {e}")))?;
                let [shards] = inputs else {
                    return internal_err!("a PassExec without its shard list");
                };
                Ok(Arc::new(PassExec::over(
                    node.spec,
                    node.projection,
                    shards.clone(),
                )?))
            }
            Some((&BALLISTA_NODE, rest)) => self.ballista.try_decode(rest, inputs, ctx, converter),
            _ => internal_err!("a plan node not encoded by hubnorm's codec"),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        match node.downcast_ref::<PassExec>() {
            Some(exec) => {
                buf.push(PASS_EXEC);
                let node = EncodedPassExec {
                    spec: exec.spec().clone(),
                    projection: exec.projection().map(<[usize]>::to_vec),
                };
                serde_json::to_writer(&mut *buf, &node)
                    .map_err(|e| DataFusionError::Internal(format!("a PassExec: {e}")))
            }
            None => {
                buf.push(BALLISTA_NODE);
                self.ballista.try_encode(node, buf, converter)
            }
        }
    }
}
