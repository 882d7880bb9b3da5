//! `florin bench custody`: the source document's threshold-signature measurements (`004_…`
//! section 6) on Florin's FROST path.
//!
//! 1. Key generation, nonce preparation ("presigning") and signing versus (t, n), split into
//!    computation and waiting, as the document splits them. Computation is measured on the
//!    protocol's state machines alone (per node, as if each node had its own machine);
//!    waiting is the same step over real key-management nodes (Noise channels on loopback,
//!    all nodes on this machine's cores) minus that computation.
//! 2. End-to-end custodial payments: two payment providers, each with its own 2-of-3
//!    key-management network, customers whose keys are threshold keys (or, as the reference,
//!    single keys held by the provider), paying customers of the same provider (UC1) or of the
//!    other one (UC2) on a ledger node running as `florin devnet` runs it. A payment counts
//!    from the provider building the transaction to the payee's provider seeing it confirmed
//!    (UC2: checking the payee's output unspent on the ledger itself).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use florin_crypto::{LocalSigner, SecretKey, Signature, Signer};
use florin_custody::frost::{self, KeyShare, NoncePool, SigningPackage};
use florin_ledger::{Draft, Encumbrance, Mint, Output, Transaction, Utxo};
use florin_node::custody::{free_loopback_addrs, Kmn, Layout, RunningNode};
use rand::rngs::OsRng;
use serde_json::json;

use super::ledger_e2e::{percentile, Node};
use super::{Recorder, Reference, Scale};

const DOC: &str = "004_… (threshold signatures for CBDC) §6";

