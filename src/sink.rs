//! Parquet outputs, written atomically: to a hidden temporary file beside the
//! destination, renamed into place only when complete, so a failed or
//! interrupted run never leaves a half-written file under the final name.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::error::{HubnormError, Result};

/// A file that appears under its final name only when [`AtomicFile::commit`]
/// is called; dropped without commit, its temporary file is removed.
#[derive(Debug)]
pub struct AtomicFile {
    temporary: PathBuf,
    destination: PathBuf,
    committed: bool,
}

impl AtomicFile {
    /// Creates the temporary file for `destination`. Fails when the
    /// destination exists and `overwrite` is false.
    pub fn create(destination: &Path, overwrite: bool) -> Result<(Self, File)> {
        if destination.exists() && !overwrite {
            return Err(HubnormError::Usage(format!(
                "{} already exists (pass --overwrite to replace it)",
                destination.display()
            )));
        }
        let dir = destination
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| HubnormError::io(dir, e))?;
        let name = destination
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let file = File::create(&temporary).map_err(|e| HubnormError::io(&temporary, e))?;
        Ok((
            AtomicFile {
                temporary,
                destination: destination.to_path_buf(),
                committed: false,
            },
            file,
        ))
    }

    /// Moves the finished file to its destination.
    pub fn commit(mut self) -> Result<PathBuf> {
        std::fs::rename(&self.temporary, &self.destination)
            .map_err(|e| HubnormError::io(&self.destination, e))?;
        self.committed = true;
        Ok(self.destination.clone())
    }

    pub fn destination(&self) -> &Path {
        &self.destination
    }

    /// Where the file is until it is committed (to read it back before then).
    pub fn temporary_path(&self) -> &Path {
        &self.temporary
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

/// Encoded bytes a writer buffers before it flushes a row group (counted in
/// the plan's fixed overhead).
pub const WRITER_BUFFER_BYTES: usize = 1 << 20;

/// Writes record batches to a Parquet file atomically, with the run's
/// options recorded in the key-value metadata.
pub struct ParquetSink {
    file: AtomicFile,
    writer: ArrowWriter<File>,
}

impl ParquetSink {
    /// Opens a sink. `metadata` pairs are stored in the footer (`hubnorm.*` keys).
    pub fn create(
        destination: &Path,
        schema: SchemaRef,
        metadata: Vec<(String, String)>,
        overwrite: bool,
    ) -> Result<Self> {
        let (file, handle) = AtomicFile::create(destination, overwrite)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("valid level"),
            ))
            // Bounded row groups keep the writer's buffer small (memory limit).
            .set_max_row_group_row_count(Some(65_536))
            // Ids and floats are (nearly) unique, so dictionaries only cost
            // time (40% of writing gc's similarity lists); `method` repeats.
            .set_dictionary_enabled(false)
            .set_column_dictionary_enabled(ColumnPath::from("method"), true)
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_key_value_metadata(Some(
                metadata
                    .into_iter()
                    .map(|(k, v)| KeyValue::new(k, v))
                    .collect(),
            ))
            .build();
        let writer = ArrowWriter::try_new(handle, schema, Some(props))
            .map_err(|e| HubnormError::parquet(file.destination(), e))?;
        Ok(ParquetSink { file, writer })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.writer
            .write(batch)
            .map_err(|e| HubnormError::parquet(self.file.destination(), e))?;
        // Flush full row groups early so buffered rows stay bounded.
        if self.writer.in_progress_size() > WRITER_BUFFER_BYTES {
            self.writer
                .flush()
                .map_err(|e| HubnormError::parquet(self.file.destination(), e))?;
        }
        Ok(())
    }

    /// Writes the footer and renames the file into place.
    pub fn finish(self) -> Result<PathBuf> {
        let ParquetSink { file, writer } = self;
        writer
            .close()
            .map_err(|e| HubnormError::parquet(file.destination(), e))?;
        file.commit()
    }

    /// Finishes the file under its temporary name, to be committed later with
    /// other outputs of the same run.
    pub fn close_uncommitted(self) -> Result<AtomicFile> {
        let ParquetSink { file, writer } = self;
        writer
            .close()
            .map_err(|e| HubnormError::parquet(file.destination(), e))?;
        Ok(file)
    }
}

/// Writes a small text file (JSON) atomically.
pub fn write_text_atomically(
    destination: &Path,
    text: &str,
    overwrite: bool,
) -> Result<AtomicFile> {
    use std::io::Write;
    let (file, mut handle) = AtomicFile::create(destination, overwrite)?;
    handle
        .write_all(text.as_bytes())
        .and_then(|_| handle.sync_all())
        .map_err(|e| HubnormError::io(file.destination(), e))?;
    Ok(file)
}
