//! The payment provider's HTTP/JSON API bodies, shared by the server, `florin psp` and other
//! providers (which call `receive`). Amounts are in cents; UTXOs travel as hex of their
//! canonical encoding; a payee is named by an encumbrance's text form
//! (`p256:<64 hex>` / `ed25519:<64 hex>`, see `florin_ledger::Encumbrance::to_text`).

use serde::{Deserialize, Serialize};

/// `GET /v1/psp/info`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PspInfo {
    /// The provider's name.
    pub name: String,
    /// Customers' key scheme: `p256` (threshold ECDSA) or `ed25519` (FROST).
    pub scheme: String,
    /// Key-management network: signatures need `t` of `n` nodes.
    pub t: u16,
    /// Nodes in the key-management network.
    pub n: u16,
    /// The ledger API this provider settles on.
    pub ledger: String,
    /// Customer accounts.
    pub accounts: usize,
    /// Payments whose ledger outcome is not known yet (retried in the background).
    pub unresolved: usize,
    /// Cross-provider payments settled but not yet acknowledged by the payee's provider.
    pub unnotified: usize,
    /// The provider's peer key (`eur1…`): what other providers configure for it.
    #[serde(default)]
    pub peer_key: String,
    /// The peers it pays and takes `receive` from, by name.
    #[serde(default)]
    pub peers: Vec<String>,
}

/// `POST /v1/psp/accounts`: open a custodial account (its key is made by distributed key
/// generation in the provider's key-management network).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OpenAccount {
    /// The account's name: 1–48 of `a-z 0-9 - _`.
    pub name: String,
    /// The customer's device key (`eur1…`, Ed25519): it signs every request for the account
    /// (this one included) and authorizes every payment; the key-management nodes bind it to
    /// the account's key. Required.
    #[serde(default)]
    pub customer_key: Option<String>,
}

/// `GET /v1/psp/payees/{name}` (public; `?peer=ID` asks that configured peer): where to pay an
/// account.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PayeeView {
    /// Name.
    pub name: String,
    /// `p256` or `ed25519`.
    pub scheme: String,
    /// Where payers pay it on the ledger (text form).
    pub encumbrance: String,
    /// The same, signed by the provider's peer key: a paying provider keeps it in its proof
    /// of payment (`florin_node::psp::proof`) and refuses to pay without it.
    #[serde(default)]
    pub offer: Option<super::proof::PayeeOffer>,
}

/// An account as the provider reports it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AccountView {
    /// Name.
    pub name: String,
    /// `p256` or `ed25519`.
    pub scheme: String,
    /// The threshold public key (hex: 33-byte SEC1 for P-256, 32 bytes for Ed25519).
    pub public_key: String,
    /// Where payers pay this account on the ledger (text form).
    pub encumbrance: String,
    /// Spendable balance.
    pub balance_cents: u64,
    /// Unspent outputs held.
    pub coins: usize,
    /// Payments from this account whose ledger outcome is not known yet.
    pub unresolved: usize,
    /// P-256 accounts: presignatures ready for one-round signing.
    #[serde(default)]
    pub presignatures_ready: Option<usize>,
    /// The customer's key (`eur1…`) bound to the account's key.
    #[serde(default)]
    pub customer_key: Option<String>,
}

/// `GET /v1/psp/accounts`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AccountList {
    /// Every account, by name.
    pub accounts: Vec<AccountView>,
}

/// `POST /v1/psp/accounts/{name}/faucet` (devnet ledgers only): the ledger's faucet mints to
/// the account.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Fund {
    /// Amount in cents.
    pub amount_cents: u64,
}

/// `POST /v1/psp/pay`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PayRequest {
    /// The paying account.
    pub from: String,
    /// The payee: an account name here or at `to_psp`, or an encumbrance's text form (any
    /// ledger wallet).
    pub to: String,
    /// The payee's provider when the payee is another provider's customer: a configured
    /// peer's name, or its URL exactly as configured (no other URL is ever called).
    #[serde(default)]
    pub to_psp: Option<String>,
    /// Amount in cents.
    pub amount_cents: u64,
    /// The client's id for this payment (1–64 printable ASCII characters): a request repeated
    /// with the same id is answered with the first payment's receipt and pays nothing more.
    /// Give one whenever a request may be retried.
    #[serde(default)]
    pub id: Option<String>,
    /// The customer's signed authorization of exactly this payment
    /// (`florin_custody::authz::PaymentAuth`, hex): its id must be `id`, its payee the
    /// payee's encumbrance. The key-management nodes check it before they sign. Required.
    #[serde(default)]
    pub authorization: Option<String>,
    /// Filia's remote transfer: the payee's provider's offer from `POST /v1/psp/transfers`
    /// (with `to_psp`). When it carries `r1`, the payment goes to the joint key `R1 + R2`
    /// that the answer named, and `r2` is handed over with the output.
    #[serde(default)]
    pub offer: Option<super::proof::PayeeOffer>,
}

