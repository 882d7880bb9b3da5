//! Custodial payments through the payment-provider service (`florin psp`) with threshold
//! ECDSA P-256 keys: two providers, each with its own 2-of-3 key-management network (nodes in
//! this process over real Noise links), customers paying over the providers' HTTP API, the
//! ledger node as `florin devnet` runs it. This is the source document's own setting (CGGMP
//! ECDSA, smart-card compatible keys) end to end. A payment counts from the customer's request
//! to the provider's receipt: signed from a presignature (or interactively when the account's
//! pool is empty), confirmed on the ledger and, across providers, acknowledged by the payee's
//! provider after its own ledger check.
//!
//! The ECDSA level is insecure-test (768-bit Paillier primes): a presignature costs ≈ 0.2 s of
//! CPU here instead of 1.6–2.5 s, so these figures are an upper bound for production keys.
//! Sustained throughput is the presignature refill rate; the first payments of each account
//! spend its ready pool.
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
use florin_node::custody::{free_loopback_addrs, EcdsaLevel, Kmn, Layout, RunningNode};
use florin_node::psp::api::{AccountView, PayReceipt, PayRequest};
use florin_node::psp::auth::{SignedRequest, AUTH_HEADER};
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
    pool: usize,
) -> Result<Provider> {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(2, &free_loopback_addrs(3)?)?;
    layout.set_ecdsa(Some(EcdsaLevel::InsecureTest))?;
    let nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    kmn.ecdsa_setup(Duration::from_secs(300))?;
    let peer_key = SecretKey::generate(&mut rand::rngs::OsRng);
    let peer_pub = peer_key.public_key().to_address();
    let psp = Psp::open(
        PspConfig {
            name: name.into(),
            books: dir.path().join("psp.redb"),
            ledger: ledger.into(),
            scheme: PspScheme::P256,
            presign_pool: pool,
            ecdsa_engine: florin_node::custody::EcdsaEngine::Cggmp24,
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

/// Runs the PSP path: `users` payers per point, same and cross provider.
pub fn run(rec: &mut Recorder, quick: bool) -> Result<()> {
    let node = Node::start(&[]).context("starting the ledger node")?;
    let ledger = format!("http://{}", node.addr);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let pool = 2;
    let st = Instant::now();
    let a = provider(&rt, "bank-a", &ledger, pool)?;
    let b = provider(&rt, "bank-b", &ledger, pool)?;
    a.psp.set_peers(vec![b.peer.clone()])?;
    b.psp.set_peers(vec![a.peer.clone()])?;
    // Account name → (customer key, encumbrance).
    let mut accounts: std::collections::HashMap<String, (SecretKey, Encumbrance)> =
        std::collections::HashMap::new();
    eprintln!(
        "  two providers with ECDSA networks ready in {:.1} s",
        st.elapsed().as_secs_f64()
    );
    let mut ha = Http::connect(a.addr)?;
    let mut hb = Http::connect(b.addr)?;
    let users: &[usize] = if quick { &[1, 4] } else { &[1, 4, 10, 30] };
    let secs = if quick { 3.0 } else { 10.0 };
    for &u in users {
        // Payers at A, payees at A (same) and at B (cross).
        for i in 0..u {
            for (at_b, name) in [
                (false, format!("p{u}-{i}")),
                (false, format!("q{u}-{i}")),
                (true, format!("r{u}-{i}")),
            ] {
                let h = if at_b { &mut hb } else { &mut ha };
                let key = SecretKey::generate(&mut rand::rngs::OsRng);
                let v: AccountView = post_signed(
                    h,
                    "/v1/psp/accounts",
                    &json!({ "name": name, "customer_key": key.public_key().to_address() }),
                    &name,
                    &key,
                )?;
                let enc = Encumbrance::parse_text(&v.encumbrance)
                    .ok_or_else(|| anyhow!("account {name}: bad encumbrance"))?;
                accounts.insert(name, (key, enc));
            }
            let payer = format!("p{u}-{i}");
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
        for route in ["same_provider", "cross_provider"] {
            // Let every account's pool fill before the clock starts (steady state).
            std::thread::sleep(
                Duration::from_secs_f64(0.5 * u as f64).min(Duration::from_secs(10)),
            );
            // Each payer: (from, to, customer key, payer's and payee's encumbrances).
            let payers = (0..u)
                .map(|i| {
                    let from = format!("p{u}-{i}");
                    let to = if route == "same_provider" {
                        format!("q{u}-{i}")
                    } else {
                        format!("r{u}-{i}")
                    };
                    match (accounts.get(&from), accounts.get(&to)) {
                        (Some(p), Some(q)) => Ok((from, to, p.0.clone(), p.1, q.1)),
                        _ => Err(anyhow!("accounts {from} and {to} were not opened")),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let stop = AtomicBool::new(false);
            let done = AtomicU64::new(0);
            let presigned = AtomicU64::new(0);
            let lats = Mutex::new(Vec::<u32>::new());
            let errors = Mutex::new(Vec::<String>::new());
            let start = Instant::now();
            std::thread::scope(|s| {
                for (i, payer) in payers.iter().enumerate() {
                    let (stop, done, presigned, lats, errors) =
                        (&stop, &done, &presigned, &lats, &errors);
                    let a_addr = a.addr;
                    let (from, to, key, payer_enc, payee_enc) = payer.clone();
                    s.spawn(move || {
                        let mut http = match Http::connect(a_addr) {
                            Ok(h) => h,
                            Err(e) => {
                                if let Ok(mut v) = errors.lock() {
                                    v.push(format!("connect: {e:#}"));
                                }
                                return;
                            }
                        };
                        let mut mine = Vec::new();
                        let mut n = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            n += 1;
                            let t = Instant::now();
                            // The customer's side: the authorization and the signed request.
                            let id = format!("{route}-{u}-{i}-{n}");
                            let r: Result<PayReceipt> = PaymentAuth::sign(
                                &key,
                                payer_enc,
                                payee_enc,
                                1,
                                unix_now() + 300,
                                &id,
                            )
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
                                };
                                serde_json::to_value(&req).map_err(|e| anyhow!(e))
                            })
                            .and_then(|body| {
                                post_signed(&mut http, "/v1/psp/pay", &body, &from, &key)
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
                                        if let Ok(mut e) = errors.lock() {
                                            e.push("payee's provider not notified".into());
                                        }
                                    }
                                }
                                Err(e) => {
                                    if let Ok(mut v) = errors.lock() {
                                        v.push(format!("payment {n}: {e:#}"));
                                    }
                                    stop.store(true, Ordering::Relaxed);
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
            let elapsed = start.elapsed().as_secs_f64();
            let errors = errors.into_inner().map_err(|_| anyhow!("lock"))?;
            if let Some(e) = errors.first() {
                bail!("{} PSP payment(s) failed; first: {e}", errors.len());
            }
            let mut l = lats.into_inner().map_err(|_| anyhow!("lock"))?;
            l.sort_unstable();
            let n = done.load(Ordering::Relaxed);
            let share = if n > 0 {
                presigned.load(Ordering::Relaxed) as f64 / n as f64
            } else {
                0.0
            };
            let params = json!({
                "custody": "threshold", "scheme": "p256", "path": "psp",
                "level": "insecure-test", "route": route, "users": u, "payments": n,
                "presign_pool": pool, "from_presignature_share": (share * 100.0).round() / 100.0,
            });
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
                "e2e_payments_per_s",
                n as f64 / elapsed,
                "payments/s",
                params.clone(),
                Some(seed),
                None,
            );
            rec.add(
                "e2e_latency_ms_p50",
                percentile(&l, 0.5),
                "ms",
                params.clone(),
                None,
                None,
            );
            rec.add(
                "e2e_latency_ms_p99",
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
