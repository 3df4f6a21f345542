//! The SQL face: function registration, aggregates against the native pass
//! (over several partitions), scalar functions against f64, the streaming
//! table functions against `hubnorm stats`/`search`, and `hubnorm sql` with
//! every file of queries/ on a run over data-samples/.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Float64Array, ListArray,
    RecordBatch, StringArray,
};
use arrow::datatypes::{DataType, Field, Float64Type};
use common::{
    hubnorm, random_table, read_parquet, rng, write_columns, write_table, Layout, Table, TestOutput,
};
use hubnorm::kernel::{LogSumExp, TopValues};
use hubnorm::options::{MemoryBudget, MethodSpec, PassOptions};
use hubnorm::pipeline::{run, run_search, run_stats, RunJob, SearchJob, StatsJob};
use hubnorm::progress::Silent;
use hubnorm::sql::{catalogue, register_functions, session, FunctionKind, SqlOptions};
use rand::seq::SliceRandom;

/// Runs `sql` in a fresh session with `tables` registered, all rows in one batch.
fn query(options: &SqlOptions, tables: &[(&str, &Path)], sql: &str) -> RecordBatch {
    try_query(options, tables, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn try_query(
    options: &SqlOptions,
    tables: &[(&str, &Path)],
    sql: &str,
) -> Result<RecordBatch, String> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let ctx = session(options).map_err(|e| e.to_string())?;
        for (name, path) in tables {
            ctx.register_parquet(
                *name,
                path.to_str().unwrap(),
                datafusion::prelude::ParquetReadOptions::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        }
        let frame = ctx.sql(sql).await.map_err(|e| e.to_string())?;
        let schema = Arc::new(frame.schema().as_arrow().clone());
        let batches = frame.collect().await.map_err(|e| e.to_string())?;
        Ok(arrow::compute::concat_batches(&schema, &batches).unwrap())
    })
}

fn f64s(batch: &RecordBatch, column: &str) -> Vec<f64> {
    let c =
        arrow::compute::cast(batch.column_by_name(column).unwrap(), &DataType::Float64).unwrap();
    c.as_primitive::<Float64Type>().values().to_vec()
}

fn strings(batch: &RecordBatch, column: &str) -> Vec<String> {
    let c = arrow::compute::cast(batch.column_by_name(column).unwrap(), &DataType::Utf8).unwrap();
    c.as_string::<i32>()
        .iter()
        .map(|s| s.unwrap().to_owned())
        .collect()
}

fn options(threads: usize) -> SqlOptions {
    SqlOptions {
        threads,
        ..SqlOptions::default()
    }
}

fn unit(v: &[f32]) -> Vec<f64> {
    let n = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|&x| x as f64 / n).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Every function in the catalogue is installed once under its name; a
/// second registration into the same session is refused; the README lists
/// each with its syntax.
#[test]
fn every_function_is_registered_once_and_documented() {
    let opts = options(2);
    let ctx = session(&opts).unwrap();
    let docs = catalogue();
    let mut names: Vec<&str> = docs.iter().map(|d| d.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), docs.len(), "duplicate names in the catalogue");
    let state = ctx.state();
    for doc in &docs {
        let found = match doc.kind {
            FunctionKind::Scalar => state.scalar_functions().contains_key(doc.name),
            FunctionKind::Aggregate => state.aggregate_functions().contains_key(doc.name),
            FunctionKind::Table => state.table_functions().contains_key(doc.name),
        };
        assert!(
            found,
            "{} not registered as a {:?} function",
            doc.name, doc.kind
        );
    }
    let again = register_functions(&ctx, &opts).unwrap_err().to_string();
    assert!(again.contains("registered twice"), "{again}");

    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for doc in &docs {
        assert!(
            readme.contains(&format!("`{}`", doc.syntax)),
            "README does not list `{}`",
            doc.syntax
        );
    }
}

/// Writes the long-format similarity table of `bank` × `gallery`
/// (normalised, as the native pass does; f32 scores) in shuffled order,
/// split over uneven parts of `dir`: one empty, one of a single row.
fn write_long_format(dir: &Path, bank: &Table, gallery: &Table, seed: u64) -> Vec<(String, f32)> {
    let g: Vec<Vec<f64>> = (0..gallery.rows()).map(|i| unit(gallery.row(i))).collect();
    let mut rows: Vec<(String, String, f32)> = Vec::new();
    for b in 0..bank.rows() {
        let bu = unit(bank.row(b));
        for (j, gj) in g.iter().enumerate() {
            rows.push((
                bank.ids[b].clone(),
                gallery.ids[j].clone(),
                dot(&bu, gj) as f32,
            ));
        }
    }
    rows.shuffle(&mut rng(seed));
    std::fs::create_dir_all(dir).unwrap();
    let n = rows.len();
    let cuts = [0, 0, 1, n / 3, n / 3 + 7, n];
    for (part, w) in cuts.windows(2).enumerate() {
        let slice = &rows[w[0]..w[1]];
        let col = |f: &dyn Fn(&(String, String, f32)) -> String| -> ArrayRef {
            Arc::new(StringArray::from(slice.iter().map(f).collect::<Vec<_>>()))
        };
        write_columns(
            &dir.join(format!("part-{part}.parquet")),
            vec![
                ("query_id", col(&|r| r.0.clone())),
                ("gallery_id", col(&|r| r.1.clone())),
                (
                    "score",
                    Arc::new(Float32Array::from(
                        slice.iter().map(|r| r.2).collect::<Vec<_>>(),
                    )),
                ),
            ],
        );
    }
    rows.into_iter().map(|(_, g, s)| (g, s)).collect()
}

