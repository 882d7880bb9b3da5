//! `florin fraud …`: list the authority's fraud registry, verify a proof offline.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use florin_crypto::PublicKey;
use florin_token::amount::format_cents;
use florin_token::FraudProof;
use serde_json::json;

use crate::util::runtime;
use crate::util::{print_json, read, write_atomic};

/// `florin fraud` subcommands.
#[derive(Subcommand)]
pub enum FraudCommand {
    /// List every double spend the authority detected.
    List {
        /// The node's API.
        #[arg(long, env = "FLORIN_NODE", default_value = "https://127.0.0.1:7400")]
        node: String,
        /// Also write each proof to DIR/<id>.proof.
        #[arg(long)]
        save: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify a fraud proof offline; exit 0 only if it is valid.
    Verify {
        /// The proof file (binary, or hex as `fraud list` prints it).
        proof: PathBuf,
        /// The authority's address to pin; without it the key named in the proof is used.
        #[arg(long)]
        authority: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a fraud command.
pub fn run(cmd: FraudCommand, trust: &crate::util::Trust) -> Result<ExitCode> {
    match cmd {
        FraudCommand::List { node, save, json } => {
            let client = trust.node(&node)?;
            let list = runtime()?.block_on(client.fraud())?;
            if let Some(dir) = &save {
                std::fs::create_dir_all(dir)?;
                for f in &list {
                    write_atomic(
                        &dir.join(format!("{}.proof", f.id)),
                        &hex::decode(&f.proof)?,
                    )?;
                }
            }
            if json {
                print_json(&serde_json::to_value(&list)?);
            } else if list.is_empty() {
                println!("no fraud detected");
            } else {
                for f in &list {
                    println!(
                        "token {} (€{}) double spent by {}  [proof {}]",
                        f.serial,
                        format_cents(f.value_cents),
                        f.culprit,
                        f.id.get(..16).unwrap_or(&f.id)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        FraudCommand::Verify {
            proof,
            authority,
            json,
        } => {
            let bytes = read(&proof)?;
            // Accept hex as printed by `fraud list --json`, or raw bytes.
            let text = std::str::from_utf8(&bytes).ok().map(str::trim);
            let raw = match text.and_then(|t| hex::decode(t).ok()) {
                Some(b) => b,
                None => bytes,
            };
            let pinned = authority
                .as_deref()
                .map(PublicKey::parse)
                .transpose()
                .context("--authority")?;
            let p = FraudProof::decode(&raw)
                .with_context(|| format!("{} is not a fraud proof", proof.display()))?;
            let culprit = p.verify(pinned.as_ref()).context("invalid fraud proof")?;
            if json {
                print_json(&json!({
                    "valid": true,
                    "culprit": culprit.to_address(),
                    "serial": hex::encode(p.serial),
                    "value_cents": p.value.cents(),
                    "authority": p.authority.to_address(),
                    "authority_pinned": pinned.is_some(),
                }));
            } else {
                println!(
                    "valid: {} signed token {} twice",
                    culprit,
                    hex::encode(p.serial)
                );
                if pinned.is_none() {
                    println!("note: checked against the authority named in the proof ({}); pin it with --authority", p.authority);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
