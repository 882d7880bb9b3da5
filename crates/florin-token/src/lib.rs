//! Offline cash (thesis section IV): fixed-denomination tokens carrying a chain of signatures,
//! spendable device to device with no network, and the authority's side — verification,
//! double-spend detection, fraud proofs and re-anchoring.
//!
//! This crate does no I/O, spawns no threads and never reads the clock; keys sign through
//! [`florin_crypto::Signer`] and randomness is passed in.
//!
//! # Chain of proofs
//! A token's first link is the *anchor*: the authority signs
//! `(version, serial, value, authority, nonce, recipient, handshake)`. Every later link is
//! signed by the previous link's recipient over `(serial, previous proof, recipient,
//! handshake)`. The handshake is a fresh random nonce chosen by the payee (replay prevention,
//! IV-G), so a payee can tell a new payment from a replayed one.

pub mod amount;
pub mod authority;
mod codec;
mod denomination;
pub mod fraud;
pub mod payment;
pub mod registry;
mod token;
pub mod verify;

pub use codec::DecodeError;
pub use denomination::Denomination;
pub use fraud::{FraudProof, FraudProofError};
pub use payment::{Payment, PaymentRequest};
pub use token::{Handshake, Link, MintNonce, Serial, Token, TransferError, TOKEN_VERSION};
pub use verify::{ClientPolicy, TokenError};
