//! A deterministic simulation of the replicated authority (`florin_node::registry`): three
//! replicas of the registry, each serving operations, under a seeded schedule of partitions,
//! lagging replicas and answers lost after their write was ordered. The group's committed log
//! is modelled directly (Raft's own safety is tested in `florin-cluster`); what is checked
//! here is the write-set scheme on top of it: replicas that applied the same log hold the same
//! registry, a write computed on a stale replica is never applied, acknowledged writes are
//! all there, and a token is answered with one successor however many replicas are asked.

#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_node::error::StorageError;
use florin_node::registry::{self, Applied, Replicate};
use florin_node::{Authority, AuthorityConfig, NodeError};
use florin_token::Token;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const REPLICAS: usize = 3;

/// The group as the simulation sees it: the committed log and how far each replica applied it.
struct Group {
    log: Vec<Vec<u8>>,
    applied: [usize; REPLICAS],
    /// Each entry's answer, from the first replica that applied it (every other must agree).
    answers: Vec<Option<Applied>>,
    partitioned: [bool; REPLICAS],
    dbs: Vec<Arc<redb::Database>>,
    rng: StdRng,
    lost_answers: usize,
    duplicates: usize,
}

impl Group {
    /// Replica `i` applies the log up to `upto`.
    fn catch_up(&mut self, i: usize, upto: usize) {
        while self.applied[i] < upto.min(self.log.len()) {
            let k = self.applied[i];
            let a = registry::apply(&self.dbs[i], &self.log[k]).unwrap();
            match &self.answers[k] {
                None => self.answers[k] = Some(a),
                Some(first) => assert_eq!(first, &a, "replica {i} answered entry {k} otherwise"),
            }
            self.applied[i] += 1;
        }
    }
}

struct Link {
    group: Arc<Mutex<Group>>,
    me: usize,
}

impl Replicate for Link {
    fn replicate(&self, set: Vec<u8>) -> Result<Vec<u8>, NodeError> {
        let mut g = self.group.lock().unwrap();
        if g.partitioned[self.me] {
            return Err(StorageError::Unavailable("partitioned".into()).into());
        }
        g.log.push(set.clone());
        g.answers.push(None);
        // Sometimes the set is delivered twice (the group's client resent it): the copy is
        // answered as the first and changes nothing.
        if g.rng.gen_bool(0.1) {
            g.log.push(set);
            g.answers.push(None);
            g.duplicates += 1;
        }
        let end = g.log.len();
        // The others move on by some of the log (a lagging follower applies later).
        for i in 0..REPLICAS {
            if i != self.me && !g.partitioned[i] && g.rng.gen_bool(0.5) {
                let from = g.applied[i];
                let upto = g.rng.gen_range(from..=end);
                g.catch_up(i, upto);
            }
        }
        g.catch_up(self.me, end);
        // Sometimes the answer is lost after the write was ordered.
        if g.rng.gen_bool(0.08) {
            g.lost_answers += 1;
            return Err(StorageError::Unavailable("answer lost".into()).into());
        }
        let answer = g.answers[end - 1].clone().unwrap();
        Ok(postcard::to_allocvec(&answer).unwrap())
    }

    fn sync(&self) -> Result<(), NodeError> {
        let mut g = self.group.lock().unwrap();
        if g.partitioned[self.me] {
            return Err(StorageError::Unavailable("partitioned".into()).into());
        }
        let end = g.log.len();
        g.catch_up(self.me, end);
        Ok(())
    }

    fn wait_applied(&self, version: u64) {
        let mut g = self.group.lock().unwrap();
        if !g.partitioned[self.me] {
            let end = g.log.len();
            g.catch_up(self.me, end);
        }
        let _ = version;
    }
}

fn key(i: u8) -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[i; 32]))
}

/// A token minted to wallet 1, passed to `to` and signed over to the authority by `to`.
fn signed_over(t: &Token, to: &LocalSigner, authority: &PublicKey, hs: u8) -> Token {
    let w1 = key(1);
    let t = t.transfer(&w1, to.public_key(), [hs; 32]).unwrap();
    t.transfer(to, *authority, [hs.wrapping_add(100); 32])
        .unwrap()
}

/// What a run exercised: conflicts answered, answers lost, tokens re-anchored, double spends
/// caught.
#[derive(Default, Debug)]
struct Seen {
    conflicts: usize,
    lost: usize,
    duplicates: usize,
    reanchored: usize,
    double_spends: usize,
}

