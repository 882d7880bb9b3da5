//! A coverage-blind mutation fuzzer on stable Rust, for machines without the nightly toolchain
//! or cargo-fuzz: `florin-fuzz-mutate TARGET ITERATIONS [SEED]` mutates the target's seeds
//! and kept corpus (`fuzz/corpus/TARGET/`) at random (bit flips, byte changes, inserts,
//! deletes, splices) and runs each result through the target. An input that panics is written
//! to `fuzz/artifacts/TARGET/mutate-crash-<n>` and the program exits 1. libFuzzer
//! (`scripts/fuzz.sh`) finds far more; this is a quick smoke check.
#![allow(clippy::print_stderr)] // a command-line tool for fuzzing: its output is for a person

use std::path::PathBuf;
use std::process::ExitCode;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn mutate(rng: &mut StdRng, pool: &[Vec<u8>], mut b: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.gen_range(1..6) {
        match rng.gen_range(0..6) {
            0 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                b[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                b[i] = [0, 1, 0x7f, 0x80, 0xff][rng.gen_range(0..5)];
            }
            2 => {
                let i = rng.gen_range(0..=b.len());
                b.insert(i, rng.gen());
            }
            3 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                let n = rng.gen_range(1..=(b.len() - i).min(16));
                b.drain(i..i + n);
            }
            4 if !pool.is_empty() => {
                let other = &pool[rng.gen_range(0..pool.len())];
                if !other.is_empty() {
                    let from = rng.gen_range(0..other.len());
                    let to = rng.gen_range(from..=other.len());
                    let at = rng.gen_range(0..=b.len());
                    b.splice(at..at, other[from..to].iter().copied());
                }
            }
            _ => {
                let at = rng.gen_range(0..=b.len());
                b.truncate(at);
            }
        }
    }
    b
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(name), Some(iters)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: florin-fuzz-mutate TARGET ITERATIONS [SEED]");
        return ExitCode::from(2);
    };
    let seed = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let Some(target) = florin_fuzz_targets::target(name) else {
        eprintln!("no target {name}");
        return ExitCode::from(2);
    };
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut pool: Vec<Vec<u8>> = florin_fuzz_targets::seeds::seeds()
        .into_iter()
        .filter(|(n, _)| n == name)
        .flat_map(|(_, s)| s)
        .collect();
    if let Ok(rd) = std::fs::read_dir(fuzz.join("corpus").join(name)) {
        pool.extend(
            rd.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path()).ok()),
        );
    }
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..iters {
        let base = pool[rng.gen_range(0..pool.len())].clone();
        let input = mutate(&mut rng, &pool, base);
        if std::panic::catch_unwind(|| target(&input)).is_err() {
            let _ = std::panic::take_hook();
            let dir = fuzz.join("artifacts").join(name);
            let path = dir.join(format!("mutate-crash-{seed}-{i}"));
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(&path, &input);
            // Run it again with the default hook, to show the panic message.
            let _ = std::panic::catch_unwind(|| target(&input));
            eprintln!("{name}: crash after {i} inputs, kept at {}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!("{name}: {iters} inputs, no crash");
    ExitCode::SUCCESS
}
