//! The bodies of Florin's fuzz targets, in a normal library so that they build on stable Rust.
//!
//! The cargo-fuzz binaries in `fuzz/fuzz_targets/` call these functions (with libFuzzer and
//! sanitizers, on nightly); `tests/replay.rs` runs every kept input of `fuzz/corpus/<target>/`
//! and `fuzz/regressions/<target>/` through the same functions on stable, as part of
//! `cargo test --workspace`. A target panics (an assertion) when it finds a defect: a decoder
//! that panics, a value that does not round-trip, a state machine that breaks its model.
//!
//! [`TARGETS`] lists them all; `docs/fuzzing.md` says what each checks. Nothing in the
//! workspace may depend on this crate.

pub mod cluster_model;
pub mod decoders;
pub mod deposit;
mod input;
pub mod noise_channel;
pub mod payee;
pub mod seeds;
pub mod wallet_file;

pub use input::Input;

/// A fuzz target: takes any bytes, panics on a defect.
pub type Target = fn(&[u8]);

/// Every target by name (the name of its cargo-fuzz binary and of its corpus directory).
pub const TARGETS: &[(&str, Target)] = &[
    ("decode_token", decoders::decode_token),
    ("decode_payment", decoders::decode_payment),
    ("decode_fraud_proof", decoders::decode_fraud_proof),
    ("decode_tx", decoders::decode_tx),
    ("decode_batch", decoders::decode_batch),
    ("decode_deposit", decoders::decode_deposit),
    ("decode_shard_msg", decoders::decode_shard_msg),
    ("decode_cluster_rpc", decoders::decode_cluster_rpc),
    ("decode_custody_wire", decoders::decode_custody_wire),
    ("decode_peer_msg", decoders::decode_peer_msg),
    ("decode_qr", decoders::decode_qr),
    ("decode_sealed", decoders::decode_sealed),
    ("decode_handoff", decoders::decode_handoff),
    ("wallet_file", wallet_file::wallet_file),
    ("cluster_model", cluster_model::cluster_model),
    ("deposit", deposit::deposit),
    ("noise_channel", noise_channel::noise_channel),
    ("payee", payee::payee),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}
