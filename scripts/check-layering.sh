#!/usr/bin/env bash
# The layering rules of docs/architecture.md, checked on the dependency graph (normal edges,
# so test-only dev-dependencies do not count). Usage: scripts/check-layering.sh
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
# forbid CRATE PATTERN WHY: CRATE's normal dependency tree must not contain PATTERN.
forbid() {
  local crate=$1 pattern=$2 why=$3 found
  found=$(cargo tree --locked --offline -q -e normal -p "$crate" --prefix none --format '{p}' 2>/dev/null \
    | awk '{print $1}' | sort -u | grep -Ex "$pattern" || true)
  if [ -n "$found" ]; then
    echo "layering: $crate depends on $(echo "$found" | tr '\n' ' ')— $why"
    fail=1
  fi
}

io='tokio|postgres|redb|axum|hyper|reqwest|openraft|snow|socket2'
for c in florin-crypto florin-token florin-ledger florin-custody; do
  forbid "$c" "$io" "protocol crates do no I/O"
done
forbid florin-wallet 'postgres|redb|axum|hyper|reqwest|openraft' \
  "a wallet links no database driver and no HTTP stack (connectors are implemented outside)"
forbid florin-node 'axum|hyper|reqwest' "services take typed values; HTTP lives in florin-http"
forbid florin-store "axum|hyper|reqwest" "stores are storage only (the PostgreSQL driver brings its own tokio)"
forbid florin-obs "$io" "observability is a library of counters and log set-up; the HTTP surface serves it"

# The fuzz targets crate may use everything; nothing may use it.
users=$(cargo tree --locked --offline -q -e normal,build,dev -i florin-fuzz-targets --prefix none \
  --format '{p}' 2>/dev/null | awk '{print $1}' | sort -u | grep -vx florin-fuzz-targets || true)
if [ -n "$users" ]; then
  echo "layering: $(echo "$users" | tr '\n' ' ')depends on florin-fuzz-targets — nothing may"
  fail=1
fi

if [ "$fail" = 0 ]; then
  echo "layering: ok"
fi
exit "$fail"
