//! A progress bar on stderr, drawn only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

const TEMPLATE: &str =
    "{spinner} {elapsed_precise} [{bar:40.cyan/blue}] {pos}/{len} tasks done · {msg}";

/// Tasks resolved so far, and the phase of the run. A no-op when disabled.
#[derive(Debug)]
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A bar counting to `tasks`, if `wanted` and stderr is a terminal.
    pub fn new(tasks: u64, wanted: bool) -> Progress {
        if !wanted || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = ProgressBar::new(tasks);
        if let Ok(style) = ProgressStyle::with_template(TEMPLATE) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(100));
        Progress(Some(bar))
    }

    /// Shows `resolved` tasks done.
    pub fn set(&self, resolved: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(resolved);
        }
    }

    /// Starts counting again, from 0 to `len`, in a new phase.
    pub fn restart(&self, len: u64, phase: &'static str) {
        if let Some(bar) = &self.0 {
            bar.set_length(len);
            bar.set_position(0);
            bar.set_message(phase);
        }
    }

    /// Names the current phase.
    pub fn phase(&self, phase: &'static str) {
        if let Some(bar) = &self.0 {
            bar.set_message(phase);
        }
    }
}

impl Drop for Progress {
    /// Removes the bar, so that the summary or an error prints cleanly.
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
