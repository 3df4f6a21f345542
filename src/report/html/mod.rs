//! A self-contained HTML page of a report: inline SVG plots, no network.
//!
//! The page shows, for the baseline and each method, the k-occurrence
//! distribution (log-scaled counts, as the hubness papers plot it), the top
//! hubs with their text and how their counts changed, R@K bars with
//! bootstrap intervals, and the tuning curves when present.

/// Everything the page shows. The first method is the baseline.
#[derive(Debug, Clone, Default)]
pub struct PageInput {
    /// Page heading, e.g. "hubnorm compare".
    pub title: String,
    /// Context lines under the heading (inputs, k, sizes).
    pub context: Vec<String>,
    /// The k of the k-occurrence counts.
    pub k: usize,
    /// Baseline first.
    pub methods: Vec<MethodPage>,
    /// The baseline's top hubs (most retrieved first), with their count under every method.
    pub top_hubs: Vec<HubRow>,
    /// One curve per (method, parameter); empty unless tuning ran.
    pub tuning: Vec<TuningCurve>,
}

/// One method's figures.
#[derive(Debug, Clone, Default)]
pub struct MethodPage {
    /// Display name, e.g. "is (beta=20)".
    pub name: String,
    /// (N_k value, number of gallery items with that N_k), ascending by N_k,
    /// only values with at least one item.
    pub histogram: Vec<(u32, u64)>,
    /// R@K with its 95% bootstrap interval; empty without ground truth.
    pub recall: Vec<RecallBar>,
    /// Hubness measures (name as in REPORTS.md, snake_case; value).
    pub measures: Vec<(String, f64)>,
}

/// R@K of one method as a fraction in [0, 1], with its interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RecallBar {
    pub k: usize,
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

/// A gallery item that is a hub under the baseline.
#[derive(Debug, Clone, Default)]
pub struct HubRow {
    pub gallery_id: String,
    /// The gallery's text column, when it has one.
    pub text: Option<String>,
    /// N_k under each method, in the order of [`PageInput::methods`].
    pub counts: Vec<u32>,
}

/// How a selection metric moves along one hyperparameter (the others at
/// their chosen values).
#[derive(Debug, Clone, Default)]
pub struct TuningCurve {
    pub method: String,
    pub parameter: String,
    /// e.g. "R@1".
    pub metric: String,
    /// (parameter value, metric value), ascending by parameter.
    pub points: Vec<(f64, f64)>,
    /// The value chosen.
    pub chosen: f64,
}

use std::borrow::Cow;
use std::fmt::Write as _;

/// `write!` into a `String`; writing to a `String` cannot fail, so the
/// `fmt::Result` carries no information.
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {{
        let _ = write!($out, $($arg)*);
    }};
}

// After the macro, so that the charts and the text helpers can use it.
mod scale;
mod svg;
mod text;

use self::text::{escape, fmt_sig4, recall_text, truncate};

/// Hub text longer than this (in characters) is cut, with an ellipsis.
const TEXT_CHARS: usize = 120;
/// Gallery ids up to this long (in characters) are kept on one line; longer
/// ones may wrap anywhere.
const ID_LINE_CHARS: usize = 24;

