//! The HTML report in a real browser: Chromium (headless) loads the page
//! from disk, runs its check script, and the test reads back the DOM, the
//! browser's log and a screenshot.
//!
//! Skipped (with a note) when no Chromium is on PATH, unless
//! `HUBNORM_REQUIRE_CHROMIUM=1`, which makes a missing browser a failure.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hubnorm::report::html::{render, HubRow, MethodPage, PageInput, RecallBar, TuningCurve};

/// Chromium never gets longer than this; the test fails instead of hanging.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);

/// Text with every character HTML treats specially.
const HOSTILE: &str = r#"<b>bold</b> & "double" 'single'"#;

/// A k-occurrence histogram with a long right tail up to `max_nk`: most
/// items retrieved a few times, a handful of hubs retrieved hundreds of times.
fn histogram(max_nk: u32, antihubs: u64, decay: f64) -> Vec<(u32, u64)> {
    let mut h: Vec<(u32, u64)> = (0..=max_nk)
        .filter_map(|nk| {
            let items = if nk == 0 {
                antihubs
            } else {
                (3000.0 * (-(f64::from(nk)) / decay).exp()).round() as u64
            };
            (items > 0).then_some((nk, items))
        })
        .collect();
    // The tail: single hubs far out, as in real hubness.
    for nk in [max_nk / 2, max_nk * 3 / 4, max_nk] {
        if !h.iter().any(|&(v, _)| v == nk) {
            h.push((nk, 1));
        }
    }
    h.sort_unstable();
    h
}

fn recall(values: [f64; 3]) -> Vec<RecallBar> {
    [1, 5, 10]
        .into_iter()
        .zip(values)
        .map(|(k, value)| RecallBar {
            k,
            value,
            low: value - 0.015,
            high: (value + 0.015).min(1.0),
        })
        .collect()
}

fn measures(skewness: f64, gini: f64, antihubs: f64) -> Vec<(String, f64)> {
    vec![
        ("skewness".into(), skewness),
        ("kurtosis".into(), skewness * skewness * 2.5),
        ("max".into(), 300.0),
        ("antihub_rate".into(), antihubs),
        ("gini".into(), gini),
        ("robin_hood".into(), gini * 0.7),
    ]
}

/// The method names of a comparison of every method, and more (17).
const MANY_METHODS: [&str; 17] = [
    "none",
    "is",
    "dis",
    "nnn",
    "csls",
    "gc",
    "dn",
    "dual-is",
    "dual-dis",
    "sn",
    "dbsn",
    "dsl",
    "sinkhorn-pp",
    "is (beta=50)",
    "nnn (alpha=0.5, k=64)",
    "a method with a much longer name than the others",
    "dis (beta=20, activation_k=3)",
];

/// Three methods, 20 hubs (with hostile text), R@1/5/10 and two tuning curves.
fn realistic_page() -> PageInput {
    let methods = vec![
        MethodPage {
            name: "none".into(),
            histogram: histogram(300, 4200, 6.0),
            recall: recall([0.412, 0.688, 0.781]),
            measures: measures(7.84, 0.61, 0.31),
        },
        MethodPage {
            name: "is".into(),
            histogram: histogram(60, 900, 9.0),
            recall: recall([0.447, 0.716, 0.803]),
            measures: measures(1.92, 0.38, 0.07),
        },
        MethodPage {
            name: "nnn".into(),
            histogram: histogram(90, 1500, 8.0),
            recall: recall([0.439, 0.705, 0.797]),
            measures: measures(2.61, 0.42, 0.12),
        },
    ];
    let top_hubs = (0..20u32)
        .map(|i| {
            let base = 300 - i * 11;
            HubRow {
                gallery_id: if i == 3 {
                    "<img src=x onerror=\"document.body.dataset.rendered='pwned'\">".into()
                } else {
                    format!("doc-{:05}", 1000 + i * 37)
                },
                text: (i != 7).then(|| {
                    if i % 4 == 0 {
                        format!("{HOSTILE} {}", "a very long caption ".repeat(20))
                    } else {
                        format!("{HOSTILE} item {i}")
                    }
                }),
                counts: vec![base, base / 7 + i, base / 5 + (i % 3) * 40],
            }
        })
        .collect();
    PageInput {
        title: "hubnorm compare <test> & \"report\"".into(),
        context: vec![
            "queries: q.parquet (10000 rows); gallery: g.parquet (12000 rows)".into(),
            "k = 10; bank: 50000 rows".into(),
        ],
        k: 10,
        methods,
        top_hubs,
        tuning: vec![
            TuningCurve {
                method: "is".into(),
                parameter: "beta".into(),
                metric: "R@1".into(),
                points: vec![
                    (1.0, 0.415),
                    (3.0, 0.424),
                    (10.0, 0.439),
                    (20.0, 0.447),
                    (50.0, 0.444),
                    (100.0, 0.431),
                    (300.0, 0.420),
                ],
                chosen: 20.0,
            },
            TuningCurve {
                method: "nnn".into(),
                parameter: "alpha".into(),
                metric: "R@1".into(),
                points: vec![(0.1, 0.421), (0.25, 0.433), (0.5, 0.439), (1.0, 0.430)],
                chosen: 0.5,
            },
        ],
    }
}

