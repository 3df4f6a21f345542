//! What methods see of the engine: the pass-1 request they add to, the
//! statistics columns they declare and fill, the rows `--update` merges, and
//! the stored columns pass 2 plans with. Shared state codecs (log-sum-exp
//! triples, top-k lists, sorted lists) live here once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Array, Float64Array, ListArray, RecordBatch,
    UInt64Array,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Float32Type, Float64Type, UInt64Type};

use crate::bank::pass::{BankPassOutput, StatsChunk};
use crate::bank::states::ActivationState;
use crate::bank::BankMoments;
use crate::error::{HubnormError, Result};
use crate::kernel::{ColumnStates, LogSumExp, TopK, TopValues};
use crate::query::{MethodRule, QueryTerm, Scoring, ScoringPlan, Selection};
use crate::source::EmbeddingTable;

use super::MethodSpec;

/// One column's type in the stats file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Float64,
    Boolean,
    /// A list of f32 per gallery item.
    ListFloat32,
    /// A list of bank rows per gallery item.
    ListUInt64,
}

impl ColumnKind {
    /// The Arrow type of the column.
    pub fn data_type(self) -> DataType {
        match self {
            ColumnKind::Float64 => DataType::Float64,
            ColumnKind::Boolean => DataType::Boolean,
            ColumnKind::ListFloat32 => {
                DataType::List(Arc::new(Field::new("item", DataType::Float32, false)))
            }
            ColumnKind::ListUInt64 => {
                DataType::List(Arc::new(Field::new("item", DataType::UInt64, false)))
            }
        }
    }

    /// Bytes per gallery item in a chunk's output (a list counts its offset).
    pub fn row_bytes(self) -> usize {
        match self {
            ColumnKind::Float64 | ColumnKind::ListFloat32 | ColumnKind::ListUInt64 => 8,
            ColumnKind::Boolean => 1,
        }
    }
}

/// A column of a method in `gallery_stats.parquet`: its name after the
/// method's column prefix, its type, and whether it is known only after the
/// last gallery chunk (activation sets, Sinkhorn potentials).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatColumn {
    pub suffix: &'static str,
    pub kind: ColumnKind,
    pub late: bool,
}

impl StatColumn {
    /// A Float64 column filled per chunk.
    pub const fn f64(suffix: &'static str) -> Self {
        StatColumn {
            suffix,
            kind: ColumnKind::Float64,
            late: false,
        }
    }
    /// A list column filled per chunk.
    pub const fn list(suffix: &'static str) -> Self {
        StatColumn {
            suffix,
            kind: ColumnKind::ListFloat32,
            late: false,
        }
    }
    /// A list-of-bank-rows column filled per chunk.
    pub const fn rows(suffix: &'static str) -> Self {
        StatColumn {
            suffix,
            kind: ColumnKind::ListUInt64,
            late: false,
        }
    }
    /// A Boolean column known after the last chunk.
    pub const fn late_bool(suffix: &'static str) -> Self {
        StatColumn {
            suffix,
            kind: ColumnKind::Boolean,
            late: true,
        }
    }
    /// A Float64 column known after the last chunk.
    pub const fn late_f64(suffix: &'static str) -> Self {
        StatColumn {
            suffix,
            kind: ColumnKind::Float64,
            late: true,
        }
    }
}

/// What pass 1 accumulates, as the methods ask for it: the union of their
/// needs, so that one stream over each bank feeds every method.
#[derive(Debug, Clone, Default)]
pub struct BankNeeds {
    pub(crate) bank_betas: Vec<f32>,
    pub(crate) gallery_bank_betas: Vec<f32>,
    pub(crate) column_top_k: usize,
    pub(crate) neighbour_ks: Vec<usize>,
    pub(crate) keep_all: bool,
    pub(crate) bank_activation_k: usize,
    pub(crate) gallery_bank_activation_k: usize,
    pub(crate) means: bool,
    pub(crate) covariances: bool,
}

fn push_unique(list: &mut Vec<f32>, beta: f64) {
    let beta = beta as f32;
    if !list.contains(&beta) {
        list.push(beta);
    }
}

