//! Damage to a key-management node's files, over real sockets (nodes in this process): a
//! share file flipped, cut, emptied or deleted is refused by name, the node serves its other
//! keys, and repair restores it; a damaged key record, a missing seal key, identity key or
//! coordinator key refuse the open and change nothing on disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use florin_crypto::Signer;
use florin_custody::wire::{Request, Response};
use florin_node::custody::{
    free_loopback_addrs, CustodyNode, CustodyNodeConfig, Kmn, Layout, RunningNode,
};

type R = Result<(), Box<dyn std::error::Error>>;

type Net = (tempfile::TempDir, Layout, Vec<RunningNode>, Arc<Kmn>);

fn network() -> Result<Net, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(2, &free_loopback_addrs(3)?)?;
    let nodes = layout.start_in_process()?;
    let (net, me) = layout.load()?;
    let kmn = Kmn::new(&net, me)?;
    Ok((dir, layout, nodes, kmn))
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(b) = std::fs::read(&p) {
                out.insert(p, b);
            }
        }
    }
    out
}

fn stop(nodes: Vec<RunningNode>) {
    for n in &nodes {
        n.stop();
    }
    drop(nodes);
    std::thread::sleep(Duration::from_millis(300));
}

/// Node `p`'s answer to an export of `key` (an administrator's request that needs the share).
fn export_at(
    kmn: &Kmn,
    p: u16,
    key: &str,
) -> Result<Result<(), String>, Box<dyn std::error::Error>> {
    Ok(match kmn.ask(p, Request::Export { key_id: key.into() })? {
        Response::Exported(_) => Ok(()),
        Response::Refused(r) => Err(r.message),
        other => Err(format!("{other:?}")),
    })
}

#[test]
fn a_damaged_emptied_or_deleted_share_is_refused_by_name_and_repaired() -> R {
    let (_dir, layout, nodes, kmn) = network()?;
    let group = kmn.dkg("issuer")?;
    kmn.dkg("other")?;
    stop(nodes);
    let share3 = layout.node_dir(3).join("shares").join("issuer.share");
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage)> = vec![
        ("header byte", Box::new(|b| b[0] ^= 1)),
        ("nonce byte", Box::new(|b| b[5] ^= 0x40)),
        (
            "body byte",
            Box::new(|b| {
                let m = b.len() / 2;
                b[m] ^= 1
            }),
        ),
        (
            "last byte (tag)",
            Box::new(|b| {
                let l = b.len() - 1;
                b[l] ^= 0x80
            }),
        ),
        ("cut", Box::new(|b| b.truncate(b.len() - 7))),
        ("emptied", Box::new(|b| b.clear())),
    ];
    for (what, damage) in cases
        .iter()
        .map(|(w, f)| (Some(*w), Some(f)))
        .chain([(None, None)])
    {
        let what = what.unwrap_or("deleted");
        match damage {
            Some(f) => {
                let mut b = std::fs::read(&share3)?;
                f(&mut b);
                std::fs::write(&share3, &b)?;
            }
            None => std::fs::remove_file(&share3)?,
        }
        let before = snapshot(&layout.node_dir(3));
        let nodes = layout.start_in_process()?;
        // Opening changed nothing: the damaged file is left as it was.
        assert_eq!(
            snapshot(&layout.node_dir(3)),
            before,
            "{what}: the open changed node 3"
        );
        // Node 3 serves its other key, reports none of the lost one, and refuses it by name.
        let st = kmn.status();
        assert!(st[2].up, "{what}");
        assert!(
            st[2].keys.iter().all(|(k, _)| k != "issuer"),
            "{what}: {:?}",
            st[2].keys
        );
        export_at(&kmn, 3, "other")?.map_err(|e| format!("{what}: other key: {e}"))?;
        let refusal = export_at(&kmn, 3, "issuer")?
            .err()
            .ok_or("a lost share was served")?;
        assert!(
            refusal.contains(&share3.display().to_string())
                && refusal.contains("florin custody repair issuer --party 3"),
            "{what}: {refusal}"
        );
        if what == "deleted" {
            assert!(refusal.contains("missing"), "{refusal}");
        } else {
            assert!(refusal.contains("damaged"), "{refusal}");
        }
        // Repair restores it; the damaged file is kept aside.
        assert_eq!(kmn.repair("issuer", 3)?, vec![1, 2]);
        export_at(&kmn, 3, "issuer")?.map_err(|e| format!("{what}: after repair: {e}"))?;
        let aside = std::fs::read_dir(layout.node_dir(3).join("shares"))?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("issuer.share.damaged-")
            })
            .count();
        if what != "deleted" {
            assert!(aside > 0, "{what}: the damaged share was not kept aside");
        }
        stop(nodes);
    }
    // The repaired share survives a restart and signs with node 2 while node 1 is down.
    let mut nodes = layout.start_in_process()?;
    nodes.remove(0).stop();
    let sig = kmn.signer("issuer")?.sign(b"after the damage")?;
    assert!(florin_crypto::verify(&group.public_key(), b"after the damage", &sig).is_ok());
    Ok(())
}

