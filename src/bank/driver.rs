//! Pass 1 as a stage: the layout of the requested methods, the bank pass
//! over gallery chunks, the Sinkhorn sweeps, and the rows of
//! `gallery_stats.parquet` handed to a sink (a file, or the SQL table
//! function's stream) as soon as they are known.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};

use crate::bank::pass::ResumePoint;
use crate::bank::sinkhorn::{sinkhorn_potentials_from, SinkhornRequest};
use crate::bank::{
    compute_bank_statistics, ActivationBank, ActivationShape, BankInput, BankMoments,
    BankPassOutput, BankPassRequest, RowMoments, StatsChunk, StatsLayout,
};
use crate::checkpoint::Checkpoint;
use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::kernel::ScreenCounts;
use crate::method::MethodSpec;
use crate::options::{PassOptions, Precision};
use crate::progress::Progress;
use crate::sink::{AtomicFile, ParquetSink};
use crate::source::EmbeddingTable;
use crate::stats_file::methods_json;

/// The tables pass 1 reads.
#[derive(Debug, Clone, Copy)]
pub struct StatsInputs<'a> {
    pub gallery: &'a EmbeddingTable,
    pub bank: &'a EmbeddingTable,
    pub gallery_bank: Option<&'a EmbeddingTable>,
    /// The gallery's id index, when the caller holds one during the pass
    /// (counted against the memory budget).
    pub index: Option<&'a IdIndex>,
}

/// Rows per block of the moments' read: a few MiB of f32 at common widths,
/// outside the pass's plan (which starts after it).
const MOMENT_BLOCK_ROWS: usize = 1024;

/// The moments of a table (the covariance too when `covariance`), read block
/// by block.
fn table_moments(table: &EmbeddingTable, covariance: bool) -> Result<RowMoments> {
    let mut moments = if covariance {
        RowMoments::with_covariance()
    } else {
        RowMoments::default()
    };
    let mut blocks = table.blocks(MOMENT_BLOCK_ROWS);
    while let Some(block) = blocks.next_block()? {
        moments.add_rows(&block.data, block.dim);
    }
    Ok(moments)
}

/// The moments `layout`'s methods read (`dn`, `mp`), of the query bank and
/// of the gallery bank (or the gallery); None when no method needs them.
pub fn bank_moments(
    layout: &StatsLayout,
    bank: &EmbeddingTable,
    gallery_side: &EmbeddingTable,
) -> Result<Option<BankMoments>> {
    let Some(covariance) = layout.needs_moments() else {
        return Ok(None);
    };
    Ok(Some(BankMoments {
        query_bank: table_moments(bank, covariance)?.finish(),
        gallery: table_moments(gallery_side, covariance)?.finish(),
    }))
}

/// (the SQL table function).
pub trait StatsSink {
    /// Called once, before the first batch, with the final schema and the
    /// file metadata (methods, bank moments of `dn` and `mp`, Sinkhorn reports).
    fn begin(&mut self, schema: SchemaRef, metadata: Vec<(String, String)>) -> Result<()>;
    /// One batch of rows, in gallery order.
    fn write(&mut self, batch: &RecordBatch) -> Result<()>;
}

/// A [`StatsSink`] into an uncommitted Parquet file, created when the pass
/// begins.
pub struct FileStatsSink<'a> {
    out: &'a Path,
    overwrite: bool,
    sink: Option<ParquetSink>,
}

impl<'a> FileStatsSink<'a> {
    /// A sink into `out` (replaced only when `overwrite`).
    pub fn new(out: &'a Path, overwrite: bool) -> Self {
        FileStatsSink {
            out,
            overwrite,
            sink: None,
        }
    }

    /// The file with every row written, under its temporary name.
    pub fn close_uncommitted(self) -> Result<AtomicFile> {
        self.sink
            .ok_or_else(|| HubnormError::Internal("a stats file closed before it began".into()))?
            .close_uncommitted()
    }
}

impl StatsSink for FileStatsSink<'_> {
    fn begin(&mut self, schema: SchemaRef, metadata: Vec<(String, String)>) -> Result<()> {
        self.sink = Some(ParquetSink::create(
            self.out,
            schema,
            metadata,
            self.overwrite,
        )?);
        Ok(())
    }
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.sink.as_mut().expect("begun").write(batch)
    }
}

