//! The wallet's online flows: pay, withdraw, sync, deposit, faucet, and what they share
//! (settling the transaction in flight, reconciling with the ledger, delivering handoffs,
//! collecting withdrawals).
//!
//! A flow changes the [`Wallet`], saves it through the [`WalletStore`] before anything leaves
//! (so a crash resumes instead of signing anew) and talks to the network through a
//! [`Connector`]. It returns what happened as data ([`Paid`], [`SyncReport`], …) or a
//! [`FlowError`] whose `Display` is the message for the user; the front end prints. Things
//! worth telling while a flow runs (a consolidation, outputs restored, a handoff dropped) go to
//! the [`Notice`] callback given to [`Flows::with_notices`].

use std::fmt;

use florin_crypto::PublicKey;
use florin_ledger::{Transaction, Utxo};
use florin_token::amount::format_cents;
use rand::rngs::OsRng;

use crate::connector::{error_chain, Connector, ConnectorError, TxVerdict, Withdrawal};
use crate::online::{decode_handoff, decode_note, HandoffFate};
use crate::store::{StoreError, WalletStore};
use crate::wallet::{DepositResult, Wallet, WalletError};

/// Why a flow stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    /// The wallet could not be saved.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The wallet refused the operation.
    #[error(transparent)]
    Wallet(#[from] WalletError),
    /// A node call failed.
    #[error(transparent)]
    Node(#[from] ConnectorError),
    /// Submitting a transaction got no verdict; it is saved in flight.
    #[error("the payment is saved and will be retried by `florin wallet sync`")]
    SubmitUnanswered(#[source] ConnectorError),
    /// A deposit got no answer; its tokens stay pending.
    #[error("deposit is pending; run `florin wallet deposit` again to retry")]
    DepositUnanswered(#[source] ConnectorError),
    /// The wallet trusts no authority and the node could not tell it one.
    #[error("this wallet trusts no authority yet")]
    NoAuthority(#[source] ConnectorError),
    /// The node serves another authority than the one the wallet trusts.
    #[error("the node is authority {node}, but this wallet trusts {trusted}")]
    AuthorityMismatch {
        /// The node's authority.
        node: PublicKey,
        /// The wallet's.
        trusted: PublicKey,
    },
    /// The wallet trusts no authority (needed to withdraw).
    #[error("no authority")]
    NoAuthorityKnown,
    /// The ledger did not confirm.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A payment needs more coins than a transaction takes and nothing can be consolidated.
    #[error(
        "the payment needs {needed} coins, more than {max}, and there is nothing to consolidate"
    )]
    NothingToConsolidate {
        /// Coins needed.
        needed: usize,
        /// Most inputs of one transaction.
        max: usize,
    },
    /// An earlier transaction is still pending on the ledger.
    #[error(
        "an earlier transaction is still pending on the ledger; `florin wallet sync` finishes it"
    )]
    EarlierPending,
    /// Something the wallet built or kept does not decode.
    #[error("{0}")]
    Corrupt(String),
}

/// Something worth telling while a flow runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Notice {
    /// A payment needed more coins than one transaction takes: the smallest were consolidated.
    Consolidated {
        /// Coins needed.
        needed: usize,
        /// Most inputs of one transaction.
        max: usize,
        /// The consolidation's txid (hex).
        txid: String,
    },
    /// Outputs set aside earlier as spent are unspent on the ledger again: back in the wallet.
    Restored {
        /// How many.
        count: usize,
        /// Their value.
        cents: u64,
    },
    /// A handoff owed from earlier was dropped (emitted by [`Flows::withdraw`], which has no
    /// other place to report it).
    HandoffDropped(DroppedHandoff),
    /// A payee refused an earlier payment delivered again over a device channel
    /// ([`crate::peer::pay_peer`]).
    EarlierPaymentRefused {
        /// Its amount.
        cents: u64,
        /// The payee's reason.
        reason: String,
    },
    /// The wallet's restore notes (the record that lets its backup words find its outputs)
    /// could not be left now; the next command tries again.
    NotesPending(String),
    /// A long flow (a withdrawal, a sync) entered a step (for a progress display).
    Step(&'static str),
    /// The current step's work: `done` of `total` (coins checked with the ledger, mailbox
    /// messages opened, withdrawals collected).
    Progress {
        /// Done so far.
        done: u64,
        /// In all (known so far).
        total: u64,
    },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Consolidated { needed, max, txid } => write!(
                f,
                "the payment needs {needed} coins and one transaction takes {max}: consolidated the smallest into one (txid {txid})"
            ),
            Notice::Restored { count, cents } => write!(
                f,
                "{count} output(s) of €{} set aside earlier as spent are unspent on the ledger again: back in the wallet",
                format_cents(*cents)
            ),
            Notice::HandoffDropped(d) => d.fmt(f),
            Notice::NotesPending(why) => write!(
                f,
                "restore notes not left yet ({why}): until the next command leaves them, a \
                 restore from the backup words would not find the newest outputs"
            ),
            Notice::EarlierPaymentRefused { cents, reason } => write!(
                f,
                "the payee refused an earlier payment of €{}: {reason}",
                format_cents(*cents)
            ),
            Notice::Step(step) => f.write_str(step),
            Notice::Progress { done, total } => write!(f, "{done} of {total}"),
        }
    }
}

