//! Threshold ECDSA P-256 (CGGMP24) in the key-management network, over real sockets with the
//! nodes in this process, at the insecure test level (768-bit primes) so a run takes seconds:
//! auxiliary information, key generation, presignature pool, signing that survives a node,
//! the below-threshold error, restarts, import and export, a tampered relay.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_crypto::p256::{self, P256SecretKey, P256Signer};
use florin_custody::wire::{EcdsaJob, Request, Response};
use florin_node::custody::{free_loopback_addrs, EcdsaLevel, Kmn, KmnError, Layout, RunningNode};
use rand::rngs::OsRng;
use rand::RngCore;

type R = Result<(), Box<dyn std::error::Error>>;

type Net = (tempfile::TempDir, Layout, Vec<RunningNode>, Arc<Kmn>);

/// A t-of-n network with ECDSA on and its auxiliary information made.
fn network(t: u16, n: usize) -> Result<Net, Box<dyn std::error::Error>> {
    network_with(t, n, |_| Ok(()))
}

/// [`network`], with `setup` changing the configs before the nodes start.
fn network_with(
    t: u16,
    n: usize,
    setup: impl FnOnce(&Layout) -> Result<(), florin_node::NodeError>,
) -> Result<Net, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(t, &free_loopback_addrs(n)?)?;
    layout.set_ecdsa(Some(EcdsaLevel::InsecureTest))?;
    setup(&layout)?;
    let nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    kmn.ecdsa_setup(Duration::from_secs(120))?;
    Ok((dir, layout, nodes, kmn))
}

