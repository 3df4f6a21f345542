//! `gallery_stats.parquet` and method configs on disk: the methods a file
//! records, its metadata, and its columns read back aligned to the gallery.
//! Pass 1 writes the file ([`crate::bank::driver`]); pass 2 plans with it
//! ([`crate::query::plan`]).

use std::collections::HashMap;
use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Float32Type, Float64Type};

use crate::error::{HubnormError, Result};
use crate::ids::{id_at, IdIndex};
use crate::method::{ColumnKind, ColumnValues, MethodKind, MethodParams, MethodSpec};

pub use crate::bank::driver::{
    stats_of_rows, stream_stats, write_stats, SinkhornReport, StatsInputs, StatsPlan, StatsReport,
    StatsSink,
};

pub(crate) fn floats_json(values: &[f64]) -> String {
    serde_json::Value::from(values.to_vec()).to_string()
}

/// Metadata pairs describing the methods (method, parameters, column prefix).
pub fn methods_json(methods: &[MethodSpec]) -> String {
    let list: Vec<_> = methods
        .iter()
        .map(|m| {
            serde_json::json!({
                "method": m.kind().name(),
                "parameters": parameters_json(m),
                "column_prefix": m.column_prefix(),
            })
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

/// A method's parameters as a JSON object.
pub fn parameters_json(m: &MethodSpec) -> serde_json::Map<String, serde_json::Value> {
    m.parameters()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), serde_json::json!(v)))
        .collect()
}

/// Metadata key of a run's stats file: whether the bank was the test
/// queries themselves (`--transductive`), which `dsl`'s rule reads.
pub const TRANSDUCTIVE_KEY: &str = "hubnorm.transductive";

/// Refuses statistics computed on vectors normalised differently from the
/// ones a job reads (`--no-normalize`): h(g) of raw dot products does not
/// correct cosines, nor the reverse. Files without the key predate it.
pub(crate) fn check_same_normalize(
    path: &Path,
    metadata: &HashMap<String, String>,
    normalize: bool,
) -> Result<()> {
    let Some(stored) = metadata.get("hubnorm.normalize") else {
        return Ok(());
    };
    if *stored == normalize.to_string() {
        return Ok(());
    }
    let vectors = |n: bool| {
        if n {
            "L2-normalised vectors"
        } else {
            "raw vectors (--no-normalize)"
        }
    };
    Err(HubnormError::Usage(format!(
        "{} holds statistics of {} (hubnorm.normalize={stored}), and this command reads {}; give both commands the same --no-normalize setting",
        path.display(),
        vectors(!normalize),
        vectors(normalize),
    )))
}

/// The key-value metadata of a Parquet file.
pub(crate) fn file_metadata(path: &Path) -> Result<HashMap<String, String>> {
    let builder = crate::source::open_parquet(path)?;
    Ok(builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default())
}

/// The methods `kinds` for a pass that reads a stats file recording
/// `from_file`: with no parameter given (`params` empty), a method that
/// needs a bank takes the statistic the file holds for it when it holds
/// exactly one; otherwise each takes `params` and its defaults (as
/// `hubnorm search --stats FILE --method is` without `--beta`).
pub fn methods_for_stats_file(
    kinds: &[MethodKind],
    params: &MethodParams,
    from_file: &[MethodSpec],
) -> Vec<MethodSpec> {
    kinds
        .iter()
        .map(|&kind| {
            let candidates: Vec<&MethodSpec> =
                from_file.iter().filter(|m| m.kind() == kind).collect();
            match (kind.needs_bank(), params.is_empty(), candidates.as_slice()) {
                (true, true, [only]) => **only,
                _ => MethodSpec::from_kind(kind, params),
            }
        })
        .collect()
}

