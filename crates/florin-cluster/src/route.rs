//! Routing by id prefix: shard `i` owns the ids whose first two bytes (big-endian) fall in
//! `[starts[i], starts[i + 1])`. Ranges are configurable; [`ShardMap::even`] splits evenly.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A shard's index in the map.
pub type ShardId = u16;

/// Why a shard map is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouteError {
    /// No shards, or more than the prefix space.
    #[error("a shard map needs 1..=65536 shards, got {0}")]
    Count(usize),
    /// The first range must start at 0 and starts must increase strictly.
    #[error("shard range starts must begin at 0 and increase strictly: {0:?}")]
    Order(Vec<u16>),
}

/// Which shard owns which ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    starts: Vec<u16>,
}

impl ShardMap {
    /// `n` shards with (nearly) equal ranges.
    pub fn even(n: usize) -> Result<ShardMap, RouteError> {
        if n == 0 || n > 1 << 16 {
            return Err(RouteError::Count(n));
        }
        let starts = (0..n).map(|i| ((i << 16) / n) as u16).collect();
        Ok(ShardMap { starts })
    }

    /// Shards starting at the given prefixes (the first must be 0).
    pub fn from_starts(starts: Vec<u16>) -> Result<ShardMap, RouteError> {
        if starts.is_empty() {
            return Err(RouteError::Count(0));
        }
        if starts[0] != 0 || starts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(RouteError::Order(starts));
        }
        Ok(ShardMap { starts })
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Never true (a map has at least one shard); here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The range starts.
    pub fn starts(&self) -> &[u16] {
        &self.starts
    }

    /// The shard owning `id`.
    pub fn shard_of(&self, id: &[u8; 32]) -> ShardId {
        let prefix = u16::from_be_bytes([id[0], id[1]]);
        // The last start that is <= prefix; starts[0] == 0 so there is one.
        (self.starts.partition_point(|s| *s <= prefix) - 1) as ShardId
    }

    /// Whether shard `shard` owns `id`.
    pub fn owns(&self, shard: ShardId, id: &[u8; 32]) -> bool {
        self.shard_of(id) == shard
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn id(a: u8, b: u8) -> [u8; 32] {
        let mut x = [7u8; 32];
        x[0] = a;
        x[1] = b;
        x
    }

    #[test]
    fn even_maps_cover_the_space_in_order() {
        let m = ShardMap::even(4).unwrap();
        assert_eq!(m.starts(), &[0, 0x4000, 0x8000, 0xc000]);
        assert_eq!(m.shard_of(&id(0, 0)), 0);
        assert_eq!(m.shard_of(&id(0x3f, 0xff)), 0);
        assert_eq!(m.shard_of(&id(0x40, 0)), 1);
        assert_eq!(m.shard_of(&id(0xff, 0xff)), 3);
        assert_eq!(ShardMap::even(1).unwrap().shard_of(&id(0xff, 0xff)), 0);
    }

    #[test]
    fn bad_maps_are_refused() {
        assert_eq!(ShardMap::even(0), Err(RouteError::Count(0)));
        assert!(ShardMap::from_starts(vec![1, 5]).is_err());
        assert!(ShardMap::from_starts(vec![0, 5, 5]).is_err());
        assert!(ShardMap::from_starts(vec![]).is_err());
        let m = ShardMap::from_starts(vec![0, 0x0100]).unwrap();
        assert_eq!(m.shard_of(&id(0, 0xff)), 0);
        assert_eq!(m.shard_of(&id(1, 0)), 1);
    }
}
