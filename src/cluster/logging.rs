//! The log of the cluster processes: the records of hubnorm, Ballista and
//! their libraries (everything that logs through the `log` crate) on stderr,
//! one line each, filtered by `RUST_LOG`, with floods of one warning damped.
//!
//! Ballista retries some failures in tight loops and warns at every try (an
//! executor whose scheduler is gone polls it 20 times a second), which would
//! bury the rest of the log. So a warning or error of a library repeated
//! word for word within a minute of being shown is counted instead, and
//! the count is shown once that minute has passed (with the next record).
//! hubnorm's own warnings are never damped: they pace themselves.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::{Level, Log, Metadata, Record};

/// How long a warning shown stands for its repeats.
const DAMPING_WINDOW: Duration = Duration::from_secs(60);

/// Sends the log to stderr at `RUST_LOG`'s directives, as env_logger reads
/// them (`warn`, `info,ballista_executor=warn`, `info,hubnorm=debug`); `info`
/// when unset, and when they do not parse. Does nothing when a logger is
/// already installed. Returns warnings about `RUST_LOG` for the caller to
/// show (the log itself may be filtered so as to hide them).
pub fn log_to_stderr() -> Vec<String> {
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let mut warnings = Vec::new();
    let filter = match filter_for(&spec) {
        Ok(filter) => {
            warnings.extend(modules_only_warning(&spec));
            filter
        }
        Err(why) => {
            warnings.push(format!(
                "RUST_LOG={spec}: {why}; logging at info (RUST_LOG takes a level such as warn, or directives such as info,ballista_executor=warn)"
            ));
            filter_for("info").expect("`info` is a valid RUST_LOG")
        }
    };
    let level = filter.filter();
    if log::set_boxed_logger(Box::new(StderrLog::new(filter))).is_ok() {
        log::set_max_level(level);
    }
    warnings
}

/// A warning for a `RUST_LOG` without a level for all modules
/// (`hubnorm=debug`, `hubnorm`, or a mistyped level such as `warning`):
/// env_logger's reading logs the modules it names and nothing else, not
/// even the errors of the others.
fn modules_only_warning(spec: &str) -> Option<String> {
    let directives: Vec<&str> = spec
        .split(',')
        .map(|d| d.split('/').next().unwrap_or("").trim())
        .filter(|d| !d.is_empty())
        .collect();
    let is_level = |d: &&str| d.parse::<log::LevelFilter>().is_ok();
    (!directives.is_empty() && !directives.iter().any(is_level)).then(|| {
        format!(
            "RUST_LOG={spec} sets no level for the modules it does not name: they log nothing, not even errors; put one first, e.g. RUST_LOG=warn,{spec}"
        )
    })
}

/// The filter of `RUST_LOG=spec` (blank: `info`).
fn filter_for(spec: &str) -> std::result::Result<env_filter::Filter, String> {
    let spec = match spec.trim() {
        "" => "info",
        given => given,
    };
    let mut builder = env_filter::Builder::new();
    builder.try_parse(spec).map_err(|e| e.to_string())?;
    Ok(builder.build())
}

/// The logger: `filter`, then the damper, then one line on stderr.
struct StderrLog {
    filter: env_filter::Filter,
    damper: Mutex<Damper>,
}

impl StderrLog {
    fn new(filter: env_filter::Filter) -> Self {
        StderrLog {
            filter,
            damper: Mutex::new(Damper::default()),
        }
    }
}

impl Log for StderrLog {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if !self.filter.matches(record) {
            return;
        }
        let message = record.args().to_string();
        let now = Instant::now();
        let (counted, repeat) = {
            let mut damper = self.damper.lock().unwrap_or_else(|e| e.into_inner());
            let counted = damper.overdue(now);
            let repeat = dampable(record.target(), record.level())
                && damper.is_repeat(record.target(), record.level(), &message, now);
            (counted, repeat)
        };
        for ((target, level, message), repeats) in counted {
            let message =
                format!("{message} [{repeats} more times in the minute after it was shown]");
            write_line(level, &target, &message);
        }
        if !repeat {
            write_line(record.level(), record.target(), &message);
        }
    }

    fn flush(&self) {}
}

/// One line on stderr: the time, the level, the module and the message.
fn write_line(level: Level, target: &str, message: &str) {
    // A closed stderr must not stop a server: the line is lost.
    let _ = writeln!(
        std::io::stderr().lock(),
        "{} {level:<5} {target}: {message}",
        humantime::format_rfc3339_millis(std::time::SystemTime::now()),
    );
}

/// Whether records of `target` at `level` may be damped: the warnings and
/// errors of the libraries.
fn dampable(target: &str, level: Level) -> bool {
    level <= Level::Warn && !target.starts_with("hubnorm")
}

/// A warning by its module, level and words.
type Warning = (String, Level, String);