/// The methods recorded in a `gallery_stats.parquet` file.
pub fn stats_file_methods(path: &Path) -> Result<Vec<MethodSpec>> {
    let metadata = file_metadata(path)?;
    let Some(json) = metadata.get("hubnorm.methods") else {
        return Err(HubnormError::input(
            path,
            None,
            None,
            "not a hubnorm stats file (no hubnorm.methods metadata)",
        ));
    };
    let list: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| HubnormError::input(path, None, None, format!("hubnorm.methods: {e}")))?;
    methods_from_json(&list, path, "hubnorm.methods")
}

/// Methods from a JSON list of `{"method": NAME, "parameters": {...}}` (as
/// [`methods_json`] writes them); `path` and `what` name the source in errors.
pub fn methods_from_json(
    list: &serde_json::Value,
    path: &Path,
    what: &str,
) -> Result<Vec<MethodSpec>> {
    let bad = |why: &str| HubnormError::input(path, None, None, format!("{what}: {why}"));
    let mut methods = Vec::new();
    for entry in list.as_array().ok_or_else(|| bad("not a list"))? {
        let kind: MethodKind = entry["method"]
            .as_str()
            .ok_or_else(|| bad("method name missing"))?
            .parse()?;
        let mut parameters: Vec<(String, f64)> = Vec::new();
        if let Some(object) = entry.get("parameters") {
            let object = object
                .as_object()
                .ok_or_else(|| bad("parameters must be an object"))?;
            for (name, value) in object {
                let value = value
                    .as_f64()
                    .ok_or_else(|| bad(&format!("parameter {name} of {kind} is not a number")))?;
                parameters.push((name.clone(), value));
            }
        }
        let spec = MethodSpec::with_parameters(kind, &parameters)?;
        spec.validate()?;
        methods.push(spec);
    }
    Ok(methods)
}

/// The methods of a config file (`hubnorm tune`'s `tuned.json`, or one
/// written by hand): `{"methods": [{"method": "is", "parameters": {"beta": 30}}]}`.
pub fn config_file_methods(path: &Path) -> Result<Vec<MethodSpec>> {
    let text = crate::storage::read_to_string(path)?;
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| HubnormError::input(path, None, None, format!("not JSON: {e}")))?;
    let list = config
        .get("methods")
        .ok_or_else(|| HubnormError::input(path, None, None, "no \"methods\" list"))?;
    methods_from_json(list, path, "methods")
}

