//! `florin`: run a devnet, use a wallet, inspect fraud, run benchmarks.

mod admin_cmd;
mod cluster_cmd;
mod custody_cmd;
mod devnet;
mod fraud_cmd;
mod node_cmd;
mod offline_cmd;
mod passphrase;
mod progress;
mod psp_cmd;
mod tls_args;
mod util;
mod wallet_cmd;
mod wallet_serve;

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
    /// The operator's key file, for privileged requests (`florin admin`, a faucet outside the
    /// devnet); the devnet and `cluster up` write DATA/operator.key.
    #[arg(long, global = true, env = "FLORIN_OPERATOR_KEY", value_name = "FILE")]
    operator_key: Option<PathBuf>,
    /// A CA certificate (PEM; a file may hold several) trusted for `https://` servers besides
    /// the system's roots, e.g. a devnet's `DATA/tls/ca.pem`.
    #[arg(long, global = true, env = "FLORIN_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// How log lines on standard error look: `auto` (human, coloured on a terminal), `human`, or
    /// `json` (one object per line). `RUST_LOG` filters them (e.g. `warn`,
    /// `info,florin::access=off`).
    #[arg(
        long,
        global = true,
        env = "FLORIN_LOG_FORMAT",
        value_name = "FORMAT",
        default_value = "auto"
    )]
    log_format: florin_obs::log::Format,
    #[command(subcommand)]
    command: Command,
}

impl Command {
    /// Servers log time, level and request ids; commands print plain lines.
    fn log_style(&self) -> florin_obs::log::Style {
        use florin_obs::log::Style;
        match self {
            Command::Devnet(_) => Style::Server,
            Command::Node(a) if a.runs_a_process() => Style::Server,
            Command::Psp {
                command: psp_cmd::PspCommand::Serve { .. },
            }
            | Command::Custody {
                command: custody_cmd::CustodyCommand::Node { .. },
            } => Style::Server,
            _ => Style::Command,
        }
    }

    /// Added to the default log filter: a benchmark's in-process nodes answer thousands of
    /// requests, whose access lines would drown its progress.
    fn log_directives(&self) -> &'static str {
        match self {
            Command::Bench(_) => "florin::access=warn",
            _ => "",
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a single-node development network: the token authority with embedded storage.
    Devnet(devnet::DevnetArgs),
    /// Use a wallet.
    Wallet(wallet_cmd::WalletArgs),
    /// Run a key-management network: threshold keys for the issuer, the authority and
    /// custodial wallets.
    Custody {
        #[command(subcommand)]
        command: custody_cmd::CustodyCommand,
    },
    /// Run a payment service provider with custodial wallets on threshold keys, and use it.
    Psp {
        #[command(subcommand)]
        command: psp_cmd::PspCommand,
    },
    /// Inspect and verify fraud proofs.
    Fraud {
        #[command(subcommand)]
        command: fraud_cmd::FraudCommand,
    },
    /// Run one cluster process (shard replica, coordinator replica or sentinel) from its
    /// config; or check, back up and restore a node's data directory.
    Node(cluster_cmd::NodeArgs),
    /// Run a sharded, replicated ledger on this machine: up, status, kill, down.
    Cluster {
        #[command(subcommand)]
        command: cluster_cmd::ClusterCommand,
    },
    /// Operator actions on a node (signed with --operator-key): blacklist tokens, revoke
    /// wallet keys, list them and the audit trail.
    Admin(admin_cmd::AdminArgs),
    /// Run a benchmark suite (see docs/benchmarks.md).
    Bench(florin_bench::BenchArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on standard
    /// output, e.g. `florin completions bash > /etc/bash_completion.d/florin`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the manual pages (`florin.1` and one per command, `florin-wallet-pay.1`, ...)
    /// into a directory, e.g. `florin man --out /usr/local/share/man/man1`.
    Man {
        /// Where to write them (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Check the books: minted − redeemed = ledger money + tokens outstanding.
    Audit {
        /// The node's API.
        #[arg(long, env = "FLORIN_NODE", default_value = "https://127.0.0.1:7400")]
        node: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `florin … | head` closes standard output early. Rust's printing then panics; end quietly
/// instead, with the status a shell gives a program killed by SIGPIPE (141), as other tools do.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to std") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        // The lines before a crash are the ones that explain it.
        florin_obs::log::flush();
        default(info);
    }));
}

/// The one line a failed command ends with, `error: …` on standard error whatever the log
/// format (scripts and tests read it; logging may not be set up when it is said).
#[allow(clippy::print_stderr)]
fn say_error(msg: &str) {
    // After what was logged before it.
    florin_obs::log::flush();
    eprintln!("error: {msg}");
}

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    // Every command takes `--json`; a failing one then also prints the API's error envelope.
    // Read from the parsed command line (an argument *value* spelled `--json` does not count);
    // only a line that does not parse is judged by its raw words.
    let matches = match <Cli as clap::CommandFactory>::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let json = std::env::args().skip(1).any(|a| a == "--json");
            return usage_error(e, json);
        }
    };
    let json = json_flag(&matches);
    progress::set_quiet(json);
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, json),
    };
    // The children `cluster up` and `custody up` start log as their parent does.
    std::env::set_var("FLORIN_LOG_FORMAT", cli.log_format.to_string());
    if let Err(e) = florin_obs::log::init(
        cli.log_format,
        cli.command.log_style(),
        cli.command.log_directives(),
    ) {
        say_error(&e.to_string());
        return ExitCode::FAILURE;
    }
    let code = run(cli, json);
    // A server's last info lines are still gathered: out before the process ends.
    florin_obs::log::flush();
    code
}

