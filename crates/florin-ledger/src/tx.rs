//! UTXOs and transactions (Hamilton 3.4), with one canonical encoding each.
//!
//! - A UTXO is `(value in cents, encumbrance, serial)`; its UHS id is the domain-separated
//!   SHA-256 of its encoding. The ledger stores only ids (and, for auditing, values).
//! - A Transfer's txid hashes its full input UTXOs and its outputs, not the witnesses; every
//!   witness signs the txid. Output serials are `H(txid, index)`, so every output ever created is
//!   unique and a spent id can never come back.
//! - Every transaction carries `expires`: the last second (Unix time) at which the ledger may
//!   apply it. A ledger refuses it after that ([`crate::expiry`]) and forgets a transfer's or a
//!   redeem's txid once its expiry has passed, so the replay-answer state stays bounded: a
//!   replay after expiry is answered "expired", never applied (its inputs are spent for good).
//! - A Mint carries an issuer-chosen random nonce and the issuer's signature; the ledger
//!   remembers applied txids, so replaying a mint creates nothing.
//! - A Redeem destroys value: signed by the owners of its inputs and by the issuer.
//! - An encumbrance is a scheme tag and 32 bytes: an Ed25519 key ([`SCHEME_ED25519`]) or the
//!   hash of a 33-byte SEC1-compressed P-256 key ([`SCHEME_P256`]), so every UTXO has the same
//!   size. A witness carries the full key of its scheme and a 64-byte signature on the txid;
//!   a P-256 signature is ECDSA-P256-SHA256 over the 32-byte txid, low-S (see
//!   [`florin_crypto::p256`]). A threshold P-256 wallet and a single-key one look the same.
//!   Mint and redeem issuer signatures are always Ed25519.

use florin_crypto::{hash, Digest, P256PublicKey, P256Signature, PublicKey, Signature};

use crate::codec::{DecodeError, Reader};

/// A UHS id: the hash of a UTXO.
pub type UhsId = Digest;
/// The Ed25519 encumbrance / witness scheme tag.
pub const SCHEME_ED25519: u8 = 1;
/// The ECDSA P-256 encumbrance / witness scheme tag.
pub const SCHEME_P256: u8 = 2;
/// Domain of the hash of a P-256 key in a [`SCHEME_P256`] encumbrance.
pub const P256_KEY_DOMAIN: &str = "florin/ledger/p256-key/v1";
/// Version byte of the transaction encoding (2: every transaction carries `expires`).
pub const TX_VERSION: u8 = 2;
/// The version before expiries existed. Such transactions still decode (wallets, payment
/// providers and the authority may hold one that was in flight), with `expires` =
/// [`LEGACY_EXPIRES`]; they keep their version-1 encoding and txid, and every ledger refuses
/// them (an expiry that far ahead never passes the edge), so a holder settles them by their
/// inputs as it settles an expired transaction.
pub const TX_VERSION_1: u8 = 1;
/// The `expires` of a version-1 transaction.
pub const LEGACY_EXPIRES: u64 = u64::MAX;
/// Most inputs or outputs in one transaction.
pub const MAX_IO: usize = 1024;

/// Who may spend an output: a signature scheme tag and 32 bytes naming the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encumbrance {
    /// Scheme tag: [`SCHEME_ED25519`] or [`SCHEME_P256`].
    pub scheme: u8,
    /// For Ed25519 the key itself; for P-256 [`p256_key_hash`] of the compressed key.
    pub key: [u8; 32],
}

/// The 32 bytes a [`SCHEME_P256`] encumbrance holds for `key`:
/// `H("florin/ledger/p256-key/v1", key33)`.
pub fn p256_key_hash(key: &P256PublicKey) -> [u8; 32] {
    hash(P256_KEY_DOMAIN, &[&key.0])
}

impl Encumbrance {
    /// An Ed25519 key.
    pub fn ed25519(key: &PublicKey) -> Self {
        Encumbrance {
            scheme: SCHEME_ED25519,
            key: key.0,
        }
    }

    /// A P-256 key (single-key or threshold: the ledger cannot tell them apart).
    pub fn p256(key: &P256PublicKey) -> Self {
        Encumbrance {
            scheme: SCHEME_P256,
            key: p256_key_hash(key),
        }
    }

