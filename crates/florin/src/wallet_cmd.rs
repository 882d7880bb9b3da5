//! `florin wallet …`: a wallet file and the commands a user needs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use florin_crypto::PublicKey;
use florin_ledger::Utxo;
use florin_node::api::{DepositRequest, LedgerFaucet, WithdrawRequest};
use florin_token::amount::{format_cents, parse_euros};
use florin_token::{FraudProof, Token};
use florin_wallet::online::decode_handoff;
use florin_wallet::{DepositItem, FileStore, Wallet, WalletStore};
use rand::rngs::OsRng;
use serde_json::json;

use crate::client::{runtime, NodeClient};
use crate::util::print_json;

/// Options of `florin wallet`.
#[derive(Args)]
pub struct WalletArgs {
    /// The wallet file.
    #[arg(long, env = "FLORIN_WALLET", default_value = "florin-wallet.json")]
    wallet: PathBuf,
    /// The node's API.
    #[arg(long, env = "FLORIN_NODE", default_value = "http://127.0.0.1:7400")]
    node: String,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: WalletCommand,
}

#[derive(Subcommand)]
enum WalletCommand {
    /// Create a wallet with a fresh key.
    New {
        /// The authority to trust (address); fetched from the node when omitted.
        #[arg(long)]
        authority: Option<String>,
        /// Most offline hops accepted in an incoming token.
        #[arg(long)]
        max_hops: Option<usize>,
        /// Most money held as tokens received offline, in euros.
        #[arg(long)]
        max_offline: Option<String>,
    },
    /// Print the wallet's address.
    Address,
    /// Show verified and offline money, by denomination.
    Balance,
    /// Get ledger funds from the devnet faucet (the issuer mints them to this wallet).
    Faucet {
        /// Amount in euros, e.g. 12.50.
        #[arg(allow_hyphen_values = true)]
        amount: String,
    },
    /// Pay on the online ledger: coin selection, change to a fresh key, and the payee's output
    /// handed off through its mailbox.
    Pay {
        /// The payee's address.
        address: String,
        /// Amount in euros.
        #[arg(allow_hyphen_values = true)]
        amount: String,
    },
    /// Collect incoming payments (mailbox handoffs checked unspent on the ledger) and finish
    /// anything in flight.
    Sync,
    /// Turn ledger funds into tokens: pay the authority's reserve, receive tokens of that value.
    Withdraw {
        /// Amount in euros.
        #[arg(allow_hyphen_values = true)]
        amount: String,
    },
    /// Offline payments: by file, QR code, or a device-to-device channel.
    Offline {
        #[command(subcommand)]
        command: crate::offline_cmd::OfflineCommand,
    },
    /// Send tokens received offline to the authority: verified, then credited back to the
    /// ledger (default) or re-anchored to this wallet as fresh tokens (`--reanchor`).
    Deposit {
        /// Re-anchor the tokens instead of crediting the ledger.
        #[arg(long)]
        reanchor: bool,
    },
}

