//! The token authority: minting, deposits (the six steps of IV-E), fraud registry.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use florin_crypto::{PublicKey, Signer};
use florin_token::authority::{settle, DepositError, Outcome, Reanchor, SettleMode};
use florin_token::registry::{TokenRecord, TokenStatus};
use florin_token::verify::{authority_precheck, verify_chains};
use florin_token::{Denomination, FraudProof, Handshake, Serial, Token, TokenError};
use rand::rngs::{OsRng, StdRng};
use rand::{RngCore, SeedableRng};
use redb::{ReadableDatabase, ReadableTable};

use crate::api::{AdminEntry, AdminLogEntry, DepositReport, FraudInfo, TokenInfo};
use crate::bridge::CreditIntent;
use crate::error::{
    BadRequest, Corrupt, Forbidden, Full, IoError, NodeError, NotFound, StorageError,
};
use crate::registry::{Committed, RegTx, Replicate};
use crate::store::{
    self, serial_key, ADMIN_LOG, BLACKLIST, FRAUD, MAILBOX, MAILBOX_AGES, MAILBOX_USAGE, META,
    OPERATOR_NONCES, REVOKED, TOKENS,
};

/// Most times a replicated registry write runs again because another came first.
pub const MAX_CONFLICTS: usize = 64;

/// Largest mailbox message.
pub const MAX_MAILBOX_MESSAGE: usize = 64 * 1024;

/// How the authority runs.
#[derive(Debug, Clone)]
pub struct AuthorityConfig {
    /// Where the registry lives.
    pub data_dir: PathBuf,
    /// Whether wallets may mint directly (devnet).
    pub faucet: bool,
    /// Largest faucet request in cents.
    pub max_faucet_cents: u64,
    /// Threads for batched signature verification (0: all cores).
    pub verify_threads: usize,
    /// Most offline hops accepted in a deposited token (bounds the work and the history).
    pub max_hops: usize,
    /// Most tokens in one deposit request.
    pub max_deposit_tokens: usize,
    /// How much the payment-handoff mailboxes keep, and for how long.
    pub mailbox: MailboxLimits,
    /// The operator keys whose signed requests are accepted for issuer and operator
    /// operations ([`crate::operator`]).
    pub operators: Vec<PublicKey>,
    /// Whether the faucet (when on) is open to anyone (the devnet) rather than to operators.
    pub faucet_open: bool,
}

/// How much the payment-handoff mailboxes keep. Anyone may leave a message (a handoff is
/// sealed to its recipient and gives a reader nothing), so what one writer can make the node
/// keep is bounded per recipient and in all, and messages are removed after `retention`.
/// A message refused for a quota is answered 429 and may be sent again later; a wallet keeps
/// its handoff queued until it is taken.
#[derive(Debug, Clone)]
pub struct MailboxLimits {
    /// Most messages waiting for one recipient.
    pub per_recipient_messages: u64,
    /// Most bytes waiting for one recipient.
    pub per_recipient_bytes: u64,
    /// Most bytes waiting in all mailboxes together.
    pub total_bytes: u64,
    /// How long a message is kept (a wallet must sync within this time to receive it).
    pub retention: std::time::Duration,
}

