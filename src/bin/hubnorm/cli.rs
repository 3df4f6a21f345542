//! Command-line arguments (clap derive; the doc comments are the help text)
//! and their conversion into library options.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use hubnorm::options::{
    BankSample, Beta, MemoryBudget, MethodKind, MethodParams, MethodSpec, PassOptions, ReadOptions,
};

/// Hubness reduction for embedding retrieval: querybank normalisation as a
/// streaming job over Parquet.
///
/// Exit codes: 0 success, 1 internal or I/O failure, 2 bad input or usage.
#[derive(Debug, Parser)]
#[command(name = "hubnorm", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Both passes: bank statistics, then corrected top-k search, plus a summary.
    Run(RunArgs),
    /// Pass 1: per-gallery statistics from the query bank (gallery_stats.parquet).
    Stats(StatsArgs),
    /// Pass 2: corrected top-k search with statistics from `hubnorm stats`.
    Search(SearchArgs),
    /// Measure kernel and pass throughput on generated data.
    Bench(crate::bench::BenchArgs),
}

/// Column names, normalisation, memory and threads.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Name of the id column (Utf8, LargeUtf8 or Int64).
    #[arg(long, default_value = "id")]
    pub id_column: String,
    /// Name of the embedding column (FixedSizeList or List of Float16/32/64).
    #[arg(long, default_value = "embedding")]
    pub embedding_column: String,
    /// Name of the ground-truth column of the queries (a gallery id or a list of them).
    #[arg(long, default_value = "target_id")]
    pub target_column: String,
    /// Keep raw dot products instead of L2-normalising every row (cosine).
    #[arg(long)]
    pub no_normalize: bool,
    /// Peak memory to stay within, e.g. 256MiB or 2GiB. Block sizes follow from it.
    #[arg(long, default_value = "2GiB", value_parser = parse_memory)]
    pub memory_limit: MemoryBudget,
    /// Worker threads (0 = one per core). Results do not depend on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Which methods, and their hyperparameters (defaults as in METHODS.md).
#[derive(Debug, Clone, Args)]
pub struct MethodArgs {
    /// One method: none, is, dis, nnn, csls, gc, dn, dual-is, dual-dis, sn,
    /// dbsn, dsl or sinkhorn-pp (see docs/methods.md).
    #[arg(long, conflicts_with = "methods")]
    pub method: Option<String>,
    /// Several methods, comma separated, computed in one stream over the
    /// bank and one over the gallery (e.g. is,dis,nnn,csls).
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// β of is and dis: inverse temperature, exp(β·s); β = 1/τ. Default 20.
    #[arg(long)]
    pub beta: Option<f64>,
    /// k_A of dis and dual-dis: a gallery item is activated when it is in the
    /// top-k_A of some bank item. Default 1.
    #[arg(long)]
    pub activation_k: Option<usize>,
    /// α of nnn: weight of the bank-neighbour mean subtracted. Default 0.75.
    #[arg(long)]
    pub alpha: Option<f64>,
    /// k of nnn: bank neighbours averaged per gallery item (≤ bank size). Default 128.
    #[arg(long)]
    pub nnn_k: Option<usize>,
    /// k of csls: neighbours averaged on each side. Default 10.
    #[arg(long)]
    pub csls_k: Option<usize>,
    /// λ of dn: fraction of the bank means subtracted. Default 0.5.
    #[arg(long)]
    pub lambda: Option<f64>,
    /// β₁ of dual-is and dual-dis (query-bank factor). Default 20.
    #[arg(long)]
    pub beta1: Option<f64>,
    /// β₂ of dual-is and dual-dis (gallery-bank factor). Default 1.
    #[arg(long)]
    pub beta2: Option<f64>,
    /// τ of sn and dbsn: temperature that divides, exp(s/τ); τ = 1/β. Default 0.01.
    #[arg(long)]
    pub tau: Option<f64>,
    /// Iterations T of sn and dbsn. Default 10.
    #[arg(long)]
    pub iterations: Option<usize>,
    /// θ of dsl: temperature of the column softmax, exp(s/θ). Default 0.01.
    #[arg(long)]
    pub theta: Option<f64>,
    /// m − 1 of sinkhorn-pp: bank queries (a fixed sample, --seed) stacked
    /// with each test query. Default 127.
    #[arg(long)]
    pub pseudo_queries: Option<usize>,
    /// sn, dbsn: stop iterating once every row of the plan sums to 1/|B|
    /// within this relative error (the columns are exact after each iteration).
    #[arg(long)]
    pub tol: Option<f64>,
}

