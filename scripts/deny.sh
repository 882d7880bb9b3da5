#!/usr/bin/env bash
# The supply-chain check (docs/supply-chain.md): licences, duplicate versions, wildcard and
# unknown sources with cargo-deny and deny.toml's explained allow-list, then the RustSec
# advisories when their database can be fetched (or is already on this machine).
# Usage: scripts/deny.sh     (installs cargo-deny from crates.io when it is missing)
set -euo pipefail
cd "$(dirname "$0")/.."

DENY_VERSION="0.20.2"
if ! cargo deny --version 2>/dev/null | grep -q "$DENY_VERSION"; then
  echo "installing cargo-deny $DENY_VERSION from crates.io (a few minutes, once)"
  cargo install cargo-deny --locked --version "$DENY_VERSION" --quiet
fi

# cargo-deny reads `cargo metadata`, which needs every package of Cargo.lock on this machine,
# those of other platforms too (a build fetches only this one's): fetch them from crates.io.
timeout 600 cargo fetch --locked >/dev/null 2>&1 \
  || echo "warning: cargo fetch failed; cargo deny below needs every locked package present"

# Licences, bans (duplicates, wildcards) and sources need nothing but Cargo.lock.
cargo deny --offline --locked check licenses bans sources

# Advisories need the RustSec database (a git repository on github.com). Fetch it when the
# network allows; use the copy already on this machine otherwise; say plainly when there is none.
db_dir="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
timeout 120 cargo deny fetch db >/dev/null 2>&1 || true
if compgen -G "$db_dir/advisory-db-*" >/dev/null; then
  db=$(ls -d "$db_dir"/advisory-db-* | head -1)
  when=$(git -C "$db" show -s --format=%ct HEAD 2>/dev/null || echo 0)
  age_days=$(( ($(date +%s) - when) / 86400 ))
  echo "advisories: RustSec database of $(date -u -d "@$when" +%F) ($age_days days old)"
  if [ "$age_days" -gt 30 ]; then
    echo "  warning: the database is over 30 days old (github.com unreachable?); newer advisories are not checked"
  fi
  cargo deny --offline --locked check advisories
else
  echo "advisories: NOT CHECKED: the RustSec database (github.com/rustsec/advisory-db) cannot"
  echo "  be fetched from this machine and no copy is present; run scripts/deny.sh where it can."
fi
