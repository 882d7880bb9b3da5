//! Key shares encrypted at rest: ChaCha20-Poly1305 under a 32-byte key-encryption key, with
//! the share's name as associated data so a file cannot be swapped for another key's share.
//! Format: `version (1) ‖ nonce (12) ‖ ciphertext with tag`.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::{CryptoRng, RngCore};
use zeroize::Zeroizing;

use crate::CustodyError;

const VERSION: u8 = 1;

/// Encrypts `plaintext` under `kek`, bound to `name`.
pub fn seal<R: RngCore + CryptoRng>(
    kek: &[u8; 32],
    name: &str,
    plaintext: &[u8],
    rng: &mut R,
) -> Result<Vec<u8>, CustodyError> {
    let mut nonce = [0u8; 12];
    rng.fill_bytes(&mut nonce);
    let cipher = ChaCha20Poly1305::new(Key::from_slice(kek));
    let ct = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plaintext,
                aad: name.as_bytes(),
            },
        )
        .map_err(|_| CustodyError::Sealed(name.to_string()))?;
    let mut out = Vec::with_capacity(1 + 12 + ct.len());
    out.push(VERSION);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Decrypts [`seal`]'s output; any change, another key or another name fails.
pub fn open(kek: &[u8; 32], name: &str, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, CustodyError> {
    if sealed.len() < 1 + 12 + 16 || sealed[0] != VERSION {
        return Err(CustodyError::Sealed(name.to_string()));
    }
    let cipher = ChaCha20Poly1305::new(Key::from_slice(kek));
    cipher
        .decrypt(
            Nonce::from_slice(&sealed[1..13]),
            Payload {
                msg: &sealed[13..],
                aad: name.as_bytes(),
            },
        )
        .map(Zeroizing::new)
        .map_err(|_| CustodyError::Sealed(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::OsRng;

    #[test]
    fn round_trip_and_refusals() -> Result<(), CustodyError> {
        let kek = [7u8; 32];
        let s = seal(&kek, "issuer", b"share bytes", &mut OsRng)?;
        assert_eq!(open(&kek, "issuer", &s)?.as_slice(), b"share bytes");
        assert!(open(&[8u8; 32], "issuer", &s).is_err());
        assert!(open(&kek, "authority", &s).is_err());
        let mut t = s.clone();
        t[20] ^= 1;
        assert!(open(&kek, "issuer", &t).is_err());
        assert!(open(&kek, "issuer", &s[..10]).is_err());
        Ok(())
    }
}
