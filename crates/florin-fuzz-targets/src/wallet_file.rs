//! The wallet file loader (`florin_wallet::FileStore::load`) on fuzzer-made files.
//!
//! The first byte picks the mode. Raw: the rest is the file; whatever loads must save and load
//! again to the same content (the loader and the writer agree). Mutated: a valid wallet file (a
//! wallet with a key, an authority and offline tokens) is changed by fuzzer-chosen edits
//! (overwrite, insert, delete, truncate); a file that differs from the original in any byte
//! must be refused with a typed error (`Damaged` or `Corrupt`) and never load: the checksum
//! covers every byte, and a damaged checksum line must not pass for an old file. The second
//! bit of the first byte picks, for the mutated mode, the same wallet encrypted under a
//! passphrase (format 2): a change anywhere, in the envelope or the sealed wallet, must be
//! refused as damage before any key derivation, never read as a wrong passphrase.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_wallet::{FileStore, StoreError, Wallet, WalletStore};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::Input;

struct Fixture {
    path: PathBuf,
    valid: Vec<u8>,
    encrypted: Vec<u8>,
}

const PASSPHRASE: &str = "fuzz";

/// A wallet holding offline tokens, as its file.
pub fn sample_wallet_file() -> Vec<u8> {
    saved(&sample_wallet(), "sample.json")
}

fn sample_wallet() -> Wallet {
    let mut rng = StdRng::seed_from_u64(5);
    let authority = LocalSigner::new(SecretKey::from_seed(&[31; 32]));
    let mut w = Wallet::generate(&mut rng, Some(authority.public_key()));
    let handshake = [4u8; 32];
    let tokens: Vec<_> = [500u64, 200, 50]
        .into_iter()
        .enumerate()
        .filter_map(|(i, cents)| {
            let d = florin_token::Denomination::from_cents(cents)?;
            let serial = [i as u8 + 1; 8];
            florin_token::Token::mint(
                &authority,
                serial,
                d,
                [i as u8; 64],
                w.public_key(),
                handshake,
            )
            .ok()
        })
        .collect();
    let _ = w.accept_issued(tokens, &handshake, &mut rng);
    w
}

/// `wallet` as `FileStore::save` writes it, through a file called `name` in the fixture's
/// directory.
fn saved(w: &Wallet, name: &str) -> Vec<u8> {
    saved_with(w, name, None)
}

/// The sample wallet encrypted under [`PASSPHRASE`].
fn sample_encrypted_file() -> Vec<u8> {
    saved_with(&sample_wallet(), "sample-encrypted.json", Some(PASSPHRASE))
}

fn saved_with(w: &Wallet, name: &str, passphrase: Option<&str>) -> Vec<u8> {
    let path = fixture_dir().join(name);
    let store = FileStore::new(&path);
    if let Some(p) = passphrase {
        if let Err(e) = store.encrypt_with(p) {
            panic!("cannot derive a file key: {e}");
        }
    }
    if let Err(e) = store.save(w) {
        panic!("cannot save a wallet: {e}");
    }
    match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => panic!("cannot read a saved wallet: {e}"),
    }
}

fn fixture_dir() -> &'static std::path::Path {
    static D: OnceLock<tempfile::TempDir> = OnceLock::new();
    D.get_or_init(|| match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("no temporary directory: {e}"),
    })
    .path()
}

/// A saved wallet's content, for comparison: the JSON without its checksum and with the set
/// of seen proofs (saved in hash-set order) sorted.
fn normal(file: &[u8]) -> serde_json::Value {
    let mut v: serde_json::Value = match serde_json::from_slice(file) {
        Ok(v) => v,
        Err(e) => panic!("a saved wallet is not JSON: {e}"),
    };
    if let Some(o) = v.as_object_mut() {
        o.remove("checksum");
        if let Some(serde_json::Value::Array(a)) = o.get_mut("seen_proofs") {
            a.sort_by_key(|x| x.to_string());
        }
    }
    v
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| Fixture {
        path: fixture_dir().join("wallet.json"),
        valid: sample_wallet_file(),
        encrypted: sample_encrypted_file(),
    })
}

fn load(bytes: &[u8]) -> Result<Wallet, StoreError> {
    load_with(bytes, false)
}

/// Loads `bytes` as the wallet file; with `passphrase`, the store can open an encrypted file
/// (raw inputs get none: a file may ask for up to 1 GiB of KDF memory).
fn load_with(bytes: &[u8], passphrase: bool) -> Result<Wallet, StoreError> {
    let f = fixture();
    if let Err(e) = std::fs::write(&f.path, bytes) {
        panic!("cannot write the test file: {e}");
    }
    let store = FileStore::new(&f.path);
    if passphrase {
        let source: florin_wallet::PassphraseSource =
            std::sync::Arc::new(|| Ok(zeroize::Zeroizing::new(PASSPHRASE.to_string())));
        store.with_passphrase(source).load()
    } else {
        store.load()
    }
}

/// The target.
pub fn wallet_file(data: &[u8]) {
    // One file set per process: calls from several threads (the replay tests) take turns.
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut input = Input::new(data);
    let mode = input.u8();
    if mode & 1 == 0 {
        if let Ok(w) = load(input.rest()) {
            let once = saved(&w, "once.json");
            match load(&once) {
                Ok(again) => assert!(
                    normal(&saved(&again, "again.json")) == normal(&once),
                    "a loaded wallet does not save and load to the same file"
                ),
                Err(e) => panic!("a saved wallet does not load: {e}"),
            }
        }
        return;
    }
    let f = fixture();
    let encrypted = mode & 2 != 0;
    let original = if encrypted { &f.encrypted } else { &f.valid };
    let mut file = original.clone();
    let edits = 1 + input.below(4);
    for _ in 0..edits {
        let op = input.u8() % 4;
        let at = input.below(file.len() + 1);
        let b = input.u8();
        match op {
            0 if at < file.len() => file[at] = b,
            0 | 1 => file.insert(at.min(file.len()), b),
            2 if at < file.len() => {
                file.remove(at);
            }
            _ => file.truncate(at),
        }
    }
    match load_with(&file, encrypted) {
        Ok(_) if file == *original => {}
        Ok(_) => panic!(
            "a damaged wallet file loaded ({} bytes, first difference at byte {:?})",
            file.len(),
            file.iter().zip(original).position(|(a, b)| a != b)
        ),
        Err(StoreError::Damaged { .. } | StoreError::Corrupt { .. }) => {
            assert!(file != *original, "the valid wallet file was refused");
        }
        Err(e) => panic!("a damaged wallet file got an untyped refusal: {e}"),
    }
}
