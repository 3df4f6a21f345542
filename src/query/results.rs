//! Pass 2's output stage: each query block's states turned into result
//! rows (each method's selected scoring, its query term), and the figures
//! every report is built from.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Array, Float64Array, Int32Array, RecordBatch,
    StringArray, UInt32Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::datatypes::{Float64Type, Int32Type, UInt32Type};
use serde::Serialize;

use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::kernel::{QueryState, ScreenCounts, TopK};
use crate::options::{MethodSpec, PassOptions};
use crate::progress::Progress;
use crate::query::sinkhorn_pp::SingleQuerySinkhorn;
use crate::query::{
    search, MethodRule, QueryBlockResult, QueryTerm, ScoringPlan, SearchRequest, Selection,
};
use crate::report::{HubnessMeasures, KOccurrence, QualityReport, RankList};
use crate::source::{EmbeddingTable, IdKind};
use crate::stats_file::{parameters_json, SinkhornReport};

/// The k of the k-occurrence skewness reported in summaries.
pub const SKEWNESS_K: usize = 10;

/// Per-method figures of a run (`summary.json`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MethodSummary {
    pub method: String,
    pub parameters: serde_json::Map<String, serde_json::Value>,
    /// Skewness of the k-occurrence distribution at k = 10 over all gallery items.
    pub k_occurrence_skewness: f64,
    /// Every hubness measure of REPORTS.md at `ReportOptions::hubness_k`.
    pub hubness: HubnessMeasures,
    /// `dis`, `dual-dis`: the fraction of queries whose scores were
    /// corrected (raw top-1 in an activation set); the others stay raw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalised_fraction: Option<f64>,
    /// `sn`, `dbsn`: iterations run and how far the plan is from its marginals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sinkhorn: Option<SinkhornReport>,
    /// R@K with intervals, MdR, MnR, MRR: present when the queries carry ground truth.
    #[serde(flatten)]
    pub quality: Option<QualityReport>,
}

/// What pass 2 gathered for one method: enough to rebuild every report
/// (k-occurrence per gallery item, one rank per query).
#[derive(Debug, Clone, PartialEq)]
pub struct MethodOutcome {
    pub spec: MethodSpec,
    /// N_k at `ReportOptions::hubness_k`.
    pub occurrence: KOccurrence,
    /// N_k at k = 10, for `k_occurrence_skewness`.
    pub occurrence_at_10: KOccurrence,
    pub ranks: RankList,
    /// Gated methods: queries whose reported scoring was not the raw one.
    pub normalised: Option<u64>,
}

impl MethodOutcome {
    /// The summary figures of this method.
    pub fn summary(&self, options: &crate::options::ReportOptions) -> MethodSummary {
        MethodSummary {
            method: self.spec.kind().name().to_owned(),
            parameters: parameters_json(&self.spec),
            k_occurrence_skewness: self.occurrence_at_10.skewness(),
            hubness: self.occurrence.measures(options.top_hubs),
            normalised_fraction: self
                .normalised
                .map(|n| n as f64 / self.occurrence.queries.max(1) as f64),
            sinkhorn: None,
            quality: self.ranks.summary(&options.quality),
        }
    }
}

/// Schema of `results.parquet`.
pub fn results_schema(query_ids: IdKind, gallery_ids: IdKind) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("method", DataType::Utf8, false),
        Field::new("query_id", query_ids.data_type(), false),
        Field::new("rank", DataType::Int32, false),
        Field::new("gallery_id", gallery_ids.data_type(), false),
        Field::new("score", DataType::Float32, false),
        Field::new("raw_score", DataType::Float32, false),
    ]))
}

/// What pass 2's rows hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultRows {
    /// The rows of `results.parquet`: the first k of every list.
    TopK,
    /// The rows a cluster's client rebuilds the summary from
    /// ([`OutcomesFromRows`]): every list down to rank `depth` (at least k
    /// and the k of every hubness measure), with the [`report_fields`]
    /// after the results' columns.
    WithReportColumns { depth: usize },
}

