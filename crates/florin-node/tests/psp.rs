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

use common::{runtime, LedgerNode};
use florin_crypto::SecretKey;
use florin_ledger::{Encumbrance, Utxo};
use florin_node::custody::{
    free_loopback_addrs, EcdsaEngine, EcdsaLevel, Kmn, Layout, RunningNode,
};
use florin_node::psp::auth::{SignedRequest, AUTH_HEADER};
use florin_node::psp::{PaymentAuth, PeerPsp, Psp, PspConfig, PspScheme};
use serde_json::{json, Value};

/// One HTTP/1.0 request with an optional `florin-auth` header; the status and JSON body.
fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    auth: Option<&str>,
) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let auth = auth
        .map(|a| format!("{AUTH_HEADER}: {a}\r\n"))
        .unwrap_or_default();
    let mut req = match body {
        Some(b) => format!(
            "{method} {path} HTTP/1.0\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            b.len()
        ),
        None => format!("{method} {path} HTTP/1.0\r\n{auth}\r\n"),
    }
    .into_bytes();
    if let Some(b) = body {
        req.extend_from_slice(b);
    }
    s.write_all(&req).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code: u16 = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A request signed by `key` as `who` (or unsigned).
fn http_as(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
    signer: Option<(&str, &SecretKey)>,
) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    let bytes = body.as_deref().map(str::as_bytes);
    let auth = signer
        .map(|(who, key)| SignedRequest::header(key, who, method, path, bytes.unwrap_or_default()));
    raw(addr, method, path, bytes, auth.as_deref())
}

fn http(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    http_as(addr, method, path, body, None)
}

/// Every test customer's key: derived from the account's name.
fn customer(name: &str) -> SecretKey {
    SecretKey::from_seed(&florin_crypto::hash("test/customer", &[name.as_bytes()]))
}

