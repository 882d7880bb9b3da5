//! Payment service providers over real sockets: a ledger node (embedded store), two providers
//! each with its own key-management network (in this process, real Noise links) — provider A
//! with threshold ECDSA P-256 customers (insecure-test level, so set-up takes seconds),
//! provider B with FROST Ed25519 customers — paying within a provider (UC1), across providers
//! (UC2) both ways, to a plain ledger key, refusing bad input, and resolving a payment whose
//! confirmation was lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{request, runtime, LedgerNode};
use florin_crypto::SecretKey;
use florin_ledger::{Encumbrance, Utxo};
use florin_node::custody::{free_loopback_addrs, EcdsaLevel, Kmn, Layout, RunningNode};
use florin_node::psp::{Psp, PspConfig, PspScheme};
use serde_json::{json, Value};

fn http(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    request(
        addr,
        method,
        path,
        body.as_deref().map(|b| ("application/json", b.as_bytes())),
        Some(Duration::from_secs(120)),
    )
}

fn ok(r: (u16, Value)) -> Value {
    assert_eq!(r.0, 200, "{}", r.1);
    r.1
}

fn refused(r: (u16, Value), code: u16, what: &str) -> Value {
    assert_eq!(r.0, code, "{}", r.1);
    assert_eq!(r.1["error"]["code"], what, "{}", r.1);
    r.1
}

impl LedgerNode {
    fn unspent(&self, utxo_hex: &str) -> bool {
        let u = Utxo::decode(&hex::decode(utxo_hex).unwrap()).unwrap();
        let v = ok(http(
            self.addr,
            "GET",
            &format!("/v1/ledger/unspent/{}", hex::encode(u.id())),
            None,
        ));
        v["unspent"].as_bool().unwrap()
    }
}

/// A provider: its network (nodes in this process) and its API on loopback.
struct Provider {
    addr: SocketAddr,
    kmn: Arc<Kmn>,
    books: std::path::PathBuf,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _nodes: Vec<RunningNode>,
    _dir: tempfile::TempDir,
}

fn network(dir: &std::path::Path, scheme: PspScheme) -> (Vec<RunningNode>, Arc<Kmn>) {
    let layout = Layout::new(&dir.join("kmn"));
    layout.create(2, &free_loopback_addrs(3).unwrap()).unwrap();
    if scheme == PspScheme::P256 {
        layout.set_ecdsa(Some(EcdsaLevel::InsecureTest)).unwrap();
    }
    let nodes = layout.start_in_process().unwrap();
    let (net, me) = layout.load().unwrap();
    let kmn = Kmn::new(&net, me).unwrap();
    if scheme == PspScheme::P256 {
        kmn.ecdsa_setup(Duration::from_secs(120)).unwrap();
    }
    (nodes, kmn)
}

impl Provider {
    fn start(name: &str, scheme: PspScheme, ledger: &str) -> Provider {
        let dir = tempfile::tempdir().unwrap();
        let (nodes, kmn) = network(dir.path(), scheme);
        let books = dir.path().join("psp.redb");
        let rt = runtime();
        let mut p = Provider {
            addr: "127.0.0.1:1".parse().unwrap(),
            kmn,
            books,
            rt,
            stop: None,
            server: None,
            _nodes: nodes,
            _dir: dir,
        };
        p.serve(name, scheme, ledger);
        p
    }

    /// (Re)opens the books and serves them.
    fn serve(&mut self, name: &str, scheme: PspScheme, ledger: &str) {
        let psp = Psp::open(
            PspConfig {
                name: name.into(),
                books: self.books.clone(),
                ledger: ledger.into(),
                scheme,
                presign_pool: 1,
            },
            self.kmn.clone(),
            Arc::new(florin_http::HttpLinks::new().unwrap()),
        )
        .unwrap();
        let listener = self
            .rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        self.addr = listener.local_addr().unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        self.stop = Some(stop);
        self.server = Some(self.rt.spawn(florin_http::psp::serve(listener, psp, async {
            let _ = rx.await;
        })));
    }

