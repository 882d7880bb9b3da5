//! `florin wallet offline …`: offline payments by file, QR code, or a device-to-device channel.

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use florin_crypto::{LocalSigner, PublicKey};
use florin_net::channel::accept_on;
use florin_net::discovery::{discover, Announcer};
use florin_net::qr::{self, Kind};
use florin_net::{connect, payment_digest, ChannelConfig, Msg, NetError, Receipt};
use florin_token::amount::{format_cents, parse_euros};
use florin_token::{Payment, PaymentRequest};
use florin_wallet::connector::Cause;
use florin_wallet::peer::{
    serve_payer, Answer, FromPayer, PayeeEvent, PayerChannel, PeerError, PeerExchange, RecvError,
    SessionEnd, SessionLimits, ToPayer,
};
use florin_wallet::{FileStore, Wallet, WalletStore};
use rand::rngs::OsRng;
use serde_json::json;

use crate::util::{print_json, read, write_atomic};

/// Offline payment commands.
#[derive(Subcommand)]
pub enum OfflineCommand {
    /// Payee: issue a payment request (amount, this wallet's key, a fresh nonce) as a file
    /// and/or a QR code.
    Request {
        /// Amount in euros.
        #[arg(allow_hyphen_values = true)]
        amount: String,
        /// Write the request to this file.
        #[arg(long, required_unless_present = "qr")]
        out: Option<PathBuf>,
        /// Write the request as a QR code (PNG).
        #[arg(long)]
        qr: Option<PathBuf>,
    },
    /// Payer: pay with exact change. Either a request (file, or a photo of its QR code) written
    /// out as a payment file and/or QR codes, or `--peer` and an amount over a device channel.
    Pay {
        /// The request file or image; with `--peer`, the amount in euros.
        #[arg(allow_hyphen_values = true)]
        what: String,
        /// Write the payment to this file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Write the payment as QR codes: FILE.png for one part; FILE-1.png … and FILE.gif for
        /// several.
        #[arg(long)]
        qr: Option<PathBuf>,
        /// Pay a listening wallet: HOST:PORT, its address (found on the local network), or
        /// ADDRESS@HOST:PORT.
        #[arg(long)]
        peer: Option<String>,
        /// How long to look for the peer on the local network, in seconds.
        #[arg(long, default_value = "5")]
        discover_secs: u64,
    },
    /// Payee: verify a payment and keep its tokens (from a file, or from QR images in any
    /// order: PNGs and/or an animated GIF).
    Accept {
        /// The payment file.
        #[arg(required_unless_present = "qr")]
        payment: Option<PathBuf>,
        /// QR images of the payment.
        #[arg(long, num_args = 1..)]
        qr: Vec<PathBuf>,
    },
    /// Payee: accept payments over the device channel until interrupted (or `--count`), serving
    /// up to 32 payers at once.
    Listen {
        /// Address to listen on: this device only by default; 0.0.0.0:7475 (or this device's
        /// address on the network) to take payments from other devices.
        #[arg(long, default_value = "127.0.0.1:7475")]
        listen: SocketAddr,
        /// Stop accepting connections after this many payments received in total (payers already
        /// connected may finish, so a few more may arrive).
        #[arg(long)]
        count: Option<usize>,
        /// Do not announce this wallet on the local network.
        #[arg(long)]
        no_announce: bool,
    },
    /// Payee: list the payment requests issued and not yet paid (each holds back its amount of
    /// the offline limit), or cancel one or all of them.
    Requests {
        /// Cancel the open request with this handshake (hex, as listed). A payer who already
        /// signed a payment for it is then refused: cancel only requests you know were not
        /// paid (a stranger's asks to a listening wallet).
        #[arg(long, value_name = "HANDSHAKE", conflicts_with = "cancel_all")]
        cancel: Option<String>,
        /// Cancel every open request (same warning).
        #[arg(long)]
        cancel_all: bool,
    },
    /// List wallets announcing themselves on the local network.
    Peers {
        /// How long to listen, in seconds.
        #[arg(long, default_value = "3")]
        wait_secs: u64,
    },
}

/// Whether the command works without the wallet lock held throughout (it locks per payment).
pub fn locks_itself(cmd: &OfflineCommand) -> bool {
    matches!(
        cmd,
        OfflineCommand::Listen { .. } | OfflineCommand::Peers { .. }
    )
}

