//! `florin_fuzz_targets::cluster_model::cluster_model` — see docs/fuzzing.md.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| florin_fuzz_targets::cluster_model::cluster_model(data));
