#!/usr/bin/env bash
# The browser tests (tests/browser/*.test.mjs): Debian's Chromium driven by playwright-core
# (npm, pinned; its own browser download is not used) against a real devnet, with `node --test`.
# Screenshots land in target/browser-test/. Usage: scripts/browser-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
dir=$target/browser-test
# Pinned: upgrade on purpose.
playwright=1.65.1

chromium=$(command -v chromium || true)
[ -n "$chromium" ] || { echo "browser tests: chromium is not installed (apt-get install chromium)"; exit 1; }
command -v node >/dev/null || { echo "browser tests: node is not installed (apt-get install nodejs npm)"; exit 1; }

if [ ! -f "$dir/node_modules/playwright-core/package.json" ] \
  || ! grep -q "\"version\": \"$playwright\"" "$dir/node_modules/playwright-core/package.json"; then
  echo "installing playwright-core $playwright into $dir"
  mkdir -p "$dir"
  npm install --silent --no-audit --no-fund --no-save --prefix "$dir" "playwright-core@$playwright"
fi
# Up to date with the tree (a no-op after `cargo test`, which builds it for its tests).
cargo build -q --locked -p florin

rm -rf "$dir/screenshots"
export FLORIN_BIN=$(realpath "$target/debug/florin")
export OUT_DIR=$(realpath -m "$dir/screenshots")
export PLAYWRIGHT_CORE=$(realpath "$dir/node_modules/playwright-core")
export CHROMIUM=$chromium
status=0
# Files, not the directory (newer Node takes a directory argument as a module); a test that
# hangs fails after 5 minutes instead of holding CI.
node --test --test-reporter=spec --test-timeout=300000 --test-force-exit tests/browser/*.test.mjs 2>&1 \
  | tee "$dir/log.txt" || status=$?
passed=$(sed -n 's/^ℹ pass \([0-9]*\)/\1/p' "$dir/log.txt" | tail -1)
failed=$(sed -n 's/^ℹ fail \([0-9]*\)/\1/p' "$dir/log.txt" | tail -1)
echo "browser tests: ${passed:-0} passed, ${failed:-?} failed (screenshots in $OUT_DIR)"
exit "$status"
