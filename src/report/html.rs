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

/// Series colours (Tableau 10): distinguishable, and readable in greyscale
/// print by lightness. Methods beyond ten cycle, with a dash pattern added.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Hub text longer than this (in characters) is cut, with an ellipsis.
const TEXT_CHARS: usize = 120;
/// Legend labels longer than this are cut (the full name is in a tooltip).
const LEGEND_CHARS: usize = 28;

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
/// script errors are written into the element with id `errors`.
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
td.id { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; word-break: break-all; }
td.text { max-width: 32rem; }
tbody tr:nth-child(even) { background: #fafafa; }
.dec { color: #1a7f37; }
.inc { color: #c62828; }
#errors { color: #b00020; white-space: pre-wrap; font-family: monospace; }
#errors:empty { display: none; }
footer { margin-top: 3rem; color: #999; font-size: 0.8rem; }
";

/// Installs the error trap first, then checks the plots once loaded.
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
    var box = document.getElementById("errors");
    document.body.dataset.rendered = (box && box.textContent) ? "error" : "ok";
  });
})();
"#;

// ---------------------------------------------------------------------------
// Sections. Each returns whether it drew its plot, so the check script knows
// which plots to expect.

/// k-occurrence distribution: x = N_k, y = items with that N_k (log10).
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
         (log scale). A long right tail means hubs; a flatter, shorter tail means less hubness.</p>\n",
    );
    let names: Vec<&str> = page.methods.iter().map(|m| m.name.as_str()).collect();
    let frame = Frame::with_legend(900.0, 420.0, names.len());
    let all_points: Vec<Vec<(f64, f64)>> = page.methods.iter().map(histogram_points).collect();
    let (max_nk, max_items) = all_points
        .iter()
        .flatten()
        .fold((0.0, 1.0), |(nk, items): (f64, f64), &(x, y)| {
            (nk.max(x), items.max(y))
        });
    // N_k starts at 0 (never retrieved); at least [0, 1] so an empty chart has an axis.
    let x = Scale::linear(0.0, max_nk.max(1.0), frame.left, frame.plot_right()).nice();
    let y = Scale::log10(1.0, max_items, frame.plot_bottom(), frame.top).nice();

    svg_open(
        out,
        "k-occurrence",
        "plot-k-occurrence",
        &frame,
        "k-occurrence distribution",
    );
    y_axis(out, &frame, &y, "gallery items (log scale)", &|v| {
        tick_label(v, v)
    });
    x_axis(out, &frame, &x, "N_k (times retrieved)");
    let mut drawn = 0;
    for (i, (method, pts)) in page.methods.iter().zip(&all_points).enumerate() {
        let tips: Vec<String> = pts
            .iter()
            .map(|&(nk, items)| format!("{}: N_k = {nk}, {items} items", method.name))
            .collect();
        drawn += series(out, i, &method.name, pts, &tips, &x, &y);
    }
    if drawn == 0 {
        empty_note(out, &frame, "no k-occurrence data");
    }
    legend(out, &frame, &names);
    out.push_str("</svg>\n</section>\n");
    true
}

