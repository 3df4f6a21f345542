//! Options structs and small newtypes for units that are easy to confuse.

use std::fmt;
use std::str::FromStr;

use crate::error::{HubnormError, Result};

pub use crate::method::{MethodKind, MethodParams, MethodSpec};

/// A memory limit in bytes, parsed from strings such as `256MiB`, `2GiB`, `500MB` or `1048576`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MemoryBudget(pub usize);

impl MemoryBudget {
    /// Default limit when the user gives none: 2 GiB, comfortable on a laptop
    /// and large enough that blocks are big and the GEMM runs near peak.
    pub const DEFAULT: MemoryBudget = MemoryBudget(2 << 30);

    pub fn bytes(self) -> usize {
        self.0
    }
}

impl Default for MemoryBudget {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl FromStr for MemoryBudget {
    type Err = HubnormError;

    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let value: f64 = number
            .parse()
            .map_err(|_| HubnormError::Usage(format!("cannot parse memory size '{s}'")))?;
        let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" => 1e3,
            "kib" => 1024.0,
            "m" | "mb" => 1e6,
            "mib" => 1024.0 * 1024.0,
            "g" | "gb" => 1e9,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            "t" | "tb" => 1e12,
            "tib" => 1024f64.powi(4),
            other => {
                return Err(HubnormError::Usage(format!(
                    "unknown unit '{other}' in memory size '{s}' (use B, KiB, MiB, GiB, KB, MB, GB)"
                )))
            }
        };
        Ok(MemoryBudget((value * scale) as usize))
    }
}

impl fmt::Display for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", human_bytes(self.0 as u64))
    }
}

/// `1536` -> `"1.5 KiB"`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A seeded uniform subsample of each bank (`--bank-sample N`); the seed
/// also draws `sinkhorn-pp`'s pseudo-test set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BankSample {
    /// Rows kept (all rows when the bank is smaller; `u64::MAX`: no sample,
    /// only a seed).
    pub rows: u64,
    pub seed: u64,
}

/// Where a pass runs when not in this process (`--cluster`, `--shards`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterJob {
    /// The scheduler, `df://HOST:PORT`.
    pub scheduler: String,
    /// Shards the pass is cut into: tasks, each computed on its own by one
    /// executor slot. More shards than slots balance the load; each shard
    /// reads the banks once.
    pub shards: usize,
}

/// How embedding tables are read.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadOptions {
    /// Name of the id column (strings, or integers that fit Int64; plain or dictionary-encoded).
    pub id_column: String,
    /// Name of the embedding column (FixedSizeList or List of Float16/32/64).
    pub embedding_column: String,
    /// Name of the optional ground-truth column on the query table.
    pub target_column: String,
    /// Whether the user named `target_column` (`--target-column`): query
    /// tables without it are then refused, not read as carrying no ground
    /// truth (a typo would otherwise give an evaluation without figures).
    #[serde(default)]
    pub target_column_named: bool,
    /// L2-normalise every row on read (cosine similarity). When false, raw dot products are used.
    pub normalize: bool,
    /// Rows per Parquet record batch.
    pub batch_rows: usize,
    /// A query none of whose targets is in the gallery is skipped (and
    /// counted) instead of refused (`--skip-missing`).
    pub skip_missing_targets: bool,
}

impl ReadOptions {
    /// The defaults with the tables' column names: `target` when the user
    /// named a ground-truth column (then it must be there), the default
    /// read when present otherwise.
    pub fn with_columns(id: &str, embedding: &str, target: Option<&str>) -> Self {
        let defaults = ReadOptions::default();
        ReadOptions {
            id_column: id.to_owned(),
            embedding_column: embedding.to_owned(),
            target_column: target.map_or(defaults.target_column.clone(), str::to_owned),
            target_column_named: target.is_some(),
            ..defaults
        }
    }
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            id_column: "id".to_owned(),
            embedding_column: "embedding".to_owned(),
            target_column: "target_id".to_owned(),
            target_column_named: false,
            normalize: true,
            batch_rows: 4096,
            skip_missing_targets: false,
        }
    }
}

/// Options shared by the passes.
#[derive(Debug, Clone, PartialEq)]
pub struct PassOptions {
    pub read: ReadOptions,
    /// Peak memory the passes may use.
    pub memory: MemoryBudget,
    /// Worker threads (0 = one per core).
    pub threads: usize,
    /// `sn`/`dbsn`: stop iterating once the row marginals are within this
    /// relative error of uniform (`--tol`).
    pub sinkhorn_tolerance: Option<f64>,
    /// How the summaries measure hubness and quality.
    pub report: ReportOptions,
    /// How the passes compute the similarities they rank by.
    pub precision: Precision,
}

/// How the passes compute the similarities they rank by (`--precision`):
/// pass 2's search, and pass 1's statistics made of top-k lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 tiles throughout.
    #[default]
    Exact,
    /// A bf16 screen, re-scoring in f32 every item it cannot rule out of a
    /// top-k (docs/precision.md): the lists, scores and counts of `Exact`.
    /// Needs AVX512_BF16, or the scalar model of its arithmetic that
    /// `kernel::bf16::allow_scalar_screen` (`HUBNORM_SCALAR_SCREEN=1`) turns
    /// on for testing.
    Screened,
    /// `Screened` where the CPU and the methods allow it, else `Exact`.
    Auto,
}

