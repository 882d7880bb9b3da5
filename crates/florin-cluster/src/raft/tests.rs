//! Tests of the log store and the state machine store on their own: openraft's storage
//! conformance suite, holes, reopening, the redb-era directory.

use std::future::Future;
use std::sync::{Arc, RwLock};

use openraft::storage::RaftLogStorage;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{Entry, EntryPayload, LogId, RaftLogReader, StorageError, StoredMembership, Vote};

use super::log_store::{completed, completion, LogStore};
use super::state_machine::{Machine, SmState, SmStore};
use super::{Bytes, NodeId, TypeConfig};

/// A machine that records the commands it applied.
#[derive(Default)]
struct Recorder(Vec<Vec<u8>>);

impl Machine for Recorder {
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
        self.0.push(cmd.to_vec());
        cmd.to_vec()
    }
    fn snapshot(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.0).unwrap()
    }
    type Error = postcard::Error;
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), postcard::Error> {
        self.0 = postcard::from_bytes(snapshot)?;
        Ok(())
    }
}

struct OnDisk;

impl StoreBuilder<TypeConfig, LogStore, SmStore<Recorder>, tempfile::TempDir> for OnDisk {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, SmStore<Recorder>), StorageError<NodeId>> {
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(dir.path()).unwrap();
        let sm = SmStore {
            state: Arc::new(RwLock::new(SmState::new(
                Recorder::default(),
                None,
                StoredMembership::default(),
                0,
            ))),
            dir: dir.path().to_path_buf(),
            persisted: Arc::new(tokio::sync::Mutex::new(None)),
        };
        Ok((dir, log, sm))
    }
}

type S = Suite<TypeConfig, LogStore, SmStore<Recorder>, OnDisk, tempfile::TempDir>;

/// Runs one test of openraft's suite on a fresh store.
fn run<F, Fu>(name: &str, test: F)
where
    F: FnOnce(LogStore, SmStore<Recorder>) -> Fu,
    Fu: Future<Output = Result<(), StorageError<NodeId>>>,
{
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (_dir, log, sm) = OnDisk.build().await.unwrap();
        if let Err(e) = test(log, sm).await {
            panic!("{name}: {e}");
        }
    });
}

/// openraft's own conformance suite for log stores and state machines, test by test.
/// Left out: `get_initial_state_membership_from_log_and_sm`, which appends entry 3 after
/// entry 1 — a hole, which openraft's contract forbids and this store refuses
/// (`append_with_a_hole_is_refused` below).
#[test]
fn openraft_storage_suite() {
    macro_rules! suite {
        ($($t:ident),* $(,)?) => { $( run(stringify!($t), S::$t); )* };
    }
    suite!(
        last_membership_in_log_initial,
        last_membership_in_log,
        last_membership_in_log_multi_step,
        get_membership_initial,
        get_membership_from_log_and_empty_sm,
        get_membership_from_empty_log_and_sm,
        get_membership_from_log_le_sm_last_applied,
        get_membership_from_log_gt_sm_last_applied_1,
        get_membership_from_log_gt_sm_last_applied_2,
        get_initial_state_without_init,
        get_initial_state_with_state,
        get_initial_state_last_log_gt_sm,
        get_initial_state_last_log_lt_sm,
        get_initial_state_log_ids,
        get_initial_state_re_apply_committed,
        save_vote,
        get_log_entries,
        limited_get_log_entries,
        try_get_log_entry,
        initial_logs,
        get_log_state,
        get_log_id,
        last_id_in_log,
        last_applied_state,
        purge_logs_upto_0,
        purge_logs_upto_5,
        purge_logs_upto_20,
        delete_logs_since_11,
        delete_logs_since_0,
        append_to_log,
        snapshot_meta,
        apply_single,
        apply_multiple,
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(S::transfer_snapshot(&OnDisk)).unwrap();
}

#[test]
fn append_with_a_hole_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (_dir, mut log, _) = OnDisk.build().await.unwrap();
        let e = |index| Entry::<TypeConfig> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        };
        let (done, rx) = completion();
        log.submit([e(1)], done).unwrap();
        completed(rx).await.unwrap();
        let Err(err) = log.submit([e(3)], Box::new(|_| {})) else {
            panic!("a hole must be refused");
        };
        assert!(err.to_string().contains("does not follow"), "{err}");
        assert_eq!(log.try_get_log_entries(0..).await.unwrap().len(), 1);
    });
}

/// What the log store reports survives closing and reopening it, including after a
/// truncation and a purge.
#[test]
fn log_store_reopens_where_it_left_off() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let id = |term, index| LogId::new(openraft::CommittedLeaderId::new(term, 1), index);
        let entry = |term, index: u64| Entry::<TypeConfig> {
            log_id: id(term, index),
            payload: EntryPayload::Normal(Bytes::from(index.to_le_bytes().to_vec())),
        };
        {
            let mut log = LogStore::open(dir.path()).unwrap();
            let (done, rx) = completion();
            log.submit((1..=20).map(|i| entry(1, i)), done).unwrap();
            completed(rx).await.unwrap();
            log.save_vote(&Vote::new(2, 1)).await.unwrap();
            log.truncate(id(1, 15)).await.unwrap();
            log.purge(id(1, 5)).await.unwrap();
            log.save_committed(Some(id(1, 12))).await.unwrap();
            let st = log.get_log_state().await.unwrap();
            assert_eq!(st.last_log_id, Some(id(1, 14)));
            assert_eq!(st.last_purged_log_id, Some(id(1, 5)));
        }
        let mut log = LogStore::open(dir.path()).unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_log_id, Some(id(1, 14)));
        assert_eq!(st.last_purged_log_id, Some(id(1, 5)));
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
        assert_eq!(log.read_committed().await.unwrap(), Some(id(1, 12)));
        let got = log.try_get_log_entries(1..6).await.unwrap();
        assert!(got.is_empty(), "purged entries are not served");
        let got = log.try_get_log_entries(1..100).await.unwrap();
        assert_eq!(
            got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            (6..=14).collect::<Vec<_>>()
        );
        assert_eq!(got[0].payload, entry(1, 6).payload);
    });
}

/// A replica directory from the redb era is refused with a clear message.
#[test]
fn an_old_redb_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("raft.redb"), b"old").unwrap();
    let Err(e) = LogStore::open(dir.path()) else {
        panic!("a redb-era directory must be refused");
    };
    assert!(e.to_string().contains("older Florin"), "{e}");
}
