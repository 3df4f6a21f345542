//! The SVG charts of the page: frames, axes and series (on the scales of
//! [`super::scale`]), and the k-occurrence small multiples, the recall panels
//! and the tuning curves drawn with them. Every chart is an `<svg>` with a
//! `data-plot` attribute naming its kind.

use std::fmt::Write as _;

use super::scale::{tick_label, Scale};
use super::text::{escape, fmt_short, recall_text, truncate};
use super::{MethodPage, PageInput, RecallBar, TuningCurve};

/// Series colours (Tableau 10): distinguishable, and readable in greyscale
/// print by lightness. Methods beyond ten cycle, with a dash pattern added.
pub(super) const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// Method names longer than this are cut in chart labels and captions (the
/// full name is in a tooltip).
const LABEL_CHARS: usize = 24;

/// One small multiple of the k-occurrence distribution.
const SMALL_MULTIPLE: Frame = Frame {
    width: 280.0,
    height: 210.0,
    left: 56.0,
    right: 12.0,
    top: 10.0,
    bottom: 40.0,
};

/// The k-occurrence distribution as small multiples: one chart per method
/// (x = N_k, y = gallery items with that N_k, log10) in a wrapping grid, all
/// on the same axes, each but the first with the baseline (the first method)
/// as a grey reference line behind its own.
pub(super) fn k_occurrence_charts(out: &mut String, page: &PageInput) {
    let frame = SMALL_MULTIPLE;
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

    out.push_str("<div class=\"grid-multiples\">\n");
    for (i, (method, pts)) in page.methods.iter().zip(&all_points).enumerate() {
        let caption = if i == 0 {
            format!("{} (baseline)", truncate(&method.name, LABEL_CHARS))
        } else {
            truncate(&method.name, LABEL_CHARS).into_owned()
        };
        w!(
            out,
            "<figure>\n<figcaption title=\"{}\">{}</figcaption>\n",
            escape(&method.name),
            escape(&caption)
        );
        svg_open(
            out,
            "k-occurrence",
            &format!("plot-k-occurrence-{i}"),
            &frame,
            &format!("k-occurrence distribution: {}", method.name),
        );
        y_axis(out, &frame, &y, "gallery items (log)", &|v| {
            tick_label(v, v)
        });
        x_axis(out, &frame, &x, "N_k (times retrieved)");
        if i > 0 {
            reference_line(out, &page.methods[0].name, &all_points[0], &x, &y);
        }
        let tips: Vec<String> = pts
            .iter()
            .map(|&(nk, items)| format!("{}: N_k = {nk}, {items} items", method.name))
            .collect();
        if series(out, i, &method.name, pts, &tips, &x, &y) == 0 {
            empty_note(out, &frame, "no k-occurrence data");
        }
        out.push_str("</svg>\n</figure>\n");
    }
    out.push_str("</div>\n");
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

/// The baseline's line, grey and without markers, behind a method's series.
fn reference_line(out: &mut String, name: &str, points: &[(f64, f64)], x: &Scale, y: &Scale) {
    let path = line_path(points, x, y);
    if !path.is_empty() {
        w!(
            out,
            "<path class=\"reference\" d=\"{path}\" fill=\"none\" stroke=\"#b0b0b0\" \
             stroke-width=\"1.5\"><title>{} (baseline)</title></path>\n",
            escape(name)
        );
    }
}

/// Rows of the recall chart, one per method.
const RECALL_ROW: f64 = 18.0;
/// Width of the method labels left of the recall panels.
const RECALL_LABELS: f64 = 150.0;
/// Space between two recall panels.
const RECALL_GAP: f64 = 44.0;

/// R@K as horizontal bars with their 95% intervals: one panel per K side by
/// side, one labelled row per method (so no legend, however many methods),
/// and the baseline's (the first method's) value as a dashed line in each
/// panel.
pub(super) fn recall_chart(out: &mut String, page: &PageInput, ks: &[usize]) {
    let width = 960.0;
    let frame = Frame {
        width,
        height: 30.0 + RECALL_ROW * page.methods.len() as f64 + 36.0,
        left: RECALL_LABELS,
        right: 24.0,
        top: 30.0,
        bottom: 36.0,
    };
    svg_open(out, "recall", "plot-recall", &frame, "recall at K");
    out.push_str("<g class=\"labels\">\n");
    for (i, method) in page.methods.iter().enumerate() {
        w!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\"><title>{}</title>{}</text>\n",
            num(RECALL_LABELS - 8.0),
            num(frame.top + RECALL_ROW * i as f64 + RECALL_ROW / 2.0 + 4.0),
            escape(&method.name),
            escape(&truncate(&method.name, LABEL_CHARS))
        );
    }
    out.push_str("</g>\n");
    let panels = ks.len() as f64;
    let panel_width =
        (frame.plot_right() - frame.left - RECALL_GAP * (panels - 1.0).max(0.0)) / panels;
    for (p, &k) in ks.iter().enumerate() {
        let x0 = frame.left + (panel_width + RECALL_GAP) * p as f64;
        let panel = Frame {
            left: x0,
            right: width - x0 - panel_width,
            ..frame
        };
        let x = Scale::linear(0.0, 1.0, x0, x0 + panel_width);
        w!(
            out,
            "<text class=\"axis-title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">R@{k}</text>\n",
            num(x0 + panel_width / 2.0),
            num(frame.top - 12.0)
        );
        x_grid(out, &panel, &x);
        x_axis_with(out, &panel, &x, "", &|v| format!("{:.0}%", v * 100.0));
        w!(
            out,
            "<line class=\"axis\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n",
            num(x0),
            num(frame.top),
            num(frame.plot_bottom())
        );
        for (i, method) in page.methods.iter().enumerate() {
            let Some(bar) = method.recall.iter().find(|r| r.k == k) else {
                continue;
            };
            let row_top = frame.top + RECALL_ROW * i as f64;
            recall_bar(
                out,
                i,
                &method.name,
                bar,
                &x,
                row_top + 3.0,
                RECALL_ROW - 6.0,
            );
        }
        let baseline = page
            .methods
            .first()
            .and_then(|m| m.recall.iter().find(|r| r.k == k));
        if let Some(bx) = baseline.and_then(|b| x.map(b.value.clamp(0.0, 1.0))) {
            w!(
                out,
                "<line class=\"reference\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" \
                 stroke=\"#444\" stroke-width=\"1\" stroke-dasharray=\"3 3\"/>\n",
                num(bx),
                num(frame.top),
                num(frame.plot_bottom())
            );
        }
    }
    out.push_str("</svg>\n");
}

