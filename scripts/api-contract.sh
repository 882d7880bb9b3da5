#!/usr/bin/env bash
# The API contract checked by a real client: schemathesis (from PyPI) generates requests from
# the devnet's own /openapi.json and sends them to a running devnet for a bounded time. It
# passes with zero server errors and zero answers that break the schema (status codes,
# content types, headers, bodies), and no request the schema forbids accepted.
#
# Usage: scripts/api-contract.sh [SECONDS]   (default 90; uses target/debug/florin, building
# it if missing). The venv lives in target/schemathesis-venv; reports in target/api-contract/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-90}
target=${CARGO_TARGET_DIR:-target}
venv=$target/schemathesis-venv
out=$target/api-contract
# Pinned: a new release may add checks; upgrade on purpose.
version=4.32.5

if [ ! -x "$venv/bin/st" ] || ! "$venv/bin/st" --version 2>/dev/null | grep -q "$version"; then
  echo "installing schemathesis $version into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$version"
fi
# Up to date with the tree (a no-op after `cargo test`, which builds it for its tests).
cargo build -q --locked -p florin

rm -rf "$out"
mkdir -p "$out"
data=$(mktemp -d)
port_file=$out/devnet.out
# Plain HTTP on loopback, rate limits off: the client sends thousands of requests a minute and
# must see the API's answers, not 429s.
RUST_LOG=info "$target/debug/florin" devnet --data "$data" --listen 127.0.0.1:0 --plain-http \
  --rate-per-ip 0 --rate-burst-ip 0 --rate-per-key 0 --rate-burst-key 0 \
  --tx-rate-per-ip 0 --tx-burst-ip 0 --new-conns-per-ip 0 --audit-every 0 \
  >"$port_file" 2>"$out/devnet.log" &
devnet=$!
cleanup() {
  kill "$devnet" 2>/dev/null || true
  wait "$devnet" 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT

url=
for _ in $(seq 1 300); do
  url=$(sed -n 's/^listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$port_file" | head -1)
  [ -n "$url" ] && break
  kill -0 "$devnet" 2>/dev/null || { echo "the devnet exited:"; tail -20 "$out/devnet.log"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "the devnet did not start in 30 s"; tail -20 "$out/devnet.log"; exit 1; }

# Every check but `positive_data_acceptance`: that one expects any request the schema allows
# to succeed, and no schema can say which bytes are a validly signed transaction or token, so
# a random 64-hex txid or transaction is rightly refused (400). Negative data (what the schema
# forbids) must still be refused.
# Run in $out: schemathesis keeps its cache (.schemathesis/) where it runs.
status=0
st=$(realpath "$venv/bin/st")
# A body larger than a route takes is refused with 413 before it is read: that is a rejection
# too (schemathesis's default list for negative_data_rejection lacks 413, so a large invalid
# body it sends to a small-limit route would otherwise count as "accepted").
cat >"$out/schemathesis.toml" <<'TOML'
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
TOML
(cd "$out" && "$st" --config-file schemathesis.toml run "$url/openapi.json" \
  --phases examples,coverage,fuzzing --max-examples 25 --workers 1 --max-time "$seconds" \
  --exclude-checks positive_data_acceptance \
  --report junit --report-dir . \
  --output-truncate true >schemathesis.log 2>&1) || status=$?

cases=$(sed -n 's/^ *\([0-9]*\) generated.*/\1/p' "$out/schemathesis.log" | tail -1)
if [ "$status" -ne 0 ]; then
  echo "api contract: schemathesis FAILED (exit $status) against $url; the end of its log:"
  tail -60 "$out/schemathesis.log"
  exit "$status"
fi
# A server error would have failed the run above; the devnet's log says so too.
if grep -q '"status":5\|status=5[0-9][0-9]' "$out/devnet.log"; then
  echo "api contract: the devnet answered 5xx (see $out/devnet.log):"
  grep -E '"status":5|status=5[0-9][0-9]' "$out/devnet.log" | head -5
  exit 1
fi
echo "api contract: schemathesis sent ${cases:-?} generated requests to the devnet, all conforming, no server error (${seconds} s; $out)"
