//! Where the two money forms meet: withdrawing ledger funds into tokens, crediting deposited
//! tokens back to the ledger, and the supply audit.
//!
//! The authority keeps a **reserve** on the ledger: outputs locked to its key. Withdrawing pays
//! the reserve and the authority mints tokens of the same value against that confirmed output;
//! crediting a deposit pays the depositor from the reserve. So the reserve always equals the
//! tokens in circulation, and the books balance:
//! `minted − redeemed = (ledger supply − reserve) + tokens outstanding`.

use florin_crypto::{Digest, PublicKey, Signature};
use florin_ledger::{Encumbrance, Output, Transaction, Transfer, Utxo};
use florin_token::registry::{TokenRecord, TokenStatus};
use florin_token::{Denomination, Token};
use redb::{ReadableDatabase, ReadableTable};

use crate::registry::RegTx;
use serde::Serialize;

use crate::authority::{check_usable, Authority};
use crate::error::{Corrupt, NodeError, StorageError, WithdrawAuthError, WithdrawalRefused};
use crate::store::{CREDITS, RESERVE, TOKENS, WITHDRAWALS};

/// A ledger payment from the reserve to a depositor, recorded durably before it is submitted.
#[derive(Debug, Clone)]
pub struct CreditIntent {
    /// Transfers that first join reserve outputs into fewer (reserve to reserve), for a credit
    /// that needs more of them than one transaction takes; submitted in order before `tx`.
    /// Usually empty.
    pub before: Vec<Transaction>,
    /// The transaction paying the depositor.
    pub tx: Transaction,
    /// The depositor's new output.
    pub credit: Utxo,
    /// Change back to the reserve, if any.
    pub change: Option<Utxo>,
}

/// Marks the stored form of an intent with joins: a length no transaction has.
const WITH_JOINS: u32 = u32::MAX;

impl CreditIntent {
    /// Every transaction of the credit, in submission order.
    pub fn transactions(&self) -> impl Iterator<Item = &Transaction> {
        self.before.iter().chain(std::iter::once(&self.tx))
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.before.is_empty() {
            out.extend_from_slice(&WITH_JOINS.to_le_bytes());
            out.extend_from_slice(&(self.before.len() as u32).to_le_bytes());
            for t in &self.before {
                let b = t.encode();
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(&b);
            }
        }
        let tx = self.tx.encode();
        out.extend_from_slice(&(tx.len() as u32).to_le_bytes());
        out.extend_from_slice(&tx);
        out.extend_from_slice(&self.credit.encode());
        if let Some(c) = &self.change {
            out.extend_from_slice(&c.encode());
        }
        out
    }

    /// Decodes an intent as the registry stores it.
    pub(crate) fn decode_stored(b: &[u8]) -> Option<CreditIntent> {
        Self::decode(b)
    }

    fn decode(mut b: &[u8]) -> Option<CreditIntent> {
        fn u32_at(b: &[u8]) -> Option<u32> {
            Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?))
        }
        let mut before = Vec::new();
        if u32_at(b)? == WITH_JOINS {
            let count = u32_at(b.get(4..)?)? as usize;
            b = &b[8..];
            // Each join spends at least one input: a count past what the rest could hold is
            // damage, not an allocation to make.
            if count > b.len() / 4 {
                return None;
            }
            for _ in 0..count {
                let n = u32_at(b)? as usize;
                before.push(Transaction::decode(b.get(4..4 + n)?).ok()?);
                b = &b[4 + n..];
            }
        }
        let n = u32_at(b)? as usize;
        let tx = Transaction::decode(b.get(4..4 + n)?).ok()?;
        let rest = b.get(4 + n..)?;
        let credit = Utxo::decode(rest.get(..73)?).ok()?;
        let change = match rest.len() {
            73 => None,
            146 => Some(Utxo::decode(&rest[73..]).ok()?),
            _ => return None,
        };
        Some(CreditIntent {
            before,
            tx,
            credit,
            change,
        })
    }
}