/// [`realistic_page`] with the 17 methods of [`MANY_METHODS`], and long
/// gallery ids.
fn many_methods_page() -> PageInput {
    let mut page = realistic_page();
    page.methods = MANY_METHODS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let i = i as u32;
            let r1 = 0.40 + 0.003 * f64::from(i);
            MethodPage {
                name: name.to_string(),
                histogram: histogram(300 - 15 * i, 4200 - 200 * u64::from(i), 6.0 + f64::from(i)),
                recall: recall([r1, r1 + 0.27, r1 + 0.37]),
                measures: measures(7.84 - 0.4 * f64::from(i), 0.61, 0.31),
            }
        })
        .collect();
    for (rank, hub) in page.top_hubs.iter_mut().enumerate() {
        if rank % 5 == 1 {
            hub.gallery_id = format!("urn:gallery:item:{:020}", rank * 7919);
        }
        hub.counts = (0..MANY_METHODS.len() as u32)
            .map(|m| 300u32.saturating_sub(11 * rank as u32 + 13 * m))
            .collect();
    }
    page
}

/// The first of `chromium`, `chromium-browser`, `google-chrome` on PATH.
fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

/// The browser, or `None` when the test should be skipped.
fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    let found = find_chromium();
    if found.is_none() {
        let required = std::env::var("HUBNORM_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "HUBNORM_REQUIRE_CHROMIUM=1 but no chromium, chromium-browser or google-chrome on PATH"
        );
        println!("{test}: skipped, no chromium, chromium-browser or google-chrome on PATH");
    }
    found
}

/// What one browser run left behind.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs headless Chromium on `page` with `extra` flags, killing it after
/// [`BROWSER_TIMEOUT`]. Output goes to files, so a chatty browser cannot
/// block on a full pipe.
fn run_chromium(browser: &Path, dir: &Path, page: &Path, extra: &[String]) -> Run {
    let out_path = dir.join("chromium.stdout");
    let err_path = dir.join("chromium.stderr");
    let mut child = Command::new(browser)
        .arg("--headless=new")
        // Root (as in CI containers) cannot use the sandbox.
        .arg("--no-sandbox")
        .arg("--disable-gpu")
        .arg("--disable-dev-shm-usage")
        .arg("--no-first-run")
        .arg("--no-default-browser-check")
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        // Let the load event and the check script finish before dumping.
        .arg("--virtual-time-budget=2000")
        // Console messages and uncaught errors go to stderr as "CONSOLE" lines.
        .arg("--enable-logging=stderr")
        .arg("--v=0")
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + BROWSER_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium ran longer than {BROWSER_TIMEOUT:?}; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Run {
        status,
        stdout: std::fs::read_to_string(&out_path).expect("read stdout"),
        stderr: std::fs::read_to_string(&err_path).expect("read stderr"),
    }
}

/// Writes the rendered page into `dir`.
fn write_page(dir: &Path) -> PathBuf {
    write_page_of(dir, &realistic_page())
}

/// Writes `page`, rendered, into `dir`.
fn write_page_of(dir: &Path, page: &PageInput) -> PathBuf {
    let html = render(page);
    let path = dir.join("report.html");
    std::fs::write(&path, html).expect("write page");
    path
}

/// The `<body …>` tag of the dumped DOM.
fn body_tag(dom: &str) -> &str {
    let body = &dom[dom.find("<body").expect("body")..];
    &body[..body.find('>').expect("tag end")]
}

/// The number in attribute `name` of `tag`.
fn attribute(tag: &str, name: &str) -> u32 {
    let start = tag
        .find(&format!("{name}=\""))
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + name.len()
        + 2;
    let end = tag[start..].find('"').expect("closed attribute") + start;
    tag[start..end]
        .parse()
        .unwrap_or_else(|e| panic!("{name} in {tag}: {e}"))
}

/// Nothing on the page sticks out to the right: its layout is no wider
/// than the viewport (as the check script measured them), so the page never
/// scrolls sideways; wide tables scroll inside their own boxes.
fn assert_fits_the_viewport(dom: &str, window_width: u32) {
    let body = body_tag(dom);
    let (page, viewport) = (
        attribute(body, "data-scroll-width"),
        attribute(body, "data-viewport-width"),
    );
    // The viewport is the window less a scroll bar, if any.
    assert!(
        viewport <= window_width && viewport + 30 >= window_width,
        "viewport {viewport} px in a window of {window_width} px"
    );
    assert!(
        page <= viewport,
        "the page is {page} px wide in a viewport of {viewport} px"
    );
}

/// The `<svg …>…</svg>` elements of one plot kind in the dumped DOM.
fn plots<'a>(dom: &'a str, kind: &str) -> Vec<&'a str> {
    let marker = format!("data-plot=\"{kind}\"");
    dom.match_indices("<svg ")
        .map(|(start, _)| {
            let end = dom[start..].find("</svg>").expect("closed svg") + start;
            &dom[start..end]
        })
        .filter(|svg| svg.contains(&marker))
        .collect()
}

