//! The PostgreSQL swap store, for operators who prefer an existing database. `swap` is a
//! stored function, as in Hamilton's PostgreSQL baseline (`003_…` section 6); a batch runs in
//! one database transaction, so it commits (and syncs, with `synchronous_commit` on) once.
//!
//! Schema, in a schema of its own: `uhs(id, value)`, `applied(txid)`, `books(k, v)`.
//!
//! Expiry ([`florin_ledger::expiry`]) is decided here before the function runs: an expired
//! transfer or redeem is answered `Expired` without touching the database, an expired mint
//! `AlreadyApplied` if `applied` has it. The `applied` table keeps every txid: it lives on the
//! database's disk, not in Florin's memory. It records neither kind nor expiry, so its rows
//! cannot be pruned safely as they are (a mint's row must stay for ever).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use florin_crypto::Digest;
use florin_ledger::compact::{CompactTx, TxKind};
use florin_ledger::store::{StoreError, Supply, SwapOutcome, SwapStore};
use florin_ledger::tx::UhsId;
use postgres::{Client, NoTls};

/// The error with its causes ("error performing TLS handshake: invalid peer certificate: …").
fn db(e: postgres::Error) -> StoreError {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    StoreError::Backend(text)
}

const FUNCTION: &str = r#"
CREATE OR REPLACE FUNCTION florin_swap(p_txid bytea, p_kind smallint, p_inputs bytea[],
                                       p_out_ids bytea[], p_out_values bigint[])
RETURNS smallint LANGUAGE plpgsql AS $$
DECLARE
    n_removed int;
    removed bigint;
    added bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM applied WHERE txid = p_txid) THEN
        RETURN 2; -- already applied: a replay changes nothing
    END IF;
    BEGIN
        WITH d AS (DELETE FROM uhs WHERE id = ANY(p_inputs) RETURNING value)
        SELECT count(*), coalesce(sum(value), 0) INTO n_removed, removed FROM d;
        IF n_removed <> coalesce(cardinality(p_inputs), 0) THEN
            RAISE EXCEPTION 'missing input';
        END IF;
        INSERT INTO uhs (id, value) SELECT * FROM unnest(p_out_ids, p_out_values);
        SELECT coalesce(sum(v), 0) INTO added FROM unnest(p_out_values) AS v;
        INSERT INTO applied (txid) VALUES (p_txid);
        IF p_kind = 2 THEN
            UPDATE books SET v = v + added WHERE k = 'minted';
        ELSIF p_kind = 3 THEN
            UPDATE books SET v = v + removed WHERE k = 'redeemed';
        END IF;
        RETURN 0;
    EXCEPTION WHEN raise_exception OR unique_violation THEN
        RETURN 1; -- the block's changes are rolled back: nothing changed
    END;
END;
$$;
"#;

/// A swap store in PostgreSQL.
pub struct PgStore {
    clients: Vec<Mutex<Client>>,
    next: AtomicUsize,
    /// The store's clock: the highest `now` a swap was given.
    clock: AtomicU64,
}

impl PgStore {
    /// Connects `connections` clients to `url` (a libpq connection string), creating the
    /// schema `schema` and its tables and function if they do not exist.
    pub fn connect(url: &str, schema: &str, connections: usize) -> Result<Self, StoreError> {
        Self::connect_with(url, schema, connections, None)
    }

