//! Which statistics a set of methods needs from pass 1, and the columns of
//! `gallery_stats.parquet` they become: the union of what each registered
//! method declares ([`crate::method::Method`]).
//!
//! Every method's columns start with its [`MethodSpec::column_prefix`]
//! (method and parameters, e.g. `nnn_alpha0.75_k128`) and follow with the
//! suffixes its module declares; `_correction` is h(g) in similarity units
//! (score = s − h), the other columns are the mergeable states it came
//! from. Columns known only after the last gallery chunk (activation sets,
//! Sinkhorn potentials) come last in the schema, after every method's early
//! columns.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{Field, Schema, SchemaRef};

use crate::bank::pass::{BankPassOutput, StatsChunk};
use crate::bank::states::Moments;
use crate::error::Result;
use crate::kernel::ColumnStatsRequest;
use crate::method::{BankNeeds, ChunkContext, ColumnKind, LateContext, MethodSpec, SinkhornSetup};
use crate::source::IdKind;

/// The moments of the banks that `dn` and `mp` read: of the query bank,
/// and of the gallery bank (or of the gallery when there is no gallery
/// bank). The covariances are there when some method asked for them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BankMoments {
    pub query_bank: Moments,
    pub gallery: Moments,
}

impl BankMoments {
    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.query_bank.memory_bytes() + self.gallery.memory_bytes()
    }
}

/// A column of the stats file: its full name and type.
pub type NamedColumn = (String, ColumnKind);

/// The statistics requested from the banks by a set of methods, and how
/// they turn into columns.
#[derive(Debug, Clone)]
pub struct StatsLayout {
    methods: Vec<MethodSpec>,
    needs: BankNeeds,
}

impl StatsLayout {
    /// The layout for `methods` (those without a gallery statistic, `none`
    /// and `sinkhorn-pp`, are skipped).
    pub fn new(methods: &[MethodSpec]) -> Self {
        let methods: Vec<MethodSpec> = methods
            .iter()
            .filter(|m| m.method().has_statistics())
            .copied()
            .collect();
        let mut needs = BankNeeds::default();
        for m in &methods {
            m.method().request(m, &mut needs);
        }
        StatsLayout { methods, needs }
    }

    /// The methods with statistics, in order.
    pub fn methods(&self) -> &[MethodSpec] {
        &self.methods
    }

    /// What pass 1 computes from the query bank.
    pub fn bank_request(&self) -> ColumnStatsRequest<'_> {
        ColumnStatsRequest {
            betas: &self.needs.bank_betas,
            column_top_k: self.needs.column_top_k,
            column_top_rows: self.needs.neighbour_ks.iter().copied().max().unwrap_or(0),
            neighbour_means: &self.needs.neighbour_ks,
            keep_all: self.needs.keep_all,
            row_top_k: self.needs.bank_activation_k,
        }
    }

    /// What pass 1 computes from the gallery bank.
    pub fn gallery_bank_request(&self) -> ColumnStatsRequest<'_> {
        ColumnStatsRequest {
            betas: &self.needs.gallery_bank_betas,
            row_top_k: self.needs.gallery_bank_activation_k,
            ..ColumnStatsRequest::default()
        }
    }

    /// Whether some method reads the gallery bank's similarities.
    pub fn needs_gallery_bank_tiles(&self) -> bool {
        self.gallery_bank_request().needs_tiles()
    }

    /// Whether some method needs the bank moments (`dn`, `mp`), and
    /// whether the covariances too (`mp`).
    pub fn needs_moments(&self) -> Option<bool> {
        self.needs.means.then_some(self.needs.covariances)
    }

    /// The stats file's metadata of every method from the bank moments
    /// (each key once).
    pub fn file_metadata(&self, moments: &BankMoments) -> Vec<(String, String)> {
        let mut metadata: Vec<(String, String)> = Vec::new();
        for m in &self.methods {
            for (key, value) in m.method().file_metadata(m, moments) {
                if !metadata.iter().any(|(k, _)| *k == key) {
                    metadata.push((key, value));
                }
            }
        }
        metadata
    }

    /// Columns written as each chunk finishes, then the columns known only
    /// at the end (activation sets, Sinkhorn potentials), in schema order
    /// after `gallery_id`.
    pub fn columns(&self) -> (Vec<NamedColumn>, Vec<NamedColumn>) {
        let mut early = Vec::new();
        let mut late = Vec::new();
        for m in &self.methods {
            for c in m.method().columns(m) {
                let column = (m.column(c.suffix), c.kind);
                if c.late {
                    late.push(column);
                } else {
                    early.push(column);
                }
            }
        }
        (early, late)
    }

    /// Schema of `gallery_stats.parquet`: `gallery_id`, then every column.
    pub fn schema(&self, id_kind: IdKind) -> SchemaRef {
        let (early, late) = self.columns();
        let mut fields = vec![Field::new("gallery_id", id_kind.data_type(), false)];
        for (name, kind) in early.into_iter().chain(late) {
            fields.push(Field::new(name, kind.data_type(), false));
        }
        Arc::new(Schema::new(fields))
    }

    /// Bytes per gallery item of one chunk's output columns, with a query
    /// bank of `bank_rows` rows.
    pub fn output_row_bytes(&self, bank_rows: u64) -> usize {
        let (early, late) = self.columns();
        early
            .iter()
            .chain(&late)
            .map(|(_, kind)| kind.row_bytes())
            .sum::<usize>()
            + self.needs.column_top_k * 4 * 2
            + if self.needs.keep_all {
                bank_rows as usize * 4
            } else {
                0
            }
    }

    /// The early columns of one finished gallery chunk, in schema order
    /// (without `gallery_id`).
    pub fn chunk_columns(
        &self,
        chunk: &StatsChunk<'_>,
        moments: Option<&BankMoments>,
    ) -> Result<Vec<ArrayRef>> {
        let context = ChunkContext {
            chunk,
            needs: &self.needs,
            moments,
        };
        Ok(self
            .methods
            .iter()
            .flat_map(|m| m.method().chunk_columns(m, &context))
            .collect())
    }

    /// The columns known only after the last gallery chunk, for the whole
    /// gallery, in schema order: activation sets from `output`, and each
    /// Sinkhorn method's target potential over the gallery from `potentials`
    /// (in the order of [`StatsLayout::sinkhorn_methods`]).
    pub fn late_columns(
        &self,
        output: &BankPassOutput,
        gallery_rows: usize,
        potentials: &[Vec<f64>],
    ) -> Vec<ArrayRef> {
        let mut potentials = potentials.iter();
        let mut columns = Vec::new();
        for m in &self.methods {
            let potential = m.method().sinkhorn(m).map(|_| {
                potentials
                    .next()
                    .expect("one potential per Sinkhorn method")
                    .as_slice()
            });
            let late = LateContext {
                output,
                gallery_rows,
                potential,
            };
            columns.extend(m.method().late_columns(m, &late));
        }
        columns
    }

    /// Whether some column is known only after the last gallery chunk
    /// (activation sets, Sinkhorn potentials): a checkpoint of the pass then
    /// keeps states across chunks, and no range of gallery rows can be
    /// computed on its own.
    pub fn has_late_columns(&self) -> bool {
        self.methods.iter().any(MethodSpec::has_late_columns)
    }

    /// The methods whose statistic comes from Sinkhorn sweeps, in order, with their setup.
    pub fn sinkhorn_methods(&self) -> Vec<(MethodSpec, SinkhornSetup)> {
        self.methods
            .iter()
            .filter_map(|m| m.method().sinkhorn(m).map(|s| (*m, s)))
            .collect()
    }
}