/// `hub_is_correction` and `hub_topk_mean` over a long-format table in six
/// uneven parts, on 1 and 4 partitions, with and without GROUP BY, give
/// the native pass's corrections (to f32 rounding of the scores), and the
/// very numbers of the native structs fed the same scores.
#[test]
fn aggregates_equal_the_native_pass_over_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng(61);
    let gallery = random_table(&mut r, "g", 41, 12);
    let bank = random_table(&mut r, "b", 173, 12);
    let (gp, bp) = (
        dir.path().join("gallery.parquet"),
        dir.path().join("bank.parquet"),
    );
    write_table(&gp, &gallery, Layout::FixedF32, false);
    write_table(&bp, &bank, Layout::FixedF32, false);
    let stats = dir.path().join("stats.parquet");
    run_stats(
        &StatsJob {
            gallery: gp.display().to_string(),
            bank: bp.display().to_string(),
            gallery_bank: None,
            bank_sample: None,
            methods: vec![
                MethodSpec::new("is", &[("beta", 20.0)]).unwrap(),
                MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 7.0)]).unwrap(),
                MethodSpec::new("csls", &[("k", 5.0)]).unwrap(),
            ],
            out: stats.clone(),
            overwrite: false,
            options: PassOptions::default(),
            checkpoint: Default::default(),
        },
        &Silent,
    )
    .unwrap();
    let sims_dir = dir.path().join("sims");
    let rows = write_long_format(&sims_dir, &bank, &gallery, 3);

    // The native structs fed the same f32 scores.
    let mut lse: HashMap<String, LogSumExp> = HashMap::new();
    let mut top7: HashMap<String, TopValues> = HashMap::new();
    for (g, s) in &rows {
        lse.entry(g.clone()).or_default().push(20.0 * *s as f64);
        top7.entry(g.clone())
            .or_insert_with(|| TopValues::new(7))
            .push(*s);
    }

    let sql = "SELECT gallery_id, hub_is_correction(score, 20.0) AS h, \
               hub_topk_mean(score, 7) AS t7, hub_topk_mean(score, 5) AS t5 \
               FROM sims GROUP BY gallery_id ORDER BY gallery_id";
    let native = read_parquet(&stats);
    let native_ids = strings(&native, "gallery_id");
    let column = |name: &str| -> HashMap<String, f64> {
        native_ids
            .iter()
            .cloned()
            .zip(f64s(&native, name))
            .collect()
    };
    let (h, nnn, csls) = (
        column("is_beta20_correction"),
        column("nnn_alpha0.75_k7_correction"),
        column("csls_k5_correction"),
    );
    let mut by_partitions = Vec::new();
    for threads in [1, 4] {
        let out = query(&options(threads), &[("sims", &sims_dir)], sql);
        assert_eq!(out.num_rows(), 41);
        let ids = strings(&out, "gallery_id");
        let (sh, st7, st5) = (f64s(&out, "h"), f64s(&out, "t7"), f64s(&out, "t5"));
        for (i, id) in ids.iter().enumerate() {
            assert!(
                (sh[i] - h[id]).abs() < 1e-5,
                "{id}: is {} vs {}",
                sh[i],
                h[id]
            );
            assert!((0.75 * st7[i] - nnn[id]).abs() < 1e-5, "{id}: nnn");
            assert!((0.5 * st5[i] - csls[id]).abs() < 1e-5, "{id}: csls");
            let same = lse[id].value() / 20.0;
            assert!(
                (sh[i] - same).abs() <= 1e-12 * same.abs().max(1.0),
                "{id}: struct"
            );
            assert_eq!(
                st7[i],
                top7[id].mean_of_largest(7).unwrap(),
                "{id}: top-k struct"
            );
        }
        by_partitions.push(sh);
    }
    for (a, b) in by_partitions[0].iter().zip(&by_partitions[1]) {
        assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0));
    }
    // Without GROUP BY: the row accumulator gives the same value.
    let one = query(
        &options(4),
        &[("sims", &sims_dir)],
        "SELECT hub_is_correction(score, 20.0) AS h, hub_topk_mean(score, 7) AS t FROM sims WHERE gallery_id = 'g3'",
    );
    assert!((f64s(&one, "h")[0] - lse["g3"].value() / 20.0).abs() < 1e-12);
    assert_eq!(f64s(&one, "t")[0], top7["g3"].mean_of_largest(7).unwrap());
    // A non-constant β is refused with a clear message.
    let err = try_query(
        &options(1),
        &[("sims", &sims_dir)],
        "SELECT hub_is_correction(score, score) FROM sims",
    )
    .unwrap_err();
    assert!(err.contains("must be a constant"), "{err}");
}