    /// [`PgStore::connect`], over TLS when `tls` is given ([`crate::pg_tls`]; the connection
    /// string's `sslmode=require` then refuses a server without TLS).
    pub fn connect_with(
        url: &str,
        schema: &str,
        connections: usize,
        tls: Option<&crate::pg_tls::PgTls>,
    ) -> Result<Self, StoreError> {
        let config: postgres::Config = url.parse().map_err(db)?;
        let client = || match tls {
            // TLS configured is TLS required: with `sslmode=prefer` a man in the middle could
            // answer "no TLS" and the session would go on in the clear.
            Some(t) => {
                let mut c = config.clone();
                c.ssl_mode(postgres::config::SslMode::Require);
                c.connect(t.clone())
            }
            None => config.connect(NoTls),
        };
        if !schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
            || schema.is_empty()
        {
            return Err(StoreError::Backend(format!(
                "invalid schema name {schema:?}"
            )));
        }
        let mut first = client().map_err(db)?;
        first
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema};
                 SET search_path TO {schema};
                 CREATE TABLE IF NOT EXISTS uhs (id bytea PRIMARY KEY, value bigint NOT NULL);
                 CREATE TABLE IF NOT EXISTS applied (txid bytea PRIMARY KEY);
                 CREATE TABLE IF NOT EXISTS books (k text PRIMARY KEY, v bigint NOT NULL);
                 INSERT INTO books VALUES ('minted', 0), ('redeemed', 0) ON CONFLICT DO NOTHING;
                 {FUNCTION}"
            ))
            .map_err(db)?;
        let mut clients = vec![Mutex::new(first)];
        for _ in 1..connections.max(1) {
            let mut c = client().map_err(db)?;
            c.batch_execute(&format!("SET search_path TO {schema}"))
                .map_err(db)?;
            clients.push(Mutex::new(c));
        }
        Ok(PgStore {
            clients,
            next: AtomicUsize::new(0),
            clock: AtomicU64::new(0),
        })
    }

    /// Loads unspent ids in bulk, counted as minted (benchmarks' preloading: 1 M ids in seconds
    /// instead of a million function calls).
    pub fn bulk_load(&self, ids: &[(UhsId, u64)]) -> Result<(), StoreError> {
        let mut c = self.client()?;
        for chunk in ids.chunks(50_000) {
            let keys: Vec<&[u8]> = chunk.iter().map(|(i, _)| i.as_slice()).collect();
            let values: Vec<i64> = chunk.iter().map(|(_, v)| *v as i64).collect();
            let total: i64 = values.iter().sum();
            let mut tx = c.transaction().map_err(db)?;
            tx.execute(
                "INSERT INTO uhs (id, value) SELECT * FROM unnest($1::bytea[], $2::bigint[])",
                &[&keys, &values],
            )
            .map_err(db)?;
            tx.execute("UPDATE books SET v = v + $1 WHERE k = 'minted'", &[&total])
                .map_err(db)?;
            tx.commit().map_err(db)?;
        }
        Ok(())
    }

    fn client(&self) -> Result<std::sync::MutexGuard<'_, Client>, StoreError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        // Try the chosen client, else wait for any.
        for k in 0..self.clients.len() {
            if let Ok(g) = self.clients[(i + k) % self.clients.len()].try_lock() {
                return Ok(g);
            }
        }
        self.clients[i]
            .lock()
            .map_err(|_| StoreError::Corrupt("a client panicked".into()))
    }
}

fn kind(k: TxKind) -> i16 {
    k.to_byte() as i16
}

impl SwapStore for PgStore {
    fn swap_at(&self, now: u64, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock.fetch_max(now, Ordering::AcqRel).max(now);
        let mut c = self.client()?;
        let mut tx = c.transaction().map_err(db)?;
        let stmt = tx
            .prepare("SELECT florin_swap($1, $2, $3, $4, $5)")
            .map_err(db)?;
        let mut out = Vec::with_capacity(batch.len());
        for t in batch {
            if t.expires < now {
                let kept = t.kind == TxKind::Mint
                    && tx
                        .query_one(
                            "SELECT EXISTS (SELECT 1 FROM applied WHERE txid = $1)",
                            &[&t.txid.as_slice()],
                        )
                        .map_err(db)?
                        .get::<_, bool>(0);
                out.push(if kept {
                    SwapOutcome::AlreadyApplied
                } else {
                    SwapOutcome::Expired
                });
                continue;
            }
            let inputs: Vec<&[u8]> = t.inputs.iter().map(|i| i.as_slice()).collect();
            let out_ids: Vec<&[u8]> = t.outputs.iter().map(|(i, _)| i.as_slice()).collect();
            let out_values: Vec<i64> = t.outputs.iter().map(|(_, v)| *v as i64).collect();
            let row = tx
                .query_one(
                    &stmt,
                    &[
                        &t.txid.as_slice(),
                        &kind(t.kind),
                        &inputs,
                        &out_ids,
                        &out_values,
                    ],
                )
                .map_err(db)?;
            out.push(match row.get::<_, i16>(0) {
                0 => SwapOutcome::Confirmed,
                2 => SwapOutcome::AlreadyApplied,
                _ => SwapOutcome::MissingInput,
            });
        }
        tx.commit().map_err(db)?;
        Ok(out)
    }