    /// Stops serving and closes the books.
    fn halt(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.server.take() {
            self.rt.block_on(h).unwrap().unwrap();
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        http(self.addr, method, path, body)
    }

    fn balance(&self, name: &str) -> u64 {
        ok(self.call("GET", &format!("/v1/psp/accounts/{name}"), None))["balance_cents"]
            .as_u64()
            .unwrap()
    }

    fn pay(&self, from: &str, to: &str, to_psp: Option<&str>, cents: u64) -> (u16, Value) {
        self.call(
            "POST",
            "/v1/psp/pay",
            Some(json!({"from": from, "to": to, "to_psp": to_psp, "amount_cents": cents})),
        )
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

#[test]
fn same_and_cross_provider_payments_settle_on_the_ledger_and_bad_input_is_refused() {
    let node = LedgerNode::start();
    let ledger = format!("http://{}", node.addr);
    let a = Provider::start("bank-a", PspScheme::P256, &ledger);
    let b = Provider::start("bank-b", PspScheme::Ed25519, &ledger);

    // Accounts: keys by distributed key generation in each provider's own network.
    let alice = ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "alice"}))));
    assert_eq!(alice["scheme"], "p256");
    assert!(alice["encumbrance"].as_str().unwrap().starts_with("p256:"));
    ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "bob"}))));
    let carol = ok(b.call("POST", "/v1/psp/accounts", Some(json!({"name": "carol"}))));
    assert!(carol["encumbrance"]
        .as_str()
        .unwrap()
        .starts_with("ed25519:"));
    refused(
        a.call("POST", "/v1/psp/accounts", Some(json!({"name": "alice"}))),
        409,
        "exists",
    );
    for bad in ["", "Alice", "a/b", &"x".repeat(49)] {
        refused(
            a.call("POST", "/v1/psp/accounts", Some(json!({"name": bad}))),
            400,
            "bad_request",
        );
    }
    let info = ok(a.call("GET", "/v1/psp/info", None));
    assert_eq!((info["t"].as_u64(), info["n"].as_u64()), (Some(2), Some(3)));
    assert_eq!(info["accounts"], 2);

    // Funding from the ledger's faucet, to a P-256 encumbrance.
    ok(a.call(
        "POST",
        "/v1/psp/accounts/alice/faucet",
        Some(json!({"amount_cents": 10_000})),
    ));
    assert_eq!(a.balance("alice"), 10_000);

    // UC1: alice pays bob at the same provider.
    let r = ok(a.pay("alice", "bob", None, 1_000));
    assert_eq!(r["route"], "same_provider");
    assert!(node.unspent(r["payee_output"].as_str().unwrap()));
    assert!(node.unspent(r["change_output"].as_str().unwrap()));
    assert_eq!(a.balance("alice"), 9_000);
    assert_eq!(a.balance("bob"), 1_000);

    // UC2: alice (threshold ECDSA) pays carol at provider B (FROST), and back.
    let r = ok(a.pay("alice", "carol", Some(&b.url()), 500));
    assert_eq!(r["route"], "cross_provider");
    assert_eq!(r["notified"], true, "{r}");
    assert_eq!(b.balance("carol"), 500);
    assert_eq!(a.balance("alice"), 8_500);
    let carol_coin = r["payee_output"].as_str().unwrap().to_string();
    let r2 = ok(b.pay("carol", "bob", Some(&a.url()), 200));
    assert_eq!(r2["notified"], true, "{r2}");
    assert_eq!(b.balance("carol"), 300);
    assert_eq!(a.balance("bob"), 1_200);

    // Replaying a notice changes nothing, even after the coin is spent; forged outputs are
    // not credited.
    let replay = ok(b.call(
        "POST",
        "/v1/psp/receive",
        Some(json!({"outputs": [carol_coin], "from": "replayer"})),
    ));
    assert_eq!(replay["results"][0]["outcome"], "known");
    let r3 = ok(a.pay("alice", "carol", Some(&b.url()), 100));
    let fresh = r3["payee_output"].as_str().unwrap().to_string();
    assert_eq!(b.balance("carol"), 400);
    let again = ok(b.call(
        "POST",
        "/v1/psp/receive",
        Some(json!({"outputs": [fresh.clone()]})),
    ));
    assert_eq!(again["results"][0]["outcome"], "known");
    let mut forged = Utxo::decode(&hex::decode(&fresh).unwrap()).unwrap();
    forged.value = 1_000_000;
    let f = ok(b.call(
        "POST",
        "/v1/psp/receive",
        Some(json!({"outputs": [hex::encode(forged.encode())]})),
    ));
    assert_eq!(f["results"][0]["outcome"], "not_unspent");
    assert_eq!(b.balance("carol"), 400);
    let stranger = Utxo {
        encumbrance: Encumbrance::ed25519(&SecretKey::from_seed(&[1; 32]).public_key()),
        ..forged
    };
    let s = ok(b.call(
        "POST",
        "/v1/psp/receive",
        Some(json!({"outputs": [hex::encode(stranger.encode())]})),
    ));
    assert_eq!(s["results"][0]["outcome"], "not_ours");
    for junk in [
        json!({"outputs": ["zz"]}),
        json!({"outputs": ["00"]}),
        json!({"outputs": [fresh.clone(), fresh.clone()]}),
        json!({"outputs": vec![fresh.clone(); 257]}),
    ] {
        refused(
            b.call("POST", "/v1/psp/receive", Some(junk)),
            400,
            "bad_request",
        );
    }
    // A body of the wrong shape is `malformed`, in the same envelope.
    refused(
        b.call("POST", "/v1/psp/receive", Some(json!({"nope": 1}))),
        400,
        "malformed",
    );
    refused(
        a.call("POST", "/v1/psp/pay", Some(json!({"from": "alice"}))),
        400,
        "malformed",
    );
    // The edge answers in the envelope too: unknown route, wrong method, wrong content
    // type, a body that is not JSON, a body over the route's limit.
    refused(a.call("GET", "/v1/psp/nope", None), 404, "not_found");
    refused(
        a.call("GET", "/v1/psp/pay", None),
        405,
        "method_not_allowed",
    );
    let raw = |ctype: &str, body: &[u8]| {
        common::request(a.addr, "POST", "/v1/psp/pay", Some((ctype, body)), None)
    };
    refused(raw("text/plain", b"{}"), 415, "unsupported_media_type");
    refused(raw("application/json", b"{\"from"), 400, "malformed");
    let big = vec![b' '; florin_http::psp::limits::SMALL + 1];
    refused(raw("application/json", &big), 413, "too_large");
    refused(raw("image/png", &big), 413, "too_large");

    // Refusals: each typed, nothing moves.
    refused(
        a.pay("bob", "alice", None, 50_000),
        409,
        "insufficient_funds",
    );
    refused(a.pay("nobody", "alice", None, 1), 404, "not_found");
    refused(a.pay("alice", "nobody", None, 1), 404, "not_found");
    refused(a.pay("alice", "alice", None, 1), 400, "bad_request");
    refused(a.pay("alice", "bob", None, 0), 400, "bad_request");
    refused(
        a.pay("alice", "nobody", Some(&b.url()), 1),
        404,
        "not_found",
    );
    refused(
        a.pay("alice", "carol", Some("http://127.0.0.1:1"), 1),
        502,
        "unreachable",
    );
    refused(
        a.pay("alice", "carol", Some("not a url"), 1),
        400,
        "bad_request",
    );
    refused(
        a.call(
            "POST",
            "/v1/psp/accounts/alice/faucet",
            Some(json!({"amount_cents": 0})),
        ),
        400,
        "bad_request",
    );
    assert_eq!(a.balance("alice"), 8_400);
    assert_eq!(a.balance("bob"), 1_200);

    // A provider named as the payee's provider that answers with one of our own customers:
    // paid here, never trusting another provider to credit it.
    let r = ok(a.pay("alice", "bob", Some(&a.url()), 100));
    assert_eq!(r["route"], "same_provider");
    assert_eq!(a.balance("bob"), 1_300);

    // A payment id: the retried request is answered with the first receipt, nothing more paid.
    let pay_id = |from: &str, id: &str| {
        a.call(
            "POST",
            "/v1/psp/pay",
            Some(json!({"from": from, "to": "bob", "amount_cents": 100, "id": id})),
        )
    };
    let first = ok(pay_id("alice", "order-17"));
    let again = ok(pay_id("alice", "order-17"));
    assert_eq!(first["txid"], again["txid"]);
    assert_eq!(
        (first["repeated"].as_bool(), again["repeated"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!(a.balance("bob"), 1_400);
    refused(pay_id("bob", "order-17"), 409, "exists");
    refused(pay_id("alice", ""), 400, "bad_request");
    assert_eq!(a.balance("alice"), 8_200);

    // A plain ledger key: the payment is on the ledger, no provider is told.
    let outsider = Encumbrance::ed25519(&SecretKey::from_seed(&[2; 32]).public_key());
    let r = ok(a.pay("alice", &outsider.to_text(), None, 300));
    assert_eq!(r["route"], "ledger");
    assert!(node.unspent(r["payee_output"].as_str().unwrap()));
    assert_eq!(a.balance("alice"), 7_900);

    // History, oldest first.
    let h = ok(a.call("GET", "/v1/psp/accounts/bob/history", None));
    let lines: Vec<(String, u64)> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["direction"].as_str().unwrap().to_string(),
                e["amount_cents"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        lines,
        vec![
            ("in".into(), 1_000),
            ("in".into(), 200),
            ("in".into(), 100),
            ("in".into(), 100)
        ]
    );
    refused(
        a.call("GET", "/v1/psp/accounts/nobody/history", None),
        404,
        "not_found",
    );

    // Money is conserved: what the providers hold plus the outsider's output is what the
    // faucet minted.
    let held = a.balance("alice") + a.balance("bob") + b.balance("carol");
    assert_eq!(held + 300, 10_000);
}

/// Forwards to the ledger; while `drop_replies` is set it forwards requests but closes the
/// connection instead of relaying the answer: the ledger decides, the provider never hears.
fn lossy_proxy(to: SocketAddr, drop_replies: Arc<AtomicBool>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut client) = c else { return };
            let Ok(mut up) = TcpStream::connect(to) else {
                continue;
            };
            let drop_now = drop_replies.clone();
            let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut u2);
                let _ = u2.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match up.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => {
                            if drop_now.load(Ordering::SeqCst) {
                                break;
                            }
                            if client.write_all(&buf[..k]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = up.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

#[test]
fn a_lost_confirmation_is_resolved_once_and_the_books_survive_a_restart() {
    let node = LedgerNode::start();
    let drop_replies = Arc::new(AtomicBool::new(false));
    let proxy = lossy_proxy(node.addr, drop_replies.clone());
    let ledger = format!("http://{proxy}");
    let mut a = Provider::start("bank-a", PspScheme::Ed25519, &ledger);
    for n in ["dora", "erin", "fay"] {
        ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": n}))));
    }
    ok(a.call(
        "POST",
        "/v1/psp/accounts/dora/faucet",
        Some(json!({"amount_cents": 5_000})),
    ));

    // The ledger confirms, but the answer is lost: the payment is unresolved, not failed.
    drop_replies.store(true, Ordering::SeqCst);
    let pay_d1 = || {
        a.call(
            "POST",
            "/v1/psp/pay",
            Some(json!({"from": "dora", "to": "erin", "amount_cents": 1_500, "id": "d1"})),
        )
    };
    let err = refused(pay_d1(), 503, "unresolved");
    let v = ok(a.call("GET", "/v1/psp/accounts/dora", None));
    assert_eq!(v["unresolved"], 1, "{v}");
    // While unresolved the account cannot pay again (it would not know its coins), and the
    // retried request is not paid a second time.
    refused(a.pay("dora", "erin", None, 10), 503, "unresolved");
    refused(pay_d1(), 503, "unresolved");

    // Meanwhile someone hands erin's output to `receive` (it is unspent on the ledger), and
    // erin spends it. Applying the payment later must not bring the spent coin back.
    drop_replies.store(false, Ordering::SeqCst);
    let msg = err["error"]["message"].as_str().unwrap();
    let txid_hex = msg
        .split_whitespace()
        .find(|w| w.len() == 64 && hex::decode(w).is_ok())
        .unwrap();
    let txid: [u8; 32] = hex::decode(txid_hex).unwrap().try_into().unwrap();
    let erin_enc = ok(a.call("GET", "/v1/psp/accounts/erin", None))["encumbrance"]
        .as_str()
        .unwrap()
        .to_string();
    let erin_coin = Utxo {
        value: 1_500,
        encumbrance: Encumbrance::parse_text(&erin_enc).unwrap(),
        serial: florin_ledger::tx::output_serial(&txid, 0),
    };
    let got = ok(a.call(
        "POST",
        "/v1/psp/receive",
        Some(json!({"outputs": [hex::encode(erin_coin.encode())]})),
    ));
    // "credited" unless the background upkeep resolved the payment first (then "known");
    // either way the coin is erin's once.
    let outcome = got["results"][0]["outcome"].as_str().unwrap();
    assert!(outcome == "credited" || outcome == "known", "{got}");
    ok(a.pay("erin", "fay", None, 1_500));

    // The ledger answers again: the background upkeep resends the same transaction, which
    // the ledger answers as confirmed, and the payment is applied exactly once.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = ok(a.call("GET", "/v1/psp/accounts/dora", None));
        if v["unresolved"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not resolved: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(a.balance("dora"), 3_500);
    assert_eq!(a.balance("erin"), 0);
    assert_eq!(a.balance("fay"), 1_500);
    let h = ok(a.call("GET", "/v1/psp/accounts/dora/history", None));
    let dirs: Vec<&str> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["direction"].as_str().unwrap())
        .collect();
    assert_eq!(dirs, ["funded", "out"]);
    // The retried request now gets the first payment's receipt.
    let again = ok(pay_d1());
    assert_eq!(again["repeated"], true);
    assert_eq!(again["txid"], txid_hex);
    assert_eq!(a.balance("dora"), 3_500);

    // Restart: the books are on disk.
    a.halt();
    a.serve(
        "bank-a",
        PspScheme::Ed25519,
        &format!("http://{}", node.addr),
    );
    assert_eq!(a.balance("dora"), 3_500);
    assert_eq!(a.balance("fay"), 1_500);
    let r = ok(a.pay("fay", "dora", None, 500));
    assert!(node.unspent(r["payee_output"].as_str().unwrap()));
    assert_eq!(a.balance("dora"), 4_000);
    assert_eq!(a.balance("fay"), 1_000);
    let info = ok(a.call("GET", "/v1/psp/info", None));
    assert_eq!(info["unresolved"], 0);

    // Damaged books refuse to start, naming the file, and are left as they were; lost books
    // are not recreated empty. Put back, the provider starts with every balance.
    a.halt();
    let good = std::fs::read(&a.books).unwrap();
    let open = |a: &Provider| {
        Psp::open(
            PspConfig {
                name: "bank-a".into(),
                books: a.books.clone(),
                ledger: format!("http://{}", node.addr),
                scheme: PspScheme::Ed25519,
                presign_pool: 1,
            },
            a.kmn.clone(),
            Arc::new(florin_http::HttpLinks::new().unwrap()),
        )
        .map(drop)
    };
    let primary_slot = 64 + 128 * usize::from(good[9] & 1);
    let mut flipped = good.clone();
    flipped[primary_slot + 8] ^= 1;
    for (what, bytes, expect) in [
        ("flipped", Some(flipped), "damaged"),
        ("cut", Some(good[..good.len() / 2].to_vec()), "damaged"),
        ("emptied", Some(Vec::new()), "empty"),
        ("deleted", None, "missing"),
    ] {
        match &bytes {
            Some(b) => std::fs::write(&a.books, b).unwrap(),
            None => std::fs::remove_file(&a.books).unwrap(),
        }
        let e = open(&a)
            .err()
            .unwrap_or_else(|| panic!("{what} books opened"));
        let e = e.to_string();
        assert!(
            e.contains(&a.books.display().to_string()) && e.contains(expect),
            "{what}: {e}"
        );
        assert_eq!(
            std::fs::read(&a.books).ok(),
            bytes,
            "{what}: the books changed"
        );
    }
    std::fs::write(&a.books, &good).unwrap();
    a.serve(
        "bank-a",
        PspScheme::Ed25519,
        &format!("http://{}", node.addr),
    );
    assert_eq!(a.balance("dora"), 4_000);
    assert_eq!(a.balance("fay"), 1_000);
}
