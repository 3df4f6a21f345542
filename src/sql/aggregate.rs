//! Aggregate SQL functions over long-format tables, adapting the native
//! pass's mergeable statistics (DESIGN.md, decisions 2 and 6):
//!
//! | function | native struct | state between partial and final aggregation |
//! |---|---|---|
//! | `hub_is_correction(score, β)` | [`LogSumExp`] of β·s | running max, Σ exp(·− max) |
//! | `hub_topk_mean(score, k)` | [`TopValues`] | the k largest scores |
//! | `hub_hubness(gallery_id, measure, k, gallery_size)` | [`KOccurrence`] | (id, count) lists |
//! | `hub_moments(embedding)` | [`RowMoments`] | count, mean, Σ (x − m)(x − m)ᵀ |
//!
//! Each has a row accumulator and a [`GroupsAccumulator`] (one state per
//! group in a vector), both thin adapters over one `Statistic` so they
//! cannot disagree.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Array, Float64Array, ListArray, RecordBatch,
    StringArray, StructArray, UInt64Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Float32Type, Float64Type, Schema, UInt64Type,
};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, EmitTo, GroupsAccumulator,
    Signature, Volatility,
};
use datafusion::physical_expr::PhysicalExpr;

use crate::bank::RowMoments;
use crate::kernel::{LogSumExp, TopValues};
use crate::report::{HubnessMeasures, KOccurrence};

use super::scalar::Embeddings;

/// A mergeable statistic as SQL sees it: how input rows and partial states
/// fold into per-group states, and what a state evaluates to.
trait Statistic: Debug + Send + Sync + 'static {
    type State: Clone + Debug + Send + Sync + 'static;

    fn empty(&self) -> Self::State;
    /// Folds input row i into `states[group(i)]` (rows with no group are skipped).
    fn update(
        &self,
        values: &[ArrayRef],
        group: &dyn Fn(usize) -> Option<usize>,
        states: &mut [Self::State],
    ) -> Result<()>;
    /// The state's fields (names prefixed by the aggregate's name).
    fn state_fields(&self, name: &str) -> Vec<Field>;
    fn state_arrays(&self, states: &[Self::State]) -> Result<Vec<ArrayRef>>;
    /// Merges partial state i of `state` into `states[groups[i]]`.
    fn merge(&self, state: &[ArrayRef], groups: &[usize], states: &mut [Self::State])
        -> Result<()>;
    fn evaluate(&self, states: &[Self::State]) -> Result<ArrayRef>;
    fn state_bytes(&self, state: &Self::State) -> usize;
}

/// One state: the accumulator of a query without GROUP BY (or of a group
/// when DataFusion does not use the groups path).
#[derive(Debug)]
struct RowAccumulator<S: Statistic> {
    statistic: Arc<S>,
    state: Vec<S::State>,
}

impl<S: Statistic> Accumulator for RowAccumulator<S> {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.statistic.update(values, &|_| Some(0), &mut self.state)
    }
    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let groups = vec![0; states.first().map_or(0, |a| a.len())];
        self.statistic.merge(states, &groups, &mut self.state)
    }
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.statistic
            .state_arrays(&self.state)?
            .iter()
            .map(|a| ScalarValue::try_from_array(a, 0))
            .collect()
    }
    fn evaluate(&mut self) -> Result<ScalarValue> {
        ScalarValue::try_from_array(&self.statistic.evaluate(&self.state)?, 0)
    }
    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.statistic.state_bytes(&self.state[0])
    }
}

/// Many groups: one state per group index.
#[derive(Debug)]
struct GroupsAdapter<S: Statistic> {
    statistic: Arc<S>,
    states: Vec<S::State>,
}

impl<S: Statistic> GroupsAdapter<S> {
    fn grow(&mut self, groups: usize) {
        if self.states.len() < groups {
            let empty = self.statistic.empty();
            self.states.resize(groups, empty);
        }
    }
}

fn selected(filter: Option<&BooleanArray>, i: usize) -> bool {
    filter.is_none_or(|f| f.is_valid(i) && f.value(i))
}