impl BankNeeds {
    /// Log-sum-exp of β·s(b, g) over the query bank.
    pub fn bank_lse(&mut self, beta: f64) {
        push_unique(&mut self.bank_betas, beta);
    }
    /// Log-sum-exp of β·s(ĝ, g) over the gallery bank.
    pub fn gallery_bank_lse(&mut self, beta: f64) {
        push_unique(&mut self.gallery_bank_betas, beta);
    }
    /// The k largest s(b, g) per gallery item.
    pub fn bank_top_k(&mut self, k: usize) {
        self.column_top_k = self.column_top_k.max(k);
    }
    /// The mean of the vectors of the k bank rows most similar to each
    /// gallery item, N_k(g) (ties to the smaller bank row).
    pub fn bank_neighbour_mean(&mut self, k: usize) {
        if !self.neighbour_ks.contains(&k) {
            self.neighbour_ks.push(k);
        }
    }
    /// Every s(b, g) per gallery item, sorted.
    pub fn every_bank_similarity(&mut self) {
        self.keep_all = true;
    }
    /// Each query-bank item's top-k_A gallery items.
    pub fn bank_activation(&mut self, k: usize) {
        self.bank_activation_k = self.bank_activation_k.max(k);
    }
    /// Each gallery-bank item's top-k_A gallery items.
    pub fn gallery_bank_activation(&mut self, k: usize) {
        self.gallery_bank_activation_k = self.gallery_bank_activation_k.max(k);
    }
    /// The mean rows of the query bank and of the gallery bank (or gallery).
    pub fn means(&mut self) {
        self.means = true;
    }
    /// The mean rows and covariance matrices of the query bank and of
    /// the gallery bank (or gallery).
    pub fn covariances(&mut self) {
        self.means = true;
        self.covariances = true;
    }
}

/// One finished gallery chunk of pass 1, as methods read it.
pub struct ChunkContext<'a> {
    pub(crate) chunk: &'a StatsChunk<'a>,
    pub(crate) needs: &'a BankNeeds,
    pub(crate) moments: Option<&'a BankMoments>,
}

fn lse_of(states: &ColumnStates, betas: &[f32], beta: f64, i: usize) -> LogSumExp {
    let b = betas
        .iter()
        .position(|&x| x == beta as f32)
        .expect("β requested by the method");
    states.lse[i * betas.len() + b]
}

impl ChunkContext<'_> {
    /// Gallery items in the chunk.
    pub fn rows(&self) -> usize {
        self.chunk.gallery.rows
    }
    /// Gallery item `i`'s embedding.
    pub fn gallery_row(&self, i: usize) -> &[f32] {
        let dim = self.chunk.gallery.dim;
        &self.chunk.gallery.data[i * dim..(i + 1) * dim]
    }
    /// The chunk's gallery embeddings, row-major, and their dimension.
    pub fn gallery_block(&self) -> (&[f32], usize) {
        (&self.chunk.gallery.data, self.chunk.gallery.dim)
    }
    /// LSE_b β·s(b, g_i) over the query bank.
    pub fn bank_lse(&self, beta: f64, i: usize) -> LogSumExp {
        lse_of(self.chunk.bank, &self.needs.bank_betas, beta, i)
    }
    /// LSE_ĝ β·s(ĝ, g_i) over the gallery bank.
    pub fn gallery_bank_lse(&self, beta: f64, i: usize) -> LogSumExp {
        lse_of(
            self.chunk.gallery_bank,
            &self.needs.gallery_bank_betas,
            beta,
            i,
        )
    }
    /// The largest bank similarities of each gallery item, descending
    /// ([`BankNeeds::bank_top_k`]): as many as the largest k any method of
    /// the pass asked for, so a method takes its own k first.
    pub fn bank_top(&self) -> &[TopValues] {
        &self.chunk.bank.top
    }
    /// The largest bank similarities of each gallery item with their bank
    /// rows: filled only when a method asked for
    /// [`BankNeeds::bank_neighbour_mean`] (empty otherwise), as many as the
    /// largest k asked for.
    pub fn bank_top_rows(&self) -> &[TopK] {
        &self.chunk.bank.top_rows
    }
    /// The mean of the vectors of N_k(g_i), the k bank rows most similar to
    /// gallery item i.
    pub fn bank_neighbour_mean(&self, k: usize, i: usize) -> &[f64] {
        let dim = self.chunk.gallery.dim;
        let (_, means) = self
            .chunk
            .bank
            .neighbour_means
            .iter()
            .find(|(kk, _)| *kk == k)
            .expect("neighbour mean requested by the method");
        &means[i * dim..(i + 1) * dim]
    }
    /// Every bank similarity of each gallery item, sorted ascending
    /// ([`BankNeeds::every_bank_similarity`]; empty otherwise).
    pub fn bank_all(&self) -> &[Vec<f32>] {
        &self.chunk.bank.all
    }
    /// The moments of the banks (`dn`, `mp`).
    pub fn moments(&self) -> &BankMoments {
        self.moments.expect("moments requested by the method")
    }
    /// A Float64 column of `f(i)` over the chunk's rows.
    pub fn f64s(&self, f: impl Fn(usize) -> f64) -> ArrayRef {
        Arc::new(Float64Array::from_iter_values((0..self.rows()).map(f)))
    }
    /// The columns of a log-sum-exp state: `head(state)`, max, sum.
    pub fn lse_columns(
        &self,
        lse: impl Fn(usize) -> LogSumExp,
        head: impl Fn(LogSumExp) -> f64,
    ) -> Vec<ArrayRef> {
        vec![
            self.f64s(|i| head(lse(i))),
            self.f64s(|i| lse(i).max),
            self.f64s(|i| lse(i).sum),
        ]
    }
}