/// The test's own peer identity, configured at every provider (it hands outputs to
/// `receive` as a peer provider would).
fn tester() -> (PeerPsp, SecretKey) {
    let key = SecretKey::from_seed(&[42; 32]);
    (
        PeerPsp {
            id: "tester".into(),
            url: "http://127.0.0.1:9".into(),
            key: key.public_key().to_address(),
        },
        key,
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
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
    name: String,
    peer_key: SecretKey,
    peers: Vec<PeerPsp>,
    engine: EcdsaEngine,
    key_pool: usize,
    psp: std::sync::Weak<Psp>,
    kmn: Arc<Kmn>,
    books: std::path::PathBuf,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _nodes: Vec<RunningNode>,
    _dir: tempfile::TempDir,
}

fn network(
    dir: &std::path::Path,
    scheme: PspScheme,
    engine: EcdsaEngine,
) -> (Vec<RunningNode>, Arc<Kmn>) {
    let layout = Layout::new(&dir.join("kmn"));
    layout.create(2, &free_loopback_addrs(3).unwrap()).unwrap();
    if scheme == PspScheme::P256 {
        layout
            .set_ecdsa(Some(match engine {
                EcdsaEngine::Cggmp24 => EcdsaLevel::InsecureTest,
                EcdsaEngine::Dkls23 => EcdsaLevel::Dkls23,
            }))
            .unwrap();
    }
    let nodes = layout.start_in_process().unwrap();
    let (net, me) = layout.load().unwrap();
    let kmn = Kmn::new(&net, me).unwrap();
    if scheme == PspScheme::P256 && engine == EcdsaEngine::Cggmp24 {
        kmn.ecdsa_setup(Duration::from_secs(120)).unwrap();
    }
    (nodes, kmn)
}

impl Provider {
    fn start(name: &str, scheme: PspScheme, ledger: &str) -> Provider {
        Self::start_with(name, scheme, EcdsaEngine::Cggmp24, 0, ledger)
    }

    /// A provider whose P-256 accounts use `engine`, with `key_pool` keys made ahead.
    fn start_with(
        name: &str,
        scheme: PspScheme,
        engine: EcdsaEngine,
        key_pool: usize,
        ledger: &str,
    ) -> Provider {
        let dir = tempfile::tempdir().unwrap();
        let (nodes, kmn) = network(dir.path(), scheme, engine);
        let books = dir.path().join("psp.redb");
        let rt = runtime();
        let mut p = Provider {
            addr: "127.0.0.1:1".parse().unwrap(),
            name: name.into(),
            peer_key: SecretKey::from_seed(&florin_crypto::hash("test/peer", &[name.as_bytes()])),
            peers: vec![tester().0],
            engine,
            key_pool,
            psp: std::sync::Weak::new(),
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
                ecdsa_engine: self.engine,
                key_pool: self.key_pool,
                peer_key: self.peer_key.clone(),
                peers: self.peers.clone(),
                operators: Vec::new(),
            },
            self.kmn.clone(),
            Arc::new(florin_http::HttpLinks::new().unwrap()),
        )
        .unwrap();
        self.psp = Arc::downgrade(&psp);
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

    /// This provider as another's peer.
    fn as_peer(&self) -> PeerPsp {
        PeerPsp {
            id: self.name.clone(),
            url: self.url(),
            key: self.peer_key.public_key().to_address(),
        }
    }

    /// Adds peers (kept across restarts).
    fn add_peers(&mut self, more: &[PeerPsp]) {
        self.peers.extend_from_slice(more);
        if let Some(p) = self.psp.upgrade() {
            p.set_peers(self.peers.clone()).unwrap();
        }
    }

    /// A call as the customer would make it: signed by the account's customer key (named by
    /// the path, or by the body's `from` or `name`; a new account's body gets its
    /// `customer_key`), a payment with the customer's authorization of it, `receive` signed
    /// by the test's peer identity.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut body = body;
        let who = if let Some(rest) = path.strip_prefix("/v1/psp/accounts/") {
            rest.split(['/', '?']).next().map(str::to_string)
        } else if path == "/v1/psp/accounts" && method == "POST" {
            let name = body
                .as_ref()
                .and_then(|b| b["name"].as_str())
                .map(str::to_string);
            if let (Some(b), Some(n)) = (body.as_mut(), name.as_deref()) {
                b["customer_key"] = json!(customer(n).public_key().to_address());
            }
            name
        } else if path == "/v1/psp/pay" {
            if let Some(b) = body.as_mut() {
                self.authorize(b);
            }
            body.as_ref()
                .and_then(|b| b["from"].as_str())
                .map(str::to_string)
        } else {
            None
        };
        if path == "/v1/psp/receive" {
            let (peer, key) = tester();
            return http_as(self.addr, method, path, body, Some((&peer.id, &key)));
        }
        match who {
            Some(w) => {
                let key = customer(&w);
                http_as(self.addr, method, path, body, Some((&w, &key)))
            }
            _ => http(self.addr, method, path, body),
        }
    }

    /// Adds the customer's authorization (and an id) to a payment body that has none, as
    /// `florin psp pay` does: the payer's and the payee's encumbrances looked up first.
    fn authorize(&self, b: &mut Value) {
        if b.get("authorization").is_some() {
            return;
        }
        let (Some(from), Some(to), Some(amount)) = (
            b["from"].as_str().map(str::to_string),
            b["to"].as_str().map(str::to_string),
            b["amount_cents"].as_u64(),
        ) else {
            return;
        };
        if b.get("id").is_none() {
            b["id"] = json!(format!("t-{}", rand::random::<u64>()));
        }
        let id = b["id"].as_str().unwrap_or_default().to_string();
        let lookup = |name: &str, peer: Option<&str>| {
            let path = match peer {
                Some(p) => format!("/v1/psp/payees/{name}?peer={p}"),
                None => format!("/v1/psp/payees/{name}"),
            };
            let (code, v) = http(self.addr, "GET", &path, None);
            (code == 200)
                .then(|| Encumbrance::parse_text(v["encumbrance"].as_str()?))
                .flatten()
        };
        // Unknown names get a stand-in: the provider refuses such a payment before it
        // looks at the payee the authorization names.
        let stand_in = Encumbrance::ed25519(&SecretKey::from_seed(&[3; 32]).public_key());
        let payer = lookup(&from, None).unwrap_or(stand_in);
        let to_psp = b["to_psp"].as_str().map(str::to_string);
        let payee = match (&to_psp, Encumbrance::parse_text(&to)) {
            (None, Some(e)) => e,
            _ => lookup(&to, to_psp.as_deref()).unwrap_or(stand_in),
        };
        if let Ok(a) = PaymentAuth::sign(
            &customer(&from),
            payer,
            payee,
            amount,
            unix_now() + 300,
            &id,
        ) {
            b["authorization"] = json!(hex::encode(a.encode()));
        }
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
    let mut a = Provider::start("bank-a", PspScheme::P256, &ledger);
    let mut b = Provider::start("bank-b", PspScheme::Ed25519, &ledger);
    a.add_peers(&[b.as_peer()]);
    b.add_peers(&[a.as_peer()]);

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
    // The provider serves its API contract, the one committed as docs/openapi-psp.json.
    let served = ok(a.call("GET", "/openapi.json", None));
    assert_eq!(
        served,
        serde_json::to_value(florin_http::psp::openapi()).unwrap()
    );
    assert!(served["paths"]["/v1/psp/pay"]["post"].is_object());

    // Funding from the ledger's faucet, to a P-256 encumbrance.
    ok(a.call(
        "POST",
        "/v1/psp/accounts/alice/faucet",
        Some(json!({"amount_cents": 10_000})),
    ));
    assert_eq!(a.balance("alice"), 10_000);
    // Funding is the customer's request, and the list of every account the operator's:
    // unsigned, both are refused.
    refused(
        http(
            a.addr,
            "POST",
            "/v1/psp/accounts/alice/faucet",
            Some(json!({"amount_cents": 1})),
        ),
        401,
        "unauthorized",
    );
    refused(
        http(a.addr, "GET", "/v1/psp/accounts", None),
        401,
        "unauthorized",
    );
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
    let post_pay = |ctype: &str, body: &[u8]| {
        common::request(a.addr, "POST", "/v1/psp/pay", Some((ctype, body)), None)
    };
    refused(post_pay("text/plain", b"{}"), 415, "unsupported_media_type");
    refused(post_pay("application/json", b"{\"from"), 400, "malformed");
    let big = vec![b' '; florin_http::psp::limits::SMALL + 1];
    refused(post_pay("application/json", &big), 413, "too_large");
    refused(post_pay("image/png", &big), 413, "too_large");

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
    // A URL that is not a configured peer is never called (no server-side request
    // forgery): refused before any connection, as is an unknown peer name.
    let bait = TcpListener::bind("127.0.0.1:0").unwrap();
    bait.set_nonblocking(true).unwrap();
    let bait_url = format!("http://{}", bait.local_addr().unwrap());
    refused(
        a.pay("alice", "carol", Some(&bait_url), 1),
        400,
        "bad_request",
    );
    refused(
        a.call(
            "GET",
            &format!("/v1/psp/payees/carol?peer={bait_url}"),
            None,
        ),
        400,
        "bad_request",
    );
    refused(
        a.pay("alice", "carol", Some("bank-z"), 1),
        400,
        "bad_request",
    );
    assert!(
        bait.accept().is_err(),
        "the provider connected to a URL that is not a peer"
    );
    // A configured peer that is down: unreachable, nothing paid.
    a.add_peers(&[PeerPsp {
        id: "bank-down".into(),
        url: "http://127.0.0.1:1".into(),
        key: SecretKey::from_seed(&[5; 32]).public_key().to_address(),
    }]);
    refused(
        a.pay("alice", "carol", Some("bank-down"), 1),
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

    // A peer provider that answers with one of our own customers (here: this provider
    // configured as a peer of itself): paid here, never trusting another provider to credit
    // it.
    let me = a.as_peer();
    a.add_peers(&[me]);
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

    // Customers authenticate every request; the provider cannot be made to pay without the
    // customer's authorization of exactly that payment.
    let (alice_before, bob_before) = (a.balance("alice"), a.balance("bob"));
    refused(
        http(a.addr, "GET", "/v1/psp/accounts/alice", None),
        401,
        "unauthorized",
    );
    refused(
        http_as(
            a.addr,
            "GET",
            "/v1/psp/accounts/alice",
            None,
            Some(("alice", &customer("bob"))),
        ),
        401,
        "unauthorized",
    );
    refused(
        http_as(
            a.addr,
            "GET",
            "/v1/psp/accounts/alice/history",
            None,
            Some(("bob", &customer("bob"))),
        ),
        403,
        "forbidden",
    );
    let once = SignedRequest::header(
        &customer("alice"),
        "alice",
        "GET",
        "/v1/psp/accounts/alice",
        b"",
    );
    ok(raw(
        a.addr,
        "GET",
        "/v1/psp/accounts/alice",
        None,
        Some(&once),
    ));
    refused(
        raw(a.addr, "GET", "/v1/psp/accounts/alice", None, Some(&once)),
        401,
        "unauthorized",
    );
    // An unsigned payment request, with a valid authorization: refused.
    let mut body = json!({"from": "alice", "to": "bob", "amount_cents": 100, "id": "x-1"});
    a.authorize(&mut body);
    refused(
        http(a.addr, "POST", "/v1/psp/pay", Some(body.clone())),
        401,
        "unauthorized",
    );
    // Signed requests with no, or a mismatched, authorization: refused.
    let signed_pay = |b: Value| {
        http_as(
            a.addr,
            "POST",
            "/v1/psp/pay",
            Some(b),
            Some(("alice", &customer("alice"))),
        )
    };
    let mut none = body.clone();
    none["authorization"] = Value::Null;
    refused(signed_pay(none), 403, "forbidden");
    let bob_enc = Encumbrance::parse_text(bob_view(&a)["encumbrance"].as_str().unwrap()).unwrap();
    let alice_enc = Encumbrance::parse_text(
        ok(a.call("GET", "/v1/psp/accounts/alice", None))["encumbrance"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let exp = unix_now() + 300;
    for (what, auth) in [
        (
            "another amount",
            PaymentAuth::sign(&customer("alice"), alice_enc, bob_enc, 5_000, exp, "x-1").unwrap(),
        ),
        (
            "another payee",
            PaymentAuth::sign(
                &customer("alice"),
                alice_enc,
                Encumbrance::ed25519(&SecretKey::from_seed(&[4; 32]).public_key()),
                100,
                exp,
                "x-1",
            )
            .unwrap(),
        ),
        (
            "another customer",
            PaymentAuth::sign(&customer("bob"), alice_enc, bob_enc, 100, exp, "x-1").unwrap(),
        ),
        (
            "another id",
            PaymentAuth::sign(&customer("alice"), alice_enc, bob_enc, 100, exp, "x-2").unwrap(),
        ),
        (
            "expired",
            PaymentAuth::sign(
                &customer("alice"),
                alice_enc,
                bob_enc,
                100,
                unix_now() - 1,
                "x-1",
            )
            .unwrap(),
        ),
    ] {
        let mut b2 = body.clone();
        b2["authorization"] = json!(hex::encode(auth.encode()));
        let r = signed_pay(b2);
        assert_eq!(
            (r.0, r.1["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{what}: {}",
            r.1
        );
    }
    // Opening needs the customer key, and a request signed by it.
    refused(
        http_as(
            a.addr,
            "POST",
            "/v1/psp/accounts",
            Some(json!({"name": "dave"})),
            Some(("dave", &customer("dave"))),
        ),
        400,
        "bad_request",
    );
    refused(
        http_as(
            a.addr,
            "POST",
            "/v1/psp/accounts",
            Some(
                json!({"name": "dave", "customer_key": customer("dave").public_key().to_address()}),
            ),
            Some(("dave", &customer("eve"))),
        ),
        401,
        "unauthorized",
    );
    // `receive` only from a configured peer, signed with its key.
    let rx = json!({"outputs": [fresh.clone()]});
    refused(
        http(b.addr, "POST", "/v1/psp/receive", Some(rx.clone())),
        401,
        "unauthorized",
    );
    refused(
        http_as(
            b.addr,
            "POST",
            "/v1/psp/receive",
            Some(rx.clone()),
            Some(("mallory", &SecretKey::from_seed(&[6; 32]))),
        ),
        403,
        "forbidden",
    );
    refused(
        http_as(
            b.addr,
            "POST",
            "/v1/psp/receive",
            Some(rx.clone()),
            Some(("bank-a", &SecretKey::from_seed(&[6; 32]))),
        ),
        401,
        "unauthorized",
    );
    assert_eq!(
        (a.balance("alice"), a.balance("bob")),
        (alice_before, bob_before)
    );
    // The honest request still pays.
    ok(signed_pay(body));
    assert_eq!(a.balance("bob"), bob_before + 100);
    let alice_before = alice_before - 100;
    assert_eq!(a.balance("alice"), alice_before);

    // Money is conserved: what the providers hold plus the outsider's output is what the
    // faucet minted.
    let held = a.balance("alice") + a.balance("bob") + b.balance("carol");
    assert_eq!(held + 300, 10_000);
}

fn bob_view(a: &Provider) -> Value {
    ok(a.call("GET", "/v1/psp/accounts/bob", None))
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
                ecdsa_engine: EcdsaEngine::Cggmp24,
                key_pool: 0,
                peer_key: a.peer_key.clone(),
                peers: a.peers.clone(),
                operators: Vec::new(),
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

/// DKLs23 accounts with keys made ahead: opening an account takes a pooled key (bound to the
/// customer while pending, then committed), the pool refills, a restarted provider adopts the
/// pool keys its nodes still hold, and payments within and across providers settle.
#[test]
fn dkls23_accounts_from_a_key_pool_pay_within_and_across_providers() {
    let node = LedgerNode::start();
    let ledger = format!("http://{}", node.addr);
    let mut a = Provider::start_with("bank-a", PspScheme::P256, EcdsaEngine::Dkls23, 2, &ledger);
    let mut b = Provider::start_with("bank-b", PspScheme::P256, EcdsaEngine::Dkls23, 0, &ledger);
    a.add_peers(&[b.as_peer()]);
    b.add_peers(&[a.as_peer()]);
    let pool = |a: &Provider| a.psp.upgrade().map(|p| p.pool_ready()).unwrap_or(0);
    let wait_pool = |a: &Provider, n: usize| {
        let until = std::time::Instant::now() + Duration::from_secs(120);
        while pool(a) < n {
            assert!(std::time::Instant::now() < until, "the pool did not fill");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_pool(&a, 2);
    // The pooled keys are pending at every node: they sign nothing.
    let pending: Vec<String> = a.kmn.status()[0]
        .pending
        .iter()
        .map(|(k, _, _)| k.clone())
        .collect();
    assert_eq!(pending.len(), 2, "{pending:?}");
    assert!(a.kmn.ecdsa_signer(&pending[0], 0).is_err());

    let alice = ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "alice"}))));
    assert!(alice["encumbrance"].as_str().unwrap().starts_with("p256:"));
    assert_eq!(alice["presignatures_ready"], 0);
    // Alice's key is one of the two made ahead, now committed and bound to her.
    let committed: Vec<String> = a
        .kmn
        .status()
        .iter()
        .flat_map(|s| s.ecdsa.clone().map(|e| e.dkls23).unwrap_or_default())
        .collect();
    assert!(
        pending.iter().any(|k| committed.contains(k)),
        "{committed:?}"
    );
    ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "bob"}))));
    ok(b.call("POST", "/v1/psp/accounts", Some(json!({"name": "carol"}))));
    wait_pool(&a, 2);

    ok(a.call(
        "POST",
        "/v1/psp/accounts/alice/faucet",
        Some(json!({"amount_cents": 10_000})),
    ));
    let r = ok(a.pay("alice", "bob", None, 1_000));
    assert_eq!(r["route"], "same_provider");
    assert!(node.unspent(r["payee_output"].as_str().unwrap()));
    let r = ok(a.pay("alice", "carol", Some(&b.url()), 500));
    assert_eq!(r["notified"], true, "{r}");
    assert_eq!(b.balance("carol"), 500);
    assert_eq!(a.balance("alice"), 8_500);
    assert_eq!(a.balance("bob"), 1_000);

    // A restarted provider adopts the two pending pool keys instead of making new ones.
    a.halt();
    a.serve("bank-a", PspScheme::P256, &ledger);
    wait_pool(&a, 2);
    let pending_after: Vec<String> = a.kmn.status()[0]
        .pending
        .iter()
        .map(|(k, _, _)| k.clone())
        .collect();
    assert_eq!(pending_after.len(), 2, "{pending_after:?}");
    ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "dan"}))));
    let r = ok(a.pay("bob", "dan", None, 300));
    assert!(node.unspent(r["payee_output"].as_str().unwrap()));
    assert_eq!(a.balance("dan"), 300);
}

