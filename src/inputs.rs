//! Opening and checking a job's inputs: the tables, the banks pass 1 reads
//! (sampled when asked), the methods against them, the worker pool, and
//! the metadata that records them in every output.

use crate::error::{HubnormError, Result};
use crate::ids::IdIndex;
use crate::method::InputSizes;
use crate::options::{BankSample, MethodKind, MethodSpec, PassOptions};
use crate::source::{EmbeddingTable, PartRecord};
use crate::stats_file::StatsInputs;

/// Runs `f` on a rayon pool of `threads` workers (0 = one per core).
pub(crate) fn with_threads<T: Send>(
    threads: usize,
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    check_threads(threads)?;
    // The workers report their plans where the caller's thread does, and
    // stop with its job.
    let ledger = crate::plan::current_ledger();
    let stop = crate::cancel::current_job_stop();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |_| {
            crate::plan::set_ledger(ledger.clone());
            crate::cancel::set_job_stop(stop.clone());
        })
        .build()
        .map_err(|e| HubnormError::Internal(format!("cannot start worker threads: {e}")))?;
    pool.install(f)
}

/// The most worker threads a job starts: far more than any machine has
/// cores, and few enough that the stacks and per-thread buffers of a typo
/// (`--threads 100000`) are refused instead of exhausting memory.
pub const MAX_THREADS: usize = 1024;

/// Refuses a thread count above [`MAX_THREADS`] (0 is one per core).
pub fn check_threads(threads: usize) -> Result<()> {
    if threads > MAX_THREADS {
        return Err(HubnormError::Usage(format!(
            "--threads {threads} is more than {MAX_THREADS}; use 0 for one thread per core"
        )));
    }
    Ok(())
}

pub(crate) fn open_table(
    role: &str,
    spec: &str,
    options: &PassOptions,
    targets: bool,
) -> Result<EmbeddingTable> {
    EmbeddingTable::open(role, spec, &options.read, targets)
}

/// Opens a bank, subsampled when asked.
pub(crate) fn open_bank(
    role: &str,
    spec: &str,
    options: &PassOptions,
    sample: Option<BankSample>,
) -> Result<EmbeddingTable> {
    let table = open_table(role, spec, options, false)?;
    match sample {
        Some(s) => table.sampled(s.rows, s.seed),
        None => Ok(table),
    }
}

/// The tables pass 1 reads, opened and checked against the gallery.
pub(crate) struct Banks {
    pub bank: EmbeddingTable,
    pub gallery_bank: Option<EmbeddingTable>,
}

impl Banks {
    /// Pass 1's inputs: these banks against `gallery`.
    pub(crate) fn inputs<'a>(
        &'a self,
        gallery: &'a EmbeddingTable,
        index: &'a IdIndex,
    ) -> StatsInputs<'a> {
        StatsInputs {
            gallery,
            bank: &self.bank,
            gallery_bank: self.gallery_bank.as_ref(),
            index: Some(index),
        }
    }

    /// The metadata of a stats file computed from these banks.
    pub(crate) fn stats_metadata(
        &self,
        gallery: &EmbeddingTable,
        sample: Option<BankSample>,
        options: &PassOptions,
    ) -> Vec<(String, String)> {
        let mut metadata = common_metadata("gallery_stats", options);
        metadata.extend(table_metadata("gallery", gallery));
        metadata.extend(bank_metadata(self, sample));
        metadata
    }
}

pub(crate) fn open_banks(
    bank: &str,
    gallery_bank: Option<&str>,
    sample: Option<BankSample>,
    methods: &[MethodSpec],
    gallery: &EmbeddingTable,
    options: &PassOptions,
) -> Result<Banks> {
    let bank = open_bank("bank", bank, options, sample)?;
    let uses_gallery_bank = methods.iter().any(|m| m.kind().uses_gallery_bank());
    let gallery_bank = match gallery_bank {
        Some(spec) if uses_gallery_bank => Some(open_bank("gallery bank", spec, options, sample)?),
        _ => None,
    };
    for table in std::iter::once(&bank).chain(&gallery_bank) {
        if table.dim != gallery.dim {
            return Err(crate::bank::pass::dimension_error(table, gallery));
        }
    }
    check_bank_sizes(methods, &bank, gallery, options)?;
    Ok(Banks { bank, gallery_bank })
}