/// A method's histogram as plot points, without zero counts (which cannot
/// sit on a log axis, and are not in the data anyway).
fn histogram_points(method: &MethodPage) -> Vec<(f64, f64)> {
    method
        .histogram
        .iter()
        .filter(|&&(_, items)| items > 0)
        .map(|&(nk, items)| (f64::from(nk), items as f64))
        .collect()
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
    out.push_str("<table class=\"hubs\">\n<thead><tr><th>#</th><th>gallery id</th>");
    if with_text {
        out.push_str("<th>text</th>");
    }
    for method in &page.methods {
        w!(out, "<th>{}</th>", escape(&method.name));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for (rank, hub) in page.top_hubs.iter().enumerate() {
        w!(
            out,
            "<tr><td class=\"num\">{}</td><td class=\"id\">{}</td>",
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
    out.push_str("</tbody>\n</table>\n</section>\n");
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

/// R@K as grouped bars (groups by K, one bar per method) with 95% intervals.
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
    out.push_str("<p class=\"note\">Bars: R@K; whiskers: 95% bootstrap interval.</p>\n");

    let names: Vec<&str> = page.methods.iter().map(|m| m.name.as_str()).collect();
    let frame = Frame::with_legend(900.0, 380.0, names.len());
    let y = Scale::linear(0.0, 1.0, frame.plot_bottom(), frame.top);
    svg_open(out, "recall", "plot-recall", &frame, "recall at K");
    y_axis(out, &frame, &y, "recall", &|v| format!("{:.0}%", v * 100.0));

    // Categorical x: one slot per K, bars fill 80% of it.
    let slot = (frame.plot_right() - frame.left) / ks.len() as f64;
    let bar_w = slot * 0.8 / page.methods.len() as f64;
    let base = frame.plot_bottom();
    w!(
        out,
        "<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n",
        num(frame.left),
        num(base),
        num(frame.plot_right()),
        num(base)
    );
    for (g, &k) in ks.iter().enumerate() {
        let slot_x = frame.left + slot * g as f64;
        w!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">R@{k}</text>\n",
            num(slot_x + slot / 2.0),
            num(base + 16.0)
        );
        for (i, method) in page.methods.iter().enumerate() {
            let Some(bar) = method.recall.iter().find(|r| r.k == k) else {
                continue;
            };
            let bx = slot_x + slot * 0.1 + bar_w * i as f64;
            recall_bar(out, i, &method.name, bar, bx, bar_w, &y);
        }
    }
    axis_title_x(out, &frame, "K");
    legend(out, &frame, &names);
    out.push_str("</svg>\n");
    recall_table(out, page, &ks);
    out.push_str("</section>\n");
    true
}

/// One bar with its whisker; a non-finite value draws nothing, a
/// non-finite bound drops only the whisker.
fn recall_bar(
    out: &mut String,
    series: usize,
    name: &str,
    bar: &RecallBar,
    x: f64,
    width: f64,
    y: &Scale,
) {
    let clamp = |v: f64| v.clamp(0.0, 1.0);
    let (Some(top), Some(zero)) = (y.map(clamp(bar.value)), y.map(0.0)) else {
        return;
    };
    w!(
        out,
        "<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\">\
         <title>{}: R@{} = {}</title></rect>\n",
        num(x),
        num(top),
        num((width - 1.0).max(1.0)),
        num((zero - top).max(0.0)),
        colour(series),
        escape(name),
        bar.k,
        recall_text(bar)
    );
    if let (Some(lo), Some(hi)) = (y.map(clamp(bar.low)), y.map(clamp(bar.high))) {
        let cx = x + width / 2.0;
        let cap = (width * 0.25).min(6.0);
        w!(
            out,
            "<path class=\"whisker\" d=\"M{} {}V{}M{} {}H{}M{} {}H{}\" stroke=\"#222\" \
             stroke-width=\"1.2\" fill=\"none\"/>\n",
            num(cx),
            num(lo),
            num(hi),
            num(cx - cap),
            num(lo),
            num(cx + cap),
            num(cx - cap),
            num(hi),
            num(cx + cap)
        );
    }
}

/// The exact figures behind the bars, for reading off and copying.
fn recall_table(out: &mut String, page: &PageInput, ks: &[usize]) {
    out.push_str("<table class=\"recall\">\n<thead><tr><th>method</th>");
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
    out.push_str("</tbody>\n</table>\n");
}

/// "85.2% [83.1–87.0]", with "n/a" for non-finite parts.
fn recall_text(bar: &RecallBar) -> String {
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
        tuning_chart(out, i, curve);
    }
    out.push_str("</div>\n</section>\n");
    true
}

fn tuning_chart(out: &mut String, index: usize, curve: &TuningCurve) {
    let title = format!("{}: {}", curve.method, curve.parameter);
    let pts = &curve.points;
    let finite: Vec<(f64, f64)> = pts
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    let (x_min, x_max) = min_max(finite.iter().map(|p| p.0));
    let (y_min, y_max) = min_max(finite.iter().map(|p| p.1));
    // A log axis when the values span decades (e.g. beta 1…1000), as a
    // grid search over such a parameter is usually geometric.
    let log_x = !finite.is_empty() && x_min > 0.0 && x_max / x_min >= 20.0;
    let chosen = curve.chosen;
    let chosen_ok = chosen.is_finite() && (!log_x || chosen > 0.0);
    let (x_lo, x_hi) = if chosen_ok && !finite.is_empty() {
        (x_min.min(chosen), x_max.max(chosen))
    } else if chosen_ok {
        (chosen, chosen)
    } else {
        (x_min, x_max)
    };

    let frame = Frame {
        width: 380.0,
        height: 260.0,
        left: 66.0,
        right: 14.0,
        top: 14.0,
        bottom: 42.0,
    };
    let x = if log_x {
        // Not widened to whole decades: a grid of 1…300 would waste a third
        // of a small chart on 300…1000.
        Scale::log10(x_lo, x_hi, frame.left, frame.plot_right())
    } else {
        Scale::linear(x_lo, x_hi, frame.left, frame.plot_right()).nice()
    };
    let pad = (y_max - y_min) * 0.05;
    let y = Scale::linear(y_min - pad, y_max + pad, frame.plot_bottom(), frame.top).nice();

    w!(
        out,
        "<figure>\n<figcaption>{}</figcaption>\n",
        escape(&title)
    );
    svg_open(
        out,
        "tuning",
        &format!("plot-tuning-{index}"),
        &frame,
        &title,
    );
    y_axis(out, &frame, &y, &curve.metric, &|v| tick_label(v, y.step()));
    let x_title = if log_x {
        format!("{} (log scale)", curve.parameter)
    } else {
        curve.parameter.clone()
    };
    x_axis(out, &frame, &x, &x_title);
    if chosen_ok {
        chosen_marker(out, &frame, &x, &y, curve);
    }
    let tips: Vec<String> = pts
        .iter()
        .map(|&(px, py)| {
            format!(
                "{} = {}: {} = {}",
                curve.parameter,
                fmt_short(px),
                curve.metric,
                fmt_short(py)
            )
        })
        .collect();
    if series(out, 0, &title, pts, &tips, &x, &y) == 0 {
        empty_note(out, &frame, "no finite points");
    }
    out.push_str("</svg>\n</figure>\n");
}

/// Dashed vertical line at the chosen value, with its label.
fn chosen_marker(out: &mut String, frame: &Frame, x: &Scale, y: &Scale, curve: &TuningCurve) {
    let Some(cx) = x.map(curve.chosen) else {
        return;
    };
    w!(
        out,
        "<line class=\"chosen\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#c62828\" \
         stroke-width=\"1.2\" stroke-dasharray=\"4 3\"/>\n",
        num(cx),
        num(frame.plot_bottom()),
        num(frame.top)
    );
    // Keep the label inside the plot: anchor it left of the line near the right edge.
    let anchor = if cx > frame.plot_right() - 70.0 {
        "end"
    } else {
        "start"
    };
    let dx = if anchor == "end" { -4.0 } else { 4.0 };
    w!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"{anchor}\" fill=\"#c62828\">chosen {}</text>\n",
        num(cx + dx),
        num(frame.top + 11.0),
        escape(&fmt_short(curve.chosen))
    );
    // Ring the measured point at the chosen value, if there is one.
    let at = curve.points.iter().find(|(px, py)| {
        py.is_finite() && (*px - curve.chosen).abs() <= 1e-9 * curve.chosen.abs().max(1.0)
    });
    if let Some(&(px, py)) = at {
        if let (Some(mx), Some(my)) = (x.map(px), y.map(py)) {
            w!(
                out,
                "<circle class=\"chosen-point\" cx=\"{}\" cy=\"{}\" r=\"6\" fill=\"none\" \
                 stroke=\"#c62828\" stroke-width=\"1.5\"/>\n",
                num(mx),
                num(my)
            );
        }
    }
}

