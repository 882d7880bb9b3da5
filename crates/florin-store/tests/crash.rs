//! Crash consistency of the embedded store: a child process applies batches and prints each
//! acknowledgement; the parent `kill -9`s it mid-run (logs and snapshots rolling), reopens the
//! store and checks that every acknowledged transaction is there and the books add up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use florin_ledger::store::testing::{mint, transfer};
use florin_ledger::SwapStore;
use florin_store::embedded::{EmbeddedConfig, EmbeddedStore};

const CHILD_ENV: &str = "FLORIN_CRASH_CHILD_DIR";

fn config(dir: &str) -> EmbeddedConfig {
    // Small snapshot threshold so the kill can land during a snapshot too.
    EmbeddedConfig {
        snapshot_after_bytes: 64 << 10,
        ..EmbeddedConfig::new(dir)
    }
}

/// Batch `n`: mint two outputs, and spend the previous batch's outputs.
fn batch(n: u64) -> Vec<florin_ledger::CompactTx> {
    let mut b = vec![mint(n, &[(n * 10, 7), (n * 10 + 1, 3)])];
    if n > 0 {
        b.push(transfer(
            n,
            &[(n - 1) * 10, (n - 1) * 10 + 1],
            &[(n * 10 + 2, 10)],
        ));
    }
    b
}

/// The child: runs only when spawned by the parent below.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = EmbeddedStore::open(config(&dir)).unwrap();
    let out = std::io::stdout();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0u64;
    while Instant::now() < deadline && n < 1_000_000 {
        store.swap(&batch(n)).unwrap();
        let mut o = out.lock();
        writeln!(o, "ack {n}").unwrap();
        o.flush().unwrap();
        n += 1;
    }
}

#[test]
fn acknowledged_batches_survive_kill_9() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for round in 0..3 {
        let mut child = Command::new(&exe)
            .args([
                "crash_child_writer",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut acked = None;
        let reader = BufReader::new(child.stdout.take().unwrap());
        for line in reader.lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("ack ") {
                acked = Some(n.trim().parse::<u64>().unwrap());
                if acked >= Some(300 + round * 97) {
                    child.kill().unwrap(); // SIGKILL
                    break;
                }
            }
        }
        let _ = child.wait();
        let last = acked.expect("the child acknowledged batches");
        let store = EmbeddedStore::open(config(dir.path().to_str().unwrap())).unwrap();
        for n in 0..=last {
            for tx in batch(n) {
                assert!(
                    store.is_confirmed(&tx.txid).unwrap(),
                    "round {round}: acknowledged batch {n} lost"
                );
            }
        }
        let s = store.supply().unwrap();
        assert_eq!(
            s.unspent_cents,
            s.minted_cents - s.redeemed_cents,
            "books add up"
        );
        // Every round restarts the child from batch 0: the replays change nothing.
    }
}