/// Filia's non-repudiation (`004_…` 4.1 steps ③, ⑥, ⑧): a cross-provider payment leaves the
/// paying provider a proof — the payee's provider's signed word on where to pay, the ledger's
/// signed confirmation and the payee's provider's signed acknowledgement — that verifies
/// offline; a forged or altered one does not, only the payer's customer may fetch it, and a
/// payee's provider that signs with another key than the configured one is not paid.
#[test]
fn cross_provider_payments_leave_a_proof_that_verifies_offline_and_forgeries_fail() {
    use florin_node::api::LedgerConfirmation;
    use florin_node::psp::proof::TransferProof;
    let node = LedgerNode::start();
    let ledger = format!("http://{}", node.addr);
    let mut a = Provider::start("bank-a", PspScheme::Ed25519, &ledger);
    let mut b = Provider::start("bank-b", PspScheme::Ed25519, &ledger);
    a.add_peers(&[b.as_peer()]);
    b.add_peers(&[a.as_peer()]);
    ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "alice"}))));
    ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "bob"}))));
    ok(b.call("POST", "/v1/psp/accounts", Some(json!({"name": "carol"}))));
    ok(a.call(
        "POST",
        "/v1/psp/accounts/alice/faucet",
        Some(json!({"amount_cents": 10_000})),
    ));
    let issuer_addr = ok(http(node.addr, "GET", "/v1/info", None))["issuer"]
        .as_str()
        .unwrap()
        .to_string();
    let issuer = florin_crypto::PublicKey::parse(&issuer_addr).unwrap();
    let b_key = b.peer_key.public_key();

    // The payee's provider signs where to pay.
    let view = ok(http(b.addr, "GET", "/v1/psp/payees/carol", None));
    assert_eq!(view["offer"]["key"], b_key.to_address());

    let r = ok(a.pay("alice", "carol", Some(&b.url()), 750));
    assert_eq!(r["notified"], true, "{r}");
    let txid = r["txid"].as_str().unwrap().to_string();
    let path = format!("/v1/psp/accounts/alice/proofs/{txid}");
    let fetched = ok(a.call("GET", &path, None));
    let proof: TransferProof = serde_json::from_value(fetched).unwrap();
    let check = proof.verify(Some(&issuer), Some(&b_key)).unwrap();
    assert!(check.complete && check.pinned, "{check:?}");
    assert_eq!(check.amount_cents, 750);
    assert_eq!(check.payee_account, "carol");
    assert_eq!(check.payer, "alice@bank-a");
    assert_eq!(check.acknowledged.as_deref(), Some("credited"));
    assert_eq!(check.ledger_issuer.as_deref(), Some(issuer_addr.as_str()));

    // Forgeries and alterations, each refused with its reason.
    let fails = |p: &TransferProof, why: &str| {
        let e = p.verify(Some(&issuer), Some(&b_key)).unwrap_err();
        assert!(e.0.contains(why), "{e} (wanted {why:?})");
    };
    let mut p = proof.clone();
    p.amount_cents = 7_500;
    fails(&p, "pays 750 cents");
    let mallory = SecretKey::from_seed(&[66; 32]);
    let mut p = proof.clone();
    p.offer.encumbrance = Encumbrance::ed25519(&mallory.public_key()).to_text();
    fails(&p, "does not verify");
    // A validly signed offer for another encumbrance than the output's.
    let mut p = proof.clone();
    p.offer = florin_node::psp::proof::PayeeOffer::sign(
        &b.peer_key,
        "bank-b",
        "carol",
        &Encumbrance::ed25519(&mallory.public_key()).to_text(),
        1,
    );
    fails(&p, "asked for");
    let mut p = proof.clone();
    let c = p.confirmation.as_mut().unwrap();
    c.at += 1;
    fails(&p, "does not verify");
    // A confirmation validly signed by a key that is not the ledger's issuer.
    let mut p = proof.clone();
    let tid: [u8; 32] = hex::decode(&txid).unwrap().try_into().unwrap();
    p.confirmation = Some(LedgerConfirmation {
        txid: txid.clone(),
        issuer: mallory.public_key().to_address(),
        at: 1,
        signature: hex::encode(mallory.sign(&LedgerConfirmation::digest(&tid, 1)).0),
    });
    fails(&p, "not by the ledger's issuer");
    // Unpinned it checks out with the keys it names, and says it was not pinned.
    assert!(!p.verify(None, Some(&b_key)).unwrap().pinned);
    // An offer re-signed by a stranger for the same encumbrance.
    let mut p = proof.clone();
    p.offer = florin_node::psp::proof::PayeeOffer::sign(
        &mallory,
        "bank-b",
        "carol",
        &proof.offer.encumbrance,
        1,
    );
    fails(&p, "not by the payee's provider's key");
    let mut p = proof.clone();
    p.acknowledgement.as_mut().unwrap().results[0].outcome = "not_ours".into();
    fails(&p, "does not verify");
    let mut p = proof.clone();
    p.txid = "00".repeat(32);
    fails(&p, "the proof names");
    // Another transaction of the ledger, confirmed too, does not stand in for this one.
    let r2 = ok(a.pay("alice", "bob", None, 10));
    let other = ok(http(
        node.addr,
        "GET",
        &format!(
            "/v1/ledger/transactions/{}/confirmation",
            r2["txid"].as_str().unwrap()
        ),
        None,
    ));
    let mut p = proof.clone();
    p.confirmation = Some(serde_json::from_value(other).unwrap());
    fails(&p, "another transaction");

    // Only the paying account's customer fetches it; same-provider payments have none.
    refused(http(a.addr, "GET", &path, None), 401, "unauthorized");
    let bob = customer("bob");
    let (code, v) = http_as(a.addr, "GET", &path, None, Some(("alice", &bob)));
    assert!(code == 401 || code == 403, "{code} {v}");
    refused(
        a.call("GET", &format!("/v1/psp/accounts/bob/proofs/{txid}"), None),
        404,
        "not_found",
    );
    refused(
        a.call(
            "GET",
            &format!(
                "/v1/psp/accounts/alice/proofs/{}",
                r2["txid"].as_str().unwrap()
            ),
            None,
        ),
        404,
        "not_found",
    );
    refused(
        a.call("GET", "/v1/psp/accounts/alice/proofs/xyz", None),
        400,
        "bad_request",
    );
    // The ledger confirms only what it confirmed.
    refused(
        http(
            node.addr,
            "GET",
            &format!("/v1/ledger/transactions/{}/confirmation", "11".repeat(32)),
            None,
        ),
        404,
        "not_found",
    );

    // A payee's provider whose answer is signed by another key than the configured one is
    // not paid.
    let mut wrong = b.as_peer();
    wrong.id = "bank-b-wrong".into();
    wrong.key = mallory.public_key().to_address();
    a.add_peers(&[wrong]);
    let before = a.balance("alice");
    let (code, v) = a.pay("alice", "carol", Some("bank-b-wrong"), 5);
    assert_eq!(code, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not by its configured key"),
        "{v}"
    );
    assert_eq!(a.balance("alice"), before);
}

