//! `florin devnet`: the token authority and the ledger (sentinel, embedded swap engine,
//! issuer) with embedded storage, one process, no set-up.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_http::{serve_with, AppState};
use florin_node::manifest::{check_dir, DirState, Manifest};
use florin_node::{
    load_key, load_or_create_key, write_private, Authority, AuthorityConfig, Ledger,
};
use florin_store::embedded::{EmbeddedConfig, EmbeddedStore};

/// The operator's key file in a devnet's or a cluster's data directory (mode 0600).
pub const OPERATOR_KEY_FILE: &str = "operator.key";

/// Options of `florin devnet`.
#[derive(Args)]
pub struct DevnetArgs {
    /// Data directory (created if missing).
    #[arg(long, default_value = "./florin-data")]
    data: PathBuf,
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Largest faucet request, in euros.
    #[arg(long, default_value = "10000")]
    max_faucet: String,
    /// Where the issuer's and the authority's keys live: key files in the data directory, or
    /// a local 2-of-3 key-management network (`DATA/custody`, three node processes).
    #[arg(long, value_enum, default_value = "local")]
    custody: Custody,
    /// TLS (by default, from a CA made in `DATA/tls` on first start) or plain HTTP.
    #[command(flatten)]
    tls: crate::tls_args::ServeTlsArgs,
    /// Rate limits of the HTTP API (429 `rate_limited` over them; loopback included).
    #[command(flatten)]
    rate: RateArgs,
    /// Run the supply audit every SECS seconds, for the `florin_audit_balanced` metric and a
    /// warning in the log when the books do not balance (0: only when asked, `GET /v1/audit`).
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    audit_every: u64,
}

/// Audits the books every `every`, so that `florin_audit_balanced` says how they stand; a
/// failed or unbalanced audit is logged as a warning.
pub fn spawn_audits(
    every: std::time::Duration,
    authority: Arc<florin_node::Authority>,
    ledger: Arc<Ledger>,
) -> Option<tokio::task::JoinHandle<()>> {
    if every.is_zero() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (a, l) = (authority.clone(), ledger.clone());
            match tokio::task::spawn_blocking(move || florin_node::audit::full_audit(&a, &l)).await
            {
                Ok(Ok(audit)) if !audit.balanced => tracing::warn!(
                    problems = audit.problems.len(),
                    "the supply audit does not balance: {}",
                    audit.problems.join("; ")
                ),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!("the supply audit failed: {e}"),
                Err(e) => tracing::warn!("the supply audit stopped: {e}"),
            }
        }
    }))
}

/// Rate limits of a node's HTTP API (`docs/api.md#rate-limits`); 0 turns one off.
#[derive(Args, Clone, Copy)]
pub struct RateArgs {
    /// Requests per second one client address may make, sustained.
    #[arg(long, default_value_t = florin_http::RateLimits::default().per_ip_per_sec)]
    pub rate_per_ip: u32,
    /// Requests one client address may make at once.
    #[arg(long, default_value_t = florin_http::RateLimits::default().per_ip_burst)]
    pub rate_burst_ip: u32,
    /// Requests per second naming one key (a mailbox's recipient, a withdrawing key, a faucet
    /// owner), sustained.
    #[arg(long, default_value_t = florin_http::RateLimits::default().per_key_per_sec)]
    pub rate_per_key: u32,
    /// Requests naming one key at once.
    #[arg(long, default_value_t = florin_http::RateLimits::default().per_key_burst)]
    pub rate_burst_key: u32,
    /// Transactions per second one client address may have validated, sustained (a batch
    /// counts each transaction, a deposit each token).
    #[arg(long, default_value_t = florin_http::RateLimits::default().per_ip_tx_per_sec)]
    pub tx_rate_per_ip: u32,
    /// Transactions one client address may have validated at once.
    #[arg(long, default_value_t = florin_http::RateLimits::default().per_ip_tx_burst)]
    pub tx_burst_ip: u32,
    /// Connections one client address (an IPv6 /64) may hold open at once.
    #[arg(long, default_value_t = florin_http::ServeOptions::default().max_connections_per_ip)]
    pub conns_per_ip: usize,
    /// New connections one client address may open per second (a burst of ten times as
    /// many); 0 turns this off.
    #[arg(long, default_value_t = florin_http::ServeOptions::default().new_connections_per_ip_per_sec)]
    pub new_conns_per_ip: u32,
}

impl RateArgs {
    /// `options` with these connection limits.
    pub fn connections(&self, options: florin_http::ServeOptions) -> florin_http::ServeOptions {
        florin_http::ServeOptions {
            max_connections_per_ip: self.conns_per_ip,
            new_connections_per_ip_per_sec: self.new_conns_per_ip,
            ..options
        }
    }

