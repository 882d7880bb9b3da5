//! The node API's request and response bodies: plain serde values, no HTTP. Served by
//! `florin-http`'s router; shared with clients (the wallet's) and, where they are also domain
//! answers (`DepositReport`, `CreditInfo`, `FraudInfo`, `TokenInfo`), returned by the services.
//! Binary objects (tokens, fraud proofs) travel as hex of their canonical encoding.

use serde::{Deserialize, Serialize};

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// "ok".
    pub status: String,
}

/// `GET /v1/ready`: whether the process can do its work now (its storage answers, its quorum is
/// reachable), apart from `GET /v1/health`, which says only that it runs.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: String,
    /// Each check's result: `ok`, or why it failed.
    pub checks: std::collections::BTreeMap<String, String>,
}

/// `GET /v1/info`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Info {
    /// The authority's address.
    pub authority: String,
    /// Florin version.
    pub version: String,
    /// Whether the faucet is on (devnet).
    pub faucet: bool,
    /// Largest faucet request, in cents.
    pub max_faucet_cents: u64,
    /// Whether the faucet needs an operator credential (on everywhere but the devnet).
    #[serde(default)]
    pub faucet_needs_operator: bool,
    /// The ledger's issuer key (`eur1…`): it signs mints and the ledger's confirmations
    /// (`GET /v1/ledger/transactions/{txid}/confirmation`). Absent where no ledger runs.
    #[serde(default)]
    pub issuer: Option<String>,
}

/// `POST /v1/faucet`: mint tokens straight to a wallet (devnet only).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FaucetRequest {
    /// The recipient's address.
    pub recipient: String,
    /// Amount in cents.
    pub amount_cents: u64,
    /// The recipient's handshake (hex, 32 bytes).
    pub handshake: String,
}

/// Tokens issued.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FaucetResponse {
    /// Tokens (hex).
    pub tokens: Vec<String>,
}

/// `POST /v1/deposit`: tokens signed over to the authority.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DepositRequest {
    /// The depositor's address (each token's penultimate recipient).
    pub depositor: String,
    /// Tokens (hex), each with the authority as last recipient. The handshake of that last
    /// link is the one the re-anchored token will carry.
    pub tokens: Vec<String>,
    /// Credit clean tokens to the depositor on the ledger (instead of re-anchoring them).
    #[serde(default)]
    pub credit: bool,
}

/// A ledger credit for a deposit: the depositor's new output.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreditInfo {
    /// The credit transaction (hex txid).
    pub txid: String,
    /// "confirmed" once durable on the ledger.
    pub status: String,
    /// The depositor's output (hex of the UTXO).
    pub output: String,
}

/// `POST /v1/withdraw`: tokens against a confirmed payment to the reserve.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WithdrawRequest {
    /// The ledger transfer paying the reserve (hex).
    pub tx: String,
    /// Which of its outputs pays the reserve.
    pub output: usize,
    /// The tokens' first recipient (address).
    pub recipient: String,
    /// The recipient's handshake (64 hex).
    #[schema(pattern = "^[0-9a-fA-F]{64}$")]
    pub handshake: String,
    /// The key that authorizes the withdrawal: the key of one of the transfer's inputs (64 hex
    /// for Ed25519; 66 hex, SEC1 compressed, for P-256).
    #[serde(default)]
    pub key: Option<String>,
    /// That key's signature on [`withdraw_message`] (128 hex). Without a valid one the
    /// authority mints nothing and returns nothing: seeing the transaction gives no tokens.
    #[serde(default)]
    pub signature: Option<String>,
}

pub use florin_ledger::withdraw::{withdraw_message, WITHDRAW_AUTH_DOMAIN};

/// A detected double spend.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct FraudInfo {
    /// The proof's id (hex).
    pub id: String,
    /// Serial (hex).
    pub serial: String,
    /// Value in cents.
    pub value_cents: u64,
    /// Address of the key that signed twice.
    pub culprit: String,
    /// Unix seconds when first detected.
    pub detected_at: u64,
    /// The proof (hex).
    pub proof: String,
}

/// The outcome of one deposited token.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DepositReport {
    /// Serial (hex).
    pub serial: String,
    /// Value in cents.
    pub value_cents: u64,
    /// "reanchored", "repeated", "double_spend" or "refused".
    pub outcome: String,
    /// The re-anchored token (hex), for "reanchored" and "repeated".
    pub token: Option<String>,
    /// The fraud found, for "double_spend".
    pub fraud: Option<FraudInfo>,
    /// Why it was refused.
    pub error: Option<String>,
    /// A stable code for why it was refused, where it has one (`blacklisted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Whether a refused token may succeed later.
    pub retry: bool,
}

