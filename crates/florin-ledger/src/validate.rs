//! Sentinel validation (Hamilton 3.5): everything that needs no shared state, in a fixed order,
//! with one typed error per rule. Ed25519 signatures are checked in one batch across many
//! transactions; P-256 witnesses (which have no batch equation) are verified one by one before
//! the batch, so a bad one fails only its own transaction.

use std::collections::HashSet;

use florin_crypto::{
    verify_p256, BatchVerifier, Digest, P256Error, P256PublicKey, P256Signature, PublicKey,
    Signature, SignatureError,
};
use rand::{CryptoRng, RngCore};
use thiserror::Error;

use crate::compact::CompactTx;
use crate::tx::{
    p256_key_hash, Encumbrance, Output, Transaction, Utxo, Witness, SCHEME_ED25519, SCHEME_P256,
};

/// Why a transaction is statically invalid. Checked in the order of the variants.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValidationError {
    /// A transfer or redeem without inputs.
    #[error("transaction has no inputs")]
    NoInputs,
    /// A transfer or mint without outputs.
    #[error("transaction has no outputs")]
    NoOutputs,
    /// Witnesses must be exactly one per input.
    #[error("{witnesses} witnesses for {inputs} inputs")]
    WitnessCount {
        /// Inputs.
        inputs: usize,
        /// Witnesses.
        witnesses: usize,
    },
    /// The same input twice.
    #[error("input {0} is spent twice in the same transaction")]
    DuplicateInput(usize),
    /// An input or output of zero value.
    #[error("zero-value {which} {index}")]
    ZeroValue {
        /// "input" or "output".
        which: &'static str,
        /// Its index.
        index: usize,
    },
    /// The values do not fit in 64 bits.
    #[error("values overflow")]
    Overflow,
    /// Inputs and outputs differ.
    #[error("unbalanced: inputs {inputs} cents, outputs {outputs} cents")]
    Unbalanced {
        /// Sum of inputs.
        inputs: u64,
        /// Sum of outputs.
        outputs: u64,
    },
    /// An encumbrance with an unknown signature scheme.
    #[error("unknown signature scheme {scheme} in {which} {index}")]
    UnknownScheme {
        /// "input" or "output".
        which: &'static str,
        /// Its index.
        index: usize,
        /// The tag.
        scheme: u8,
    },
    /// A witness of another scheme than its input.
    #[error("witness {0} is malformed for its input's scheme")]
    MalformedWitness(usize),
    /// A witness key that does not match its input's encumbrance.
    #[error("witness {0} is by another key than its input's owner")]
    KeyMismatch(usize),
    /// A P-256 witness signature that does not verify (these are checked before the Ed25519
    /// batch).
    #[error("witness {index} P-256 signature is invalid ({reason})")]
    BadP256Signature {
        /// Which witness.
        index: usize,
        /// Why.
        reason: P256Error,
    },
    /// An Ed25519 witness signature that does not verify.
    #[error("witness {index} signature is invalid ({reason})")]
    BadSignature {
        /// Which witness.
        index: usize,
        /// Why.
        reason: SignatureError,
    },
    /// The issuer's signature (mint, redeem) does not verify.
    #[error("issuer signature is invalid ({0})")]
    BadIssuerSignature(SignatureError),
}

