//! The wallet's online money: UTXOs on the ledger, each locked to a key derived from the
//! wallet's secret (a fresh key per change output), payments with change, and the handoff of
//! output preimages to payees (Hamilton 3.7).

use florin_crypto::{Digest, LocalSigner, PublicKey, Signer};
use florin_ledger::{BuildError, Draft, Encumbrance, Output, Transaction, Transfer, UhsId, Utxo};
use serde::{Deserialize, Serialize};

use crate::wallet::{Wallet, WalletError};

/// Version byte of a handoff message.
pub const HANDOFF_VERSION: u8 = 1;

pub use florin_ledger::withdraw::{withdraw_message, WITHDRAW_AUTH_DOMAIN};

/// A withdrawal's authorization: a signature by the key of one of the paying transfer's inputs
/// over [`withdraw_message`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithdrawAuth {
    /// The signing key (64 hex: Ed25519).
    pub key: String,
    /// The signature (128 hex).
    pub signature: String,
}

/// What happened to one handoff when the wallet tried to deliver it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffFate {
    /// Delivered to the payee's mailbox.
    Delivered,
    /// Not delivered now (the node is unreachable or refused for now); kept and retried.
    Pending(String),
    /// Can never be delivered (the payee's key is not a usable key: sealing to it fails);
    /// dropped. The money stays the payee's on the ledger.
    Dropped(String),
}

/// A UTXO the wallet can spend.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnedUtxo {
    /// The UTXO (hex of its encoding).
    pub utxo: String,
    /// The derived key index; `None` for the wallet's main key (its address).
    pub key: Option<u64>,
    /// When a restore note for it was last left in the wallet's own mailbox (Unix seconds);
    /// `None` while it has none ([`Wallet::notes_due`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noted: Option<u64>,
}

/// A ledger transaction built and saved but not yet known to be confirmed. Retried (the
/// ledger's submission is idempotent) until decided.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingTx {
    /// The transaction (hex).
    pub tx: String,
    /// The inputs it spends (restored if it fails).
    pub inputs: Vec<OwnedUtxo>,
    /// Change coming back, with its key index.
    pub change: Option<OwnedUtxo>,
    /// The output for the payee, to hand off once confirmed: (payee, UTXO hex).
    pub handoff: Option<(PublicKey, String)>,
    /// What it is for: "pay" or "withdraw".
    pub purpose: String,
    /// For a withdrawal: the handshake the tokens must carry (hex).
    #[serde(default)]
    pub handshake: Option<String>,
    /// For a withdrawal: the owner's authorization (see [`withdraw_message`]).
    #[serde(default)]
    pub withdraw_auth: Option<WithdrawAuth>,
}

/// A confirmed payment to the reserve whose tokens have not arrived yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AwaitingTokens {
    /// The transaction (hex).
    pub tx: String,
    /// The handshake the tokens carry (hex).
    pub handshake: String,
    /// The value.
    pub cents: u64,
    /// The owner's authorization for the authority (absent in wallet files written before
    /// withdrawals were bound to their owner: recomputed from the transaction then).
    #[serde(default)]
    pub auth: Option<WithdrawAuth>,
}

/// Online state kept in the wallet file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OnlinePurse {
    /// Next derived key index.
    pub next_key: u64,
    /// Spendable UTXOs.
    pub utxos: Vec<OwnedUtxo>,
    /// Highest mailbox sequence number read.
    pub mailbox_cursor: u64,
    /// A transaction in flight.
    pub pending: Option<PendingTx>,
    /// Handoffs confirmed on the ledger but not yet delivered: (payee, UTXO hex).
    pub outbox: Vec<(PublicKey, String)>,
    /// Withdrawals paid on the ledger, tokens not yet received.
    #[serde(default)]
    pub awaiting_tokens: Vec<AwaitingTokens>,
    /// Outputs a node said were no longer unspent, kept (never deleted) and checked again by
    /// every sync: if the node was wrong (another network, a ledger being restored, a hostile
    /// answer) they come back. The most recent [`MAX_SPENT_ELSEWHERE`] are kept.
    #[serde(default)]
    pub spent_elsewhere: Vec<OwnedUtxo>,
}

