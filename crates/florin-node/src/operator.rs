//! The operator credential: issuer and operator requests (the faucet outside the devnet,
//! blacklisting, key revocation) are signed by a configured operator key.
//!
//! A request carries one header:
//!
//! ```text
//! Authorization: Florin-Operator v1 <key> <unix-seconds> <nonce> <signature>
//! ```
//!
//! - `key`: the operator's Ed25519 public key, as an `eur1…` address or 64 hex digits;
//! - `unix-seconds`: when the request was signed (decimal);
//! - `nonce`: 16 random bytes as 32 hex digits, never used twice by the same key;
//! - `signature`: 128 hex digits, the Ed25519 signature of [`request_digest`] (the method, the
//!   path with its query, the time, the nonce and the hash of the body, under a domain of its
//!   own, so a signature for one request is never valid for another).
//!
//! The gate ([`OperatorGate`]) is HTTP-free: it gets the header's value, the method, the path
//! and the body. No credential, or one that does not parse, is [`Unauthorized`] (401). One from
//! a key that is not an operator, signed more than [`MAX_SKEW_SECS`] from the node's clock,
//! whose signature does not verify, or whose nonce was already used by that key within the
//! window, is refused as [`Forbidden::Operator`] (403). Nonces are remembered only as long as
//! their credential could be accepted (at most [`MAX_NONCES`] at once: memory is bounded; when
//! full, further operator requests are refused with 429 until old ones expire).

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

use florin_crypto::{hash, Digest, PublicKey, SecretKey, Signature};
use thiserror::Error;

use crate::error::{Forbidden, Full, NodeError};

/// The scheme's name and version in the `Authorization` header.
pub const SCHEME: &str = "Florin-Operator";
/// The scheme's version.
pub const VERSION: &str = "v1";
/// The clock difference accepted between the signer and the node, each way.
pub const MAX_SKEW_SECS: u64 = 60;
/// Most nonces remembered at once (each for at most `2 × MAX_SKEW_SECS`).
pub const MAX_NONCES: usize = 65_536;
/// Bytes in a nonce.
pub const NONCE_LEN: usize = 16;

const REQUEST_DOMAIN: &str = "florin/operator/request/v1";
const BODY_DOMAIN: &str = "florin/operator/body/v1";

/// Why a request carries no usable operator credential (401).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unauthorized {
    /// No `Authorization` header.
    #[error("this operation needs an operator credential (Authorization: {SCHEME} {VERSION} …; `--operator-key FILE` or FLORIN_OPERATOR_KEY)")]
    Missing,
    /// A header that is not a credential of this scheme (`0`: what is wrong).
    #[error("malformed operator credential: {0}")]
    Malformed(&'static str),
}

/// Why a well-formed operator credential is refused (403).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OperatorRefused {
    /// The key is not one of this node's operators.
    #[error("{0} is not an operator of this node")]
    NotOperator(String),
    /// Signed too long ago, or in the future.
    #[error("the credential was signed at {signed_at}, more than {MAX_SKEW_SECS} s from the node's clock ({now})")]
    Expired {
        /// When it says it was signed.
        signed_at: u64,
        /// The node's clock.
        now: u64,
    },
    /// The signature does not verify for this request.
    #[error("the credential's signature does not verify for this request")]
    Forged,
    /// The nonce was already used by this key.
    #[error("the credential was already used (replayed)")]
    Replayed,
}

/// The digest an operator signs for one request: the method, the path with its query, the
/// time, the nonce and the body's hash, each length-prefixed under the domain
/// `florin/operator/request/v1`.
pub fn request_digest(
    method: &str,
    path_and_query: &str,
    timestamp: u64,
    nonce: &[u8; NONCE_LEN],
    body: &[u8],
) -> Digest {
    let body_hash = hash(BODY_DOMAIN, &[body]);
    let method_len = (method.len() as u64).to_le_bytes();
    let path_len = (path_and_query.len() as u64).to_le_bytes();
    hash(
        REQUEST_DOMAIN,
        &[
            &method_len,
            method.as_bytes(),
            &path_len,
            path_and_query.as_bytes(),
            &timestamp.to_le_bytes(),
            nonce,
            &body_hash,
        ],
    )
}

/// One operator credential (the `Authorization` header's content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The operator's key.
    pub key: PublicKey,
    /// When it was signed (unix seconds).
    pub timestamp: u64,
    /// Its nonce.
    pub nonce: [u8; NONCE_LEN],
    /// The signature of [`request_digest`].
    pub signature: Signature,
}

impl Credential {
    /// Signs a request with `key` at `timestamp` with `nonce`.
    pub fn sign(
        key: &SecretKey,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        timestamp: u64,
        nonce: [u8; NONCE_LEN],
    ) -> Credential {
        let digest = request_digest(method, path_and_query, timestamp, &nonce, body);
        Credential {
            key: key.public_key(),
            timestamp,
            nonce,
            signature: key.sign(&digest),
        }
    }

