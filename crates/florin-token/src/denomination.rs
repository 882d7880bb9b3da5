//! The euro series: 1 cent to €500, one byte each.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::amount::format_cents;
use crate::codec::DecodeError;

/// A token's fixed value. The byte on the wire is `1..=15` in ascending value; every other byte
/// is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Denomination {
    /// 1 cent
    C1,
    /// 2 cents
    C2,
    /// 5 cents
    C5,
    /// 10 cents
    C10,
    /// 20 cents
    C20,
    /// 50 cents
    C50,
    /// €1
    E1,
    /// €2
    E2,
    /// €5
    E5,
    /// €10
    E10,
    /// €20
    E20,
    /// €50
    E50,
    /// €100
    E100,
    /// €200
    E200,
    /// €500
    E500,
}

impl Denomination {
    /// Every denomination, ascending.
    pub const ALL: [Denomination; 15] = [
        Self::C1,
        Self::C2,
        Self::C5,
        Self::C10,
        Self::C20,
        Self::C50,
        Self::E1,
        Self::E2,
        Self::E5,
        Self::E10,
        Self::E20,
        Self::E50,
        Self::E100,
        Self::E200,
        Self::E500,
    ];

    /// The value in euro cents.
    pub const fn cents(self) -> u64 {
        match self {
            Self::C1 => 1,
            Self::C2 => 2,
            Self::C5 => 5,
            Self::C10 => 10,
            Self::C20 => 20,
            Self::C50 => 50,
            Self::E1 => 100,
            Self::E2 => 200,
            Self::E5 => 500,
            Self::E10 => 1_000,
            Self::E20 => 2_000,
            Self::E50 => 5_000,
            Self::E100 => 10_000,
            Self::E200 => 20_000,
            Self::E500 => 50_000,
        }
    }

    /// The wire byte.
    pub fn to_byte(self) -> u8 {
        Self::ALL
            .iter()
            .position(|d| *d == self)
            .map_or(0, |i| i as u8 + 1)
    }

    /// Parses the wire byte.
    pub fn from_byte(b: u8) -> Result<Self, DecodeError> {
        match b {
            1..=15 => Ok(Self::ALL[b as usize - 1]),
            _ => Err(DecodeError::InvalidDenomination(b)),
        }
    }

    /// The denomination worth exactly `cents`, if any.
    pub fn from_cents(cents: u64) -> Option<Self> {
        Self::ALL.iter().copied().find(|d| d.cents() == cents)
    }

    /// Splits `cents` into the fewest tokens (greedy is optimal for the euro series).
    pub fn decompose(mut cents: u64) -> Vec<Denomination> {
        let mut out = Vec::new();
        for d in Self::ALL.iter().rev() {
            while cents >= d.cents() {
                out.push(*d);
                cents -= d.cents();
            }
        }
        out
    }
}

impl Denomination {
    /// Splits `cents` so that the tokens can pay most amounts up to the total in exact change:
    /// for each decade (1c, 10c, €1, €10, €100) that the amount can afford, one change set
    /// {1, 2, 2, 5} × decade (which makes every multiple of the decade from 0 to 9), then the
    /// fewest tokens for the rest.
    pub fn spendable_split(cents: u64) -> Vec<Denomination> {
        let mut out = Vec::new();
        let mut rest = cents;
        for decade in [1u64, 10, 100, 1_000, 10_000] {
            if rest < decade * 10 {
                break;
            }
            for unit in [1u64, 2, 2, 5] {
                if let Some(d) = Self::from_cents(unit * decade) {
                    out.push(d);
                }
            }
            rest -= decade * 10;
        }
        out.extend(Self::decompose(rest));
        out.sort();
        out
    }
}

impl fmt::Display for Denomination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "€{}", format_cents(self.cents()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_roundtrip_and_others_are_invalid() {
        for d in Denomination::ALL {
            assert_eq!(Denomination::from_byte(d.to_byte()), Ok(d));
        }
        for b in [0u8, 16, 17, 128, 255] {
            assert_eq!(
                Denomination::from_byte(b),
                Err(DecodeError::InvalidDenomination(b))
            );
        }
    }

    #[test]
    fn spendable_split_sums_and_makes_change() {
        for cents in [0u64, 1, 9, 10, 99, 1250, 88_888, 1_000_000] {
            let parts = Denomination::spendable_split(cents);
            assert_eq!(parts.iter().map(|d| d.cents()).sum::<u64>(), cents);
        }
        // Every whole-cent amount up to €12.50 can be paid exactly from a €12.50 split.
        let parts = Denomination::spendable_split(1250);
        let mut reach = vec![false; 1251];
        reach[0] = true;
        for d in &parts {
            for v in (d.cents() as usize..=1250).rev() {
                reach[v] |= reach[v - d.cents() as usize];
            }
        }
        assert!(reach.iter().all(|r| *r));
    }

    #[test]
    fn decompose_sums_and_is_minimal() {
        // €12.88 = 10 + 2 + 0.50 + 0.20 + 0.10 + 0.05 + 0.02 + 0.01
        assert_eq!(Denomination::decompose(1288).len(), 8);
        for cents in [0u64, 1, 3, 99, 1250, 88_888, 1_000_000] {
            let parts = Denomination::decompose(cents);
            assert_eq!(parts.iter().map(|d| d.cents()).sum::<u64>(), cents);
        }
    }
}
