//! Device-to-device payments as a user runs them: two wallet processes on loopback, the payee
//! listening, the payer dialing it; a connection cut mid-transfer; a peer with the wrong key;
//! QR codes in one and in many parts. No node is needed: the wallets are offline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_node::{Authority, AuthorityConfig};
use florin_token::Denomination;
use florin_wallet::{FileStore, Wallet, WalletStore};
use rand::rngs::OsRng;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_florin");

/// A payer holding `n` one-euro tokens and two empty wallets (payee, stranger), all trusting
/// the same authority. Returns their paths.
fn wallets(dir: &Path, n: usize) -> (PathBuf, PathBuf, PathBuf) {
    wallets_with(dir, n, 0)
}

/// As [`wallets`], the stranger holding `m` one-euro tokens (a second payer).
fn wallets_with(dir: &Path, n: usize, m: usize) -> (PathBuf, PathBuf, PathBuf) {
    let signer = std::sync::Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng)));
    let authority = Authority::open(
        AuthorityConfig::devnet(dir.join("authority")),
        signer.clone(),
    )
    .unwrap();
    let mut payer = Wallet::generate(&mut OsRng, Some(signer.public_key()));
    let hs = Wallet::fresh_handshake(&mut OsRng);
    let tokens = authority
        .mint_tokens(payer.public_key(), &vec![Denomination::E1; n], hs)
        .unwrap();
    payer.accept_issued(tokens, &hs, &mut OsRng).unwrap();
    let mut second = Wallet::generate(&mut OsRng, Some(signer.public_key()));
    if m > 0 {
        let hs = Wallet::fresh_handshake(&mut OsRng);
        let tokens = authority
            .mint_tokens(second.public_key(), &vec![Denomination::E1; m], hs)
            .unwrap();
        second.accept_issued(tokens, &hs, &mut OsRng).unwrap();
    }
    let paths: Vec<PathBuf> = ["payer", "payee", "stranger"]
        .iter()
        .map(|n| dir.join(format!("{n}.json")))
        .collect();
    FileStore::new(&paths[0]).save(&payer).unwrap();
    let mut payee = Wallet::generate(&mut OsRng, Some(signer.public_key()));
    payee.max_offline_cents = u64::MAX / 4;
    FileStore::new(&paths[1]).save(&payee).unwrap();
    second.max_offline_cents = u64::MAX / 4;
    FileStore::new(&paths[2]).save(&second).unwrap();
    (paths[0].clone(), paths[1].clone(), paths[2].clone())
}

fn wallet(path: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("wallet")
        .arg("--wallet")
        .arg(path)
        .arg("--json")
        .args(args)
        .output()
        .unwrap()
}