/// How many outputs [`OnlinePurse::spent_elsewhere`] keeps.
pub const MAX_SPENT_ELSEWHERE: usize = 4096;

/// Version byte of a restore note: a message a wallet seals to itself with the preimages of
/// outputs it holds and the index of the key each is locked to.
pub const NOTE_VERSION: u8 = 2;
/// Most outputs in one restore note (a note stays well under the mailbox's message limit).
pub const NOTE_MAX_OUTPUTS: usize = 500;
/// How often a held output's restore note is left again, so that one is always in the mailbox
/// within its retention (30 days by default): a wallet that syncs within this period never
/// has an output without a note.
pub const NOTE_REFRESH_SECS: u64 = 7 * 24 * 3600;
const MAIN_KEY: u64 = u64::MAX;
const NOTE_ENTRY: usize = 8 + 73;

/// A restore note's entries: (key index, output), `None` for the wallet's main key.
pub type NoteEntries = Vec<(Option<u64>, Utxo)>;

fn note_body(entries: &[(Option<u64>, Utxo)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + entries.len() * NOTE_ENTRY);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for (k, u) in entries {
        out.extend_from_slice(&k.unwrap_or(MAIN_KEY).to_le_bytes());
        out.extend_from_slice(&u.encode());
    }
    out
}

/// The note's MAC over `body` (`None` never happens: HMAC takes keys of any length).
fn note_mac(key: &[u8; 32], body: &[u8]) -> Option<hmac::Hmac<sha2::Sha256>> {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).ok()?;
    mac.update(body);
    Some(mac)
}

/// Encodes a restore note, authenticated under `key` (HMAC-SHA-256 with a key only the
/// wallet's words derive: anyone can seal a message to the wallet's address, but only the
/// wallet can write a note it will act on).
pub fn encode_note(key: &[u8; 32], entries: &[(Option<u64>, Utxo)]) -> Vec<u8> {
    let body = note_body(entries);
    let mut out = vec![NOTE_VERSION];
    let tag: [u8; 32] = note_mac(key, &body)
        .map(|m| hmac::Mac::finalize(m).into_bytes().into())
        .unwrap_or_default();
    out.extend_from_slice(&tag);
    out.extend_from_slice(&body);
    out
}

/// Decodes a restore note; `None` if it is not a note, is malformed, lists more than
/// [`NOTE_MAX_OUTPUTS`] outputs, or was not written with `key`.
pub fn decode_note(key: &[u8; 32], b: &[u8]) -> Option<NoteEntries> {
    let (&version, rest) = b.split_first()?;
    if version != NOTE_VERSION || rest.len() < 34 {
        return None;
    }
    let (tag, body) = rest.split_at(32);
    let n = u16::from_le_bytes([body[0], body[1]]) as usize;
    if n > NOTE_MAX_OUTPUTS || body.len() != 2 + n * NOTE_ENTRY {
        return None;
    }
    // The library's constant-time comparison.
    hmac::Mac::verify_slice(note_mac(key, body)?, tag).ok()?;
    body[2..]
        .chunks(NOTE_ENTRY)
        .map(|c| {
            let k = u64::from_le_bytes(c[..8].try_into().ok()?);
            let u = Utxo::decode(&c[8..]).ok()?;
            Some(((k != MAIN_KEY).then_some(k), u))
        })
        .collect()
}

/// Encodes a handoff message: the preimages of outputs for the payee.
pub fn encode_handoff(utxos: &[Utxo]) -> Vec<u8> {
    let mut out = vec![HANDOFF_VERSION];
    out.extend_from_slice(&(utxos.len() as u16).to_le_bytes());
    for u in utxos {
        out.extend_from_slice(&u.encode());
    }
    out
}

/// Decodes a handoff message; `None` if malformed.
pub fn decode_handoff(b: &[u8]) -> Option<Vec<Utxo>> {
    if b.len() < 3 || b[0] != HANDOFF_VERSION {
        return None;
    }
    let n = u16::from_le_bytes([b[1], b[2]]) as usize;
    let body = &b[3..];
    if body.len() != n * 73 {
        return None;
    }
    body.chunks(73).map(|c| Utxo::decode(c).ok()).collect()
}

