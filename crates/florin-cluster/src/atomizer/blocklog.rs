//! The block log: every block the atomizer sealed, in order, on each atomizer replica's disk. It
//! is the auditable history (`florin cluster blocks` prints and verifies it) and what a shard
//! that fell behind is sent blocks from.
//!
//! It is a segment log (the Raft log's format: records `len ‖ crc32 ‖ height ‖ block`, synced by
//! one writer thread) whose index is the block's height. Opening checks everything: a torn
//! append at the end that was never synced is cut, any other damage refuses to open, naming the
//! file and byte, and changes nothing.
//!
//! A block is appended when the replica applies the step that sealed it, and the append waits
//! for its sync: a block is on the disk of every replica that applied it before the replica's
//! state (and so its snapshot) moves past it. Applying the same step again (a restart replays
//! the Raft log after the last snapshot) finds the block already there and checks it is the same
//! block. A replica that receives a snapshot instead of the steps (it was down while the group
//! compacted its log) has no copy of the blocks in between: its log then starts after the gap
//! (the blocks it held before are dropped with the gap: the log is one contiguous run), the
//! start is recorded in `meta.bin` with the hash the next block must follow, and reads before
//! it are refused with where the log starts (another replica serves them).

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use florin_crypto::Digest;
use serde::{Deserialize, Serialize};

use super::{Block, Height, GENESIS};
use crate::seglog::{self, frame_with, Got, LogError, SegLog};

