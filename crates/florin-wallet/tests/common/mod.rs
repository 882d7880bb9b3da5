//! What the wallet's test files share: the authority played by a local signer, and a wallet
//! holding freshly issued tokens.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_token::{Denomination, Token};
use florin_wallet::Wallet;
use rand::rngs::StdRng;

/// The test authority.
pub fn authority() -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[250; 32]))
}

/// A wallet trusting [`authority`] and holding one issued token per denomination.
pub fn funded(rng: &mut StdRng, denoms: &[Denomination]) -> Wallet {
    let auth = authority();
    let mut w = Wallet::generate(rng, Some(auth.public_key()));
    let hs = Wallet::fresh_handshake(rng);
    let tokens: Vec<Token> = denoms
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut serial = [0u8; 8];
            serial[..4].copy_from_slice(&(i as u32).to_le_bytes());
            serial[7] = w.public_key().0[0];
            Token::mint(&auth, serial, *d, [i as u8; 64], w.public_key(), hs).unwrap()
        })
        .collect();
    w.accept_issued(tokens, &hs, rng).unwrap();
    w
}
