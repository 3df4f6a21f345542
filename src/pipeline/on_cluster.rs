//! The passes on a cluster (`--cluster`), into the files a local pass
//! writes: the client's side of `stats`, `search`, `run` and `compare`.

use super::search::{check_search, results_sink, search_metadata, search_summary, SearchInputs};
use super::stats::write_potentials;
use super::*;
use crate::bank::driver::{FileStatsSink, SinkhornReport, StatsReport, StatsSink};
use crate::bank::shards::{shard_row_count, RoundMerge, ShardMerge};
use crate::bank::sinkhorn::{sinkhorn_in_rounds, RoundsRequest};
use crate::kernel::ScreenCounts;
use crate::method::SinkhornSetup;
use crate::progress::Silent;
use crate::query::results::OutcomesFromRows;
use crate::sql::pass::{ClusterInputs, PassSpec};

/// [`run_search_on`](super::run_search_on).
pub(super) fn search(job: &SearchJob, cluster: &ClusterJob) -> Result<RunSummary> {
    let methods = check_search(job)?;
    with_threads(job.options.threads, || {
        // Opened and checked as a local run does, so that the same inputs
        // fail with the same messages before anything is sent.
        let SearchInputs {
            queries,
            gallery,
            plan,
            ..
        } = SearchInputs::open(job, &methods)?;
        let pinned = ClusterInputs::of([Some(&queries), Some(&gallery)])?;
        let (file, outcomes, screen) = results(
            job,
            &queries,
            &gallery,
            &plan,
            search_metadata(job),
            None,
            cluster,
            &pinned,
        )?;
        file.commit()?;
        Ok(search_summary(job, &queries, &gallery, &outcomes, screen))
    })
}

/// Pass 1 of `job` (`methods`, checked) over `inputs` into an
/// uncommitted stats file at `out` with `metadata`, and its report: how
/// each Sinkhorn method's iterations ended, what the executors' screens
/// did (when any screened). The file a local pass writes, bit for bit,
/// but for the Sinkhorn potentials (to rounding: see
/// [`sinkhorn_in_rounds`]). With activation sets (`dis`, `dual-dis`) the
/// shards send their partial states after their rows and the client
/// merges them ([`crate::bank::shards`]); the Sinkhorn potentials come
/// from rounds of their own after the shards ([`sinkhorn_on`]). Every pass
/// it sends reads the tables as `pinned` took them.
pub(super) fn stats(
    job: &StatsJob,
    methods: &[MethodSpec],
    inputs: &StatsInputs<'_>,
    metadata: Vec<(String, String)>,
    out: &Path,
    cluster: &ClusterJob,
    pinned: &ClusterInputs,
) -> Result<(AtomicFile, StatsReport)> {
    let mut plan = StatsPlan::new(inputs, methods, metadata)?;
    // Each executor applies the precision on its own CPU.
    let precision = job
        .options
        .precision
        .recorded_on_cluster(plan.bank_screenable(inputs));
    plan.metadata
        .push(crate::bank::driver::precision_entry(precision));
    let mut reports = Vec::new();
    let screen;
    let mut sink = FileStatsSink::new(out, job.overwrite);
    let spec = PassSpec::stats(job, methods, inputs.gallery.id_kind)
        .sharded(inputs.gallery.rows, cluster.shards);
    if plan.rows_are_independent() {
        sink.begin(plan.schema.clone(), plan.metadata.clone())?;
        // A shard's rows: one per gallery row.
        let expected = spec.shards.windows(2).map(|w| w[1] - w[0]).collect();
        screen = send(
            spec,
            expected,
            &job.options,
            cluster,
            pinned,
            &mut |batch| sink.write(batch),
        )?;
    } else {
        let shapes = plan.activation_shapes(inputs);
        let expected = spec
            .shards
            .windows(2)
            .map(|w| shard_row_count(w[1] - w[0], &shapes))
            .collect();
        let scratch = tempfile::Builder::new()
            .prefix("hubnorm-stats-")
            .tempdir()
            .map_err(|e| HubnormError::io(std::env::temp_dir(), e))?;
        let spool = scratch.path().join("early.parquet");
        let mut merge = ShardMerge::new(&plan, &shapes, inputs.gallery.rows as usize, &spool)?;
        screen = send(
            spec.with_activation_rows(),
            expected,
            &job.options,
            cluster,
            pinned,
            &mut |batch| merge.push(batch),
        )?;
        let mut potentials = Vec::new();
        for (method, setup) in plan.layout.sinkhorn_methods() {
            let (f, report) = sinkhorn_on(job, method, setup, inputs, out, cluster, pinned)?;
            plan.metadata.push(report.metadata_entry()?);
            potentials.push(f);
            reports.push(report);
        }
        merge.finish(&plan, &potentials, &mut sink)?;
    }
    let report = StatsReport {
        sinkhorn: reports,
        screen: (screen.screened > 0).then_some(screen),
    };
    Ok((sink.close_uncommitted()?, report))
}

