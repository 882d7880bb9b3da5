//! The token, its links, and the two signing operations: minting (the anchor) and transfer.

use florin_crypto::{Hasher, PublicKey, Signature, Signer, SignerError};
use thiserror::Error;

use crate::codec::{DecodeError, Reader};
use crate::denomination::Denomination;

/// Version byte of the token encoding.
pub const TOKEN_VERSION: u8 = 1;
/// An 8-byte serial number, unique per token at its authority.
pub type Serial = [u8; 8];
/// The authority's 64-byte nonce, fresh for every anchor (mint or re-anchor).
pub type MintNonce = [u8; 64];
/// The payee's 32-byte handshake nonce (replay prevention, IV-G).
pub type Handshake = [u8; 32];

const LINK_LEN: usize = 32 + 32 + 64;
/// Most links a token can carry (the link count is 16 bits).
pub const MAX_LINKS: usize = u16::MAX as usize;
/// Bytes of a token before its links.
pub const HEADER_LEN: usize = 1 + 8 + 1 + 32 + 64 + 2;

/// One hand the token passed into: recipient, the handshake nonce the recipient issued, and the
/// proof (the previous holder's signature; the authority's for an anchor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Link {
    /// Who received the token.
    pub recipient: PublicKey,
    /// The nonce the recipient issued for this transfer.
    pub handshake: Handshake,
    /// The signature making the transfer.
    pub proof: Signature,
}

impl Link {
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.recipient.0);
        out.extend_from_slice(&self.handshake);
        out.extend_from_slice(&self.proof.0);
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Link {
            recipient: PublicKey(r.array("link recipient")?),
            handshake: r.array("link handshake")?,
            proof: Signature(r.array("link proof")?),
        })
    }

    /// `true` when both links pay the same recipient under the same handshake — the same
    /// payment, even if the signature bytes differ.
    pub fn same_payment(&self, other: &Link) -> bool {
        self.recipient == other.recipient && self.handshake == other.handshake
    }
}

/// The message the authority signs for an anchor link.
pub fn anchor_message(
    serial: &Serial,
    value: Denomination,
    authority: &PublicKey,
    nonce: &MintNonce,
    recipient: &PublicKey,
    handshake: &Handshake,
) -> [u8; 32] {
    Hasher::new("florin/token/anchor/v1")
        .chain(&[TOKEN_VERSION])
        .chain(serial)
        .chain(&[value.to_byte()])
        .chain(&authority.0)
        .chain(nonce)
        .chain(&recipient.0)
        .chain(handshake)
        .finalize()
}

/// The message a holder signs to pass the token on.
pub fn link_message(
    serial: &Serial,
    prev_proof: &Signature,
    recipient: &PublicKey,
    handshake: &Handshake,
) -> [u8; 32] {
    Hasher::new("florin/token/link/v1")
        .chain(serial)
        .chain(&prev_proof.0)
        .chain(&recipient.0)
        .chain(handshake)
        .finalize()
}

/// A fixed-value token with its chain of links since its last anchor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Token {
    /// Unique serial number.
    pub serial: Serial,
    /// Fixed value.
    pub value: Denomination,
    /// The authority in charge of the token.
    pub authority: PublicKey,
    /// The nonce of the current anchor.
    pub nonce: MintNonce,
    /// The chain: `links[0]` is the anchor; never empty in a decoded token.
    pub links: Vec<Link>,
}

/// Why a holder cannot pass a token on.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransferError {
    /// The signer is not the token's last recipient.
    #[error("token {serial} is held by {holder}, not by the signer {signer}")]
    NotHolder {
        /// The token.
        serial: String,
        /// The last recipient.
        holder: PublicKey,
        /// Who tried to sign.
        signer: PublicKey,
    },
    /// The chain is as long as the encoding allows.
    #[error("token {0} cannot take another link")]
    ChainFull(String),
    /// The signer failed.
    #[error(transparent)]
    Signer(#[from] SignerError),
}