/// The supply audit.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Audit {
    /// Cents the issuer minted on the ledger.
    pub minted_cents: u64,
    /// Cents redeemed out of the ledger.
    pub redeemed_cents: u64,
    /// Cents in unspent ledger outputs (summed over the UHS).
    pub ledger_supply_cents: u64,
    /// The authority's reserve (backs the tokens).
    pub reserve_cents: u64,
    /// Ledger money held by users: supply − reserve.
    pub ledger_circulating_cents: u64,
    /// Value of tokens in circulation at the authority.
    pub tokens_outstanding_cents: u64,
    /// Whether `minted − redeemed = ledger circulating + tokens outstanding`, the ledger's
    /// own books agree (`supply = minted − redeemed`) and the cross-checks against the
    /// authority's independent records found nothing missing ([`Audit::problems`]).
    pub balanced: bool,
    /// Cents the issuer's journal (in the authority's registry, apart from the ledger's log)
    /// says were minted and confirmed; `None` where this node keeps no journal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_journal_cents: Option<u64>,
    /// Reserve outputs the authority relies on that were checked on the ledger.
    #[serde(default)]
    pub reserve_outputs_checked: u64,
    /// What the cross-checks found missing or different, one line each (empty when balanced).
    #[serde(default)]
    pub problems: Vec<String>,
}

impl Authority {
    /// Builds and signs a credit of `cents` to `to` from the reserve outputs `from` (joining
    /// them first when one transaction cannot take them all): the intent, and the indices in
    /// `from` of the outputs it spends. What it spends is exactly what the payment is paid
    /// from (through its joins), or the reserve's books would lose or invent value.
    fn build_credit(
        &self,
        from: &[Utxo],
        to: Encumbrance,
        cents: u64,
    ) -> Result<(CreditIntent, Vec<usize>), NodeError> {
        let me = Encumbrance::ed25519(&self.public_key());
        let pay = Output {
            value: cents,
            encumbrance: to,
        };
        let drafts = florin_ledger::build::payment_chain(from, pay, me)
            .map_err(|source| StorageError::Credit { cents, source })?;
        let mut chosen: Vec<usize> = Vec::new();
        let mut txs = Vec::with_capacity(drafts.len());
        let mut last = None;
        for d in drafts {
            chosen.extend(d.chosen.iter().copied());
            let change = d.change;
            let signer = self.signer();
            let signers = vec![signer; d.transfer.inputs.len()];
            let t = d
                .sign(&signers)
                .map_err(crate::error::SignerFailure::from)?;
            last = Some((t.output_utxos(), change));
            txs.push(Transaction::Transfer(t));
        }
        let (Some(tx_pay), Some((created, change))) = (txs.pop(), last) else {
            return Err(NodeError::storage("crediting built no transaction"));
        };
        let removed: u64 = chosen
            .iter()
            .filter_map(|&i| from.get(i))
            .map(|u| u.value)
            .sum();
        let paid_from: u64 = match &tx_pay {
            Transaction::Transfer(t) => t.inputs.iter().map(|u| u.value).sum(),
            _ => 0,
        };
        if removed != paid_from {
            return Err(NodeError::storage(format!(
                "crediting {cents} cents: {removed} cents would leave the reserve for a payment from {paid_from}"
            )));
        }
        let intent = CreditIntent {
            before: txs,
            credit: created[0],
            change: change.map(|i| created[i]),
            tx: tx_pay,
        };
        Ok((intent, chosen))
    }

    /// Records a credit of `cents` to `depositor` from the reserve, inside the deposit's write
    /// transaction: the reserve outputs it spends leave the reserve table and the intent is
    /// stored, all or nothing with the tokens leaving circulation.
    pub(crate) fn record_credit(
        &self,
        tx: &RegTx,
        depositor: &PublicKey,
        cents: u64,
    ) -> Result<CreditIntent, NodeError> {
        let mut reserve = tx.open_table(RESERVE)?;
        // Reserve outputs in key order until they cover the credit; the builder then spends
        // the largest of them first, joining them first when more than one transaction takes.
        let mut offered: Vec<Utxo> = Vec::new();
        let mut sum = 0u64;
        for item in reserve.iter()? {
            if sum >= cents {
                break;
            }
            let (_, v) = item?;
            let u = Utxo::decode(v.value()).map_err(Corrupt::from)?;
            sum = sum.saturating_add(u.value);
            offered.push(u);
        }
        if sum < cents {
            return Err(StorageError::ReserveShort {
                have: sum,
                need: cents,
            }
            .into());
        }
        let (intent, chosen) =
            self.build_credit(&offered, Encumbrance::ed25519(depositor), cents)?;
        for u in chosen.iter().filter_map(|&i| offered.get(i)) {
            reserve.remove(u.id().as_slice())?;
        }
        tx.open_table(CREDITS)?
            .insert(intent.tx.txid().as_slice(), intent.encode().as_slice())?;
        Ok(intent)
    }

