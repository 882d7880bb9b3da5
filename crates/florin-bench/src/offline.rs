//! `florin bench offline`: the thesis's measurements (001_… section VI) on Florin.
//!
//! - minting and client verification throughput (Fig. 3, one CPU);
//! - authority verification in signatures per second per core, by chain length (Fig. 5) and by
//!   thread count (Fig. 3), with libsodium — the thesis prototype's library — measured on the
//!   same signatures in the same run;
//! - the end-to-end table (Table I), through the real wallet and the real authority with its
//!   redb registry, one thread.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Result};
use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_node::{parallel_verify, Authority, AuthorityConfig};
use florin_token::verify::{client_precheck, verify_chains};
use florin_token::{ClientPolicy, Denomination, Payment, Token};
use florin_wallet::Wallet;
use rand::rngs::OsRng;
use serde_json::json;

use super::libsodium::Sodium;
use super::{Recorder, Reference, Scale};

const THESIS: &str = "001_… (TU Delft thesis, final)";

fn seed(value: f64, what: &str) -> Option<Reference> {
    Some(Reference {
        value,
        source: format!("{THESIS} {what}"),
    })
}

fn rate(n: usize, secs: f64) -> f64 {
    n as f64 / secs.max(1e-9)
}

/// Median of three timed runs of `f`, as a rate of `n` items per second.
fn median_rate(n: usize, mut f: impl FnMut()) -> f64 {
    let mut r: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            f();
            rate(n, t.elapsed().as_secs_f64())
        })
        .collect();
    r.sort_by(|a, b| a.total_cmp(b));
    r[1]
}

fn serial(i: usize) -> [u8; 8] {
    (i as u64).to_le_bytes()
}

/// `count` deposit-shaped tokens with `links` links, as a real deposit looks: the anchor to a
/// first holder, `links − 2` offline hops through holders with keys of their own, the last of
/// them the depositor (one key for the whole deposit), and the hop to the authority. Distinct
/// keys matter: the batch verifier coalesces signatures under one key, so reusing a few keys
/// would flatter it.
fn deposit_shaped(
    auth: &LocalSigner,
    depositor: &LocalSigner,
    links: usize,
    count: usize,
) -> Result<Vec<Token>> {
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        // Holders before the depositor: links − 2 of them (none for a two-link token).
        let holders: Vec<LocalSigner> = (0..links.saturating_sub(2))
            .map(|_| LocalSigner::new(SecretKey::generate(&mut OsRng)))
            .collect();
        let first = holders.first().unwrap_or(depositor);
        let mut t = Token::mint(
            auth,
            serial(i),
            Denomination::E1,
            [i as u8; 64],
            first.public_key(),
            [1; 32],
        )?;
        for (h, from) in holders.iter().enumerate() {
            let to = holders.get(h + 1).unwrap_or(depositor);
            t = t.transfer(from, to.public_key(), [h as u8; 32])?;
        }
        t = t.transfer(depositor, auth.public_key(), [9; 32])?;
        out.push(t);
    }
    Ok(out)
}

/// (key, message, signature) of every link of `tokens`.
fn triples(tokens: &[Token]) -> Vec<([u8; 32], [u8; 32], [u8; 64])> {
    let mut v = Vec::new();
    for t in tokens {
        for i in 0..t.links.len() {
            if let (Some(m), Some(k)) = (t.message(i), t.signer_of(i)) {
                v.push((k.0, m, t.links[i].proof.0));
            }
        }
    }
    v
}

fn sodium_rate(
    s: &Sodium,
    triples: &[([u8; 32], [u8; 32], [u8; 64])],
    threads: usize,
) -> Result<f64> {
    let chunk = triples.len().div_ceil(threads.max(1));
    let t = Instant::now();
    let ok = std::thread::scope(|sc| {
        let hs: Vec<_> = triples
            .chunks(chunk)
            .map(|c| sc.spawn(move || c.iter().all(|(k, m, sig)| s.verify(sig, m, k))))
            .collect();
        hs.into_iter().all(|h| h.join().unwrap_or(false))
    });
    let r = rate(triples.len(), t.elapsed().as_secs_f64());
    if !ok {
        return Err(anyhow!("libsodium rejected a Florin signature"));
    }
    Ok(r)
}

