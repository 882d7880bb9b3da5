//! The JSON line format: one object per event, written straight into the line buffer.
//!
//! `{"timestamp":"2026-11-27T17:00:00.123456Z","level":"INFO","target":"florin::access",
//! "message":"request","status":200,…,"span":{"name":"http","request_id":"…","route":"…"}}`
//!
//! The event's fields sit at the top level; the innermost span's name and fields under `span`.
//! A span's fields are formatted once, when it is made, as JSON members, and copied into each
//! line as they are — nothing is parsed again per event (tracing-subscriber's own JSON format
//! re-parses a span's fields for every line, which costs more than the rest of a request's
//! logging together).

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Writes `s` as a JSON string (quotes included).
pub(crate) fn string(w: &mut impl fmt::Write, s: &str) -> fmt::Result {
    w.write_char('"')?;
    let mut from = 0;
    for (i, c) in s.char_indices() {
        let esc: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => None,
            _ => continue,
        };
        w.write_str(&s[from..i])?;
        match esc {
            Some(e) => w.write_str(e)?,
            None => write!(w, "\\u{:04x}", c as u32)?,
        }
        from = i + c.len_utf8();
    }
    w.write_str(&s[from..])?;
    w.write_char('"')
}

/// Escapes what is written through it as the inside of a JSON string.
struct Escaper<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaper<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut quoted = String::new();
        if s.bytes()
            .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b != 0xe2)
        {
            return self.0.write_str(s);
        }
        string(&mut quoted, s)?;
        self.0.write_str(&quoted[1..quoted.len() - 1])
    }
}

/// Writes each field as `,"name":value`.
struct Members<'a, W: fmt::Write> {
    w: &'a mut W,
    result: fmt::Result,
}

impl<W: fmt::Write> Members<'_, W> {
    fn key(&mut self, field: &Field) -> fmt::Result {
        self.w.write_char(',')?;
        let name = field.name();
        // A field named like one of the line's own members (openraft logs a `target` field)
        // is renamed: a line never has a key twice.
        if matches!(name, "timestamp" | "level" | "target" | "span") {
            self.w.write_str("\"field.")?;
            self.w.write_str(name)?;
            return self.w.write_str("\":");
        }
        // Records from the `log` crate carry their metadata as `log.*` fields: the line's own
        // members say it already.
        string(self.w, name)?;
        self.w.write_char(':')
    }

    fn put(&mut self, field: &Field, f: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_ok() && !field.name().starts_with("log.") {
            self.result = self.key(field).and_then(|()| f(self.w));
        }
    }
}

impl<W: fmt::Write> Visit for Members<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, |w| string(w, value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, |w| write!(w, "{value}"));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, |w| write!(w, "{value}"));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, |w| write!(w, "{value}"));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.put(field, |w| write!(w, "{value}"));
        } else {
            self.put(field, |w| w.write_str("null"));
        }
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let text = value.to_string();
        self.put(field, |w| string(w, &text));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // Formatted straight into the line through the escaper: no string in between.
        self.put(field, |w| {
            w.write_char('"')?;
            write!(Escaper(w), "{value:?}")?;
            w.write_char('"')
        });
    }
}

/// A span's fields as JSON members (`,"name":value…`), kept with the span.
pub(crate) struct SpanMembers;

impl<'w> FormatFields<'w> for SpanMembers {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut m = Members {
            w: &mut writer,
            result: Ok(()),
        };
        fields.record(&mut m);
        m.result
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        // Members only append: no separator to add.
        self.format_fields(current.as_writer(), fields)
    }
}

/// The event format (see the module's text).
pub(crate) struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
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
        // A record from the `log` crate (rustls, reqwest) under its own target and level.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        writer.write_str("{\"timestamp\":\"")?;
        SystemTime.format_time(&mut writer)?;
        write!(writer, "\",\"level\":\"{}\",\"target\":", meta.level())?;
        string(&mut writer, meta.target())?;
        let mut m = Members {
            w: &mut writer,
            result: Ok(()),
        };
        event.record(&mut m);
        m.result?;
        if let Some(span) = ctx.lookup_current() {
            writer.write_str(",\"span\":{\"name\":")?;
            string(&mut writer, span.name())?;
            let ext = span.extensions();
            if let Some(fields) = ext.get::<FormattedFields<N>>() {
                writer.write_str(fields)?;
            }
            writer.write_char('}')?;
        }
        writer.write_str("}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::string;

    #[test]
    fn strings_are_escaped_as_json_wants() {
        let nasty = "a\"b\\c\nd\re\tf\u{1}g\u{7f}h\u{2028}é🙂";
        let mut out = String::new();
        string(&mut out, nasty).unwrap();
        let back: String = serde_json_free_parse(&out);
        assert_eq!(back, nasty);
    }

    /// A minimal JSON string reader (this crate has no JSON parser).
    fn serde_json_free_parse(s: &str) -> String {
        let inner = &s[1..s.len() - 1];
        let mut out = String::new();
        let mut it = inner.chars();
        while let Some(c) = it.next() {
            if c != '\\' {
                assert!(c != '"' && (c as u32) >= 0x20, "unescaped {c:?} in {s}");
                out.push(c);
                continue;
            }
            match it.next().unwrap() {
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                'u' => {
                    let hex: String = (0..4).map(|_| it.next().unwrap()).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
                }
                other => panic!("bad escape {other}"),
            }
        }
        out
    }
}