/// A handoff that can never be delivered.
#[derive(Debug, Clone)]
pub struct DroppedHandoff {
    /// The payee.
    pub payee: PublicKey,
    /// The payee's output (hex).
    pub utxo: String,
    /// Why it cannot be delivered.
    pub reason: String,
}

impl DroppedHandoff {
    /// The value of the output.
    pub fn cents(&self) -> u64 {
        Wallet::handoff_utxo(&self.utxo)
            .map(|u| u.value)
            .unwrap_or(0)
    }
}

impl fmt::Display for DroppedHandoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dropped the handoff of €{} to {}: it can never be delivered ({}); the payment is \
             confirmed and the money stays with that key on the ledger",
            format_cents(self.cents()),
            self.payee,
            self.reason
        )
    }
}

/// The ledger's verdict on the wallet's transaction in flight.
#[derive(Debug, Clone)]
pub struct Settled {
    /// The verdict.
    pub verdict: TxVerdict,
    /// Why it is invalid, when it is.
    pub error: Option<String>,
    /// Inputs the ledger no longer holds unspent, removed from the wallet: (count, cents).
    pub removed: (usize, u64),
}

impl Settled {
    /// Whether the ledger confirmed.
    pub fn confirmed(&self) -> bool {
        self.verdict == TxVerdict::Confirmed
    }

    /// What to tell the user when the ledger did not confirm the `what` (a payment, a
    /// consolidation…); `w` is the wallet after settling.
    pub fn refusal(&self, what: &'static str, w: &Wallet) -> Refusal {
        Refusal {
            what,
            verdict: self.verdict.clone(),
            error: self.error.clone(),
            removed: self.removed,
            online_cents: w.balance().online_cents,
        }
    }

    /// `Ok` when confirmed, else the [`Refusal`] for `what`.
    pub fn check(&self, what: &'static str, w: &Wallet) -> Result<(), Refusal> {
        if self.confirmed() {
            Ok(())
        } else {
            Err(self.refusal(what, w))
        }
    }
}

/// The ledger did not confirm a transaction of the wallet.
#[derive(Debug, Clone, thiserror::Error)]
pub struct Refusal {
    /// What was refused ("payment", "consolidation", "payment to the reserve").
    pub what: &'static str,
    /// The verdict.
    pub verdict: TxVerdict,
    /// The ledger's reason.
    pub error: Option<String>,
    /// Coins removed as spent elsewhere: (count, cents).
    pub removed: (usize, u64),
    /// What remains on the ledger.
    pub online_cents: u64,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = self.what;
        let why = self
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        match self.verdict {
            TxVerdict::StateInvalid if self.removed.0 > 0 => write!(
                f,
                "the ledger refused the {what} ({}{why}): {} of your coins worth €{} were already \
                 spent elsewhere (a copy of this wallet, or a restored backup) and are removed; \
                 nothing was paid; €{} remains on the ledger — pay again",
                self.verdict,
                self.removed.0,
                format_cents(self.removed.1),
                format_cents(self.online_cents)
            ),
            TxVerdict::StateInvalid | TxVerdict::StaticInvalid | TxVerdict::Expired => write!(
                f,
                "the ledger refused the {what} ({}{why}); nothing was paid and your coins are back \
                 in the wallet",
                self.verdict
            ),
            ref other => write!(
                f,
                "the {what} is submitted but not confirmed yet ({other}); do not pay again: \
                 `florin wallet sync` finishes it"
            ),
        }
    }
}

