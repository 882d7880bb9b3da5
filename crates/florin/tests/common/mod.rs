//! What the CLI's test files share: the `florin` binary, a devnet process on loopback, running
//! `florin` commands, and plain HTTP GETs.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_florin");

/// Starts a server process and reads the URL it prints first (`listening on URL`).
pub fn spawn_listening(mut cmd: Command) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("the process prints its URL first, got {line:?}"))
        .to_string();
    (child, url)
}

/// `florin ARGS` in `dir` against the node at `node`.
pub fn florin(dir: &Path, node: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(dir)
        .env("FLORIN_NODE", node)
        .args(args)
        .output()
        .unwrap()
}

/// GET `path` from `addr` (`host:port`) over HTTP/1.0: the whole answer, head and body.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    buf
}

/// A `florin devnet` process, killed when dropped.
pub struct Devnet {
    pub child: Child,
    pub url: String,
}

impl Devnet {
    pub fn start(data: &Path) -> Devnet {
        Self::start_with(data, &[])
    }

    pub fn start_with(data: &Path, extra: &[&str]) -> Devnet {
        let mut cmd = Command::new(BIN);
        cmd.args(["devnet", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(extra);
        let (child, url) = spawn_listening(cmd);
        let d = Devnet { child, url };
        d.wait_healthy();
        d
    }

    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr = self.url.trim_start_matches("http://").to_string();
        while Instant::now() < deadline {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                let _ = s.write_all(b"GET /v1/health HTTP/1.0\r\n\r\n");
                let mut buf = String::new();
                let _ = s.read_to_string(&mut buf);
                if buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("devnet did not become healthy");
    }

    /// GET `path` (JSON).
    pub fn get(&self, path: &str) -> Value {
        let buf = http_get(self.url.trim_start_matches("http://"), path);
        let body = buf.split("\r\n\r\n").nth(1).unwrap_or("");
        serde_json::from_str(body).unwrap()
    }

    /// `kill -9`.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `kill -9` once the acknowledgement mark has had time to follow (it is written every
    /// 100 ms).
    pub fn crash(mut self) {
        std::thread::sleep(Duration::from_millis(400));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Devnet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