/// Every method's hubness measures: rows = measures, columns = methods.
fn measures_section(out: &mut String, page: &PageInput) {
    out.push_str("<section id=\"measures\">\n<h2>Hubness measures</h2>\n");
    // Rows in order of first appearance, so the REPORTS.md order survives.
    let mut rows: Vec<&str> = Vec::new();
    for method in &page.methods {
        for (name, _) in &method.measures {
            if !rows.contains(&name.as_str()) {
                rows.push(name);
            }
        }
    }
    if rows.is_empty() {
        out.push_str("<p class=\"note\">no measures</p>\n</section>\n");
        return;
    }
    out.push_str("<table class=\"measures\">\n<thead><tr><th>measure</th>");
    for method in &page.methods {
        w!(out, "<th>{}</th>", escape(&method.name));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        w!(out, "<tr><td>{}</td>", escape(row));
        for method in &page.methods {
            let value = method
                .measures
                .iter()
                .find(|(name, _)| name == row)
                .map_or_else(|| "n/a".to_string(), |&(_, v)| fmt_sig4(v));
            w!(out, "<td class=\"num\">{}</td>", escape(&value));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n</section>\n");
}

// ---------------------------------------------------------------------------
// Plot building blocks.

/// A chart's size and the margins around its plot area, in pixels.
#[derive(Debug, Clone, Copy)]
struct Frame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Frame {
    /// A chart with a legend column on the right, tall enough for every entry.
    fn with_legend(width: f64, height: f64, entries: usize) -> Frame {
        let top = 16.0;
        let needed = top + 18.0 * entries as f64 + 50.0;
        Frame {
            width,
            height: height.max(needed),
            left: 64.0,
            right: 200.0,
            top,
            bottom: 46.0,
        }
    }

    fn plot_right(&self) -> f64 {
        self.width - self.right
    }

    fn plot_bottom(&self) -> f64 {
        self.height - self.bottom
    }
}

/// Maps data values to pixels, linearly or by log10. The pixel range may
/// run backwards (y grows downwards in SVG).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scale {
    log: bool,
    d0: f64,
    d1: f64,
    r0: f64,
    r1: f64,
}

impl Scale {
    /// A linear scale; a degenerate or non-finite domain is widened so that
    /// mapping never divides by zero (a single point sits in the middle).
    fn linear(d0: f64, d1: f64, r0: f64, r1: f64) -> Scale {
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
    fn log10(d0: f64, d1: f64, r0: f64, r1: f64) -> Scale {
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
    fn nice(self) -> Scale {
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
    fn map(&self, v: f64) -> Option<f64> {
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
    fn step(&self) -> f64 {
        if self.log {
            1.0
        } else {
            nice_step(self.d1 - self.d0)
        }
    }

    /// Tick values inside the domain: round steps, or on a log scale whole
    /// decades (with 2 and 5 in between when the domain spans few decades).
    fn ticks(&self) -> Vec<f64> {
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
fn tick_label(v: f64, step: f64) -> String {
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

/// A value with four significant digits ("0.4231", "5.123", "312"), in
/// exponent form when very small or large; "n/a" when not finite.
fn fmt_sig4(v: f64) -> String {
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
fn fmt_short(v: f64) -> String {
    let s = fmt_sig4(v);
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// An SVG coordinate; only called with mapped (finite) values.
fn num(v: f64) -> String {
    debug_assert!(v.is_finite());
    format!("{v:.1}")
}

fn colour(series: usize) -> &'static str {
    PALETTE[series % PALETTE.len()]
}

/// Methods past the palette reuse a colour, so their lines get dashes.
fn dash_attr(series: usize) -> &'static str {
    if series >= PALETTE.len() {
        " stroke-dasharray=\"6 3\""
    } else {
        ""
    }
}

/// Opens a chart's `<svg>` with its `data-plot` kind and `id`.
fn svg_open(out: &mut String, plot: &str, id: &str, frame: &Frame, label: &str) {
    w!(
        out,
        "<svg id=\"{}\" data-plot=\"{}\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" \
         role=\"img\" aria-label=\"{}\">\n",
        escape(id),
        escape(plot),
        num(frame.width),
        num(frame.height),
        num(frame.width),
        num(frame.height),
        escape(label)
    );
}

/// Left axis: grid lines across the plot, tick labels, and the title.
fn y_axis(out: &mut String, frame: &Frame, y: &Scale, title: &str, label: &dyn Fn(f64) -> String) {
    out.push_str("<g class=\"y-axis\">\n");
    for v in y.ticks() {
        let Some(py) = y.map(v) else { continue };
        let (x0, x1, y) = (num(frame.left), num(frame.plot_right()), num(py));
        w!(
            out,
            "<line class=\"grid\" x1=\"{x0}\" y1=\"{y}\" x2=\"{x1}\" y2=\"{y}\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            num(frame.left - 6.0),
            num(py + 4.0),
            escape(&label(v))
        );
    }
    w!(
        out,
        "<line class=\"axis\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n",
        num(frame.left),
        num(frame.top),
        num(frame.plot_bottom())
    );
    let cy = (frame.top + frame.plot_bottom()) / 2.0;
    w!(
        out,
        "<text class=\"axis-title\" transform=\"translate({} {}) rotate(-90)\" \
         text-anchor=\"middle\">{}</text>\n</g>\n",
        num(16.0),
        num(cy),
        escape(title)
    );
}

/// Bottom axis: the line, tick marks with labels, and the title.
fn x_axis(out: &mut String, frame: &Frame, x: &Scale, title: &str) {
    let base = frame.plot_bottom();
    out.push_str("<g class=\"x-axis\">\n");
    let (x0, x1, y) = (num(frame.left), num(frame.plot_right()), num(base));
    w!(
        out,
        "<line class=\"axis\" x1=\"{x0}\" y1=\"{y}\" x2=\"{x1}\" y2=\"{y}\"/>\n"
    );
    let step = x.step();
    for v in x.ticks() {
        let Some(px) = x.map(v) else { continue };
        let label = if x.log {
            tick_label(v, v)
        } else {
            tick_label(v, step)
        };
        w!(
            out,
            "<line class=\"axis\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\
             <text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
            num(px),
            num(base),
            num(base + 5.0),
            num(base + 17.0),
            escape(&label)
        );
    }
    out.push_str("</g>\n");
    axis_title_x(out, frame, title);
}

fn axis_title_x(out: &mut String, frame: &Frame, title: &str) {
    w!(
        out,
        "<text class=\"axis-title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        num((frame.left + frame.plot_right()) / 2.0),
        num(frame.height - 8.0),
        escape(title)
    );
}

/// One series as a line through markers. Non-finite or unmappable points
/// are skipped and break the line. Returns the number of markers drawn.
fn series(
    out: &mut String,
    index: usize,
    name: &str,
    points: &[(f64, f64)],
    tips: &[String],
    x: &Scale,
    y: &Scale,
) -> usize {
    let mut path = String::new();
    let mut markers = String::new();
    let mut pen_down = false;
    let mut drawn = 0;
    for (i, &(vx, vy)) in points.iter().enumerate() {
        let (Some(px), Some(py)) = (x.map(vx), y.map(vy)) else {
            pen_down = false;
            continue;
        };
        w!(
            path,
            "{}{} {}",
            if pen_down { "L" } else { "M" },
            num(px),
            num(py)
        );
        pen_down = true;
        drawn += 1;
        let tip = tips.get(i).map(String::as_str).unwrap_or("");
        w!(
            markers,
            "<circle class=\"pt\" cx=\"{}\" cy=\"{}\" r=\"2.5\"><title>{}</title></circle>",
            num(px),
            num(py),
            escape(tip)
        );
    }
    let c = colour(index);
    w!(
        out,
        "<g class=\"series\" data-series=\"{}\" fill=\"{c}\">\n",
        escape(name)
    );
    if !path.is_empty() {
        w!(
            out,
            "<path class=\"line\" d=\"{path}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"1.5\"{}/>\n",
            dash_attr(index)
        );
    }
    out.push_str(&markers);
    out.push_str("\n</g>\n");
    drawn
}

/// Legend in the right margin: a swatch and the (shortened) name per series.
fn legend(out: &mut String, frame: &Frame, names: &[&str]) {
    let x = frame.plot_right() + 16.0;
    out.push_str("<g class=\"legend\">\n");
    for (i, name) in names.iter().enumerate() {
        let y = frame.top + 18.0 * i as f64;
        let (c, dash, mid) = (colour(i), dash_attr(i), num(y + 6.0));
        w!(
            out,
            "<g><title>{}</title><line x1=\"{}\" y1=\"{mid}\" x2=\"{}\" y2=\"{mid}\" \
             stroke=\"{c}\" stroke-width=\"3\"{dash}/>\
             <circle cx=\"{}\" cy=\"{mid}\" r=\"3\" fill=\"{c}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text></g>\n",
            escape(name),
            num(x),
            num(x + 20.0),
            num(x + 10.0),
            num(x + 26.0),
            num(y + 10.0),
            escape(&truncate(name, LEGEND_CHARS))
        );
    }
    out.push_str("</g>\n");
}

/// A grey note in the middle of an empty plot.
fn empty_note(out: &mut String, frame: &Frame, text: &str) {
    w!(
        out,
        "<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        num((frame.left + frame.plot_right()) / 2.0),
        num((frame.top + frame.plot_bottom()) / 2.0),
        escape(text)
    );
}

/// The smallest and largest of the values (1, 1 when there are none, a
/// harmless domain the scales widen).
fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo <= hi {
        (lo, hi)
    } else {
        (1.0, 1.0)
    }
}

// ---------------------------------------------------------------------------
// Text.

/// Escapes text for HTML content and quoted attribute values.
fn escape(s: &str) -> Cow<'_, str> {
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
fn truncate(s: &str, max: usize) -> Cow<'_, str> {
    if s.chars().count() <= max {
        return Cow::Borrowed(s);
    }
    let kept: String = s.chars().take(max.saturating_sub(1)).collect();
    Cow::Owned(format!("{}\u{2026}", kept.trim_end()))
}

#[cfg(test)]
mod tests {
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

    fn assert_no_bad_numbers(html: &str) {
        for bad in ["NaN", "inf", "Infinity"] {
            assert!(!html.contains(bad), "{bad} in output");
        }
    }

    #[test]
    fn escape_replaces_every_special_character() {
        assert_eq!(
            escape(r#"<b>&"'</b>"#),
            "&lt;b&gt;&amp;&quot;&#39;&lt;/b&gt;"
        );
        assert!(matches!(escape("plain"), Cow::Borrowed("plain")));
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
    fn long_text_is_truncated_with_an_ellipsis() {
        let long = "é".repeat(500);
        let cut = truncate(&long, TEXT_CHARS);
        assert_eq!(cut.chars().count(), TEXT_CHARS);
        assert!(cut.ends_with('\u{2026}'));
        assert_eq!(truncate("short", TEXT_CHARS), "short");
    }

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
        let k_occ = plots(&html, "k-occurrence");
        assert_eq!(k_occ.len(), 1);
        assert_eq!(k_occ[0].matches("class=\"line\"").count(), 2);
        assert_eq!(k_occ[0].matches("class=\"pt\"").count(), 7);
        let recall = plots(&html, "recall");
        assert_eq!(recall.len(), 1);
        assert_eq!(recall[0].matches("class=\"bar\"").count(), 4);
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
        // Measures table.
        assert!(html.contains("<td>skewness</td><td class=\"num\">3.250</td>"));
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
        assert_eq!(
            plots(&html, "k-occurrence")[0]
                .matches("class=\"pt\"")
                .count(),
            1
        );

        page.methods[1].histogram.clear();
        let html = render(&page);
        assert_no_bad_numbers(&html);
        assert!(html.contains("no k-occurrence data"));
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