/// Moves the outputs with the given ids from `from` to `to` (once each). Returns (how many,
/// their value in cents).
fn move_utxos(from: &mut Vec<OwnedUtxo>, to: &mut Vec<OwnedUtxo>, ids: &[UhsId]) -> (usize, u64) {
    let (mut n, mut cents) = (0, 0);
    let mut moved = Vec::new();
    from.retain(|o| match decode_utxo(&o.utxo) {
        Some(u) if ids.contains(&u.id()) => {
            n += 1;
            cents += u.value;
            moved.push(o.clone());
            false
        }
        _ => true,
    });
    for o in moved {
        if !to.iter().any(|x| x.utxo == o.utxo) {
            to.push(o);
        }
    }
    (n, cents)
}

/// The builder's refusals in the wallet's terms.
fn build_error(e: BuildError) -> WalletError {
    match e {
        BuildError::Insufficient { have, need } => WalletError::InsufficientFunds { have, need },
        BuildError::TooManyInputs { needed, max } => WalletError::TooManyInputs { needed, max },
        BuildError::Signing(m) => WalletError::Signing(m),
        other => WalletError::Build(other),
    }
}

fn decode_utxo(h: &str) -> Option<Utxo> {
    hex::decode(h).ok().and_then(|b| Utxo::decode(&b).ok())
}

impl Wallet {
    fn ledger_signer(&self, key: Option<u64>) -> LocalSigner {
        match key {
            None => self.signer().clone(),
            Some(i) => LocalSigner::new(self.signer().secret().derive("florin/wallet/ledger", i)),
        }
    }

    /// Signs `draft`, each input with its own key (`owners[i]` is the wallet's record of
    /// input `i`), through the one transaction builder ([`florin_ledger::build`]).
    fn sign_draft(&self, draft: Draft, owners: &[&OwnedUtxo]) -> Result<Transfer, WalletError> {
        let signers: Vec<LocalSigner> = owners.iter().map(|o| self.ledger_signer(o.key)).collect();
        let refs: Vec<&dyn Signer> = signers.iter().map(|s| s as &dyn Signer).collect();
        draft.sign(&refs).map_err(build_error)
    }

    /// The coins the wallet holds, with its record of each (undecodable records are skipped).
    fn owned_coins(&self) -> (Vec<Utxo>, Vec<OwnedUtxo>) {
        self.online
            .utxos
            .iter()
            .filter_map(|o| decode_utxo(&o.utxo).map(|u| (u, o.clone())))
            .unzip()
    }

    /// Money on the ledger, in cents (including change of a transaction in flight).
    pub fn online_cents(&self) -> u64 {
        let held: u64 = self
            .online
            .utxos
            .iter()
            .filter_map(|o| decode_utxo(&o.utxo))
            .map(|u| u.value)
            .sum();
        let pending: u64 = self
            .online
            .pending
            .iter()
            .flat_map(|p| p.inputs.iter())
            .filter_map(|o| decode_utxo(&o.utxo))
            .map(|u| u.value)
            .sum();
        held + pending
    }

    /// Adds UTXOs locked to this wallet's main key (faucet, handoffs). Returns the value added;
    /// UTXOs for other keys or already held are ignored. The caller checks they are unspent.
    pub fn receive_utxos(&mut self, utxos: &[Utxo]) -> u64 {
        let me = Encumbrance::ed25519(&self.public_key());
        let mut added = 0;
        for u in utxos {
            if u.encumbrance != me || self.holds(u) {
                continue;
            }
            let h = hex::encode(u.encode());
            self.online.utxos.push(OwnedUtxo {
                utxo: h,
                key: None,
                noted: None,
            });
            added += u.value;
        }
        added
    }

    /// Adds outputs from this wallet's own restore notes: each must be locked to the key the
    /// note names (checked by deriving it), and be held not yet. The caller checks they are
    /// unspent. Returns the value added.
    pub fn receive_noted(&mut self, entries: &[(Option<u64>, Utxo)]) -> u64 {
        let mut added = 0;
        for (k, u) in entries {
            if !self.is_own(*k, u) || self.holds(u) {
                continue;
            }
            let h = hex::encode(u.encode());
            self.online.utxos.push(OwnedUtxo {
                utxo: h,
                key: *k,
                noted: None,
            });
            added += u.value;
        }
        added
    }