/// `hub_hubness` over results.parquet gives every measure of the run's
/// summary (which the native pass computed), on 3 partitions.
#[test]
fn hubness_aggregate_equals_the_run_summary() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng(62);
    let gallery = random_table(&mut r, "g", 90, 10);
    let queries = random_table(&mut r, "q", 70, 10);
    let bank = random_table(&mut r, "b", 120, 10);
    let path = |n: &str| dir.path().join(n);
    write_table(&path("g.parquet"), &gallery, Layout::FixedF32, false);
    write_table(&path("q.parquet"), &queries, Layout::FixedF32, false);
    write_table(&path("b.parquet"), &bank, Layout::FixedF32, false);
    let summary = run(
        &RunJob {
            queries: path("q.parquet").display().to_string(),
            gallery: path("g.parquet").display().to_string(),
            bank: path("b.parquet").display().to_string(),
            gallery_bank: None,
            bank_sample: None,
            transductive: false,
            methods: vec![MethodSpec::new("is", &[("beta", 20.0)]).unwrap()],
            k: 10,
            out_dir: path("run"),
            overwrite: false,
            options: PassOptions::default(),
            cluster: None,
            checkpoint: Default::default(),
        },
        &Silent,
    )
    .unwrap();
    let names = hubnorm::report::HubnessMeasures::NAMES;
    let columns: Vec<String> = names
        .iter()
        .map(|m| format!("hub_hubness(gallery_id, '{m}', 10, 90) AS \"{m}\""))
        .collect();
    let sql = format!(
        "SELECT method, {} FROM results WHERE rank <= 10 GROUP BY method ORDER BY method",
        columns.join(", ")
    );
    let out = query(
        &options(3),
        &[("results", &path("run/results.parquet"))],
        &sql,
    );
    let methods = strings(&out, "method");
    for m in &summary.methods {
        let row = methods.iter().position(|x| *x == m.method).unwrap();
        for (name, value) in m.hubness.values() {
            let got = f64s(&out, name)[row];
            assert!(
                (got - value).abs() <= 1e-9 * value.abs().max(1.0),
                "{} {name}: SQL {got} vs native {value}",
                m.method
            );
        }
    }
}

/// hub_dot, hub_cosine and hub_l2_normalize against f64 on two list
/// layouts (with a null row); hub_corrected_score rebuilds the results'
/// scores from raw scores and the stats file's corrections.
#[test]
fn scalar_functions_match_f64() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng(63);
    let a = random_table(&mut r, "a", 25, 9);
    let b = random_table(&mut r, "b", 25, 9);
    let item = |t| Arc::new(Field::new("item", t, true));
    let fixed = FixedSizeListArray::try_new(
        item(DataType::Float32),
        9,
        Arc::new(Float32Array::from(a.data.clone())),
        Some(vec![true; 24].into_iter().chain([false]).collect()),
    )
    .unwrap();
    let list = ListArray::try_new(
        item(DataType::Float64),
        arrow::buffer::OffsetBuffer::from_lengths(vec![9; 25]),
        Arc::new(Float64Array::from_iter_values(
            b.data.iter().map(|&x| x as f64),
        )),
        None,
    )
    .unwrap();
    let pairs = dir.path().join("pairs.parquet");
    write_columns(
        &pairs,
        vec![
            ("id", Arc::new(StringArray::from(a.ids.clone()))),
            ("a", Arc::new(fixed)),
            ("b", Arc::new(list)),
        ],
    );
    let out = query(
        &options(2),
        &[("pairs", &pairs)],
        "SELECT id, hub_dot(a, b) AS d, hub_cosine(a, b) AS c, \
         hub_dot(hub_l2_normalize(a), hub_l2_normalize(a)) AS n FROM pairs ORDER BY id",
    );
    let ids = strings(&out, "id");
    let (d, c, n) = (
        out.column_by_name("d")
            .unwrap()
            .as_primitive::<Float64Type>()
            .clone(),
        out.column_by_name("c")
            .unwrap()
            .as_primitive::<Float64Type>()
            .clone(),
        out.column_by_name("n")
            .unwrap()
            .as_primitive::<Float64Type>()
            .clone(),
    );
    for (row, id) in ids.iter().enumerate() {
        let i: usize = id[1..].parse().unwrap();
        if i == 24 {
            assert!(
                d.is_null(row) && c.is_null(row),
                "a null embedding gives null"
            );
            continue;
        }
        let (x, y): (Vec<f64>, Vec<f64>) = (
            a.row(i).iter().map(|&v| v as f64).collect(),
            b.row(i).iter().map(|&v| v as f64).collect(),
        );
        assert!((d.value(row) - dot(&x, &y)).abs() < 1e-9);
        let cos = dot(&unit(a.row(i)), &unit(b.row(i)));
        assert!((c.value(row) - cos).abs() < 1e-9);
        assert!((n.value(row) - 1.0).abs() < 1e-6);
    }

    // Scores of a run rebuilt from raw scores and corrections.
    let mut r = rng(64);
    let gallery = random_table(&mut r, "g", 50, 8);
    let queries = random_table(&mut r, "q", 30, 8);
    let bank = random_table(&mut r, "b", 60, 8);
    let path = |n: &str| dir.path().join(n);
    write_table(&path("g.parquet"), &gallery, Layout::FixedF32, false);
    write_table(&path("q.parquet"), &queries, Layout::FixedF32, false);
    write_table(&path("b.parquet"), &bank, Layout::FixedF32, false);
    run(
        &RunJob {
            queries: path("q.parquet").display().to_string(),
            gallery: path("g.parquet").display().to_string(),
            bank: path("b.parquet").display().to_string(),
            gallery_bank: None,
            bank_sample: None,
            transductive: false,
            methods: vec![MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 16.0)]).unwrap()],
            k: 5,
            out_dir: path("run"),
            overwrite: false,
            options: PassOptions::default(),
            cluster: None,
            checkpoint: Default::default(),
        },
        &Silent,
    )
    .unwrap();
    let out = query(
        &options(2),
        &[
            ("results", &path("run/results.parquet")),
            ("stats", &path("run/gallery_stats.parquet")),
        ],
        "SELECT r.score, hub_corrected_score(r.raw_score, s.\"nnn_alpha0.75_k16_correction\") AS rebuilt \
         FROM results r JOIN stats s USING (gallery_id) WHERE r.method = 'nnn'",
    );
    assert_eq!(out.num_rows(), 150);
    for (s, rebuilt) in f64s(&out, "score").iter().zip(f64s(&out, "rebuilt")) {
        assert!((s - rebuilt).abs() < 1e-6, "{s} vs {rebuilt}");
    }
}

