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

/// The retrieval methods hubnorm can score with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MethodKind {
    /// Raw inner product: the baseline.
    None,
    /// Inverted softmax over the query bank (Smith et al. 2017, as used by QB-Norm).
    InvertedSoftmax,
}

impl MethodKind {
    /// The name used on the command line and in output files.
    pub fn name(self) -> &'static str {
        match self {
            MethodKind::None => "none",
            MethodKind::InvertedSoftmax => "is",
        }
    }

    /// Every method, for help texts.
    pub const ALL: [MethodKind; 2] = [MethodKind::None, MethodKind::InvertedSoftmax];

    /// Whether pass 1 (bank statistics) is needed.
    pub fn needs_bank(self) -> bool {
        !matches!(self, MethodKind::None)
    }
}

impl FromStr for MethodKind {
    type Err = HubnormError;
    fn from_str(s: &str) -> Result<Self> {
        MethodKind::ALL
            .into_iter()
            .find(|m| m.name() == s.trim())
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

/// A method with its hyperparameters: what a column of `gallery_stats.parquet`
/// and a `method` value of `results.parquet` stand for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MethodSpec {
    None,
    InvertedSoftmax { beta: Beta },
}

impl MethodSpec {
    pub fn kind(&self) -> MethodKind {
        match self {
            MethodSpec::None => MethodKind::None,
            MethodSpec::InvertedSoftmax { .. } => MethodKind::InvertedSoftmax,
        }
    }

    /// The method with its parameters taken from `params`.
    pub fn from_kind(kind: MethodKind, params: &MethodParams) -> Self {
        match kind {
            MethodKind::None => MethodSpec::None,
            MethodKind::InvertedSoftmax => MethodSpec::InvertedSoftmax { beta: params.beta },
        }
    }

    /// Prefix of this method's columns in `gallery_stats.parquet`, naming the
    /// method and its parameters, e.g. `is_beta20`.
    pub fn column_prefix(&self) -> String {
        match self {
            MethodSpec::None => "none".to_owned(),
            MethodSpec::InvertedSoftmax { beta } => format!("is_beta{}", beta.0),
        }
    }

    /// Parameters as (name, value) pairs, for metadata and summaries.
    pub fn parameters(&self) -> Vec<(&'static str, f64)> {
        match self {
            MethodSpec::None => vec![],
            MethodSpec::InvertedSoftmax { beta } => vec![("beta", beta.0)],
        }
    }
}

/// Hyperparameters shared by the methods (each method reads the ones it uses).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MethodParams {
    /// Inverse temperature of inverted softmax.
    pub beta: Beta,
}

impl Default for MethodParams {
    fn default() -> Self {
        MethodParams {
            beta: Beta::DEFAULT,
        }
    }
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
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            id_column: "id".to_owned(),
            embedding_column: "embedding".to_owned(),
            target_column: "target_id".to_owned(),
            normalize: true,
            batch_rows: 4096,
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
}

impl Default for PassOptions {
    fn default() -> Self {
        PassOptions {
            read: ReadOptions::default(),
            memory: MemoryBudget::DEFAULT,
            threads: 0,
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
        assert!(err.contains("available: none, is"), "{err}");
    }
}
