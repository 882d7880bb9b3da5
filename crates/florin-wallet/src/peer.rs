//! The offline exchange with a peer over a device channel, both sides.
//!
//! The payer's side, [`pay_peer`]: finish earlier payments to that payee whose receipt never
//! came back, ask for a request, pay it with exact change, deliver it and wait for the receipt.
//! The transport is a [`PeerExchange`] (the command line's is a `florin-net` channel). Its
//! methods block: the device channel does. Every payment is saved before it leaves, so a
//! broken connection never signs twice: the same command run again delivers it.
//!
//! The payee's side, [`serve_payer`]: one session per connection, over a [`PayerChannel`]. The
//! payer may ask for one payment request and deliver payments, each answered with a receipt
//! (a delivery repeated after a lost receipt gets the same receipt and is credited once);
//! anything else is refused. A session ends at a deadline or after a few messages, so one
//! connection cannot hold the payee. The wallet is locked, loaded and saved around each change
//! only ([`LockingStore`]), so sessions may run side by side.

use std::error::Error as StdError;
use std::fmt;
use std::time::{Duration, Instant};

use florin_crypto::PublicKey;
use florin_token::amount::format_cents;
use florin_token::{Payment, PaymentRequest};
use rand::{CryptoRng, RngCore};

use crate::connector::Cause;
use crate::flows::Notice;
use crate::store::{LockingStore, StoreError, WalletStore};
use crate::wallet::{Wallet, WalletError};

/// What the payee answered: `Err(reason)` when it refused.
pub type Answer<T> = Result<T, String>;

/// Why an exchange with the peer broke off.
#[derive(Debug)]
#[non_exhaustive]
pub enum PeerError {
    /// The channel failed (closed, timed out, garbled).
    Channel(Cause),
    /// The payee's receipt does not match the payment delivered.
    ReceiptMismatch,
    /// The payee answered out of turn.
    Unexpected(String),
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerError::Channel(e) => e.fmt(f),
            PeerError::ReceiptMismatch => {
                f.write_str("the payee's receipt does not match the payment sent")
            }
            PeerError::Unexpected(what) => write!(f, "unexpected answer from the payee: {what}"),
        }
    }
}

impl StdError for PeerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            // Shown as the channel's own error: its causes follow it.
            PeerError::Channel(e) => e.source(),
            _ => None,
        }
    }
}

/// A channel to a payee whose key is proven.
pub trait PeerExchange {
    /// The payee's key (proven by the channel).
    fn peer(&self) -> PublicKey;

    /// Asks the payee for a payment request of `cents`.
    fn ask(&mut self, cents: u64) -> Result<Answer<PaymentRequest>, PeerError>;

    /// Delivers `p` and waits for the payee's receipt, checked to match `p`: `Ok(Err(why))`
    /// when the payee refused it (final), `Err` when the exchange broke off (retry).
    fn deliver(&mut self, p: &Payment) -> Result<Answer<()>, PeerError>;
}

/// Why paying a peer stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerPayError {
    /// The wallet could not be saved.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The wallet refused (not enough tokens, a bad request…).
    #[error(transparent)]
    Wallet(#[from] WalletError),
    /// The exchange broke off before anything was signed.
    #[error(transparent)]
    Exchange(PeerError),
    /// The exchange broke off while a signed payment was on its way: it is kept.
    #[error(
        "the payment is signed and kept as undelivered: run the same command again to finish \
         it (it is delivered once, never paid twice)"
    )]
    Undelivered(#[source] PeerError),
    /// The payee refused to issue a request.
    #[error("the payee refused: {0}")]
    RequestRefused(String),
    /// The request names another payee than the channel proved.
    #[error("the peer is {got}, not the requested {expected}")]
    WrongPayee {
        /// The channel's key.
        expected: PublicKey,
        /// The request's payee.
        got: PublicKey,
    },
    /// The payee asked for another amount.
    #[error("the payee asked for €{} instead of €{}", format_cents(*asked), format_cents(*wanted))]
    WrongAmount {
        /// What the request says.
        asked: u64,
        /// What the payer wants to pay.
        wanted: u64,
    },
    /// The payee refused the payment.
    #[error(
        "the payee refused the payment: {0} (the tokens are signed to the payee; the payment is \
         recorded as refused and not retried)"
    )]
    PaymentRefused(String),
}