impl Token {
    /// Mints a token: the authority signs the anchor naming the first recipient.
    pub fn mint(
        authority: &dyn Signer,
        serial: Serial,
        value: Denomination,
        nonce: MintNonce,
        recipient: PublicKey,
        handshake: Handshake,
    ) -> Result<Token, SignerError> {
        let authority_key = authority.public_key();
        let msg = anchor_message(
            &serial,
            value,
            &authority_key,
            &nonce,
            &recipient,
            &handshake,
        );
        let proof = authority.sign(&msg)?;
        Ok(Token {
            serial,
            value,
            authority: authority_key,
            nonce,
            links: vec![Link {
                recipient,
                handshake,
                proof,
            }],
        })
    }

    /// The serial as 16 hex digits, for humans and JSON.
    pub fn serial_hex(&self) -> String {
        hex::encode(self.serial)
    }

    /// The anchor link.
    pub fn anchor(&self) -> Option<&Link> {
        self.links.first()
    }

    /// The current holder: the last recipient.
    pub fn holder(&self) -> Option<PublicKey> {
        self.links.last().map(|l| l.recipient)
    }

    /// Offline hops since the anchor.
    pub fn hops(&self) -> usize {
        self.links.len().saturating_sub(1)
    }

    /// The message signed by link `i` (the anchor for `i == 0`).
    pub fn message(&self, i: usize) -> Option<[u8; 32]> {
        let link = self.links.get(i)?;
        Some(if i == 0 {
            anchor_message(
                &self.serial,
                self.value,
                &self.authority,
                &self.nonce,
                &link.recipient,
                &link.handshake,
            )
        } else {
            let prev = &self.links[i - 1];
            link_message(&self.serial, &prev.proof, &link.recipient, &link.handshake)
        })
    }

    /// Who must have signed link `i`: the authority for the anchor, the previous recipient
    /// otherwise.
    pub fn signer_of(&self, i: usize) -> Option<PublicKey> {
        match i {
            0 => Some(self.authority),
            _ => self.links.get(i - 1).map(|l| l.recipient),
        }
    }

    /// Passes the token to `recipient` (client transaction, IV-D). The signer must be the
    /// holder; the handshake is the nonce the recipient issued for this payment.
    pub fn transfer(
        &self,
        holder: &dyn Signer,
        recipient: PublicKey,
        handshake: Handshake,
    ) -> Result<Token, TransferError> {
        let signer = holder.public_key();
        let last = match self.links.last() {
            Some(l) if l.recipient == signer => l,
            other => {
                return Err(TransferError::NotHolder {
                    serial: self.serial_hex(),
                    holder: other.map(|l| l.recipient).unwrap_or(PublicKey([0; 32])),
                    signer,
                })
            }
        };
        if self.links.len() >= MAX_LINKS {
            return Err(TransferError::ChainFull(self.serial_hex()));
        }
        let msg = link_message(&self.serial, &last.proof, &recipient, &handshake);
        let proof = holder.sign(&msg)?;
        let mut next = self.clone();
        next.links.push(Link {
            recipient,
            handshake,
            proof,
        });
        Ok(next)
    }

    /// Size of the encoding in bytes: 108 + 128 per link.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.links.len() * LINK_LEN
    }

    /// The canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(TOKEN_VERSION);
        out.extend_from_slice(&self.serial);
        out.push(self.value.to_byte());
        out.extend_from_slice(&self.authority.0);
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&(self.links.len() as u16).to_le_bytes());
        for l in &self.links {
            l.encode_into(out);
        }
    }

    /// Decodes a token, rejecting trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Token, DecodeError> {
        let mut r = Reader::new(bytes);
        let t = Self::decode_from(&mut r)?;
        r.finish()?;
        Ok(t)
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Token, DecodeError> {
        r.version(TOKEN_VERSION, "token")?;
        let serial = r.array("serial")?;
        let value = Denomination::from_byte(r.u8("value")?)?;
        let authority = PublicKey(r.array("authority key")?);
        let nonce = r.array("nonce")?;
        let n = r.u16("link count")? as usize;
        if n == 0 {
            return Err(DecodeError::Invalid("token without links"));
        }
        if r.remaining() < n * LINK_LEN {
            return Err(DecodeError::Truncated {
                what: "links",
                needed: n * LINK_LEN - r.remaining(),
            });
        }
        let links = (0..n)
            .map(|_| Link::decode_from(r))
            .collect::<Result<_, _>>()?;
        Ok(Token {
            serial,
            value,
            authority,
            nonce,
            links,
        })
    }
}