impl<S: Statistic> GroupsAccumulator for GroupsAdapter<S> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        let group = |i: usize| selected(opt_filter, i).then(|| group_indices[i]);
        self.statistic.update(values, &group, &mut self.states)
    }
    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        self.statistic
            .merge(values, group_indices, &mut self.states)
    }
    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let states = emit_to.take_needed(&mut self.states);
        self.statistic.evaluate(&states)
    }
    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let states = emit_to.take_needed(&mut self.states);
        self.statistic.state_arrays(&states)
    }
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        // Each row becomes its own partial state.
        let rows = values.first().map_or(0, |a| a.len());
        let mut states = vec![self.statistic.empty(); rows];
        let group = |i: usize| selected(opt_filter, i).then_some(i);
        self.statistic.update(values, &group, &mut states)?;
        self.statistic.state_arrays(&states)
    }
    fn size(&self) -> usize {
        // O(1) per the trait's contract: states are of similar size.
        let per = self
            .states
            .first()
            .map_or(0, |s| self.statistic.state_bytes(s));
        std::mem::size_of_val(self) + self.states.capacity() * per
    }
}

/// The value of a constant argument (a literal), read when the accumulator
/// is created.
fn literal(
    args: &AccumulatorArgs<'_>,
    i: usize,
    function: &str,
    what: &str,
) -> Result<ScalarValue> {
    let expr: &Arc<dyn PhysicalExpr> = &args.exprs[i];
    let empty = RecordBatch::new_empty(Arc::new(Schema::empty()));
    match expr.evaluate(&empty) {
        Ok(ColumnarValue::Scalar(value)) if !value.is_null() => Ok(value),
        _ => plan_err!("{function}: {what} must be a constant (e.g. a number literal)"),
    }
}

fn literal_f64(args: &AccumulatorArgs<'_>, i: usize, function: &str, what: &str) -> Result<f64> {
    let value = literal(args, i, function, what)?.cast_to(&DataType::Float64)?;
    match value {
        ScalarValue::Float64(Some(v)) => Ok(v),
        _ => plan_err!("{function}: {what} must be a number"),
    }
}

fn literal_k(args: &AccumulatorArgs<'_>, i: usize, function: &str) -> Result<usize> {
    let k = literal_f64(args, i, function, "k")?;
    if !(k >= 1.0 && k.fract() == 0.0 && k <= u32::MAX as f64) {
        return plan_err!("{function}: k must be a whole number ≥ 1, got {k}");
    }
    Ok(k as usize)
}

fn float64s(array: &ArrayRef) -> Result<ArrayRef> {
    Ok(cast(array, &DataType::Float64)?)
}

// ------------------------------------------------------------ hub_is_correction

/// h(g) = LSE_b(β·s(b, g)) / β over a group's scores.
#[derive(Debug)]
struct IsCorrection {
    beta: f64,
}

impl Statistic for IsCorrection {
    type State = LogSumExp;

    fn empty(&self) -> LogSumExp {
        LogSumExp::default()
    }
    fn update(
        &self,
        values: &[ArrayRef],
        group: &dyn Fn(usize) -> Option<usize>,
        states: &mut [LogSumExp],
    ) -> Result<()> {
        let scores = float64s(&values[0])?;
        for (i, s) in scores.as_primitive::<Float64Type>().iter().enumerate() {
            if let (Some(s), Some(g)) = (s, group(i)) {
                states[g].push(self.beta * s);
            }
        }
        Ok(())
    }
    fn state_fields(&self, name: &str) -> Vec<Field> {
        vec![
            Field::new(format!("{name}_lse_max"), DataType::Float64, true),
            Field::new(format!("{name}_lse_sum"), DataType::Float64, true),
        ]
    }
    fn state_arrays(&self, states: &[LogSumExp]) -> Result<Vec<ArrayRef>> {
        Ok(vec![
            Arc::new(Float64Array::from_iter_values(states.iter().map(|s| s.max))),
            Arc::new(Float64Array::from_iter_values(states.iter().map(|s| s.sum))),
        ])
    }
    fn merge(&self, state: &[ArrayRef], groups: &[usize], states: &mut [LogSumExp]) -> Result<()> {
        let max = state[0].as_primitive::<Float64Type>();
        let sum = state[1].as_primitive::<Float64Type>();
        for (i, &g) in groups.iter().enumerate() {
            states[g].merge(&LogSumExp {
                max: max.value(i),
                sum: sum.value(i),
            });
        }
        Ok(())
    }
    fn evaluate(&self, states: &[LogSumExp]) -> Result<ArrayRef> {
        Ok(Arc::new(Float64Array::from_iter(
            states
                .iter()
                .map(|s| (!s.is_empty()).then(|| s.value() / self.beta)),
        )))
    }
    fn state_bytes(&self, _: &LogSumExp) -> usize {
        std::mem::size_of::<LogSumExp>()
    }
}

// --------------------------------------------------------------- hub_topk_mean