/// Filia's note model at a DKLs23 provider: change goes to a fresh note key of the payer
/// every time (never back to the account key), notes are spent with one signature per key,
/// and the note keys survive a restart of the provider.
#[test]
fn dkls23_accounts_keep_their_change_as_notes_under_keys_of_their_own() {
    let node = LedgerNode::start();
    let ledger = format!("http://{}", node.addr);
    let mut a = Provider::start_with("bank-a", PspScheme::P256, EcdsaEngine::Dkls23, 0, &ledger);
    let alice = ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "alice"}))));
    let alice_enc = alice["encumbrance"].as_str().unwrap().to_string();
    ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "bob"}))));
    ok(a.call(
        "POST",
        "/v1/psp/accounts/alice/faucet",
        Some(json!({"amount_cents": 1_000})),
    ));
    let enc_of = |utxo: &str| {
        Utxo::decode(&hex::decode(utxo).unwrap())
            .unwrap()
            .encumbrance
            .to_text()
    };
    let mut changes = Vec::new();
    for _ in 0..3 {
        let r = ok(a.pay("alice", "bob", None, 100));
        assert_eq!(r["signatures"], 1, "{r}");
        let change = r["change_output"].as_str().unwrap();
        assert!(node.unspent(change));
        let enc = enc_of(change);
        assert_ne!(enc, alice_enc, "change back to the account key");
        assert!(!changes.contains(&enc), "a note key used twice");
        changes.push(enc);
    }
    assert_eq!(a.balance("alice"), 700);
    // Bob was paid at his account key; he pays back from it, his change a note too.
    let bob_enc = ok(a.call("GET", "/v1/psp/accounts/bob", None))["encumbrance"]
        .as_str()
        .unwrap()
        .to_string();
    let r = ok(a.pay("bob", "alice", None, 50));
    assert_ne!(enc_of(r["change_output"].as_str().unwrap()), bob_enc);
    // A note (700) and an account-key coin (250 from the faucet) together: two signatures.
    ok(a.call(
        "POST",
        "/v1/psp/accounts/alice/faucet",
        Some(json!({"amount_cents": 250})),
    ));
    a.halt();
    a.serve("bank-a", PspScheme::P256, &ledger);
    let r = ok(a.pay("alice", "bob", None, 990));
    assert!(r["signatures"].as_u64().unwrap() >= 2, "{r}");
    assert!(node.unspent(r["payee_output"].as_str().unwrap()));
    assert_eq!(a.balance("alice"), 1_000 - 300 + 50 + 250 - 990);
}