/// Pass 1 into an uncommitted stats file at `out`, with how it went
/// ([`StatsReport`]). `metadata` is stored in the footer, with the
/// methods, the means of `dn`, and the Sinkhorn reports added.
#[allow(clippy::too_many_arguments)]
pub fn write_stats(
    inputs: &StatsInputs<'_>,
    methods: &[MethodSpec],
    out: &Path,
    overwrite: bool,
    options: &PassOptions,
    metadata: Vec<(String, String)>,
    progress: &dyn Progress,
    checkpoint: Option<&mut Checkpoint>,
) -> Result<(AtomicFile, StatsReport)> {
    let mut sink = FileStatsSink::new(out, overwrite);
    let reports = stream_stats(
        inputs,
        methods,
        &spool_path(out),
        options,
        metadata,
        progress,
        &mut sink,
        checkpoint,
    )?;
    let file = sink.close_uncommitted()?;
    Ok((file, reports))
}

/// What pass 1 writes, known before it starts: the layout of the methods'
/// columns, the bank moments of `dn` and `mp`, and the stats file's schema
/// and metadata.
#[derive(Debug)]
pub struct StatsPlan {
    pub layout: StatsLayout,
    pub moments: Option<BankMoments>,
    /// The stats file's schema.
    pub schema: SchemaRef,
    /// The stats file's metadata: the caller's, then the methods and the
    /// moments (Sinkhorn reports are added when the sweeps end).
    pub metadata: Vec<(String, String)>,
}

impl StatsPlan {
    /// The plan of `methods` over `inputs` (reads the tables once when a
    /// method needs their moments).
    pub fn new(
        inputs: &StatsInputs<'_>,
        methods: &[MethodSpec],
        mut metadata: Vec<(String, String)>,
    ) -> Result<Self> {
        let layout = StatsLayout::new(methods);
        let moments = bank_moments(
            &layout,
            inputs.bank,
            inputs.gallery_bank.unwrap_or(inputs.gallery),
        )?;
        if let Some(moments) = &moments {
            metadata.extend(layout.file_metadata(moments));
        }
        metadata.push(("hubnorm.methods".into(), methods_json(layout.methods())));
        let schema = layout.schema(inputs.gallery.id_kind);
        Ok(StatsPlan {
            layout,
            moments,
            schema,
            metadata,
        })
    }

    /// Whether every column of a gallery row is known once the banks have
    /// streamed past it (no activation sets, no Sinkhorn potentials, which
    /// need every gallery row): then any range of gallery rows can be
    /// computed on its own, as a cluster task does.
    pub fn rows_are_independent(&self) -> bool {
        !self.layout.has_late_columns()
    }

    /// The activation states a pass over `inputs` keeps: one per bank whose
    /// items' top-k_A gallery items some method needs.
    pub fn activation_shapes(&self, inputs: &StatsInputs<'_>) -> Vec<ActivationShape> {
        let request = self.pass_request(inputs, &PassOptions::default(), 0..0, None);
        [
            (ActivationBank::Query, request.bank),
            (ActivationBank::Gallery, request.gallery_bank),
        ]
        .into_iter()
        .filter_map(|(bank, input)| {
            let input = input?;
            (input.request.row_top_k > 0).then_some(ActivationShape {
                bank,
                rows: input.table.rows as usize,
                k: input.request.row_top_k,
            })
        })
        .collect()
    }

    /// The columns written as each gallery chunk finishes: the id and the
    /// early columns.
    pub fn early_schema(&self) -> SchemaRef {
        let early = self.layout.columns().0.len();
        Arc::new(Schema::new(self.schema.fields()[..1 + early].to_vec()))
    }

    /// Whether some bank's statistics of this plan are of the kind the bf16
    /// screen serves (column top-k lists), whatever the CPU.
    #[cfg(feature = "cluster")]
    pub(crate) fn bank_screenable(&self, inputs: &StatsInputs<'_>) -> bool {
        let mut request = self.pass_request(inputs, &PassOptions::default(), 0..0, None);
        request.screen = true;
        request.screens_a_bank()
    }

