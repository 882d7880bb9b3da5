//! Compact serde encodings for byte strings and 32-byte ids, for `#[serde(with = "…")]`.
//!
//! serde has no specialisation for bytes: a `Vec<u8>` or a `[u8; 32]` is written element by
//! element, so a binary format such as postcard makes one call per byte on the way out and on the
//! way in. For the cluster's Raft entries (a whole batch, hundreds of kilobytes) and the ids in its
//! two-phase-commit messages that was a quarter of the CPU. These helpers write one length-prefixed
//! byte string instead (`serialize_bytes`), which postcard copies in one go.
//!
//! Human-readable formats (JSON) keep serde's default shape, so nothing that is shown to users
//! changes. In a binary format a byte string whose length does not fit (an id that is not 32
//! bytes, a list whose length is not a multiple of the element size) is a decoding error.

use std::fmt;

use serde::de::{Error, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 32-byte id.
type Id = [u8; 32];

/// Accepts a byte string (borrowed or owned) and hands it to `f`.
struct BytesWith<F>(&'static str, F);

impl<'de, T, F: FnOnce(&[u8]) -> Result<T, String>> Visitor<'de> for BytesWith<F> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
}

fn chunks<'a, const N: usize>(
    v: &'a [u8],
    what: &str,
) -> Result<impl Iterator<Item = [u8; N]> + 'a, String> {
    if !v.len().is_multiple_of(N) {
        return Err(format!(
            "{what}: {} bytes is not a multiple of {N}",
            v.len()
        ));
    }
    Ok(v.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    }))
}

/// `Vec<u8>` as one byte string.
pub mod bytes {
    use super::*;

    /// Serializes.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            v.serialize(s)
        } else {
            s.serialize_bytes(v)
        }
    }

    /// Deserializes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            Vec::deserialize(d)
        } else {
            d.deserialize_byte_buf(BytesWith("a byte string", |v: &[u8]| Ok(v.to_vec())))
        }
    }
}

/// A 32-byte id as one byte string.
pub mod id {
    use super::*;

    /// Serializes.
    pub fn serialize<S: Serializer>(v: &Id, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            v.serialize(s)
        } else {
            s.serialize_bytes(v)
        }
    }

    /// Deserializes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        if d.is_human_readable() {
            Id::deserialize(d)
        } else {
            d.deserialize_bytes(BytesWith("a 32-byte id", |v: &[u8]| {
                <Id>::try_from(v).map_err(|_| format!("an id of {} bytes, not 32", v.len()))
            }))
        }
    }
}

/// A list of 32-byte ids as one byte string of 32 × n bytes.
pub mod ids {
    use super::*;

    /// Serializes.
    pub fn serialize<S: Serializer>(v: &[Id], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            v.serialize(s)
        } else {
            s.serialize_bytes(v.as_flattened())
        }
    }

    /// Deserializes into any collection of ids (a `Vec`, or an inline small vector that
    /// spares a short list its allocation).
    pub fn deserialize<'de, D, C>(d: D) -> Result<C, D::Error>
    where
        D: Deserializer<'de>,
        C: FromIterator<Id>,
    {
        if d.is_human_readable() {
            Ok(Vec::<Id>::deserialize(d)?.into_iter().collect())
        } else {
            d.deserialize_bytes(BytesWith("32-byte ids", |v: &[u8]| {
                Ok(chunks::<32>(v, "ids")?.collect())
            }))
        }
    }
}

/// A list of (32-byte id, u64) pairs as one byte string of 40 × n bytes (the value little-endian).
pub mod valued_ids {
    use super::*;