/// The table functions produce exactly what `hubnorm stats` and `hubnorm
/// search` write, compose with LIMIT, and take their budget from the
/// session's memory pool (refused when the pool cannot give it).
#[test]
fn table_functions_stream_the_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng(65);
    let gallery = random_table(&mut r, "g", 300, 16);
    let queries = random_table(&mut r, "q", 80, 16);
    let bank = random_table(&mut r, "b", 200, 16);
    let path = |n: &str| dir.path().join(n);
    let s = |n: &str| path(n).display().to_string();
    write_table(&path("g.parquet"), &gallery, Layout::FixedF32, false);
    write_table(&path("q.parquet"), &queries, Layout::FixedF32, false);
    write_table(&path("b.parquet"), &bank, Layout::FixedF32, false);
    let methods = vec![
        MethodSpec::new("is", &[("beta", 30.0)]).unwrap(),
        MethodSpec::new("nnn", &[("alpha", 0.75), ("k", 16.0)]).unwrap(),
        MethodSpec::new("dis", &[("beta", 30.0), ("ka", 1.0)]).unwrap(),
    ];
    run_stats(
        &StatsJob {
            gallery: s("g.parquet"),
            bank: s("b.parquet"),
            gallery_bank: None,
            bank_sample: None,
            methods: methods.clone(),
            out: path("stats.parquet"),
            overwrite: false,
            options: PassOptions::default(),
            checkpoint: Default::default(),
        },
        &Silent,
    )
    .unwrap();
    let small = SqlOptions {
        memory: MemoryBudget(64 << 20),
        threads: 2,
        ..SqlOptions::default()
    };
    let streamed = query(
        &small,
        &[],
        &format!(
            "SELECT * FROM hubnorm_stats('{}', '{}', 'is,nnn,dis', 'beta=30,nnn.k=16')",
            s("g.parquet"),
            s("b.parquet")
        ),
    );
    let written = read_parquet(&path("stats.parquet"));
    assert_eq!(streamed.schema().fields(), written.schema().fields());
    assert_eq!(streamed.columns(), written.columns(), "stats rows differ");
    // No column read (`count(*)`): the rows still count.
    let counted = query(
        &small,
        &[],
        &format!(
            "SELECT count(*) AS n FROM hubnorm_stats('{}', '{}', 'is')",
            s("g.parquet"),
            s("b.parquet")
        ),
    );
    assert_eq!(
        counted
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(0),
        written.num_rows() as i64
    );

    run_search(
        &SearchJob {
            queries: s("q.parquet"),
            gallery: s("g.parquet"),
            stats: Some(path("stats.parquet")),
            methods: methods[..2].to_vec(),
            k: 7,
            out: path("results.parquet"),
            overwrite: false,
            options: PassOptions::default(),
        },
        &Silent,
    )
    .unwrap();
    let streamed = query(
        &small,
        &[],
        &format!(
            "SELECT * FROM hubnorm_search('{}', '{}', '{}', 'is,nnn', 7)",
            s("q.parquet"),
            s("g.parquet"),
            s("stats.parquet")
        ),
    );
    let written = read_parquet(&path("results.parquet"));
    assert_eq!(streamed.columns(), written.columns(), "search rows differ");

    let limited = query(
        &small,
        &[],
        &format!(
            "SELECT * FROM hubnorm_search('{}', '{}', '{}', 'is', 7) LIMIT 3",
            s("q.parquet"),
            s("g.parquet"),
            s("stats.parquet")
        ),
    );
    assert_eq!(limited.num_rows(), 3);

    // A fractional k is refused, not truncated.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for k in ["2.5", "0", "-3"] {
        let err = runtime.block_on(async {
            let ctx = session(&small).unwrap();
            let sql = format!(
                "SELECT * FROM hubnorm_search('{}', '{}', '{}', 'is', {k})",
                s("q.parquet"),
                s("g.parquet"),
                s("stats.parquet")
            );
            match ctx.sql(&sql).await {
                Ok(frame) => frame.collect().await.unwrap_err().to_string(),
                Err(e) => e.to_string(),
            }
        });
        assert!(err.contains("whole number"), "k = {k}: {err}");
    }

    // Another consumer holds most of the pool: the pass cannot reserve its budget.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let err = runtime.block_on(async {
        let ctx = session(&small).unwrap();
        let pool = ctx.runtime_env().memory_pool.clone();
        let held = datafusion::execution::memory_pool::MemoryConsumer::new("other").register(&pool);
        held.try_grow(small.memory.bytes() * 15 / 16).unwrap();
        let sql = format!(
            "SELECT COUNT(*) FROM hubnorm_search('{}', '{}', '{}', 'is', 7)",
            s("q.parquet"),
            s("g.parquet"),
            s("stats.parquet")
        );
        let outcome = ctx.sql(&sql).await.unwrap().collect().await;
        drop(held);
        outcome.unwrap_err().to_string()
    });
    assert!(err.contains("hubnorm_search"), "{err}");
    assert!(err.to_lowercase().contains("resources exhausted"), "{err}");

    // Six table functions in one query under a 256 MiB pool: each keeps
    // only what its plan uses (about 20 MiB here), so all run; reserving a
    // half, a quarter, … of the pool, the fifth would get 8 MiB, below the
    // sixteenth it needs, and be refused. The pool is whole again afterwards.
    let pooled = SqlOptions {
        memory: MemoryBudget(256 << 20),
        ..small.clone()
    };
    let one = format!(
        "SELECT COUNT(*) AS n, SUM(score) AS total FROM hubnorm_search('{}', '{}', '{}', 'is', 7)",
        s("q.parquet"),
        s("g.parquet"),
        s("stats.parquet")
    );
    let six = vec![one.clone(); 6].join(" UNION ALL ");
    let (rows, reserved_after) = runtime.block_on(async {
        let ctx = session(&pooled).unwrap();
        let pool = ctx.runtime_env().memory_pool.clone();
        let batches = ctx.sql(&six).await.unwrap().collect().await.unwrap();
        (batches, pool.reserved())
    });
    let single = query(&pooled, &[], &one);
    let rows = arrow::compute::concat_batches(&rows[0].schema(), &rows).unwrap();
    assert_eq!(rows.num_rows(), 6);
    for i in 0..6 {
        assert_eq!(
            rows.slice(i, 1).columns(),
            single.columns(),
            "table function {i} of six"
        );
    }
    assert_eq!(reserved_after, 0, "the passes kept memory after the query");
}

