//! The key-management network over real sockets, nodes in this process: key generation,
//! threshold signing through the `Signer` trait, node failures, restarts, import, export,
//! refusals.

use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_crypto::{verify, LocalSigner, SecretKey, Signer};
use florin_custody::envelope::Envelope;
use florin_custody::frost::{scalar_public_key, split_ed25519_seed, DkgParty, KeyShare};
use florin_custody::wire::{self, DkgEcho, Refusal, Request, Response};
use florin_node::custody::{
    free_loopback_addrs, Kmn, KmnError, Layout, RunningNode, ThresholdSigner,
};
use rand::rngs::OsRng;

type R = Result<(), Box<dyn std::error::Error>>;

type Net = (tempfile::TempDir, Layout, Vec<RunningNode>, Arc<Kmn>);

fn network(t: u16, n: usize) -> Result<Net, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(t, &free_loopback_addrs(n)?)?;
    let nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    Ok((dir, layout, nodes, kmn))
}

fn dalek_ok(pk: &florin_crypto::PublicKey, msg: &[u8], sig: &florin_crypto::Signature) -> bool {
    ed25519_dalek::VerifyingKey::from_bytes(&pk.0)
        .map(|vk| {
            vk.verify_strict(msg, &ed25519_dalek::Signature::from_bytes(&sig.0))
                .is_ok()
        })
        .unwrap_or(false)
}

