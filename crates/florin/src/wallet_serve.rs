//! `florin wallet serve`: the wallet as a page in the browser, served on loopback by the same
//! process and the same wallet crate as the command line. The keys never leave the process:
//! the page sees balances, QR images and results, never a key (the backup words only when the
//! user asks for them).
//!
//! Who may call it: the page's API answers only requests that carry the session token printed
//! with the URL (in the URL's fragment, which browsers never send to a server, kept by the page
//! in session storage and sent in a custom header — a header another origin cannot add without
//! a CORS preflight, which this server never grants), and only when the `Host` header names
//! the loopback address and port it listens on (DNS rebinding). Each request takes the
//! wallet's file lock for the duration of one operation, as one CLI command does, so the CLI
//! can be used beside the page.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use florin_crypto::PublicKey;
use florin_net::qr::{self, Kind};
use florin_token::amount::parse_euros;
use florin_token::{Payment, PaymentRequest};
use florin_wallet::{FileStore, Flows, Wallet, WalletStore};
use rand::rngs::OsRng;
use rand::RngCore;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::util::{print_json, runtime, Trust};

const HTML: &str = include_str!("../assets/wallet.html");
const JS: &str = include_str!("../assets/wallet.js");
const CSS: &str = include_str!("../assets/wallet.css");

/// The page's policy: its own script and style only; QR images as `data:` URLs; the camera's
/// stream for scanning a code.
const POLICY: &str = "default-src 'self'; img-src 'self' data: blob:; media-src 'self' blob: \
                      mediastream:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; \
                      form-action 'none'";

/// Largest request body (a few QR images).
const BODY_LIMIT: usize = 4 << 20;

/// The session token's header.
const SESSION_HEADER: &str = "x-florin-session";

struct Ctx {
    /// Print the listener's events as JSON lines (`--json`).
    json: bool,
    /// The device-channel listener the page started, if one runs: (peer string, until, ended).
    listening: std::sync::Mutex<Option<Listening>>,
    store: FileStore,
    wallet: PathBuf,
    node: String,
    trust: Trust,
    token: String,
    hosts: Vec<String>,
}

/// Serves the wallet page at `listen` (a loopback address) until interrupted.
pub fn run(
    store: FileStore,
    wallet: PathBuf,
    node: String,
    trust: Trust,
    listen: SocketAddr,
    json: bool,
) -> Result<ExitCode> {
    if !listen.ip().is_loopback() {
        bail!("the wallet page is served on loopback only (127.0.0.1 or ::1): its keys are in this process");
    }
    // Opened once now: an encrypted file asks for its passphrase here, on the terminal, and
    // the key stays in this process for the requests that follow. Without a file the page
    // offers to create one (its words shown once, its passphrase typed in the page).
    if wallet.exists() {
        let _lock = store.lock()?;
        store.load()?;
    }
    // From now on nothing is asked on the terminal: a request never waits on a prompt while it
    // holds the wallet's lock (a passphrase changed meanwhile needs the page restarted).
    let store = store.with_passphrase(Arc::new(|| {
        Err(
            "the file's passphrase changed while the page was open: restart `florin wallet serve`"
                .into(),
        )
    }));
    let mut t = [0u8; 32];
    OsRng.fill_bytes(&mut t);
    let token = hex::encode(t);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let at = listener.local_addr()?;
        let port = at.port();
        let hosts = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        let url = format!("http://{at}/#{token}");
        let ctx = Arc::new(Ctx {
            json,
            listening: std::sync::Mutex::new(None),
            store,
            wallet,
            node,
            trust,
            token,
            hosts,
        });
        let app = Router::new()
            .route(
                "/",
                get(|| async { page(HTML, "text/html; charset=utf-8") }),
            )
            .route(
                "/wallet.js",
                get(|| async { page(JS, "text/javascript; charset=utf-8") }),
            )
            .route(
                "/wallet.css",
                get(|| async { page(CSS, "text/css; charset=utf-8") }),
            )
            .route("/api/{op}", post(api))
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .layer(axum::middleware::from_fn_with_state(
                ctx.clone(),
                host_check,
            ))
            .with_state(ctx);
        if json {
            print_json(&json!({ "url": url, "listen": at.to_string() }));
        } else {
            println!("wallet page: {url}");
            println!(
                "(the part after # is this session's key: do not share the link; Ctrl-C stops)"
            );
        }
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn page(body: &'static str, content_type: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// Refuses requests whose `Host` is not this server's loopback address (DNS rebinding).
async fn host_check(
    State(ctx): State<Arc<Ctx>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !ctx.hosts.iter().any(|h| h == host) {
        return failure(
            StatusCode::FORBIDDEN,
            "forbidden_host",
            "this page answers on its loopback address only",
        );
    }
    next.run(req).await
}

fn failure(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({ "error": { "code": code, "message": message } })),
    )
        .into_response()
}