    /// The text form: `ed25519:<64 hex>` (the key) or `p256:<64 hex>` (the key's hash), as
    /// wallets and payment providers exchange it. A P-256 encumbrance names a key by its hash,
    /// so a payer needs only this text, never the payee's public key.
    pub fn to_text(&self) -> String {
        let scheme = match self.scheme {
            SCHEME_ED25519 => "ed25519".to_string(),
            SCHEME_P256 => "p256".to_string(),
            other => format!("scheme{other}"),
        };
        format!("{scheme}:{}", hex::encode(self.key))
    }

    /// Parses [`Encumbrance::to_text`]'s form; `None` for anything else (an unknown scheme,
    /// bad hex, a wrong length).
    pub fn parse_text(s: &str) -> Option<Encumbrance> {
        let (scheme, key) = s.trim().split_once(':')?;
        let scheme = match scheme {
            "ed25519" => SCHEME_ED25519,
            "p256" => SCHEME_P256,
            _ => return None,
        };
        let bytes = hex::decode(key).ok()?;
        Some(Encumbrance {
            scheme,
            key: bytes.try_into().ok()?,
        })
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(self.scheme);
        out.extend_from_slice(&self.key);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Encumbrance {
            scheme: r.u8("scheme")?,
            key: r.array("key")?,
        })
    }
}

/// An output to be created: value and encumbrance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Output {
    /// Value in euro cents.
    pub value: u64,
    /// Who may spend it.
    pub encumbrance: Encumbrance,
}

impl Output {
    const LEN: usize = 8 + 33;

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.value.to_le_bytes());
        self.encumbrance.encode_into(out);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Output {
            value: r.u64("value")?,
            encumbrance: Encumbrance::decode(r)?,
        })
    }
}

/// An unspent transaction output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Utxo {
    /// Value in euro cents.
    pub value: u64,
    /// Who may spend it.
    pub encumbrance: Encumbrance,
    /// Globally unique serial.
    pub serial: [u8; 32],
}

impl Utxo {
    const LEN: usize = 8 + 33 + 32;

    /// The canonical encoding (73 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.value.to_le_bytes());
        self.encumbrance.encode_into(out);
        out.extend_from_slice(&self.serial);
    }

    /// Decodes a UTXO, rejecting trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let u = Self::decode_from(&mut r)?;
        r.finish()?;
        Ok(u)
    }

    fn decode_from(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Utxo {
            value: r.u64("value")?,
            encumbrance: Encumbrance::decode(r)?,
            serial: r.array("serial")?,
        })
    }

    /// The UHS id.
    pub fn id(&self) -> UhsId {
        hash("florin/ledger/uhs/v1", &[&self.encode()])
    }
}

/// A witness: the spender's full key and signature over the txid, in the input's scheme.
///
/// Encoded as the scheme tag, the key and the signature: `1 ‖ key 32 ‖ sig 64` (97 bytes) for
/// Ed25519, `2 ‖ compressed key 33 ‖ r 32 ‖ s 32` (98 bytes) for P-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Witness {
    /// [`SCHEME_ED25519`]: the key must equal the input's encumbrance key.
    Ed25519 {
        /// The signing key.
        key: PublicKey,
        /// The Ed25519 signature over the txid.
        signature: Signature,
    },
    /// [`SCHEME_P256`]: the key must hash ([`p256_key_hash`]) to the input's encumbrance key.
    P256 {
        /// The SEC1-compressed signing key.
        key: P256PublicKey,
        /// The low-S ECDSA-P256-SHA256 signature over the txid.
        signature: P256Signature,
    },
}

impl Witness {
    /// The shortest encoding (Ed25519).
    const MIN_LEN: usize = 1 + 32 + 64;

    /// An Ed25519 witness.
    pub fn ed25519(key: PublicKey, signature: Signature) -> Self {
        Witness::Ed25519 { key, signature }
    }

    /// A P-256 witness.
    pub fn p256(key: P256PublicKey, signature: P256Signature) -> Self {
        Witness::P256 { key, signature }
    }

