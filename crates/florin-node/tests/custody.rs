//! The key-management network over real sockets, nodes in this process: key generation,
//! threshold signing through the `Signer` trait, node failures, restarts, import, export,
//! refusals.

use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_crypto::{verify, LocalSigner, SecretKey, Signer};
use florin_custody::frost::scalar_public_key;
use florin_node::custody::{free_loopback_addrs, Kmn, KmnError, Layout, RunningNode};
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
    let _nodes = layout.start_in_process()?;
    let sig = signer.sign(b"after restart")?;
    assert!(verify(&group.public_key(), b"after restart", &sig).is_ok());
    assert_eq!(kmn.group("authority")?, group);
    // Shares are encrypted at rest: the file does not hold the share's bytes, and a changed
    // file stops the node from starting instead of serving a wrong share.
    let path = layout.node_dir(1).join("shares").join("authority.share");
    let sealed = std::fs::read(&path)?;
    assert!(sealed.len() > 100);
    let mut bad = sealed.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    std::fs::write(&path, &bad)?;
    let cfg = florin_node::custody::CustodyNodeConfig::load(&layout.node_config(1))?;
    assert!(florin_node::custody::CustodyNode::open(&cfg).is_err());
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
