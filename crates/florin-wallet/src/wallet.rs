//! Wallet state and the operations on it.

use std::collections::{BTreeMap, HashMap, HashSet};

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signature, Signer};
use florin_token::amount::format_cents;
use florin_token::verify::{client_precheck, verify_chains};
use florin_token::{
    ClientPolicy, Denomination, FraudProof, Handshake, Payment, PaymentRequest, Serial, Token,
    TokenError,
};
use rand::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use zeroize::Zeroizing;

use crate::select::select_exact;
use crate::store::StoreError;

/// Default most offline hops accepted in an incoming token.
pub const DEFAULT_MAX_HOPS: usize = 64;
/// Default most money held as tokens received offline: €1,000.
pub const DEFAULT_MAX_OFFLINE_CENTS: u64 = 100_000;
/// Largest hop limit a wallet may set (bounds token size and verification work).
pub const MAX_HOPS_LIMIT: usize = 1024;
/// Most tokens sent in one deposit request: a wallet with more deposits them in several
/// (the node's body limit for a deposit is sized for this many tokens of 64 hops).
pub const MAX_DEPOSIT_PER_REQUEST: usize = 1_000;
/// The wallet file's format: 3 since backup words, history and moves (format 1 files still
/// load; 2 is the encrypted envelope around a format-3 wallet, `store.rs`). A version that
/// knows only format 1 says "unknown wallet format 3" instead of taking the new fields for
/// damage.
const FILE_FORMAT: u32 = 3;

/// Why a wallet operation failed. Nothing in the wallet changes when one is returned.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WalletError {
    /// Loading or saving failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The wallet does not know which authority to trust yet.
    #[error(
        "this wallet trusts no authority yet: connect it to a node (faucet) or pass --authority"
    )]
    NoAuthority,
    /// Not enough money.
    #[error("insufficient funds: €{} held, €{} needed", format_cents(*have), format_cents(*need))]
    InsufficientFunds {
        /// Cents held.
        have: u64,
        /// Cents needed.
        need: u64,
    },
    /// No subset of the held tokens adds up to the amount.
    #[error("exact change is impossible: no combination of your tokens ({holdings}) makes €{}; \
             ask for another amount or deposit to re-anchor", format_cents(*amount))]
    NoExactChange {
        /// The amount.
        amount: u64,
        /// What the wallet holds, by denomination.
        holdings: String,
    },
    /// A payment whose handshake this wallet did not issue, or already used.
    #[error("this payment answers no open request of this wallet (replayed, or already accepted)")]
    UnknownRequest,
    /// A payment or request addressed to another key.
    #[error("payment is addressed to {0}, not to this wallet")]
    WrongPayee(PublicKey),
    /// The payment does not carry the amount requested.
    #[error("payment carries €{}, the request asked for €{}", format_cents(*got), format_cents(*asked))]
    AmountMismatch {
        /// Requested.
        asked: u64,
        /// Carried.
        got: u64,
    },
    /// A token failed verification.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// A serial appears twice, or is already in the purse.
    #[error("token {0} appears twice or is already held (replay)")]
    DuplicateSerial(String),
    /// Accepting would exceed the offline holding limit.
    #[error("accepting would hold €{} received offline, over the limit of €{}; deposit first",
            format_cents(*would_hold), format_cents(*limit))]
    OfflineLimit {
        /// The limit.
        limit: u64,
        /// Offline money after accepting.
        would_hold: u64,
    },
    /// Not enough tokens within the payee's hop limit.
    #[error("only €{} of your tokens are within the payee's limit of {max_hops} offline hops; \
             deposit to re-anchor them", format_cents(*eligible))]
    TooManyHops {
        /// The payee's limit.
        max_hops: u16,
        /// Value of the tokens within it.
        eligible: u64,
    },
    /// The payment needs more coins than one ledger transaction takes.
    #[error("this payment needs {needed} coins, more than the {max} one ledger transaction takes: consolidate first (`florin wallet pay` does it by itself)")]
    TooManyInputs {
        /// Coins the payment needs.
        needed: usize,
        /// Most inputs of one transaction.
        max: usize,
    },
    /// A ledger transaction is already in flight.
    #[error("a ledger transaction is still in flight: run `florin wallet sync` to settle it")]
    Busy,
    /// Too many requests issued and not yet paid.
    #[error("{0} payment requests are open and unpaid; no more until some are paid")]
    TooManyOpenRequests(usize),
    /// Paying oneself.
    #[error("refusing to pay this wallet's own request")]
    PayingSelf,
    /// A payment request for nothing (no payment of tokens can answer it).
    #[error("a payment request must be for more than €0.00")]
    ZeroRequest,
    /// Signing failed.
    #[error("signing failed: {0}")]
    Signing(String),
    /// The payee's address is not a usable key (not a curve point, non-canonical, or of small
    /// order): money sent to it would be lost. Refused before anything is signed.
    #[error("refusing to pay an invalid address: {0}")]
    InvalidAddress(florin_crypto::KeyError),
    /// The ledger transaction could not be built (see [`florin_ledger::BuildError`]).
    #[error("cannot build the ledger transaction: {0}")]
    Build(florin_ledger::BuildError),
}

