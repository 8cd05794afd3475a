//! Progress bars on stderr (indicatif): drawn only when stderr is a terminal, so `--json`
//! output piped to a file stays clean and tests see nothing.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Makes the bars of one run.
pub(crate) struct Bars {
    visible: bool,
}

impl Bars {
    pub(crate) fn new() -> Bars {
        Bars {
            visible: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        }
    }

    fn bar(&self, len: u64, template: &str, what: &str) -> ProgressBar {
        if !self.visible {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr_with_hz(10));
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_owned());
        bar
    }

    /// A bar counting bytes, with the rate in MB/s.
    pub(crate) fn bytes(&self, what: &str, len: u64) -> ProgressBar {
        self.bar(
            len,
            "{prefix:>22} [{bar:30}] {decimal_bytes:>10}/{decimal_total_bytes:<10} {decimal_bytes_per_sec:>12} eta {eta}",
            what,
        )
    }

    /// A bar counting operations.
    pub(crate) fn ops(&self, what: &str, len: u64) -> ProgressBar {
        self.bar(
            len,
            "{prefix:>22} [{bar:30}] {pos:>8}/{len:<8} {per_sec:>14}",
            what,
        )
    }

    /// A spinner for work whose progress cannot be seen (an sftp transfer).
    pub(crate) fn spinner(&self, what: &str) -> ProgressBar {
        if !self.visible {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
        if let Ok(style) = ProgressStyle::with_template("{prefix:>22} {spinner} {elapsed}") {
            bar.set_style(style);
        }
        bar.set_prefix(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    }
}
