//! Node-to-node protocol messages, relayed by a coordinator.
//!
//! Key-management nodes talk to each other through the coordinator (a star, as in the source
//! document's KMN). So that the relay cannot forge or read what it carries, every message is
//! signed by its sender's identity key over the session, the step, sender and recipient, and
//! a message that carries a secret share is sealed to its recipient's identity key
//! (`florin_crypto::sealed`). A signed bad share is also evidence against its sender.

use std::collections::BTreeMap;

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

const PAYLOAD_DOMAIN: &str = "florin/custody/envelope-payload/v1";

/// The hash of an envelope's payload, as its signature covers it.
pub fn payload_hash(payload: &[u8]) -> [u8; 32] {
    hash(PAYLOAD_DOMAIN, &[payload])
}

/// What an envelope's signature signs. The payload enters as its hash, so that a receiver can
/// show a third party which message it got from a sender with 64 bytes of signature and 32 of
/// hash ([`Attestation`]) instead of the whole message.
fn digest(
    session: &[u8; 16],
    step: u8,
    from: PartyId,
    to: PartyId,
    sealed: bool,
    payload_hash: &[u8; 32],
) -> [u8; 32] {
    hash(
        DOMAIN,
        &[
            session,
            &[step, sealed as u8],
            &from.to_le_bytes(),
            &to.to_le_bytes(),
            payload_hash,
        ],
    )
}

/// What one party received from another in a broadcast step, with the sender's signature:
/// the evidence of a reliable-broadcast (echo) check. Two attestations of one sender, step and
/// run with different hashes, both signed, prove that the sender equivocated; an attestation
/// whose signature fails proves that whoever presented it lied.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Attestation {
    /// The sender of the broadcast.
    pub from: PartyId,
    /// [`payload_hash`] of the broadcast's payload.
    pub payload_hash: [u8; 32],
    /// The sender's signature on the envelope (64 bytes).
    pub signature: Vec<u8>,
}

impl Attestation {
    /// Whether `from_key` signed a broadcast of this hash in run `session`, step `step`.
    pub fn verify(&self, session: &[u8; 16], step: u8, from_key: &PublicKey) -> bool {
        let Ok(sig) = <[u8; 64]>::try_from(self.signature.as_slice()) else {
            return false;
        };
        let d = digest(
            session,
            step,
            self.from,
            EVERYONE,
            false,
            &self.payload_hash,
        );
        verify(from_key, &d, &Signature(sig)).is_ok()
    }
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
            .sign(&digest(
                &session,
                step,
                from,
                to,
                sealed,
                &payload_hash(&payload),
            ))
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
            &payload_hash(&self.payload),
        );
        verify(from_key, &d, &Signature(sig)).is_ok()
    }

    /// This broadcast as evidence of what its sender sent ([`Attestation`]).
    pub fn attestation(&self) -> Attestation {
        Attestation {
            from: self.from,
            payload_hash: payload_hash(&self.payload),
            signature: self.signature.clone(),
        }
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
            &payload_hash(&self.payload),
        );
        verify(from_key, &d, &Signature(sig)).map_err(|_| bad("message signature is wrong"))?;
        if self.sealed {
            sealed::open(my_secret, &self.payload).map_err(|_| bad("sealed share does not open"))
        } else {
            Ok(self.payload.clone())
        }
    }
}