/// How the wallet holds a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    /// Issued or re-anchored by the authority directly to this wallet (one link).
    Verified,
    /// Received offline: the chain verifies, but the authority has not seen it yet.
    Offline,
}

#[derive(Serialize, Deserialize)]
struct HeldToken {
    state: TokenState,
    token: String,
}

#[derive(Serialize, Deserialize, Clone)]
struct IssuedRequest {
    handshake: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, Clone)]
struct SentPayment {
    handshake: String,
    payee: PublicKey,
    payment: String,
    /// Sent over a device channel: a receipt is expected.
    #[serde(default)]
    via_peer: bool,
    /// Amount, for the balance of undelivered payments.
    #[serde(default)]
    amount_cents: u64,
    /// The payee's receipt came back.
    #[serde(default)]
    delivered: bool,
    /// The payee refused the payment (its reason); it is not retried.
    #[serde(default)]
    refused: Option<String>,
}

/// Most entries the wallet's history keeps (the oldest go first).
pub const MAX_HISTORY: usize = 1_000;

/// One line of the wallet's history: what moved, when, with whom, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// When (Unix seconds).
    pub at: u64,
    /// `faucet`, `pay`, `receive`, `withdraw`, `deposit`, `offline_pay` or `offline_receive`.
    pub kind: String,
    /// The amount in cents.
    pub cents: u64,
    /// The other side's address, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counterparty: Option<PublicKey>,
    /// How it ended: `confirmed`, `refused`, `signed`, `accepted`, `credited`, ….
    pub status: String,
    /// The transaction id or the request's handshake (hex), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// Most payment requests open at once.
pub const MAX_OPEN_REQUESTS: usize = 1_000;

/// A payment this wallet accepted: a retried delivery of it is acknowledged, not counted again.
#[derive(Serialize, Deserialize, Clone)]
struct ReceivedPayment {
    handshake: String,
    digest: String,
    amount_cents: u64,
}

fn payment_digest(p: &Payment) -> String {
    hex::encode(florin_crypto::hash(
        "florin/wallet/received/v1",
        &[&p.encode()],
    ))
}

/// Tokens signed over to the authority whose deposit has not been answered yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingDeposit {
    /// The handshake the re-anchored tokens must carry.
    pub handshake: String,
    /// The tokens, hex, each ending with a link to the authority.
    pub tokens: Vec<String>,
    /// Credit the ledger (true) or re-anchor (false); a resumed deposit keeps its mode.
    #[serde(default)]
    pub credit: bool,
}

/// The wallet file. Unknown fields are refused: they are either damage (a wallet file's
/// checksum line with a changed byte would otherwise read as an old file without one) or a newer
/// wallet's state, which saving with this version would silently drop.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WalletFile {
    format: u32,
    secret_key: String,
    /// The backup words (absent in wallets made before backups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backup_words: Option<String>,
    /// Where `florin wallet export` moved this wallet (it then refuses to spend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    moved_to: Option<String>,
    /// What moved, newest last (at most [`MAX_HISTORY`]).
    #[serde(default, skip_serializing_if = "std::collections::VecDeque::is_empty")]
    history: std::collections::VecDeque<HistoryEntry>,
    public_key: PublicKey,
    authority: Option<PublicKey>,
    max_hops: usize,
    max_offline_cents: u64,
    tokens: Vec<HeldToken>,
    requests: Vec<IssuedRequest>,
    seen_proofs: Vec<String>,
    sent: Vec<SentPayment>,
    pending_deposit: Option<PendingDeposit>,
    #[serde(default)]
    received: Vec<ReceivedPayment>,
    #[serde(default)]
    online: crate::online::OnlinePurse,
}

/// Count and value of one denomination.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DenominationCount {
    /// e.g. "5.00".
    pub denomination: String,
    /// Tokens of it.
    pub count: usize,
    /// Their value.
    pub cents: u64,
}

/// What the wallet holds.
#[derive(Debug, Clone, Serialize)]
pub struct Balance {
    /// The wallet's address.
    pub address: String,
    /// Tokens issued to this wallet by the authority.
    pub verified: Vec<DenominationCount>,
    /// Their value.
    pub verified_cents: u64,
    /// Tokens received offline, not yet seen by the authority.
    pub offline: Vec<DenominationCount>,
    /// Their value.
    pub offline_cents: u64,
    /// Value signed to the authority, awaiting its answer.
    pub pending_deposit_cents: u64,
    /// Money on the online ledger.
    pub online_cents: u64,
    /// Paid to the reserve, tokens not yet received.
    pub withdrawing_cents: u64,
    /// Paid over a device channel, the payee's receipt not yet received (no longer this
    /// wallet's money; not in the total).
    pub undelivered_cents: u64,
    /// All money the wallet holds.
    pub total_cents: u64,
}