/// Renders the report as one self-contained HTML5 page.
///
/// Nothing is loaded from elsewhere: the CSS, the SVG plots and a tiny
/// check script are inline, and a Content-Security-Policy forbids any
/// fetch, so the page can be opened offline or attached to a ticket. All
/// user data (title, ids, text, method names) is HTML-escaped; non-finite
/// numbers are left out of the plots and shown as "n/a" in the tables.
///
/// Every plot is an `<svg>` with a `data-plot` attribute (`k-occurrence`,
/// `recall`, `tuning`). On load the script checks that each plot the page
/// should have is there and sets `document.body.dataset.rendered = "ok"`;
/// script errors are written into the element with id `errors`. It also
/// records the page's layout width and the viewport's (`data-scroll-width`
/// and `data-viewport-width` on the body), so a test can check that nothing
/// sticks out to the right.
///
/// The page stays readable with many methods: the k-occurrence distribution
/// is one small chart per method on shared axes, the recall chart one
/// labelled row per method, the measures one row per method, and the
/// top-hubs table (a column per method) scrolls sideways inside its own box
/// when it is wider than the page.
pub fn render(page: &PageInput) -> String {
    let mut expected: Vec<&str> = Vec::new();
    let mut body = String::new();

    if k_occurrence_section(&mut body, page) {
        expected.push("k-occurrence");
    }
    top_hubs_section(&mut body, page);
    if recall_section(&mut body, page) {
        expected.push("recall");
    }
    if tuning_section(&mut body, page) {
        expected.push("tuning");
    }
    measures_section(&mut body, page);

    let mut out = String::with_capacity(body.len() + 8192);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    // The browser itself enforces "no network": anything but inline
    // style and script is refused.
    out.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n",
    );
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    w!(out, "<title>{}</title>\n", escape(&page.title));
    w!(out, "<style>{CSS}</style>\n");
    // Only fixed plot names go into the script, never user data.
    let names: Vec<String> = expected.iter().map(|n| format!("\"{n}\"")).collect();
    w!(
        out,
        "<script>\nvar EXPECTED_PLOTS = [{}];\n{SCRIPT}</script>\n",
        names.join(", ")
    );
    out.push_str("</head>\n<body>\n");
    out.push_str("<div id=\"errors\" role=\"alert\"></div>\n");
    out.push_str("<header>\n");
    w!(out, "<h1>{}</h1>\n", escape(&page.title));
    if !page.context.is_empty() {
        out.push_str("<ul class=\"context\">\n");
        for line in &page.context {
            w!(out, "<li>{}</li>\n", escape(line));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</header>\n<main>\n");
    out.push_str(&body);
    out.push_str("</main>\n");
    w!(
        out,
        "<footer>hubnorm {}</footer>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION")
    );
    out
}

const CSS: &str = "
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif;
  margin: 0 auto; max-width: 1180px; padding: 1rem 1.5rem 3rem; color: #222; background: #fff; }