    /// Whether the wallet knows `u` already: held, an input or the change of the transaction
    /// in flight, or set aside as spent elsewhere (checked again by every sync). An output it
    /// knows is never added a second time.
    pub fn holds(&self, u: &Utxo) -> bool {
        let h = hex::encode(u.encode());
        let pending = self
            .online
            .pending
            .iter()
            .flat_map(|p| p.inputs.iter().chain(p.change.iter()));
        self.online
            .utxos
            .iter()
            .chain(pending)
            .chain(self.online.spent_elsewhere.iter())
            .any(|o| o.utxo == h)
    }

    /// The key restore notes are authenticated with (derived from the wallet's key).
    pub fn note_key(&self) -> zeroize::Zeroizing<[u8; 32]> {
        let k = self.signer().secret().derive("florin/wallet/notes", 0);
        let hexed = zeroize::Zeroizing::new(k.to_hex());
        let mut seed = zeroize::Zeroizing::new([0u8; 32]);
        if let Ok(b) = hex::decode(hexed.as_str()).map(zeroize::Zeroizing::new) {
            if let Ok(a) = <[u8; 32]>::try_from(b.as_slice()) {
                *seed = a;
            }
        }
        florin_crypto::hash("florin/wallet/note-key/v1", &[seed.as_ref()]).into()
    }

    /// Whether `u` is locked to this wallet's key `k`.
    pub fn is_own(&self, k: Option<u64>, u: &Utxo) -> bool {
        u.encumbrance == Encumbrance::ed25519(&self.ledger_signer(k).public_key())
    }

    /// Moves the next derived key past every index this wallet's notes name (spent outputs
    /// included), so a restored wallet never derives a used key again.
    pub fn observe_note_keys(&mut self, entries: &[(Option<u64>, Utxo)]) {
        for (k, u) in entries {
            if let Some(i) = k {
                if *i >= self.online.next_key && *i < u64::MAX / 2 && self.is_own(*k, u) {
                    self.online.next_key = i + 1;
                }
            }
        }
    }

    /// Held outputs whose restore note is missing or older than [`NOTE_REFRESH_SECS`] (at
    /// most [`NOTE_MAX_OUTPUTS`]), with their key indices.
    pub fn notes_due(&self, now: u64) -> Vec<(Option<u64>, Utxo)> {
        self.online
            .utxos
            .iter()
            .filter(|o| {
                o.noted
                    .is_none_or(|t| now.saturating_sub(t) >= NOTE_REFRESH_SECS)
            })
            .filter_map(|o| decode_utxo(&o.utxo).map(|u| (o.key, u)))
            .take(NOTE_MAX_OUTPUTS)
            .collect()
    }

    /// Records that a note for these outputs was left at `now`.
    pub fn mark_noted(&mut self, entries: &[(Option<u64>, Utxo)], now: u64) {
        let noted: Vec<String> = entries
            .iter()
            .map(|(_, u)| hex::encode(u.encode()))
            .collect();
        for o in &mut self.online.utxos {
            if noted.contains(&o.utxo) {
                o.noted = Some(now);
            }
        }
    }

    /// Seals a restore note to this wallet's own key.
    pub fn seal_note<R: rand::RngCore + rand::CryptoRng>(
        &self,
        entries: &[(Option<u64>, Utxo)],
        rng: &mut R,
    ) -> Result<Vec<u8>, String> {
        florin_crypto::sealed::seal(
            &self.public_key(),
            &encode_note(&self.note_key(), entries),
            rng,
        )
        .map_err(|e| format!("sealing a restore note failed ({e})"))
    }

