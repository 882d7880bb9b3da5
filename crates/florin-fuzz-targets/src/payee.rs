//! The offline payee's session state machine (`florin_wallet::peer::serve_payer`, what
//! `florin offline listen` runs for every payer that connects) against a reference model.
//!
//! A real payee wallet in a real wallet file (`FileStore`, in `/dev/shm` when there is one)
//! serves 1–4 sessions, each from one of two payers holding tokens of the trusted authority and
//! of a rogue one. In each session the fuzzer plays the payer, one message at a time, seeing
//! the payee's answers: asks for requests (payable amounts or any), deliveries (paying the
//! session's request, an earlier session's, an accepted one again, or a made-up handshake; any
//! subset of the payer's tokens, so amounts that do not match and tokens already passed to the
//! payee; a flipped signature byte, a rogue authority's token, tokens passed to someone else,
//! a payment naming another payee), exact repeats of receipted payments, and other messages;
//! with a fuzzer-chosen message cap.
//!
//! The model predicts every answer: one request per session, issued exactly when the offline
//! limit allows it, for the amount asked, to the payee; a delivery is receipted and credited
//! exactly when it names the payee and an open request, matches its amount, and every token is
//! genuine, passed to the payee under that handshake and not already held (never refused for
//! the offline limit: the request reserved it); an exact repeat of
//! a receipted payment gets the same receipt and no credit; anything else is refused and
//! changes nothing. Checked too: the session ends `Closed` or at its cap, the events and the
//! session's count agree with the credits, and the wallet file, loaded again, holds exactly the
//! model's balance, tokens and open requests.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_token::{Denomination, Handshake, Payment, Token};
use florin_wallet::connector::Cause;
use florin_wallet::peer::{
    serve_payer, FromPayer, PayeeEvent, PayerChannel, RecvError, SessionEnd, SessionLimits, ToPayer,
};
use florin_wallet::{FileStore, Wallet, WalletStore};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::Input;

const DENOMS: [Denomination; 6] = [
    Denomination::C50,
    Denomination::E1,
    Denomination::E1,
    Denomination::E2,
    Denomination::E5,
    Denomination::E10,
];

struct Payer {
    key: LocalSigner,
    /// Tokens of the trusted authority, then the rogue one's, all held by `key`.
    tokens: Vec<Token>,
    rogue: Vec<Token>,
}

struct Fixture {
    dir: tempfile::TempDir,
    authority: LocalSigner,
    outsider: LocalSigner,
    payers: Vec<Payer>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let authority = LocalSigner::new(SecretKey::from_seed(&[41; 32]));
        let rogue = LocalSigner::new(SecretKey::from_seed(&[42; 32]));
        let mint = |by: &LocalSigner, to: &LocalSigner, tag: u8| -> Vec<Token> {
            DENOMS
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    match Token::mint(
                        by,
                        [tag, i as u8, 0, 0, 0, 0, 0, 1],
                        *d,
                        [tag; 64],
                        to.public_key(),
                        [tag; 32],
                    ) {
                        Ok(t) => t,
                        Err(e) => panic!("cannot mint: {e}"),
                    }
                })
                .collect()
        };
        let payers = (0..2u8)
            .map(|i| {
                let key = LocalSigner::new(SecretKey::from_seed(&[50 + i; 32]));
                Payer {
                    tokens: mint(&authority, &key, 10 + i),
                    rogue: mint(&rogue, &key, 20 + i),
                    key,
                }
            })
            .collect();
        let shm = std::path::Path::new("/dev/shm");
        let dir = match if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        } {
            Ok(d) => d,
            Err(e) => panic!("no temporary directory: {e}"),
        };
        Fixture {
            dir,
            authority,
            outsider: LocalSigner::new(SecretKey::from_seed(&[43; 32])),
            payers,
        }
    })
}

/// What the payee holds and owes, as the model sees it.
#[derive(Default)]
struct Model {
    /// Open requests: handshake → amount.
    open: Vec<(Handshake, u64)>,
    /// Receipted payments: handshake → (payment bytes, amount).
    received: HashMap<Handshake, (Vec<u8>, u64)>,
    /// Serials the payee holds.
    held: HashSet<[u8; 8]>,
    balance: u64,
    limit: u64,
}