/// The potentials f over the gallery of the Sinkhorn `method` of `job` and
/// its report, from T + 1 rounds on `cluster`, each sharded over the rows
/// of its targets ([`sinkhorn_in_rounds`]). Each round's source potentials
/// go to the executors in a scratch file beside `out` (which they must
/// reach, as they reach the inputs), removed afterwards.
fn sinkhorn_on(
    job: &StatsJob,
    method: MethodSpec,
    setup: SinkhornSetup,
    inputs: &StatsInputs<'_>,
    out: &Path,
    cluster: &ClusterJob,
    pinned: &ClusterInputs,
) -> Result<(Vec<f64>, SinkhornReport)> {
    let gallery_rows = inputs.gallery.rows as usize;
    let mut targets = gallery_rows;
    if setup.with_gallery_bank {
        let gallery_bank = inputs.gallery_bank.ok_or_else(|| {
            HubnormError::Usage(format!(
                "method {} needs --gallery-bank PATH",
                method.kind()
            ))
        })?;
        targets += gallery_bank.rows as usize;
    }
    let sources = inputs.bank.rows as usize;
    let scratch = ScratchFile(sibling(
        out,
        &format!("sinkhorn-{}", method.column_prefix()),
    ));
    let outcome = sinkhorn_in_rounds(
        &RoundsRequest {
            sources,
            targets,
            tau: setup.tau,
            iterations: setup.iterations,
            tolerance: job.options.sinkhorn_tolerance,
        },
        &Silent,
        |g| {
            let potentials = match g {
                Some(g) => {
                    write_potentials(&scratch.0, g)?;
                    Some(scratch.0.as_path())
                }
                None => None,
            };
            let spec = PassSpec::sinkhorn_round(job, &method, potentials)
                .sharded(targets as u64, cluster.shards);
            // A shard's rows: one per target of the shard, one per source.
            let expected = spec
                .shards
                .windows(2)
                .map(|w| w[1] - w[0] + sources as u64)
                .collect();
            let mut merge = RoundMerge::new(targets, sources);
            send(
                spec,
                expected,
                &job.options,
                cluster,
                pinned,
                &mut |batch| merge.push(batch),
            )?;
            merge.finish()
        },
    )?;
    drop(scratch);
    let report = SinkhornReport::new(method, &outcome);
    let mut f = outcome.target_potential;
    f.truncate(gallery_rows);
    Ok((f, report))
}

/// `.NAME.WHAT.parquet` beside `path` (a local path or URL).
fn sibling(path: &Path, what: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{what}.parquet"))
}

/// A scratch file the executors read, removed when dropped (on success
/// and on failure alike).
struct ScratchFile(PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        // Nothing to report: a leftover scratch file is only clutter.
        crate::cancel::finishing(|| {
            if crate::storage::exists(&self.0).unwrap_or(false) {
                let _ = crate::storage::remove_file(&self.0);
            }
        });
    }
}

