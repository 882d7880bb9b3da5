//! Progress on a terminal for long commands (indicatif): a spinner with the time taken while a
//! command waits (`cluster up` for a healthy cluster, `custody ecdsa-setup` for the nodes'
//! Paillier primes), a bar while bytes move (`offline` payments over the device channel).
//!
//! Nothing is drawn when standard error is not a terminal or the command prints JSON: scripts
//! and tests see exactly what they saw before.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// No progress at all (the command prints JSON).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

fn shown() -> bool {
    !QUIET.load(Ordering::Relaxed) && std::io::stderr().is_terminal()
}

/// A spinner, cleared when dropped.
pub struct Spinner(Option<ProgressBar>);

/// Shows `msg` with a spinner and the seconds elapsed until the returned value is dropped.
pub fn spinner(msg: impl Into<Cow<'static, str>>) -> Spinner {
    if !shown() {
        return Spinner(None);
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(120));
    Spinner(Some(pb))
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if let Some(pb) = self.0.take() {
            pb.finish_and_clear();
        }
    }
}

/// A bar for `total` bytes labelled `label`, or nothing (see the module's text); `total` under
/// 1 MiB gets nothing either, it is over before it could be read.
pub fn bytes(label: &'static str, total: u64) -> Option<ProgressBar> {
    if !shown() || total < (1 << 20) {
        return None;
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:25}] {percent:>3}% {bytes}/{total_bytes} {bytes_per_sec}",
    ) {
        pb.set_style(style.progress_chars("#>-"));
    }
    pb.set_message(label);
    Some(pb)
}

/// The steps of a long wallet flow (a withdrawal, a sync): a spinner naming the step, turning
/// into a bar while the step counts its work (coins checked with the ledger, mailbox messages
/// opened). Drawn from the first step on, cleared by [`Steps::clear`] (before the command prints
/// its result) or when the last clone is dropped; nothing at all when not [`shown`].
#[derive(Clone)]
pub struct Steps(Option<std::sync::Arc<std::sync::OnceLock<ProgressBar>>>);

/// Steps shown on standard error (or nothing; see the module's text).
pub fn steps() -> Steps {
    Steps(shown().then(Default::default))
}

impl Steps {
    /// Nothing drawn, whatever is told.
    pub fn none() -> Steps {
        Steps(None)
    }

    fn bar(&self) -> Option<&ProgressBar> {
        let cell = self.0.as_ref()?;
        Some(cell.get_or_init(|| {
            let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
                .with_finish(indicatif::ProgressFinish::AndClear);
            pb.enable_steady_tick(Duration::from_millis(120));
            pb
        }))
    }

    /// A new step: its name, and no count yet.
    pub fn step(&self, name: &'static str) {
        if let Some(pb) = self.bar() {
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
                pb.set_style(style);
            }
            pb.set_length(0);
            pb.set_position(0);
            pb.set_message(name);
        }
    }

    /// The current step's count: `done` of `total`.
    pub fn progress(&self, done: u64, total: u64) {
        if let Some(pb) = self.bar() {
            if pb.length() == Some(0) && total > 0 {
                if let Ok(style) =
                    ProgressStyle::with_template("{msg} [{bar:25}] {pos}/{len} {elapsed}")
                {
                    pb.set_style(style.progress_chars("#>-"));
                }
            }
            pb.set_length(total);
            pb.set_position(done);
        }
    }

    /// Clears what was drawn (the command is about to print).
    pub fn clear(&self) {
        if let Some(pb) = self.0.as_ref().and_then(|c| c.get()) {
            pb.finish_and_clear();
        }
    }
}
