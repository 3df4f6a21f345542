//! `hubnorm run`, `hubnorm stats`, `hubnorm search`: arguments in, library call, summary out.

use hubnorm::export::ExportJob;
use hubnorm::options::{MethodKind, MethodSpec};
use hubnorm::pipeline::{self, MethodSummary, RunSummary, SearchJob};
use hubnorm::{HubnormError, Result};

use crate::cli::{ExportArgs, RunArgs, SearchArgs, StatsArgs};
use crate::progress::reporter;

pub fn run(args: RunArgs) -> Result<()> {
    let job = args.job(args.method.specs(MethodKind::default())?)?;
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
    let job = args.job()?;
    let progress = reporter(args.common.quiet);
    if args.update && args.cluster.cluster.is_some() {
        return Err(HubnormError::Usage(
            "--update merges new parts on this machine; run it without --cluster".into(),
        ));
    }
    if args.update {
        let summary = hubnorm::update::update_stats(&job, progress.as_ref())?;
        if !args.common.quiet {
            let names = |ms: &[MethodSpec]| {
                ms.iter()
                    .map(|m| m.kind().name())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            if summary.new_bank_parts == 0
                && summary.new_gallery_parts == 0
                && summary.new_gallery_bank_parts == 0
            {
                let compacted = if summary.compacted {
                    "; the Delta inputs were compacted since, the same rows in other files: nothing recomputed"
                } else {
                    ""
                };
                println!(
                    "{} is up to date (no new parts{compacted})",
                    job.out.display()
                );
            } else {
                println!(
                    "merged {} new bank part(s), {} new gallery-bank part(s) and {} new gallery part(s) ({} new items) into {}: merged [{}], recomputed [{}]",
                    summary.new_bank_parts,
                    summary.new_gallery_bank_parts,
                    summary.new_gallery_parts,
                    summary.new_gallery_rows,
                    job.out.display(),
                    names(&summary.merged),
                    names(&summary.recomputed)
                );
            }
        }
        return Ok(());
    }
    let outcome = match args.cluster.job() {
        Some(cluster) => pipeline::run_stats_on(&job, &cluster)?,
        None => pipeline::run_stats(&job, progress.as_ref())?,
    };
    if !args.common.quiet {
        if outcome.resumed_rows > 0 {
            println!(
                "resumed after {} gallery rows from the checkpoint",
                outcome.resumed_rows
            );
        }
        if let Some(screen) = &outcome.screen {
            print_screen("bf16 screen", "(bank, gallery)", screen);
        }
        println!("wrote {}", outcome.path.display());
    }
    Ok(())
}

/// What a pass's bf16 screen did, as a line of the summary.
fn print_screen(what: &str, pairs: &str, screen: &hubnorm::pipeline::ScreenSummary) {
    println!(
        "{what}: re-scored {} of {} {pairs} pairs in f32 ({:.3}%)",
        screen.rescored_pairs,
        screen.screened_pairs,
        100.0 * screen.rescored_pairs as f64 / screen.screened_pairs.max(1) as f64
    );
}

pub fn search(args: SearchArgs) -> Result<()> {
    let methods = methods_for_stats(&args.method, args.stats.as_deref())?;
    search_with(args, methods)
}

/// The methods `args` name, with the statistics the stats file records.
fn methods_for_stats(
    args: &crate::cli::MethodArgs,
    stats: Option<&std::path::Path>,
) -> Result<Vec<MethodSpec>> {
    if args.tol.is_some() {
        return Err(HubnormError::Usage(
            "--tol stops pass 1's Sinkhorn iterations; this command reads finished statistics: give it to `hubnorm stats` or `run`".into(),
        ));
    }
    let from_file = match stats {
        Some(path) if args.config.is_none() => pipeline::stats_file_methods(path)?,
        _ => vec![],
    };
    args.specs_for_stats(&from_file)
}

pub fn export(args: ExportArgs) -> Result<()> {
    let mut methods = methods_for_stats(&args.method, Some(&args.stats))?;
    // A config (e.g. tune's) lists the baseline beside the tuned method;
    // the baseline has no correction to export.
    if methods.len() > 1 {
        methods.retain(|m| m.kind() != MethodKind::baseline());
    }
    let [method] = methods[..] else {
        return Err(HubnormError::Usage(
            "export takes one method (--method NAME)".into(),
        ));
    };
    let job = ExportJob {
        gallery: args.gallery,
        stats: args.stats,
        method,
        out: args.out.clone(),
        overwrite: args.table.apply(vec![args.out.clone()], args.overwrite)?,
        options: args.common.pass_options(),
    };
    let progress = reporter(args.common.quiet);
    let summary = hubnorm::export::export(&job, progress.as_ref())?;
    if !args.common.quiet {
        let queries = if job.options.read.normalize {
            "each L2-normalised query"
        } else {
            "each query"
        };
        println!(
            "wrote {} vectors of dimension {} to {} (append {} to {queries})",
            summary.rows,
            summary.dim,
            args.out.display(),
            hubnorm::export::QUERY_SUFFIX
        );
    }
    Ok(())
}

fn search_with(args: SearchArgs, methods: Vec<MethodSpec>) -> Result<()> {
    let job = SearchJob {
        queries: args.queries,
        gallery: args.gallery,
        stats: args.stats,
        methods,
        k: args.k,
        out: args.out.clone(),
        overwrite: args.table.apply(vec![args.out.clone()], args.overwrite)?,
        options: args
            .quality
            .apply(args.precision.apply(args.common.pass_options()))?,
    };
    let summary = match args.cluster.job() {
        Some(cluster) => pipeline::run_search_on(&job, &cluster)?,
        None => pipeline::run_search(&job, reporter(args.common.quiet).as_ref())?,
    };
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
    if let Some(screen) = &summary.bank_screen {
        print_screen("bf16 screen, pass 1", "(bank, gallery)", screen);
    }
    if let Some(screen) = &summary.screen {
        print_screen("bf16 screen", "(query, item)", screen);
    }
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
