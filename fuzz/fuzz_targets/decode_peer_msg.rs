//! `florin_fuzz_targets::decoders::decode_peer_msg` — see docs/fuzzing.md.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| florin_fuzz_targets::decoders::decode_peer_msg(data));
