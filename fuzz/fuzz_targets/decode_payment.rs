//! Any bytes: payment and request decoding never panic, and round-trip exactly.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = florin_token::Payment::decode(data) {
        assert_eq!(p.encode(), data);
    }
    if let Ok(r) = florin_token::PaymentRequest::decode(data) {
        assert_eq!(r.encode(), data);
    }
});