/// Most restore notes one command leaves (each with up to
/// [`crate::online::NOTE_MAX_OUTPUTS`] outputs).
const NOTES_PER_COMMAND: usize = 20;

/// What happened to the handoffs owed to payees.
#[derive(Debug, Clone, Default)]
pub struct Handoffs {
    /// UTXOs (hex) delivered.
    pub delivered: Vec<String>,
    /// Why delivery is pending, if it is.
    pub pending: Option<String>,
    /// Handoffs dropped: they can never be delivered.
    pub dropped: Vec<DroppedHandoff>,
}

impl Handoffs {
    /// Adds `other`'s outcomes (an earlier delivery round).
    pub fn merge(&mut self, other: Handoffs) {
        self.delivered.extend(other.delivered);
        self.dropped.extend(other.dropped);
        if self.pending.is_none() {
            self.pending = other.pending;
        }
    }

    /// Whether the output `utxo` (hex) was delivered.
    pub fn delivered_this(&self, utxo: &str) -> bool {
        self.delivered.iter().any(|u| u == utxo)
    }

    /// Whether the output `utxo` (hex) was dropped.
    pub fn dropped_this(&self, utxo: &str) -> bool {
        self.dropped.iter().any(|d| d.utxo == utxo)
    }

    /// The fate of the handoff of `utxo` (hex).
    pub fn fate(&self, utxo: &str) -> HandoffFate {
        if self.delivered_this(utxo) {
            HandoffFate::Delivered
        } else if let Some(d) = self.dropped.iter().find(|d| d.utxo == utxo) {
            HandoffFate::Dropped(d.reason.clone())
        } else {
            HandoffFate::Pending(self.pending.clone().unwrap_or_default())
        }
    }
}

/// A confirmed payment or one the ledger did not confirm (see [`Settled::check`]).
#[derive(Debug, Clone)]
pub struct Paid {
    /// The payment.
    pub tx: Transaction,
    /// The ledger's verdict.
    pub settled: Settled,
    /// Handoffs delivered by this command: those owed from earlier and, when confirmed, the
    /// payee's.
    pub handoffs: Handoffs,
    /// The payee's handoff (when confirmed).
    pub fate: HandoffFate,
}

/// A withdrawal: paid to the reserve, tokens collected.
#[derive(Debug, Clone)]
pub struct Withdrawn {
    /// The payment to the reserve.
    pub tx: Transaction,
    /// Cents received as tokens (this and earlier withdrawals).
    pub received_cents: u64,
    /// Per withdrawal still waiting, why.
    pub errors: Vec<String>,
    /// Whether this withdrawal's tokens are still to be collected.
    pub waiting: bool,
}

/// What `sync` did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    /// Cents received from the mailbox (unspent outputs only).
    pub received: u64,
    /// Cents of withdrawals that arrived as tokens.
    pub withdrawn: u64,
    /// Coins removed as spent elsewhere: (count, cents).
    pub removed: (usize, u64),
    /// Handoffs delivered or dropped.
    pub handoffs: Handoffs,
    /// Per withdrawal still waiting, why.
    pub withdraw_errors: Vec<String>,
}

/// What a faucet call did.
#[derive(Debug, Clone)]
pub struct Fauceted {
    /// Cents received.
    pub received: u64,
    /// Outputs received.
    pub outputs: usize,
    /// Handoffs delivered on the way.
    pub handoffs: Handoffs,
}

/// What a deposit did.
#[derive(Debug)]
pub enum Deposited {
    /// Nothing received offline: nothing to deposit.
    Nothing,
    /// The authority answered.
    Done {
        /// Per-token outcomes, summed.
        result: DepositResult,
        /// A crediting deposit's credit is collected by a sync; why that failed, if it did.
        sync_error: Option<FlowError>,
    },
}

/// The flows of one wallet store over one connector.
pub struct Flows<'a, C> {
    store: &'a dyn WalletStore,
    connector: &'a C,
    notify: Box<dyn Fn(&Notice) + 'a>,
    /// The clock (Unix seconds) an `expired` answer is judged final by.
    clock: fn() -> u64,
}