/// Runs an offline command. `authority` learns the authority when the wallet knows none.
pub fn run(
    cmd: OfflineCommand,
    store: &FileStore,
    json: bool,
    authority: &dyn Fn(&mut Wallet) -> Result<()>,
) -> Result<ExitCode> {
    match cmd {
        OfflineCommand::Request { amount, out, qr } => {
            let cents = positive(&amount)?;
            let mut w = store.load()?;
            let req = w.request(cents, &mut OsRng)?;
            store.save(&w)?;
            let bytes = req.encode();
            if let Some(out) = &out {
                write_atomic(out, &bytes)?;
            }
            let images = match &qr {
                Some(q) => write_qr(q, Kind::Request, &bytes)?,
                None => vec![],
            };
            if json {
                print_json(&json!({
                    "request": out.map(|o| o.display().to_string()),
                    "qr": images,
                    "amount_cents": cents,
                    "payee": req.payee.to_address(),
                    "handshake": hex::encode(req.handshake),
                }));
            } else {
                println!("request for €{} from {}", format_cents(cents), req.payee);
                for f in out.iter().map(|o| o.display().to_string()).chain(images) {
                    println!("  written to {f}");
                }
            }
        }
        OfflineCommand::Pay {
            what,
            out,
            qr,
            peer: Some(peer),
            discover_secs,
        } => {
            if out.is_some() || qr.is_some() {
                bail!("--peer delivers the payment itself: drop --out and --qr");
            }
            return pay_peer(store, json, &peer, &what, discover_secs);
        }
        OfflineCommand::Pay { what, out, qr, .. } => {
            if out.is_none() && qr.is_none() {
                bail!("say where the payment goes: --out FILE, --qr FILE.png, or --peer");
            }
            let path = PathBuf::from(&what);
            let bytes = read(&path)?;
            let req_bytes = if is_image(&bytes) {
                let (kind, msg) = qr::join(&qr::read_image(&bytes)?)?;
                if kind != Kind::Request {
                    bail!("{what} shows a payment, not a request");
                }
                msg
            } else {
                bytes
            };
            let req = PaymentRequest::decode(&req_bytes)
                .with_context(|| format!("{what} is not a payment request"))?;
            let mut w = store.load()?;
            let payment = w.pay(&req)?;
            // The wallet is saved before the payment leaves it, so a crash never signs twice.
            store.save(&w)?;
            let pb = payment.encode();
            if let Some(out) = &out {
                write_atomic(out, &pb)?;
            }
            let images = match &qr {
                Some(q) => write_qr(q, Kind::Payment, &pb)?,
                None => vec![],
            };
            if json {
                print_json(&json!({
                    "payment": out.map(|o| o.display().to_string()),
                    "qr": images,
                    "amount_cents": payment.amount_cents(),
                    "tokens": payment.tokens.len(),
                    "payee": payment.payee.to_address(),
                }));
            } else {
                println!(
                    "paid €{} with {} tokens to {}",
                    format_cents(payment.amount_cents()),
                    payment.tokens.len(),
                    payment.payee,
                );
                for f in out.iter().map(|o| o.display().to_string()).chain(images) {
                    println!("  written to {f}");
                }
            }
        }
        OfflineCommand::Accept { payment, qr } => {
            let bytes = match payment {
                Some(p) => {
                    let b = read(&p)?;
                    if is_image(&b) {
                        payment_from_images(&[p])?
                    } else {
                        b
                    }
                }
                None => payment_from_images(&qr)?,
            };
            let p = Payment::decode(&bytes).context("not a valid payment")?;
            let mut w = store.load()?;
            if w.authority().is_none() {
                authority(&mut w)?;
            }
            let got = w.accept(&p, &mut OsRng)?;
            store.save(&w)?;
            if json {
                print_json(
                    &json!({ "accepted_cents": got, "tokens": p.tokens.len(), "total_cents": w.balance().total_cents }),
                );
            } else {
                println!(
                    "accepted €{} in {} tokens",
                    format_cents(got),
                    p.tokens.len()
                );
            }
        }
        OfflineCommand::Listen {
            listen,
            count,
            no_announce,
        } => return listen_loop(store, json, listen, count, no_announce, authority),
        OfflineCommand::Requests { cancel, cancel_all } => {
            let mut w = store.load()?;
            let cancelled = if cancel_all {
                w.cancel_requests(None)
            } else if let Some(h) = &cancel {
                let h: [u8; 32] = hex::decode(h)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| anyhow!("--cancel takes a handshake: 64 hex digits"))?;
                match w.cancel_requests(Some(&h)) {
                    0 => bail!("no open request has handshake {}", hex::encode(h)),
                    n => n,
                }
            } else {
                0
            };
            if cancelled > 0 {
                store.save(&w)?;
            }
            let open: Vec<([u8; 32], u64)> = w.open_requests().collect();
            let reserved = w.reserved_cents();
            if json {
                print_json(&json!({
                    "cancelled": cancelled,
                    "requests": open.iter().map(|(h, c)| json!({ "handshake": hex::encode(h), "amount_cents": c })).collect::<Vec<_>>(),
                    "reserved_cents": reserved,
                    "offline_limit_cents": w.max_offline_cents,
                }));
            } else {
                if cancelled > 0 {
                    println!("cancelled {cancelled} request(s)");
                }
                println!(
                    "{} open request(s) reserve €{} of the offline limit of €{}",
                    open.len(),
                    format_cents(reserved),
                    format_cents(w.max_offline_cents)
                );
                for (h, c) in &open {
                    println!("  {}  €{}", hex::encode(h), format_cents(*c));
                }
            }
        }
        OfflineCommand::Peers { wait_secs } => {
            let found = discover(Duration::from_secs(wait_secs), None)?;
            if json {
                print_json(
                    &json!({ "peers": found.iter().map(|(k, a)| json!({ "address": k.to_address(), "at": a.to_string() })).collect::<Vec<_>>() }),
                );
            } else if found.is_empty() {
                println!("no wallets announced themselves in {wait_secs} s");
            } else {
                for (k, a) in found {
                    println!("{k}  {a}");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn positive(amount: &str) -> Result<u64> {
    let cents = parse_euros(amount)?;
    if cents == 0 {
        bail!("the amount must be positive");
    }
    Ok(cents)
}

fn is_image(b: &[u8]) -> bool {
    b.starts_with(b"\x89PNG") || b.starts_with(b"GIF8")
}

fn payment_from_images(files: &[PathBuf]) -> Result<Vec<u8>> {
    let mut parts = Vec::new();
    for f in files {
        parts.extend(qr::read_image(&read(f)?).with_context(|| f.display().to_string())?);
    }
    let (kind, msg) = qr::join(&parts)?;
    if kind != Kind::Payment {
        bail!("the codes show a payment request, not a payment");
    }
    Ok(msg)
}

/// Writes QR images: `path` itself for one part; `stem-1.png` … and `stem.gif` for several.
fn write_qr(path: &Path, kind: Kind, msg: &[u8]) -> Result<Vec<String>> {
    let pngs = qr::to_pngs(kind, msg)?;
    if pngs.len() == 1 {
        write_atomic(path, &pngs[0])?;
        return Ok(vec![path.display().to_string()]);
    }
    let stem = path.with_extension("");
    let mut written = Vec::new();
    for (i, png) in pngs.iter().enumerate() {
        let p = PathBuf::from(format!("{}-{}.png", stem.display(), i + 1));
        write_atomic(&p, png)?;
        written.push(p.display().to_string());
    }
    let gif = stem.with_extension("gif");
    write_atomic(&gif, &qr::to_gif(kind, msg)?)?;
    written.push(gif.display().to_string());
    Ok(written)
}

/// `ADDRESS`, `HOST:PORT` or `ADDRESS@HOST:PORT` → where to dial and which key to insist on.
fn resolve(peer: &str, wait: Duration) -> Result<(SocketAddr, Option<PublicKey>)> {
    if let Some((key, at)) = peer.split_once('@') {
        let key = PublicKey::parse(key).context("the key before @ is not a Florin address")?;
        key.validate()
            .context("the key before @ is not a usable Florin address")?;
        let addr = at
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| anyhow!("cannot resolve {at}"))?;
        return Ok((addr, Some(key)));
    }
    if let Ok(key) = PublicKey::parse(peer) {
        key.validate()
            .with_context(|| format!("the peer {peer} is not a usable Florin address"))?;
        let found = discover(wait, Some(key))?;
        let (_, addr) = found.into_iter().find(|(k, _)| *k == key).ok_or_else(|| {
            anyhow!(
                "{key} did not announce itself on the local network within {} s; \
                 pass --peer {key}@HOST:PORT",
                wait.as_secs()
            )
        })?;
        return Ok((addr, Some(key)));
    }
    let addr = peer
        .to_socket_addrs()
        .with_context(|| format!("{peer} is neither a Florin address nor HOST:PORT"))?
        .next()
        .ok_or_else(|| anyhow!("cannot resolve {peer}"))?;
    Ok((addr, None))
}

/// With only HOST:PORT, whoever answers there proves its own key: a person at a terminal
/// confirms it; a script must name the key.
#[allow(clippy::print_stderr)] // a question to the person at the terminal, not a log line
fn confirm_unnamed_peer(addr: SocketAddr, key: &PublicKey, cents: u64) -> Result<()> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "name the payee, so that nobody else answering at {addr} can take the payment: \
             --peer {key}@{addr} if that is the payee (or --peer ADDRESS to find it nearby)"
        );
    }
    eprint!(
        "the wallet at {addr} is {key}\npay it €{}? [y/N] ",
        format_cents(cents)
    );
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    if !matches!(line.trim(), "y" | "Y" | "yes") {
        bail!("not paid");
    }
    Ok(())
}

