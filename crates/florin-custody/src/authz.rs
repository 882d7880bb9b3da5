//! A customer's authorization of one payment, and the check every key-management node runs
//! on it before it takes part in a signature with a key bound to that customer.
//!
//! A payment provider holds its customers' keys as shares in its key-management network. Were
//! the nodes to sign whatever the provider asks, a compromised provider process could spend
//! any customer's money. So an account's key is *bound* to a customer key (an Ed25519 key the
//! customer's device holds) when the key is made, and a node signs with a bound key only a
//! transaction that the customer authorized:
//!
//! - the [`PaymentAuth`] is signed by the bound customer key;
//! - it names the key's own encumbrance as the payer;
//! - the transaction (sent whole, its txid recomputed) is the message being signed;
//! - the transaction pays exactly `amount_cents` to `payee` in one output, and every other
//!   output goes back to the payer;
//! - it has not expired, and expires at most [`MAX_VALIDITY_SECS`] from now;
//! - its payment id was not used before for another transaction (a retry of the same
//!   transaction is allowed).
//!
//! Encoding (version 1), all integers little-endian:
//! `1 ‖ customer (32) ‖ payer (scheme 1, key 32) ‖ payee (1 + 32) ‖ amount (8) ‖ expires (8,
//! unix seconds) ‖ id length (1) ‖ id (1–64 printable ASCII) ‖ signature (64)`. The signature
//! is Ed25519 over `H("florin/psp/payment-auth/v1", everything before it)`.

use florin_crypto::{hash, Digest, PublicKey, SecretKey, Signature};
use florin_ledger::{Encumbrance, Transaction, Transfer};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Version byte of [`PaymentAuth`]'s encoding.
pub const AUTH_VERSION: u8 = 1;
/// Longest an authorization may be valid for, from the moment a node checks it.
pub const MAX_VALIDITY_SECS: u64 = 900;
/// Longest payment id.
pub const MAX_ID_LEN: usize = 64;
const DOMAIN: &str = "florin/psp/payment-auth/v1";

/// Why a node (or the provider before it) refused to sign a payment with a customer's key.
#[derive(Debug, Clone, Error, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthzError {
    /// The key is bound to a customer and the request carried no authorization.
    #[error("the key is bound to a customer and no authorization came with the request")]
    Missing,
    /// The authorization or the transaction did not decode.
    #[error("malformed {0}")]
    Malformed(String),
    /// The authorization is not signed by the customer key bound to the key.
    #[error("the authorization is not signed by the customer key bound to this key")]
    WrongCustomer,
    /// The authorization names another payer than the key being used.
    #[error("the authorization is for another payer")]
    WrongPayer,
    /// The message to sign is not the txid of the transaction sent with it.
    #[error("the message to sign is not the txid of the transaction sent with it")]
    DigestMismatch,
    /// No output pays the authorized payee the authorized amount.
    #[error("the transaction does not pay the authorized payee the authorized amount")]
    WrongPayee,
    /// An output pays someone other than the payee (once) and the payer's change.
    #[error("output {0} pays neither the authorized payee nor the payer's change")]
    ForeignOutput(usize),
    /// The authorization has expired.
    #[error("the authorization expired at {expires} (now {now})")]
    Expired {
        /// Its expiry (unix seconds).
        expires: u64,
        /// The node's clock.
        now: u64,
    },
    /// The authorization is valid for longer than [`MAX_VALIDITY_SECS`].
    #[error("the authorization is valid for longer than {MAX_VALIDITY_SECS} s")]
    TooLong,
    /// The payment id authorized another transaction already.
    #[error("payment id {0:?} was already used for another transaction")]
    Reused(String),
    /// The node remembers as many live payment ids as it may; it signs again as they expire.
    #[error("too many live payment authorizations; retry later")]
    Busy,
    /// The note key asked for (the key plus the tweak) encumbers no input of the transaction.
    #[error("the note key to sign with encumbers no input of the transaction")]
    NotAnInput,
    /// Note keys (tweaks) asked of a key whose engine cannot sign with them.
    #[error("note keys need a DKLs23 key; this key signs only as itself")]
    NoNotes,
    /// A tweak that is not a usable P-256 scalar.
    #[error("a note tweak is not a usable P-256 scalar")]
    BadTweak,
}

