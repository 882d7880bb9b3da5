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
pub const MAX_NONCES: usize = 1 << 19;
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

/// Most nonces remembered for one account at once: one caller that signs requests as fast
/// as it can fills its own memory, never the others'.
pub const MAX_NONCES_PER_CALLER: usize = 16_384;
/// Most nonces remembered for one configured peer provider: a busy peer makes two signed
/// calls per payment (Filia's announcement and the hand-over), so this allows about 435 a
/// second over the window (2 × [`MAX_SKEW_SECS`]).
pub const MAX_NONCES_PER_PEER: usize = 1 << 17;
/// Nonces a caller may always have remembered, even once the memory holds [`MAX_NONCES`]:
/// callers that fill the memory together are refused beyond their share, light callers never.
pub const FAIR_SHARE: usize = 256;

/// Which kind of caller signs: accounts and peer providers have separate memories, so an
/// account named like a peer cannot use up the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Caller {
    /// A customer, by account name (also an account being opened).
    Account,
    /// A peer provider, by its configured id.
    Peer,
}

/// Nonces seen within the time window, per caller.
#[derive(Default)]
pub(super) struct Replay {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Per caller (kind and `who`): nonce → when it may be forgotten.
    by_caller: HashMap<(Caller, String), HashMap<[u8; 16], u64>>,
    /// Nonces in all.
    total: usize,
}

impl Seen {
    /// Forgets one caller's expired nonces.
    fn sweep_one(&mut self, key: &(Caller, String), t: u64) {
        if let Some(nonces) = self.by_caller.get_mut(key) {
            let before = nonces.len();
            nonces.retain(|_, exp| *exp > t);
            self.total -= before - nonces.len();
            if nonces.is_empty() {
                self.by_caller.remove(key);
            }
        }
    }

    /// Forgets every caller's expired nonces.
    fn sweep_all(&mut self, t: u64) {
        let mut dropped = 0;
        for nonces in self.by_caller.values_mut() {
            let before = nonces.len();
            nonces.retain(|_, exp| *exp > t);
            dropped += before - nonces.len();
        }
        self.by_caller.retain(|_, n| !n.is_empty());
        self.total -= dropped;
    }

    fn held(&self, key: &(Caller, String)) -> usize {
        self.by_caller.get(key).map_or(0, HashMap::len)
    }
}

impl Replay {
    /// Checks `req`'s header: signed by `key` as `who`, fresh, not replayed. The nonce is
    /// remembered only once the signature verified.
    pub(super) fn check(
        &self,
        req: &CallerRequest<'_>,
        kind: Caller,
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
        let full = || {
            PspError::Unresolved(
                "too many signed requests in the last minutes; retry shortly".into(),
            )
        };
        let caller = (kind, who.to_string());
        let cap = match kind {
            Caller::Account => MAX_NONCES_PER_CALLER,
            Caller::Peer => MAX_NONCES_PER_PEER,
        };
        if seen.held(&caller) >= cap {
            seen.sweep_one(&caller, t);
            if seen.held(&caller) >= cap {
                return Err(full());
            }
        }
        // A full memory refuses only callers beyond their fair share: many callers filling it
        // together cannot lock the light ones out. (Memory stays bounded: the fair shares of
        // the callers seen within the window, each of which had to be opened or configured.)
        if seen.total >= MAX_NONCES && seen.held(&caller) >= FAIR_SHARE {
            seen.sweep_all(t);
            if seen.total >= MAX_NONCES && seen.held(&caller) >= FAIR_SHARE {
                return Err(full());
            }
        }
        let fresh = seen
            .by_caller
            .entry(caller)
            .or_default()
            .insert(s.nonce, s.ts + MAX_SKEW_SECS + 1)
            .is_none();
        if !fresh {
            return Err(PspError::Unauthorized("replayed request".into()));
        }
        seen.total += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(header: &'a str) -> CallerRequest<'a> {
        CallerRequest {
            method: "GET",
            path: "/x",
            body: &[],
            header: Some(header),
        }
    }

    #[test]
    fn one_caller_fills_only_its_own_memory_and_replays_are_refused() {
        let replay = Replay::default();
        let (a, b) = (
            SecretKey::from_seed(&[1; 32]),
            SecretKey::from_seed(&[2; 32]),
        );
        let signed = |key: &SecretKey, who: &str| SignedRequest::header(key, who, "GET", "/x", &[]);
        for _ in 0..MAX_NONCES_PER_CALLER {
            replay
                .check(
                    &request(&signed(&a, "mallory")),
                    Caller::Account,
                    "mallory",
                    &a.public_key(),
                )
                .unwrap();
        }
        let err = replay
            .check(
                &request(&signed(&a, "mallory")),
                Caller::Account,
                "mallory",
                &a.public_key(),
            )
            .unwrap_err();
        assert!(matches!(err, PspError::Unresolved(_)), "{err}");
        // Another caller is not affected; a replay of its request is refused.
        let h = signed(&b, "alice");
        replay
            .check(&request(&h), Caller::Account, "alice", &b.public_key())
            .unwrap();
        let err = replay
            .check(&request(&h), Caller::Account, "alice", &b.public_key())
            .unwrap_err();
        assert!(matches!(err, PspError::Unauthorized(_)), "{err}");
        // A forged request is refused and remembers nothing.
        let before = replay.seen.lock().unwrap().total;
        let forged = signed(&a, "alice");
        assert!(replay
            .check(&request(&forged), Caller::Account, "alice", &b.public_key())
            .is_err());
        assert_eq!(replay.seen.lock().unwrap().total, before);
        // An account named like a peer has its own memory: the peer `mallory` is not full.
        replay
            .check(
                &request(&signed(&a, "mallory")),
                Caller::Peer,
                "mallory",
                &a.public_key(),
            )
            .unwrap();
    }
}
