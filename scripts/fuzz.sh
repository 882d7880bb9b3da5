#!/usr/bin/env bash
# Long fuzzing, outside CI: runs every cargo-fuzz target (or those named) for SECONDS each on
# the nightly toolchain, one process at a time, then minimizes each corpus into
# fuzz/corpus/<target>/ and prints per target the executions (libFuzzer's final stats),
# executions per second, whether it crashed (the crashing input is under
# fuzz/artifacts/<target>/) and the corpus kept.
# Usage: scripts/fuzz.sh SECONDS [TARGET...]
# Environment: FUZZ_NICE (default 10), FUZZ_MAX_LEN (default 65536), FUZZ_SANITIZER
# (default `address`; `none` runs 3-5x more executions a second: the decoders are safe Rust,
# where a panic, an overflow or a round-trip mismatch is what a run finds, and those are
# caught without a sanitizer), FUZZ_RUNS (stop a target after this many executions, e.g.
# 10000000; SECONDS still caps the time).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
nice_level=${FUZZ_NICE:-10}
max_len=${FUZZ_MAX_LEN:-65536}
sanitizer=${FUZZ_SANITIZER:-address}
runs=${FUZZ_RUNS:-0}
runs_arg=()
if [ "$runs" != 0 ]; then runs_arg=(-runs="$runs"); fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

# Seeds: valid encodings of every format, so fuzzing starts deep (written before the run;
# cmin keeps them only where they add coverage).
cargo run -q --locked -p florin-fuzz-targets --bin florin-fuzz-seed -- fuzz/corpus >/dev/null

cd fuzz
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
echo "==> building ${#targets[@]} targets (nightly, sanitizer: $sanitizer)"
if [ $# -gt 0 ]; then
  # Only those named: a binary of another target may be running (relinking it could fail).
  for t in "${targets[@]}"; do
    nice -n "$nice_level" cargo +nightly fuzz build -O -s "$sanitizer" "$t" >/dev/null
  done
else
  nice -n "$nice_level" cargo +nightly fuzz build -O -s "$sanitizer" >/dev/null
fi

mkdir -p logs
summary=()
crashed_any=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log="logs/$t.log"
  echo "==> $t: ${secs}s"
  set +e
  nice -n "$nice_level" cargo +nightly fuzz run -O -s "$sanitizer" "$t" "corpus/$t" -- \
    -max_total_time="$secs" -max_len="$max_len" -print_final_stats=1 -timeout=30 \
    -rss_limit_mb=4096 "${runs_arg[@]}" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  rate=$(grep -Eo 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  if [ "$rc" = 0 ]; then
    crashed=no
  else
    crashed="YES (exit $rc; see fuzz/$log and fuzz/artifacts/$t/)"
    crashed_any=1
  fi
  # Minimize into the kept corpus.
  nice -n "$nice_level" cargo +nightly fuzz cmin -O -s "$sanitizer" "$t" "corpus/$t" -- -max_len="$max_len" \
    >"logs/$t.cmin.log" 2>&1 || echo "warning: cmin of $t failed (fuzz/logs/$t.cmin.log)"
  files=$(find "corpus/$t" -type f | wc -l)
  kb=$(find "corpus/$t" -type f -printf '%s\n' | awk '{s+=$1} END {printf "%.0f", s/1024}')
  line="$t: ${execs:-?} executions (${rate:-?}/s), crashed: $crashed, corpus: $files files, ${kb} KB"
  echo "$line"
  summary+=("$line")
done

echo
echo "==> fuzz summary ($(date -u +%Y-%m-%dT%H:%MZ), ${secs}s per target)"
printf '%s\n' "${summary[@]}"
exit "$crashed_any"