/// The text between the `errors` element's tags.
fn errors_text(dom: &str) -> &str {
    let open = dom.find("id=\"errors\"").expect("errors element");
    let start = dom[open..].find('>').expect("tag end") + open + 1;
    let end = dom[start..].find("</div>").expect("errors closed") + start;
    &dom[start..end]
}

/// Loads `page` in a window `width` px wide and dumps the DOM once the
/// check script has run; fails unless the browser succeeded and the script
/// finished.
fn dump_dom(browser: &Path, dir: &Path, page: &Path, width: u32) -> Run {
    let window = format!("--window-size={width},900");
    let run = run_chromium(browser, dir, page, &["--dump-dom".to_string(), window]);
    assert!(
        run.status.success(),
        "chromium failed ({}); stderr:\n{}",
        run.status,
        run.stderr
    );
    let body_tag = body_tag(&run.stdout);
    assert!(
        body_tag.contains("data-rendered=\"ok\""),
        "check script did not finish: {body_tag}; errors: {}",
        errors_text(&run.stdout)
    );
    run
}

#[test]
fn report_renders_in_headless_chromium() {
    let Some(browser) = chromium_or_skip("report_renders_in_headless_chromium") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let page = write_page(dir.path());
    let run = dump_dom(&browser, dir.path(), &page, 1200);
    let dom = &run.stdout;
    assert_eq!(errors_text(dom), "", "JS errors on the page");

    // Each plot is there, with its marks, as parsed by the browser: one
    // k-occurrence chart per method, each with its line, and the baseline's
    // grey line behind the others'.
    let k_occ = plots(dom, "k-occurrence");
    assert_eq!(k_occ.len(), 3);
    for (i, chart) in k_occ.iter().enumerate() {
        assert_eq!(
            chart.matches("<path class=\"line\"").count(),
            1,
            "chart {i}"
        );
        let reference = usize::from(i > 0);
        assert_eq!(
            chart.matches("<path class=\"reference\"").count(),
            reference,
            "chart {i}"
        );
    }
    let points: usize = k_occ
        .iter()
        .map(|chart| chart.matches("<circle class=\"pt\"").count())
        .sum();
    assert!(points > 100, "{points} points");
    let recall = plots(dom, "recall");
    assert_eq!(recall.len(), 1);
    assert_eq!(recall[0].matches("<rect class=\"bar\"").count(), 9);
    assert_eq!(recall[0].matches("class=\"whisker\"").count(), 9);
    let tuning = plots(dom, "tuning");
    assert_eq!(tuning.len(), 2);
    for chart in &tuning {
        assert!(chart.contains("<path class=\"line\""));
        assert!(chart.contains("class=\"chosen\""));
    }

    // Hostile ids and text stayed text: no element was injected.
    assert!(!dom.contains("<b>bold</b>"), "hub text parsed as HTML");
    assert!(dom.contains("&lt;b&gt;bold&lt;/b&gt; &amp;"));
    assert!(!dom.contains("<img"), "gallery id parsed as HTML");
    assert_eq!(dom.matches("<tbody>").count(), 3, "hubs, recall, measures");
    assert_fits_the_viewport(dom, 1200);

    // No console output at all (the page logs nothing, so any line is an
    // error, a CSP violation or an uncaught exception).
    let console: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .collect();
    assert!(console.is_empty(), "browser console: {console:#?}");
}

#[test]
fn report_screenshot_is_not_blank() {
    let Some(browser) = chromium_or_skip("report_screenshot_is_not_blank") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let page = write_page(dir.path());
    let shot = dir.path().join("report.png");
    let run = run_chromium(
        &browser,
        dir.path(),
        &page,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1200,2400".to_string(),
            "--hide-scrollbars".to_string(),
        ],
    );
    assert!(
        run.status.success(),
        "chromium failed ({}); stderr:\n{}",
        run.status,
        run.stderr
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // A blank 1200×2400 page compresses to a few kB; plots and tables don't.
    assert!(png.len() > 10 * 1024, "screenshot only {} bytes", png.len());
}

/// With many methods (17, some with long names) and long gallery ids, the
/// page still fits the window, wide or narrow: the k-occurrence charts wrap,
/// the recall chart and the measures grow downwards, and the top-hubs table
/// scrolls inside its own box.
#[test]
fn many_methods_fit_the_viewport() {
    let Some(browser) = chromium_or_skip("many_methods_fit_the_viewport") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let page = write_page_of(dir.path(), &many_methods_page());
    for width in [1280, 800] {
        let run = dump_dom(&browser, dir.path(), &page, width);
        let dom = &run.stdout;
        assert_eq!(plots(dom, "k-occurrence").len(), MANY_METHODS.len());
        let recall = plots(dom, "recall");
        assert_eq!(recall.len(), 1);
        assert_eq!(
            recall[0].matches("<rect class=\"bar\"").count(),
            3 * MANY_METHODS.len()
        );
        assert_fits_the_viewport(dom, width);
    }
}
