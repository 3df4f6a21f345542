//! `hubnorm sql`: arguments in, SQL job, rows out.

use hubnorm::sql::{catalogue, run_sql, SqlJob, SqlOptions};
use hubnorm::{HubnormError, Result};

use crate::cli::SqlArgs;

pub fn sql(args: SqlArgs) -> Result<()> {
    if args.functions {
        for doc in catalogue() {
            println!(
                "{:<20} {:<9} {}\n{:<30} {}\n{:<30} e.g. {}\n",
                doc.name,
                doc.kind.name(),
                doc.description,
                "",
                doc.syntax,
                "",
                doc.example
            );
        }
        return Ok(());
    }
    let (sql, source) = match (&args.query, &args.file) {
        (Some(query), None) => (query.clone(), None),
        (None, Some(file)) => {
            let text = hubnorm::storage::read_to_string(file).map_err(|e| match e {
                HubnormError::Input { .. } => {
                    HubnormError::Usage(format!("{}: no such file", file.display()))
                }
                other => other,
            })?;
            (text, Some(file.clone()))
        }
        _ => unreachable!("clap requires exactly one of QUERY and --file"),
    };
    let tables = args
        .tables
        .iter()
        .map(|t| match t.split_once('=') {
            Some((name, path)) if !name.is_empty() && !path.is_empty() => {
                Ok((name.to_owned(), path.to_owned()))
            }
            _ => Err(HubnormError::Usage(format!(
                "--table {t}: expected NAME=PATH"
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    // A Delta table is written as the Parquet output is, then committed.
    let delta = args.format == "delta";
    if delta && args.out.is_none() {
        return Err(HubnormError::Usage(
            "--format delta needs --out TABLE".into(),
        ));
    }
    let overwrite = match &args.out {
        Some(out) => crate::cli::TableArgs {
            format: if delta { "delta" } else { "parquet" }.into(),
            append: args.append,
        }
        .apply(vec![out.clone()], args.overwrite)?,
        None if args.append => {
            return Err(HubnormError::Usage(
                "--append needs --format delta and --out TABLE".into(),
            ))
        }
        None => args.overwrite,
    };
    let job = SqlJob {
        tables,
        run_dir: args.run.clone(),
        sql,
        source,
        format: if delta {
            "parquet"
        } else {
            args.format.as_str()
        }
        .parse()?,
        max_table_rows: args.max_table_rows,
        out: args.out.clone(),
        overwrite,
        options: SqlOptions {
            memory: args.memory_limit,
            threads: args.threads,
            ..SqlOptions::default()
        },
        cluster: args.cluster.clone(),
    };
    let mut stdout = std::io::stdout().lock();
    let outcome = run_sql(&job, &mut stdout)?;
    for note in &outcome.skipped {
        eprintln!("note: {note}");
    }
    if let Some(out) = &args.out {
        eprintln!("wrote {} rows to {}", outcome.rows, out.display());
    }
    Ok(())
}