/// The outcome of one deposited token, as the authority answered.
#[derive(Debug, Clone)]
pub enum DepositItem {
    /// Clean: the re-anchored token.
    Reanchored(Token),
    /// Double spent somewhere in its history.
    DoubleSpend {
        /// The serial.
        serial: Serial,
        /// The proof.
        proof: Box<FraudProof>,
    },
    /// Clean: taken out of circulation, its value credited on the ledger.
    Credited {
        /// The serial.
        serial: Serial,
    },
    /// Refused.
    Refused {
        /// The serial.
        serial: Serial,
        /// The authority's reason.
        reason: String,
        /// Whether retrying later may succeed (the token stays pending).
        retry: bool,
    },
}

/// What a finished deposit did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DepositResult {
    /// Value credited back as verified tokens.
    pub credited_cents: u64,
    /// Tokens re-anchored.
    pub reanchored: usize,
    /// Fraud found: (serial hex, culprit address, proof hex).
    pub fraud: Vec<(String, String, String)>,
    /// Tokens refused: (serial hex, reason).
    pub refused: Vec<(String, String)>,
    /// Value lost to fraud or refusal.
    pub lost_cents: u64,
    /// Tokens still pending (to retry).
    pub still_pending: usize,
}

impl DepositResult {
    /// Adds the outcomes of another part of the same deposit.
    pub fn absorb(&mut self, other: DepositResult) {
        self.credited_cents += other.credited_cents;
        self.reanchored += other.reanchored;
        self.fraud.extend(other.fraud);
        self.refused.extend(other.refused);
        self.lost_cents += other.lost_cents;
        self.still_pending += other.still_pending;
    }
}

/// A wallet in memory.
pub struct Wallet {
    signer: LocalSigner,
    /// The backup words the keys derive from (`None` for wallets made before backups).
    words: Option<crate::backup::Words>,
    moved_to: Option<String>,
    history: std::collections::VecDeque<HistoryEntry>,
    authority: Option<PublicKey>,
    /// Most offline hops accepted.
    pub max_hops: usize,
    /// Most money held as offline tokens.
    pub max_offline_cents: u64,
    tokens: Vec<(Token, TokenState)>,
    requests: Vec<IssuedRequest>,
    seen: HashSet<Signature>,
    sent: Vec<SentPayment>,
    received: Vec<ReceivedPayment>,
    pending: Option<PendingDeposit>,
    pub(crate) online: crate::online::OnlinePurse,
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    hex::decode(s)
        .ok()
        .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
}

fn counts(tokens: &[&Token]) -> (Vec<DenominationCount>, u64) {
    let mut m: BTreeMap<Denomination, usize> = BTreeMap::new();
    for t in tokens {
        *m.entry(t.value).or_default() += 1;
    }
    let v: Vec<_> = m
        .iter()
        .rev()
        .map(|(d, c)| DenominationCount {
            denomination: format_cents(d.cents()),
            count: *c,
            cents: d.cents() * *c as u64,
        })
        .collect();
    let total = v.iter().map(|x| x.cents).sum();
    (v, total)
}

