//! A progress bar on stderr (rows done, rows/s, ETA) when stderr is a terminal.

use std::io::IsTerminal;

use hubnorm::progress::{Progress, Silent};
use indicatif::{ProgressBar, ProgressStyle};

/// Progress shown with indicatif.
pub struct Bar {
    bar: ProgressBar,
    phase: std::sync::Mutex<String>,
}

impl Progress for Bar {
    fn start(&self, phase: &str, total: u64) {
        self.bar.reset();
        self.bar.set_length(total);
        self.bar.set_message(phase.to_owned());
        *self.phase.lock().expect("phase lock") = phase.to_owned();
    }
    fn status(&self, status: &str) {
        let phase = self.phase.lock().expect("phase lock").clone();
        self.bar.set_message(format!("{phase} ({status})"));
    }
    fn advance(&self, rows: u64) {
        self.bar.inc(rows);
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A bar when stderr is a terminal and `--quiet` was not given; silence otherwise.
pub fn reporter(quiet: bool) -> Box<dyn Progress> {
    if quiet || !std::io::stderr().is_terminal() {
        return Box::new(Silent);
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:28} [{bar:30}] {human_pos}/{human_len}  {per_sec}  ETA {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    Box::new(Bar {
        bar,
        phase: std::sync::Mutex::new(String::new()),
    })
}
