//! log Φ, the log of the standard normal CDF, accurate far into both tails
//! (`mp`'s scores are sums of two of them).

use std::f64::consts::{FRAC_1_SQRT_2, PI};

/// Below this, erfc(−x/√2) nears the end of f64's range (it underflows
/// near x = −38.5), and the asymptotic series is already exact to ~1e-13.
const SERIES_BELOW: f64 = -30.0;

/// log Φ(x), finite for every finite x: never the log of a Φ rounded to 0
/// (lower tail) or to 1 (upper tail).
#[inline]
pub fn log_normal_cdf(x: f64) -> f64 {
    if x >= 0.0 {
        // Φ(x) = 1 − Q(x), Q(x) = erfc(x/√2)/2 small: log1p keeps it.
        (-0.5 * libm::erfc(x * FRAC_1_SQRT_2)).ln_1p()
    } else if x > SERIES_BELOW {
        (0.5 * libm::erfc(-x * FRAC_1_SQRT_2)).ln()
    } else {
        // Φ(x) = φ(x)/|x| · (1 − 1/x² + 3/x⁴ − 15/x⁶ + 105/x⁸ − …), x → −∞.
        let t = 1.0 / (x * x);
        let series = 1.0 - t * (1.0 - t * (3.0 - t * (15.0 - t * 105.0)));
        -0.5 * x * x - (-x).ln() - 0.5 * (2.0 * PI).ln() + series.ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_known_values_in_both_tails() {
        // (x, log Φ(x)) from mpmath at 50 digits.
        let cases = [
            (0.0, -std::f64::consts::LN_2),
            (1.0, -0.172_753_779_023_449_9),
            (-1.0, -1.841_021_645_009_263_5),
            (-10.0, -53.231_285_150_512_47),
            (-29.9, -451.322_912_458_528_6),
            (-30.1, -457.329_564_416_382_3),
            (-100.0, -5_005.524_208_694_205),
            (8.0, -6.220_960_574_271_786e-16),
            (40.0, 0.0),
        ];
        for (x, want) in cases {
            let got = log_normal_cdf(x);
            let error = (got - want).abs() / want.abs().max(1e-300);
            assert!(
                error < 1e-12 || (want == 0.0 && got.abs() < 1e-300),
                "log Φ({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn is_continuous_where_the_forms_meet() {
        for x in [SERIES_BELOW, 0.0] {
            let (a, b) = (log_normal_cdf(x - 1e-9), log_normal_cdf(x + 1e-9));
            assert!((a - b).abs() < 1e-6 * a.abs().max(1e-3), "{x}: {a} vs {b}");
        }
    }
}
