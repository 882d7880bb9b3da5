//! The one place ledger transfers are built: coin selection, change, the input limit and
//! signing. The wallet, the authority's reserve, the payment provider and the benchmarks all
//! build through here, so a transaction the ledger cannot decode (more than [`MAX_IO`] inputs or
//! outputs) or one that does not balance is never signed.
//!
//! Building is in two steps, so a caller whose signer is slow or remote (a threshold network)
//! can sign off the async runtime:
//! 1. [`payment`], [`consolidation`], [`payment_chain`] or [`Draft::new`] choose inputs and
//!    outputs and check them (counts, balance, zero values, output keys), giving a [`Draft`];
//! 2. [`Draft::sign`] signs with one [`Signer`] per input (an Ed25519 key signs the txid once,
//!    however many inputs it owns), or [`Draft::sign_with`] takes witnesses from any scheme's
//!    signer. Each witness is checked against its input's encumbrance before it is used.
//!
//! Selection is largest coins first: the fewest inputs for a payment. A payment that still
//! needs more than [`MAX_IO`] coins is refused with [`BuildError::TooManyInputs`]; a wallet
//! consolidates first ([`consolidation`]: the smallest coins into one), and a holder that signs
//! everything itself (the reserve) builds a [`payment_chain`].
//!
//! Nothing here does I/O.

use florin_crypto::{Digest, PublicKey, Signer};
use thiserror::Error;

use crate::tx::{p256_key_hash, Encumbrance, Output, Transfer, Utxo, Witness, MAX_IO};
use crate::tx::{SCHEME_ED25519, SCHEME_P256};

/// Why a transfer could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The coins offered hold less than the payment.
    #[error("not enough money: {have} cents held, {need} needed")]
    Insufficient {
        /// Cents the coins hold.
        have: u64,
        /// Cents needed.
        need: u64,
    },
    /// The payment needs more coins than one transaction takes.
    #[error("the payment needs {needed} coins, one transaction takes at most {max}")]
    TooManyInputs {
        /// Coins the payment needs (largest first).
        needed: usize,
        /// [`MAX_IO`].
        max: usize,
    },
    /// More outputs than one transaction takes.
    #[error("{count} outputs, one transaction takes at most {max}")]
    TooManyOutputs {
        /// Outputs asked for.
        count: usize,
        /// [`MAX_IO`].
        max: usize,
    },
    /// A transfer spends something.
    #[error("a transfer needs at least one input")]
    NoInputs,
    /// A transfer creates something.
    #[error("a transfer needs at least one output")]
    NoOutputs,
    /// The same coin twice.
    #[error("input {index} spends the same coin as an earlier input")]
    DuplicateInput {
        /// The later input's index.
        index: usize,
    },
    /// A coin of zero cents (the ledger holds none).
    #[error("input {index} is of zero cents")]
    ZeroInput {
        /// The input's index.
        index: usize,
    },
    /// An output of zero cents (or a payment of nothing).
    #[error("output {index} is of zero cents")]
    ZeroOutput {
        /// The output's index.
        index: usize,
    },
    /// An output locked to something nobody can sign for: an unknown scheme or an Ed25519 key
    /// that is not a valid point. Money sent there would be lost.
    #[error("output {index} is locked to an invalid key: {reason}")]
    InvalidOutput {
        /// The output's index.
        index: usize,
        /// Why.
        reason: String,
    },
    /// Inputs and outputs do not hold the same value (or a sum overflows).
    #[error("inputs hold {inputs} cents, outputs {outputs}")]
    Unbalanced {
        /// Cents in (saturated).
        inputs: u64,
        /// Cents out (saturated).
        outputs: u64,
    },
    /// One signer per input, or one witness per input, was not given.
    #[error("{inputs} inputs but {signers} signers")]
    SignerCount {
        /// Inputs.
        inputs: usize,
        /// Signers given.
        signers: usize,
    },
    /// A signer's key is not the one the input is locked to.
    #[error("input {index} is locked to another key than its signer's")]
    WrongSigner {
        /// The input's index.
        index: usize,
    },
    /// The signer failed.
    #[error("signing failed: {0}")]
    Signing(String),
}

/// A transfer checked and ready to sign: what was chosen and where the change went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    /// The transfer, without witnesses.
    pub transfer: Transfer,
    /// For each input, its index in the coins offered to the builder (for [`Draft::new`], the
    /// identity).
    pub chosen: Vec<usize>,
    /// The change output's index, if there is change.
    pub change: Option<usize>,
}