fn run(seed: u64, steps: usize, seen: &mut Seen) {
    let dirs: Vec<tempfile::TempDir> = (0..REPLICAS)
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let signer: Arc<dyn Signer> = Arc::new(key(9));
    let authority_key = signer.public_key();
    let replicas: Vec<Authority> = dirs
        .iter()
        .map(|d| {
            Authority::open_replicated(AuthorityConfig::devnet(d.path()), signer.clone()).unwrap()
        })
        .collect();
    let group = Arc::new(Mutex::new(Group {
        log: Vec::new(),
        applied: [0; REPLICAS],
        answers: Vec::new(),
        partitioned: [false; REPLICAS],
        dbs: replicas.iter().map(|a| a.registry_db()).collect(),
        rng: StdRng::seed_from_u64(seed ^ 0x5eed),
        lost_answers: 0,
        duplicates: 0,
    }));
    for (i, a) in replicas.iter().enumerate() {
        a.join(Arc::new(Link {
            group: group.clone(),
            me: i,
        }));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mailbox = key(50).public_key();
    // Acknowledged writes: mailbox messages by sequence, minted tokens, deposit answers.
    let mut messages: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut minted: Vec<Token> = Vec::new();
    let mut successors: HashMap<[u8; 8], String> = HashMap::new();
    let mut spent_twice: Vec<[u8; 8]> = Vec::new();
    let (w2, w3) = (key(2), key(3));
    for step in 0..steps {
        let r = rng.gen_range(0..REPLICAS);
        let a = &replicas[r];
        match rng.gen_range(0..10) {
            // A partition starts or heals (at most one replica cut off: a majority stays).
            0 => {
                let mut g = group.lock().unwrap();
                let was = g.partitioned[r];
                g.partitioned = [false; REPLICAS];
                g.partitioned[r] = !was;
            }
            1..=3 => {
                let msg = format!("handoff {step}").into_bytes();
                if let Ok(seq) = a.mailbox_put(&mailbox, &msg) {
                    assert!(
                        messages.insert(seq, msg).is_none(),
                        "sequence {seq} given twice"
                    );
                }
            }
            4 | 5 => {
                if let Ok(t) = a.mint(key(1).public_key(), 100, [step as u8; 32]) {
                    minted.extend(t);
                }
            }
            6..=8 if !minted.is_empty() => {
                // Deposit a minted token through this replica: the same chain again (a retry
                // elsewhere) or, sometimes, another chain from the same token (a double spend).
                let t = &minted[rng.gen_range(0..minted.len())];
                let double = rng.gen_bool(0.3);
                let (who, hs) = if double { (&w3, 3) } else { (&w2, 2) };
                let chain = signed_over(t, who, &authority_key, hs);
                let Ok(reports) = a.deposit(&who.public_key(), &[Ok(chain)]) else {
                    continue;
                };
                let rep = &reports[0];
                match rep.outcome.as_str() {
                    "reanchored" | "repeated" => {
                        let succ = rep.token.clone().unwrap();
                        let first = successors.entry(t.serial).or_insert_with(|| succ.clone());
                        assert_eq!(*first, succ, "two successors for one token");
                    }
                    "double_spend" => spent_twice.push(t.serial),
                    other => panic!("unexpected outcome {other}: {rep:?}"),
                }
            }
            _ => {
                let _ = a.revoke(&key(60 + rng.gen_range(0..3)).public_key(), None, "sim");
            }
        }
    }
    // Heal and let every replica apply the whole log.
    {
        let mut g = group.lock().unwrap();
        g.partitioned = [false; REPLICAS];
        let end = g.log.len();
        for i in 0..REPLICAS {
            g.catch_up(i, end);
        }
        // Each applied set took one version; a duplicate got its first's.
        let done = g
            .answers
            .iter()
            .filter_map(|a| match a {
                Some(Applied::Done { version }) => Some(*version),
                _ => None,
            })
            .collect::<std::collections::BTreeSet<u64>>()
            .len() as u64;
        for db in &g.dbs {
            assert_eq!(registry::version(db).unwrap(), done);
        }
        let first = registry::dump(&g.dbs[0]).unwrap();
        for db in &g.dbs[1..] {
            assert!(
                registry::dump(db).unwrap() == first,
                "replicas differ (seed {seed})"
            );
        }
        assert!(
            g.log.len() > steps / 4,
            "the schedule wrote ({} entries)",
            g.log.len()
        );
        seen.conflicts += g
            .answers
            .iter()
            .filter(|a| matches!(a, Some(Applied::Conflict { .. })))
            .count();
        seen.lost += g.lost_answers;
        seen.duplicates += g.duplicates;
    }
    seen.reanchored += successors.len();
    seen.double_spends += spent_twice.len();
    // Every acknowledged write is there, on every replica.
    for a in &replicas {
        let got: BTreeMap<u64, Vec<u8>> = a.mailbox_get(&mailbox, 0).unwrap().into_iter().collect();
        for (seq, msg) in &messages {
            assert_eq!(
                got.get(seq),
                Some(msg),
                "acknowledged message {seq} (seed {seed})"
            );
        }
        for t in &minted {
            assert!(
                a.token(&t.serial).is_ok(),
                "acknowledged mint (seed {seed})"
            );
        }
        let proofs = a.fraud_list().unwrap();
        for s in &spent_twice {
            let serial = hex::encode(s);
            assert!(
                proofs.iter().any(|p| p.serial == serial),
                "a double spend without its proof (seed {seed})"
            );
        }
    }
}

#[test]
fn replicas_agree_under_partitions_lag_and_lost_answers() {
    let mut seen = Seen::default();
    for seed in 1..=6 {
        run(seed, 200, &mut seen);
    }
    // The schedules reached the cases that matter.
    assert!(
        seen.conflicts > 0
            && seen.lost > 0
            && seen.duplicates > 0
            && seen.reanchored > 0
            && seen.double_spends > 0,
        "{seen:?}"
    );
    eprintln!("{seen:?}");
}
