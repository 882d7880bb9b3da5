//! `florin admin`: operator actions on a node, each request signed with the operator's key
//! (`--operator-key FILE` or `FLORIN_OPERATOR_KEY`; see docs/api.md, "Operator credential").

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use florin_node::api::AdminEntry;
use serde_json::json;

use crate::util::{operator_client, print_json, runtime, Trust};

/// Options of `florin admin`.
#[derive(Args)]
pub struct AdminArgs {
    /// The node's API.
    #[arg(
        long,
        env = "FLORIN_NODE",
        default_value = "http://127.0.0.1:7400",
        global = true
    )]
    node: String,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: AdminCommand,
}

/// `florin admin …`.
#[derive(Subcommand)]
pub enum AdminCommand {
    /// Take a token out of circulation: its deposits are refused (`blacklisted`).
    Blacklist {
        /// The token's serial (16 hex digits).
        serial: String,
        /// Why (kept in the audit trail).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Revoke a wallet key: it may no longer deposit or withdraw (`revoked`).
    Revoke {
        /// The key (an `eur1…` address).
        key: String,
        /// Why (kept in the audit trail).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lift a key's revocation.
    Unrevoke {
        /// The key (an `eur1…` address).
        key: String,
        /// Why (kept in the audit trail).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// The blacklisted tokens and the revoked keys, with who, when and why.
    List,
    /// The operators' audit trail, oldest first.
    Log,
}

fn print_entry(what: &str, e: &AdminEntry, json_out: bool) {
    if json_out {
        print_json(&json!(e));
    } else {
        println!(
            "{what} {} (by {} at {}{})",
            e.subject,
            if e.operator.is_empty() {
                "the node"
            } else {
                &e.operator
            },
            e.at,
            if e.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", e.reason)
            }
        );
    }
}

/// Runs `florin admin …`.
pub fn run(args: AdminArgs, trust: &Trust) -> Result<ExitCode> {
    let client = operator_client(&args.node, trust)?;
    let rt = runtime()?;
    match args.command {
        AdminCommand::Blacklist { serial, reason } => {
            let e = rt.block_on(client.admin_blacklist(&serial, &reason))?;
            print_entry("blacklisted", &e, args.json);
        }
        AdminCommand::Revoke { key, reason } => {
            let e = rt.block_on(client.admin_revoke(&key, &reason))?;
            print_entry("revoked", &e, args.json);
        }
        AdminCommand::Unrevoke { key, reason } => {
            let e = rt.block_on(client.admin_unrevoke(&key, &reason))?;
            print_entry("unrevoked", &e, args.json);
        }
        AdminCommand::List => {
            let blacklist = rt.block_on(client.admin_blacklisted())?;
            let revoked = rt.block_on(client.admin_revoked())?;
            if args.json {
                print_json(&json!({ "blacklist": blacklist, "revoked": revoked }));
            } else {
                println!("blacklisted tokens: {}", blacklist.len());
                for e in &blacklist {
                    print_entry("  token", e, false);
                }
                println!("revoked keys: {}", revoked.len());
                for e in &revoked {
                    print_entry("  key", e, false);
                }
            }
        }
        AdminCommand::Log => {
            let log = rt.block_on(client.admin_log())?;
            if args.json {
                print_json(&json!(log));
            } else {
                for l in &log {
                    print_entry(&format!("{:>4} {}", l.seq, l.action), &l.entry, false);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
