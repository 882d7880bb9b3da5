//! An account's signer: the network's threshold signer for the account's key.

use florin_crypto::p256::P256Signer;
use florin_crypto::{Digest, Signer};
use florin_ledger::Witness;

use super::PspError;
use crate::custody::{EcdsaSigner, ThresholdSigner};

/// An account's signer.
pub(super) enum KeySigner {
    P256(EcdsaSigner),
    Ed25519(Box<ThresholdSigner>),
}

impl KeySigner {
    /// The witness of a customer's payment: the nodes check `authz` before they sign.
    pub(super) fn witness_authorized(
        &self,
        txid: &Digest,
        authz: &florin_custody::authz::Authorization,
    ) -> Result<Witness, PspError> {
        Ok(match self {
            KeySigner::P256(s) => Witness::p256(
                P256Signer::public_key(s),
                s.sign_authorized(txid, authz).map_err(PspError::from)?,
            ),
            KeySigner::Ed25519(s) => Witness::ed25519(
                Signer::public_key(s.as_ref()),
                s.sign_authorized(txid, authz).map_err(PspError::from)?,
            ),
        })
    }

    pub(super) fn ready(&self) -> Option<usize> {
        match self {
            KeySigner::P256(s) => Some(s.ready()),
            KeySigner::Ed25519(_) => None,
        }
    }
}
