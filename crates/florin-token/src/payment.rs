//! Payment requests and payments: the two messages of an offline transfer. Files stand in for
//! NFC, QR codes or Bluetooth.
//!
//! 1. The payee issues a [`PaymentRequest`]: amount, its key and a fresh handshake nonce.
//! 2. The payer answers with a [`Payment`]: tokens whose new last link pays that key under that
//!    nonce.

use florin_crypto::PublicKey;

use crate::codec::{DecodeError, Reader};
use crate::token::{Handshake, Token};

/// Version byte of the payment request encoding.
pub const REQUEST_VERSION: u8 = 1;
/// Version byte of the payment encoding.
pub const PAYMENT_VERSION: u8 = 1;
/// Most tokens one payment may carry.
pub const MAX_PAYMENT_TOKENS: usize = 1_000_000;

/// The payee's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRequest {
    /// Amount asked, in cents.
    pub amount_cents: u64,
    /// The payee's key.
    pub payee: PublicKey,
    /// The fresh handshake nonce.
    pub handshake: Handshake,
    /// Most offline hops the payee accepts in a token (the payer picks tokens within it).
    pub max_hops: u16,
}

impl PaymentRequest {
    /// The canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(75);
        out.push(REQUEST_VERSION);
        out.extend_from_slice(&self.amount_cents.to_le_bytes());
        out.extend_from_slice(&self.payee.0);
        out.extend_from_slice(&self.handshake);
        out.extend_from_slice(&self.max_hops.to_le_bytes());
        out
    }

    /// Decodes a request, rejecting trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        r.version(REQUEST_VERSION, "payment request")?;
        let amount_cents = r.u64("amount")?;
        if amount_cents == 0 {
            return Err(DecodeError::Invalid("zero amount"));
        }
        let payee = PublicKey(r.array("payee")?);
        let handshake = r.array("handshake")?;
        let max_hops = r.u16("max hops")?;
        r.finish()?;
        Ok(PaymentRequest {
            amount_cents,
            payee,
            handshake,
            max_hops,
        })
    }
}

/// The payer's answer: tokens passed to the payee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// The payee the tokens are passed to.
    pub payee: PublicKey,
    /// The handshake of the request being paid.
    pub handshake: Handshake,
    /// The tokens.
    pub tokens: Vec<Token>,
}

impl Payment {
    /// Total value in cents.
    pub fn amount_cents(&self) -> u64 {
        self.tokens.iter().map(|t| t.value.cents()).sum()
    }

    /// The canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(PAYMENT_VERSION);
        out.extend_from_slice(&self.payee.0);
        out.extend_from_slice(&self.handshake);
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in &self.tokens {
            out.extend_from_slice(&(t.encoded_len() as u32).to_le_bytes());
            t.encode_into(&mut out);
        }
        out
    }

    /// Decodes a payment, rejecting trailing bytes and any malformed token.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        r.version(PAYMENT_VERSION, "payment")?;
        let payee = PublicKey(r.array("payee")?);
        let handshake = r.array("handshake")?;
        let n = r.u32("token count")? as usize;
        if n == 0 || n > MAX_PAYMENT_TOKENS {
            return Err(DecodeError::Invalid("token count"));
        }
        let mut tokens = Vec::with_capacity(n.min(r.remaining() / 236 + 1));
        for _ in 0..n {
            let len = r.u32("token length")? as usize;
            let bytes = r.take(len, "token")?;
            tokens.push(Token::decode(bytes)?);
        }
        r.finish()?;
        Ok(Payment {
            payee,
            handshake,
            tokens,
        })
    }
}