/// Methods without repeats, each checked, and the gallery bank present
/// when a method needs it.
pub(crate) fn check_methods(
    methods: &[MethodSpec],
    has_gallery_bank: bool,
) -> Result<Vec<MethodSpec>> {
    let mut unique: Vec<MethodSpec> = Vec::new();
    for m in methods {
        m.validate()?;
        if m.kind().needs_gallery_bank() && !has_gallery_bank {
            return Err(HubnormError::Usage(format!(
                "method {} needs --gallery-bank PATH (items of the gallery modality from the training split, e.g. the bank queries' targets)",
                m.kind()
            )));
        }
        if !unique.contains(m) {
            unique.push(*m);
        }
    }
    Ok(unique)
}

/// Refuses a Sinkhorn tolerance that is not a positive relative error, or
/// that no method would use (it would be ignored without a word).
pub(crate) fn check_tolerance(methods: &[MethodSpec], tolerance: Option<f64>) -> Result<()> {
    let Some(tol) = tolerance else {
        return Ok(());
    };
    if !(tol.is_finite() && tol > 0.0) {
        return Err(HubnormError::Usage(format!(
            "--tol is a relative error and must be a positive number, not {tol}"
        )));
    }
    let iterates = |m: &MethodSpec| m.method().sinkhorn(m).is_some();
    if methods.iter().any(iterates) {
        return Ok(());
    }
    // Each method once (a tune grid has many points of one), the baseline
    // only when it is alone.
    let mut named: Vec<String> = Vec::new();
    for m in methods {
        let name = m.kind().to_string();
        if m.kind() != MethodKind::baseline() && !named.contains(&name) {
            named.push(name);
        }
    }
    if named.is_empty() {
        named.push(MethodKind::baseline().to_string());
    }
    Err(HubnormError::Usage(format!(
        "--tol stops the iterations of {}, none of which is among the methods ({}); add the method or drop it",
        crate::method::names_where(iterates),
        named.join(", ")
    )))
}

/// Checks that need the inputs' sizes, as each method declares them (k
/// within the bank, statistics within the memory limit).
pub(crate) fn check_bank_sizes(
    methods: &[MethodSpec],
    bank: &EmbeddingTable,
    gallery: &EmbeddingTable,
    options: &PassOptions,
) -> Result<()> {
    let sizes = input_sizes(bank, gallery, None, options);
    for m in methods {
        m.method().check_inputs(m, &sizes)?;
    }
    Ok(())
}

pub(crate) fn bank_metadata(banks: &Banks, sample: Option<BankSample>) -> Vec<(String, String)> {
    let mut metadata = table_metadata("bank", &banks.bank);
    if let Some(gallery_bank) = &banks.gallery_bank {
        metadata.extend(table_metadata("gallery bank", gallery_bank));
    }
    if let Some(s) = sample {
        if s.rows != u64::MAX {
            metadata.push(("hubnorm.bank_sample.rows".into(), s.rows.to_string()));
        }
        metadata.push(("hubnorm.bank_sample.seed".into(), s.seed.to_string()));
    }
    metadata
}

pub(crate) fn common_metadata(kind: &str, options: &PassOptions) -> Vec<(String, String)> {
    vec![
        ("hubnorm.version".into(), env!("CARGO_PKG_VERSION").into()),
        ("hubnorm.output".into(), kind.into()),
        // The last bits of every score depend on which GEMM computed it.
        ("hubnorm.gemm".into(), crate::kernel::gemm::backend_name()),
        (
            "hubnorm.normalize".into(),
            options.read.normalize.to_string(),
        ),
    ]
}

pub(crate) fn table_metadata(role: &str, table: &EmbeddingTable) -> Vec<(String, String)> {
    let key = role.replace(' ', "_");
    let mut metadata = vec![
        (format!("hubnorm.{key}.path"), table.spec.clone()),
        (format!("hubnorm.{key}.rows"), table.rows.to_string()),
        (format!("hubnorm.{key}.parts"), PartRecord::list_json(table)),
    ];
    if let Some(version) = table.delta_version {
        metadata.push((format!("hubnorm.{key}.delta_version"), version.to_string()));
    }
    metadata
}

/// The sizes methods check their inputs against ([`crate::method::Method::check_inputs`]).
pub(crate) fn input_sizes(
    bank: &EmbeddingTable,
    gallery: &EmbeddingTable,
    queries: Option<&EmbeddingTable>,
    options: &PassOptions,
) -> InputSizes {
    InputSizes {
        bank_rows: bank.rows,
        gallery_rows: gallery.rows,
        queries_rows: queries.map_or(0, |q| q.rows),
        memory_bytes: options.memory.bytes(),
        normalized: options.read.normalize,
    }
}