    /// The scheme tag.
    pub fn scheme(&self) -> u8 {
        match self {
            Witness::Ed25519 { .. } => SCHEME_ED25519,
            Witness::P256 { .. } => SCHEME_P256,
        }
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(self.scheme());
        match self {
            Witness::Ed25519 { key, signature } => {
                out.extend_from_slice(&key.0);
                out.extend_from_slice(&signature.0);
            }
            Witness::P256 { key, signature } => {
                out.extend_from_slice(&key.0);
                out.extend_from_slice(&signature.0);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8("witness scheme")? {
            SCHEME_ED25519 => Ok(Witness::Ed25519 {
                key: PublicKey(r.array("witness key")?),
                signature: Signature(r.array("witness signature")?),
            }),
            SCHEME_P256 => Ok(Witness::P256 {
                key: P256PublicKey(r.array("witness key")?),
                signature: P256Signature(r.array("witness signature")?),
            }),
            _ => Err(DecodeError::Invalid("witness scheme")),
        }
    }
}

/// Derives output `index`'s serial from the creating transaction's id.
pub fn output_serial(txid: &Digest, index: usize) -> [u8; 32] {
    hash(
        "florin/ledger/serial/v1",
        &[txid, &(index as u32).to_le_bytes()],
    )
}

pub(crate) fn outputs_to_utxos(txid: &Digest, outputs: &[Output]) -> Vec<Utxo> {
    outputs
        .iter()
        .enumerate()
        .map(|(i, o)| Utxo {
            value: o.value,
            encumbrance: o.encumbrance,
            serial: output_serial(txid, i),
        })
        .collect()
}

/// k inputs → l outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Full input UTXOs.
    pub inputs: Vec<Utxo>,
    /// Outputs to create.
    pub outputs: Vec<Output>,
    /// One per input.
    pub witnesses: Vec<Witness>,
    /// The last second (Unix time) at which the ledger may apply it.
    pub expires: u64,
}

impl Transfer {
    /// The txid: expiry, inputs and outputs, not witnesses.
    pub fn txid(&self) -> Digest {
        let mut body = Vec::with_capacity(
            12 + self.inputs.len() * Utxo::LEN + self.outputs.len() * Output::LEN,
        );
        if self.expires != LEGACY_EXPIRES {
            body.extend_from_slice(&self.expires.to_le_bytes());
        }
        encode_list(&mut body, &self.inputs, |u, o| u.encode_into(o));
        encode_list(&mut body, &self.outputs, |x, o| x.encode_into(o));
        hash("florin/ledger/transfer/v1", &[&body])
    }

    /// The UTXOs this transfer creates.
    pub fn output_utxos(&self) -> Vec<Utxo> {
        outputs_to_utxos(&self.txid(), &self.outputs)
    }
}

/// The issuer creates money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mint {
    /// A fresh random nonce: makes every mint's outputs unique.
    pub nonce: [u8; 32],
    /// Outputs to create.
    pub outputs: Vec<Output>,
    /// The issuer's signature over the txid.
    pub issuer_signature: Signature,
    /// The last second (Unix time) at which the ledger may apply it.
    pub expires: u64,
}

impl Mint {
    /// The txid.
    pub fn txid(&self) -> Digest {
        let mut body = Vec::with_capacity(40 + self.outputs.len() * Output::LEN);
        if self.expires != LEGACY_EXPIRES {
            body.extend_from_slice(&self.expires.to_le_bytes());
        }
        body.extend_from_slice(&self.nonce);
        encode_list(&mut body, &self.outputs, |x, o| x.encode_into(o));
        hash("florin/ledger/mint/v1", &[&body])
    }

    /// The UTXOs this mint creates.
    pub fn output_utxos(&self) -> Vec<Utxo> {
        outputs_to_utxos(&self.txid(), &self.outputs)
    }
}

/// Value leaves the ledger (redemption), authorized by the inputs' owners and the issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redeem {
    /// Inputs destroyed.
    pub inputs: Vec<Utxo>,
    /// One per input.
    pub witnesses: Vec<Witness>,
    /// The issuer's signature over the txid.
    pub issuer_signature: Signature,
    /// The last second (Unix time) at which the ledger may apply it.
    pub expires: u64,
}

impl Redeem {
    /// The txid.
    pub fn txid(&self) -> Digest {
        let mut body = Vec::with_capacity(10 + self.inputs.len() * Utxo::LEN);
        if self.expires != LEGACY_EXPIRES {
            body.extend_from_slice(&self.expires.to_le_bytes());
        }
        encode_list(&mut body, &self.inputs, |u, o| u.encode_into(o));
        hash("florin/ledger/redeem/v1", &[&body])
    }
}

/// Any ledger transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transaction {
    /// Move money.
    Transfer(Transfer),
    /// Create money.
    Mint(Mint),
    /// Destroy money.
    Redeem(Redeem),
}

fn encode_list<T>(out: &mut Vec<u8>, items: &[T], f: impl Fn(&T, &mut Vec<u8>)) {
    out.extend_from_slice(&(items.len() as u16).to_le_bytes());
    for i in items {
        f(i, out);
    }
}