fn samples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data-samples")
}

/// CSV rows of `hubnorm sql` as maps from column to text.
fn csv_rows(output: &TestOutput) -> Vec<HashMap<String, String>> {
    output.assert_success();
    let text = String::from_utf8(output.stdout_bytes().to_vec()).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    lines
        .map(|line| header.iter().cloned().zip(csv_fields(line)).collect())
        .collect()
}

/// The fields of one CSV line (quoted fields may hold commas and "").
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// Every file of queries/ runs against a run over data-samples/, and the
/// figures they compute in SQL are the run's own.
#[test]
fn every_query_file_runs_on_the_sample_run() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let s = |n: &str| samples().join(n).display().to_string();
    let out = hubnorm([
        "run",
        "--queries",
        &s("queries.parquet"),
        "--gallery",
        &s("gallery.parquet"),
        "--bank",
        &s("bank.parquet"),
        "--methods",
        "is,nnn,csls",
        "--quiet",
        "--out",
        run_dir.to_str().unwrap(),
    ])
    .output();
    out.assert_success();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    let figure = |method: &str, f: &dyn Fn(&serde_json::Value) -> f64| -> f64 {
        f(summary["methods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["method"] == method)
            .unwrap())
    };
    let queries_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("queries");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&queries_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "queries/ holds {} files", files.len());
    for file in &files {
        let header = std::fs::read_to_string(file).unwrap();
        assert!(
            header.starts_with("--") && header.contains("Reads:"),
            "{}: the header comment must say what it answers and which tables it reads",
            file.display()
        );
        let output = hubnorm([
            "sql",
            "--run",
            run_dir.to_str().unwrap(),
            "--file",
            file.to_str().unwrap(),
            "--format",
            "csv",
        ])
        .output();
        let rows = csv_rows(&output);
        assert!(!rows.is_empty(), "{} returned no rows", file.display());
        let name = file.file_stem().unwrap().to_str().unwrap();
        let value = |row: &HashMap<String, String>, col: &str| -> f64 { row[col].parse().unwrap() };
        for row in &rows {
            let method = row.get("method").cloned().unwrap_or_default();
            match name {
                "hubness_by_method" => {
                    let native = figure(&method, &|m| m["hubness"]["skewness"].as_f64().unwrap());
                    assert!((value(row, "skewness") - native).abs() < 1e-9, "{method}");
                    let native = figure(&method, &|m| m["hubness"]["gini"].as_f64().unwrap());
                    assert!((value(row, "gini") - native).abs() < 1e-9, "{method}");
                }
                "recall_by_method" => {
                    for (col, key) in [("r_at_1", "R@1"), ("r_at_5", "R@5"), ("r_at_10", "R@10")] {
                        let native = figure(&method, &|m| m[key].as_f64().unwrap());
                        assert!((value(row, col) - native).abs() < 1e-9, "{method} {key}");
                    }
                }
                "is_correction_in_sql" => {
                    assert_eq!(value(row, "gallery_items"), 600.0);
                    assert!(value(row, "max_abs_difference") < 1e-5);
                }
                "top_hubs" if row["hub_rank"] == "1" => {
                    let native = figure(&method, &|m| m["hubness"]["max"].as_f64().unwrap());
                    assert_eq!(value(row, "k_occurrence"), native, "{method}");
                }
                _ => {}
            }
        }
        if name == "never_retrieved" {
            for method in ["none", "is", "nnn", "csls"] {
                let count = rows.iter().filter(|r| r["method"] == method).count() as f64;
                let native = figure(method, &|m| m["hubness"]["antihub_rate"].as_f64().unwrap());
                assert!((count - native * 600.0).abs() < 1e-9, "{method}: {count}");
            }
        }
    }
}

