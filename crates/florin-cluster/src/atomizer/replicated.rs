//! The atomizer's and the shards' machines as Raft replicates them ([`crate::raft::Machine`]):
//! commands and replies postcard-encoded; the atomizer's sealed blocks appended to the replica's
//! [`BlockLog`] as they are applied.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::blocklog::BlockLog;
use super::machine::{AtomCmd, AtomizerConfig, AtomizerState, StepReply};
use super::shard::{BlockReply, BlockShard, ShardBlock, SnapshotError};
use super::Block;
use crate::raft::Machine;
use crate::route::{ShardId, ShardMap};
use crate::shard::{decode, encode, DecodeError};

/// The atomizer's answer to a replicated step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AtomReply {
    /// The step was applied.
    Stepped(StepReply),
    /// The command does not decode (nothing changed).
    Refused(String),
}

/// An atomizer replica's machine: the state and the block log its sealed blocks go to.
pub struct AtomizerMachine {
    /// The replicated state.
    pub state: AtomizerState,
    log: Arc<BlockLog>,
    /// Why the block log stopped taking blocks, if it did (the replica must not lead: it
    /// cannot send the blocks it lacks).
    failed: Option<String>,
}

impl AtomizerMachine {
    /// A machine with the settings and shard map every replica of the group shares, writing
    /// to `log`.
    pub fn new(cfg: AtomizerConfig, map: ShardMap, log: Arc<BlockLog>) -> AtomizerMachine {
        AtomizerMachine {
            state: AtomizerState::new(cfg, map),
            log,
            failed: None,
        }
    }

    /// The block log.
    pub fn log(&self) -> &Arc<BlockLog> {
        &self.log
    }

    /// Why the block log failed, if it did.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }
}

impl Machine for AtomizerMachine {
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
        let cmd = match decode::<AtomCmd>(cmd) {
            Ok(c) => c,
            Err(e) => return encode(&AtomReply::Refused(e.to_string())),
        };
        let (reply, blocks) = self.state.apply(cmd);
        for b in &blocks {
            if self.failed.is_some() {
                break;
            }
            if let Err(e) = self.log.append(b) {
                tracing::error!("ALERT florin atomizer: {e}; this replica will not lead");
                self.failed = Some(e.to_string());
            }
        }
        encode(&AtomReply::Stepped(reply))
    }
    fn snapshot(&self) -> Vec<u8> {
        self.state.snapshot()
    }
    type Error = DecodeError;
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), DecodeError> {
        let state = AtomizerState::from_snapshot(snapshot)?;
        // The settings decide what is ordered: a replica taking another's would seal other
        // blocks from the same steps (a cluster spec that changed them, or a version whose
        // defaults differ). Refused, loudly, rather than diverging.
        if state.config() != self.state.config() {
            tracing::error!(
                "ALERT florin atomizer: a snapshot with settings {:?} where this replica has {:?}: refused",
                state.config(),
                self.state.config()
            );
            return Err(DecodeError::Refused(format!(
                "atomizer settings {:?} differ from this replica's {:?}",
                state.config(),
                self.state.config()
            )));
        }
        self.state = state;
        if let Err(e) = self.log.skip_to(self.state.height(), self.state.tip()) {
            tracing::error!("ALERT florin atomizer: {e}; this replica will not lead");
            self.failed = Some(e.to_string());
        }
        Ok(())
    }
}

/// A shard replica's machine in the atomizer architecture: its commands are runs of blocks.
pub struct BlockShardMachine {
    /// The replicated state.
    pub state: BlockShard,
    map: ShardMap,
    shard: ShardId,
}

impl BlockShardMachine {
    /// Shard `shard` of `map`, before any block.
    pub fn new(map: ShardMap, shard: ShardId) -> BlockShardMachine {
        BlockShardMachine {
            state: BlockShard::new(map.clone(), shard),
            map,
            shard,
        }
    }
}

/// What starts a shard command of [`ShardBlock`]s (the commands of earlier releases, runs of
/// whole blocks or one block, have no prefix).
const PARTS: &[u8] = b"florin/atomizer/shard-parts/v1";

/// A shard command: these blocks' parts, applied in order.
pub fn shard_parts_command(parts: &[ShardBlock]) -> Vec<u8> {
    let mut cmd = PARTS.to_vec();
    cmd.extend_from_slice(&encode(&parts));
    cmd
}

/// What a shard replica answers a block with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardBlockReply {
    /// The block's effect.
    Block(BlockReply),
    /// The command does not decode (nothing changed).
    Refused(String),
}

impl Machine for BlockShardMachine {
    /// A command is a run of blocks, applied in order up to the first that does not apply
    /// (one Raft entry for all the blocks of one delivery, not one per block).
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
        // Each block's part for this shard (`shard_parts_command`); or whole blocks, the
        // commands of earlier releases: a run of them, or a single one (the first release's).
        let parts = match cmd.strip_prefix(PARTS) {
            Some(rest) => decode::<Vec<ShardBlock>>(rest),
            None => decode::<Vec<Block>>(cmd)
                .or_else(|e| decode::<Block>(cmd).map(|b| vec![b]).map_err(|_| e))
                .map(|blocks| {
                    blocks
                        .iter()
                        .map(|b| ShardBlock {
                            block: b.clone(),
                            hash: b.hash(),
                        })
                        .collect()
                }),
        };
        encode(&match parts {
            Ok(parts) => {
                let mut last = BlockReply::Applied(self.state.height());
                for p in &parts {
                    last = self.state.apply_part(p);
                    if !matches!(last, BlockReply::Applied(_)) {
                        break;
                    }
                }
                ShardBlockReply::Block(last)
            }
            Err(e) => ShardBlockReply::Refused(e.to_string()),
        })
    }
    fn snapshot(&self) -> Vec<u8> {
        self.state.snapshot()
    }
    type Error = SnapshotError;
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), SnapshotError> {
        self.state = BlockShard::from_snapshot(self.map.clone(), self.shard, snapshot)?;
        Ok(())
    }
}
