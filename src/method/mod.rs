//! One home per method: the [`Method`] trait and the registry.
//!
//! Each method (or family sharing a statistic) lives in a module of its own
//! and implements [`Method`], which declares everything the rest of the
//! engine needs to know about it: its parameters (defaults, flags,
//! validation, tuning grid), what pass 1 accumulates for it and the
//! statistics-file columns that state becomes (declared once, with how they
//! are filled and merged), how pass 2 scores with the stored columns, and
//! whether it can be exported. Pass 1's layout, pass 2's plan, `stats
//! --update`, `tune`, `compare`, `export` and the CLI loop over
//! [`REGISTRY`]; adding a method is its module, two lines here (its `mod`
//! and its registry entry), its tests and its docs (CONTRIBUTING.md).
//!
//! The kernel's scoring vocabulary ([`crate::kernel::ColumnScoring`]) stays
//! a closed enum: it is the hot path, and methods compose it.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use arrow::array::ArrayRef;

use crate::error::{HubnormError, Result};

pub mod columns;
pub mod dis;
pub mod dissim_local;
pub mod dn;
pub mod dsl;
pub mod dual;
pub mod gc;
pub mod is;
pub mod local;
pub mod mp;
pub mod nnn;
pub mod none;
pub mod sinkhorn;
pub mod sinkhorn_pp;

pub use crate::bank::BankMoments;
pub use columns::{
    BankAccess, BankNeeds, BankRowMap, ChunkContext, ColumnKind, ColumnValues, LateContext,
    PlanContext, StatColumn, StoredRows,
};

/// Every method, in the order of help texts, `compare` and reports.
pub static REGISTRY: &[&dyn Method] = &[
    &none::None,
    &is::InvertedSoftmax,
    &dis::DynamicInvertedSoftmax,
    &nnn::NearestNeighbour,
    &nnn::Csls,
    &gc::GloballyCorrected,
    &dn::DistributionNormalisation,
    &dual::DualInvertedSoftmax,
    &dual::DualDynamicInvertedSoftmax,
    &sinkhorn::SN,
    &sinkhorn::DBSN,
    &dsl::DualSoftmax,
    &sinkhorn_pp::SinkhornPp,
    &mp::MutualProximity,
    &local::LS,
    &local::NICDM,
    &dissim_local::DissimLocal,
];

/// The most parameters one method has.
pub const MAX_PARAMETERS: usize = 3;

/// The values a parameter may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Domain {
    /// A finite number > 0.
    Positive,
    /// A finite number ≥ 0.
    NonNegative,
    /// Any finite number.
    Finite,
    /// A whole number ≥ the bound (a count: k, iterations).
    Count { min: usize },
}

/// One hyperparameter of a method.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Parameter {
    /// Its name in column prefixes, metadata, configs and `--grid`
    /// (`beta`, `k`, `tau`).
    pub name: &'static str,
    /// The command-line flag without dashes (`beta`, `nnn-k`); methods that
    /// share a flag share its value.
    pub flag: &'static str,
    /// Help text of the flag.
    pub help: &'static str,
    /// The default, as the parameter's value: METHODS.md's where it gives
    /// one (docs/methods.md says where hubnorm chose).
    pub default: f64,
    /// The parameter's value is the flag's value plus this (`sinkhorn-pp`'s
    /// m is `--pseudo-queries` + 1).
    pub flag_offset: f64,
    /// The flag's value in help (`--pseudo-queries <m-1>`): the name unless
    /// the flag is offset.
    pub flag_value: &'static str,
    pub domain: Domain,
    /// The values `tune` tries by default (empty: the parameter stays fixed).
    pub grid: &'static [f64],
}

impl Parameter {
    /// A parameter whose flag is its name, with no grid.
    pub const fn new(name: &'static str, help: &'static str, default: f64, domain: Domain) -> Self {
        Parameter {
            name,
            flag: name,
            help,
            default,
            flag_offset: 0.0,
            flag_value: name,
            domain,
            grid: &[],
        }
    }

