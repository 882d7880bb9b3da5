//! Compact transactions: what the swap engine sees once a sentinel has validated a transaction.

use florin_crypto::Digest;

use crate::tx::{outputs_to_utxos, Transaction, UhsId};

/// What kind of transaction a compact transaction came from (for supply accounting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum TxKind {
    /// Value moves; inputs and outputs balance.
    Transfer,
    /// Value enters the ledger.
    Mint,
    /// Value leaves the ledger.
    Redeem,
}

impl TxKind {
    /// The wire byte.
    pub fn to_byte(self) -> u8 {
        match self {
            TxKind::Transfer => 1,
            TxKind::Mint => 2,
            TxKind::Redeem => 3,
        }
    }

    /// From the wire byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(TxKind::Transfer),
            2 => Some(TxKind::Mint),
            3 => Some(TxKind::Redeem),
            _ => None,
        }
    }
}

/// Input ids to remove and output ids (with their values, for auditing) to insert.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CompactTx {
    /// The transaction's id (remembered by the store: a replay changes nothing).
    #[serde(with = "crate::bin_serde::id")]
    pub txid: Digest,
    /// Its kind.
    pub kind: TxKind,
    /// UHS ids that must exist and are removed.
    #[serde(with = "crate::bin_serde::ids")]
    pub inputs: Vec<UhsId>,
    /// UHS ids created, with their values in cents.
    #[serde(with = "crate::bin_serde::valued_ids")]
    pub outputs: Vec<(UhsId, u64)>,
    /// The last second (Unix time) at which it may be applied ([`crate::expiry`]).
    pub expires: u64,
}

impl CompactTx {
    /// Whether a store forgets its txid once it has expired (transfers and redeems: their
    /// spent inputs stop any replay); a mint's txid is kept for ever.
    pub fn forgettable(&self) -> bool {
        self.kind != TxKind::Mint
    }
}

impl CompactTx {
    /// Compacts a transaction (the sentinel does this after validation).
    pub fn from_tx(tx: &Transaction) -> CompactTx {
        Self::with_txid(tx, tx.txid())
    }

    /// Compacts a transaction whose txid the caller already computed.
    pub(crate) fn with_txid(tx: &Transaction, txid: Digest) -> CompactTx {
        let outputs = |outs: &[crate::tx::Output]| -> Vec<(UhsId, u64)> {
            outputs_to_utxos(&txid, outs)
                .iter()
                .map(|u| (u.id(), u.value))
                .collect()
        };
        match tx {
            Transaction::Transfer(t) => CompactTx {
                txid,
                kind: TxKind::Transfer,
                inputs: t.inputs.iter().map(|u| u.id()).collect(),
                outputs: outputs(&t.outputs),
                expires: t.expires,
            },
            Transaction::Mint(m) => CompactTx {
                txid,
                kind: TxKind::Mint,
                inputs: Vec::new(),
                outputs: outputs(&m.outputs),
                expires: m.expires,
            },
            Transaction::Redeem(d) => CompactTx {
                txid,
                kind: TxKind::Redeem,
                inputs: d.inputs.iter().map(|u| u.id()).collect(),
                outputs: Vec::new(),
                expires: d.expires,
            },
        }
    }
}
