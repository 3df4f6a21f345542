//! Which statistics a set of methods needs from pass 1, and the columns of
//! `gallery_stats.parquet` they become.
//!
//! Every method's columns start with its [`MethodSpec::column_prefix`]
//! (method and parameters, e.g. `nnn_alpha0.75_k128`):
//!
//! | method | columns after the prefix |
//! |---|---|
//! | is | `_correction`, `_lse_max`, `_lse_sum` |
//! | dis | as is, plus `_active` (in the activation set) |
//! | nnn, csls | `_correction`, `_topk` (the k largest bank similarities, descending) |
//! | gc | `_sorted_sims` (every bank similarity, ascending) |
//! | dn | `_correction` (λ·⟨μ_Q, g⟩); the means are in the file's metadata |
//! | dsl | `_log_normaliser` (L(g) = LSE_b s(b, g)/θ), `_lse_max`, `_lse_sum` |
//! | sn, dbsn | `_correction` (the target potential f(g), known after the last sweep) |
//! | dual-is | `_correction`, `_query_lse_max/_sum`, `_gallery_lse_max/_sum` |
//! | dual-dis | as dual-is, plus `_query_correction`, `_gallery_correction`, `_query_active`, `_gallery_active` |
//!
//! `_correction` is h(g) in similarity units (score = s − h); the other
//! columns are the mergeable states it came from. Activation columns are
//! only known after the last gallery chunk, so they come last in the schema.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Float32Array, Float64Array, ListArray};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::bank::pass::{BankPassOutput, StatsChunk};
use crate::error::Result;
use crate::kernel::{ColumnStates, ColumnStatsRequest, LogSumExp};
use crate::options::MethodSpec;
use crate::source::IdKind;

/// Metadata key of the query-bank mean used by `dn`.
pub const DN_QUERY_BANK_MEAN_KEY: &str = "hubnorm.dn.query_bank_mean";
/// Metadata key of the gallery(-bank) mean used by `dn`.
pub const DN_GALLERY_MEAN_KEY: &str = "hubnorm.dn.gallery_mean";

/// The means `dn` shifts by: of the query bank, and of the gallery bank
/// (or of the gallery when there is no gallery bank).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DnMeans {
    pub query_bank: Vec<f64>,
    pub gallery: Vec<f64>,
}

/// One column's kind in the stats file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Float64,
    Boolean,
    /// A list of f32 per gallery item.
    ListFloat32,
}

impl ColumnKind {
    fn data_type(self) -> DataType {
        match self {
            ColumnKind::Float64 => DataType::Float64,
            ColumnKind::Boolean => DataType::Boolean,
            ColumnKind::ListFloat32 => {
                DataType::List(Arc::new(Field::new("item", DataType::Float32, false)))
            }
        }
    }
}

/// A column of the stats file: its name and kind.
pub type NamedColumn = (String, ColumnKind);

/// The statistics requested from the banks by a set of methods, and how
/// they turn into columns.
#[derive(Debug, Clone)]
pub struct StatsLayout {
    methods: Vec<MethodSpec>,
    bank_betas: Vec<f32>,
    gallery_bank_betas: Vec<f32>,
    column_top_k: usize,
    keep_all: bool,
    bank_activation_k: usize,
    gallery_bank_activation_k: usize,
}

fn push_unique(list: &mut Vec<f32>, beta: f64) {
    let beta = beta as f32;
    if !list.contains(&beta) {
        list.push(beta);
    }
}