#[test]
fn dkg_sign_survive_a_node_and_fail_clearly_below_threshold() -> R {
    let (_dir, _layout, mut nodes, kmn) = network(2, 3)?;
    let group = kmn.dkg("issuer")?;
    assert_eq!(group.threshold(), 2);
    // The same key name twice is refused.
    assert!(matches!(kmn.dkg("issuer"), Err(KmnError::Refused { .. })));
    let signer = kmn.signer("issuer")?;
    assert_eq!(signer.public_key(), group.public_key());
    for i in 0..50u32 {
        let msg = format!("mint {i}");
        let sig = signer.sign(msg.as_bytes())?;
        assert!(verify(&group.public_key(), msg.as_bytes(), &sig).is_ok());
        assert!(dalek_ok(&group.public_key(), msg.as_bytes(), &sig));
    }
    // Concurrent signers share the network.
    let signer = Arc::new(signer);
    let handles: Vec<_> = (0..4)
        .map(|th| {
            let s = signer.clone();
            std::thread::spawn(move || {
                (0..25)
                    .map(|i| {
                        let m = format!("{th}/{i}");
                        s.sign(m.as_bytes()).map(|sig| (m, sig))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        for r in h.join().map_err(|_| "thread panicked")? {
            let (m, sig) = r?;
            assert!(verify(&group.public_key(), m.as_bytes(), &sig).is_ok());
        }
    }
    // One node crashes: the other two still sign.
    nodes.remove(0).stop();
    for i in 0..10u32 {
        let msg = format!("after crash {i}");
        let sig = signer.sign(msg.as_bytes())?;
        assert!(verify(&group.public_key(), msg.as_bytes(), &sig).is_ok());
    }
    // A second one: below the threshold, a clear error, quickly.
    nodes.remove(0).stop();
    let start = Instant::now();
    let err = signer
        .sign(b"one node left")
        .err()
        .ok_or("signed with one node")?;
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    let text = err.to_string();
    assert!(text.contains("2 of 3"), "{text}");
    Ok(())
}

#[test]
fn restart_keeps_shares_and_old_nonces_are_refused() -> R {
    let (_dir, layout, nodes, kmn) = network(2, 3)?;
    let group = kmn.dkg("authority")?;
    let signer = kmn.signer("authority")?;
    signer.sign(b"before")?;
    // Every node restarts; the signer still holds commitments from before, which the new
    // processes never issued.
    for n in nodes {
        n.stop();
    }
    std::thread::sleep(Duration::from_millis(100));
    let nodes = layout.start_in_process()?;
    let sig = signer.sign(b"after restart")?;
    assert!(verify(&group.public_key(), b"after restart", &sig).is_ok());
    assert_eq!(kmn.group("authority")?, group);
    // Shares are encrypted at rest: the file does not hold the share's bytes, and a changed
    // file is never served: the node starts, leaves the file as it is, and refuses the key
    // by the file's name until it is repaired (more in tests/integrity_custody_psp.rs).
    let path = layout.node_dir(1).join("shares").join("authority.share");
    let sealed = std::fs::read(&path)?;
    assert!(sealed.len() > 100);
    let mut bad = sealed.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    for n in nodes {
        n.stop();
    }
    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(&path, &bad)?;
    let _nodes = layout.start_in_process()?;
    assert_eq!(std::fs::read(&path)?, bad);
    let export = Request::Export {
        key_id: "authority".into(),
    };
    match kmn.ask(1, export)? {
        Response::Refused(r) => assert!(
            r.message.contains(&path.display().to_string())
                && r.message
                    .contains("florin custody repair authority --party 1"),
            "{}",
            r.message
        ),
        other => return Err(format!("node 1 served a damaged share: {other:?}").into()),
    }
    Ok(())
}

#[test]
fn import_export_and_access_control() -> R {
    let (_dir, layout, _nodes, kmn) = network(2, 3)?;
    let old = SecretKey::generate(&mut OsRng);
    let seed: [u8; 32] = hex::decode(old.to_hex())?
        .try_into()
        .map_err(|_| "seed length")?;
    let group = kmn.import_seed("legacy", &seed)?;
    assert_eq!(group.public_key(), old.public_key());
    let sig = kmn.signer("legacy")?.sign(b"still the old key")?;
    assert!(verify(&old.public_key(), b"still the old key", &sig).is_ok());
    let scalar = kmn.export("legacy")?;
    assert_eq!(scalar_public_key(&scalar)?, old.public_key());
    // A stranger's key is not a client: the nodes drop it.
    let (net, _) = layout.load()?;
    let stranger = Kmn::new(&net, LocalSigner::new(SecretKey::generate(&mut OsRng)))?;
    assert!(stranger.group("legacy").is_err());
    let s = florin_node::custody::ThresholdSigner::new(stranger.clone(), group);
    assert!(s.sign(b"x").is_err());
    assert!(stranger.export("legacy").is_err());
    Ok(())
}

fn seed_of(k: &SecretKey) -> Result<[u8; 32], Box<dyn std::error::Error>> {
    Ok(hex::decode(k.to_hex())?
        .try_into()
        .map_err(|_| "seed length")?)
}

/// A key is stored as pending at each node and signs nothing until every node holds it and
/// the coordinator commits it: here the coordinator "fails" after storing (the shares are
/// sent by hand), then after committing at one node only.
#[test]
fn a_key_signs_only_after_every_node_committed_it() -> R {
    let (_dir, layout, nodes, kmn) = network(2, 3)?;
    let old = SecretKey::generate(&mut OsRng);
    let (group, shares) = split_ed25519_seed("legacy", &seed_of(&old)?, 2, 3, &mut OsRng)?;
    for s in &shares {
        let import = Request::Import {
            key_id: "legacy".into(),
            share: s.to_bytes().to_vec(),
        };
        assert_eq!(kmn.ask(s.party(), import)?, Response::Key(group.to_bytes()));
    }
    // Pending: listed as such, not as a key; it gives no nonces, no signer, no export.
    for s in kmn.status() {
        assert!(s.keys.is_empty(), "{s:?}");
        assert_eq!(
            s.pending,
            vec![(
                "legacy".to_string(),
                "ed25519".to_string(),
                old.public_key().to_address()
            )]
        );
    }
    assert!(kmn.group("legacy").is_err());
    assert!(kmn.signer("legacy").is_err());
    assert!(kmn.export("legacy").is_err());
    // A pending key signs nothing, even with a nonce the node handed out.
    let nonce = match kmn.ask(1, Request::Commitments { count: 1 })? {
        Response::Commitments(list) => list[0].0,
        other => panic!("commitments: {other:?}"),
    };
    let sign = Request::Sign {
        key_id: "legacy".into(),
        group: [0; 32],
        nonce,
        package: vec![0; 8],
    };
    match kmn.ask(1, sign)? {
        Response::Refused(r) => assert!(r.message.contains("legacy"), "{}", r.message),
        other => panic!("a pending key signed: {other:?}"),
    }
    // A commit must name the key the node holds.
    let wrong = Request::Commit {
        key_id: "legacy".into(),
        public: vec![7; 40],
    };
    assert!(matches!(kmn.ask(1, wrong)?, Response::Refused(_)));
    // Committed at node 1 only: one node is below the threshold.
    let commit = Request::Commit {
        key_id: "legacy".into(),
        public: group.to_bytes(),
    };
    assert_eq!(kmn.ask(1, commit)?, Response::Key(group.to_bytes()));
    assert!(kmn.group("legacy").is_err());
    // Another key under the name is refused before any node is sent a share, so the pending
    // shares at nodes 2 and 3 are not replaced.
    let other = SecretKey::generate(&mut OsRng);
    assert!(matches!(
        kmn.import_seed("legacy", &seed_of(&other)?),
        Err(KmnError::Refused { .. })
    ));
    // Pending and committed shares survive a restart of every node; then the commit round is
    // finished, and finishing it again changes nothing.
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let _nodes = layout.start_in_process()?;
    let held = kmn.commit_pending("legacy")?;
    assert!(!held.ecdsa);
    assert_eq!(held.public, group.to_bytes());
    assert_eq!(kmn.commit_pending("legacy")?, held);
    assert_eq!(kmn.group("legacy")?, group);
    let sig = kmn.signer("legacy")?.sign(b"committed")?;
    assert!(dalek_ok(&old.public_key(), b"committed", &sig));
    assert!(kmn.status().iter().all(|s| s.pending.is_empty()));

    // A run that stored shares at two nodes of three: not committable, and a new run of the
    // name replaces the pending shares.
    let lost = SecretKey::generate(&mut OsRng);
    let (_, part) = split_ed25519_seed("two", &seed_of(&lost)?, 2, 3, &mut OsRng)?;
    for s in part.iter().take(2) {
        let import = Request::Import {
            key_id: "two".into(),
            share: s.to_bytes().to_vec(),
        };
        assert!(matches!(kmn.ask(s.party(), import)?, Response::Key(_)));
    }
    let err = kmn.commit_pending("two").unwrap_err().to_string();
    assert!(err.contains("node 3 does not hold it"), "{err}");
    let fresh = SecretKey::generate(&mut OsRng);
    let g2 = kmn.import_seed("two", &seed_of(&fresh)?)?;
    assert_eq!(g2.public_key(), fresh.public_key());
    let sig = kmn.signer("two")?.sign(b"replaced")?;
    assert!(dalek_ok(&fresh.public_key(), b"replaced", &sig));
    assert!(kmn.status().iter().all(|s| s.pending.is_empty()));
    // Nothing to commit.
    assert!(kmn.commit_pending("nothing").is_err());
    let none = Request::Commit {
        key_id: "nothing".into(),
        public: vec![1],
    };
    assert!(matches!(kmn.ask(2, none)?, Response::Refused(_)));
    Ok(())
}

type Echo = (Envelope, Vec<Envelope>);

fn dkg_start(kmn: &Kmn, p: u16, session: [u8; 16]) -> Result<Envelope, Box<dyn std::error::Error>> {
    let start = Request::DkgStart {
        session,
        key_id: "k".into(),
        t: 2,
        n: 3,
    };
    match kmn.ask(p, start)? {
        Response::DkgRound1(e) => Ok(e),
        other => Err(format!("round 1 of node {p}: {other:?}").into()),
    }
}

fn dkg_round2(
    kmn: &Kmn,
    p: u16,
    session: [u8; 16],
    round1: Vec<Envelope>,
) -> Result<Echo, Box<dyn std::error::Error>> {
    match kmn.ask(p, Request::DkgRound2 { session, round1 })? {
        Response::DkgRound2 { echo, direct } => Ok((echo, direct)),
        other => Err(format!("round 2 of node {p}: {other:?}").into()),
    }
}

fn dkg_refusal(
    kmn: &Kmn,
    p: u16,
    session: [u8; 16],
    echoes: Vec<Envelope>,
    direct: Vec<Envelope>,
) -> Result<Refusal, Box<dyn std::error::Error>> {
    let direct = direct.into_iter().filter(|e| e.to == p).collect();
    match kmn.ask(
        p,
        Request::DkgFinish {
            session,
            echoes,
            direct,
        },
    )? {
        Response::Refused(r) => Ok(r),
        other => Err(format!("node {p} finished: {other:?}").into()),
    }
}

/// The echo check weighs signed evidence: a node that sent two different round-1 messages is
/// named, a node that lies about what it received is named instead of the honest sender it
/// accuses, and a message broken on the way is blamed on the way. The test plays node 3 (with
/// its identity key) and the relay; nodes 1 and 2 are real.
#[test]
fn dkg_evidence_names_the_equivocator_or_the_lying_witness() -> R {
    let (_dir, layout, _nodes, kmn) = network(2, 3)?;
    let id3 = LocalSigner::new(SecretKey::from_hex(
        std::fs::read_to_string(layout.node_dir(3).join("identity.key"))?.trim(),
    )?);
    let echo3 = |session, frost: Vec<u8>, seen| {
        Envelope::broadcast(&id3, session, 2, 3, wire::encode(&DkgEcho { frost, seen }))
    };

    // Node 3 sends one round-1 message to node 1 and another to node 2.
    let s = rand::random::<[u8; 16]>();
    let (e1, e2) = (dkg_start(&kmn, 1, s)?, dkg_start(&kmn, 2, s)?);
    let (mut p3, m_a) = DkgParty::start("k", 3, 2, 3, &mut OsRng)?;
    let (_, m_b) = DkgParty::start("k", 3, 2, 3, &mut OsRng)?;
    let a = Envelope::broadcast(&id3, s, 1, 3, m_a)?;
    let b = Envelope::broadcast(&id3, s, 1, 3, m_b)?;
    let (_, _) = dkg_round2(&kmn, 1, s, vec![e2.clone(), a.clone()])?;
    let (echo2, direct2) = dkg_round2(&kmn, 2, s, vec![e1.clone(), b])?;
    let out3 = p3.round2(&[(1, e1.payload.clone()), (2, e2.payload.clone())].into())?;
    let seen = vec![e1.attestation(), e2.attestation(), a.attestation()];
    let mine = echo3(s, out3.echo, seen)?;
    let r = dkg_refusal(&kmn, 1, s, vec![echo2, mine], direct2)?;
    assert_eq!(r.culprit, Some(3), "{}", r.message);
    assert!(r.message.contains("different messages"), "{}", r.message);

    // Node 3 sends one message to both, then lies in its echo about what node 1 sent.
    let s = rand::random::<[u8; 16]>();
    let (e1, e2) = (dkg_start(&kmn, 1, s)?, dkg_start(&kmn, 2, s)?);
    let (mut p3, m) = DkgParty::start("k", 3, 2, 3, &mut OsRng)?;
    let a = Envelope::broadcast(&id3, s, 1, 3, m)?;
    let (echo1, direct1) = dkg_round2(&kmn, 1, s, vec![e2.clone(), a.clone()])?;
    let (echo2, direct2) = dkg_round2(&kmn, 2, s, vec![e1.clone(), a.clone()])?;
    let out3 = p3.round2(&[(1, e1.payload.clone()), (2, e2.payload.clone())].into())?;
    // Its FROST digests say node 1's message was another one; so does its attestation, with
    // node 1's real signature from another message.
    let mut digests: std::collections::BTreeMap<u16, [u8; 32]> = postcard::from_bytes(&out3.echo)?;
    digests.insert(1, [7; 32]);
    let lying_digests = postcard::to_allocvec(&digests)?;
    let mut forged = e1.attestation();
    forged.payload_hash = [7; 32];
    let seen = vec![forged, e2.attestation(), a.attestation()];
    let lie = echo3(s, lying_digests.clone(), seen)?;
    let r = dkg_refusal(&kmn, 2, s, vec![echo1, lie], direct1)?;
    assert_eq!(r.culprit, Some(3), "{}", r.message);
    assert!(r.message.contains("never signed"), "{}", r.message);
    // Honest attestations with lying digests: node 3 contradicts itself.
    let seen = vec![e1.attestation(), e2.attestation(), a.attestation()];
    let lie = echo3(s, lying_digests, seen)?;
    let to1 = out3.direct.get(&1).ok_or("no share for node 1")?;
    let node1 = SecretKey::from_hex(
        std::fs::read_to_string(layout.node_dir(1).join("identity.key"))?.trim(),
    )?;
    let share3 = Envelope::direct(&id3, s, 3, 3, 1, &node1.public_key(), to1, &mut OsRng)?;
    let direct = direct2.into_iter().chain([share3]).collect();
    let r = dkg_refusal(&kmn, 1, s, vec![echo2, lie], direct)?;
    assert_eq!(r.culprit, Some(3), "{}", r.message);
    assert!(r.message.contains("contradict"), "{}", r.message);

    // A message altered on the way names no party: the coordinator checked it on receipt.
    let s = rand::random::<[u8; 16]>();
    let (_, mut e2) = (dkg_start(&kmn, 1, s)?, dkg_start(&kmn, 2, s)?);
    let (_, m) = DkgParty::start("k", 3, 2, 3, &mut OsRng)?;
    let a = Envelope::broadcast(&id3, s, 1, 3, m)?;
    e2.payload[0] ^= 1;
    match kmn.ask(
        1,
        Request::DkgRound2 {
            session: s,
            round1: vec![e2, a],
        },
    )? {
        Response::Refused(r) => {
            assert_eq!(r.culprit, None, "{}", r.message);
            assert!(r.message.contains("altered in transit"), "{}", r.message);
        }
        other => panic!("took an altered message: {other:?}"),
    }

    // The nodes are fine: a real key generation still works.
    let group = kmn.dkg("fine")?;
    let sig = kmn.signer("fine")?.sign(b"after the fuss")?;
    assert!(dalek_ok(&group.public_key(), b"after the fuss", &sig));
    Ok(())
}

/// Peers that connect and never finish their handshake hold handshake slots only, for a few
/// seconds at most, and the oldest is cut when a new one comes: hundreds of them do not keep
/// a coordinator out.
#[test]
fn silent_connections_do_not_lock_out_the_coordinator() -> R {
    use std::io::Read;
    let (_dir, layout, _nodes, kmn) = network(2, 3)?;
    let group = kmn.dkg("k")?;
    let (net, me) = layout.load()?;
    let addr = net.members[0].addr;
    // More than the node's 256 connection slots and 64 handshake slots.
    let flood: Vec<std::net::TcpStream> = (0..320)
        .map(|_| std::net::TcpStream::connect(addr))
        .collect::<Result<_, _>>()?;
    // A coordinator that connects now (fresh links) is served by node 1.
    let fresh = Kmn::new(&net, me)?;
    match fresh.ask(1, Request::Status)? {
        Response::Status { party, .. } => assert_eq!(party, 1),
        other => panic!("status: {other:?}"),
    }
    let sig = fresh.signer("k")?.sign(b"through the flood")?;
    assert!(dalek_ok(&group.public_key(), b"through the flood", &sig));
    // The oldest silent peers were cut, not left to hold sockets.
    let mut first = &flood[0];
    first.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = [0u8; 1];
    assert!(matches!(first.read(&mut buf), Ok(0) | Err(_)));
    Ok(())
}

/// A client with a grant signs with its keys only; administrator operations stay refused;
/// a revoked client is dropped. Grants take effect when the nodes start.
#[test]
fn grants_limit_a_client_to_its_keys() -> R {
    let (_dir, layout, nodes, kmn) = network(2, 3)?;
    let issuer = kmn.dkg("issuer")?;
    let alice = kmn.dkg("psp-a-alice")?;
    let psp_a = LocalSigner::new(SecretKey::generate(&mut OsRng));
    let addr = psp_a.public_key().to_address();
    // Bad patterns and keys are refused before any config changes.
    for bad in ["PSP-*", "psp a", "*-a", ""] {
        assert!(
            layout.grant(&addr, Some(&[bad.to_string()])).is_err(),
            "{bad}"
        );
    }
    assert!(layout.grant("eur1notakey", None).is_err());
    let (net, _) = layout.load()?;
    let a = Kmn::new(&net, psp_a.clone())?;
    // Not a client yet: dropped after the handshake.
    assert!(ThresholdSigner::new(a.clone(), alice.clone())
        .sign(b"pay bob")
        .is_err());
    // The running nodes take the grant up by themselves (they watch their config).
    layout.grant(&addr, Some(&["psp-a-*".to_string(), "ops".to_string()]))?;
    let own = eventually(|| ThresholdSigner::new(a.clone(), alice.clone()).sign(b"pay bob"))?;
    assert!(dalek_ok(&alice.public_key(), b"pay bob", &own));
    let err = ThresholdSigner::new(a.clone(), issuer.clone())
        .sign(b"mint a million")
        .err()
        .ok_or("a PSP client signed with the issuer's key")?;
    assert!(err.to_string().contains("not granted"), "{err}");
    // Each node refuses the share itself, whatever the coordinator does.
    let nonce = match a.ask(2, Request::Commitments { count: 1 })? {
        Response::Commitments(list) => list[0].0,
        other => panic!("commitments: {other:?}"),
    };
    let sign = Request::Sign {
        key_id: "issuer".into(),
        group: [0; 32],
        nonce,
        package: vec![0; 8],
    };
    match a.ask(2, sign)? {
        Response::Refused(r) => assert!(r.message.contains("not granted"), "{}", r.message),
        other => panic!("node 2 gave a share of the issuer's key: {other:?}"),
    }
    assert!(a.export("psp-a-alice").is_err());
    assert!(a.dkg("psp-a-carol").is_err());
    // The coordinator (client and admin, no grant) still uses every key.
    let sig = kmn.signer("issuer")?.sign(b"mint")?;
    assert!(dalek_ok(&issuer.public_key(), b"mint", &sig));
    // A config that does not parse changes nothing: the node serves on as it did.
    let cfg1 = layout.node_config(1);
    let good = std::fs::read(&cfg1)?;
    std::fs::write(&cfg1, b"{ not json")?;
    std::thread::sleep(florin_node::custody::node::CONFIG_POLL * 3);
    assert!(kmn.status().iter().all(|s| s.up));
    for i in 0..4u32 {
        let m = format!("still granted {i}");
        ThresholdSigner::new(a.clone(), alice.clone()).sign(m.as_bytes())?;
    }
    std::fs::write(&cfg1, &good)?;
    // Revoked while its connections are open: every node drops the client at its next
    // request, without a restart.
    layout.revoke(&addr)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ThresholdSigner::new(a.clone(), alice.clone())
        .sign(b"pay bob")
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the revoked client still signs");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Signing fails once a threshold of nodes has dropped the client; the others follow at
    // their next config poll.
    for p in 1..=3 {
        while a.ask(p, Request::Commitments { count: 1 }).is_ok() {
            assert!(
                Instant::now() < deadline,
                "node {p} still serves the revoked client"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // The coordinator is not affected.
    assert!(dalek_ok(
        &alice.public_key(),
        b"coordinator",
        &kmn.signer("psp-a-alice")?.sign(b"coordinator")?
    ));
    drop(nodes);
    Ok(())
}

/// Retries `f` for up to ten seconds (a change the nodes pick up from their config).
fn eventually<T, E: std::fmt::Display>(
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => return Err(e.to_string().into()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A node that lost its share (its disk, not its identity) gets it back from t others without
/// the key being rebuilt anywhere, then signs again; only an administrator may ask.
#[test]
fn a_lost_share_is_repaired_from_the_others() -> R {
    let (_dir, layout, nodes, kmn) = network(2, 3)?;
    let group = kmn.dkg("issuer")?;
    let client = LocalSigner::new(SecretKey::generate(&mut OsRng));
    layout.grant(&client.public_key().to_address(), None)?;
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let share3 = layout.node_dir(3).join("shares").join("issuer.share");
    std::fs::remove_file(&share3)?;
    let mut nodes = layout.start_in_process()?;
    let before = kmn.status();
    assert!(before[2].up && before[2].keys.is_empty(), "{:?}", before[2]);
    // A client that is not an administrator may not repair.
    let (net, _) = layout.load()?;
    let plain = Kmn::new(&net, client)?;
    let err = plain.repair("issuer", 3).err().ok_or("a client repaired")?;
    assert!(err.to_string().contains("administrator"), "{err}");
    // Unknown key, unknown node.
    assert!(kmn.repair("nope", 3).is_err());
    assert!(kmn.repair("issuer", 9).is_err());

    assert_eq!(kmn.repair("issuer", 3)?, vec![1, 2]);
    assert!(share3.exists());
    assert_eq!(kmn.status()[2].keys.len(), 1);
    // Repairing a node that holds its share changes nothing.
    assert_eq!(kmn.repair("issuer", 3)?, vec![1, 2]);
    // Node 3 signs with node 2 alone: node 1 is down.
    nodes.remove(0).stop();
    for i in 0..5u32 {
        let msg = format!("after repair {i}");
        let sig = kmn.signer("issuer")?.sign(msg.as_bytes())?;
        assert!(dalek_ok(&group.public_key(), msg.as_bytes(), &sig));
    }
    // With node 1 down, only one helper is left for node 2: a clear error.
    let err = kmn
        .repair("issuer", 2)
        .err()
        .ok_or("repaired with one helper")?;
    assert!(err.to_string().contains("repair needs 2"), "{err}");
    Ok(())
}

/// Runs a refresh of `key` by hand up to (not including) the commit: every node stores its
/// refreshed share pending. Returns the new group key's bytes.
fn refresh_uncommitted(kmn: &Kmn, key: &str) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let digest = kmn.group(key)?.digest();
    let mut session = [0u8; 16];
    rand::RngCore::fill_bytes(&mut OsRng, &mut session);
    let mut round1 = Vec::new();
    for p in 1..=3 {
        let start = Request::RefreshStart {
            session,
            key_id: key.into(),
            group: digest,
        };
        match kmn.ask(p, start)? {
            Response::DkgRound1(e) => round1.push(e),
            other => return Err(format!("refresh start at {p}: {other:?}").into()),
        }
    }
    let mut echoes = Vec::new();
    let mut direct = Vec::new();
    for p in 1..=3 {
        let others = round1.iter().filter(|e| e.from != p).cloned().collect();
        let (echo, d) = dkg_round2(kmn, p, session, others)?;
        echoes.push(echo);
        direct.extend(d);
    }
    let mut group = None;
    for p in 1..=3 {
        let finish = Request::DkgFinish {
            session,
            echoes: echoes.iter().filter(|e| e.from != p).cloned().collect(),
            direct: direct.iter().filter(|e| e.to == p).cloned().collect(),
        };
        match kmn.ask(p, finish)? {
            Response::Key(g) => group = Some(g),
            other => return Err(format!("refresh finish at {p}: {other:?}").into()),
        }
    }
    Ok(group.ok_or("no group")?)
}

fn exported_share(kmn: &Kmn, p: u16, key: &str) -> Result<KeyShare, Box<dyn std::error::Error>> {
    match kmn.ask(p, Request::Export { key_id: key.into() })? {
        Response::Exported(b) => Ok(KeyShare::from_bytes(&b)?),
        other => Err(format!("export at {p}: {other:?}").into()),
    }
}

/// A proactive refresh changes every node's share and keeps the public key; signers that
/// hold the old sharing follow by themselves; old and new shares do not combine; a refresh
/// needs every node and an administrator; a refresh cut short before or during its commit
/// round is finished (or harmlessly left) and survives restarts.
#[test]
fn a_refresh_renews_every_share_and_signers_follow() -> R {
    let (_dir, layout, mut nodes, kmn) = network(2, 3)?;
    let old = kmn.dkg("issuer")?;
    let pk = old.public_key();
    let signer = kmn.signer("issuer")?;
    assert!(dalek_ok(&pk, b"before", &signer.sign(b"before")?));
    let old1 = exported_share(&kmn, 1, "issuer")?;
    let secret = kmn.export("issuer")?;

    let new = kmn.refresh("issuer")?;
    assert_eq!(new.public_key(), pk);
    assert!(new.is_refresh_of(&old));
    assert_eq!(kmn.group("issuer")?, new);
    // The signer made before the refresh takes up the new sharing by itself.
    for i in 0..5u32 {
        let msg = format!("after refresh {i}");
        assert!(dalek_ok(&pk, msg.as_bytes(), &signer.sign(msg.as_bytes())?));
    }
    assert_eq!(signer.group(), new);
    // Every share changed, the key did not; an old share does not combine with a new one.
    let new1 = exported_share(&kmn, 1, "issuer")?;
    let new2 = exported_share(&kmn, 2, "issuer")?;
    assert_ne!(new1, old1);
    assert_eq!(*kmn.export("issuer")?, *secret);
    assert_eq!(scalar_public_key(&*kmn.export("issuer")?)?, pk);
    let mixed = florin_custody::frost::reconstruct(&[old1.clone(), new2]);
    assert!(mixed.map(|m| *m != *secret).unwrap_or(true));
    // A node asked to refresh a sharing it does not hold refuses, naming the reason.
    let stale = Request::RefreshStart {
        session: [9; 16],
        key_id: "issuer".into(),
        group: old.digest(),
    };
    match kmn.ask(1, stale)? {
        Response::Refused(r) => assert!(r.stale_group, "{}", r.message),
        other => panic!("refreshed a sharing it does not hold: {other:?}"),
    }

    // Only an administrator refreshes.
    let client = LocalSigner::new(SecretKey::generate(&mut OsRng));
    layout.grant(&client.public_key().to_address(), None)?;
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    nodes = layout.start_in_process()?;
    let (net, _) = layout.load()?;
    let plain = Kmn::new(&net, client)?;
    let err = plain.refresh("issuer").err().ok_or("a client refreshed")?;
    assert!(err.to_string().contains("administrator"), "{err}");
    assert!(kmn.refresh("nope").is_err());

    // Cut short before its commit: every node holds the new sharing pending, and signs on
    // with the old one, across a restart too.
    let pending = refresh_uncommitted(&kmn, "issuer")?;
    assert!(kmn.status().iter().all(|s| s.pending.len() == 1));
    assert!(dalek_ok(&pk, b"pending", &signer.sign(b"pending")?));
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    nodes = layout.start_in_process()?;
    assert!(kmn.status().iter().all(|s| s.pending.len() == 1));
    assert_eq!(kmn.group("issuer")?, new);
    // Cut short during its commit: node 1 alone has the newer sharing.
    let commit = Request::Commit {
        key_id: "issuer".into(),
        public: pending.clone(),
    };
    assert!(matches!(kmn.ask(1, commit)?, Response::Key(_)));
    // Nodes 2 and 3 still hold the older sharing: signing goes on with them.
    for i in 0..3u32 {
        let msg = format!("half committed {i}");
        assert!(dalek_ok(&pk, msg.as_bytes(), &signer.sign(msg.as_bytes())?));
    }
    // The next refresh first finishes the cut-short one, then refreshes again.
    let third = kmn.refresh("issuer")?;
    assert_eq!(third.public_key(), pk);
    let status = kmn.status();
    assert!(status.iter().all(|s| s.pending.is_empty()), "{status:?}");
    assert_eq!(kmn.group("issuer")?, third);
    assert_ne!(third.to_bytes(), pending);
    assert!(dalek_ok(&pk, b"third", &signer.sign(b"third")?));
    // Restarted nodes keep the refreshed shares.
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    nodes = layout.start_in_process()?;
    assert_eq!(kmn.group("issuer")?, third);
    assert!(dalek_ok(
        &pk,
        b"restart",
        &kmn.signer("issuer")?.sign(b"restart")?
    ));
    // A refresh needs every node; with one down it fails clearly and the key signs on.
    nodes.remove(2).stop();
    let err = kmn
        .refresh("issuer")
        .err()
        .ok_or("refreshed with a node down")?;
    assert!(err.to_string().contains("every node"), "{err}");
    assert!(dalek_ok(&pk, b"degraded", &signer.sign(b"degraded")?));
    assert_eq!(kmn.group("issuer")?, third);
    Ok(())
}