impl<'a, C: Connector> Flows<'a, C> {
    /// Flows saving through `store` and reaching the network through `connector`.
    pub fn new(store: &'a dyn WalletStore, connector: &'a C) -> Self {
        Flows {
            store,
            connector,
            notify: Box::new(|_| {}),
            clock: florin_ledger::expiry::unix_now,
        }
    }

    /// Judges `expired` answers by `clock` instead of this machine's (tests).
    pub fn with_clock(mut self, clock: fn() -> u64) -> Self {
        self.clock = clock;
        self
    }

    /// Tells `f` about [`Notice`]s as they happen.
    pub fn with_notices(mut self, f: impl Fn(&Notice) + 'a) -> Self {
        self.notify = Box::new(f);
        self
    }

    /// The connector.
    pub fn connector(&self) -> &C {
        self.connector
    }

    fn save(&self, w: &Wallet) -> Result<(), FlowError> {
        Ok(self.store.save(w)?)
    }

    /// Learns the authority from the node on first use: see [`ensure_authority`].
    pub async fn ensure_authority(&self, w: &mut Wallet) -> Result<(), FlowError> {
        ensure_authority(w, self.connector).await
    }

    /// Devnet faucet: ledger money minted to the wallet, then handoffs owed go out (they
    /// never block this).
    pub async fn faucet(&self, w: &mut Wallet, cents: u64) -> Result<Fauceted, FlowError> {
        let utxos = self.connector.faucet(&w.public_key(), cents).await?;
        let received = w.receive_utxos(&utxos);
        w.record("faucet", received, None, "confirmed", None);
        self.save(w)?;
        let handoffs = self.deliver(w).await?;
        Ok(Fauceted {
            received,
            outputs: utxos.len(),
            handoffs,
        })
    }

    /// Pays `cents` to `payee` on the ledger: finishes what is in flight, builds the payment
    /// (consolidating first when it needs too many coins), submits and settles it and, when
    /// confirmed, delivers the payee's handoff. A verdict other than confirmed is returned in
    /// [`Paid::settled`], not as an error: the handoffs owed from earlier are still reported.
    pub async fn pay(
        &self,
        w: &mut Wallet,
        payee: PublicKey,
        cents: u64,
    ) -> Result<Paid, FlowError> {
        let earlier = self.finish_in_flight(w).await?;
        let tx = self.build_paying(w, payee, cents, "pay").await?;
        // Saved before it leaves: a crash resumes it (submission is idempotent).
        self.save(w)?;
        let settled = self.settle(w, &tx).await?;
        if !settled.confirmed() {
            // Coins back from a refusal (or a consolidation's output) still get their notes.
            self.leave_notes(w).await?;
            return Ok(Paid {
                tx,
                settled,
                handoffs: earlier,
                fate: HandoffFate::Pending(String::new()),
            });
        }
        let mut handoffs = self.deliver(w).await?;
        handoffs.merge(earlier);
        let utxo = hex::encode(payee_output(&tx)?.encode());
        let fate = handoffs.fate(&utxo);
        Ok(Paid {
            tx,
            settled,
            handoffs,
            fate,
        })
    }

    /// Withdraws `cents` into tokens: finishes what is in flight (handoffs dropped on the way
    /// are told as [`Notice::HandoffDropped`]), pays the authority's reserve, then collects the
    /// tokens. A payment the ledger does not confirm is a [`FlowError::Refused`].
    pub async fn withdraw(&self, w: &mut Wallet, cents: u64) -> Result<Withdrawn, FlowError> {
        let reserve = w.authority().ok_or(FlowError::NoAuthorityKnown)?;
        let earlier = self.finish_in_flight(w).await?;
        for d in earlier.dropped {
            (self.notify)(&Notice::HandoffDropped(d));
        }
        (self.notify)(&Notice::Step("paying the reserve on the ledger"));
        let tx = self.build_paying(w, reserve, cents, "withdraw").await?;
        self.save(w)?;
        let settled = self.settle(w, &tx).await?;
        // The change (if any) gets its restore note whatever the verdict.
        self.leave_notes(w).await?;
        settled.check("payment to the reserve", w)?;
        let txhex = hex::encode(tx.encode());
        let (received_cents, errors) = self.collect_withdrawals(w).await?;
        let waiting = w.awaiting_tokens().iter().any(|a| a.tx == txhex);
        Ok(Withdrawn {
            tx,
            received_cents,
            errors,
            waiting,
        })
    }

