#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, then checks
# formatting, lints and runs every test. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

# System packages the suite uses. PostgreSQL is installed (if missing) and started below;
# iproute2 gives the emulated hosts their namespaces; libsodium is the peer baseline of
# `florin bench offline`
# (loaded at run time; the bench smoke test runs with or without it).
need=()
ldconfig -p 2>/dev/null | grep -q 'libsodium\.so' || need+=(libsodium23)
# `ip` (iproute2): emulated hosts (network namespaces) for the cluster test on emulated hosts.
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# Python with venv: schemathesis (from PyPI) checks the API contract (scripts/api-contract.sh).
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3 python3-venv)
# A real browser for the console's tests (scripts/browser-test.sh): Debian's Chromium, driven
# by playwright-core from npm.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
if [ ${#need[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    log "installing ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null) \
      || echo "warning: could not install ${need[*]}; continuing without it"
  else
    echo "note: ${need[*]} not installed (needs root and apt-get); continuing without it"
  fi
fi

# A private PostgreSQL on loopback for the PostgreSQL store's suite.
. scripts/pg-test-server.sh
log "starting PostgreSQL for the tests"
start_test_postgres
trap stop_test_postgres EXIT

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "supply chain: cargo deny (docs/supply-chain.md)"
scripts/deny.sh

log "layering rules (docs/architecture.md)"
scripts/check-layering.sh

# Free space where the build and the tests' temporary files go: a full disk fails every test
# that writes, whatever the change under test.
disk() {
  for d in "${CARGO_TARGET_DIR:-target}" "${TMPDIR:-/tmp}"; do
    df -Ph "$d" 2>/dev/null | awk -v d="$d" 'NR==2 {print "disk: " $4 " free of " $2 " for " d}'
  done
}

log "cargo test"
# The fuzz replay test (crates/florin-fuzz-targets/tests/replay.rs) leaves its counts here.
fuzz_summary=${CARGO_TARGET_DIR:-target}/tmp/fuzz-replay.txt
rm -f "$fuzz_summary"
disk
status=0
cargo test --workspace --locked 2>&1 | tee /tmp/florin-test.log || status=$?
passed=$( (grep -E '^test result: ' /tmp/florin-test.log || true) | awk '{s+=$4} END {print s+0}')
failed=$( (grep -E '^test result: ' /tmp/florin-test.log || true) | awk '{s+=$6} END {print s+0}')
echo
echo "summary: ${passed} passed, ${failed} failed"
disk
if [ "$status" -ne 0 ]; then
  # Cargo stops at the first test binary that fails: the first lines of its panics.
  log "failed (exit $status): each panic's first lines (the whole log: /tmp/florin-test.log)"
  grep -E -A4 "panicked at" /tmp/florin-test.log | cut -c1-400 | head -120 || true
  exit "$status"
fi
log "API contract: schemathesis against a devnet (scripts/api-contract.sh)"
scripts/api-contract.sh 90

log "browser tests: the console and the API view in Chromium (scripts/browser-test.sh)"
scripts/browser-test.sh

if [ -s "$fuzz_summary" ]; then
  echo "fuzz corpora: replayed ($(tail -1 "$fuzz_summary" | sed 's/^fuzz replay: //'); per target in $fuzz_summary)"
else
  echo "fuzz corpora: NOT replayed (the replay test did not run or failed; see /tmp/florin-test.log)"
fi
