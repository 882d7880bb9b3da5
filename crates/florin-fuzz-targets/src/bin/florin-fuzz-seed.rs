//! Writes the seed inputs of every fuzz target: `florin-fuzz-seed DIR` creates
//! `DIR/<target>/seed-<n>` (existing files are overwritten, nothing else is touched).
#![allow(clippy::print_stderr)] // a command-line tool for fuzzing: its output is for a person

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: florin-fuzz-seed DIR");
        return ExitCode::from(2);
    };
    for (target, seeds) in florin_fuzz_targets::seeds::seeds() {
        let d = dir.join(target);
        if let Err(e) = std::fs::create_dir_all(&d) {
            eprintln!("{}: {e}", d.display());
            return ExitCode::FAILURE;
        }
        for (i, s) in seeds.iter().enumerate() {
            let p = d.join(format!("seed-{i}"));
            if let Err(e) = std::fs::write(&p, s) {
                eprintln!("{}: {e}", p.display());
                return ExitCode::FAILURE;
            }
        }
        println!("{target}: {} seeds", seeds.len());
    }
    ExitCode::SUCCESS
}