    /// The `Authorization` header's value.
    pub fn header(&self) -> String {
        format!(
            "{SCHEME} {VERSION} {} {} {} {}",
            self.key.to_address(),
            self.timestamp,
            hex::encode(self.nonce),
            hex::encode(self.signature.as_bytes())
        )
    }

    /// Parses an `Authorization` header's value.
    pub fn parse(value: &[u8]) -> Result<Credential, Unauthorized> {
        let text = std::str::from_utf8(value).map_err(|_| Unauthorized::Malformed("not text"))?;
        let parts: Vec<&str> = text.split_ascii_whitespace().collect();
        let [scheme, version, key, ts, nonce, sig] = parts.as_slice() else {
            return Err(Unauthorized::Malformed(
                "expected `Florin-Operator v1 KEY UNIX-SECONDS NONCE SIGNATURE`",
            ));
        };
        if !scheme.eq_ignore_ascii_case(SCHEME) {
            return Err(Unauthorized::Malformed("not the Florin-Operator scheme"));
        }
        if *version != VERSION {
            return Err(Unauthorized::Malformed("unknown version (v1 expected)"));
        }
        let key = PublicKey::parse(key).map_err(|_| Unauthorized::Malformed("bad key"))?;
        let timestamp = ts
            .parse::<u64>()
            .map_err(|_| Unauthorized::Malformed("bad time (unix seconds)"))?;
        let nonce = hex::decode(nonce)
            .ok()
            .and_then(|v| <[u8; NONCE_LEN]>::try_from(v.as_slice()).ok())
            .ok_or(Unauthorized::Malformed("the nonce is not 32 hex digits"))?;
        let signature = hex::decode(sig)
            .ok()
            .and_then(|v| <[u8; 64]>::try_from(v.as_slice()).ok())
            .map(Signature)
            .ok_or(Unauthorized::Malformed(
                "the signature is not 128 hex digits",
            ))?;
        Ok(Credential {
            key,
            timestamp,
            nonce,
            signature,
        })
    }
}

/// Nonces seen within the window: by expiry for pruning, and by (key, nonce) for look-up.
#[derive(Default)]
struct Seen {
    by_expiry: BTreeSet<(u64, [u8; 32], [u8; NONCE_LEN])>,
    set: HashSet<([u8; 32], [u8; NONCE_LEN])>,
}

impl Seen {
    fn prune(&mut self, now: u64) {
        while let Some(first) = self.by_expiry.first().copied() {
            if first.0 >= now {
                break;
            }
            self.by_expiry.remove(&first);
            self.set.remove(&(first.1, first.2));
        }
    }
}

/// Checks operator credentials against a set of operator keys, refusing replays.
pub struct OperatorGate {
    operators: Vec<PublicKey>,
    capacity: usize,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for OperatorGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorGate")
            .field("operators", &self.operators)
            .finish_non_exhaustive()
    }
}

impl OperatorGate {
    /// A gate admitting `operators`.
    pub fn new(operators: Vec<PublicKey>) -> OperatorGate {
        OperatorGate::with_capacity(operators, MAX_NONCES)
    }

