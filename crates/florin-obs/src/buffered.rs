//! A server's log writer: lines gathered in a bounded buffer and written in batches.
//!
//! Writing each line with its own `write(2)` costs a server more than formatting it (measured
//! by `florin bench ledger`'s `observability_cpu_overhead_ratio`). Lines at `info` and below are
//! gathered and written when the buffer holds [`CAPACITY`] bytes, at the latest every
//! [`FLUSH_EVERY`] (a thread flushes), and when the process ends normally ([`flush`]). A
//! warning or an error is written at once, with everything before it, so the order holds and
//! what needs attention is never waiting. A process killed outright loses at most the last
//! [`FLUSH_EVERY`] of info lines (a panic and `florin`'s own exits flush first); nothing else is
//! dropped unless standard error itself refuses the write, and the buffer never grows past its
//! capacity (a full buffer is written by the thread that filled it). The writes happen under
//! the buffer's lock: a reader of standard error that stops reading holds up the threads that
//! log, as it would with one write per line.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Bytes gathered before they are written.
pub const CAPACITY: usize = 64 * 1024;

/// The longest a line waits.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

struct Shared {
    state: Mutex<(Vec<u8>, Box<dyn Write + Send>)>,
}

impl Shared {
    fn flush(&self) {
        // A thread that panicked while writing leaves the lines as they were: go on with them.
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        {
            let (buf, out) = &mut *s;
            if !buf.is_empty() {
                // A log that cannot be written has nowhere to say so: the lines are dropped.
                let _ = out.write_all(buf);
                let _ = out.flush();
                buf.clear();
            }
        }
    }
}

/// The writer (see the module's text).
#[derive(Clone)]
pub struct Buffered {
    shared: Arc<Shared>,
}

impl Buffered {
    /// Gathers lines for `out`; a thread writes them at least every [`FLUSH_EVERY`] while this
    /// writer (or a clone) lives.
    pub fn new(out: impl Write + Send + 'static) -> Buffered {
        let shared = Arc::new(Shared {
            state: Mutex::new((Vec::with_capacity(CAPACITY), Box::new(out))),
        });
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        let _ = std::thread::Builder::new()
            .name("florin-log".into())
            .spawn(move || loop {
                std::thread::sleep(FLUSH_EVERY);
                match weak.upgrade() {
                    Some(s) => s.flush(),
                    None => return,
                }
            });
        Buffered { shared }
    }

    /// Writes what is gathered now.
    pub fn flush(&self) {
        self.shared.flush();
    }
}

/// One event's writer: its line goes into the buffer; `urgent` lines are written at once.
pub struct Line<'a> {
    shared: &'a Shared,
    urgent: bool,
}

impl Write for Line<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let mut s = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let (buf, out) = &mut *s;
        if buf.len() + b.len() > CAPACITY && !buf.is_empty() {
            out.write_all(buf)?;
            buf.clear();
        }
        buf.extend_from_slice(b);
        if self.urgent || buf.len() >= CAPACITY {
            out.write_all(buf)?;
            out.flush()?;
            buf.clear();
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buffered {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            shared: &self.shared,
            urgent: true,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line<'a> {
        Line {
            shared: &self.shared,
            urgent: *meta.level() <= Level::WARN,
        }
    }
}

/// The process's buffered standard error, when logging uses one.
pub(crate) static STDERR: OnceLock<Buffered> = OnceLock::new();

/// Writes the log lines gathered so far (call before the process ends).
pub fn flush() {
    if let Some(b) = STDERR.get() {
        b.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn info_waits_warnings_do_not_and_order_holds() {
        let sink = Sink::default();
        let b = Buffered::new(sink.clone());
        let d = tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_writer(b.clone())
                .with_ansi(false)
                .without_time()
                .finish(),
        );
        tracing::dispatcher::with_default(&d, || {
            tracing::info!("first");
            assert!(sink.0.lock().unwrap().is_empty(), "info waits");
            tracing::warn!("second");
        });
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let first = text.find("first").unwrap();
        let second = text.find("second").unwrap();
        assert!(first < second, "{text}");
        tracing::dispatcher::with_default(&d, || tracing::info!("third"));
        assert!(!String::from_utf8_lossy(&sink.0.lock().unwrap()).contains("third"));
        std::thread::sleep(FLUSH_EVERY * 3);
        assert!(
            String::from_utf8_lossy(&sink.0.lock().unwrap()).contains("third"),
            "the flusher wrote it"
        );
    }

    #[test]
    fn the_buffer_never_grows_past_its_capacity() {
        let sink = Sink::default();
        let b = Buffered::new(sink.clone());
        let line = vec![b'x'; 1000];
        for _ in 0..200 {
            let mut w = Line {
                shared: &b.shared,
                urgent: false,
            };
            w.write_all(&line).unwrap();
            assert!(b.shared.state.lock().unwrap().0.len() <= CAPACITY);
        }
        b.flush();
        assert_eq!(sink.0.lock().unwrap().len(), 200 * 1000, "nothing lost");
    }
}