    /// The same parameter behind flag `--flag`.
    pub const fn flag(mut self, flag: &'static str) -> Self {
        self.flag = flag;
        self
    }

    /// The same parameter with tuning grid `grid`.
    pub const fn grid(mut self, grid: &'static [f64]) -> Self {
        self.grid = grid;
        self
    }

    /// The same parameter, whose flag gives its value minus `offset`, a
    /// value named `value` in help.
    pub const fn flag_offset(mut self, offset: f64, value: &'static str) -> Self {
        self.flag_offset = offset;
        self.flag_value = value;
        self
    }

    /// Checks `value` against the domain; errors name the flag and method.
    fn check(&self, value: f64, method: &str) -> Result<()> {
        let flag = self.flag;
        let shown = value - self.flag_offset;
        let ok = match self.domain {
            Domain::Positive => value > 0.0 && value.is_finite(),
            Domain::NonNegative => value >= 0.0 && value.is_finite(),
            Domain::Finite => value.is_finite(),
            Domain::Count { min } => {
                value.is_finite() && value >= min as f64 && value.fract() == 0.0
            }
        };
        if ok {
            return Ok(());
        }
        Err(HubnormError::Usage(match self.domain {
            Domain::Positive => {
                format!("--{flag} must be a positive number, got {shown} (method {method})")
            }
            Domain::NonNegative => {
                format!("--{flag} must be a non-negative number, got {shown} (method {method})")
            }
            Domain::Finite => {
                format!("--{flag} must be a finite number, got {shown} (method {method})")
            }
            Domain::Count { .. } if value.fract() != 0.0 => {
                format!("--{flag} must be a whole number, got {shown} (method {method})")
            }
            Domain::Count { min } => format!(
                "--{flag} must be at least {} (method {method})",
                min as f64 - self.flag_offset
            ),
        }))
    }
}

/// How a method uses `--gallery-bank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GalleryBankUse {
    Unused,
    /// Used when given (`dn`: its mean instead of the gallery's).
    Optional,
    /// Refused without one.
    Required,
}

/// Whether `hubnorm export` can serve a method with an inner-product index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Export {
    /// Ranks by s(q, g) − h(g) minus a term of the query alone: exported
    /// as [g, h(g)], with h the method's scoring in the pass-2 plan.
    Additive,
    /// Not exportable, and why.
    Refused(&'static str),
}

/// The Sinkhorn sweeps a method's statistic comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinkhornSetup {
    pub tau: f64,
    pub iterations: usize,
    /// Targets are the gallery and the gallery bank (`dbsn`), not the gallery alone.
    pub with_gallery_bank: bool,
}

/// The single-query protocol a method normalises each test query with
/// (`sinkhorn-pp`), instead of a gallery statistic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SingleQuerySetup {
    /// Bank queries stacked with each test query (m − 1).
    pub pseudo_queries: usize,
    pub tau: f64,
    pub iterations: usize,
}