impl ValidationError {
    /// The witness this error blames, if it blames one.
    pub fn witness(&self) -> Option<usize> {
        match self {
            ValidationError::MalformedWitness(i) | ValidationError::KeyMismatch(i) => Some(*i),
            ValidationError::BadP256Signature { index, .. }
            | ValidationError::BadSignature { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// An Ed25519 signature check a transaction needs: (who, message, signature, which witness or
/// issuer).
type Check = (PublicKey, Digest, Signature, Option<usize>);

fn known_scheme(scheme: u8) -> bool {
    scheme == SCHEME_ED25519 || scheme == SCHEME_P256
}

fn check_values<'a>(
    inputs: impl Iterator<Item = &'a Utxo>,
    outputs: impl Iterator<Item = &'a Output>,
) -> Result<(u64, u64), ValidationError> {
    let (mut sum_in, mut sum_out) = (0u64, 0u64);
    let ins: Vec<&Utxo> = inputs.collect();
    let outs: Vec<&Output> = outputs.collect();
    for (i, u) in ins.iter().enumerate() {
        if u.value == 0 {
            return Err(ValidationError::ZeroValue {
                which: "input",
                index: i,
            });
        }
    }
    for (i, o) in outs.iter().enumerate() {
        if o.value == 0 {
            return Err(ValidationError::ZeroValue {
                which: "output",
                index: i,
            });
        }
    }
    for u in &ins {
        sum_in = sum_in
            .checked_add(u.value)
            .ok_or(ValidationError::Overflow)?;
    }
    for o in &outs {
        sum_out = sum_out
            .checked_add(o.value)
            .ok_or(ValidationError::Overflow)?;
    }
    Ok((sum_in, sum_out))
}

fn check_schemes<'a>(
    inputs: &[Utxo],
    outputs: impl Iterator<Item = &'a Encumbrance>,
) -> Result<(), ValidationError> {
    for (i, u) in inputs.iter().enumerate() {
        if !known_scheme(u.encumbrance.scheme) {
            return Err(ValidationError::UnknownScheme {
                which: "input",
                index: i,
                scheme: u.encumbrance.scheme,
            });
        }
    }
    for (i, e) in outputs.enumerate() {
        if !known_scheme(e.scheme) {
            return Err(ValidationError::UnknownScheme {
                which: "output",
                index: i,
                scheme: e.scheme,
            });
        }
    }
    Ok(())
}

fn check_inputs(inputs: &[Utxo], witnesses: &[Witness]) -> Result<(), ValidationError> {
    if witnesses.len() != inputs.len() {
        return Err(ValidationError::WitnessCount {
            inputs: inputs.len(),
            witnesses: witnesses.len(),
        });
    }
    let mut seen = HashSet::with_capacity(inputs.len());
    for (i, u) in inputs.iter().enumerate() {
        if !seen.insert(u) {
            return Err(ValidationError::DuplicateInput(i));
        }
    }
    Ok(())
}

/// A P-256 signature check a transaction needs: (which witness, key, signature).
type P256Check = (usize, P256PublicKey, P256Signature);

/// Checks that each witness is of its input's scheme and by its input's key; queues the Ed25519
/// signatures in `out` and the P-256 ones in `p256` (verified after every key is matched, so
/// that every key mismatch is found before any signature failure).
fn witness_checks(
    inputs: &[Utxo],
    witnesses: &[Witness],
    txid: &Digest,
    out: &mut Vec<Check>,
    p256: &mut Vec<P256Check>,
) -> Result<(), ValidationError> {
    for (i, (u, w)) in inputs.iter().zip(witnesses).enumerate() {
        if w.scheme() != u.encumbrance.scheme {
            return Err(ValidationError::MalformedWitness(i));
        }
        match w {
            Witness::Ed25519 { key, signature } => {
                if key.0 != u.encumbrance.key {
                    return Err(ValidationError::KeyMismatch(i));
                }
                out.push((*key, *txid, *signature, Some(i)));
            }
            Witness::P256 { key, signature } => {
                if p256_key_hash(key) != u.encumbrance.key {
                    return Err(ValidationError::KeyMismatch(i));
                }
                p256.push((i, *key, *signature));
            }
        }
    }
    Ok(())
}

/// Verifies the P-256 witnesses a transaction needs (one by one: they have no batch equation).
fn verify_p256s(txid: &Digest, p256: &[P256Check]) -> Result<(), ValidationError> {
    for (index, key, signature) in p256 {
        verify_p256(key, txid, signature).map_err(|reason| ValidationError::BadP256Signature {
            index: *index,
            reason,
        })?;
    }
    Ok(())
}

/// What a transaction still needs after the stateless checks: its txid, its Ed25519 checks
/// and its P-256 checks.
type Prechecked = (Digest, Vec<Check>, Vec<P256Check>);

/// Every stateless check but the signatures; returns the signature checks still to do.
fn precheck(tx: &Transaction, issuer: &PublicKey) -> Result<Prechecked, ValidationError> {
    let mut checks = Vec::new();
    let mut p256 = Vec::new();
    let txid;
    match tx {
        Transaction::Transfer(t) => {
            if t.inputs.is_empty() {
                return Err(ValidationError::NoInputs);
            }
            if t.outputs.is_empty() {
                return Err(ValidationError::NoOutputs);
            }
            check_inputs(&t.inputs, &t.witnesses)?;
            let (i, o) = check_values(t.inputs.iter(), t.outputs.iter())?;
            if i != o {
                return Err(ValidationError::Unbalanced {
                    inputs: i,
                    outputs: o,
                });
            }
            check_schemes(&t.inputs, t.outputs.iter().map(|o| &o.encumbrance))?;
            txid = t.txid();
            witness_checks(&t.inputs, &t.witnesses, &txid, &mut checks, &mut p256)?;
        }
        Transaction::Mint(m) => {
            if m.outputs.is_empty() {
                return Err(ValidationError::NoOutputs);
            }
            check_values(std::iter::empty(), m.outputs.iter())?;
            check_schemes(&[], m.outputs.iter().map(|o| &o.encumbrance))?;
            txid = m.txid();
            checks.push((*issuer, txid, m.issuer_signature, None));
        }
        Transaction::Redeem(d) => {
            if d.inputs.is_empty() {
                return Err(ValidationError::NoInputs);
            }
            check_inputs(&d.inputs, &d.witnesses)?;
            check_values(d.inputs.iter(), std::iter::empty())?;
            check_schemes(&d.inputs, std::iter::empty())?;
            txid = d.txid();
            witness_checks(&d.inputs, &d.witnesses, &txid, &mut checks, &mut p256)?;
            checks.push((*issuer, txid, d.issuer_signature, None));
        }
    }
    Ok((txid, checks, p256))
}

/// The inputs a transaction spends (none for a mint).
pub fn inputs_of(tx: &Transaction) -> &[Utxo] {
    match tx {
        Transaction::Transfer(t) => &t.inputs,
        Transaction::Redeem(d) => &d.inputs,
        Transaction::Mint(_) => &[],
    }
}

/// Validates transactions and compacts the valid ones. Signatures of all of them are checked
/// in one batch; a bad one is pinned to its transaction and witness.
pub fn validate_many<R: RngCore + CryptoRng>(
    txs: &[&Transaction],
    issuer: &PublicKey,
    rng: &mut R,
) -> Vec<Result<CompactTx, ValidationError>> {
    validate_many_gated(txs, issuer, rng, |_, _| true)
        .into_iter()
        .map(|v| v.unwrap_or(Err(ValidationError::NoInputs)))
        .collect()
}

/// [`validate_many`] with the cheap checks first: every stateless rule (sizes, duplicates,
/// values, balance, schemes, witness keys), then `gate(tx, txid)` — the caller's look at the
/// state, e.g. whether the inputs exist — and only for the transactions it lets through any
/// signature verification (P-256, then the Ed25519 batch). A transaction the gate stops is
/// `None`: no signature of it was verified. For the others the verdict is exactly
/// [`validate_many`]'s.
pub fn validate_many_gated<R: RngCore + CryptoRng>(
    txs: &[&Transaction],
    issuer: &PublicKey,
    rng: &mut R,
    mut gate: impl FnMut(&Transaction, &Digest) -> bool,
) -> Vec<Option<Result<CompactTx, ValidationError>>> {
    let mut results: Vec<Option<Result<Digest, ValidationError>>> = Vec::with_capacity(txs.len());
    let mut batch = BatchVerifier::with_capacity(txs.len() * 2);
    let mut owner: Vec<(usize, Option<usize>)> = Vec::new();
    for (ti, tx) in txs.iter().enumerate() {
        let (txid, checks, p256) = match precheck(tx, issuer) {
            Ok(p) => p,
            Err(e) => {
                results.push(Some(Err(e)));
                continue;
            }
        };
        if !gate(tx, &txid) {
            results.push(None);
            continue;
        }
        if let Err(e) = verify_p256s(&txid, &p256) {
            results.push(Some(Err(e)));
            continue;
        }
        for (k, m, s, w) in checks {
            batch.queue(&k, &m, &s);
            owner.push((ti, w));
        }
        results.push(Some(Ok(txid)));
    }
    if let Err(e) = batch.verify(rng) {
        for (pos, reason) in e.invalid {
            let (ti, w) = owner[pos];
            if matches!(results[ti], Some(Ok(_))) {
                results[ti] = Some(Err(match w {
                    Some(index) => ValidationError::BadSignature { index, reason },
                    None => ValidationError::BadIssuerSignature(reason),
                }));
            }
        }
    }
    results
        .into_iter()
        .zip(txs)
        .map(|(r, tx)| r.map(|r| r.map(|txid| CompactTx::with_txid(tx, txid))))
        .collect()
}

/// Validates one transaction.
pub fn validate<R: RngCore + CryptoRng>(
    tx: &Transaction,
    issuer: &PublicKey,
    rng: &mut R,
) -> Result<CompactTx, ValidationError> {
    validate_many(&[tx], issuer, rng)
        .pop()
        .unwrap_or(Err(ValidationError::NoInputs))
}
