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
    /// Create a wallet: fresh backup words (printed once), every key derived from them, the
    /// file encrypted under a passphrase (FLORIN_WALLET_PASSPHRASE, or asked on a terminal).
    New {
        /// Write the file unencrypted (tests and demos only: anyone who can read the file can
        /// spend the money).
        #[arg(long)]
        no_passphrase: bool,
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
    /// Rebuild a lost wallet from its backup words: its keys, then its ledger funds (the
    /// payments and restore notes in its mailbox, each checked unspent on the ledger). Offline
    /// tokens cannot be restored: they were bearer data in the lost file.
    Restore {
        /// Read the words from this file (scripts); without it they are asked on the terminal.
        /// Never on the command line.
        #[arg(long)]
        mnemonic_file: Option<PathBuf>,
        /// Write the file unencrypted (tests and demos only).
        #[arg(long)]
        no_passphrase: bool,
        /// The authority to trust (address); fetched from the node when omitted.
        #[arg(long)]
        authority: Option<String>,
    },
    /// Print the wallet's backup words (handle with care: they are the wallet).
    Backup,
    /// Move the wallet to another file (another machine): the copy keeps the passphrase, and
    /// this file then refuses to spend, so the two never spend the same money.
    Export {
        /// The file to write (refused if it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// Take in a wallet moved by `export` (into `--wallet`); the exported file then refuses
    /// to spend. Also takes back a wallet this file had moved away.
    Import {
        /// The exported file.
        file: PathBuf,
    },
    /// Change the file's passphrase (the new one from FLORIN_WALLET_NEW_PASSPHRASE or the
    /// terminal), or remove it with --no-passphrase.
    Passphrase {
        /// Store the file unencrypted from now on.
        #[arg(long)]
        no_passphrase: bool,
    },
    /// Serve the wallet as a page on loopback (keys stay in this process): balances, pay,
    /// request and pay by QR code (upload or camera), withdraw, deposit, history, backup words.
    Serve {
        /// Where to listen (loopback only; port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:7480")]
        listen: std::net::SocketAddr,
    },
    /// Print the wallet's history: what moved, when, with whom, and how it ended.
    History,
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
    let store =
        FileStore::new(&args.wallet).with_passphrase(crate::passphrase::source(&args.wallet));
    let json = args.json;
    // One command at a time per wallet: two concurrent payments must never spend the same
    // tokens. Held until the command ends.
    let _lock = match &args.command {
        WalletCommand::Offline { command } if crate::offline_cmd::locks_itself(command) => None,
        // Takes the lock per request, so commands can run beside the page.
        WalletCommand::Serve { .. } => None,
        // Takes its two files' locks in a fixed order.
        WalletCommand::Import { .. } => None,
        _ => Some(store.lock()?),
    };
    match args.command {
        WalletCommand::New {
            no_passphrase,
            authority,
            max_hops,
            max_offline,
        } => {
            if args.wallet.exists() {
                return Err(florin_wallet::StoreError::Exists(args.wallet.clone()).into());
            }
            let authority = match authority {
                Some(a) => Some(PublicKey::parse(&a).context("--authority")?),
                None => fetch_authority(&args.node, trust).ok(),
            };
            let encrypted = choose_sealing(&store, &args.wallet, no_passphrase)?;
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
            let words = w
                .backup_words()
                .map(|b| b.phrase().to_string())
                .unwrap_or_default();
            let out = json!({
                "wallet": args.wallet.display().to_string(),
                "address": w.public_key().to_address(),
                "authority": w.authority().map(|a| a.to_address()),
                "encrypted": encrypted,
                "backup_words": words,
                "warning": BACKUP_WARNING,
            });
            if json {
                print_json(&out);
            } else {
                println!("created {} for {}", args.wallet.display(), w.public_key());
                if !encrypted {
                    println!("the file is NOT encrypted (--no-passphrase): anyone who can read it can spend");
                }
                if w.authority().is_none() {
                    println!("no node reachable: the authority will be fetched on first use");
                }
                crate::util::warn_user(BACKUP_WARNING);
                println!("backup words: {words}");
            }
        }
        WalletCommand::Restore {
            mnemonic_file,
            no_passphrase,
            authority,
        } => {
            if args.wallet.exists() {
                return Err(florin_wallet::StoreError::Exists(args.wallet.clone()).into());
            }
            let words = crate::passphrase::read_words(mnemonic_file.as_deref())?;
            let authority = match authority {
                Some(a) => Some(PublicKey::parse(&a).context("--authority")?),
                None => fetch_authority(&args.node, trust).ok(),
            };
            let encrypted = choose_sealing(&store, &args.wallet, no_passphrase)?;
            let mut w = Wallet::from_words(words, authority);
            store.create(&w)?;
            let found = restore_funds(&store, &mut w, &args.node, trust, json);
            let (found, reason) = match found {
                Ok(r) => (Some(r), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            };
            let b = w.balance();
            if json {
                print_json(&json!({
                    "wallet": args.wallet.display().to_string(),
                    "address": w.public_key().to_address(),
                    "encrypted": encrypted,
                    "found_cents": found.as_ref().map(|r| r.received),
                    "online_cents": b.online_cents,
                    "ledger_searched": found.is_some(),
                    "not_restorable": NOT_RESTORABLE,
                }));
            } else {
                println!(
                    "restored the keys of {} into {}",
                    w.public_key(),
                    args.wallet.display()
                );
                if let Some(r) = &found {
                    println!(
                        "found €{} on the ledger (€{} online in all)",
                        format_cents(r.received),
                        format_cents(b.online_cents)
                    );
                }
                crate::util::warn_user(&format!("not restorable from words: {NOT_RESTORABLE}"));
            }
            if let Some(reason) = reason {
                bail!(
                    "the keys are restored in {}, but the ledger funds could not be searched: \
                     {reason}; `florin wallet sync` searches again",
                    args.wallet.display()
                );
            }
        }
        WalletCommand::Backup => {
            let w = store.load()?;
            let Some(words) = w.backup_words() else {
                bail!(
                    "this wallet was created before backup words existed: its key is random. \
                     Keep a copy of the file (`florin wallet export`), or create a new wallet \
                     and pay its funds there"
                );
            };
            if json {
                print_json(&json!({ "backup_words": words.phrase(), "warning": BACKUP_WARNING }));
            } else {
                crate::util::warn_user(BACKUP_WARNING);
                println!("{}", words.phrase());
            }
        }
        WalletCommand::Export { out } => {
            let dest_path = canonical(&out);
            let mut w = store.clone().reading_moved().load()?;
            match w.moved_to() {
                None => {}
                // An export that marked this file but could not write the copy: again.
                Some(m) if m == dest_path.display().to_string() && !out.exists() => {}
                Some(m) => {
                    return Err(florin_wallet::StoreError::Moved {
                        path: args.wallet.clone(),
                        to: m.to_string(),
                    }
                    .into())
                }
            }
            if out.exists() || canonical(&args.wallet) == dest_path {
                return Err(florin_wallet::StoreError::Exists(out.clone()).into());
            }
            // This file stops spending first, then the copy is written: at no moment are two
            // files live (a failure in between leaves one to finish with the same command).
            w.set_moved_to(Some(dest_path.display().to_string()));
            store.save(&w)?;
            w.set_moved_to(None);
            let dest = FileStore::new(&out);
            if store.is_encrypted() {
                dest.seal_like(&store);
            } else {
                dest.write_plain();
            }
            dest.create(&w).with_context(|| {
                format!(
                    "{} is marked moved to {}, which could not be written: run the same export \
                     again",
                    args.wallet.display(),
                    dest_path.display()
                )
            })?;
            if json {
                print_json(&json!({
                    "exported": dest_path.display().to_string(),
                    "address": w.public_key().to_address(),
                    "encrypted": store.is_encrypted(),
                }));
            } else {
                println!(
                    "moved the wallet {} to {}; {} now refuses to spend (take it back with \
                     `florin wallet import`)",
                    w.public_key(),
                    dest_path.display(),
                    args.wallet.display()
                );
            }
        }
        WalletCommand::Import { file } => {
            let src_path = canonical(&file);
            let dest_path = canonical(&args.wallet);
            if src_path == dest_path {
                bail!(
                    "{} is the wallet itself: import another file",
                    file.display()
                );
            }
            let src = FileStore::new(&file)
                .with_passphrase(crate::passphrase::source(&file))
                .reading_moved();
            // Both locks, always in the same order (two imports in opposite directions never
            // wait on each other).
            let (_first, _second) = if src_path < dest_path {
                let a = src.lock()?;
                (a, store.lock()?)
            } else {
                let a = store.lock()?;
                (a, src.lock()?)
            };
            let mut w = src.load()?;
            match w.moved_to() {
                None => {}
                // An import that marked the file but did not write here: again.
                Some(m) if m == dest_path.display().to_string() => {}
                Some(m) => {
                    return Err(florin_wallet::StoreError::Moved {
                        path: file.clone(),
                        to: m.to_string(),
                    }
                    .into())
                }
            }
            if args.wallet.exists() {
                let here = store.clone().reading_moved().load()?;
                let back_here = here.moved_to() == Some(src_path.display().to_string().as_str());
                if here.public_key() != w.public_key() || !back_here {
                    bail!(
                        "{} holds another wallet, or one that was not moved to {}; import into \
                         a new file (--wallet)",
                        args.wallet.display(),
                        src_path.display()
                    );
                }
            }
            // The file imported stops spending first, then this one is written.
            w.set_moved_to(Some(dest_path.display().to_string()));
            src.save(&w)?;
            w.set_moved_to(None);
            if src.is_encrypted() || !args.wallet.exists() {
                store.seal_like(&src);
            }
            store.save(&w)?;
            if json {
                print_json(&json!({
                    "imported": file.display().to_string(),
                    "wallet": args.wallet.display().to_string(),
                    "address": w.public_key().to_address(),
                    "total_cents": w.balance().total_cents,
                }));
            } else {
                println!(
                    "imported {} into {} (€{}); {} now refuses to spend",
                    w.public_key(),
                    args.wallet.display(),
                    format_cents(w.balance().total_cents),
                    file.display()
                );
            }
        }
        WalletCommand::Passphrase { no_passphrase } => {
            let w = store.load()?;
            if no_passphrase {
                store.write_plain();
            } else {
                let new = new_passphrase_for_change(&args.wallet)?;
                store.encrypt_with(&new)?;
            }
            store.save(&w)?;
            if json {
                print_json(&json!({ "encrypted": store.is_encrypted() }));
            } else if store.is_encrypted() {
                println!(
                    "{} is encrypted under the new passphrase",
                    args.wallet.display()
                );
            } else {
                println!("{} is now stored unencrypted", args.wallet.display());
            }
        }
        WalletCommand::Serve { listen } => {
            return crate::wallet_serve::run(
                store,
                args.wallet.clone(),
                args.node.clone(),
                trust.clone(),
                listen,
                json,
            );
        }
        WalletCommand::History => {
            let w = store.load()?;
            if json {
                print_json(&json!({ "history": w.history().collect::<Vec<_>>() }));
            } else {
                for h in w.history() {
                    println!(
                        "{}  {:<15} €{:>10}  {:<10} {}",
                        h.at,
                        h.kind,
                        format_cents(h.cents),
                        h.status,
                        h.counterparty.map(|c| c.to_address()).unwrap_or_default()
                    );
                }
            }
        }
        WalletCommand::Address => {
            // An encrypted file declares its (public) address; opening it verifies that. Without
            // the passphrase the declared address is printed, marked unverified.
            let (mut address, mut verified) = store.declared_address()?;
            if !verified {
                match store.load() {
                    Ok(w) => (address, verified) = (w.public_key(), true),
                    Err(florin_wallet::StoreError::Locked { .. }) => crate::util::warn_user(
                        "the address is the one the encrypted file declares, unverified: give \
                         the passphrase to check it before you ask for money",
                    ),
                    Err(e) => return Err(e.into()),
                }
            }
            if json {
                print_json(&json!({ "address": address.to_address(), "verified": verified }));
            } else {
                println!("{address}");
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

/// `path` made absolute, with its directory resolved (the file itself may not exist yet): two
/// spellings of one file compare equal.
fn canonical(path: &std::path::Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if let Ok(c) = abs.canonicalize() {
        return c;
    }
    match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => dir
            .canonicalize()
            .map(|d| d.join(name))
            .unwrap_or(abs.clone()),
        _ => abs,
    }
}

/// Said when backup words are shown.
const BACKUP_WARNING: &str = "Write these 12 backup words down and keep them offline: anyone \
     who has them can spend this wallet's ledger funds, and with them alone you can restore \
     those funds (`florin wallet restore`). They are not shown again unless you ask \
     (`florin wallet backup`).";

/// What a restore from words cannot bring back.
const NOT_RESTORABLE: &str = "tokens held offline (bearer data: only the lost file had them), \
     withdrawals whose tokens had not arrived, a payment in flight, and outputs whose last \
     restore note outlived the mailbox's retention";

/// Encrypts new files under a passphrase from the environment or the terminal; plain only
/// when asked (`--no-passphrase`). Returns whether the file will be encrypted.
fn choose_sealing(store: &FileStore, path: &std::path::Path, no_passphrase: bool) -> Result<bool> {
    if no_passphrase {
        store.write_plain();
        return Ok(false);
    }
    match crate::passphrase::new_passphrase(path)? {
        Some(p) => {
            store.encrypt_with(&p)?;
            Ok(true)
        }
        None => bail!(
            "refusing to write an unencrypted wallet: set {}, run on a terminal to be asked \
             for a passphrase, or pass --no-passphrase (tests and demos)",
            crate::passphrase::ENV
        ),
    }
}

/// The new passphrase of `wallet passphrase`: `FLORIN_WALLET_NEW_PASSPHRASE`, else asked.
fn new_passphrase_for_change(path: &std::path::Path) -> Result<zeroize::Zeroizing<String>> {
    if let Some(p) = std::env::var("FLORIN_WALLET_NEW_PASSPHRASE")
        .ok()
        .filter(|p| !p.is_empty())
    {
        return Ok(zeroize::Zeroizing::new(p));
    }
    // Not from FLORIN_WALLET_PASSPHRASE: that one opened the file (the old passphrase).
    crate::passphrase::ask_new(path)?.ok_or_else(|| {
        anyhow::anyhow!("no new passphrase: set FLORIN_WALLET_NEW_PASSPHRASE or run on a terminal")
    })
}

/// Searches the ledger for a restored wallet's funds.
fn restore_funds(
    store: &FileStore,
    w: &mut Wallet,
    node: &str,
    trust: &Trust,
    json: bool,
) -> Result<florin_wallet::flows::SyncReport> {
    ensure_authority(w, node, trust)?;
    let client = trust.node(node)?;
    let steps = crate::progress::steps();
    let flows = flows_with(store, &client, json, steps.clone());
    let r = runtime()?.block_on(flows.restore(w));
    steps.clear();
    Ok(r?)
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
        Notice::NotesPending(_) => crate::util::warn_user(&n.to_string()),
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

pub(crate) fn fetch_authority(node: &str, trust: &Trust) -> Result<PublicKey> {
    let client = trust.node(node)?;
    Ok(runtime()?.block_on(florin_wallet::Connector::authority(&client))?)
}

/// Learns the authority from the node on first use; afterwards insists it stays the same.
pub(crate) fn ensure_authority(w: &mut Wallet, node: &str, trust: &Trust) -> Result<()> {
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