/// The warnings shown in the last minute, and how many times each was
/// repeated since.
#[derive(Default)]
struct Damper {
    shown: HashMap<Warning, Shown>,
}

/// When a warning was shown, and its repeats since.
struct Shown {
    at: Instant,
    repeats: u64,
}

/// Distinct warnings remembered at most (beyond them, more are shown).
const REMEMBERED: usize = 256;

impl Damper {
    /// Whether `message` of `target` at `level` repeats a warning shown
    /// less than a minute before `now` (then it is counted); if not, it is
    /// remembered as shown now.
    fn is_repeat(&mut self, target: &str, level: Level, message: &str, now: Instant) -> bool {
        let warning = (target.to_owned(), level, message.to_owned());
        if let Some(shown) = self.shown.get_mut(&warning) {
            if now.duration_since(shown.at) < DAMPING_WINDOW {
                shown.repeats += 1;
                return true;
            }
        }
        if self.shown.len() < REMEMBERED || self.shown.contains_key(&warning) {
            self.shown.insert(
                warning,
                Shown {
                    at: now,
                    repeats: 0,
                },
            );
        }
        false
    }

    /// The warnings whose minute has passed by `now` and that were repeated
    /// in it, with their counts; every warning whose minute has passed is
    /// forgotten.
    fn overdue(&mut self, now: Instant) -> Vec<(Warning, u64)> {
        let mut counted = Vec::new();
        self.shown.retain(|warning, shown| {
            let current = now.duration_since(shown.at) < DAMPING_WINDOW;
            if !current && shown.repeats > 0 {
                counted.push((warning.clone(), shown.repeats));
            }
            current
        });
        counted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::LevelFilter;

    #[test]
    fn a_repeated_warning_is_counted_and_the_count_shown_after_its_minute() {
        let mut damper = Damper::default();
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let poll = "Executor poll work loop failed. Error: tcp connect error";
        let target = "ballista_executor::execution_loop";
        assert!(!damper.is_repeat(target, Level::Warn, poll, at(0)));
        for second in 1..60 {
            assert!(damper.overdue(at(second)).is_empty());
            assert!(damper.is_repeat(target, Level::Warn, poll, at(second)));
        }
        // Another message, level or module is not a repeat.
        assert!(!damper.is_repeat(target, Level::Warn, "task 7 failed", at(5)));
        assert!(!damper.is_repeat(target, Level::Error, poll, at(5)));
        assert!(!damper.is_repeat("other", Level::Warn, poll, at(5)));
        // Its minute over: the count comes out once, and the next one shows.
        let warning = (target.to_owned(), Level::Warn, poll.to_owned());
        assert_eq!(damper.overdue(at(60)), vec![(warning, 59)]);
        assert!(damper.overdue(at(61)).is_empty());
        assert!(!damper.is_repeat(target, Level::Warn, poll, at(61)));
        // Warnings shown once are forgotten without a count.
        assert!(damper.overdue(at(200)).is_empty());
        assert!(damper.shown.is_empty());
    }

    #[test]
    fn only_the_libraries_warnings_are_damped() {
        assert!(dampable("ballista_executor::execution_loop", Level::Warn));
        assert!(dampable("h2::proto", Level::Error));
        assert!(!dampable("ballista_executor::execution_loop", Level::Info));
        assert!(!dampable("hubnorm::cluster::contact", Level::Warn));
    }

    #[test]
    fn the_remembered_warnings_stay_bounded() {
        let mut damper = Damper::default();
        let start = Instant::now();
        for i in 0..3 * REMEMBERED {
            assert!(!damper.is_repeat("t", Level::Warn, &i.to_string(), start));
            assert!(damper.shown.len() <= REMEMBERED);
        }
        // Those remembered are still counted.
        assert!(damper.is_repeat("t", Level::Warn, "0", start));
    }

    #[test]
    fn rust_log_takes_levels_and_directives_and_refuses_the_rest() {
        let info = filter_for("").unwrap();
        assert_eq!(info.filter(), LevelFilter::Info);
        let spec = filter_for("warn,hubnorm=debug").unwrap();
        assert_eq!(spec.filter(), LevelFilter::Debug);
        let metadata = |target, level| Metadata::builder().target(target).level(level).build();
        assert!(spec.enabled(&metadata("hubnorm::cluster", Level::Debug)));
        assert!(!spec.enabled(&metadata("ballista_executor", Level::Info)));
        assert!(filter_for("hubnorm=loud").is_err());
    }

    #[test]
    fn a_rust_log_of_modules_alone_is_warned_about() {
        for spec in [
            "hubnorm",
            "warning",
            "hubnorm=debug",
            "hubnorm=debug,ballista_executor",
        ] {
            assert!(modules_only_warning(spec).is_some(), "{spec}");
        }
        for spec in ["", "warn", "info,hubnorm", "hubnorm=debug,info", "off"] {
            assert_eq!(modules_only_warning(spec), None, "{spec}");
        }
    }
}