/// What is known after the last gallery chunk.
pub struct LateContext<'a> {
    pub(crate) output: &'a BankPassOutput,
    pub(crate) gallery_rows: usize,
    /// The method's Sinkhorn target potential over the gallery, if it has one.
    pub(crate) potential: Option<&'a [f64]>,
}

impl LateContext<'_> {
    /// Whether each gallery item is in the top-k of some query-bank item.
    pub fn bank_activation(&self, k: usize) -> ArrayRef {
        self.activated(&self.output.bank_activation, k)
    }
    /// Whether each gallery item is in the top-k of some gallery-bank item.
    pub fn gallery_bank_activation(&self, k: usize) -> ArrayRef {
        self.activated(&self.output.gallery_bank_activation, k)
    }
    fn activated(&self, state: &ActivationState, k: usize) -> ArrayRef {
        // The pass kept the largest k_A any method asked for.
        Arc::new(BooleanArray::from(
            state.truncated(k).activated(self.gallery_rows),
        ))
    }
    /// The Sinkhorn target potential f(g).
    pub fn potential(&self) -> ArrayRef {
        let f = self
            .potential
            .expect("a potential for each Sinkhorn method");
        Arc::new(Float64Array::from(f[..self.gallery_rows].to_vec()))
    }
}

/// Where the bank rows of a stats file (or a partial pass) sit in the bank
/// of an update: it was computed over some of the current bank's parts, in
/// their current order, and numbered its rows from 0.
#[derive(Debug, Clone, Default)]
pub struct BankRowMap {
    /// (first row in the file's numbering, first row in the bank, rows), in order.
    pieces: Vec<(u64, u64, u64)>,
}

impl BankRowMap {
    /// The map of a pass over the parts of `bank` whose `included` is true.
    pub fn of_parts(bank: &EmbeddingTable, included: &[bool]) -> Self {
        let mut pieces = Vec::new();
        let mut local = 0;
        for (part, &kept) in bank.parts.iter().zip(included) {
            if kept {
                pieces.push((local, part.first_row, part.rows));
                local += part.rows;
            }
        }
        BankRowMap { pieces }
    }

    /// The bank row of row `row` in the file's numbering.
    pub fn bank_row(&self, row: u64) -> Result<u64> {
        self.pieces
            .iter()
            .find(|&&(start, _, rows)| row >= start && row < start + rows)
            .map(|&(start, first, _)| first + (row - start))
            .ok_or_else(|| {
                HubnormError::Internal(format!("bank row {row} lies outside the parts counted"))
            })
    }
}

/// The bank an update's rows refer to, for methods whose merge reads bank
/// vectors (`dissim-local`).
#[derive(Clone, Copy)]
pub struct BankAccess<'a> {
    pub(crate) table: &'a EmbeddingTable,
    pub(crate) rows: &'a BankRowMap,
}

/// Rows of a stats file (or of a partial pass) that `--update` merges.
pub struct StoredRows<'a> {
    pub(crate) batch: &'a RecordBatch,
    pub(crate) bank: Option<BankAccess<'a>>,
}

impl<'a> StoredRows<'a> {
    /// The rows of `batch` (columns named as in the stats file), whose
    /// bank rows are those of the bank they were computed from.
    pub fn new(batch: &'a RecordBatch) -> Self {
        StoredRows { batch, bank: None }
    }

