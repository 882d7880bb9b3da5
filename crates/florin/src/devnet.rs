//! `florin devnet`: the token authority and the ledger (sentinel, embedded swap engine,
//! issuer) with embedded storage, one process, no set-up.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use florin_crypto::LocalSigner;
use florin_ledger::embedded::{EmbeddedConfig, EmbeddedStore};
use florin_node::{load_or_create_key, serve, AppState, Authority, AuthorityConfig, Ledger};

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
}

/// Runs the devnet until interrupted.
pub fn run(args: DevnetArgs) -> Result<ExitCode> {
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("cannot create data directory {}", args.data.display()))?;
    let key = load_or_create_key(&args.data.join("authority.key"))?;
    let signer = Arc::new(LocalSigner::new(key));
    let mut config = AuthorityConfig::devnet(&args.data);
    config.max_faucet_cents = florin_token::amount::parse_euros(&args.max_faucet)?;
    let authority = Arc::new(Authority::open(config, signer)?);
    // The ledger: the embedded durable swap store and the issuer's key.
    let store = EmbeddedStore::open(EmbeddedConfig::new(args.data.join("ledger")))
        .with_context(|| format!("cannot open the ledger in {}", args.data.display()))?;
    let issuer = Arc::new(LocalSigner::new(load_or_create_key(
        &args.data.join("issuer.key"),
    )?));
    let ledger = Ledger::start(Arc::new(store), issuer);
    let state = AppState {
        authority: authority.clone(),
        ledger: Some(ledger.clone()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        // Credits recorded before a crash but not confirmed: finish them now.
        for intent in authority.pending_credits()? {
            florin_node::settle_credit(&authority, &ledger, intent).await?;
        }
        eprintln!("florin devnet");
        eprintln!("  authority  {}", authority.public_key().to_address());
        eprintln!("  issuer     {}", ledger.issuer().to_address());
        eprintln!("  data       {}", args.data.display());
        println!("listening on http://{addr}");
        serve(listener, state, shutdown_signal()).await?;
        eprintln!("florin devnet stopped");
        Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
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