/// Whether `--json` was given to the command or any of its subcommands.
fn json_flag(m: &clap::ArgMatches) -> bool {
    m.try_get_one::<bool>("json")
        .ok()
        .flatten()
        .copied()
        .unwrap_or(false)
        || m.subcommand().is_some_and(|(_, sub)| json_flag(sub))
}

fn run(cli: Cli, json: bool) -> ExitCode {
    util::set_operator_key(cli.operator_key);
    let trust = util::Trust::new(cli.ca_cert);
    let result = match cli.command {
        Command::Admin(a) => admin_cmd::run(a, &trust),
        Command::Devnet(a) => devnet::run(a),
        Command::Wallet(a) => wallet_cmd::run(a, &trust),
        Command::Fraud { command } => fraud_cmd::run(command, &trust),
        Command::Custody { command } => custody_cmd::run(command),
        Command::Psp { command } => psp_cmd::run(command, &trust),
        Command::Bench(a) => florin_bench::run(a),
        Command::Node(a) => cluster_cmd::run_node(a),
        Command::Cluster { command } => cluster_cmd::run(command),
        Command::Audit { node, json } => audit(&node, &trust, json),
        Command::Completions { shell } => completions(shell),
        Command::Man { out } => man_pages(&out),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One clear line.
            let mut msg = format!("{e:#}").replace('\n', " ");
            if msg.contains("invalid peer certificate") {
                msg.push_str(
                    " (the server's certificate is not trusted: give its CA with --ca-cert FILE or FLORIN_CA_CERT, e.g. a devnet's DATA/tls/ca.pem)",
                );
            }
            say_error(&msg);
            if json && !util::has_printed_json() {
                // The same envelope the node and the providers answer with, on standard output
                // (unless the command printed its JSON result already).
                let envelope = florin_node::api::ApiError::new(error_code(&e), msg);
                println!("{}", serde_json::to_string(&envelope).unwrap_or_default());
            }
            ExitCode::FAILURE
        }
    }
}

/// A command line clap refused (or `--help`, `--version`): clap's own text as usual, and under
/// `--json` also the error envelope every failed command prints, with code `usage`.
fn usage_error(e: clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    let informational = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if json && !informational {
        // Clap's first paragraph on one line, without its `error: ` prefix.
        let text = e.render().to_string();
        let msg = text
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
        let envelope = florin_node::api::ApiError::new("usage", msg);
        println!("{}", serde_json::to_string(&envelope).unwrap_or_default());
    }
    // Prints to stderr (stdout for help and version) and gives clap's exit code (2, or 0).
    let code = e.exit_code();
    let _ = e.print();
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}

