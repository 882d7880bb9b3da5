//! Signature verification, single and batched, under one validity rule (see the crate docs).

use std::collections::HashMap;

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::{IsIdentity, VartimeMultiscalarMul};
use rand::{CryptoRng, RngCore};
use sha2::{Digest as _, Sha512};
use thiserror::Error;

use crate::keys::{PublicKey, Signature};

/// Why a signature is invalid. Every variant is a property of the bytes, so every verifier
/// (wallet, authority, batch or single) reaches the same verdict.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignatureError {
    /// The public key's y coordinate is not reduced modulo p.
    #[error("public key is not a canonical point encoding")]
    NonCanonicalKey,
    /// The public key is not on the curve.
    #[error("public key is not a curve point")]
    InvalidKey,
    /// The public key has small order: anyone could sign for it.
    #[error("public key has small order")]
    SmallOrderKey,
    /// R's y coordinate is not reduced modulo p.
    #[error("signature R is not a canonical point encoding")]
    NonCanonicalR,
    /// R is not on the curve.
    #[error("signature R is not a curve point")]
    InvalidR,
    /// R has small order.
    #[error("signature R has small order")]
    SmallOrderR,
    /// s is not reduced modulo ℓ (a malleated signature).
    #[error("signature s is not a canonical scalar")]
    NonCanonicalS,
    /// The verification equation does not hold: wrong key, wrong message or forged.
    #[error("signature does not verify")]
    Equation,
}

/// `true` when the low 255 bits of `bytes` encode an integer below p = 2²⁵⁵ − 19.
fn is_canonical_y(bytes: &[u8; 32]) -> bool {
    let top_all_ones = bytes[31] & 0x7f == 0x7f && bytes[1..31].iter().all(|b| *b == 0xff);
    !(top_all_ones && bytes[0] >= 0xed)
}

fn parse_point(
    bytes: &[u8; 32],
    non_canonical: SignatureError,
    invalid: SignatureError,
    small: SignatureError,
) -> Result<EdwardsPoint, SignatureError> {
    if !is_canonical_y(bytes) {
        return Err(non_canonical);
    }
    let point = CompressedEdwardsY(*bytes).decompress().ok_or(invalid)?;
    if point.is_small_order() {
        return Err(small);
    }
    Ok(point)
}

fn parse_key(bytes: &[u8; 32]) -> Result<EdwardsPoint, SignatureError> {
    parse_point(
        bytes,
        SignatureError::NonCanonicalKey,
        SignatureError::InvalidKey,
        SignatureError::SmallOrderKey,
    )
}

fn parse_r(bytes: &[u8; 32]) -> Result<EdwardsPoint, SignatureError> {
    parse_point(
        bytes,
        SignatureError::NonCanonicalR,
        SignatureError::InvalidR,
        SignatureError::SmallOrderR,
    )
}

fn split(sig: &Signature) -> ([u8; 32], [u8; 32]) {
    let mut r = [0u8; 32];
    let mut s = [0u8; 32];
    r.copy_from_slice(&sig.0[..32]);
    s.copy_from_slice(&sig.0[32..]);
    (r, s)
}

fn parse_s(bytes: [u8; 32]) -> Result<Scalar, SignatureError> {
    Option::from(Scalar::from_canonical_bytes(bytes)).ok_or(SignatureError::NonCanonicalS)
}

fn challenge(r: &[u8; 32], a: &[u8; 32], msg: &[u8]) -> Scalar {
    Scalar::from_hash(
        Sha512::new()
            .chain_update(r)
            .chain_update(a)
            .chain_update(msg),
    )
}

/// The cofactored equation for one signature: `[8]([s]B − [k]A − R) = 0`.
fn equation_holds(a: &EdwardsPoint, r: &EdwardsPoint, s: &Scalar, k: &Scalar) -> bool {
    let sb_minus_ka = EdwardsPoint::vartime_double_scalar_mul_basepoint(k, &(-a), s);
    (sb_minus_ka - r).mul_by_cofactor().is_identity()
}

/// Verifies one signature under Florin's validity rule.
pub fn verify(key: &PublicKey, msg: &[u8], sig: &Signature) -> Result<(), SignatureError> {
    let a = parse_key(&key.0)?;
    let (r_bytes, s_bytes) = split(sig);
    let r = parse_r(&r_bytes)?;
    let s = parse_s(s_bytes)?;
    let k = challenge(&r_bytes, &key.0, msg);
    if equation_holds(&a, &r, &s, &k) {
        Ok(())
    } else {
        Err(SignatureError::Equation)
    }
}

struct Item {
    key: [u8; 32],
    r: [u8; 32],
    s: [u8; 32],
    k: Scalar,
}

/// The invalid signatures found by [`BatchVerifier::verify`], by queue position.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{} of the batch's signatures are invalid (first: #{} {})", invalid.len(),
        invalid.first().map(|x| x.0).unwrap_or_default(),
        invalid.first().map(|x| x.1.to_string()).unwrap_or_default())]
pub struct BatchError {
    /// `(queue position, reason)` for every invalid signature, in queue order.
    pub invalid: Vec<(usize, SignatureError)>,
}

/// Verifies many signatures at once with one multi-scalar multiplication.
///
/// Accepts exactly the signatures [`verify`] accepts. Signatures under the same key share one
/// point (the authority's key, or a depositor's key on every token of a deposit), which makes
/// the batch cheaper than the sum of its parts. When the batch fails, every signature is checked
/// on its own so the caller learns which ones are bad.
#[derive(Default)]
pub struct BatchVerifier {
    items: Vec<Item>,
}

