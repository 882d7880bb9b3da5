//! Bounded requests against a real `florin devnet` process: oversized bodies are refused with
//! 413 without the node's memory growing, rate limits trigger (429, the envelope,
//! `Retry-After`) and recover, and a failing command under `--json` prints the envelope.

#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{florin, Devnet};
use serde_json::Value;

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The status code and body of an HTTP/1.x answer read from `s` (up to 64 KiB).
fn read_answer(s: &mut TcpStream) -> (u16, String) {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf);
                // The answers here are small and carry a Content-Length: stop once whole.
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        break;
                    }
                }
                if buf.len() > 65_536 {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text)
}

fn body_json(answer: &str) -> Value {
    serde_json::from_str(answer.split_once("\r\n\r\n").map_or("", |p| p.1)).unwrap_or(Value::Null)
}

const MIB: usize = 1024 * 1024;

#[test]
fn oversized_bodies_get_413_without_growing_memory() {
    let dir = tempfile::tempdir().unwrap();
    // Plain HTTP on loopback: the requests below are written by hand on raw sockets.
    let net = Devnet::start_with(&dir.path().join("data"), &["--plain-http"]);
    let addr = net.url.trim_start_matches("http://").to_string();
    let pid = net.child.id();
    let (rss_before, _) = memory_kib(pid);

    // 20 clients at once, each announcing a 100 MiB body to a route that buffers bodies,
    // some as JSON, some binary, some with a content type no route takes. Each is answered
    // 413 from its headers alone; then each sends its 100 MiB anyway.
    let routes = [
        ("/v1/deposit", "application/json"),
        ("/v1/ledger/batch", "application/octet-stream"),
        ("/v1/ledger/transactions", "application/json"),
        ("/v1/mailbox", "text/plain"),
        ("/v1/withdraw", "application/x-anything"),
    ];
    let clients: Vec<_> = (0..20)
        .map(|i| {
            let (path, ctype) = routes[i % routes.len()];
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                write!(
                    s,
                    "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\r\n",
                    100 * MIB
                )
                .unwrap();
                // A first piece, then the answer: it comes from the headers alone.
                let _ = s.write_all(&[b'7'; 64 * 1024]);
                let (code, answer) = read_answer(&mut s);
                let chunk = vec![b'7'; MIB];
                // The rest of the body: the node is not reading it (writes fail once it has
                // closed the connection).
                s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                for _ in 1..100 {
                    if s.write_all(&chunk).is_err() {
                        break;
                    }
                }
                (path, code, body_json(&answer))
            })
        })
        .collect();
    for c in clients {
        let (path, code, body) = c.join().unwrap();
        assert_eq!(code, 413, "{path}: {body}");
        assert_eq!(body["error"]["code"], "too_large", "{path}: {body}");
    }

    // A body without a length (chunked) is cut at the route's limit, also 413.
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "POST /v1/mailbox HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .unwrap();
    let piece = vec![b' '; 16 * 1024];
    let mut sent = 0;
    // The node may answer and close as soon as the limit is passed: later writes may fail.
    while sent <= 160 * 1024 {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(&piece);
        chunk.extend_from_slice(b"\r\n");
        if s.write_all(&chunk).is_err() {
            break;
        }
        sent += piece.len();
    }
    let _ = s.write_all(b"0\r\n\r\n");
    let (code, answer) = read_answer(&mut s);
    assert_eq!(code, 413, "{}", body_json(&answer));

    let (rss_after, hwm_after) = memory_kib(pid);
    let grown_mib = hwm_after.saturating_sub(rss_before) / 1024;
    eprintln!(
        "node memory: RSS before {} KiB, after {rss_after} KiB, peak {hwm_after} KiB",
        rss_before
    );
    assert!(
        grown_mib < 200,
        "the node's peak memory grew by {grown_mib} MiB (RSS {} -> {} MiB, peak {} MiB)",
        rss_before / 1024,
        rss_after / 1024,
        hwm_after / 1024
    );
    // The node still serves.
    assert_eq!(net.get("/v1/health")["status"], "ok");
}

/// `GET /v1/health` on a fresh connection: the status, `Retry-After`, and the body.
fn health(addr: &str) -> (u16, Option<u64>, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /v1/health HTTP/1.0\r\n\r\n").unwrap();
    let (code, answer) = read_answer(&mut s);
    let retry = answer.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("retry-after:")
            .map(|v| v.trim().parse::<u64>().unwrap())
    });
    (code, retry, body_json(&answer))
}

#[test]
fn rate_limits_trigger_and_recover_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let net = Devnet::start_with(
        &dir.path().join("data"),
        &["--rate-per-ip", "2", "--rate-burst-ip", "5", "--plain-http"],
    );
    let addr = net.url.trim_start_matches("http://").to_string();
    // The burst (less what the health wait took) passes; then 429.
    let mut answers = Vec::new();
    for _ in 0..8 {
        answers.push(health(&addr));
        if answers.last().unwrap().0 == 429 {
            break;
        }
    }
    let (code, retry, body) = answers.last().unwrap().clone();
    assert_eq!(code, 429, "no request was limited: {answers:?}");
    assert!(answers.len() >= 3, "limited too early: {answers:?}");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let retry = retry.expect("Retry-After");
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    // After the window: served again.
    std::thread::sleep(Duration::from_millis(retry * 1000 + 200));
    let (code, _, body) = health(&addr);
    assert_eq!(code, 200, "{body}");
}

#[test]
fn a_failing_command_prints_the_envelope_under_json() {
    let dir = tempfile::tempdir().unwrap();
    let net = Devnet::start(&dir.path().join("data"));
    let w = |args: &[&str]| {
        let mut a = vec!["wallet", "--wallet", "w.json", "--json"];
        a.extend_from_slice(args);
        florin(dir.path(), &net.url, &a)
    };
    assert!(w(&["new", "--no-passphrase"]).status.success());
    // Over the faucet's limit: the node refuses (400), the command fails with its envelope.
    let out = w(&["faucet", "20000"]);
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "bad_request", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("faucet"),
        "{v}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: "), "{err}");
    // No node: `unreachable`.
    let out = florin(
        dir.path(),
        "http://127.0.0.1:9",
        &["wallet", "--wallet", "w.json", "--json", "faucet", "1"],
    );
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "unreachable", "{v}");
}