/// Prints `shell`'s completion script (built in memory: a reader that stops early, `| head`,
/// ends the command quietly as for every other output).
fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "florin", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::from(141)),
        other => {
            other?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Writes `florin.1` and a page per command and subcommand (`florin-cluster-up.1`) into `dir`.
fn man_pages(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    // After `build`, each subcommand's display name is its path (`florin-cluster-up`) and its
    // binary name what a user types (`florin cluster up`).
    fn write(cmd: &clap::Command, dir: &std::path::Path, n: &mut usize) -> anyhow::Result<()> {
        let name = cmd.get_display_name().unwrap_or(cmd.get_name());
        let path = dir.join(format!("{name}.1"));
        let mut file = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        clap_mangen::Man::new(cmd.clone())
            .render(&mut file)
            .with_context(|| format!("cannot write {}", path.display()))?;
        *n += 1;
        // `help` (clap's own subcommand) gets no pages: `--help` is on every page.
        for sub in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            write(sub, dir, n)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let mut n = 0;
    write(&cmd, dir, &mut n)?;
    println!("wrote {n} manual pages in {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

/// The stable code of a failed command: the server's when a node or a provider refused
/// (`bad_request`, `quota`, `rate_limited`, ...), `unreachable` when it could not be reached,
/// else `failed`.
fn error_code(e: &anyhow::Error) -> String {
    use florin_http::{client, psp_client};
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<client::ClientError>() {
            return match c {
                client::ClientError::Refused { code, .. } => code.clone(),
                _ => "unreachable".into(),
            };
        }
        if let Some(c) = cause.downcast_ref::<psp_client::ClientError>() {
            return match c {
                psp_client::ClientError::Refused { code, .. } => code.clone(),
                psp_client::ClientError::Unreachable { .. } => "unreachable".into(),
                _ => "failed".into(),
            };
        }
        if let Some(c) = cause.downcast_ref::<florin_wallet::ConnectorError>() {
            return connector_code(c);
        }
        if let Some(s) = cause.downcast_ref::<florin_wallet::StoreError>() {
            use florin_wallet::StoreError as S;
            let code = match s {
                S::WrongPassphrase { .. } => "wrong_passphrase",
                S::Locked { .. } => "passphrase_needed",
                S::Moved { .. } => "wallet_moved",
                S::Damaged { .. } | S::Corrupt { .. } => "wallet_damaged",
                S::Exists(_) => "exists",
                S::NotFound(_) => "not_found",
                _ => continue,
            };
            return code.into();
        }
        if cause
            .downcast_ref::<florin_wallet::backup::BackupError>()
            .is_some()
        {
            return "bad_backup_words".into();
        }
        if cause
            .downcast_ref::<wallet_serve::UnknownOperation>()
            .is_some()
        {
            return "unknown_operation".into();
        }
        // A flow's node error is transparent: its source skips the connector error itself.
        if let Some(f) = cause.downcast_ref::<florin_wallet::FlowError>() {
            use florin_wallet::FlowError as F;
            match f {
                F::Node(c)
                | F::SubmitUnanswered(c)
                | F::DepositUnanswered(c)
                | F::NoAuthority(c) => return connector_code(c),
                _ => {}
            }
        }
    }
    "failed".into()
}

fn connector_code(c: &florin_wallet::ConnectorError) -> String {
    match c {
        florin_wallet::ConnectorError::Refused { code, .. } => code.clone(),
        florin_wallet::ConnectorError::Unreachable { .. } => "unreachable".into(),
        _ => "failed".into(),
    }
}

fn audit(node: &str, trust: &util::Trust, json: bool) -> anyhow::Result<ExitCode> {
    let client = trust.node(node)?;
    let a = util::runtime()?.block_on(client.audit())?;
    let balanced = a["balanced"].as_bool().unwrap_or(false);
    if json {
        util::print_json(&a);
    } else {
        let c = |k: &str| florin_token::amount::format_cents(a[k].as_u64().unwrap_or(0));
        println!("minted               €{}", c("minted_cents"));
        println!("redeemed             €{}", c("redeemed_cents"));
        println!("ledger supply        €{}", c("ledger_supply_cents"));
        println!("  authority reserve  €{}", c("reserve_cents"));
        println!("  held by users      €{}", c("ledger_circulating_cents"));
        println!("tokens outstanding   €{}", c("tokens_outstanding_cents"));
        println!(
            "{}",
            if balanced {
                "balanced: minted − redeemed = ledger money + tokens outstanding"
            } else {
                "NOT BALANCED"
            }
        );
    }
    Ok(if balanced {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Default data directory of the devnet.
pub fn default_data_dir() -> PathBuf {
    PathBuf::from("./florin-data")
}
