//! Custodial payments through the payment-provider service (`florin psp`) with threshold
//! ECDSA P-256 keys: two providers, each with its own 2-of-3 key-management network (nodes in
//! this process over real Noise links), customers paying over the providers' HTTP API, the
//! ledger node as `florin devnet` runs it. This is the source document's own setting (CGGMP
//! ECDSA, smart-card compatible keys) end to end. A payment counts from the customer's request
//! to the provider's receipt: signed from a presignature (or interactively when the account's
//! pool is empty), confirmed on the ledger and, across providers, acknowledged by the payee's
//! provider after its own ledger check.
//!
//! Both ECDSA engines run, each with its own ledger and providers:
//! - **CGGMP24** at the insecure-test level (768-bit Paillier primes): a presignature costs
//!   ≈ 0.2 s of CPU here instead of 1.6–2.5 s, so these figures are an upper bound for
//!   production keys. Sustained throughput is the presignature refill rate; the first payments
//!   of each account spend its ready pool.
//! - **DKLs23** at its one level, production: every payment's signature is a three-round run
//!   among two of the three nodes. Provider A keeps two account keys made ahead
//!   (`ecdsa_key_ready_ms` times an account opened from them); provider B makes each key when
//!   its account opens (`ecdsa_account_open_ms`). The default run ends with a 60-second point.
//!
//! Every point reports its error rate (`e2e_error_rate`; a failed payment is counted and its
//! payer goes on) and then checks that nothing is half-done: no payment left unresolved on the
//! ledger and none unacknowledged to the payee's provider.
//!
//! Every request is signed by the customer's key and every payment carries the customer's
//! authorization, which each key-management node checks before it signs (as in production:
//! see `florin_custody::authz`); the providers know each other as configured peers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use florin_crypto::SecretKey;
use florin_ledger::Encumbrance;
use florin_node::custody::{
    free_loopback_addrs, EcdsaEngine, EcdsaLevel, Kmn, Layout, RunningNode,
};
use florin_node::psp::api::{AccountView, PayReceipt, PayRequest, TransferOffer};
use florin_node::psp::auth::{SignedRequest, AUTH_HEADER};
use florin_node::psp::proof::PayeeOffer;
use florin_node::psp::{PaymentAuth, PeerPsp, Psp, PspConfig, PspScheme};
use serde_json::json;

use super::custody::Http;
use super::ledger_e2e::{percentile, Node};
use super::{Recorder, Reference};

struct Provider {
    addr: std::net::SocketAddr,
    psp: std::sync::Arc<Psp>,
    peer: PeerPsp,
    _stop: tokio::sync::oneshot::Sender<()>,
    _nodes: Vec<RunningNode>,
    _dir: tempfile::TempDir,
}

fn provider(
    rt: &tokio::runtime::Runtime,
    name: &str,
    ledger: &str,
    e: &EngineRun,
    key_pool: usize,
) -> Result<Provider> {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(2, &free_loopback_addrs(3)?)?;
    layout.set_ecdsa(Some(e.level))?;
    let nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    if e.engine == EcdsaEngine::Cggmp24 {
        kmn.ecdsa_setup(Duration::from_secs(300))?;
    }
    let peer_key = SecretKey::generate(&mut rand::rngs::OsRng);
    let peer_pub = peer_key.public_key().to_address();
    let psp = Psp::open(
        PspConfig {
            name: name.into(),
            books: dir.path().join("psp.redb"),
            ledger: ledger.into(),
            scheme: PspScheme::P256,
            presign_pool: e.pool,
            ecdsa_engine: e.engine,
            key_pool,
            peer_key,
            peers: Vec::new(),
            operators: Vec::new(),
        },
        kmn,
        std::sync::Arc::new(florin_http::HttpLinks::new()?),
    )?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = psp.clone();
    rt.spawn(async move {
        // A load generator from one address: no per-address limits.
        let options = florin_http::ServeOptions::default().without_per_address_limits();
        let limits = florin_http::RateLimits::off();
        let _ =
            florin_http::psp::serve_with_limits(listener, serving, options, limits, async move {
                let _ = stopped.await;
            })
            .await;
    });
    Ok(Provider {
        addr,
        peer: PeerPsp {
            id: name.into(),
            url,
            key: peer_pub,
        },
        psp,
        _stop: stop,
        _nodes: nodes,
        _dir: dir,
    })
}

