//! The payer's side of the device exchange against an in-memory payee: a cut delivery is
//! finished once by running the same payment again; a request for another amount is refused
//! before anything is signed. The florin-net channel is covered by the `florin` crate's tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use florin_crypto::{PublicKey, Signer};
use florin_token::{Denomination, Payment, PaymentRequest};
use florin_wallet::peer::{pay_peer, Answer, PeerError, PeerExchange, PeerPayError};
use florin_wallet::{FileStore, Wallet, WalletStore};
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::{authority, funded};

struct Payee {
    w: Wallet,
    rng: StdRng,
    /// The next delivery breaks off before the payee sees it.
    cut: bool,
    /// Ask for this much more than the payer said.
    greedy: u64,
}

impl PeerExchange for Payee {
    fn peer(&self) -> PublicKey {
        self.w.public_key()
    }

    fn ask(&mut self, cents: u64) -> Result<Answer<PaymentRequest>, PeerError> {
        Ok(self
            .w
            .request(cents + self.greedy, &mut self.rng)
            .map_err(|e| e.to_string()))
    }

    fn deliver(&mut self, p: &Payment) -> Result<Answer<()>, PeerError> {
        if std::mem::take(&mut self.cut) {
            return Err(PeerError::Channel(Box::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            ))));
        }
        Ok(self
            .w
            .accept_once(p, &mut self.rng)
            .map(|_| ())
            .map_err(|e| e.to_string()))
    }
}

fn payee(rng: &mut StdRng) -> Payee {
    Payee {
        w: Wallet::generate(rng, Some(authority().public_key())),
        rng: StdRng::seed_from_u64(9),
        cut: false,
        greedy: 0,
    }
}

#[test]
fn a_cut_delivery_is_finished_once_by_paying_again() {
    let mut rng = StdRng::seed_from_u64(1);
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("payer.json"));
    let mut payer = funded(&mut rng, &[Denomination::E50, Denomination::E20]);
    store.create(&payer).unwrap();
    let mut to = payee(&mut rng);
    to.cut = true;

    let e = pay_peer(&mut payer, &store, &mut to, 5000, &|_| {}).unwrap_err();
    assert!(matches!(e, PeerPayError::Undelivered(_)));
    assert!(e.to_string().contains("run the same command again"), "{e}");
    assert_eq!(to.w.balance().offline_cents, 0);
    // Signed and saved before it left.
    assert_eq!(
        store.load().unwrap().undelivered(&to.w.public_key()).len(),
        1
    );

    let mut payer = store.load().unwrap();
    let r = pay_peer(&mut payer, &store, &mut to, 5000, &|_| {}).unwrap();
    assert_eq!(r.resumed, vec![5000]);
    assert_eq!(r.paid_cents, 0, "a retry never pays twice");
    assert_eq!(to.w.balance().offline_cents, 5000);
    assert!(store
        .load()
        .unwrap()
        .undelivered(&to.w.public_key())
        .is_empty());
    assert_eq!(store.load().unwrap().balance().total_cents, 2000);
}

#[test]
fn a_request_for_another_amount_is_refused_before_signing() {
    let mut rng = StdRng::seed_from_u64(2);
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("payer.json"));
    let mut payer = funded(&mut rng, &[Denomination::E50, Denomination::E20]);
    store.create(&payer).unwrap();
    let mut to = payee(&mut rng);
    to.greedy = 2000;
    let e = pay_peer(&mut payer, &store, &mut to, 5000, &|_| {}).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the payee asked for €70.00 instead of €50.00"
    );
    assert_eq!(payer.balance().total_cents, 7000);
    assert_eq!(store.load().unwrap().balance().total_cents, 7000);
}
