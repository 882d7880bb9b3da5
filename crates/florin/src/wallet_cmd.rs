//! `florin wallet …`: a wallet file and the commands a user needs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use florin_crypto::PublicKey;
use florin_token::amount::{format_cents, parse_euros};
use florin_wallet::connector::error_chain;
use florin_wallet::flows::{Deposited, Handoffs};
use florin_wallet::online::HandoffFate;
use florin_wallet::{FileStore, FlowError, Flows, Notice, Wallet, WalletStore};
use rand::rngs::OsRng;
use serde_json::json;

use crate::util::print_json;
use crate::util::{runtime, Trust};
use florin_http::NodeClient;

/// Options of `florin wallet`.
#[derive(Args)]
pub struct WalletArgs {
    /// The wallet file.
    #[arg(long, env = "FLORIN_WALLET", default_value = "florin-wallet.json")]
    wallet: PathBuf,
    /// The node's API.
    #[arg(long, env = "FLORIN_NODE", default_value = "https://127.0.0.1:7400")]
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
pub fn run(args: WalletArgs, trust: &Trust) -> Result<ExitCode> {
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
                None => fetch_authority(&args.node, trust).ok(),
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
            ensure_authority(&mut w, &args.node, trust)?;
            // Signed by the operator key when one is given (a faucet outside the devnet).
            let client = crate::util::node_client(&args.node, trust)?;
            let flows = flows(&store, &client, json);
            let f = runtime()?.block_on(flows.faucet(&mut w, cents))?;
            // Handoffs owed to payees went out in the background; they never block this.
            tell(&f.handoffs, json);
            if json {
                print_json(
                    &json!({ "received_cents": f.received, "outputs": f.outputs, "online_cents": w.balance().online_cents, "total_cents": w.balance().total_cents }),
                );
            } else {
                println!(
                    "received €{} on the ledger ({} outputs)",
                    format_cents(f.received),
                    f.outputs
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
            let client = trust.node(&args.node)?;
            let flows = flows(&store, &client, json);
            let p = runtime()?.block_on(flows.pay(&mut w, payee, cents))?;
            if let Err(refusal) = p.settled.check("payment", &w) {
                tell(&p.handoffs, json);
                return Err(refusal.into());
            }
            let fate = match p.fate {
                HandoffFate::Delivered => "delivered",
                HandoffFate::Dropped(_) => "dropped",
                HandoffFate::Pending(_) => "pending",
            };
            if json {
                print_json(&json!({
                    "txid": hex::encode(p.tx.txid()),
                    "status": "confirmed",
                    "paid": true,
                    "amount_cents": cents,
                    "payee": payee.to_address(),
                    "handoff": fate,
                    "handoff_delivered": fate == "delivered",
                    "handoffs_pending": w.outbox().len(),
                    "handoffs_dropped": dropped_json(&p.handoffs),
                    "online_cents": w.balance().online_cents,
                }));
            } else {
                println!(
                    "paid €{} to {payee} (txid {})",
                    format_cents(cents),
                    hex::encode(p.tx.txid())
                );
                if fate == "pending" {
                    println!(
                        "handoff pending: the payment is confirmed on the ledger, but the payee's \
                         notice could not be delivered yet; later commands (sync, pay, withdraw) \
                         retry it. Do not pay again."
                    );
                }
                tell(&p.handoffs, false);
            }
        }
        WalletCommand::Sync => {
            let mut w = store.load()?;
            ensure_authority(&mut w, &args.node, trust)?;
            let client = trust.node(&args.node)?;
            let steps = crate::progress::steps();
            let flows = flows_with(&store, &client, json, steps.clone());
            let r = runtime()?.block_on(flows.sync(&mut w));
            steps.clear();
            let r = r?;
            if json {
                print_json(&json!({
                    "received_cents": r.received,
                    "withdrawn_cents": r.withdrawn,
                    "removed_coins": r.removed.0,
                    "removed_cents": r.removed.1,
                    "handoffs_delivered": r.handoffs.delivered.len(),
                    "handoffs_pending": w.outbox().len(),
                    "handoffs_dropped": dropped_json(&r.handoffs),
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
                tell(&r.handoffs, false);
                for e in &r.withdraw_errors {
                    println!("withdrawal still waiting for its tokens: {e}");
                }
            }
        }
        WalletCommand::Withdraw { amount } => {
            let cents = parse_euros(&amount)?;
            let mut w = store.load()?;
            ensure_authority(&mut w, &args.node, trust)?;
            let client = trust.node(&args.node)?;
            let steps = crate::progress::steps();
            let flows = flows_with(&store, &client, json, steps.clone());
            let r = runtime()?.block_on(flows.withdraw(&mut w, cents));
            steps.clear();
            let r = r?;
            if json {
                print_json(&json!({
                    "withdrawn_cents": r.received_cents,
                    "paid_to_reserve_cents": cents,
                    "tokens_pending": r.waiting,
                    "withdrawal_errors": r.errors,
                    "online_cents": w.balance().online_cents,
                    "verified_cents": w.balance().verified_cents,
                    "total_cents": w.balance().total_cents,
                }));
            } else {
                println!("withdrew €{} into tokens", format_cents(r.received_cents));
            }
            if r.waiting {
                bail!(
                    "paid €{} to the reserve (txid {}), but its tokens have not arrived: {}; \
                     `florin wallet sync` collects them",
                    format_cents(cents),
                    hex::encode(r.tx.txid()),
                    r.errors.last().cloned().unwrap_or_default()
                );
            }
        }
        WalletCommand::Offline { command } => {
            let node = args.node.clone();
            let trust = trust.clone();
            return crate::offline_cmd::run(command, &store, json, &move |w| {
                ensure_authority(w, &node, &trust)
            });
        }
        WalletCommand::Deposit { reanchor } => {
            return deposit(&store, &args.node, trust, json, !reanchor)
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The wallet's flows over the node at `client`; their notices printed as they happen
/// (dropped handoffs on stdout in text mode, like [`tell`]; the rest on stderr).
fn flows<'a>(store: &'a FileStore, client: &'a NodeClient, json: bool) -> Flows<'a, NodeClient> {
    flows_with(store, client, json, crate::progress::Steps::none())
}

/// [`flows`] whose steps and counts drive `steps`, a progress display on a terminal, never log
/// lines (a withdrawal, a sync: [`crate::progress::steps`]); the caller clears it before it
/// prints.
fn flows_with<'a>(
    store: &'a FileStore,
    client: &'a NodeClient,
    json: bool,
    steps: crate::progress::Steps,
) -> Flows<'a, NodeClient> {
    Flows::new(store, client).with_notices(move |n| match n {
        Notice::HandoffDropped(d) => {
            if !json {
                println!("{d}");
            }
        }
        Notice::Step(name) => steps.step(name),
        Notice::Progress { done, total } => steps.progress(*done, *total),
        other => tracing::info!("{other}"),
    })
}

/// Tells the user about dropped handoffs (text mode; JSON carries them in fields).
fn tell(h: &Handoffs, json: bool) {
    if json {
        return;
    }
    for d in &h.dropped {
        println!("{d}");
    }
}

fn dropped_json(h: &Handoffs) -> Vec<serde_json::Value> {
    h.dropped
        .iter()
        .map(|d| json!({ "payee": d.payee.to_address(), "cents": d.cents(), "reason": d.reason }))
        .collect()
}

fn deposit(
    store: &FileStore,
    node: &str,
    trust: &Trust,
    json: bool,
    credit: bool,
) -> Result<ExitCode> {
    let mut w = store.load()?;
    ensure_authority(&mut w, node, trust)?;
    let client = trust.node(node)?;
    let flows = flows(store, &client, json);
    let Deposited::Done {
        result: res,
        sync_error,
    } = runtime()?.block_on(flows.deposit(&mut w, credit))?
    else {
        if json {
            print_json(
                &json!({ "credited_cents": 0, "reanchored": 0, "fraud": [], "refused": [], "lost_cents": 0, "still_pending": 0 }),
            );
        } else {
            println!("nothing to deposit: no tokens received offline");
        }
        return Ok(ExitCode::SUCCESS);
    };
    let sync_note = sync_error.map(|e| {
        format!(
            "the credit waits in this wallet's mailbox ({}); `florin wallet sync` collects it",
            error_chain(&e)
        )
    });
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

fn fetch_authority(node: &str, trust: &Trust) -> Result<PublicKey> {
    let client = trust.node(node)?;
    Ok(runtime()?.block_on(florin_wallet::Connector::authority(&client))?)
}

/// Learns the authority from the node on first use; afterwards insists it stays the same.
fn ensure_authority(w: &mut Wallet, node: &str, trust: &Trust) -> Result<()> {
    let client = trust.node(node)?;
    match runtime()?.block_on(florin_wallet::flows::ensure_authority(w, &client)) {
        Err(FlowError::AuthorityMismatch {
            node: k,
            trusted: a,
        }) => {
            bail!("the node at {node} is authority {k}, but this wallet trusts {a}")
        }
        r => Ok(r?),
    }
}
