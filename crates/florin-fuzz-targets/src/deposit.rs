//! The authority's deposit path (`florin_node::Authority::deposit`) on a real registry in a
//! temporary directory, with token chains the fuzzer builds: tokens minted to three wallets,
//! passed between them (a holder may pass the same token twice: a fork), signed over to the
//! authority and deposited by any wallet, deposited again, deposited with a byte changed, or
//! as bytes that do not decode.
//!
//! Checked: no panic; one report per token; a token is re-anchored at most once per anchor it
//! extends (never credited twice), and only when its chain is one the wallets really signed;
//! "repeated" only for a chain re-anchored before; "double_spend" only when two different
//! chains from the same anchor were deposited; the re-anchored token is held by the depositor
//! with the same value; the registry's anchor count per serial follows the model; deposits
//! never change what was minted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_node::{Authority, AuthorityConfig};
use florin_token::{Serial, Token};

use crate::Input;

const WALLETS: usize = 3;
const MAX_OPS: usize = 40;

#[derive(Clone)]
struct Version {
    token: Token,
    /// Which anchor of its serial it extends (0: the mint).
    anchor: u64,
    /// Whether every byte is as the wallets signed it.
    genuine: bool,
}

fn temp_dir() -> tempfile::TempDir {
    // Memory-backed when the machine has it: the registry syncs every commit.
    let shm = std::path::Path::new("/dev/shm");
    let made = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    };
    match made {
        Ok(d) => d,
        Err(e) => panic!("no temporary directory: {e}"),
    }
}

/// What one run saw: (re-anchored, repeated, double spends, refused).
pub type Seen = (usize, usize, usize, usize);

/// The target.
pub fn deposit(data: &[u8]) {
    let _ = run(data);
}

/// The target's body; returns what it saw (for tests that the checks are reached).
pub fn run(data: &[u8]) -> Seen {
    let mut seen: Seen = (0, 0, 0, 0);
    let mut input = Input::new(data);
    let dir = temp_dir();
    let auth_signer = LocalSigner::new(SecretKey::from_seed(&[41; 32]));
    let auth_key = auth_signer.public_key();
    let config = AuthorityConfig {
        verify_threads: 1,
        ..AuthorityConfig::devnet(dir.path())
    };
    let a = match Authority::open(config, Arc::new(auth_signer)) {
        Ok(a) => a,
        Err(e) => panic!("cannot open an authority: {e}"),
    };
    let wallets: Vec<LocalSigner> = (0..WALLETS)
        .map(|i| LocalSigner::new(SecretKey::from_seed(&[50 + i as u8; 32])))
        .collect();
    let mut versions: Vec<Version> = Vec::new();
    let holders = 1 + input.below(2);
    for (w, wallet) in wallets.iter().enumerate().take(holders) {
        let cents = [500u64, 1200, 50][input.below(3)];
        match a.mint(wallet.public_key(), cents, [w as u8; 32]) {
            Ok(ts) => versions.extend(ts.into_iter().map(|token| Version {
                token,
                anchor: 0,
                genuine: true,
            })),
            Err(e) => panic!("mint failed: {e}"),
        }
    }
    let minted = match a.minted() {
        Ok(m) => m,
        Err(e) => panic!("minted(): {e}"),
    };
    // Re-anchors per serial; anchors credited; chains deposited per (serial, anchor).
    let mut reanchors: HashMap<Serial, u64> = HashMap::new();
    let mut credited: HashSet<(Serial, u64)> = HashSet::new();
    let mut credited_chains: HashSet<Vec<u8>> = HashSet::new();
    let mut deposited: HashMap<(Serial, u64), HashSet<Vec<u8>>> = HashMap::new();
    let holder_signer = |k: &PublicKey| wallets.iter().find(|w| w.public_key() == *k);

    for _ in 0..MAX_OPS {
        if input.is_empty() || versions.len() > 64 {
            break;
        }
        match input.u8() % 4 {
            0 | 1 => {
                // A holder passes a version on, to a wallet or to the authority.
                let v = versions[input.below(versions.len())].clone();
                let Some(holder) = v.token.holder() else {
                    continue;
                };
                let Some(signer) = holder_signer(&holder) else {
                    continue;
                };
                let to = match input.below(WALLETS + 1) {
                    WALLETS => auth_key,
                    k => wallets[k].public_key(),
                };
                let handshake = [input.u8(); 32];
                if let Ok(token) = v.token.transfer(signer, to, handshake) {
                    versions.push(Version { token, ..v });
                }
            }
            _ => {
                // A deposit of up to three versions (as they are, changed, or garbage).
                let depositor = wallets[input.below(WALLETS)].public_key();
                let n = 1 + input.below(3);
                let mut sent: Vec<Option<Version>> = Vec::new();
                let mut tokens = Vec::new();
                for _ in 0..n {
                    let mut v = versions[input.below(versions.len())].clone();
                    match input.u8() % 8 {
                        0 => {
                            // One byte changed.
                            let mut b = v.token.encode();
                            let at = input.below(b.len());
                            b[at] ^= 1 | input.u8();
                            match Token::decode(&b) {
                                Ok(t) => {
                                    v.token = t;
                                    v.genuine = false;
                                    tokens.push(Ok(v.token.clone()));
                                    sent.push(Some(v));
                                }
                                Err(e) => {
                                    tokens.push(Err(e.to_string()));
                                    sent.push(None);
                                }
                            }
                        }
                        1 => {
                            tokens.push(Err("garbage".to_string()));
                            sent.push(None);
                        }
                        _ => {
                            tokens.push(Ok(v.token.clone()));
                            sent.push(Some(v));
                        }
                    }
                }
                for v in sent.iter().flatten() {
                    deposited
                        .entry((v.token.serial, v.anchor))
                        .or_default()
                        .insert(v.token.encode());
                }
                let reports = match a.deposit(&depositor, &tokens) {
                    Ok(r) => r,
                    Err(e) => panic!("a deposit failed as a whole: {e}"),
                };
                assert!(reports.len() == tokens.len(), "one report per token");
                for (r, v) in reports.iter().zip(&sent) {
                    let Some(v) = v else {
                        assert!(
                            r.outcome == "refused",
                            "an undecodable token was not refused"
                        );
                        continue;
                    };
                    let key = (v.token.serial, v.anchor);
                    let chain = v.token.encode();
                    match r.outcome.as_str() {
                        "reanchored" => {
                            seen.0 += 1;
                            assert!(v.genuine, "a damaged token was re-anchored");
                            assert!(
                                v.token.holder() == Some(auth_key),
                                "a token not signed over to the authority was re-anchored"
                            );
                            assert!(credited.insert(key), "a token was credited twice");
                            credited_chains.insert(chain);
                            let n = reanchors.entry(v.token.serial).or_default();
                            *n += 1;
                            let new = r
                                .token
                                .as_deref()
                                .and_then(|h| hex::decode(h).ok())
                                .and_then(|b| Token::decode(&b).ok());
                            let Some(new) = new else {
                                panic!("a re-anchored token does not decode");
                            };
                            assert!(
                                new.holder() == Some(depositor),
                                "re-anchored to someone else"
                            );
                            assert!(new.value == v.token.value, "re-anchored with another value");
                            versions.push(Version {
                                token: new,
                                anchor: *n,
                                genuine: true,
                            });
                        }
                        "repeated" => {
                            seen.1 += 1;
                            assert!(
                                credited_chains.contains(&chain),
                                "repeated, but never credited"
                            );
                        }
                        "double_spend" => {
                            seen.2 += 1;
                            assert!(
                                deposited.get(&key).is_some_and(|c| c.len() > 1),
                                "double spend reported without a fork"
                            );
                        }
                        "refused" => seen.3 += 1,
                        other => panic!("unknown outcome {other}"),
                    }
                }
            }
        }
    }
    for (serial, n) in &reanchors {
        match a.token(serial) {
            Ok(info) => assert!(
                info.anchors as u64 == 1 + n,
                "registry anchors differ from the model"
            ),
            Err(e) => panic!("a deposited token is unknown: {e}"),
        }
    }
    assert!(
        a.minted().ok() == Some(minted),
        "a deposit changed what was minted"
    );
    seen
}