    /// The bank pass over `gallery_rows` of `inputs`, from `resume` when set.
    fn pass_request<'a>(
        &'a self,
        inputs: &StatsInputs<'a>,
        options: &PassOptions,
        gallery_rows: Range<u64>,
        resume: Option<&'a ResumePoint>,
    ) -> BankPassRequest<'a> {
        let layout = &self.layout;
        BankPassRequest {
            gallery: inputs.gallery,
            gallery_rows,
            bank: Some(BankInput {
                table: inputs.bank,
                request: layout.bank_request(),
            }),
            gallery_bank: inputs
                .gallery_bank
                .filter(|_| layout.needs_gallery_bank_tiles())
                .map(|table| BankInput {
                    table,
                    request: layout.gallery_bank_request(),
                }),
            budget: options.memory.bytes(),
            resident_bytes: inputs.index.map_or(0, IdIndex::memory_bytes)
                + self.moments.as_ref().map_or(0, BankMoments::memory_bytes),
            output_row_bytes: layout.output_row_bytes(inputs.bank.rows),
            resume,
            screen: options.precision.screens_bank_pass(),
        }
    }

    /// The early columns of a finished chunk, as a batch of `early_schema`.
    fn chunk_batch(&self, chunk: &StatsChunk<'_>, early_schema: &SchemaRef) -> Result<RecordBatch> {
        let mut columns = vec![chunk.gallery.ids.clone()];
        columns.extend(self.layout.chunk_columns(chunk, self.moments.as_ref())?);
        Ok(RecordBatch::try_new(early_schema.clone(), columns)?)
    }
}

/// The early columns of gallery rows `gallery_rows` alone, each finished
/// chunk handed to `on_batch` in gallery order, and the activation states
/// over these rows: a cluster task's shard of pass 1. The rows are those a
/// whole pass writes for these gallery rows, bit for bit, and the states
/// of all shards merge into the whole pass's. Sinkhorn potentials are not
/// computed here: they couple every gallery row, and come from their own
/// rounds ([`crate::bank::sinkhorn::sinkhorn_in_rounds`]).
pub fn stats_of_rows(
    inputs: &StatsInputs<'_>,
    plan: &StatsPlan,
    gallery_rows: Range<u64>,
    options: &PassOptions,
    progress: &dyn Progress,
    mut on_batch: impl FnMut(RecordBatch) -> Result<()>,
) -> Result<BankPassOutput> {
    let schema = plan.early_schema();
    let request = plan.pass_request(inputs, options, gallery_rows, None);
    compute_bank_statistics(&request, progress, |chunk| {
        on_batch(plan.chunk_batch(&chunk, &schema)?)
    })
}

/// Writes the early columns held in the Parquet file `spool`, joined with
/// `late_columns` (one value per gallery row each), into `sink` as rows of
/// `schema`.
pub fn join_late_columns(
    spool: &Path,
    schema: &SchemaRef,
    late_columns: &[arrow::array::ArrayRef],
    sink: &mut dyn StatsSink,
) -> Result<()> {
    let reader = crate::source::open_parquet(spool)?
        .build()
        .map_err(|e| HubnormError::parquet(spool, e))?;
    let mut row = 0usize;
    for batch in crate::source::CheckedBatches::new(reader, spool) {
        let batch = batch?;
        let n = batch.num_rows();
        let mut columns = batch.columns().to_vec();
        columns.extend(late_columns.iter().map(|column| column.slice(row, n)));
        sink.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
        row += n;
    }
    Ok(())
}