pub(super) fn seed(value: f64, what: &str) -> Option<Reference> {
    Some(Reference {
        value,
        source: format!("{DOC}: {what}"),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One DKG among `n` in-memory parties; returns the shares and the mean compute time per
/// party (its three steps).
fn dkg_compute(t: u16, n: u16) -> Result<(Vec<KeyShare>, Duration)> {
    let (shares, spent) = frost::dkg_in_memory("bench", t, n, &mut OsRng)?;
    let mean = spent.iter().sum::<Duration>() / n as u32;
    Ok((shares, mean))
}

/// Compute per signature.
struct SignCompute {
    /// Nonce preparation, per node.
    prep: Duration,
    /// Signing as the nodes do it in parallel: one node's share plus the coordinator's work.
    sign: Duration,
    /// Every party's CPU for one signature added up: t nonce preparations, t shares and the
    /// coordinator (what one signature costs when all parties share one machine's cores).
    all_parties: Duration,
}

fn sign_compute(shares: &[KeyShare], t: u16, iters: usize) -> Result<SignCompute> {
    let chosen = &shares[..t as usize];
    let mut prep = Duration::ZERO;
    let mut sign = Duration::ZERO;
    let mut all = Duration::ZERO;
    for i in 0..iters {
        let mut pools: Vec<NoncePool> = chosen.iter().map(|_| NoncePool::new(1, 8)).collect();
        let mut commitments = BTreeMap::new();
        let mut ids = Vec::new();
        for (s, pool) in chosen.iter().zip(pools.iter_mut()) {
            let st = Instant::now();
            pool.add(NoncePool::generate(&s.nonce_hedge(), 1, &mut OsRng));
            prep += st.elapsed();
            let (id, c) = pool.issue(1).remove(0);
            ids.push(id);
            commitments.insert(s.party(), c);
        }
        let msg = format!("bench {i}");
        let st = Instant::now();
        let package = SigningPackage::new(&commitments, msg.as_bytes())?;
        let mut per_node = Duration::ZERO;
        let mut out = BTreeMap::new();
        let coordinator_part = st.elapsed();
        for ((s, pool), id) in chosen.iter().zip(pools.iter_mut()).zip(ids) {
            let st = Instant::now();
            let nonces = pool.take(id)?;
            out.insert(s.party(), frost::sign_share(s, &nonces, &package)?);
            per_node += st.elapsed();
        }
        let st = Instant::now();
        frost::aggregate(chosen[0].group(), &package, &out)?;
        let aggregate = st.elapsed();
        // Nodes sign in parallel: one node's time, plus the coordinator's.
        sign += coordinator_part + per_node / t as u32 + aggregate;
        all += coordinator_part + per_node + aggregate;
    }
    Ok(SignCompute {
        prep: prep / (iters as u32 * t as u32),
        sign: sign / iters as u32,
        all_parties: (all + prep) / iters as u32,
    })
}

/// A t-of-n network of in-process nodes over real sockets. (Fields drop in order: the nodes
/// stop before their directory goes, so their config watchers do not report it missing.)
struct Net {
    kmn: Arc<Kmn>,
    _nodes: Vec<RunningNode>,
    _dir: tempfile::TempDir,
}

fn network(t: u16, n: u16) -> Result<Net> {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(t, &free_loopback_addrs(n as usize)?)?;
    let nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    // Measure from steady state: each fresh node first fills its nonce pool in the
    // background (≈ 65 µs per nonce), which would otherwise compete with what is measured.
    let full = florin_node::custody::node::NONCE_POOL_START as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && !kmn.status().iter().all(|s| s.up && s.nonces_ready >= full)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Net {
        kmn,
        _nodes: nodes,
        _dir: dir,
    })
}

/// Returns every party's CPU for one 2-of-3 signature (see [`SignCompute::all_parties`]).
fn crypto_points(rec: &mut Recorder, quick: bool) -> Result<Duration> {
    let mut all_2_of_3 = Duration::ZERO;
    let points: &[(u16, u16)] = if quick {
        &[(2, 3), (3, 5)]
    } else {
        &[
            (2, 3),
            (3, 5),
            (5, 8),
            (7, 10),
            (14, 20),
            (21, 32),
            (32, 52),
        ]
    };
    for &(t, n) in points {
        let (shares, dkg_c) = dkg_compute(t, n)?;
        let iters = if quick { 20 } else { 100 };
        let SignCompute {
            prep: prep_c,
            sign: sign_c,
            all_parties,
        } = sign_compute(&shares, t, iters)?;
        if (t, n) == (2, 3) {
            all_2_of_3 = all_parties;
        }
        let p = |part: &str| json!({"scheme": "frost-ed25519", "t": t, "n": n, "part": part});
        let dkg_seed = (t, n) == (32, 52);
        rec.add(
            "dkg_ms",
            ms(dkg_c),
            "ms",
            p("compute"),
            if dkg_seed {
                seed(2500.0, "CGGMP21 DKG computation at t=32, n=52")
            } else {
                None
            },
            None,
        );
        rec.add("presign_ms", ms(prep_c), "ms", p("compute"), None, None);
        rec.add("sign_ms", ms(sign_c), "ms", p("compute"), None, None);
        rec.add(
            "sign_ms",
            ms(all_parties),
            "ms",
            p("compute_all_parties"),
            None,
            None,
        );
        // Proactive refresh: the same three steps as the DKG, each party dealing zero.
        let (_, spent) = frost::refresh_in_memory(&shares, &mut OsRng)?;
        let refresh_c = spent.iter().sum::<Duration>() / n as u32;
        rec.add("refresh_ms", ms(refresh_c), "ms", p("compute"), None, None);
        // Over the network, where this machine can host the nodes.
        if n > 20 {
            continue;
        }
        let net = network(t, n)?;
        let st = Instant::now();
        let group = net.kmn.dkg("bench")?;
        let dkg_wall = st.elapsed();
        rec.add(
            "dkg_ms",
            ms(dkg_wall.saturating_sub(dkg_c)),
            "ms",
            p("wait"),
            None,
            None,
        );
        let signer = florin_node::custody::ThresholdSigner::new(net.kmn.clone(), group);
        // Warm: connections and the first commitment batches.
        for i in 0..40 {
            signer.sign(format!("warm {i}").as_bytes())?;
        }
        let mut lat = Vec::with_capacity(iters);
        let st = Instant::now();
        for i in 0..iters {
            let s = Instant::now();
            signer.sign(format!("bench {i}").as_bytes())?;
            lat.push(s.elapsed().as_micros() as u32);
        }
        let per_sig = st.elapsed() / iters as u32;
        lat.sort_unstable();
        rec.add(
            "sign_ms",
            ms(per_sig.saturating_sub(sign_c)),
            "ms",
            p("wait"),
            None,
            None,
        );
        rec.add(
            "sign_ms",
            ms(per_sig),
            "ms",
            p("total"),
            if (t, n) == (2, 3) {
                seed(1000.0, "interactive 2-of-3 CGGMP21 signing, about 1 s")
            } else {
                None
            },
            None,
        );
        rec.add(
            "sign_ms_p99",
            percentile(&lat, 0.99),
            "ms",
            p("total"),
            None,
            None,
        );
        // A refresh over the network, and the first signature after it (the signer is
        // refused as stale once, fetches the new sharing and signs again).
        let st = Instant::now();
        net.kmn.refresh("bench")?;
        let refresh_wall = st.elapsed();
        rec.add(
            "refresh_ms",
            ms(refresh_wall.saturating_sub(refresh_c)),
            "ms",
            p("wait"),
            None,
            None,
        );
        let st = Instant::now();
        signer.sign(b"after refresh")?;
        rec.add(
            "sign_ms",
            ms(st.elapsed()),
            "ms",
            p("first_after_refresh"),
            None,
            None,
        );
        // Nonce preparation over the network: one batch fetch of 512 from a cold key.
        let g2 = net.kmn.dkg("cold")?;
        let cold = florin_node::custody::ThresholdSigner::new(net.kmn.clone(), g2);
        let st = Instant::now();
        cold.sign(b"first")?;
        rec.add(
            "presign_ms",
            ms(st.elapsed()),
            "ms",
            p("first_signature_cold_pool"),
            None,
            None,
        );
    }
    Ok(all_2_of_3)
}

// ---------------------------------------------------------------------------------------------
// End to end

/// A byte stream an [`Http`] client talks over: plain TCP or TLS.
trait Conn: Read + Write + Send {}

impl<T: Read + Write + Send> Conn for T {}

/// A blocking keep-alive HTTP/1.1 client for the ledger and provider APIs. A connection left
/// idle for [`Http::REOPEN_AFTER`] is replaced before the next request (servers close idle
/// ones: `florin` after 10 s).
pub(super) struct Http {
    s: Box<dyn Conn>,
    buf: Vec<u8>,
    addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
    last: Instant,
    /// The server said it closes the connection after its last answer.
    closing: bool,
    retries: u64,
}

impl Http {
    const REOPEN_AFTER: Duration = Duration::from_secs(5);

    fn open(addr: SocketAddr, tls: Option<&Arc<rustls::ClientConfig>>) -> Result<Box<dyn Conn>> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        let Some(tls) = tls else {
            return Ok(Box::new(s));
        };
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let conn = rustls::ClientConnection::new(tls.clone(), name)?;
        let mut s = rustls::StreamOwned::new(conn, s);
        // The handshake now, so that the first request does not pay for it.
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock)?;
        }
        Ok(Box::new(s))
    }

    pub(super) fn connect(addr: SocketAddr) -> Result<Http> {
        Ok(Http {
            s: Http::open(addr, None)?,
            buf: Vec::with_capacity(4096),
            addr,
            tls: None,
            last: Instant::now(),
            closing: false,
            retries: 0,
        })
    }

    /// Over TLS, trusting what `tls` trusts for the name `addr`'s IP address.
    pub(super) fn connect_tls(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> Result<Http> {
        Ok(Http {
            s: Http::open(addr, Some(&tls))?,
            buf: Vec::with_capacity(4096),
            addr,
            tls: Some(tls),
            last: Instant::now(),
            closing: false,
            retries: 0,
        })
    }

    /// A request to the ledger's API (`application/octet-stream`). One that got no byte of an
    /// answer (the server closed the connection first: it had been idle too long, or the host
    /// was starved of CPU) is sent once more on a fresh connection. That is safe for what this
    /// is used for: a transaction sent again is answered with its status and changes nothing,
    /// and a GET changes nothing.
    pub(super) fn call(&mut self, method: &str, path: &str, body: &[u8]) -> Result<Vec<u8>> {
        let req = Http::request(method, path, "application/octet-stream", body, "");
        match self.exchange(&req)? {
            Ok(answer) => Ok(answer),
            Err(first) => {
                self.retries += 1;
                self.s = Http::open(self.addr, self.tls.as_ref())?;
                self.closing = false;
                self.last = Instant::now();
                self.exchange(&req)?.map_err(|e| {
                    e.context(format!(
                        "sent twice, no answer either time (the first time: {first:#})"
                    ))
                })
            }
        }
    }

    /// A JSON request with one more header line (`name: value`); the answer's body. Never
    /// sent twice.
    pub(super) fn call_json_with(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        header: &str,
    ) -> Result<Vec<u8>> {
        let req = Http::request(method, path, "application/json", body, header);
        self.exchange(&req)?
    }

    /// Requests sent again on a fresh connection after getting no answer.
    pub(super) fn retries(&self) -> u64 {
        self.retries
    }

    fn request(method: &str, path: &str, ctype: &str, body: &[u8], header: &str) -> Vec<u8> {
        let extra = if header.is_empty() {
            String::new()
        } else {
            format!("{header}\r\n")
        };
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: {ctype}\r\n{extra}content-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        req
    }

    /// Sends `req` and reads the answer's body. The outer error is a failed or broken answer;
    /// the inner one says no byte of an answer came (the request may be sent again).
    fn exchange(&mut self, req: &[u8]) -> Result<Result<Vec<u8>, anyhow::Error>> {
        if self.closing || self.last.elapsed() > Http::REOPEN_AFTER {
            self.s = Http::open(self.addr, self.tls.as_ref())?;
            self.closing = false;
        }
        self.last = Instant::now();
        self.buf.clear();
        if let Err(e) = self.s.write_all(req) {
            return Ok(Err(anyhow::Error::from(e).context("sending the request")));
        }
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
                if !head.starts_with("http/1.1 200") {
                    let status = head.lines().next().unwrap_or("").to_string();
                    bail!("HTTP: {status}");
                }
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| anyhow!("no content-length"))?;
                while self.buf.len() < end + 4 + len {
                    let k = self.s.read(&mut chunk)?;
                    if k == 0 {
                        bail!("connection closed");
                    }
                    self.buf.extend_from_slice(&chunk[..k]);
                }
                // The server's idle clock starts now; one that closes the connection after
                // this answer gets a fresh one for the next request.
                self.last = Instant::now();
                self.closing = head.lines().any(|l| l.trim() == "connection: close");
                return Ok(Ok(self.buf[end + 4..end + 4 + len].to_vec()));
            }
            let read = self.s.read(&mut chunk);
            match read {
                Ok(k) if k > 0 => self.buf.extend_from_slice(&chunk[..k]),
                Ok(_) if self.buf.is_empty() => return Ok(Err(anyhow!("connection closed"))),
                Err(e) if self.buf.is_empty() => return Ok(Err(e.into())),
                Ok(_) => bail!("connection closed"),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A custodial customer: its key (threshold or single), its current coin and its provider's
/// connection to the ledger (kept from one run to the next).
/// A customer's key: Ed25519 (single, or FROST through the provider's network) or P-256
/// (single, or DKLs23 through the provider's network).
#[derive(Clone)]
pub(super) enum PayKey {
    Ed25519(Arc<dyn Signer>),
    P256(Arc<dyn florin_crypto::p256::P256Signer>),
}

impl PayKey {
    /// What its coins are locked to.
    pub(super) fn encumbrance(&self) -> Encumbrance {
        match self {
            PayKey::Ed25519(k) => Encumbrance::ed25519(&k.public_key()),
            PayKey::P256(k) => Encumbrance::p256(&k.public_key()),
        }
    }

    /// Signs a one-input transfer.
    fn sign(&self, d: Draft) -> Result<florin_ledger::Transfer> {
        Ok(match self {
            PayKey::Ed25519(k) => d.sign(&[k.as_ref()])?,
            PayKey::P256(k) => {
                let pk = k.public_key();
                d.sign_with(|_, txid| {
                    let sig = k
                        .sign(txid)
                        .map_err(|e| florin_ledger::BuildError::Signing(e.to_string()))?;
                    Ok(florin_ledger::Witness::p256(pk, sig))
                })?
            }
        })
    }
}

pub(super) struct Customer {
    pub(super) key: PayKey,
    pub(super) coin: Utxo,
    pub(super) http: Option<Http>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub(super) enum Route {
    Same,
    Cross,
}

/// Customers of two providers: `users` payers, half at each provider, each with a payee at
/// its own provider and one at the other.
struct Providers {
    payers: Vec<Mutex<Customer>>,
    same_payee: Vec<Encumbrance>,
    cross_payee: Vec<Encumbrance>,
}

/// Each customer's coin.
pub(super) const COIN: u64 = 1_000_000;

/// A mint of one [`COIN`] to each of `keys`, signed by `issuer`.
pub(super) fn coin_mint(issuer: &dyn Signer, keys: &[Encumbrance]) -> Result<Mint> {
    let mut nonce = [0u8; 32];
    rand::RngCore::fill_bytes(&mut OsRng, &mut nonce);
    let mut mint = Mint {
        expires: florin_ledger::expiry::default_expiry(),
        nonce,
        outputs: keys
            .iter()
            .map(|k| Output {
                value: COIN,
                encumbrance: *k,
            })
            .collect(),
        issuer_signature: Signature([0; 64]),
    };
    mint.issuer_signature = issuer.sign(&mint.txid())?;
    Ok(mint)
}

fn mint_coins(node: &Node, keys: &[Encumbrance]) -> Result<Vec<Utxo>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(1000) {
        let mint = coin_mint(node.issuer.as_ref(), chunk)?;
        out.extend(mint.output_utxos());
        let (_, status) = node
            .rt
            .block_on(node.ledger.submit(Transaction::Mint(mint)))?;
        if status != florin_node::TxStatus::Confirmed {
            bail!("benchmark mint not confirmed: {status:?}");
        }
    }
    Ok(out)
}

/// Makes `users` custodial payers (half per provider) and their payees. With `threshold`,
/// every key is made by distributed key generation in its provider's network.
fn providers(
    node: &Node,
    kmns: &[Arc<Kmn>; 2],
    users: usize,
    threshold: bool,
    tag: &str,
) -> Result<Providers> {
    let mut keys: Vec<PayKey> = Vec::with_capacity(users);
    let payee = |provider: usize, name: String| -> Result<Encumbrance> {
        let pk = if threshold {
            kmns[provider].dkg(&name)?.public_key()
        } else {
            SecretKey::generate(&mut OsRng).public_key()
        };
        Ok(Encumbrance::ed25519(&pk))
    };
    let mut same_payee = Vec::with_capacity(users);
    let mut cross_payee = Vec::with_capacity(users);
    for u in 0..users {
        let provider = u % 2;
        let key = PayKey::Ed25519(if threshold {
            let name = format!("{tag}-payer-{u}");
            let g = kmns[provider].dkg(&name)?;
            Arc::new(florin_node::custody::ThresholdSigner::new(
                kmns[provider].clone(),
                g,
            ))
        } else {
            Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng)))
        });
        keys.push(key);
        same_payee.push(payee(provider, format!("{tag}-same-{u}"))?);
        cross_payee.push(payee(1 - provider, format!("{tag}-cross-{u}"))?);
    }
    let encs: Vec<Encumbrance> = keys.iter().map(|k| k.encumbrance()).collect();
    let coins = mint_coins(node, &encs)?;
    Ok(Providers {
        payers: keys
            .into_iter()
            .zip(coins)
            .map(|(key, coin)| {
                Mutex::new(Customer {
                    key,
                    coin,
                    http: None,
                })
            })
            .collect(),
        same_payee,
        cross_payee,
    })
}

