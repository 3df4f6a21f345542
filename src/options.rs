//! Options structs and small newtypes for units that are easy to confuse.

use std::fmt;
use std::str::FromStr;

use crate::error::{HubnormError, Result};

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

/// Inverse temperature that multiplies similarities: exp(β·s). β = 1/τ.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Beta(pub f64);

impl Beta {
    /// β = 20, the QB-Norm default for inverted softmax.
    pub const DEFAULT: Beta = Beta(20.0);
}

/// The retrieval methods hubnorm can score with (METHODS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MethodKind {
    /// Raw inner product: the baseline.
    None,
    /// Inverted softmax over the query bank (Smith et al. 2017, as used by QB-Norm).
    InvertedSoftmax,
    /// Dynamic inverted softmax: IS only for queries whose raw top-1 is in the
    /// activation set (QB-Norm, Bogolin et al. 2022).
    DynamicInvertedSoftmax,
    /// Nearest-neighbour normalisation (Chowdhury et al. 2024).
    NearestNeighbour,
    /// Cross-domain similarity local scaling (Conneau et al. 2018).
    Csls,
    /// Globally corrected retrieval: rank among the bank (Dinu et al. 2015).
    GloballyCorrected,
    /// Distribution normalisation: subtract λ × the bank means (Zhou et al. 2023).
    DistributionNormalisation,
    /// DBNorm's dual inverted softmax over query bank and gallery bank (Wang et al. 2023).
    DualInvertedSoftmax,
    /// Dual inverted softmax with DIS gating per factor (Wang et al. 2023).
    DualDynamicInvertedSoftmax,
    /// Sinkhorn normalisation over the query bank (Pan et al. 2025).
    Sinkhorn,
    /// Dual-bank Sinkhorn: targets are the gallery and the gallery bank (Pan et al. 2025).
    DualBankSinkhorn,
    /// Dual softmax: s times the column softmax over the bank and the query (Cheng et al. 2021).
    DualSoftmax,
    /// Single-query Sinkhorn protocol: each query normalised with a pseudo-test set (Yakovlev et al. 2023).
    SinkhornPp,
}

impl MethodKind {
    /// Every method, for help texts and `compare`.
    pub const ALL: [MethodKind; 13] = [
        MethodKind::None,
        MethodKind::InvertedSoftmax,
        MethodKind::DynamicInvertedSoftmax,
        MethodKind::NearestNeighbour,
        MethodKind::Csls,
        MethodKind::GloballyCorrected,
        MethodKind::DistributionNormalisation,
        MethodKind::DualInvertedSoftmax,
        MethodKind::DualDynamicInvertedSoftmax,
        MethodKind::Sinkhorn,
        MethodKind::DualBankSinkhorn,
        MethodKind::DualSoftmax,
        MethodKind::SinkhornPp,
    ];

    /// The name used on the command line and in output files.
    pub fn name(self) -> &'static str {
        match self {
            MethodKind::None => "none",
            MethodKind::InvertedSoftmax => "is",
            MethodKind::DynamicInvertedSoftmax => "dis",
            MethodKind::NearestNeighbour => "nnn",
            MethodKind::Csls => "csls",
            MethodKind::GloballyCorrected => "gc",
            MethodKind::DistributionNormalisation => "dn",
            MethodKind::DualInvertedSoftmax => "dual-is",
            MethodKind::DualDynamicInvertedSoftmax => "dual-dis",
            MethodKind::Sinkhorn => "sn",
            MethodKind::DualBankSinkhorn => "dbsn",
            MethodKind::DualSoftmax => "dsl",
            MethodKind::SinkhornPp => "sinkhorn-pp",
        }
    }

    /// Whether the method can use the test queries as its bank (`--transductive`).
    pub fn has_transductive_variant(self) -> bool {
        matches!(
            self,
            MethodKind::None
                | MethodKind::InvertedSoftmax
                | MethodKind::Sinkhorn
                | MethodKind::DualSoftmax
                | MethodKind::SinkhornPp
        )
    }

    /// Whether pass 1 (bank statistics) is needed.
    pub fn needs_bank(self) -> bool {
        !matches!(self, MethodKind::None)
    }

    /// Whether the method cannot run without `--gallery-bank`.
    pub fn needs_gallery_bank(self) -> bool {
        matches!(
            self,
            MethodKind::DualInvertedSoftmax
                | MethodKind::DualDynamicInvertedSoftmax
                | MethodKind::DualBankSinkhorn
        )
    }

    /// Whether the method uses `--gallery-bank` when one is given.
    pub fn uses_gallery_bank(self) -> bool {
        self.needs_gallery_bank() || self == MethodKind::DistributionNormalisation
    }
}

