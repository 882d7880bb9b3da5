//! Small helpers shared by the commands.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

/// Writes `bytes` to `path` atomically and durably ([`florin_fs::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    florin_fs::write_atomic(path, &[bytes])
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Reads a file with a clear error.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Whether this command printed JSON on stdout already (then a failure does not add the
/// error envelope: stdout stays one JSON document, or JSON lines).
static PRINTED_JSON: AtomicBool = AtomicBool::new(false);

/// Notes that JSON went to stdout.
pub fn printed_json() {
    PRINTED_JSON.store(true, Ordering::Relaxed);
}

/// Whether [`printed_json`] was called.
pub fn has_printed_json() -> bool {
    PRINTED_JSON.load(Ordering::Relaxed)
}

/// Prints JSON on stdout.
pub fn print_json(v: &serde_json::Value) {
    printed_json();
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// A current-thread runtime for one command.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
