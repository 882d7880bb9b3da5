//! The one message that binds a withdrawal to whoever paid the reserve.
//!
//! A withdrawal pays the authority's reserve on the ledger and asks for tokens of that value.
//! The request names the recipient of the tokens and the handshake they carry; anyone who saw
//! the paying transaction could name their own. So the key of one of the paying transfer's
//! inputs signs [`withdraw_message`], and the authority mints only against a valid signature.
//! The wallet (which signs) and the authority (which checks) both use this function.

use florin_crypto::{hash, Digest, PublicKey};

/// Domain of [`withdraw_message`].
pub const WITHDRAW_AUTH_DOMAIN: &str = "florin/withdraw/authorize/v1";

/// What the owner of a withdrawal signs: `H("florin/withdraw/authorize/v1", txid ‖ output
/// (u64 little-endian) ‖ recipient key (32 bytes) ‖ handshake (32 bytes))`, Florin's
/// domain-separated SHA-256.
pub fn withdraw_message(
    txid: &Digest,
    output: u64,
    recipient: &PublicKey,
    handshake: &[u8; 32],
) -> Digest {
    hash(
        WITHDRAW_AUTH_DOMAIN,
        &[txid, &output.to_le_bytes(), &recipient.0, handshake],
    )
}