    /// Builds a credit again after its transactions expired unapplied ([`florin_ledger::expiry`]):
    /// the same payment to the same depositor, from `unspent` (the credit's reserve outputs
    /// still unspent: the ones it was built from and those of joins that did apply), under a
    /// fresh expiry. The new intent replaces the old one in one registry write, and any of
    /// `unspent` the new payment does not spend goes back to the reserve table (the old intent
    /// took them out of it), so the reserve's books stay whole.
    pub(crate) fn renew_credit(
        &self,
        old: &CreditIntent,
        unspent: &[Utxo],
    ) -> Result<CreditIntent, NodeError> {
        let (intent, chosen) =
            self.build_credit(unspent, old.credit.encumbrance, old.credit.value)?;
        let unused: Vec<Utxo> = unspent
            .iter()
            .enumerate()
            .filter(|(i, _)| !chosen.contains(i))
            .map(|(_, u)| *u)
            .collect();
        let (old_key, new_key, value) = (old.tx.txid(), intent.tx.txid(), intent.encode());
        self.transact(|tx| {
            let mut credits = tx.open_table(CREDITS)?;
            if credits.remove(old_key.as_slice())?.is_none() {
                return Err(NodeError::storage(
                    "the credit to renew is no longer pending (renewed or finished elsewhere)",
                ));
            }
            credits.insert(new_key.as_slice(), value.as_slice())?;
            let mut reserve = tx.open_table(RESERVE)?;
            for u in &unused {
                reserve.insert(u.id().as_slice(), u.encode().as_slice())?;
            }
            Ok(())
        })?;
        Ok(intent)
    }

    /// Marks a credit confirmed on the ledger: its change joins the reserve.
    pub fn finish_credit(&self, intent: &CreditIntent) -> Result<(), NodeError> {
        let txid = intent.tx.txid();
        self.transact(|tx| {
            let mut credits = tx.open_table(CREDITS)?;
            if credits.remove(txid.as_slice())?.is_some() {
                if let Some(c) = &intent.change {
                    tx.open_table(RESERVE)?
                        .insert(c.id().as_slice(), c.encode().as_slice())?;
                }
            }
            Ok(())
        })
    }

    /// Credits recorded but not confirmed (to resubmit after a restart).
    pub fn pending_credits(&self) -> Result<Vec<CreditIntent>, NodeError> {
        let tx = self.db().begin_read()?;
        let t = tx.open_table(CREDITS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (_, v) = item?;
            out.push(CreditIntent::decode(v.value()).ok_or(Corrupt::Record("credit intent"))?);
        }
        Ok(out)
    }

