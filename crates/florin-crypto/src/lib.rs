//! Florin's cryptography: Ed25519 keys and signatures under one validity rule shared by the
//! single and batch verification paths, domain-separated SHA-256, bech32m addresses and the
//! [`Signer`] trait that lets a key live outside the process (a threshold network, an HSM).
//! ECDSA on P-256 ([`mod@p256`]), for custodial wallets whose keys a threshold network holds,
//! has its own low-S validity rule and is verified one signature at a time.
//!
//! This crate does no I/O, spawns no threads and never reads the clock. Randomness is passed in
//! by the caller.
//!
//! # The validity rule
//! A signature `(R, s)` by key `A` on message `M` is valid when, and only when:
//! 1. `A` and `R` are canonical encodings of curve points (y < p, and decompression succeeds);
//! 2. neither `A` nor `R` has small order (order dividing 8);
//! 3. `s` is a canonical scalar (s < ℓ);
//! 4. the *cofactored* equation `[8]([s]B − R − [k]A) = 0` holds, with
//!    `k = SHA-512(R ‖ A ‖ M) mod ℓ`.
//!
//! Checks 1–3 are byte-level and deterministic; check 4 is the equation ZIP-215 uses. Because
//! the batch path checks the same cofactored equation (a random linear combination of it), a
//! signature is accepted by [`verify`] exactly when it is accepted inside any batch by
//! [`BatchVerifier`] — up to a 2⁻¹²⁸ chance of a batch accepting a bad signature. A wallet and
//! the authority therefore never disagree about a signature, which is not true of
//! `ed25519-dalek`'s `verify` versus `verify_batch` on crafted mixed-order signatures.

mod address;
pub mod codec;
mod hash;
mod keys;
pub mod p256;
pub mod sealed;
mod signer;
mod verify;

pub use address::{AddressError, ADDRESS_HRP};
pub use hash::{hash, Digest, Hasher};
pub use keys::{KeyError, PublicKey, SecretKey, Signature};
pub use p256::{
    verify as verify_p256, P256Error, P256PublicKey, P256SecretKey, P256Signature, P256Signer,
};
pub use signer::{LocalSigner, Signer, SignerError};
pub use verify::{verify, BatchVerifier, SignatureError};