/// What paying a peer did.
#[derive(Debug, Clone, Default)]
pub struct PeerPaid {
    /// Cents paid now (0 when this run only finished an interrupted payment of that amount).
    pub paid_cents: u64,
    /// Tokens in the payment made now.
    pub tokens: usize,
    /// Earlier payments to this payee delivered now, by amount.
    pub resumed: Vec<u64>,
    /// Earlier payments the payee refused now: (amount, reason).
    pub refused: Vec<(u64, String)>,
}

/// Pays `cents` to the payee at the other end of `ch`. Earlier payments to that payee left
/// undelivered are delivered first; when one of them is of `cents`, it is this command run
/// again and nothing new is paid. A refused earlier payment is told as
/// [`Notice::EarlierPaymentRefused`].
pub fn pay_peer(
    w: &mut Wallet,
    store: &dyn WalletStore,
    ch: &mut impl PeerExchange,
    cents: u64,
    notify: &dyn Fn(&Notice),
) -> Result<PeerPaid, PeerPayError> {
    let payee = ch.peer();
    let mut out = PeerPaid::default();
    // Finish earlier payments to this payee whose receipt never came back.
    for p in w.undelivered(&payee) {
        match ch.deliver(&p).map_err(PeerPayError::Undelivered)? {
            Ok(()) => {
                w.mark_delivered(&payee, &p.handshake);
                out.resumed.push(p.amount_cents());
            }
            Err(why) => {
                notify(&Notice::EarlierPaymentRefused {
                    cents: p.amount_cents(),
                    reason: why.clone(),
                });
                w.mark_refused(&payee, &p.handshake, &why);
                out.refused.push((p.amount_cents(), why));
            }
        }
        store.save(w)?;
    }
    // A retry of the same command finishes the interrupted payment instead of paying again.
    if out.resumed.contains(&cents) {
        return Ok(out);
    }
    let req = ch
        .ask(cents)
        .map_err(PeerPayError::Exchange)?
        .map_err(PeerPayError::RequestRefused)?;
    if req.payee != payee {
        return Err(PeerPayError::WrongPayee {
            expected: payee,
            got: req.payee,
        });
    }
    if req.amount_cents != cents {
        return Err(PeerPayError::WrongAmount {
            asked: req.amount_cents,
            wanted: cents,
        });
    }
    let payment = w.pay_to_peer(&req)?;
    // Saved before the payment leaves: a crash never signs twice.
    store.save(w)?;
    if let Err(why) = ch.deliver(&payment).map_err(PeerPayError::Undelivered)? {
        w.mark_refused(&payee, &payment.handshake, &why);
        store.save(w)?;
        return Err(PeerPayError::PaymentRefused(why));
    }
    w.mark_delivered(&payee, &payment.handshake);
    store.save(w)?;
    out.paid_cents = payment.amount_cents();
    out.tokens = payment.tokens.len();
    Ok(out)
}

// ---- The payee's side ----

/// What a payer sends the payee.
#[derive(Debug, Clone)]
pub enum FromPayer {
    /// Please issue a request for this many cents.
    Ask {
        /// Cents.
        amount_cents: u64,
    },
    /// The payment.
    Deliver(Payment),
    /// Any other message, described for the refusal (`unexpected message {0}`).
    Other(String),
}

/// What the payee answers.
#[derive(Debug, Clone)]
pub enum ToPayer {
    /// The payment request asked for.
    Request(PaymentRequest),
    /// `payment` is stored, worth `amount_cents`: the channel sends its receipt (the
    /// payment's handshake, value and digest).
    Receipt {
        /// The payment delivered.
        payment: Payment,
        /// Its value.
        amount_cents: u64,
    },
    /// The reason the payee refuses.
    Refused(String),
}

/// Why receiving from the payer failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecvError {
    /// The payer closed the channel.
    Closed,
    /// The channel could not be set to wait: the session ends as at its limit.
    NoTimer,
    /// The channel failed (timed out, garbled, reset).
    Broken(Cause),
}

/// A channel to a payer whose key is proven (the payee's side of [`PeerExchange`]).
pub trait PayerChannel {
    /// The payer's key (proven by the channel).
    fn peer(&self) -> PublicKey;

    /// Waits at most `timeout` for the payer's next message.
    fn recv(&mut self, timeout: Duration) -> Result<FromPayer, RecvError>;

    /// Sends the payee's answer.
    fn send(&mut self, answer: ToPayer) -> Result<(), Cause>;
}