/// Equal in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn api(
    State(ctx): State<Arc<Ctx>>,
    axum::extract::Path(op): axum::extract::Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let given = headers
        .get(SESSION_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !same(given, ctx.token.as_bytes()) {
        return failure(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "open the page from the link `florin wallet serve` printed",
        );
    }
    let input: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return failure(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &format!("not JSON: {e}"),
                )
            }
        }
    };
    // One operation at a time on the wallet file, off the server's threads (the flows block
    // on the wallet's lock and run on their own small runtime, as a CLI command does).
    let done = tokio::task::spawn_blocking(move || operate(&ctx, &op, input)).await;
    match done {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => {
            let msg = format!("{e:#}");
            let code = crate::error_code(&e);
            let status = if code == "unknown_operation" {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::BAD_REQUEST
            };
            failure(status, &code, &msg)
        }
        Err(_) => failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed",
            "the operation stopped unexpectedly",
        ),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Amount {
    amount: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PayTo {
    address: String,
    amount: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Images {
    /// Base64 of PNG or GIF images (a camera frame, an uploaded file).
    images: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PayRequest {
    images: Vec<String>,
    /// The amount the user confirmed (cents), from `read_request`.
    confirm_cents: u64,
    /// The payee the user confirmed, from `read_request`.
    confirm_payee: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerPay {
    /// ADDRESS@HOST:PORT, or ADDRESS to find the payee on the local network.
    peer: String,
    amount: String,
}

type Listening = (
    String,
    std::time::Instant,
    Arc<std::sync::atomic::AtomicBool>,
);

/// The peer string of the listener still running, if one is (its thread has not ended, and
/// its time with the drain after it has not passed).
fn live(l: &Option<Listening>) -> Option<String> {
    l.as_ref()
        .filter(|(_, until, ended)| {
            std::time::Instant::now() < *until && !ended.load(std::sync::atomic::Ordering::SeqCst)
        })
        .map(|(peer, _, _)| peer.clone())
}

/// The listener slot, whatever a panicking holder left.
fn lock_listening(ctx: &Ctx) -> std::sync::MutexGuard<'_, Option<Listening>> {
    ctx.listening
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sets the flag when dropped: a listener thread's end, however it ends.
struct Ended(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How long a listener may still finish sessions after its time (its drain).
const LISTEN_DRAIN: std::time::Duration = std::time::Duration::from_secs(40);

/// How long a listener the page starts waits for its payer.
const LISTEN_SECS: u64 = 120;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DepositArgs {
    #[serde(default)]
    reanchor: bool,
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).context("the request's fields")
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Result<Vec<u8>> {
    use base64::Engine;
    let s = s.split_once(',').map_or(
        s,
        |(head, rest)| if head.starts_with("data:") { rest } else { s },
    );
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .context("an image is not base64")
}

/// The QR parts shown in `images`, joined into one message of `kind`.
fn from_images(images: &[String], kind: Kind) -> Result<Vec<u8>> {
    if images.is_empty() || images.len() > 64 {
        bail!("give 1 to 64 images");
    }
    let mut parts = Vec::new();
    for (i, im) in images.iter().enumerate() {
        let bytes = unb64(im)?;
        parts.extend(qr::read_image(&bytes).with_context(|| format!("image {}", i + 1))?);
    }
    let (k, msg) = qr::join(&parts)?;
    if k != kind {
        bail!("the code shows a {}, not a {}", name(k), name(kind));
    }
    Ok(msg)
}

fn name(k: Kind) -> &'static str {
    match k {
        Kind::Request => "payment request",
        Kind::Payment => "payment",
    }
}

fn state(ctx: &Ctx, w: &Wallet) -> Value {
    let history: Vec<Value> = w
        .history()
        .rev()
        .take(100)
        .map(|h| serde_json::to_value(h).unwrap_or(Value::Null))
        .collect();
    let requests: Vec<Value> = w
        .open_requests()
        .map(|(hs, cents)| json!({ "handshake": hex::encode(hs), "amount_cents": cents }))
        .collect();
    json!({
        "wallet": ctx.wallet.display().to_string(),
        "node": ctx.node,
        "address": w.public_key().to_address(),
        "authority": w.authority().map(|a| a.to_address()),
        "encrypted": ctx.store.is_encrypted(),
        "balance": w.balance(),
        "in_flight": w.pending_tx().map(|p| p.purpose.clone()),
        "handoffs_pending": w.outbox().len(),
        "withdrawals_waiting": w.awaiting_tokens().len(),
        "open_requests": requests,
        "history": history,
        "listening": live(&lock_listening(ctx)),
        "has_backup_words": w.backup_words().is_some(),
        "needs_wallet": false,
    })
}

/// One operation, under the wallet's lock, on this thread (a blocking-pool thread).
fn operate(ctx: &Ctx, op: &str, input: Value) -> Result<Value> {
    let store = &ctx.store;
    let _lock = store.lock()?;
    if !ctx.wallet.exists() {
        return create(ctx, op, input);
    }
    let mut w = store.load()?;
    let online = |w: &mut Wallet| -> Result<()> {
        crate::wallet_cmd::ensure_authority(w, &ctx.node, &ctx.trust)
    };
    let out = match op {
        "state" => json!({}),
        "faucet" => {
            let a: Amount = parse(input)?;
            let cents = parse_euros(&a.amount)?;
            online(&mut w)?;
            let client = crate::util::node_client(&ctx.node, &ctx.trust)?;
            let f = runtime()?.block_on(Flows::new(store, &client).faucet(&mut w, cents))?;
            json!({ "received_cents": f.received })
        }
        "pay" => {
            let a: PayTo = parse(input)?;
            let cents = parse_euros(&a.amount)?;
            let payee = PublicKey::parse_valid(a.address.trim()).context("the payee's address")?;
            let client = ctx.trust.node(&ctx.node)?;
            let p = runtime()?.block_on(Flows::new(store, &client).pay(&mut w, payee, cents))?;
            p.settled.check("payment", &w)?;
            json!({ "txid": hex::encode(p.tx.txid()), "amount_cents": cents })
        }
        "sync" => {
            online(&mut w)?;
            let client = ctx.trust.node(&ctx.node)?;
            let r = runtime()?.block_on(Flows::new(store, &client).sync(&mut w))?;
            json!({ "received_cents": r.received, "withdrawn_cents": r.withdrawn, "removed_cents": r.removed.1 })
        }
        "withdraw" => {
            let a: Amount = parse(input)?;
            let cents = parse_euros(&a.amount)?;
            online(&mut w)?;
            let client = ctx.trust.node(&ctx.node)?;
            let r = runtime()?.block_on(Flows::new(store, &client).withdraw(&mut w, cents))?;
            if r.waiting {
                bail!("paid the reserve, but the tokens have not arrived yet: sync collects them");
            }
            json!({ "withdrawn_cents": r.received_cents })
        }
        "deposit" => {
            let a: DepositArgs = parse(input)?;
            online(&mut w)?;
            let client = ctx.trust.node(&ctx.node)?;
            let d = runtime()?.block_on(Flows::new(store, &client).deposit(&mut w, !a.reanchor))?;
            match d {
                florin_wallet::flows::Deposited::Nothing => json!({ "deposited": false }),
                florin_wallet::flows::Deposited::Done { result, sync_error } => json!({
                    "deposited": true,
                    "credited_cents": result.credited_cents,
                    "reanchored": result.reanchored,
                    "refused": result.refused.len(),
                    "fraud": result.fraud.len(),
                    "still_pending": result.still_pending,
                    "sync_error": sync_error.map(|e| e.to_string()),
                }),
            }
        }
        "request" => {
            let a: Amount = parse(input)?;
            let cents = parse_euros(&a.amount)?;
            if cents == 0 {
                bail!("ask for more than €0");
            }
            let req = w.request(cents, &mut OsRng)?;
            store.save(&w)?;
            let bytes = req.encode();
            let pngs = qr::to_pngs(Kind::Request, &bytes)?;
            json!({
                "amount_cents": cents,
                "handshake": hex::encode(req.handshake),
                "qr": pngs.iter().map(|p| b64(p)).collect::<Vec<_>>(),
                "file": b64(&bytes),
            })
        }
        "read_request" => {
            // What a code asks for, shown before anything is signed.
            let a: Images = parse(input)?;
            let req = PaymentRequest::decode(&from_images(&a.images, Kind::Request)?)
                .context("not a payment request")?;
            json!({
                "amount_cents": req.amount_cents,
                "payee": req.payee.to_address(),
                "handshake": hex::encode(req.handshake),
            })
        }
        "pay_request" => {
            let a: PayRequest = parse(input)?;
            let req = PaymentRequest::decode(&from_images(&a.images, Kind::Request)?)
                .context("not a payment request")?;
            // Signed only for what the user saw and confirmed (read_request).
            if req.amount_cents != a.confirm_cents || req.payee.to_address() != a.confirm_payee {
                bail!("the code does not ask for what was confirmed: read it again");
            }
            let payment = w.pay(&req)?;
            // Saved before the payment leaves, so a crash never signs twice.
            store.save(&w)?;
            let pb = payment.encode();
            let pngs = qr::to_pngs(Kind::Payment, &pb)?;
            json!({
                "amount_cents": payment.amount_cents(),
                "payee": payment.payee.to_address(),
                "tokens": payment.tokens.len(),
                "qr": pngs.iter().map(|p| b64(p)).collect::<Vec<_>>(),
                "file": b64(&pb),
            })
        }
        "accept" => {
            let a: Images = parse(input)?;
            let p = Payment::decode(&from_images(&a.images, Kind::Payment)?)
                .context("not a valid payment")?;
            if w.authority().is_none() {
                online(&mut w)?;
            }
            let got = w.accept(&p, &mut OsRng)?;
            store.save(&w)?;
            json!({ "accepted_cents": got })
        }
        "pay_peer" => {
            let a: PeerPay = parse(input)?;
            let cents = parse_euros(&a.amount)?;
            if cents == 0 {
                bail!("pay more than €0");
            }
            // Under this request's wallet lock, as `offline pay --peer` holds it: nothing else
            // (another tab, the CLI, this page's listener) changes the wallet mid-exchange.
            drop(w);
            let (payee, r) = crate::offline_cmd::pay_a_peer(store, a.peer.trim(), cents, 3, false)?;
            let refused: Vec<Value> = r
                .refused
                .iter()
                .map(|(c, why)| json!({ "amount_cents": c, "reason": why }))
                .collect();
            json!({
                "payee": payee.to_address(),
                "amount_cents": r.paid_cents,
                "tokens": r.tokens,
                "resumed_cents": r.resumed,
                "refused": refused,
            })
        }
        "listen" => {
            // One listener at a time, on loopback, for one payment or LISTEN_SECS.
            let running = live(&lock_listening(ctx));
            match running {
                Some(peer) => json!({ "peer": peer, "already": true }),
                None => {
                    if w.authority().is_none() {
                        online(&mut w)?;
                        store.save(&w)?;
                    }
                    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
                    let at = listener.local_addr()?;
                    let peer = format!("{}@{at}", w.public_key().to_address());
                    let signer = (Arc::new(w.signer().clone()), w.public_key());
                    let until = std::time::Duration::from_secs(LISTEN_SECS);
                    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let guard = Ended(ended.clone());
                    let (store, json) = (store.clone(), ctx.json);
                    std::thread::Builder::new()
                        .name("florin-web-listen".into())
                        .spawn(move || {
                            // Marks the listener ended however the thread ends (a panic too).
                            let _guard = guard;
                            if let Err(e) = crate::offline_cmd::listen_on(
                                &store,
                                json,
                                listener,
                                signer,
                                Some(1),
                                true,
                                Some(until),
                            ) {
                                tracing::warn!("the page's listener stopped: {e:#}");
                            }
                        })
                        .context("cannot start the listener")?;
                    // Shown only once the listener runs.
                    *lock_listening(ctx) = Some((
                        peer.clone(),
                        std::time::Instant::now() + until + LISTEN_DRAIN,
                        ended,
                    ));
                    json!({ "peer": peer, "seconds": LISTEN_SECS })
                }
            }
        }
        "cancel_requests" => {
            // Requests a stranger asked of the page's listener and never paid hold back the
            // offline limit: the user may cancel them (a payer who signed for one is refused).
            let n = w.cancel_requests(None);
            if n > 0 {
                store.save(&w)?;
            }
            json!({ "cancelled": n })
        }
        "backup" => {
            let Some(words) = w.backup_words() else {
                bail!("this wallet was created before backup words existed: its key is random");
            };
            json!({ "backup_words": words.phrase() })
        }
        _ => return Err(anyhow::Error::new(UnknownOperation)),
    };
    let w = store.load()?;
    Ok(json!({ "result": out, "state": state(ctx, &w) }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Create {
    /// The file's passphrase (ignored with `no_passphrase`).
    #[serde(default)]
    passphrase: String,
    /// Store the file unencrypted (demos).
    #[serde(default)]
    no_passphrase: bool,
}

/// Shortest passphrase the page accepts for a new file.
const MIN_PASSPHRASE: usize = 8;

/// Before a wallet exists: `state` says so, `create` makes one (under the request's lock).
fn create(ctx: &Ctx, op: &str, input: Value) -> Result<Value> {
    let needs = json!({ "needs_wallet": true, "wallet": ctx.wallet.display().to_string(), "node": ctx.node });
    match op {
        "state" => Ok(json!({ "result": {}, "state": needs })),
        "create" => {
            let a: Create = parse(input)?;
            let passphrase = zeroize::Zeroizing::new(a.passphrase);
            if a.no_passphrase {
                ctx.store.write_plain();
            } else {
                if passphrase.chars().count() < MIN_PASSPHRASE {
                    bail!("a passphrase of at least {MIN_PASSPHRASE} characters, or no passphrase (demos only)");
                }
                ctx.store.encrypt_with(&passphrase)?;
            }
            let authority = crate::wallet_cmd::fetch_authority(&ctx.node, &ctx.trust).ok();
            let w = Wallet::generate(&mut OsRng, authority);
            ctx.store.create(&w)?;
            let words = w
                .backup_words()
                .map(|b| zeroize::Zeroizing::new(b.phrase().to_string()))
                .unwrap_or_default();
            Ok(json!({
                "result": { "backup_words": words.as_str(), "encrypted": !a.no_passphrase },
                "state": state(ctx, &w),
            }))
        }
        _ => bail!(
            "there is no wallet at {} yet: create one first",
            ctx.wallet.display()
        ),
    }
}

/// An operation the page does not have.
#[derive(Debug, thiserror::Error)]
#[error("no such operation")]
pub struct UnknownOperation;
