//! The signer trait: protocol code asks for signatures without holding keys.
//!
//! The authority's token-signing key, the issuer's minting key and custodial wallet keys all
//! sign through [`Signer`], so the in-process [`LocalSigner`] can be replaced by a threshold
//! network or an HSM without touching protocol code. A threshold signer's output verifies
//! exactly like an ordinary signature.

use thiserror::Error;

use crate::keys::{PublicKey, SecretKey, Signature};

/// Why a signer could not sign.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SignerError {
    /// The signer (a remote network, a device) is unreachable or refused.
    #[error("signer unavailable: {0}")]
    Unavailable(String),
}

/// Something that signs with one key.
pub trait Signer: Send + Sync {
    /// The key signatures verify under.
    fn public_key(&self) -> PublicKey;
    /// Signs `msg`.
    fn sign(&self, msg: &[u8]) -> Result<Signature, SignerError>;
}

/// A signer holding its secret key in process memory.
#[derive(Debug, Clone)]
pub struct LocalSigner {
    secret: SecretKey,
    public: PublicKey,
}

impl LocalSigner {
    /// Wraps a secret key.
    pub fn new(secret: SecretKey) -> Self {
        let public = secret.public_key();
        LocalSigner { secret, public }
    }

    /// The wrapped secret key.
    pub fn secret(&self) -> &SecretKey {
        &self.secret
    }
}

impl Signer for LocalSigner {
    fn public_key(&self) -> PublicKey {
        self.public
    }

    fn sign(&self, msg: &[u8]) -> Result<Signature, SignerError> {
        Ok(self.secret.sign(msg))
    }
}