impl Wallet {
    /// A new wallet with fresh backup words (its keys all derive from them).
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R, authority: Option<PublicKey>) -> Wallet {
        Wallet::from_words(crate::backup::Words::generate(rng), authority)
    }

    /// The wallet whose keys derive from `words`: a new wallet, or the keys of a lost one
    /// (its funds are then found by [`crate::flows::Flows::restore`]).
    pub fn from_words(words: crate::backup::Words, authority: Option<PublicKey>) -> Wallet {
        Wallet {
            signer: LocalSigner::new(words.master_key()),
            words: Some(words),
            moved_to: None,
            history: Default::default(),
            authority,
            max_hops: DEFAULT_MAX_HOPS,
            max_offline_cents: DEFAULT_MAX_OFFLINE_CENTS,
            tokens: Vec::new(),
            requests: Vec::new(),
            seen: HashSet::new(),
            sent: Vec::new(),
            received: Vec::new(),
            pending: None,
            online: Default::default(),
        }
    }

    /// The wallet's history, oldest first.
    pub fn history(&self) -> impl DoubleEndedIterator<Item = &HistoryEntry> {
        self.history.iter()
    }

    /// Adds a line to the history, now.
    pub fn record(
        &mut self,
        kind: &str,
        cents: u64,
        counterparty: Option<PublicKey>,
        status: &str,
        reference: Option<String>,
    ) {
        if self.history.len() >= MAX_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(HistoryEntry {
            at: florin_ledger::expiry::unix_now(),
            kind: kind.into(),
            cents,
            counterparty,
            status: status.into(),
            reference,
        });
    }

    /// Where an export moved this wallet, if it did ([`crate::StoreError::Moved`]).
    pub fn moved_to(&self) -> Option<&str> {
        self.moved_to.as_deref()
    }

    /// Marks the wallet moved to `to` (an export), or back here (`None`: an import).
    pub fn set_moved_to(&mut self, to: Option<String>) {
        self.moved_to = to;
    }

    /// The backup words this wallet's keys derive from; `None` for a wallet created before
    /// backup words existed (its key is random: back up the file, or move the funds to a new
    /// wallet).
    pub fn backup_words(&self) -> Option<&crate::backup::Words> {
        self.words.as_ref()
    }

    /// The wallet's key.
    pub fn public_key(&self) -> PublicKey {
        self.signer.public_key()
    }

    /// The wallet's signer (also its identity on device channels).
    pub fn signer(&self) -> &LocalSigner {
        &self.signer
    }

    /// The trusted authority, if known.
    pub fn authority(&self) -> Option<PublicKey> {
        self.authority
    }

    /// Sets the trusted authority.
    pub fn set_authority(&mut self, key: PublicKey) {
        self.authority = Some(key);
    }

    fn policy(&self) -> Result<ClientPolicy, WalletError> {
        Ok(ClientPolicy {
            trusted_authorities: vec![self.authority.ok_or(WalletError::NoAuthority)?],
            max_hops: self.max_hops,
        })
    }

    /// Payment requests issued and not yet paid: (handshake, amount in cents), oldest first.
    pub fn open_requests(&self) -> impl Iterator<Item = (Handshake, u64)> + '_ {
        self.requests.iter().filter_map(|r| {
            let h: Handshake = hex::decode(&r.handshake).ok()?.try_into().ok()?;
            Some((h, r.amount_cents))
        })
    }

    /// What the open requests hold back of the offline limit (cents).
    pub fn reserved_cents(&self) -> u64 {
        self.requests
            .iter()
            .fold(0u64, |t, r| t.saturating_add(r.amount_cents))
    }

    /// Cancels the open request with `handshake`, or every open request with `None`; returns
    /// how many were cancelled. Their reservation of the offline limit is freed. A payer who
    /// already signed a payment for a cancelled request is refused when delivering it (its
    /// tokens stay signed to this wallet): cancel only requests known not to have been paid,
    /// such as a stranger's asks to a listening wallet.
    pub fn cancel_requests(&mut self, handshake: Option<&Handshake>) -> usize {
        let before = self.requests.len();
        match handshake {
            Some(h) => {
                let h = hex::encode(h);
                self.requests.retain(|r| r.handshake != h);
            }
            None => self.requests.clear(),
        }
        before - self.requests.len()
    }

    /// Tokens held, with their state.
    pub fn tokens(&self) -> impl Iterator<Item = (&Token, TokenState)> {
        self.tokens.iter().map(|(t, s)| (t, *s))
    }

    /// What the wallet holds.
    pub fn balance(&self) -> Balance {
        let of = |st: TokenState| -> Vec<&Token> {
            self.tokens
                .iter()
                .filter(|(_, s)| *s == st)
                .map(|(t, _)| t)
                .collect()
        };
        let (verified, verified_cents) = counts(&of(TokenState::Verified));
        let (offline, offline_cents) = counts(&of(TokenState::Offline));
        let pending_deposit_cents = self.pending_tokens().iter().map(|t| t.value.cents()).sum();
        Balance {
            address: self.public_key().to_address(),
            verified,
            verified_cents,
            offline,
            offline_cents,
            pending_deposit_cents,
            online_cents: self.online_cents(),
            withdrawing_cents: self.online.awaiting_tokens.iter().map(|a| a.cents).sum(),
            undelivered_cents: self
                .sent
                .iter()
                .filter(|s| s.via_peer && !s.delivered)
                .map(|s| s.amount_cents)
                .sum(),
            total_cents: verified_cents
                + offline_cents
                + pending_deposit_cents
                + self.online_cents()
                + self
                    .online
                    .awaiting_tokens
                    .iter()
                    .map(|a| a.cents)
                    .sum::<u64>(),
        }
    }

    fn pending_tokens(&self) -> Vec<Token> {
        self.pending
            .iter()
            .flat_map(|p| p.tokens.iter())
            .filter_map(|h| hex::decode(h).ok().and_then(|b| Token::decode(&b).ok()))
            .collect()
    }

    /// A fresh handshake for tokens the authority issues to this wallet (faucet).
    pub fn fresh_handshake<R: RngCore + CryptoRng>(rng: &mut R) -> Handshake {
        let mut h = [0u8; 32];
        rng.fill_bytes(&mut h);
        h
    }

    /// Verifies tokens issued directly by the authority under `handshake` and adds them.
    pub fn accept_issued<R: RngCore + CryptoRng>(
        &mut self,
        tokens: Vec<Token>,
        handshake: &Handshake,
        rng: &mut R,
    ) -> Result<u64, WalletError> {
        let policy = ClientPolicy {
            max_hops: 0,
            ..self.policy()?
        };
        self.check_incoming(&tokens, handshake, &policy, rng)?;
        let total = tokens.iter().map(|t| t.value.cents()).sum();
        for t in tokens {
            self.remember(&t);
            self.tokens.push((t, TokenState::Verified));
        }
        Ok(total)
    }

    fn remember(&mut self, t: &Token) {
        if let Some(l) = t.links.last() {
            self.seen.insert(l.proof);
        }
    }

    /// All-or-nothing verification of incoming tokens (client verification, batched).
    fn check_incoming<R: RngCore + CryptoRng>(
        &self,
        tokens: &[Token],
        handshake: &Handshake,
        policy: &ClientPolicy,
        rng: &mut R,
    ) -> Result<(), WalletError> {
        let me = self.public_key();
        let mut serials = HashSet::new();
        let held: HashSet<Serial> = self.tokens.iter().map(|(t, _)| t.serial).collect();
        for t in tokens {
            if !serials.insert((t.authority, t.serial)) || held.contains(&t.serial) {
                return Err(WalletError::DuplicateSerial(t.serial_hex()));
            }
            client_precheck(t, &me, Some(handshake), &self.seen, policy)?;
        }
        let refs: Vec<&Token> = tokens.iter().collect();
        for r in verify_chains(&refs, rng) {
            r?;
        }
        Ok(())
    }

    /// Issues a payment request for `amount_cents` (payee side). The request carries this
    /// wallet's hop limit so the payer picks tokens it will accept; a request that the offline
    /// limit could not accept is refused now rather than after the payer has signed.
    pub fn request<R: RngCore + CryptoRng>(
        &mut self,
        amount_cents: u64,
        rng: &mut R,
    ) -> Result<PaymentRequest, WalletError> {
        if amount_cents == 0 {
            return Err(WalletError::ZeroRequest);
        }
        if self.requests.len() >= MAX_OPEN_REQUESTS {
            return Err(WalletError::TooManyOpenRequests(self.requests.len()));
        }
        // Open requests count against the limit: two requests issued before either is paid
        // cannot together exceed it.
        let open = self.reserved_cents();
        let would_hold = self
            .balance()
            .offline_cents
            .saturating_add(open)
            .saturating_add(amount_cents);
        if would_hold > self.max_offline_cents {
            return Err(WalletError::OfflineLimit {
                limit: self.max_offline_cents,
                would_hold,
            });
        }
        let handshake = Self::fresh_handshake(rng);
        self.requests.push(IssuedRequest {
            handshake: hex::encode(handshake),
            amount_cents,
        });
        Ok(PaymentRequest {
            amount_cents,
            payee: self.public_key(),
            handshake,
            max_hops: self.max_hops.min(MAX_HOPS_LIMIT) as u16,
        })
    }

    /// Pays a request (payer side): chooses tokens making exact change and passes them on.
    /// Paying the same request twice returns the same payment.
    pub fn pay(&mut self, req: &PaymentRequest) -> Result<Payment, WalletError> {
        if req.payee == self.public_key() {
            return Err(WalletError::PayingSelf);
        }
        if req.amount_cents == 0 {
            return Err(WalletError::ZeroRequest);
        }
        req.payee.validate().map_err(WalletError::InvalidAddress)?;
        let hs = hex::encode(req.handshake);
        if let Some(s) = self
            .sent
            .iter()
            .find(|s| s.handshake == hs && s.payee == req.payee)
        {
            if let Some(p) = hex::decode(&s.payment)
                .ok()
                .and_then(|b| Payment::decode(&b).ok())
            {
                return Ok(p);
            }
        }
        let have: u64 = self.tokens.iter().map(|(t, _)| t.value.cents()).sum();
        if have < req.amount_cents {
            return Err(WalletError::InsufficientFunds {
                have,
                need: req.amount_cents,
            });
        }
        // Only tokens the payee will accept (one more hop within its limit); short chains
        // first so selection prefers them.
        let mut order: Vec<usize> = (0..self.tokens.len())
            .filter(|&i| self.tokens[i].0.hops() < req.max_hops as usize)
            .collect();
        let eligible: u64 = order.iter().map(|&i| self.tokens[i].0.value.cents()).sum();
        if eligible < req.amount_cents {
            return Err(WalletError::TooManyHops {
                max_hops: req.max_hops,
                eligible,
            });
        }
        order.sort_by_key(|&i| self.tokens[i].0.hops());
        let denoms: Vec<Denomination> = order.iter().map(|&i| self.tokens[i].0.value).collect();
        let chosen = select_exact(&denoms, req.amount_cents).ok_or_else(|| {
            let refs: Vec<&Token> = order.iter().map(|&i| &self.tokens[i].0).collect();
            let holdings = counts(&refs)
                .0
                .iter()
                .map(|c| format!("{}×€{}", c.count, c.denomination))
                .collect::<Vec<_>>()
                .join(", ");
            WalletError::NoExactChange {
                amount: req.amount_cents,
                holdings,
            }
        })?;
        let mut idx: Vec<usize> = chosen.iter().map(|&k| order[k]).collect();
        idx.sort_unstable();
        let mut out = Vec::with_capacity(idx.len());
        for &i in &idx {
            let t = self.tokens[i]
                .0
                .transfer(&self.signer, req.payee, req.handshake)
                .map_err(|e| WalletError::Signing(e.to_string()))?;
            out.push(t);
        }
        for &i in idx.iter().rev() {
            self.tokens.remove(i);
        }
        let payment = Payment {
            payee: req.payee,
            handshake: req.handshake,
            tokens: out,
        };
        self.sent.push(SentPayment {
            handshake: hs,
            payee: req.payee,
            payment: hex::encode(payment.encode()),
            via_peer: false,
            amount_cents: payment.amount_cents(),
            delivered: false,
            refused: None,
        });
        self.record(
            "offline_pay",
            payment.amount_cents(),
            Some(req.payee),
            "signed",
            Some(hex::encode(req.handshake)),
        );
        Ok(payment)
    }

    /// Accepts a payment (payee side): verifies every token, all or nothing.
    pub fn accept<R: RngCore + CryptoRng>(
        &mut self,
        payment: &Payment,
        rng: &mut R,
    ) -> Result<u64, WalletError> {
        if payment.payee != self.public_key() {
            return Err(WalletError::WrongPayee(payment.payee));
        }
        let hs = hex::encode(payment.handshake);
        let ri = self
            .requests
            .iter()
            .position(|r| r.handshake == hs)
            .ok_or(WalletError::UnknownRequest)?;
        let asked = self.requests[ri].amount_cents;
        let got = payment.amount_cents();
        if got != asked {
            return Err(WalletError::AmountMismatch { asked, got });
        }
        let policy = self.policy()?;
        self.check_incoming(&payment.tokens, &payment.handshake, &policy, rng)?;
        let would_hold = self.balance().offline_cents + got;
        if would_hold > self.max_offline_cents {
            return Err(WalletError::OfflineLimit {
                limit: self.max_offline_cents,
                would_hold,
            });
        }
        for t in &payment.tokens {
            self.remember(t);
            self.tokens.push((t.clone(), TokenState::Offline));
        }
        self.requests.remove(ri);
        self.received.push(ReceivedPayment {
            handshake: hs.clone(),
            digest: payment_digest(payment),
            amount_cents: got,
        });
        self.record("offline_receive", got, None, "accepted", Some(hs));
        Ok(got)
    }

    /// Accepts a payment delivered over a device channel: like [`Wallet::accept`], except that
    /// a payment this wallet has already accepted (a retried delivery whose receipt was lost)
    /// returns its value again with `false` and changes nothing. Returns (value, newly accepted).
    pub fn accept_once<R: RngCore + CryptoRng>(
        &mut self,
        payment: &Payment,
        rng: &mut R,
    ) -> Result<(u64, bool), WalletError> {
        let hs = hex::encode(payment.handshake);
        if let Some(r) = self.received.iter().find(|r| r.handshake == hs) {
            if r.digest == payment_digest(payment) && payment.payee == self.public_key() {
                return Ok((r.amount_cents, false));
            }
            return Err(WalletError::UnknownRequest);
        }
        self.accept(payment, rng).map(|v| (v, true))
    }

    /// Pays a request received over a device channel: like [`Wallet::pay`], and the payment is
    /// remembered as undelivered until [`Wallet::mark_delivered`].
    pub fn pay_to_peer(&mut self, req: &PaymentRequest) -> Result<Payment, WalletError> {
        let p = self.pay(req)?;
        let hs = hex::encode(req.handshake);
        if let Some(s) = self
            .sent
            .iter_mut()
            .find(|s| s.handshake == hs && s.payee == req.payee)
        {
            if !s.delivered {
                s.via_peer = true;
            }
        }
        Ok(p)
    }

    /// Channel payments to `payee` whose receipt has not come back, oldest first.
    pub fn undelivered(&self, payee: &PublicKey) -> Vec<Payment> {
        self.sent
            .iter()
            .filter(|s| s.via_peer && !s.delivered && s.refused.is_none() && s.payee == *payee)
            .filter_map(|s| {
                hex::decode(&s.payment)
                    .ok()
                    .and_then(|b| Payment::decode(&b).ok())
            })
            .collect()
    }

    /// Records that the payee refused the payment answering `handshake`: it is no longer
    /// retried. The tokens stay signed to the payee (counted in `undelivered_cents`).
    pub fn mark_refused(&mut self, payee: &PublicKey, handshake: &Handshake, reason: &str) {
        let hs = hex::encode(handshake);
        if let Some(s) = self
            .sent
            .iter_mut()
            .find(|s| s.handshake == hs && s.payee == *payee)
        {
            s.refused = Some(reason.to_string());
        }
    }

    /// Records the payee's receipt for the payment answering `handshake`.
    pub fn mark_delivered(&mut self, payee: &PublicKey, handshake: &Handshake) -> bool {
        let hs = hex::encode(handshake);
        match self
            .sent
            .iter_mut()
            .find(|s| s.handshake == hs && s.payee == *payee)
        {
            Some(s) => {
                s.delivered = true;
                true
            }
            None => false,
        }
    }

    /// Starts (or resumes) a deposit of every offline token: signs each over to the authority,
    /// with one fresh handshake that the re-anchored tokens must carry (the authority takes it
    /// from these signed links). Returns `None` when there is nothing to deposit. Persist the
    /// wallet before sending.
    pub fn prepare_deposit<R: RngCore + CryptoRng>(
        &mut self,
        rng: &mut R,
    ) -> Result<Option<(Handshake, Vec<Token>)>, WalletError> {
        self.prepare_deposit_mode(rng, false)
    }

    /// Whether a deposit is in flight (signed over, not yet answered in full).
    pub fn has_pending_deposit(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether the deposit in flight credits the ledger.
    pub fn pending_deposit_credits(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.credit)
    }

    /// [`Wallet::prepare_deposit`] choosing to credit the ledger (`credit`) or re-anchor.
    pub fn prepare_deposit_mode<R: RngCore + CryptoRng>(
        &mut self,
        rng: &mut R,
        credit: bool,
    ) -> Result<Option<(Handshake, Vec<Token>)>, WalletError> {
        let authority = self.authority.ok_or(WalletError::NoAuthority)?;
        if let Some(p) = &self.pending {
            let hs = hex32(&p.handshake).unwrap_or_default();
            return Ok(Some((hs, self.pending_tokens())));
        }
        // At most MAX_DEPOSIT_PER_REQUEST at a time: the rest stay for the next part.
        let offline: Vec<usize> = (0..self.tokens.len())
            .filter(|&i| self.tokens[i].1 == TokenState::Offline)
            .take(MAX_DEPOSIT_PER_REQUEST)
            .collect();
        if offline.is_empty() {
            return Ok(None);
        }
        let handshake = Self::fresh_handshake(rng);
        let mut signed = Vec::with_capacity(offline.len());
        for &i in &offline {
            let t = self.tokens[i]
                .0
                .transfer(&self.signer, authority, handshake)
                .map_err(|e| WalletError::Signing(e.to_string()))?;
            signed.push(t);
        }
        for &i in offline.iter().rev() {
            self.tokens.remove(i);
        }
        self.pending = Some(PendingDeposit {
            handshake: hex::encode(handshake),
            tokens: signed.iter().map(|t| hex::encode(t.encode())).collect(),
            credit,
        });
        Ok(Some((handshake, signed)))
    }

    /// Applies the authority's answer to the pending deposit, item by item. An answer the
    /// wallet cannot check — a re-anchored token that does not verify, a fraud proof that is
    /// invalid or about another token — leaves that token pending, to retry; it is never
    /// written off on the authority's word alone.
    pub fn finish_deposit<R: RngCore + CryptoRng>(
        &mut self,
        items: Vec<DepositItem>,
        rng: &mut R,
    ) -> Result<DepositResult, WalletError> {
        let Some(pending) = self.pending.clone() else {
            return Ok(DepositResult::default());
        };
        let authority = self.authority.ok_or(WalletError::NoAuthority)?;
        let handshake = hex32(&pending.handshake).unwrap_or_default();
        let mut remaining: HashMap<Serial, Token> = self
            .pending_tokens()
            .into_iter()
            .map(|t| (t.serial, t))
            .collect();
        let mut res = DepositResult::default();
        let policy = ClientPolicy {
            trusted_authorities: vec![authority],
            max_hops: 0,
        };
        let me = self.public_key();
        let held: HashSet<Serial> = self.tokens.iter().map(|(t, _)| t.serial).collect();

        // Re-anchored tokens: structural checks one by one, signatures in one batch.
        let mut fresh: Vec<(Token, u64)> = Vec::new();
        for item in items {
            match item {
                DepositItem::Reanchored(t) => {
                    let Some(sent) = remaining.get(&t.serial) else {
                        continue;
                    };
                    let ok = t.value == sent.value
                        && !held.contains(&t.serial)
                        && client_precheck(&t, &me, Some(&handshake), &self.seen, &policy).is_ok();
                    if ok {
                        let v = t.value.cents();
                        fresh.push((t, v));
                    } else {
                        res.refused.push((
                            t.serial_hex(),
                            "the authority's answer did not verify; kept pending".into(),
                        ));
                    }
                }
                DepositItem::DoubleSpend { serial, proof } => {
                    let Some(sent) = remaining.get(&serial) else {
                        continue;
                    };
                    if proof.concerns(sent) && proof.verify(Some(&authority)).is_ok() {
                        let value = sent.value.cents();
                        remaining.remove(&serial);
                        let culprit = proof.culprit().map(|c| c.to_address()).unwrap_or_default();
                        res.fraud
                            .push((hex::encode(serial), culprit, hex::encode(proof.encode())));
                        res.lost_cents += value;
                    } else {
                        res.refused.push((
                            hex::encode(serial),
                            "the authority sent a fraud proof about another history; kept pending"
                                .into(),
                        ));
                    }
                }
                DepositItem::Credited { serial } => {
                    let Some(sent) = remaining.remove(&serial) else {
                        continue;
                    };
                    res.credited_cents += sent.value.cents();
                }
                DepositItem::Refused {
                    serial,
                    reason,
                    retry,
                } => {
                    let Some(sent) = remaining.get(&serial) else {
                        continue;
                    };
                    if !retry {
                        res.lost_cents += sent.value.cents();
                        remaining.remove(&serial);
                    }
                    res.refused.push((hex::encode(serial), reason));
                }
            }
        }
        let refs: Vec<&Token> = fresh.iter().map(|(t, _)| t).collect();
        let verdicts = verify_chains(&refs, rng);
        for ((t, v), verdict) in fresh.into_iter().zip(verdicts) {
            if verdict.is_err() {
                res.refused.push((
                    t.serial_hex(),
                    "the re-anchored token does not verify; kept pending".into(),
                ));
                continue;
            }
            remaining.remove(&t.serial);
            self.remember(&t);
            self.tokens.push((t, TokenState::Verified));
            res.credited_cents += v;
            res.reanchored += 1;
        }
        res.still_pending = remaining.len();
        self.pending = if remaining.is_empty() {
            None
        } else {
            // Keep the original order of what is still pending.
            let tokens = self
                .pending_tokens()
                .into_iter()
                .filter(|t| remaining.contains_key(&t.serial))
                .map(|t| hex::encode(t.encode()))
                .collect();
            Some(PendingDeposit {
                handshake: pending.handshake,
                tokens,
                credit: pending.credit,
            })
        };
        Ok(res)
    }

    /// Serializes the wallet (JSON).
    pub fn to_json(&self) -> Vec<u8> {
        let mut file = WalletFile {
            format: FILE_FORMAT,
            secret_key: self.signer.secret().to_hex(),
            backup_words: self.words.as_ref().map(|w| w.phrase().to_string()),
            moved_to: self.moved_to.clone(),
            history: self.history.clone(),
            public_key: self.public_key(),
            authority: self.authority,
            max_hops: self.max_hops,
            max_offline_cents: self.max_offline_cents,
            tokens: self
                .tokens
                .iter()
                .map(|(t, s)| HeldToken {
                    state: *s,
                    token: hex::encode(t.encode()),
                })
                .collect(),
            requests: self.requests.clone(),
            seen_proofs: self.seen.iter().map(|s| hex::encode(s.0)).collect(),
            sent: self.sent.clone(),
            pending_deposit: self.pending.clone(),
            received: self.received.clone(),
            online: self.online.clone(),
        };
        let out = serde_json::to_vec_pretty(&file).unwrap_or_default();
        // The copies of the secrets made for it; the output is the caller's to protect.
        zeroize::Zeroize::zeroize(&mut file.secret_key);
        if let Some(w) = file.backup_words.as_mut() {
            zeroize::Zeroize::zeroize(w);
        }
        out
    }

    /// Parses a wallet file.
    pub fn from_json(bytes: &[u8]) -> Result<Wallet, String> {
        let mut f: WalletFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let secrets = Zeroizing::new((
            std::mem::take(&mut f.secret_key),
            f.backup_words.take().unwrap_or_default(),
        ));
        if f.format != FILE_FORMAT && f.format != 1 {
            return Err(format!("unknown wallet format {}", f.format));
        }
        let secret = SecretKey::from_hex(&secrets.0).map_err(|e| e.to_string())?;
        if secret.public_key() != f.public_key {
            return Err("secret key does not match public key".into());
        }
        let words = match Some(secrets.1.as_str()).filter(|t| !t.is_empty()) {
            None => None,
            Some(text) => {
                let w =
                    crate::backup::Words::parse(text).map_err(|e| format!("backup words: {e}"))?;
                if w.master_key().public_key() != f.public_key {
                    return Err("the backup words do not derive this wallet's key".into());
                }
                Some(w)
            }
        };
        let mut tokens = Vec::with_capacity(f.tokens.len());
        for h in f.tokens {
            let bytes = hex::decode(&h.token).map_err(|e| e.to_string())?;
            tokens.push((Token::decode(&bytes).map_err(|e| e.to_string())?, h.state));
        }
        let mut seen = HashSet::new();
        for s in f.seen_proofs {
            let b = hex::decode(&s).map_err(|e| e.to_string())?;
            seen.insert(Signature(
                <[u8; 64]>::try_from(b.as_slice()).map_err(|_| "bad proof length")?,
            ));
        }
        Ok(Wallet {
            signer: LocalSigner::new(secret),
            words,
            moved_to: f.moved_to,
            history: f.history,
            authority: f.authority,
            max_hops: f.max_hops,
            max_offline_cents: f.max_offline_cents,
            tokens,
            requests: f.requests,
            seen,
            sent: f.sent,
            received: f.received,
            pending: f.pending_deposit,
            online: f.online,
        })
    }
}