    /// The rows of `batch`, whose bank rows sit in `table` as `rows` says.
    pub fn in_bank(
        batch: &'a RecordBatch,
        table: &'a EmbeddingTable,
        rows: &'a BankRowMap,
    ) -> Self {
        StoredRows {
            batch,
            bank: Some(BankAccess { table, rows }),
        }
    }

    /// The bank the rows' bank rows refer to, when known.
    pub fn bank(&self) -> Option<BankAccess<'a>> {
        self.bank
    }

    /// List-of-bank-rows column `name`, one list per row, as rows of
    /// [`StoredRows::bank`] (as stored when that is unknown).
    pub fn bank_rows(&self, name: &str) -> Result<Vec<Vec<u64>>> {
        let list = self.column(name)?.as_list::<i32>();
        (0..list.len())
            .map(|i| {
                // A Delta table stores them as i64 (Delta has no unsigned types).
                let stored = arrow::compute::cast(&list.value(i), &DataType::UInt64)?;
                let stored = stored.as_primitive::<UInt64Type>().values();
                match &self.bank {
                    Some(bank) => stored.iter().map(|&r| bank.rows.bank_row(r)).collect(),
                    None => Ok(stored.to_vec()),
                }
            })
            .collect()
    }

    fn column(&self, name: &str) -> Result<&ArrayRef> {
        self.batch
            .column_by_name(name)
            .ok_or_else(|| HubnormError::Internal(format!("stats rows lack column {name}")))
    }
    /// Float64 column `name`.
    pub fn floats(&self, name: &str) -> Result<Vec<f64>> {
        Ok(self
            .column(name)?
            .as_primitive::<Float64Type>()
            .values()
            .to_vec())
    }
    /// List column `name`, one list per row.
    pub fn lists(&self, name: &str) -> Result<Vec<Vec<f32>>> {
        let list = self.column(name)?.as_list::<i32>();
        Ok((0..list.len())
            .map(|i| {
                list.value(i)
                    .as_primitive::<Float32Type>()
                    .values()
                    .to_vec()
            })
            .collect())
    }
    /// The log-sum-exp states of `spec`'s `_lse_max`/`_lse_sum` columns.
    pub fn lse_states(&self, spec: &MethodSpec) -> Result<Vec<LogSumExp>> {
        let max = self.floats(&spec.column("lse_max"))?;
        let sum = self.floats(&spec.column("lse_sum"))?;
        Ok(max
            .into_iter()
            .zip(sum)
            .map(|(max, sum)| LogSumExp { max, sum })
            .collect())
    }
}

/// `a`'s log-sum-exp states merged with `b`'s, and their columns: `head`
/// of each state, max, sum.
pub fn merge_lse(
    spec: &MethodSpec,
    a: &StoredRows<'_>,
    b: Option<&StoredRows<'_>>,
    head: impl Fn(&LogSumExp) -> f64,
) -> Result<Vec<ArrayRef>> {
    let mut states = a.lse_states(spec)?;
    if let Some(b) = b {
        for (s, other) in states.iter_mut().zip(b.lse_states(spec)?) {
            s.merge(&other);
        }
    }
    Ok(vec![
        f64_array(states.iter().map(head).collect()),
        f64_array(states.iter().map(|s| s.max).collect()),
        f64_array(states.iter().map(|s| s.sum).collect()),
    ])
}

/// `a`'s top-`k` lists in column `name` merged with `b`'s, descending.
pub fn merge_top_lists(
    name: &str,
    k: usize,
    a: &StoredRows<'_>,
    b: Option<&StoredRows<'_>>,
) -> Result<Vec<Vec<f32>>> {
    let mut rows = a.lists(name)?;
    if let Some(b) = b {
        for (row, extra) in rows.iter_mut().zip(b.lists(name)?) {
            let mut top = TopValues::new(k);
            row.iter().chain(&extra).for_each(|&v| top.push(v));
            *row = top.sorted();
        }
    }
    Ok(rows)
}

/// The mean of the `k` largest values of a descending list (0 when empty),
/// as [`TopValues::mean_of_largest`] computes it.
pub fn mean_of_list(row: &[f32], k: usize) -> f64 {
    let mut top = TopValues::new(k);
    row.iter().for_each(|&v| top.push(v));
    top.mean_of_largest(k).unwrap_or(0.0)
}

/// A Float64 column.
pub fn f64_array(values: Vec<f64>) -> ArrayRef {
    Arc::new(Float64Array::from(values))
}

