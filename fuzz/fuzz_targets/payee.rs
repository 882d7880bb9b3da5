//! `florin_fuzz_targets::payee::payee` — see docs/fuzzing.md.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| florin_fuzz_targets::payee::payee(data));