impl FromStr for MethodKind {
    type Err = HubnormError;
    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        MethodKind::ALL
            .into_iter()
            .find(|m| m.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<_> = MethodKind::ALL.iter().map(|m| m.name()).collect();
                HubnormError::Usage(format!(
                    "unknown method '{s}' (available: {})",
                    names.join(", ")
                ))
            })
    }
}

impl fmt::Display for MethodKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A method with its hyperparameters: what a `method` value of
/// `results.parquet` and a group of `gallery_stats.parquet` columns stand for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MethodSpec {
    None,
    InvertedSoftmax {
        beta: Beta,
    },
    DynamicInvertedSoftmax {
        beta: Beta,
        /// k_A: a gallery item is activated when it is in the top-k_A of some bank query.
        activation_k: usize,
    },
    NearestNeighbour {
        alpha: f64,
        k: usize,
    },
    Csls {
        k: usize,
    },
    GloballyCorrected,
    DistributionNormalisation {
        lambda: f64,
    },
    DualInvertedSoftmax {
        /// β₁ of the query-bank factor.
        beta1: Beta,
        /// β₂ of the gallery-bank factor.
        beta2: Beta,
    },
    DualDynamicInvertedSoftmax {
        beta1: Beta,
        beta2: Beta,
        activation_k: usize,
    },
    Sinkhorn {
        /// Temperature τ: the plan is exp((s − g − f)/τ).
        tau: f64,
        /// Iterations T.
        iterations: usize,
    },
    DualBankSinkhorn {
        tau: f64,
        iterations: usize,
    },
    DualSoftmax {
        /// Temperature θ of the column softmax, exp(s/θ).
        theta: f64,
    },
    SinkhornPp {
        tau: f64,
        iterations: usize,
        /// m − 1: bank queries stacked with each test query.
        pseudo_queries: usize,
    },
}

impl MethodSpec {
    pub fn kind(&self) -> MethodKind {
        match self {
            MethodSpec::None => MethodKind::None,
            MethodSpec::InvertedSoftmax { .. } => MethodKind::InvertedSoftmax,
            MethodSpec::DynamicInvertedSoftmax { .. } => MethodKind::DynamicInvertedSoftmax,
            MethodSpec::NearestNeighbour { .. } => MethodKind::NearestNeighbour,
            MethodSpec::Csls { .. } => MethodKind::Csls,
            MethodSpec::GloballyCorrected => MethodKind::GloballyCorrected,
            MethodSpec::DistributionNormalisation { .. } => MethodKind::DistributionNormalisation,
            MethodSpec::DualInvertedSoftmax { .. } => MethodKind::DualInvertedSoftmax,
            MethodSpec::DualDynamicInvertedSoftmax { .. } => MethodKind::DualDynamicInvertedSoftmax,
            MethodSpec::Sinkhorn { .. } => MethodKind::Sinkhorn,
            MethodSpec::DualBankSinkhorn { .. } => MethodKind::DualBankSinkhorn,
            MethodSpec::DualSoftmax { .. } => MethodKind::DualSoftmax,
            MethodSpec::SinkhornPp { .. } => MethodKind::SinkhornPp,
        }
    }

