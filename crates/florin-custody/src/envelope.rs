//! Node-to-node protocol messages, relayed by a coordinator.
//!
//! Key-management nodes talk to each other through the coordinator (a star, as in the source
//! document's KMN). So that the relay cannot forge or read what it carries, every message is
//! signed by its sender's identity key over the session, the step, sender and recipient, and
//! a message that carries a secret share is sealed to its recipient's identity key
//! (`florin_crypto::sealed`). A signed bad share is also evidence against its sender.

use florin_crypto::{hash, sealed, verify, PublicKey, SecretKey, Signature, Signer};
use rand::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};

use crate::{CustodyError, PartyId};

const DOMAIN: &str = "florin/custody/envelope/v1";

/// The recipient of a broadcast.
pub const EVERYONE: PartyId = 0;

/// A signed (and possibly sealed) protocol message.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Envelope {
    /// The protocol run (random per run).
    pub session: [u8; 16],
    /// The step of the run this message belongs to.
    pub step: u8,
    /// Sender.
    pub from: PartyId,
    /// Recipient, or [`EVERYONE`].
    pub to: PartyId,
    /// Whether `payload` is sealed to the recipient.
    pub sealed: bool,
    /// The message (ciphertext when sealed).
    pub payload: Vec<u8>,
    /// The sender's Ed25519 signature over all of the above.
    pub signature: Vec<u8>,
}

fn digest(
    session: &[u8; 16],
    step: u8,
    from: PartyId,
    to: PartyId,
    sealed: bool,
    payload: &[u8],
) -> [u8; 32] {
    hash(
        DOMAIN,
        &[
            session,
            &[step, sealed as u8],
            &from.to_le_bytes(),
            &to.to_le_bytes(),
            payload,
        ],
    )
}

impl Envelope {
    fn make(
        signer: &dyn Signer,
        session: [u8; 16],
        step: u8,
        from: PartyId,
        to: PartyId,
        sealed: bool,
        payload: Vec<u8>,
    ) -> Result<Envelope, CustodyError> {
        let sig = signer
            .sign(&digest(&session, step, from, to, sealed, &payload))
            .map_err(|e| CustodyError::Frost(format!("identity key cannot sign: {e}")))?;
        Ok(Envelope {
            session,
            step,
            from,
            to,
            sealed,
            payload,
            signature: sig.0.to_vec(),
        })
    }

    /// A message for every party.
    pub fn broadcast(
        signer: &dyn Signer,
        session: [u8; 16],
        step: u8,
        from: PartyId,
        payload: Vec<u8>,
    ) -> Result<Envelope, CustodyError> {
        Self::make(signer, session, step, from, EVERYONE, false, payload)
    }

    /// A secret message for party `to` alone, sealed to its identity key.
    #[allow(clippy::too_many_arguments)]
    pub fn direct<R: RngCore + CryptoRng>(
        signer: &dyn Signer,
        session: [u8; 16],
        step: u8,
        from: PartyId,
        to: PartyId,
        to_key: &PublicKey,
        payload: &[u8],
        rng: &mut R,
    ) -> Result<Envelope, CustodyError> {
        let ct = sealed::seal(to_key, payload, rng)
            .map_err(|e| CustodyError::BadParameters(format!("party {to}'s key: {e}")))?;
        Self::make(signer, session, step, from, to, true, ct)
    }

    /// Whether the envelope carries `from_key`'s valid signature. Anyone on the path can
    /// break a signature, so a bad one proves nothing about the sender by itself; whoever
    /// received the envelope directly from its sender over an authenticated channel can blame
    /// the sender for it.
    pub fn verify(&self, from_key: &PublicKey) -> bool {
        let Ok(sig) = <[u8; 64]>::try_from(self.signature.as_slice()) else {
            return false;
        };
        let d = digest(
            &self.session,
            self.step,
            self.from,
            self.to,
            self.sealed,
            &self.payload,
        );
        verify(from_key, &d, &Signature(sig)).is_ok()
    }

    /// Checks the envelope is for this run and step, addressed to `me` (or everyone) and
    /// signed by `from_key`; returns the plaintext, unsealing with `my_secret` when sealed.
    /// A bad signature or a sealed payload that does not open names the sender.
    pub fn open(
        &self,
        session: &[u8; 16],
        step: u8,
        me: PartyId,
        from_key: &PublicKey,
        my_secret: &SecretKey,
    ) -> Result<Vec<u8>, CustodyError> {
        if &self.session != session || self.step != step {
            return Err(CustodyError::OutOfOrder(format!(
                "message from party {} for another run or step",
                self.from
            )));
        }
        if self.to != EVERYONE && self.to != me {
            return Err(CustodyError::OutOfOrder(format!(
                "message from party {} addressed to party {}",
                self.from, self.to
            )));
        }
        let bad = |reason: &str| CustodyError::Misbehaved {
            party: self.from,
            reason: reason.into(),
        };
        let sig: [u8; 64] = self
            .signature
            .as_slice()
            .try_into()
            .map_err(|_| bad("malformed signature"))?;
        let d = digest(
            session,
            step,
            self.from,
            self.to,
            self.sealed,
            &self.payload,
        );
        verify(from_key, &d, &Signature(sig)).map_err(|_| bad("message signature is wrong"))?;
        if self.sealed {
            sealed::open(my_secret, &self.payload).map_err(|_| bad("sealed share does not open"))
        } else {
            Ok(self.payload.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use florin_crypto::LocalSigner;
    use rand::rngs::OsRng;

    #[test]
    fn signed_sealed_and_checked() -> Result<(), CustodyError> {
        let a = LocalSigner::new(SecretKey::generate(&mut OsRng));
        let b = LocalSigner::new(SecretKey::generate(&mut OsRng));
        let s = [9u8; 16];
        let e = Envelope::direct(&a, s, 2, 1, 2, &b.public_key(), b"share", &mut OsRng)?;
        assert_ne!(e.payload, b"share");
        assert_eq!(e.open(&s, 2, 2, &a.public_key(), b.secret())?, b"share");
        // Not for party 3; wrong step; wrong sender key; tampered.
        assert!(e.open(&s, 2, 3, &a.public_key(), b.secret()).is_err());
        assert!(e.open(&s, 3, 2, &a.public_key(), b.secret()).is_err());
        assert!(matches!(
            e.open(&s, 2, 2, &b.public_key(), b.secret()),
            Err(CustodyError::Misbehaved { party: 1, .. })
        ));
        let mut t = e.clone();
        t.payload[3] ^= 1;
        assert!(matches!(
            t.open(&s, 2, 2, &a.public_key(), b.secret()),
            Err(CustodyError::Misbehaved { party: 1, .. })
        ));
        let mut t = e.clone();
        t.to = EVERYONE;
        assert!(t.open(&s, 2, 2, &a.public_key(), b.secret()).is_err());
        let br = Envelope::broadcast(&a, s, 1, 1, b"hello".to_vec())?;
        assert_eq!(br.open(&s, 1, 5, &a.public_key(), b.secret())?, b"hello");
        Ok(())
    }
}