    fn is_unspent(&self, id: &UhsId) -> Result<bool, StoreError> {
        let mut c = self.client()?;
        let row = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM uhs WHERE id = $1)",
                &[&id.as_slice()],
            )
            .map_err(db)?;
        Ok(row.get(0))
    }

    fn is_confirmed(&self, txid: &Digest) -> Result<bool, StoreError> {
        let mut c = self.client()?;
        let row = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM applied WHERE txid = $1)",
                &[&txid.as_slice()],
            )
            .map_err(db)?;
        Ok(row.get(0))
    }

    fn supply(&self) -> Result<Supply, StoreError> {
        let mut c = self.client()?;
        let row = c
            .query_one(
                "SELECT (SELECT v FROM books WHERE k = 'minted'), (SELECT v FROM books WHERE k = 'redeemed'),
                        (SELECT coalesce(sum(value), 0)::bigint FROM uhs), (SELECT count(*) FROM uhs)",
                &[],
            )
            .map_err(db)?;
        let g = |i: usize| row.get::<_, i64>(i).max(0) as u64;
        Ok(Supply {
            minted_cents: g(0),
            redeemed_cents: g(1),
            unspent_cents: g(2),
            unspent_count: g(3),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the shared suite against the server in `FLORIN_TEST_PG` (a libpq connection
    /// string); `scripts/test.sh` starts one on loopback and sets `FLORIN_REQUIRE_PG=1`, so CI
    /// cannot skip this silently.
    #[test]
    fn shared_suite() {
        let Ok(url) = std::env::var("FLORIN_TEST_PG") else {
            assert!(
                std::env::var("FLORIN_REQUIRE_PG").is_err(),
                "FLORIN_REQUIRE_PG is set but FLORIN_TEST_PG is not"
            );
            eprintln!("skipped: set FLORIN_TEST_PG to run the PostgreSQL store suite");
            return;
        };
        let schema = format!(
            "florin_test_{}_{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let open = || PgStore::connect(&url, &schema, 2).unwrap();
        florin_ledger::store::testing::run_suite(open, |s| {
            drop(s);
            PgStore::connect(&url, &schema, 2).unwrap()
        });
        let mut c = Client::connect(&url, NoTls).unwrap();
        c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }

    /// The store over TLS against the server in `FLORIN_TEST_PG_TLS` (`sslmode=require`),
    /// trusting the CA in `FLORIN_TEST_PG_CA` (`scripts/pg-test-server.sh` sets both): it
    /// works, the server reports the session encrypted, and a server whose certificate is
    /// not from the trusted CA, or a plain connection, is refused.
    #[test]
    fn the_store_runs_over_tls_and_checks_the_server() {
        use crate::pg_tls::PgTls;
        use florin_ledger::store::testing::{id, mint};
        let (Ok(url), Ok(ca)) = (
            std::env::var("FLORIN_TEST_PG_TLS"),
            std::env::var("FLORIN_TEST_PG_CA"),
        ) else {
            assert!(
                std::env::var("FLORIN_REQUIRE_PG").is_err(),
                "FLORIN_REQUIRE_PG is set but FLORIN_TEST_PG_TLS/FLORIN_TEST_PG_CA are not"
            );
            eprintln!("skipped: set FLORIN_TEST_PG_TLS and FLORIN_TEST_PG_CA");
            return;
        };
        let tls = PgTls::from_ca_file(std::path::Path::new(&ca)).unwrap();
        let schema = format!(
            "florin_tls_{}_{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let store = PgStore::connect_with(&url, &schema, 2, Some(&tls)).unwrap();
        assert_eq!(
            store.swap(&[mint(1, &[(1, 100)])]).unwrap(),
            vec![SwapOutcome::Confirmed]
        );
        assert!(store.is_unspent(&id(1)).unwrap());
        let mut c = Client::connect(&url, tls.clone()).unwrap();
        let row = c
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .unwrap();
        assert!(row.get::<_, bool>(0), "the session is not encrypted");
        // Another CA: the server is not trusted.
        let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let stranger = PgTls::from_ca_pem(other.cert.pem().as_bytes()).unwrap();
        let err = PgStore::connect_with(&url, &schema, 1, Some(&stranger))
            .err()
            .expect("a server from another CA is refused")
            .to_string();
        assert!(err.to_lowercase().contains("certificate"), "{err}");
        // A plain connection where TLS is required: refused.
        assert!(PgStore::connect(&url, &schema, 1).is_err());
        c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }
}