    /// The limits.
    pub fn limits(&self) -> florin_http::RateLimits {
        florin_http::RateLimits {
            per_ip_per_sec: self.rate_per_ip,
            per_ip_burst: self.rate_burst_ip,
            per_key_per_sec: self.rate_per_key,
            per_key_burst: self.rate_burst_key,
            per_ip_tx_per_sec: self.tx_rate_per_ip,
            per_ip_tx_burst: self.tx_burst_ip,
        }
    }
}

/// Where devnet keeps its signing keys.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Custody {
    /// Key files (`authority.key`, `issuer.key`).
    Local,
    /// Shares in a 2-of-3 key-management network; no machine holds a whole key.
    Threshold,
}

/// The authority's and the issuer's signers, and the key-management network behind them when
/// the keys are shared.
type Signers = (
    Arc<dyn Signer>,
    Arc<dyn Signer>,
    Option<Arc<florin_node::custody::Kmn>>,
);

fn signers(args: &DevnetArgs) -> Result<Signers> {
    let custody = crate::custody_cmd::layout_at(&args.data.join("custody"))?;
    let authority_key = args.data.join("authority.key");
    let issuer_key = args.data.join("issuer.key");
    match args.custody {
        Custody::Local => {
            if custody.exists() && (!authority_key.exists() || !issuer_key.exists()) {
                bail!(
                    "this devnet's keys are in the key-management network {}: run it with --custody threshold",
                    custody.dir().display()
                );
            }
            Ok((
                Arc::new(LocalSigner::new(load_or_create_key(&authority_key)?)),
                Arc::new(LocalSigner::new(load_or_create_key(&issuer_key)?)),
                None,
            ))
        }
        Custody::Threshold => {
            // A devnet that ran with key files keeps its keys: they are imported as shares.
            let seed = |p: &std::path::Path| -> Result<Option<[u8; 32]>> {
                if p.exists() {
                    Ok(Some(crate::custody_cmd::read_seed(p)?))
                } else {
                    Ok(None)
                }
            };
            let keys = vec![
                ("authority".to_string(), seed(&authority_key)?),
                ("issuer".to_string(), seed(&issuer_key)?),
            ];
            let (kmn, started) =
                crate::custody_cmd::ensure_up(&custody, 2, 3, 0, &keys, true, None)?;
            if started > 0 {
                tracing::info!(
                    "  started {started} key-management node(s) in {}",
                    custody.dir().display()
                );
            }
            for (k, s) in &keys {
                if s.is_some() {
                    tracing::info!(
                        "  note: {k}.key was imported into the network; the file can be removed"
                    );
                }
            }
            Ok((
                Arc::new(kmn.signer("authority")?),
                Arc::new(kmn.signer("issuer")?),
                Some(kmn),
            ))
        }
    }
}

/// The files a devnet's data directory must hold once initialized (see [`Manifest`]).
pub(crate) fn required_files(custody: Custody) -> Vec<String> {
    let mut files = vec![
        "authority.redb".to_string(),
        format!("ledger/{}", florin_store::embedded::MARK_FILE),
    ];
    match custody {
        Custody::Local => files.extend(["authority.key".into(), "issuer.key".into()]),
        Custody::Threshold => files.push("custody/network.json".into()),
    }
    files
}