impl BatchVerifier {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `n` signatures.
    pub fn with_capacity(n: usize) -> Self {
        BatchVerifier {
            items: Vec::with_capacity(n),
        }
    }

    /// Number of queued signatures.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// `true` when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Queues a signature; the message is hashed now and need not outlive the call.
    pub fn queue(&mut self, key: &PublicKey, msg: &[u8], sig: &Signature) {
        let (r, s) = split(sig);
        let k = challenge(&r, &key.0, msg);
        self.items.push(Item {
            key: key.0,
            r,
            s,
            k,
        });
    }

    /// Verifies every queued signature. `Ok` means all are valid.
    pub fn verify<R: RngCore + CryptoRng>(self, rng: &mut R) -> Result<(), BatchError> {
        let n = self.items.len();
        if n == 0 {
            return Ok(());
        }
        let mut invalid = Vec::new();
        // Keys deduplicated: index into `key_points`.
        let mut key_index: HashMap<[u8; 32], Result<usize, SignatureError>> = HashMap::new();
        let mut key_points: Vec<EdwardsPoint> = Vec::new();
        let mut key_coeffs: Vec<Scalar> = Vec::new();
        let mut r_points: Vec<EdwardsPoint> = Vec::with_capacity(n);
        let mut r_coeffs: Vec<Scalar> = Vec::with_capacity(n);
        let mut parsed: Vec<Option<(usize, EdwardsPoint, Scalar)>> = Vec::with_capacity(n);
        let mut b_coeff = Scalar::ZERO;

        for (i, item) in self.items.iter().enumerate() {
            let key = *key_index.entry(item.key).or_insert_with(|| {
                parse_key(&item.key).map(|p| {
                    key_points.push(p);
                    key_coeffs.push(Scalar::ZERO);
                    key_points.len() - 1
                })
            });
            let parts = key.and_then(|ki| Ok((ki, parse_r(&item.r)?, parse_s(item.s)?)));
            match parts {
                Ok((ki, r, s)) => {
                    let z = random_128(rng);
                    b_coeff += z * s;
                    r_points.push(r);
                    r_coeffs.push(-z);
                    key_coeffs[ki] -= z * item.k;
                    parsed.push(Some((ki, r, s)));
                }
                Err(e) => {
                    invalid.push((i, e));
                    parsed.push(None);
                }
            }
        }

        let scalars = std::iter::once(&b_coeff)
            .chain(r_coeffs.iter())
            .chain(key_coeffs.iter());
        let points = std::iter::once(&ED25519_BASEPOINT_POINT)
            .chain(r_points.iter())
            .chain(key_points.iter());
        let sum = EdwardsPoint::vartime_multiscalar_mul(scalars, points);
        if !sum.mul_by_cofactor().is_identity() {
            // Find the culprits by bisection: a half that verifies as a batch is clean, so a
            // few bad signatures among many cost a few small batches, not one check each.
            let well_formed: Vec<Prepared> = self
                .items
                .iter()
                .zip(&parsed)
                .enumerate()
                .filter_map(|(i, (item, p))| {
                    p.map(|(ki, r, s)| Prepared {
                        pos: i,
                        a: key_points[ki],
                        r,
                        s,
                        k: item.k,
                    })
                })
                .collect();
            bisect(&well_formed, rng, &mut invalid);
            invalid.sort_by_key(|x| x.0);
        }
        if invalid.is_empty() {
            Ok(())
        } else {
            Err(BatchError { invalid })
        }
    }
}

/// A well-formed signature ready for the equation.
#[derive(Clone, Copy)]
struct Prepared {
    pos: usize,
    a: EdwardsPoint,
    r: EdwardsPoint,
    s: Scalar,
    k: Scalar,
}

/// Whether a random linear combination of the cofactored equations of `items` holds.
fn combination_holds<R: RngCore + CryptoRng>(items: &[Prepared], rng: &mut R) -> bool {
    let mut b_coeff = Scalar::ZERO;
    let mut scalars = Vec::with_capacity(2 * items.len() + 1);
    let mut points = Vec::with_capacity(2 * items.len() + 1);
    for p in items {
        let z = random_128(rng);
        b_coeff += z * p.s;
        scalars.push(-z);
        points.push(p.r);
        scalars.push(-(z * p.k));
        points.push(p.a);
    }
    scalars.push(b_coeff);
    points.push(ED25519_BASEPOINT_POINT);
    EdwardsPoint::vartime_multiscalar_mul(&scalars, &points)
        .mul_by_cofactor()
        .is_identity()
}

/// Appends the invalid members of `items`, known to contain at least one.
fn bisect<R: RngCore + CryptoRng>(
    items: &[Prepared],
    rng: &mut R,
    invalid: &mut Vec<(usize, SignatureError)>,
) {
    if items.len() <= 4 {
        for p in items {
            if !equation_holds(&p.a, &p.r, &p.s, &p.k) {
                invalid.push((p.pos, SignatureError::Equation));
            }
        }
        return;
    }
    let (left, right) = items.split_at(items.len() / 2);
    for half in [left, right] {
        if !combination_holds(half, rng) {
            bisect(half, rng, invalid);
        }
    }
}

fn random_128<R: RngCore + CryptoRng>(rng: &mut R) -> Scalar {
    let mut b = [0u8; 32];
    rng.fill_bytes(&mut b[..16]);
    Scalar::from_bytes_mod_order(b)
}

#[cfg(test)]
mod tests;
