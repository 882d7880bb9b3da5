//! Logging set-up: one call at process start.
//!
//! - **Human** lines on a terminal. A server (`florin devnet`, `florin node`, `florin psp serve`,
//!   `florin custody node`) prints time, level, the span's fields (`request_id`, `route`) and the
//!   event; a command prints what it has to say as plain text (`warning: …` for warnings), as it
//!   always has.
//! - **JSON** with `--log-format json`: one object per line with `timestamp`, `level`, `target`,
//!   the event's fields (`message` included) at the top level and the current span under `span`
//!   (`request_id` among its fields).
//! - `RUST_LOG` filters (the usual `tracing` directives: `warn`, `info,florin::access=off`,
//!   `florin_node=debug`); unset, the default is `info` with the chatty libraries at `warn`.
//!
//! Everything goes to standard error: standard output is the machine interface.

use std::fmt;
use std::io::IsTerminal;
use std::str::FromStr;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The target of the one line each HTTP request logs (`RUST_LOG=info,florin::access=off` turns
/// those lines off and keeps the rest).
pub const ACCESS_TARGET: &str = "florin::access";

/// The filter used when `RUST_LOG` is not set.
pub const DEFAULT_DIRECTIVES: &str =
    "info,openraft=warn,rustls=warn,hyper=warn,hyper_util=warn,reqwest=warn,tokio_postgres=warn";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Human lines (the default; colours only on a terminal).
    #[default]
    Auto,
    /// Human lines, never coloured.
    Human,
    /// One JSON object per line.
    Json,
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Format::Auto),
            "human" | "text" => Ok(Format::Human),
            "json" => Ok(Format::Json),
            other => Err(format!(
                "unknown log format {other:?} (auto, human or json)"
            )),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Auto => "auto",
            Format::Human => "human",
            Format::Json => "json",
        })
    }
}

/// What kind of process logs: a long-running server or a command a person typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Time, level, target and span fields on every human line.
    Server,
    /// Plain text: an info event prints its message, a warning `warning: …`.
    Command,
}

/// Why logging could not be set up.
#[derive(Debug)]
pub enum InitError {
    /// `RUST_LOG` does not parse.
    BadFilter(String),
    /// Logging was set up already in this process.
    AlreadySet,
}

impl std::error::Error for InitError {}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::BadFilter(e) => write!(f, "RUST_LOG: {e}"),
            InitError::AlreadySet => f.write_str("logging is set up already"),
        }
    }
}

/// The filter: `RUST_LOG` when set, else [`DEFAULT_DIRECTIVES`] followed by `extra` (directives a
/// command adds to the default, e.g. quieter access lines during a benchmark).
pub fn filter(extra: &str) -> Result<EnvFilter, InitError> {
    match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(v.trim()).map_err(|e| InitError::BadFilter(e.to_string()))
        }
        _ => {
            let directives = if extra.is_empty() {
                DEFAULT_DIRECTIVES.to_string()
            } else {
                format!("{DEFAULT_DIRECTIVES},{extra}")
            };
            EnvFilter::try_new(directives).map_err(|e| InitError::BadFilter(e.to_string()))
        }
    }
}

/// A boxed layer over the plain registry.
/// The filter sits in front of the registry as a global filter: a span or event it turns away
/// costs nothing further, and no per-layer filter state is kept per span.
type Filtered = tracing_subscriber::layer::Layered<EnvFilter, tracing_subscriber::Registry>;

/// A boxed formatting layer over the filtered registry.
type Boxed = Box<dyn Layer<Filtered> + Send + Sync + 'static>;

/// The formatting layer for `format` and `style`, writing to `writer`.
fn layer<W>(format: Format, style: Style, writer: W, ansi: bool) -> Boxed
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let base = tracing_subscriber::fmt::layer().with_writer(writer);
    match (format, style) {
        (Format::Json, _) => base
            .event_format(crate::json::JsonLine)
            .fmt_fields(crate::json::SpanMembers)
            .boxed(),
        (_, Style::Command) => base.event_format(CommandFormat).with_ansi(false).boxed(),
        (_, Style::Server) => base.with_ansi(ansi).with_target(true).boxed(),
    }
}