/// A `List<Float32>` column from per-row lists.
pub fn list_array(rows: Vec<Vec<f32>>) -> ArrayRef {
    let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
    Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(Float32Array::from(rows.concat())),
        None,
    ))
}

/// A `List<UInt64>` column of bank rows from per-row lists.
pub fn rows_array(rows: Vec<Vec<u64>>) -> ArrayRef {
    let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
    Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::UInt64, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(UInt64Array::from(rows.concat())),
        None,
    ))
}

/// The `k` largest values of each column, descending.
pub fn top_lists(tops: &[TopValues], k: usize) -> ArrayRef {
    list_array(
        tops.iter()
            .map(|top| {
                let mut sorted = top.sorted();
                sorted.truncate(k);
                sorted
            })
            .collect(),
    )
}

/// Values of one stats column, aligned to gallery rows.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValues {
    Float64(Vec<f64>),
    Boolean(Vec<bool>),
    /// `width` values per gallery row, row after row.
    ListFloat32 {
        values: Vec<f32>,
        width: usize,
    },
}

impl ColumnValues {
    /// The values of a Float64 column.
    pub fn into_f64(self) -> Vec<f64> {
        match self {
            ColumnValues::Float64(v) => v,
            _ => unreachable!("declared Float64"),
        }
    }
    /// The values of a Boolean column.
    pub fn into_bits(self) -> Vec<bool> {
        match self {
            ColumnValues::Boolean(v) => v,
            _ => unreachable!("declared Boolean"),
        }
    }
    /// The values of a list column and their width.
    pub fn into_lists(self) -> (Vec<f32>, usize) {
        match self {
            ColumnValues::ListFloat32 { values, width } => (values, width),
            _ => unreachable!("declared a list"),
        }
    }
    /// A Float64 correction column as the scoring s − h(g).
    pub fn into_subtract(self) -> Scoring {
        Scoring::Subtract(self.into_f64().into_iter().map(|x| x as f32).collect())
    }
}

/// What a method plans pass 2 with: its stored columns (in the order of
/// [`super::Method::search_columns`]), the plan's scorings, the raw scoring
/// and the stats file's metadata.
pub struct PlanContext<'a> {
    pub(crate) plan: &'a mut ScoringPlan,
    pub(crate) raw: Option<usize>,
    pub(crate) values: Vec<Option<ColumnValues>>,
    pub(crate) metadata: &'a HashMap<String, String>,
    pub(crate) path: Option<&'a Path>,
}

impl PlanContext<'_> {
    /// Stored column `i` (of the method's search columns), once.
    pub fn take(&mut self, i: usize) -> ColumnValues {
        self.values[i].take().expect("each column taken once")
    }
    /// The rule of an additive method: s − h(g) with h from stored column
    /// `i`, for every query.
    pub fn subtract_column(&mut self, spec: &MethodSpec, i: usize) -> MethodRule {
        let correction = self.take(i).into_subtract();
        let s = self.add_scoring(correction);
        MethodRule {
            spec: *spec,
            selection: Selection::Fixed(s),
            query_term: QueryTerm::None,
        }
    }
    /// Adds a scoring (shared with an identical one) and returns its index.
    pub fn add_scoring(&mut self, scoring: Scoring) -> usize {
        self.plan.add_scoring(scoring)
    }
    /// The raw scoring's index (the method declared [`super::Method::needs_raw`]).
    pub fn raw(&self) -> usize {
        self.raw.expect("needs_raw declared")
    }
    /// The stats file's metadata value `key`.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }
    /// The metadata value `key`, or an error naming the file.
    pub fn metadata_text(&self, key: &str) -> Result<&str> {
        self.metadata(key)
            .ok_or_else(|| self.metadata_error(key, "is missing"))
    }
    /// An error about metadata value `key` of the stats file, naming the file.
    pub fn metadata_error(&self, key: &str, problem: impl std::fmt::Display) -> HubnormError {
        let path = self.path.unwrap_or(Path::new("stats file"));
        HubnormError::input(path, None, None, format!("metadata {key} {problem}"))
    }
    /// A JSON list of floats from the metadata, or an error naming the file.
    pub fn metadata_floats(&self, key: &str) -> Result<Vec<f64>> {
        serde_json::from_str(self.metadata_text(key)?)
            .map_err(|e| self.metadata_error(key, format!("is not a list of numbers: {e}")))
    }
}
