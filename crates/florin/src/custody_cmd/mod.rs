//! `florin custody`: a local key-management network as separate processes on 127.0.0.1.
//!
//! `up` creates the network on first use (identities, configs, the coordinator's key; see
//! `florin_node::custody::Layout`), starts every node that is not answering, and makes the
//! named keys by distributed key generation. The other commands inspect and drill it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use florin_crypto::p256::P256Signer;
use florin_crypto::{verify, Signer};
use florin_custody::PartyId;
use florin_node::custody::{free_loopback_addrs, CustodyNodeConfig, EcdsaLevel, Kmn, Layout};
use serde_json::json;
use zeroize::Zeroizing;

use crate::util::print_json;

mod keys;
mod processes;

pub use keys::read_seed;
use keys::*;
use processes::*;
pub use processes::{ensure_up, layout_at};

/// What `export` prints before the hex scalar, so it is never mistaken for a key file's seed.
const SCALAR_PREFIX: &str = "ed25519-scalar:";
/// What `export` prints before an ECDSA key's secret (which `import --scheme p256` takes).
const P256_PREFIX: &str = "p256-secret:";

/// `florin custody` subcommands.
#[derive(Subcommand)]
pub enum CustodyCommand {
    /// Create (first time) and start a t-of-n key-management network, one process per node,
    /// and make the named keys by distributed key generation.
    Up {
        /// Nodes.
        #[arg(long, default_value_t = 3)]
        n: u16,
        /// Nodes needed to sign.
        #[arg(long, default_value_t = 2)]
        t: u16,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
        /// First node's port (the others follow); 0 picks free ports.
        #[arg(long, default_value_t = 0)]
        base_port: u16,
        /// Keys to make if missing, comma-separated.
        #[arg(long, default_value = "issuer,authority", value_delimiter = ',')]
        keys: Vec<String>,
        /// Run threshold ECDSA P-256 too: `dkls23` (DKLs23 keys only: no set-up, keys in
        /// seconds, signatures in milliseconds, no identifiable abort), or CGGMP24 (and DKLs23)
        /// at a security level: `production` (each node first spends minutes generating its
        /// Paillier primes in the background; then run `florin custody ecdsa-setup`) or
        /// `insecure-test` (768-bit primes, seconds; for tests and demos only, never for keys
        /// that hold value).
        #[arg(long)]
        ecdsa: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make the network's ECDSA auxiliary information (once per network, every node), waiting
    /// for nodes still generating their primes.
    EcdsaSetup {
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
        /// Longest to wait for primes, seconds.
        #[arg(long, default_value_t = 1800)]
        wait: u64,
    },
    /// Run one key-management node in the foreground (what `up` starts).
    Node {
        /// The node's `node.json`.
        #[arg(long)]
        config: PathBuf,
        /// Exit when the process that started this one exits.
        #[arg(long, hide = true)]
        exit_with_parent: bool,
    },
    /// Every node: up or down, keys held, nonces ready.
    Status {
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop every node.
    Down {
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// `kill -9` one node (a fault drill).
    Kill {
        /// The node's party number.
        party: PartyId,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Make a new key by distributed key generation.
    Keygen {
        /// The key's name.
        key: String,
        /// `ed25519` (FROST; issuer and authority keys) or `p256` (threshold ECDSA; custodial
        /// wallets, ledger scheme 2).
        #[arg(long, default_value = "ed25519")]
        scheme: String,
        /// P-256 keys: `cggmp24` (identifiable abort, presignatures; needs `ecdsa-setup`) or
        /// `dkls23` (OT-based, fast). Default: `dkls23` on a network run with `--ecdsa
        /// dkls23`, `cggmp24` otherwise.
        #[arg(long)]
        engine: Option<String>,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sign a message (hex) with a threshold key and check the signature.
    Sign {
        /// The key's name.
        key: String,
        /// The message, hex.
        message: String,
        /// ECDSA keys: make a presignature first, then sign from it (both timed), instead of
        /// signing interactively.
        #[arg(long)]
        presigned: bool,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import an existing key as shares: an Ed25519 key file (e.g. a devnet's `issuer.key`),
    /// or with `--scheme p256` a P-256 secret key (32 bytes, hex).
    Import {
        /// The key's name in the network.
        key: String,
        /// The key file (hex seed, or hex P-256 secret).
        #[arg(long)]
        from: PathBuf,
        /// `ed25519` or `p256`.
        #[arg(long, default_value = "ed25519")]
        scheme: String,
        /// P-256 keys: `cggmp24` or `dkls23` (as for `keygen`). After a DKLs23 import, run
        /// `refresh` (new shares; the dealer also made every pair's OT set-up, which only a
        /// complete refresh, not built yet, would replace).
        #[arg(long)]
        engine: Option<String>,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Key addition (R5): make KEY the sum of the P-256 key FROM held in the network (r1) and a
    /// whole P-256 secret key handed over by someone else (r2, `--addend`, hex as `export`
    /// prints it). Every node adds r2 to its share; whoever knew r2 alone cannot sign for KEY.
    AddKey {
        /// The new key's name.
        key: String,
        /// The P-256 key the network holds already.
        #[arg(long)]
        from: String,
        /// The file with the key handed over (hex P-256 secret).
        #[arg(long)]
        addend: PathBuf,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Finish a key whose creation stopped during its commit round: if every node holds the
    /// key (committed or pending), commit it everywhere. Keys are stored as pending and
    /// sign nothing until every node has reported the same key; `keygen`, `import` and
    /// `add-key` commit by themselves, so this is only needed after one of them failed with
    /// a message that says so.
    Commit {
        /// The key's name.
        key: String,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Rebuild node P's lost share of a FROST or DKLs23 key (its disk was lost; its identity
    /// key and config are back) from t other nodes, without rebuilding the key anywhere. A
    /// DKLs23 repair ends with a complete refresh by all n nodes (every share changes; the
    /// rebuilt one gets its OT set-up), so it needs every node up.
    Repair {
        /// The key's name.
        key: String,
        /// The node whose share is lost.
        #[arg(long)]
        party: u16,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Give node P a new identity key, after its machine or disk was lost together with its
    /// old one (or the key leaked): every node's config and network.json name the new key,
    /// and P's config is recreated if it was lost. Then restart the network (`down`, `up`):
    /// `up` rebuilds P's share of every FROST key from the others.
    ReplaceNode {
        /// The node to give a new identity.
        #[arg(long)]
        party: u16,
        /// Replace it even though the node answers with its current identity.
        #[arg(long)]
        force: bool,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Proactively refresh the shares of FROST keys: every node deals a random sharing of
    /// zero to the others and adds what it gets, so the public keys stay and every share
    /// changes; shares stolen before do not combine with shares stolen after. Needs every
    /// node. Running signers (devnet, payment providers) take up the new shares by
    /// themselves. Schedule it (e.g. daily) to bound how long an attacker has to collect t
    /// shares.
    Refresh {
        /// The keys' names (FROST keys, and DKLs23 ECDSA keys).
        keys: Vec<String>,
        /// Every FROST key the network holds.
        #[arg(long, conflicts_with = "keys")]
        all: bool,
        /// DKLs23 keys: commit at every node a refresh that was committed at only some (its
        /// coordinator stopped half-way), once every node attests the same new sharing.
        #[arg(long, conflicts_with = "all")]
        finish: bool,
        /// DKLs23 keys: the complete refresh, which makes every pair's OT set-up anew
        /// (seconds, like a key generation) instead of re-randomizing it. Run it after a
        /// DKLs23 import, whose dealer made the old set-up.
        #[arg(long, conflicts_with_all = ["all", "finish"])]
        complete: bool,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Let a client key (`eur1…`, e.g. a payment provider's) take signature shares at every
    /// node, of the keys named by `--keys` only: whole names or prefixes ending in `*`
    /// (`psp-a-*`), comma-separated; `*` grants every key. Replaces the client's earlier
    /// grant. Running nodes apply it within a second (they watch their node.json).
    Grant {
        /// The client's key (`eur1…`).
        client: String,
        /// Key names and prefixes, comma-separated.
        #[arg(long)]
        keys: String,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Remove a client key from every node (its grant too). Running nodes apply it within a
    /// second and drop the client's open connections at its next request.
    Revoke {
        /// The client's key (`eur1…`).
        client: String,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
    /// Rebuild a key from t shares and print it as a hex scalar (handle it like a key file).
    Export {
        /// The key's name.
        key: String,
        /// The network's directory.
        #[arg(long, default_value = "./florin-custody")]
        data: PathBuf,
    },
}

/// Runs a `florin custody` command.
pub fn run(cmd: CustodyCommand) -> Result<ExitCode> {
    match cmd {
        CustodyCommand::Up {
            n,
            t,
            data,
            base_port,
            keys,
            ecdsa,
            json,
        } => {
            let layout = layout_at(&data)?;
            let level = match ecdsa.as_deref() {
                None => None,
                Some(l) => Some(EcdsaLevel::parse(l).ok_or_else(|| {
                    anyhow!("--ecdsa takes `dkls23`, `production` or `insecure-test`, not {l:?}")
                })?),
            };
            let keys: Vec<(String, Option<[u8; 32]>)> =
                keys.into_iter().map(|k| (k, None)).collect();
            let (kmn, started) = ensure_up(&layout, t, n, base_port, &keys, false, level)?;
            match level {
                Some(EcdsaLevel::InsecureTest) => {
                    kmn.ecdsa_setup(Duration::from_secs(300))?;
                    tracing::info!(
                        "ECDSA ready (insecure-test level: never for keys that hold value)"
                    );
                }
                Some(EcdsaLevel::Production) => tracing::info!(
                    "ECDSA: each node generates its Paillier primes in the background (about 5 \
                     minutes of CPU per node); then run `florin custody ecdsa-setup --data {}`",
                    data.display()
                ),
                Some(EcdsaLevel::Dkls23) => {
                    tracing::info!("ECDSA ready: DKLs23 keys (no set-up; CGGMP24 refused)")
                }
                None => {}
            }
            report(&layout, &kmn, json, started)?;
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::EcdsaSetup { data, wait } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            let st = Instant::now();
            tracing::info!(
                "waiting for every node's primes, then making the auxiliary information…"
            );
            let spin = crate::progress::spinner("primes and auxiliary information");
            kmn.ecdsa_setup(Duration::from_secs(wait))?;
            drop(spin);
            tracing::info!(
                "ECDSA auxiliary information ready on all {} nodes ({:.1} s)",
                kmn.n(),
                st.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Node {
            config,
            exit_with_parent,
        } => {
            let cfg = CustodyNodeConfig::load(&config)?;
            if exit_with_parent {
                watch_parent();
            }
            // `/metrics` on its own small runtime beside the node's threads.
            let _metrics = match cfg.metrics {
                Some(addr) => {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .thread_name("florin-metrics")
                        .enable_all()
                        .build()?;
                    rt.block_on(crate::cluster_cmd::serve_metrics(Some(addr)))?;
                    Some(rt)
                }
                None => None,
            };
            florin_node::custody::node::run_node(&cfg, Some(&config))?;
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Status { data, json } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            let up = report(&layout, &kmn, json, 0)?;
            Ok(if up >= kmn.t() as usize {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        CustodyCommand::Down { data } => {
            let layout = existing(&data)?;
            let stopped = down(&layout)?;
            tracing::info!("stopped {stopped} node(s)");
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Kill { party, data } => {
            let layout = existing(&data)?;
            let pid =
                node_pid(&layout, party).ok_or_else(|| anyhow!("node {party} is not running"))?;
            signal(pid, "KILL")?;
            tracing::info!("killed node {party} (pid {pid})");
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Keygen {
            key,
            scheme,
            engine,
            data,
            json,
        } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            if scheme == "p256" {
                let engine = engine_of(&layout, engine.as_deref())?;
                let pk = kmn.ecdsa_keygen_with(&key, engine)?;
                if json {
                    print_json(
                        &json!({"key": key, "scheme": "p256", "engine": engine.name(), "public_key": hex::encode(pk.0), "t": kmn.t(), "n": kmn.n()}),
                    );
                } else {
                    println!(
                        "{key}  p256:{}  ({} of {}, {})",
                        hex::encode(pk.0),
                        kmn.t(),
                        kmn.n(),
                        engine.name()
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            if scheme != "ed25519" {
                bail!("--scheme takes `ed25519` or `p256`, not {scheme:?}");
            }
            let g = kmn.dkg(&key)?;
            if json {
                print_json(
                    &json!({"key": key, "public_key": g.public_key().to_address(), "t": g.threshold(), "n": g.parties()}),
                );
            } else {
                println!(
                    "{key}  {}  ({} of {})",
                    g.public_key().to_address(),
                    g.threshold(),
                    g.parties()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Sign {
            key,
            message,
            presigned,
            data,
            json,
        } => {
            let layout = existing(&data)?;
            let msg = hex::decode(message.trim()).context("the message must be hex")?;
            let kmn = open(&layout)?;
            if is_ecdsa(&kmn, &key) {
                return sign_p256(&kmn, &key, &msg, presigned, json);
            }
            let signer = kmn.signer(&key)?;
            let start = Instant::now();
            let sig = signer.sign(&msg)?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let valid = verify(&signer.public_key(), &msg, &sig).is_ok();
            if json {
                print_json(
                    &json!({"key": key, "public_key": signer.public_key().to_address(), "signature": hex::encode(sig.0), "valid": valid, "ms": ms}),
                );
            } else {
                println!("{}", hex::encode(sig.0));
                tracing::info!(
                    "verifies under {}: {valid} ({ms:.1} ms)",
                    signer.public_key().to_address()
                );
            }
            Ok(if valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        CustodyCommand::Import {
            key,
            from,
            scheme,
            engine,
            data,
        } => {
            let layout = existing(&data)?;
            if scheme == "p256" {
                let engine = engine_of(&layout, engine.as_deref())?;
                let secret = read_p256_secret(&from)?;
                let pk = open(&layout)?.ecdsa_import_with(&key, &secret, engine)?;
                println!("{key}  p256:{}", hex::encode(pk.0));
                tracing::info!(
                    "imported: every node holds a share; {} can now be removed from this machine",
                    from.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            if scheme != "ed25519" {
                bail!("--scheme takes `ed25519` or `p256`, not {scheme:?}");
            }
            let seed = read_seed(&from)?;
            let g = open(&layout)?.import_seed(&key, &seed)?;
            println!("{key}  {}", g.public_key().to_address());
            tracing::info!(
                "imported: every node holds a share; {} can now be removed from this machine",
                from.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::AddKey {
            key,
            from,
            addend,
            data,
        } => {
            let layout = existing(&data)?;
            let r2 = read_p256_secret(&addend)?;
            let pk = open(&layout)?.ecdsa_add_key(&key, &from, &r2)?;
            println!("{key}  p256:{}", hex::encode(pk.0));
            tracing::info!(
                "added: every node holds a share of {from} + the key in {}; that key alone no \
                 longer signs for {key}",
                addend.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Commit { key, data } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            let held = kmn.commit_pending(&key)?;
            if held.ecdsa {
                let pk = florin_custody::ecdsa::identity_public_key(&held.public)
                    .ok_or_else(|| anyhow!("a malformed key identity"))?;
                println!("{key}  p256:{}", hex::encode(pk));
            } else {
                let g = florin_custody::frost::GroupKey::from_bytes(&held.public)?;
                println!("{key}  {}", g.public_key().to_address());
            }
            tracing::info!("committed at all {} nodes", kmn.n());
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Repair { key, party, data } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            if is_ecdsa(&kmn, &key) {
                let helpers = kmn.ecdsa_repair(&key, party)?;
                tracing::info!(
                    "repaired node {party}'s share of {key} with nodes {helpers:?}, then \
                     refreshed it completely at all {} nodes",
                    kmn.n()
                );
                return Ok(ExitCode::SUCCESS);
            }
            let helpers = kmn.repair(&key, party)?;
            tracing::info!("repaired node {party}'s share of {key} with nodes {helpers:?}");
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::ReplaceNode { party, force, data } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            let st = kmn.status();
            let node = st
                .iter()
                .find(|s| s.party == party)
                .ok_or_else(|| anyhow!("the network has no node {party}"))?;
            if node.up && !force {
                bail!(
                    "node {party} answers with its identity {}: it is not lost (stop it first, \
                     or pass --force if its key leaked)",
                    node.key
                );
            }
            let key = layout.replace_identity(party)?;
            println!("node {party}  {}", key.to_address());
            tracing::info!(
                "node {party} has a new identity in every config. Restart the network \
                 (`florin custody down`, then `up`, or the devnet): node {party}'s FROST shares \
                 are rebuilt from the others when it starts. ECDSA shares and auxiliary \
                 information of node {party} are not rebuilt."
            );
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Refresh {
            keys,
            all,
            finish,
            complete,
            data,
        } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            let keys = if all {
                let mut names: Vec<String> = kmn
                    .status()
                    .into_iter()
                    .flat_map(|s| s.keys.into_iter().map(|(k, _)| k))
                    .collect();
                names.sort();
                names.dedup();
                names
            } else {
                keys
            };
            if keys.is_empty() {
                bail!("name the keys to refresh, or --all");
            }
            for key in &keys {
                let started = Instant::now();
                if finish {
                    let pk = kmn
                        .ecdsa_finish_refresh(key)
                        .with_context(|| format!("finishing the refresh of {key}"))?;
                    println!(
                        "{key}  p256:{}  refresh committed everywhere",
                        hex::encode(pk.0)
                    );
                    continue;
                }
                if is_ecdsa(&kmn, key) {
                    let pk = if complete {
                        kmn.ecdsa_refresh_complete(key)
                    } else {
                        kmn.ecdsa_refresh(key)
                    }
                    .with_context(|| format!("refresh of {key}"))?;
                    println!("{key}  p256:{}  refreshed", hex::encode(pk.0));
                    tracing::info!(
                        "{key}: new DKLs23 shares{} at all {} nodes in {:.0} ms",
                        if complete { " and OT set-up" } else { "" },
                        kmn.n(),
                        started.elapsed().as_secs_f64() * 1e3
                    );
                    continue;
                }
                if complete {
                    bail!("{key}: --complete is for DKLs23 keys");
                }
                let g = kmn
                    .refresh(key)
                    .with_context(|| format!("refresh of {key}"))?;
                println!("{key}  {}  refreshed", g.public_key().to_address());
                tracing::info!(
                    "{key}: new shares at all {} nodes in {:.0} ms; the old ones are erased",
                    kmn.n(),
                    started.elapsed().as_secs_f64() * 1e3
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Grant { client, keys, data } => {
            let layout = existing(&data)?;
            let patterns: Vec<String> = keys
                .split(',')
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())
                .collect();
            if patterns.is_empty() {
                bail!("--keys names no key (use '*' for every key, or `revoke`)");
            }
            let every = patterns.iter().any(|p| p == "*");
            layout.grant(&client, (!every).then_some(patterns.as_slice()))?;
            tracing::info!(
                "granted {client}: {}; running nodes apply it within a second",
                if every {
                    "every key".to_string()
                } else {
                    patterns.join(", ")
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Revoke { client, data } => {
            let layout = existing(&data)?;
            layout.revoke(&client)?;
            tracing::info!("revoked {client}; running nodes drop it within a second");
            Ok(ExitCode::SUCCESS)
        }
        CustodyCommand::Export { key, data } => {
            let layout = existing(&data)?;
            let kmn = open(&layout)?;
            if is_ecdsa(&kmn, &key) {
                let secret = kmn.ecdsa_export(&key)?;
                let pk = florin_crypto::p256::P256SecretKey::from_bytes(&secret)
                    .map_err(|e| anyhow!("{e}"))?
                    .public_key();
                println!("{P256_PREFIX}{}", hex::encode(&secret[..]));
                tracing::warn!(
                    "P-256 secret key of {key} (p256:{}); it signs alone: guard it",
                    hex::encode(pk.0)
                );
                return Ok(ExitCode::SUCCESS);
            }
            let scalar = kmn.export(&key)?;
            let pk = florin_custody::frost::scalar_public_key(&scalar)?;
            println!("{SCALAR_PREFIX}{}", hex::encode(&scalar[..]));
            tracing::warn!(
                "signing scalar of {key} ({}); it signs alone: guard it",
                pk.to_address()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The ECDSA engine `--engine` names, or the network's default: DKLs23 on a network run with
/// `--ecdsa dkls23`, CGGMP24 otherwise.
fn engine_of(layout: &Layout, named: Option<&str>) -> Result<florin_node::custody::EcdsaEngine> {
    use florin_node::custody::EcdsaEngine;
    match named {
        Some(e) => EcdsaEngine::parse(e)
            .ok_or_else(|| anyhow!("--engine takes `cggmp24` or `dkls23`, not {e:?}")),
        None => Ok(match layout.ecdsa()? {
            Some(EcdsaLevel::Dkls23) => EcdsaEngine::Dkls23,
            _ => EcdsaEngine::Cggmp24,
        }),
    }
}