/// A customer's signed authorization of one payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentAuth {
    /// The customer key that signs (bound to the payer's key in the network).
    pub customer: PublicKey,
    /// The paying account's encumbrance.
    pub payer: Encumbrance,
    /// Who is paid.
    pub payee: Encumbrance,
    /// How much, in cents.
    pub amount_cents: u64,
    /// Unix seconds after which it is void.
    pub expires: u64,
    /// The payment id (1–64 printable ASCII): one transaction per id.
    pub id: String,
    /// Ed25519 by `customer` over [`PaymentAuth::digest`].
    pub signature: Signature,
}

fn enc_bytes(e: &Encumbrance, out: &mut Vec<u8>) {
    out.push(e.scheme);
    out.extend_from_slice(&e.key);
}

/// Whether `id` is a valid payment id.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}

impl PaymentAuth {
    fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 32 + 66 + 16 + 1 + self.id.len() + 64);
        out.push(AUTH_VERSION);
        out.extend_from_slice(&self.customer.0);
        enc_bytes(&self.payer, &mut out);
        enc_bytes(&self.payee, &mut out);
        out.extend_from_slice(&self.amount_cents.to_le_bytes());
        out.extend_from_slice(&self.expires.to_le_bytes());
        out.push(self.id.len() as u8);
        out.extend_from_slice(self.id.as_bytes());
        out
    }

    /// What the customer signs.
    pub fn digest(&self) -> Digest {
        hash(DOMAIN, &[&self.body()])
    }

    /// Makes and signs an authorization with the customer's secret key.
    pub fn sign(
        secret: &SecretKey,
        payer: Encumbrance,
        payee: Encumbrance,
        amount_cents: u64,
        expires: u64,
        id: &str,
    ) -> Result<PaymentAuth, AuthzError> {
        if !valid_id(id) {
            return Err(AuthzError::Malformed("payment id".into()));
        }
        let mut a = PaymentAuth {
            customer: secret.public_key(),
            payer,
            payee,
            amount_cents,
            expires,
            id: id.to_string(),
            signature: Signature([0; 64]),
        };
        a.signature = secret.sign(&a.digest());
        Ok(a)
    }

    /// The encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.body();
        b.extend_from_slice(&self.signature.0);
        b
    }

    /// Decodes (the signature is not checked here: see [`PaymentAuth::verify`]).
    pub fn decode(b: &[u8]) -> Result<PaymentAuth, AuthzError> {
        let bad = || AuthzError::Malformed("authorization".into());
        let take = |at: &mut usize, n: usize| -> Result<&[u8], AuthzError> {
            let s = b.get(*at..*at + n).ok_or_else(bad)?;
            *at += n;
            Ok(s)
        };
        let arr32 = |s: &[u8]| -> Result<[u8; 32], AuthzError> { s.try_into().map_err(|_| bad()) };
        let u64le = |s: &[u8]| -> Result<u64, AuthzError> {
            Ok(u64::from_le_bytes(s.try_into().map_err(|_| bad())?))
        };
        let mut at = 0;
        if take(&mut at, 1)? != [AUTH_VERSION] {
            return Err(AuthzError::Malformed("authorization version".into()));
        }
        let customer = PublicKey(arr32(take(&mut at, 32)?)?);
        let payer_scheme = take(&mut at, 1)?[0];
        let payer = Encumbrance {
            scheme: payer_scheme,
            key: arr32(take(&mut at, 32)?)?,
        };
        let payee_scheme = take(&mut at, 1)?[0];
        let payee = Encumbrance {
            scheme: payee_scheme,
            key: arr32(take(&mut at, 32)?)?,
        };
        let amount_cents = u64le(take(&mut at, 8)?)?;
        let expires = u64le(take(&mut at, 8)?)?;
        let len = take(&mut at, 1)?[0] as usize;
        let id = std::str::from_utf8(take(&mut at, len)?)
            .map_err(|_| bad())?
            .to_string();
        if !valid_id(&id) {
            return Err(AuthzError::Malformed("payment id".into()));
        }
        let sig: [u8; 64] = take(&mut at, 64)?.try_into().map_err(|_| bad())?;
        if at != b.len() {
            return Err(bad());
        }
        Ok(PaymentAuth {
            customer,
            payer,
            payee,
            amount_cents,
            expires,
            id,
            signature: Signature(sig),
        })
    }

    /// Checks the signature against `customer` (the key bound to the payer's key).
    pub fn verify(&self, customer: &PublicKey) -> Result<(), AuthzError> {
        if self.customer != *customer {
            return Err(AuthzError::WrongCustomer);
        }
        florin_crypto::verify(customer, &self.digest(), &self.signature)
            .map_err(|_| AuthzError::WrongCustomer)
    }

    /// Checks the time window at `now` (unix seconds).
    pub fn check_time(&self, now: u64) -> Result<(), AuthzError> {
        if self.expires <= now {
            return Err(AuthzError::Expired {
                expires: self.expires,
                now,
            });
        }
        if self.expires > now.saturating_add(MAX_VALIDITY_SECS) {
            return Err(AuthzError::TooLong);
        }
        Ok(())
    }

    /// Checks that `tx` pays what this authorizes: one output of exactly `amount_cents` to
    /// `payee`, every other output to `payer`.
    pub fn check_outputs(&self, tx: &Transfer) -> Result<(), AuthzError> {
        self.check_outputs_with(tx, &[])
    }

    /// [`PaymentAuth::check_outputs`], where change may also go to `notes`: the payer's own
    /// note keys (its key plus a tweak, see [`change_tweak`]).
    pub fn check_outputs_with(
        &self,
        tx: &Transfer,
        notes: &[Encumbrance],
    ) -> Result<(), AuthzError> {
        let mut paid = false;
        for (i, o) in tx.outputs.iter().enumerate() {
            if !paid && o.encumbrance == self.payee && o.value == self.amount_cents {
                paid = true;
            } else if o.encumbrance != self.payer && !notes.contains(&o.encumbrance) {
                return Err(AuthzError::ForeignOutput(i));
            }
        }
        if !paid {
            return Err(AuthzError::WrongPayee);
        }
        Ok(())
    }
}