/// `hubnorm sql`'s refusals: bad SQL names the file (exit 2), an unknown
/// table (2), Parquet without --out (2), an existing --out (2, unchanged);
/// Parquet output is written whole.
#[test]
fn sql_command_refuses_clearly_and_writes_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.sql");
    std::fs::write(&bad, "-- broken\nSELEC 1;").unwrap();
    let table = format!("g={}", samples().join("gallery.parquet").display());
    let out = hubnorm(["sql", "--file", bad.to_str().unwrap()]).output();
    assert_eq!(out.code(), Some(2));
    let err = out.stderr();
    assert!(err.contains("bad.sql"), "{err}");

    let out = hubnorm(["sql", "SELECT * FROM nowhere"]).output();
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr().contains("nowhere"));

    // An aligned table is gathered before it is printed: bounded, and a
    // larger result refused before anything is printed or written.
    let printed = dir.path().join("ids.txt");
    let out = hubnorm([
        "sql",
        "--table",
        &table,
        "--max-table-rows",
        "500",
        "--out",
        printed.to_str().unwrap(),
        "SELECT id FROM g",
    ])
    .output();
    assert_eq!(out.code(), Some(2));
    assert!(
        out.stderr().contains("--max-table-rows"),
        "{}",
        out.stderr()
    );
    assert!(out.stdout().is_empty());
    assert!(!printed.exists());
    let out = hubnorm([
        "sql",
        "--table",
        &table,
        "--max-table-rows",
        "600",
        "SELECT id FROM g",
    ])
    .output();
    out.assert_success();
    assert_eq!(out.stdout().matches("|").count() / 2, 600 + 1);

    let out = hubnorm([
        "sql",
        "--table",
        &table,
        "--format",
        "parquet",
        "SELECT id FROM g",
    ])
    .output();
    assert_eq!(out.code(), Some(2));

    let target = dir.path().join("ids.parquet");
    let out = hubnorm([
        "sql",
        "--table",
        &table,
        "--format",
        "parquet",
        "--out",
        target.to_str().unwrap(),
        "SELECT id, hub_l2_normalize(embedding) AS embedding FROM g ORDER BY id",
    ])
    .output();
    out.assert_success();
    let written = read_parquet(&target);
    assert_eq!(written.num_rows(), 600);
    let before = std::fs::read(&target).unwrap();
    let out = hubnorm([
        "sql",
        "--table",
        &table,
        "--format",
        "parquet",
        "--out",
        target.to_str().unwrap(),
        "SELECT id FROM g",
    ])
    .output();
    assert_eq!(out.code(), Some(2));
    assert_eq!(std::fs::read(&target).unwrap(), before);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A secret in a URL of the SQL (a table's location, a table name) is
/// refused or cut out of the message, as in every argument; nothing is
/// requested (the port listens to nobody).
#[test]
fn sql_never_echoes_a_secret_of_a_url() {
    for sql in [
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION \
         'http://u:hubnorm-secret-1@127.0.0.1:9/g.parquet'; SELECT count(*) FROM t",
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION \
         'http://hubnorm-secret-2@127.0.0.1:9/g.parquet'; SELECT count(*) FROM t",
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION \
         's3://b/g.parquet?X-Amz-Signature=hubnorm-secret-3'; SELECT count(*) FROM t",
    ] {
        let out = hubnorm(["sql", sql]).output();
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(out.stderr().contains("must not carry"), "{}", out.stderr());
        assert!(!out.stderr().contains("hubnorm-secret"), "{}", out.stderr());
    }
    let out = hubnorm([
        "sql",
        "SELECT count(*) FROM 'http://u:hubnorm-secret-4@127.0.0.1:9/g.parquet?sig=hubnorm-secret-5'",
    ])
    .output();
    assert_eq!(out.code(), Some(2), "{}", out.stderr());
    assert!(out.stderr().contains("not found"), "{}", out.stderr());
    assert!(!out.stderr().contains("hubnorm-secret"), "{}", out.stderr());
}

/// `COPY ... TO` goes through hubnorm's writers: the format from STORED AS
/// or the extension, an existing target kept unless asked, a failing query
/// leaves nothing under the final name, and the batches' own types are
/// written (a CASE the logical plan types narrower than its rows).
#[test]
fn copy_writes_atomically_and_keeps_existing_targets() {
    let dir = tempfile::tempdir().unwrap();
    let table = format!("g={}", samples().join("gallery.parquet").display());
    let path = |name: &str| dir.path().join(name).display().to_string();
    let sql = |statement: &str, extra: &[&str]| {
        let mut args = vec!["sql".to_owned(), "--table".into(), table.clone()];
        args.extend(extra.iter().map(|a| a.to_string()));
        args.push(statement.into());
        hubnorm(args).output()
    };
    let copy = |target: &str, stored: &str| {
        format!("COPY (SELECT id FROM g ORDER BY id) TO '{target}' {stored}")
    };

    let out = sql(&copy(&path("ids.parquet"), ""), &["--format", "csv"]);
    out.assert_success();
    assert_eq!(out.stdout(), "count\n600\n");
    assert_eq!(
        read_parquet(&dir.path().join("ids.parquet")).num_rows(),
        600
    );
    sql(&copy(&path("ids.txt"), "STORED AS CSV"), &[]).assert_success();
    let csv = std::fs::read_to_string(dir.path().join("ids.txt")).unwrap();
    assert_eq!(csv.lines().count(), 601, "a header and 600 rows");

    // An existing target: refused, kept; replaced when asked.
    let mine = dir.path().join("mine.parquet");
    std::fs::write(&mine, b"mine").unwrap();
    let out = sql(&copy(&path("mine.parquet"), ""), &[]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr());
    assert!(out.stderr().contains("already exists"), "{}", out.stderr());
    assert_eq!(std::fs::read(&mine).unwrap(), b"mine");
    sql(
        &copy(&path("mine.parquet"), "OPTIONS ('mode' 'overwrite')"),
        &[],
    )
    .assert_success();
    assert_eq!(read_parquet(&mine).num_rows(), 600);
    std::fs::write(&mine, b"mine").unwrap();
    sql(&copy(&path("mine.parquet"), ""), &["--overwrite"]).assert_success();
    assert_eq!(read_parquet(&mine).num_rows(), 600);

    // A query that fails after rows were written: nothing under the name.
    let failing = format!(
        "COPY (SELECT x, CASE WHEN x > 90000 THEN CAST(CAST(x AS VARCHAR) || 'a' AS INT) \
         ELSE x END AS y FROM generate_series(1, 100000) r(x)) TO '{}'",
        path("partial.parquet")
    );
    let out = sql(&failing, &[]);
    assert_ne!(out.code(), Some(0));
    assert!(!dir.path().join("partial.parquet").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The batches' types (Int64 here), for COPY and for --out alike.
    let widened = "SELECT x, CASE WHEN x > 5 THEN CAST(1 AS INT) ELSE x END AS y \
                   FROM generate_series(1, 10) r(x)";
    sql(
        &format!("COPY ({widened}) TO '{}'", path("case.parquet")),
        &[],
    )
    .assert_success();
    let case = read_parquet(&dir.path().join("case.parquet"));
    assert_eq!(case.num_rows(), 10);
    let out_file = path("case-out.parquet");
    sql(widened, &["--format", "parquet", "--out", &out_file]).assert_success();
    assert_eq!(read_parquet(Path::new(&out_file)).num_rows(), 10);

    // Formats it does not write, folders, PARTITIONED BY, unknown options.
    for (statement, phrase) in [
        (copy(&path("x.json"), ""), "PARQUET, CSV or DELTA, not JSON"),
        (copy(&path("x"), ""), "name the format"),
        (copy(&path("folder/"), "STORED AS PARQUET"), "name a file"),
        (
            format!("COPY g TO '{}' PARTITIONED BY (id)", path("p.parquet")),
            "PARTITIONED BY",
        ),
        (
            copy(&path("y.parquet"), "OPTIONS ('mode' 'append')"),
            "'mode' 'append' adds a version to a Delta table",
        ),
        (
            copy(&path("y.parquet"), "OPTIONS ('format.compression' 'zstd')"),
            "unknown option",
        ),
    ] {
        let out = sql(&statement, &[]);
        assert_eq!(out.code(), Some(2), "{statement}: {}", out.stderr());
        assert!(
            out.stderr().contains(phrase),
            "{statement}: {}",
            out.stderr()
        );
    }
    assert!(!dir.path().join("y.parquet").exists());
}

/// An output inside a table the statements read (`--out` or a COPY target,
/// in its folder or the file itself) is refused before anything is written,
/// as every command refuses one inside an input; the input stays as it was
/// even with `--overwrite`. A Delta table may take a new version made from
/// a query on itself.
#[test]
fn outputs_inside_input_tables_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let parts = dir.path().join("parts");
    std::fs::create_dir(&parts).unwrap();
    let part = parts.join("a.parquet");
    std::fs::copy(samples().join("gallery.parquet"), &part).unwrap();
    let before = std::fs::read(&part).unwrap();
    let folder_table = format!("g={}", parts.display());
    let file_table = format!("g={}", part.display());
    let inside = parts.join("x.parquet").display().to_string();
    let copy_inside = format!("COPY (SELECT id FROM g) TO '{inside}'");
    for (table, extra) in [
        (&folder_table, vec!["--format", "parquet", "--out", &inside]),
        (&folder_table, vec!["--format", "csv", "--out", &inside]),
        (&folder_table, vec![&copy_inside]),
        (
            &file_table,
            vec![
                "--format",
                "parquet",
                "--overwrite",
                "--out",
                part.to_str().unwrap(),
            ],
        ),
    ] {
        let mut args = vec!["sql", "--table", table.as_str()];
        let statement = extra.iter().any(|a| a.starts_with("COPY"));
        args.extend(extra.iter().copied());
        if !statement {
            args.push("SELECT id FROM g LIMIT 3");
        }
        let out = hubnorm(&args).output();
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr());
        assert!(
            out.stderr().contains("is inside the table g input"),
            "{args:?}: {}",
            out.stderr()
        );
        let names: Vec<_> = std::fs::read_dir(&parts)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.parquet"], "{args:?}");
        assert_eq!(std::fs::read(&part).unwrap(), before, "{args:?}");
    }

    // The tables a table function reads, directly or through a view.
    let bank = samples().join("bank.parquet").display().to_string();
    let stats_of = format!("hubnorm_stats('{}', '{bank}', 'is')", part.display());
    let view = format!("CREATE VIEW v AS SELECT * FROM {stats_of}");
    let over_part = format!(
        "COPY (SELECT * FROM v) TO '{}' OPTIONS ('mode' 'overwrite')",
        part.display()
    );
    for args in [
        vec![format!(
            "COPY (SELECT * FROM hubnorm_stats('{}', '{bank}', 'is')) TO '{inside}'",
            parts.display()
        )],
        vec![format!("{view}; {over_part}")],
        vec![
            "--format".into(),
            "parquet".into(),
            "--overwrite".into(),
            "--out".into(),
            part.display().to_string(),
            format!("{view}; SELECT count(*) FROM v"),
        ],
    ] {
        let out = hubnorm(["sql"]).args(&args).output();
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr());
        assert!(
            out.stderr()
                .contains("is inside the hubnorm_stats() gallery input"),
            "{args:?}: {}",
            out.stderr()
        );
        assert_eq!(std::fs::read(&part).unwrap(), before, "{args:?}");
        assert!(!Path::new(&inside).exists(), "{args:?}");
    }

    #[cfg(feature = "delta")]
    {
        let table = dir.path().join("ids");
        let sql = |statement: String| {
            hubnorm([
                "sql",
                "--table",
                &file_table,
                "--table",
                &format!("t={}", table.display()),
            ])
            .arg(statement)
            .output()
        };
        let create = format!(
            "COPY (SELECT id FROM g LIMIT 10) TO '{}' STORED AS DELTA",
            table.display()
        );
        hubnorm(["sql", "--table", &file_table, &create])
            .output()
            .assert_success();
        let grow = format!(
            "COPY (SELECT id FROM t LIMIT 2) TO '{}' STORED AS DELTA OPTIONS ('mode' 'append')",
            table.display()
        );
        let count = || {
            let out = sql("SELECT count(*) AS n FROM t".into());
            out.assert_success();
            out.stdout()
                .lines()
                .nth(3)
                .unwrap()
                .trim_matches(['|', ' '])
                .to_owned()
        };
        assert_eq!(count(), "10");
        sql(grow).assert_success();
        assert_eq!(count(), "12");
        let out = sql(format!(
            "COPY (SELECT id FROM t) TO '{}' STORED AS PARQUET",
            table.join("x.parquet").display()
        ));
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(
            out.stderr().contains("is inside the table t input"),
            "{}",
            out.stderr()
        );
        // The table read at a version: its folder is still an input.
        let out = hubnorm([
            "sql",
            "--table",
            &format!("t={}@0", table.display()),
            "--format",
            "parquet",
            "--out",
            &table.join("y.parquet").display().to_string(),
            "SELECT id FROM t",
        ])
        .output();
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(
            out.stderr().contains("is inside the table t input"),
            "{}",
            out.stderr()
        );
        assert!(!table.join("y.parquet").exists());

        // A Delta gallery that a table function reads is never the target
        // of a new version: its rows would become statistics.
        let gallery = dir.path().join("gallery_delta");
        let made = format!(
            "COPY (SELECT * FROM g) TO '{}' STORED AS DELTA",
            gallery.display()
        );
        hubnorm(["sql", "--table", &file_table, &made])
            .output()
            .assert_success();
        let over = format!(
            "COPY (SELECT * FROM hubnorm_stats('{0}', '{bank}', 'is')) TO '{0}' STORED AS DELTA OPTIONS ('mode' 'overwrite')",
            gallery.display()
        );
        let out = hubnorm(["sql", &over]).output();
        assert_eq!(out.code(), Some(2), "{}", out.stderr());
        assert!(
            out.stderr()
                .contains("is inside the hubnorm_stats() gallery input"),
            "{}",
            out.stderr()
        );
    }
}

