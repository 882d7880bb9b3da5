//! The payer's side of the offline exchange with a peer (a device channel): finish earlier
//! payments to that payee whose receipt never came back, ask for a request, pay it with exact
//! change, deliver it and wait for the receipt.
//!
//! The transport is a [`PeerExchange`] (the command line's is a `florin-net` channel). Its
//! methods block: the device channel does. Every payment is saved before it leaves, so a
//! broken connection never signs twice: the same command run again delivers it.

use std::error::Error as StdError;
use std::fmt;

use florin_crypto::PublicKey;
use florin_token::amount::format_cents;
use florin_token::{Payment, PaymentRequest};

use crate::connector::Cause;
use crate::flows::Notice;
use crate::store::{StoreError, WalletStore};
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