/// Pass 1 into `sink`: each gallery chunk's rows as soon as the banks have
/// streamed past it, or, when some column is known only at the end
/// (activation sets, Sinkhorn potentials), after the last chunk, joined
/// with the early columns held in a scratch file at `spool`.
///
/// With a `checkpoint`, the finished chunks are saved as they go, and a
/// resumed checkpoint's rows are replayed before the pass goes on after them.
#[allow(clippy::too_many_arguments)]
pub fn stream_stats(
    inputs: &StatsInputs<'_>,
    methods: &[MethodSpec],
    spool: &Path,
    options: &PassOptions,
    metadata: Vec<(String, String)>,
    progress: &dyn Progress,
    sink: &mut dyn StatsSink,
    mut checkpoint: Option<&mut Checkpoint>,
) -> Result<StatsReport> {
    let StatsInputs {
        gallery,
        bank,
        gallery_bank,
        index,
    } = *inputs;
    let plan = StatsPlan::new(inputs, methods, metadata)?;
    let StatsPlan {
        layout,
        moments,
        schema,
        metadata,
    } = &plan;
    let mut metadata = metadata.clone();
    let screened = plan
        .pass_request(inputs, options, 0..0, None)
        .screens_a_bank();
    metadata.push(precision_entry(Precision::recorded(screened)));
    // Activation columns are known only after the last chunk: the other
    // columns go to a scratch file first and are copied next to them then.
    let direct = plan.rows_are_independent();
    let early_schema = plan.early_schema();
    let mut spool_sink = if direct {
        sink.begin(schema.clone(), metadata.clone())?;
        None
    } else {
        Some(ParquetSink::create(
            spool,
            early_schema.clone(),
            vec![],
            true,
        )?)
    };
    // A resumed pass: the saved rows first, then the pass from after them.
    let mut resume = None;
    let mut screen = ScreenCounts::default();
    if let Some(checkpoint) = checkpoint.as_deref() {
        screen = checkpoint.resumed_screen_counts()?;
        checkpoint.replay(&early_schema, |batch| match &mut spool_sink {
            Some(spool) => spool.write(&batch),
            None => sink.write(&batch),
        })?;
        let shape = |input: Option<&EmbeddingTable>, k: usize| {
            input.filter(|_| k > 0).map(|t| (t.rows as usize, k))
        };
        resume = checkpoint.resume_point(
            shape(Some(bank), layout.bank_request().row_top_k),
            shape(
                gallery_bank.filter(|_| layout.needs_gallery_bank_tiles()),
                layout.gallery_bank_request().row_top_k,
            ),
        )?;
    }
    let request = plan.pass_request(inputs, options, 0..gallery.rows, resume.as_ref());
    let output = compute_bank_statistics(&request, progress, |chunk| {
        let batch = plan.chunk_batch(&chunk, &early_schema)?;
        match &mut spool_sink {
            Some(spool) => spool.write(&batch)?,
            None => sink.write(&batch)?,
        }
        if let Some(checkpoint) = checkpoint.as_deref_mut() {
            checkpoint.record(&batch, chunk.gallery.first_row, chunk.activations)?;
        }
        Ok(())
    });
    let output = match (output, checkpoint.as_deref_mut()) {
        (Err(HubnormError::Interrupted(message)), Some(checkpoint)) => {
            crate::cancel::finishing(|| checkpoint.save_on_interrupt())?;
            return Err(HubnormError::Interrupted(message));
        }
        (output, checkpoint) => {
            let output = output?;
            // Keep every chunk: a stop during the sweeps or the rest of the
            // job then repeats none of them.
            if let Some(checkpoint) = checkpoint {
                checkpoint.save_now(&output)?;
            }
            output
        }
    };
    screen.add(output.screen);
    let screen = screened.then_some(screen);
    let Some(spool_sink) = spool_sink else {
        return Ok(StatsReport {
            sinkhorn: Vec::new(),
            screen,
        });
    };
    let spool = spool_sink.close_uncommitted()?;
    // Sinkhorn couples every target: its potentials come from their own
    // sweeps over the whole bank × targets, after the single-pass statistics.
    let mut reports = Vec::new();
    let mut potentials = Vec::new();
    for (i, (method, setup)) in layout.sinkhorn_methods().into_iter().enumerate() {
        let targets = if setup.with_gallery_bank {
            let gallery_bank = gallery_bank.ok_or_else(|| {
                HubnormError::Usage(format!(
                    "method {} needs --gallery-bank PATH",
                    method.kind()
                ))
            })?;
            vec![gallery, gallery_bank]
        } else {
            vec![gallery]
        };
        let (tau, iterations) = (setup.tau, setup.iterations);
        let target_rows = targets.iter().map(|t| t.rows as usize).sum();
        let resume = match checkpoint.as_deref() {
            Some(checkpoint) => checkpoint.resumed_sweeps(i, target_rows, bank.rows as usize)?,
            None => None,
        };
        let outcome = sinkhorn_potentials_from(
            &SinkhornRequest {
                sources: bank,
                targets: &targets,
                tau,
                iterations,
                tolerance: options.sinkhorn_tolerance,
                budget: options.memory.bytes(),
                resident_bytes: index.map_or(0, IdIndex::memory_bytes)
                    + moments.as_ref().map_or(0, BankMoments::memory_bytes)
                    + potentials
                        .iter()
                        .map(|p: &Vec<f64>| p.len() * 8)
                        .sum::<usize>(),
            },
            progress,
            resume,
            &mut |state| match checkpoint.as_deref_mut() {
                Some(checkpoint) => checkpoint.save_sweeps(i, state),
                None => Ok(()),
            },
        )?;
        let report = SinkhornReport::new(method, &outcome);
        metadata.push(report.metadata_entry()?);
        reports.push(report);
        let mut f = outcome.target_potential;
        f.truncate(gallery.rows as usize);
        potentials.push(f);
    }
    let late_columns = layout.late_columns(&output, gallery.rows as usize, &potentials);
    sink.begin(schema.clone(), metadata)?;
    join_late_columns(spool.temporary_path(), schema, &late_columns, sink)?;
    drop(spool);
    Ok(StatsReport {
        sinkhorn: reports,
        screen,
    })
}