    /// The method with its parameters taken from `params`.
    pub fn from_kind(kind: MethodKind, params: &MethodParams) -> Self {
        match kind {
            MethodKind::None => MethodSpec::None,
            MethodKind::InvertedSoftmax => MethodSpec::InvertedSoftmax { beta: params.beta },
            MethodKind::DynamicInvertedSoftmax => MethodSpec::DynamicInvertedSoftmax {
                beta: params.beta,
                activation_k: params.activation_k,
            },
            MethodKind::NearestNeighbour => MethodSpec::NearestNeighbour {
                alpha: params.alpha,
                k: params.nnn_k,
            },
            MethodKind::Csls => MethodSpec::Csls { k: params.csls_k },
            MethodKind::GloballyCorrected => MethodSpec::GloballyCorrected,
            MethodKind::DistributionNormalisation => MethodSpec::DistributionNormalisation {
                lambda: params.lambda,
            },
            MethodKind::DualInvertedSoftmax => MethodSpec::DualInvertedSoftmax {
                beta1: params.beta1,
                beta2: params.beta2,
            },
            MethodKind::DualDynamicInvertedSoftmax => MethodSpec::DualDynamicInvertedSoftmax {
                beta1: params.beta1,
                beta2: params.beta2,
                activation_k: params.activation_k,
            },
            MethodKind::Sinkhorn => MethodSpec::Sinkhorn {
                tau: params.tau,
                iterations: params.iterations,
            },
            MethodKind::DualBankSinkhorn => MethodSpec::DualBankSinkhorn {
                tau: params.tau,
                iterations: params.iterations,
            },
            MethodKind::DualSoftmax => MethodSpec::DualSoftmax {
                theta: params.theta,
            },
            MethodKind::SinkhornPp => MethodSpec::SinkhornPp {
                tau: params.tau,
                iterations: params.iterations,
                pseudo_queries: params.pseudo_queries,
            },
        }
    }

    /// The method with every parameter at its METHODS.md default.
    pub fn default_for(kind: MethodKind) -> Self {
        MethodSpec::from_kind(kind, &MethodParams::default())
    }

    /// Prefix of this method's columns in `gallery_stats.parquet`, naming the
    /// method and its parameters, e.g. `is_beta20` or `nnn_alpha0.75_k128`.
    pub fn column_prefix(&self) -> String {
        let mut prefix = self.kind().name().replace('-', "_");
        for (name, value) in self.parameters() {
            // `beta1_20`, not the ambiguous `beta120`.
            let separator = if name.ends_with(|c: char| c.is_ascii_digit()) {
                "_"
            } else {
                ""
            };
            prefix.push_str(&format!("_{name}{separator}{value}"));
        }
        prefix
    }

    /// Parameters as (name, value) pairs, for metadata, summaries and column names.
    pub fn parameters(&self) -> Vec<(&'static str, f64)> {
        match *self {
            MethodSpec::None | MethodSpec::GloballyCorrected => vec![],
            MethodSpec::InvertedSoftmax { beta } => vec![("beta", beta.0)],
            MethodSpec::DynamicInvertedSoftmax { beta, activation_k } => {
                vec![("beta", beta.0), ("ka", activation_k as f64)]
            }
            MethodSpec::NearestNeighbour { alpha, k } => vec![("alpha", alpha), ("k", k as f64)],
            MethodSpec::Csls { k } => vec![("k", k as f64)],
            MethodSpec::DistributionNormalisation { lambda } => vec![("lambda", lambda)],
            MethodSpec::DualInvertedSoftmax { beta1, beta2 } => {
                vec![("beta1", beta1.0), ("beta2", beta2.0)]
            }
            MethodSpec::DualDynamicInvertedSoftmax {
                beta1,
                beta2,
                activation_k,
            } => vec![
                ("beta1", beta1.0),
                ("beta2", beta2.0),
                ("ka", activation_k as f64),
            ],
            MethodSpec::Sinkhorn { tau, iterations }
            | MethodSpec::DualBankSinkhorn { tau, iterations } => {
                vec![("tau", tau), ("t", iterations as f64)]
            }
            MethodSpec::DualSoftmax { theta } => vec![("theta", theta)],
            MethodSpec::SinkhornPp {
                tau,
                iterations,
                pseudo_queries,
            } => vec![
                ("tau", tau),
                ("t", iterations as f64),
                ("m", pseudo_queries as f64 + 1.0),
            ],
        }
    }

