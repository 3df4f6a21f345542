//! Streaming log-sum-exp: the mergeable state behind inverted softmax.

/// log Σ exp(xᵢ) over the values folded in so far, kept as (running max,
/// Σ exp(xᵢ − max)) in f64. `Default` is the empty set (identity of
/// [`LogSumExp::merge`]); `merge` is associative and commutative up to
/// floating-point rounding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogSumExp {
    /// Largest value seen (−∞ when empty).
    pub max: f64,
    /// Σ exp(xᵢ − max) (0 when empty).
    pub sum: f64,
}

impl Default for LogSumExp {
    fn default() -> Self {
        LogSumExp {
            max: f64::NEG_INFINITY,
            sum: 0.0,
        }
    }
}

impl LogSumExp {
    /// Folds in one value.
    pub fn push(&mut self, x: f64) {
        self.merge(&LogSumExp { max: x, sum: 1.0 });
    }

    /// Combines two partial states.
    pub fn merge(&mut self, other: &LogSumExp) {
        if other.sum == 0.0 {
            return;
        }
        if self.sum == 0.0 {
            *self = *other;
        } else if other.max > self.max {
            self.sum = self.sum * (self.max - other.max).exp() + other.sum;
            self.max = other.max;
        } else {
            self.sum += other.sum * (other.max - self.max).exp();
        }
    }

    /// log Σ exp(xᵢ); −∞ for the empty set.
    pub fn value(&self) -> f64 {
        if self.sum == 0.0 {
            f64::NEG_INFINITY
        } else {
            self.max + self.sum.ln()
        }
    }

    /// Whether nothing has been folded in.
    pub fn is_empty(&self) -> bool {
        self.sum == 0.0
    }
}

/// Raises per-column running maxima (kept structure-of-arrays, with their
/// sums) to `scale · tile_max[j]` where that is larger, rescaling the sums,
/// and writes each column's max as the f32 `shift` the exp epilogue
/// subtracts. The new max is an f32 value (rounded as the exp argument is),
/// so every sum stays exactly relative to its stored max.
pub(crate) fn raise_column_maxima(
    tile_max: &[f32],
    scale: f32,
    max: &mut [f64],
    sum: &mut [f64],
    shift: &mut [f32],
) {
    for (((&m, max), sum), shift) in tile_max.iter().zip(max).zip(sum).zip(shift) {
        let candidate = (scale * m) as f64;
        if candidate > *max {
            if *sum != 0.0 {
                *sum *= (*max - candidate).exp();
            }
            *max = candidate;
        }
        *shift = *max as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_matches_direct_formula() {
        let xs = [3.0, -1.0, 700.0, 699.5, -20.0];
        let mut s = LogSumExp::default();
        xs.iter().for_each(|&x| s.push(x));
        let m = 700.0f64;
        let direct = m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        assert!((s.value() - direct).abs() < 1e-12);
        assert_eq!(LogSumExp::default().value(), f64::NEG_INFINITY);
    }
}
