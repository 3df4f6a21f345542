//! The report's Parquet files: `report.parquet` (method × measure),
//! `gallery_report.parquet` (one row per gallery item) and
//! `compare.parquet`, plus the reads they need (a gallery's text column, a
//! stats file's per-item corrections).

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ProjectionMask;

use crate::error::{HubnormError, Result};
use crate::ids::{id_at, IdIndex};
use crate::report::compare::{Comparison, MethodFigures};
use crate::sink::{AtomicFile, ParquetSink};
use crate::source::{memory, normalise_ids, open_parquet, CheckedBatches, EmbeddingTable};

/// Reads the named columns of one Parquet file (all rows); a name the file
/// lacks is an error naming the file and column.
pub fn read_file_columns(path: &Path, names: &[&str]) -> Result<Vec<ArrayRef>> {
    let builder = open_parquet(path)?;
    let schema = builder.schema().clone();
    let mut roots = Vec::with_capacity(names.len());
    for name in names {
        roots.push(schema.index_of(name).map_err(|_| {
            let have: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            HubnormError::input(
                path,
                None,
                Some(name),
                format!("missing column (the file has: {})", have.join(", ")),
            )
        })?);
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| HubnormError::input(path, None, None, format!("cannot read: {e}")))?;
    let mut batches = Vec::new();
    for batch in CheckedBatches::new(reader, path) {
        batches.push(batch?);
    }
    // The projected batch keeps the file's column order.
    let mut sorted = roots.clone();
    sorted.sort_unstable();
    names
        .iter()
        .zip(&roots)
        .map(|(_, root)| {
            let position = sorted.iter().position(|r| r == root).expect("projected");
            let pieces: Vec<&dyn Array> = batches
                .iter()
                .map(|b| b.column(position).as_ref())
                .collect();
            if pieces.is_empty() {
                Ok(arrow::array::new_empty_array(
                    schema.field(*root).data_type(),
                ))
            } else {
                Ok(arrow::compute::concat(&pieces)?)
            }
        })
        .collect()
}

/// The gallery's `column` (e.g. its text) as Utf8 in table order, or `None`
/// when the table has no such column.
pub fn read_text_column(table: &EmbeddingTable, column: &str) -> Result<Option<ArrayRef>> {
    let mut pieces = Vec::with_capacity(table.parts.len());
    for part in &table.parts {
        let values = if memory::is_memory(&part.path) {
            match memory::lookup(&part.path)?.column(column)? {
                Some(values) => values,
                None => return Ok(None),
            }
        } else {
            if open_parquet(&part.path)?.schema().index_of(column).is_err() {
                return Ok(None);
            }
            read_file_columns(&part.path, &[column])?.remove(0)
        };
        pieces.push(arrow::compute::cast(&values, &DataType::Utf8)?);
    }
    let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
    Ok(Some(arrow::compute::concat(&refs)?))
}

/// The scalar columns of a stats file (h(g), activation flags, potentials;
/// not the per-item lists), reordered to the gallery's rows by `gallery_id`.
/// Items the file lacks are null.
pub fn read_corrections(path: &Path, index: &IdIndex) -> Result<Vec<(String, ArrayRef)>> {
    let builder = open_parquet(path)?;
    let schema = builder.schema().clone();
    let scalar: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|f| {
            let scalar = f.data_type().is_primitive() || f.data_type() == &DataType::Boolean;
            f.name() != "gallery_id" && scalar
        })
        .map(|f| f.name().as_str())
        .collect();
    let mut names = vec!["gallery_id"];
    names.extend(&scalar);
    let columns = read_file_columns(path, &names)?;
    let ids = normalise_ids(&columns[0])?;
    // For each gallery row, the stats file's row holding it.
    let mut source_row: Vec<Option<u32>> = vec![None; index.len()];
    for row in 0..ids.len() {
        if ids.is_null(row) {
            continue;
        }
        if let Some(g) = index.find(id_at(ids.as_ref(), row)) {
            source_row[g as usize] = Some(row as u32);
        }
    }
    let take = UInt32Array::from(source_row);
    scalar
        .iter()
        .zip(&columns[1..])
        .map(|(name, values)| {
            Ok((
                name.to_string(),
                arrow::compute::take(values.as_ref(), &take, None)?,
            ))
        })
        .collect()
}

