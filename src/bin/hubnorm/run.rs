//! `hubnorm run`, `hubnorm stats`, `hubnorm search`: arguments in, library call, summary out.

use hubnorm::options::MethodKind;
use hubnorm::pipeline::{self, RunJob, RunSummary, SearchJob, StatsJob};
use hubnorm::Result;

use crate::cli::{RunArgs, SearchArgs, StatsArgs};
use crate::progress::reporter;

pub fn run(args: RunArgs) -> Result<()> {
    let job = RunJob {
        queries: args.queries,
        gallery: args.gallery,
        bank: args.bank.unwrap_or_default(),
        gallery_bank: args.banks.gallery_bank.clone(),
        bank_sample: args.banks.sample(),
        transductive: args.transductive,
        methods: args.method.specs(MethodKind::InvertedSoftmax)?,
        k: args.k,
        out_dir: args.out.clone(),
        overwrite: args.overwrite,
        options: args.method.pass_options(&args.common),
    };
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
    let job = SearchJob {
        queries: args.queries,
        gallery: args.gallery,
        stats: args.stats,
        methods,
        k: args.k,
        out: args.out.clone(),
        overwrite: args.overwrite,
        options: args.common.pass_options(),
    };
    let progress = reporter(args.common.quiet);
    let summary = pipeline::run_search(&job, progress.as_ref())?;
    if !args.common.quiet {
        print_summary(&summary);
        println!("wrote {}", args.out.display());
    }
    Ok(())
}

/// The short printed summary: skewness and, with ground truth, R@K and MRR.
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
    let names: Vec<String> = summary
        .methods
        .iter()
        .map(|m| {
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
        })
        .collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<width$} {:>10} {:>8} {:>8} {:>8} {:>8}",
        "method", "skew(N10)", "R@1", "R@5", "R@10", "MRR"
    );
    for (m, name) in summary.methods.iter().zip(&names) {
        match &m.quality {
            Some(q) => println!(
                "{:<width$} {:>10.3} {:>8.4} {:>8.4} {:>8.4} {:>8.4}",
                name, m.k_occurrence_skewness, q.r1, q.r5, q.r10, q.mrr
            ),
            None => println!(
                "{:<width$} {:>10.3} {:>8} {:>8} {:>8} {:>8}",
                name, m.k_occurrence_skewness, "-", "-", "-", "-"
            ),
        }
    }
}