/// What a node is sent with a request to sign with a customer-bound key: the whole
/// transaction without witnesses and the customer's authorization.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Authorization {
    /// `Transaction::Transfer(..).encode()` with no witnesses (or with any: they are not
    /// part of the txid).
    pub tx: Vec<u8>,
    /// [`PaymentAuth::encode`].
    pub auth: Vec<u8>,
    /// Filia's note keys (DKLs23 keys only): sign with the key plus this tweak (`t`, 32
    /// bytes big-endian), the key of a note `P + t·G` that one of the transaction's inputs
    /// must be encumbered by. `None`: the key itself.
    #[serde(default)]
    pub tweak: Option<[u8; 32]>,
}

/// Domain of [`change_tweak`].
pub const CHANGE_NOTE_DOMAIN: &str = "florin/custody/change-note/v1";

/// The tweak `c` of the change note of a payment from key `base` under authorization
/// `auth`: `H("florin/custody/change-note/v1", base ‖ auth digest ‖ counter)`, the first
/// counter that gives a P-256 scalar. Nodes, provider and customer all compute it from what
/// they hold, so the change key `P + c·G` is never only in one party's books, and no one
/// chooses it.
pub fn change_tweak(base: &[u8; 33], auth: &PaymentAuth) -> [u8; 32] {
    let d = auth.digest();
    let mut c: u32 = 0;
    loop {
        let t = hash(CHANGE_NOTE_DOMAIN, &[base, &d, &c.to_le_bytes()]);
        if crate::dkls::public_of(&t).is_ok() {
            return t;
        }
        c = c.wrapping_add(1);
    }
}