/// The banks of pass 1 besides the query bank.
#[derive(Debug, Clone, Args)]
pub struct BankArgs {
    /// Gallery bank: items of the gallery modality from the training split
    /// (needed by dual-is and dual-dis; used by dn for μ_G when given).
    #[arg(long)]
    pub gallery_bank: Option<String>,
    /// Use a seeded uniform sample of N rows of each bank (e.g. to make gc fit).
    #[arg(long, value_name = "N")]
    pub bank_sample: Option<u64>,
    /// Seed of --bank-sample and of sinkhorn-pp's pseudo-test set.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl BankArgs {
    /// The bank sample asked for; without `--bank-sample`, a sample of
    /// every row that only carries the seed (for sinkhorn-pp).
    pub fn sample(&self) -> Option<BankSample> {
        match (self.bank_sample, self.seed) {
            (Some(rows), seed) => Some(BankSample { rows, seed }),
            (None, 0) => None,
            (None, seed) => Some(BankSample {
                rows: u64::MAX,
                seed,
            }),
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Test queries: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub queries: String,
    /// Gallery to search: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub gallery: String,
    /// Query bank (training-split queries, never the test queries).
    #[arg(long, required_unless_present = "transductive")]
    pub bank: Option<String>,
    /// Use the test queries themselves as the bank (is, sn, dsl, sinkhorn-pp). This PEEKS AT THE
    /// TEST SET: legitimate only for offline re-ranking of a query set known in
    /// advance (e.g. a query log), never for evaluating a deployable system.
    #[arg(long, conflicts_with = "bank")]
    pub transductive: bool,
    #[command(flatten)]
    pub banks: BankArgs,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Results per query.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// Replace outputs that already exist.
    #[arg(long)]
    pub overwrite: bool,
    /// Output directory (results.parquet, gallery_stats.parquet, summary.json).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Gallery: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub gallery: String,
    /// Query bank (training-split queries).
    #[arg(long)]
    pub bank: String,
    #[command(flatten)]
    pub banks: BankArgs,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Replace the output if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// Output file (gallery_stats.parquet).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Test queries: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub queries: String,
    /// Gallery: a Parquet file, a directory of parts, or a glob.
    #[arg(long)]
    pub gallery: String,
    /// gallery_stats.parquet from `hubnorm stats` (not needed for --method none).
    #[arg(long)]
    pub stats: Option<PathBuf>,
    #[command(flatten)]
    pub method: MethodArgs,
    /// Results per query.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// Replace the output if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// Output file (results.parquet).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub common: CommonArgs,
}

fn parse_memory(s: &str) -> Result<MemoryBudget, String> {
    s.parse().map_err(|e: hubnorm::HubnormError| e.to_string())
}

impl CommonArgs {
    pub fn pass_options(&self) -> PassOptions {
        PassOptions {
            read: ReadOptions {
                id_column: self.id_column.clone(),
                embedding_column: self.embedding_column.clone(),
                target_column: self.target_column.clone(),
                normalize: !self.no_normalize,
                ..ReadOptions::default()
            },
            memory: self.memory_limit,
            threads: self.threads,
            ..PassOptions::default()
        }
    }
}

impl MethodArgs {
    /// The method kinds named, in order, without repeats; `default` when none is named.
    pub fn kinds(&self, default: MethodKind) -> hubnorm::Result<Vec<MethodKind>> {
        let names: Vec<&str> = match &self.method {
            Some(m) => vec![m.as_str()],
            None => self.methods.iter().map(String::as_str).collect(),
        };
        let mut kinds = Vec::new();
        for name in names {
            let kind: MethodKind = name.parse()?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if kinds.is_empty() {
            kinds.push(default);
        }
        Ok(kinds)
    }

    /// Hyperparameters given on the command line, defaults elsewhere.
    pub fn params(&self) -> MethodParams {
        let mut p = MethodParams::default();
        if let Some(beta) = self.beta {
            p.beta = Beta(beta);
        }
        if let Some(k) = self.activation_k {
            p.activation_k = k;
        }
        if let Some(alpha) = self.alpha {
            p.alpha = alpha;
        }
        if let Some(k) = self.nnn_k {
            p.nnn_k = k;
        }
        if let Some(k) = self.csls_k {
            p.csls_k = k;
        }
        if let Some(lambda) = self.lambda {
            p.lambda = lambda;
        }
        if let Some(beta) = self.beta1 {
            p.beta1 = Beta(beta);
        }
        if let Some(beta) = self.beta2 {
            p.beta2 = Beta(beta);
        }
        if let Some(tau) = self.tau {
            p.tau = tau;
        }
        if let Some(t) = self.iterations {
            p.iterations = t;
        }
        if let Some(theta) = self.theta {
            p.theta = theta;
        }
        if let Some(m) = self.pseudo_queries {
            p.pseudo_queries = m;
        }
        p
    }

    /// The pass options, with the Sinkhorn tolerance.
    pub fn pass_options(&self, common: &CommonArgs) -> PassOptions {
        PassOptions {
            sinkhorn_tolerance: self.tol,
            ..common.pass_options()
        }
    }

    /// Whether any hyperparameter was given on the command line.
    pub fn any_parameter(&self) -> bool {
        self.params() != MethodParams::default()
            || self.beta.is_some()
            || self.activation_k.is_some()
            || self.alpha.is_some()
            || self.nnn_k.is_some()
            || self.csls_k.is_some()
            || self.lambda.is_some()
            || self.beta1.is_some()
            || self.beta2.is_some()
            || self.tau.is_some()
            || self.iterations.is_some()
            || self.theta.is_some()
            || self.pseudo_queries.is_some()
    }

    /// The methods with their parameters.
    pub fn specs(&self, default: MethodKind) -> hubnorm::Result<Vec<MethodSpec>> {
        let params = self.params();
        Ok(self
            .kinds(default)?
            .into_iter()
            .map(|k| MethodSpec::from_kind(k, &params))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
