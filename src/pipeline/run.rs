//! `hubnorm run` (and the runs of `compare` and `tune`): both passes and
//! the summary, committed together.

use super::*;

/// File names `hubnorm run` writes into its output directory.
pub const RUN_OUTPUTS: [&str; 3] = ["results.parquet", "gallery_stats.parquet", "summary.json"];

/// The tabular outputs `run` and `compare` may write in their folder.
pub const RUN_TABLES: [&str; 5] = [
    "results.parquet",
    "gallery_stats.parquet",
    "report.parquet",
    "gallery_report.parquet",
    "compare.parquet",
];

/// Declares the tables a `run` or `compare` writes into `out_dir` in
/// `format`. Under `--append` the statistics get a new version replacing
/// them (they describe the inputs as they are now), where results and
/// reports add their rows.
pub fn declare_run_tables(
    format: TableFormat,
    out_dir: &Path,
    overwrite: bool,
) -> Result<DeclaredTables> {
    let tables = RUN_TABLES.iter().map(|name| out_dir.join(name)).collect();
    let declared = format.declare(tables, overwrite)?;
    if format != (TableFormat::Delta { append: true }) {
        return Ok(declared);
    }
    let stats = crate::sink::write_as_delta_tables(
        [out_dir.join("gallery_stats.parquet")],
        crate::sink::DeltaMode::Overwrite,
    )?;
    Ok(declared.and(stats))
}

/// A run has a query bank or is transductive, not both: the command
/// line's rules, for the library's other callers (the Python package) too.
pub(crate) fn check_bank_choice(job: &RunJob) -> Result<()> {
    match (job.transductive, job.bank.is_empty()) {
        (true, false) => Err(HubnormError::Usage(
            "--bank cannot be used with --transductive (which uses the test queries as the bank)"
                .into(),
        )),
        (false, true) => Err(HubnormError::Usage(
            "a query bank is needed: --bank PATH (training-split queries), or --transductive to use the test queries themselves".into(),
        )),
        _ => Ok(()),
    }
}

/// `hubnorm run`: pass 1, pass 2 and the summary, into `job.out_dir`.
/// Nothing appears under the final names unless every output is complete.
pub fn run(job: &RunJob, progress: &dyn Progress) -> Result<RunSummary> {
    let _locks = OutputLock::acquire_folder(&job.out_dir, &RUN_OUTPUTS)?;
    let products = run_uncommitted(job, "run", &[], progress)?;
    let summary = products.summary.clone();
    products.commit(Vec::new())?;
    Ok(summary)
}

/// What `hubnorm run` produced, before its files take their final names.
pub(crate) struct RunProducts {
    pub summary: RunSummary,
    pub outcomes: Vec<MethodOutcome>,
    /// The gallery's ids in row order, with their lookup.
    pub index: IdIndex,
    /// gallery_stats, results, summary.json: uncommitted.
    pub files: Vec<AtomicFile>,
    /// The run's checkpoint, removed once the outputs are committed.
    pub checkpoint: Option<RunCheckpoint>,
    /// Whether the outputs may replace existing files: `--overwrite`, or a
    /// resume (which may replace what the stopped run committed).
    pub overwrite: bool,
}

impl RunProducts {
    /// Commits the run's files, then the caller's `more`, and removes the
    /// checkpoint.
    pub fn commit(self, more: Vec<AtomicFile>) -> Result<()> {
        if let Err(e) = commit_all(self.files.into_iter().chain(more).collect()) {
            // The checkpoint stays whatever failed (a refused upload too): a
            // resume writes every output again. A stop's message says so.
            return Err(match (e, self.checkpoint) {
                (e @ HubnormError::Interrupted(_), Some(checkpoint)) => {
                    checkpoint.after_failure(e, true)
                }
                (e, _) => e,
            });
        }
        // The outputs are in place: a stop now would only strand the
        // checkpoint (and say that nothing was written).
        match self.checkpoint {
            Some(checkpoint) => crate::cancel::finishing(|| checkpoint.remove()),
            None => Ok(()),
        }
    }

    /// The stats file as written so far (its temporary name).
    pub fn stats_path(&self) -> &Path {
        self.files[0].temporary_path()
    }
}

/// Gives every file its final name, in the order written; when one fails,
/// those already renamed are put back as they were (see
/// [`crate::sink::commit_together`]).
pub(crate) fn commit_all(files: Vec<AtomicFile>) -> Result<()> {
    crate::sink::commit_together(files)
}