    /// Serializes.
    pub fn serialize<S: Serializer>(v: &[(Id, u64)], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return v.serialize(s);
        }
        let put = |out: &mut [u8]| {
            for ((id, value), rec) in v.iter().zip(out.chunks_exact_mut(40)) {
                rec[..32].copy_from_slice(id);
                rec[32..].copy_from_slice(&value.to_le_bytes());
            }
        };
        // A transaction's few outputs are laid out on the stack; longer lists on the heap.
        let mut small = [0u8; 4 * 40];
        if v.len() <= 4 {
            let out = &mut small[..v.len() * 40];
            put(out);
            s.serialize_bytes(out)
        } else {
            let mut out = vec![0u8; v.len() * 40];
            put(&mut out);
            s.serialize_bytes(&out)
        }
    }

    /// Deserializes into any collection of pairs (a `Vec`, or an inline small vector).
    pub fn deserialize<'de, D, C>(d: D) -> Result<C, D::Error>
    where
        D: Deserializer<'de>,
        C: FromIterator<(Id, u64)>,
    {
        if d.is_human_readable() {
            Ok(Vec::<(Id, u64)>::deserialize(d)?.into_iter().collect())
        } else {
            d.deserialize_bytes(BytesWith("(id, value) pairs", |v: &[u8]| {
                Ok(chunks::<40>(v, "valued ids")?
                    .map(|c| {
                        let mut id = [0u8; 32];
                        id.copy_from_slice(&c[..32]);
                        let mut value = [0u8; 8];
                        value.copy_from_slice(&c[32..]);
                        (id, u64::from_le_bytes(value))
                    })
                    .collect())
            }))
        }
    }
}

/// A fixed-width integer stored little-endian in [`id_map`] records.
pub trait FixedLe: Sized + Copy {
    /// Its width in bytes.
    const N: usize;
    /// Appends it.
    fn put(self, out: &mut Vec<u8>);
    /// Reads it from exactly [`FixedLe::N`] bytes.
    fn get(b: &[u8]) -> Self;
}

macro_rules! fixed_le {
    ($t:ty) => {
        impl FixedLe for $t {
            const N: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
        }
    };
}
fixed_le!(u64);
fixed_le!(u128);

/// A `HashMap<id, integer>` as one byte string of `32 + N`-byte records (in the map's order):
/// a shard's unspent set of millions of ids encodes and decodes at memory speed in a snapshot.
pub mod id_map {
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    use super::*;

    /// Serializes.
    pub fn serialize<V, H, S>(m: &HashMap<Id, V, H>, s: S) -> Result<S::Ok, S::Error>
    where
        V: FixedLe + Serialize,
        S: Serializer,
    {
        if s.is_human_readable() {
            return s.collect_seq(m.iter());
        }
        let mut out = Vec::with_capacity(m.len() * (32 + V::N));
        for (k, v) in m {
            out.extend_from_slice(k);
            v.put(&mut out);
        }
        s.serialize_bytes(&out)
    }

