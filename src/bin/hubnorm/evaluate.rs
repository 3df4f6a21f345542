//! `hubnorm compare`, `hubnorm report` and `hubnorm tune`: arguments in,
//! library call, table out.

use hubnorm::evaluate::{self, CompareJob, ReportJob, COMPARE_OUTPUTS, REPORT_OUTPUTS};
use hubnorm::options::MethodKind;
use hubnorm::pipeline::RUN_OUTPUTS;
use hubnorm::Result;

use crate::cli::{CompareArgs, ReportArgs, TuneArgs};
use crate::progress::reporter;

pub fn compare(args: CompareArgs) -> Result<()> {
    let method = &args.run.method;
    // Without method flags, every method the inputs allow, at its defaults.
    let methods = if method.method.is_some()
        || !method.methods.is_empty()
        || method.config.is_some()
    {
        method.specs(MethodKind::baseline())?
    } else if method.any_parameter() {
        return Err(hubnorm::HubnormError::Usage(
                "compare without --method, --methods or --config runs every method at its defaults; name the methods whose parameters you set (e.g. --methods is --beta 30)".into(),
            ));
    } else {
        Vec::new()
    };
    if args.hubness_k == 0 {
        return Err(hubnorm::HubnormError::Usage(
            "--hubness-k must be at least 1".into(),
        ));
    }
    let mut run = args.run.job(methods)?;
    run.options.report.hubness_k = args.hubness_k;
    let job = CompareJob {
        run,
        text_column: args.text_column,
        html: args.html.clone(),
    };
    let progress = reporter(args.run.common.quiet);
    let outcome = evaluate::compare(&job, progress.as_ref())?;
    let s = &outcome.summary;
    println!(
        "{} queries × {} gallery items (dim {}), bank {} rows{}; hubness at k = {}",
        s.queries,
        s.gallery,
        s.dim,
        s.bank.unwrap_or(0),
        s.gallery_bank
            .map(|b| format!(", gallery bank {b} rows"))
            .unwrap_or_default(),
        args.hubness_k
    );
    print!("{}", outcome.comparison.to_text());
    for note in &outcome.left_out {
        println!("left out {note}");
    }
    let names: Vec<&str> = RUN_OUTPUTS
        .iter()
        .chain(&COMPARE_OUTPUTS)
        .copied()
        .collect();
    println!("wrote {}/{{{}}}", args.run.out.display(), names.join(","));
    if let Some(html) = &args.html {
        println!("wrote {}", html.display());
    }
    Ok(())
}

pub fn report(args: ReportArgs) -> Result<()> {
    let mut options = args.quality.apply(args.common.pass_options())?;
    options.report.hubness_k = args.k;
    let job = ReportJob {
        results: args.results,
        gallery: args.gallery,
        queries: args.queries,
        stats: args.stats,
        k: args.k,
        out_dir: args.out.clone(),
        html: args.html.clone(),
        text_column: args.text_column,
        overwrite: args.table.apply(
            REPORT_OUTPUTS
                .iter()
                .map(|name| args.out.join(name))
                .collect(),
            args.overwrite,
        )?,
        options,
    };
    let progress = reporter(args.common.quiet);
    let outcome = evaluate::report(&job, progress.as_ref())?;
    print!("{}", outcome.comparison.to_text());
    println!(
        "wrote {}/{{{}}}",
        args.out.display(),
        REPORT_OUTPUTS.join(",")
    );
    if let Some(html) = &args.html {
        println!("wrote {}", html.display());
    }
    Ok(())
}

pub fn tune(args: TuneArgs) -> Result<()> {
    use hubnorm::tune::{self, GridAxis, TuneJob, Validation};
    let validation = match (&args.validation, args.validation_split) {
        (Some(spec), _) => Validation::Queries(spec.clone()),
        (None, Some(fraction)) => Validation::SplitBank {
            fraction,
            seed: args.seed,
            gallery: args.validation_gallery.clone(),
        },
        (None, None) => unreachable!("clap requires one"),
    };
    let methods = args
        .methods
        .iter()
        .map(|m| m.parse::<MethodKind>())
        .collect::<Result<Vec<_>>>()?;
    let grid = args
        .grid
        .iter()
        .map(|g| g.parse::<GridAxis>())
        .collect::<Result<Vec<_>>>()?;
    let mut options = args
        .quality
        .apply(args.precision.apply(args.common.pass_options()))?;
    options.sinkhorn_tolerance = args.tol;
    let job = TuneJob {
        gallery: args.gallery,
        bank: args.bank,
        gallery_bank: args.gallery_bank,
        validation,
        methods,
        grid,
        metric: args.metric.parse()?,
        out_dir: args.out.clone(),
        html: args.html.clone(),
        overwrite: args.overwrite,
        options,
    };
    let progress = reporter(args.common.quiet);
    let outcome = tune::tune(&job, progress.as_ref())?;
    println!(
        "{} grid points on {} validation queries, chosen by {} (* = chosen)",
        outcome.grid.len(),
        outcome.validation_queries,
        job.metric.name()
    );
    print!("{}", tune::grid_table(&outcome.grid, job.metric));
    println!(
        "wrote {}/{{{}}}; use it with: hubnorm run --config {}",
        args.out.display(),
        tune::TUNE_OUTPUTS.join(","),
        args.out.join("tuned.json").display()
    );
    if let Some(html) = &args.html {
        println!("wrote {}", html.display());
    }
    Ok(())
}
