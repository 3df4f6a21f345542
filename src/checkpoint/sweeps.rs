//! Sinkhorn's iterations in a checkpoint: the potentials after the last
//! saved iteration of each Sinkhorn method, so that a resumed pass goes on
//! from that iteration instead of repeating the sweeps.
//!
//! One file per method, `sweeps-<i>.parquet` (the i-th Sinkhorn method of
//! the layout): one `value` column holding f (one per target row), g (one
//! per source row), then, before the iterations end, the target shifts of
//! the last update (one per target) and each source row's log-sum-exp per
//! strip of targets (strip-major), which the next update's shifts start
//! from; the iteration count, the marginal error and whether the
//! iterations ended in the footer. f32 values are stored widened (exact).
//! Replaced atomically at each save.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, Float64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::Checkpoint;
use crate::bank::sinkhorn::{SinkhornProgress, SinkhornResume};
use crate::error::{HubnormError, Result};
use crate::sink::ParquetSink;

const ITERATIONS: &str = "hubnorm.sweeps.iterations";
const TARGETS: &str = "hubnorm.sweeps.targets";
const EXACT_COLUMN_UPDATES: &str = "hubnorm.sweeps.exact_column_updates";
/// The f64's bits in hexadecimal: exact, and infinity survives.
const MARGINAL_ERROR: &str = "hubnorm.sweeps.marginal_error_bits";
const FINISHED: &str = "hubnorm.sweeps.finished";
/// Strips of saved log-sum-exps (0: no bounds saved).
const STRIPS: &str = "hubnorm.sweeps.strips";

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "value",
        DataType::Float64,
        false,
    )]))
}

impl Checkpoint {
    fn sweeps_path(&self, method: usize) -> PathBuf {
        self.dir.join(format!("sweeps-{method:020}.parquet"))
    }

    /// Saves the `method`-th Sinkhorn method's `progress` when the interval
    /// has passed since the last save, and always once it is finished.
    pub fn save_sweeps(&mut self, method: usize, progress: &SinkhornProgress<'_>) -> Result<()> {
        if !progress.finished && self.last_saved.elapsed() < self.interval {
            return Ok(());
        }
        let metadata = vec![
            (ITERATIONS.to_owned(), progress.iterations.to_string()),
            (
                TARGETS.to_owned(),
                progress.target_potential.len().to_string(),
            ),
            (
                EXACT_COLUMN_UPDATES.to_owned(),
                progress.exact_column_updates.to_string(),
            ),
            (
                MARGINAL_ERROR.to_owned(),
                format!("{:016x}", progress.marginal_error.to_bits()),
            ),
            (FINISHED.to_owned(), progress.finished.to_string()),
        ];
        let bounds = progress.col_shift.filter(|_| !progress.finished);
        let strips = if bounds.is_some() {
            progress.row_lse.len()
        } else {
            0
        };
        let mut metadata = metadata;
        metadata.push((STRIPS.to_owned(), strips.to_string()));
        let mut sink = ParquetSink::create(&self.sweeps_path(method), schema(), metadata, true)?;
        let mut write = |values: &mut dyn Iterator<Item = f64>| -> Result<()> {
            loop {
                let part: Vec<f64> = values.take(1 << 16).collect();
                if part.is_empty() {
                    return Ok(());
                }
                let column = Arc::new(Float64Array::from(part));
                sink.write(&RecordBatch::try_new(schema(), vec![column])?)?;
            }
        };
        write(&mut progress.target_potential.iter().copied())?;
        write(&mut progress.source_potential.iter().copied())?;
        if let Some(col_shift) = bounds {
            write(&mut col_shift.iter().map(|&v| v as f64))?;
            for lse in progress.row_lse {
                write(&mut lse.iter().map(|&v| v as f64))?;
            }
        }
        sink.finish()?;
        self.last_saved = Instant::now();
        Ok(())
    }

    /// The `method`-th Sinkhorn method's saved potentials, for `targets`
    /// target rows and `sources` source rows; `None` when none are saved.
    pub fn resumed_sweeps(
        &self,
        method: usize,
        targets: usize,
        sources: usize,
    ) -> Result<Option<SinkhornResume>> {
        // Sweeps run only after every chunk is saved.
        let path = self.sweeps_path(method);
        if self.resumed_rows == 0 || !crate::storage::exists(&path)? {
            return Ok(None);
        }
        read(&path, targets, sources).map(Some)
    }
}

fn read(path: &Path, targets: usize, sources: usize) -> Result<SinkhornResume> {
    let corrupt =
        |what: &str| HubnormError::input(path, None, None, format!("corrupt checkpoint: {what}"));
    let builder = crate::source::open_parquet(path)?;
    let metadata: std::collections::BTreeMap<String, String> = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e.key.clone(), e.value.clone()?)))
        .collect();
    let number = |key: &str| -> Result<u64> {
        metadata
            .get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| corrupt(&format!("no {key}")))
    };
    if number(TARGETS)? != targets as u64 {
        return Err(corrupt("the number of targets differs"));
    }
    let marginal_error = metadata
        .get(MARGINAL_ERROR)
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .map(f64::from_bits)
        .ok_or_else(|| corrupt("no marginal error"))?;
    let strips = number(STRIPS)? as usize;
    let expected = targets
        + sources
        + if strips > 0 {
            targets + strips * sources
        } else {
            0
        };
    let mut values = Vec::with_capacity(expected);
    let reader = builder
        .build()
        .map_err(|e| HubnormError::parquet(path, e))?;
    for batch in crate::source::CheckedBatches::new(reader, path) {
        let batch = batch?;
        if batch.schema().fields() != schema().fields() {
            return Err(corrupt("unexpected columns"));
        }
        let column = batch.column(0);
        let column = column
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("schema checked");
        values.extend_from_slice(column.values());
    }
    if values.len() != expected {
        return Err(corrupt("the number of potentials differs"));
    }
    let narrow = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let (col_shift, row_lse) = if strips > 0 {
        let bounds = &values[2 * targets + sources..];
        (
            Some(narrow(&values[targets + sources..2 * targets + sources])),
            bounds.chunks(sources.max(1)).map(narrow).collect(),
        )
    } else {
        (None, Vec::new())
    };
    values.truncate(targets + sources);
    let source_potential = values.split_off(targets);
    Ok(SinkhornResume {
        iterations: number(ITERATIONS)? as usize,
        target_potential: values,
        source_potential,
        exact_column_updates: number(EXACT_COLUMN_UPDATES)? as usize,
        marginal_error,
        finished: metadata.get(FINISHED).map(String::as_str) == Some("true"),
        row_lse,
        col_shift,
    })
}