/// What the payee must answer to the message just sent.
enum Expect {
    /// A request for this amount, or a refusal when the limit does not allow it.
    Request(u64),
    /// A refusal.
    Refused,
    /// A receipt for this payment (its bytes), worth this much; `true` when newly credited.
    Receipt(Vec<u8>, u64, bool, Handshake),
}

/// The payer's side of one session, played by the fuzzer, checking each answer.
struct Session<'a, 'b> {
    inp: &'a mut Input<'b>,
    model: &'a mut Model,
    payer: &'static Payer,
    me: PublicKey,
    steps: usize,
    asked: bool,
    /// This session's request, if one was issued.
    request: Option<Handshake>,
    expect: Option<Expect>,
    credited: usize,
}

impl Session<'_, '_> {
    fn pick_tokens(&mut self) -> Vec<Token> {
        let mask = self.inp.u8();
        (0..DENOMS.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| self.payer.tokens[i].clone())
            .collect()
    }

    fn deliver(&mut self) -> FromPayer {
        let f = fixture();
        // Which request: this session's, any open one, an accepted one, or made up.
        let handshake = match self.inp.u8() % 4 {
            0 if self.request.is_some() => self.request.unwrap_or_default(),
            1 if !self.model.open.is_empty() => {
                self.model.open[self.inp.below(self.model.open.len())].0
            }
            2 if !self.model.received.is_empty() => {
                let mut keys: Vec<_> = self.model.received.keys().copied().collect();
                keys.sort();
                keys[self.inp.below(keys.len())]
            }
            _ => {
                let mut h = [0u8; 32];
                h[0] = self.inp.u8();
                h
            }
        };
        // Which tokens: exact change for the request when the payer can make it, or any subset.
        let asked = self
            .model
            .open
            .iter()
            .find(|(h, _)| *h == handshake)
            .map(|(_, a)| *a);
        let mut tokens = match asked {
            Some(a) if self.inp.u8() & 1 == 0 => exact(&self.payer.tokens, a),
            _ => None,
        }
        .unwrap_or_else(|| self.pick_tokens());
        let tamper = match self.inp.u8() {
            0..=191 => 0,
            b => 1 + b % 4,
        };
        if tamper == 2 && !tokens.is_empty() {
            // A rogue authority's token of the same value.
            let i = self.inp.below(tokens.len());
            if let Some(r) = self.payer.rogue.iter().find(|r| r.value == tokens[i].value) {
                tokens[i] = r.clone();
            }
        }
        // 3: tokens passed to someone else in a payment naming the payee; 4: a payment for
        // someone else.
        let recipient = if matches!(tamper, 3 | 4) {
            f.outsider.public_key()
        } else {
            self.me
        };
        let named = if tamper == 4 {
            f.outsider.public_key()
        } else {
            self.me
        };
        let mut passed: Vec<Token> = tokens
            .iter()
            .map(
                |t| match t.transfer(&self.payer.key, recipient, handshake) {
                    Ok(t) => t,
                    Err(e) => panic!("the payer cannot pass its own token: {e}"),
                },
            )
            .collect();
        let tampered = tamper != 0 && !passed.is_empty();
        if tamper == 1 {
            if let Some(l) = passed.first_mut().and_then(|t| t.links.last_mut()) {
                let at = self.inp.below(l.proof.0.len());
                l.proof.0[at] ^= 1 << (self.inp.u8() % 8);
            }
        }
        let p = Payment {
            payee: named,
            handshake,
            tokens: std::mem::take(&mut passed),
        };
        self.expect = Some(self.predict(&p, tampered || named != self.me));
        FromPayer::Deliver(p)
    }

    fn predict(&self, p: &Payment, bad: bool) -> Expect {
        let bytes = p.encode();
        if let Some((was, amount)) = self.model.received.get(&p.handshake) {
            return if *was == bytes && p.payee == self.me {
                Expect::Receipt(bytes, *amount, false, p.handshake)
            } else {
                Expect::Refused
            };
        }
        let Some(&(_, asked)) = self.model.open.iter().find(|(h, _)| *h == p.handshake) else {
            return Expect::Refused;
        };
        let amount = p.amount_cents();
        // An open request reserved its amount of the offline limit when it was issued: a
        // correct payment for it is never refused for the limit (the payer has signed).
        if bad || amount != asked || p.tokens.iter().any(|t| self.model.held.contains(&t.serial)) {
            return Expect::Refused;
        }
        Expect::Receipt(bytes, amount, true, p.handshake)
    }
}