/// Why the block log refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BlockLogError {
    /// A file could not be opened, read or written, or is damaged.
    #[error("block log {}: {source}", dir.display())]
    Log {
        /// The log's directory.
        dir: PathBuf,
        /// What happened.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A block to append does not follow the log (another history).
    #[error("block log {}: block {height} does not follow block {} in the log", dir.display(), height - 1)]
    Fork {
        /// The log's directory.
        dir: PathBuf,
        /// The block.
        height: Height,
    },
    /// The blocks asked for are before the log's first (this replica received a snapshot).
    #[error("block log {}: starts at block {first}; earlier blocks are on other replicas", dir.display())]
    Purged {
        /// The log's directory.
        dir: PathBuf,
        /// Its first block.
        first: Height,
    },
    /// A record does not decode as a block.
    #[error("block log {}: block {height} does not decode", dir.display())]
    Undecodable {
        /// The log's directory.
        dir: PathBuf,
        /// The block.
        height: Height,
    },
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Meta {
    /// Blocks up to this height are not in this log.
    purged: Option<Height>,
    /// The hash of the block at `purged` (what the log's first block follows).
    #[serde(with = "florin_ledger::bin_serde::id")]
    tip_at_purge: Digest,
}

/// An atomizer replica's block log.
pub struct BlockLog {
    dir: PathBuf,
    log: SegLog<Arc<Block>>,
    /// The first height held (the one after a purge, or 1), the last, and the last's hash.
    at: Mutex<(Height, Height, Digest)>,
}

impl std::fmt::Debug for BlockLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockLog").field("dir", &self.dir).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits for a seglog job's completion.
fn wait(f: impl FnOnce(seglog::Done) -> Result<(), LogError>) -> Result<(), LogError> {
    let (tx, rx) = mpsc::channel();
    f(Box::new(move |r| {
        let _ = tx.send(r);
    }))?;
    rx.recv().map_err(|_| LogError::Stopped)?
}

impl BlockLog {
    /// Opens (or creates) the block log in `dir`, checking every record.
    pub fn open(dir: &Path) -> Result<BlockLog, BlockLogError> {
        let err = |e: LogError| BlockLogError::Log {
            dir: dir.to_path_buf(),
            source: Arc::new(e),
        };
        let (log, found) = SegLog::<Arc<Block>>::open(
            dir,
            seglog::Limits {
                segment_bytes: 64 << 20,
                cache_bytes: 16 << 20,
            },
            |meta, _| {
                let purged = match meta {
                    Some(m) => {
                        postcard::from_bytes::<Meta>(m)
                            .map_err(|_| {
                                LogError::from(seglog::Damage::new(
                                    dir.join("meta.bin"),
                                    8,
                                    "the block log's metadata",
                                    "bytes that do not decode",
                                ))
                            })?
                            .purged
                    }
                    None => None,
                };
                Ok(seglog::Bounds {
                    purged,
                    committed: None,
                    covered: None,
                    origin: Some(1),
                })
            },
        )
        .map_err(err)?;
        let meta: Meta = match &found.meta {
            Some(m) => postcard::from_bytes(m).unwrap_or_default(),
            None => {
                // Written before the first block, so a log holding blocks always has it.
                let m = Meta::default();
                wait(|done| log.save_meta(crate::shard::encode(&m), done)).map_err(err)?;
                m
            }
        };
        let first = meta.purged.map_or(1, |p| p + 1);
        let (last, tip) = match &found.last {
            Some((h, payload)) => {
                let b: Block =
                    postcard::from_bytes(payload).map_err(|_| BlockLogError::Undecodable {
                        dir: dir.to_path_buf(),
                        height: *h,
                    })?;
                (*h, b.hash())
            }
            None => (
                first - 1,
                meta.purged.map_or(GENESIS, |_| meta.tip_at_purge),
            ),
        };
        Ok(BlockLog {
            dir: dir.to_path_buf(),
            log,
            at: Mutex::new((first, last, tip)),
        })
    }

    fn err(&self, e: LogError) -> BlockLogError {
        BlockLogError::Log {
            dir: self.dir.clone(),
            source: Arc::new(e),
        }
    }

    /// The first and last heights held, and the last block's hash (`(1, 0, GENESIS)` before any
    /// block).
    pub fn span(&self) -> (Height, Height, Digest) {
        *lock(&self.at)
    }

    /// Appends `block` and waits until it is synced. A block already held is checked to be the
    /// same block; one past the next height starts the log after a gap (see the module's
    /// documentation).
    pub fn append(&self, block: &Block) -> Result<(), BlockLogError> {
        let mut at = lock(&self.at);
        let (first, last, tip) = *at;
        if block.height < first {
            return Ok(());
        }
        if block.height <= last {
            let held = self.read_held(first, block.height, block.height)?;
            if held.first().map(Block::hash) != Some(block.hash()) {
                return Err(BlockLogError::Fork {
                    dir: self.dir.clone(),
                    height: block.height,
                });
            }
            return Ok(());
        }
        if block.height > last + 1 {
            let meta = Meta {
                purged: Some(block.height - 1),
                tip_at_purge: block.prev,
            };
            wait(|done| {
                self.log
                    .purge(block.height - 1, crate::shard::encode(&meta), done)
            })
            .map_err(|e| self.err(e))?;
            *at = (block.height, block.height - 1, block.prev);
        } else if block.prev != tip {
            return Err(BlockLogError::Fork {
                dir: self.dir.clone(),
                height: block.height,
            });
        }
        // Encoded once: the framed record and the block's hash (the log's new tip).
        let mut hash = GENESIS;
        let mut buf = Vec::new();
        frame_with(&mut buf, block.height, |b| {
            postcard::to_allocvec(block).map(|v| {
                hash = Block::hash_of_encoding(&v);
                b.extend_from_slice(&v)
            })
        })
        .map_err(|_| BlockLogError::Undecodable {
            dir: self.dir.clone(),
            height: block.height,
        })?;
        let len = (buf.len() - seglog::HEADER) as u32;
        let shared = Arc::new(block.clone());
        wait(|done| {
            self.log
                .append_framed(buf, vec![(block.height, shared, len)], done)
        })
        .map_err(|e| self.err(e))?;
        let (first, _, _) = *at;
        *at = (first, block.height, hash);
        Ok(())
    }

    /// Marks the log as starting after `height`, whose block's hash is `tip`, when it ends
    /// before it: the replica's state was replaced by a snapshot holding blocks this log never
    /// received (they are on the replicas that applied them). Logged as a warning. The log
    /// holds one contiguous run of blocks, so every block it held (all before `height`) is
    /// dropped with it: this replica then serves only the blocks after `height`.
    pub fn skip_to(&self, height: Height, tip: Digest) -> Result<(), BlockLogError> {
        let mut at = lock(&self.at);
        if at.1 >= height {
            return Ok(());
        }
        tracing::warn!(
            "florin atomizer: block log {} ends at block {}, this replica's state is at block              {height} (it received a snapshot): blocks {}..={height} are on the other replicas",
            self.dir.display(),
            at.1,
            at.1 + 1
        );
        let meta = Meta {
            purged: Some(height),
            tip_at_purge: tip,
        };
        wait(|done| self.log.purge(height, crate::shard::encode(&meta), done))
            .map_err(|e| self.err(e))?;
        *at = (height + 1, height, tip);
        Ok(())
    }

    /// The blocks `from..=to` (as many as the log holds up to `to`).
    pub fn read(&self, from: Height, to: Height) -> Result<Vec<Block>, BlockLogError> {
        let first = lock(&self.at).0;
        self.read_held(first, from, to)
    }

    /// [`BlockLog::read`] for a log whose first height is `first` (the caller holds `at`).
    fn read_held(
        &self,
        first: Height,
        from: Height,
        to: Height,
    ) -> Result<Vec<Block>, BlockLogError> {
        if from < first {
            return Err(BlockLogError::Purged {
                dir: self.dir.clone(),
                first,
            });
        }
        let got = self
            .log
            .reader()
            .read(from, to.saturating_add(1))
            .map_err(|e| self.err(e))?;
        got.into_iter()
            .enumerate()
            .map(|(k, g)| match g {
                Got::Cached(b) => Ok((*b).clone()),
                Got::Disk(p) => postcard::from_bytes(&p).map_err(|_| BlockLogError::Undecodable {
                    dir: self.dir.clone(),
                    height: from + k as u64,
                }),
            })
            .collect()
    }
}
