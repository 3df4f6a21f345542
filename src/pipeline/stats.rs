//! `hubnorm stats`: pass 1 into a stats file (checkpointed), on this
//! machine or on a cluster, and as streams for SQL and for a cluster's
//! tasks.

use super::*;

/// The gallery and the banks of `job` for `methods`, opened as pass 1
/// reads them (the bank sampled as `job` says).
fn open_stats_tables(job: &StatsJob, methods: &[MethodSpec]) -> Result<(EmbeddingTable, Banks)> {
    let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
    let banks = open_banks(
        &job.bank,
        job.gallery_bank.as_deref(),
        job.bank_sample,
        methods,
        &gallery,
        &job.options,
    )?;
    Ok((gallery, banks))
}

/// Opens pass 1's inputs for `job` (in its thread pool) and hands them,
/// with the stats file's metadata, to `pass`.
fn with_stats_inputs<T: Send>(
    job: &StatsJob,
    methods: &[MethodSpec],
    pass: impl FnOnce(&StatsInputs<'_>, Vec<(String, String)>) -> Result<T> + Send,
) -> Result<T> {
    with_threads(job.options.threads, || {
        let (gallery, banks) = open_stats_tables(job, methods)?;
        let index = IdIndex::build(&gallery)?;
        let metadata = banks.stats_metadata(&gallery, job.bank_sample, &job.options);
        pass(&banks.inputs(&gallery, &index), metadata)
    })
}

/// Declares the stats file `out` in `format`. A stats table takes no
/// `--append`: it holds one file per version, read whole.
pub fn declare_stats_table(
    format: TableFormat,
    out: &Path,
    overwrite: bool,
) -> Result<DeclaredTables> {
    if format == (TableFormat::Delta { append: true }) {
        return Err(HubnormError::Usage(
            "a stats table holds one file per version, read whole by search, export and --update: write a new version with --overwrite (or --update), not --append".into(),
        ));
    }
    format.declare(vec![out.to_path_buf()], overwrite)
}

/// `hubnorm stats`: pass 1 only; writes `gallery_stats.parquet`,
/// checkpointing finished gallery chunks as `job.checkpoint` says.
pub fn run_stats(job: &StatsJob, progress: &dyn Progress) -> Result<StatsOutcome> {
    job.options.precision.check_available()?;
    let methods = check_methods(&job.methods, job.gallery_bank.is_some())?;
    check_tolerance(&methods, job.options.sinkhorn_tolerance)?;
    refuse_protocol(&methods, "stats")?;
    refuse_output_in_inputs(&job.out, &stats_inputs(job))?;
    refuse_existing(&job.out, job.overwrite)?;
    let _lock = OutputLock::acquire(&job.out)?;
    with_stats_inputs(job, &methods, |inputs, metadata| {
        let manifest = checkpoint_manifest(&metadata, &methods, &job.options);
        let saves_activation = StatsLayout::new(&methods).has_late_columns();
        let mut checkpoint =
            Checkpoint::open(&job.out, &manifest, &job.checkpoint, saves_activation)?;
        let resumed_rows = checkpoint.as_ref().map_or(0, Checkpoint::resumed_rows);
        let written = write_stats(
            inputs,
            &methods,
            &job.out,
            job.overwrite,
            &job.options,
            metadata,
            progress,
            checkpoint.as_mut(),
        );
        let (file, report) = match written {
            Ok(written) => written,
            Err(err) => {
                // Saved work is never deleted (the message says where it
                // is); a checkpoint with nothing saved would only block the
                // next run.
                let saved = checkpoint.as_ref().map_or(0, Checkpoint::saved_rows);
                if let Some(checkpoint) = checkpoint.filter(|_| saved == 0) {
                    // The failure is what to report: a checkpoint that cannot
                    // be removed (a store that is gone) only asks the next
                    // run for --resume.
                    let _ = crate::cancel::finishing(|| checkpoint.remove());
                }
                return Err(match err {
                    HubnormError::Interrupted(message) if saved > 0 => {
                        HubnormError::Interrupted(format!(
                            "{message}; the first {saved} gallery rows are saved in {}: run the same command with --resume to continue",
                            checkpoint_dir(&job.out).display()
                        ))
                    }
                    err => err,
                });
            }
        };
        let path = file.commit()?;
        if let Some(checkpoint) = checkpoint {
            // The output is in place: a stop now would only strand the
            // checkpoint (and say that nothing was written).
            crate::cancel::finishing(|| checkpoint.remove())?;
        }
        Ok(StatsOutcome {
            path,
            resumed_rows,
            screen: report.screen.map(ScreenSummary::of),
        })
    })
}

/// `hubnorm stats --cluster`: pass 1 of `job` computed by the cluster of
/// `cluster`, in shards of gallery rows (and the Sinkhorn potentials in
/// rounds sharded over the targets), into the same file `run_stats` writes,
/// bit for bit but for the potentials' rounding, written and committed here
/// once every shard is in. No checkpoint: a task lost with its executor is
/// run again by the scheduler.
pub fn run_stats_on(job: &StatsJob, cluster: &ClusterJob) -> Result<StatsOutcome> {
    let methods = stats_methods(job)?;
    if job.checkpoint.resume {
        return Err(HubnormError::Usage(
            "--resume: a cluster run keeps no checkpoint (the scheduler runs lost tasks again)"
                .into(),
        ));
    }
    refuse_output_in_inputs(&job.out, &stats_inputs(job))?;
    refuse_existing(&job.out, job.overwrite)?;
    let _lock = OutputLock::acquire(&job.out)?;
    #[cfg(not(feature = "cluster"))]
    {
        // Checked as on one machine, then refused: not built in.
        drop(methods);
        Err(without_cluster(&cluster.scheduler))
    }
    #[cfg(feature = "cluster")]
    with_stats_inputs(job, &methods, |inputs, metadata| {
        let pinned = crate::sql::pass::ClusterInputs::of([
            Some(inputs.gallery),
            Some(inputs.bank),
            inputs.gallery_bank,
        ])?;
        let (file, report) =
            on_cluster::stats(job, &methods, inputs, metadata, &job.out, cluster, &pinned)?;
        let path = file.commit()?;
        Ok(StatsOutcome {
            path,
            resumed_rows: 0,
            screen: report.screen.map(ScreenSummary::of),
        })
    })
}

/// The inputs of a stats job, as (role, spec) pairs.
fn stats_inputs(job: &StatsJob) -> Vec<(&str, &str)> {
    let mut inputs = vec![
        ("gallery", job.gallery.as_str()),
        ("bank", job.bank.as_str()),
    ];
    inputs.extend(job.gallery_bank.as_deref().map(|g| ("gallery bank", g)));
    inputs
}

/// What a checkpoint must match to be resumed: the stats file's metadata
/// (input parts with sizes and modification times, normalisation, bank
/// sample), the methods, and the options that change the statistics or
/// what the file records (the precision).
fn checkpoint_manifest(
    metadata: &[(String, String)],
    methods: &[MethodSpec],
    options: &PassOptions,
) -> std::collections::BTreeMap<String, String> {
    let mut manifest: std::collections::BTreeMap<String, String> =
        metadata.iter().cloned().collect();
    manifest.insert(
        "hubnorm.methods".into(),
        crate::stats_file::methods_json(methods),
    );
    manifest.insert(
        "hubnorm.sinkhorn_tolerance".into(),
        format!("{:?}", options.sinkhorn_tolerance),
    );
    // The same rows either way, but a resume would record one precision
    // and report one screen for rows computed under two.
    // Absent at the default, as in checkpoints of earlier builds.
    if options.precision != crate::options::Precision::default() {
        manifest.insert(
            "hubnorm.precision".into(),
            format!("{:?}", options.precision),
        );
    }
    let read = &options.read;
    manifest.insert(
        "hubnorm.columns".into(),
        format!("{} {}", read.id_column, read.embedding_column),
    );
    manifest
}

/// The methods of `job`, checked for a stats pass.
pub fn stats_methods(job: &StatsJob) -> Result<Vec<MethodSpec>> {
    let methods = check_methods(&job.methods, job.gallery_bank.is_some())?;
    check_tolerance(&methods, job.options.sinkhorn_tolerance)?;
    refuse_protocol(&methods, "stats")?;
    Ok(methods)
}

/// Refuses `methods` unless pass 1 can compute any range of gallery rows on
/// its own with no merge after it, as the partitions of `hubnorm_stats`
/// on a cluster do (see
/// [`crate::bank::driver::StatsPlan::rows_are_independent`]).
pub fn check_shardable(methods: &[MethodSpec]) -> Result<()> {
    refuse_methods(
        methods,
        MethodSpec::has_late_columns,
        "cannot run in hubnorm_stats on a cluster yet: their statistics need every gallery row at once (activation sets, Sinkhorn potentials), while the table's partitions are independent shards of gallery rows; use `hubnorm stats --cluster` for them, or run without --cluster",
    )
}

/// A usage error naming the methods `refused` picks, followed by `why`.
fn refuse_methods(
    methods: &[MethodSpec],
    refused: impl Fn(&MethodSpec) -> bool,
    why: &str,
) -> Result<()> {
    let names: Vec<&str> = methods
        .iter()
        .filter(|m| refused(m))
        .map(|m| m.kind().name())
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    Err(HubnormError::Usage(format!("{} {why}", names.join(", "))))
}

/// The stats rows of gallery rows `gallery_rows` alone (a cluster task's
/// shard of `job`), batch by batch into `emit`, in gallery order: the
/// rows the whole pass writes for them. With `activation_rows`, the early
/// columns in [`crate::bank::shards::shard_schema`] followed by the shard's
/// activation states, for a client that merges them (and computes the
/// Sinkhorn potentials in rounds of their own: not in these rows); without,
/// the methods must pass [`check_shardable`]. Returns what the bf16 screen
/// did (zeros where it did not run).
pub fn stream_stats_rows(
    job: &StatsJob,
    gallery_rows: std::ops::Range<u64>,
    activation_rows: bool,
    progress: &dyn Progress,
    emit: &mut (dyn FnMut(&RecordBatch) -> Result<()> + Send),
) -> Result<crate::kernel::ScreenCounts> {
    let methods = stats_methods(job)?;
    if !activation_rows {
        check_shardable(&methods)?;
    }
    with_threads(job.options.threads, || {
        let (gallery, banks) = open_stats_tables(job, &methods)?;
        gallery.check_shard(&gallery_rows)?;
        let inputs = StatsInputs {
            gallery: &gallery,
            bank: &banks.bank,
            gallery_bank: banks.gallery_bank.as_ref(),
            index: None,
        };
        let plan = StatsPlan::new(&inputs, &methods, Vec::new())?;
        if !activation_rows {
            let output = stats_of_rows(
                &inputs,
                &plan,
                gallery_rows,
                &job.options,
                progress,
                |batch| emit(&batch),
            )?;
            return Ok(output.screen);
        }
        use crate::bank::shards;
        let schema = shards::shard_schema(&plan.layout, gallery.id_kind);
        let output = stats_of_rows(
            &inputs,
            &plan,
            gallery_rows,
            &job.options,
            progress,
            |batch| emit(&shards::early_rows(&batch, &schema)?),
        )?;
        shards::activation_rows(
            &output,
            &plan.activation_shapes(&inputs),
            &schema,
            job.options.read.batch_rows,
            emit,
        )?;
        Ok(output.screen)
    })
}

/// A round of the one Sinkhorn method of `job` over the targets' rows
/// `target_rows` (the gallery's, then the gallery bank's), from the source
/// potentials the client wrote at `source_potentials` (none in the first
/// round): a cluster task's shard, in [`crate::bank::shards::round_schema`]
/// rows into `emit`.
pub fn stream_sinkhorn_round(
    job: &StatsJob,
    target_rows: Option<std::ops::Range<u64>>,
    source_potentials: Option<&Path>,
    emit: &mut (dyn FnMut(&RecordBatch) -> Result<()> + Send),
) -> Result<()> {
    let methods = stats_methods(job)?;
    let (method, setup) = match &methods[..] {
        [method] => method
            .method()
            .sinkhorn(method)
            .map(|setup| (method, setup)),
        _ => None,
    }
    .ok_or_else(|| {
        HubnormError::Internal("a Sinkhorn round is for one method with Sinkhorn sweeps".into())
    })?;
    with_threads(job.options.threads, || {
        let (gallery, banks) = open_stats_tables(job, &methods)?;
        let mut targets = vec![&gallery];
        if setup.with_gallery_bank {
            targets.push(banks.gallery_bank.as_ref().ok_or_else(|| {
                HubnormError::Usage(format!(
                    "method {} needs --gallery-bank PATH",
                    method.kind()
                ))
            })?);
        }
        let target_rows = target_rows.unwrap_or(0..targets.iter().map(|t| t.rows).sum());
        let g = source_potentials
            .map(|path| read_potentials(path, banks.bank.rows as usize))
            .transpose()?;
        let round =
            crate::bank::sinkhorn::sinkhorn_round(&crate::bank::sinkhorn::SinkhornRoundRequest {
                sources: &banks.bank,
                targets: &targets,
                target_rows: target_rows.clone(),
                tau: setup.tau,
                source_potential: g.as_deref(),
                budget: job.options.memory.bytes(),
                resident_bytes: g.as_ref().map_or(0, |g| g.len() * 8),
            })?;
        crate::bank::shards::round_rows(
            &round,
            target_rows.start,
            job.options.read.batch_rows,
            emit,
        )
    })
}

/// The column of a file of Sinkhorn source potentials.
const POTENTIAL_COLUMN: &str = "potential";

/// Writes the source potentials `g` of a Sinkhorn round to `path` (a
/// local path or URL the executors read), replacing the last round's.
#[cfg(feature = "cluster")]
pub(super) fn write_potentials(path: &Path, g: &[f64]) -> Result<()> {
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new(POTENTIAL_COLUMN, arrow::datatypes::DataType::Float64, false),
    ]));
    let mut sink = ParquetSink::create(path, schema.clone(), Vec::new(), true)?;
    for part in g.chunks(65_536) {
        let column = std::sync::Arc::new(arrow::array::Float64Array::from(part.to_vec()));
        sink.write(&RecordBatch::try_new(schema.clone(), vec![column])?)?;
    }
    sink.finish()?;
    Ok(())
}