    /// Builds a payment; one that needs more coins than a ledger transaction takes is preceded
    /// by consolidations (the smallest coins into one), each confirmed before the next step.
    pub async fn build_paying(
        &self,
        w: &mut Wallet,
        payee: PublicKey,
        cents: u64,
        purpose: &str,
    ) -> Result<Transaction, FlowError> {
        loop {
            match w.build_payment(payee, cents, purpose) {
                Err(WalletError::TooManyInputs { needed, max }) => {
                    let Some(tx) = w.build_consolidation()? else {
                        return Err(FlowError::NothingToConsolidate { needed, max });
                    };
                    // Saved before it leaves, like a payment: a crash resumes it.
                    self.save(w)?;
                    let s = self.settle(w, &tx).await?;
                    s.check("consolidation", w)?;
                    (self.notify)(&Notice::Consolidated {
                        needed,
                        max,
                        txid: hex::encode(tx.txid()),
                    });
                }
                other => return Ok(other?),
            }
        }
    }

    /// Submits `tx` (idempotent) and settles the wallet's transaction in flight by the answer.
    /// When the ledger says its inputs are not unspent, each coin is checked and those the
    /// ledger no longer holds are removed, so the next payment does not choose them again.
    pub async fn settle(&self, w: &mut Wallet, tx: &Transaction) -> Result<Settled, FlowError> {
        let answer = self
            .connector
            .submit(tx)
            .await
            .map_err(FlowError::SubmitUnanswered)?;
        let mut removed = (0, 0);
        let mut verdict = answer.verdict.clone();
        match answer.verdict {
            TxVerdict::Confirmed => {
                w.settle_pending(true);
            }
            TxVerdict::StaticInvalid => {
                w.settle_pending(false);
            }
            TxVerdict::StateInvalid => {
                w.settle_pending(false);
                self.save(w)?;
                removed = self.reconcile(w).await?;
            }
            // Sent again after its expiry (the wallet was away longer than the transaction's
            // validity): a coin still unspent says it never applied, and now never will; every
            // coin spent says it applied before it expired. Either way the coins are checked.
            // Expired only just now: the ledger may still be committing it. Left in flight:
            // `sync` settles it once the answer is final.
            TxVerdict::Expired
                if !florin_ledger::expiry::expired_for_good(tx.expires(), (self.clock)()) =>
            {
                verdict = TxVerdict::Pending;
            }
            TxVerdict::Expired => {
                let mut applied = true;
                for u in florin_ledger::validate::inputs_of(tx) {
                    if self.connector.unspent(&u.id()).await? {
                        applied = false;
                        break;
                    }
                }
                w.settle_pending(applied);
                self.save(w)?;
                removed = self.reconcile(w).await?;
                if applied {
                    verdict = TxVerdict::Confirmed;
                }
            }
            _ => {}
        }
        self.save(w)?;
        Ok(Settled {
            verdict,
            error: answer.error,
            removed,
        })
    }

    /// Settles the transaction in flight, if any.
    async fn settle_in_flight(&self, w: &mut Wallet) -> Result<Option<Settled>, FlowError> {
        let Some(p) = w.pending_tx() else {
            return Ok(None);
        };
        let tx = decode_tx(&p.tx)?;
        Ok(Some(self.settle(w, &tx).await?))
    }

    /// Checks every coin the wallet holds against the ledger and forgets those no longer
    /// unspent; outputs set aside earlier that are unspent again come back. Returns (count,
    /// cents) removed.
    pub async fn reconcile(&self, w: &mut Wallet) -> Result<(usize, u64), FlowError> {
        let mut spent = Vec::new();
        let held = w.held_utxos();
        let aside = w.set_aside_utxos();
        let total = (held.len() + aside.len()) as u64;
        (self.notify)(&Notice::Step("checking coins with the ledger"));
        let mut done = 0;
        for u in held {
            if !self.connector.unspent(&u.id()).await? {
                spent.push(u.id());
            }
            done += 1;
            (self.notify)(&Notice::Progress { done, total });
        }
        // Set aside, never deleted: outputs a node called spent that it holds unspent again
        // (a ledger restored, a wrong node) come back.
        let mut back = Vec::new();
        for u in aside {
            if self.connector.unspent(&u.id()).await? {
                back.push(u.id());
            }
            done += 1;
            (self.notify)(&Notice::Progress { done, total });
        }
        let (count, cents) = w.restore_unspent(&back);
        if count > 0 {
            (self.notify)(&Notice::Restored { count, cents });
        }
        Ok(w.forget_spent(&spent))
    }