/// Runs a wallet command.
pub fn run(args: WalletArgs) -> Result<ExitCode> {
    let store = FileStore::new(&args.wallet);
    let json = args.json;
    // One command at a time per wallet: two concurrent payments must never spend the same
    // tokens. Held until the command ends.
    let _lock = match &args.command {
        WalletCommand::Offline { command } if crate::offline_cmd::locks_itself(command) => None,
        _ => Some(store.lock()?),
    };
    match args.command {
        WalletCommand::New {
            authority,
            max_hops,
            max_offline,
        } => {
            let authority = match authority {
                Some(a) => Some(PublicKey::parse(&a).context("--authority")?),
                None => fetch_authority(&args.node).ok(),
            };
            let mut w = Wallet::generate(&mut OsRng, authority);
            if let Some(h) = max_hops {
                if h > florin_wallet::MAX_HOPS_LIMIT {
                    bail!("--max-hops is at most {}", florin_wallet::MAX_HOPS_LIMIT);
                }
                w.max_hops = h;
            }
            if let Some(m) = max_offline {
                w.max_offline_cents = parse_euros(&m)?;
            }
            store.create(&w)?;
            let out = json!({
                "wallet": args.wallet.display().to_string(),
                "address": w.public_key().to_address(),
                "authority": w.authority().map(|a| a.to_address()),
            });
            if json {
                print_json(&out);
            } else {
                println!("created {} for {}", args.wallet.display(), w.public_key());
                if w.authority().is_none() {
                    println!("no node reachable: the authority will be fetched on first use");
                }
            }
        }
        WalletCommand::Address => {
            let w = store.load()?;
            if json {
                print_json(&json!({ "address": w.public_key().to_address() }));
            } else {
                println!("{}", w.public_key());
            }
        }
        WalletCommand::Balance => {
            let w = store.load()?;
            let b = w.balance();
            if json {
                print_json(&serde_json::to_value(&b)?);
            } else {
                println!("address   {}", b.address);
                println!(
                    "online    €{}  (on the ledger)",
                    format_cents(b.online_cents)
                );
                if b.withdrawing_cents > 0 {
                    println!(
                        "          €{} paid to the reserve, tokens on their way (sync)",
                        format_cents(b.withdrawing_cents)
                    );
                }
                println!("verified  €{}", format_cents(b.verified_cents));
                for d in &b.verified {
                    println!("            {:>4} × €{}", d.count, d.denomination);
                }
                println!(
                    "offline   €{}  (received offline, not yet deposited)",
                    format_cents(b.offline_cents)
                );
                for d in &b.offline {
                    println!("            {:>4} × €{}", d.count, d.denomination);
                }
                if b.pending_deposit_cents > 0 {
                    println!(
                        "pending   €{}  (deposit awaiting the authority)",
                        format_cents(b.pending_deposit_cents)
                    );
                }
                println!("total     €{}", format_cents(b.total_cents));
            }
        }
        WalletCommand::Faucet { amount } => {
            let cents = parse_euros(&amount)?;
            let mut w = store.load()?;
            ensure_authority(&mut w, &args.node)?;
            let client = NodeClient::new(&args.node)?;
            let req = LedgerFaucet {
                owner: w.public_key().to_address(),
                amount_cents: cents,
            };
            let rt = runtime()?;
            let resp = rt.block_on(client.ledger_faucet(&req))?;
            let utxos = decode_utxos(&resp.outputs)?;
            let got = w.receive_utxos(&utxos);
            store.save(&w)?;
            // Handoffs owed to payees go out in the background; they never block this.
            let handoffs = rt.block_on(deliver(&mut w, &store, &client))?;
            handoffs.tell(json);
            if json {
                print_json(
                    &json!({ "received_cents": got, "outputs": utxos.len(), "online_cents": w.balance().online_cents, "total_cents": w.balance().total_cents }),
                );
            } else {
                println!(
                    "received €{} on the ledger ({} outputs)",
                    format_cents(got),
                    utxos.len()
                );
            }
        }
        WalletCommand::Pay { address, amount } => {
            let cents = parse_euros(&amount)?;
            // Checked before the wallet is even opened: nothing is signed or submitted to an
            // address that is not a usable key (the money would be lost for good).
            let payee = PublicKey::parse_valid(&address)
                .with_context(|| format!("payee address {address}"))?;
            let mut w = store.load()?;
            let client = NodeClient::new(&args.node)?;
            let rt = runtime()?;
            let earlier = rt.block_on(finish_in_flight(&mut w, &store, &client))?;
            let tx = rt.block_on(build_paying(&mut w, &store, &client, payee, cents, "pay"))?;
            // Saved before it leaves: a crash resumes it (submission is idempotent).
            store.save(&w)?;
            let s = rt.block_on(settle(&mut w, &store, &client, hex::encode(tx.encode())))?;
            if s.status != "confirmed" {
                earlier.tell(json);
                bail!("{}", s.refusal("payment", &w));
            }
            let mut handoffs = rt.block_on(deliver(&mut w, &store, &client))?;
            handoffs.merge(earlier);
            let utxo = hex::encode(tx_payee_output(&tx)?.encode());
            let fate = if handoffs.delivered_this(&utxo) {
                "delivered"
            } else if handoffs.dropped_this(&utxo) {
                "dropped"
            } else {
                "pending"
            };
            if json {
                print_json(&json!({
                    "txid": hex::encode(tx.txid()),
                    "status": "confirmed",
                    "paid": true,
                    "amount_cents": cents,
                    "payee": payee.to_address(),
                    "handoff": fate,
                    "handoff_delivered": fate == "delivered",
                    "handoffs_pending": w.outbox().len(),
                    "handoffs_dropped": handoffs.dropped_json(),
                    "online_cents": w.balance().online_cents,
                }));
            } else {
                println!(
                    "paid €{} to {payee} (txid {})",
                    format_cents(cents),
                    hex::encode(tx.txid())
                );
                if fate == "pending" {
                    println!(
                        "handoff pending: the payment is confirmed on the ledger, but the payee's \
                         notice could not be delivered yet; later commands (sync, pay, withdraw) \
                         retry it. Do not pay again."
                    );
                }
                handoffs.tell(false);
            }
        }
        WalletCommand::Sync => {
            let mut w = store.load()?;
            ensure_authority(&mut w, &args.node)?;
            let client = NodeClient::new(&args.node)?;
            let rt = runtime()?;
            let r = rt.block_on(sync(&mut w, &store, &client))?;
            if json {
                print_json(&json!({
                    "received_cents": r.received,
                    "withdrawn_cents": r.withdrawn,
                    "removed_coins": r.removed.0,
                    "removed_cents": r.removed.1,
                    "handoffs_delivered": r.handoffs.delivered.len(),
                    "handoffs_pending": w.outbox().len(),
                    "handoffs_dropped": r.handoffs.dropped_json(),
                    "withdrawals_waiting": w.awaiting_tokens().len(),
                    "withdrawal_errors": r.withdraw_errors,
                    "online_cents": w.balance().online_cents,
                    "total_cents": w.balance().total_cents,
                }));
            } else {
                println!(
                    "received €{} on the ledger; €{} of withdrawals arrived as tokens",
                    format_cents(r.received),
                    format_cents(r.withdrawn)
                );
                if r.removed.0 > 0 {
                    println!(
                        "removed {} coins worth €{}: the ledger says they were spent elsewhere \
                         (a copy of this wallet, or a restored backup)",
                        r.removed.0,
                        format_cents(r.removed.1)
                    );
                }
                r.handoffs.tell(false);
                for e in &r.withdraw_errors {
                    println!("withdrawal still waiting for its tokens: {e}");
                }
            }
        }
        WalletCommand::Withdraw { amount } => {
            let cents = parse_euros(&amount)?;
            let mut w = store.load()?;
            ensure_authority(&mut w, &args.node)?;
            let reserve = w.authority().ok_or_else(|| anyhow!("no authority"))?;
            let client = NodeClient::new(&args.node)?;
            let rt = runtime()?;
            let earlier = rt.block_on(finish_in_flight(&mut w, &store, &client))?;
            earlier.tell(json);
            let tx = rt.block_on(build_paying(
                &mut w, &store, &client, reserve, cents, "withdraw",
            ))?;
            store.save(&w)?;
            let s = rt.block_on(settle(&mut w, &store, &client, hex::encode(tx.encode())))?;
            if s.status != "confirmed" {
                bail!("{}", s.refusal("payment to the reserve", &w));
            }
            let txhex = hex::encode(tx.encode());
            let (got, errors) = rt.block_on(collect_withdrawals(&mut w, &store, &client))?;
            let waiting = w.awaiting_tokens().iter().any(|a| a.tx == txhex);
            if json {
                print_json(&json!({
                    "withdrawn_cents": got,
                    "paid_to_reserve_cents": cents,
                    "tokens_pending": waiting,
                    "withdrawal_errors": errors,
                    "online_cents": w.balance().online_cents,
                    "verified_cents": w.balance().verified_cents,
                    "total_cents": w.balance().total_cents,
                }));
            } else {
                println!("withdrew €{} into tokens", format_cents(got));
            }
            if waiting {
                bail!(
                    "paid €{} to the reserve (txid {}), but its tokens have not arrived: {}; \
                     `florin wallet sync` collects them",
                    format_cents(cents),
                    hex::encode(tx.txid()),
                    errors.last().cloned().unwrap_or_default()
                );
            }
        }
        WalletCommand::Offline { command } => {
            let node = args.node.clone();
            return crate::offline_cmd::run(command, &store, json, &move |w| {
                ensure_authority(w, &node)
            });
        }
        WalletCommand::Deposit { reanchor } => return deposit(&store, &args.node, json, !reanchor),
    }
    Ok(ExitCode::SUCCESS)
}