fn ok(path: &Path, args: &[&str]) -> Value {
    let out = wallet(path, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn balance(path: &Path) -> Value {
    ok(path, &["balance"])
}

/// A payee listening for `count` payments.
struct Listening {
    child: Child,
    at: SocketAddr,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Listening {
    fn start(path: &Path, count: usize) -> Listening {
        let mut child = Command::new(BIN)
            .arg("wallet")
            .arg("--wallet")
            .arg(path)
            .args([
                "--json",
                "offline",
                "listen",
                "--listen",
                "127.0.0.1:0",
                "--no-announce",
                "--count",
            ])
            .arg(count.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert_eq!(first["event"], "listening");
        let at = first["at"].as_str().unwrap().parse().unwrap();
        Listening { child, at, lines }
    }

    fn next_event(&mut self) -> Value {
        serde_json::from_str(&self.lines.next().unwrap().unwrap()).unwrap()
    }

    fn wait(mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success());
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("the listener did not finish");
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn one_token_then_forty_thousand_between_two_wallet_processes() {
    let dir = tempfile::tempdir().unwrap();
    let (payer, payee, _) = wallets(dir.path(), 40_001);
    let mut l = Listening::start(&payee, 2);
    let at = l.at.to_string();
    let payee_addr = ok(&payee, &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    // HOST:PORT alone is refused in a script (no terminal to confirm the key on): the payer
    // must name whom it pays.
    let anon = wallet(&payer, &["offline", "pay", "1", "--peer", &at]);
    assert!(String::from_utf8_lossy(&anon.stderr).contains("name the payee"));
    let keyed = format!("{payee_addr}@{at}");
    let one = ok(&payer, &["offline", "pay", "1", "--peer", &keyed]);
    assert_eq!(
        (one["amount_cents"].as_u64(), one["tokens"].as_u64()),
        (Some(100), Some(1))
    );
    assert_eq!(l.next_event()["amount_cents"], 100);
    let big = ok(&payer, &["offline", "pay", "40000", "--peer", &keyed]);
    assert_eq!(big["tokens"], 40_000);
    let ev = l.next_event();
    assert_eq!(
        (ev["amount_cents"].as_u64(), ev["tokens"].as_u64()),
        (Some(4_000_000), Some(40_000))
    );
    l.wait();
    let b = balance(&payee);
    assert_eq!(b["offline_cents"], 4_000_100);
    let p = balance(&payer);
    assert_eq!(
        (p["total_cents"].as_u64(), p["undelivered_cents"].as_u64()),
        (Some(0), Some(0))
    );
}

/// Forwards connections to `to`, cutting the first one after `cut` bytes from the client;
/// later connections pass in small pieces with short delays (fragmentation and delay).
fn flaky_proxy(to: SocketAddr, cut: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let c2 = conns.clone();
    std::thread::spawn(move || {
        for (i, client) in l.incoming().enumerate().take(8) {
            let Ok(client) = client else { return };
            c2.fetch_add(1, Ordering::SeqCst);
            let server = TcpStream::connect(to).unwrap();
            let limit = if i == 0 { Some(cut) } else { None };
            let (mut c_r, mut s_w) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut s_r, mut c_w) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while let Ok(n) = s_r.read(&mut buf) {
                    if n == 0 || c_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_w.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let mut buf = [0u8; 7919];
                let mut total = 0usize;
                let mut k = 0u32;
                while let Ok(n) = c_r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Some(cut) = limit {
                        if total + n > cut {
                            let _ = s_w.write_all(&buf[..cut - total]);
                            let _ = s_w.shutdown(std::net::Shutdown::Both);
                            let _ = c_r.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                    }
                    total += n;
                    // Odd-sized pieces, now and then a pause.
                    for piece in buf[..n].chunks(1 + (k as usize * 131) % 3000) {
                        if s_w.write_all(piece).is_err() {
                            return;
                        }
                    }
                    k += 1;
                    if k.is_multiple_of(64) {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                let _ = s_w.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (addr, conns)
}

#[test]
fn a_transfer_cut_mid_way_is_finished_once_by_running_the_command_again() {
    let dir = tempfile::tempdir().unwrap();
    let (payer, payee, _) = wallets(dir.path(), 6_000);
    let mut l = Listening::start(&payee, 1);
    // 6,000 two-link tokens are about 2.2 MB: cut after 1 MB.
    let (proxy, conns) = flaky_proxy(l.at, 1 << 20);
    let payee_addr = ok(&payee, &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    let at = format!("{payee_addr}@{proxy}");
    let cut = wallet(&payer, &["offline", "pay", "6000", "--peer", &at]);
    assert!(!cut.status.success());
    let err = String::from_utf8_lossy(&cut.stderr);
    assert!(err.contains("run the same command again"), "{err}");
    // Both wallets agree nothing arrived: the payer knows the payment is undelivered.
    let p = balance(&payer);
    assert_eq!(
        (p["total_cents"].as_u64(), p["undelivered_cents"].as_u64()),
        (Some(0), Some(600_000))
    );
    assert_eq!(balance(&payee)["offline_cents"], 0);
    // Again, through fragmenting and delaying connections: delivered exactly once.
    let again = ok(&payer, &["offline", "pay", "6000", "--peer", &at]);
    assert_eq!(again["resumed_cents"], serde_json::json!([600_000]));
    assert_eq!(again["amount_cents"], 0, "a retry never pays twice");
    assert_eq!(l.next_event()["amount_cents"], 600_000);
    l.wait();
    assert_eq!(balance(&payee)["offline_cents"], 600_000);
    assert_eq!(balance(&payer)["undelivered_cents"], 0);
    assert_eq!(conns.load(Ordering::SeqCst), 2);
}

#[test]
fn a_peer_holding_another_key_is_refused_before_anything_is_signed() {
    let dir = tempfile::tempdir().unwrap();
    let (payer, payee, stranger) = wallets(dir.path(), 3);
    let l = Listening::start(&payee, 1);
    let stranger_addr = ok(&stranger, &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    let out = wallet(
        &payer,
        &[
            "offline",
            "pay",
            "1",
            "--peer",
            &format!("{stranger_addr}@{}", l.at),
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the requested"));
    assert_eq!(balance(&payer)["total_cents"], 300);
    // Garbage on the payee's port does not stop it.
    let mut s = TcpStream::connect(l.at).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    drop(s);
    let payee_addr = ok(&payee, &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        &payer,
        &[
            "offline",
            "pay",
            "1",
            "--peer",
            &format!("{payee_addr}@{}", l.at),
        ],
    );
    l.wait();
    assert_eq!(balance(&payee)["offline_cents"], 100);
}

fn address(path: &Path) -> String {
    ok(path, &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Starts `offline pay CENTS/100 --peer PEER` from `path` without waiting for it.
fn start_paying(path: &Path, euros: &str, peer: &str) -> Child {
    Command::new(BIN)
        .arg("wallet")
        .arg("--wallet")
        .arg(path)
        .args(["--json", "offline", "pay", euros, "--peer", peer])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a payer started by [`start_paying`], at most `bound`; its JSON answer.
fn paid_within(mut child: Child, bound: Duration) -> Value {
    let until = Instant::now() + bound;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("the payer was not served within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_silent_connection_does_not_hold_up_a_payer() {
    let dir = tempfile::tempdir().unwrap();
    let (payer, payee, _) = wallets(dir.path(), 2);
    let mut l = Listening::start(&payee, 1);
    // Connected and silent: before, it held the listener in its handshake for 30 s.
    let idle = TcpStream::connect(l.at).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let peer = format!("{}@{}", address(&payee), l.at);
    // Well under the 30 s a silent peer may take per message.
    let got = paid_within(start_paying(&payer, "1", &peer), Duration::from_secs(10));
    assert_eq!(got["delivered"], true);
    assert!(started.elapsed() < Duration::from_secs(10));
    let ev = l.next_event();
    assert_eq!(
        (ev["event"].as_str(), ev["amount_cents"].as_u64()),
        (Some("received"), Some(100))
    );
    // `--count 1` reached: the listener stops without waiting for the silent handshake.
    let stopping = Instant::now();
    l.wait();
    assert!(stopping.elapsed() < Duration::from_secs(10));
    drop(idle);
    assert_eq!(balance(&payee)["offline_cents"], 100);
    assert_eq!(balance(&payer)["total_cents"], 100);
}

#[test]
fn two_payers_at_once_are_both_served() {
    let dir = tempfile::tempdir().unwrap();
    let (first, payee, second) = wallets_with(dir.path(), 3, 3);
    let mut l = Listening::start(&payee, 2);
    // A payer that completed its handshake and says nothing holds a session open meanwhile.
    let silent = LocalSigner::new(SecretKey::generate(&mut OsRng));
    let held =
        florin_net::connect(l.at, &silent, None, &florin_net::ChannelConfig::default()).unwrap();
    let idle = TcpStream::connect(l.at).unwrap();
    let peer = format!("{}@{}", address(&payee), l.at);
    let started = Instant::now();
    let a = start_paying(&first, "1", &peer);
    let b = start_paying(&second, "2", &peer);
    let (a, b) = (
        paid_within(a, Duration::from_secs(20)),
        paid_within(b, Duration::from_secs(20)),
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(
        (a["amount_cents"].as_u64(), b["amount_cents"].as_u64()),
        (Some(100), Some(200))
    );
    let mut got = [l.next_event(), l.next_event()]
        .iter()
        .map(|e| e["amount_cents"].as_u64().unwrap())
        .collect::<Vec<_>>();
    got.sort_unstable();
    assert_eq!(got, [100, 200]);
    // The count is reached; the silent session ends when its payer goes.
    drop(held);
    let stopping = Instant::now();
    l.wait();
    assert!(stopping.elapsed() < Duration::from_secs(10));
    drop(idle);
    assert_eq!(balance(&payee)["offline_cents"], 300);
    assert_eq!(balance(&first)["total_cents"], 200);
    assert_eq!(balance(&second)["total_cents"], 100);
}

#[test]
fn listens_on_this_device_only_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (_, payee, _) = wallets(dir.path(), 1);
    // `--count 0` prints where it listens and stops.
    let out = wallet(
        &payee,
        &["offline", "listen", "--no-announce", "--count", "0"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let first: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
        assert_eq!(first["event"], "listening");
        let at = first["at"].as_str().unwrap();
        assert!(at.starts_with("127.0.0.1:"), "listening on {at}");
    } else {
        // The default port is taken on this machine: the error still names the address.
        assert!(
            stderr.contains("cannot listen on 127.0.0.1:7475"),
            "{stderr}"
        );
    }
}

#[test]
fn qr_codes_in_one_and_many_parts_and_replayed_or_foreign_codes_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (payer, payee, stranger) = wallets(dir.path(), 20);
    let d = dir.path();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // One part: a €1 request and payment.
    ok(
        &payee,
        &["offline", "request", "1", "--qr", &s(&d.join("req1.png"))],
    );
    let p1 = ok(
        &payer,
        &[
            "offline",
            "pay",
            &s(&d.join("req1.png")),
            "--qr",
            &s(&d.join("pay1.png")),
        ],
    );
    assert_eq!(p1["qr"].as_array().unwrap().len(), 1);
    // Someone who photographed the code cannot use it; the payee can, once.
    let foreign = wallet(
        &stranger,
        &["offline", "accept", "--qr", &s(&d.join("pay1.png"))],
    );
    assert!(!foreign.status.success());
    assert!(String::from_utf8_lossy(&foreign.stderr).contains("not to this wallet"));
    assert_eq!(
        ok(
            &payee,
            &["offline", "accept", "--qr", &s(&d.join("pay1.png"))]
        )["accepted_cents"],
        100
    );
    let replay = wallet(
        &payee,
        &["offline", "accept", "--qr", &s(&d.join("pay1.png"))],
    );
    assert!(!replay.status.success());
    // Many parts: €12 in twelve tokens is over 4 KB; parts scanned in reverse order.
    ok(
        &payee,
        &["offline", "request", "12", "--qr", &s(&d.join("req12.png"))],
    );
    let p12 = ok(
        &payer,
        &[
            "offline",
            "pay",
            &s(&d.join("req12.png")),
            "--qr",
            &s(&d.join("pay12.png")),
        ],
    );
    let files: Vec<String> = p12["qr"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert!(files.len() >= 4, "{files:?}");
    assert!(files.last().unwrap().ends_with(".gif"));
    let mut pngs: Vec<String> = files
        .iter()
        .filter(|f| f.ends_with(".png"))
        .cloned()
        .collect();
    pngs.reverse();
    // A missing part is named.
    let mut partial = vec!["offline", "accept", "--qr"];
    partial.extend(pngs[1..].iter().map(|x| x.as_str()));
    let missing = wallet(&payee, &partial);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("parts missing"));
    let mut args = vec!["offline", "accept", "--qr"];
    args.extend(pngs.iter().map(|x| x.as_str()));
    assert_eq!(ok(&payee, &args)["accepted_cents"], 1200);
    // The animated GIF carries the same payment: already accepted, so refused as a replay.
    let gif = wallet(
        &payee,
        &["offline", "accept", "--qr", files.last().unwrap()],
    );
    assert!(!gif.status.success());
    assert!(String::from_utf8_lossy(&gif.stderr).contains("replayed"));
    assert_eq!(balance(&payee)["offline_cents"], 1300);
}

/// A payee sees its open requests and what they reserve of the offline limit, and can cancel
/// them (a stranger's asks to a listening wallet would otherwise hold the limit for good); a
/// payment for a cancelled request is refused.
#[test]
fn open_requests_are_listed_and_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (payer, payee, _) = wallets(dir.path(), 3);
    let d = dir.path();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let r1 = ok(
        &payee,
        &["offline", "request", "1", "--out", &s(&d.join("r1"))],
    );
    ok(
        &payee,
        &["offline", "request", "2", "--out", &s(&d.join("r2"))],
    );
    let h1 = r1["handshake"].as_str().unwrap().to_string();
    let listed = ok(&payee, &["offline", "requests"]);
    assert_eq!(listed["requests"].as_array().unwrap().len(), 2);
    assert_eq!(listed["reserved_cents"], 300);
    assert_eq!(listed["cancelled"], 0);

    ok(
        &payer,
        &[
            "offline",
            "pay",
            &s(&d.join("r1")),
            "--out",
            &s(&d.join("p1")),
        ],
    );
    let after = ok(&payee, &["offline", "requests", "--cancel", &h1]);
    assert_eq!(after["cancelled"], 1);
    assert_eq!(after["reserved_cents"], 200);
    // The payment for the cancelled request is refused, and nothing is credited.
    assert!(!wallet(&payee, &["offline", "accept", &s(&d.join("p1"))])
        .status
        .success());
    assert_eq!(balance(&payee)["offline_cents"], 0);
    // Unknown or malformed handshakes are errors that change nothing.
    assert!(!wallet(&payee, &["offline", "requests", "--cancel", &h1])
        .status
        .success());
    assert!(!wallet(&payee, &["offline", "requests", "--cancel", "zz"])
        .status
        .success());
    let all = ok(&payee, &["offline", "requests", "--cancel-all"]);
    assert_eq!(all["cancelled"], 1);
    assert_eq!(all["requests"].as_array().unwrap().len(), 0);
}