/// Reads columns `names` (each of its declared type) of a stats file,
/// aligned to the gallery's rows through its ids. Every gallery item must
/// have exactly one row.
pub(crate) fn read_columns(
    path: &Path,
    index: &IdIndex,
    names: &[(String, ColumnKind)],
) -> Result<Vec<ColumnValues>> {
    let builder = crate::source::open_parquet(path)?;
    let schema = builder.schema().clone();
    let id_col = schema
        .index_of("gallery_id")
        .map_err(|_| HubnormError::input(path, None, Some("gallery_id"), "missing column"))?;
    let n = index.len();
    let mut positions = Vec::with_capacity(names.len());
    let mut out = Vec::with_capacity(names.len());
    for (name, kind) in names {
        let col = schema.index_of(name).map_err(|_| {
            // Each stored statistic with the flags that choose it.
            let available: Vec<String> = stats_file_methods(path)
                .unwrap_or_default()
                .iter()
                .map(|m| {
                    let mut flags = format!("--method {}", m.kind());
                    for p in m.method().parameters() {
                        flags.push_str(&format!(" --{} {}", p.flag, m.get(p.name) - p.flag_offset));
                    }
                    format!("{} ({flags})", m.column_prefix())
                })
                .collect();
            HubnormError::input(
                path,
                None,
                Some(name),
                format!(
                    "the stats file has no statistic for this method and parameters (it has: {}); choose one with its flags, or run `hubnorm stats` with this method and parameters",
                    available.join(", ")
                ),
            )
        })?;
        positions.push(col);
        let expected = kind.data_type();
        let actual = schema.field(col).data_type();
        out.push(match (actual, kind) {
            (DataType::Float64, ColumnKind::Float64) => ColumnValues::Float64(vec![0.0; n]),
            (DataType::Boolean, ColumnKind::Boolean) => ColumnValues::Boolean(vec![false; n]),
            (DataType::List(item), ColumnKind::ListFloat32)
                if item.data_type() == &DataType::Float32 =>
            {
                ColumnValues::ListFloat32 {
                    values: Vec::new(),
                    width: 0,
                }
            }
            (other, _) => {
                return Err(HubnormError::input(
                    path,
                    None,
                    Some(name),
                    format!("has type {other}, expected {expected}"),
                ))
            }
        });
    }
    let mut seen = vec![false; n];
    let id_type = index.ids().data_type().clone();
    let reader = builder
        .build()
        .map_err(|e| HubnormError::input(path, None, None, format!("cannot read: {e}")))?;
    let mut file_row = 0u64;
    for batch in crate::source::CheckedBatches::new(reader, path) {
        let batch = batch?;
        let ids = crate::source::normalise_ids(batch.column(id_col))?;
        let ids = if ids.data_type() == &id_type {
            ids
        } else {
            arrow::compute::cast(&ids, &id_type)?
        };
        for i in 0..batch.num_rows() {
            let row = file_row + i as u64;
            let error = |column: &str, message: String| {
                HubnormError::input(path, Some(row), Some(column), message)
            };
            if ids.is_null(i) {
                return Err(error("gallery_id", "null or unconvertible id".into()));
            }
            let id = id_at(ids.as_ref(), i);
            let g = index.find(id).ok_or_else(|| {
                error(
                    "gallery_id",
                    format!("id {id} is not in the gallery (stats from another gallery?)"),
                )
            })? as usize;
            if std::mem::replace(&mut seen[g], true) {
                return Err(error("gallery_id", format!("duplicate id {id}")));
            }
            for ((values, &col), (name, _)) in out.iter_mut().zip(&positions).zip(names) {
                let array = batch.column(col);
                if array.is_null(i) {
                    return Err(error(name, "null statistic".into()));
                }
                set_value(values, array, i, g, n).map_err(|m| error(name, m))?;
            }
        }
        file_row += batch.num_rows() as u64;
    }
    if let Some(g) = seen.iter().position(|s| !s) {
        return Err(HubnormError::input(
            path,
            None,
            Some("gallery_id"),
            format!(
                "gallery item {} has no statistics in this file (stats from another gallery?)",
                id_at(index.ids().as_ref(), g)
            ),
        ));
    }
    Ok(out)
}

/// Stores row `i` of `array` as gallery row `g` (of `n`).
fn set_value(
    values: &mut ColumnValues,
    array: &ArrayRef,
    i: usize,
    g: usize,
    n: usize,
) -> std::result::Result<(), String> {
    match values {
        ColumnValues::Float64(v) => {
            let x = array
                .as_primitive_opt::<Float64Type>()
                .ok_or("expected Float64")?
                .value(i);
            if !x.is_finite() {
                return Err("statistic is not finite".into());
            }
            v[g] = x;
        }
        ColumnValues::Boolean(v) => {
            v[g] = array.as_boolean_opt().ok_or("expected Boolean")?.value(i);
        }
        ColumnValues::ListFloat32 { values, width } => {
            let list = array.as_list_opt::<i32>().ok_or("expected List<Float32>")?;
            let item = list.value(i);
            let item = item
                .as_primitive_opt::<Float32Type>()
                .ok_or("expected List<Float32>")?;
            if values.is_empty() {
                *width = item.len();
                *values = vec![0.0; n * *width];
            } else if item.len() != *width {
                return Err(format!(
                    "list of {} values, but earlier rows have {}",
                    item.len(),
                    width
                ));
            }
            if item.values().iter().any(|x| !x.is_finite()) {
                return Err("statistic is not finite".into());
            }
            values[g * *width..(g + 1) * *width].copy_from_slice(item.values());
        }
    }
    Ok(())
}