impl ResultRows {
    /// Rows made per list of `k` results.
    pub fn depth(self, k: usize) -> usize {
        match self {
            ResultRows::TopK => k,
            ResultRows::WithReportColumns { depth } => depth.max(k),
        }
    }

    pub fn report_columns(self) -> bool {
        matches!(self, ResultRows::WithReportColumns { .. })
    }
}

/// The columns [`ResultRows::WithReportColumns`] adds: which method (its
/// position in the plan), the gallery row of each candidate, and per list
/// the ground truth's full-gallery rank and whether a gated method
/// corrected it.
pub fn report_fields() -> Vec<Field> {
    vec![
        Field::new("hubnorm_method", DataType::UInt32, false),
        Field::new("hubnorm_gallery_row", DataType::UInt32, false),
        Field::new("hubnorm_target_rank", DataType::Float64, true),
        Field::new("hubnorm_normalised", DataType::Boolean, true),
    ]
}

/// The schema of `rows`: the results' columns, and the report columns
/// when asked.
pub fn rows_schema(query_ids: IdKind, gallery_ids: IdKind, rows: ResultRows) -> SchemaRef {
    let results = results_schema(query_ids, gallery_ids);
    match rows {
        ResultRows::TopK => results,
        ResultRows::WithReportColumns { .. } => {
            let mut fields: Vec<Field> = results
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.extend(report_fields());
            Arc::new(Schema::new(fields))
        }
    }
}

/// Each method's figures before any query is counted.
fn empty_outcomes(
    rules: &[MethodRule],
    hubness_k: usize,
    gallery_rows: usize,
) -> Vec<MethodOutcome> {
    rules
        .iter()
        .map(|rule| MethodOutcome {
            spec: rule.spec,
            occurrence: KOccurrence::new(hubness_k, gallery_rows),
            occurrence_at_10: KOccurrence::new(SKEWNESS_K, gallery_rows),
            ranks: RankList::default(),
            normalised: matches!(rule.selection, Selection::Gated { .. }).then_some(0),
        })
        .collect()
}

/// Which scoring `rule` reports for the query whose states are `states`.
fn selected_scoring(rule: &MethodRule, states: &[QueryState]) -> usize {
    match &rule.selection {
        Selection::Fixed(s) => *s,
        Selection::SingleQuery => unreachable!("single-query methods have their own states"),
        Selection::Gated { raw, sets, choices } => {
            // The raw top-1 g*; a query with no candidate stays raw.
            let Some(top1) = states[*raw].top.best() else {
                return choices[0];
            };
            let bits = sets
                .iter()
                .enumerate()
                .filter(|(_, set)| set[top1.row as usize])
                .fold(0usize, |acc, (i, _)| acc | (1 << i));
            choices[bits]
        }
    }
}

/// The term `rule` subtracts from every reported score of a query.
fn query_offset(rule: &MethodRule, states: &[QueryState], query: &[f32]) -> f64 {
    match &rule.query_term {
        QueryTerm::None => 0.0,
        QueryTerm::HalfNeighbourMean { raw, k } => {
            let top: &TopK = &states[*raw].top;
            let sorted = top.sorted();
            let take = (*k).min(sorted.len()).max(1);
            0.5 * sorted.iter().take(take).map(|c| c.raw as f64).sum::<f64>() / take as f64
        }
        QueryTerm::DistributionShift {
            lambda,
            gallery_mean,
            constant,
        } => {
            let dot: f64 = query
                .iter()
                .zip(gallery_mean)
                .map(|(&q, &m)| q as f64 * m)
                .sum();
            lambda * dot - constant
        }
    }
}

/// Turns query blocks into result rows, and accumulates the summary figures.
struct ResultsCollector<'a> {
    schema: SchemaRef,
    rules: &'a [MethodRule],
    /// `sinkhorn-pp`'s inputs, when it is among the methods.
    protocol: Option<&'a SingleQuerySinkhorn>,
    /// Candidates kept per query (at least `k` and the skewness's 10).
    search_k: usize,
    gallery_ids: &'a ArrayRef,
    /// Rows made per list (`k`, or deeper with the report columns).
    depth: usize,
    report_columns: bool,
    /// Whether the queries carry ground truth (a query without a usable target is then skipped).
    has_targets: bool,
    outcomes: Vec<MethodOutcome>,
}

