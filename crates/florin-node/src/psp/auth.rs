//! Who is calling: customers sign every request with the key their device holds (bound to
//! their account when it was opened), and providers sign `receive` with their peer key.
//!
//! The header `florin-auth: v1 WHO TS NONCE SIG`: `WHO` the account name (customers) or the
//! provider's name (peers), `TS` unix seconds, `NONCE` 16 random bytes in hex, `SIG` the
//! Ed25519 signature (hex) over `H("florin/psp/request/v1", WHO ‖ 0 ‖ METHOD ‖ 0 ‖
//! PATH-AND-QUERY ‖ 0 ‖ TS (8, LE) ‖ NONCE ‖ H("florin/psp/request-body/v1", BODY))`. A request more than
//! [`MAX_SKEW_SECS`] away from the provider's clock, or whose nonce was seen within that
//! window, is refused; the provider remembers at most [`MAX_NONCES`] nonces.

use std::collections::HashMap;
use std::sync::Mutex;

use florin_crypto::{hash, Digest, PublicKey, SecretKey, Signature};
use rand::RngCore;

use super::PspError;

/// The request header carrying the signature.
pub const AUTH_HEADER: &str = "florin-auth";
/// Most seconds between the caller's timestamp and the provider's clock.
pub const MAX_SKEW_SECS: u64 = 300;
/// Most request nonces remembered (each for 2 × [`MAX_SKEW_SECS`]).
pub const MAX_NONCES: usize = 1 << 18;
const DOMAIN: &str = "florin/psp/request/v1";

/// A parsed `florin-auth` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRequest {
    /// The account or provider name that signs.
    pub who: String,
    /// Unix seconds.
    pub ts: u64,
    /// Fresh per request.
    pub nonce: [u8; 16],
    /// Over [`SignedRequest::digest`].
    pub sig: Signature,
}

fn now() -> u64 {
    super::store::now()
}

impl SignedRequest {
    /// What is signed.
    pub fn digest(
        who: &str,
        ts: u64,
        nonce: &[u8; 16],
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Digest {
        let body_hash = hash("florin/psp/request-body/v1", &[body]);
        hash(
            DOMAIN,
            &[
                who.as_bytes(),
                &[0],
                method.as_bytes(),
                &[0],
                path.as_bytes(),
                &[0],
                &ts.to_le_bytes(),
                nonce,
                &body_hash,
            ],
        )
    }

    /// The header value for a request `method path` with `body`, signed by `key` as `who`.
    pub fn header(key: &SecretKey, who: &str, method: &str, path: &str, body: &[u8]) -> String {
        let mut nonce = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let ts = now();
        let sig = key.sign(&Self::digest(who, ts, &nonce, method, path, body));
        format!(
            "v1 {who} {ts} {} {}",
            hex::encode(nonce),
            hex::encode(sig.0)
        )
    }

    /// Parses a header value.
    pub fn parse(h: &str) -> Result<SignedRequest, PspError> {
        let bad = || PspError::Unauthorized(format!("malformed {AUTH_HEADER} header"));
        let f: Vec<&str> = h.split(' ').collect();
        let ["v1", who, ts, nonce, sig] = f.as_slice() else {
            return Err(bad());
        };
        Ok(SignedRequest {
            who: who.to_string(),
            ts: ts.parse().map_err(|_| bad())?,
            nonce: hex::decode(nonce)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?,
            sig: Signature(
                hex::decode(sig)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(bad)?,
            ),
        })
    }
}

/// One HTTP request as the handler saw it, for checking its signature.
pub struct CallerRequest<'a> {
    /// `GET`, `POST`.
    pub method: &'a str,
    /// Path and query as sent.
    pub path: &'a str,
    /// The raw body.
    pub body: &'a [u8],
    /// The `florin-auth` header, if any.
    pub header: Option<&'a str>,
}

/// Nonces seen within the time window.
#[derive(Default)]
pub(super) struct Replay {
    seen: Mutex<HashMap<[u8; 16], u64>>,
}

impl Replay {
    /// Checks `req`'s header: signed by `key` as `who`, fresh, not replayed.
    pub(super) fn check(
        &self,
        req: &CallerRequest<'_>,
        who: &str,
        key: &PublicKey,
    ) -> Result<(), PspError> {
        let h = req
            .header
            .ok_or_else(|| PspError::Unauthorized(format!("no {AUTH_HEADER} header")))?;
        let s = SignedRequest::parse(h)?;
        if s.who != who {
            return Err(PspError::Forbidden(format!(
                "signed as {:?}, the request is for {who:?}",
                s.who
            )));
        }
        let t = now();
        if s.ts.abs_diff(t) > MAX_SKEW_SECS {
            return Err(PspError::Unauthorized(format!(
                "request time {} is more than {MAX_SKEW_SECS} s from the provider's {t}",
                s.ts
            )));
        }
        let d = SignedRequest::digest(who, s.ts, &s.nonce, req.method, req.path, req.body);
        florin_crypto::verify(key, &d, &s.sig)
            .map_err(|_| PspError::Unauthorized("bad request signature".into()))?;
        let mut seen = match self.seen.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if seen.len() >= MAX_NONCES {
            seen.retain(|_, exp| *exp > t);
            if seen.len() >= MAX_NONCES {
                return Err(PspError::Unresolved(
                    "too many signed requests in the last minutes; retry shortly".into(),
                ));
            }
        }
        if seen.insert(s.nonce, s.ts + MAX_SKEW_SECS + 1).is_some() {
            return Err(PspError::Unauthorized("replayed request".into()));
        }
        Ok(())
    }
}
