//! `florin_fuzz_targets::wallet_file::wallet_file` — see docs/fuzzing.md.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| florin_fuzz_targets::wallet_file::wallet_file(data));