    /// The method of kind `kind` with the named parameters (as in
    /// [`MethodSpec::parameters`]) and defaults for the others; used to read
    /// the methods recorded in a stats file.
    pub fn with_parameters(kind: MethodKind, parameters: &[(String, f64)]) -> Result<Self> {
        let mut p = MethodParams::default();
        for (name, value) in parameters {
            let count = || *value as usize;
            match (kind, name.as_str()) {
                (_, "beta") => p.beta = Beta(*value),
                (_, "ka") => p.activation_k = count(),
                (_, "alpha") => p.alpha = *value,
                (MethodKind::NearestNeighbour, "k") => p.nnn_k = count(),
                (MethodKind::Csls, "k") => p.csls_k = count(),
                (_, "lambda") => p.lambda = *value,
                (_, "beta1") => p.beta1 = Beta(*value),
                (_, "beta2") => p.beta2 = Beta(*value),
                (_, "tau") => p.tau = *value,
                (_, "t") => p.iterations = count(),
                (_, "theta") => p.theta = *value,
                (_, "m") => p.pseudo_queries = count().saturating_sub(1),
                _ => {
                    return Err(HubnormError::Usage(format!(
                        "method {kind} has no parameter '{name}'"
                    )))
                }
            }
        }
        Ok(MethodSpec::from_kind(kind, &p))
    }

    /// Checks the hyperparameters' ranges (the bank-size checks come later,
    /// once the tables are open).
    pub fn validate(&self) -> Result<()> {
        let positive = |flag: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(HubnormError::Usage(format!(
                    "{flag} must be a positive number, got {v} (method {})",
                    self.kind()
                )))
            }
        };
        let at_least_one = |flag: &str, v: usize| {
            if v >= 1 {
                Ok(())
            } else {
                Err(HubnormError::Usage(format!(
                    "{flag} must be at least 1 (method {})",
                    self.kind()
                )))
            }
        };
        match *self {
            MethodSpec::None | MethodSpec::GloballyCorrected => Ok(()),
            MethodSpec::InvertedSoftmax { beta } => positive("--beta", beta.0),
            MethodSpec::DynamicInvertedSoftmax { beta, activation_k } => {
                positive("--beta", beta.0)?;
                at_least_one("--activation-k", activation_k)
            }
            MethodSpec::NearestNeighbour { alpha, k } => {
                if !(alpha >= 0.0 && alpha.is_finite()) {
                    return Err(HubnormError::Usage(format!(
                        "--alpha must be a non-negative number, got {alpha} (method nnn)"
                    )));
                }
                at_least_one("--nnn-k", k)
            }
            MethodSpec::Csls { k } => at_least_one("--csls-k", k),
            MethodSpec::DistributionNormalisation { lambda } => {
                if lambda.is_finite() {
                    Ok(())
                } else {
                    Err(HubnormError::Usage(format!(
                        "--lambda must be a finite number, got {lambda} (method dn)"
                    )))
                }
            }
            MethodSpec::DualInvertedSoftmax { beta1, beta2 } => {
                positive("--beta1", beta1.0)?;
                positive("--beta2", beta2.0)
            }
            MethodSpec::DualDynamicInvertedSoftmax {
                beta1,
                beta2,
                activation_k,
            } => {
                positive("--beta1", beta1.0)?;
                positive("--beta2", beta2.0)?;
                at_least_one("--activation-k", activation_k)
            }
            MethodSpec::Sinkhorn { tau, iterations }
            | MethodSpec::DualBankSinkhorn { tau, iterations } => {
                positive("--tau", tau)?;
                at_least_one("--iterations", iterations)
            }
            MethodSpec::DualSoftmax { theta } => positive("--theta", theta),
            MethodSpec::SinkhornPp {
                tau,
                iterations,
                pseudo_queries,
            } => {
                positive("--tau", tau)?;
                at_least_one("--iterations", iterations)?;
                at_least_one("--pseudo-queries", pseudo_queries)
            }
        }
    }
}