/// `POST /v1/deposit` response.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DepositResponse {
    /// One report per token, in request order.
    pub results: Vec<DepositReport>,
    /// The ledger credit, for a crediting deposit with clean tokens.
    #[serde(default)]
    pub credit: Option<CreditInfo>,
}

/// `GET /v1/tokens/{serial}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenInfo {
    /// Serial (hex).
    pub serial: String,
    /// Value in cents.
    pub value_cents: u64,
    /// "in_circulation", "deposited" or "blacklisted".
    pub status: String,
    /// Links in the stored history.
    pub history_links: usize,
    /// Anchors (mint and re-anchors).
    pub anchors: usize,
    /// Current holder's address.
    pub holder: String,
}

/// Error body of every non-2xx answer, on every route of the node and of a provider:
/// `{"error": {"code": "...", "message": "..."}}` (codes and statuses in `docs/api.md`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ApiError {
    /// The code and the message.
    pub error: ApiErrorBody,
}

/// The inside of [`ApiError`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ApiErrorBody {
    /// Stable code (`bad_request`, `not_found`, `too_large`, `rate_limited`, ...).
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// An error body with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            error: ApiErrorBody {
                code: code.into(),
                message: message.into(),
            },
        }
    }

    /// The code.
    pub fn code(&self) -> &str {
        &self.error.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.error.message
    }
}

/// `POST /v1/ledger/transactions`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubmitTx {
    /// The transaction (hex of its canonical encoding).
    pub tx: String,
}

/// `POST /v1/ledger/batch` (JSON form).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubmitBatch {
    /// The transactions (hex of their canonical encodings), at most 4,096.
    pub txs: Vec<String>,
}

/// The answer to a batch: one status per transaction, in the order given.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubmitBatchAnswer {
    /// Statuses.
    pub results: Vec<LedgerTxStatus>,
}

/// `GET /v1/ledger/transactions/{txid}/confirmation`: the ledger's signed word that a
/// transaction is confirmed (committed and durable, never undone). The issuer's key signs
/// `H("florin/ledger/confirmation/v1", txid ‖ at (8, LE))`; the transaction itself, which
/// its holder keeps, says what it paid to whom (its txid binds every input and output).
/// A payment provider keeps one for every cross-provider payment as its proof of payment
/// (Filia's Verifier proof, `004_…` 4.1 step ⑥; see `florin_node::psp::proof`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LedgerConfirmation {
    /// The txid (hex).
    pub txid: String,
    /// The issuer's key (`eur1…`) that signed.
    pub issuer: String,
    /// Unix seconds when the ledger signed.
    pub at: u64,
    /// Ed25519 signature (hex) over [`LedgerConfirmation::digest`].
    pub signature: String,
}

/// Domain of [`LedgerConfirmation::digest`].
pub const CONFIRMATION_DOMAIN: &str = "florin/ledger/confirmation/v1";

impl LedgerConfirmation {
    /// What the issuer signs.
    pub fn digest(txid: &[u8; 32], at: u64) -> florin_crypto::Digest {
        florin_crypto::hash(CONFIRMATION_DOMAIN, &[txid, &at.to_le_bytes()])
    }

    /// Checks the signature; the txid and the issuer's key it verifies under. It says
    /// nothing about whether that key is the ledger's issuer: the caller compares it with
    /// the one it trusts.
    pub fn verify(&self) -> Result<([u8; 32], florin_crypto::PublicKey), String> {
        let txid: [u8; 32] = hex::decode(&self.txid)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or("the confirmation's txid is not 32 bytes of hex")?;
        let issuer = florin_crypto::PublicKey::parse(&self.issuer)
            .map_err(|e| format!("the confirmation's issuer key: {e}"))?;
        let sig = hex::decode(&self.signature)
            .ok()
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .ok_or("the confirmation's signature is not 64 bytes of hex")?;
        florin_crypto::verify(
            &issuer,
            &Self::digest(&txid, self.at),
            &florin_crypto::Signature(sig),
        )
        .map_err(|_| "the ledger's signature on the confirmation does not verify".to_string())?;
        Ok((txid, issuer))
    }
}

/// A ledger transaction's status.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerTxStatus {
    /// The txid (hex).
    pub txid: String,
    /// "pending", "static_invalid", "state_invalid" or "confirmed" (committed and durable).
    pub status: String,
    /// Why it is invalid.
    pub error: Option<String>,
}

