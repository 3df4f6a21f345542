//! Scalar SQL functions over embedding lists and scores.
//!
//! Embedding arguments may be any list layout a Parquet file holds
//! (FixedSizeList, List or LargeList of Float16/32/64); they are cast once per
//! batch to a flat `List<Float32>` and read row by row from its buffer.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Float64Array, ListArray,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Float64Type};
use datafusion::common::{plan_err, Result};

use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// The rows of an embedding-list argument, cast once to `List<Float32>`.
pub(super) struct Embeddings {
    list: ListArray,
    function: &'static str,
}

impl Embeddings {
    fn from_arg(arg: &ColumnarValue, rows: usize, function: &'static str) -> Result<Self> {
        Self::from_array(&arg.to_array(rows)?, function)
    }

    /// The rows of an embedding-list array.
    pub(super) fn from_array(array: &ArrayRef, function: &'static str) -> Result<Self> {
        let list = cast(
            array,
            &DataType::List(Arc::new(Field::new_list_field(DataType::Float32, true))),
        )?;
        Ok(Embeddings {
            list: list.as_list::<i32>().clone(),
            function,
        })
    }

    fn nulls(&self) -> Option<&NullBuffer> {
        self.list.nulls()
    }

    /// Row i's values; `None` for a null row. A null value inside a row is an error.
    pub(super) fn row(&self, i: usize) -> Result<Option<&[f32]>> {
        if self.list.is_null(i) {
            return Ok(None);
        }
        let offsets = self.list.value_offsets();
        let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
        let child = self.list.values().as_primitive::<Float32Type>();
        if child.slice(start, end - start).null_count() > 0 {
            return bad_input!("{}: row {} holds a null value", self.function, i + 1);
        }
        Ok(Some(&child.values()[start..end]))
    }
}

fn is_list(t: &DataType) -> bool {
    matches!(
        t,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _)
    )
}

fn check_lists(function: &str, types: &[DataType]) -> Result<()> {
    for t in types {
        if !is_list(t) {
            return plan_err!("{function} takes embedding lists, got {t}");
        }
    }
    Ok(())
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

fn norm(a: &[f32]) -> f64 {
    dot(a, a).sqrt()
}

/// `hub_dot(a, b)` and `hub_cosine(a, b)`: the similarity of two embeddings.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Similarity {
    name: &'static str,
    cosine: bool,
    signature: Signature,
}

impl ScalarUDFImpl for Similarity {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        check_lists(self.name, arg_types)?;
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let a = Embeddings::from_arg(&args.args[0], rows, self.name)?;
        let b = Embeddings::from_arg(&args.args[1], rows, self.name)?;
        let mut out = Vec::with_capacity(rows);
        for i in 0..rows {
            let (Some(x), Some(y)) = (a.row(i)?, b.row(i)?) else {
                out.push(None);
                continue;
            };
            if x.len() != y.len() {
                return bad_input!(
                    "{}: row {} has embeddings of dimensions {} and {}",
                    self.name,
                    i + 1,
                    x.len(),
                    y.len()
                );
            }
            let d = dot(x, y);
            out.push(Some(if self.cosine {
                let n = norm(x) * norm(y);
                if n == 0.0 {
                    return bad_input!("{}: row {} has a zero vector", self.name, i + 1);
                }
                d / n
            } else {
                d
            }));
        }
        Ok(ColumnarValue::Array(Arc::new(Float64Array::from(out))))
    }
}

/// `hub_l2_normalize(v)`: the embedding divided by its L2 norm (f32 values;
/// a fixed-size list stays fixed-size).
#[derive(Debug, PartialEq, Eq, Hash)]
struct L2Normalize {
    signature: Signature,
}

impl ScalarUDFImpl for L2Normalize {
    fn name(&self) -> &str {
        "hub_l2_normalize"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        check_lists(self.name(), arg_types)?;
        let item = Arc::new(Field::new_list_field(DataType::Float32, true));
        Ok(match &arg_types[0] {
            DataType::FixedSizeList(_, d) => DataType::FixedSizeList(item, *d),
            _ => DataType::List(item),
        })
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let v = Embeddings::from_arg(&args.args[0], rows, "hub_l2_normalize")?;
        let mut values = Vec::with_capacity(v.list.values().len());
        let mut lengths = Vec::with_capacity(rows);
        for i in 0..rows {
            let row = v.row(i)?.unwrap_or(&[]);
            let n = norm(row);
            if n == 0.0 && !row.is_empty() {
                return bad_input!("hub_l2_normalize: row {} is a zero vector", i + 1);
            }
            values.extend(row.iter().map(|&x| (x as f64 / n) as f32));
            lengths.push(row.len());
        }
        let item = Arc::new(Field::new_list_field(DataType::Float32, true));
        let child = Arc::new(Float32Array::from(values));
        let out: ArrayRef = match args.return_field.data_type() {
            DataType::FixedSizeList(_, d) => {
                // Null rows still take d slots in a fixed-size list.
                let mut padded = Vec::with_capacity(rows * *d as usize);
                let mut k = 0;
                for &len in &lengths {
                    padded.extend_from_slice(&child.values()[k..k + len]);
                    padded.resize(padded.len() + (*d as usize - len), 0.0);
                    k += len;
                }
                Arc::new(FixedSizeListArray::try_new(
                    item,
                    *d,
                    Arc::new(Float32Array::from(padded)),
                    v.nulls().cloned(),
                )?)
            }
            _ => Arc::new(ListArray::try_new(
                item,
                OffsetBuffer::from_lengths(lengths),
                child,
                v.nulls().cloned(),
            )?),
        };
        Ok(ColumnarValue::Array(out))
    }
}

/// `hub_corrected_score(raw_score, correction)`: raw − h(g), the score every
/// method with a `_correction` column ranks by.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CorrectedScore {
    signature: Signature,
}

impl ScalarUDFImpl for CorrectedScore {
    fn name(&self) -> &str {
        "hub_corrected_score"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let raw = args.args[0].to_array(rows)?;
        let correction = args.args[1].to_array(rows)?;
        let out: Float64Array = raw
            .as_primitive::<Float64Type>()
            .iter()
            .zip(correction.as_primitive::<Float64Type>().iter())
            .map(|(s, h)| Some(s? - h?))
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// Every scalar function.
pub(super) fn functions() -> Vec<ScalarUDF> {
    let any2 = || Signature::any(2, Volatility::Immutable);
    vec![
        ScalarUDF::new_from_impl(Similarity {
            name: "hub_dot",
            cosine: false,
            signature: any2(),
        }),
        ScalarUDF::new_from_impl(Similarity {
            name: "hub_cosine",
            cosine: true,
            signature: any2(),
        }),
        ScalarUDF::new_from_impl(L2Normalize {
            signature: Signature::any(1, Volatility::Immutable),
        }),
        ScalarUDF::new_from_impl(CorrectedScore {
            signature: Signature::exact(
                vec![DataType::Float64, DataType::Float64],
                Volatility::Immutable,
            ),
        }),
    ]
}
