//! `hubnorm export`: gallery vectors that carry their correction, for any
//! inner-product index.
//!
//! For a method that ranks by s(q, g) − h(g), the gallery item g becomes
//! g' = [g, h(g)] (d + 1 values) and the query q becomes q' = [q, −1], so
//! ⟨q', g'⟩ = ⟨q, g⟩ − h(g): a plain inner-product top-k over the exported
//! vectors (FAISS `IndexFlatIP`, an HNSW index, a vector database) serves
//! the corrected ranking. The embeddings are written as the passes read
//! them (L2-normalised unless `--no-normalize`), so queries must be
//! normalised the same way before −1 is appended.
//!
//! A term that depends only on the query (CSLS's r(q), DN's shift) is left
//! out: it never changes a ranking. Each method declares whether it is
//! exportable ([`crate::method::Export`]); the others (gated, rank-based,
//! multiplicative, per-query) are refused with the reason.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};

use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::method::Export;
use crate::options::{MethodKind, MethodSpec, PassOptions};
use crate::progress::Progress;
use crate::query::load_plan;
use crate::query::{Scoring, Selection};
use crate::sink::ParquetSink;
use crate::source::EmbeddingTable;
use crate::stats_file::methods_json;

/// The value appended to every query vector.
pub const QUERY_SUFFIX: f32 = -1.0;

/// Inputs and options of `hubnorm export`.
#[derive(Debug, Clone)]
pub struct ExportJob {
    pub gallery: String,
    /// `gallery_stats.parquet` holding the method's statistic.
    pub stats: PathBuf,
    pub method: MethodSpec,
    pub out: PathBuf,
    pub overwrite: bool,
    pub options: PassOptions,
}

/// What was exported.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSummary {
    pub rows: u64,
    /// Dimension of the exported vectors (d + 1).
    pub dim: usize,
}

/// Why a method cannot be served by an inner-product index.
fn not_exportable(method: &MethodSpec, why: &str) -> HubnormError {
    let exportable: Vec<&str> = MethodKind::all()
        .filter(|k| k.method().export() == Export::Additive)
        .map(MethodKind::name)
        .collect();
    HubnormError::Usage(format!(
        "method {} does not rank by s(q, g) − h(g) ({why}), so no (d + 1)-vector reproduces it; export supports {}",
        method.kind(),
        exportable.join(", ")
    ))
}

/// Writes the gallery with h(g) appended to every vector (`id`,
/// `embedding` with d + 1 values) to `job.out`, atomically.
pub fn export(job: &ExportJob, progress: &dyn Progress) -> Result<ExportSummary> {
    let stats = job.stats.display().to_string();
    crate::sink::refuse_output_in_inputs(
        &job.out,
        &[("gallery", job.gallery.as_str()), ("stats", stats.as_str())],
    )?;
    crate::sink::refuse_existing(&job.out, job.overwrite)?;
    let _lock = crate::sink::OutputLock::acquire(&job.out)?;
    job.method.validate()?;
    if let Export::Refused(why) = job.method.method().export() {
        if !job.method.kind().needs_bank() {
            return Err(HubnormError::Usage(why.into()));
        }
        return Err(not_exportable(&job.method, why));
    }
    let gallery = EmbeddingTable::open("gallery", &job.gallery, &job.options.read, false)?;
    let index = IdIndex::build(&gallery)?;
    let plan = load_plan(
        Some(&job.stats),
        &index,
        &[job.method],
        job.options.read.normalize,
    )?;
    let rule = &plan.methods[0];
    let correction = match (&rule.selection, &plan.scorings[..]) {
        (Selection::Fixed(i), scorings) => match &scorings[*i] {
            Scoring::Subtract(h) => h,
            _ => {
                return Err(HubnormError::Internal(format!(
                    "{} declared additive",
                    job.method.kind()
                )))
            }
        },
        _ => {
            return Err(HubnormError::Internal(format!(
                "{} declared additive",
                job.method.kind()
            )))
        }
    };
    let dim = gallery.dim + 1;
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", gallery.id_kind.data_type(), false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(item.clone(), dim as i32),
            false,
        ),
    ]));
    let metadata = vec![
        ("hubnorm.kind".to_owned(), "export".to_owned()),
        ("hubnorm.methods".to_owned(), methods_json(&[job.method])),
        (
            "hubnorm.export.query_suffix".to_owned(),
            QUERY_SUFFIX.to_string(),
        ),
        (
            "hubnorm.export.normalized".to_owned(),
            job.options.read.normalize.to_string(),
        ),
        ("hubnorm.gallery.path".to_owned(), gallery.spec.clone()),
        (
            "hubnorm.stats.path".to_owned(),
            job.stats.display().to_string(),
        ),
    ];
    let mut sink = ParquetSink::create(&job.out, schema.clone(), metadata, job.overwrite)?;
    progress.start("export", gallery.rows);
    // Blocks of about 4 MiB of output.
    let block_rows = ((4 << 20) / (dim * 4)).max(1);
    let mut blocks = gallery.blocks(block_rows);
    while let Some(block) = blocks.next_block()? {
        let first = block.first_row as usize;
        let mut values = Vec::with_capacity(block.rows * dim);
        for (i, row) in block.data.chunks_exact(gallery.dim).enumerate() {
            values.extend_from_slice(row);
            values.push(correction[first + i]);
        }
        let embeddings = FixedSizeListArray::try_new(
            item.clone(),
            dim as i32,
            Arc::new(Float32Array::from(values)),
            None,
        )?;
        let columns: Vec<ArrayRef> = vec![block.ids.clone(), Arc::new(embeddings)];
        sink.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
        progress.advance(block.rows as u64);
    }
    sink.finish()?;
    progress.finish();
    Ok(ExportSummary {
        rows: gallery.rows,
        dim,
    })
}
