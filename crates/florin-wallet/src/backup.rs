//! Backup words: a wallet's every key derives from 12 BIP39 words (English list, 128 bits of
//! entropy plus a 4-bit checksum), so the words alone rebuild its keys on another machine.
//!
//! ```text
//! words ──BIP39 (PBKDF2-HMAC-SHA512, 2048 rounds, empty passphrase)──▶ 64-byte seed
//! seed  ──H("florin/wallet/master/v1", seed)──▶ the wallet's master key (its address)
//! master ──derive("florin/wallet/ledger", i)──▶ the key of the i-th change output
//! ```
//!
//! The BIP39 "25th word" passphrase is not used: the wallet file's own passphrase
//! ([`crate::store`]) protects the file, and a second secret to remember for the backup is a
//! second way to lose the money.
//!
//! The words restore **keys**, not everything a wallet held: see [`crate::flows::Flows::restore`]
//! for what comes back and what cannot.

use std::fmt;

use florin_crypto::SecretKey;
use rand::{CryptoRng, RngCore};
use thiserror::Error;
use zeroize::{Zeroize, Zeroizing};

/// How many words a backup has.
pub const WORD_COUNT: usize = 12;
/// The domain of the master key's derivation from the BIP39 seed.
pub const MASTER_DOMAIN: &str = "florin/wallet/master/v1";

/// Why some text is not a wallet's backup words. The words themselves are never repeated in
/// an error (errors end up in logs and terminals' scrollback).
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackupError {
    /// Not 12 words.
    #[error("a backup has {WORD_COUNT} words; this has {0}")]
    WordCount(usize),
    /// A word not in the BIP39 English list.
    #[error("word {0} is not in the BIP39 English word list (check its spelling)")]
    UnknownWord(usize),
    /// The words' checksum does not match: a word is wrong or two are swapped.
    #[error("the words' checksum does not match: a word is wrong, or two are in the wrong order")]
    Checksum,
}

/// A wallet's backup words, normalised (lower case, single spaces), with the BIP39 seed they
/// stand for. Zeroised on drop and redacted in `Debug`.
#[derive(Clone)]
pub struct Words {
    phrase: Zeroizing<String>,
    seed: Zeroizing<[u8; 64]>,
}

impl fmt::Debug for Words {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Words(<redacted>)")
    }
}

impl Words {
    /// Fresh words from `rng`.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Words {
        let mut entropy = Zeroizing::new([0u8; 16]);
        loop {
            rng.fill_bytes(entropy.as_mut());
            // 16 bytes is a valid BIP39 entropy length: the first round returns.
            if let Ok(m) = bip39::Mnemonic::from_entropy(entropy.as_ref()) {
                return Words::of(&m);
            }
        }
    }

    fn of(m: &bip39::Mnemonic) -> Words {
        Words {
            phrase: Zeroizing::new(m.to_string()),
            seed: Zeroizing::new(m.to_seed_normalized("")),
        }
    }

    /// Parses words typed or read from a file: any whitespace between them, any case.
    pub fn parse(text: &str) -> Result<Words, BackupError> {
        let lower: Zeroizing<Vec<String>> =
            Zeroizing::new(text.split_whitespace().map(str::to_lowercase).collect());
        let normal = Zeroizing::new(lower.join(" "));
        let count = normal.split(' ').filter(|w| !w.is_empty()).count();
        if count != WORD_COUNT {
            return Err(BackupError::WordCount(count));
        }
        match bip39::Mnemonic::parse_in_normalized(bip39::Language::English, &normal) {
            Ok(m) => Ok(Words::of(&m)),
            Err(bip39::Error::UnknownWord(i)) => Err(BackupError::UnknownWord(i + 1)),
            Err(bip39::Error::BadWordCount(n)) => Err(BackupError::WordCount(n)),
            Err(_) => Err(BackupError::Checksum),
        }
    }

    /// The words, separated by single spaces. Handle with care.
    pub fn phrase(&self) -> &str {
        &self.phrase
    }

    /// The wallet's master key.
    pub fn master_key(&self) -> SecretKey {
        let mut key = florin_crypto::hash(MASTER_DOMAIN, &[self.seed.as_ref()]);
        let secret = SecretKey::from_seed(&key);
        key.zeroize();
        secret
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn words_round_trip_and_derive_one_key() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let w = Words::generate(&mut rng);
        assert_eq!(w.phrase().split(' ').count(), WORD_COUNT);
        let again = Words::parse(&format!("  {}\n", w.phrase().to_uppercase())).unwrap();
        assert_eq!(again.phrase(), w.phrase());
        assert_eq!(again.master_key().public_key(), w.master_key().public_key());
        assert_eq!(format!("{w:?}"), "Words(<redacted>)");
        let other = Words::generate(&mut rng);
        assert_ne!(other.master_key().public_key(), w.master_key().public_key());
    }

    #[test]
    fn the_bip39_test_vector_gives_a_fixed_key() {
        // BIP39's first English vector (entropy 00…00): its words are a valid backup, and
        // the key they derive never changes (a change would strand every backup).
        let w = Words::parse(
            "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon \
             abandon about",
        )
        .unwrap();
        assert_eq!(
            hex::encode(w.master_key().public_key().0),
            "716eccd5b3f11a62f9b8540859d0d27ea589ec7aaeef3785e5cdac3414597cf6"
        );
    }

    #[test]
    fn wrong_words_are_refused_without_repeating_them() {
        assert_eq!(
            Words::parse("abandon abandon").unwrap_err(),
            BackupError::WordCount(2)
        );
        let e = Words::parse(
            "abandon abandon abandon abandon abandon zzzsecret abandon abandon abandon abandon \
             abandon about",
        )
        .unwrap_err();
        assert_eq!(e, BackupError::UnknownWord(6));
        assert!(!e.to_string().contains("zzzsecret"));
        // Twelve listed words whose checksum fails.
        assert_eq!(
            Words::parse(
                "abandon abandon abandon abandon abandon abandon abandon abandon abandon \
                 abandon abandon abandon"
            )
            .unwrap_err(),
            BackupError::Checksum
        );
        assert_eq!(Words::parse("").unwrap_err(), BackupError::WordCount(0));
    }
}