    /// Deserializes (a repeated id keeps its last value).
    pub fn deserialize<'de, V, H, D>(d: D) -> Result<HashMap<Id, V, H>, D::Error>
    where
        V: FixedLe + Deserialize<'de>,
        H: BuildHasher + Default,
        D: Deserializer<'de>,
    {
        if d.is_human_readable() {
            let v: Vec<(Id, V)> = Vec::deserialize(d)?;
            return Ok(v.into_iter().collect());
        }
        d.deserialize_bytes(BytesWith("(id, integer) records", |b: &[u8]| {
            let n = 32 + V::N;
            if !b.len().is_multiple_of(n) {
                return Err(format!(
                    "id map: {} bytes is not a multiple of {n}",
                    b.len()
                ));
            }
            let mut m = HashMap::with_capacity_and_hasher(b.len() / n, H::default());
            for c in b.chunks_exact(n) {
                let mut id = [0u8; 32];
                id.copy_from_slice(&c[..32]);
                m.insert(id, V::get(&c[32..]));
            }
            Ok(m)
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct All {
        #[serde(with = "super::bytes")]
        bytes: Vec<u8>,
        #[serde(with = "super::id")]
        id: [u8; 32],
        #[serde(with = "super::ids")]
        ids: Vec<[u8; 32]>,
        #[serde(with = "super::valued_ids")]
        valued: Vec<([u8; 32], u64)>,
    }

    fn sample() -> All {
        All {
            bytes: b"hello".to_vec(),
            id: [7; 32],
            ids: vec![[1; 32], [2; 32]],
            valued: vec![([3; 32], 5), ([4; 32], u64::MAX)],
        }
    }

    #[test]
    fn binary_round_trips_compactly_and_json_keeps_its_shape() {
        let v = sample();
        let bin = postcard::to_allocvec(&v).unwrap();
        // Length prefixes (one byte each here) plus the raw bytes, nothing per element.
        assert_eq!(bin.len(), (1 + 5) + (1 + 32) + (1 + 64) + (1 + 80));
        assert_eq!(postcard::from_bytes::<All>(&bin).unwrap(), v);

        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["bytes"], serde_json::json!([104, 101, 108, 108, 111]));
        assert_eq!(json["valued"][1][1], serde_json::json!(u64::MAX));
        assert_eq!(serde_json::from_value::<All>(json).unwrap(), v);
    }

    #[test]
    fn wrong_lengths_are_decoding_errors() {
        let v = sample();
        let mut bin = postcard::to_allocvec(&v).unwrap();
        // Shorten the id's length prefix: the id is 31 bytes and everything after it shifts.
        assert_eq!(bin[6], 32);
        bin[6] = 31;
        assert!(postcard::from_bytes::<All>(&bin).is_err());

        #[derive(Serialize)]
        struct Raw<'a> {
            #[serde(with = "super::bytes")]
            bytes: Vec<u8>,
            #[serde(with = "super::bytes")]
            id: Vec<u8>,
            #[serde(with = "super::bytes")]
            ids: Vec<u8>,
            #[serde(with = "super::bytes")]
            valued: Vec<u8>,
            #[serde(skip)]
            _p: std::marker::PhantomData<&'a ()>,
        }
        let raw = |ids: usize, valued: usize| {
            postcard::to_allocvec(&Raw {
                bytes: vec![],
                id: vec![0; 32],
                ids: vec![0; ids],
                valued: vec![0; valued],
                _p: std::marker::PhantomData,
            })
            .unwrap()
        };
        assert!(postcard::from_bytes::<All>(&raw(64, 80)).is_ok());
        let e = postcard::from_bytes::<All>(&raw(33, 80)).unwrap_err();
        assert!(matches!(e, postcard::Error::SerdeDeCustom), "{e}");
        assert!(postcard::from_bytes::<All>(&raw(64, 41)).is_err());
        assert!(postcard::from_bytes::<All>(&[]).is_err());
    }
    #[test]
    fn lists_of_any_length_round_trip_into_any_collection() {
        use std::collections::VecDeque;

        #[derive(Debug, PartialEq, Deserialize)]
        struct Deque {
            #[serde(with = "super::ids")]
            ids: VecDeque<[u8; 32]>,
            #[serde(with = "super::valued_ids")]
            valued: VecDeque<([u8; 32], u64)>,
        }
        // 0..=4 pairs are laid out on the stack when encoding, 5 and more on the heap.
        for n in [0usize, 1, 4, 5, 9] {
            let ids: Vec<[u8; 32]> = (0..n).map(|i| [i as u8 + 1; 32]).collect();
            let valued: Vec<([u8; 32], u64)> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| (*id, u64::MAX - i as u64))
                .collect();
            let v = All {
                bytes: vec![],
                id: [0; 32],
                ids: ids.clone(),
                valued: valued.clone(),
            };
            let bin = postcard::to_allocvec(&v).unwrap();
            assert_eq!(postcard::from_bytes::<All>(&bin).unwrap(), v, "n = {n}");

            let d: Deque = postcard::from_bytes(&bin[1 + 1 + 32..]).unwrap();
            assert_eq!(d.ids, ids, "n = {n}");
            assert_eq!(d.valued, valued, "n = {n}");
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(serde_json::from_str::<All>(&json).unwrap(), v, "n = {n}");
        }
    }
}