    /// Builds and signs a payment of `amount_cents` to `payee` (largest UTXOs first, change to
    /// a fresh derived key) and records it as pending. Persist the wallet, then submit.
    pub fn build_payment(
        &mut self,
        payee: PublicKey,
        amount_cents: u64,
        purpose: &str,
    ) -> Result<Transaction, WalletError> {
        if self.online.pending.is_some() {
            return Err(WalletError::Busy);
        }
        // Before anything is signed: money locked to a key nobody holds is lost for good.
        payee.validate().map_err(WalletError::InvalidAddress)?;
        if amount_cents == 0 {
            return Err(WalletError::InsufficientFunds { have: 0, need: 0 });
        }
        let (coins, owners) = self.owned_coins();
        // The change goes to a fresh derived key; the index is used up only if there is change.
        let idx = self.online.next_key;
        let change_key = self.ledger_signer(Some(idx)).public_key();
        let pay = Output {
            value: amount_cents,
            encumbrance: Encumbrance::ed25519(&payee),
        };
        let draft =
            florin_ledger::build::payment(&coins, vec![pay], Encumbrance::ed25519(&change_key))
                .map_err(build_error)?;
        let chosen: Vec<OwnedUtxo> = draft.chosen.iter().map(|&i| owners[i].clone()).collect();
        let has_change = draft.change.is_some();
        let t = self.sign_draft(draft, &chosen.iter().collect::<Vec<_>>())?;
        if has_change {
            self.online.next_key += 1;
        }
        let txid = t.txid();
        let created = t.output_utxos();
        let change = has_change.then(|| OwnedUtxo {
            utxo: hex::encode(created[1].encode()),
            key: Some(idx),
            noted: None,
        });
        let spent: Vec<&str> = chosen.iter().map(|o| o.utxo.as_str()).collect();
        self.online
            .utxos
            .retain(|o| !spent.contains(&o.utxo.as_str()));
        let tx = Transaction::Transfer(t);
        let handshake =
            (purpose == "withdraw").then(|| Self::fresh_handshake(&mut rand::rngs::OsRng));
        let withdraw_auth = match (&handshake, chosen.first()) {
            (Some(hs), Some(o)) => Some(self.sign_withdrawal(o.key, &txid, 0, hs)?),
            _ => None,
        };
        self.online.pending = Some(PendingTx {
            tx: hex::encode(tx.encode()),
            inputs: chosen,
            change,
            handoff: Some((payee, hex::encode(created[0].encode()))),
            purpose: purpose.into(),
            handshake: handshake.map(hex::encode),
            withdraw_auth,
        });
        Ok(tx)
    }

    /// Builds and signs a consolidation: the smallest held coins, as many as one transaction
    /// takes ([`florin_ledger::tx::MAX_IO`]), into one output to a fresh derived key of this
    /// wallet, recorded as pending like a payment. For a payment that needs more coins than
    /// one transaction takes. Returns `None` when there is nothing to consolidate (one coin).
    pub fn build_consolidation(&mut self) -> Result<Option<Transaction>, WalletError> {
        if self.online.pending.is_some() {
            return Err(WalletError::Busy);
        }
        let (coins, owners) = self.owned_coins();
        let idx = self.online.next_key;
        let k = self.ledger_signer(Some(idx)).public_key();
        let Some(draft) = florin_ledger::build::consolidation(&coins, Encumbrance::ed25519(&k))
            .map_err(build_error)?
        else {
            return Ok(None);
        };
        let owned: Vec<OwnedUtxo> = draft.chosen.iter().map(|&i| owners[i].clone()).collect();
        let t = self.sign_draft(draft, &owned.iter().collect::<Vec<_>>())?;
        self.online.next_key += 1;
        let created = t.output_utxos();
        let spent: Vec<&str> = owned.iter().map(|o| o.utxo.as_str()).collect();
        self.online
            .utxos
            .retain(|o| !spent.contains(&o.utxo.as_str()));
        let tx = Transaction::Transfer(t);
        self.online.pending = Some(PendingTx {
            tx: hex::encode(tx.encode()),
            inputs: owned,
            change: Some(OwnedUtxo {
                utxo: hex::encode(created[0].encode()),
                key: Some(idx),
                noted: None,
            }),
            handoff: None,
            purpose: "consolidate".into(),
            handshake: None,
            withdraw_auth: None,
        });
        Ok(Some(tx))
    }

    /// The transaction in flight, if any.
    pub fn pending_tx(&self) -> Option<&PendingTx> {
        self.online.pending.as_ref()
    }