/// One payment by `c` to `to`: build, sign (through the provider's custody), submit, wait for
/// confirmation; on the cross-provider route the payee's provider then checks the output on
/// the ledger.
pub(super) fn pay(http: &mut Http, c: &mut Customer, to: &Encumbrance, route: Route) -> Result<()> {
    let outputs = vec![
        Output {
            value: 1,
            encumbrance: *to,
        },
        Output {
            value: c.coin.value - 1,
            encumbrance: c.coin.encumbrance,
        },
    ];
    let t = c.key.sign(Draft::new(vec![c.coin], outputs)?)?;
    let outs = t.output_utxos();
    let body = http.call(
        "POST",
        "/v1/ledger/transactions",
        &Transaction::Transfer(t).encode(),
    )?;
    let st: florin_node::api::LedgerTxStatus = serde_json::from_slice(&body)?;
    if st.status != "confirmed" {
        bail!("payment not confirmed: {} {:?}", st.status, st.error);
    }
    if route == Route::Cross {
        let body = http.call(
            "GET",
            &format!("/v1/ledger/unspent/{}", hex::encode(outs[0].id())),
            &[],
        )?;
        let u: florin_node::api::Unspent = serde_json::from_slice(&body)?;
        if !u.unspent {
            bail!("the payee's provider does not see the payment");
        }
    }
    c.coin = outs[1];
    Ok(())
}

