# Sourced by scripts/test.sh: installs PostgreSQL from Debian if missing, starts a private
# server on 127.0.0.1 for the test run, exports FLORIN_TEST_PG, and stops it on exit.

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

start_test_postgres() {
  if [ -z "$(pg_bin)" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "installing postgresql from Debian packages"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
  fi
  local bin; bin=$(pg_bin)
  if [ -z "$bin" ]; then
    echo "error: PostgreSQL is not installed and cannot be installed here" >&2
    return 1
  fi
  PG_TEST_DIR=$(mktemp -d /tmp/florin-pg.XXXXXX)
  local as=()
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$PG_TEST_DIR"
    as=(runuser -u postgres --)
  fi
  local port
  for port in 54329 54339 54349 54359; do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  done
  "${as[@]}" "$bin/initdb" -D "$PG_TEST_DIR/data" --auth=trust -U postgres >/dev/null
  # TLS: a CA made for this run and a server certificate for 127.0.0.1 from it, so the store's
  # TLS path (florin_store::pg_tls) is tested against a real server too.
  if ! command -v openssl >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
  fi
  local tls_opts=""
  if command -v openssl >/dev/null 2>&1; then
    local d=$PG_TEST_DIR
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj "/CN=florin test CA" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
      -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
      -days 2 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
    chmod 600 "$d/server.key"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$d/server.key" "$d/server.pem"; fi
    tls_opts="-c ssl=on -c ssl_cert_file=$d/server.pem -c ssl_key_file=$d/server.key"
    export FLORIN_TEST_PG_TLS="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=require"
    export FLORIN_TEST_PG_CA="$d/ca.pem"
  fi
  "${as[@]}" "$bin/pg_ctl" -D "$PG_TEST_DIR/data" -l "$PG_TEST_DIR/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_TEST_DIR -c fsync=on -c synchronous_commit=on $tls_opts" start >/dev/null
  PG_TEST_AS=("${as[@]}")
  PG_TEST_BIN=$bin
  export FLORIN_TEST_PG="host=127.0.0.1 port=$port user=postgres dbname=postgres"
  export FLORIN_REQUIRE_PG=1
  echo "PostgreSQL ($("$bin/postgres" --version)) on 127.0.0.1:$port${tls_opts:+, TLS on (CA $PG_TEST_DIR/ca.pem)}"
}

stop_test_postgres() {
  if [ -n "${PG_TEST_DIR:-}" ]; then
    "${PG_TEST_AS[@]}" "$PG_TEST_BIN/pg_ctl" -D "$PG_TEST_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$PG_TEST_DIR"
  fi
}