/// Pass 2 of `job` (methods checked, `plan` loaded) into an uncommitted
/// results file at `job.out` with `metadata`, and each method's figures:
/// those of a local pass. The shards' rows go down to the depth of the
/// hubness measures and carry the report columns, from which the
/// figures are rebuilt here.
#[allow(clippy::too_many_arguments)]
pub(super) fn results(
    job: &SearchJob,
    queries: &EmbeddingTable,
    gallery: &EmbeddingTable,
    plan: &ScoringPlan,
    metadata: Vec<(String, String)>,
    protocol_bank: Option<ProtocolBank>,
    cluster: &ClusterJob,
    pinned: &ClusterInputs,
) -> Result<(AtomicFile, Vec<MethodOutcome>, Option<ScreenSummary>)> {
    // Each executor applies the precision on its own CPU; the methods are
    // checked here, before anything is sent.
    let methods = plan.method_specs();
    job.options.precision.check_methods(&methods)?;
    let mut sink = results_sink(
        queries,
        gallery,
        plan,
        job.k,
        &job.out,
        job.overwrite,
        &job.options,
        job.options
            .precision
            .recorded_on_cluster(crate::options::all_screenable(&methods)),
        metadata,
    )?;
    let mut figures = OutcomesFromRows::new(
        plan,
        job.k,
        gallery.rows as usize,
        job.options.report.hubness_k,
        queries.has_targets,
    );
    let depth = figures.depth();
    let spec = PassSpec::search(job, queries.id_kind, gallery.id_kind)
        .with_report_depth(depth)
        .with_protocol_bank(protocol_bank)
        .sharded(queries.rows, cluster.shards);
    // A shard's rows: every list of its queries, down to `depth`.
    let per_query = (plan.methods.len() * depth.min(gallery.rows as usize)) as u64;
    let expected = spec
        .shards
        .windows(2)
        .map(|w| (w[1] - w[0]) * per_query)
        .collect();
    let screen = send(
        spec,
        expected,
        &job.options,
        cluster,
        pinned,
        &mut |batch| sink.write(&figures.take(batch)?),
    )?;
    Ok((
        sink.close_uncommitted()?,
        figures.finish(),
        (screen.screened > 0).then(|| ScreenSummary::of(screen)),
    ))
}

/// Runs the sharded `spec` on `cluster`, its tables as `pinned` took
/// them: one task per shard, one thread per task (a slot of an executor
/// each), its rows into `emit` in shard order; what the executors'
/// screens did.
fn send(
    spec: PassSpec,
    expected: Vec<u64>,
    options: &PassOptions,
    cluster: &ClusterJob,
    pinned: &ClusterInputs,
    emit: &mut dyn FnMut(&RecordBatch) -> Result<()>,
) -> Result<ScreenCounts> {
    // The paths as the user gave them, and as the executors read them.
    let given: Vec<String> = spec
        .inputs
        .tables()
        .iter()
        .map(|(_, t)| t.to_string())
        .collect();
    let absolute: Vec<String> = given
        .iter()
        .map(|t| crate::sql::Placement::Cluster.path(t.clone()))
        .collect::<Result<_>>()?;
    let mut spec = spec.for_cluster(pinned)?;
    spec.shard_column = true;
    spec.threads = 1;
    crate::cluster::passes::pass_rows(
        &cluster.scheduler.parse()?,
        spec,
        expected,
        &crate::sql::SqlOptions {
            memory: options.memory,
            threads: options.threads,
            read: options.read.clone(),
        },
        emit,
    )
    .map_err(|err| match err {
        // A task's error names the files as the executor read them: named
        // as the user gave them, as a local run names them.
        HubnormError::Carried { message, exit_code } => HubnormError::Carried {
            message: absolute
                .iter()
                .zip(&given)
                .filter(|(a, g)| a != g)
                .fold(message, |m, (a, g)| m.replace(a.as_str(), g)),
            exit_code,
        },
        err => err,
    })
}