    /// A gate admitting `operators` that remembers at most `capacity` nonces at once.
    pub fn with_capacity(operators: Vec<PublicKey>, capacity: usize) -> OperatorGate {
        OperatorGate {
            operators,
            capacity,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// The operator keys.
    pub fn operators(&self) -> &[PublicKey] {
        &self.operators
    }

    /// Nonces remembered now.
    pub fn remembered(&self) -> usize {
        self.seen.lock().map(|s| s.set.len()).unwrap_or(0)
    }

    /// Checks the credential in `header` (the `Authorization` header's value, `None` when
    /// absent) for the request `method path_and_query` with `body`, at `now` (unix seconds).
    /// Returns the operator's key. [`OperatorGate::admit`], then [`OperatorGate::verify`].
    pub fn check(
        &self,
        header: Option<&[u8]>,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        now: u64,
    ) -> Result<PublicKey, NodeError> {
        let c = self.admit(header, now)?;
        self.verify(&c, method, path_and_query, body, now)
    }

    /// The cheap checks, before the body is read: the header parses, names an operator, and
    /// was signed within [`MAX_SKEW_SECS`] of `now`.
    pub fn admit(&self, header: Option<&[u8]>, now: u64) -> Result<Credential, NodeError> {
        let c = Credential::parse(header.ok_or(Unauthorized::Missing)?)?;
        if !self.operators.contains(&c.key) {
            return Err(refused(OperatorRefused::NotOperator(c.key.to_address())));
        }
        if c.timestamp.abs_diff(now) > MAX_SKEW_SECS {
            return Err(refused(OperatorRefused::Expired {
                signed_at: c.timestamp,
                now,
            }));
        }
        Ok(c)
    }

    /// The signature over this request, then the nonce: remembered only once the signature
    /// verified (a forger cannot fill the memory). `c` must have passed
    /// [`OperatorGate::admit`] (checked again here: a credential is never accepted without).
    pub fn verify(
        &self,
        c: &Credential,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        now: u64,
    ) -> Result<PublicKey, NodeError> {
        if !self.operators.contains(&c.key) {
            return Err(refused(OperatorRefused::NotOperator(c.key.to_address())));
        }
        if c.timestamp.abs_diff(now) > MAX_SKEW_SECS {
            return Err(refused(OperatorRefused::Expired {
                signed_at: c.timestamp,
                now,
            }));
        }
        let digest = request_digest(method, path_and_query, c.timestamp, &c.nonce, body);
        florin_crypto::verify(&c.key, &digest, &c.signature)
            .map_err(|_| refused(OperatorRefused::Forged))?;
        let mut seen = self
            .seen
            .lock()
            .map_err(|_| NodeError::storage("the operator nonce cache is poisoned"))?;
        seen.prune(now);
        let id = (c.key.0, c.nonce);
        if seen.set.contains(&id) {
            return Err(refused(OperatorRefused::Replayed));
        }
        if seen.set.len() >= self.capacity {
            return Err(Full::OperatorNonces { max: self.capacity }.into());
        }
        // Acceptable until `timestamp + MAX_SKEW_SECS`: remembered until then.
        seen.by_expiry
            .insert((c.timestamp + MAX_SKEW_SECS, c.key.0, c.nonce));
        seen.set.insert(id);
        Ok(c.key)
    }
}

fn refused(r: OperatorRefused) -> NodeError {
    NodeError::Forbidden(Forbidden::Operator(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SecretKey {
        SecretKey::from_seed(&[seed; 32])
    }

    const NOW: u64 = 1_800_000_000;

    fn signed(k: &SecretKey, method: &str, path: &str, body: &[u8], ts: u64, n: u8) -> String {
        Credential::sign(k, method, path, body, ts, [n; NONCE_LEN]).header()
    }

    fn check(
        gate: &OperatorGate,
        h: &str,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<PublicKey, NodeError> {
        gate.check(Some(h.as_bytes()), method, path, body, NOW)
    }

    fn is_refused(r: Result<PublicKey, NodeError>, want: OperatorRefused) -> bool {
        matches!(r, Err(NodeError::Forbidden(Forbidden::Operator(got))) if got == want)
    }

    #[test]
    fn a_valid_credential_is_accepted_once() {
        let op = key(1);
        let gate = OperatorGate::new(vec![op.public_key()]);
        let h = signed(&op, "POST", "/v1/admin/revoke", b"{}", NOW, 1);
        assert_eq!(
            check(&gate, &h, "POST", "/v1/admin/revoke", b"{}").unwrap(),
            op.public_key()
        );
        assert!(is_refused(
            check(&gate, &h, "POST", "/v1/admin/revoke", b"{}"),
            OperatorRefused::Replayed
        ));
        // Another nonce is another request.
        let h2 = signed(&op, "POST", "/v1/admin/revoke", b"{}", NOW, 2);
        assert!(check(&gate, &h2, "POST", "/v1/admin/revoke", b"{}").is_ok());
        assert_eq!(gate.remembered(), 2);
    }

    #[test]
    fn wrong_method_path_query_body_or_key_is_forged() {
        let op = key(1);
        let gate = OperatorGate::new(vec![op.public_key()]);
        let h = signed(
            &op,
            "POST",
            "/v1/admin/blacklist?x=1",
            b"{\"serial\":\"00\"}",
            NOW,
            1,
        );
        for (m, p, b) in [
            (
                "GET",
                "/v1/admin/blacklist?x=1",
                &b"{\"serial\":\"00\"}"[..],
            ),
            ("POST", "/v1/admin/revoke?x=1", &b"{\"serial\":\"00\"}"[..]),
            (
                "POST",
                "/v1/admin/blacklist?x=2",
                &b"{\"serial\":\"00\"}"[..],
            ),
            (
                "POST",
                "/v1/admin/blacklist?x=1",
                &b"{\"serial\":\"01\"}"[..],
            ),
            ("POST", "/v1/admin/blacklist?x=1", &b""[..]),
        ] {
            assert!(
                is_refused(check(&gate, &h, m, p, b), OperatorRefused::Forged),
                "{m} {p}"
            );
        }
        // A different time in the header than the one signed.
        let c = Credential::sign(&op, "GET", "/v1/admin/log", b"", NOW, [7; NONCE_LEN]);
        let moved = Credential {
            timestamp: NOW + 1,
            ..c.clone()
        };
        assert!(is_refused(
            check(&gate, &moved.header(), "GET", "/v1/admin/log", b""),
            OperatorRefused::Forged
        ));
        // Another key's signature under the operator's name.
        let forged = Credential {
            signature: Credential::sign(&key(2), "GET", "/v1/admin/log", b"", NOW, [7; NONCE_LEN])
                .signature,
            ..c.clone()
        };
        assert!(is_refused(
            check(&gate, &forged.header(), "GET", "/v1/admin/log", b""),
            OperatorRefused::Forged
        ));
        // Refused attempts did not use the nonce up: the genuine request still passes.
        assert!(check(&gate, &c.header(), "GET", "/v1/admin/log", b"").is_ok());
    }

    #[test]
    fn time_outside_the_window_is_expired() {
        let op = key(1);
        let gate = OperatorGate::new(vec![op.public_key()]);
        for (ts, ok) in [
            (NOW - MAX_SKEW_SECS - 1, false),
            (NOW + MAX_SKEW_SECS + 1, false),
            (NOW - MAX_SKEW_SECS, true),
            (NOW + MAX_SKEW_SECS, true),
        ] {
            let h = signed(&op, "GET", "/v1/admin/log", b"", ts, (ts % 251) as u8);
            let r = check(&gate, &h, "GET", "/v1/admin/log", b"");
            if ok {
                assert!(r.is_ok(), "{ts}");
            } else {
                assert!(
                    is_refused(
                        r,
                        OperatorRefused::Expired {
                            signed_at: ts,
                            now: NOW
                        }
                    ),
                    "{ts}"
                );
            }
        }
    }

    #[test]
    fn a_stranger_is_not_an_operator_and_garbage_is_unauthorized() {
        let op = key(1);
        let gate = OperatorGate::new(vec![op.public_key()]);
        let stranger = key(9);
        let h = signed(&stranger, "GET", "/v1/admin/log", b"", NOW, 1);
        assert!(is_refused(
            check(&gate, &h, "GET", "/v1/admin/log", b""),
            OperatorRefused::NotOperator(stranger.public_key().to_address())
        ));
        assert!(matches!(
            gate.check(None, "GET", "/v1/admin/log", b"", NOW),
            Err(NodeError::Unauthorized(Unauthorized::Missing))
        ));
        let good = signed(&op, "GET", "/v1/admin/log", b"", NOW, 1);
        for bad in [
            "Bearer abc".to_string(),
            good.replace(" v1 ", " v2 "),
            good.replacen(&NOW.to_string(), "soon", 1),
            format!("{good} extra"),
            good[..good.len() - 2].to_string(),
        ] {
            assert!(
                matches!(
                    check(&gate, &bad, "GET", "/v1/admin/log", b""),
                    Err(NodeError::Unauthorized(Unauthorized::Malformed(_)))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            gate.check(Some(&[0xff, 0xfe]), "GET", "/", b"", NOW),
            Err(NodeError::Unauthorized(Unauthorized::Malformed(_)))
        ));
    }

    #[test]
    fn nonces_are_forgotten_after_the_window_and_bounded() {
        let op = key(1);
        let gate = OperatorGate::new(vec![op.public_key()]);
        let h = signed(&op, "GET", "/v1/admin/log", b"", NOW, 1);
        assert!(check(&gate, &h, "GET", "/v1/admin/log", b"").is_ok());
        // Once the credential expired its nonce is forgotten; the credential itself is refused
        // as expired, so forgetting never lets a replay through.
        let later = NOW + 2 * MAX_SKEW_SECS + 1;
        let h2 = signed(&op, "GET", "/v1/admin/log", b"", later, 2);
        assert!(gate
            .check(Some(h2.as_bytes()), "GET", "/v1/admin/log", b"", later)
            .is_ok());
        assert_eq!(gate.remembered(), 1);
        assert!(matches!(
            gate.check(Some(h.as_bytes()), "GET", "/v1/admin/log", b"", later),
            Err(NodeError::Forbidden(Forbidden::Operator(
                OperatorRefused::Expired { .. }
            )))
        ));
        // At most `capacity` nonces within the window: the next is refused (429), not kept.
        let small = OperatorGate::with_capacity(vec![op.public_key()], 2);
        for n in 1..=2 {
            let h = signed(&op, "GET", "/v1/admin/log", b"", NOW, n);
            assert!(check(&small, &h, "GET", "/v1/admin/log", b"").is_ok());
        }
        let h3 = signed(&op, "GET", "/v1/admin/log", b"", NOW, 3);
        assert!(matches!(
            check(&small, &h3, "GET", "/v1/admin/log", b""),
            Err(NodeError::Full(Full::OperatorNonces { max: 2 }))
        ));
        assert_eq!(small.remembered(), 2);
    }
}