impl Authorization {
    /// The authorization for signing `tx`.
    pub fn new(tx: &Transfer, auth: &PaymentAuth) -> Authorization {
        let bare = Transfer {
            inputs: tx.inputs.clone(),
            outputs: tx.outputs.clone(),
            witnesses: Vec::new(),
            expires: tx.expires,
        };
        Authorization {
            tx: Transaction::Transfer(bare).encode(),
            auth: auth.encode(),
            tweak: None,
        }
    }

    /// The same authorization for signing as the note key `P + tweak·G` (see
    /// [`Authorization::tweak`]).
    pub fn for_note(&self, tweak: Option<[u8; 32]>) -> Authorization {
        Authorization {
            tweak,
            ..self.clone()
        }
    }

    /// Whether it asks to sign as a note key.
    pub fn uses_notes(&self) -> bool {
        self.tweak.is_some()
    }

    /// [`Authorization::check`] for a P-256 key `base` (SEC1 compressed) whose engine signs
    /// with note keys: the payer is `base`'s encumbrance, the note key signed with
    /// (`base + tweak·G`) must encumber an input, and change may go to `base` or to the
    /// payment's change note (`base + c·G`, [`change_tweak`]).
    pub fn check_notes(
        &self,
        customer: &PublicKey,
        base: &[u8; 33],
        message: &[u8],
        now: u64,
    ) -> Result<(PaymentAuth, Digest), AuthzError> {
        let payer = Encumbrance::p256(&florin_crypto::P256PublicKey(*base));
        let (auth, tx, txid) = self.open(customer, &payer, message)?;
        let note = |t: &[u8; 32]| -> Result<Encumbrance, AuthzError> {
            let k = crate::dkls::tweak_public(base, t).map_err(|_| AuthzError::BadTweak)?;
            Ok(Encumbrance::p256(&florin_crypto::P256PublicKey(k)))
        };
        let signing = match &self.tweak {
            Some(t) => note(t)?,
            None => payer,
        };
        if !tx.inputs.iter().any(|u| u.encumbrance == signing) {
            return Err(AuthzError::NotAnInput);
        }
        auth.check_time(now)?;
        let notes = [note(&change_tweak(base, &auth))?];
        auth.check_outputs_with(&tx, &notes)?;
        Ok((auth, txid))
    }

    /// Every check but the payment id's: for signing `message` with the key whose
    /// encumbrance is `payer`, bound to `customer`, at `now`. The checked authorization and
    /// the txid.
    pub fn check(
        &self,
        customer: &PublicKey,
        payer: &Encumbrance,
        message: &[u8],
        now: u64,
    ) -> Result<(PaymentAuth, Digest), AuthzError> {
        let (auth, tx, txid) = self.open(customer, payer, message)?;
        auth.check_outputs(&tx)?;
        auth.check_time(now)?;
        Ok((auth, txid))
    }