/// Mean of a group's k largest scores (of all, when fewer).
#[derive(Debug)]
struct TopKMean {
    k: usize,
}

impl Statistic for TopKMean {
    type State = TopValues;

    fn empty(&self) -> TopValues {
        TopValues::new(self.k)
    }
    fn update(
        &self,
        values: &[ArrayRef],
        group: &dyn Fn(usize) -> Option<usize>,
        states: &mut [TopValues],
    ) -> Result<()> {
        // The native pass keeps f32 similarities; so does the SQL state.
        let scores = cast(&values[0], &DataType::Float32)?;
        for (i, s) in scores.as_primitive::<Float32Type>().iter().enumerate() {
            if let (Some(s), Some(g)) = (s, group(i)) {
                states[g].push(s);
            }
        }
        Ok(())
    }
    fn state_fields(&self, name: &str) -> Vec<Field> {
        vec![Field::new(
            format!("{name}_top"),
            DataType::List(Arc::new(Field::new_list_field(DataType::Float32, true))),
            true,
        )]
    }
    fn state_arrays(&self, states: &[TopValues]) -> Result<Vec<ArrayRef>> {
        let lists: Vec<Vec<f32>> = states.iter().map(TopValues::sorted).collect();
        let lengths = lists.iter().map(Vec::len);
        let offsets = OffsetBuffer::from_lengths(lengths);
        let values = Float32Array::from_iter_values(lists.into_iter().flatten());
        Ok(vec![Arc::new(ListArray::try_new(
            Arc::new(Field::new_list_field(DataType::Float32, true)),
            offsets,
            Arc::new(values),
            None,
        )?)])
    }
    fn merge(&self, state: &[ArrayRef], groups: &[usize], states: &mut [TopValues]) -> Result<()> {
        let lists = state[0].as_list::<i32>();
        for (i, &g) in groups.iter().enumerate() {
            let list = lists.value(i);
            for v in list.as_primitive::<Float32Type>().values() {
                states[g].push(*v);
            }
        }
        Ok(())
    }
    fn evaluate(&self, states: &[TopValues]) -> Result<ArrayRef> {
        Ok(Arc::new(Float64Array::from_iter(
            states.iter().map(|s| s.mean_of_largest(self.k)),
        )))
    }
    fn state_bytes(&self, _: &TopValues) -> usize {
        std::mem::size_of::<TopValues>() + self.k * 4
    }
}

// ----------------------------------------------------------------- hub_moments

/// The mean row and covariance of a group's embeddings (and the second
/// moment C = Σ + m mᵀ): what `mp` keeps of the query bank and of the
/// gallery side, mergeable across partitions.
#[derive(Debug)]
struct EmbeddingMoments;

fn f64_list(rows: impl Iterator<Item = Option<Vec<f64>>>) -> Result<ArrayRef> {
    let rows: Vec<Option<Vec<f64>>> = rows.collect();
    let offsets = OffsetBuffer::from_lengths(rows.iter().map(|r| r.as_ref().map_or(0, Vec::len)));
    let nulls: Vec<bool> = rows.iter().map(Option::is_some).collect();
    let values = Float64Array::from_iter_values(rows.into_iter().flatten().flatten());
    Ok(Arc::new(ListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Float64, true)),
        offsets,
        Arc::new(values),
        Some(nulls.into()),
    )?))
}

fn f64_list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true)))
}

/// The fields of `hub_moments`'s result.
fn moments_fields() -> Vec<Field> {
    vec![
        Field::new("rows", DataType::UInt64, false),
        Field::new("mean", f64_list_type(), false),
        Field::new("covariance", f64_list_type(), false),
        Field::new("second_moment", f64_list_type(), false),
    ]
}

impl Statistic for EmbeddingMoments {
    type State = RowMoments;