/// Tokens of `have` summing to `cents`, if any subset does.
fn exact(have: &[Token], cents: u64) -> Option<Vec<Token>> {
    (0u32..1 << have.len())
        .find(|m| {
            have.iter()
                .enumerate()
                .filter(|(i, _)| m & (1 << i) != 0)
                .map(|(_, t)| t.value.cents())
                .sum::<u64>()
                == cents
        })
        .map(|m| {
            have.iter()
                .enumerate()
                .filter(|(i, _)| m & (1 << i) != 0)
                .map(|(_, t)| t.clone())
                .collect()
        })
}

impl PayerChannel for Session<'_, '_> {
    fn peer(&self) -> PublicKey {
        self.payer.key.public_key()
    }

    fn recv(&mut self, _timeout: Duration) -> Result<FromPayer, RecvError> {
        assert!(self.expect.is_none(), "a message went unanswered");
        if self.steps == 0 {
            return Err(RecvError::Closed);
        }
        self.steps -= 1;
        Ok(match self.inp.u8() % 8 {
            0 | 1 => {
                let amount = if self.inp.u8() & 1 == 0 {
                    self.pick_tokens().iter().map(|t| t.value.cents()).sum()
                } else {
                    u64::from(self.inp.u16()) * 100
                };
                self.expect = Some(if self.asked || amount == 0 {
                    Expect::Refused
                } else {
                    Expect::Request(amount)
                });
                self.asked = true;
                FromPayer::Ask {
                    amount_cents: amount,
                }
            }
            2 if !self.model.received.is_empty() => {
                // An exact repeat of a receipted payment (a receipt lost on the way).
                let mut all: Vec<_> = self.model.received.values().collect();
                all.sort();
                let (bytes, _) = all[self.inp.below(all.len())];
                let p = match Payment::decode(bytes) {
                    Ok(p) => p,
                    Err(e) => panic!("a receipted payment does not decode: {e}"),
                };
                self.expect = Some(self.predict(&p, false));
                FromPayer::Deliver(p)
            }
            7 => {
                self.expect = Some(Expect::Refused);
                FromPayer::Other("a stray message".into())
            }
            _ => self.deliver(),
        })
    }

    fn send(&mut self, answer: ToPayer) -> Result<(), Cause> {
        let Some(expect) = self.expect.take() else {
            panic!("an answer to no message: {answer:?}");
        };
        match (expect, answer) {
            (Expect::Request(amount), ToPayer::Request(r)) => {
                assert_eq!(r.amount_cents, amount, "a request for another amount");
                assert_eq!(r.payee, self.me, "a request naming another payee");
                let open: u64 = self.model.open.iter().map(|(_, a)| a).sum();
                assert!(
                    self.model.balance + open + amount <= self.model.limit,
                    "a request over the offline limit"
                );
                assert!(
                    !self.model.open.iter().any(|(h, _)| *h == r.handshake)
                        && !self.model.received.contains_key(&r.handshake),
                    "a request reusing a handshake"
                );
                self.model.open.push((r.handshake, amount));
                self.request = Some(r.handshake);
            }
            (Expect::Request(amount), ToPayer::Refused(why)) => {
                let open: u64 = self.model.open.iter().map(|(_, a)| a).sum();
                assert!(
                    self.model.balance + open + amount > self.model.limit,
                    "a request within the limit refused: {why}"
                );
            }
            (Expect::Refused, ToPayer::Refused(_)) => {}
            (
                Expect::Receipt(bytes, amount, new, handshake),
                ToPayer::Receipt {
                    payment,
                    amount_cents,
                },
            ) => {
                assert!(payment.encode() == bytes, "a receipt for another payment");
                assert_eq!(amount_cents, amount, "a receipt for another amount");
                if new {
                    self.model.balance += amount;
                    self.model.open.retain(|(h, _)| *h != handshake);
                    self.model
                        .held
                        .extend(payment.tokens.iter().map(|t| t.serial));
                    self.model.received.insert(handshake, (bytes, amount));
                    self.credited += 1;
                }
            }
            (Expect::Refused, a) => panic!("the payee should have refused; it answered {a:?}"),
            (Expect::Receipt(..), ToPayer::Refused(why)) => {
                panic!("the payee refused a payment the model accepts: {why}")
            }
            (_, a) => panic!("an answer out of turn: {a:?}"),
        }
        Ok(())
    }
}