/// Hyperparameters shared by the methods (each method reads the ones it
/// uses); defaults as in METHODS.md.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MethodParams {
    /// β of `is` and `dis` (exp(β·s)); default 20.
    pub beta: Beta,
    /// k_A, the top-k of each bank item that forms the activation set of
    /// `dis` and `dual-dis`; default 1.
    pub activation_k: usize,
    /// α of `nnn`; default 0.75.
    pub alpha: f64,
    /// k of `nnn` (bank neighbours averaged); default 128.
    pub nnn_k: usize,
    /// k of `csls`; default 10.
    pub csls_k: usize,
    /// λ of `dn`; default 0.5.
    pub lambda: f64,
    /// β₁ of `dual-is`/`dual-dis` (query-bank factor); default 20.
    pub beta1: Beta,
    /// β₂ of `dual-is`/`dual-dis` (gallery-bank factor); default 1.
    pub beta2: Beta,
    /// τ of `sn`/`dbsn` (divides: exp(s/τ)); default 0.01.
    pub tau: f64,
    /// Iterations T of `sn`/`dbsn`; default 10.
    pub iterations: usize,
    /// θ of `dsl` (divides: exp(s/θ)); default 0.01.
    pub theta: f64,
    /// m − 1 of `sinkhorn-pp`: bank queries stacked with each test query; default 127.
    pub pseudo_queries: usize,
}

impl Default for MethodParams {
    fn default() -> Self {
        MethodParams {
            beta: Beta::DEFAULT,
            activation_k: 1,
            alpha: 0.75,
            nnn_k: 128,
            csls_k: 10,
            lambda: 0.5,
            beta1: Beta(20.0),
            beta2: Beta(1.0),
            tau: 0.01,
            iterations: 10,
            theta: 0.01,
            pseudo_queries: 127,
        }
    }
}

/// A seeded uniform subsample of each bank (`--bank-sample N`); the seed
/// also draws `sinkhorn-pp`'s pseudo-test set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BankSample {
    /// Rows kept (all rows when the bank is smaller; `u64::MAX`: no sample,
    /// only a seed).
    pub rows: u64,
    pub seed: u64,
}

/// How embedding tables are read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadOptions {
    /// Name of the id column (Utf8, LargeUtf8 or Int64).
    pub id_column: String,
    /// Name of the embedding column (FixedSizeList or List of Float16/32/64).
    pub embedding_column: String,
    /// Name of the optional ground-truth column on the query table.
    pub target_column: String,
    /// L2-normalise every row on read (cosine similarity). When false, raw dot products are used.
    pub normalize: bool,
    /// Rows per Parquet record batch.
    pub batch_rows: usize,
    /// A query none of whose targets is in the gallery is skipped (and
    /// counted) instead of refused (`--skip-missing`).
    pub skip_missing_targets: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            id_column: "id".to_owned(),
            embedding_column: "embedding".to_owned(),
            target_column: "target_id".to_owned(),
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

    #[test]
    fn parses_method_names() {
        assert_eq!(
            "is".parse::<MethodKind>().unwrap(),
            MethodKind::InvertedSoftmax
        );
        assert_eq!("none".parse::<MethodKind>().unwrap(), MethodKind::None);
        let err = "bogus".parse::<MethodKind>().unwrap_err().to_string();
        assert!(err.contains("available: none, is, dis"), "{err}");
        assert_eq!(
            "dual_is".parse::<MethodKind>().unwrap(),
            MethodKind::DualInvertedSoftmax
        );
    }
}

#[cfg(test)]
mod column_tests {
    use super::*;

    #[test]
    fn column_prefixes_name_method_and_parameters() {
        let p = MethodParams::default();
        let prefix = |k| MethodSpec::from_kind(k, &p).column_prefix();
        assert_eq!(prefix(MethodKind::InvertedSoftmax), "is_beta20");
        assert_eq!(prefix(MethodKind::DynamicInvertedSoftmax), "dis_beta20_ka1");
        assert_eq!(prefix(MethodKind::NearestNeighbour), "nnn_alpha0.75_k128");
        assert_eq!(
            prefix(MethodKind::DualInvertedSoftmax),
            "dual_is_beta1_20_beta2_1"
        );
        assert_eq!(prefix(MethodKind::GloballyCorrected), "gc");
    }
}