    /// Finishes whatever a crash or a lost answer left in flight. Handoffs and withdrawals
    /// owed from earlier are retried but never block: their failures are reported, not
    /// returned.
    pub async fn finish_in_flight(&self, w: &mut Wallet) -> Result<Handoffs, FlowError> {
        if let Some(s) = self.settle_in_flight(w).await? {
            if s.verdict == TxVerdict::Pending {
                return Err(FlowError::EarlierPending);
            }
        }
        let h = self.deliver(w).await?;
        self.collect_withdrawals(w).await?;
        Ok(h)
    }

    /// Delivers confirmed handoffs: each payee's output preimage, sealed to the payee. A
    /// handoff that cannot be delivered now stays queued (retried by later commands); one that
    /// can never be delivered (the payee's key is unusable) is dropped. Only saving the wallet
    /// can fail.
    pub async fn deliver(&self, w: &mut Wallet) -> Result<Handoffs, FlowError> {
        let mut out = Handoffs::default();
        for (payee, utxo) in w.outbox().to_vec() {
            let sealed = match Wallet::seal_handoff(&payee, &utxo, &mut OsRng) {
                Ok(s) => s,
                Err(reason) => {
                    w.delivered(&payee, &utxo);
                    self.save(w)?;
                    out.dropped.push(DroppedHandoff {
                        payee,
                        utxo,
                        reason,
                    });
                    continue;
                }
            };
            match self.connector.mailbox_put(&payee, &sealed).await {
                Ok(_) => {
                    w.delivered(&payee, &utxo);
                    self.save(w)?;
                    out.delivered.push(utxo);
                }
                Err(e) => {
                    out.pending = Some(error_chain(&e));
                    if !e.is_refusal() {
                        // Unreachable: the rest would fare the same.
                        break;
                    }
                    // Refused for now (this payee's mailbox is full): others may take theirs.
                }
            }
        }
        self.leave_notes(w).await?;
        Ok(out)
    }