/// Sets up logging for this process (once, before anything logs). `extra` is added to the default
/// filter when `RUST_LOG` is unset.
pub fn init(format: Format, style: Style, extra: &str) -> Result<(), InitError> {
    let filter = filter(extra)?;
    let ansi = format == Format::Auto && std::io::stderr().is_terminal();
    let layer = match style {
        // A server's lines are gathered and written in batches (warnings at once).
        Style::Server => {
            let out = crate::buffered::STDERR
                .get_or_init(|| crate::buffered::Buffered::new(std::io::stderr()))
                .clone();
            layer(format, style, out, ansi)
        }
        // A command's lines go out as they are said, in step with its standard output.
        Style::Command => layer(format, style, std::io::stderr, ansi),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init()
        .map_err(|_| InitError::AlreadySet)
}

pub use crate::buffered::flush;

/// A server's JSON subscriber writing to `out` at `info`, as [`init`] sets up for
/// `--log-format json` (lines gathered, see [`crate::buffered`]), to install as a thread's
/// default: the observability-overhead benchmark gives its node's threads one that writes to a
/// file, as an operator's `--log-format json 2>FILE` would.
pub fn json_dispatch(out: impl std::io::Write + Send + 'static) -> tracing::Dispatch {
    let filter = EnvFilter::new(DEFAULT_DIRECTIVES);
    let writer = crate::buffered::Buffered::new(out);
    let layer = layer(Format::Json, Style::Server, writer, false);
    tracing::Dispatch::new(tracing_subscriber::registry().with(filter).with(layer))
}

/// A command's human lines: the message and its fields, prefixed by `warning: ` or `error: ` for
/// those levels and by the level and target for debug and trace.
struct CommandFormat;

impl<S, N> FormatEvent<S, N> for CommandFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        match *meta.level() {
            Level::INFO => {}
            Level::WARN => writer.write_str("warning: ")?,
            Level::ERROR => writer.write_str("error: ")?,
            Level::DEBUG => write!(writer, "debug {}: ", meta.target())?,
            Level::TRACE => write!(writer, "trace {}: ", meta.target())?,
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what it is given.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    fn lines(buf: &Buf) -> Vec<String> {
        String::from_utf8(buf.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn json_lines_carry_the_fields_and_the_request_id() {
        let buf = Buf::default();
        let d = json_dispatch(buf.clone());
        tracing::dispatcher::with_default(&d, || {
            let span = tracing::info_span!("http", request_id = "abc123", route = "/v1/x");
            let _g = span.enter();
            tracing::info!(target: ACCESS_TARGET, status = 200u16, "request");
            tracing::debug!("not at info");
            tracing::warn!("quote \" and\nnewline");
            // openraft names a field `target`: renamed, never a second key.
            tracing::warn!(target = "peer-3", level = 9u8, "vote refused");
        });
        let lines = lines(&buf);
        assert_eq!(lines.len(), 3, "{lines:?}");
        let third = &lines[2];
        assert_eq!(third.matches("\"target\":").count(), 1, "{third}");
        assert_eq!(third.matches("\"level\":").count(), 1, "{third}");
        assert!(third.contains("\"field.target\":\"peer-3\""), "{third}");
        assert!(third.contains("\"field.level\":9"), "{third}");
        let first = &lines[0];
        for needle in [
            "\"level\":\"INFO\"",
            "\"message\":\"request\"",
            "\"status\":200",
            "\"target\":\"florin::access\"",
            "\"request_id\":\"abc123\"",
            "\"timestamp\":",
        ] {
            assert!(first.contains(needle), "{needle} in {first}");
        }
        // A message with a quote and a newline stays one valid line.
        assert!(
            lines[1].contains("quote \\\" and\\nnewline"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn command_lines_are_plain_text() {
        let buf = Buf::default();
        let layer = layer(Format::Human, Style::Command, buf.clone(), false);
        let d = tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(EnvFilter::new("info"))
                .with(layer),
        );
        tracing::dispatcher::with_default(&d, || {
            tracing::info!("cluster up: 3 groups");
            tracing::warn!("disk nearly full");
            tracing::error!(code = 7, "failed");
        });
        assert_eq!(
            lines(&buf),
            [
                "cluster up: 3 groups",
                "warning: disk nearly full",
                "error: failed code=7"
            ]
        );
    }

    #[test]
    fn formats_parse() {
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert_eq!("human".parse::<Format>(), Ok(Format::Human));
        assert!("xml".parse::<Format>().is_err());
    }
}