    fn empty(&self) -> RowMoments {
        RowMoments::with_covariance()
    }
    fn update(
        &self,
        values: &[ArrayRef],
        group: &dyn Fn(usize) -> Option<usize>,
        states: &mut [RowMoments],
    ) -> Result<()> {
        let rows = Embeddings::from_array(&values[0], "hub_moments")?;
        for i in 0..values[0].len() {
            let (Some(row), Some(g)) = (rows.row(i)?, group(i)) else {
                continue;
            };
            let dim = states[g].mean().len();
            if states[g].count() > 0 && row.len() != dim {
                return bad_input!(
                    "hub_moments: row {} has dimension {}, the group's earlier rows {dim}",
                    i + 1,
                    row.len()
                );
            }
            states[g].add_rows(row, row.len());
        }
        Ok(())
    }
    fn state_fields(&self, name: &str) -> Vec<Field> {
        vec![
            Field::new(format!("{name}_rows"), DataType::UInt64, true),
            Field::new(format!("{name}_mean"), f64_list_type(), true),
            Field::new(format!("{name}_centred"), f64_list_type(), true),
        ]
    }
    fn state_arrays(&self, states: &[RowMoments]) -> Result<Vec<ArrayRef>> {
        Ok(vec![
            Arc::new(UInt64Array::from_iter_values(
                states.iter().map(RowMoments::count),
            )),
            f64_list(states.iter().map(|s| Some(s.mean())))?,
            f64_list(states.iter().map(|s| {
                Some(
                    s.centred()
                        .map_or_else(Vec::new, |m| m.iter().copied().collect()),
                )
            }))?,
        ])
    }
    fn merge(&self, state: &[ArrayRef], groups: &[usize], states: &mut [RowMoments]) -> Result<()> {
        let count = state[0].as_primitive::<UInt64Type>();
        let (mean, centred) = (state[1].as_list::<i32>(), state[2].as_list::<i32>());
        let floats = |list: &ListArray, i: usize| -> Vec<f64> {
            list.value(i)
                .as_primitive::<Float64Type>()
                .values()
                .to_vec()
        };
        for (i, &g) in groups.iter().enumerate() {
            let mean = floats(mean, i);
            let dim = mean.len();
            let centred =
                ndarray::Array2::from_shape_vec((dim, dim), floats(centred, i)).map_err(|e| {
                    datafusion::error::DataFusionError::Internal(format!(
                        "hub_moments: a partial state of the wrong shape: {e}"
                    ))
                })?;
            let part = RowMoments::from_parts(count.value(i), mean, Some(centred));
            if states[g].count() > 0 && part.count() > 0 && states[g].mean().len() != dim {
                return bad_input!(
                    "hub_moments: embeddings of dimensions {} and {dim} in one group",
                    states[g].mean().len()
                );
            }
            states[g].merge(&part);
        }
        Ok(())
    }
    fn evaluate(&self, states: &[RowMoments]) -> Result<ArrayRef> {
        let finished: Vec<_> = states.iter().map(RowMoments::finish).collect();
        let present = |m: &crate::bank::Moments| m.rows > 0;
        let covariance = |m: &crate::bank::Moments| {
            m.covariance
                .as_ref()
                .map_or_else(Vec::new, |c| c.iter().copied().collect())
        };
        let second = |m: &crate::bank::Moments| {
            let d = m.mean.len();
            let mut c = covariance(m);
            for i in 0..d {
                for j in 0..d {
                    c[i * d + j] += m.mean[i] * m.mean[j];
                }
            }
            c
        };
        let nulls: Vec<bool> = finished.iter().map(present).collect();
        Ok(Arc::new(StructArray::try_new(
            moments_fields().into(),
            vec![
                Arc::new(UInt64Array::from_iter_values(
                    finished.iter().map(|m| m.rows),
                )),
                f64_list(finished.iter().map(|m| Some(m.mean.clone())))?,
                f64_list(finished.iter().map(|m| Some(covariance(m))))?,
                f64_list(finished.iter().map(|m| Some(second(m))))?,
            ],
            Some(nulls.into()),
        )?))
    }
    fn state_bytes(&self, state: &RowMoments) -> usize {
        let d = state.mean().len();
        std::mem::size_of::<RowMoments>() + (d + d * d) * 8
    }
}

// ----------------------------------------------------------------- hub_hubness

/// Occurrences of each gallery id in a group's rows, and the gallery size.
#[derive(Debug, Clone, Default)]
struct Occurrences {
    counts: HashMap<String, u64>,
    gallery_size: u64,
}

/// One hubness measure of REPORTS.md from a group's result rows (rows with
/// rank ≤ k, filtered by the query): gallery items that never occur count
/// as zero, so the gallery size is an argument.
#[derive(Debug)]
struct Hubness {
    measure: usize,
    k: usize,
}

impl Statistic for Hubness {
    type State = Occurrences;