/// A POST signed by `key` as `who`.
fn post_signed<T: serde::de::DeserializeOwned>(
    http: &mut Http,
    path: &str,
    body: &serde_json::Value,
    who: &str,
    key: &SecretKey,
) -> Result<T> {
    let body = body.to_string();
    let auth = SignedRequest::header(key, who, "POST", path, body.as_bytes());
    let out = http
        .call_json_with(
            "POST",
            path,
            body.as_bytes(),
            &format!("{AUTH_HEADER}: {auth}"),
        )
        .with_context(|| format!("POST {path}"))?;
    serde_json::from_slice(&out).with_context(|| format!("POST {path}: unreadable answer"))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One engine's settings on the PSP path.
struct EngineRun {
    engine: EcdsaEngine,
    /// The key-management nodes' ECDSA setting.
    level: EcdsaLevel,
    /// The security level the rows are labelled with.
    level_name: &'static str,
    pool: usize,
    /// Account keys made ahead per provider.
    key_pool: usize,
    users: Vec<usize>,
    secs: f64,
    /// One longer point (users, seconds), to show the rate holds.
    sustained: Option<(usize, f64)>,
}

/// What one point measured.
struct Point {
    done: u64,
    presigned: u64,
    errors: Vec<String>,
    unnotified: u64,
    lats: Vec<u32>,
    elapsed: f64,
}

/// Runs the PSP path for both engines: CGGMP24 at the insecure test level (a production
/// presignature costs seconds here), DKLs23 at its one level, production.
pub fn run(rec: &mut Recorder, quick: bool) -> Result<()> {
    run_engine(
        rec,
        &EngineRun {
            engine: EcdsaEngine::Cggmp24,
            level: EcdsaLevel::InsecureTest,
            level_name: "insecure-test",
            pool: 2,
            key_pool: 0,
            users: if quick {
                vec![1, 4]
            } else {
                vec![1, 4, 10, 30]
            },
            secs: if quick { 3.0 } else { 10.0 },
            sustained: None,
        },
    )?;
    run_engine(
        rec,
        &EngineRun {
            engine: EcdsaEngine::Dkls23,
            level: EcdsaLevel::Dkls23,
            level_name: "production",
            pool: 0,
            key_pool: 2,
            users: if quick { vec![1, 2] } else { vec![1, 4, 10] },
            secs: if quick { 3.0 } else { 10.0 },
            sustained: (!quick).then_some((10, 60.0)),
        },
    )
}

/// `users` payers per point, same and cross provider, with one engine's keys.
fn run_engine(rec: &mut Recorder, e: &EngineRun) -> Result<()> {
    let node = Node::start(&[]).context("starting the ledger node")?;
    let ledger = format!("http://{}", node.addr);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let st = Instant::now();
    // Provider A keeps account keys made ahead (when the engine's run asks for it); B makes
    // each key when its account opens, which `ecdsa_account_open_ms` times.
    let a = provider(&rt, "bank-a", &ledger, e, e.key_pool)?;
    let b = provider(&rt, "bank-b", &ledger, e, 0)?;
    a.psp.set_peers(vec![b.peer.clone()])?;
    b.psp.set_peers(vec![a.peer.clone()])?;
    tracing::info!(
        "  two providers with {} ECDSA networks ready in {:.1} s",
        e.engine.name(),
        st.elapsed().as_secs_f64()
    );
    let mut ha = Http::connect(a.addr)?;
    let mut hb = Http::connect(b.addr)?;
    // Payers p at A, payees q at A (same provider) and r at B (cross), opened once for the
    // largest point; a point of u users uses the first u of each.
    let most = e
        .users
        .iter()
        .copied()
        .chain(e.sustained.map(|s| s.0))
        .max()
        .unwrap_or(1);
    if e.key_pool > 0 {
        // A new account's key ready to sign, taken from the keys made ahead.
        let until = Instant::now() + Duration::from_secs(300);
        while a.psp.pool_ready() < e.key_pool {
            if Instant::now() >= until {
                bail!("the key pool did not fill in 5 minutes");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut ready = Vec::new();
        for i in 0..e.key_pool {
            let (_, _, took) = open_account(&mut ha, &format!("k{i}"))?;
            ready.push(took);
        }
        ready.sort_unstable();
        rec.add(
            "ecdsa_key_ready_ms",
            percentile(&ready, 0.5),
            "ms",
            json!({"engine": e.engine.name(), "level": e.level_name, "t": 2, "n": 3,
                   "key": "made ahead (pool), bound to the customer and committed at opening",
                   "accounts": e.key_pool, "key_pool": e.key_pool}),
            None,
            None,
        );
    }
    let st = Instant::now();
    let mut at_b_opening = Vec::new();
    let mut accounts: std::collections::HashMap<String, (SecretKey, Encumbrance)> =
        std::collections::HashMap::new();
    for i in 0..most {
        for (at_b, name) in [
            (false, format!("p{i}")),
            (false, format!("q{i}")),
            (true, format!("r{i}")),
        ] {
            let h = if at_b { &mut hb } else { &mut ha };
            let (key, enc, took) = open_account(h, &name)?;
            if at_b {
                at_b_opening.push(took);
            }
            accounts.insert(name, (key, enc));
        }
        let payer = format!("p{i}");
        let key = &accounts
            .get(&payer)
            .ok_or_else(|| anyhow!("account {payer} was not opened"))?
            .0;
        let _: serde_json::Value = post_signed(
            &mut ha,
            &format!("/v1/psp/accounts/{payer}/faucet"),
            &json!({ "amount_cents": 1_000_000 }),
            &payer,
            key,
        )?;
    }
    let opened = st.elapsed().as_secs_f64();
    tracing::info!(
        "  {} accounts opened in {opened:.1} s ({:.0} ms a key)",
        3 * most,
        opened * 1e3 / (3 * most) as f64
    );
    at_b_opening.sort_unstable();
    rec.add(
        "ecdsa_account_open_ms",
        percentile(&at_b_opening, 0.5),
        "ms",
        json!({"engine": e.engine.name(), "level": e.level_name, "t": 2, "n": 3,
               "accounts": at_b_opening.len(),
               "key": "distributed key generation on the request path (no pool)"}),
        None,
        None,
    );
    // No key generation during the points: the pools refill first.
    let until = Instant::now() + Duration::from_secs(300);
    while a.psp.pool_ready() < e.key_pool {
        if Instant::now() >= until {
            bail!("the key pool did not refill in 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut points: Vec<(usize, f64, bool)> = e.users.iter().map(|&u| (u, e.secs, false)).collect();
    if let Some((u, secs)) = e.sustained {
        points.push((u, secs, true));
    }
    for (u, secs, sustained) in points {
        for route in ["same_provider", "cross_provider"] {
            if e.engine == EcdsaEngine::Cggmp24 {
                // Let every account's pool fill before the clock starts (steady state).
                std::thread::sleep(
                    Duration::from_secs_f64(0.5 * u as f64).min(Duration::from_secs(10)),
                );
            }
            // Each payer: (from, to, customer key, payer's and payee's encumbrances).
            let payers = (0..u)
                .map(|i| {
                    let from = format!("p{i}");
                    let to = if route == "same_provider" {
                        format!("q{i}")
                    } else {
                        format!("r{i}")
                    };
                    match (accounts.get(&from), accounts.get(&to)) {
                        (Some(p), Some(q)) => Ok((from, to, p.0.clone(), p.1, q.1)),
                        _ => Err(anyhow!("accounts {from} and {to} were not opened")),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let tag = format!("{}-{u}-{secs}", e.engine.name());
            let pt = drive(a.addr, &payers, route, secs, &tag)?;
            // Nothing half-done: every payment the providers took is resolved on the ledger and
            // acknowledged to the payee's provider (the background upkeep finishes stragglers).
            let until = Instant::now() + Duration::from_secs(30);
            let (unresolved, unnotified) = loop {
                let (ia, ib) = (a.psp.info()?, b.psp.info()?);
                let left = (ia.unresolved + ib.unresolved, ia.unnotified + ib.unnotified);
                if left == (0, 0) || Instant::now() >= until {
                    break left;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            if unresolved + unnotified > 0 {
                bail!(
                    "{}: {unresolved} payment(s) unresolved and {unnotified} unacknowledged 30 s \
                     after the point ({route}, {u} users)",
                    e.engine.name()
                );
            }
            let attempts = pt.done + pt.errors.len() as u64;
            if pt.done == 0 {
                bail!(
                    "{} {route}: no payment finished; first error: {}",
                    e.engine.name(),
                    pt.errors.first().map(String::as_str).unwrap_or("none")
                );
            }
            let error_rate = pt.errors.len() as f64 / attempts.max(1) as f64;
            if error_rate > 0.01 {
                bail!(
                    "{} {route}: {} of {attempts} payments failed; first: {}",
                    e.engine.name(),
                    pt.errors.len(),
                    pt.errors.first().map(String::as_str).unwrap_or("")
                );
            }
            let mut l = pt.lats;
            l.sort_unstable();
            let share = pt.presigned as f64 / pt.done as f64;
            let mut params = json!({
                "custody": "threshold", "scheme": "p256", "path": "psp",
                "engine": e.engine.name(), "level": e.level_name, "route": route, "users": u,
                "payments": pt.done, "seconds": secs, "signatures_per_payment": 1,
                "acknowledged_later": pt.unnotified,
            });
            if e.engine == EcdsaEngine::Cggmp24 {
                params["presign_pool"] = json!(e.pool);
                params["from_presignature_share"] = json!((share * 100.0).round() / 100.0);
            }
            if sustained {
                params["sustained"] = json!(true);
            }
            let seed = if route == "same_provider" {
                Reference {
                    value: 10.7,
                    source: "004_… §6: UC1 with threshold keys, 100-300 users".into(),
                }
            } else {
                Reference {
                    value: 1.2,
                    source: "004_… §6: UC2 with threshold keys, 100-300 users".into(),
                }
            };
            rec.add(
                "ecdsa_e2e_payments_per_s",
                pt.done as f64 / pt.elapsed,
                "payments/s",
                params.clone(),
                Some(seed),
                None,
            );
            rec.add(
                "e2e_error_rate",
                error_rate,
                "fraction",
                params.clone(),
                Some(Reference {
                    value: 0.0015,
                    source: "004_… §6: up to 0.15 % of payments failed under load".into(),
                }),
                None,
            );
            rec.add(
                "ecdsa_e2e_latency_ms_p50",
                percentile(&l, 0.5),
                "ms",
                params.clone(),
                None,
                None,
            );
            rec.add(
                "ecdsa_e2e_latency_ms_p99",
                percentile(&l, 0.99),
                "ms",
                params,
                None,
                None,
            );
        }
    }
    Ok(())
}

/// Opens account `name` with a fresh customer key: (the key, the account's encumbrance, µs
/// the opening took).
fn open_account(h: &mut Http, name: &str) -> Result<(SecretKey, Encumbrance, u32)> {
    let key = SecretKey::generate(&mut rand::rngs::OsRng);
    let st = Instant::now();
    let v: AccountView = post_signed(
        h,
        "/v1/psp/accounts",
        &json!({ "name": name, "customer_key": key.public_key().to_address() }),
        name,
        &key,
    )?;
    let took = st.elapsed().as_micros() as u32;
    let enc = Encumbrance::parse_text(&v.encumbrance)
        .ok_or_else(|| anyhow!("account {name}: bad encumbrance"))?;
    Ok((key, enc, took))
}

/// `payers` pay as fast as their answers come for `secs`, each on its own connection. A
/// failed payment is counted, and its payer goes on after a pause.
fn drive(
    a_addr: std::net::SocketAddr,
    payers: &[(String, String, SecretKey, Encumbrance, Encumbrance)],
    route: &str,
    secs: f64,
    tag: &str,
) -> Result<Point> {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let presigned = AtomicU64::new(0);
    let unnotified = AtomicU64::new(0);
    let lats = Mutex::new(Vec::<u32>::new());
    let errors = Mutex::new(Vec::<String>::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for (i, payer) in payers.iter().enumerate() {
            let (stop, done, presigned, unnotified, lats, errors) =
                (&stop, &done, &presigned, &unnotified, &lats, &errors);
            let (from, to, key, payer_enc, payee_enc) = payer.clone();
            s.spawn(move || {
                let note = |e: String| {
                    if let Ok(mut v) = errors.lock() {
                        v.push(e);
                    }
                };
                let mut http = match Http::connect(a_addr) {
                    Ok(h) => h,
                    Err(e) => return note(format!("connect: {e:#}")),
                };
                let mut mine = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let t = Instant::now();
                    // The customer's side: the authorization and the signed request.
                    let id = format!("{tag}-{route}-{i}-{n}");
                    // Across providers, Filia's remote transfer: the payee's provider offers
                    // where to pay (a joint key `R1 + R2` for note keys), then the payment.
                    let start = |http: &mut Http| -> Result<(Encumbrance, Option<PayeeOffer>)> {
                        if route != "cross_provider" {
                            return Ok((payee_enc, None));
                        }
                        let t: TransferOffer = post_signed(
                            http,
                            "/v1/psp/transfers",
                            &serde_json::json!({"from": from, "to": to, "to_psp": "bank-b",
                                "amount_cents": 1}),
                            &from,
                            &key,
                        )?;
                        let enc = Encumbrance::parse_text(&t.encumbrance)
                            .ok_or_else(|| anyhow!("bad transfer encumbrance"))?;
                        Ok((enc, Some(t.offer)))
                    };
                    let r: Result<PayReceipt> = start(&mut http).and_then(|(to_enc, offer)| {
                        PaymentAuth::sign(&key, payer_enc, to_enc, 1, unix_now() + 300, &id)
                            .map_err(|e| anyhow!(e))
                            .and_then(|auth| {
                                let req = PayRequest {
                                    from: from.clone(),
                                    to: to.clone(),
                                    to_psp: (route == "cross_provider")
                                        .then(|| "bank-b".to_string()),
                                    amount_cents: 1,
                                    id: Some(id),
                                    authorization: Some(hex::encode(auth.encode())),
                                    offer,
                                };
                                serde_json::to_value(&req).map_err(|e| anyhow!(e))
                            })
                            .and_then(|body| {
                                post_signed(&mut http, "/v1/psp/pay", &body, &from, &key)
                            })
                    });
                    match r {
                        Ok(r) => {
                            mine.push(t.elapsed().as_micros() as u32);
                            done.fetch_add(1, Ordering::Relaxed);
                            // A presignature signs in milliseconds; the interactive
                            // fallback takes a whole presigning run.
                            if r.sign_ms < 50.0 {
                                presigned.fetch_add(1, Ordering::Relaxed);
                            }
                            if route == "cross_provider" && !r.notified {
                                unnotified.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            note(format!("payment {n} of {from}: {e:#}"));
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
                if let Ok(mut l) = lats.lock() {
                    l.extend(mine);
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    Ok(Point {
        done: done.load(Ordering::Relaxed),
        presigned: presigned.load(Ordering::Relaxed),
        unnotified: unnotified.load(Ordering::Relaxed),
        errors: errors.into_inner().map_err(|_| anyhow!("lock"))?,
        lats: lats.into_inner().map_err(|_| anyhow!("lock"))?,
        elapsed: start.elapsed().as_secs_f64(),
    })
}