impl LedgerTxStatus {
    /// The answer for a transaction and its status on the ledger.
    pub fn of(txid: &[u8; 32], status: &crate::ledger::TxStatus) -> LedgerTxStatus {
        LedgerTxStatus {
            txid: hex::encode(txid),
            status: status.name().into(),
            error: status.error().map(str::to_string),
        }
    }

    /// The status this answer names (`None` for a name this version does not know).
    pub fn to_status(&self) -> Option<crate::ledger::TxStatus> {
        use crate::ledger::TxStatus;
        let error = || self.error.clone().unwrap_or_default();
        Some(match self.status.as_str() {
            "pending" => TxStatus::Pending,
            "static_invalid" => TxStatus::StaticInvalid(error()),
            "state_invalid" => TxStatus::StateInvalid(error()),
            "confirmed" => TxStatus::Confirmed,
            "expired" => TxStatus::Expired(error()),
            _ => return None,
        })
    }
}

/// One transaction this node decided (`GET /v1/ledger/recent`).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecentTx {
    /// The txid (hex).
    pub txid: String,
    /// Its status when decided, as [`LedgerTxStatus::status`].
    pub status: String,
    /// Why it is invalid.
    pub error: Option<String>,
    /// When it was decided (unix seconds).
    pub at: u64,
}

/// `GET /v1/ledger/recent`: the last transactions this node decided, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecentTxs {
    /// At most 256.
    pub transactions: Vec<RecentTx>,
}

/// `GET /v1/cluster`: a sentinel's view of its cluster's Raft groups.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterStatus {
    /// Whether every group is healthy.
    pub healthy: bool,
    /// The shard groups, the coordinator groups, then the authority group.
    pub groups: Vec<GroupStatus>,
}

/// One Raft group.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GroupStatus {
    /// `shard`, `coordinator` or `authority`.
    pub role: String,
    /// Its index among the groups of its role.
    pub group: u16,
    /// The replica its members agree leads (none while they do not).
    pub leader: Option<u64>,
    /// The highest term a replica reported.
    pub term: Option<u64>,
    /// One agreed leader, every replica that answers following it, a majority answering.
    pub healthy: bool,
    /// Its replicas.
    pub members: Vec<MemberStatus>,
}

/// One replica of a group, as it answered (`up: false` when it did not).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MemberStatus {
    /// Its Raft id.
    pub id: u64,
    /// Where it listens for the cluster's RPC (on emulated hosts, its host's address).
    pub addr: String,
    /// Whether it answered.
    pub up: bool,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub state: Option<String>,
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// Its term.
    pub term: Option<u64>,
    /// Its last log index.
    pub last_log_index: Option<u64>,
    /// The last index it applied.
    pub last_applied: Option<u64>,
    /// How far its applied index is behind the leader's log.
    pub lag: Option<u64>,
}

/// `GET /v1/custody`: the key-management network a node signs through.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CustodyStatus {
    /// Shares needed to sign.
    pub t: u16,
    /// Nodes in the network.
    pub n: u16,
    /// Whether at least `t` nodes answer (the node can sign).
    pub healthy: bool,
    /// Every node.
    pub nodes: Vec<CustodyNodeStatus>,
}

/// One custody node, as it answered.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CustodyNodeStatus {
    /// Its party number.
    pub party: u16,
    /// Where it listens.
    pub addr: String,
    /// Whether it answered.
    pub up: bool,
    /// Why not.
    pub error: Option<String>,
    /// Keys it holds (FROST and ECDSA).
    pub keys: u64,
    /// FROST nonces it has ready.
    pub nonces_ready: u64,
    /// ECDSA presignatures it holds.
    pub presignatures: u64,
}

/// `GET /v1/ledger/unspent/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Unspent {
    /// The UHS id (hex).
    pub id: String,
    /// Whether it is unspent now.
    pub unspent: bool,
}

/// `POST /v1/ledger/faucet` (devnet only).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerFaucet {
    /// The owner: a wallet address, or an encumbrance's text form (`p256:<64 hex>` or
    /// `ed25519:<64 hex>`).
    pub owner: String,
    /// Amount in cents.
    pub amount_cents: u64,
}

/// The minted outputs.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerFaucetAnswer {
    /// The mint's txid (hex).
    pub txid: String,
    /// The created UTXOs (hex), confirmed and durable.
    pub outputs: Vec<String>,
}

/// `POST /v1/mailbox`: leave a sealed message (the payment handoff).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MailboxPut {
    /// The recipient's address.
    pub to: String,
    /// The sealed message (hex).
    pub message: String,
}

