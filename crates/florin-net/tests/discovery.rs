//! Local discovery over UDP multicast (loopback delivery of the group).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_net::discovery::{discover, Announcer};

#[test]
fn a_listening_wallet_is_found_by_its_key() {
    let key = LocalSigner::new(SecretKey::from_seed(&[5; 32])).public_key();
    let at = "127.0.0.1:45123".parse().unwrap();
    let _a = Announcer::start(key, at, None).unwrap();
    let found = discover(Duration::from_secs(5), Some(key)).unwrap();
    assert!(found.contains(&(key, at)), "{found:?}");
}