/// Runs the devnet until interrupted.
pub fn run(args: DevnetArgs) -> Result<ExitCode> {
    // Every argument checked before anything is written.
    let max_faucet_cents =
        florin_token::amount::parse_euros(&args.max_faucet).context("--max-faucet")?;
    args.tls.check(args.listen)?;
    // Before anything is created: a directory initialized before must still hold every file
    // its manifest names (never a fresh key, registry or ledger over existing state).
    let mut required = required_files(args.custody);
    let dir_state = match check_dir(&args.data, &required) {
        Err(e) if args.custody == Custody::Threshold => {
            // A devnet that ran with key files keeps them when it moves to threshold custody.
            required = required_files(Custody::Local);
            check_dir(&args.data, &required).map_err(|_| e)?
        }
        other => other?,
    };
    if let DirState::Known(m) = &dir_state {
        let custody_dir = args.data.join("custody");
        if m.files.iter().any(|f| f.starts_with("custody")) && args.custody == Custody::Local {
            bail!(
                "this devnet's keys are in the key-management network {}: run it with --custody threshold",
                custody_dir.display()
            );
        }
    }
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("cannot create data directory {}", args.data.display()))?;
    // One process per directory (and `florin node backup` waits for none).
    let _lock = crate::node_cmd::lock_dir(&args.data)?;
    if matches!(dir_state, DirState::Fresh) {
        // Before the first file is created: a first start killed half-way is continued by
        // the next start instead of being refused for the files it had not made yet.
        Manifest::provisional("devnet", required_files(args.custody)).save(&args.data)?;
    }
    let (signer, issuer, kmn) = signers(&args)?;
    if let DirState::Known(m) = &dir_state {
        m.verify_key("authority", &signer.public_key().to_address(), &args.data)?;
        m.verify_key("issuer", &issuer.public_key().to_address(), &args.data)?;
    }
    // The ledger first: its checks refuse damage before anything (the registry's crash
    // recovery included) writes to the directory.
    let store = EmbeddedStore::open(EmbeddedConfig::new(args.data.join("ledger")))
        .with_context(|| format!("cannot open the ledger in {}", args.data.display()))?;
    let mut config = AuthorityConfig::devnet(&args.data);
    config.max_faucet_cents = max_faucet_cents;
    // The operator's key (blacklist, revocation; the devnet's faucet stays open to anyone):
    // a damaged file is refused naming it; a new one is written only once the registry opened
    // (a start refused for damage changes nothing).
    let operator_file = args.data.join(OPERATOR_KEY_FILE);
    let (operator_key, operator_new) = if operator_file.exists() {
        (load_key(&operator_file)?, false)
    } else {
        (SecretKey::generate(&mut rand::rngs::OsRng), true)
    };
    let operator = operator_key.public_key();
    config.operators = vec![operator];
    let authority = Arc::new(Authority::open(config, signer)?);
    if operator_new {
        write_private(&operator_file, operator_key.to_hex().as_bytes())?;
    }
    match &dir_state {
        DirState::Known(m) if m.files == required_files(args.custody) => {}
        _ => {
            // First start (or a directory from before manifests, or one that moved to
            // threshold custody): from now on it is held to what it holds.
            Manifest::new(
                "devnet",
                vec![
                    ("authority".into(), authority.public_key().to_address()),
                    ("issuer".into(), issuer.public_key().to_address()),
                ],
                required_files(args.custody),
            )
            .save(&args.data)?;
        }
    }
    let store = Arc::new(store);
    florin_node::obs::export_store_files("ledger", args.data.join("ledger"), None);
    florin_node::obs::export_store_files("authority", args.data.clone(), None);
    let ledger = Ledger::start(store.clone(), issuer);
    authority.ensure_issuance_baseline(ledger.supply()?.minted_cents)?;
    let state = AppState {
        authority: Some(authority.clone()),
        ledger: Some(ledger.clone()),
        limits: args.rate.limits(),
        cluster: None,
        custody: kmn.map(florin_node::custody::view::CustodyView::new),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let served = crate::tls_args::serve_options(
            args.tls.plain_http,
            &args.tls.tls_names,
            &args.data.join(crate::tls_args::TLS_DIR),
            addr,
            true,
        )?;
        // `florin node backup` of this running devnet: a consistent copy over DIR/admin/sock.
        // Bound before "listening" is printed, so a backup right after finds it.
        let admin = match crate::node_cmd::bind_admin(&args.data) {
            Ok(l) => {
                let (dir, a, st) = (args.data.clone(), authority.clone(), store.clone());
                Some(tokio::spawn(async move {
                    if let Err(e) = crate::node_cmd::serve_admin(l, dir, a, st).await {
                        tracing::warn!("the admin socket stopped ({e:#}); `florin node backup` needs this devnet stopped");
                    }
                }))
            }
            Err(e) => {
                tracing::warn!("no admin socket ({e:#}); `florin node backup` needs this devnet stopped");
                None
            }
        };
        // Credits recorded before a crash but not confirmed: finish them now.
        for intent in authority.pending_credits()? {
            florin_node::settle_credit(&authority, &ledger, intent).await?;
        }
        let audits = spawn_audits(
            std::time::Duration::from_secs(args.audit_every),
            authority.clone(),
            ledger.clone(),
        );
        // One line for the set-up: a terminal reads it, a log pipeline gets its fields.
        let custody = if args.custody == Custody::Threshold {
            format!(
                "2-of-3 key-management network in {}",
                args.data.join("custody").display()
            )
        } else {
            "local keys".to_string()
        };
        let tls = match &served.ca_cert {
            Some(ca) => format!(
                "CA {}{} (clients: --ca-cert or FLORIN_CA_CERT)",
                ca.display(),
                if served.ca_created { ", made now" } else { "" }
            ),
            None => "off (plain HTTP)".to_string(),
        };
        tracing::info!(
            authority = %authority.public_key().to_address(),
            issuer = %ledger.issuer().to_address(),
            custody = %custody,
            operator = %operator.to_address(),
            operator_key = %operator_file.display(),
            data = %args.data.display(),
            tls = %tls,
            "florin devnet"
        );
        println!("listening on {}://{addr}", served.scheme);
        let options = args.rate.connections(served.options);
        serve_with(listener, state, options, shutdown_signal()).await?;
        if let Some(a) = admin {
            a.abort();
        }
        if let Some(a) = audits {
            a.abort();
        }
        let _ = std::fs::remove_dir_all(args.data.join(crate::node_cmd::ADMIN_DIR));
        tracing::info!("florin devnet stopped");
        Ok(ExitCode::SUCCESS)
    })
}

pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