/// Everything the engine needs to know about one method. Methods are
/// stateless: their parameters travel in a [`MethodSpec`].
pub trait Method: Sync + Send + 'static {
    /// The name on the command line, in `results.parquet` and in configs.
    fn name(&self) -> &'static str;
    /// One line for help texts and docs: what it does, and its source.
    fn summary(&self) -> &'static str;
    /// Its hyperparameters, in the order of column prefixes.
    fn parameters(&self) -> &'static [Parameter] {
        &[]
    }
    /// Whether it needs a query bank (pass 1 or its own stack).
    fn needs_bank(&self) -> bool {
        true
    }
    fn gallery_bank(&self) -> GalleryBankUse {
        GalleryBankUse::Unused
    }
    /// Whether the test queries may serve as its bank (`--transductive`).
    fn transductive(&self) -> bool {
        false
    }
    /// Whether `tune` sweeps it by default (a method with a grid).
    fn tuned_by_default(&self) -> bool {
        self.parameters().iter().any(|p| !p.grid.is_empty())
    }
    /// The protocol it normalises each query with on its own, when it has
    /// no gallery statistic and runs in `hubnorm run` and `compare` only
    /// (then [`Method::has_statistics`] is false too).
    fn single_query(&self, _spec: &MethodSpec) -> Option<SingleQuerySetup> {
        None
    }
    /// Whether it has a gallery statistic (a row of `gallery_stats.parquet`);
    /// `none` and a single-query protocol have none.
    fn has_statistics(&self) -> bool {
        self.needs_bank()
    }
    /// Checks that need the inputs' sizes (k within the bank, memory).
    fn check_inputs(&self, _spec: &MethodSpec, _sizes: &InputSizes) -> Result<()> {
        Ok(())
    }

    // Pass 1.

    /// Adds what pass 1 must accumulate for `spec`.
    fn request(&self, _spec: &MethodSpec, _needs: &mut BankNeeds) {}
    /// Its statistics-file columns after the method's column prefix, in
    /// schema order (the late ones, known after the last chunk, last).
    fn columns(&self, _spec: &MethodSpec) -> Vec<StatColumn> {
        Vec::new()
    }
    /// The early columns of one finished gallery chunk, in schema order.
    fn chunk_columns(&self, _spec: &MethodSpec, _chunk: &ChunkContext<'_>) -> Vec<ArrayRef> {
        Vec::new()
    }
    /// The late columns over the whole gallery, in schema order.
    fn late_columns(&self, _spec: &MethodSpec, _late: &LateContext<'_>) -> Vec<ArrayRef> {
        Vec::new()
    }
    /// Key-value metadata of the stats file that pass 2 reads back (`dn`'s
    /// means, `mp`'s query-side moments), from the bank moments the method
    /// requested.
    fn file_metadata(&self, _spec: &MethodSpec, _moments: &BankMoments) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The Sinkhorn sweeps its statistic needs, if any.
    fn sinkhorn(&self, _spec: &MethodSpec) -> Option<SinkhornSetup> {
        None
    }

    // `stats --update`.

    /// Whether two files' rows of the same gallery items merge into the
    /// state of their union (otherwise `--update` recomputes it).
    fn mergeable(&self) -> bool {
        false
    }
    /// The columns of `spec` from rows `a` merged with rows `b` (of the same
    /// gallery items, over other bank parts), in schema order.
    fn merge(
        &self,
        spec: &MethodSpec,
        _a: &StoredRows<'_>,
        _b: Option<&StoredRows<'_>>,
    ) -> Result<Vec<ArrayRef>> {
        Err(HubnormError::Internal(format!(
            "method {} does not merge",
            spec.kind()
        )))
    }

    // Pass 2.

    /// Whether it reads the raw scoring (gating, a query term, the baseline).
    fn needs_raw(&self, _spec: &MethodSpec) -> bool {
        false
    }
    /// The columns pass 2 reads (suffixes, as in [`Method::columns`]).
    fn search_columns(&self, _spec: &MethodSpec) -> Vec<&'static str> {
        vec!["correction"]
    }
    /// Whether its pass-2 score is s − h(g) (or s itself), whose order the
    /// bf16 screen's bound carries over, so that `--precision screened` can
    /// search it: the one place that decides, held to its rule by
    /// [`crate::query::MethodRule::fits_screen`] when a plan is built.
    fn screened_search(&self) -> bool {
        true
    }
    /// Its rule over the plan's scorings, from the columns named by
    /// [`Method::search_columns`] (in `ctx`, in that order).
    fn rule(
        &self,
        spec: &MethodSpec,
        ctx: &mut PlanContext<'_>,
    ) -> Result<crate::query::MethodRule>;
    /// Whether `hubnorm export` can serve it.
    fn export(&self) -> Export;
}

/// Sizes of the inputs, for [`Method::check_inputs`].
#[derive(Debug, Clone, Copy)]
pub struct InputSizes {
    /// Rows of the query bank (after `--bank-sample`).
    pub bank_rows: u64,
    pub gallery_rows: u64,
    /// Test queries: 0 where a command has none (`stats`, `tune`).
    pub queries_rows: u64,
    /// The job's `--memory-limit`.
    pub memory_bytes: usize,
    /// Whether rows are L2-normalised on read (not `--no-normalize`).
    pub normalized: bool,
}