    /// Settles the transaction in flight: `confirmed` adds the change and queues the handoff;
    /// otherwise the inputs come back (the ledger changed nothing). Returns the pending record.
    pub fn settle_pending(&mut self, confirmed: bool) -> Option<PendingTx> {
        let p = self.online.pending.take()?;
        if p.purpose != "consolidate" {
            let (to, cents) = p
                .handoff
                .as_ref()
                .and_then(|(k, u)| decode_utxo(u).map(|u| (*k, u.value)))
                .map_or((None, 0), |(k, v)| (Some(k), v));
            let txid = hex::decode(&p.tx)
                .ok()
                .and_then(|b| Transaction::decode(&b).ok())
                .map(|t| hex::encode(t.txid()));
            let status = if confirmed { "confirmed" } else { "refused" };
            self.record(&p.purpose, cents, to, status, txid);
        }
        if confirmed {
            if let Some(c) = &p.change {
                self.online.utxos.push(c.clone());
            }
            if let Some(h) = &p.handoff {
                if p.purpose == "pay" {
                    self.online.outbox.push(h.clone());
                }
            }
            if p.purpose == "withdraw" {
                let cents = p
                    .handoff
                    .as_ref()
                    .and_then(|(_, u)| decode_utxo(u))
                    .map(|u| u.value)
                    .unwrap_or(0);
                self.online.awaiting_tokens.push(AwaitingTokens {
                    tx: p.tx.clone(),
                    handshake: p.handshake.clone().unwrap_or_default(),
                    cents,
                    auth: p.withdraw_auth.clone(),
                });
            }
        } else {
            for i in &p.inputs {
                if !self.online.utxos.iter().any(|o| o.utxo == i.utxo) {
                    self.online.utxos.push(i.clone());
                }
            }
        }
        Some(p)
    }

    /// Handoffs waiting to be delivered.
    pub fn outbox(&self) -> &[(PublicKey, String)] {
        &self.online.outbox
    }

    /// Marks a handoff delivered (or dropped: it can never be delivered).
    pub fn delivered(&mut self, payee: &PublicKey, utxo: &str) {
        self.online
            .outbox
            .retain(|(p, u)| !(p == payee && u == utxo));
    }

    /// Withdrawals waiting for their tokens.
    pub fn awaiting_tokens(&self) -> &[AwaitingTokens] {
        &self.online.awaiting_tokens
    }

    fn sign_withdrawal(
        &self,
        key: Option<u64>,
        txid: &Digest,
        output: u64,
        handshake: &[u8; 32],
    ) -> Result<WithdrawAuth, WalletError> {
        let s = self.ledger_signer(key);
        let msg = withdraw_message(txid, output, &self.public_key(), handshake);
        let sig = s
            .sign(&msg)
            .map_err(|e| WalletError::Signing(e.to_string()))?;
        Ok(WithdrawAuth {
            key: hex::encode(s.public_key().0),
            signature: hex::encode(sig.0),
        })
    }