/// `POST /v1/psp/transfers` (customer-signed as `from`): announces a payment to another
/// provider's customer (Filia's remote transfer, step ①) and answers where to pay it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StartTransfer {
    /// The paying account.
    pub from: String,
    /// The payee's account at `to_psp`.
    pub to: String,
    /// The payee's provider: a configured peer's name or URL.
    pub to_psp: String,
    /// Amount in cents.
    pub amount_cents: u64,
}

/// The answer to a [`StartTransfer`]: authorize a payment to `encumbrance`, then pay with
/// `offer` in the [`PayRequest`].
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TransferOffer {
    /// The payee's provider's signed offer.
    pub offer: super::proof::PayeeOffer,
    /// Where the payment goes: `R1 + R2`'s encumbrance for a joint key, else the offer's.
    pub encumbrance: String,
    /// For a joint key, `r2` (hex): the customer checks `encumbrance` is `R1 + r2·G` with
    /// the offer's `R1`, signed by the payee's provider, before authorizing.
    #[serde(default)]
    pub r2: Option<String>,
}

/// `POST /v1/psp/announce` (peer-signed): a provider announces a payment to one of this
/// provider's accounts; the answer is a signed offer, with a fresh note key `R1` of the
/// account where the account's key has note keys.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Announce {
    /// The payee's account.
    pub account: String,
    /// Amount in cents.
    pub amount_cents: u64,
}

/// Filia's step ⑦: the paying provider hands over `r2`, so that the payee's provider's note
/// key of output `id` becomes `r1 + r2`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Handover {
    /// The output's UHS id (hex).
    pub id: String,
    /// The offer's transfer id.
    pub transfer: String,
    /// The payee's account.
    pub account: String,
    /// `r2` (hex, 32 bytes).
    pub r2: String,
}

/// A settled payment.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PayReceipt {
    /// The ledger transaction (hex txid).
    pub txid: String,
    /// `same_provider` (UC1), `cross_provider` (UC2) or `ledger` (an encumbrance, no provider
    /// told).
    pub route: String,
    /// The payee's output (hex of the UTXO).
    pub payee_output: String,
    /// The payer's change output, if any (hex of the UTXO).
    pub change_output: Option<String>,
    /// Cross-provider: whether the payee's provider acknowledged the payment (if not, it is
    /// retried in the background; the money is already the payee's on the ledger).
    pub notified: bool,
    /// Whether this answers a repeated payment id (nothing was paid this time).
    #[serde(default)]
    pub repeated: bool,
    /// Threshold signatures the payment took: one per key among its inputs (the account's
    /// key and each note key spent; 0 for a repeated id).
    #[serde(default)]
    pub signatures: usize,
    /// Time spent on the threshold signature, milliseconds.
    pub sign_ms: f64,
    /// Time from the request to confirmation (and acknowledgement), milliseconds.
    pub total_ms: f64,
}

/// `POST /v1/psp/receive`: another provider (or anyone) tells this one about ledger outputs
/// that pay its customers. Each is checked unspent on the ledger before it is credited, so the
/// caller needs no trust.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Receive {
    /// The outputs (hex of each UTXO), at most 256.
    pub outputs: Vec<String>,
    /// Who sent them (free text, kept in the payee's history).
    #[serde(default)]
    pub from: Option<String>,
    /// Keys handed over for outputs paid to joint keys `R1 + R2` (at most one per output).
    #[serde(default)]
    pub handover: Vec<Handover>,
}

/// What happened to one output of a [`Receive`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Received {
    /// The output's UHS id (hex).
    pub id: String,
    /// The account it pays, if it pays one here.
    pub account: Option<String>,
    /// `credited`, `known` (credited before, even if spent since: a replay changes nothing),
    /// `not_ours` or `not_unspent` (the ledger does not hold it unspent).
    pub outcome: String,
}

/// The answer to a [`Receive`], one entry per output in order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ReceiveAnswer {
    /// Outcomes.
    pub results: Vec<Received>,
    /// The answering provider's signature over the outcomes (its acknowledgement, which the
    /// paying provider keeps in its proof of payment).
    #[serde(default)]
    pub signed: Option<super::proof::ReceiptAck>,
}

/// One line of an account's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct HistoryEntry {
    /// Sequence number (per provider, increasing).
    pub seq: u64,
    /// `out` (paid), `in` (received) or `funded` (faucet).
    pub direction: String,
    /// The ledger transaction (hex txid), when known.
    pub txid: Option<String>,
    /// The other side: an account name, `name@provider`, an encumbrance or a sender's label.
    pub counterparty: String,
    /// Amount in cents.
    pub amount_cents: u64,
    /// `same_provider`, `cross_provider`, `ledger` or `faucet`.
    pub route: String,
    /// Unix seconds.
    pub at: u64,
}

/// `GET /v1/psp/accounts/{name}/history`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct History {
    /// Oldest first (at most the last 1,000).
    pub entries: Vec<HistoryEntry>,
}