/// One mailbox message.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MailboxMessage {
    /// Sequence number within the recipient's mailbox (from 1).
    pub seq: u64,
    /// The sealed message (hex).
    pub message: String,
}

/// `GET /v1/mailbox/{address}?after=N`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MailboxList {
    /// Messages after `after`, oldest first (at most 1,000).
    pub messages: Vec<MailboxMessage>,
}

/// `POST /v1/admin/blacklist` (operator): take a token out of circulation.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdminBlacklist {
    /// The token's serial (16 hex digits).
    pub serial: String,
    /// Why (kept in the audit trail).
    #[serde(default)]
    pub reason: String,
}

/// `POST /v1/admin/revoke` and `/v1/admin/unrevoke` (operator): a wallet key that may no
/// longer deposit or withdraw, or may again.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdminRevoke {
    /// The key (an `eur1…` address or 64 hex digits).
    pub key: String,
    /// Why (kept in the audit trail).
    #[serde(default)]
    pub reason: String,
}

/// One blacklisted token or revoked key, with who decided it, when and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AdminEntry {
    /// The token's serial (hex) or the key's address.
    pub subject: String,
    /// The operator's key (address) that decided it.
    pub operator: String,
    /// When (unix seconds).
    pub at: u64,
    /// The operator's reason.
    pub reason: String,
}

/// One operator action in the audit trail (`GET /v1/admin/log`), oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct AdminLogEntry {
    /// Its place in the trail (from 1).
    pub seq: u64,
    /// `blacklist`, `revoke` or `unrevoke`.
    pub action: String,
    /// The entry.
    #[serde(flatten)]
    pub entry: AdminEntry,
}

/// Rate limits: requests per second and burst per client address, and per key (a mailbox's
/// recipient, a withdrawal's key, a faucet's owner). Zero turns a limit off. A sentinel reads
/// them from its `node.toml` (`[limits]`; a field left out keeps its default), for example to
/// lift the per-address limits behind a load balancer, where every request comes from its
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimits {
    /// Requests per second one client address may make (sustained).
    pub per_ip_per_sec: u32,
    /// Requests one client address may make at once, above the sustained rate.
    pub per_ip_burst: u32,
    /// Requests per second naming one key (mailbox recipient, withdrawing key, faucet owner).
    pub per_key_per_sec: u32,
    /// Requests naming one key at once.
    pub per_key_burst: u32,
    /// Transactions per second one client address may have validated, sustained: the budget
    /// of validation work (a batch costs one per transaction, a deposit one per token). An
    /// address that has spent it is refused with 429 before its next body is read.
    pub per_ip_tx_per_sec: u32,
    /// Transactions one client address may have validated at once, above the sustained rate.
    pub per_ip_tx_burst: u32,
}

/// The connection limits of a sentinel's API (`[connections]` in its `node.toml`): what
/// `florin devnet` takes as `--conns-per-ip` and `--new-conns-per-ip`. Behind a load balancer
/// every connection comes from its address: raise them there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionLimits {
    /// Connections open at once, all clients together.
    pub max: usize,
    /// Connections one client address (an IPv6 /64) may hold open at once; 0 turns this off
    /// (one address may then hold up to `max`).
    pub per_ip: usize,
    /// New connections one client address may open per second (a burst of ten times as
    /// many); 0 turns this off.
    pub new_per_ip_per_sec: u32,
}

impl Default for ConnectionLimits {
    /// The HTTP server's own defaults.
    fn default() -> Self {
        ConnectionLimits {
            max: 1024,
            per_ip: 256,
            new_per_ip_per_sec: 200,
        }
    }
}

impl Default for RateLimits {
    /// High enough that the test suite and `florin bench ledger` never meet them on one
    /// machine; low enough that one address cannot flood the node with cheap requests.
    fn default() -> Self {
        RateLimits {
            per_ip_per_sec: 5_000,
            per_ip_burst: 10_000,
            per_key_per_sec: 100,
            per_key_burst: 1_000,
            per_ip_tx_per_sec: 2_000,
            per_ip_tx_burst: 4_096,
        }
    }
}

impl RateLimits {
    /// No limits.
    pub fn off() -> RateLimits {
        RateLimits {
            per_ip_per_sec: 0,
            per_ip_burst: 0,
            per_key_per_sec: 0,
            per_key_burst: 0,
            per_ip_tx_per_sec: 0,
            per_ip_tx_burst: 0,
        }
    }
}