/// Filia's remote transfer (`004_…` 4.1, Fig. 1b) to a DKLs23 payee: the payee's provider
/// offers a fresh note key `R1` of the payee's account, the payment goes to `R1 + R2`, `r2` is
/// handed over with the output, and the payee's network then signs as `r1 + r2` — the payee
/// spends it. The proof shows the joint key; a wrong `r2` credits nothing; a tampered offer or
/// one for another account pays nothing.
#[test]
fn a_remote_transfer_pays_a_joint_key_r1_plus_r2_that_only_the_payee_can_spend() {
    let node = LedgerNode::start();
    let ledger = format!("http://{}", node.addr);
    let mut a = Provider::start("bank-a", PspScheme::Ed25519, &ledger);
    let mut b = Provider::start_with("bank-b", PspScheme::P256, EcdsaEngine::Dkls23, 0, &ledger);
    a.add_peers(&[b.as_peer()]);
    b.add_peers(&[a.as_peer()]);
    ok(a.call("POST", "/v1/psp/accounts", Some(json!({"name": "alice"}))));
    let carol = ok(b.call("POST", "/v1/psp/accounts", Some(json!({"name": "carol"}))));
    ok(b.call("POST", "/v1/psp/accounts", Some(json!({"name": "erin"}))));
    ok(a.call(
        "POST",
        "/v1/psp/accounts/alice/faucet",
        Some(json!({"amount_cents": 5_000})),
    ));
    let alice = customer("alice");
    let start = |amount: u64| {
        ok(http_as(
            a.addr,
            "POST",
            "/v1/psp/transfers",
            Some(json!({"from": "alice", "to": "carol", "to_psp": "bank-b",
                "amount_cents": amount})),
            Some(("alice", &alice)),
        ))
    };
    let t = start(700);
    let offer = t["offer"].clone();
    assert!(offer["r1"].is_string(), "{t}");
    let joint = t["encumbrance"].as_str().unwrap().to_string();
    assert_ne!(joint, carol["encumbrance"].as_str().unwrap());
    assert_ne!(
        joint,
        offer["encumbrance"].as_str().unwrap(),
        "R1 + R2, not R1"
    );
    // Alice pays account `to` at bank-b through `offer`, authorizing `to_enc`.
    let pay_to = |to: &str, offer: &Value, to_enc: &str, amount: u64, id: &str| {
        let payer = Encumbrance::parse_text(
            ok(a.call("GET", "/v1/psp/accounts/alice", None))["encumbrance"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let auth = PaymentAuth::sign(
            &alice,
            payer,
            Encumbrance::parse_text(to_enc).unwrap(),
            amount,
            unix_now() + 300,
            id,
        )
        .unwrap();
        http_as(
            a.addr,
            "POST",
            "/v1/psp/pay",
            Some(json!({"from": "alice", "to": to, "to_psp": "bank-b",
                "amount_cents": amount, "id": id, "offer": offer,
                "authorization": hex::encode(auth.encode())})),
            Some(("alice", &alice)),
        )
    };
    let pay_with = |offer: &Value, to_enc: &str, amount: u64, id: &str| {
        pay_to("carol", offer, to_enc, amount, id)
    };
    // A tampered offer, or one for another account, pays nothing.
    let mut forged = offer.clone();
    forged["amount_cents"] = 70_000.into();
    let (code, v) = pay_with(&forged, &joint, 700, "t-forged");
    assert_eq!(code, 422, "{v}");
    // Carol's offer used to pay erin: refused on the offer's account.
    let (code, v) = pay_to("erin", &offer, &joint, 700, "t-other");
    assert_eq!(code, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another account"),
        "{v}"
    );
    // An offer for 700 paying 600.
    let (code, v) = pay_with(&offer, &joint, 600, "t-less");
    assert_eq!(code, 400, "{v}");
    assert_eq!(a.balance("alice"), 5_000);

    let r = ok(pay_with(&offer, &joint, 700, "t-1"));
    assert_eq!(r["notified"], true, "{r}");
    let out = Utxo::decode(&hex::decode(r["payee_output"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(out.encumbrance.to_text(), joint);
    assert_eq!(b.balance("carol"), 700);
    assert_eq!(a.balance("alice"), 4_300);

    // The proof names the joint key and holds.
    let issuer = florin_crypto::PublicKey::parse(
        ok(http(node.addr, "GET", "/v1/info", None))["issuer"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let proof: florin_node::psp::proof::TransferProof = serde_json::from_value(ok(a.call(
        "GET",
        &format!(
            "/v1/psp/accounts/alice/proofs/{}",
            r["txid"].as_str().unwrap()
        ),
        None,
    )))
    .unwrap();
    let check = proof
        .verify(Some(&issuer), Some(&b.peer_key.public_key()))
        .unwrap();
    assert!(
        check.joint_key && check.complete && check.pinned,
        "{check:?}"
    );
    assert_eq!(t["r2"], json!(proof.r2), "the customer was shown r2");
    let mut p = proof.clone();
    p.r2 = None;
    assert!(p.verify(None, None).is_err(), "a joint key needs r2");
    let mut p = proof.clone();
    p.r2 = Some(hex::encode(*florin_custody::dkls::random_scalar()));
    assert!(
        p.verify(None, None).is_err(),
        "another r2 names another key"
    );

    // Carol spends the joint note: her network signs as r1 + r2.
    let r = ok(b.pay("carol", "erin", None, 650));
    assert_eq!(r["signatures"], 1, "{r}");
    assert!(node.unspent(r["payee_output"].as_str().unwrap()));
    assert!(!node.unspent(&hex::encode(out.encode())));
    assert_eq!(b.balance("erin"), 650);
    assert_eq!(b.balance("carol"), 50);

    // A second transfer, handed over with a wrong r2 by a peer: not credited.
    let t2 = start(5);
    let r1 = hex::decode(t2["offer"]["r1"].as_str().unwrap()).unwrap();
    let r2 = florin_custody::dkls::random_scalar();
    let joint2 = florin_custody::dkls::add_public(
        &r1.try_into().unwrap(),
        &florin_custody::dkls::public_of(&r2).unwrap(),
    )
    .unwrap();
    let fake = Utxo {
        value: 5,
        encumbrance: Encumbrance::p256(&florin_crypto::P256PublicKey(joint2)),
        serial: [5; 32],
    };
    let handover = |r2: &[u8; 32]| {
        json!({"outputs": [hex::encode(fake.encode())], "handover": [{
            "id": hex::encode(fake.id()),
            "transfer": t2["offer"]["transfer"],
            "account": "carol",
            "r2": hex::encode(r2),
        }]})
    };
    let wrong = ok(b.call(
        "POST",
        "/v1/psp/receive",
        Some(handover(&florin_custody::dkls::random_scalar())),
    ));
    assert_eq!(wrong["results"][0]["outcome"], "not_ours", "{wrong}");
    // The right r2 makes it carol's key; this output is not on the ledger, so nothing is
    // credited either.
    let right = ok(b.call("POST", "/v1/psp/receive", Some(handover(&r2))));
    assert_eq!(right["results"][0]["outcome"], "not_unspent", "{right}");
    assert_eq!(b.balance("carol"), 50);
    // A handover naming no output of the call is refused whole.
    let mut stray = handover(&r2);
    stray["handover"][0]["id"] = json!("00".repeat(32));
    refused(
        b.call("POST", "/v1/psp/receive", Some(stray)),
        400,
        "bad_request",
    );
}