/// A registered method: a handle that compares by name.
#[derive(Clone, Copy)]
pub struct MethodKind(&'static dyn Method);

impl MethodKind {
    /// Every registered method.
    pub fn all() -> impl Iterator<Item = MethodKind> {
        REGISTRY.iter().map(|m| MethodKind(*m))
    }

    /// The baseline, `none`, which every run reports beside its methods.
    pub fn baseline() -> MethodKind {
        MethodKind(&none::None)
    }

    /// The registered method called `name` (as on the command line).
    pub fn named(name: &str) -> Result<MethodKind> {
        name.parse()
    }

    /// The method's definition.
    pub fn method(self) -> &'static dyn Method {
        self.0
    }

    /// The name used on the command line and in output files.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// Position in the registry (the order of reports).
    pub fn position(self) -> usize {
        REGISTRY
            .iter()
            .position(|m| m.name() == self.name())
            .expect("registered")
    }

    /// Whether the method can use the test queries as its bank.
    pub fn has_transductive_variant(self) -> bool {
        self.0.transductive()
    }

    /// Whether `--transductive` makes the test queries its bank: a bank
    /// method that allows it (the baseline runs too, with no bank).
    pub fn takes_queries_as_bank(self) -> bool {
        self.needs_bank() && self.has_transductive_variant()
    }

    /// Whether a bank is needed.
    pub fn needs_bank(self) -> bool {
        self.0.needs_bank()
    }

    /// Whether the method cannot run without `--gallery-bank`.
    pub fn needs_gallery_bank(self) -> bool {
        self.0.gallery_bank() == GalleryBankUse::Required
    }

    /// Whether the method uses `--gallery-bank` when one is given.
    pub fn uses_gallery_bank(self) -> bool {
        self.0.gallery_bank() != GalleryBankUse::Unused
    }
}

impl Default for MethodKind {
    /// The method a command runs when it names none: `is`.
    fn default() -> Self {
        MethodKind(&is::InvertedSoftmax)
    }
}

impl PartialEq for MethodKind {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}
impl Eq for MethodKind {}
impl Hash for MethodKind {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state)
    }
}
impl PartialOrd for MethodKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for MethodKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.position().cmp(&other.position())
    }
}

impl fmt::Debug for MethodKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MethodKind({})", self.name())
    }
}

impl fmt::Display for MethodKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MethodKind {
    type Err = HubnormError;
    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        MethodKind::all()
            .find(|m| m.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<_> = MethodKind::all().map(MethodKind::name).collect();
                HubnormError::Usage(format!(
                    "unknown method '{s}' (available: {})",
                    names.join(", ")
                ))
            })
    }
}

/// Values given for parameter flags (`--beta 30`), by flag; each method
/// takes the ones its parameters name and defaults for the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MethodParams(BTreeMap<&'static str, f64>);

impl MethodParams {
    /// Sets flag `--flag` (without dashes) to `value`.
    pub fn set(&mut self, flag: &'static str, value: f64) {
        self.0.insert(flag, value);
    }

    /// The value given for `--flag`.
    pub fn get(&self, flag: &str) -> Option<f64> {
        self.0.get(flag).copied()
    }

    /// Whether no flag was given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Refuses a flag given here that none of `kinds` has: it would be
    /// ignored without a word (`--method is --nnn-k 5`).
    pub fn refuse_unused(&self, kinds: &[MethodKind]) -> Result<()> {
        let has = |m: &dyn Method, flag: &str| m.parameters().iter().any(|q| q.flag == flag);
        for p in MethodParams::flags() {
            if self.get(p.flag).is_none() || kinds.iter().any(|k| has(k.method(), p.flag)) {
                continue;
            }
            let users: Vec<&str> = REGISTRY
                .iter()
                .filter(|m| has(**m, p.flag))
                .map(|m| m.name())
                .collect();
            let named: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
            return Err(HubnormError::Usage(format!(
                "--{} is a parameter of {}, none of which is among the methods ({}); add the method or drop the flag",
                p.flag,
                users.join(", "),
                named.join(", ")
            )));
        }
        Ok(())
    }

