//! `hubnorm run`, `hubnorm stats`, `hubnorm search`: arguments in, library call, summary out.

use hubnorm::options::MethodKind;
use hubnorm::pipeline::{self, MethodSummary, RunJob, RunSummary, SearchJob, StatsJob};
use hubnorm::Result;

use crate::cli::{RunArgs, SearchArgs, StatsArgs};
use crate::progress::reporter;

pub fn run(args: RunArgs) -> Result<()> {
    let job = run_job(&args, args.method.specs(MethodKind::InvertedSoftmax)?)?;
    let progress = reporter(args.common.quiet);
    let summary = pipeline::run(&job, progress.as_ref())?;
    print_summary(&summary);
    println!(
        "wrote {}/{{{}}}",
        args.out.display(),
        pipeline::RUN_OUTPUTS.join(",")
    );
    Ok(())
}

/// The run `args` describe, with these methods.
pub fn run_job(args: &RunArgs, methods: Vec<hubnorm::options::MethodSpec>) -> Result<RunJob> {
    Ok(RunJob {
        queries: args.queries.clone(),
        gallery: args.gallery.clone(),
        bank: args.bank.clone().unwrap_or_default(),
        gallery_bank: args.banks.gallery_bank.clone(),
        bank_sample: args.banks.sample(),
        transductive: args.transductive,
        methods,
        k: args.k,
        out_dir: args.out.clone(),
        overwrite: args.overwrite,
        options: args.quality.apply(args.method.pass_options(&args.common))?,
    })
}

pub fn stats(args: StatsArgs) -> Result<()> {
    let methods = args.method.specs(MethodKind::InvertedSoftmax)?;
    let job = StatsJob {
        gallery: args.gallery,
        bank: args.bank,
        gallery_bank: args.banks.gallery_bank.clone(),
        bank_sample: args.banks.sample(),
        methods,
        out: args.out,
        overwrite: args.overwrite,
        options: args.method.pass_options(&args.common),
    };
    let progress = reporter(args.common.quiet);
    let path = pipeline::run_stats(&job, progress.as_ref())?;
    if !args.common.quiet {
        println!("wrote {}", path.display());
    }
    Ok(())
}

pub fn search(args: SearchArgs) -> Result<()> {
    if args.method.config.is_some() {
        let methods = args.method.specs(MethodKind::InvertedSoftmax)?;
        return search_with(args, methods);
    }
    let kinds = args.method.kinds(MethodKind::InvertedSoftmax)?;
    // Without parameter flags, take the statistic the stats file holds.
    let from_file = match &args.stats {
        Some(path) => pipeline::stats_file_methods(path)?,
        None => vec![],
    };
    let params = args.method.params();
    let mut methods = Vec::new();
    for kind in kinds {
        let explicit = hubnorm::options::MethodSpec::from_kind(kind, &params);
        let candidates: Vec<_> = from_file
            .iter()
            .filter(|m| m.kind() == kind)
            .copied()
            .collect();
        let spec = match (kind, args.method.any_parameter(), candidates.as_slice()) {
            (MethodKind::None, _, _) | (_, true, _) => explicit,
            (_, false, [only]) => *only,
            _ => explicit,
        };
        methods.push(spec);
    }
    search_with(args, methods)
}

fn search_with(args: SearchArgs, methods: Vec<hubnorm::options::MethodSpec>) -> Result<()> {
    let job = SearchJob {
        queries: args.queries,
        gallery: args.gallery,
        stats: args.stats,
        methods,
        k: args.k,
        out: args.out.clone(),
        overwrite: args.overwrite,
        options: args.quality.apply(args.common.pass_options())?,
    };
    let progress = reporter(args.common.quiet);
    let summary = pipeline::run_search(&job, progress.as_ref())?;
    if !args.common.quiet {
        print_summary(&summary);
        println!("wrote {}", args.out.display());
    }
    Ok(())
}

/// The printed summary: sizes, then one row per method (quality when the
/// queries carry ground truth, and hubness).
fn print_summary(summary: &RunSummary) {
    println!(
        "{} queries × {} gallery items (dim {}{})",
        summary.queries,
        summary.gallery,
        summary.dim,
        summary
            .bank
            .map(|b| format!(", bank {b}"))
            .unwrap_or_default()
            + &summary
                .gallery_bank
                .map(|b| format!(", gallery bank {b}"))
                .unwrap_or_default()
    );
    print!("{}", summary_table(&summary.methods));
}

/// An aligned table of method summaries (R@K in percent).
fn summary_table(methods: &[MethodSummary]) -> String {
    let names: Vec<String> = methods.iter().map(method_label).collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    let ks: Vec<usize> = methods
        .iter()
        .find_map(|m| m.quality.as_ref())
        .map(|q| q.recall.iter().map(|r| r.k).collect())
        .unwrap_or_default();
    let mut out = format!("{:<width$} {:>9}", "method", "skew(N10)");
    for k in &ks {
        out += &format!(" {:>7}", format!("R@{k}"));
    }
    if !ks.is_empty() {
        out += &format!(" {:>7} {:>7}", "MdR", "MRR");
    }
    out.push('\n');
    for (m, name) in methods.iter().zip(&names) {
        out += &format!("{:<width$} {:>9.3}", name, m.k_occurrence_skewness);
        if let Some(q) = &m.quality {
            for r in &q.recall {
                out += &format!(" {:>7.2}", 100.0 * r.value);
            }
            out += &format!(" {:>7.1} {:>7.4}", q.median_rank, q.mrr);
        }
        out.push('\n');
    }
    out
}

/// `is beta=20`: the method with its parameters.
fn method_label(m: &MethodSummary) -> String {
    let params: Vec<String> = m
        .parameters
        .iter()
        .map(|(k, v)| match v.as_f64() {
            Some(x) if x.fract() == 0.0 => format!("{k}={x:.0}"),
            _ => format!("{k}={v}"),
        })
        .collect();
    if params.is_empty() {
        m.method.clone()
    } else {
        format!("{} {}", m.method, params.join(","))
    }
}
