//! Any bytes: fraud-proof decoding and verification never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = florin_token::FraudProof::decode(data) {
        assert_eq!(p.encode(), data);
        let _ = p.verify(None);
    }
});