/// The fuzz target.
pub fn payee(data: &[u8]) {
    run(data);
}

/// Runs the sessions `data` describes; returns the payee's balance as the model and the saved
/// wallet agree on it.
fn run(data: &[u8]) -> u64 {
    // One wallet file per process: calls from several threads (the replay tests) take turns.
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let f = fixture();
    let path: PathBuf = f.dir.path().join("payee.json");
    for entry in std::fs::read_dir(f.dir.path())
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = std::fs::remove_file(entry.path());
    }
    let mut rng = StdRng::seed_from_u64(7);
    let w = Wallet::generate(&mut rng, Some(f.authority.public_key()));
    let me = w.public_key();
    let store = FileStore::new(&path);
    if let Err(e) = store.create(&w) {
        panic!("cannot create the payee's wallet: {e}");
    }
    let mut model = Model {
        limit: w.max_offline_cents,
        ..Model::default()
    };
    let mut inp = Input::new(data);
    for _ in 0..1 + inp.below(4) {
        let payer = &f.payers[inp.below(2)];
        let cap = 1 + inp.below(10);
        let steps = inp.below(12);
        let limits = SessionLimits {
            deadline: Duration::from_secs(3600),
            max_messages: cap,
            message_timeout: Duration::from_secs(3600),
        };
        let mut events = Vec::new();
        let mut s = Session {
            inp: &mut inp,
            model: &mut model,
            payer,
            me,
            steps,
            asked: false,
            request: None,
            expect: None,
            credited: 0,
        };
        let served = match serve_payer(&store, &mut s, &limits, &mut rng, |e| {
            events.push(e.clone())
        }) {
            Ok(v) => v,
            Err(e) => panic!("the payee's wallet failed: {e}"),
        };
        assert!(s.expect.is_none(), "a message went unanswered");
        let credited = s.credited;
        match served.end {
            SessionEnd::Closed => assert!(steps < cap, "closed before its cap with messages left"),
            SessionEnd::Limit => assert!(steps >= cap, "ended at its cap early"),
            other => panic!("a session ended otherwise: {other}"),
        }
        assert_eq!(served.received, credited, "the session's count");
        let told = events
            .iter()
            .filter(|e| matches!(e, PayeeEvent::Received { .. }))
            .count();
        assert_eq!(told, credited, "Received events");
        for e in &events {
            if let PayeeEvent::Received { from, .. } | PayeeEvent::Refused { from, .. } = e {
                assert_eq!(
                    *from,
                    payer.key.public_key(),
                    "an event names another payer"
                );
            }
        }
    }
    let w = match store.load() {
        Ok(w) => w,
        Err(e) => panic!("the payee's wallet does not load: {e}"),
    };
    assert_eq!(
        w.balance().offline_cents,
        model.balance,
        "the saved balance"
    );
    let held: HashSet<[u8; 8]> = w.tokens().map(|(t, _)| t.serial).collect();
    assert!(held == model.held, "the saved tokens");
    assert_eq!(w.tokens().count(), model.held.len(), "a serial held twice");
    let mut open: Vec<(Handshake, u64)> = w.open_requests().collect();
    let mut want = model.open.clone();
    open.sort();
    want.sort();
    assert!(open == want, "the saved open requests");
    model.balance
}

#[cfg(test)]
mod tests {
    use super::run;

    #[test]
    fn the_seeds_pay_what_they_should() {
        let seeds = crate::seeds::seeds();
        let Some((_, s)) = seeds.iter().find(|(n, _)| *n == "payee") else {
            panic!("no payee seeds");
        };
        // Paid once though delivered twice; paid across sessions; a forged payment is not.
        assert_eq!(run(&s[0]), 600);
        assert_eq!(run(&s[1]), 600);
        assert_eq!(run(&s[2]), 0);
    }
}
