//! The scales of the charts: data values to pixels, linear or log10, with
//! round tick values and their labels.

/// Maps data values to pixels, linearly or by log10. The pixel range may
/// run backwards (y grows downwards in SVG).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Scale {
    pub(super) log: bool,
    d0: f64,
    d1: f64,
    r0: f64,
    r1: f64,
}

impl Scale {
    /// A linear scale; a degenerate or non-finite domain is widened so that
    /// mapping never divides by zero (a single point sits in the middle).
    pub(super) fn linear(d0: f64, d1: f64, r0: f64, r1: f64) -> Scale {
        let (d0, d1) = if d0.is_finite() && d1.is_finite() {
            (d0.min(d1), d0.max(d1))
        } else {
            (0.0, 1.0)
        };
        let (d0, d1) = if d1 - d0 > f64::EPSILON * d0.abs().max(1.0) {
            (d0, d1)
        } else {
            let half = (d0.abs() * 0.1).max(0.5);
            (d0 - half, d1 + half)
        };
        Scale {
            log: false,
            d0,
            d1,
            r0,
            r1,
        }
    }

    /// A log10 scale over a positive domain (non-positive bounds fall back
    /// to 1; a single value gets a decade around it).
    pub(super) fn log10(d0: f64, d1: f64, r0: f64, r1: f64) -> Scale {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        let (d0, d1) = match (ok(d0), ok(d1)) {
            (true, true) => (d0.min(d1), d0.max(d1)),
            (true, false) => (d0, d0),
            (false, true) => (d1, d1),
            (false, false) => (1.0, 1.0),
        };
        let (d0, d1) = if d1 / d0 > 1.0 + 1e-12 {
            (d0, d1)
        } else {
            (d0 / 10f64.sqrt(), d1 * 10f64.sqrt())
        };
        Scale {
            log: true,
            d0,
            d1,
            r0,
            r1,
        }
    }

    /// Widens the domain to round tick values (whole decades for log).
    pub(super) fn nice(self) -> Scale {
        if self.log {
            let d0 = 10f64.powf(self.d0.log10().floor());
            let d1 = 10f64.powf(self.d1.log10().ceil());
            let d1 = if d1 > d0 { d1 } else { d0 * 10.0 };
            Scale { d0, d1, ..self }
        } else {
            let step = nice_step(self.d1 - self.d0);
            let d0 = (self.d0 / step).floor() * step;
            let d1 = (self.d1 / step).ceil() * step;
            Scale { d0, d1, ..self }
        }
    }

    /// The pixel of `v`; `None` for non-finite values and, on a log scale,
    /// non-positive ones, so callers skip them instead of printing NaN.
    pub(super) fn map(&self, v: f64) -> Option<f64> {
        if !v.is_finite() || (self.log && v <= 0.0) {
            return None;
        }
        let t = if self.log {
            (v.log10() - self.d0.log10()) / (self.d1.log10() - self.d0.log10())
        } else {
            (v - self.d0) / (self.d1 - self.d0)
        };
        let px = self.r0 + t * (self.r1 - self.r0);
        px.is_finite().then_some(px)
    }

    /// The linear tick step (for labels' decimals); 1 on a log scale.
    pub(super) fn step(&self) -> f64 {
        if self.log {
            1.0
        } else {
            nice_step(self.d1 - self.d0)
        }
    }

    /// Tick values inside the domain: round steps, or on a log scale whole
    /// decades (with 2 and 5 in between when the domain spans few decades).
    pub(super) fn ticks(&self) -> Vec<f64> {
        let inside =
            |v: f64| v >= self.d0 * (1.0 - 1e-9) - 1e-12 && v <= self.d1 * (1.0 + 1e-9) + 1e-12;
        if self.log {
            let lo = self.d0.log10().floor() as i32;
            let hi = self.d1.log10().ceil() as i32;
            let decades = (hi - lo).max(1);
            // Thin out labels so at most ~8 decades are labelled.
            let every = (decades + 7) / 8;
            let multiples: &[f64] = if decades <= 2 {
                &[1.0, 2.0, 5.0]
            } else {
                &[1.0]
            };
            let mut ticks = Vec::new();
            for e in (lo..=hi).step_by(every as usize) {
                for m in multiples {
                    let v = m * 10f64.powi(e);
                    if inside(v) {
                        ticks.push(v);
                    }
                }
            }
            ticks
        } else {
            let step = nice_step(self.d1 - self.d0);
            let first = (self.d0 / step).ceil() as i64;
            let last = (self.d1 / step).floor() as i64;
            // Bounded: nice_step gives ~6 ticks over the domain.
            (first..=last.min(first + 50))
                .map(|i| i as f64 * step)
                .collect()
        }
    }
}

/// A round step (1, 2 or 5 × 10^n) giving about six ticks over `span`.
fn nice_step(span: f64) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / 6.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let norm = raw / magnitude;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// A tick label with as many decimals as `step` needs ("0.05", "20", "1e6").
pub(super) fn tick_label(v: f64, step: f64) -> String {
    if v.abs() >= 1e6 {
        return format!("{v:e}");
    }
    let decimals = if step > 0.0 && step.is_finite() {
        (-step.log10().floor()).clamp(0.0, 8.0) as usize
    } else {
        0
    };
    // "-0" looks like a bug; print 0.
    let v = if v.abs() < step * 1e-9 { 0.0 } else { v };
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_scale_maps_counts_monotonically() {
        // y grows downwards: larger counts get smaller pixel values.
        let y = Scale::log10(1.0, 5000.0, 400.0, 10.0).nice();
        let pixels: Vec<f64> = (1..=10_000u32)
            .map(|c| y.map(f64::from(c)).expect("positive count maps"))
            .collect();
        assert!(pixels.windows(2).all(|w| w[1] < w[0]));
        assert_eq!(y.map(1.0), Some(400.0));
        assert_eq!(y.map(10_000.0), Some(10.0));
        assert_eq!(y.map(0.0), None);
        assert_eq!(y.map(f64::NAN), None);
        assert_eq!(y.ticks(), vec![1.0, 10.0, 100.0, 1000.0, 10_000.0]);
    }

    #[test]
    fn degenerate_domains_do_not_divide_by_zero() {
        for scale in [
            Scale::linear(3.0, 3.0, 0.0, 100.0).nice(),
            Scale::linear(f64::NAN, f64::INFINITY, 0.0, 100.0).nice(),
            Scale::log10(7.0, 7.0, 0.0, 100.0).nice(),
            Scale::log10(0.0, -1.0, 0.0, 100.0).nice(),
        ] {
            assert!(scale.d1 > scale.d0, "{scale:?}");
            let mid = if scale.log {
                (scale.d0 * scale.d1).sqrt()
            } else {
                (scale.d0 + scale.d1) / 2.0
            };
            assert!(scale.map(mid).is_some_and(f64::is_finite), "{scale:?}");
            assert!(!scale.ticks().is_empty(), "{scale:?}");
        }
    }

    #[test]
    fn linear_ticks_are_round() {
        let x = Scale::linear(0.0, 287.0, 0.0, 1.0).nice();
        assert_eq!(
            x.ticks(),
            vec![0.0, 50.0, 100.0, 150.0, 200.0, 250.0, 300.0]
        );
        assert_eq!(tick_label(0.15, 0.05), "0.15");
        assert_eq!(tick_label(200.0, 50.0), "200");
    }
}