    /// Withdraws: `tx` is a confirmed ledger transfer whose output `index` pays the reserve;
    /// the authority mints tokens of that value to `recipient` under `handshake`. Asking again
    /// for the same output returns the same tokens. `confirmed` and `unspent` are the ledger's
    /// answers for the transfer and the output.
    ///
    /// Bound to whoever paid: `auth` is a signature by the key of one of the transfer's
    /// inputs over [`crate::api::withdraw_message`] (txid, output, recipient, handshake). It is
    /// checked before anything is minted and before a repeat is answered with the stored
    /// tokens, so someone who only saw the transaction gets nothing. The recipient must be a
    /// usable key.
    #[allow(clippy::too_many_arguments)]
    pub fn withdraw(
        &self,
        tx: &Transaction,
        index: usize,
        recipient: &PublicKey,
        handshake: [u8; 32],
        auth: Option<&WithdrawAuth>,
        confirmed: bool,
        unspent: bool,
    ) -> Result<Vec<Token>, NodeError> {
        check_usable(recipient, "recipient")?;
        let recipient = *recipient;
        let Transaction::Transfer(t) = tx else {
            return Err(WithdrawalRefused::NotATransfer.into());
        };
        check_withdraw_auth(t, index, &recipient, &handshake, auth)?;
        // A revoked key may not withdraw: neither to itself nor by authorizing it.
        self.check_not_revoked(&recipient, "recipient")?;
        if let Some(WithdrawAuth {
            key: InputKey::Ed25519(k),
            ..
        }) = auth
        {
            self.check_not_revoked(k, "signer")?;
        }
        let out = t
            .output_utxos()
            .get(index)
            .copied()
            .ok_or(WithdrawalRefused::NoSuchOutput)?;
        if out.encumbrance != Encumbrance::ed25519(&self.public_key()) {
            return Err(WithdrawalRefused::NotToReserve.into());
        }
        let id = out.id();
        // Tokens made now (not a repeat's stored ones), for the metrics.
        let minted = std::cell::Cell::new(0u64);
        let tokens = self.transact(|wtx| {
            minted.set(0);
            // Again inside the transaction (the checks above may have read a lagging replica).
            Self::check_not_revoked_in(wtx, &recipient, "recipient")?;
            if let Some(WithdrawAuth {
                key: InputKey::Ed25519(k),
                ..
            }) = auth
            {
                Self::check_not_revoked_in(wtx, k, "signer")?;
            }
            let tokens;
            {
                let mut w = wtx.open_table(WITHDRAWALS)?;
                if let Some(v) = w.get(id.as_slice())? {
                    // A repeat: the stored tokens, also after the ledger has forgotten the
                    // payment's txid and a credit has spent its reserve output.
                    return decode_tokens(v.value());
                }
                if !confirmed {
                    return Err(WithdrawalRefused::NotConfirmed.into());
                }
                if !unspent {
                    return Err(WithdrawalRefused::AlreadySpent.into());
                }
                tokens = self.mint_in(
                    wtx,
                    recipient,
                    &Denomination::spendable_split(out.value),
                    handshake,
                )?;
                w.insert(id.as_slice(), encode_tokens(&tokens).as_slice())?;
                wtx.open_table(RESERVE)?
                    .insert(id.as_slice(), out.encode().as_slice())?;
            }
            minted.set(tokens.len() as u64);
            Ok(tokens)
        })?;
        florin_obs::metrics::global().token_event("minted", minted.get());
        Ok(tokens)
    }

    /// The authority's side of the audit: (reserve cents, tokens outstanding cents). Reserve
    /// outputs being spent by a credit in flight still count until the credit is confirmed.
    pub fn audit_parts(&self) -> Result<(u64, u64), NodeError> {
        let tx = self.db().begin_read()?;
        let mut reserve = 0u64;
        for item in tx.open_table(RESERVE)?.iter()? {
            let (_, v) = item?;
            reserve += Utxo::decode(v.value()).map_err(Corrupt::from)?.value;
        }
        for item in tx.open_table(CREDITS)?.iter()? {
            let (_, v) = item?;
            let i = CreditIntent::decode(v.value()).ok_or(Corrupt::Record("credit intent"))?;
            if let Transaction::Transfer(t) = &i.tx {
                reserve += t.inputs.iter().map(|u| u.value).sum::<u64>();
            }
        }
        let mut outstanding = 0u64;
        for item in tx.open_table(TOKENS)?.iter()? {
            let (_, v) = item?;
            let r = TokenRecord::decode(v.value()).map_err(Corrupt::from)?;
            if r.status == TokenStatus::InCirculation {
                outstanding += r.value.cents();
            }
        }
        Ok((reserve, outstanding))
    }
}

