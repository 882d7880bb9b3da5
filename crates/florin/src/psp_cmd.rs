//! `florin psp`: a payment service provider hosting custodial wallets whose keys live in its
//! own key-management network (`serve`), and the commands its operator and customers use
//! against its API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use florin_node::custody::EcdsaLevel;
use florin_node::psp::{PeerPsp, Psp, PspConfig, PspScheme};
use florin_token::amount::{format_cents, parse_euros};
use serde::{Deserialize, Serialize};

use crate::util::{print_json, Trust};

/// `florin psp` subcommands.
#[derive(Subcommand)]
pub enum PspCommand {
    /// Run a payment service provider: its 2-of-3 key-management network (node processes,
    /// started if down) and its API, settling on a ledger (e.g. `florin devnet`).
    Serve {
        /// Data directory: the provider's books and `custody/` (its network).
        #[arg(long, default_value = "./florin-psp")]
        data: PathBuf,
        /// The provider's name (kept after the first start).
        #[arg(long)]
        name: Option<String>,
        /// The ledger's API: one URL, or several comma-separated (a cluster's sentinels; a call
        /// passes to the next when one cannot be reached).
        #[arg(long, env = "FLORIN_NODE", default_value = "https://127.0.0.1:7400")]
        ledger: String,
        /// Address to listen on (loopback by default).
        #[arg(long, default_value = "127.0.0.1:7600")]
        listen: SocketAddr,
        /// Customers' keys: `p256` (threshold ECDSA, as smart cards need) or `ed25519`
        /// (FROST). Kept after the first start.
        #[arg(long)]
        scheme: Option<String>,
        /// P-256: the network's threshold ECDSA. `dkls23`: DKLs23 keys (OT-based; ready in
        /// seconds, milliseconds a signature; no identifiable abort). `production`: CGGMP24
        /// keys (identifiable abort; each node first spends minutes on its Paillier primes).
        /// `insecure-test`: CGGMP24 at a test level (seconds; demos and tests only).
        /// Kept after the first start (default `production`).
        #[arg(long)]
        ecdsa: Option<String>,
        /// P-256: presignatures kept ready per account (CGGMP24 keys).
        #[arg(long, default_value_t = 2)]
        presign_pool: usize,
        /// P-256: account keys made ahead in the background (pending at the nodes until an
        /// account opens and takes one); 0 makes each key when its account opens.
        #[arg(long, default_value_t = 2)]
        key_pool: usize,
        /// Longest to wait for the network's ECDSA set-up at start, seconds.
        #[arg(long, default_value_t = 1800)]
        setup_wait: u64,
        /// TLS (by default, from a CA made in `DATA/tls` on first start) or plain HTTP.
        #[command(flatten)]
        tls: crate::tls_args::ServeTlsArgs,
        /// A peer provider, `NAME=URL=KEY` (its name, API URL and peer key as its `florin psp
        /// info` shows them); repeat for each. Only peers are paid across providers and
        /// only they may call `receive`.
        #[arg(long = "peer")]
        peers: Vec<String>,
        /// This provider's peer key (default `DATA/peer.key`, made on first start).
        #[arg(long)]
        peer_key: Option<PathBuf>,
    },
    /// The provider: name, scheme, network, accounts, unresolved payments.
    Info {
        /// The provider's API.
        #[arg(long, env = "FLORIN_PSP", default_value = "https://127.0.0.1:7600")]
        psp: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Open a custodial account (its key is made by distributed key generation and bound to
    /// the customer's key, which is created if its file does not exist).
    Open {
        /// The account's name.
        name: String,
        /// The customer's key file (default `./NAME.customer.key`): signs the account's
        /// requests and authorizes its payments.
        #[arg(long)]
        customer_key: Option<PathBuf>,
        /// The provider's API.
        #[arg(long, env = "FLORIN_PSP", default_value = "https://127.0.0.1:7600")]
        psp: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fund an account from the ledger's faucet (devnet), asked by its customer.
    Fund {
        /// The account.
        name: String,
        /// Euros, e.g. `25` or `3.50`.
        amount: String,
        /// The customer's key file (default `./NAME.customer.key`): signs the request.
        #[arg(long)]
        customer_key: Option<PathBuf>,
        /// The provider's API.
        #[arg(long, env = "FLORIN_PSP", default_value = "https://127.0.0.1:7600")]
        psp: String,
    },
    /// One account's balance (signed with its customer key), or every account's (signed with
    /// the provider's operator key: `--operator-key DATA/operator.key`).
    Balance {
        /// The account (all when left out).
        name: Option<String>,
        /// The customer's key file (default `./NAME.customer.key`): signs the account's
        /// requests and authorizes its payments.
        #[arg(long)]
        customer_key: Option<PathBuf>,
        /// The provider's API.
        #[arg(long, env = "FLORIN_PSP", default_value = "https://127.0.0.1:7600")]
        psp: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pay: to an account here, to another provider's customer (`--to-psp`), or to a ledger
    /// encumbrance (`p256:…` / `ed25519:…`).
    Pay {
        /// The paying account.
        from: String,
        /// The payee.
        to: String,
        /// Euros.
        amount: String,
        /// The payee's provider, when it is another one: a configured peer's name or URL.
        #[arg(long)]
        to_psp: Option<String>,
        /// The customer's key file (default `./FROM.customer.key`): signs the account's
        /// requests and authorizes its payments.
        #[arg(long)]
        customer_key: Option<PathBuf>,

        /// A payment id: running the command again with the same id pays once (a random
        /// one is used when left out).
        #[arg(long)]
        id: Option<String>,
        /// The provider's API.
        #[arg(long, env = "FLORIN_PSP", default_value = "https://127.0.0.1:7600")]
        psp: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print and check, offline, the proof of a cross-provider payment: where the payee's
    /// provider said to pay (signed by it), the ledger's signed confirmation of the
    /// transaction, and the payee's provider's signed acknowledgement. Exit 0 when the proof
    /// holds, is complete and both keys were pinned (`--issuer`, `--payee-key`); 2 when it
    /// does not hold; 3 when it holds but lacks the confirmation or the acknowledgement, or a
    /// key was not pinned (1: it could not be fetched or read).
    Proof(ProofArgs),
    /// An account's payments, oldest first.
    History {
        /// The account.
        name: String,
        /// The customer's key file (default `./NAME.customer.key`): signs the account's
        /// requests and authorizes its payments.
        #[arg(long)]
        customer_key: Option<PathBuf>,
        /// The provider's API.
        #[arg(long, env = "FLORIN_PSP", default_value = "https://127.0.0.1:7600")]
        psp: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `florin psp proof`: where the proof comes from and which keys it must be signed by.
#[derive(clap::Args)]
pub struct ProofArgs {
    /// The payment's txid (as its receipt shows it); fetched from the paying provider.
    txid: Option<String>,
    /// The paying account (with TXID).
    #[arg(long)]
    account: Option<String>,
    /// The customer's key file (default `./ACCOUNT.customer.key`).
    #[arg(long)]
    customer_key: Option<PathBuf>,
    /// The paying provider's API (with TXID).
    #[arg(long, env = "FLORIN_PSP", default_value = "https://127.0.0.1:7600")]
    psp: String,
    /// Check a proof saved before (`--out`) instead: offline, nothing is fetched.
    #[arg(long, conflicts_with_all = ["txid", "account", "customer_key"])]
    file: Option<PathBuf>,
    /// Save the fetched proof (JSON) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The ledger's issuer key (`eur1…`, as the ledger's `/v1/info` shows it): the
    /// confirmation must be signed by it.
    #[arg(long)]
    issuer: Option<String>,
    /// The payee's provider's peer key (`eur1…`): its offer and acknowledgement must be
    /// signed by it.
    #[arg(long)]
    payee_key: Option<String>,
    /// Print JSON (the proof and what the check found).
    #[arg(long)]
    json: bool,
}

/// What the data directory remembers from the first start.
#[derive(Serialize, Deserialize)]
struct Stored {
    name: String,
    scheme: String,
    /// P-256: the `--ecdsa` setting its accounts' keys were made with (absent in books from
    /// before it was stored: the first start that names it, or `production`, fills it in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ecdsa: Option<String>,
}

/// Runs a `florin psp` command.
pub fn run(cmd: PspCommand, trust: &Trust) -> Result<ExitCode> {
    match cmd {
        PspCommand::Serve {
            data,
            name,
            ledger,
            listen,
            scheme,
            ecdsa,
            presign_pool,
            key_pool,
            setup_wait,
            tls,
            peers,
            peer_key,
        } => serve(
            data,
            name,
            ledger,
            listen,
            scheme,
            ecdsa.as_deref(),
            (presign_pool, key_pool),
            setup_wait,
            &tls,
            trust,
            &peers,
            peer_key,
        ),
        PspCommand::Info { psp, json } => {
            let c = Client::new(&psp, trust)?;
            let i = c.run(c.api.info())?;
            if json {
                print_json(&serde_json::to_value(&i)?);
            } else {
                println!("provider    {}", i.name);
                println!("keys        {} ({}-of-{} network)", i.scheme, i.t, i.n);
                println!("ledger      {}", i.ledger);
                println!("accounts    {}", i.accounts);
                println!("unresolved  {}", i.unresolved);
                println!("unnotified  {}", i.unnotified);
                println!("peer key    {}", i.peer_key);
                println!("peers       {}", i.peers.join(", "));
            }
            Ok(ExitCode::SUCCESS)
        }
        PspCommand::Open {
            name,
            customer_key,
            psp,
            json,
        } => {
            let path = customer_key.unwrap_or_else(|| default_key(&name));
            let key = florin_node::load_or_create_key(&path)?;
            let c = Client::new(&psp, trust)?;
            let v = c.run(c.api.open_account(&name, &key))?;
            if json {
                print_json(&serde_json::to_value(&v)?);
            } else {
                println!("{}  {}  pay to {}", v.name, v.scheme, v.encumbrance);
            }
            Ok(ExitCode::SUCCESS)
        }
        PspCommand::Fund {
            name,
            amount,
            customer_key,
            psp,
        } => {
            let amount_cents = parse_euros(&amount)?;
            let key = customer(&name, customer_key)?;
            let c = Client::new(&psp, trust)?;
            let v = c.run(c.api.fund(&name, amount_cents, &key))?;
            println!("{}  €{}", v.name, format_cents(v.balance_cents));
            Ok(ExitCode::SUCCESS)
        }
        PspCommand::Balance {
            name,
            customer_key,
            psp,
            json,
        } => {
            let c = Client::new(&psp, trust)?;
            let list = match name {
                Some(n) => {
                    let key = customer(&n, customer_key)?;
                    vec![c.run(c.api.account(&n, &key))?]
                }
                None => {
                    let path = crate::util::operator_key_path().ok_or_else(|| {
                        anyhow!(
                            "listing every account needs the provider's operator key: \
                             --operator-key DATA/operator.key (or FLORIN_OPERATOR_KEY)"
                        )
                    })?;
                    let operator = crate::util::read_operator_key(path)?;
                    c.run(c.api.accounts(&operator))?
                }
            };
            if json {
                print_json(&serde_json::to_value(&list)?);
            } else {
                for v in list {
                    println!(
                        "{:<16} €{:>12}  {} coin(s){}",
                        v.name,
                        format_cents(v.balance_cents),
                        v.coins,
                        if v.unresolved > 0 {
                            format!(", {} payment(s) unresolved", v.unresolved)
                        } else {
                            String::new()
                        }
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PspCommand::Pay {
            from,
            to,
            amount,
            to_psp,
            id,
            customer_key,
            psp,
            json,
        } => {
            let key = customer(&from, customer_key)?;
            let amount_cents = parse_euros(&amount)?;
            let id = id.unwrap_or_else(|| {
                let mut b = [0u8; 16];
                rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
                hex::encode(b)
            });
            let c = Client::new(&psp, trust)?;
            let r = c.run(
                c.api
                    .pay_as(&key, &from, &to, to_psp.as_deref(), amount_cents, &id),
            )?;
            if json {
                print_json(&serde_json::to_value(&r)?);
            } else {
                if r.repeated {
                    println!(
                        "already paid under this id: ledger tx {} ({})",
                        r.txid, r.route
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                println!(
                    "paid €{} ({}) in {:.0} ms (signing {:.0} ms), ledger tx {}{}",
                    format_cents(amount_cents),
                    r.route,
                    r.total_ms,
                    r.sign_ms,
                    r.txid,
                    if r.route == "cross_provider" && !r.notified {
                        "; the payee's provider has not acknowledged yet (retried)"
                    } else {
                        ""
                    }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        PspCommand::Proof(args) => proof(args, trust),
        PspCommand::History {
            name,
            customer_key,
            psp,
            json,
        } => {
            let key = customer(&name, customer_key)?;
            let c = Client::new(&psp, trust)?;
            let h = c.run(c.api.history(&name, &key))?;
            if json {
                print_json(&serde_json::to_value(&h)?);
            } else {
                for e in h.entries {
                    println!(
                        "{:>5}  {:<6} €{:>10}  {:<14} {}",
                        e.seq,
                        e.direction,
                        format_cents(e.amount_cents),
                        e.route,
                        e.counterparty
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn serve(
    data: PathBuf,
    name: Option<String>,
    ledger: String,
    listen: SocketAddr,
    scheme: Option<String>,
    ecdsa: Option<&str>,
    (presign_pool, key_pool): (usize, usize),
    setup_wait: u64,
    tls: &crate::tls_args::ServeTlsArgs,
    trust: &Trust,
    peers: &[String],
    peer_key: Option<PathBuf>,
) -> Result<ExitCode> {
    tls.check(listen)?;
    // The ledger's and other providers' CAs (`--ca-cert`), read before anything is written.
    let links = florin_http::HttpLinks::with_tls(&trust.client_tls()?)?;
    let peers = peers
        .iter()
        .map(|p| {
            PeerPsp::parse(p).ok_or_else(|| {
                anyhow!("--peer {p:?}: expected NAME=URL=KEY (an http(s) URL, an eur1… key)")
            })
        })
        .collect::<Result<Vec<_>>>()?;
    std::fs::create_dir_all(&data)
        .with_context(|| format!("cannot create data directory {}", data.display()))?;
    let stored_path = data.join("psp.json");
    // Books already here: their configuration and key-management network must be too (a
    // fresh provider name, scheme or set of keys over existing books is never made).
    let has_books = data.join("psp.redb").exists() || data.join("psp.redb.created").exists();
    let stored: Option<Stored> = match std::fs::read(&stored_path) {
        Ok(b) => Some(serde_json::from_slice(&b).with_context(|| {
            format!(
                "{} is damaged: expected the provider's JSON",
                stored_path.display()
            )
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if has_books {
                bail!(
                    "{} is missing, but {} holds a provider's books: refusing to start with a new configuration (restore it from a backup)",
                    stored_path.display(),
                    data.display()
                );
            }
            None
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", stored_path.display())),
    };
    if has_books && !data.join("custody").exists() {
        bail!(
            "{} is missing, but {} holds a provider's books: refusing to create a new key-management network (new keys) over them",
            data.join("custody").display(),
            data.display()
        );
    }
    let stored = match stored {
        Some(s) => {
            if name.as_ref().is_some_and(|n| *n != s.name) {
                bail!(
                    "{} is provider {:?}; --name cannot change it",
                    data.display(),
                    s.name
                );
            }
            if scheme.as_ref().is_some_and(|x| *x != s.scheme) {
                bail!(
                    "{} holds {} accounts; --scheme cannot change it",
                    data.display(),
                    s.scheme
                );
            }
            match (&s.ecdsa, ecdsa) {
                (Some(kept), Some(given)) if kept != given => bail!(
                    "{} holds accounts made with --ecdsa {kept}; --ecdsa cannot change it",
                    data.display()
                ),
                (None, _) if s.scheme == "p256" => {
                    let e = ecdsa.unwrap_or("production");
                    if EcdsaLevel::parse(e).is_none() {
                        bail!("--ecdsa takes `dkls23`, `production` or `insecure-test`, not {e:?}");
                    }
                    let s = Stored {
                        ecdsa: Some(e.to_string()),
                        ..s
                    };
                    crate::util::write_atomic(&stored_path, &serde_json::to_vec_pretty(&s)?)?;
                    s
                }
                _ => s,
            }
        }
        None => {
            let scheme = scheme.unwrap_or_else(|| "p256".into());
            let s = Stored {
                name: name.unwrap_or_else(|| "psp".into()),
                ecdsa: (scheme == "p256").then(|| ecdsa.unwrap_or("production").to_string()),
                scheme,
            };
            // Checked before anything is written, so a typo is not remembered.
            if !florin_node::psp::valid_account(&s.name) {
                bail!("--name: 1–48 of a-z 0-9 - _");
            }
            if PspScheme::parse(&s.scheme).is_none() {
                bail!("--scheme takes `p256` or `ed25519`, not {:?}", s.scheme);
            }
            if let Some(e) = s
                .ecdsa
                .as_deref()
                .filter(|e| EcdsaLevel::parse(e).is_none())
            {
                bail!("--ecdsa takes `dkls23`, `production` or `insecure-test`, not {e:?}");
            }
            crate::util::write_atomic(&stored_path, &serde_json::to_vec_pretty(&s)?)?;
            s
        }
    };
    let scheme = PspScheme::parse(&stored.scheme).ok_or_else(|| {
        anyhow!(
            "--scheme takes `p256` or `ed25519`, not {:?}",
            stored.scheme
        )
    })?;
    let level = match scheme {
        PspScheme::P256 => {
            let e = stored.ecdsa.as_deref().unwrap_or("production");
            Some(EcdsaLevel::parse(e).ok_or_else(|| {
                anyhow!("--ecdsa takes `dkls23`, `production` or `insecure-test`, not {e:?}")
            })?)
        }
        PspScheme::Ed25519 => None,
    };
    let ecdsa_engine = match level {
        Some(EcdsaLevel::Dkls23) => florin_node::custody::EcdsaEngine::Dkls23,
        _ => florin_node::custody::EcdsaEngine::Cggmp24,
    };
    let layout = crate::custody_cmd::layout_at(&data.join("custody"))?;
    let (kmn, started) = crate::custody_cmd::ensure_up(&layout, 2, 3, 0, &[], true, level)?;
    if started > 0 {
        tracing::info!(
            "  started {started} key-management node(s) in {}",
            layout.dir().display()
        );
    }
    if scheme == PspScheme::P256 && ecdsa_engine == florin_node::custody::EcdsaEngine::Cggmp24 {
        let st = Instant::now();
        if level == Some(EcdsaLevel::Production) {
            tracing::info!(
                "  ECDSA set-up: waiting for every node's Paillier primes (minutes on a fresh \
                 network), then the auxiliary information…"
            );
        }
        kmn.ecdsa_setup(Duration::from_secs(setup_wait))
            .context("ECDSA set-up of the provider's network")?;
        tracing::info!("  ECDSA ready ({:.1} s)", st.elapsed().as_secs_f64());
    }
    // The provider's operator key (lists every account; `florin psp balance` without a name).
    let operator_file = data.join(crate::devnet::OPERATOR_KEY_FILE);
    let operator_new = !operator_file.exists();
    let operator = florin_node::load_or_create_key(&operator_file)?;
    if operator_new {
        tracing::info!("  created the operator key {}", operator_file.display());
    }
    let psp = Psp::open(
        PspConfig {
            name: stored.name.clone(),
            books: data.join("psp.redb"),
            ledger: ledger.clone(),
            scheme,
            presign_pool,
            ecdsa_engine,
            key_pool,
            peer_key: florin_node::load_or_create_key(
                &peer_key.unwrap_or_else(|| data.join("peer.key")),
            )?,
            peers,
            operators: vec![operator.public_key()],
        },
        kmn.clone(),
        std::sync::Arc::new(links),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let served = crate::tls_args::serve_options(
            tls.plain_http,
            &tls.tls_names,
            &data.join(crate::tls_args::TLS_DIR),
            addr,
            true,
        )?;
        tracing::info!("florin psp {}", stored.name);
        tracing::info!(
            "  keys       {} in a {}-of-{} network ({})",
            scheme.name(),
            kmn.t(),
            kmn.n(),
            layout.dir().display()
        );
        tracing::info!("  ledger     {ledger}");
        let info = psp.info()?;
        tracing::info!("  peer key   {}", info.peer_key);
        tracing::info!("  peers      {}", info.peers.join(", "));
        tracing::info!(
            "  operator   {} ({})",
            operator.public_key().to_address(),
            operator_file.display()
        );
        tracing::info!("  data       {}", data.display());
        if let Some(ca) = &served.ca_cert {
            tracing::info!("  tls        CA {}", ca.display());
        }
        println!("listening on {}://{addr}", served.scheme);
        florin_http::psp::serve_with(
            listener,
            psp,
            served.options,
            crate::devnet::shutdown_signal(),
        )
        .await?;
        tracing::info!("florin psp stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// A blocking client for the provider's API (`florin_http::PspClient` on a runtime).
struct Client {
    api: florin_http::PspClient,
    rt: tokio::runtime::Runtime,
}

impl Client {
    fn new(base: &str, trust: &Trust) -> Result<Client> {
        Ok(Client {
            api: florin_http::PspClient::with_tls(base, &trust.client_tls()?)?,
            rt: crate::util::runtime()?,
        })
    }

    fn run<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, florin_http::ClientError>>,
    ) -> Result<T> {
        Ok(self.rt.block_on(call)?)
    }
}

/// `./NAME.customer.key`.
fn default_key(name: &str) -> PathBuf {
    PathBuf::from(format!("{name}.customer.key"))
}

/// The customer key of account `name` (it must exist: made by `florin psp open`).
fn customer(name: &str, path: Option<PathBuf>) -> Result<florin_crypto::SecretKey> {
    let path = path.unwrap_or_else(|| default_key(name));
    florin_node::load_key(&path).with_context(|| {
        format!(
            "the customer key of {name} ({}; made by `florin psp open`)",
            path.display()
        )
    })
}

fn proof(a: ProofArgs, trust: &Trust) -> Result<ExitCode> {
    use florin_node::psp::proof::TransferProof;
    let proof: TransferProof = match (&a.file, &a.txid) {
        (Some(f), _) => {
            let b = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
            serde_json::from_slice(&b)
                .with_context(|| format!("{} is not a proof of payment", f.display()))?
        }
        (None, Some(txid)) => {
            let account = a
                .account
                .clone()
                .ok_or_else(|| anyhow!("fetching a proof needs --account (the paying account)"))?;
            let key = customer(&account, a.customer_key.clone())?;
            let c = Client::new(&a.psp, trust)?;
            c.run(c.api.proof(&account, txid, &key))?
        }
        (None, None) => bail!("give a TXID (fetched from the provider) or --file PROOF"),
    };
    let pin = |k: &Option<String>, what: &str| -> Result<Option<florin_crypto::PublicKey>> {
        k.as_deref()
            .map(|s| florin_crypto::PublicKey::parse(s).map_err(|e| anyhow!("{what} {s:?}: {e}")))
            .transpose()
    };
    let issuer = pin(&a.issuer, "--issuer")?;
    let payee_key = pin(&a.payee_key, "--payee-key")?;
    if let Some(out) = &a.out {
        crate::util::write_atomic(out, &serde_json::to_vec_pretty(&proof)?)?;
    }
    let check = proof.verify(issuer.as_ref(), payee_key.as_ref());
    if a.json {
        print_json(&serde_json::json!({
            "proof": proof,
            "valid": check.is_ok(),
            "error": check.as_ref().err().map(|e| e.to_string()),
            "check": check.as_ref().ok(),
        }));
    }
    let c = match check {
        Ok(c) => c,
        Err(e) => {
            if !a.json {
                tracing::error!("the proof of {} does NOT hold: {e}", proof.txid);
            }
            return Ok(ExitCode::from(2));
        }
    };
    if !a.json {
        println!("payment      {}", c.txid);
        println!("amount       €{}", format_cents(c.amount_cents));
        println!("from         {} (the paying provider's record)", c.payer);
        println!(
            "to           {} at provider {} (its key {})",
            c.payee_account, c.payee_psp, c.payee_psp_key
        );
        println!("paid to      {}", c.encumbrance);
        match (&c.ledger_issuer, c.confirmed_at) {
            (Some(k), Some(at)) => println!(
                "ledger       confirmed, signed by issuer {k}{} at {at}",
                if issuer.is_some() {
                    " (as pinned)"
                } else {
                    " (NOT pinned: give --issuer, the ledger's /v1/info issuer)"
                }
            ),
            _ => println!(
                "ledger       NO confirmation yet (the provider fetches it in the background)"
            ),
        }
        match &c.acknowledged {
            Some(o) => println!("payee's provider  acknowledged ({o}), signed"),
            None => println!("payee's provider  NOT acknowledged yet"),
        }
        if payee_key.is_none() {
            println!(
                "payee's key  NOT pinned: give --payee-key, the peer key configured for {}",
                c.payee_psp
            );
        }
        println!(
            "{}",
            match (c.complete, c.pinned) {
                (true, true) => "the proof holds and is complete",
                (true, false) => {
                    "the proof holds with the keys it names, which were not all pinned: \
                     anyone can sign with keys of their own"
                }
                _ => "the proof holds so far but is not complete",
            }
        );
    }
    Ok(if c.complete && c.pinned {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}