/// How long one connection may hold the payee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// The whole session's deadline.
    pub deadline: Duration,
    /// Most messages received in one session.
    pub max_messages: usize,
    /// Longest wait for one message.
    pub message_timeout: Duration,
}

impl Default for SessionLimits {
    /// 300 s, 8 messages, 30 s per message: one request and a few deliveries.
    fn default() -> Self {
        SessionLimits {
            deadline: Duration::from_secs(300),
            max_messages: 8,
            message_timeout: Duration::from_secs(30),
        }
    }
}

/// Something that happened in a payee's session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PayeeEvent {
    /// A payment was accepted and saved (told once: a repeated delivery is only answered).
    Received {
        /// Its value.
        cents: u64,
        /// Its tokens.
        tokens: usize,
        /// The payer.
        from: PublicKey,
    },
    /// A delivered payment was refused.
    Refused {
        /// The payer.
        from: PublicKey,
        /// Why.
        reason: String,
    },
}

/// Why a payee's session ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum SessionEnd {
    /// The payer closed the channel.
    Closed,
    /// The deadline or the message cap was reached.
    Limit,
    /// The channel failed.
    Broken(Cause),
}

impl fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionEnd::Closed => f.write_str("the payer closed the connection"),
            SessionEnd::Limit => f.write_str("session limit"),
            SessionEnd::Broken(e) => e.fmt(f),
        }
    }
}

/// What a payee's session did.
#[derive(Debug)]
pub struct Served {
    /// Payments newly accepted.
    pub received: usize,
    /// Why it ended.
    pub end: SessionEnd,
}

/// Serves one payer connection until it ends (see the module's documentation): answers at
/// most one ask with a request and each delivery with a receipt, refuses anything else, and
/// tells each payment received or refused to `on_event` as it happens. The wallet in `store` is
/// locked, loaded and saved around each change only: sessions on several connections may run
/// side by side. Ends with `Err` only when the wallet cannot be loaded or saved.
pub fn serve_payer<S: LockingStore + ?Sized>(
    store: &S,
    ch: &mut impl PayerChannel,
    limits: &SessionLimits,
    rng: &mut (impl RngCore + CryptoRng),
    mut on_event: impl FnMut(&PayeeEvent),
) -> Result<Served, StoreError> {
    let from = ch.peer();
    let deadline = Instant::now() + limits.deadline;
    let (mut asks, mut messages, mut received) = (0usize, 0usize, 0usize);
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        messages += 1;
        if left.is_zero() || messages > limits.max_messages {
            break SessionEnd::Limit;
        }
        let msg = match ch.recv(left.min(limits.message_timeout)) {
            Ok(m) => m,
            Err(RecvError::Closed) => break SessionEnd::Closed,
            Err(RecvError::NoTimer) => break SessionEnd::Limit,
            Err(RecvError::Broken(e)) => break SessionEnd::Broken(e),
        };
        let answer = match msg {
            FromPayer::Ask { .. } if asks > 0 => {
                ToPayer::Refused("one request per connection".into())
            }
            FromPayer::Ask { amount_cents } => {
                asks += 1;
                let _lock = store.lock()?;
                let mut w = store.load()?;
                match w.request(amount_cents, rng) {
                    Ok(req) => {
                        store.save(&w)?;
                        ToPayer::Request(req)
                    }
                    Err(e) => ToPayer::Refused(e.to_string()),
                }
            }
            FromPayer::Deliver(p) => {
                let accepted = {
                    let _lock = store.lock()?;
                    let mut w = store.load()?;
                    let r = w.accept_once(&p, rng);
                    if let Ok((_, true)) = r {
                        store.save(&w)?;
                    }
                    r
                };
                // Told with the wallet let go: the callback never holds up another session.
                match accepted {
                    Ok((cents, new)) => {
                        if new {
                            received += 1;
                            on_event(&PayeeEvent::Received {
                                cents,
                                tokens: p.tokens.len(),
                                from,
                            });
                        }
                        ToPayer::Receipt {
                            payment: p,
                            amount_cents: cents,
                        }
                    }
                    Err(e) => {
                        let reason = e.to_string();
                        on_event(&PayeeEvent::Refused {
                            from,
                            reason: reason.clone(),
                        });
                        ToPayer::Refused(reason)
                    }
                }
            }
            FromPayer::Other(what) => ToPayer::Refused(format!("unexpected message {what}")),
        };
        if let Err(e) = ch.send(answer) {
            break SessionEnd::Broken(e);
        }
    };
    Ok(Served { received, end })
}
