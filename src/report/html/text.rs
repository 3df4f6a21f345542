//! Text for the page and its charts: HTML escaping, truncation and number
//! formatting.

use std::borrow::Cow;

use super::RecallBar;

/// Escapes text for HTML content and quoted attribute values.
pub(super) fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(['&', '<', '>', '"', '\'']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// At most `max` characters (not bytes, so UTF-8 is never split), the last
/// one an ellipsis when cut.
pub(super) fn truncate(s: &str, max: usize) -> Cow<'_, str> {
    if s.chars().count() <= max {
        return Cow::Borrowed(s);
    }
    let kept: String = s.chars().take(max.saturating_sub(1)).collect();
    Cow::Owned(format!("{}\u{2026}", kept.trim_end()))
}

/// A value with four significant digits ("0.4231", "5.123", "312"), in
/// exponent form when very small or large; "n/a" when not finite.
pub(super) fn fmt_sig4(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_string();
    }
    if v == 0.0 {
        // Also turns -0 into 0.
        return "0".to_string();
    }
    if v == v.trunc() && v.abs() < 1e9 {
        return format!("{v:.0}");
    }
    let magnitude = v.abs().log10().floor() as i32;
    if !(-3..6).contains(&magnitude) {
        return format!("{v:.3e}");
    }
    let decimals = (3 - magnitude).max(0) as usize;
    format!("{v:.decimals$}")
}

/// [`fmt_sig4`] without trailing zeros ("0.5", not "0.5000"), for labels.
pub(super) fn fmt_short(v: f64) -> String {
    let s = fmt_sig4(v);
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// "85.2% [83.1–87.0]", with "n/a" for non-finite parts.
pub(super) fn recall_text(bar: &RecallBar) -> String {
    let pct = |v: f64| {
        if v.is_finite() {
            format!("{:.1}", v * 100.0)
        } else {
            "n/a".to_string()
        }
    };
    if !bar.value.is_finite() {
        return "n/a".to_string();
    }
    if bar.low.is_finite() || bar.high.is_finite() {
        format!(
            "{}% [{}\u{2013}{}]",
            pct(bar.value),
            pct(bar.low),
            pct(bar.high)
        )
    } else {
        format!("{}%", pct(bar.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::html::TEXT_CHARS;

    #[test]
    fn escape_replaces_every_special_character() {
        assert_eq!(
            escape(r#"<b>&"'</b>"#),
            "&lt;b&gt;&amp;&quot;&#39;&lt;/b&gt;"
        );
        assert!(matches!(escape("plain"), Cow::Borrowed("plain")));
    }

    #[test]
    fn long_text_is_truncated_with_an_ellipsis() {
        let long = "é".repeat(500);
        let cut = truncate(&long, TEXT_CHARS);
        assert_eq!(cut.chars().count(), TEXT_CHARS);
        assert!(cut.ends_with('\u{2026}'));
        assert_eq!(truncate("short", TEXT_CHARS), "short");
    }

    #[test]
    fn four_significant_digits() {
        assert_eq!(fmt_sig4(0.423_123), "0.4231");
        assert_eq!(fmt_sig4(5.123_45), "5.123");
        assert_eq!(fmt_sig4(312.0), "312");
        assert_eq!(fmt_sig4(-0.0), "0");
        assert_eq!(fmt_sig4(0.000_012_34), "1.234e-5");
        assert_eq!(fmt_sig4(f64::NAN), "n/a");
        assert_eq!(fmt_sig4(f64::NEG_INFINITY), "n/a");
        assert_eq!(fmt_sig4(0.5), "0.5000");
        assert_eq!(fmt_short(0.5), "0.5");
        assert_eq!(fmt_short(20.0), "20");
        assert_eq!(fmt_short(1.5e-5), "1.500e-5");
    }
}
