//! A child process that the benchmarks drive one line at a time: a load generator or a payment
//! provider on its emulated host.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

/// The longest [`LineChild::line`] waits: a net for a child that hangs, far beyond any step of
/// a benchmark (a soak's stretch between two readings included).
const LINE_WAIT: Duration = Duration::from_secs(3600);

/// The child, its pipes and the log its stderr goes to. Killed when dropped.
pub(crate) struct LineChild {
    child: Child,
    stdin: ChildStdin,
    /// Its stdout's lines, read by a thread of their own (so a wait can end).
    lines: Receiver<std::io::Result<String>>,
    log: PathBuf,
    /// What it is, for errors ("a load generator").
    what: &'static str,
}

impl LineChild {
    /// Starts `cmd` with piped stdin and stdout and its stderr in `log`.
    pub(crate) fn spawn(mut cmd: Command, log: PathBuf, what: &'static str) -> Result<LineChild> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?);
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(LineChild {
            child,
            stdin,
            lines,
            log,
            what,
        })
    }

    /// Its next line, trimmed, within [`LINE_WAIT`].
    pub(crate) fn line(&mut self) -> Result<String> {
        self.line_within(LINE_WAIT)
    }

    /// Its next line, trimmed; an error with its log's last lines when it has exited or said
    /// nothing within `wait`.
    pub(crate) fn line_within(&mut self, wait: Duration) -> Result<String> {
        let why = match self.lines.recv_timeout(wait) {
            Ok(Ok(s)) => return Ok(s.trim().to_string()),
            Ok(Err(e)) => format!("its output could not be read ({e})"),
            Err(RecvTimeoutError::Disconnected) => "it exited early".to_string(),
            Err(RecvTimeoutError::Timeout) => format!("it said nothing for {wait:?}"),
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        bail!(
            "{}: {why}; its log ends: {}",
            self.what,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }

    /// Its next line, which must be `want`.
    pub(crate) fn expect(&mut self, want: &str) -> Result<()> {
        let l = self.line()?;
        if l != want {
            bail!("{} said {l:?} instead of {want}", self.what);
        }
        Ok(())
    }

    /// Its process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends it one line.
    pub(crate) fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        Ok(())
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