fn sum(values: impl Iterator<Item = u64>) -> Option<u64> {
    values.into_iter().try_fold(0u64, |a, v| a.checked_add(v))
}

fn check_output(index: usize, o: &Output) -> Result<(), BuildError> {
    if o.value == 0 {
        return Err(BuildError::ZeroOutput { index });
    }
    match o.encumbrance.scheme {
        SCHEME_ED25519 => {
            PublicKey(o.encumbrance.key)
                .validate()
                .map_err(|e| BuildError::InvalidOutput {
                    index,
                    reason: e.to_string(),
                })
        }
        // A P-256 encumbrance is a key's hash: nothing to check but the scheme.
        SCHEME_P256 => Ok(()),
        s => Err(BuildError::InvalidOutput {
            index,
            reason: format!("unknown scheme {s}"),
        }),
    }
}

impl Draft {
    /// A transfer of exactly these inputs into these outputs, checked as the ledger's validation
    /// would: 1..=[`MAX_IO`] distinct inputs of more than zero cents, 1..=[`MAX_IO`] outputs of
    /// more than zero cents to valid keys, value in = value out.
    pub fn new(inputs: Vec<Utxo>, outputs: Vec<Output>) -> Result<Draft, BuildError> {
        if inputs.is_empty() {
            return Err(BuildError::NoInputs);
        }
        if inputs.len() > MAX_IO {
            return Err(BuildError::TooManyInputs {
                needed: inputs.len(),
                max: MAX_IO,
            });
        }
        if outputs.is_empty() {
            return Err(BuildError::NoOutputs);
        }
        let mut seen = std::collections::HashSet::with_capacity(inputs.len());
        for (index, u) in inputs.iter().enumerate() {
            if u.value == 0 {
                return Err(BuildError::ZeroInput { index });
            }
            if !seen.insert(u.id()) {
                return Err(BuildError::DuplicateInput { index });
            }
        }
        if outputs.len() > MAX_IO {
            return Err(BuildError::TooManyOutputs {
                count: outputs.len(),
                max: MAX_IO,
            });
        }
        for (i, o) in outputs.iter().enumerate() {
            // Back to an input's own key (change): that key signs for the input, no check.
            if !inputs.iter().any(|u| u.encumbrance == o.encumbrance) {
                check_output(i, o)?;
            } else if o.value == 0 {
                return Err(BuildError::ZeroOutput { index: i });
            }
        }
        let vin = sum(inputs.iter().map(|u| u.value));
        let vout = sum(outputs.iter().map(|o| o.value));
        if vin.is_none() || vin != vout {
            return Err(BuildError::Unbalanced {
                inputs: vin.unwrap_or(u64::MAX),
                outputs: vout.unwrap_or(u64::MAX),
            });
        }
        let chosen = (0..inputs.len()).collect();
        Ok(Draft {
            transfer: Transfer {
                inputs,
                outputs,
                witnesses: vec![],
                expires: crate::expiry::default_expiry(),
            },
            chosen,
            change: None,
        })
    }

    /// The same draft with another expiry (Unix seconds; by default
    /// [`crate::expiry::DEFAULT_TTL_SECS`] from when it was drafted). Changes the txid.
    pub fn expiring(mut self, expires: u64) -> Draft {
        self.transfer.expires = expires;
        self
    }

    /// The txid the witnesses sign.
    pub fn txid(&self) -> Digest {
        self.transfer.txid()
    }

    /// The UTXOs the transfer creates, in output order.
    pub fn output_utxos(&self) -> Vec<Utxo> {
        self.transfer.output_utxos()
    }

    /// Signs with one Ed25519 signer per input. A key that owns several inputs signs once.
    pub fn sign(self, signers: &[&dyn Signer]) -> Result<Transfer, BuildError> {
        let n = self.transfer.inputs.len();
        if signers.len() != n {
            return Err(BuildError::SignerCount {
                inputs: n,
                signers: signers.len(),
            });
        }
        let mut done: Vec<Witness> = Vec::with_capacity(2);
        self.sign_with(|i, txid| {
            let key = signers[i].public_key();
            if let Some(w) = done
                .iter()
                .find(|w| matches!(w, Witness::Ed25519 { key: k, .. } if *k == key))
            {
                return Ok(*w);
            }
            let sig = signers[i]
                .sign(txid)
                .map_err(|e| BuildError::Signing(e.to_string()))?;
            let w = Witness::ed25519(key, sig);
            done.push(w);
            Ok(w)
        })
    }