/// Combines the ledger's books and the authority's into the audit.
pub fn audit(supply: florin_ledger::Supply, reserve: u64, outstanding: u64) -> Audit {
    let circulating = supply.unspent_cents.saturating_sub(reserve);
    let issued = supply.minted_cents.saturating_sub(supply.redeemed_cents);
    Audit {
        minted_cents: supply.minted_cents,
        redeemed_cents: supply.redeemed_cents,
        ledger_supply_cents: supply.unspent_cents,
        reserve_cents: reserve,
        ledger_circulating_cents: circulating,
        tokens_outstanding_cents: outstanding,
        balanced: supply.unspent_cents >= reserve
            && supply.unspent_cents == issued
            && issued == circulating + outstanding,
        issued_journal_cents: None,
        reserve_outputs_checked: 0,
        problems: Vec::new(),
    }
}

/// The key that signs a withdrawal: an Ed25519 key, or a P-256 key (an input's encumbrance is
/// its hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKey {
    /// An Ed25519 key.
    Ed25519(PublicKey),
    /// A compressed P-256 key.
    P256(florin_crypto::P256PublicKey),
}

/// A withdrawal's authorization: the key of one of the paying transfer's inputs and its
/// signature over [`crate::api::withdraw_message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WithdrawAuth {
    /// The key.
    pub key: InputKey,
    /// The signature (Ed25519, or P-256 `r || s`).
    pub signature: [u8; 64],
}

impl WithdrawAuth {
    /// Parses the key (32 bytes for Ed25519, 33 for a compressed P-256 key) and the signature
    /// as a request carries them, in hex.
    pub fn parse(key_hex: &str, sig_hex: &str) -> Result<WithdrawAuth, WithdrawAuthError> {
        let key = hex::decode(key_hex).map_err(|_| WithdrawAuthError::KeyNotHex)?;
        let signature = hex::decode(sig_hex)
            .ok()
            .and_then(|s| <[u8; 64]>::try_from(s.as_slice()).ok())
            .ok_or(WithdrawAuthError::SignatureNotHex)?;
        let key = match key.len() {
            32 => {
                let mut k = [0u8; 32];
                k.copy_from_slice(&key);
                InputKey::Ed25519(PublicKey(k))
            }
            33 => InputKey::P256(
                florin_crypto::P256PublicKey::from_sec1(&key)
                    .map_err(WithdrawAuthError::P256Key)?,
            ),
            n => return Err(WithdrawAuthError::KeyLength(n)),
        };
        Ok(WithdrawAuth { key, signature })
    }
}

/// Checks a withdrawal's authorization: the key must be the key of one of `t`'s inputs (an
/// Ed25519 key, or a P-256 key whose hash is the input's encumbrance) and the signature must
/// verify on [`crate::api::withdraw_message`].
fn check_withdraw_auth(
    t: &Transfer,
    index: usize,
    recipient: &PublicKey,
    handshake: &[u8; 32],
    auth: Option<&WithdrawAuth>,
) -> Result<(), WithdrawAuthError> {
    let Some(auth) = auth else {
        return Err(WithdrawAuthError::Missing);
    };
    let msg = crate::api::withdraw_message(&t.txid(), index as u64, recipient, handshake);
    let owns = |e: Encumbrance| t.inputs.iter().any(|u| u.encumbrance == e);
    match &auth.key {
        InputKey::Ed25519(k) => {
            if !owns(Encumbrance::ed25519(k)) {
                return Err(WithdrawAuthError::NotAnInput);
            }
            florin_crypto::verify(k, &msg, &Signature(auth.signature))
                .map_err(WithdrawAuthError::Signature)
        }
        InputKey::P256(k) => {
            if !owns(Encumbrance::p256(k)) {
                return Err(WithdrawAuthError::NotAnInput);
            }
            florin_crypto::verify_p256(k, &msg, &florin_crypto::P256Signature(auth.signature))
                .map_err(WithdrawAuthError::P256Signature)
        }
    }
}

fn encode_tokens(tokens: &[Token]) -> Vec<u8> {
    let mut out = Vec::new();
    for t in tokens {
        let b = t.encode();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
    }
    out
}

fn decode_tokens(mut b: &[u8]) -> Result<Vec<Token>, NodeError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let n = b
            .get(..4)
            .and_then(|x| x.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or(Corrupt::Record("withdrawal"))? as usize;
        let t = b.get(4..4 + n).ok_or(Corrupt::Record("withdrawal"))?;
        out.push(Token::decode(t).map_err(Corrupt::from)?);
        b = &b[4 + n..];
    }
    Ok(out)
}