impl Default for MailboxLimits {
    fn default() -> Self {
        MailboxLimits {
            per_recipient_messages: 1_000,
            per_recipient_bytes: 8 << 20,
            total_bytes: 1 << 30,
            retention: std::time::Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// Expired messages removed by one mailbox write, taken or refused (the rest by the next).
const SWEEP_PER_WRITE: usize = 1_024;

fn usage_decode(v: &[u8]) -> (u64, u64) {
    let n = |r: std::ops::Range<usize>| {
        v.get(r)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0)
    };
    (n(0..8), n(8..16))
}

fn usage_encode(messages: u64, bytes: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&messages.to_le_bytes());
    out[8..].copy_from_slice(&bytes.to_le_bytes());
    out
}

fn age_key(time: u64, to: &[u8], seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(48);
    k.extend_from_slice(&time.to_be_bytes());
    k.extend_from_slice(to);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn mailbox_key(to: &[u8], seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(40);
    k.extend_from_slice(to);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Whether messages from before the quotas have been counted (`META`).
const MAILBOX_INDEXED: &str = "mailbox_indexed";
/// The last sequence number given, across all mailboxes (`META`).
const MAILBOX_SEQ: &str = "mailbox_seq";
/// Bytes waiting in all mailboxes (`META`).
const MAILBOX_BYTES: &str = "mailbox_bytes";

impl AuthorityConfig {
    /// Devnet defaults for `data_dir`.
    pub fn devnet(data_dir: impl Into<PathBuf>) -> Self {
        AuthorityConfig {
            data_dir: data_dir.into(),
            faucet: true,
            max_faucet_cents: 1_000_000,
            verify_threads: 0,
            max_hops: 64,
            max_deposit_tokens: 100_000,
            mailbox: MailboxLimits::default(),
            operators: Vec::new(),
            faucet_open: true,
        }
    }

    /// Defaults for a node configured by hand (a cluster sentinel): as the devnet's, but with
    /// no faucet unless its operator turns it on, and then only for operators.
    pub fn closed(data_dir: impl Into<PathBuf>) -> Self {
        AuthorityConfig {
            faucet: false,
            faucet_open: false,
            ..AuthorityConfig::devnet(data_dir)
        }
    }
}

/// Longest operator's reason kept in the audit trail.
pub const MAX_REASON: usize = 1024;

/// The token authority.
pub struct Authority {
    db: Arc<redb::Database>,
    /// Set when the registry is replicated ([`crate::registry`]): writes are then applied by
    /// the group, through this link once it is joined ([`Authority::join`]).
    replicated: bool,
    group: std::sync::OnceLock<Arc<dyn Replicate>>,
    /// One replicated write at a time from this replica: writes computed here at once would
    /// all read the same version, and all but one would run again.
    writer: std::sync::Mutex<()>,
    signer: Arc<dyn Signer>,
    key: PublicKey,
    config: AuthorityConfig,
    gate: crate::operator::OperatorGate,
    /// Held by a mint from its journal record to its confirmation, and by the audit and the
    /// live backup while they read the journal and the ledger (a consistent view of both).
    pub(crate) issuing: tokio::sync::Mutex<()>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Checks that `key` (the field `what`) is a usable key (a canonical curve point, not of small
/// order): money or a handoff addressed to anything else is lost.
pub(crate) fn check_usable(key: &PublicKey, what: &str) -> Result<(), NodeError> {
    key.validate().map_err(|source| {
        NodeError::BadRequest(BadRequest::Key {
            what: what.into(),
            source,
        })
    })
}

/// A depositor must be a usable key (a re-anchored token to anything else is lost).
fn check_depositor(depositor: &PublicKey) -> Result<(), NodeError> {
    check_usable(depositor, "depositor")
}

/// Counts messages left from before the mailbox quotas (once): each is dated now, so it is
/// kept for a whole retention time, and the sequence counter starts above every number given.
fn index_mailbox(db: &redb::Database, at: u64) -> Result<(), NodeError> {
    {
        let r = db.begin_read()?;
        if r.open_table(META)?.get(MAILBOX_INDEXED)?.is_some() {
            return Ok(());
        }
    }
    let mut tx = db.begin_write()?;
    tx.set_two_phase_commit(true);
    {
        let mail = tx.open_table(MAILBOX)?;
        let mut usage = tx.open_table(MAILBOX_USAGE)?;
        let mut ages = tx.open_table(MAILBOX_AGES)?;
        let (mut total, mut last_seq) = (0u64, 0u64);
        let mut per: std::collections::BTreeMap<Vec<u8>, (u64, u64)> = Default::default();
        for item in mail.iter()? {
            let (k, v) = item?;
            let (k, len) = (k.value(), v.value().len() as u64);
            let (Some(to), Some(seq)) = (
                k.get(..32),
                k.get(32..40)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes),
            ) else {
                return Err(Corrupt::Record("mailbox key").into());
            };
            let e = per.entry(to.to_vec()).or_default();
            *e = (e.0 + 1, e.1 + len);
            total += len;
            last_seq = last_seq.max(seq);
            ages.insert(
                age_key(at, to, seq).as_slice(),
                len.to_le_bytes().as_slice(),
            )?;
        }
        for (to, (m, b)) in per {
            usage.insert(to.as_slice(), usage_encode(m, b).as_slice())?;
        }
        let mut meta = tx.open_table(META)?;
        meta.insert(MAILBOX_SEQ, last_seq)?;
        meta.insert(MAILBOX_BYTES, total)?;
        meta.insert(MAILBOX_INDEXED, 1)?;
    }
    tx.commit()?;
    Ok(())
}

/// Removes up to `max` mailbox messages put before `cutoff` (unix seconds), oldest first,
/// with their usage; a mailbox left empty is forgotten.
fn sweep_mailbox(tx: &RegTx, cutoff: u64, max: usize) -> Result<usize, NodeError> {
    let mut ages = tx.open_table(MAILBOX_AGES)?;
    let expired: Vec<(Vec<u8>, u64)> = ages
        .range(..age_key(cutoff, &[0u8; 32], 0).as_slice())?
        .take(max)
        .map(|item| item.map(|(k, v)| (k.value().to_vec(), usage_decode(v.value()).0)))
        .collect::<Result<_, _>>()?;
    if expired.is_empty() {
        return Ok(0);
    }
    let mut mail = tx.open_table(MAILBOX)?;
    let mut usage = tx.open_table(MAILBOX_USAGE)?;
    let mut meta = tx.open_table(META)?;
    let mut total = meta.get(MAILBOX_BYTES)?.map(|v| v.value()).unwrap_or(0);
    for (k, len) in &expired {
        let (Some(to), Some(seq)) = (k.get(8..40), k.get(40..48)) else {
            return Err(Corrupt::Record("mailbox age key").into());
        };
        ages.remove(k.as_slice())?;
        mail.remove([to, seq].concat().as_slice())?;
        let (m, b) = usage
            .get(to)?
            .map(|v| usage_decode(v.value()))
            .unwrap_or((0, 0));
        if m <= 1 {
            usage.remove(to)?;
        } else {
            usage.insert(to, usage_encode(m - 1, b.saturating_sub(*len)).as_slice())?;
        }
        total = total.saturating_sub(*len);
    }
    meta.insert(MAILBOX_BYTES, total)?;
    Ok(expired.len())
}

impl Authority {
    /// Opens (or creates) the registry in `config.data_dir` with `signer` as the authority key.
    pub fn open(config: AuthorityConfig, signer: Arc<dyn Signer>) -> Result<Self, NodeError> {
        Self::open_as(config, signer, false)
    }

    /// Opens the registry as one replica of an authority group: it changes only by write
    /// sets the group applies ([`crate::registry`]). Writes fail until [`Authority::join`]
    /// gives the link to the group; [`Authority::registry_db`] is what the group's state
    /// machine applies to.
    pub fn open_replicated(
        config: AuthorityConfig,
        signer: Arc<dyn Signer>,
    ) -> Result<Self, NodeError> {
        Self::open_as(config, signer, true)
    }

    fn open_as(
        config: AuthorityConfig,
        signer: Arc<dyn Signer>,
        replicated: bool,
    ) -> Result<Self, NodeError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| IoError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        // Strictly: damage is refused naming the file, and a registry is created only in a
        // directory that was never initialized (no manifest): never a fresh one over state.
        let expect = match crate::manifest::Manifest::load(&config.data_dir)? {
            Some(m) if !m.initializing => crate::redb_open::Expect::Existing,
            _ => crate::redb_open::Expect::FirstStart,
        };
        let db = crate::redb_open::open_strict(&config.data_dir.join("authority.redb"), expect)
            .map_err(Corrupt::from)?;
        store::init(&db)?;
        if replicated {
            crate::registry::check_replica(&db, &config.data_dir)?;
        }
        if !replicated {
            // A replicated registry was made with the quotas: every replica counts from its
            // first write set, and a local write here would leave the group's state.
            index_mailbox(&db, now())?;
        }
        let key = signer.public_key();
        let gate = crate::operator::OperatorGate::new(config.operators.clone());
        Ok(Authority {
            db: Arc::new(db),
            replicated,
            group: std::sync::OnceLock::new(),
            writer: std::sync::Mutex::new(()),
            signer,
            key,
            gate,
            config,
            issuing: tokio::sync::Mutex::new(()),
        })
    }

    /// Refuses a deposit of more tokens than the configured limit (before they are decoded).
    pub fn check_deposit_size(&self, n: usize) -> Result<(), NodeError> {
        if n > self.config.max_deposit_tokens {
            return Err(BadRequest::DepositTooLarge {
                max: self.config.max_deposit_tokens,
            }
            .into());
        }
        Ok(())
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// The authority's public key.
    pub fn public_key(&self) -> PublicKey {
        self.key
    }

    /// The configuration.
    pub fn config(&self) -> &AuthorityConfig {
        &self.config
    }

    /// The gate that checks operator credentials.
    pub fn operators(&self) -> &crate::operator::OperatorGate {
        &self.gate
    }

    /// Whether the faucet needs an operator credential.
    pub fn faucet_needs_operator(&self) -> bool {
        !self.config.faucet_open
    }

    /// Mints `amount_cents` to `recipient` (IV-B), split so that the tokens make change
    /// ([`Denomination::spendable_split`]).
    /// Durable before it returns.
    pub fn mint(
        &self,
        recipient: PublicKey,
        amount_cents: u64,
        handshake: Handshake,
    ) -> Result<Vec<Token>, NodeError> {
        if amount_cents == 0 {
            return Err(BadRequest::ZeroAmount.into());
        }
        self.mint_tokens(
            recipient,
            &Denomination::spendable_split(amount_cents),
            handshake,
        )
    }

    /// Mints one token per entry of `denominations` to `recipient`, in one durable transaction.
    pub fn mint_tokens(
        &self,
        recipient: PublicKey,
        denominations: &[Denomination],
        handshake: Handshake,
    ) -> Result<Vec<Token>, NodeError> {
        let tokens = self.transact(|tx| self.mint_in(tx, recipient, denominations, handshake))?;
        florin_obs::metrics::global().token_event("minted", tokens.len() as u64);
        Ok(tokens)
    }

    /// Mints inside an open write transaction (so minting commits with whatever else the
    /// caller records, e.g. a withdrawal).
    pub(crate) fn mint_in(
        &self,
        tx: &RegTx,
        recipient: PublicKey,
        denominations: &[Denomination],
        handshake: Handshake,
    ) -> Result<Vec<Token>, NodeError> {
        let amount_cents: u64 = denominations.iter().map(|d| d.cents()).sum();
        let mut rng = StdRng::from_rng(OsRng).map_err(IoError::from)?;
        let mut tokens = Vec::with_capacity(denominations.len());
        let mut table = tx.open_table(TOKENS)?;
        for &d in denominations {
            let serial = loop {
                let mut s = [0u8; 8];
                rng.fill_bytes(&mut s);
                if table.get(serial_key(&s))?.is_none() {
                    break s;
                }
            };
            let mut nonce = [0u8; 64];
            rng.fill_bytes(&mut nonce);
            let t = Token::mint(self.signer.as_ref(), serial, d, nonce, recipient, handshake)?;
            table.insert(
                serial_key(&serial),
                TokenRecord::minted(&t).encode().as_slice(),
            )?;
            tokens.push(t);
        }
        let mut meta = tx.open_table(META)?;
        let count = meta.get("minted_count")?.map(|v| v.value()).unwrap_or(0);
        let cents = meta.get("minted_cents")?.map(|v| v.value()).unwrap_or(0);
        meta.insert("minted_count", count + tokens.len() as u64)?;
        meta.insert("minted_cents", cents + amount_cents)?;
        Ok(tokens)
    }

    pub(crate) fn db(&self) -> &redb::Database {
        &self.db
    }

    /// A write transaction with two-phase commit: redb then refuses (rather than rolls back)
    /// a newest commit that fails its checksums after a crash, so an acknowledged commit is
    /// never silently undone (see `redb_open`).
    pub(crate) fn begin_write(&self) -> Result<RegTx, NodeError> {
        RegTx::begin(&self.db, self.replicated)
    }

    /// The registry's database (a replicated authority's state machine applies to it).
    pub fn registry_db(&self) -> Arc<redb::Database> {
        self.db.clone()
    }

    /// Whether the registry is replicated.
    pub fn is_replicated(&self) -> bool {
        self.replicated
    }

    /// Gives a replicated registry its link to the group (once; later calls are ignored).
    pub fn join(&self, group: Arc<dyn Replicate>) {
        let _ = self.group.set(group);
    }

    /// Runs a registry write: `op` reads and writes through the transaction it is given, and
    /// what it wrote is committed (locally, or by the group). A replicated write that another
    /// came before runs again on the newer registry, at most [`MAX_CONFLICTS`] times; an
    /// error from `op` writes nothing.
    pub(crate) fn transact<T>(
        &self,
        op: impl FnMut(&RegTx) -> Result<T, NodeError>,
    ) -> Result<T, NodeError> {
        self.transact_with(true, op)
    }

    /// [`Authority::transact`]; without `barrier`, an answer that writes nothing is given as
    /// this replica read it (for housekeeping whose answer nobody relies on, such as the
    /// mailbox's expiry sweep).
    pub(crate) fn transact_with<T>(
        &self,
        barrier: bool,
        mut op: impl FnMut(&RegTx) -> Result<T, NodeError>,
    ) -> Result<T, NodeError> {
        let group = match (self.replicated, self.group.get()) {
            (false, _) => None,
            (true, Some(g)) => Some(g.as_ref()),
            (true, None) => {
                return Err(StorageError::Unavailable(
                    "this replica has not joined its authority group yet".into(),
                )
                .into())
            }
        };
        // The lock guards no data: one that a panicking operation left poisoned still orders
        // writers.
        let _one = group.map(|_| {
            self.writer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        });
        let mut synced = !barrier;
        for _ in 0..MAX_CONFLICTS {
            let tx = self.begin_write()?;
            let base = tx.base();
            let out = op(&tx);
            // An answer that writes nothing (a refusal, a repeat) was read from this replica,
            // which may be behind the group: it is given only once the replica has caught up
            // with the leader and the registry is still the one it was read from.
            let read_only = match &out {
                Err(_) => true,
                Ok(_) => !tx.has_changes(),
            };
            if let (true, Some(g)) = (read_only, group) {
                tx.abort()?;
                // Once caught up with the leader, a later read is at least that recent: one
                // barrier per operation.
                if synced {
                    return out;
                }
                g.sync()?;
                synced = true;
                if crate::registry::version(&self.db)? != base {
                    continue;
                }
                return out;
            }
            let out = match out {
                Ok(out) => out,
                Err(e) => {
                    tx.abort()?;
                    return Err(e);
                }
            };
            match tx.commit(group)? {
                Committed::Done => return Ok(out),
                Committed::Conflict => continue,
            }
        }
        Err(StorageError::Unavailable(format!(
            "{MAX_CONFLICTS} other registry writes came first: try again"
        ))
        .into())
    }

    pub(crate) fn signer(&self) -> &dyn Signer {
        self.signer.as_ref()
    }

    /// The faucet: minting on request, devnet only, bounded per request. The recipient must
    /// be a usable key.
    pub fn faucet(
        &self,
        recipient: &PublicKey,
        amount_cents: u64,
        handshake: Handshake,
    ) -> Result<Vec<Token>, NodeError> {
        if !self.config.faucet {
            return Err(Forbidden::FaucetOff.into());
        }
        if amount_cents > self.config.max_faucet_cents {
            return Err(BadRequest::FaucetLimit {
                max_cents: self.config.max_faucet_cents,
            }
            .into());
        }
        check_usable(recipient, "recipient")?;
        self.mint(*recipient, amount_cents, handshake)
    }

    /// Verifies the signature chains of `tokens` in batches spread over the configured threads.
    fn verify_parallel(&self, tokens: &[&Token]) -> Vec<Result<(), TokenError>> {
        let threads = match self.config.verify_threads {
            0 => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            n => n,
        };
        parallel_verify(tokens, threads)
    }

    /// Deposits tokens (IV-E): structural checks, a registry look-up (unknown serials and
    /// anchors are refused before any signature work), one batched signature check for the
    /// rest spread over all cores, then, in one durable transaction, the fork check and the
    /// re-anchor of each clean token. The re-anchored token carries the handshake of the
    /// depositor's signed link to the authority.
    ///
    /// `tokens` are decoded; an `Err` is a token that failed to decode (the reason), reported
    /// back as refused. At most `max_deposit_tokens`; the depositor must be a usable key.
    pub fn deposit(
        &self,
        depositor: &PublicKey,
        tokens: &[Result<Token, String>],
    ) -> Result<Vec<DepositReport>, NodeError> {
        check_depositor(depositor)?;
        self.check_deposit_size(tokens.len())?;
        self.deposit_tokens(depositor, tokens)
    }

    /// [`Authority::deposit`] without the size limit (the offline benchmark deposits
    /// everything at once).
    pub fn deposit_tokens(
        &self,
        depositor: &PublicKey,
        decoded: &[Result<Token, String>],
    ) -> Result<Vec<DepositReport>, NodeError> {
        self.deposit_mode(depositor, decoded, SettleMode::Reanchor)
            .map(|(r, _)| count_deposits(r))
    }

    /// Deposits tokens whose value is credited on the ledger: clean tokens leave circulation
    /// and, in the same durable transaction, the authority records a ledger payment from its
    /// reserve to the depositor (the [`CreditIntent`] the caller must submit and then
    /// [`Authority::finish_credit`]). Pending intents survive restarts
    /// ([`Authority::pending_credits`]).
    /// Tokens as for [`Authority::deposit`].
    pub fn deposit_credit(
        &self,
        depositor: &PublicKey,
        tokens: &[Result<Token, String>],
    ) -> Result<(Vec<DepositReport>, Option<CreditIntent>), NodeError> {
        check_depositor(depositor)?;
        self.check_deposit_size(tokens.len())?;
        self.deposit_mode(depositor, tokens, SettleMode::Redeem)
            .map(|(r, intent)| (count_deposits(r), intent))
    }

    fn deposit_mode(
        &self,
        depositor: &PublicKey,
        decoded: &[Result<Token, String>],
        mode: SettleMode,
    ) -> Result<(Vec<DepositReport>, Option<CreditIntent>), NodeError> {
        let depositor = *depositor;
        self.check_not_revoked(&depositor, "depositor")?;
        // A verdict per token; `None` only for tokens that failed to decode. Steps 3a: the
        // registry must know the serial and the anchor; otherwise no signature work is spent
        // on the token. A replica that does not know one may be behind its group: it catches
        // up with the leader and looks again before refusing it.
        let (mut checked, unknown) = self.known_tokens(&depositor, decoded)?;
        if let (true, Some(g)) = (unknown, self.group.get()) {
            g.sync()?;
            checked = self.known_tokens(&depositor, decoded)?.0;
        }
        // Step 4, batched across tokens and cores.
        let to_verify: Vec<(usize, &Token)> = decoded
            .iter()
            .enumerate()
            .filter_map(|(i, d)| match (d, &checked[i]) {
                (Ok(t), Some(Ok(()))) => Some((i, t)),
                _ => None,
            })
            .collect();
        let refs: Vec<&Token> = to_verify.iter().map(|x| x.1).collect();
        for ((i, _), verdict) in to_verify.iter().zip(self.verify_parallel(&refs)) {
            checked[*i] = Some(verdict.map_err(|e| e.to_string()));
        }

        let mut rng = StdRng::from_rng(OsRng).map_err(IoError::from)?;
        let detected_at = now();
        // Fraud proofs recorded now (a proof already on file is reported again, not counted).
        let new_proofs = std::cell::Cell::new(0u64);
        let out = self.transact(|tx| {
            new_proofs.set(0);
            Self::check_not_revoked_in(tx, &depositor, "depositor")?;
            let mut reports = Vec::with_capacity(decoded.len());
            let mut credited = 0u64;
            let mut intent = None;
            {
                let mut table = tx.open_table(TOKENS)?;
                let mut fraud = tx.open_table(FRAUD)?;
                for (i, d) in decoded.iter().enumerate() {
                    let t = match d {
                        Ok(t) => t,
                        Err(e) => {
                            reports.push(refused(String::new(), 0, e.clone(), false));
                            continue;
                        }
                    };
                    match checked[i].clone() {
                        Some(Ok(())) => {}
                        Some(Err(e)) => {
                            reports.push(refused(t.serial_hex(), t.value.cents(), e, false));
                            continue;
                        }
                        None => {
                            reports.push(refused(
                                t.serial_hex(),
                                t.value.cents(),
                                "not verified".into(),
                                true,
                            ));
                            continue;
                        }
                    }
                    let key = serial_key(&t.serial);
                    let mut record = match table.get(key)? {
                        Some(v) => Some(TokenRecord::decode(v.value()).map_err(Corrupt::from)?),
                        None => None,
                    };
                    let mut nonce = [0u8; 64];
                    rng.fill_bytes(&mut nonce);
                    let reanchor = Reanchor {
                        signer: self.signer.as_ref(),
                        nonce,
                    };
                    let (outcome, changed) =
                        settle(record.as_mut(), t, Ok(()), &depositor, reanchor, mode);
                    if changed {
                        if let Some(r) = &record {
                            table.insert(key, r.encode().as_slice())?;
                        }
                    }
                    let serial = t.serial_hex();
                    let value = t.value.cents();
                    reports.push(match outcome {
                        Outcome::Reanchored(n) => report(serial, value, "reanchored", Some(&n)),
                        Outcome::Redeemed => {
                            credited += value;
                            report(serial, value, "credited", None)
                        }
                        Outcome::Repeated(n) => report(serial, value, "repeated", Some(&n)),
                        Outcome::DoubleSpend(proof) => {
                            let id = proof.id();
                            let existing = fraud.get(id.as_slice())?.map(|v| v.value().to_vec());
                            let at = match existing {
                                Some(v) if v.len() >= 8 => u64::from_le_bytes(
                                    <[u8; 8]>::try_from(&v[..8]).unwrap_or_default(),
                                ),
                                _ => {
                                    let mut v = detected_at.to_le_bytes().to_vec();
                                    v.extend_from_slice(&proof.encode());
                                    fraud.insert(id.as_slice(), v.as_slice())?;
                                    new_proofs.set(new_proofs.get() + 1);
                                    detected_at
                                }
                            };
                            let mut r = report(serial, value, "double_spend", None);
                            r.fraud = Some(fraud_info(&proof, at));
                            r
                        }
                        Outcome::Refused(DepositError::AlreadyDeposited(_))
                            if mode == SettleMode::Redeem =>
                        {
                            // This exact deposit was credited before (a retry): its credit went to
                            // the depositor's mailbox then.
                            report(serial, value, "already_credited", None)
                        }
                        Outcome::Refused(e) => {
                            let retry =
                                matches!(e, florin_token::authority::DepositError::Signer(_));
                            let mut r = refused(serial, value, e.to_string(), retry);
                            if matches!(e, DepositError::Blacklisted(_)) {
                                r.code = Some("blacklisted".into());
                            }
                            r
                        }
                    });
                }
                if credited > 0 {
                    intent = Some(self.record_credit(tx, &depositor, credited)?);
                }
            }
            Ok((reports, intent))
        })?;
        florin_obs::metrics::global()
            .fraud_proofs
            .inc_by(new_proofs.get());
        Ok(out)
    }

    /// Steps 1–3a of a deposit for each token: the authority's precheck, then whether the
    /// registry knows its serial and anchor; and whether it did not know one.
    #[allow(clippy::type_complexity)]
    fn known_tokens(
        &self,
        depositor: &PublicKey,
        decoded: &[Result<Token, String>],
    ) -> Result<(Vec<Option<Result<(), String>>>, bool), NodeError> {
        let mut unknown = false;
        let mut checked: Vec<Option<Result<(), String>>> = decoded
            .iter()
            .map(|d| {
                d.as_ref().ok().map(|t| {
                    authority_precheck(t, &self.key, depositor, self.config.max_hops)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        let tx = self.db.begin_read()?;
        let table = tx.open_table(TOKENS)?;
        for (d, c) in decoded.iter().zip(checked.iter_mut()) {
            let (Ok(t), Some(Ok(()))) = (d, &c) else {
                continue;
            };
            let known = match table.get(serial_key(&t.serial))? {
                None => Err(DepositError::UnknownToken(t.serial_hex())),
                Some(v) => {
                    let r = TokenRecord::decode(v.value()).map_err(Corrupt::from)?;
                    if r.knows_anchor(t) {
                        Ok(())
                    } else {
                        Err(DepositError::UnknownAnchor(t.serial_hex()))
                    }
                }
            };
            unknown |= known.is_err();
            *c = Some(known.map_err(|e| e.to_string()));
        }
        Ok((checked, unknown))
    }

    /// Every fraud proof recorded, oldest first.
    pub fn fraud_list(&self) -> Result<Vec<FraudInfo>, NodeError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(FRAUD)?;
        let mut out = Vec::new();
        for item in table.iter()? {
            let (_, v) = item?;
            let v = v.value();
            if v.len() < 8 {
                return Err(Corrupt::Record("fraud entry too short").into());
            }
            let at = u64::from_le_bytes(<[u8; 8]>::try_from(&v[..8]).unwrap_or_default());
            let proof = FraudProof::decode(&v[8..]).map_err(Corrupt::from)?;
            out.push(fraud_info(&proof, at));
        }
        out.sort_by(|a, b| a.detected_at.cmp(&b.detected_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// One token's state.
    pub fn token(&self, serial: &Serial) -> Result<TokenInfo, NodeError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(TOKENS)?;
        let v = table
            .get(serial_key(serial))?
            .ok_or(NotFound::Token(*serial))?;
        let r = TokenRecord::decode(v.value()).map_err(Corrupt::from)?;
        Ok(TokenInfo {
            serial: hex::encode(serial),
            value_cents: r.value.cents(),
            status: match r.status {
                TokenStatus::InCirculation => "in_circulation",
                TokenStatus::Deposited => "deposited",
                TokenStatus::Blacklisted => "blacklisted",
            }
            .into(),
            history_links: r.links.len(),
            anchors: r.epochs.len(),
            holder: r
                .links
                .last()
                .map(|l| l.recipient.to_address())
                .unwrap_or_default(),
        })
    }

    /// Takes a token out of circulation (lost or stolen, or by policy). Durable. Recorded
    /// with no operator (a service call, not a request).
    pub fn blacklist(&self, serial: &Serial) -> Result<(), NodeError> {
        self.blacklist_by(serial, None, "").map(|_| ())
    }

    /// Takes a token out of circulation on `operator`'s word for `reason`: its deposits are
    /// refused from now on (`blacklisted`). The token's record, the blacklist entry and the
    /// audit trail change in one durable transaction. Blacklisting again keeps the first entry.
    pub fn blacklist_by(
        &self,
        serial: &Serial,
        operator: Option<&PublicKey>,
        reason: &str,
    ) -> Result<AdminEntry, NodeError> {
        check_reason(reason)?;
        let entry = admin_entry(hex::encode(serial), operator, reason);
        self.transact(|tx| {
            let kept;
            {
                let mut table = tx.open_table(TOKENS)?;
                let bytes = table
                    .get(serial_key(serial))?
                    .map(|v| v.value().to_vec())
                    .ok_or(NotFound::Token(*serial))?;
                let mut r = TokenRecord::decode(&bytes).map_err(Corrupt::from)?;
                r.status = TokenStatus::Blacklisted;
                table.insert(serial_key(serial), r.encode().as_slice())?;
                let mut bl = tx.open_table(BLACKLIST)?;
                let existing = bl.get(serial_key(serial))?.map(|v| v.value().to_vec());
                kept = match existing {
                    Some(v) => decode_entry(&v)?,
                    None => {
                        bl.insert(serial_key(serial), encode_entry(&entry)?.as_slice())?;
                        append_log(tx, "blacklist", &entry)?;
                        entry.clone()
                    }
                };
            }
            Ok(kept)
        })
    }

    /// Every blacklisted token with who, when and why, by serial.
    pub fn blacklisted(&self) -> Result<Vec<AdminEntry>, NodeError> {
        let tx = self.db.begin_read()?;
        let mut out = Vec::new();
        for item in tx.open_table(BLACKLIST)?.iter()? {
            out.push(decode_entry(item?.1.value())?);
        }
        out.sort_by(|a, b| a.subject.cmp(&b.subject));
        Ok(out)
    }

    /// Revokes a wallet key on `operator`'s word for `reason`: from now on it may not deposit
    /// tokens (as the depositor) nor withdraw (as the recipient of the tokens or the key
    /// authorizing the withdrawal); refused with `revoked` (403). Durable, with the audit
    /// trail. Revoking again keeps the first entry.
    pub fn revoke(
        &self,
        key: &PublicKey,
        operator: Option<&PublicKey>,
        reason: &str,
    ) -> Result<AdminEntry, NodeError> {
        check_reason(reason)?;
        let entry = admin_entry(key.to_address(), operator, reason);
        self.transact(|tx| {
            let kept;
            {
                let mut rv = tx.open_table(REVOKED)?;
                let existing = rv.get(key.0.as_slice())?.map(|v| v.value().to_vec());
                kept = match existing {
                    Some(v) => decode_entry(&v)?,
                    None => {
                        rv.insert(key.0.as_slice(), encode_entry(&entry)?.as_slice())?;
                        append_log(tx, "revoke", &entry)?;
                        entry.clone()
                    }
                };
            }
            Ok(kept)
        })
    }

    /// Lifts a key's revocation on `operator`'s word for `reason` (the trail keeps both).
    /// A key that is not revoked is [`NotFound`].
    pub fn unrevoke(
        &self,
        key: &PublicKey,
        operator: Option<&PublicKey>,
        reason: &str,
    ) -> Result<AdminEntry, NodeError> {
        check_reason(reason)?;
        let entry = admin_entry(key.to_address(), operator, reason);
        self.transact(|tx| {
            let mut rv = tx.open_table(REVOKED)?;
            if rv.remove(key.0.as_slice())?.is_none() {
                return Err(NodeError::not_found(format!(
                    "{} is not revoked",
                    key.to_address()
                )));
            }
            append_log(tx, "unrevoke", &entry)?;
            Ok(entry.clone())
        })
    }

    /// Every revoked key with who, when and why, by address.
    pub fn revoked(&self) -> Result<Vec<AdminEntry>, NodeError> {
        let tx = self.db.begin_read()?;
        let mut out = Vec::new();
        for item in tx.open_table(REVOKED)?.iter()? {
            out.push(decode_entry(item?.1.value())?);
        }
        out.sort_by(|a, b| a.subject.cmp(&b.subject));
        Ok(out)
    }

    /// The revocation of `key`, if it is revoked.
    pub fn revocation(&self, key: &PublicKey) -> Result<Option<AdminEntry>, NodeError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(REVOKED)?;
        let v = table.get(key.0.as_slice())?;
        v.map(|v| decode_entry(v.value())).transpose()
    }

    /// Records an operator credential as used in a replicated registry, so the other replicas
    /// refuse it as replayed (each sentinel's gate remembers only what it saw itself). Nothing
    /// to do on a registry that is not replicated: its gate saw every request. Call after the
    /// gate accepted `c`.
    pub fn use_operator_credential(
        &self,
        c: &crate::operator::Credential,
    ) -> Result<(), NodeError> {
        if !self.replicated {
            return Ok(());
        }
        let until = c.timestamp.saturating_add(crate::operator::MAX_SKEW_SECS);
        let mut key = Vec::with_capacity(56);
        key.extend_from_slice(&until.to_be_bytes());
        key.extend_from_slice(&c.key.0);
        key.extend_from_slice(&c.nonce);
        let now = now();
        self.transact(|tx| {
            let mut t = tx.open_table(OPERATOR_NONCES)?;
            if t.get(key.as_slice())?.is_some() {
                return Err(NodeError::Forbidden(Forbidden::Operator(
                    crate::operator::OperatorRefused::Replayed,
                )));
            }
            // Those no longer acceptable anywhere go (a bounded number per write), with a
            // margin for another sentinel's clock being behind this one's.
            let cutoff = now.saturating_sub(crate::operator::MAX_SKEW_SECS);
            let expired: Vec<Vec<u8>> = t
                .range(..cutoff.to_be_bytes().as_slice())?
                .take(SWEEP_PER_WRITE)
                .map(|item| item.map(|(k, _)| k.value().to_vec()))
                .collect::<Result<_, _>>()?;
            for k in expired {
                t.remove(k.as_slice())?;
            }
            t.insert(key.as_slice(), [].as_slice())?;
            Ok(())
        })
    }

    /// Refuses a revoked `key` (in the request's `role`) as the write transaction `tx` sees
    /// the registry: a replicated write is then applied only on the registry it checked (a
    /// lagging replica's read before the transaction could miss a revocation).
    pub(crate) fn check_not_revoked_in(
        tx: &RegTx,
        key: &PublicKey,
        role: &'static str,
    ) -> Result<(), NodeError> {
        let table = tx.open_table(REVOKED)?;
        let Some(v) = table.get(key.0.as_slice())? else {
            return Ok(());
        };
        let e = decode_entry(v.value())?;
        Err(Forbidden::Revoked {
            role,
            key: key.to_address(),
            reason: e.reason,
        }
        .into())
    }

    /// Refuses a revoked `key` (in the request's `role`).
    pub(crate) fn check_not_revoked(
        &self,
        key: &PublicKey,
        role: &'static str,
    ) -> Result<(), NodeError> {
        let mut found = self.revocation(key)?;
        if let (Some(_), Some(g)) = (&found, self.group.get()) {
            // Read from this replica, which may be behind an unrevoke made elsewhere.
            g.sync()?;
            found = self.revocation(key)?;
        }
        match found {
            None => Ok(()),
            Some(e) => Err(Forbidden::Revoked {
                role,
                key: key.to_address(),
                reason: e.reason,
            }
            .into()),
        }
    }

    /// The operators' audit trail (blacklist, revoke, unrevoke), oldest first.
    pub fn admin_log(&self) -> Result<Vec<AdminLogEntry>, NodeError> {
        let tx = self.db.begin_read()?;
        let mut out = Vec::new();
        for item in tx.open_table(ADMIN_LOG)?.iter()? {
            let v = item?.1;
            out.push(
                serde_json::from_slice(v.value())
                    .map_err(|_| Corrupt::Record("admin log entry"))?,
            );
        }
        Ok(out)
    }

    /// Leaves a sealed message for `to` (the payment handoff), which must be a usable key.
    /// Durable before it returns. Refused with [`Full`] when `to`'s mailbox or all mailboxes
    /// hold what [`MailboxLimits`] allows. Sequence numbers rise across all mailboxes, so a
    /// reader's cursor stays valid whatever is removed.
    pub fn mailbox_put(&self, to: &PublicKey, message: &[u8]) -> Result<u64, NodeError> {
        self.mailbox_write(to, message, true, now())
    }

    /// [`Authority::mailbox_put`] for the authority's own handoffs (a credit's output for its
    /// depositor): bound to a deposit the authority took, so outside the quotas.
    pub(crate) fn mailbox_put_own(&self, to: &PublicKey, message: &[u8]) -> Result<u64, NodeError> {
        self.mailbox_write(to, message, false, now())
    }

    pub(crate) fn mailbox_write(
        &self,
        to: &PublicKey,
        message: &[u8],
        quota: bool,
        at: u64,
    ) -> Result<u64, NodeError> {
        check_usable(to, "to")?;
        if message.is_empty() || message.len() > MAX_MAILBOX_MESSAGE {
            return Err(BadRequest::MessageSize.into());
        }
        let limits = &self.config.mailbox;
        let len = message.len() as u64;
        // Expired messages are removed in a transaction of their own, committed whether or not
        // this message is then taken: a refused write still frees what has expired, so a full
        // budget always drains.
        {
            let cutoff = at.saturating_sub(limits.retention.as_secs());
            self.transact_with(false, |tx| sweep_mailbox(tx, cutoff, SWEEP_PER_WRITE))?;
        }
        self.transact(|tx| {
            let seq;
            {
                let mut meta = tx.open_table(META)?;
                let total = meta.get(MAILBOX_BYTES)?.map(|v| v.value()).unwrap_or(0);
                let mut usage = tx.open_table(MAILBOX_USAGE)?;
                let (messages, bytes) = usage
                    .get(to.0.as_slice())?
                    .map(|v| usage_decode(v.value()))
                    .unwrap_or((0, 0));
                if quota {
                    if messages >= limits.per_recipient_messages
                        || bytes.saturating_add(len) > limits.per_recipient_bytes
                    {
                        return Err(Full::Mailbox { messages, bytes }.into());
                    }
                    if total.saturating_add(len) > limits.total_bytes {
                        return Err(Full::Mailboxes { bytes: total }.into());
                    }
                }
                seq = meta.get(MAILBOX_SEQ)?.map(|v| v.value()).unwrap_or(0) + 1;
                meta.insert(MAILBOX_SEQ, seq)?;
                meta.insert(MAILBOX_BYTES, total.saturating_add(len))?;
                usage.insert(
                    to.0.as_slice(),
                    usage_encode(messages + 1, bytes.saturating_add(len)).as_slice(),
                )?;
                tx.open_table(MAILBOX)?
                    .insert(mailbox_key(&to.0, seq).as_slice(), message)?;
                tx.open_table(MAILBOX_AGES)?.insert(
                    age_key(at, &to.0, seq).as_slice(),
                    len.to_le_bytes().as_slice(),
                )?;
            }
            Ok(seq)
        })
    }

    /// Removes mailbox messages older than the retention time (at most `max`; the number
    /// removed). Mailbox writes also remove some as they go.
    pub fn mailbox_sweep(&self, max: usize) -> Result<usize, NodeError> {
        let cutoff = now().saturating_sub(self.config.mailbox.retention.as_secs());
        self.transact_with(false, |tx| sweep_mailbox(tx, cutoff, max))
    }

    /// Messages for `to` with sequence numbers above `after` (at most 1,000).
    pub fn mailbox_get(
        &self,
        to: &PublicKey,
        after: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, NodeError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(MAILBOX)?;
        let mut lo = to.0.to_vec();
        lo.extend_from_slice(&after.saturating_add(1).to_be_bytes());
        let mut hi = to.0.to_vec();
        hi.extend_from_slice(&[0xffu8; 8]);
        let mut out = Vec::new();
        for item in t.range(lo.as_slice()..=hi.as_slice())?.take(1000) {
            let (k, v) = item?;
            let k = k.value();
            let seq = u64::from_be_bytes(<[u8; 8]>::try_from(&k[32..40]).unwrap_or_default());
            out.push((seq, v.value().to_vec()));
        }
        Ok(out)
    }

    /// (tokens minted, cents minted) since the registry was created.
    pub fn minted(&self) -> Result<(u64, u64), NodeError> {
        let tx = self.db.begin_read()?;
        let meta = tx.open_table(META)?;
        let c = meta.get("minted_count")?.map(|v| v.value()).unwrap_or(0);
        let v = meta.get("minted_cents")?.map(|v| v.value()).unwrap_or(0);
        Ok((c, v))
    }
}

/// Signatures per batch: large enough for the multi-scalar multiplication to pay off, small
/// enough to spread a deposit over every core and keep memory bounded.
pub const BATCH_SIGNATURES: usize = 1024;

/// Verifies token chains in batches of at most [`BATCH_SIGNATURES`] signatures, handed to
/// `threads` threads from a shared queue. Results are in token order.
pub fn parallel_verify(tokens: &[&Token], threads: usize) -> Vec<Result<(), TokenError>> {
    // Cut the tokens into batches by signature count: at most BATCH_SIGNATURES, and small
    // enough that every thread gets several batches (load balance), but not below 256
    // (below that a batch loses most of its advantage).
    let total: usize = tokens.iter().map(|t| t.links.len()).sum();
    let target = (total / (threads.max(1) * 8)).clamp(256, BATCH_SIGNATURES);
    let mut bounds = vec![0usize];
    let mut sigs = 0;
    for (i, t) in tokens.iter().enumerate() {
        sigs += t.links.len();
        if sigs >= target {
            bounds.push(i + 1);
            sigs = 0;
        }
    }
    if *bounds.last().unwrap_or(&0) != tokens.len() {
        bounds.push(tokens.len());
    }
    let batches: Vec<&[&Token]> = bounds.windows(2).map(|w| &tokens[w[0]..w[1]]).collect();
    let threads = threads.max(1).min(batches.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = |out: &mut Vec<(usize, Vec<Result<(), TokenError>>)>| {
        // Batch verification is sound only with unpredictable weights: without the OS's
        // randomness this worker verifies nothing, and its batches are refused below.
        let Ok(mut rng) = StdRng::from_rng(OsRng) else {
            return;
        };
        loop {
            let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(batch) = batches.get(b) else { break };
            out.push((b, verify_chains(batch, &mut rng)));
        }
    };
    let mut done: Vec<(usize, Vec<Result<(), TokenError>>)> = Vec::with_capacity(batches.len());
    if threads == 1 {
        work(&mut done);
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut out = Vec::new();
                        work(&mut out);
                        out
                    })
                })
                .collect();
            for h in handles {
                // A panicking verifier would be a bug; its batches stay missing and are
                // refused below, never accepted.
                if let Ok(v) = h.join() {
                    done.extend(v);
                }
            }
        });
    }
    let mut by_batch: Vec<Option<Vec<Result<(), TokenError>>>> = vec![None; batches.len()];
    for (b, r) in done {
        by_batch[b] = Some(r);
    }
    by_batch
        .into_iter()
        .zip(&batches)
        .flat_map(|(r, batch)| {
            r.unwrap_or_else(|| {
                vec![
                    Err(TokenError::Decode(florin_token::DecodeError::Invalid(
                        "verifier failed"
                    )));
                    batch.len()
                ]
            })
        })
        .collect()
}

fn check_reason(reason: &str) -> Result<(), NodeError> {
    if reason.len() > MAX_REASON {
        return Err(BadRequest::ReasonTooLong { max: MAX_REASON }.into());
    }
    Ok(())
}

fn admin_entry(subject: String, operator: Option<&PublicKey>, reason: &str) -> AdminEntry {
    AdminEntry {
        subject,
        operator: operator.map(|k| k.to_address()).unwrap_or_default(),
        at: now(),
        reason: reason.to_string(),
    }
}

fn encode_entry(e: &AdminEntry) -> Result<Vec<u8>, NodeError> {
    serde_json::to_vec(e).map_err(|e| IoError::Json(e).into())
}

fn decode_entry(v: &[u8]) -> Result<AdminEntry, NodeError> {
    serde_json::from_slice(v).map_err(|_| Corrupt::Record("admin entry").into())
}

/// Appends `action` on `entry` to the audit trail in `tx`.
fn append_log(tx: &RegTx, action: &str, entry: &AdminEntry) -> Result<(), NodeError> {
    let mut log = tx.open_table(ADMIN_LOG)?;
    let seq = log.last()?.map(|(k, _)| k.value()).unwrap_or(0) + 1;
    let rec = AdminLogEntry {
        seq,
        action: action.into(),
        entry: entry.clone(),
    };
    let bytes = serde_json::to_vec(&rec).map_err(IoError::Json)?;
    log.insert(seq, bytes.as_slice())?;
    Ok(())
}

/// Counts a deposit's clean tokens in the metrics (re-anchored or credited; a repeat is not
/// counted again).
fn count_deposits(reports: Vec<DepositReport>) -> Vec<DepositReport> {
    let m = florin_obs::metrics::global();
    let count = |what: &str| reports.iter().filter(|r| r.outcome == what).count() as u64;
    let (reanchored, credited) = (count("reanchored"), count("credited"));
    m.token_event("deposited", reanchored + credited);
    m.token_event("reanchored", reanchored);
    reports
}

fn report(serial: String, value_cents: u64, outcome: &str, token: Option<&Token>) -> DepositReport {
    DepositReport {
        serial,
        value_cents,
        outcome: outcome.into(),
        token: token.map(|t| hex::encode(t.encode())),
        fraud: None,
        error: None,
        code: None,
        retry: false,
    }
}

fn refused(serial: String, value_cents: u64, error: String, retry: bool) -> DepositReport {
    DepositReport {
        serial,
        value_cents,
        outcome: "refused".into(),
        token: None,
        fraud: None,
        error: Some(error),
        code: None,
        retry,
    }
}

fn fraud_info(p: &FraudProof, detected_at: u64) -> FraudInfo {
    FraudInfo {
        id: hex::encode(p.id()),
        serial: hex::encode(p.serial),
        value_cents: p.value.cents(),
        culprit: p.culprit().map(|c| c.to_address()).unwrap_or_default(),
        detected_at,
        proof: hex::encode(p.encode()),
    }
}

#[cfg(test)]
mod mailbox_tests {
    use super::*;
    use crate::error::Full;
    use florin_crypto::{LocalSigner, SecretKey};

    fn authority(dir: &Path, limits: MailboxLimits) -> Authority {
        let mut config = AuthorityConfig::devnet(dir);
        config.mailbox = limits;
        let signer = LocalSigner::new(SecretKey::from_seed(&[5; 32]));
        Authority::open(config, Arc::new(signer)).unwrap()
    }

    fn key(i: u8) -> PublicKey {
        LocalSigner::new(SecretKey::from_seed(&[i; 32])).public_key()
    }

    fn small() -> MailboxLimits {
        MailboxLimits {
            per_recipient_messages: 3,
            per_recipient_bytes: 1_000,
            total_bytes: 2_500,
            retention: std::time::Duration::from_secs(100),
        }
    }

    fn usage(a: &Authority, to: &PublicKey) -> (u64, u64) {
        let r = a.db.begin_read().unwrap();
        let t = r.open_table(MAILBOX_USAGE).unwrap();
        let u = t.get(to.0.as_slice()).unwrap();
        u.map(|v| usage_decode(v.value())).unwrap_or((0, 0))
    }

    #[test]
    fn quotas_refuse_what_a_writer_may_not_make_the_node_keep() {
        let dir = tempfile::tempdir().unwrap();
        let a = authority(dir.path(), small());
        let (alice, bob) = (key(1), key(2));
        // Per recipient: three messages.
        for _ in 0..3 {
            a.mailbox_put(&alice, &[1; 10]).unwrap();
        }
        let e = a.mailbox_put(&alice, &[1; 10]).unwrap_err();
        assert!(
            matches!(
                e,
                NodeError::Full(Full::Mailbox {
                    messages: 3,
                    bytes: 30
                })
            ),
            "{e}"
        );
        assert_eq!(e.code(), "quota");
        // A refused write changes nothing; the authority's own handoff is outside the quota.
        assert_eq!(a.mailbox_get(&alice, 0).unwrap().len(), 3);
        a.mailbox_put_own(&alice, &[2; 10]).unwrap();
        assert_eq!(usage(&a, &alice), (4, 40));
        // Per recipient: bytes.
        let e = a.mailbox_put(&bob, &[3; 1_001]).unwrap_err();
        assert!(matches!(e, NodeError::Full(Full::Mailbox { .. })), "{e}");
        a.mailbox_put(&bob, &[3; 1_000]).unwrap();
        // In all: 40 + 1,000 + 1,000 + 1,000 would pass 2,500.
        a.mailbox_put(&key(3), &[4; 1_000]).unwrap();
        let e = a.mailbox_put(&key(4), &[5; 1_000]).unwrap_err();
        assert!(
            matches!(e, NodeError::Full(Full::Mailboxes { bytes: 2_040 })),
            "{e}"
        );
        // Unusable recipients and empty or oversized messages are still refused first.
        assert!(matches!(
            a.mailbox_put(&key(5), &[]),
            Err(NodeError::BadRequest(_))
        ));
    }

    #[test]
    fn old_messages_are_removed_and_cursors_stay_valid() {
        let dir = tempfile::tempdir().unwrap();
        let a = authority(dir.path(), small());
        let alice = key(1);
        let t0 = now() - 1_000;
        let s1 = a.mailbox_write(&alice, &[1; 10], true, t0).unwrap();
        let s2 = a.mailbox_write(&alice, &[2; 10], true, t0 + 1).unwrap();
        assert_eq!((s1, s2), (1, 2));
        // A write 100 s later (the retention) removes both as it goes.
        let s3 = a.mailbox_write(&key(2), &[3; 10], true, t0 + 102).unwrap();
        assert!(a.mailbox_get(&alice, 0).unwrap().is_empty());
        assert_eq!(usage(&a, &alice), (0, 0));
        // Numbers keep rising across mailboxes, so a reader's cursor (2) sees what comes next.
        let s4 = a.mailbox_put(&alice, &[4; 10]).unwrap();
        assert!(s4 > s3 && s3 > s2, "{s2} {s3} {s4}");
        let got = a.mailbox_get(&alice, s2).unwrap();
        assert_eq!(got, vec![(s4, vec![4; 10])]);
        // A full mailbox drains: a refused write still removes what has expired.
        let bob = key(3);
        for i in 0..3 {
            a.mailbox_write(&bob, &[6; 10], true, t0 + 200 + i).unwrap();
        }
        assert!(a.mailbox_write(&bob, &[7; 10], true, t0 + 250).is_err());
        assert!(a
            .mailbox_write(&key(4), &[0; 2_000], true, t0 + 400)
            .is_err());
        assert_eq!(usage(&a, &bob), (0, 0));
        a.mailbox_write(&bob, &[7; 10], true, t0 + 400).unwrap();
        // The explicit sweep removes what has expired by now: Bob's last (dated t0 + 400), not
        // Alice's (dated now).
        assert_eq!(a.mailbox_sweep(100).unwrap(), 1);
        assert_eq!(usage(&a, &bob), (0, 0));
        // Reopening keeps the counters.
        drop(a);
        let a = authority(dir.path(), small());
        assert_eq!(usage(&a, &alice), (1, 10));
        assert!(a.mailbox_put(&alice, &[5; 10]).unwrap() > s4);
    }

    #[test]
    fn messages_from_before_the_quotas_are_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = authority(dir.path(), small());
        let alice = key(1);
        a.mailbox_put(&alice, &[1; 10]).unwrap();
        a.mailbox_put(&alice, &[2; 20]).unwrap();
        // Make the registry look like one written before the quotas existed.
        {
            let tx = a.begin_write().unwrap();
            for t in [MAILBOX_USAGE, MAILBOX_AGES] {
                let mut tb = tx.open_table(t).unwrap();
                let keys: Vec<Vec<u8>> = tb
                    .iter()
                    .unwrap()
                    .map(|i| i.unwrap().0.value().to_vec())
                    .collect();
                for k in keys {
                    tb.remove(k.as_slice()).unwrap();
                }
            }
            let mut meta = tx.open_table(META).unwrap();
            for k in [MAILBOX_INDEXED, MAILBOX_SEQ, MAILBOX_BYTES] {
                meta.remove(k).unwrap();
            }
            drop(meta);
            tx.commit(None).unwrap();
        }
        drop(a);
        let a = authority(dir.path(), small());
        assert_eq!(usage(&a, &alice), (2, 30));
        // The counter starts above every number given; one more fills the quota of three.
        assert_eq!(a.mailbox_put(&alice, &[3; 10]).unwrap(), 3);
        assert!(a.mailbox_put(&alice, &[4; 10]).is_err());
        assert_eq!(a.mailbox_get(&alice, 0).unwrap().len(), 3);
    }
}
