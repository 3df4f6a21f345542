//! One table of many methods on the same data: quality, hubness and the
//! change from the baseline (REPORTS.md, "a comparison of methods").

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

use crate::error::Result;
use crate::report::{HubnessMeasures, KOccurrence, QualityReport};

/// Everything reported about one method's top-k lists.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodFigures {
    /// How the method is shown, e.g. `is` or `is beta=30`.
    pub label: String,
    /// The method's name (`none`, `is`, ...), or the results file's method value.
    pub method: String,
    /// Parameters as a JSON object (empty for results files of other tools).
    pub parameters: String,
    pub occurrence: KOccurrence,
    pub hubness: HubnessMeasures,
    pub quality: Option<QualityReport>,
}

impl MethodFigures {
    /// (measure, value) pairs: quality first when present, then hubness.
    pub fn values(&self) -> Vec<(String, f64)> {
        let mut values: Vec<(String, f64)> = self
            .quality
            .as_ref()
            .map(QualityReport::values)
            .unwrap_or_default();
        values.extend(
            self.hubness
                .values()
                .iter()
                .map(|(name, v)| (name.to_string(), *v)),
        );
        values
    }
}

/// Methods side by side, the baseline (the first) first, with each figure's
/// difference to the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub labels: Vec<String>,
    pub methods: Vec<String>,
    pub parameters: Vec<String>,
    /// Figure names, the same for every method.
    pub columns: Vec<String>,
    /// `values[m][c]`: method m, figure `columns[c]`.
    pub values: Vec<Vec<f64>>,
}

/// Figures the printed table shows (the Parquet file and the markdown have all).
const PRINTED: [(&str, &str, Precision); 12] = [
    ("recall_at_1", "R@1", Precision::Percent),
    ("delta_recall_at_1", "ΔR@1", Precision::SignedPercent),
    ("recall_at_5", "R@5", Precision::Percent),
    ("recall_at_10", "R@10", Precision::Percent),
    ("median_rank", "MdR", Precision::Rank),
    ("mean_rank", "MnR", Precision::Rank),
    ("mrr", "MRR", Precision::Fraction),
    ("skewness", "skew", Precision::Fraction),
    ("delta_skewness", "Δskew", Precision::Signed),
    ("max", "max N", Precision::Rank),
    ("antihub_rate", "antihub", Precision::Fraction),
    ("robin_hood", "robin hood", Precision::Fraction),
];

#[derive(Debug, Clone, Copy)]
enum Precision {
    Percent,
    SignedPercent,
    Fraction,
    Signed,
    Rank,
}

impl Precision {
    fn format(self, v: f64) -> String {
        if !v.is_finite() {
            return "-".into();
        }
        match self {
            Precision::Percent => format!("{:.2}", 100.0 * v),
            Precision::SignedPercent => format!("{:+.2}", 100.0 * v),
            Precision::Fraction => format!("{v:.3}"),
            Precision::Signed => format!("{v:+.3}"),
            Precision::Rank if v.fract() == 0.0 => format!("{v:.0}"),
            Precision::Rank => format!("{v:.1}"),
        }
    }
}

impl Comparison {
    /// The table of `figures` (the baseline first). A figure some method
    /// lacks (quality without ground truth) is NaN.
    pub fn new(figures: &[MethodFigures]) -> Self {
        let per_method: Vec<Vec<(String, f64)>> = figures.iter().map(|f| f.values()).collect();
        let mut columns: Vec<String> = Vec::new();
        for values in &per_method {
            for (name, _) in values {
                if !columns.contains(name) {
                    columns.push(name.clone());
                }
            }
        }
        let mut values: Vec<Vec<f64>> = per_method
            .iter()
            .map(|vs| {
                columns
                    .iter()
                    .map(|c| {
                        vs.iter()
                            .find(|(n, _)| n == c)
                            .map_or(f64::NAN, |(_, v)| *v)
                    })
                    .collect()
            })
            .collect();
        // Differences to the baseline, for every figure but the interval ends.
        let base: Vec<f64> = values.first().cloned().unwrap_or_default();
        let deltas: Vec<usize> = (0..columns.len())
            .filter(|&c| !columns[c].ends_with("_low") && !columns[c].ends_with("_high"))
            .collect();
        for row in &mut values {
            let extra: Vec<f64> = deltas.iter().map(|&c| row[c] - base[c]).collect();
            row.extend(extra);
        }
        let delta_names: Vec<String> = deltas
            .iter()
            .map(|&c| format!("delta_{}", columns[c]))
            .collect();
        columns.extend(delta_names);
        Comparison {
            labels: figures.iter().map(|f| f.label.clone()).collect(),
            methods: figures.iter().map(|f| f.method.clone()).collect(),
            parameters: figures.iter().map(|f| f.parameters.clone()).collect(),
            columns,
            values,
        }
    }