/// One horizontal bar, from 0 at `x`'s origin, with its whisker, in the row
/// band `top..top + height`; a non-finite value draws nothing, a non-finite
/// bound drops only the whisker.
fn recall_bar(
    out: &mut String,
    series: usize,
    name: &str,
    bar: &RecallBar,
    x: &Scale,
    top: f64,
    height: f64,
) {
    let clamp = |v: f64| v.clamp(0.0, 1.0);
    let (Some(end), Some(zero)) = (x.map(clamp(bar.value)), x.map(0.0)) else {
        return;
    };
    w!(
        out,
        "<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\">\
         <title>{}: R@{} = {}</title></rect>\n",
        num(zero),
        num(top),
        num((end - zero).max(0.0)),
        num(height),
        colour(series),
        escape(name),
        bar.k,
        recall_text(bar)
    );
    if let (Some(lo), Some(hi)) = (x.map(clamp(bar.low)), x.map(clamp(bar.high))) {
        let cy = top + height / 2.0;
        let cap = (height * 0.4).min(6.0);
        w!(
            out,
            "<path class=\"whisker\" d=\"M{} {}H{}M{} {}V{}M{} {}V{}\" stroke=\"#222\" \
             stroke-width=\"1.2\" fill=\"none\"/>\n",
            num(lo),
            num(cy),
            num(hi),
            num(lo),
            num(cy - cap),
            num(cy + cap),
            num(hi),
            num(cy - cap),
            num(cy + cap)
        );
    }
}

pub(super) fn tuning_chart(out: &mut String, index: usize, curve: &TuningCurve) {
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
    fn plot_right(&self) -> f64 {
        self.width - self.right
    }

    fn plot_bottom(&self) -> f64 {
        self.height - self.bottom
    }
}

/// An SVG coordinate; only called with mapped (finite) values.
fn num(v: f64) -> String {
    debug_assert!(v.is_finite());
    format!("{v:.1}")
}

pub(super) fn colour(series: usize) -> &'static str {
    PALETTE[series % PALETTE.len()]
}

/// Methods past the palette reuse a colour, so their lines get dashes.
pub(super) fn dash_attr(series: usize) -> &'static str {
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
    let (log, step) = (x.log, x.step());
    let label = |v: f64| {
        if log {
            tick_label(v, v)
        } else {
            tick_label(v, step)
        }
    };
    x_axis_with(out, frame, x, title, &label);
}

/// [`x_axis`] with tick labels from `label`.
fn x_axis_with(
    out: &mut String,
    frame: &Frame,
    x: &Scale,
    title: &str,
    label: &dyn Fn(f64) -> String,
) {
    let base = frame.plot_bottom();
    out.push_str("<g class=\"x-axis\">\n");
    let (x0, x1, y) = (num(frame.left), num(frame.plot_right()), num(base));
    w!(
        out,
        "<line class=\"axis\" x1=\"{x0}\" y1=\"{y}\" x2=\"{x1}\" y2=\"{y}\"/>\n"
    );
    for v in x.ticks() {
        let Some(px) = x.map(v) else { continue };
        w!(
            out,
            "<line class=\"axis\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\
             <text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
            num(px),
            num(base),
            num(base + 5.0),
            num(base + 17.0),
            escape(&label(v))
        );
    }
    out.push_str("</g>\n");
    axis_title_x(out, frame, title);
}

/// Vertical grid lines across the plot at `x`'s ticks.
fn x_grid(out: &mut String, frame: &Frame, x: &Scale) {
    out.push_str("<g class=\"x-grid\">\n");
    for v in x.ticks() {
        let Some(px) = x.map(v) else { continue };
        w!(
            out,
            "<line class=\"grid\" x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n",
            num(px),
            num(frame.top),
            num(frame.plot_bottom())
        );
    }
    out.push_str("</g>\n");
}

fn axis_title_x(out: &mut String, frame: &Frame, title: &str) {
    if title.is_empty() {
        return;
    }
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
    let path = line_path(points, x, y);
    let mut markers = String::new();
    let mut drawn = 0;
    for (i, &(vx, vy)) in points.iter().enumerate() {
        let (Some(px), Some(py)) = (x.map(vx), y.map(vy)) else {
            continue;
        };
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

/// The SVG path data of a line through `points`; non-finite or unmappable
/// points are skipped and break the line.
fn line_path(points: &[(f64, f64)], x: &Scale, y: &Scale) -> String {
    let mut path = String::new();
    let mut pen_down = false;
    for &(vx, vy) in points {
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
    }
    path
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