    /// Every parameter flag of the registry once, with the first parameter
    /// that declares it (for the CLI). Methods sharing a flag share its
    /// default, help and domain.
    pub fn flags() -> Vec<Parameter> {
        let mut flags: Vec<Parameter> = Vec::new();
        for m in REGISTRY {
            for p in m.parameters() {
                if !flags.iter().any(|f| f.flag == p.flag) {
                    flags.push(*p);
                }
            }
        }
        flags
    }
}

/// The registry's methods that have `property` at their defaults, as
/// "a, b and c": for help texts and messages that name them, so that a
/// new method appears in them without an edit.
pub fn names_where(property: impl Fn(&MethodSpec) -> bool) -> String {
    let names: Vec<&str> = MethodKind::all()
        .map(MethodSpec::default_for)
        .filter(|m| property(m))
        .map(|m| m.kind().name())
        .collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// A method with its hyperparameters: what a `method` value of
/// `results.parquet` and a group of `gallery_stats.parquet` columns stand for.
#[derive(Clone, Copy)]
pub struct MethodSpec {
    kind: MethodKind,
    values: [f64; MAX_PARAMETERS],
}

impl PartialEq for MethodSpec {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.values == other.values
    }
}

impl fmt::Debug for MethodSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        for (name, value) in self.parameters() {
            write!(f, " {name}={value}")?;
        }
        Ok(())
    }
}

impl MethodSpec {
    /// `kind` with the parameters given in `params` (by flag) and defaults
    /// for the others.
    pub fn from_kind(kind: MethodKind, params: &MethodParams) -> Self {
        let declared = kind.method().parameters();
        // More would be dropped without a word: raise MAX_PARAMETERS.
        assert!(
            declared.len() <= MAX_PARAMETERS,
            "method {kind} declares {} parameters, more than MAX_PARAMETERS",
            declared.len()
        );
        let mut values = [0.0; MAX_PARAMETERS];
        for (v, p) in values.iter_mut().zip(declared) {
            *v = params.get(p.flag).map_or(p.default, |x| x + p.flag_offset);
        }
        MethodSpec { kind, values }
    }

    /// `kind` with every parameter at its METHODS.md default.
    pub fn default_for(kind: MethodKind) -> Self {
        MethodSpec::from_kind(kind, &MethodParams::default())
    }

    /// The method called `name` with the named parameters (as in
    /// [`MethodSpec::parameters`]) and defaults for the others, validated.
    /// For code that names methods: `MethodSpec::new("nnn", &[("k", 64.0)])`.
    pub fn new(name: &str, parameters: &[(&str, f64)]) -> Result<Self> {
        let owned: Vec<(String, f64)> = parameters
            .iter()
            .map(|(n, v)| ((*n).to_owned(), *v))
            .collect();
        let spec = MethodSpec::with_parameters(name.parse()?, &owned)?;
        spec.validate()?;
        Ok(spec)
    }

