//! `florin`: run a devnet, use a wallet, inspect fraud, run benchmarks.

mod bench;
mod client;
mod devnet;
mod fraud_cmd;
mod util;
mod wallet_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "florin",
    version,
    about = "Florin: digital cash, online and offline"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a single-node development network: the token authority with embedded storage.
    Devnet(devnet::DevnetArgs),
    /// Use a wallet.
    Wallet(wallet_cmd::WalletArgs),
    /// Inspect and verify fraud proofs.
    Fraud {
        #[command(subcommand)]
        command: fraud_cmd::FraudCommand,
    },
    /// Run a benchmark suite (see docs/benchmarks.md).
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devnet(a) => devnet::run(a),
        Command::Wallet(a) => wallet_cmd::run(a),
        Command::Fraud { command } => fraud_cmd::run(command),
        Command::Bench(a) => bench::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One clear line.
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Default data directory of the devnet.
pub fn default_data_dir() -> PathBuf {
    PathBuf::from("./florin-data")
}