/// The txid of an intent.
pub fn intent_txid(i: &CreditIntent) -> Digest {
    i.tx.txid()
}

/// A handoff message carrying one UTXO preimage (the wallet's format: version, count, UTXOs).
fn wallet_handoff(u: &Utxo) -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&u.encode());
    out
}

/// Submits a recorded credit to the ledger and, once confirmed, hands the new output off to
/// the depositor's mailbox and finishes it.
pub async fn settle_credit(
    authority: &std::sync::Arc<Authority>,
    ledger: &std::sync::Arc<crate::ledger::Ledger>,
    intent: CreditIntent,
) -> Result<crate::api::CreditInfo, NodeError> {
    // Its own task: a caller that goes away (a client that disconnects) does not stop a credit
    // half way, with its joins confirmed and the payment not sent.
    let (a, l) = (authority.clone(), ledger.clone());
    tokio::spawn(async move { settle_chain(&a, &l, intent).await })
        .await
        .map_err(|e| NodeError::task("credit task", e))?
}

/// Whether every input of `tx` is spent on the ledger.
fn all_inputs_spent(ledger: &crate::ledger::Ledger, tx: &Transaction) -> Result<bool, NodeError> {
    for u in florin_ledger::validate::inputs_of(tx) {
        if ledger.is_unspent(&u.id())? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether a credit's payment applied, told by the ledger's unspent set alone (its txid may be
/// forgotten). An id not unspent is spent *or never existed*, so "every input spent" proves a
/// transaction applied only for inputs known to have existed: the original reserve outputs
/// (confirmed when they joined the reserve, and spent only by this credit). So each join must
/// have applied (its inputs, original reserve outputs, all spent) before the payment's inputs,
/// some of which are the joins' outputs, say anything.
fn credit_applied(
    ledger: &crate::ledger::Ledger,
    intent: &CreditIntent,
) -> Result<bool, NodeError> {
    for join in &intent.before {
        if !all_inputs_spent(ledger, join)? {
            return Ok(false);
        }
    }
    all_inputs_spent(ledger, &intent.tx)
}

async fn settle_chain(
    authority: &std::sync::Arc<Authority>,
    ledger: &std::sync::Arc<crate::ledger::Ledger>,
    intent: CreditIntent,
) -> Result<crate::api::CreditInfo, NodeError> {
    if let Some(info) = settle_once(authority, ledger, &intent).await? {
        return Ok(info);
    }
    // Expired unapplied (the node was down longer than the credit's validity): the same
    // credit again from the reserve outputs it still holds, under a fresh expiry. First wait
    // until no ledger could still apply the old one: a sentinel whose clock lags this one's by
    // up to the tolerated skew may still pass it, and shards take their clock from sentinels.
    let last_expiry = intent
        .transactions()
        .map(Transaction::expires)
        .max()
        .unwrap_or(0);
    while !florin_ledger::expiry::expired_for_good(last_expiry, florin_ledger::expiry::unix_now()) {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    if let Some(info) = settle_once(authority, ledger, &intent).await? {
        // It applied after all (a lagging sentinel passed it meanwhile).
        return Ok(info);
    }
    let l = ledger.clone();
    let old = intent.clone();
    let unspent = tokio::task::spawn_blocking(move || -> Result<Vec<Utxo>, NodeError> {
        // The original reserve outputs and the outputs of joins that applied; never the
        // payment's own outputs (they exist only if it applied, and then nothing is renewed).
        let mut candidates: Vec<Utxo> = Vec::new();
        for t in old.transactions() {
            candidates.extend(florin_ledger::validate::inputs_of(t).iter().copied());
        }
        for t in &old.before {
            if let Transaction::Transfer(t) = t {
                candidates.extend(t.output_utxos());
            }
        }
        candidates.sort_by_key(|u| u.id());
        candidates.dedup();
        let mut unspent = Vec::new();
        for u in candidates {
            if l.is_unspent(&u.id())? {
                unspent.push(u);
            }
        }
        Ok(unspent)
    })
    .await
    .map_err(|e| NodeError::task("worker", e))??;
    let a = authority.clone();
    let renewed = tokio::task::spawn_blocking(move || a.renew_credit(&intent, &unspent))
        .await
        .map_err(|e| NodeError::task("worker", e))??;
    settle_once(authority, ledger, &renewed)
        .await?
        .ok_or_else(|| {
            NodeError::storage(format!(
                "credit {} expired again as soon as it was renewed: check this node's clock",
                hex::encode(renewed.tx.txid())
            ))
        })
}

/// One try of a credit: its answer, or `None` when it expired unapplied and must be built
/// again.
async fn settle_once(
    authority: &std::sync::Arc<Authority>,
    ledger: &std::sync::Arc<crate::ledger::Ledger>,
    intent: &CreditIntent,
) -> Result<Option<crate::api::CreditInfo>, NodeError> {
    use crate::api::{CreditInfo, LedgerTxStatus};
    use crate::ledger::TxStatus;
    let intent = intent.clone();
    // A payment answered expired applied before its expiry if it and its joins spent their
    // inputs ([`credit_applied`]).
    let (l, whole) = (ledger.clone(), intent.clone());
    let pay_applied = move || {
        let (l, whole) = (l.clone(), whole.clone());
        async move {
            tokio::task::spawn_blocking(move || credit_applied(&l, &whole))
                .await
                .map_err(|e| NodeError::task("worker", e))?
        }
    };
    // The joins spend original reserve outputs only, never each other's: submitted together.
    // The payment spends their outputs, so it goes once all are confirmed. Resubmitting a
    // confirmed transaction is answered confirmed.
    if !intent.before.is_empty() {
        let answers = ledger.submit_many(intent.before.clone()).await?;
        if let Some((txid, status)) = answers.iter().find(|(_, s)| *s != TxStatus::Confirmed) {
            if matches!(status, TxStatus::Expired(_)) && !pay_applied().await? {
                return Ok(None);
            }
            if !matches!(status, TxStatus::Expired(_)) {
                // The join that is not confirmed, by its own txid: the payment was not sent.
                let answer = LedgerTxStatus::of(txid, status);
                return Ok(Some(CreditInfo {
                    txid: answer.txid,
                    status: answer.status,
                    output: hex::encode(intent.credit.encode()),
                }));
            }
        }
    }
    let (txid, mut status) = ledger.submit(intent.tx.clone()).await?;
    if let TxStatus::Expired(_) = status {
        if pay_applied().await? {
            status = TxStatus::Confirmed;
        } else {
            return Ok(None);
        }
    }
    let answer = LedgerTxStatus::of(&txid, &status);
    if status == TxStatus::Confirmed {
        let a = authority.clone();
        let i = intent.clone();
        tokio::task::spawn_blocking(move || {
            // The handoff (Hamilton 3.7): the depositor's wallet collects the preimage of its
            // new output from its mailbox, even if this answer is lost.
            let owner = PublicKey(i.credit.encumbrance.key);
            let msg = wallet_handoff(&i.credit);
            let sealed = florin_crypto::sealed::seal(&owner, &msg, &mut rand::rngs::OsRng)
                .map_err(crate::error::BadRequest::from)?;
            a.mailbox_put_own(&owner, &sealed)?;
            a.finish_credit(&i)
        })
        .await
        .map_err(|e| NodeError::task("worker", e))??;
    }
    Ok(Some(CreditInfo {
        txid: answer.txid,
        status: answer.status,
        output: hex::encode(intent.credit.encode()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use florin_crypto::{LocalSigner, SecretKey, Signer};
    use florin_ledger::build;

    fn coins(owner: &PublicKey, n: usize) -> Vec<Utxo> {
        (0..n)
            .map(|i| Utxo {
                value: 1,
                encumbrance: Encumbrance::ed25519(owner),
                serial: florin_crypto::hash("test/reserve", &[&(i as u64).to_le_bytes()]),
            })
            .collect()
    }

    fn intent(n: usize) -> CreditIntent {
        let reserve = LocalSigner::new(SecretKey::from_seed(&[9; 32]));
        let depositor = LocalSigner::new(SecretKey::from_seed(&[2; 32])).public_key();
        let me = Encumbrance::ed25519(&reserve.public_key());
        let pay = Output {
            value: n as u64 - 1,
            encumbrance: Encumbrance::ed25519(&depositor),
        };
        let drafts =
            build::payment_chain(&coins(&reserve.public_key(), n), pay, me).expect("chain");
        let mut txs: Vec<Transaction> = drafts
            .into_iter()
            .map(|d| {
                let k = d.transfer.inputs.len();
                Transaction::Transfer(d.sign(&vec![&reserve as &dyn Signer; k]).expect("sign"))
            })
            .collect();
        let tx = txs.pop().expect("payment");
        let Transaction::Transfer(t) = &tx else {
            unreachable!()
        };
        let created = t.output_utxos();
        CreditIntent {
            before: txs,
            credit: created[0],
            change: created.get(1).copied(),
            tx,
        }
    }

    #[test]
    fn an_expired_credit_is_renewed_from_the_reserve_outputs_it_still_holds() {
        let dir = tempfile::tempdir().expect("dir");
        let signer = LocalSigner::new(SecretKey::from_seed(&[9; 32]));
        let a = Authority::open(
            crate::AuthorityConfig::devnet(dir.path()),
            std::sync::Arc::new(signer.clone()),
        )
        .expect("open");
        let depositor = LocalSigner::new(SecretKey::from_seed(&[2; 32])).public_key();
        // A reserve of many one-cent outputs: the credit needs joins first.
        let n = florin_ledger::tx::MAX_IO + 200;
        let reserve = coins(&signer.public_key(), n);
        let cents = florin_ledger::tx::MAX_IO as u64 + 100;
        a.transact(|tx| {
            let mut t = tx.open_table(RESERVE)?;
            for u in &reserve {
                t.insert(u.id().as_slice(), u.encode().as_slice())?;
            }
            Ok(())
        })
        .expect("reserve");
        let old = a
            .transact(|tx| a.record_credit(tx, &depositor, cents))
            .expect("credit");
        assert!(!old.before.is_empty());
        // None of it applied: every reserve output it chose is still unspent.
        let chosen: Vec<Utxo> = old
            .transactions()
            .flat_map(|t| florin_ledger::validate::inputs_of(t).to_vec())
            .filter(|u| reserve.contains(u))
            .collect();
        let renewed = a.renew_credit(&old, &chosen).expect("renew");
        assert_eq!(
            (renewed.credit.value, renewed.credit.encumbrance),
            (cents, Encumbrance::ed25519(&depositor))
        );
        assert!(renewed.tx.expires() >= old.tx.expires());
        let pending = a.pending_credits().expect("pending");
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].tx.txid(), renewed.tx.txid());
        // Spends exactly what the old one would have, through joins of its own.
        let spent = |i: &CreditIntent| -> u64 {
            i.transactions()
                .flat_map(|t| florin_ledger::validate::inputs_of(t).to_vec())
                .filter(|u| reserve.contains(u))
                .map(|u| u.value)
                .sum()
        };
        assert_eq!(spent(&renewed), spent(&old));
        // A credit no longer pending (finished, or renewed elsewhere) is not renewed.
        a.finish_credit(&renewed).expect("finish");
        assert!(a.renew_credit(&renewed, &chosen).is_err());
        assert!(a.pending_credits().expect("pending").is_empty());
    }

    #[test]
    fn intents_round_trip_with_and_without_joins() {
        for n in [3, florin_ledger::tx::MAX_IO + 5] {
            let i = intent(n);
            assert_eq!(i.before.len(), usize::from(n > 3) * 2);
            let b = i.encode();
            let d = CreditIntent::decode(&b).expect("decodes");
            assert_eq!(d.transactions().count(), i.transactions().count());
            assert_eq!(d.encode(), b);
            // Cut anywhere, or a trailing byte: refused, not misread.
            for cut in [1, 5, 9, b.len() / 2, b.len() - 1] {
                assert!(CreditIntent::decode(&b[..cut]).is_none(), "cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(CreditIntent::decode(&long).is_none());
        }
        // A join count no record could hold is refused before anything is allocated.
        let mut huge = WITH_JOINS.to_le_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(CreditIntent::decode(&huge).is_none());
    }
}