    /// The method of kind `kind` with the named parameters and defaults
    /// for the others; used to read the methods recorded in a stats file.
    pub fn with_parameters(kind: MethodKind, parameters: &[(String, f64)]) -> Result<Self> {
        let mut spec = MethodSpec::default_for(kind);
        let declared = kind.method().parameters();
        for (name, value) in parameters {
            let i = declared
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| {
                    HubnormError::Usage(format!("method {kind} has no parameter '{name}'"))
                })?;
            spec.values[i] = *value;
        }
        Ok(spec)
    }

    pub fn kind(&self) -> MethodKind {
        self.kind
    }

    /// The method's definition.
    pub fn method(&self) -> &'static dyn Method {
        self.kind.method()
    }

    /// The value of parameter `name`.
    ///
    /// # Panics
    /// When the method has no such parameter (a bug in its module).
    pub fn get(&self, name: &str) -> f64 {
        let i = self
            .method()
            .parameters()
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("method {} has no parameter {name}", self.kind));
        self.values[i]
    }

    /// The value of count parameter `name` (k, iterations).
    pub fn count(&self, name: &str) -> usize {
        self.get(name) as usize
    }

    /// Whether its pass-1 statistics are top-k lists alone, which the bf16
    /// screen of `--precision screened` serves.
    pub fn screens_bank_pass(&self) -> bool {
        crate::bank::StatsLayout::new(&[*self])
            .bank_request()
            .screenable()
    }

    /// Whether a column of its statistic is known only after the last
    /// gallery chunk (a late column: activation sets, Sinkhorn potentials).
    pub fn has_late_columns(&self) -> bool {
        self.method().columns(self).iter().any(|c| c.late)
    }

    /// Parameters as (name, value) pairs, for metadata, summaries and column names.
    pub fn parameters(&self) -> Vec<(&'static str, f64)> {
        self.method()
            .parameters()
            .iter()
            .zip(self.values)
            .map(|(p, v)| (p.name, v))
            .collect()
    }

    /// Prefix of this method's columns in `gallery_stats.parquet`, naming the
    /// method and its parameters, e.g. `is_beta20` or `nnn_alpha0.75_k128`.
    pub fn column_prefix(&self) -> String {
        let mut prefix = self.kind.name().replace('-', "_");
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

    /// Checks the hyperparameters' ranges (the bank-size checks come later,
    /// once the tables are open).
    pub fn validate(&self) -> Result<()> {
        for (p, v) in self.method().parameters().iter().zip(self.values) {
            p.check(v, self.kind.name())?;
        }
        Ok(())
    }

    /// Column `suffix` of this method in the stats file.
    pub fn column(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.column_prefix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_method_names() {
        assert_eq!("is".parse::<MethodKind>().unwrap().name(), "is");
        assert_eq!("none".parse::<MethodKind>().unwrap().name(), "none");
        let err = "bogus".parse::<MethodKind>().unwrap_err().to_string();
        assert!(err.contains("available: none, is, dis"), "{err}");
        assert_eq!("dual_is".parse::<MethodKind>().unwrap().name(), "dual-is");
    }

    #[test]
    fn column_prefixes_name_method_and_parameters() {
        let prefix = |name: &str| MethodSpec::new(name, &[]).unwrap().column_prefix();
        assert_eq!(prefix("is"), "is_beta20");
        assert_eq!(prefix("dis"), "dis_beta20_ka1");
        assert_eq!(prefix("nnn"), "nnn_alpha0.75_k128");
        assert_eq!(prefix("dual-is"), "dual_is_beta1_20_beta2_1");
        assert_eq!(prefix("gc"), "gc");
    }

    #[test]
    fn names_are_unique_and_parameters_fit() {
        let mut names: Vec<&str> = REGISTRY.iter().map(|m| m.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len());
        for m in REGISTRY {
            assert!(m.parameters().len() <= MAX_PARAMETERS, "{}", m.name());
            MethodSpec::default_for(MethodKind(*m)).validate().unwrap();
        }
    }

    #[test]
    fn shared_flags_agree_on_their_default() {
        for flag in MethodParams::flags() {
            for m in REGISTRY {
                for p in m.parameters().iter().filter(|p| p.flag == flag.flag) {
                    assert_eq!(
                        p.default - p.flag_offset,
                        flag.default - flag.flag_offset,
                        "--{} of {}",
                        p.flag,
                        m.name()
                    );
                    assert_eq!(p.domain, flag.domain, "--{} of {}", p.flag, m.name());
                }
            }
        }
    }

    #[test]
    fn flags_set_parameters_with_their_offset() {
        let mut params = MethodParams::default();
        params.set("pseudo-queries", 63.0);
        params.set("beta", 30.0);
        let pp = MethodSpec::from_kind("sinkhorn-pp".parse().unwrap(), &params);
        assert_eq!(pp.get("m"), 64.0);
        let is = MethodSpec::from_kind("is".parse().unwrap(), &params);
        assert_eq!(is.get("beta"), 30.0);
        let err = MethodSpec::new("sinkhorn-pp", &[("m", 1.0)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--pseudo-queries must be at least 1"), "{err}");
    }
}