/// A bar while `label`'s bytes move (see [`crate::progress::bytes`]).
fn progress_bar(label: &'static str) -> impl FnMut(usize, usize) {
    let mut bar: Option<Option<indicatif::ProgressBar>> = None;
    move |done, total| {
        let pb = bar.get_or_insert_with(|| crate::progress::bytes(label, total as u64));
        if let Some(pb) = pb {
            pb.set_position(done as u64);
            if done >= total {
                pb.finish();
            }
        }
    }
}

/// The device channel as the wallet's [`PeerExchange`].
struct PeerChannel(florin_net::Channel);

fn broken(e: NetError) -> PeerError {
    PeerError::Channel(Box::new(e))
}

impl PeerExchange for PeerChannel {
    fn peer(&self) -> PublicKey {
        self.0.peer()
    }

    fn ask(&mut self, cents: u64) -> Result<Answer<PaymentRequest>, PeerError> {
        self.0
            .send_msg(
                &Msg::Ask {
                    amount_cents: cents,
                },
                |_, _| {},
            )
            .map_err(broken)?;
        match self.0.recv_msg().map_err(broken)? {
            Msg::Request(r) => Ok(Ok(r)),
            Msg::Refused(why) => Ok(Err(why)),
            other => Err(PeerError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Delivers `p` and waits for the matching receipt.
    fn deliver(&mut self, p: &Payment) -> Result<Answer<()>, PeerError> {
        let ch = &mut self.0;
        ch.send_msg(&Msg::Deliver(p.clone()), progress_bar("sending"))
            .map_err(broken)?;
        // The payee verifies every token before answering: allow time for large payments.
        ch.set_timeout(Duration::from_secs(30 + p.tokens.len() as u64 / 1_000))
            .map_err(broken)?;
        match ch.recv_msg().map_err(broken)? {
            Msg::Receipt(r) => {
                if r.handshake != p.handshake
                    || r.amount_cents != p.amount_cents()
                    || r.payment != payment_digest(p)
                {
                    return Err(PeerError::ReceiptMismatch);
                }
                Ok(Ok(()))
            }
            Msg::Refused(why) => Ok(Err(why)),
            other => Err(PeerError::Unexpected(format!("{other:?}"))),
        }
    }
}

/// An accepted device channel as the wallet's [`PayerChannel`].
struct PayerLink(florin_net::Channel);

impl PayerChannel for PayerLink {
    fn peer(&self) -> PublicKey {
        self.0.peer()
    }

    fn recv(&mut self, timeout: Duration) -> Result<FromPayer, RecvError> {
        self.0
            .set_timeout(timeout)
            .map_err(|_| RecvError::NoTimer)?;
        match self.0.recv_msg() {
            Ok(Msg::Ask { amount_cents }) => Ok(FromPayer::Ask { amount_cents }),
            Ok(Msg::Deliver(p)) => Ok(FromPayer::Deliver(p)),
            Ok(other) => Ok(FromPayer::Other(format!(
                "{:?}",
                std::mem::discriminant(&other)
            ))),
            Err(NetError::Closed) => Err(RecvError::Closed),
            Err(e) => Err(RecvError::Broken(Box::new(e))),
        }
    }

    fn send(&mut self, answer: ToPayer) -> Result<(), Cause> {
        let msg = match answer {
            ToPayer::Request(r) => Msg::Request(r),
            ToPayer::Receipt {
                payment,
                amount_cents,
            } => Msg::Receipt(Receipt {
                handshake: payment.handshake,
                amount_cents,
                payment: payment_digest(&payment),
            }),
            ToPayer::Refused(why) => Msg::Refused(why),
        };
        self.0
            .send_msg(&msg, |_, _| {})
            .map_err(|e| Box::new(e) as Cause)
    }
}

fn pay_peer(
    store: &FileStore,
    json: bool,
    peer: &str,
    amount: &str,
    discover_secs: u64,
) -> Result<ExitCode> {
    let cents = positive(amount)?;
    let (payee, r) = pay_a_peer(store, peer, cents, discover_secs, true)?;
    if json {
        let refused: Vec<_> = r
            .refused
            .iter()
            .map(|(c, why)| json!({ "amount_cents": c, "reason": why }))
            .collect();
        print_json(&json!({
            "payee": payee.to_address(),
            "amount_cents": r.paid_cents,
            "tokens": r.tokens,
            "resumed_cents": r.resumed,
            "refused": refused,
            "delivered": true,
        }));
    } else {
        for c in &r.resumed {
            println!(
                "finished an interrupted payment of €{} to {payee}",
                format_cents(*c)
            );
        }
        if r.paid_cents > 0 {
            println!(
                "paid €{} with {} tokens to {payee}; receipt received",
                format_cents(r.paid_cents),
                r.tokens
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Pays `cents` to the listening wallet `peer` (see `--peer`): the channel, then the exchange.
/// A peer given without its address is confirmed on the terminal when `ask` (the CLI), and
/// refused otherwise (the web wallet: the payee's key must be pinned).
pub(crate) fn pay_a_peer(
    store: &FileStore,
    peer: &str,
    cents: u64,
    discover_secs: u64,
    ask: bool,
) -> Result<(PublicKey, florin_wallet::peer::PeerPaid)> {
    let (addr, expected) = resolve(peer, Duration::from_secs(discover_secs))?;
    if expected.is_none() && !ask {
        bail!("give the payee's address (ADDRESS@HOST:PORT, or ADDRESS to find it nearby), not only where it listens");
    }
    let mut w = store.load()?;
    let cfg = ChannelConfig::default();
    let ch = connect(addr, w.signer(), expected, &cfg)
        .with_context(|| format!("cannot open a secure channel to {addr}"))?;
    let payee = ch.peer();
    if expected.is_none() {
        confirm_unnamed_peer(addr, &payee, cents)?;
    }
    let mut ch = PeerChannel(ch);
    let r =
        florin_wallet::peer::pay_peer(&mut w, store, &mut ch, cents, &|n| tracing::info!("{n}"))?;
    Ok((payee, r))
}

/// Prints one event as one line. Each line is written under the stdout lock, so events told by
/// several sessions at once never interleave within a line.
fn event(json: bool, v: serde_json::Value, text: String) {
    let line = if json {
        crate::util::printed_json();
        serde_json::to_string(&v).unwrap_or_default()
    } else {
        text
    };
    println!("{line}");
}

/// Payers served at once (authenticated sessions): a connection that completes its handshake
/// beyond this is closed at once, and the payer may try again.
const MAX_SESSIONS: usize = 32;
/// Connections in their (unauthenticated) handshake at once: beyond this the oldest is cut, so
/// silent connections cannot lock honest payers out.
const MAX_HANDSHAKES: usize = 16;
/// Longest a connection may take over its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// Once `--count` is reached, how long sessions still open may take to finish.
const DRAIN: Duration = Duration::from_secs(30);

/// The listener's state shared by its accept loop and its sessions.
struct Sessions {
    /// Set when the listener stops accepting (`--count` reached, or the wallet failed).
    stop: AtomicBool,
    /// Payments received, over all sessions.
    received: AtomicUsize,
    /// Stop after this many.
    count: Option<usize>,
    next: AtomicU64,
    /// Connection threads alive (handshakes and sessions).
    live: AtomicUsize,
    /// Connections in their handshake, oldest first.
    handshakes: Mutex<VecDeque<(u64, TcpStream)>>,
    /// Authenticated sessions, to cut them when the drain runs out.
    open: Mutex<HashMap<u64, TcpStream>>,
    /// The first error that ends the listener (the wallet could not be loaded or saved).
    failed: Mutex<Option<anyhow::Error>>,
    /// Wakes the main thread when the listener should stop.
    done: Mutex<Option<mpsc::Sender<()>>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sessions {
    fn finish(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(tx) = locked(&self.done).take() {
            let _ = tx.send(());
        }
    }

    fn end_handshake(&self, id: u64) {
        locked(&self.handshakes).retain(|(i, _)| *i != id);
    }
}

/// Counts a connection thread alive until dropped.
struct Live<'a>(&'a AtomicUsize);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves payers: one loop accepts connections, and each runs its handshake and its session
/// ([`serve_payer`], under [`SessionLimits`]) on its own thread, so neither a silent connection
/// nor a slow payer holds up the others. At most [`MAX_HANDSHAKES`] handshakes (the oldest cut
/// beyond) and [`MAX_SESSIONS`] sessions (a new one closed beyond) at once. With `--count N`,
/// it stops accepting once N payments are received in total, cuts the handshakes under way and
/// gives the sessions still open [`DRAIN`] to finish: a payment they deliver meanwhile is
/// accepted (never refused for the count), so the total may pass N.
fn listen_loop(
    store: &FileStore,
    json: bool,
    addr: SocketAddr,
    count: Option<usize>,
    no_announce: bool,
    authority: &dyn Fn(&mut Wallet) -> Result<()>,
) -> Result<ExitCode> {
    let (signer, key) = {
        let _l = store.lock()?;
        let mut w = store.load()?;
        if w.authority().is_none() {
            authority(&mut w)?;
            store.save(&w)?;
        }
        (Arc::new(w.signer().clone()), w.public_key())
    };
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    listen_on(
        store,
        json,
        listener,
        (signer, key),
        count,
        no_announce,
        None,
    )
}

/// [`listen_loop`] on a bound `listener` as the wallet `(signer, key)`, until `count` payments,
/// or `until` has passed (the web wallet's listener), or the wallet fails.
pub(crate) fn listen_on(
    store: &FileStore,
    json: bool,
    listener: TcpListener,
    (signer, key): (Arc<LocalSigner>, PublicKey),
    count: Option<usize>,
    no_announce: bool,
    until: Option<Duration>,
) -> Result<ExitCode> {
    let at = listener.local_addr()?;
    let _announce = if no_announce {
        None
    } else {
        Announcer::start(key, at, None).ok()
    };
    event(
        json,
        json!({ "event": "listening", "at": at.to_string(), "address": key.to_address() }),
        format!("listening on {at} as {key}"),
    );
    if count == Some(0) {
        return Ok(ExitCode::SUCCESS);
    }
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Sessions {
        stop: AtomicBool::new(false),
        received: AtomicUsize::new(0),
        count,
        next: AtomicU64::new(0),
        live: AtomicUsize::new(0),
        handshakes: Mutex::new(VecDeque::new()),
        open: Mutex::new(HashMap::new()),
        failed: Mutex::new(None),
        done: Mutex::new(Some(tx)),
    });
    {
        let (shared, store) = (shared.clone(), store.clone());
        std::thread::Builder::new()
            .name("florin-listen".into())
            .spawn(move || accept_loop(&shared, &listener, &signer, &store, json))
            .context("cannot start the listener")?;
    }
    // Until `--count` is reached or the wallet fails (or forever, or `until`).
    match until {
        Some(d) => {
            let _ = rx.recv_timeout(d);
        }
        None => {
            let _ = rx.recv();
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    for (_, s) in locked(&shared.handshakes).drain(..) {
        let _ = s.shutdown(Shutdown::Both);
    }
    // Wakes the accept loop so that it lets the socket go (best effort: the process ends anyway).
    let wake = match at.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), at.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), at.port())
        }
        _ => at,
    };
    let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
    let drained = |bound: Duration| {
        let until = Instant::now() + bound;
        while shared.live.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    drained(DRAIN);
    for (_, s) in locked(&shared.open).drain() {
        let _ = s.shutdown(Shutdown::Both);
    }
    // A session cut now ends at its next read or write; one saving the wallet finishes first.
    drained(Duration::from_secs(5));
    let failed = locked(&shared.failed).take();
    match failed {
        Some(e) => Err(e),
        None => Ok(ExitCode::SUCCESS),
    }
}

fn accept_loop(
    shared: &Arc<Sessions>,
    listener: &TcpListener,
    signer: &Arc<LocalSigner>,
    store: &FileStore,
    json: bool,
) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::info!("refused a connection: {e}");
                // A failing accept (e.g. out of file handles) must not spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Ok(copy) = stream.try_clone() else {
            continue;
        };
        let id = shared.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut hs = locked(&shared.handshakes);
            // Checked under the lock the stopping side takes to cut handshakes: a connection
            // is either cut there or never started.
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            if hs.len() >= MAX_HANDSHAKES {
                if let Some((_, oldest)) = hs.pop_front() {
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            }
            hs.push_back((id, copy));
        }
        shared.live.fetch_add(1, Ordering::SeqCst);
        let (s, signer, store) = (shared.clone(), signer.clone(), store.clone());
        let spawned = std::thread::Builder::new()
            .name("florin-payer".into())
            .spawn(move || {
                let _live = Live(&s.live);
                serve_connection(&s, id, stream, &signer, &store, json);
            });
        if spawned.is_err() {
            // The closure (and its `Live`) never ran.
            shared.live.fetch_sub(1, Ordering::SeqCst);
            shared.end_handshake(id);
        }
    }
}

/// One connection: the handshake (bounded), then the payer's session.
fn serve_connection(
    shared: &Sessions,
    id: u64,
    stream: TcpStream,
    signer: &LocalSigner,
    store: &FileStore,
    json: bool,
) {
    let limits = SessionLimits::default();
    let cfg = ChannelConfig {
        timeout: HANDSHAKE_DEADLINE,
        ..ChannelConfig::default()
    };
    let ch = accept_on(stream, signer, &cfg);
    shared.end_handshake(id);
    let ch = match ch {
        Ok(c) => c,
        Err(e) => {
            if !shared.stop.load(Ordering::SeqCst) {
                tracing::info!("refused a connection: {e}");
            }
            return;
        }
    };
    let from = ch.peer();
    {
        let mut open = locked(&shared.open);
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if open.len() >= MAX_SESSIONS {
            drop(open);
            tracing::info!(
                "closed a connection from {from}: {MAX_SESSIONS} payers are served already"
            );
            return;
        }
        if let Ok(c) = ch.try_clone_stream() {
            open.insert(id, c);
        }
    }
    // A payer that stops reading an answer is cut like one that stops writing.
    let _ = ch.set_write_timeout(limits.message_timeout);
    let served = serve_payer(
        store,
        &mut PayerLink(ch),
        &limits,
        &mut OsRng,
        |e| match e {
            PayeeEvent::Received {
                cents,
                tokens,
                from,
            } => {
                event(
                    json,
                    json!({ "event": "received", "amount_cents": cents, "tokens": tokens, "from": from.to_address() }),
                    format!(
                        "received €{} in {tokens} tokens from {from}",
                        format_cents(*cents)
                    ),
                );
                let n = shared.received.fetch_add(1, Ordering::SeqCst) + 1;
                if shared.count.is_some_and(|c| n >= c) {
                    shared.finish();
                }
            }
            PayeeEvent::Refused { from, reason } => {
                tracing::info!("refused a payment from {from}: {reason}")
            }
            _ => {}
        },
    );
    locked(&shared.open).remove(&id);
    match served {
        Ok(served) => {
            if !matches!(served.end, SessionEnd::Closed) {
                tracing::info!("connection from {from} ended: {}", served.end);
            }
        }
        Err(e) => {
            tracing::info!("connection from {from} ended: {e}");
            locked(&shared.failed).get_or_insert_with(|| {
                anyhow::Error::new(e).context("the wallet could not be loaded or saved")
            });
            shared.finish();
        }
    }
}