/// `hub_moments` over a table in uneven parts, on 1 and 4 partitions,
/// gives the moments `mp` keeps of the same rows (its stats file's
/// gallery side), and its second moment is C = Σ + m mᵀ of the pairs.
#[test]
fn moments_aggregate_equals_the_native_pass_over_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng(63);
    let gallery = random_table(&mut r, "g", 37, 6);
    let bank = random_table(&mut r, "b", 20, 6);
    let gallery_dir = dir.path().join("gallery");
    std::fs::create_dir_all(&gallery_dir).unwrap();
    for (i, (start, end)) in [(0, 1), (1, 1), (1, 30), (30, 37)].into_iter().enumerate() {
        write_table(
            &gallery_dir.join(format!("part-{i}.parquet")),
            &gallery.slice(start, end),
            Layout::FixedF32,
            false,
        );
    }
    let bank_path = dir.path().join("bank.parquet");
    write_table(&bank_path, &bank, Layout::FixedF32, false);
    let stats = dir.path().join("stats.parquet");
    run_stats(
        &StatsJob {
            methods: vec![MethodSpec::new("mp", &[]).unwrap()],
            ..StatsJob::new(
                gallery_dir.display().to_string(),
                bank_path.display().to_string(),
                stats.clone(),
            )
        },
        &Silent,
    )
    .unwrap();
    let text = common::parquet_metadata(&stats)
        .into_iter()
        .find(|(k, _)| k == "hubnorm.mp.query_side_moments")
        .unwrap()
        .1;
    let native = hubnorm::bank::Moments::from_metadata(&text).unwrap();
    let native_cov = native.covariance.unwrap();
    let rows: Vec<Vec<f64>> = (0..37)
        .map(|i| unit(&gallery.data[i * 6..(i + 1) * 6]))
        .collect();
    for threads in [1, 4] {
        let out = query(
            &options(threads),
            &[("gallery", &gallery_dir)],
            "SELECT hub_moments(hub_l2_normalize(embedding)) AS m FROM gallery",
        );
        let m = out.column(0).as_struct();
        assert_eq!(
            m.column(0)
                .as_primitive::<arrow::datatypes::UInt64Type>()
                .value(0),
            37
        );
        let list = |i: usize| -> Vec<f64> {
            m.column(i)
                .as_list::<i32>()
                .value(0)
                .as_primitive::<Float64Type>()
                .values()
                .to_vec()
        };
        let (mean, cov, second) = (list(1), list(2), list(3));
        for j in 0..6 {
            assert!((mean[j] - native.mean[j]).abs() < 1e-7, "mean {j}");
            for l in 0..6 {
                assert!(
                    (cov[j * 6 + l] - native_cov[(j, l)]).abs() < 1e-7,
                    "Σ {j} {l}"
                );
                let pairs = rows.iter().map(|x| x[j] * x[l]).sum::<f64>() / 37.0;
                assert!((second[j * 6 + l] - pairs).abs() < 1e-7, "C {j} {l}");
            }
        }
    }
    let err = try_query(
        &options(1),
        &[("gallery", &gallery_dir)],
        "SELECT hub_moments(id) FROM gallery",
    )
    .unwrap_err();
    assert!(err.contains("hub_moments"), "{err}");
}