/// Runs the suite.
pub fn run(rec: &mut Recorder, scale: Scale) -> Result<()> {
    let n = scale.tokens;
    let cores = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(1);
    let auth = LocalSigner::new(SecretKey::generate(&mut OsRng));
    let w = [
        LocalSigner::new(SecretKey::generate(&mut OsRng)),
        LocalSigner::new(SecretKey::generate(&mut OsRng)),
    ];
    let one = json!({ "threads": 1 });

    // Minting: one signature per token.
    let t = Instant::now();
    let minted: Vec<Token> = (0..n)
        .map(|i| {
            Token::mint(
                &auth,
                serial(i),
                Denomination::E1,
                [3; 64],
                w[0].public_key(),
                [1; 32],
            )
        })
        .collect::<Result<_, _>>()?;
    rec.add(
        "mint_tokens_per_s",
        rate(n, t.elapsed().as_secs_f64()),
        "tokens/s",
        one.clone(),
        seed(38239.0, "VI-A, Fig. 3: signing on 1 CPU"),
        None,
    );

    // Client verification of freshly minted tokens (three steps; signatures batched).
    let policy = ClientPolicy {
        trusted_authorities: vec![auth.public_key()],
        max_hops: 64,
    };
    let seen = HashSet::new();
    let refs: Vec<&Token> = minted.iter().collect();
    let r = median_rate(n, || {
        for t in &minted {
            let _ = client_precheck(t, &w[0].public_key(), Some(&[1; 32]), &seen, &policy);
        }
        let _ = verify_chains(&refs, &mut OsRng);
    });
    rec.add(
        "client_verify_tokens_per_s",
        r,
        "tokens/s",
        one.clone(),
        seed(
            17477.0,
            "Table I: recipient #1 validates tokens from authority",
        ),
        None,
    );

    // Authority verification by chain length (Fig. 5), one thread.
    let sigs_target = n * 3;
    let lengths: &[usize] = if scale.full {
        &[2, 3, 4, 5, 6, 8, 10, 12, 15, 20]
    } else {
        &[2, 3, 5, 10, 20]
    };
    let mut base_tokens = Vec::new();
    for &links in lengths {
        let count = (sigs_target / links).max(50);
        let tokens = deposit_shaped(&auth, &w[1], links, count)?;
        let refs: Vec<&Token> = tokens.iter().collect();
        let r = median_rate(count * links, || {
            let _ = parallel_verify(&refs, 1);
        });
        rec.add(
            "authority_verify_sigs_per_s_per_core",
            r,
            "signatures/s",
            json!({ "threads": 1, "links": links }),
            seed(
                17000.0,
                "VI-D: ≈17,000 signatures/s per thread, any chain length",
            ),
            None,
        );
        if links == 3 {
            base_tokens = tokens;
        }
    }

    // By thread count (Fig. 3), three links (the online case: anchor, transfer, authority).
    // Runs for different thread counts are interleaved, five rounds, medians taken, so drift in
    // the shared machine's load affects them alike.
    let refs: Vec<&Token> = base_tokens.iter().collect();
    let sigs = base_tokens.len() * 3;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cores + 1];
    for _round in 0..5 {
        for (threads, s) in samples.iter_mut().enumerate().skip(1) {
            let t = Instant::now();
            let _ = parallel_verify(&refs, threads);
            s.push(rate(sigs, t.elapsed().as_secs_f64()));
        }
    }
    // total_by_threads[t]: all threads together, t threads (index 0 unused).
    let total_by_threads: Vec<f64> = samples
        .iter_mut()
        .map(|s| {
            s.sort_by(|a, b| a.total_cmp(b));
            s.get(s.len() / 2).copied().unwrap_or(0.0)
        })
        .collect();
    for (threads, total) in total_by_threads.iter().enumerate().skip(2) {
        rec.add(
            "authority_verify_sigs_per_s_per_core",
            total / threads as f64,
            "signatures/s",
            json!({ "threads": threads, "links": 3 }),
            seed(17000.0, "VI-D: ≈17,000 signatures/s per thread"),
            None,
        );
    }

    // libsodium on the same signatures, one at a time, as the prototype did.
    let tri = triples(&base_tokens);
    let sodium = Sodium::load();
    let sodium_1 = match &sodium {
        Ok(s) => {
            let mut rs: Vec<f64> = (0..3)
                .map(|_| sodium_rate(s, &tri, 1))
                .collect::<Result<_>>()?;
            rs.sort_by(|a, b| a.total_cmp(b));
            Some(rs[1])
        }
        Err(e) => {
            tracing::warn!("{e}; libsodium results omitted");
            None
        }
    };
    let sodium_2 = match (&sodium, cores >= 2) {
        (Ok(s), true) => Some(sodium_rate(s, &tri, 2)?),
        _ => None,
    };
    let lib_ref = |v: f64, what: &str| {
        Some(Reference {
            value: v,
            source: format!("libsodium {what}, same signatures, same run"),
        })
    };
    if let Some(s1) = sodium_1 {
        rec.add(
            "libsodium_verify_sigs_per_s_per_core",
            s1,
            "signatures/s",
            json!({ "threads": 1 }),
            seed(
                15429.0,
                "Table I: authority validates (libsodium via Kotlin), signatures/s",
            ),
            None,
        );
        rec.add(
            "authority_vs_libsodium_ratio",
            total_by_threads[1] / s1,
            "ratio",
            json!({ "threads": 1, "links": 3 }),
            None,
            lib_ref(1.0, "crypto_sign_verify_detached = 1.0"),
        );
    }
    if cores >= 2 {
        let scaling = total_by_threads[2] / total_by_threads[1];
        rec.add(
            "authority_verify_scaling_2_threads",
            scaling,
            "ratio",
            json!({ "links": 3 }),
            None,
            sodium_1
                .zip(sodium_2)
                .and_then(|(a, b)| lib_ref(b / a, "2-thread scaling")),
        );
    }

    // A library that fails here costs only its own rows.
    if let Err(e) = libraries(rec, n) {
        tracing::warn!("the Ed25519 libraries' comparison (Fig. 4) failed: {e:#}");
    }
    e2e(rec, n)
}