/// The source potentials at `path` ([`write_potentials`]), `rows` of them.
fn read_potentials(path: &Path, rows: usize) -> Result<Vec<f64>> {
    use arrow::array::AsArray;
    let reader = crate::source::open_parquet(path)?
        .build()
        .map_err(|e| HubnormError::parquet(path, e))?;
    let mut g = Vec::with_capacity(rows);
    for batch in crate::source::CheckedBatches::new(reader, path) {
        let batch = batch?;
        let column = batch
            .column_by_name(POTENTIAL_COLUMN)
            .and_then(|c| c.as_primitive_opt::<arrow::datatypes::Float64Type>())
            .ok_or_else(|| {
                HubnormError::input(
                    path,
                    None,
                    Some(POTENTIAL_COLUMN),
                    "not a file of Sinkhorn potentials",
                )
            })?;
        g.extend_from_slice(column.values());
    }
    if g.len() != rows {
        return Err(HubnormError::input(
            path,
            None,
            None,
            format!("{} Sinkhorn potentials for a bank of {rows} rows", g.len()),
        ));
    }
    Ok(g)
}

/// `hubnorm stats` as a stream of record batches into `sink` (`job.out`
/// and `job.overwrite` are not used); columns known only at the end go
/// through a scratch file at `spool`, removed afterwards.
pub fn stream_stats(
    job: &StatsJob,
    spool: &Path,
    progress: &dyn Progress,
    sink: &mut (dyn crate::stats_file::StatsSink + Send),
) -> Result<()> {
    let methods = stats_methods(job)?;
    with_stats_inputs(job, &methods, |inputs, metadata| {
        crate::stats_file::stream_stats(
            inputs,
            &methods,
            spool,
            &job.options,
            metadata,
            progress,
            sink,
            None,
        )?;
        Ok(())
    })
}