    /// The authorization for a withdrawal waiting for its tokens: the stored one, or (for a
    /// wallet file written before withdrawals were bound to their owner) one signed now by the
    /// key of an input of the paying transfer that this wallet holds. `None` if no input is
    /// this wallet's.
    pub fn withdraw_authorization(&self, a: &AwaitingTokens) -> Option<WithdrawAuth> {
        if a.auth.is_some() {
            return a.auth.clone();
        }
        let tx = hex::decode(&a.tx)
            .ok()
            .and_then(|b| Transaction::decode(&b).ok())?;
        let Transaction::Transfer(t) = &tx else {
            return None;
        };
        let hs = hex::decode(&a.handshake)
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())?;
        let txid = t.txid();
        let mine = |enc: &Encumbrance| -> Option<Option<u64>> {
            if *enc == Encumbrance::ed25519(&self.public_key()) {
                return Some(None);
            }
            (0..self.online.next_key)
                .find(|i| *enc == Encumbrance::ed25519(&self.ledger_signer(Some(*i)).public_key()))
                .map(Some)
        };
        let key = t.inputs.iter().find_map(|u| mine(&u.encumbrance))?;
        self.sign_withdrawal(key, &txid, 0, &hs).ok()
    }

    /// The ledger outputs this wallet holds (not those of a transaction in flight).
    pub fn held_utxos(&self) -> Vec<Utxo> {
        self.online
            .utxos
            .iter()
            .filter_map(|o| decode_utxo(&o.utxo))
            .collect()
    }

    /// Sets aside held outputs the ledger no longer holds unspent (spent by a copy of this
    /// wallet, or by a restored backup's twin): they leave the balance and coin selection but
    /// are kept in [`OnlinePurse::spent_elsewhere`]. Returns (how many, their value in cents).
    pub fn forget_spent(&mut self, spent: &[UhsId]) -> (usize, u64) {
        let moved = move_utxos(
            &mut self.online.utxos,
            &mut self.online.spent_elsewhere,
            spent,
        );
        let excess = self
            .online
            .spent_elsewhere
            .len()
            .saturating_sub(MAX_SPENT_ELSEWHERE);
        self.online.spent_elsewhere.drain(..excess);
        moved
    }

    /// Outputs set aside as spent elsewhere (to check again).
    pub fn set_aside_utxos(&self) -> Vec<Utxo> {
        self.online
            .spent_elsewhere
            .iter()
            .filter_map(|o| decode_utxo(&o.utxo))
            .collect()
    }

    /// Brings back set-aside outputs the ledger holds unspent after all. Returns (how many,
    /// their value in cents).
    pub fn restore_unspent(&mut self, unspent: &[UhsId]) -> (usize, u64) {
        move_utxos(
            &mut self.online.spent_elsewhere,
            &mut self.online.utxos,
            unspent,
        )
    }

    /// Receives a withdrawal's tokens: verified like any tokens from the authority, then the
    /// withdrawal is done.
    pub fn receive_withdrawal<R: rand::RngCore + rand::CryptoRng>(
        &mut self,
        tx: &str,
        tokens: Vec<florin_token::Token>,
        rng: &mut R,
    ) -> Result<u64, WalletError> {
        let Some(pos) = self.online.awaiting_tokens.iter().position(|a| a.tx == tx) else {
            return Ok(0);
        };
        let a = self.online.awaiting_tokens[pos].clone();
        let got: u64 = tokens.iter().map(|t| t.value.cents()).sum();
        if got != a.cents {
            return Err(WalletError::AmountMismatch {
                asked: a.cents,
                got,
            });
        }
        let hs = hex::decode(&a.handshake)
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
            .unwrap_or_default();
        let n = self.accept_issued(tokens, &hs, rng)?;
        self.online.awaiting_tokens.remove(pos);
        Ok(n)
    }

    /// Highest mailbox message read.
    pub fn mailbox_cursor(&self) -> u64 {
        self.online.mailbox_cursor
    }

    /// Advances the mailbox cursor.
    pub fn set_mailbox_cursor(&mut self, seq: u64) {
        self.online.mailbox_cursor = self.online.mailbox_cursor.max(seq);
    }

    /// Opens a sealed box addressed to this wallet's key.
    pub fn open_sealed(&self, sealed: &[u8]) -> Option<Vec<u8>> {
        florin_crypto::sealed::open(self.signer().secret(), sealed).ok()
    }

    /// Seals a queued handoff to its payee. `Err` (with the reason) means it can never be
    /// delivered — the payee's key is not a usable key, so sealing to it fails, or the queued
    /// output is unreadable — and should be dropped; the money stays the payee's on the ledger.
    pub fn seal_handoff<R: rand::RngCore + rand::CryptoRng>(
        payee: &PublicKey,
        utxo: &str,
        rng: &mut R,
    ) -> Result<Vec<u8>, String> {
        let u = decode_utxo(utxo).ok_or_else(|| "the queued output is unreadable".to_string())?;
        payee
            .validate()
            .map_err(|e| format!("the payee's address is not a usable key ({e})"))?;
        florin_crypto::sealed::seal(payee, &encode_handoff(&[u]), rng)
            .map_err(|e| format!("sealing to the payee failed ({e})"))
    }

    /// The UTXO a handoff string names.
    pub fn handoff_utxo(h: &str) -> Option<Utxo> {
        decode_utxo(h)
    }
}