/// The thesis's Fig. 4 at the token's message size: Ed25519 signing and verification on one
/// thread with three libraries in the same run — ed25519-dalek (Florin's), ring, and libsodium
/// (the prototype's, when installed) — each on the same 147-byte messages.
fn libraries(rec: &mut Recorder, n: usize) -> Result<()> {
    const BYTES: usize = 147;
    let count = n.clamp(1_000, 20_000);
    let msgs: Vec<[u8; BYTES]> = (0..count)
        .map(|i| {
            let mut m = [0u8; BYTES];
            m[..8].copy_from_slice(&(i as u64).to_le_bytes());
            m
        })
        .collect();
    let mut seed_bytes = [0u8; 32];
    rand::RngCore::fill_bytes(&mut OsRng, &mut seed_bytes);
    let fig4 = |op: &str| match op {
        "sign" => seed(
            41_156.0,
            "VI-A, Fig. 4: libsodium signs 6.05 MB/s at 147 bytes (41,156/s)",
        ),
        _ => seed(
            17_687.0,
            "VI-A, Fig. 4: libsodium verifies 2.60 MB/s at 147 bytes (= 17,687/s)",
        ),
    };
    let add = |rec: &mut Recorder, library: &str, op: &str, secs: f64| {
        rec.add(
            "ed25519_ops_per_s",
            count as f64 / secs.max(1e-9),
            "operations/s",
            json!({ "library": library, "op": op, "bytes": BYTES, "threads": 1 }),
            fig4(op),
            None,
        );
    };

    // ed25519-dalek, through Florin's key type.
    let key = SecretKey::from_seed(&seed_bytes);
    let t = Instant::now();
    let sigs: Vec<_> = msgs.iter().map(|m| key.sign(m)).collect();
    add(rec, "ed25519-dalek", "sign", t.elapsed().as_secs_f64());
    let pk = key.public_key();
    let t = Instant::now();
    if !msgs
        .iter()
        .zip(&sigs)
        .all(|(m, s)| florin_crypto::verify(&pk, m, s).is_ok())
    {
        return Err(anyhow!("ed25519-dalek rejected its own signature"));
    }
    add(rec, "ed25519-dalek", "verify", t.elapsed().as_secs_f64());

    // ring.
    let ring_key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed_bytes)
        .map_err(|e| anyhow!("ring key: {e}"))?;
    let t = Instant::now();
    let ring_sigs: Vec<_> = msgs.iter().map(|m| ring_key.sign(m)).collect();
    add(rec, "ring", "sign", t.elapsed().as_secs_f64());
    let ring_pk = ring::signature::UnparsedPublicKey::new(
        &ring::signature::ED25519,
        ring::signature::KeyPair::public_key(&ring_key)
            .as_ref()
            .to_vec(),
    );
    let t = Instant::now();
    if !msgs
        .iter()
        .zip(&ring_sigs)
        .all(|(m, s)| ring_pk.verify(m, s.as_ref()).is_ok())
    {
        return Err(anyhow!("ring rejected its own signature"));
    }
    add(rec, "ring", "verify", t.elapsed().as_secs_f64());

    // libsodium, when installed.
    match Sodium::load() {
        Ok(s) => {
            let (sk, spk) = s
                .keypair(&seed_bytes)
                .ok_or_else(|| anyhow!("libsodium refused the key seed"))?;
            let t = Instant::now();
            let ss: Vec<[u8; 64]> = msgs
                .iter()
                .map(|m| s.sign(&sk, m))
                .collect::<Option<_>>()
                .ok_or_else(|| anyhow!("libsodium refused to sign"))?;
            add(rec, "libsodium", "sign", t.elapsed().as_secs_f64());
            let t = Instant::now();
            if !msgs.iter().zip(&ss).all(|(m, sig)| s.verify(sig, m, &spk)) {
                return Err(anyhow!("libsodium rejected its own signature"));
            }
            add(rec, "libsodium", "verify", t.elapsed().as_secs_f64());
        }
        Err(e) => tracing::warn!("{e}; libsodium omitted from the Fig. 4 libraries"),
    }
    Ok(())
}