/// The order of the P-256 group, big-endian.
const P256_ORDER: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// (a + b) mod n for big-endian scalars below n, by schoolbook arithmetic (independent of the
/// code under test).
fn add_mod_n(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    let mut sum = [0u8; 33];
    let mut carry = 0u16;
    for i in (0..32).rev() {
        let v = a[i] as u16 + b[i] as u16 + carry;
        sum[i + 1] = v as u8;
        carry = v >> 8;
    }
    sum[0] = carry as u8;
    let mut n = [0u8; 33];
    n[1..].copy_from_slice(&P256_ORDER);
    if sum >= n {
        let mut borrow = 0i16;
        for i in (0..33).rev() {
            let v = sum[i] as i16 - n[i] as i16 - borrow;
            sum[i] = v.rem_euclid(256) as u8;
            borrow = i16::from(v < 0);
        }
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(&sum[1..]);
    out
}

fn verifies(pk: &p256::P256PublicKey, msg: &[u8], sig: &p256::P256Signature) -> bool {
    p256::verify(pk, msg, sig).is_ok()
}

#[test]
fn keygen_presign_sign_survive_a_node_and_fail_clearly_below_threshold() -> R {
    let (_dir, _layout, mut nodes, kmn) = network(2, 3)?;
    for s in kmn.status() {
        let e = s.ecdsa.expect("ecdsa state");
        // The primes stay until a key uses the auxiliary information, so a run that finished
        // at only some nodes could be repeated.
        assert!(e.aux_ready && e.primes_ready, "{e:?}");
        assert_eq!(e.level, "insecure-test");
    }
    // Setup again is a no-op.
    kmn.ecdsa_setup(Duration::from_secs(1))?;
    let pk = kmn.ecdsa_keygen("wallet-1")?;
    for s in kmn.status() {
        assert!(!s.ecdsa.expect("ecdsa state").primes_ready);
    }
    // Now a second auxiliary-information run is refused.
    assert!(matches!(
        kmn.ecdsa_run([3; 16], &[1, 2, 3], EcdsaJob::Aux),
        Err(KmnError::Refused { .. })
    ));
    assert_eq!(kmn.ecdsa_public_key("wallet-1")?, pk);
    // One name, one key, whatever the scheme.
    assert!(matches!(
        kmn.ecdsa_keygen("wallet-1"),
        Err(KmnError::Refused { .. })
    ));
    assert!(matches!(kmn.dkg("wallet-1"), Err(KmnError::Refused { .. })));

    let signer = kmn.ecdsa_signer("wallet-1", 4)?;
    assert_eq!(signer.public_key(), pk);
    assert!(signer.wait_ready(4, Duration::from_secs(120)) >= 4);
    for i in 0..4u32 {
        let msg = format!("pay {i}");
        let t0 = Instant::now();
        let sig = signer.sign(msg.as_bytes())?;
        assert!(verifies(&pk, msg.as_bytes(), &sig));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    assert!(signer.stats().from_presig >= 1, "{:?}", signer.stats());
    // Every node's presignatures are in its memory; status counts them.
    assert!(signer.wait_ready(2, Duration::from_secs(120)) >= 2);
    let held: u64 = kmn
        .status()
        .iter()
        .filter_map(|s| s.ecdsa.as_ref())
        .flat_map(|e| e.keys.iter().map(|k| k.2))
        .sum();
    assert!(held > 0);

    // One node crashes: presignatures involving it are dropped, the other two still sign.
    nodes.remove(0).stop();
    for i in 0..3u32 {
        let msg = format!("after crash {i}");
        let sig = signer.sign(msg.as_bytes())?;
        assert!(verifies(&pk, msg.as_bytes(), &sig));
    }
    // A second one: below the threshold, a clear error, quickly.
    nodes.remove(0).stop();
    let t0 = Instant::now();
    let err = signer.sign_msg(b"too few").unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert!(matches!(err, KmnError::Unavailable(_)), "{err}");
    Ok(())
}

/// Waits until every node answers the coordinator again (after a restart).
fn back(kmn: &Kmn) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while kmn.status().iter().any(|s| s.error.is_some()) || kmn.live_parties().len() < 3 {
        assert!(
            std::time::Instant::now() < until,
            "the nodes did not come back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn interactive_fallback_restart_import_export() -> R {
    let (_dir, layout, nodes, kmn) = network(2, 3)?;
    // Import a key made elsewhere: the same public key, and export gives it back.
    let mut secret = [0u8; 32];
    OsRng.fill_bytes(&mut secret);
    secret[0] &= 0x7f; // below the group order
    let sk = P256SecretKey::from_bytes(&secret)?;
    let pk = kmn.ecdsa_import("imported", &secret)?;
    assert_eq!(pk, sk.public_key());
    assert_eq!(&kmn.ecdsa_export("imported")?[..], &secret[..]);
    assert!(matches!(
        kmn.ecdsa_import("imported", &secret),
        Err(KmnError::Refused { .. })
    ));

    // Key addition (R5): another provider hands over a whole key r2; the network turns its
    // shares of r1 into shares of r1 + r2. The new key is R1 + R2; whoever knew r2 cannot sign
    // for it.
    let mut r2_bytes = [0u8; 32];
    OsRng.fill_bytes(&mut r2_bytes);
    r2_bytes[0] &= 0x7f;
    let r2 = P256SecretKey::from_bytes(&r2_bytes)?;
    let sum_pk = kmn.ecdsa_add_key("sum", "imported", &r2_bytes)?;
    assert_ne!(sum_pk, r2.public_key());
    assert_ne!(sum_pk, pk);
    let sum_secret = kmn.ecdsa_export("sum")?;
    assert_eq!(*sum_secret, add_mod_n(&secret, &r2_bytes));
    let sum_signer = kmn.ecdsa_signer("sum", 0)?;
    let sig = sum_signer.sign(b"to the new key")?;
    assert!(verifies(&sum_pk, b"to the new key", &sig));
    let by_sender = r2.sign(b"to the new key")?;
    assert!(!verifies(&sum_pk, b"to the new key", &by_sender));
    // The key added to is kept; bad requests change nothing.
    assert_eq!(&kmn.ecdsa_export("imported")?[..], &secret[..]);
    // A taken name is refused before any node is sent anything; finishing the commit of a
    // committed key changes nothing.
    assert!(matches!(
        kmn.ecdsa_add_key("sum", "imported", &r2_bytes),
        Err(KmnError::Refused { .. })
    ));
    let held = kmn.commit_pending("sum")?;
    assert!(held.ecdsa);
    assert_eq!(held.public[..33], sum_pk.0);
    let mut other = r2_bytes;
    other[31] ^= 1;
    for (name, from, addend) in [
        ("sum", "imported", other),         // the name is taken
        ("sum2", "no-such-key", r2_bytes),  // nothing to add to
        ("sum3", "imported", [0u8; 32]),    // zero is not a key
        ("sum4", "imported", P256_ORDER),   // out of range
        ("bad/name", "imported", r2_bytes), // not a key name
    ] {
        let err = kmn.ecdsa_add_key(name, from, &addend).unwrap_err();
        assert!(matches!(err, KmnError::Refused { .. }), "{name}: {err}");
    }
    for s in kmn.status() {
        let keys = s.ecdsa.expect("ecdsa state").keys;
        assert!(!keys.iter().any(|k| k.0.starts_with("sum") && k.0 != "sum"));
    }

    // A key addition whose coordinator failed after two of three nodes stored their share:
    // pending, it signs nothing and cannot be committed; the same addition again finishes it.
    for p in [1, 2] {
        let add = Request::EcdsaAddKey {
            key_id: "half".into(),
            from: "imported".into(),
            addend: r2_bytes.to_vec(),
        };
        let Response::Key(identity) = kmn.ask(p, add)? else {
            panic!("no key");
        };
        assert_eq!(identity[..33], sum_pk.0);
    }
    let st = kmn.status();
    assert_eq!(
        st[0].pending,
        vec![("half".into(), "p256".into(), hex::encode(sum_pk.0))]
    );
    assert!(st[2].pending.is_empty());
    assert!(kmn.ecdsa_signer("half", 0).is_err());
    assert!(kmn.ecdsa_export("half").is_err());
    let err = kmn.commit_pending("half").unwrap_err().to_string();
    assert!(err.contains("node 3 does not hold it"), "{err}");
    assert_eq!(kmn.ecdsa_add_key("half", "imported", &r2_bytes)?, sum_pk);
    assert!(kmn.status().iter().all(|s| s.pending.is_empty()));
    let sig = kmn.ecdsa_signer("half", 0)?.sign(b"half, finished")?;
    assert!(verifies(&sum_pk, b"half, finished", &sig));

    // Two imports of one secret make two different splits with the same public key. Nodes
    // holding shares from both must not be committed together: the identities differ.
    let first = florin_custody::ecdsa::import(&secret, 2, 3, &mut OsRng)?;
    let second = florin_custody::ecdsa::import(&secret, 2, 3, &mut OsRng)?;
    for s in [&first[0], &first[1], &second[2]] {
        let import = Request::EcdsaImport {
            key_id: "mixed".into(),
            share: s.to_bytes(),
        };
        assert!(matches!(kmn.ask(s.party(), import)?, Response::Key(_)));
    }
    let err = kmn.commit_pending("mixed").unwrap_err().to_string();
    assert!(err.contains("different keys"), "{err}");
    let commit = Request::Commit {
        key_id: "mixed".into(),
        public: second[2].identity(),
    };
    assert!(matches!(kmn.ask(1, commit)?, Response::Refused(_)));
    // A FROST key of the name, committed, drops the ECDSA pending shares; the name is taken.
    let group = kmn.import_seed("mixed", &[9u8; 32])?;
    assert!(kmn.status().iter().all(|s| s.pending.is_empty()));
    assert_eq!(kmn.group("mixed")?, group);
    assert!(matches!(
        kmn.ecdsa_import("mixed", &secret),
        Err(KmnError::Refused { .. })
    ));

    // Pool of one, then a restart of every node: the nodes kept the presignature (sealed,
    // on disk), and it still signs — once.
    let signer = kmn.ecdsa_signer("imported", 1)?;
    assert!(signer.wait_ready(1, Duration::from_secs(60)) >= 1);
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let nodes = layout.start_in_process()?;
    back(&kmn);
    let sig = signer.sign(b"after restart")?;
    assert!(verifies(&pk, b"after restart", &sig));
    let st = signer.stats();
    assert_eq!(st.from_presig, 1, "{st:?}");
    drop(signer);
    // A restarted coordinator takes back what the nodes hold unused, and nothing used.
    let coordinator = kmn.ecdsa_signer("imported", 2)?;
    assert!(coordinator.wait_ready(2, Duration::from_secs(60)) >= 2);
    drop(coordinator);
    std::thread::sleep(Duration::from_millis(100));
    let held: Vec<([u8; 16], Vec<u8>)> = match kmn.ask(
        1,
        Request::EcdsaPresigs {
            key_id: "imported".into(),
        },
    )? {
        Response::Presigs(v) => v,
        other => panic!("{other:?}"),
    };
    let adopted = kmn.ecdsa_signer("imported", 2)?;
    assert!(adopted.ready() >= 1, "nothing adopted");
    // A presignature used at node 1 is gone from it for good, also after a restart: asked to
    // sign with it again, the node refuses.
    let used = held
        .iter()
        .find(|(_, p)| {
            florin_custody::ecdsa::PresigPublic::from_bytes(p)
                .map(|p| p.signers.contains(&1))
                .unwrap_or(false)
        })
        .map(|(id, _)| *id)
        .expect("a presignature with node 1");
    let partial = |kmn: &Kmn| {
        kmn.ask(
            1,
            Request::EcdsaPartial {
                key_id: "imported".into(),
                presig: used,
                message: b"twice?".to_vec(),
            },
        )
    };
    assert!(matches!(partial(&kmn)?, Response::EcdsaPartial(_)));
    drop(adopted);
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let _nodes = layout.start_in_process()?;
    back(&kmn);
    match partial(&kmn) {
        Ok(Response::Refused(r)) => {
            let r = format!("{r:?}");
            assert!(r.contains("stale") || r.contains("nknown"), "{r}");
        }
        other => panic!("a used presignature after a restart: {other:?}"),
    }
    // Its file is gone from node 1.
    let files: Vec<String> =
        std::fs::read_dir(layout.node_dir(1).join("presigs").join("imported"))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
    assert!(!files.contains(&hex::encode(used)), "{files:?}");
    back(&kmn);
    // Shares and auxiliary information survived, the added key's too.
    for s in kmn.status() {
        let e = s.ecdsa.expect("ecdsa state");
        assert!(e.aux_ready);
        assert!(e.keys.iter().any(|k| k.0 == "imported"));
        assert!(e.keys.iter().any(|k| k.0 == "sum"));
    }
    let sig = kmn.ecdsa_signer("sum", 0)?.sign(b"sum after restart")?;
    assert!(verifies(&sum_pk, b"sum after restart", &sig));
    // Interactive signing alone (no pool).
    let plain = kmn.ecdsa_signer("imported", 0)?;
    let sig = plain.sign(b"interactive")?;
    assert!(verifies(&pk, b"interactive", &sig));
    assert_eq!(plain.stats().interactive, 1);
    Ok(())
}

#[test]
fn tampered_relay_names_the_sender_and_bad_requests_are_refused() -> R {
    // A payment provider's client key may use its customers' keys ("psp-*") only.
    let psp = florin_crypto::LocalSigner::new(florin_crypto::SecretKey::generate(&mut OsRng));
    let psp_addr = florin_crypto::Signer::public_key(&psp).to_address();
    let (_dir, layout, _nodes, kmn) =
        network_with(2, 3, |l| l.grant(&psp_addr, Some(&["psp-*".to_string()])))?;
    kmn.ecdsa_keygen("k")?;
    kmn.ecdsa_keygen("psp-alice")?;
    let client = Kmn::new(&layout.load()?.0, psp)?;
    let sig = client.ecdsa_signer("psp-alice", 1)?.sign_msg(b"pay")?;
    p256::verify(&client.ecdsa_public_key("psp-alice")?, b"pay", &sig)?;
    for job in [
        EcdsaJob::Presign {
            key_id: "k".into(),
            signers: vec![1, 2],
        },
        EcdsaJob::Sign {
            key_id: "k".into(),
            signers: vec![1, 2],
            message: b"not yours".to_vec(),
        },
        EcdsaJob::Keygen {
            key_id: "psp-bob".into(),
            t: 2,
        },
    ] {
        match client.ecdsa_run(rand::random(), &[1, 2], job.clone()) {
            Err(KmnError::Refused { message, .. }) => {
                assert!(message.contains("not allowed"), "{job:?}: {message}")
            }
            other => panic!("{job:?} ran for a client without the right: {other:?}"),
        }
    }
    assert!(client.ecdsa_export("psp-alice").is_err());
    // One client holds at most half of a node's run slots: runs it starts and never steps
    // do not lock out the others.
    let start = |who: &Kmn, session: [u8; 16]| {
        who.ask(
            1,
            Request::EcdsaStart {
                session,
                job: EcdsaJob::Presign {
                    key_id: "psp-alice".into(),
                    signers: vec![1, 2],
                },
            },
        )
    };
    let mut held = Vec::new();
    for _ in 0..florin_node::custody::MAX_RUNS_PER_CLIENT {
        let session: [u8; 16] = rand::random();
        match start(&client, session)? {
            Response::EcdsaStep { .. } => held.push(session),
            other => panic!("a client's run was refused early: {other:?}"),
        }
    }
    match start(&client, rand::random())? {
        Response::Refused(r) => assert!(r.message.contains("one client"), "{}", r.message),
        other => panic!("a client took more than its share of run slots: {other:?}"),
    }
    // The administrator is served meanwhile, and the client again once it ends a run.
    kmn.ecdsa_run(
        rand::random(),
        &[1, 2],
        EcdsaJob::Presign {
            key_id: "k".into(),
            signers: vec![1, 2],
        },
    )?;
    assert!(matches!(
        client.ask(1, Request::EcdsaAbort { session: held[0] })?,
        Response::Aborted
    ));
    assert!(matches!(
        start(&client, rand::random())?,
        Response::EcdsaStep { .. }
    ));
    // A relay that flips a byte of party 2's message after the coordinator took it: its
    // recipient refuses the run but blames no one (anyone on the way could have done it; the
    // coordinator checks each sender's signature as it receives the envelope).
    let job = EcdsaJob::Presign {
        key_id: "k".into(),
        signers: vec![1, 2],
    };
    let mut tampered = false;
    let err = kmn
        .ecdsa_run_relaying([7; 16], &[1, 2], job.clone(), &mut |_, envs| {
            if let Some(e) = envs.iter_mut().find(|e| e.from == 2 && !tampered) {
                let last = e.payload.len() - 1;
                e.payload[last] ^= 1;
                tampered = true;
            }
        })
        .unwrap_err();
    assert!(tampered);
    match err {
        KmnError::Refused {
            party: 1,
            culprit: None,
            message,
        } => assert!(message.contains("altered"), "{message}"),
        e => panic!("expected party 1 to refuse without blame, got {e:?}"),
    }
    // A replayed envelope of another run is refused (bound to its session).
    let mut first: Vec<florin_custody::envelope::Envelope> = Vec::new();
    kmn.ecdsa_run_relaying([8; 16], &[1, 2], job.clone(), &mut |step, envs| {
        if step == 0 {
            first = envs.clone();
        }
    })?;
    let err = kmn
        .ecdsa_run_relaying([9; 16], &[1, 2], job.clone(), &mut |step, envs| {
            if step == 0 {
                *envs = first.clone();
            }
        })
        .unwrap_err();
    assert!(
        matches!(err, KmnError::Refused { culprit: None, .. }),
        "replay must be refused: {err}"
    );
    // A run id is used once.
    match kmn.ecdsa_run([8; 16], &[1, 2], job.clone()) {
        Err(KmnError::Refused { message, .. }) => assert!(message.contains("used before")),
        other => panic!("a reused run id was accepted: {other:?}"),
    }
    // Unknown keys, wrong signer sets, a party outside the network.
    for job in [
        EcdsaJob::Presign {
            key_id: "nope".into(),
            signers: vec![1, 2],
        },
        EcdsaJob::Presign {
            key_id: "k".into(),
            signers: vec![1, 2, 3],
        },
        EcdsaJob::Keygen {
            key_id: "Bad Name".into(),
            t: 2,
        },
    ] {
        let mut session = [0u8; 16];
        OsRng.fill_bytes(&mut session);
        assert!(
            matches!(
                kmn.ecdsa_run(session, &[1, 2], job.clone()),
                Err(KmnError::Refused { .. })
            ),
            "{job:?}"
        );
    }
    assert!(kmn.ecdsa_run([2; 16], &[1, 4], job).is_err());
    Ok(())
}

#[test]
fn a_node_without_ecdsa_says_so() -> R {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(2, &free_loopback_addrs(3)?)?;
    let _nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    let err = kmn.ecdsa_setup(Duration::from_millis(100)).unwrap_err();
    assert!(err.to_string().contains("ECDSA not enabled"), "{err}");
    match kmn.ecdsa_keygen("k") {
        Err(KmnError::Refused { message, .. }) => {
            assert!(message.contains("does not run ECDSA"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    Ok(())
}

/// A t-of-n network serving DKLs23 keys only: no primes, no set-up.
fn dkls_network(t: u16, n: usize) -> Result<Net, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(t, &free_loopback_addrs(n)?)?;
    layout.set_ecdsa(Some(EcdsaLevel::Dkls23))?;
    let nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    Ok((dir, layout, nodes, kmn))
}

#[test]
fn dkls23_keys_without_setup_sign_refresh_restart_import_export() -> R {
    use florin_node::custody::EcdsaEngine;
    let (_dir, layout, mut nodes, kmn) = dkls_network(2, 3)?;
    for s in kmn.status() {
        let e = s.ecdsa.expect("ecdsa state");
        assert_eq!(e.level, "dkls23");
        assert!(!e.aux_ready && !e.primes_ready, "{e:?}");
    }
    // CGGMP24 is refused on a DKLs23-only network, with the reason.
    let err = kmn.ecdsa_keygen("c").unwrap_err().to_string();
    assert!(err.contains("DKLs23 ECDSA keys only"), "{err}");

    let t0 = Instant::now();
    let pk = kmn.ecdsa_keygen_with("w", EcdsaEngine::Dkls23)?;
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert_eq!(kmn.ecdsa_engine("w")?, EcdsaEngine::Dkls23);
    assert_eq!(kmn.ecdsa_public_key("w")?, pk);
    // One name, one key.
    assert!(kmn.ecdsa_keygen_with("w", EcdsaEngine::Dkls23).is_err());
    assert!(kmn.dkg("w").is_err());

    // Any two of three sign; the pool asked for is ignored (no presignatures).
    let signer = kmn.ecdsa_signer("w", 4)?;
    assert_eq!(signer.engine(), EcdsaEngine::Dkls23);
    for i in 0..4u32 {
        let msg = format!("pay {i}");
        let sig = signer.sign(msg.as_bytes())?;
        assert!(verifies(&pk, msg.as_bytes(), &sig));
    }
    assert_eq!(signer.ready(), 0);
    assert_eq!(signer.stats().interactive, 4);
    assert!(signer.presign().is_err());
    // CGGMP24 requests for a DKLs23 key are refused.
    for job in [
        EcdsaJob::Presign {
            key_id: "w".into(),
            signers: vec![1, 2],
        },
        EcdsaJob::Sign {
            key_id: "w".into(),
            signers: vec![1, 2],
            message: b"m".to_vec(),
        },
    ] {
        assert!(matches!(
            kmn.ecdsa_run(rand::random(), &[1, 2], job),
            Err(KmnError::Refused { .. })
        ));
    }
    // A DKLs23 run for a signer set of the wrong size, or naming a party twice: refused.
    for signers in [vec![1u16], vec![1, 1], vec![1, 2, 3]] {
        let job = EcdsaJob::DklsSign {
            key_id: "w".into(),
            signers: signers.clone(),
            message: b"m".to_vec(),
            authz: None,
        };
        let mut parties = signers.clone();
        parties.dedup();
        assert!(
            kmn.ecdsa_run(rand::random(), &parties, job).is_err(),
            "{signers:?}"
        );
    }

    // Refresh: the same public key, a new sharing; the old shares are gone from the nodes.
    let before: Vec<Vec<u8>> = (1..=3u16)
        .map(
            |p| match kmn.ask(p, Request::EcdsaExport { key_id: "w".into() }) {
                Ok(Response::Exported(b)) => b,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    let secret = kmn.ecdsa_export("w")?;
    // A refresh commits only with every node's signed attestation that it holds the new
    // sharing: a plain commit, a missing attestation or a forged one is refused, so no
    // coordinator can leave the nodes on different sharings.
    let done = kmn.ecdsa_run(
        rand::random(),
        &[1, 2, 3],
        EcdsaJob::DklsRefresh { key_id: "w".into() },
    )?;
    let mut atts = Vec::new();
    let mut new_id = Vec::new();
    for (p, d) in done {
        let florin_custody::wire::EcdsaDone::Refreshed {
            identity,
            attestation,
        } = d
        else {
            panic!("node {p}: {d:?}");
        };
        new_id = identity;
        atts.push((p, attestation));
    }
    let plain = Request::Commit {
        key_id: "w".into(),
        public: new_id.clone(),
    };
    assert!(matches!(kmn.ask(1, plain)?, Response::Refused(_)));
    let mut forged = atts.clone();
    forged[2].1[0] ^= 1;
    for bad in [atts[..2].to_vec(), forged] {
        let req = Request::CommitRefresh {
            key_id: "w".into(),
            identity: new_id.clone(),
            attestations: bad,
        };
        match kmn.ask(1, req)? {
            Response::Refused(r) => assert!(r.message.contains("attestation"), "{}", r.message),
            other => panic!("{other:?}"),
        }
    }
    // Still the old sharing everywhere: it signs.
    let sig = signer.sign(b"before the refresh is committed")?;
    assert!(verifies(&pk, b"before the refresh is committed", &sig));
    // A coordinator that stops after committing at node 1 only: nodes 2 and 3 still sign
    // together on the old sharing, and finishing the refresh commits it everywhere.
    let full = Request::CommitRefresh {
        key_id: "w".into(),
        identity: new_id.clone(),
        attestations: atts.clone(),
    };
    assert!(matches!(kmn.ask(1, full)?, Response::Key(_)));
    let old_pair = kmn.ecdsa_run(
        rand::random(),
        &[2, 3],
        EcdsaJob::DklsSign {
            key_id: "w".into(),
            signers: vec![2, 3],
            message: b"half committed".to_vec(),
            authz: None,
        },
    )?;
    assert_eq!(old_pair.len(), 2);
    assert_eq!(kmn.ecdsa_finish_refresh("w")?, pk);
    for p in 1..=3u16 {
        let st = kmn.status();
        let e = st[p as usize - 1].ecdsa.clone().expect("ecdsa state");
        assert!(e.keys.iter().any(|k| k.0 == "w"));
        assert!(st[p as usize - 1].pending.is_empty(), "party {p}");
    }
    let done = kmn.ecdsa_run(
        rand::random(),
        &[1, 3],
        EcdsaJob::DklsSign {
            key_id: "w".into(),
            signers: vec![1, 3],
            message: b"finished".to_vec(),
            authz: None,
        },
    )?;
    assert_eq!(done.len(), 2);
    // Finishing again changes nothing.
    assert_eq!(kmn.ecdsa_finish_refresh("w")?, pk);
    assert_eq!(kmn.ecdsa_refresh("w")?, pk);
    for p in 1..=3u16 {
        let Response::Exported(b) = kmn.ask(p, Request::EcdsaExport { key_id: "w".into() })? else {
            panic!("no share");
        };
        assert_ne!(b, before[p as usize - 1], "party {p} kept its old share");
    }
    assert_eq!(kmn.ecdsa_export("w")?, secret);
    let sig = signer.sign(b"after refresh")?;
    assert!(verifies(&pk, b"after refresh", &sig));
    // An old share imported back beside the new ones does not make a key.
    let old = Request::EcdsaImport {
        key_id: "w-old".into(),
        share: before[0].clone(),
    };
    assert!(matches!(kmn.ask(1, old)?, Response::Key(_)));
    assert!(kmn.commit_pending("w-old").is_err());

    // Import and export, and key addition, as DKLs23 keys.
    let mut s2 = [0u8; 32];
    OsRng.fill_bytes(&mut s2);
    s2[0] &= 0x7f;
    let sk = P256SecretKey::from_bytes(&s2)?;
    let ipk = kmn.ecdsa_import_with("imported", &s2, EcdsaEngine::Dkls23)?;
    assert_eq!(ipk, sk.public_key());
    assert_eq!(kmn.ecdsa_engine("imported")?, EcdsaEngine::Dkls23);
    assert_eq!(&kmn.ecdsa_export("imported")?[..], &s2[..]);
    let mut r2 = [0u8; 32];
    OsRng.fill_bytes(&mut r2);
    r2[0] &= 0x7f;
    let sum_pk = kmn.ecdsa_add_key("sum", "imported", &r2)?;
    assert_eq!(*kmn.ecdsa_export("sum")?, add_mod_n(&s2, &r2));
    let sig = kmn.ecdsa_signer("sum", 0)?.sign(b"to the sum")?;
    assert!(verifies(&sum_pk, b"to the sum", &sig));
    // A CGGMP24 import is refused on this network.
    assert!(kmn
        .ecdsa_import_with("c2", &s2, EcdsaEngine::Cggmp24)
        .is_err());

    // One node down: the other two sign. Then every node restarts: keys come back.
    nodes.remove(0).stop();
    let sig = signer.sign(b"one down")?;
    assert!(verifies(&pk, b"one down", &sig));
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let _nodes = layout.start_in_process()?;
    let sig = kmn.ecdsa_signer("w", 0)?.sign(b"after restart")?;
    assert!(verifies(&pk, b"after restart", &sig));
    for s in kmn.status() {
        let e = s.ecdsa.expect("ecdsa state");
        for k in ["w", "imported", "sum"] {
            assert!(e.dkls23.iter().any(|d| d == k), "{k}: {e:?}");
        }
    }
    Ok(())
}

/// A dishonest node 3 sends node 1 a second-round signing message that fails the OT
/// consistency check (re-signed and re-sealed as node 3 would). Node 1 bans node 3 for good:
/// it refuses every later DKLs23 run with it, after a restart too, while nodes 1 and 2 still
/// sign.
#[test]
fn dkls23_a_party_that_fails_an_ot_check_is_banned_for_good() -> R {
    use dkls23_core::protocols::signing::TransmitPhase2to3;
    use florin_custody::envelope::Envelope;
    use florin_node::custody::EcdsaEngine;
    let (_dir, layout, nodes, kmn) = dkls_network(2, 3)?;
    let pk = kmn.ecdsa_keygen_with("w", EcdsaEngine::Dkls23)?;
    let key = |p: u16| -> Result<florin_crypto::SecretKey, Box<dyn std::error::Error>> {
        Ok(florin_node::load_key(
            &layout.node_dir(p).join("identity.key"),
        )?)
    };
    let (k1, k3) = (key(1)?, key(3)?);
    let session: [u8; 16] = rand::random();
    let job = EcdsaJob::DklsSign {
        key_id: "w".into(),
        signers: vec![1, 3],
        message: b"m".to_vec(),
        authz: None,
    };
    // The envelopes' tag, as every node derives it from the run.
    let eid = florin_crypto::hash(
        "florin/custody/ecdsa/run/v1",
        &[
            &session,
            &3u16.to_le_bytes(),
            &florin_custody::wire::encode(&job),
        ],
    );
    let mut tag = [0u8; 16];
    tag.copy_from_slice(&eid[..16]);
    let mut changed = 0;
    let r = kmn.ecdsa_run_relaying(session, &[1, 3], job, &mut |step, envs| {
        if step != 1 {
            return;
        }
        for e in envs.iter_mut().filter(|e| e.from == 3 && e.to == 1) {
            let body = e.open(&tag, 1, 1, &k3.public_key(), &k1).unwrap();
            let mut m: TransmitPhase2to3<p256_dkls::NistP256> =
                postcard::from_bytes(&body).unwrap();
            m.gamma_u = p256_dkls::AffinePoint::GENERATOR;
            let signer3 = florin_crypto::LocalSigner::new(k3.clone());
            *e = Envelope::direct(
                &signer3,
                tag,
                1,
                3,
                1,
                &k1.public_key(),
                &postcard::to_allocvec(&m).unwrap(),
                &mut OsRng,
            )
            .unwrap();
            changed += 1;
        }
    });
    assert_eq!(changed, 1);
    match r {
        Err(KmnError::Refused {
            party: 1,
            culprit: Some(3),
            message,
        }) => assert!(message.contains("banned"), "{message}"),
        other => panic!("{other:?}"),
    }
    let banned_file = layout.node_dir(1).join("ecdsa").join("banned");
    assert_eq!(std::fs::read_to_string(&banned_file)?.trim(), "3");
    let refused_with_3 = |kmn: &Kmn| {
        let job = EcdsaJob::DklsSign {
            key_id: "w".into(),
            signers: vec![1, 3],
            message: b"again".to_vec(),
            authz: None,
        };
        match kmn.ecdsa_run(rand::random(), &[1, 3], job) {
            Err(KmnError::Refused { culprit, .. }) => assert_eq!(culprit, Some(3)),
            other => panic!("node 1 ran with a banned party: {other:?}"),
        }
    };
    refused_with_3(&kmn);
    // A refresh needs every node, node 3 too: refused at node 1.
    assert!(kmn.ecdsa_refresh("w").is_err());
    for s in kmn.status() {
        let e = s.ecdsa.expect("ecdsa state");
        assert_eq!(e.banned, if s.party == 1 { vec![3] } else { vec![] });
    }
    // Nodes 1 and 2 sign; after a restart node 1 still refuses node 3.
    let run = |kmn: &Kmn, signers: Vec<u16>| {
        kmn.ecdsa_run(
            rand::random(),
            &signers.clone(),
            EcdsaJob::DklsSign {
                key_id: "w".into(),
                signers,
                message: b"honest".to_vec(),
                authz: None,
            },
        )
    };
    let done = run(&kmn, vec![1, 2])?;
    let Some(florin_custody::wire::EcdsaDone::Signature(sig)) = done.get(&1).cloned() else {
        panic!("no signature");
    };
    let sig = p256::P256Signature(sig.try_into().unwrap());
    assert!(verifies(&pk, b"honest", &sig));
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let _nodes = layout.start_in_process()?;
    refused_with_3(&kmn);
    assert!(run(&kmn, vec![1, 2]).is_ok());
    Ok(())
}

/// DKLs23 share repair over real sockets: node 3's share file is damaged; nodes 1 and 2 send
/// it masked terms sealed to it; its rebuilt share is hollow (no OT set-up), cannot be
/// committed or sign, until the complete refresh by all three makes every share new. The
/// damaged file is kept aside. A node that holds its share is never "repaired", a term set
/// that does not match the helpers is refused, and a complete refresh also follows an import.
#[test]
fn dkls23_repair_rebuilds_a_lost_share_after_a_complete_refresh() -> R {
    use florin_node::custody::EcdsaEngine;
    let (_dir, layout, nodes, kmn) = dkls_network(2, 3)?;
    let pk = kmn.ecdsa_keygen_with("w", EcdsaEngine::Dkls23)?;
    let secret = kmn.ecdsa_export("w")?;
    let sign_with = |kmn: &Kmn, signers: [u16; 2], msg: &[u8]| {
        kmn.ecdsa_run(
            rand::random(),
            &signers,
            EcdsaJob::DklsSign {
                key_id: "w".into(),
                signers: signers.to_vec(),
                message: msg.to_vec(),
                authz: None,
            },
        )
    };
    // Node 2 holds its share: the coordinator cannot have it "repaired" over it, and node 2
    // writes nothing (no pending share, no customer binding).
    let err = kmn.ecdsa_repair("w", 2).unwrap_err().to_string();
    assert!(err.contains("holds its share"), "{err}");
    assert!(kmn.status()[1].pending.is_empty());
    assert!(!layout
        .node_dir(2)
        .join("customers")
        .join("w.customer")
        .exists());
    assert_eq!(kmn.ecdsa_export("w")?, secret);
    assert!(sign_with(&kmn, [1, 2], b"still whole").is_ok());

    // Node 3's share file is damaged.
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let share3 = layout.node_dir(3).join("shares").join("w.p256");
    let mut b = std::fs::read(&share3)?;
    let m = b.len() / 2;
    b[m] ^= 1;
    std::fs::write(&share3, &b)?;
    let _nodes = layout.start_in_process()?;
    back(&kmn);
    let err = sign_with(&kmn, [1, 3], b"lost").unwrap_err().to_string();
    assert!(err.contains("florin custody repair w --party 3"), "{err}");

    // By hand first: the terms, then the target's finish.
    let session: [u8; 16] = rand::random();
    let mut terms = Vec::new();
    for p in [1u16, 2] {
        let req = Request::DklsRepairTerm {
            session,
            key_id: "w".into(),
            helpers: vec![1, 2],
            target: 3,
        };
        match kmn.ask(p, req)? {
            Response::Repair(envs) => terms.extend(envs),
            other => panic!("{other:?}"),
        }
    }
    // A helper asked about itself, or with the target among the helpers: refused.
    for (helpers, target) in [(vec![1u16, 2], 1u16), (vec![1, 3], 3)] {
        let req = Request::DklsRepairTerm {
            session,
            key_id: "w".into(),
            helpers,
            target,
        };
        assert!(matches!(kmn.ask(1, req)?, Response::Refused(_)));
    }
    // Terms that do not match the helpers named, or only one of them: refused.
    for (helpers, got) in [
        (vec![1u16, 2], terms[..1].to_vec()),
        (vec![1, 2, 3], terms.clone()),
        (vec![2, 1, 1], terms[..1].to_vec()),
    ] {
        let req = Request::DklsRepairFinish {
            session,
            key_id: "w".into(),
            helpers,
            terms: got,
        };
        assert!(matches!(kmn.ask(3, req)?, Response::Refused(_)));
    }
    // Under another run id the seals do not open.
    let other = Request::DklsRepairFinish {
        session: rand::random(),
        key_id: "w".into(),
        helpers: vec![1, 2],
        terms: terms.clone(),
    };
    assert!(matches!(kmn.ask(3, other)?, Response::Refused(_)));
    let finish = Request::DklsRepairFinish {
        session,
        key_id: "w".into(),
        helpers: vec![1, 2],
        terms,
    };
    let Response::Key(identity) = kmn.ask(3, finish)? else {
        panic!("no repaired share");
    };
    assert_eq!(identity[..33], pk.0[..]);
    // Hollow: never committed by a plain commit; node 3 still serves nothing for the key
    // (no signature, no fast refresh), and the hollow share survives a restart.
    let commit = Request::Commit {
        key_id: "w".into(),
        public: identity.clone(),
    };
    match kmn.ask(3, commit)? {
        Response::Refused(r) => assert!(r.message.contains("rebuilt by repair"), "{}", r.message),
        other => panic!("{other:?}"),
    }
    let err = sign_with(&kmn, [1, 3], b"hollow").unwrap_err().to_string();
    assert!(err.contains("cannot use ECDSA key w"), "{err}");
    let err = kmn.ecdsa_refresh("w").unwrap_err().to_string();
    assert!(err.contains("cannot use ECDSA key w"), "{err}");
    drop(_nodes);
    std::thread::sleep(Duration::from_millis(200));
    let _nodes = layout.start_in_process()?;
    back(&kmn);
    assert!(kmn.status()[2].pending.iter().any(|k| k.0 == "w"));
    // The complete refresh makes it whole; every node's share changes, the key does not.
    let before: Vec<Vec<u8>> = (1..=2u16)
        .map(
            |p| match kmn.ask(p, Request::EcdsaExport { key_id: "w".into() }) {
                Ok(Response::Exported(b)) => b,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    // The complete refresh, by hand: node 3's new share is refused a plain commit (it has no
    // committed share to be checked against), and the attested commit takes it.
    let done = kmn.ecdsa_run(
        rand::random(),
        &[1, 2, 3],
        EcdsaJob::DklsRefreshComplete { key_id: "w".into() },
    )?;
    let new_id = match &done[&1] {
        florin_custody::wire::EcdsaDone::Refreshed { identity, .. } => identity.clone(),
        other => panic!("{other:?}"),
    };
    let plain = Request::Commit {
        key_id: "w".into(),
        public: new_id.clone(),
    };
    match kmn.ask(3, plain)? {
        Response::Refused(r) => assert!(r.message.contains("attestation"), "{}", r.message),
        other => panic!("{other:?}"),
    }
    assert_eq!(kmn.ecdsa_finish_refresh("w")?, pk);
    for (i, p) in (1..=2u16).enumerate() {
        let Response::Exported(b) = kmn.ask(p, Request::EcdsaExport { key_id: "w".into() })? else {
            panic!("no share");
        };
        assert_ne!(b, before[i], "party {p} kept its old share");
    }
    for signers in [[1, 3], [2, 3], [1, 2]] {
        let done = sign_with(&kmn, signers, b"repaired")?;
        assert_eq!(done.len(), 2, "{signers:?}");
    }
    assert_eq!(kmn.ecdsa_export("w")?, secret);
    let aside = std::fs::read_dir(layout.node_dir(3).join("shares"))?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("w.p256.damaged-")
        })
        .count();
    assert_eq!(aside, 1, "the damaged share is kept aside");
    for s in kmn.status() {
        assert!(s.pending.is_empty(), "party {}: {:?}", s.party, s.pending);
    }

    // The whole repair in one call, after node 1 loses its file outright. A key bound to a
    // customer ("b") gets its binding back from the helpers too, though node 1 lost it.
    let customer = florin_crypto::SecretKey::from_seed(&[8; 32]).public_key();
    kmn.bind_customer("b", &customer)?;
    kmn.ecdsa_keygen_with("b", EcdsaEngine::Dkls23)?;
    let binding = |p: u16| layout.node_dir(p).join("customers").join("b.customer");
    let kept = std::fs::read(binding(2))?;
    drop(_nodes);
    std::thread::sleep(Duration::from_millis(200));
    std::fs::remove_file(layout.node_dir(1).join("shares").join("w.p256"))?;
    std::fs::remove_file(layout.node_dir(1).join("shares").join("b.p256"))?;
    std::fs::remove_file(binding(1))?;
    let _nodes = layout.start_in_process()?;
    back(&kmn);
    assert_eq!(kmn.ecdsa_repair("b", 1)?, vec![2, 3]);
    assert_eq!(std::fs::read(binding(1))?, kept);
    assert_eq!(kmn.ecdsa_repair("w", 1)?, vec![2, 3]);
    let sig = kmn.ecdsa_signer("w", 0)?.sign(b"after the second repair")?;
    assert!(verifies(&pk, b"after the second repair", &sig));
    assert!(sign_with(&kmn, [1, 2], b"node 1 again").is_ok());

    // An imported key, then its complete refresh: the dealer's OT set-up is gone.
    let mut s2 = [0u8; 32];
    OsRng.fill_bytes(&mut s2);
    s2[0] &= 0x7f;
    let ipk = kmn.ecdsa_import_with("imp", &s2, EcdsaEngine::Dkls23)?;
    assert_eq!(kmn.ecdsa_refresh_complete("imp")?, ipk);
    assert_eq!(&kmn.ecdsa_export("imp")?[..], &s2[..]);
    let sig = kmn.ecdsa_signer("imp", 0)?.sign(b"imported, refreshed")?;
    assert!(verifies(&ipk, b"imported, refreshed", &sig));
    Ok(())
}