    /// Leaves a restore note in the wallet's own mailbox for the held outputs that have none
    /// or an old one ([`Wallet::notes_due`]): sealed to the wallet's key, it lets the backup
    /// words alone find them again ([`Flows::restore`]). A note that cannot be left now is
    /// reported as [`Notice::NotesPending`] and tried again by the next command; only saving
    /// can fail.
    pub async fn leave_notes(&self, w: &mut Wallet) -> Result<(), FlowError> {
        let now = (self.clock)();
        // Each note holds at most NOTE_MAX_OUTPUTS outputs: a wallet with more leaves several
        // (bounded per command; the rest go with the next one).
        for _ in 0..NOTES_PER_COMMAND {
            let due = w.notes_due(now);
            if due.is_empty() {
                return Ok(());
            }
            let sealed = match w.seal_note(&due, &mut OsRng) {
                Ok(s) => s,
                Err(why) => {
                    (self.notify)(&Notice::NotesPending(why));
                    return Ok(());
                }
            };
            match self.connector.mailbox_put(&w.public_key(), &sealed).await {
                Ok(_) => {
                    w.mark_noted(&due, now);
                    self.save(w)?;
                }
                Err(e) => {
                    (self.notify)(&Notice::NotesPending(error_chain(&e)));
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Finds a restored wallet's ledger funds: a [`Flows::sync`] from the start of its mailbox.
    /// The mailbox holds the payments handed off to the wallet's address and the restore notes
    /// the wallet left for every output it held (its change included); each output found is
    /// checked unspent on the ledger before it counts.
    ///
    /// What cannot come back: tokens held offline (bearer data that existed only in the lost
    /// file), withdrawals whose tokens had not arrived, a transaction in flight, and outputs
    /// whose last note is older than the mailbox's retention (a wallet that syncs at least every
    /// [`crate::online::NOTE_REFRESH_SECS`] always has a fresh one).
    pub async fn restore(&self, w: &mut Wallet) -> Result<SyncReport, FlowError> {
        (self.notify)(&Notice::Step(
            "finding this wallet's outputs from its backup words",
        ));
        self.sync_from_mailbox(w, true).await
    }

    /// Collects the tokens of withdrawals paid on the ledger, each request signed by the key
    /// of an input of its payment. Returns the cents received and, per withdrawal still
    /// waiting, why.
    pub async fn collect_withdrawals(
        &self,
        w: &mut Wallet,
    ) -> Result<(u64, Vec<String>), FlowError> {
        let mut got = 0;
        let mut errors = Vec::new();
        let awaiting = w.awaiting_tokens().to_vec();
        if !awaiting.is_empty() {
            (self.notify)(&Notice::Step("collecting and checking the tokens"));
        }
        let total = awaiting.len() as u64;
        for (done, a) in awaiting.into_iter().enumerate() {
            (self.notify)(&Notice::Progress {
                done: done as u64,
                total,
            });
            let Some(auth) = w.withdraw_authorization(&a) else {
                errors.push(format!(
                    "€{}: no input of its payment is this wallet's, so it cannot sign for the tokens",
                    format_cents(a.cents)
                ));
                continue;
            };
            let req = Withdrawal {
                tx: a.tx.clone(),
                output: 0,
                recipient: w.public_key(),
                handshake: a.handshake.clone(),
                auth,
            };
            let received = match self.connector.withdraw(&req).await {
                Ok(tokens) => w
                    .receive_withdrawal(&a.tx, tokens, &mut OsRng)
                    .map_err(|e| error_chain(&e)),
                Err(e) => Err(error_chain(&e)),
            };
            match received {
                Ok(n) => {
                    got += n;
                    self.save(w)?;
                }
                Err(e) => errors.push(format!("€{}: {e}", format_cents(a.cents))),
            }
        }
        if total > 0 {
            (self.notify)(&Notice::Progress { done: total, total });
        }
        Ok((got, errors))
    }

    /// Sync: finish what is in flight, collect handoffs from the mailbox (counting only
    /// outputs the ledger confirms are unspent), then reconcile every held coin with the
    /// ledger: those it no longer holds unspent are removed, so a copied or restored wallet
    /// converges to the truth.
    pub async fn sync(&self, w: &mut Wallet) -> Result<SyncReport, FlowError> {
        self.sync_from_mailbox(w, false).await
    }

    /// [`Flows::sync`]; `restoring` also takes outputs from the wallet's own restore notes (a
    /// wallet that has its file knows its outputs: an ordinary sync only learns from the notes
    /// which key indices are used).
    async fn sync_from_mailbox(
        &self,
        w: &mut Wallet,
        restoring: bool,
    ) -> Result<SyncReport, FlowError> {
        let mut removed = (0, 0);
        if let Some(s) = self.settle_in_flight(w).await? {
            removed = s.removed;
        }
        let handoffs = self.deliver(w).await?;
        let (withdrawn, withdraw_errors) = self.collect_withdrawals(w).await?;
        let mut received = 0;
        (self.notify)(&Notice::Step("collecting payments from the mailbox"));
        let (mut opened, mut seen) = (0, 0);
        loop {
            let list = self
                .connector
                .mailbox_get(&w.public_key(), w.mailbox_cursor())
                .await?;
            if list.is_empty() {
                break;
            }
            seen += list.len() as u64;
            for m in list {
                opened += 1;
                (self.notify)(&Notice::Progress {
                    done: opened,
                    total: seen,
                });
                // A message that does not open or parse is someone else's noise: skip it.
                let plain = w.open_sealed(&m.message).unwrap_or_default();
                let entries = match decode_note(&w.note_key(), &plain) {
                    Some(noted) => {
                        w.observe_note_keys(&noted);
                        if restoring {
                            noted
                        } else {
                            Vec::new()
                        }
                    }
                    None => decode_handoff(&plain)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|u| (None, u))
                        .collect(),
                };
                let mut live = Vec::new();
                for (k, u) in entries {
                    // Only outputs locked to this wallet's keys and not known yet cost a
                    // question to the ledger.
                    if w.is_own(k, &u)
                        && !w.holds(&u)
                        && !live.iter().any(|(_, l): &(Option<u64>, Utxo)| l == &u)
                        && self.connector.unspent(&u.id()).await?
                    {
                        live.push((k, u));
                    }
                }
                received += w.receive_noted(&live);
                w.set_mailbox_cursor(m.seq);
                self.save(w)?;
            }
        }
        if received > 0 {
            w.record("receive", received, None, "confirmed", None);
        }
        let r = self.reconcile(w).await?;
        self.save(w)?;
        self.leave_notes(w).await?;
        removed = (removed.0 + r.0, removed.1 + r.1);
        Ok(SyncReport {
            received,
            withdrawn,
            removed,
            handoffs,
            withdraw_errors,
        })
    }

    /// Deposits the tokens received offline: signed over to the authority (saved before they
    /// leave, so a retry resends the same bytes), then re-anchored to this wallet or
    /// (`credit`) credited on the ledger, the credit collected by a sync.
    ///
    /// At most [`crate::MAX_DEPOSIT_PER_REQUEST`] tokens go in one request: more are deposited
    /// in parts, one after another, each saved before it leaves; a part left pending (to
    /// retry) ends the deposit there, and the next deposit resends it first.
    pub async fn deposit(&self, w: &mut Wallet, credit: bool) -> Result<Deposited, FlowError> {
        let mut result: Option<DepositResult> = None;
        let mut credited = false;
        while let Some((_handshake, tokens)) = w.prepare_deposit_mode(&mut OsRng, credit)? {
            self.save(w)?;
            let part_credit = w.pending_deposit_credits();
            credited |= part_credit;
            let items = self
                .connector
                .deposit(&w.public_key(), &tokens, part_credit)
                .await
                .map_err(FlowError::DepositUnanswered)?;
            let part = w.finish_deposit(items, &mut OsRng)?;
            self.save(w)?;
            match &mut result {
                Some(r) => r.absorb(part),
                None => result = Some(part),
            }
            if w.has_pending_deposit() {
                break;
            }
        }
        let Some(result) = result else {
            return Ok(Deposited::Nothing);
        };
        let (cents, status) = if result.credited_cents > 0 {
            (result.credited_cents, "credited".to_string())
        } else if result.still_pending > 0 {
            (0, "pending".to_string())
        } else if result.reanchored > 0 {
            (0, format!("reanchored {} tokens", result.reanchored))
        } else {
            (0, "refused".to_string())
        };
        w.record("deposit", cents, None, &status, None);
        self.save(w)?;
        let credit = credited;
        let mut sync_error = None;
        if credit {
            // The credit arrives as a ledger output handed off to this wallet's mailbox.
            if let Err(e) = self.sync(w).await {
                sync_error = Some(e);
            }
        }
        Ok(Deposited::Done { result, sync_error })
    }
}

/// Learns the authority from the node on first use; afterwards insists it stays the same (a
/// node that cannot be asked is no objection). Saves nothing: the caller saves the wallet with
/// what it does next.
pub async fn ensure_authority(w: &mut Wallet, connector: &impl Connector) -> Result<(), FlowError> {
    match w.authority() {
        Some(a) => {
            if let Ok(k) = connector.authority().await {
                if k != a {
                    return Err(FlowError::AuthorityMismatch {
                        node: k,
                        trusted: a,
                    });
                }
            }
            Ok(())
        }
        None => {
            let k = connector
                .authority()
                .await
                .map_err(FlowError::NoAuthority)?;
            w.set_authority(k);
            Ok(())
        }
    }
}

/// The payee's output of a payment built by the wallet (output 0).
pub fn payee_output(tx: &Transaction) -> Result<Utxo, FlowError> {
    match tx {
        Transaction::Transfer(t) => t
            .output_utxos()
            .first()
            .copied()
            .ok_or_else(|| FlowError::Corrupt("the payment has no output".into())),
        _ => Err(FlowError::Corrupt("not a transfer".into())),
    }
}

fn decode_tx(h: &str) -> Result<Transaction, FlowError> {
    let bytes =
        hex::decode(h).map_err(|e| FlowError::Corrupt(format!("transaction in flight: {e}")))?;
    Transaction::decode(&bytes)
        .map_err(|e| FlowError::Corrupt(format!("transaction in flight: {e}")))
}