pub(super) struct E2e {
    /// Payments finished within the window, per second of the window.
    pub(super) per_s: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
    /// Payments finished within the window.
    pub(super) done: u64,
    /// Payments finished at all (those in flight when the window closed included): what the
    /// CPU spent until every payer stopped paid for.
    pub(super) done_all: u64,
    /// CPU time of the whole process (ledger, both networks, load) per payment.
    pub(super) cpu_us: Option<f64>,
    /// The latency (µs) of each payment finished within the window, sorted.
    pub(super) latencies_us: Vec<u32>,
    /// Requests sent again on a fresh connection after getting no answer.
    pub(super) retries: u64,
}

fn drive(node: &Node, p: &Providers, route: Route, secs: f64) -> Result<E2e> {
    let payees = match route {
        Route::Same => &p.same_payee,
        Route::Cross => &p.cross_payee,
    };
    let addr = node.addr;
    drive_payers(&|| Http::connect(addr), &p.payers, payees, route, secs)
}

/// Every payer pays its payee (`payees[i % len]`) over and over, one payment at a time,
/// for `secs`; a payer without a connection opens one with `connect`. Any failed payment
/// fails the run.
pub(super) fn drive_payers(
    connect: &(dyn Fn() -> Result<Http> + Sync),
    payers: &[Mutex<Customer>],
    payees: &[Encumbrance],
    route: Route,
    secs: f64,
) -> Result<E2e> {
    if payees.is_empty() {
        bail!("no payees");
    }
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let done_all = AtomicU64::new(0);
    let retries = AtomicU64::new(0);
    let lats = Mutex::new(Vec::<u32>::new());
    let errors = Mutex::new(Vec::<String>::new());
    let start = Instant::now();
    let window = Duration::from_secs_f64(secs);
    let end = start + window;
    let cpu0 = super::process_cpu_s();
    std::thread::scope(|s| {
        for (i, payer) in payers.iter().enumerate() {
            let to = &payees[i % payees.len()];
            let (stop, done, done_all, retries, lats, errors) =
                (&stop, &done, &done_all, &retries, &lats, &errors);
            s.spawn(move || {
                let mut mine = Vec::new();
                let mut run = || -> Result<()> {
                    let mut c = payer.lock().map_err(|_| anyhow!("lock"))?;
                    let mut http = match c.http.take() {
                        Some(h) => h,
                        None => connect()?,
                    };
                    let before = http.retries();
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        pay(&mut http, &mut c, to, route)?;
                        let now = Instant::now();
                        done_all.fetch_add(1, Ordering::Relaxed);
                        // Counted only within the window: the payments still in flight when
                        // it closes finish with fewer beside them.
                        if now <= end {
                            mine.push((now - t).as_micros() as u32);
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    retries.fetch_add(http.retries() - before, Ordering::Relaxed);
                    c.http = Some(http);
                    Ok(())
                };
                if let Err(e) = run() {
                    if let Ok(mut v) = errors.lock() {
                        v.push(format!("{e:#}"));
                    }
                    stop.store(true, Ordering::Relaxed);
                }
                if let Ok(mut l) = lats.lock() {
                    l.extend(mine);
                }
            });
        }
        std::thread::sleep(window);
        stop.store(true, Ordering::Relaxed);
    });
    let cpu = cpu0.zip(super::process_cpu_s()).map(|(a, b)| b - a);
    let errors = errors.into_inner().map_err(|_| anyhow!("lock"))?;
    if let Some(e) = errors.first() {
        let mut kinds: Vec<&String> = errors.iter().collect();
        kinds.sort();
        kinds.dedup();
        bail!(
            "{} payment(s) failed, {} kind(s) of error; first: {e}; last kind: {}",
            errors.len(),
            kinds.len(),
            kinds.last().map_or("", |k| k.as_str())
        );
    }
    let mut l = lats.into_inner().map_err(|_| anyhow!("lock"))?;
    l.sort_unstable();
    let n = done.load(Ordering::Relaxed);
    let all = done_all.load(Ordering::Relaxed);
    Ok(E2e {
        per_s: n as f64 / secs.max(1e-9),
        p50: percentile(&l, 0.5),
        p99: percentile(&l, 0.99),
        done: n,
        done_all: all,
        cpu_us: cpu.filter(|_| all > 0).map(|c| c * 1e6 / all as f64),
        latencies_us: l,
        retries: retries.load(Ordering::Relaxed),
    })
}

/// The source document's payment rate for the same custody and route.
pub(super) fn doc_rate(threshold: bool, route: Route) -> Option<Reference> {
    match (threshold, route) {
        (true, Route::Same) => seed(10.7, "UC1 with threshold keys, 100-300 users"),
        (false, Route::Same) => seed(190.0, "UC1 without threshold keys"),
        (true, Route::Cross) => seed(1.2, "UC2 with threshold keys, 100-300 users"),
        (false, Route::Cross) => seed(60.0, "UC2 without threshold keys"),
    }
}

/// CPU of one single-key Ed25519 signature, as the single-key reference signs.
fn single_sign_cpu() -> Result<Duration> {
    let signer = LocalSigner::new(SecretKey::generate(&mut OsRng));
    let n = 2_000u32;
    let st = Instant::now();
    for i in 0..n {
        std::hint::black_box(signer.sign(&i.to_le_bytes())?);
    }
    Ok(st.elapsed() / n)
}

/// `frost_all_parties`: every party's CPU for one 2-of-3 FROST signature, from
/// [`crypto_points`].
fn e2e(rec: &mut Recorder, quick: bool, frost_all_parties: Duration) -> Result<()> {
    let node = Node::start(&[]).context("starting the ledger node")?;
    let nets = [network(2, 3)?, network(2, 3)?];
    let kmns = [nets[0].kmn.clone(), nets[1].kmn.clone()];
    let users: &[usize] = if quick {
        &[1, 10]
    } else {
        &[1, 10, 30, 100, 300]
    };
    let secs = if quick { 1.0 } else { 3.0 };
    let mut best: BTreeMap<(bool, bool), f64> = BTreeMap::new();
    // CPU µs per payment of the best run of each kind.
    let mut best_cpu: BTreeMap<(bool, bool), f64> = BTreeMap::new();
    for &threshold in &[false, true] {
        let custody = if threshold { "threshold" } else { "single" };
        for &u in users {
            let st = Instant::now();
            let p = providers(&node, &kmns, u, threshold, &format!("u{u}"))?;
            if threshold {
                tracing::info!(
                    "  {} custodial keys generated by DKG in {:.1} s",
                    3 * u,
                    st.elapsed().as_secs_f64()
                );
            }
            for route in [Route::Same, Route::Cross] {
                let r = drive(&node, &p, route, secs)?;
                let rname = if route == Route::Same {
                    "same_provider"
                } else {
                    "cross_provider"
                };
                let doc = doc_rate(threshold, route);
                let params =
                    json!({"custody": custody, "route": rname, "users": u, "payments": r.done});
                rec.add(
                    "e2e_payments_per_s",
                    r.per_s,
                    "payments/s",
                    params.clone(),
                    doc,
                    None,
                );
                rec.add(
                    "e2e_latency_ms_p50",
                    r.p50,
                    "ms",
                    params.clone(),
                    None,
                    None,
                );
                rec.add(
                    "e2e_latency_ms_p99",
                    r.p99,
                    "ms",
                    params.clone(),
                    None,
                    None,
                );
                if let Some(c) = r.cpu_us {
                    rec.add("e2e_cpu_us_per_payment", c, "us", params, None, None);
                }
                let k = (threshold, route == Route::Same);
                let b = best.entry(k).or_insert(0.0);
                if r.per_s > *b {
                    *b = r.per_s;
                    if let Some(c) = r.cpu_us {
                        best_cpu.insert(k, c);
                    }
                }
            }
        }
    }
    let thr = best.get(&(true, true)).copied().unwrap_or(0.0);
    let single = best.get(&(false, true)).copied().unwrap_or(0.0);
    rec.add(
        "frost_e2e_vs_seed_ratio",
        thr / 10.7,
        "ratio",
        json!({"route": "same_provider", "florin": thr}),
        seed(10.7, "UC1 threshold throughput; target ≥ 100×"),
        None,
    );
    rec.add(
        "threshold_vs_single_e2e_ratio",
        if thr > 0.0 { single / thr } else { 0.0 },
        "ratio",
        json!({"route": "same_provider", "threshold": thr, "single": single, "note": "best over user counts; target ≤ 2"}),
        None,
        Some(Reference {
            value: single,
            source: "single-key custodial payments, same run".into(),
        }),
    );
    // What the ratio can be at best while every party runs on this machine's cores: a
    // threshold payment does all of a single-key payment's work but its one Ed25519
    // signature, plus every party's work for one FROST signature. Throughput bound by CPU
    // falls by at least that factor, however the rest is tuned.
    // (A floor on the throughput ratio only while the single-key run keeps the cores busy:
    // `single_cores_busy` says how many it kept busy.)
    if let Some(&single_cpu) = best_cpu.get(&(false, true)) {
        let own_sig = single_sign_cpu()?.as_secs_f64() * 1e6;
        let cores_busy = single_cpu * single / 1e6;
        let frost_us = frost_all_parties.as_secs_f64() * 1e6;
        let floor = (single_cpu - own_sig + frost_us) / single_cpu;
        rec.add(
            "threshold_vs_single_e2e_cpu_floor",
            floor,
            "ratio",
            json!({
                "route": "same_provider",
                "single_cpu_us_per_payment": single_cpu,
                "single_key_sign_us": own_sig,
                "single_cores_busy": cores_busy,
                "frost_2_of_3_all_parties_cpu_us": frost_us,
                "what": "lower bound on threshold_vs_single_e2e_ratio with every party on this machine's cores: (single-key payment CPU - its Ed25519 signature + one 2-of-3 FROST signature's CPU over all parties) / single-key payment CPU",
                "target_of_the_ratio": 2,
            }),
            None,
            None,
        );
    }
    let thr_x = best.get(&(true, false)).copied().unwrap_or(0.0);
    rec.add(
        "frost_e2e_vs_seed_ratio",
        thr_x / 1.2,
        "ratio",
        json!({"route": "cross_provider", "florin": thr_x}),
        seed(1.2, "UC2 threshold throughput"),
        None,
    );
    Ok(())
}

/// Runs the suite.
pub fn run(rec: &mut Recorder, scale: Scale) -> Result<()> {
    let quick = scale.tokens <= 2_000;
    let frost_all_parties = crypto_points(rec, quick)?;
    super::custody_ecdsa::run(rec, quick, scale.full)?;
    e2e(rec, quick, frost_all_parties)?;
    super::custody_psp::run(rec, quick)?;
    Ok(())
}