/// The reliable-broadcast check of one broadcast step, over signed evidence.
///
/// `mine` holds the payload hash of every party's broadcast as this party received it (its
/// own included); `echoes` holds, per witness, the attestations that witness reports for the
/// same step. Every witness must report every party once. Where a witness's hash differs
/// from ours, the sender's signature decides: if it signed the witness's hash too, the sender
/// equivocated ([`CustodyError::Equivocation`]); if not, the witness lied
/// ([`CustodyError::Misbehaved`] naming the witness). An honest sender is never blamed for a
/// lying witness, and an equivocating sender cannot hide behind one.
pub fn check_echoes(
    session: &[u8; 16],
    step: u8,
    mine: &BTreeMap<PartyId, [u8; 32]>,
    echoes: &BTreeMap<PartyId, Vec<Attestation>>,
    key_of: impl Fn(PartyId) -> Option<PublicKey>,
) -> Result<(), CustodyError> {
    for (&witness, seen) in echoes {
        let lied = |reason: String| CustodyError::Misbehaved {
            party: witness,
            reason,
        };
        if seen.len() != mine.len() {
            return Err(lied(format!(
                "echo reports {} messages of {}",
                seen.len(),
                mine.len()
            )));
        }
        let mut covered = std::collections::BTreeSet::new();
        for a in seen {
            let Some(ours) = mine.get(&a.from) else {
                return Err(lied(format!("echo reports unknown party {}", a.from)));
            };
            if !covered.insert(a.from) {
                return Err(lied(format!("echo reports party {} twice", a.from)));
            }
            if &a.payload_hash == ours {
                continue;
            }
            let key = key_of(a.from)
                .ok_or_else(|| lied(format!("echo reports unknown party {}", a.from)))?;
            if a.verify(session, step, &key) {
                return Err(CustodyError::Equivocation {
                    culprit: a.from,
                    witness,
                });
            }
            return Err(lied(format!(
                "echo reports a message of party {} that party {} never signed",
                a.from, a.from
            )));
        }
    }
    Ok(())
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
    #[test]
    fn attestations_prove_equivocation_and_expose_lying_witnesses() -> Result<(), CustodyError> {
        let keys: Vec<LocalSigner> = (0..3)
            .map(|_| LocalSigner::new(SecretKey::generate(&mut OsRng)))
            .collect();
        let key_of = |p: PartyId| keys.get(p as usize - 1).map(|k| k.public_key());
        let s = [4u8; 16];
        let sent =
            |p: PartyId, m: &[u8]| Envelope::broadcast(&keys[p as usize - 1], s, 1, p, m.to_vec());
        let (a, b, c) = (sent(1, b"one")?, sent(2, b"two")?, sent(3, b"three")?);
        // An attestation binds the run, the step and the sender.
        let att = a.attestation();
        assert!(att.verify(&s, 1, &keys[0].public_key()));
        assert!(!att.verify(&[5; 16], 1, &keys[0].public_key()));
        assert!(!att.verify(&s, 2, &keys[0].public_key()));
        assert!(!att.verify(&s, 1, &keys[1].public_key()));
        // A direct (sealed) message is no broadcast.
        let d = Envelope::direct(
            &keys[0],
            s,
            1,
            1,
            2,
            &keys[1].public_key(),
            b"x",
            &mut OsRng,
        )?;
        assert!(!d.attestation().verify(&s, 1, &keys[0].public_key()));

        let mine: BTreeMap<PartyId, [u8; 32]> = [&a, &b, &c]
            .iter()
            .map(|e| (e.from, payload_hash(&e.payload)))
            .collect();
        let honest = vec![a.attestation(), b.attestation(), c.attestation()];
        let ok: BTreeMap<_, _> = [(2, honest.clone()), (3, honest.clone())].into();
        check_echoes(&s, 1, &mine, &ok, key_of)?;

        // Party 1 signed a second message, which witness 2 got: party 1 is named.
        let mut saw = honest.clone();
        saw[0] = sent(1, b"other")?.attestation();
        let e: BTreeMap<_, _> = [(2, saw), (3, honest.clone())].into();
        assert_eq!(
            check_echoes(&s, 1, &mine, &e, key_of),
            Err(CustodyError::Equivocation {
                culprit: 1,
                witness: 2
            })
        );
        // Witness 3 claims party 1 sent something else, unsigned or signed for another step
        // or run: the witness is named, not party 1.
        let forged = [
            Attestation {
                from: 1,
                payload_hash: [9; 32],
                signature: vec![0; 64],
            },
            Envelope::broadcast(&keys[0], s, 2, 1, b"echo".to_vec())?.attestation(),
            Envelope::broadcast(&keys[0], [6; 16], 1, 1, b"one'".to_vec())?.attestation(),
            Attestation {
                from: 1,
                payload_hash: [9; 32],
                signature: vec![1; 3],
            },
        ];
        for f in forged {
            let mut saw = honest.clone();
            saw[0] = f;
            let e: BTreeMap<_, _> = [(2, honest.clone()), (3, saw)].into();
            assert!(matches!(
                check_echoes(&s, 1, &mine, &e, key_of),
                Err(CustodyError::Misbehaved { party: 3, .. })
            ),);
        }
        // An echo that leaves a party out, repeats one or names a stranger.
        for bad in [
            vec![a.attestation(), b.attestation()],
            vec![a.attestation(), a.attestation(), c.attestation()],
            vec![
                a.attestation(),
                b.attestation(),
                Attestation {
                    from: 7,
                    ..c.attestation()
                },
            ],
        ] {
            let e: BTreeMap<_, _> = [(2, bad)].into();
            assert!(matches!(
                check_echoes(&s, 1, &mine, &e, key_of),
                Err(CustodyError::Misbehaved { party: 2, .. })
            ));
        }
        Ok(())
    }
}
