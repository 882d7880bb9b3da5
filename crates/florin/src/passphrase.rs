//! Wallet passphrases: from `FLORIN_WALLET_PASSPHRASE` in scripts, else asked on the terminal
//! without echo; never from the command line, where other users could read it.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;

use florin_wallet::PassphraseSource;
use zeroize::Zeroizing;

/// The environment variable scripts give a wallet's passphrase in.
pub const ENV: &str = "FLORIN_WALLET_PASSPHRASE";

fn from_env() -> Option<Zeroizing<String>> {
    std::env::var(ENV)
        .ok()
        .filter(|p| !p.is_empty())
        .map(Zeroizing::new)
}

fn terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

fn prompt(text: &str) -> Result<Zeroizing<String>, String> {
    rpassword::prompt_password(text)
        .map(Zeroizing::new)
        .map_err(|e| format!("reading the passphrase from the terminal: {e}"))
}

/// Where the wallet at `path` gets its passphrase when it turns out to be encrypted.
pub fn source(path: &Path) -> PassphraseSource {
    let label = path.display().to_string();
    Arc::new(move || {
        if let Some(p) = from_env() {
            return Ok(p);
        }
        if terminal() {
            return prompt(&format!("passphrase for {label}: "));
        }
        Err(format!(
            "set {ENV}, or run the command on a terminal to be asked for it"
        ))
    })
}

/// A passphrase for a new file: from the environment, or asked twice on a terminal. `None`
/// when neither is available.
pub fn new_passphrase(path: &Path) -> anyhow::Result<Option<Zeroizing<String>>> {
    if let Some(p) = from_env() {
        return Ok(Some(p));
    }
    ask_new(path)
}

/// A new passphrase asked twice on the terminal (never from the environment); `None` without
/// a terminal.
pub fn ask_new(path: &Path) -> anyhow::Result<Option<Zeroizing<String>>> {
    if !terminal() {
        return Ok(None);
    }
    let label = path.display();
    let first = prompt(&format!("new passphrase for {label}: ")).map_err(anyhow::Error::msg)?;
    if first.is_empty() {
        anyhow::bail!("an empty passphrase protects nothing; use --no-passphrase to mean it");
    }
    let again = prompt("the same passphrase again: ").map_err(anyhow::Error::msg)?;
    if *first != *again {
        anyhow::bail!("the two passphrases differ; nothing was written");
    }
    Ok(Some(first))
}

/// Backup words: from `file` (scripts), or typed on the terminal without echo.
pub fn read_words(file: Option<&Path>) -> anyhow::Result<florin_wallet::backup::Words> {
    let text =
        match file {
            Some(f) => Zeroizing::new(std::fs::read_to_string(f).map_err(|e| {
                anyhow::anyhow!("reading the backup words from {}: {e}", f.display())
            })?),
            None if terminal() => {
                prompt("backup words (12, separated by spaces): ").map_err(anyhow::Error::msg)?
            }
            None => anyhow::bail!(
            "no terminal to type the backup words on: give them in a file with --mnemonic-file \
             (never on the command line)"
        ),
        };
    Ok(florin_wallet::backup::Words::parse(&text)?)
}
