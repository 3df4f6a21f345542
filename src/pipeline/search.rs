//! `hubnorm search`: pass 2 with a stats file's statistics into a results
//! file, on this machine or on a cluster, and as a stream for SQL.

use super::*;

/// Pass 2 into an (uncommitted) results file.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_results(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    index: &IdIndex,
    plan: &ScoringPlan,
    k: usize,
    out: Option<&Path>,
    overwrite: bool,
    options: &PassOptions,
    metadata: Vec<(String, String)>,
    protocol: Option<&SingleQuerySinkhorn>,
    progress: &dyn Progress,
) -> Result<(
    Option<AtomicFile>,
    Vec<MethodOutcome>,
    Option<ScreenSummary>,
)> {
    let precision =
        crate::options::Precision::recorded(crate::query::pass::screens(options.precision, plan)?);
    // Without a destination (tuning), only the figures are gathered.
    let mut sink = out
        .map(|out| {
            results_sink(
                queries, gallery, plan, k, out, overwrite, options, precision, metadata,
            )
        })
        .transpose()?;
    let (outcomes, screen) = search_into(
        queries,
        0..queries.rows,
        gallery,
        index,
        plan,
        k,
        ResultRows::TopK,
        options,
        protocol,
        progress,
        &mut |batch| match &mut sink {
            Some(sink) => sink.write(batch),
            None => Ok(()),
        },
    )?;
    let file = sink.map(ParquetSink::close_uncommitted).transpose()?;
    Ok((file, outcomes, screen.map(ScreenSummary::of)))
}

/// Pass 2 into an uncommitted results file, as [`write_results`], saving
/// each finished query block to `checkpoint` and replaying the blocks it
/// holds first. The blocks are saved with the report columns, and the
/// figures are rebuilt from the rows (replayed and new alike, in query
/// order), so a resumed run's summary counts every query once.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_results_checkpointed(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    index: &IdIndex,
    plan: &ScoringPlan,
    k: usize,
    out: &Path,
    overwrite: bool,
    options: &PassOptions,
    metadata: Vec<(String, String)>,
    protocol: Option<&SingleQuerySinkhorn>,
    progress: &dyn Progress,
    checkpoint: &mut Checkpoint,
) -> Result<(AtomicFile, Vec<MethodOutcome>, Option<ScreenSummary>)> {
    let screen = crate::query::pass::screens(options.precision, plan)?;
    let mut sink = results_sink(
        queries,
        gallery,
        plan,
        k,
        out,
        overwrite,
        options,
        crate::options::Precision::recorded(screen),
        metadata,
    )?;
    let mut figures = OutcomesFromRows::new(
        plan,
        k,
        gallery.rows as usize,
        options.report.hubness_k,
        queries.has_targets,
    );
    let rows = ResultRows::WithReportColumns {
        depth: figures.depth(),
    };
    let schema = rows_schema(queries.id_kind, gallery.id_kind, rows);
    let results = results_schema(queries.id_kind, gallery.id_kind);
    let write = |sink: &mut ParquetSink, figures: &mut OutcomesFromRows, batch: &RecordBatch| {
        let kept = figures.take(batch)?;
        sink.write(&RecordBatch::try_new(
            results.clone(),
            kept.columns().to_vec(),
        )?)
    };
    let mut counts = checkpoint.resumed_screen_counts()?;
    checkpoint.replay(&schema, |batch| write(&mut sink, &mut figures, &batch))?;
    let start = checkpoint.resumed_rows();
    if start < queries.rows {
        let searched = search_blocks_into(
            queries,
            start..queries.rows,
            gallery,
            index,
            plan,
            k,
            rows,
            options,
            protocol,
            progress,
            &mut |batch, extent| {
                write(&mut sink, &mut figures, batch)?;
                checkpoint.record_queries(batch, extent.query_rows, extent.screen)
            },
        );
        match searched {
            Err(HubnormError::Interrupted(message)) => {
                // Every recorded block is whole: keep them.
                crate::cancel::finishing(|| checkpoint.save_queries_now())?;
                return Err(HubnormError::Interrupted(message));
            }
            Err(err) => return Err(err),
            Ok((_, searched)) => counts.add(searched.unwrap_or_default()),
        }
    }
    checkpoint.save_queries_now()?;
    let file = sink.close_uncommitted()?;
    Ok((
        file,
        figures.finish(),
        screen.then_some(ScreenSummary::of(counts)),
    ))
}