fn deposit(store: &FileStore, node: &str, json: bool, credit: bool) -> Result<ExitCode> {
    let mut w = store.load()?;
    ensure_authority(&mut w, node)?;
    let Some((_handshake, tokens)) = w.prepare_deposit_mode(&mut OsRng, credit)? else {
        if json {
            print_json(
                &json!({ "credited_cents": 0, "reanchored": 0, "fraud": [], "refused": [], "lost_cents": 0, "still_pending": 0 }),
            );
        } else {
            println!("nothing to deposit: no tokens received offline");
        }
        return Ok(ExitCode::SUCCESS);
    };
    // Signed over to the authority: persist before sending, so a retry resends the same bytes.
    store.save(&w)?;
    let credit = w.pending_deposit_credits();
    let req = DepositRequest {
        depositor: w.public_key().to_address(),
        tokens: tokens.iter().map(|t| hex::encode(t.encode())).collect(),
        credit,
    };
    let client = NodeClient::new(node)?;
    let resp = runtime()?
        .block_on(client.deposit(&req))
        .context("deposit is pending; run `florin wallet deposit` again to retry")?;
    let mut items = Vec::with_capacity(resp.results.len());
    for (r, sent) in resp.results.iter().zip(&tokens) {
        let item = match r.outcome.as_str() {
            "reanchored" | "repeated" => {
                let hexed = r
                    .token
                    .as_deref()
                    .ok_or_else(|| anyhow!("node sent no token"))?;
                DepositItem::Reanchored(decode_token(hexed)?)
            }
            "double_spend" => {
                let f = r
                    .fraud
                    .as_ref()
                    .ok_or_else(|| anyhow!("node sent no fraud proof"))?;
                let proof = FraudProof::decode(&hex::decode(&f.proof)?)?;
                // The wallet checks the proof against the token it sent before writing it off.
                DepositItem::DoubleSpend {
                    serial: sent.serial,
                    proof: Box::new(proof),
                }
            }
            "credited" | "already_credited" => DepositItem::Credited {
                serial: sent.serial,
            },
            _ => DepositItem::Refused {
                serial: sent.serial,
                reason: r.error.clone().unwrap_or_default(),
                retry: r.retry,
            },
        };
        items.push(item);
    }
    let res = w.finish_deposit(items, &mut OsRng)?;
    store.save(&w)?;
    let mut sync_note = None;
    if credit {
        // The credit arrives as a ledger output handed off to this wallet's mailbox.
        if let Err(e) = runtime()?.block_on(sync(&mut w, store, &client)) {
            sync_note = Some(format!(
                "the credit waits in this wallet's mailbox ({e:#}); `florin wallet sync` collects it"
            ));
        }
    }
    if json {
        let fraud: Vec<_> = res
            .fraud
            .iter()
            .map(|(s, c, p)| json!({ "serial": s, "culprit": c, "proof": p }))
            .collect();
        let refused: Vec<_> = res
            .refused
            .iter()
            .map(|(s, r)| json!({ "serial": s, "reason": r }))
            .collect();
        print_json(&json!({
            "credited_cents": res.credited_cents,
            "reanchored": res.reanchored,
            "fraud": fraud,
            "refused": refused,
            "lost_cents": res.lost_cents,
            "still_pending": res.still_pending,
        }));
    } else {
        println!(
            "credited €{} ({} tokens re-anchored to this wallet; the rest to the ledger)",
            format_cents(res.credited_cents),
            res.reanchored
        );
        for (s, c, _) in &res.fraud {
            println!("fraud: token {s} was double spent by {c}; it is lost to this wallet");
        }
        for (s, r) in &res.refused {
            println!("refused: token {s}: {r}");
        }
        if res.still_pending > 0 {
            println!(
                "{} tokens still pending; run deposit again later",
                res.still_pending
            );
        }
        if let Some(n) = &sync_note {
            println!("{n}");
        }
    }
    // Nothing credited or re-anchored and something refused: the deposit did nothing the user
    // asked for. (Tokens found double spent were decided — lost, with a proof — not refused.)
    if res.credited_cents == 0
        && res.reanchored == 0
        && (!res.refused.is_empty() || res.still_pending > 0)
    {
        bail!(
            "nothing was deposited: {} tokens refused{}{}",
            res.refused.len(),
            res.refused
                .first()
                .map(|(s, r)| format!(" (token {s}: {r})"))
                .unwrap_or_default(),
            if res.still_pending > 0 {
                format!(
                    ", {} still pending (run deposit again later)",
                    res.still_pending
                )
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn fetch_authority(node: &str) -> Result<PublicKey> {
    let client = NodeClient::new(node)?;
    let info = runtime()?.block_on(client.info())?;
    Ok(PublicKey::parse(&info.authority)?)
}

/// Learns the authority from the node on first use; afterwards insists it stays the same.
fn ensure_authority(w: &mut Wallet, node: &str) -> Result<()> {
    match w.authority() {
        Some(a) => {
            if let Ok(k) = fetch_authority(node) {
                if k != a {
                    bail!("the node at {node} is authority {k}, but this wallet trusts {a}");
                }
            }
            Ok(())
        }
        None => {
            let k = fetch_authority(node).context("this wallet trusts no authority yet")?;
            w.set_authority(k);
            Ok(())
        }
    }
}

fn decode_token(h: &str) -> Result<Token> {
    Ok(Token::decode(&hex::decode(h).context("token is not hex")?)?)
}

fn decode_tokens(hs: &[String]) -> Result<Vec<Token>> {
    hs.iter().map(|h| decode_token(h)).collect()
}

fn decode_utxos(hs: &[String]) -> Result<Vec<Utxo>> {
    hs.iter()
        .map(|h| Ok(Utxo::decode(&hex::decode(h).context("output is not hex")?)?))
        .collect()
}

/// The ledger's verdict on the wallet's transaction in flight.
struct Settled {
    status: String,
    error: Option<String>,
    /// Inputs the ledger no longer holds unspent, removed from the wallet: (count, cents).
    removed: (usize, u64),
}

impl Settled {
    /// What to tell the user when the ledger did not confirm.
    fn refusal(&self, what: &str, w: &Wallet) -> String {
        let why = self
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        match self.status.as_str() {
            "state_invalid" if self.removed.0 > 0 => format!(
                "the ledger refused the {what} ({}{why}): {} of your coins worth €{} were already \
                 spent elsewhere (a copy of this wallet, or a restored backup) and are removed; \
                 nothing was paid; €{} remains on the ledger — pay again",
                self.status,
                self.removed.0,
                format_cents(self.removed.1),
                format_cents(w.balance().online_cents)
            ),
            "state_invalid" | "static_invalid" => format!(
                "the ledger refused the {what} ({}{why}); nothing was paid and your coins are back \
                 in the wallet",
                self.status
            ),
            other => format!(
                "the {what} is submitted but not confirmed yet ({other}); do not pay again: \
                 `florin wallet sync` finishes it"
            ),
        }
    }
}

/// Submits `tx_hex` (idempotent) and settles the wallet's transaction in flight by the answer.
/// When the ledger says its inputs are not unspent, each input is checked and those the ledger
/// no longer holds are removed, so the next payment does not choose them again.
/// Builds a payment; one that needs more coins than a ledger transaction takes is preceded by
/// consolidations (the smallest coins into one), each confirmed before the next step.
async fn build_paying(
    w: &mut Wallet,
    store: &FileStore,
    client: &NodeClient,
    payee: PublicKey,
    cents: u64,
    purpose: &str,
) -> Result<florin_ledger::Transaction> {
    loop {
        match w.build_payment(payee, cents, purpose) {
            Err(florin_wallet::WalletError::TooManyInputs { needed, max }) => {
                let Some(tx) = w.build_consolidation()? else {
                    bail!("the payment needs {needed} coins, more than {max}, and there is nothing to consolidate");
                };
                // Saved before it leaves, like a payment: a crash resumes it.
                store.save(w)?;
                let s = settle(w, store, client, hex::encode(tx.encode())).await?;
                if s.status != "confirmed" {
                    bail!("{}", s.refusal("consolidation", w));
                }
                eprintln!(
                    "the payment needs {needed} coins and one transaction takes {max}: consolidated the smallest into one (txid {})",
                    hex::encode(tx.txid())
                );
            }
            other => return Ok(other?),
        }
    }
}

async fn settle(
    w: &mut Wallet,
    store: &FileStore,
    client: &NodeClient,
    tx_hex: String,
) -> Result<Settled> {
    let answer = client
        .submit(tx_hex)
        .await
        .context("the payment is saved and will be retried by `florin wallet sync`")?;
    let mut removed = (0, 0);
    match answer.status.as_str() {
        "confirmed" => {
            w.settle_pending(true);
        }
        "static_invalid" => {
            w.settle_pending(false);
        }
        "state_invalid" => {
            w.settle_pending(false);
            store.save(w)?;
            removed = reconcile(w, client).await?;
        }
        _ => {}
    }
    store.save(w)?;
    Ok(Settled {
        status: answer.status,
        error: answer.error,
        removed,
    })
}

/// Checks every coin the wallet holds against the ledger and forgets those no longer unspent.
/// Returns (count, cents) removed.
async fn reconcile(w: &mut Wallet, client: &NodeClient) -> Result<(usize, u64)> {
    let mut spent = Vec::new();
    for u in w.held_utxos() {
        if !client.unspent(&u.id()).await? {
            spent.push(u.id());
        }
    }
    // Set aside, never deleted: outputs a node called spent that it holds unspent again
    // (a ledger restored, a wrong node) come back.
    let mut back = Vec::new();
    for u in w.set_aside_utxos() {
        if client.unspent(&u.id()).await? {
            back.push(u.id());
        }
    }
    let (n, cents) = w.restore_unspent(&back);
    if n > 0 {
        eprintln!(
            "{n} output(s) of €{} set aside earlier as spent are unspent on the ledger again: back in the wallet",
            florin_token::amount::format_cents(cents)
        );
    }
    Ok(w.forget_spent(&spent))
}

/// The payee's output of a payment built by the wallet (output 0).
fn tx_payee_output(tx: &florin_ledger::Transaction) -> Result<Utxo> {
    match tx {
        florin_ledger::Transaction::Transfer(t) => t
            .output_utxos()
            .first()
            .copied()
            .ok_or_else(|| anyhow!("the payment has no output")),
        _ => bail!("not a transfer"),
    }
}

/// What happened to the handoffs owed to payees.
#[derive(Default)]
struct Handoffs {
    /// UTXOs (hex) delivered.
    delivered: Vec<String>,
    /// Why delivery is pending, if it is.
    pending: Option<String>,
    /// (payee, UTXO hex, why) dropped: they can never be delivered.
    dropped: Vec<(PublicKey, String, String)>,
}

impl Handoffs {
    fn merge(&mut self, other: Handoffs) {
        self.delivered.extend(other.delivered);
        self.dropped.extend(other.dropped);
        if self.pending.is_none() {
            self.pending = other.pending;
        }
    }

    fn delivered_this(&self, utxo: &str) -> bool {
        self.delivered.iter().any(|u| u == utxo)
    }

    fn dropped_this(&self, utxo: &str) -> bool {
        self.dropped.iter().any(|(_, u, _)| u == utxo)
    }

    fn dropped_json(&self) -> Vec<serde_json::Value> {
        self.dropped
            .iter()
            .map(|(p, u, why)| {
                let cents = Wallet::handoff_utxo(u).map(|u| u.value).unwrap_or(0);
                json!({ "payee": p.to_address(), "cents": cents, "reason": why })
            })
            .collect()
    }

    /// Tells the user about dropped handoffs (text mode; JSON carries them in fields).
    fn tell(&self, json: bool) {
        if json {
            return;
        }
        for (p, u, why) in &self.dropped {
            let cents = Wallet::handoff_utxo(u).map(|u| u.value).unwrap_or(0);
            println!(
                "dropped the handoff of €{} to {p}: it can never be delivered ({why}); the \
                 payment is confirmed and the money stays with that key on the ledger",
                format_cents(cents)
            );
        }
    }
}

/// Finishes whatever a crash or a lost answer left in flight. Handoffs and withdrawals owed
/// from earlier are retried but never block: their failures are reported, not returned.
async fn finish_in_flight(
    w: &mut Wallet,
    store: &FileStore,
    client: &NodeClient,
) -> Result<Handoffs> {
    if let Some(p) = w.pending_tx() {
        let tx = p.tx.clone();
        let s = settle(w, store, client, tx).await?;
        if s.status == "pending" {
            bail!(
                "an earlier transaction is still pending on the ledger; `florin wallet sync` \
                 finishes it"
            );
        }
    }
    let h = deliver(w, store, client).await?;
    collect_withdrawals(w, store, client).await?;
    Ok(h)
}

/// Delivers confirmed handoffs: each payee's output preimage, sealed to the payee. A handoff
/// that cannot be delivered now stays queued (retried by later commands); one that can never
/// be delivered (the payee's key is unusable) is dropped. Only saving the wallet can fail.
async fn deliver(w: &mut Wallet, store: &FileStore, client: &NodeClient) -> Result<Handoffs> {
    let mut out = Handoffs::default();
    for (payee, utxo) in w.outbox().to_vec() {
        let sealed = match Wallet::seal_handoff(&payee, &utxo, &mut OsRng) {
            Ok(s) => s,
            Err(why) => {
                w.delivered(&payee, &utxo);
                store.save(w)?;
                out.dropped.push((payee, utxo, why));
                continue;
            }
        };
        match client.mailbox_put(&payee.to_address(), &sealed).await {
            Ok(_) => {
                w.delivered(&payee, &utxo);
                store.save(w)?;
                out.delivered.push(utxo);
            }
            Err(e) => {
                // Unreachable or refused for now: the rest would fare the same.
                out.pending = Some(format!("{e:#}"));
                break;
            }
        }
    }
    Ok(out)
}

/// Collects the tokens of withdrawals paid on the ledger, each request signed by the key of an
/// input of its payment. Returns the cents received and, per withdrawal still waiting, why.
async fn collect_withdrawals(
    w: &mut Wallet,
    store: &FileStore,
    client: &NodeClient,
) -> Result<(u64, Vec<String>)> {
    let mut got = 0;
    let mut errors = Vec::new();
    for a in w.awaiting_tokens().to_vec() {
        let Some(auth) = w.withdraw_authorization(&a) else {
            errors.push(format!(
                "€{}: no input of its payment is this wallet's, so it cannot sign for the tokens",
                format_cents(a.cents)
            ));
            continue;
        };
        let req = WithdrawRequest {
            tx: a.tx.clone(),
            output: 0,
            recipient: w.public_key().to_address(),
            handshake: a.handshake.clone(),
            key: Some(auth.key),
            signature: Some(auth.signature),
        };
        let tokens = match client.withdraw(&req).await {
            Ok(resp) => decode_tokens(&resp.tokens),
            Err(e) => Err(e),
        };
        match tokens.and_then(|t| Ok(w.receive_withdrawal(&a.tx, t, &mut OsRng)?)) {
            Ok(n) => {
                got += n;
                store.save(w)?;
            }
            Err(e) => errors.push(format!("€{}: {e:#}", format_cents(a.cents))),
        }
    }
    Ok((got, errors))
}

/// What `sync` did.
struct SyncReport {
    received: u64,
    withdrawn: u64,
    removed: (usize, u64),
    handoffs: Handoffs,
    withdraw_errors: Vec<String>,
}

/// Sync: finish what is in flight, collect handoffs from the mailbox (counting only outputs the
/// ledger confirms are unspent), then reconcile every held coin with the ledger: those it no
/// longer holds unspent are removed, so a copied or restored wallet converges to the truth.
async fn sync(w: &mut Wallet, store: &FileStore, client: &NodeClient) -> Result<SyncReport> {
    let mut removed = (0, 0);
    if let Some(p) = w.pending_tx() {
        let tx = p.tx.clone();
        let s = settle(w, store, client, tx).await?;
        removed = s.removed;
    }
    let handoffs = deliver(w, store, client).await?;
    let (withdrawn, withdraw_errors) = collect_withdrawals(w, store, client).await?;
    let mut received = 0;
    loop {
        let list = client
            .mailbox_get(&w.public_key().to_address(), w.mailbox_cursor())
            .await?;
        if list.messages.is_empty() {
            break;
        }
        for m in list.messages {
            // A message that does not open or parse is someone else's noise: skip it.
            let utxos = hex::decode(&m.message)
                .ok()
                .and_then(|b| w.open_sealed(&b))
                .and_then(|plain| decode_handoff(&plain))
                .unwrap_or_default();
            let mut live = Vec::new();
            for u in utxos {
                if client.unspent(&u.id()).await? {
                    live.push(u);
                }
            }
            received += w.receive_utxos(&live);
            w.set_mailbox_cursor(m.seq);
            store.save(w)?;
        }
    }
    let r = reconcile(w, client).await?;
    store.save(w)?;
    removed = (removed.0 + r.0, removed.1 + r.1);
    Ok(SyncReport {
        received,
        withdrawn,
        removed,
        handoffs,
        withdraw_errors,
    })
}