impl StatsLayout {
    /// The layout for `methods` (`none` needs no statistic and is skipped).
    pub fn new(methods: &[MethodSpec]) -> Self {
        let mut layout = StatsLayout {
            methods: methods
                .iter()
                .filter(|m| m.kind().needs_bank())
                .copied()
                .collect(),
            bank_betas: Vec::new(),
            gallery_bank_betas: Vec::new(),
            column_top_k: 0,
            keep_all: false,
            bank_activation_k: 0,
            gallery_bank_activation_k: 0,
        };
        for m in layout.methods.clone() {
            match m {
                MethodSpec::None
                | MethodSpec::DistributionNormalisation { .. }
                | MethodSpec::Sinkhorn { .. }
                | MethodSpec::DualBankSinkhorn { .. }
                | MethodSpec::SinkhornPp { .. } => {}
                MethodSpec::InvertedSoftmax { beta } => push_unique(&mut layout.bank_betas, beta.0),
                MethodSpec::DualSoftmax { theta } => {
                    push_unique(&mut layout.bank_betas, 1.0 / theta)
                }
                MethodSpec::DynamicInvertedSoftmax { beta, activation_k } => {
                    push_unique(&mut layout.bank_betas, beta.0);
                    layout.bank_activation_k = layout.bank_activation_k.max(activation_k);
                }
                MethodSpec::NearestNeighbour { k, .. } | MethodSpec::Csls { k } => {
                    layout.column_top_k = layout.column_top_k.max(k)
                }
                MethodSpec::GloballyCorrected => layout.keep_all = true,
                MethodSpec::DualInvertedSoftmax { beta1, beta2 } => {
                    push_unique(&mut layout.bank_betas, beta1.0);
                    push_unique(&mut layout.gallery_bank_betas, beta2.0);
                }
                MethodSpec::DualDynamicInvertedSoftmax {
                    beta1,
                    beta2,
                    activation_k,
                } => {
                    push_unique(&mut layout.bank_betas, beta1.0);
                    push_unique(&mut layout.gallery_bank_betas, beta2.0);
                    layout.bank_activation_k = layout.bank_activation_k.max(activation_k);
                    layout.gallery_bank_activation_k =
                        layout.gallery_bank_activation_k.max(activation_k);
                }
            }
        }
        layout
    }

    /// The methods with statistics, in order.
    pub fn methods(&self) -> &[MethodSpec] {
        &self.methods
    }