/// The writer of a results file, with its footer's metadata.
#[allow(clippy::too_many_arguments)]
pub(super) fn results_sink(
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    plan: &ScoringPlan,
    k: usize,
    out: &Path,
    overwrite: bool,
    options: &PassOptions,
    precision: &str,
    mut metadata: Vec<(String, String)>,
) -> Result<ParquetSink> {
    let schema = results_schema(queries.id_kind, gallery.id_kind);
    metadata.extend(common_metadata("results", options));
    // The lists and scores are the same either way; the speed is not.
    metadata.push(("hubnorm.precision".into(), precision.into()));
    metadata.push((
        "hubnorm.methods".into(),
        methods_json(&plan.methods.iter().map(|m| m.spec).collect::<Vec<_>>()),
    ));
    metadata.push(("hubnorm.k".into(), k.to_string()));
    metadata.extend(table_metadata("queries", queries));
    metadata.extend(table_metadata("gallery", gallery));
    ParquetSink::create(out, schema, metadata, overwrite)
}

/// `hubnorm search`: pass 2 only, with statistics from a stats file.
pub fn run_search(job: &SearchJob, progress: &dyn Progress) -> Result<RunSummary> {
    let methods = check_search(job)?;
    let _lock = OutputLock::acquire(&job.out)?;
    with_threads(job.options.threads, || {
        let SearchInputs {
            queries,
            gallery,
            index,
            plan,
        } = SearchInputs::open(job, &methods)?;
        let (file, outcomes, screen) = write_results(
            &queries,
            &gallery,
            &index,
            &plan,
            job.k,
            Some(&job.out),
            job.overwrite,
            &job.options,
            search_metadata(job),
            None,
            progress,
        )?;
        file.expect("a destination").commit()?;
        Ok(search_summary(job, &queries, &gallery, &outcomes, screen))
    })
}

/// `hubnorm search --cluster`: pass 2 of `job` computed by the cluster of
/// `cluster`, in shards of query rows, into the same results file and
/// summary `run_search` makes, bit for bit. The shards' rows go down to the
/// depth of the hubness measures and carry the report columns, from which
/// the summary is rebuilt here; the file is written and committed here
/// once every shard is in.
pub fn run_search_on(job: &SearchJob, cluster: &ClusterJob) -> Result<RunSummary> {
    #[cfg(feature = "cluster")]
    {
        let _lock = OutputLock::acquire(&job.out)?;
        on_cluster::search(job, cluster)
    }
    #[cfg(not(feature = "cluster"))]
    {
        check_search(job)?;
        Err(without_cluster(&cluster.scheduler))
    }
}

/// What a search reads before its pass: the tables (checked), the
/// gallery's id index and the scoring plan from the stats file.
pub(super) struct SearchInputs {
    pub(super) queries: EmbeddingTable,
    pub(super) gallery: EmbeddingTable,
    pub(super) index: IdIndex,
    pub(super) plan: ScoringPlan,
}

impl SearchInputs {
    pub(super) fn open(job: &SearchJob, methods: &[MethodSpec]) -> Result<Self> {
        let queries = open_table("queries", &job.queries, &job.options, true)?;
        let gallery = open_table("gallery", &job.gallery, &job.options, false)?;
        check_k_within(job.k, &gallery)?;
        let index = IdIndex::build(&gallery)?;
        let plan = load_plan(
            job.stats.as_deref(),
            &index,
            methods,
            job.options.read.normalize,
        )?;
        Ok(SearchInputs {
            queries,
            gallery,
            index,
            plan,
        })
    }
}

/// What `run_search` and `run_search_on` check before reading any row:
/// the methods (returned), k, and the output's place.
pub(super) fn check_search(job: &SearchJob) -> Result<Vec<MethodSpec>> {
    check_k(job.k)?;
    let methods = check_methods(&job.methods, true)?;
    refuse_protocol(&methods, "search")?;
    let mut inputs = vec![
        ("queries", job.queries.as_str()),
        ("gallery", job.gallery.as_str()),
    ];
    let stats = job.stats.as_ref().map(|s| s.display().to_string());
    inputs.extend(stats.as_deref().map(|s| ("stats", s)));
    refuse_output_in_inputs(&job.out, &inputs)?;
    refuse_existing(&job.out, job.overwrite)?;
    if let Some(stats) = &job.stats {
        check_beside_its_run(stats)?;
    }
    Ok(methods)
}