#[test]
fn a_damaged_record_or_missing_key_file_refuses_the_node_and_changes_nothing() -> R {
    let (_dir, layout, nodes, kmn) = network()?;
    kmn.dkg("issuer")?;
    stop(nodes);
    let d3 = layout.node_dir(3);
    let cfg = CustodyNodeConfig::load(&layout.node_config(3))?;
    let refused = |what: &str, file: &Path| -> R {
        let before = snapshot(layout.dir());
        let e = match CustodyNode::open(&cfg) {
            Ok(_) => return Err(format!("{what}: node 3 opened").into()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&file.display().to_string()), "{what}: {e}");
        assert_eq!(
            snapshot(layout.dir()),
            before,
            "{what}: a refused open changed the network's files"
        );
        Ok(())
    };
    let record = d3.join("keys.sealed");
    let seal = d3.join("seal.key");
    let identity = d3.join("identity.key");
    let good: Vec<(PathBuf, Vec<u8>)> = [&record, &seal, &identity]
        .iter()
        .map(|p| Ok(((*p).clone(), std::fs::read(p)?)))
        .collect::<Result<_, std::io::Error>>()?;
    let restore = || -> R {
        for (p, b) in &good {
            std::fs::write(p, b)?;
        }
        Ok(())
    };

    let mut b = std::fs::read(&record)?;
    b[20] ^= 1;
    std::fs::write(&record, &b)?;
    refused("record flipped", &record)?;
    std::fs::write(&record, &b[..b.len() - 1])?;
    refused("record cut", &record)?;
    std::fs::write(&record, b"")?;
    refused("record emptied", &record)?;
    restore()?;

    std::fs::remove_file(&seal)?;
    refused("seal key deleted", &seal)?;
    assert!(!seal.exists(), "a seal key was made again");
    std::fs::write(&seal, b"")?;
    refused("seal key emptied", &seal)?;
    // Another seal key: the record does not open under it.
    std::fs::write(&seal, hex::encode([7u8; 32]))?;
    refused("another seal key", &record)?;
    restore()?;

    std::fs::remove_file(&identity)?;
    refused("identity deleted", &identity)?;
    assert!(!identity.exists(), "an identity key was made again");
    restore()?;

    // The coordinator's key is never made again either.
    let coord = layout.coordinator_key();
    let kept = std::fs::read(&coord)?;
    std::fs::remove_file(&coord)?;
    let e = layout
        .load()
        .err()
        .ok_or("a network without its coordinator key loaded")?;
    assert!(e.to_string().contains(&coord.display().to_string()), "{e}");
    assert!(!coord.exists());
    std::fs::write(&coord, kept)?;

    // Everything put back: the node opens and signs.
    let _nodes = layout.start_in_process()?;
    kmn.signer("issuer")?.sign(b"all back")?;
    Ok(())
}
