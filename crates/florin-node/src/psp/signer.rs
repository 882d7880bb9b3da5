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
            KeySigner::P256(s) => {
                // A note key's witness names the note key.
                let key = match &authz.tweak {
                    Some(t) => s.note_public(t).map_err(PspError::from)?,
                    None => P256Signer::public_key(s),
                };
                Witness::p256(key, s.sign_authorized(txid, authz).map_err(PspError::from)?)
            }
            KeySigner::Ed25519(_) if authz.uses_notes() => {
                return Err(PspError::Storage(
                    "an Ed25519 account has no note keys".into(),
                ))
            }
            KeySigner::Ed25519(s) => Witness::ed25519(
                Signer::public_key(s.as_ref()),
                s.sign_authorized(txid, authz).map_err(PspError::from)?,
            ),
        })
    }

    /// Whether the account's money is kept as notes under keys of their own (Filia's note
    /// model): DKLs23 keys, which sign as their note keys.
    pub(super) fn uses_notes(&self) -> bool {
        matches!(self, KeySigner::P256(s) if s.engine() == crate::custody::EcdsaEngine::Dkls23)
    }

    pub(super) fn ready(&self) -> Option<usize> {
        match self {
            KeySigner::P256(s) => Some(s.ready()),
            KeySigner::Ed25519(_) => None,
        }
    }
}