    /// Signs with witnesses from `witness(input index, txid)`, for signers of any scheme. Each
    /// witness's key must be the one its input is locked to.
    pub fn sign_with(
        self,
        mut witness: impl FnMut(usize, &Digest) -> Result<Witness, BuildError>,
    ) -> Result<Transfer, BuildError> {
        let mut t = self.transfer;
        let txid = t.txid();
        let mut ws = Vec::with_capacity(t.inputs.len());
        for (i, u) in t.inputs.iter().enumerate() {
            let w = witness(i, &txid)?;
            if !owns(&w, &u.encumbrance) {
                return Err(BuildError::WrongSigner { index: i });
            }
            ws.push(w);
        }
        t.witnesses = ws;
        Ok(t)
    }
}

/// Whether `w`'s key is the one `e` names.
fn owns(w: &Witness, e: &Encumbrance) -> bool {
    match w {
        Witness::Ed25519 { key, .. } => e.scheme == SCHEME_ED25519 && key.0 == e.key,
        Witness::P256 { key, .. } => e.scheme == SCHEME_P256 && p256_key_hash(key) == e.key,
    }
}

/// The fewest coins (largest first) that cover `target` cents: their indices in `coins`.
/// [`BuildError::Insufficient`] when all of them do not, [`BuildError::TooManyInputs`] when
/// more than [`MAX_IO`] are needed.
pub fn select_largest_first(coins: &[Utxo], target: u64) -> Result<Vec<usize>, BuildError> {
    let (order, total) = covering(coins, target);
    if total < target {
        return Err(BuildError::Insufficient {
            have: total,
            need: target,
        });
    }
    if order.len() > MAX_IO {
        return Err(BuildError::TooManyInputs {
            needed: order.len(),
            max: MAX_IO,
        });
    }
    Ok(order)
}

/// The fewest coins, largest first, that cover `target` (all of them if they do not), without
/// the input limit, and what they hold.
fn covering(coins: &[Utxo], target: u64) -> (Vec<usize>, u64) {
    let mut order: Vec<usize> = (0..coins.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(coins[i].value));
    let mut total = 0u64;
    let mut n = 0;
    for &i in &order {
        if total >= target {
            break;
        }
        total = total.saturating_add(coins[i].value);
        n += 1;
    }
    order.truncate(n);
    (order, total)
}

/// Pays `pay` (one or more outputs) from `coins`, largest coins first, with any change to
/// `change_to` as the last output.
pub fn payment(
    coins: &[Utxo],
    pay: Vec<Output>,
    change_to: Encumbrance,
) -> Result<Draft, BuildError> {
    for (i, o) in pay.iter().enumerate() {
        check_output(i, o)?;
    }
    if pay.is_empty() {
        return Err(BuildError::ZeroOutput { index: 0 });
    }
    let amount = sum(pay.iter().map(|o| o.value)).ok_or(BuildError::Unbalanced {
        inputs: 0,
        outputs: u64::MAX,
    })?;
    let chosen = select_largest_first(coins, amount)?;
    let inputs: Vec<Utxo> = chosen.iter().map(|&i| coins[i]).collect();
    let held = sum(inputs.iter().map(|u| u.value)).ok_or(BuildError::Unbalanced {
        inputs: u64::MAX,
        outputs: amount,
    })?;
    let mut outputs = pay;
    let mut change = None;
    if held > amount {
        change = Some(outputs.len());
        outputs.push(Output {
            value: held - amount,
            encumbrance: change_to,
        });
    }
    let mut d = Draft::new(inputs, outputs)?;
    d.chosen = chosen;
    d.change = change;
    Ok(d)
}

/// The coins `chosen` (indices into `coins`) joined into one output to `to`.
fn join(coins: &[Utxo], chosen: Vec<usize>, to: Encumbrance) -> Result<Draft, BuildError> {
    let inputs: Vec<Utxo> = chosen.iter().map(|&i| coins[i]).collect();
    let value = sum(inputs.iter().map(|u| u.value)).ok_or(BuildError::Unbalanced {
        inputs: u64::MAX,
        outputs: 0,
    })?;
    let mut d = Draft::new(
        inputs,
        vec![Output {
            value,
            encumbrance: to,
        }],
    )?;
    d.chosen = chosen;
    d.change = Some(0);
    Ok(d)
}

/// Joins the smallest coins, as many as one transaction takes, into one output to `to`; `None`
/// when there are fewer than two coins.
pub fn consolidation(coins: &[Utxo], to: Encumbrance) -> Result<Option<Draft>, BuildError> {
    if coins.len() < 2 {
        return Ok(None);
    }
    let mut order: Vec<usize> = (0..coins.len()).collect();
    order.sort_by_key(|&i| coins[i].value);
    order.truncate(MAX_IO);
    let d = join(coins, order, to)?;
    Ok(Some(d))
}

