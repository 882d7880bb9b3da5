//! `florin_fuzz_targets::noise_channel::noise_channel` — see docs/fuzzing.md.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| florin_fuzz_targets::noise_channel::noise_channel(data));
