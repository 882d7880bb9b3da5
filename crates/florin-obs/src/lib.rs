//! Florin's observability: how a process logs ([`log`]), what it counts ([`metrics`]) and how a
//! request is named across hops ([`request_id`]).
//!
//! Every Florin process sets up logging once, at start, with [`log::init`]: human lines on a
//! terminal, one JSON object per line with `--log-format json`, filtered by `RUST_LOG`. Logs go to
//! standard error only; standard output stays the machine interface (`listening on …`, `--json`
//! results). Metrics live in one registry per process ([`metrics::global`]), encoded as OpenMetrics
//! text at `/metrics`.
//!
//! This crate does no I/O of its own beyond writing log lines: services take it as a dependency
//! without pulling a runtime or an HTTP stack.

pub mod buffered;
mod json;
pub mod log;
pub mod metrics;
pub mod request_id;

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Whether request logging and metrics recording are on (they are unless a benchmark turned them
/// off to measure what they cost).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Turns request logging and metrics recording on or off for the whole process. Only the
/// observability-overhead benchmark turns them off: "off" then costs what a build without them
/// would (one relaxed load per request).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}