/// The stats file's record of its pass 1's precision (after the plan's
/// metadata; [`Precision::recorded`], [`Precision::recorded_on_cluster`]).
/// The statistics are the same either way; the speed is not.
pub(crate) fn precision_entry(precision: &str) -> (String, String) {
    ("hubnorm.precision".into(), precision.into())
}

/// How a pass 1 went: each Sinkhorn method's iterations, and what the
/// bf16 screen did over every gallery chunk (a resumed pass's saved ones
/// from its checkpoint), when it screened.
#[derive(Debug, Clone, Default)]
pub struct StatsReport {
    pub sinkhorn: Vec<SinkhornReport>,
    pub screen: Option<ScreenCounts>,
}

/// How a Sinkhorn method's iterations ended (summary and stats metadata).
///
/// The block schedule (`cached_tiles`, `target_chunks`, `bank_blocks`)
/// depends on `--memory-limit`, not on the data, so it stays out of every
/// file: outputs are byte-identical across memory limits and thread counts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SinkhornReport {
    #[serde(skip)]
    pub method: MethodSpec,
    /// Iterations run (fewer than T when `--tol` was met).
    pub iterations: usize,
    /// Largest relative deviation of a row sum of the final plan from 1/|B|
    /// (columns are exact after the last target update).
    pub marginal_error: f64,
    /// Iterations whose target update was redone exactly because a target's
    /// mass was too small for the reused-exp form (`kernel::MIN_COLUMN_MASS`).
    /// Depends on the data only, like the potentials.
    pub exact_column_updates: usize,
    /// Whether the bank × targets similarities were cached between sweeps.
    #[serde(skip)]
    pub cached_tiles: bool,
    /// Target chunks and bank blocks each sweep streamed (more than one of
    /// either: the matrix did not fit the memory limit).
    #[serde(skip)]
    pub target_chunks: usize,
    #[serde(skip)]
    pub bank_blocks: usize,
}

impl SinkhornReport {
    /// How `method`'s iterations that gave `outcome` ended.
    pub fn new(method: MethodSpec, outcome: &crate::bank::sinkhorn::SinkhornOutcome) -> Self {
        SinkhornReport {
            method,
            iterations: outcome.iterations,
            marginal_error: outcome.marginal_error,
            exact_column_updates: outcome.exact_column_updates,
            cached_tiles: outcome.cached,
            target_chunks: outcome.target_chunks,
            bank_blocks: outcome.source_blocks,
        }
    }

    /// The stats file's metadata entry for this report.
    pub fn metadata_entry(&self) -> Result<(String, String)> {
        let key = format!("hubnorm.sinkhorn.{}", self.method.column_prefix());
        let value = serde_json::to_string(&self.json())
            .map_err(|e| HubnormError::Internal(e.to_string()))?;
        Ok((key, value))
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "iterations": self.iterations,
            "marginal_error": self.marginal_error,
            "exact_column_updates": self.exact_column_updates,
        })
    }
}

/// The scratch file beside `out` that holds the columns written per chunk.
fn spool_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!(".{name}.spool"))
}