/// Table I: one token's round trip, authority → #1 → #2 → authority, through the real wallet
/// and the real authority (redb registry, durable commits), one thread.
fn e2e(rec: &mut Recorder, n: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let signer = Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng)));
    let mut cfg = AuthorityConfig::devnet(dir.path());
    cfg.verify_threads = 1;
    let authority = Authority::open(cfg, signer.clone())?;
    let auth_key: PublicKey = signer.public_key();
    let mut w1 = Wallet::generate(&mut OsRng, Some(auth_key));
    let mut w2 = Wallet::generate(&mut OsRng, Some(auth_key));
    w2.max_offline_cents = u64::MAX;
    let one = json!({ "threads": 1, "tokens": n });
    let row = |name: &str, v: f64, s: f64, what: &str, rec: &mut Recorder| {
        rec.add(
            name,
            v,
            "tokens/s",
            one.clone(),
            if s > 0.0 { seed(s, what) } else { None },
            None,
        );
    };

    let hs = Wallet::fresh_handshake(&mut OsRng);
    let t = Instant::now();
    let tokens = authority.mint_tokens(w1.public_key(), &vec![Denomination::E1; n], hs)?;
    row(
        "e2e_authority_sign_tokens_per_s",
        rate(n, t.elapsed().as_secs_f64()),
        37663.0,
        "Table I: authority signs tokens for recipient #1",
        rec,
    );
    let wire: Vec<Vec<u8>> = tokens.iter().map(|t| t.encode()).collect();

    let t = Instant::now();
    let received: Vec<Token> = wire
        .iter()
        .map(|b| Token::decode(b))
        .collect::<Result<_, _>>()?;
    row("e2e_recipient1_receive_tokens_per_s", rate(n, t.elapsed().as_secs_f64()), 43523.0,
        "Table I: recipient #1 receives tokens from authority (here: decoding; the network is `bench transfer`)", rec);

    let t = Instant::now();
    w1.accept_issued(received, &hs, &mut OsRng)?;
    row(
        "e2e_recipient1_validate_tokens_per_s",
        rate(n, t.elapsed().as_secs_f64()),
        17477.0,
        "Table I: recipient #1 validates tokens from authority",
        rec,
    );

    let req = w2.request(n as u64 * 100, &mut OsRng)?;
    let t = Instant::now();
    let payment = w1.pay(&req)?;
    let bytes = payment.encode();
    row(
        "e2e_recipient1_transfer_tokens_per_s",
        rate(n, t.elapsed().as_secs_f64()),
        0.0,
        "",
        rec,
    );

    let t = Instant::now();
    let payment = Payment::decode(&bytes)?;
    row(
        "e2e_recipient2_receive_tokens_per_s",
        rate(n, t.elapsed().as_secs_f64()),
        34223.0,
        "Table I: recipient #2 receives tokens from recipient #1 (here: decoding)",
        rec,
    );

    let t = Instant::now();
    w2.accept(&payment, &mut OsRng)?;
    row(
        "e2e_recipient2_validate_tokens_per_s",
        rate(n, t.elapsed().as_secs_f64()),
        8797.0,
        "Table I: recipient #2 validates tokens from recipient #1",
        rec,
    );

    // A wallet sends at most `MAX_DEPOSIT_PER_REQUEST` tokens per deposit: more go in parts,
    // each step's time summed over the parts (finishing a part is not timed).
    let (mut transfer, mut receive, mut secs, mut clean) = (0.0, 0.0, 0.0, 0);
    // Fig. 9: the same tokens' cryptography alone (the authority's batch verification on one
    // thread, and one re-anchor signature per token), timed apart from the deposits.
    let mut crypto = 0.0;
    loop {
        let t = Instant::now();
        let Some((_handshake, signed)) = w2.prepare_deposit(&mut OsRng)? else {
            break;
        };
        let wire: Vec<Vec<u8>> = signed.iter().map(|t| t.encode()).collect();
        transfer += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let decoded: Vec<Result<Token, String>> = wire
            .iter()
            .map(|b| Token::decode(b).map_err(|e| e.to_string()))
            .collect();
        receive += t.elapsed().as_secs_f64();

        let tokens: Vec<&Token> = decoded.iter().filter_map(|t| t.as_ref().ok()).collect();
        let t = Instant::now();
        let verified = parallel_verify(&tokens, 1);
        for tok in &tokens {
            let _ = std::hint::black_box(signer.sign(&tok.serial));
        }
        crypto += t.elapsed().as_secs_f64();
        if verified.iter().any(Result::is_err) {
            return Err(anyhow!("a deposited token does not verify"));
        }

        let t = Instant::now();
        let reports = authority.deposit_tokens(&w2.public_key(), &decoded)?;
        secs += t.elapsed().as_secs_f64();
        let mut items = Vec::with_capacity(reports.len());
        for r in &reports {
            let token = r
                .token
                .as_deref()
                .and_then(|h| hex::decode(h).ok())
                .and_then(|b| Token::decode(&b).ok());
            match (r.outcome.as_str(), token) {
                ("reanchored", Some(t)) => {
                    clean += 1;
                    items.push(florin_wallet::DepositItem::Reanchored(t));
                }
                _ => return Err(anyhow!("a token was not deposited cleanly: {}", r.outcome)),
            }
        }
        w2.finish_deposit(items, &mut OsRng)?;
    }
    if clean != n {
        return Err(anyhow!("only {clean} of {n} tokens deposited cleanly"));
    }
    row(
        "e2e_recipient2_transfer_tokens_per_s",
        rate(n, transfer),
        0.0,
        "",
        rec,
    );
    row(
        "e2e_authority_receive_tokens_per_s",
        rate(n, receive),
        23452.0,
        "Table I: authority receives tokens from recipient #2 (here: decoding)",
        rec,
    );
    row("e2e_authority_validate_tokens_per_s", rate(n, secs), 5143.0,
        "Table I: authority validates tokens from recipient #2 (here also: fork check, re-anchor signature, durable commit)", rec);
    let share = (crypto / secs.max(1e-9) * 100.0).min(100.0);
    for (part, pct, seed_pct) in [
        ("cryptography", share, 89.0),
        (
            "rest: registry, fork check, durable commit",
            100.0 - share,
            11.0,
        ),
    ] {
        rec.add(
            "deposit_cpu_share_pct",
            pct,
            "%",
            json!({
                "part": part,
                "tokens": n,
                "threads": 1,
                "method": "the deposits' cryptography (batch verification, one signature per token) timed alone on the same tokens, over the deposits' time",
            }),
            seed(
                seed_pct,
                "VI-D, Fig. 9: flame graph of an authority verifying tokens, ≈89 % cryptography",
            ),
            None,
        );
    }
    Ok(())
}