/// Both passes and the summary into uncommitted files; `extra_outputs`
/// are further names in `job.out_dir` a caller will write (refused when they
/// exist, as run's own). A failure leaves no folder it made.
pub(crate) fn run_uncommitted(
    job: &RunJob,
    command: &'static str,
    extra_outputs: &[&str],
    progress: &dyn Progress,
) -> Result<RunProducts> {
    check_k(job.k)?;
    // Before pass 1, not after it; on a cluster each executor checks its own CPU.
    if job.cluster.is_none() {
        job.options.precision.check_available()?;
    }
    let none = MethodKind::baseline();
    let mut methods = vec![MethodSpec::default_for(none)];
    methods.extend(job.methods.iter().filter(|m| m.kind() != none));
    let methods = check_methods(&methods, job.gallery_bank.is_some())?;
    check_tolerance(&methods, job.options.sinkhorn_tolerance)?;
    job.options.precision.check_methods(&methods)?;
    check_bank_choice(job)?;
    if job.transductive {
        if let Some(m) = methods
            .iter()
            .find(|m| !m.kind().has_transductive_variant())
        {
            return Err(HubnormError::Usage(format!(
                "--transductive uses the test queries as the bank, which METHODS.md defines for {} only, not {}",
                crate::method::names_where(|m| m.kind().takes_queries_as_bank()),
                m.kind()
            )));
        }
    }
    let mut inputs = vec![
        ("queries", job.queries.as_str()),
        ("gallery", job.gallery.as_str()),
    ];
    if !job.transductive {
        inputs.push(("bank", job.bank.as_str()));
    }
    inputs.extend(job.gallery_bank.as_deref().map(|g| ("gallery bank", g)));
    refuse_output_in_inputs(&job.out_dir, &inputs)?;
    if let Some(cluster) = &job.cluster {
        check_run_on_cluster(job, cluster)?;
    }
    // The run that left a checkpoint was allowed its outputs (none existed,
    // or --overwrite): a resume may replace those it committed before it
    // stopped.
    let resuming = job.checkpoint.resume && RunCheckpoint::exists(&job.out_dir)?;
    let overwrite = job.overwrite || resuming;
    for name in RUN_OUTPUTS.iter().chain(extra_outputs) {
        refuse_output_in_inputs(&job.out_dir.join(name), &inputs)?;
        refuse_existing(&job.out_dir.join(name), overwrite)?;
    }
    // Checked before hours of work, not after them.
    let out_dir = crate::sink::PreparedOutputDir::prepare(&job.out_dir)?;
    let products = with_threads(job.options.threads, || {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        check_k_within(job.k, &gallery)?;
        if queries.dim != gallery.dim {
            return Err(crate::bank::pass::dimension_error(&queries, &gallery));
        }
        let bank_spec = if job.transductive {
            &job.queries
        } else {
            &job.bank
        };
        let banks = open_banks(
            bank_spec,
            job.gallery_bank.as_deref(),
            job.bank_sample,
            &methods,
            &gallery,
            &job.options,
        )?;
        let index = IdIndex::build(&gallery)?;
        let mut metadata = banks.stats_metadata(&gallery, job.bank_sample, &job.options);
        metadata.push((
            crate::stats_file::TRANSDUCTIVE_KEY.into(),
            job.transductive.to_string(),
        ));
        let run_pairs = {
            let mut pairs = metadata.clone();
            pairs.extend(table_metadata("queries", &queries));
            pairs.push(("hubnorm.methods".into(), methods_json(&methods)));
            pairs.push(("hubnorm.k".into(), job.k.to_string()));
            // Not the memory limit or the threads: outputs do not depend on them.
            let o = &job.options;
            let options = format!("{:?} {:?} {:?}", o.read, o.sinkhorn_tolerance, o.report);
            pairs.push(("hubnorm.options".into(), options));
            pairs
        };
        let run_id = run_fingerprint(&run_pairs);
        metadata.push((RUN_KEY.into(), run_id.clone()));
        // A cluster's run is not checkpointed (refused with --resume above).
        let checkpoint = match &job.cluster {
            None => {
                // The precision changes the summary's screen counts, not
                // the run's results: in the manifest, not the run's id.
                let mut manifest: std::collections::BTreeMap<String, String> =
                    run_pairs.into_iter().collect();
                // Absent at the default, as in checkpoints of earlier builds.
                if job.options.precision != crate::options::Precision::default() {
                    manifest.insert(
                        "hubnorm.precision".into(),
                        format!("{:?}", job.options.precision),
                    );
                }
                RunCheckpoint::open(&job.out_dir, command, manifest, &job.checkpoint)?
            }
            Some(_) => None,
        };
        let mut pass1 = checkpoint
            .as_ref()
            .map(|c| c.pass1(StatsLayout::new(&methods).has_late_columns()))
            .transpose()?;
        let failed =
            |err: HubnormError, checkpoint: Option<RunCheckpoint>, saved: bool| match checkpoint {
                Some(checkpoint) => checkpoint.after_failure(err, saved),
                None => err,
            };
        let stats_out = job.out_dir.join("gallery_stats.parquet");
        // A cluster's passes read the tables as this run opened them.
        #[cfg(feature = "cluster")]
        let cluster_inputs = match &job.cluster {
            Some(_) => crate::sql::pass::ClusterInputs::of([
                Some(&queries),
                Some(&gallery),
                Some(&banks.bank),
                banks.gallery_bank.as_ref(),
            ])?,
            None => Default::default(),
        };
        let (stats_file, pass1_report) = match &job.cluster {
            None => match write_stats(
                &banks.inputs(&gallery, &index),
                &methods,
                &stats_out,
                overwrite,
                &job.options,
                metadata,
                progress,
                pass1.as_mut(),
            ) {
                Ok(written) => written,
                Err(err) => {
                    let saved = pass1.as_ref().is_some_and(|p| p.saved_rows() > 0);
                    return Err(failed(err, checkpoint, saved));
                }
            },
            #[cfg(feature = "cluster")]
            Some(cluster) => {
                let stats_job = StatsJob {
                    gallery: job.gallery.clone(),
                    bank: bank_spec.clone(),
                    gallery_bank: job.gallery_bank.clone(),
                    bank_sample: job.bank_sample,
                    methods: methods.clone(),
                    out: stats_out.clone(),
                    overwrite,
                    options: job.options.clone(),
                    checkpoint: Default::default(),
                };
                let inputs = banks.inputs(&gallery, &index);
                on_cluster::stats(
                    &stats_job,
                    &methods,
                    &inputs,
                    metadata,
                    &stats_out,
                    cluster,
                    &cluster_inputs,
                )?
            }
            #[cfg(not(feature = "cluster"))]
            Some(cluster) => return Err(without_cluster(&cluster.scheduler)),
        };
        // Read back through the same code as `hubnorm search`. A method
        // may refuse its statistics here (`ls`: a neighbourhood of scale 0).
        let prepared = load_plan(
            Some(stats_file.temporary_path()),
            &index,
            &methods,
            job.options.read.normalize,
        )
        .and_then(|plan| {
            let protocol = prepare_protocol(
                &methods,
                &gallery,
                &banks.bank,
                queries.rows,
                job.bank_sample,
                &job.options,
            )?;
            Ok((plan, protocol))
        });
        let (plan, protocol) = match prepared {
            Ok(prepared) => prepared,
            Err(err) => return Err(failed(err, checkpoint, true)),
        };
        let results_out = job.out_dir.join("results.parquet");
        let results_metadata = bank_metadata(&banks, job.bank_sample)
            .into_iter()
            .chain([(RUN_KEY.to_owned(), run_id.clone())])
            .collect();
        let (results_file, outcomes, screen) = match (&job.cluster, &checkpoint) {
            (None, Some(run_checkpoint)) => {
                let written = run_checkpoint.pass2().and_then(|mut pass2| {
                    write_results_checkpointed(
                        &queries,
                        &gallery,
                        &index,
                        &plan,
                        job.k,
                        &results_out,
                        overwrite,
                        &job.options,
                        results_metadata,
                        protocol.as_ref(),
                        progress,
                        &mut pass2,
                    )
                });
                match written {
                    Ok(written) => written,
                    Err(err) => return Err(failed(err, checkpoint, true)),
                }
            }
            (None, None) => {
                let (file, outcomes, screen) = write_results(
                    &queries,
                    &gallery,
                    &index,
                    &plan,
                    job.k,
                    Some(&results_out),
                    overwrite,
                    &job.options,
                    results_metadata,
                    protocol.as_ref(),
                    progress,
                )?;
                (file.expect("a destination"), outcomes, screen)
            }
            #[cfg(feature = "cluster")]
            (Some(cluster), _) => {
                // The executors read the statistics from the stats file
                // under its temporary name, beside the outputs.
                let search_job = SearchJob {
                    queries: job.queries.clone(),
                    gallery: job.gallery.clone(),
                    stats: Some(stats_file.temporary_path().to_path_buf()),
                    methods: methods.clone(),
                    k: job.k,
                    out: results_out,
                    overwrite,
                    options: job.options.clone(),
                };
                // sinkhorn-pp's executors read the bank as this run does.
                let protocol_bank = protocol.as_ref().map(|_| ProtocolBank {
                    bank: bank_spec.clone(),
                    sample: job.bank_sample,
                });
                on_cluster::results(
                    &search_job,
                    &queries,
                    &gallery,
                    &plan,
                    results_metadata,
                    protocol_bank,
                    cluster,
                    &cluster_inputs,
                )?
            }
            #[cfg(not(feature = "cluster"))]
            (Some(cluster), _) => return Err(without_cluster(&cluster.scheduler)),
        };
        let mut summaries: Vec<MethodSummary> = outcomes
            .iter()
            .map(|o| o.summary(&job.options.report))
            .collect();
        for (summary, rule) in summaries.iter_mut().zip(&plan.methods) {
            summary.sinkhorn = pass1_report
                .sinkhorn
                .iter()
                .find(|r| r.method == rule.spec)
                .cloned();
        }
        let summary = RunSummary {
            queries: queries.rows,
            gallery: gallery.rows,
            bank: Some(banks.bank.rows),
            transductive: job.transductive,
            gallery_bank: banks.gallery_bank.as_ref().map(|t| t.rows),
            dim: gallery.dim,
            k: job.k,
            normalize: job.options.read.normalize,
            methods: summaries,
            screen,
            bank_screen: pass1_report.screen.map(ScreenSummary::of),
        };
        let json = serde_json::to_string_pretty(&SummaryFile {
            summary: &summary,
            run: &run_id,
        })
        .map_err(|e| HubnormError::Internal(e.to_string()))?;
        let summary_file =
            write_text_atomically(&job.out_dir.join("summary.json"), &json, overwrite)?;
        Ok(RunProducts {
            summary,
            outcomes,
            index,
            files: vec![stats_file, results_file, summary_file],
            checkpoint,
            overwrite,
        })
    });
    if products.is_err() {
        out_dir.remove_if_empty();
    }
    products
}