/// An input that reaches every outcome: one wallet is minted 500 (k tokens, versions 0..k);
/// token 0 goes wallet 0 → wallet 1 → the authority and is deposited twice (re-anchored, then
/// repeated); token 1 goes to wallet 1, which passes it to the authority twice with different
/// handshakes (a fork), and both branches are deposited together (one re-anchored, one double
/// spend). A seed, and the test that the checks are reached.
pub fn scripted() -> Vec<u8> {
    let k = florin_token::Denomination::spendable_split(500).len() as u16;
    let u16b = |v: u16| v.to_le_bytes();
    let mut d = Vec::new();
    d.extend(u16b(0)); // one holder
    d.extend(u16b(0)); // 500 cents
    let pass = |d: &mut Vec<u8>, version: u16, to: u16, handshake: u8| {
        d.push(0);
        d.extend(u16b(version));
        d.extend(u16b(to));
        d.push(handshake);
    };
    let deposit = |d: &mut Vec<u8>, versions: &[u16]| {
        d.push(2);
        d.extend(u16b(1)); // depositor: wallet 1
        d.extend(u16b(versions.len() as u16 - 1));
        for v in versions {
            d.extend(u16b(*v));
            d.push(2); // as is
        }
    };
    pass(&mut d, 0, 1, 7); // version k
    pass(&mut d, k, 3, 8); // version k+1, to the authority
    deposit(&mut d, &[k + 1]);
    deposit(&mut d, &[k + 1]);
    // Version k+2 is the re-anchored token 0.
    pass(&mut d, 1, 1, 9); // version k+3
    pass(&mut d, k + 3, 3, 10); // k+4
    pass(&mut d, k + 3, 3, 11); // k+5: the fork
    deposit(&mut d, &[k + 4, k + 5]);
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deposits_reanchor_repeat_and_catch_forks() {
        let (reanchored, repeated, double_spends, _) = run(&scripted());
        assert!(reanchored == 2, "re-anchored {reanchored}");
        assert!(repeated == 1, "repeated {repeated}");
        assert!(double_spends == 1, "double spends {double_spends}");
    }
}
