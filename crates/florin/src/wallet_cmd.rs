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
use florin_wallet::online::{decode_handoff, encode_handoff};
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
            let payee = PublicKey::parse(&address).context("payee address")?;
            let mut w = store.load()?;
            let client = NodeClient::new(&args.node)?;
            let rt = runtime()?;
            rt.block_on(finish_in_flight(&mut w, &store, &client))?;
            let tx = w.build_payment(payee, cents, "pay")?;
            // Saved before it leaves: a crash resumes it (submission is idempotent).
            store.save(&w)?;
            let status = rt.block_on(settle(&mut w, &store, &client, hex::encode(tx.encode())))?;
            let delivered = rt.block_on(deliver(&mut w, &store, &client))?;
            if json {
                print_json(
                    &json!({ "txid": hex::encode(tx.txid()), "status": status, "amount_cents": cents, "payee": payee.to_address(), "handoff_delivered": delivered > 0, "online_cents": w.balance().online_cents }),
                );
            } else if status == "confirmed" {
                println!(
                    "paid €{} to {payee} (txid {})",
                    format_cents(cents),
                    hex::encode(tx.txid())
                );
            }
            if status != "confirmed" {
                bail!("the ledger did not confirm the payment ({status}); your inputs are back in the wallet");
            }
        }
        WalletCommand::Sync => {
            let mut w = store.load()?;
            ensure_authority(&mut w, &args.node)?;
            let client = NodeClient::new(&args.node)?;
            let rt = runtime()?;
            let r = rt.block_on(sync(&mut w, &store, &client))?;
            if json {
                print_json(
                    &json!({ "received_cents": r.0, "withdrawn_cents": r.1, "online_cents": w.balance().online_cents, "total_cents": w.balance().total_cents }),
                );
            } else {
                println!(
                    "received €{} on the ledger; €{} of withdrawals arrived as tokens",
                    format_cents(r.0),
                    format_cents(r.1)
                );
            }
        }
        WalletCommand::Withdraw { amount } => {
            let cents = parse_euros(&amount)?;
            let mut w = store.load()?;
            ensure_authority(&mut w, &args.node)?;
            let reserve = w.authority().ok_or_else(|| anyhow!("no authority"))?;
            let client = NodeClient::new(&args.node)?;
            let rt = runtime()?;
            rt.block_on(finish_in_flight(&mut w, &store, &client))?;
            let tx = w.build_payment(reserve, cents, "withdraw")?;
            store.save(&w)?;
            let status = rt.block_on(settle(&mut w, &store, &client, hex::encode(tx.encode())))?;
            if status != "confirmed" {
                bail!("the ledger did not confirm the payment to the reserve ({status}); your funds are back in the wallet");
            }
            let got = rt.block_on(collect_withdrawals(&mut w, &store, &client))?;
            if json {
                print_json(
                    &json!({ "withdrawn_cents": got, "online_cents": w.balance().online_cents, "verified_cents": w.balance().verified_cents, "total_cents": w.balance().total_cents }),
                );
            } else {
                println!("withdrew €{} into tokens", format_cents(got));
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
    if credit {
        // The credit arrives as a ledger output handed off to this wallet's mailbox.
        runtime()?.block_on(sync(&mut w, store, &client))?;
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

/// Submits `tx_hex` (idempotent) and settles the wallet's transaction in flight by the answer.
async fn settle(
    w: &mut Wallet,
    store: &FileStore,
    client: &NodeClient,
    tx_hex: String,
) -> Result<String> {
    let answer = client
        .submit(tx_hex)
        .await
        .context("the payment is saved and will be retried by `florin wallet sync`")?;
    match answer.status.as_str() {
        "confirmed" => {
            w.settle_pending(true);
        }
        "static_invalid" | "state_invalid" => {
            w.settle_pending(false);
        }
        _ => {}
    }
    store.save(w)?;
    Ok(answer.status)
}

/// Finishes whatever a crash or a lost answer left in flight.
async fn finish_in_flight(w: &mut Wallet, store: &FileStore, client: &NodeClient) -> Result<()> {
    if let Some(p) = w.pending_tx() {
        let tx = p.tx.clone();
        settle(w, store, client, tx).await?;
    }
    deliver(w, store, client).await?;
    collect_withdrawals(w, store, client).await?;
    Ok(())
}

/// Delivers confirmed handoffs: each payee's output preimage, sealed to the payee.
async fn deliver(w: &mut Wallet, store: &FileStore, client: &NodeClient) -> Result<usize> {
    let mut n = 0;
    for (payee, utxo) in w.outbox().to_vec() {
        let Some(u) = Wallet::handoff_utxo(&utxo) else {
            continue;
        };
        let sealed = florin_crypto::sealed::seal(&payee, &encode_handoff(&[u]), &mut OsRng)?;
        client.mailbox_put(&payee.to_address(), &sealed).await?;
        w.delivered(&payee, &utxo);
        store.save(w)?;
        n += 1;
    }
    Ok(n)
}

/// Collects the tokens of withdrawals paid on the ledger.
async fn collect_withdrawals(
    w: &mut Wallet,
    store: &FileStore,
    client: &NodeClient,
) -> Result<u64> {
    let mut got = 0;
    for a in w.awaiting_tokens().to_vec() {
        let req = WithdrawRequest {
            tx: a.tx.clone(),
            output: 0,
            recipient: w.public_key().to_address(),
            handshake: a.handshake.clone(),
        };
        let resp = client.withdraw(&req).await?;
        let tokens = decode_tokens(&resp.tokens)?;
        got += w.receive_withdrawal(&a.tx, tokens, &mut OsRng)?;
        store.save(w)?;
    }
    Ok(got)
}

/// Sync: finish what is in flight, then collect handoffs from the mailbox, counting only
/// outputs the ledger confirms are unspent. Returns (received, withdrawn) cents.
async fn sync(w: &mut Wallet, store: &FileStore, client: &NodeClient) -> Result<(u64, u64)> {
    if let Some(p) = w.pending_tx() {
        let tx = p.tx.clone();
        settle(w, store, client, tx).await?;
    }
    deliver(w, store, client).await?;
    let withdrawn = collect_withdrawals(w, store, client).await?;
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
    Ok((received, withdrawn))
}