fn decode_list<T>(
    r: &mut Reader<'_>,
    what: &'static str,
    len: usize,
    f: impl Fn(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let n = r.count(what, len)?;
    if n > MAX_IO {
        return Err(DecodeError::Invalid(what));
    }
    (0..n).map(|_| f(r)).collect()
}

impl Transaction {
    /// The txid.
    pub fn txid(&self) -> Digest {
        match self {
            Transaction::Transfer(t) => t.txid(),
            Transaction::Mint(m) => m.txid(),
            Transaction::Redeem(d) => d.txid(),
        }
    }

    /// The last second (Unix time) at which the ledger may apply it.
    pub fn expires(&self) -> u64 {
        match self {
            Transaction::Transfer(t) => t.expires,
            Transaction::Mint(m) => m.expires,
            Transaction::Redeem(d) => d.expires,
        }
    }

    /// The canonical encoding: version, kind, expiry, then the kind's fields (a version-1
    /// transaction, [`LEGACY_EXPIRES`], in version 1's: no expiry).
    pub fn encode(&self) -> Vec<u8> {
        let legacy = self.expires() == LEGACY_EXPIRES;
        let mut out = vec![if legacy { TX_VERSION_1 } else { TX_VERSION }];
        let expiry = |out: &mut Vec<u8>, e: u64| {
            if !legacy {
                out.extend_from_slice(&e.to_le_bytes());
            }
        };
        match self {
            Transaction::Transfer(t) => {
                out.push(1);
                expiry(&mut out, t.expires);
                encode_list(&mut out, &t.inputs, |u, o| u.encode_into(o));
                encode_list(&mut out, &t.outputs, |x, o| x.encode_into(o));
                encode_list(&mut out, &t.witnesses, |w, o| w.encode_into(o));
            }
            Transaction::Mint(m) => {
                out.push(2);
                expiry(&mut out, m.expires);
                out.extend_from_slice(&m.nonce);
                encode_list(&mut out, &m.outputs, |x, o| x.encode_into(o));
                out.extend_from_slice(&m.issuer_signature.0);
            }
            Transaction::Redeem(d) => {
                out.push(3);
                expiry(&mut out, d.expires);
                encode_list(&mut out, &d.inputs, |u, o| u.encode_into(o));
                encode_list(&mut out, &d.witnesses, |w, o| w.encode_into(o));
                out.extend_from_slice(&d.issuer_signature.0);
            }
        }
        out
    }

    /// Decodes a transaction (version 2, or version 1 with [`LEGACY_EXPIRES`]), rejecting
    /// trailing bytes and unknown versions or kinds.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.u8("transaction")?;
        if version != TX_VERSION && version != TX_VERSION_1 {
            return Err(DecodeError::UnknownVersion {
                what: "transaction",
                found: version,
            });
        }
        let kind = r.u8("transaction kind")?;
        if !(1..=3).contains(&kind) {
            return Err(DecodeError::Invalid("transaction kind"));
        }
        let expires = if version == TX_VERSION_1 {
            LEGACY_EXPIRES
        } else {
            let e = r.u64("expiry")?;
            // One encoding per transaction: the legacy expiry only in the legacy layout.
            if e == LEGACY_EXPIRES {
                return Err(DecodeError::Invalid("expiry"));
            }
            e
        };
        let tx = match kind {
            1 => Transaction::Transfer(Transfer {
                inputs: decode_list(&mut r, "inputs", Utxo::LEN, Utxo::decode_from)?,
                outputs: decode_list(&mut r, "outputs", Output::LEN, Output::decode)?,
                witnesses: decode_list(&mut r, "witnesses", Witness::MIN_LEN, Witness::decode)?,
                expires,
            }),
            2 => Transaction::Mint(Mint {
                nonce: r.array("nonce")?,
                outputs: decode_list(&mut r, "outputs", Output::LEN, Output::decode)?,
                issuer_signature: Signature(r.array("issuer signature")?),
                expires,
            }),
            3 => Transaction::Redeem(Redeem {
                inputs: decode_list(&mut r, "inputs", Utxo::LEN, Utxo::decode_from)?,
                witnesses: decode_list(&mut r, "witnesses", Witness::MIN_LEN, Witness::decode)?,
                issuer_signature: Signature(r.array("issuer signature")?),
                expires,
            }),
            _ => return Err(DecodeError::Invalid("transaction kind")),
        };
        r.finish()?;
        Ok(tx)
    }
}