    fn value(&self, method: usize, column: &str) -> Option<f64> {
        let c = self.columns.iter().position(|n| n == column)?;
        Some(self.values[method][c])
    }

    /// The printed columns present in this table.
    fn printed(&self) -> Vec<(&'static str, &'static str, Precision)> {
        PRINTED
            .iter()
            .copied()
            .filter(|(name, _, _)| {
                (0..self.labels.len()).any(|m| self.value(m, name).is_some_and(f64::is_finite))
            })
            .collect()
    }

    fn cells(&self) -> (Vec<&'static str>, Vec<Vec<String>>) {
        let printed = self.printed();
        let header: Vec<&str> = std::iter::once("method")
            .chain(printed.iter().map(|p| p.1))
            .collect();
        let rows = (0..self.labels.len())
            .map(|m| {
                std::iter::once(self.labels[m].clone())
                    .chain(printed.iter().map(|(name, _, precision)| {
                        precision.format(self.value(m, name).unwrap_or(f64::NAN))
                    }))
                    .collect()
            })
            .collect();
        (header, rows)
    }

    /// An aligned text table (R@K in percent), for the terminal.
    pub fn to_text(&self) -> String {
        let (header, rows) = self.cells();
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                rows.iter()
                    .map(|r| r[c].chars().count())
                    .chain(std::iter::once(header[c].chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<&str>| -> String {
            cells
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    let pad = widths[c] - cell.chars().count();
                    if c == 0 {
                        format!("{cell}{}", " ".repeat(pad))
                    } else {
                        format!("{}{cell}", " ".repeat(pad))
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_owned()
        };
        let mut out = line(header.clone()) + "\n";
        for row in &rows {
            out += &line(row.iter().map(String::as_str).collect());
            out.push('\n');
        }
        out
    }

    /// A markdown table: the printed figures, then R@K with 95% intervals.
    pub fn to_markdown(&self) -> String {
        let (header, rows) = self.cells();
        let mut out = format!("| {} |\n", header.join(" | "));
        out += &format!("|{}\n", "---|".repeat(header.len()));
        for row in &rows {
            out += &format!("| {} |\n", row.join(" | "));
        }
        let recall: Vec<&String> = self
            .columns
            .iter()
            .filter(|c| {
                c.starts_with("recall_at_") && !c.ends_with("_low") && !c.ends_with("_high")
            })
            .collect();
        let with_intervals = recall
            .iter()
            .any(|c| self.columns.contains(&format!("{c}_low")));
        if with_intervals {
            let ks: Vec<&str> = recall.iter().map(|c| &c["recall_at_".len()..]).collect();
            out += "\nR@K (%) with 95% percentile-bootstrap intervals over queries:\n\n";
            out += &format!(
                "| method | {} |\n|---|{}\n",
                ks.iter()
                    .map(|k| format!("R@{k}"))
                    .collect::<Vec<_>>()
                    .join(" | "),
                "---|".repeat(ks.len())
            );
            for m in 0..self.labels.len() {
                let cells: Vec<String> = recall
                    .iter()
                    .map(|c| {
                        let v = self.value(m, c).unwrap_or(f64::NAN);
                        match (
                            self.value(m, &format!("{c}_low")),
                            self.value(m, &format!("{c}_high")),
                        ) {
                            (Some(lo), Some(hi)) if lo.is_finite() => {
                                format!("{:.2} [{:.2}, {:.2}]", 100.0 * v, 100.0 * lo, 100.0 * hi)
                            }
                            _ => Precision::Percent.format(v),
                        }
                    })
                    .collect();
                out += &format!("| {} | {} |\n", self.labels[m], cells.join(" | "));
            }
        }
        out
    }

    /// One row per method (`method`, `label`, `parameters`), one Float64
    /// column per figure.
    pub fn to_record_batch(&self) -> Result<RecordBatch> {
        let mut fields = vec![
            Field::new("method", DataType::Utf8, false),
            Field::new("label", DataType::Utf8, false),
            Field::new("parameters", DataType::Utf8, false),
        ];
        fields.extend(
            self.columns
                .iter()
                .map(|c| Field::new(c, DataType::Float64, true)),
        );
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(self.methods.clone())),
            Arc::new(StringArray::from(self.labels.clone())),
            Arc::new(StringArray::from(self.parameters.clone())),
        ];
        for c in 0..self.columns.len() {
            let values: Float64Array = self
                .values
                .iter()
                .map(|row| Some(row[c]).filter(|v| !v.is_nan()))
                .collect();
            columns.push(Arc::new(values));
        }
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns,
        )?)
    }
}