    /// What pass 1 computes from the query bank.
    pub fn bank_request(&self) -> ColumnStatsRequest<'_> {
        ColumnStatsRequest {
            betas: &self.bank_betas,
            column_top_k: self.column_top_k,
            keep_all: self.keep_all,
            row_top_k: self.bank_activation_k,
        }
    }

    /// What pass 1 computes from the gallery bank.
    pub fn gallery_bank_request(&self) -> ColumnStatsRequest<'_> {
        ColumnStatsRequest {
            betas: &self.gallery_bank_betas,
            row_top_k: self.gallery_bank_activation_k,
            ..ColumnStatsRequest::default()
        }
    }

    /// Whether some method reads the gallery bank's similarities.
    pub fn needs_gallery_bank_tiles(&self) -> bool {
        self.gallery_bank_request().needs_tiles()
    }

    /// Whether `dn` is among the methods.
    pub fn needs_means(&self) -> bool {
        self.methods
            .iter()
            .any(|m| matches!(m, MethodSpec::DistributionNormalisation { .. }))
    }

    /// Columns written as each chunk finishes, then the columns known only
    /// at the end (activation sets, Sinkhorn potentials), in schema order
    /// after `gallery_id`.
    pub fn columns(&self) -> (Vec<NamedColumn>, Vec<NamedColumn>) {
        let mut early = Vec::new();
        let mut late = Vec::new();
        for m in &self.methods {
            let p = m.column_prefix();
            let f = |suffix: &str| (format!("{p}_{suffix}"), ColumnKind::Float64);
            match m {
                // sinkhorn-pp normalises each query with its own stack: no statistic.
                MethodSpec::None | MethodSpec::SinkhornPp { .. } => {}
                // The potentials are known only after the last sweep.
                MethodSpec::Sinkhorn { .. } | MethodSpec::DualBankSinkhorn { .. } => {
                    late.push(f("correction"))
                }
                MethodSpec::InvertedSoftmax { .. } => {
                    early.extend([f("correction"), f("lse_max"), f("lse_sum")])
                }
                MethodSpec::DualSoftmax { .. } => {
                    early.extend([f("log_normaliser"), f("lse_max"), f("lse_sum")])
                }
                MethodSpec::DynamicInvertedSoftmax { .. } => {
                    early.extend([f("correction"), f("lse_max"), f("lse_sum")]);
                    late.push((format!("{p}_active"), ColumnKind::Boolean));
                }
                MethodSpec::NearestNeighbour { .. } | MethodSpec::Csls { .. } => early.extend([
                    f("correction"),
                    (format!("{p}_topk"), ColumnKind::ListFloat32),
                ]),
                MethodSpec::GloballyCorrected => {
                    early.push((format!("{p}_sorted_sims"), ColumnKind::ListFloat32))
                }
                MethodSpec::DistributionNormalisation { .. } => early.push(f("correction")),
                MethodSpec::DualInvertedSoftmax { .. } => early.extend([
                    f("correction"),
                    f("query_lse_max"),
                    f("query_lse_sum"),
                    f("gallery_lse_max"),
                    f("gallery_lse_sum"),
                ]),
                MethodSpec::DualDynamicInvertedSoftmax { .. } => {
                    early.extend([
                        f("correction"),
                        f("query_correction"),
                        f("gallery_correction"),
                        f("query_lse_max"),
                        f("query_lse_sum"),
                        f("gallery_lse_max"),
                        f("gallery_lse_sum"),
                    ]);
                    late.push((format!("{p}_query_active"), ColumnKind::Boolean));
                    late.push((format!("{p}_gallery_active"), ColumnKind::Boolean));
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
            .map(|(_, kind)| match kind {
                ColumnKind::Float64 => 8,
                ColumnKind::Boolean => 1,
                ColumnKind::ListFloat32 => 8,
            })
            .sum::<usize>()
            + self.column_top_k * 4 * 2
            + if self.keep_all {
                bank_rows as usize * 4
            } else {
                0
            }
    }

    /// The early columns of one finished gallery chunk, in schema order
    /// (without `gallery_id`). `bank_rows` is the query bank's size (the
    /// width of `gc`'s lists).
    pub fn chunk_columns(
        &self,
        chunk: &StatsChunk<'_>,
        means: Option<&DnMeans>,
    ) -> Result<Vec<ArrayRef>> {
        let rows = chunk.gallery.rows;
        let lse = |states: &ColumnStates, betas: &[f32], beta: f64, i: usize| -> LogSumExp {
            let nb = betas.len();
            let b = betas
                .iter()
                .position(|&x| x == beta as f32)
                .expect("β requested by the layout");
            states.lse[i * nb + b]
        };
        let bank_lse = |beta: f64, i: usize| lse(chunk.bank, &self.bank_betas, beta, i);
        let gallery_lse =
            |beta: f64, i: usize| lse(chunk.gallery_bank, &self.gallery_bank_betas, beta, i);
        let f64s = |f: &dyn Fn(usize) -> f64| -> ArrayRef {
            Arc::new(Float64Array::from_iter_values((0..rows).map(f)))
        };
        let mut columns: Vec<ArrayRef> = Vec::new();
        for m in &self.methods {
            match *m {
                MethodSpec::None
                | MethodSpec::Sinkhorn { .. }
                | MethodSpec::DualBankSinkhorn { .. }
                | MethodSpec::SinkhornPp { .. } => {}
                MethodSpec::InvertedSoftmax { beta }
                | MethodSpec::DynamicInvertedSoftmax { beta, .. } => {
                    columns.push(f64s(&|i| bank_lse(beta.0, i).value() / beta.0));
                    columns.push(f64s(&|i| bank_lse(beta.0, i).max));
                    columns.push(f64s(&|i| bank_lse(beta.0, i).sum));
                }
                MethodSpec::DualSoftmax { theta } => {
                    // L(g) = LSE_b s(b, g)/θ, the log of the column softmax's denominator.
                    let beta = 1.0 / theta;
                    columns.push(f64s(&|i| bank_lse(beta, i).value()));
                    columns.push(f64s(&|i| bank_lse(beta, i).max));
                    columns.push(f64s(&|i| bank_lse(beta, i).sum));
                }
                MethodSpec::NearestNeighbour { alpha, k } => {
                    columns.push(f64s(&|i| {
                        alpha * chunk.bank.top[i].mean_of_largest(k).unwrap_or(0.0)
                    }));
                    columns.push(top_lists(&chunk.bank.top, k));
                }
                MethodSpec::Csls { k } => {
                    columns.push(f64s(&|i| {
                        0.5 * chunk.bank.top[i].mean_of_largest(k).unwrap_or(0.0)
                    }));
                    columns.push(top_lists(&chunk.bank.top, k));
                }
                MethodSpec::GloballyCorrected => columns.push(sorted_lists(&chunk.bank.all)),
                MethodSpec::DistributionNormalisation { lambda } => {
                    let mean = &means.expect("means computed for dn").query_bank;
                    let dim = chunk.gallery.dim;
                    columns.push(f64s(&|i| {
                        let g = &chunk.gallery.data[i * dim..(i + 1) * dim];
                        lambda * g.iter().zip(mean).map(|(&a, b)| a as f64 * b).sum::<f64>()
                    }));
                }
                MethodSpec::DualInvertedSoftmax { beta1, beta2 }
                | MethodSpec::DualDynamicInvertedSoftmax { beta1, beta2, .. } => {
                    let (b1, b2) = (beta1.0, beta2.0);
                    columns.push(f64s(&|i| {
                        (bank_lse(b1, i).value() + gallery_lse(b2, i).value()) / (b1 + b2)
                    }));
                    if matches!(m, MethodSpec::DualDynamicInvertedSoftmax { .. }) {
                        columns.push(f64s(&|i| bank_lse(b1, i).value() / b1));
                        columns.push(f64s(&|i| gallery_lse(b2, i).value() / b2));
                    }
                    columns.push(f64s(&|i| bank_lse(b1, i).max));
                    columns.push(f64s(&|i| bank_lse(b1, i).sum));
                    columns.push(f64s(&|i| gallery_lse(b2, i).max));
                    columns.push(f64s(&|i| gallery_lse(b2, i).sum));
                }
            }
        }
        Ok(columns)
    }

    /// The columns known only after the last gallery chunk, for the whole
    /// gallery, in schema order: activation sets from `output`, and each
    /// Sinkhorn method's target potential over the gallery from `potentials`
    /// (in the order of the methods).
    pub fn late_columns(
        &self,
        output: &BankPassOutput,
        gallery_rows: usize,
        potentials: &[Vec<f64>],
    ) -> Vec<ArrayRef> {
        let mut columns = Vec::new();
        let mut potentials = potentials.iter();
        let active = |state: &crate::bank::states::ActivationState, k: usize| {
            // The pass kept the largest k_A any method asked for.
            bool_array(&state.truncated(k).activated(gallery_rows))
        };
        for m in &self.methods {
            match m {
                MethodSpec::DynamicInvertedSoftmax { activation_k, .. } => {
                    columns.push(active(&output.bank_activation, *activation_k))
                }
                MethodSpec::DualDynamicInvertedSoftmax { activation_k, .. } => {
                    columns.push(active(&output.bank_activation, *activation_k));
                    columns.push(active(&output.gallery_bank_activation, *activation_k));
                }
                MethodSpec::Sinkhorn { .. } | MethodSpec::DualBankSinkhorn { .. } => {
                    let f = potentials
                        .next()
                        .expect("one potential per Sinkhorn method");
                    columns.push(Arc::new(Float64Array::from(f[..gallery_rows].to_vec())));
                }
                _ => {}
            }
        }
        columns
    }

    /// The Sinkhorn methods, in order.
    pub fn sinkhorn_methods(&self) -> Vec<MethodSpec> {
        self.methods
            .iter()
            .filter(|m| {
                matches!(
                    m,
                    MethodSpec::Sinkhorn { .. } | MethodSpec::DualBankSinkhorn { .. }
                )
            })
            .copied()
            .collect()
    }
}

fn list_array(lengths: Vec<usize>, values: Vec<f32>) -> ArrayRef {
    Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(Float32Array::from(values)),
        None,
    ))
}

/// The `k` largest values of each column, descending.
fn top_lists(tops: &[crate::kernel::TopValues], k: usize) -> ArrayRef {
    let mut lengths = Vec::with_capacity(tops.len());
    let mut values = Vec::new();
    for top in tops {
        let sorted = top.sorted();
        let take = k.min(sorted.len());
        values.extend_from_slice(&sorted[..take]);
        lengths.push(take);
    }
    list_array(lengths, values)
}

/// Every value of each column (sorted by the pass).
fn sorted_lists(all: &[Vec<f32>]) -> ArrayRef {
    let lengths = all.iter().map(Vec::len).collect();
    let values = all.iter().flatten().copied().collect();
    list_array(lengths, values)
}

/// A Boolean column.
fn bool_array(values: &[bool]) -> ArrayRef {
    Arc::new(BooleanArray::from(values.to_vec()))
}