/// A payment that may need more coins than one transaction takes, for a holder that signs all
/// of its coins itself and can submit a chain: the coins it needs (largest first) are joined
/// [`MAX_IO`] at a time into outputs to `change_to`, and the last draft pays from those. Every
/// input of a later draft is one of `coins` or an output of an earlier draft, so the drafts
/// must be submitted in order. One draft when no joining is needed; at most
/// [`MAX_IO`]² coins. [`Draft::chosen`] of the joining drafts index `coins`; of the last draft,
/// its inputs that are `coins` index them and the joined outputs are `usize::MAX`.
pub fn payment_chain(
    coins: &[Utxo],
    pay: Output,
    change_to: Encumbrance,
) -> Result<Vec<Draft>, BuildError> {
    check_output(0, &pay)?;
    match payment(coins, vec![pay], change_to) {
        Err(BuildError::TooManyInputs { .. }) => {}
        other => return other.map(|d| vec![d]),
    }
    // Every coin the payment needs, largest first (counted without the input limit).
    let (order, _) = covering(coins, pay.value);
    let n = order.len();
    if n > MAX_IO * MAX_IO {
        return Err(BuildError::TooManyInputs {
            needed: n,
            max: MAX_IO * MAX_IO,
        });
    }
    let mut drafts = Vec::new();
    let mut last_inputs = Vec::new();
    let mut last_chosen = Vec::new();
    for group in order.chunks(MAX_IO) {
        if group.len() == 1 {
            last_inputs.push(coins[group[0]]);
            last_chosen.push(group[0]);
            continue;
        }
        let d = join(coins, group.to_vec(), change_to)?;
        last_inputs.push(d.output_utxos()[0]);
        last_chosen.push(usize::MAX);
        drafts.push(d);
    }
    let mut last = payment(&last_inputs, vec![pay], change_to)?;
    last.chosen = last.chosen.iter().map(|&i| last_chosen[i]).collect();
    drafts.push(last);
    Ok(drafts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use florin_crypto::{LocalSigner, SecretKey};
    use rand::rngs::OsRng;

    fn key() -> LocalSigner {
        LocalSigner::new(SecretKey::generate(&mut OsRng))
    }

    fn coins(owner: &LocalSigner, values: &[u64]) -> Vec<Utxo> {
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| Utxo {
                value: v,
                encumbrance: Encumbrance::ed25519(&owner.public_key()),
                serial: florin_crypto::hash("test/coin", &[&(i as u64).to_le_bytes()]),
            })
            .collect()
    }

    fn to(k: &LocalSigner, value: u64) -> Output {
        Output {
            value,
            encumbrance: Encumbrance::ed25519(&k.public_key()),
        }
    }

    #[test]
    fn pays_largest_first_with_change_and_signs_once_per_key() {
        let me = key();
        let bob = key();
        let c = coins(&me, &[5, 50, 20, 1]);
        let me_enc = Encumbrance::ed25519(&me.public_key());
        let d = payment(&c, vec![to(&bob, 60)], me_enc).unwrap();
        assert_eq!(d.chosen, vec![1, 2]);
        assert_eq!(d.change, Some(1));
        assert_eq!(d.transfer.outputs[1].value, 10);
        let t = d.sign(&[&me, &me]).unwrap();
        assert_eq!(t.witnesses.len(), 2);
        assert_eq!(t.witnesses[0], t.witnesses[1]);
        let tx = crate::Transaction::Transfer(t);
        let bytes = tx.encode();
        assert_eq!(crate::Transaction::decode(&bytes).unwrap(), tx);
        // Exact amount: no change.
        let d = payment(&c, vec![to(&bob, 76)], me_enc).unwrap();
        assert_eq!((d.chosen.len(), d.change), (4, None));
    }

    #[test]
    fn refuses_what_the_ledger_would_not_take() {
        let me = key();
        let bob = key();
        let me_enc = Encumbrance::ed25519(&me.public_key());
        let c = coins(&me, &[5, 5]);
        assert_eq!(
            payment(&c, vec![to(&bob, 11)], me_enc),
            Err(BuildError::Insufficient { have: 10, need: 11 })
        );
        assert_eq!(
            payment(&c, vec![to(&bob, 0)], me_enc),
            Err(BuildError::ZeroOutput { index: 0 })
        );
        let bad = Output {
            value: 1,
            encumbrance: Encumbrance {
                scheme: SCHEME_ED25519,
                key: [0; 32],
            },
        };
        assert!(matches!(
            payment(&c, vec![bad], me_enc),
            Err(BuildError::InvalidOutput { index: 0, .. })
        ));
        let unknown = Output {
            value: 1,
            encumbrance: Encumbrance {
                scheme: 9,
                key: [1; 32],
            },
        };
        assert!(matches!(
            Draft::new(c.clone(), vec![to(&bob, 9), unknown]),
            Err(BuildError::InvalidOutput { index: 1, .. })
        ));
        assert!(matches!(
            Draft::new(c.clone(), vec![to(&bob, 9)]),
            Err(BuildError::Unbalanced {
                inputs: 10,
                outputs: 9
            })
        ));
        assert_eq!(Draft::new(vec![], vec![]), Err(BuildError::NoInputs));
        let huge = coins(&me, &[u64::MAX, 1]);
        assert!(matches!(
            Draft::new(huge, vec![to(&bob, 1)]),
            Err(BuildError::Unbalanced { .. })
        ));
        // Too many outputs.
        let many = coins(&me, &[MAX_IO as u64 + 1]);
        let outs = vec![to(&bob, 1); MAX_IO + 1];
        assert_eq!(
            Draft::new(many, outs),
            Err(BuildError::TooManyOutputs {
                count: MAX_IO + 1,
                max: MAX_IO
            })
        );
        // A signer for another key, or the wrong number of signers.
        let d = payment(&c, vec![to(&bob, 7)], me_enc).unwrap();
        assert_eq!(
            d.clone().sign(&[&me, &bob]),
            Err(BuildError::WrongSigner { index: 1 })
        );
        assert_eq!(
            d.sign(&[&me]),
            Err(BuildError::SignerCount {
                inputs: 2,
                signers: 1
            })
        );
    }

    #[test]
    fn more_coins_than_a_transaction_takes() {
        let me = key();
        let bob = key();
        let me_enc = Encumbrance::ed25519(&me.public_key());
        let n = MAX_IO * 2 + 5;
        let c = coins(&me, &vec![1; n]);
        assert_eq!(
            payment(&c, vec![to(&bob, n as u64)], me_enc),
            Err(BuildError::TooManyInputs {
                needed: n,
                max: MAX_IO
            })
        );
        // A consolidation joins the smallest MAX_IO.
        let j = consolidation(&c, me_enc).unwrap().unwrap();
        assert_eq!(j.transfer.inputs.len(), MAX_IO);
        assert_eq!(j.transfer.outputs[0].value, MAX_IO as u64);
        assert!(consolidation(&c[..1], me_enc).unwrap().is_none());
        // A chain for all but one coin: three joins (1,024, 1,024 and 4 coins), then the
        // payment from the three joined outputs, without change.
        let chain = payment_chain(&c, to(&bob, n as u64 - 1), me_enc).unwrap();
        assert_eq!(chain.len(), 4);
        let mut spent = std::collections::HashSet::new();
        let mut created: Vec<Utxo> = c.clone();
        for d in &chain[..3] {
            for u in &d.transfer.inputs {
                assert!(created.contains(u) && spent.insert(u.id()), "double use");
            }
            created.extend(d.output_utxos());
        }
        let last = chain.last().unwrap();
        assert_eq!(last.transfer.inputs.len(), 3);
        for u in &last.transfer.inputs {
            assert!(created.contains(u) && spent.insert(u.id()));
        }
        assert_eq!(last.transfer.outputs, vec![to(&bob, n as u64 - 1)]);
        assert_eq!(last.chosen, vec![usize::MAX; 3]);
        // Change when the coins needed hold more than the payment: 1,025 coins of 2 for 2,049.
        let c2 = coins(&me, &vec![2; MAX_IO + 1]);
        let pay = 2 * MAX_IO as u64 + 1;
        let chain2 = payment_chain(&c2, to(&bob, pay), me_enc).unwrap();
        assert_eq!(chain2.len(), 2);
        assert_eq!(chain2[1].transfer.inputs.len(), 2);
        assert_eq!(chain2[1].change, Some(1));
        assert_eq!(chain2[1].transfer.outputs[1].value, 1);
        for d in chain {
            let k = d.transfer.inputs.len();
            d.sign(&vec![&me as &dyn Signer; k]).unwrap();
        }
        // A payment the coins do not cover is refused before any join.
        assert!(matches!(
            payment_chain(&c, to(&bob, n as u64 + 1), me_enc),
            Err(BuildError::Insufficient { .. })
        ));
    }
}