    /// The checks both [`Authorization::check`] and [`Authorization::check_notes`] start
    /// with: the customer signed it, for `payer`, and `message` is the transaction's txid.
    fn open(
        &self,
        customer: &PublicKey,
        payer: &Encumbrance,
        message: &[u8],
    ) -> Result<(PaymentAuth, Transfer, Digest), AuthzError> {
        let auth = PaymentAuth::decode(&self.auth)?;
        auth.verify(customer)?;
        if auth.payer != *payer {
            return Err(AuthzError::WrongPayer);
        }
        let tx = match Transaction::decode(&self.tx) {
            Ok(Transaction::Transfer(t)) => t,
            _ => return Err(AuthzError::Malformed("transaction".into())),
        };
        let txid = tx.txid();
        if message != txid.as_slice() {
            return Err(AuthzError::DigestMismatch);
        }
        Ok((auth, tx, txid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use florin_ledger::{Output, Utxo};

    fn key(n: u8) -> SecretKey {
        SecretKey::from_seed(&[n; 32])
    }

    fn tx(payer: Encumbrance, payee: Encumbrance, amount: u64, change: u64) -> Transfer {
        let mut outputs = vec![Output {
            value: amount,
            encumbrance: payee,
        }];
        if change > 0 {
            outputs.push(Output {
                value: change,
                encumbrance: payer,
            });
        }
        Transfer {
            inputs: vec![Utxo {
                value: amount + change,
                encumbrance: payer,
                serial: [9; 32],
            }],
            outputs,
            witnesses: Vec::new(),
            expires: 1_900_000_000,
        }
    }

    #[test]
    fn each_mismatch_is_refused_with_its_reason() {
        let cust = key(1);
        let payer = Encumbrance::ed25519(&key(2).public_key());
        let payee = Encumbrance::ed25519(&key(3).public_key());
        let other = Encumbrance::ed25519(&key(4).public_key());
        let now = 1_000_000;
        let a = PaymentAuth::sign(&cust, payer, payee, 500, now + 60, "p-1").unwrap();
        assert_eq!(PaymentAuth::decode(&a.encode()).unwrap(), a);
        let good = tx(payer, payee, 500, 100);
        let z = Authorization::new(&good, &a);
        let txid = good.txid();
        assert!(z.check(&cust.public_key(), &payer, &txid, now).is_ok());
        // Another customer key.
        assert_eq!(
            z.check(&key(5).public_key(), &payer, &txid, now)
                .unwrap_err(),
            AuthzError::WrongCustomer
        );
        // Another payer's key.
        assert_eq!(
            z.check(&cust.public_key(), &other, &txid, now).unwrap_err(),
            AuthzError::WrongPayer
        );
        // Another message.
        assert_eq!(
            z.check(&cust.public_key(), &payer, &[0; 32], now)
                .unwrap_err(),
            AuthzError::DigestMismatch
        );
        // Expired, too long.
        assert!(matches!(
            z.check(&cust.public_key(), &payer, &txid, now + 60),
            Err(AuthzError::Expired { .. })
        ));
        let long = PaymentAuth::sign(&cust, payer, payee, 500, now + 10_000, "p-1").unwrap();
        assert_eq!(
            Authorization::new(&good, &long)
                .check(&cust.public_key(), &payer, &txid, now)
                .unwrap_err(),
            AuthzError::TooLong
        );
        // Wrong amount, wrong payee, a third party's output.
        for (bad, want) in [
            (tx(payer, payee, 400, 200), AuthzError::ForeignOutput(0)),
            (tx(payer, other, 500, 100), AuthzError::ForeignOutput(0)),
            (tx(payer, payer, 500, 100), AuthzError::WrongPayee),
        ] {
            let z = Authorization::new(&bad, &a);
            assert_eq!(
                z.check(&cust.public_key(), &payer, &bad.txid(), now)
                    .unwrap_err(),
                want
            );
        }
        let mut extra = good.clone();
        extra.outputs.push(Output {
            value: 1,
            encumbrance: other,
        });
        let z = Authorization::new(&extra, &a);
        assert_eq!(
            z.check(&cust.public_key(), &payer, &extra.txid(), now)
                .unwrap_err(),
            AuthzError::ForeignOutput(2)
        );
        // A changed byte in the authorization breaks its signature; a cut one its encoding.
        let mut b = a.encode();
        let at = 1 + 32 + 66; // the amount
        b[at] ^= 1;
        let z = Authorization {
            auth: b.clone(),
            ..Authorization::new(&good, &a)
        };
        assert_eq!(
            z.check(&cust.public_key(), &payer, &txid, now).unwrap_err(),
            AuthzError::WrongCustomer
        );
        assert!(matches!(
            PaymentAuth::decode(&b[..b.len() - 1]),
            Err(AuthzError::Malformed(_))
        ));
    }
}