/// The footer metadata a search adds to its results file.
pub(super) fn search_metadata(job: &SearchJob) -> Vec<(String, String)> {
    job.stats
        .iter()
        .map(|stats| ("hubnorm.stats.path".into(), stats.display().to_string()))
        .collect()
}

/// The summary of a search from its methods' figures.
pub(super) fn search_summary(
    job: &SearchJob,
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    outcomes: &[MethodOutcome],
    screen: Option<ScreenSummary>,
) -> RunSummary {
    RunSummary {
        queries: queries.rows,
        gallery: gallery.rows,
        bank: None,
        gallery_bank: None,
        transductive: false,
        dim: gallery.dim,
        k: job.k,
        normalize: job.options.read.normalize,
        methods: outcomes
            .iter()
            .map(|o| o.summary(&job.options.report))
            .collect(),
        screen,
        bank_screen: None,
    }
}

/// The bank `sinkhorn-pp` draws its pseudo-test queries from, for a pass 2
/// that runs elsewhere (a cluster's shards of a `run`).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ProtocolBank {
    /// The bank's path or URL (the queries' when transductive).
    pub bank: String,
    pub sample: Option<BankSample>,
}

/// `sinkhorn-pp`'s fixed inputs when it is among `methods`: its pseudo-test
/// queries drawn from `bank` (seeded by `sample`'s seed), checked for the
/// cost of `queries` test queries and for the memory.
pub(super) fn prepare_protocol(
    methods: &[MethodSpec],
    gallery: &EmbeddingTable,
    bank: &EmbeddingTable,
    queries: u64,
    sample: Option<BankSample>,
    options: &PassOptions,
) -> Result<Option<SingleQuerySinkhorn>> {
    methods
        .iter()
        .find_map(|m| m.method().single_query(m))
        .map(|setup| {
            SingleQuerySinkhorn::prepare(
                gallery,
                bank,
                queries,
                setup,
                sample.map_or(0, |s| s.seed),
                options.memory.bytes(),
            )
        })
        .transpose()
}

/// `hubnorm search` as a stream of record batches into `emit` (`job.out`
/// and `job.overwrite` are not used), one batch per query block: of every
/// query, or of the rows `query_rows` alone (a cluster task's shard). With
/// `protocol_bank`, `sinkhorn-pp` may be among the methods (a shard of a
/// `run`), and draws its pseudo-test queries from it as the run does.
/// Returns what the bf16 screen did (zeros where it did not run).
pub fn stream_search(
    job: &SearchJob,
    query_rows: Option<std::ops::Range<u64>>,
    rows: ResultRows,
    protocol_bank: Option<&ProtocolBank>,
    progress: &dyn Progress,
    emit: &mut (dyn FnMut(&RecordBatch) -> Result<()> + Send),
) -> Result<crate::kernel::ScreenCounts> {
    check_k(job.k)?;
    let methods = check_methods(&job.methods, true)?;
    if protocol_bank.is_none() {
        refuse_protocol(&methods, "search")?;
    }
    with_threads(job.options.threads, || {
        let SearchInputs {
            queries,
            gallery,
            index,
            plan,
        } = SearchInputs::open(job, &methods)?;
        let protocol = match protocol_bank {
            Some(protocol) => {
                let bank = open_bank("bank", &protocol.bank, &job.options, protocol.sample)?;
                prepare_protocol(
                    &methods,
                    &gallery,
                    &bank,
                    queries.rows,
                    protocol.sample,
                    &job.options,
                )?
            }
            None => None,
        };
        let (_, screen) = search_into(
            &queries,
            query_rows.unwrap_or(0..queries.rows),
            &gallery,
            &index,
            &plan,
            job.k,
            rows,
            &job.options,
            protocol.as_ref(),
            progress,
            emit,
        )?;
        Ok(screen.unwrap_or_default())
    })
}