    fn empty(&self) -> Occurrences {
        Occurrences::default()
    }
    fn update(
        &self,
        values: &[ArrayRef],
        group: &dyn Fn(usize) -> Option<usize>,
        states: &mut [Occurrences],
    ) -> Result<()> {
        let ids = cast(&values[0], &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let sizes = cast(&values[3], &DataType::UInt64)?;
        let sizes = sizes.as_primitive::<UInt64Type>();
        for i in 0..ids.len() {
            let Some(g) = group(i) else { continue };
            if ids.is_null(i) || sizes.is_null(i) {
                continue;
            }
            let state = &mut states[g];
            let size = sizes.value(i);
            if size == 0 || size > u32::MAX as u64 {
                return bad_input!(
                    "hub_hubness: gallery_size must be between 1 and {}, got {size}",
                    u32::MAX
                );
            }
            if state.gallery_size != 0 && state.gallery_size != size {
                return bad_input!(
                    "hub_hubness: gallery_size must be the same on every row of a group ({} and {size})",
                    state.gallery_size
                );
            }
            state.gallery_size = size;
            *state.counts.entry(ids.value(i).to_owned()).or_default() += 1;
        }
        Ok(())
    }
    fn state_fields(&self, name: &str) -> Vec<Field> {
        let list = |t: DataType| DataType::List(Arc::new(Field::new_list_field(t, true)));
        vec![
            Field::new(format!("{name}_ids"), list(DataType::Utf8), true),
            Field::new(format!("{name}_counts"), list(DataType::UInt64), true),
            Field::new(format!("{name}_gallery_size"), DataType::UInt64, true),
        ]
    }
    fn state_arrays(&self, states: &[Occurrences]) -> Result<Vec<ArrayRef>> {
        let lengths = || states.iter().map(|s| s.counts.len());
        let field = |t: DataType| Arc::new(Field::new_list_field(t, true));
        let ids: Vec<&str> = states
            .iter()
            .flat_map(|s| s.counts.keys().map(String::as_str))
            .collect();
        let counts: Vec<u64> = states
            .iter()
            .flat_map(|s| s.counts.values().copied())
            .collect();
        let (ids, counts) = (StringArray::from(ids), UInt64Array::from(counts));
        Ok(vec![
            Arc::new(ListArray::try_new(
                field(DataType::Utf8),
                OffsetBuffer::from_lengths(lengths()),
                Arc::new(ids),
                None,
            )?),
            Arc::new(ListArray::try_new(
                field(DataType::UInt64),
                OffsetBuffer::from_lengths(lengths()),
                Arc::new(counts),
                None,
            )?),
            Arc::new(UInt64Array::from_iter_values(
                states.iter().map(|s| s.gallery_size),
            )),
        ])
    }
    fn merge(
        &self,
        state: &[ArrayRef],
        groups: &[usize],
        states: &mut [Occurrences],
    ) -> Result<()> {
        let (ids, counts) = (state[0].as_list::<i32>(), state[1].as_list::<i32>());
        let sizes = state[2].as_primitive::<UInt64Type>();
        for (i, &g) in groups.iter().enumerate() {
            let target = &mut states[g];
            let size = sizes.value(i);
            if size != 0 && target.gallery_size != 0 && size != target.gallery_size {
                return bad_input!(
                    "hub_hubness: gallery_size must be the same on every row of a group ({} and {size})",
                    target.gallery_size
                );
            }
            target.gallery_size = target.gallery_size.max(size);
            let (id_list, count_list) = (ids.value(i), counts.value(i));
            let id_list = id_list.as_string::<i32>();
            let count_list = count_list.as_primitive::<UInt64Type>();
            for j in 0..id_list.len() {
                *target
                    .counts
                    .entry(id_list.value(j).to_owned())
                    .or_default() += count_list.value(j);
            }
        }
        Ok(())
    }
    fn evaluate(&self, states: &[Occurrences]) -> Result<ArrayRef> {
        let mut out = Vec::with_capacity(states.len());
        for s in states {
            if s.counts.is_empty() {
                out.push(None);
                continue;
            }
            if (s.counts.len() as u64) > s.gallery_size {
                return bad_input!(
                    "hub_hubness: {} distinct gallery ids, more than gallery_size {}",
                    s.counts.len(),
                    s.gallery_size
                );
            }
            // Sorted ids: the measures sum in a fixed order, whatever the partitioning.
            let mut by_id: Vec<(&String, &u64)> = s.counts.iter().collect();
            by_id.sort();
            let mut counts: Vec<u32> = by_id.iter().map(|(_, &c)| c as u32).collect();
            counts.resize(s.gallery_size as usize, 0);
            let occurrence = KOccurrence {
                k: self.k,
                queries: 0,
                counts,
            };
            out.push(Some(occurrence.measures(0).values()[self.measure].1));
        }
        Ok(Arc::new(Float64Array::from(out)))
    }
    fn state_bytes(&self, state: &Occurrences) -> usize {
        state.counts.len() * 48
    }
}

// ----------------------------------------------------------------- the UDAFs

/// Which statistic an aggregate function adapts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    IsCorrection,
    TopKMean,
    Hubness,
    Moments,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct StatisticUdaf {
    name: &'static str,
    kind: Kind,
    signature: Signature,
}

fn boxed<S: Statistic>(statistic: S) -> Box<dyn Accumulator> {
    let statistic = Arc::new(statistic);
    let state = vec![statistic.empty()];
    Box::new(RowAccumulator { statistic, state })
}

fn grouped<S: Statistic>(statistic: S) -> Box<dyn GroupsAccumulator> {
    Box::new(GroupsAdapter {
        statistic: Arc::new(statistic),
        states: Vec::new(),
    })
}

impl StatisticUdaf {
    fn is_correction(&self, args: &AccumulatorArgs<'_>) -> Result<IsCorrection> {
        let beta = literal_f64(args, 1, self.name, "β")?;
        if !(beta > 0.0 && beta.is_finite()) {
            return plan_err!("{}: β must be a positive number, got {beta}", self.name);
        }
        Ok(IsCorrection { beta })
    }
    fn top_k_mean(&self, args: &AccumulatorArgs<'_>) -> Result<TopKMean> {
        Ok(TopKMean {
            k: literal_k(args, 1, self.name)?,
        })
    }
    fn hubness(&self, args: &AccumulatorArgs<'_>) -> Result<Hubness> {
        let name = literal(args, 1, self.name, "the measure")?.to_string();
        let Some(measure) = HubnessMeasures::NAMES.iter().position(|n| *n == name) else {
            return plan_err!(
                "{}: unknown measure '{name}' (one of: {})",
                self.name,
                HubnessMeasures::NAMES.join(", ")
            );
        };
        Ok(Hubness {
            measure,
            k: literal_k(args, 2, self.name)?,
        })
    }
}

impl AggregateUDFImpl for StatisticUdaf {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(match self.kind {
            Kind::Moments => DataType::Struct(moments_fields().into()),
            _ => DataType::Float64,
        })
    }
    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        match self.kind {
            Kind::IsCorrection => Ok(boxed(self.is_correction(&args)?)),
            Kind::TopKMean => Ok(boxed(self.top_k_mean(&args)?)),
            Kind::Hubness => Ok(boxed(self.hubness(&args)?)),
            Kind::Moments => Ok(boxed(EmbeddingMoments)),
        }
    }
    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        // The fields do not depend on the constants.
        let fields = match self.kind {
            Kind::IsCorrection => IsCorrection { beta: 1.0 }.state_fields(args.name),
            Kind::TopKMean => TopKMean { k: 1 }.state_fields(args.name),
            Kind::Hubness => Hubness { measure: 0, k: 1 }.state_fields(args.name),
            Kind::Moments => EmbeddingMoments.state_fields(args.name),
        };
        Ok(fields.into_iter().map(Arc::new).collect())
    }
    fn groups_accumulator_supported(&self, _: AccumulatorArgs) -> bool {
        true
    }
    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        match self.kind {
            Kind::IsCorrection => Ok(grouped(self.is_correction(&args)?)),
            Kind::TopKMean => Ok(grouped(self.top_k_mean(&args)?)),
            Kind::Hubness => Ok(grouped(self.hubness(&args)?)),
            Kind::Moments => Ok(grouped(EmbeddingMoments)),
        }
    }
}

/// Every aggregate function.
pub(super) fn functions() -> Vec<AggregateUDF> {
    let numeric = vec![DataType::Float64, DataType::Float64];
    vec![
        AggregateUDF::from(StatisticUdaf {
            name: "hub_is_correction",
            kind: Kind::IsCorrection,
            signature: Signature::exact(numeric.clone(), Volatility::Immutable),
        }),
        AggregateUDF::from(StatisticUdaf {
            name: "hub_topk_mean",
            kind: Kind::TopKMean,
            signature: Signature::exact(numeric, Volatility::Immutable),
        }),
        AggregateUDF::from(StatisticUdaf {
            name: "hub_hubness",
            kind: Kind::Hubness,
            signature: Signature::any(4, Volatility::Immutable),
        }),
        AggregateUDF::from(StatisticUdaf {
            name: "hub_moments",
            kind: Kind::Moments,
            signature: Signature::any(1, Volatility::Immutable),
        }),
    ]
}
