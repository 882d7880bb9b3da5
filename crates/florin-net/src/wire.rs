//! The offline payment exchange over a channel.
//!
//! ```text
//! payer                                   payee (listening)
//!   Ask { amount }            ─────────▶
//!                             ◀─────────  Request (fresh handshake, payee key = channel peer)
//!   Deliver (payment)         ─────────▶  verify, store, save
//!                             ◀─────────  Receipt (handshake, amount, payment digest)
//! ```
//!
//! A payer that lost the connection after signing re-sends the same `Deliver`; a payee that has
//! already stored that payment answers with the same `Receipt`, so a retried transfer is counted
//! once. `Refused` carries the payee's reason in words.

use florin_crypto::{hash, Digest};
use florin_token::{Handshake, Payment, PaymentRequest};

use crate::channel::NetError;

/// Largest protocol message: a payment of 1,000,000 one-link tokens is 236 MB.
pub const MAX_WIRE: usize = 256 << 20;

/// One protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Payer: please issue a request for this many cents.
    Ask {
        /// Cents.
        amount_cents: u64,
    },
    /// Payee: the request.
    Request(PaymentRequest),
    /// Payer: the payment.
    Deliver(Payment),
    /// Payee: the payment is stored.
    Receipt(Receipt),
    /// Either side: the reason it stops.
    Refused(String),
}

/// The payee's acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The request's handshake.
    pub handshake: Handshake,
    /// Value stored.
    pub amount_cents: u64,
    /// [`payment_digest`] of the stored payment.
    pub payment: Digest,
}

/// The digest naming a payment in receipts.
pub fn payment_digest(p: &Payment) -> Digest {
    hash("florin/net/payment/v1", &[&p.encode()])
}

fn bad(what: &str) -> NetError {
    NetError::Protocol(format!("malformed {what} message"))
}

/// Most bytes of a refusal's text kept.
const MAX_REFUSAL: usize = 1000;

/// A refusal's text: the first [`MAX_REFUSAL`] bytes made valid UTF-8, then cut back to
/// [`MAX_REFUSAL`] bytes at a character boundary (a replacement character takes three bytes),
/// so that a decoded refusal encodes and decodes to itself.
fn refusal_text(body: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(&body[..body.len().min(MAX_REFUSAL)]).into_owned();
    let mut end = s.len().min(MAX_REFUSAL);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

impl Msg {
    /// Encodes the message.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Msg::Ask { amount_cents } => [&[1u8][..], &amount_cents.to_le_bytes()].concat(),
            Msg::Request(r) => [vec![2u8], r.encode()].concat(),
            Msg::Deliver(p) => [vec![3u8], p.encode()].concat(),
            Msg::Receipt(r) => [
                &[4u8][..],
                &r.handshake,
                &r.amount_cents.to_le_bytes(),
                &r.payment,
            ]
            .concat(),
            Msg::Refused(why) => [&[5u8][..], why.as_bytes()].concat(),
        }
    }

    /// Decodes a message.
    pub fn decode(b: &[u8]) -> Result<Msg, NetError> {
        let (&tag, body) = b.split_first().ok_or_else(|| bad("empty"))?;
        Ok(match tag {
            1 => Msg::Ask {
                amount_cents: u64::from_le_bytes(body.try_into().map_err(|_| bad("ask"))?),
            },
            2 => Msg::Request(PaymentRequest::decode(body).map_err(|_| bad("request"))?),
            3 => Msg::Deliver(
                Payment::decode(body).map_err(|e| NetError::Protocol(format!("payment: {e}")))?,
            ),
            4 => {
                if body.len() != 72 {
                    return Err(bad("receipt"));
                }
                Msg::Receipt(Receipt {
                    handshake: body[..32].try_into().map_err(|_| bad("receipt"))?,
                    amount_cents: u64::from_le_bytes(
                        body[32..40].try_into().map_err(|_| bad("receipt"))?,
                    ),
                    payment: body[40..].try_into().map_err(|_| bad("receipt"))?,
                })
            }
            5 => Msg::Refused(refusal_text(body)),
            t => return Err(NetError::Protocol(format!("unknown message type {t}"))),
        })
    }
}

impl<S: std::io::Read + std::io::Write> crate::channel::Channel<S> {
    /// Sends a protocol message, reporting progress for large ones.
    pub fn send_msg(
        &mut self,
        m: &Msg,
        progress: impl FnMut(usize, usize),
    ) -> Result<(), NetError> {
        self.send_with_progress(&m.encode(), progress)
    }

    /// Receives a protocol message.
    pub fn recv_msg(&mut self) -> Result<Msg, NetError> {
        Msg::decode(&self.recv(MAX_WIRE)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Found by the `decode_peer_msg` fuzz target: a refusal of invalid UTF-8 decoded to more
    /// than 1,000 bytes of replacement characters, which decoded again to another text.
    #[test]
    fn a_refusal_round_trips_whatever_its_bytes() {
        for body in [
            vec![0xff; 1200],
            vec![b'a'; 1200],
            [vec![b'a'; 999], "é".into()].concat(),
        ] {
            let m = Msg::decode(&[&[5u8][..], &body].concat()).unwrap();
            let Msg::Refused(text) = &m else {
                panic!("not a refusal");
            };
            assert!(text.len() <= MAX_REFUSAL, "{} bytes kept", text.len());
            assert_eq!(Msg::decode(&m.encode()).unwrap(), m);
        }
    }
}
