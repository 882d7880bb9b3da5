//! Replays the kept fuzz inputs on stable Rust: every file of `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/`, and the generated seeds, through the target's function. A
//! target that panics on any of them fails the test (the file is named). Every target must
//! have its corpus directory. Prints, per target, how many inputs it replayed (seen with
//! `--nocapture`), and writes the same lines to `target/tmp/fuzz-replay.txt`, whose last line
//! (`fuzz replay: N inputs over T targets`) `scripts/test.sh` reports.

use std::path::{Path, PathBuf};

use florin_fuzz_targets::{seeds::seeds, target, TARGETS};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

fn run(name: &str, input: &[u8], what: &str) {
    let Some(t) = target(name) else {
        panic!("no target {name}");
    };
    if std::panic::catch_unwind(|| t(input)).is_err() {
        panic!("fuzz target {name} fails on {what} ({} bytes)", input.len());
    }
}

#[test]
fn replay_corpora_and_regressions() {
    let root = fuzz_dir();
    let summary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-replay.txt");
    let _ = std::fs::remove_file(&summary);
    let mut lines: Vec<String> = Vec::new();
    let mut missing = Vec::new();
    let mut total = 0;
    for (name, _) in TARGETS {
        let corpus = root.join("corpus").join(name);
        if !corpus.is_dir() {
            missing.push(*name);
            continue;
        }
        let mut n = 0;
        for dir in [corpus, root.join("regressions").join(name)] {
            for f in files(&dir) {
                let bytes = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                run(name, &bytes, &f.display().to_string());
                n += 1;
            }
        }
        lines.push(format!("fuzz replay: {name}: {n} inputs"));
        total += n;
    }
    assert!(
        missing.is_empty(),
        "fuzz corpus directories missing for {missing:?}"
    );
    lines.push(format!(
        "fuzz replay: {total} inputs over {} targets",
        TARGETS.len()
    ));
    for l in &lines {
        println!("{l}");
    }
    if let Err(e) = std::fs::write(&summary, lines.join("\n") + "\n") {
        panic!("{}: {e}", summary.display());
    }
}

#[test]
fn seeds_cover_every_target_and_pass() {
    let s = seeds();
    for (name, _) in TARGETS {
        let Some((_, inputs)) = s.iter().find(|(n, _)| n == name) else {
            panic!("no seeds for {name}");
        };
        assert!(!inputs.is_empty(), "no seeds for {name}");
        for (i, input) in inputs.iter().enumerate() {
            run(name, input, &format!("seed {i}"));
        }
    }
}