impl Precision {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Screened => "screened",
            Precision::Auto => "auto",
        }
    }

    /// Whether pass 2 of `methods` screens; `Screened` where it cannot is
    /// refused, naming what is missing.
    pub fn screens(self, methods: &[MethodSpec]) -> Result<bool> {
        self.check_available()?;
        self.check_methods(methods)?;
        Ok(self != Precision::Exact && all_screenable(methods) && screen_runs_here())
    }

    /// Refuses `Screened` for `methods` when one of them scores other than
    /// s − h(g) ([`crate::method::Method::screened_search`]), naming them,
    /// whatever the CPU: a run checks before any pass, which would
    /// otherwise find out after its pass 1.
    pub fn check_methods(self, methods: &[MethodSpec]) -> Result<()> {
        if self != Precision::Screened || all_screenable(methods) {
            return Ok(());
        }
        let unscreenable: Vec<&str> = methods
            .iter()
            .map(|m| m.method())
            .filter(|m| !m.screened_search())
            .map(|m| m.name())
            .collect();
        Err(HubnormError::Usage(format!(
            "--precision screened: {} score other than s − h(g), which the screen cannot bound; use --precision auto (they run exact) or exact",
            unscreenable.join(", ")
        )))
    }

    /// Refuses `Screened` where the screen cannot run (no AVX512_BF16, or
    /// a system BLAS whose tiles' bits the re-scoring cannot reproduce).
    pub fn check_available(self) -> Result<()> {
        if self == Precision::Screened && !screen_runs_here() {
            return Err(HubnormError::Usage(
                "--precision screened needs AVX512_BF16 and the built-in GEMM (no HUBNORM_BLAS); this machine has not both: use --precision auto or exact".into(),
            ));
        }
        Ok(())
    }

    /// What an output records as its precision (`hubnorm.precision`) when
    /// its pass ran here and `screened` or not.
    pub fn recorded(screened: bool) -> &'static str {
        if screened {
            "screened"
        } else {
            "exact"
        }
    }

    /// What an output records as its precision when its pass ran on a
    /// cluster, for methods the screen can serve (`screenable`) or not.
    /// Each executor applies the precision on its own CPU: `screened`
    /// everywhere (an executor without the screen refuses its task), or
    /// under `auto` wherever it can, so `auto` is recorded as such. The
    /// results are the exact ones either way.
    pub fn recorded_on_cluster(self, screenable: bool) -> &'static str {
        match self {
            Precision::Exact => "exact",
            _ if !screenable => "exact",
            Precision::Screened => "screened",
            Precision::Auto => "auto",
        }
    }

    /// Whether pass 1 takes the statistics that are column top-k lists
    /// (`nnn`, `csls`, `ls`, `nicdm`, `dissim-local`) from the screen:
    /// under `screened` and `auto` wherever the CPU allows, whatever pass 2
    /// does, since the lists are the exact pass's either way.
    pub fn screens_bank_pass(self) -> bool {
        self != Precision::Exact && screen_runs_here()
    }
}

/// Whether the screen can serve every one of `methods`
/// ([`crate::method::Method::screened_search`]).
pub fn all_screenable(methods: &[MethodSpec]) -> bool {
    methods.iter().all(|m| m.method().screened_search())
}

/// Whether the screen can run in this process: AVX512_BF16 (or the scalar
/// screen allowed for testing, [`crate::kernel::bf16::allow_scalar_screen`])
/// and the built-in GEMM, whose tiles' bits the re-scoring reproduces.
fn screen_runs_here() -> bool {
    crate::kernel::bf16::screen_available() && crate::kernel::gemm::blas().is_none()
}

impl FromStr for Precision {
    type Err = HubnormError;
    fn from_str(s: &str) -> std::result::Result<Self, HubnormError> {
        match s {
            "exact" => Ok(Precision::Exact),
            "screened" => Ok(Precision::Screened),
            "auto" => Ok(Precision::Auto),
            other => Err(HubnormError::Usage(format!(
                "--precision is exact, screened or auto, not '{other}'"
            ))),
        }
    }
}

/// How runs summarise their top-k lists and ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportOptions {
    /// The k of the k-occurrence measures (default 10, as the papers report).
    pub hubness_k: usize,
    /// Hubs listed per method.
    pub top_hubs: usize,
    /// R@K cut-offs and bootstrap intervals.
    pub quality: crate::report::QualityOptions,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            hubness_k: 10,
            top_hubs: 20,
            quality: crate::report::QualityOptions::default(),
        }
    }
}

impl Default for PassOptions {
    fn default() -> Self {
        PassOptions {
            read: ReadOptions::default(),
            memory: MemoryBudget::DEFAULT,
            threads: 0,
            sinkhorn_tolerance: None,
            report: ReportOptions::default(),
            precision: Precision::Exact,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_memory_sizes() {
        assert_eq!("256MiB".parse::<MemoryBudget>().unwrap().0, 256 << 20);
        assert_eq!("2GiB".parse::<MemoryBudget>().unwrap().0, 2 << 30);
        assert_eq!("1.5 KiB".parse::<MemoryBudget>().unwrap().0, 1536);
        assert_eq!("500MB".parse::<MemoryBudget>().unwrap().0, 500_000_000);
        assert_eq!("4096".parse::<MemoryBudget>().unwrap().0, 4096);
        assert!("12 parsecs".parse::<MemoryBudget>().is_err());
        assert!("MiB".parse::<MemoryBudget>().is_err());
    }
}