/// `report.parquet`: one row per method × measure (`method`, `measure`, `value`).
pub fn report_batch(figures: &[MethodFigures]) -> Result<RecordBatch> {
    let (mut method, mut measure, mut value) = (Vec::new(), Vec::new(), Vec::new());
    for f in figures {
        for (name, v) in f.values() {
            method.push(f.label.clone());
            measure.push(name);
            value.push(v);
        }
    }
    let schema = Schema::new(vec![
        Field::new("method", DataType::Utf8, false),
        Field::new("measure", DataType::Utf8, false),
        Field::new("value", DataType::Float64, false),
    ]);
    Ok(RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(StringArray::from(method)),
            Arc::new(StringArray::from(measure)),
            Arc::new(Float64Array::from(value)),
        ],
    )?)
}

/// A method label as a column-name stem: `dual-is` → `dual_is`, `is beta=30` → `is_beta_30`.
pub fn column_stem(label: &str) -> String {
    let mut stem = String::with_capacity(label.len());
    for c in label.chars() {
        if c.is_ascii_alphanumeric() || c == '.' {
            stem.push(c.to_ascii_lowercase());
        } else if !stem.ends_with('_') {
            stem.push('_');
        }
    }
    stem.trim_matches('_').to_owned()
}

/// `gallery_report.parquet`: per gallery item, its id, its text (when the
/// gallery has one), `k_occurrence_<method>` for every method and the
/// corrections of a stats file (its scalar columns, under their own names).
pub fn gallery_report_batch(
    figures: &[MethodFigures],
    gallery_ids: &ArrayRef,
    text: Option<&ArrayRef>,
    corrections: &[(String, ArrayRef)],
) -> Result<RecordBatch> {
    let mut fields = vec![Field::new(
        "gallery_id",
        gallery_ids.data_type().clone(),
        false,
    )];
    let mut columns: Vec<ArrayRef> = vec![gallery_ids.clone()];
    if let Some(text) = text {
        fields.push(Field::new("text", DataType::Utf8, true));
        columns.push(text.clone());
    }
    for f in figures {
        fields.push(Field::new(
            format!("k_occurrence_{}", column_stem(&f.label)),
            DataType::UInt32,
            false,
        ));
        columns.push(Arc::new(UInt32Array::from(f.occurrence.counts.clone())));
    }
    for (name, values) in corrections {
        if fields.iter().any(|f| f.name() == name) {
            continue;
        }
        fields.push(Field::new(name, values.data_type().clone(), true));
        columns.push(values.clone());
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Writes one batch to an uncommitted Parquet file.
pub fn write_batch(
    path: &Path,
    batch: &RecordBatch,
    metadata: Vec<(String, String)>,
    overwrite: bool,
) -> Result<AtomicFile> {
    let mut sink = ParquetSink::create(path, batch.schema(), metadata, overwrite)?;
    sink.write(batch)?;
    sink.close_uncommitted()
}

/// The three tabular files of a comparison (`compare.parquet`,
/// `report.parquet`, `gallery_report.parquet`) and `compare.md`, uncommitted.
pub struct ReportFiles<'a> {
    pub figures: &'a [MethodFigures],
    pub gallery_ids: &'a ArrayRef,
    pub text: Option<&'a ArrayRef>,
    pub corrections: &'a [(String, ArrayRef)],
    pub metadata: Vec<(String, String)>,
}

impl ReportFiles<'_> {
    /// `report.parquet` and `gallery_report.parquet` in `dir`.
    pub fn write_reports(&self, dir: &Path, overwrite: bool) -> Result<Vec<AtomicFile>> {
        Ok(vec![
            write_batch(
                &dir.join("report.parquet"),
                &report_batch(self.figures)?,
                self.metadata.clone(),
                overwrite,
            )?,
            write_batch(
                &dir.join("gallery_report.parquet"),
                &gallery_report_batch(self.figures, self.gallery_ids, self.text, self.corrections)?,
                self.metadata.clone(),
                overwrite,
            )?,
        ])
    }

    /// `compare.parquet` and `compare.md` in `dir`.
    pub fn write_comparison(
        &self,
        comparison: &Comparison,
        dir: &Path,
        overwrite: bool,
    ) -> Result<Vec<AtomicFile>> {
        Ok(vec![
            write_batch(
                &dir.join("compare.parquet"),
                &comparison.to_record_batch()?,
                self.metadata.clone(),
                overwrite,
            )?,
            crate::sink::write_text_atomically(
                &dir.join("compare.md"),
                &comparison.to_markdown(),
                overwrite,
            )?,
        ])
    }
}