impl<'a> ResultsCollector<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        schema: SchemaRef,
        rules: &'a [MethodRule],
        protocol: Option<&'a SingleQuerySinkhorn>,
        gallery_ids: &'a ArrayRef,
        k: usize,
        rows: ResultRows,
        search_k: usize,
        hubness_k: usize,
        has_targets: bool,
    ) -> Self {
        ResultsCollector {
            schema,
            rules,
            protocol,
            search_k,
            gallery_ids,
            depth: rows.depth(k),
            report_columns: rows.report_columns(),
            has_targets,
            outcomes: empty_outcomes(rules, hubness_k, gallery_ids.len()),
        }
    }

    // `q` indexes the block's states, embeddings and protocol lists alike.
    #[allow(clippy::needless_range_loop)]
    fn batch(&mut self, block: &QueryBlockResult<'_>) -> Result<RecordBatch> {
        let ns = block.scorings;
        let queries = block.queries;
        // Every row the block can give, allocated once: what the plan counts
        // (no growth by doubling).
        let rows = queries.rows * self.rules.len() * self.depth;
        let (mut method, mut query, mut rank, mut gallery, mut score, mut raw) = (
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
        );
        let report_rows = if self.report_columns { rows } else { 0 };
        let (mut method_index, mut target_rank, mut normalised) = (
            Vec::with_capacity(report_rows),
            Vec::with_capacity(report_rows),
            Vec::with_capacity(report_rows),
        );
        let protocol_states: Vec<QueryState> = match self.protocol {
            Some(p) => p.search_block(&queries.data, block.positives, self.search_k),
            None => Vec::new(),
        };
        // Query-major order (query, method, rank): the file's row order then
        // does not depend on the block sizes the memory limit chose.
        for q in 0..queries.rows {
            let states = &block.states[q * ns..(q + 1) * ns];
            let embedding = &queries.data[q * queries.dim..(q + 1) * queries.dim];
            for (m, rule) in self.rules.iter().enumerate() {
                let name = rule.spec.kind().name();
                let outcome = &mut self.outcomes[m];
                let mut corrected = None;
                let state = if rule.selection == Selection::SingleQuery {
                    &protocol_states[q]
                } else {
                    let selected = selected_scoring(rule, states);
                    if let Selection::Gated { choices, .. } = &rule.selection {
                        corrected = Some(selected != choices[0]);
                        *outcome.normalised.as_mut().expect("gated") +=
                            (selected != choices[0]) as u64;
                    }
                    &states[selected]
                };
                let offset = query_offset(rule, states, embedding);
                let list = state.top.sorted();
                outcome.occurrence.add_list(list.iter().map(|c| c.row));
                outcome
                    .occurrence_at_10
                    .add_list(list.iter().map(|c| c.row));
                match state.rank() {
                    Some(r) => outcome.ranks.add_rank(r),
                    None if self.has_targets => outcome.ranks.add_skipped(),
                    None => {}
                }
                let listed = list.iter().take(self.depth);
                for (r, c) in listed.enumerate() {
                    method.push(name);
                    query.push(q as u32);
                    rank.push(r as i32 + 1);
                    gallery.push(c.row);
                    score.push((c.score as f64 - offset) as f32);
                    raw.push(c.raw);
                    if self.report_columns {
                        method_index.push(m as u32);
                        target_rank.push(state.rank());
                        normalised.push(corrected);
                    }
                }
            }
        }
        let gallery = Arc::new(UInt32Array::from(gallery));
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(method)),
            arrow::compute::take(queries.ids.as_ref(), &UInt32Array::from(query), None)?,
            Arc::new(Int32Array::from(rank)),
            arrow::compute::take(self.gallery_ids.as_ref(), gallery.as_ref(), None)?,
            Arc::new(Float32Array::from(score)),
            Arc::new(Float32Array::from(raw)),
        ];
        if self.report_columns {
            columns.extend([
                Arc::new(UInt32Array::from(method_index)) as ArrayRef,
                gallery,
                Arc::new(Float64Array::from(target_rank)),
                Arc::new(BooleanArray::from(normalised)),
            ]);
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

/// What one result row holds while its batch is built: the six columns'
/// vectors (36 bytes), the method names' array, and the query and gallery
/// ids taken into it, plus the report columns' vectors and arrays. The
/// query ids, not read yet when the plan is made, are counted at the
/// gallery's bytes per id.
fn result_row_bytes(gallery_ids: &ArrayRef, report_columns: bool) -> usize {
    const VECTORS: usize = 16 + 5 * 4;
    const METHOD_NAME: usize = 4 + 16;
    const REPORT: usize = 4 + 16 + 2 + 8 + 2;
    let id_bytes = gallery_ids
        .get_array_memory_size()
        .div_ceil(gallery_ids.len().max(1))
        .max(8);
    VECTORS + METHOD_NAME + 2 * id_bytes + REPORT * report_columns as usize
}

/// Pass 2 of query rows `query_rows` (all of them, or a cluster task's
/// shard): every query block's rows into `emit` (query-major order), and
/// the figures of each method.
#[allow(clippy::too_many_arguments)]
pub(crate) fn search_into(
    queries: &EmbeddingTable,
    query_rows: std::ops::Range<u64>,
    gallery: &EmbeddingTable,
    index: &IdIndex,
    plan: &ScoringPlan,
    k: usize,
    rows: ResultRows,
    options: &PassOptions,
    protocol: Option<&SingleQuerySinkhorn>,
    progress: &dyn Progress,
    emit: &mut dyn FnMut(&RecordBatch) -> Result<()>,
) -> Result<(Vec<MethodOutcome>, Option<ScreenCounts>)> {
    search_blocks_into(
        queries,
        query_rows,
        gallery,
        index,
        plan,
        k,
        rows,
        options,
        protocol,
        progress,
        &mut |batch, _| emit(batch),
    )
}

/// A query block's place among the queries, and what the screen did for it.
#[derive(Debug, Clone)]
pub(crate) struct BlockExtent {
    pub query_rows: std::ops::Range<u64>,
    pub screen: ScreenCounts,
}

/// [`search_into`], handing each block's rows to `emit` with its extent.
#[allow(clippy::too_many_arguments)]
pub(crate) fn search_blocks_into(
    queries: &EmbeddingTable,
    query_rows: std::ops::Range<u64>,
    gallery: &EmbeddingTable,
    index: &IdIndex,
    plan: &ScoringPlan,
    k: usize,
    rows: ResultRows,
    options: &PassOptions,
    protocol: Option<&SingleQuerySinkhorn>,
    progress: &dyn Progress,
    emit: &mut dyn FnMut(&RecordBatch, BlockExtent) -> Result<()>,
) -> Result<(Vec<MethodOutcome>, Option<ScreenCounts>)> {
    let screen = crate::query::pass::screens(options.precision, plan)?;
    let schema = rows_schema(queries.id_kind, gallery.id_kind, rows);
    let hubness_k = options.report.hubness_k;
    let depth = rows.depth(k);
    let search_k = k
        .max(SKEWNESS_K)
        .max(hubness_k)
        .max(depth)
        .max(plan.neighbours_needed());
    let query_count = query_rows.end.saturating_sub(query_rows.start) as usize;
    let mut collector = ResultsCollector::new(
        schema,
        &plan.methods,
        protocol,
        index.ids(),
        k,
        rows,
        search_k,
        hubness_k,
        queries.has_targets,
    );
    // Two k-occurrence counts per method and gallery item, one rank per method and query.
    let resident = index.memory_bytes()
        + plan.memory_bytes()
        + plan.methods.len() * (index.len() * 8 + query_count * 8);
    let request = SearchRequest {
        queries,
        query_rows,
        gallery,
        gallery_index: index,
        scorings: &plan.scorings,
        k: search_k,
        budget: options.memory.bytes(),
        resident_bytes: resident,
        output_row_bytes: plan.methods.len()
            * depth
            * result_row_bytes(index.ids(), rows.report_columns()),
        screen,
    };
    let counts = search(&request, progress, |block| {
        let first = block.queries.first_row;
        let extent = BlockExtent {
            query_rows: first..first + block.queries.rows as u64,
            screen: block.screen,
        };
        emit(&collector.batch(&block)?, extent)
    })?;
    Ok((collector.outcomes, screen.then_some(counts)))
}

/// Rebuilds each method's figures on a cluster's client from the rows of
/// [`ResultRows::WithReportColumns`], and keeps the rows of
/// `results.parquet` among them: the figures a local search gathers, count
/// for count, when the rows come in query order.
pub struct OutcomesFromRows {
    k: usize,
    has_targets: bool,
    outcomes: Vec<MethodOutcome>,
}

impl OutcomesFromRows {
    /// For the methods of `plan` over a gallery of `gallery_rows` items.
    pub fn new(
        plan: &ScoringPlan,
        k: usize,
        gallery_rows: usize,
        hubness_k: usize,
        has_targets: bool,
    ) -> Self {
        OutcomesFromRows {
            k,
            has_targets,
            outcomes: empty_outcomes(&plan.methods, hubness_k, gallery_rows),
        }
    }

    /// The depth of the lists these figures need.
    pub fn depth(&self) -> usize {
        self.outcomes
            .iter()
            .map(|o| o.occurrence.k.max(o.occurrence_at_10.k))
            .max()
            .unwrap_or(0)
            .max(self.k)
    }

    /// Counts `batch`'s rows into the figures and returns those within rank
    /// `k`, in the results' columns.
    pub fn take(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let results = batch.num_columns().checked_sub(report_fields().len());
        let malformed =
            || HubnormError::Cluster("the cluster returned rows without the report columns".into());
        let results = results.ok_or_else(malformed)?;
        let ranks = batch
            .column(2)
            .as_primitive_opt::<Int32Type>()
            .ok_or_else(malformed)?;
        let methods = batch
            .column(results)
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(malformed)?;
        let rows = batch
            .column(results + 1)
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(malformed)?;
        let targets = batch
            .column(results + 2)
            .as_primitive_opt::<Float64Type>()
            .ok_or_else(malformed)?;
        let corrected = batch
            .column(results + 3)
            .as_boolean_opt()
            .ok_or_else(malformed)?;
        for i in 0..batch.num_rows() {
            let (method, rank, row) = (methods.value(i) as usize, ranks.value(i), rows.value(i));
            let outcome = self.outcomes.get_mut(method).ok_or_else(malformed)?;
            if row as usize >= outcome.occurrence.counts.len() || rank < 1 {
                return Err(malformed());
            }
            for occurrence in [&mut outcome.occurrence, &mut outcome.occurrence_at_10] {
                if rank as usize <= occurrence.k {
                    occurrence.counts[row as usize] += 1;
                }
                occurrence.queries += (rank == 1) as u64;
            }
            if rank != 1 {
                continue;
            }
            if targets.is_valid(i) {
                outcome.ranks.add_rank(targets.value(i));
            } else if self.has_targets {
                outcome.ranks.add_skipped();
            }
            if let Some(count) = outcome.normalised.as_mut() {
                *count += (corrected.is_valid(i) && corrected.value(i)) as u64;
            }
        }
        let within_k = BooleanArray::from_unary(ranks, |r| r as usize <= self.k);
        let kept = batch.project(&(0..results).collect::<Vec<_>>())?;
        Ok(arrow::compute::filter_record_batch(&kept, &within_k)?)
    }

    /// Each method's figures.
    pub fn finish(self) -> Vec<MethodOutcome> {
        self.outcomes
    }
}