h1 { font-size: 1.6rem; margin: 0.5rem 0; }
h2 { font-size: 1.25rem; margin: 2rem 0 0.5rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
figure { margin: 0.5rem 0; }
figcaption { font-weight: 600; font-size: 0.95rem; margin-bottom: 0.2rem; }
.context { margin: 0; padding-left: 1.2rem; color: #555; font-size: 0.9rem; }
.note { color: #666; font-style: italic; }
.small-multiples { display: flex; flex-wrap: wrap; gap: 1rem 1.5rem; }
.grid-multiples { display: grid; grid-template-columns: repeat(auto-fill, minmax(15rem, 1fr));
  gap: 0.5rem 1.25rem; }
.grid-multiples figcaption { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.table-scroll { max-width: 100%; overflow-x: auto; }
svg { max-width: 100%; height: auto; display: block; }
svg text { font-size: 11px; fill: #333; }
svg .axis { stroke: #555; stroke-width: 1; }
svg .grid { stroke: #e6e6e6; stroke-width: 1; }
svg .axis-title { font-size: 12px; fill: #222; }
svg .empty { font-size: 13px; fill: #888; }
table { border-collapse: collapse; font-size: 0.88rem; margin: 0.5rem 0; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; vertical-align: top; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.id { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  white-space: nowrap; }
td.id.long { white-space: normal; overflow-wrap: anywhere; min-width: 12ch; }
td.text { max-width: 32rem; min-width: 12rem; }
.delta { display: block; font-size: 0.8em; }
tbody tr:nth-child(even) { background: #fafafa; }
.dec { color: #1a7f37; }
.inc { color: #c62828; }
#errors { color: #b00020; white-space: pre-wrap; font-family: monospace; }
#errors:empty { display: none; }
footer { margin-top: 3rem; color: #999; font-size: 0.8rem; }
";

/// Installs the error trap first, then checks the plots and records the
/// layout widths once loaded.
const SCRIPT: &str = r#"(function () {
  "use strict";
  var pending = [];
  function report(text) {
    var box = document.getElementById("errors");
    if (box) { box.textContent += text + "\n"; } else { pending.push(text); }
  }
  window.onerror = function (message, source, line) {
    report(String(message) + (line ? " (line " + line + ")" : ""));
    return false;
  };
  window.addEventListener("load", function () {
    var early = pending; pending = [];
    early.forEach(report);
    var missing = EXPECTED_PLOTS.filter(function (name) {
      return !document.querySelector('svg[data-plot="' + name + '"]');
    });
    if (missing.length) { report("missing plots: " + missing.join(", ")); }
    var root = document.documentElement;
    document.body.dataset.scrollWidth = String(root.scrollWidth);
    document.body.dataset.viewportWidth = String(root.clientWidth);
    var box = document.getElementById("errors");
    document.body.dataset.rendered = (box && box.textContent) ? "error" : "ok";
  });
})();
"#;

// ---------------------------------------------------------------------------
// Sections. Each returns whether it drew its plot, so the check script knows
// which plots to expect.

/// k-occurrence distribution: x = N_k, y = items with that N_k (log10), one
/// small chart per method.
fn k_occurrence_section(out: &mut String, page: &PageInput) -> bool {
    w!(
        out,
        "<section id=\"k-occurrence\">\n<h2>k-occurrence distribution (k = {})</h2>\n",
        page.k
    );
    if page.methods.is_empty() {
        out.push_str("<p class=\"note\">no methods</p>\n</section>\n");
        return false;
    }
    out.push_str(
        "<p class=\"note\">Number of gallery items retrieved exactly N<sub>k</sub> times \
         (log scale), one chart per method on the same axes; the grey line is the baseline. \
         A long right tail means hubs; a flatter, shorter tail means less hubness.</p>\n",
    );
    svg::k_occurrence_charts(out, page);
    out.push_str("</section>\n");
    true
}

/// The baseline's top hubs with each method's count and its change.
fn top_hubs_section(out: &mut String, page: &PageInput) {
    out.push_str("<section id=\"top-hubs\">\n<h2>Top hubs</h2>\n");
    if page.top_hubs.is_empty() {
        out.push_str("<p class=\"note\">no hubs</p>\n</section>\n");
        return;
    }
    let with_text = page.top_hubs.iter().any(|h| h.text.is_some());
    out.push_str(
        "<p class=\"note\">The baseline's most retrieved gallery items, with N<sub>k</sub> \
         under each method and its change from the baseline.</p>\n",
    );
    out.push_str("<div class=\"table-scroll\">\n<table class=\"hubs\">\n");
    out.push_str("<thead><tr><th>#</th><th>gallery id</th>");
    if with_text {
        out.push_str("<th>text</th>");
    }
    for method in &page.methods {
        w!(out, "<th>{}</th>", escape(&method.name));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for (rank, hub) in page.top_hubs.iter().enumerate() {
        let id_class = if hub.gallery_id.chars().count() > ID_LINE_CHARS {
            "id long"
        } else {
            "id"
        };
        w!(
            out,
            "<tr><td class=\"num\">{}</td><td class=\"{id_class}\">{}</td>",
            rank + 1,
            escape(&hub.gallery_id)
        );
        if with_text {
            let text = hub.text.as_deref().unwrap_or("");
            let shown = truncate(text, TEXT_CHARS);
            // The full text (within reason) as a tooltip when it was cut.
            let tip = match shown {
                Cow::Owned(_) => format!(" title=\"{}\"", escape(&truncate(text, 2000))),
                Cow::Borrowed(_) => String::new(),
            };
            w!(out, "<td class=\"text\"{tip}>{}</td>", escape(&shown));
        }
        let baseline = hub.counts.first().copied();
        for i in 0..page.methods.len() {
            out.push_str("<td class=\"num\">");
            match (hub.counts.get(i), baseline) {
                (None, _) => out.push_str("n/a"),
                (Some(&count), Some(base)) if i > 0 => {
                    w!(
                        out,
                        "{count} {}",
                        delta_span(i64::from(count) - i64::from(base))
                    )
                }
                (Some(&count), _) => w!(out, "{count}"),
            }
            out.push_str("</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n</div>\n</section>\n");
}

/// "(−271)" in green, "(+5)" in red, "(±0)" plain. Fewer retrievals of a
/// hub is the goal, hence green for a decrease.
fn delta_span(delta: i64) -> String {
    match delta.signum() {
        -1 => format!(
            "<span class=\"delta dec\">(\u{2212}{})</span>",
            delta.unsigned_abs()
        ),
        1 => format!("<span class=\"delta inc\">(+{delta})</span>"),
        _ => "<span class=\"delta\">(\u{b1}0)</span>".to_string(),
    }
}

/// R@K: the bars (see [`svg::recall_chart`]) and the table of their figures.
fn recall_section(out: &mut String, page: &PageInput) -> bool {
    out.push_str("<section id=\"recall\">\n<h2>Recall@K</h2>\n");
    if page.methods.iter().all(|m| m.recall.is_empty()) {
        out.push_str("<p class=\"note\">no ground truth</p>\n</section>\n");
        return false;
    }
    let mut ks: Vec<usize> = page
        .methods
        .iter()
        .flat_map(|m| m.recall.iter().map(|r| r.k))
        .collect();
    ks.sort_unstable();
    ks.dedup();
    out.push_str(
        "<p class=\"note\">Bars: R@K; whiskers: 95% bootstrap interval; dashed line: the \
         baseline.</p>\n",
    );

    svg::recall_chart(out, page, &ks);
    recall_table(out, page, &ks);
    out.push_str("</section>\n");
    true
}

/// The exact figures behind the bars, for reading off and copying.
fn recall_table(out: &mut String, page: &PageInput, ks: &[usize]) {
    out.push_str("<div class=\"table-scroll\">\n<table class=\"recall\">\n");
    out.push_str("<thead><tr><th>method</th>");
    for k in ks {
        w!(out, "<th>R@{k} (95% interval)</th>");
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for method in &page.methods {
        w!(out, "<tr><td>{}</td>", escape(&method.name));
        for &k in ks {
            match method.recall.iter().find(|r| r.k == k) {
                Some(bar) => w!(out, "<td class=\"num\">{}</td>", recall_text(bar)),
                None => out.push_str("<td class=\"num\">n/a</td>"),
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n</div>\n");
}

/// One small line chart per tuning curve, the chosen value marked.
fn tuning_section(out: &mut String, page: &PageInput) -> bool {
    if page.tuning.is_empty() {
        return false;
    }
    out.push_str("<section id=\"tuning\">\n<h2>Tuning curves</h2>\n");
    out.push_str(
        "<p class=\"note\">The selection metric along each hyperparameter, the others at \
         their chosen values; the dashed line marks the value chosen.</p>\n",
    );
    out.push_str("<div class=\"small-multiples\">\n");
    for (i, curve) in page.tuning.iter().enumerate() {
        svg::tuning_chart(out, i, curve);
    }
    out.push_str("</div>\n</section>\n");
    true
}

/// Every method's hubness measures: rows = methods, columns = measures (so
/// the table grows downwards with the methods).
fn measures_section(out: &mut String, page: &PageInput) {
    out.push_str("<section id=\"measures\">\n<h2>Hubness measures</h2>\n");
    // Columns in order of first appearance, so the REPORTS.md order survives.
    let mut columns: Vec<&str> = Vec::new();
    for method in &page.methods {
        for (name, _) in &method.measures {
            if !columns.contains(&name.as_str()) {
                columns.push(name);
            }
        }
    }
    if columns.is_empty() {
        out.push_str("<p class=\"note\">no measures</p>\n</section>\n");
        return;
    }
    out.push_str("<div class=\"table-scroll\">\n<table class=\"measures\">\n");
    out.push_str("<thead><tr><th>method</th>");
    for column in &columns {
        w!(out, "<th>{}</th>", escape(column));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for method in &page.methods {
        w!(out, "<tr><td>{}</td>", escape(&method.name));
        for column in &columns {
            let value = method
                .measures
                .iter()
                .find(|(name, _)| name == column)
                .map_or_else(|| "n/a".to_string(), |&(_, v)| fmt_sig4(v));
            w!(out, "<td class=\"num\">{}</td>", escape(&value));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n</div>\n</section>\n");
}

#[cfg(test)]
mod tests {
    use super::svg::{colour, dash_attr, PALETTE};
    use super::*;

    fn method(name: &str, histogram: Vec<(u32, u64)>, recall: Vec<RecallBar>) -> MethodPage {
        MethodPage {
            name: name.to_string(),
            histogram,
            recall,
            measures: vec![("skewness".to_string(), 3.25), ("gini".to_string(), 0.5)],
        }
    }

    fn bar(k: usize, value: f64) -> RecallBar {
        RecallBar {
            k,
            value,
            low: value - 0.02,
            high: value + 0.02,
        }
    }

    fn full_page() -> PageInput {
        PageInput {
            title: "compare".to_string(),
            context: vec!["k = 10".to_string()],
            k: 10,
            methods: vec![
                method(
                    "none",
                    vec![(0, 500), (1, 300), (10, 40), (250, 1)],
                    vec![bar(1, 0.5), bar(10, 0.8)],
                ),
                method(
                    "is",
                    vec![(0, 100), (5, 800), (20, 3)],
                    vec![bar(1, 0.55), bar(10, 0.85)],
                ),
            ],
            top_hubs: vec![HubRow {
                gallery_id: "g1".to_string(),
                text: Some("a hub".to_string()),
                counts: vec![250, 20],
            }],
            tuning: vec![TuningCurve {
                method: "is".to_string(),
                parameter: "beta".to_string(),
                metric: "R@1".to_string(),
                points: vec![(1.0, 0.5), (10.0, 0.55), (100.0, 0.52)],
                chosen: 10.0,
            }],
        }
    }

    /// The `<svg …>…</svg>` elements of one plot kind.
    fn plots<'a>(html: &'a str, kind: &str) -> Vec<&'a str> {
        let marker = format!("data-plot=\"{kind}\"");
        html.match_indices("<svg ")
            .map(|(start, _)| {
                let end = html[start..].find("</svg>").expect("closed svg") + start;
                &html[start..end]
            })
            .filter(|svg| svg.contains(&marker))
            .collect()
    }

    /// The `<g class="{class}">…</g>` element of a chart (no nested groups).
    fn group<'a>(svg: &'a str, class: &str) -> &'a str {
        let start = svg.find(&format!("<g class=\"{class}\">")).expect("group");
        let end = svg[start..].find("</g>").expect("closed group") + start;
        &svg[start..end]
    }

    fn assert_no_bad_numbers(html: &str) {
        for bad in ["NaN", "inf", "Infinity"] {
            assert!(!html.contains(bad), "{bad} in output");
        }
    }

    #[test]
    fn hostile_user_data_is_escaped_everywhere() {
        let evil = r#""><script>alert('x')</script><img src=x onerror=alert(1)>&"#;
        let mut page = full_page();
        page.title = evil.to_string();
        page.context = vec![evil.to_string()];
        page.methods[1].name = evil.to_string();
        page.methods[1].measures.push((evil.to_string(), 1.0));
        page.top_hubs[0].gallery_id = evil.to_string();
        page.top_hubs[0].text = Some(evil.repeat(10));
        page.tuning[0].method = evil.to_string();
        page.tuning[0].parameter = evil.to_string();
        page.tuning[0].metric = evil.to_string();
        let html = render(&page);
        assert!(!html.contains("<script>alert"));
        assert!(!html.contains("<img"));
        assert!(html.contains("&quot;&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
        // Exactly one script: the page's own.
        assert_eq!(html.matches("<script").count(), 1);
    }

    #[test]
    fn nan_points_are_skipped() {
        let mut page = full_page();
        page.tuning[0].points = vec![
            (1.0, 0.5),
            (2.0, 0.55),
            (3.0, f64::NAN),
            (4.0, 0.6),
            (8.0, 0.65),
            (f64::INFINITY, 0.7),
        ];
        page.tuning[0].chosen = f64::NAN;
        page.methods[0].recall[0] = RecallBar {
            k: 1,
            value: f64::NAN,
            low: f64::NAN,
            high: f64::INFINITY,
        };
        page.methods[1].recall[1].high = f64::NAN;
        page.methods[0]
            .measures
            .push(("kurtosis".to_string(), f64::INFINITY));
        let html = render(&page);
        assert_no_bad_numbers(&html);
        let tuning = plots(&html, "tuning");
        assert_eq!(tuning.len(), 1);
        // Four finite points, the NaN one breaking the line in two.
        assert_eq!(tuning[0].matches("class=\"pt\"").count(), 4);
        let d_start = tuning[0].find("class=\"line\" d=\"").expect("line path") + 16;
        let d = &tuning[0][d_start..d_start + tuning[0][d_start..].find('"').unwrap()];
        assert_eq!(d.matches('M').count(), 2, "{d}");
        assert_eq!(d.matches('L').count(), 2, "{d}");
        assert!(!tuning[0].contains("class=\"chosen\""));
        // The NaN bar is left out: three bars and two whiskers remain.
        let recall = plots(&html, "recall");
        assert_eq!(recall[0].matches("class=\"bar\"").count(), 3);
        assert_eq!(recall[0].matches("class=\"whisker\"").count(), 2);
        assert!(html.contains("<td class=\"num\">n/a</td>"));
    }

    #[test]
    fn empty_recall_gives_the_note() {
        let mut page = full_page();
        for m in &mut page.methods {
            m.recall.clear();
        }
        let html = render(&page);
        assert!(html.contains("no ground truth"));
        assert!(plots(&html, "recall").is_empty());
        assert!(html.contains("var EXPECTED_PLOTS = [\"k-occurrence\", \"tuning\"];"));
    }

    #[test]
    fn each_plot_kind_appears_with_its_data() {
        let mut page = full_page();
        page.tuning.push(TuningCurve {
            method: "nnn".to_string(),
            parameter: "alpha".to_string(),
            metric: "R@1".to_string(),
            points: vec![(0.1, 0.4), (0.5, 0.45), (1.0, 0.41)],
            chosen: 0.5,
        });
        let html = render(&page);
        assert!(html.starts_with("<!DOCTYPE html>"));
        // One small chart per method: the baseline's 4 points, then the
        // method's 3 over the baseline's grey line, on the same axes.
        let k_occ = plots(&html, "k-occurrence");
        assert_eq!(k_occ.len(), 2);
        assert!(k_occ
            .iter()
            .all(|c| c.matches("class=\"line\"").count() == 1));
        assert_eq!(k_occ[0].matches("class=\"pt\"").count(), 4);
        assert_eq!(k_occ[1].matches("class=\"pt\"").count(), 3);
        assert!(!k_occ[0].contains("class=\"reference\""));
        assert_eq!(k_occ[1].matches("class=\"reference\"").count(), 1);
        for axis in ["x-axis", "y-axis"] {
            assert_eq!(group(k_occ[0], axis), group(k_occ[1], axis), "{axis}");
        }
        assert!(html.contains("<figcaption title=\"none\">none (baseline)</figcaption>"));
        // One row of bars per method, in one panel per K, the baseline's
        // value dashed in each panel.
        let recall = plots(&html, "recall");
        assert_eq!(recall.len(), 1);
        assert_eq!(recall[0].matches("class=\"bar\"").count(), 4);
        assert_eq!(recall[0].matches("class=\"whisker\"").count(), 4);
        assert_eq!(recall[0].matches("class=\"reference\"").count(), 2);
        let tuning = plots(&html, "tuning");
        assert_eq!(tuning.len(), 2);
        assert!(tuning.iter().all(|t| t.contains("class=\"chosen\"")));
        assert!(html.contains("<figcaption>is: beta</figcaption>"));
        // beta spans 1…100 (log axis), alpha 0.1…1 (ratio 10: linear).
        assert!(tuning[0].contains("beta (log scale)"));
        assert!(!tuning[1].contains("log scale"));
        assert!(html.contains("var EXPECTED_PLOTS = [\"k-occurrence\", \"recall\", \"tuning\"];"));
        // Hub table: the decrease 250 → 20 is green.
        assert!(html.contains("20 <span class=\"delta dec\">(\u{2212}230)</span>"));
        // Measures table: a row per method, a column per measure.
        assert!(html.contains("<th>method</th><th>skewness</th><th>gini</th>"));
        assert!(html.contains(
            "<tr><td>none</td><td class=\"num\">3.250</td><td class=\"num\">0.5000</td></tr>"
        ));
        // The wide tables scroll inside their own boxes.
        assert_eq!(html.matches("<div class=\"table-scroll\">").count(), 3);
        assert_no_bad_numbers(&html);

        let mut without = full_page();
        without.tuning.clear();
        let html = render(&without);
        assert!(plots(&html, "tuning").is_empty());
        assert!(!html.contains("id=\"tuning\""));
    }

    #[test]
    fn empty_and_single_point_histograms_render() {
        let mut page = full_page();
        page.methods[0].histogram.clear();
        page.methods[1].histogram = vec![(4, 1)];
        let html = render(&page);
        assert_no_bad_numbers(&html);
        let k_occ = plots(&html, "k-occurrence");
        assert_eq!(k_occ.len(), 2);
        assert_eq!(k_occ[0].matches("class=\"pt\"").count(), 0);
        assert!(k_occ[0].contains("no k-occurrence data"));
        assert_eq!(k_occ[1].matches("class=\"pt\"").count(), 1);

        page.methods[1].histogram.clear();
        let html = render(&page);
        assert_no_bad_numbers(&html);
        assert_eq!(html.matches("no k-occurrence data").count(), 2);
    }

    #[test]
    fn increases_are_red_and_colours_cycle() {
        assert_eq!(delta_span(5), "<span class=\"delta inc\">(+5)</span>");
        assert_eq!(delta_span(0), "<span class=\"delta\">(\u{b1}0)</span>");
        assert_eq!(colour(0), colour(PALETTE.len()));
        assert_ne!(dash_attr(0), dash_attr(PALETTE.len()));
    }

    #[test]
    fn page_loads_nothing_from_elsewhere() {
        let html = render(&full_page());
        for needle in ["http:", "https:", "src=", "@import", "url("] {
            assert!(!html.contains(needle), "{needle}");
        }
    }
}