/// Refuses a run on `cluster` that a cluster cannot compute: outputs in
/// object storage (the executors read the statistics from the stats file
/// before it is committed, which for an object is a local temporary file).
/// Every method runs there.
fn check_run_on_cluster(job: &RunJob, cluster: &ClusterJob) -> Result<()> {
    if !cfg!(feature = "cluster") {
        return Err(without_cluster(&cluster.scheduler));
    }
    if job.checkpoint.resume {
        return Err(HubnormError::Usage(
            "--resume: a run on a cluster keeps no checkpoint (its tasks are retried by the cluster); run again without --resume".into(),
        ));
    }
    if crate::storage::is_remote(&job.out_dir) {
        return Err(HubnormError::Usage(format!(
            "--out {}: a run on a cluster writes its outputs to a directory the executors can read (they read its statistics before they are committed), not to object storage; write to shared storage, or run `stats --cluster` and `search --cluster` with URL outputs",
            job.out_dir.display()
        )));
    }
    Ok(())
}

/// Pass 1 and pass 2 of `methods` for `queries`, keeping no output: the
/// figures of each method (`hubnorm tune`). The statistics go to a
/// temporary file in `scratch_dir`, removed on return.
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate_methods(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    bank: EmbeddingTable,
    gallery_bank: Option<EmbeddingTable>,
    methods: &[MethodSpec],
    options: &PassOptions,
    scratch_dir: &Path,
    progress: &dyn Progress,
) -> Result<Vec<MethodOutcome>> {
    let methods = check_methods(methods, gallery_bank.is_some())?;
    check_tolerance(&methods, options.sinkhorn_tolerance)?;
    refuse_protocol(&methods, "tune")?;
    for table in std::iter::once(&bank).chain(&gallery_bank).chain([queries]) {
        if table.dim != gallery.dim {
            return Err(crate::bank::pass::dimension_error(table, gallery));
        }
    }
    check_bank_sizes(&methods, &bank, gallery, options)?;
    let banks = Banks { bank, gallery_bank };
    with_threads(options.threads, || {
        let index = IdIndex::build(gallery)?;
        let (stats, _) = write_stats(
            &banks.inputs(gallery, &index),
            &methods,
            &scratch_dir.join("tune_stats.parquet"),
            true,
            options,
            Vec::new(),
            progress,
            None,
        )?;
        let plan = load_plan(
            Some(stats.temporary_path()),
            &index,
            &methods,
            options.read.normalize,
        )?;
        let (_, outcomes, _) = write_results(
            queries,
            gallery,
            &index,
            &plan,
            SKEWNESS_K,
            None,
            true,
            options,
            Vec::new(),
            None,
            progress,
        )?;
        Ok(outcomes)
    })
}
