//! Customer-bound keys in a key-management network of real node threads over real Noise
//! sockets: the nodes sign a payment with a customer's key only with that customer's signed
//! authorization of exactly that transaction. The coordinator here plays a compromised
//! payment provider (it holds the provider's administrator key and calls the signing client
//! directly): a missing, forged or mismatched authorization is refused by every node with a
//! typed reason before any share leaves it; the honest path signs, for FROST Ed25519 and for
//! threshold ECDSA P-256.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use florin_crypto::p256::{self, P256Signer};
use florin_crypto::{SecretKey, Signer};
use florin_custody::authz::{Authorization, AuthzError, PaymentAuth};
use florin_custody::frost::SigningPackage;
use florin_custody::wire::{EcdsaDone, EcdsaJob, Request, Response};
use florin_ledger::{Encumbrance, Output, Transfer, Utxo};
use florin_node::custody::{free_loopback_addrs, EcdsaLevel, Kmn, KmnError, Layout, RunningNode};

type Net = (tempfile::TempDir, Layout, Vec<RunningNode>, Arc<Kmn>);

fn network(ecdsa: bool) -> Net {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(2, &free_loopback_addrs(3).unwrap()).unwrap();
    if ecdsa {
        layout.set_ecdsa(Some(EcdsaLevel::InsecureTest)).unwrap();
    }
    let nodes = layout.start_in_process().unwrap();
    let (net, me) = layout.load().unwrap();
    let kmn = Kmn::new(&net, me).unwrap();
    if ecdsa {
        kmn.ecdsa_setup(Duration::from_secs(120)).unwrap();
    }
    (dir, layout, nodes, kmn)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A transfer from `payer` (one coin of `amount + change`) paying `amount` to `payee`.
fn transfer(
    payer: Encumbrance,
    payee: Encumbrance,
    amount: u64,
    change: u64,
    serial: u8,
) -> Transfer {
    let mut outputs = vec![Output {
        value: amount,
        encumbrance: payee,
    }];
    if change > 0 {
        outputs.push(Output {
            value: change,
            encumbrance: payer,
        });
    }
    Transfer {
        expires: florin_ledger::expiry::default_expiry(),
        inputs: vec![Utxo {
            value: amount + change,
            encumbrance: payer,
            serial: [serial; 32],
        }],
        outputs,
        witnesses: Vec::new(),
    }
}

/// Signs a txid through the network, with or without an authorization.
type SignFn<'a> = &'a dyn Fn(&[u8], Option<&Authorization>) -> Result<(), KmnError>;

fn reason(e: KmnError) -> AuthzError {
    match e {
        KmnError::Unauthorized { reason, .. } => reason,
        other => panic!("expected an authorization refusal, got {other}"),
    }
}

/// The forged cases a compromised provider could try, each with the reason every node must
/// give. `sign(txid, authz)` signs through the network.
fn refusals(payer: Encumbrance, customer: &SecretKey, sign: SignFn<'_>) {
    let payee = Encumbrance::ed25519(&SecretKey::from_seed(&[7; 32]).public_key());
    let thief = Encumbrance::ed25519(&SecretKey::from_seed(&[8; 32]).public_key());
    let other_customer = SecretKey::from_seed(&[9; 32]);
    let exp = now() + 300;
    let auth = PaymentAuth::sign(customer, payer, payee, 500, exp, "pay-1").unwrap();
    let good = transfer(payer, payee, 500, 1_500, 1);
    let txid = good.txid();

    // Absent.
    assert_eq!(reason(sign(&txid, None).unwrap_err()), AuthzError::Missing);
    // The right authorization, another transaction's txid to sign.
    let z = Authorization::new(&good, &auth);
    let other = transfer(payer, payee, 500, 1_500, 2);
    assert_eq!(
        reason(sign(&other.txid(), Some(&z)).unwrap_err()),
        AuthzError::DigestMismatch
    );
    // Wrong amount, wrong payee: the transaction differs from what was authorized.
    for bad in [
        transfer(payer, payee, 900, 1_100, 1),
        transfer(payer, thief, 500, 1_500, 1),
    ] {
        let z = Authorization::new(&bad, &auth);
        assert_eq!(
            reason(sign(&bad.txid(), Some(&z)).unwrap_err()),
            AuthzError::ForeignOutput(0)
        );
    }
    // The change goes to a third party.
    let mut stolen_change = good.clone();
    stolen_change.outputs[1].encumbrance = thief;
    let z = Authorization::new(&stolen_change, &auth);
    assert_eq!(
        reason(sign(&stolen_change.txid(), Some(&z)).unwrap_err()),
        AuthzError::ForeignOutput(1)
    );
    // Signed by another account's customer key (the provider's own, say).
    let forged = PaymentAuth::sign(&other_customer, payer, payee, 500, exp, "pay-1").unwrap();
    assert_eq!(
        reason(sign(&txid, Some(&Authorization::new(&good, &forged))).unwrap_err()),
        AuthzError::WrongCustomer
    );
    // Expired, and valid for too long.
    let old = PaymentAuth::sign(customer, payer, payee, 500, now() - 1, "pay-1").unwrap();
    assert!(matches!(
        reason(sign(&txid, Some(&Authorization::new(&good, &old))).unwrap_err()),
        AuthzError::Expired { .. }
    ));
    let long = PaymentAuth::sign(customer, payer, payee, 500, now() + 86_400, "pay-1").unwrap();
    assert_eq!(
        reason(sign(&txid, Some(&Authorization::new(&good, &long))).unwrap_err()),
        AuthzError::TooLong
    );

    // The honest path signs, and a retry of the same transaction signs again.
    sign(&txid, Some(&z_good(&good, &auth))).unwrap();
    sign(&txid, Some(&z_good(&good, &auth))).unwrap();
    // The same payment id for another transaction paying the same: refused.
    let second = transfer(payer, payee, 500, 1_500, 3);
    assert_eq!(
        reason(sign(&second.txid(), Some(&Authorization::new(&second, &auth))).unwrap_err()),
        AuthzError::Reused("pay-1".into())
    );
    // A fresh id for it is fine.
    let auth2 = PaymentAuth::sign(customer, payer, payee, 500, exp, "pay-2").unwrap();
    sign(&second.txid(), Some(&Authorization::new(&second, &auth2))).unwrap();
}

fn z_good(t: &Transfer, a: &PaymentAuth) -> Authorization {
    Authorization::new(t, a)
}

/// One nonce from each of `parties` (their ids) and the FROST signing package over `txid`,
/// for requests sent to nodes by hand.
fn raw_package(kmn: &Kmn, parties: &[u16], txid: &[u8]) -> (BTreeMap<u16, u64>, Vec<u8>) {
    let mut commitments = BTreeMap::new();
    let mut ids = BTreeMap::new();
    for &p in parties {
        match kmn.ask(p, Request::Commitments { count: 1 }).unwrap() {
            Response::Commitments(v) => {
                ids.insert(p, v[0].0);
                commitments.insert(p, v[0].1.clone());
            }
            other => panic!("commitments: {other:?}"),
        }
    }
    let package = SigningPackage::new(&commitments, txid)
        .unwrap()
        .to_bytes()
        .unwrap();
    (ids, package)
}

#[test]
fn frost_nodes_sign_a_customer_key_only_with_its_authorization() {
    let (_dir, _layout, _nodes, kmn) = network(false);
    let customer = SecretKey::from_seed(&[1; 32]);
    kmn.bind_customer("acct-alice", &customer.public_key())
        .unwrap();
    let group = kmn.dkg("acct-alice").unwrap();
    let payer = Encumbrance::ed25519(&group.public_key());
    let signer = kmn.signer("acct-alice").unwrap();
    refusals(payer, &customer, &|msg, authz| {
        let sig = match authz {
            None => signer.sign_msg(msg)?,
            Some(a) => signer.sign_authorized(msg, a)?,
        };
        florin_crypto::verify(&Signer::public_key(&signer), msg, &sig).unwrap();
        Ok(())
    });

    // No node releases a share for a refused authorization, and the refusal leaves the
    // nonce usable: the same nonces then sign with the customer's authorization.
    let payee = Encumbrance::ed25519(&SecretKey::from_seed(&[7; 32]).public_key());
    let good = transfer(payer, payee, 100, 0, 40);
    let auth = PaymentAuth::sign(&customer, payer, payee, 100, now() + 300, "raw").unwrap();
    let (ids, package) = raw_package(&kmn, &[1, 2], &good.txid());
    let forged = PaymentAuth::sign(
        &SecretKey::from_seed(&[9; 32]),
        payer,
        payee,
        100,
        now() + 300,
        "raw",
    )
    .unwrap();
    let ask = |p: u16, a: &PaymentAuth| {
        kmn.ask(
            p,
            Request::SignAuthorized {
                key_id: "acct-alice".into(),
                group: group.digest(),
                nonce: ids[&p],
                package: package.clone(),
                authz: Authorization::new(&good, a),
            },
        )
        .unwrap()
    };
    for p in [1u16, 2] {
        match ask(p, &forged) {
            Response::Refused(r) => assert_eq!(r.unauthorized, Some(AuthzError::WrongCustomer)),
            other => panic!("node {p} answered {other:?}"),
        }
        // Plain `Sign` for a bound key: refused, whatever the package.
        match kmn
            .ask(
                p,
                Request::Sign {
                    key_id: "acct-alice".into(),
                    group: group.digest(),
                    nonce: ids[&p],
                    package: package.clone(),
                },
            )
            .unwrap()
        {
            Response::Refused(r) => assert_eq!(r.unauthorized, Some(AuthzError::Missing)),
            other => panic!("node {p} answered {other:?}"),
        }
        assert!(matches!(ask(p, &auth), Response::Share(_)));
    }

    // The binding never changes once the key exists; the same binding again is harmless.
    let thief = SecretKey::from_seed(&[9; 32]);
    assert!(kmn
        .bind_customer("acct-alice", &thief.public_key())
        .is_err());
    kmn.bind_customer("acct-alice", &customer.public_key())
        .unwrap();
    // Nor can the administrator (the provider) export the customer's key and sign alone.
    let err = kmn.export("acct-alice").unwrap_err().to_string();
    assert!(err.contains("bound to a customer"), "{err}");
    // A key without a customer (an issuer's) keeps today's rules.
    kmn.dkg("issuer").unwrap();
    let issuer = kmn.signer("issuer").unwrap();
    issuer.sign_msg(b"mint").unwrap();
    kmn.export("issuer").unwrap();
}

#[test]
fn ecdsa_nodes_check_the_authorization_before_using_a_presignature() {
    let (_dir, _layout, _nodes, kmn) = network(true);
    let customer = SecretKey::from_seed(&[2; 32]);
    kmn.bind_customer("acct-bob", &customer.public_key())
        .unwrap();
    let pk = kmn.ecdsa_keygen("acct-bob").unwrap();
    let payer = Encumbrance::p256(&pk);
    let signer = kmn.ecdsa_signer("acct-bob", 1).unwrap();
    refusals(payer, &customer, &|msg, authz| {
        let sig = match authz {
            None => signer.sign_msg(msg)?,
            Some(a) => signer.sign_authorized(msg, a)?,
        };
        p256::verify(&P256Signer::public_key(&signer), msg, &sig).unwrap();
        Ok(())
    });

    // CGGMP24 keys sign from presignatures: no note keys (a tweak chosen after the
    // presignature would be unsafe).
    let payee = Encumbrance::ed25519(&SecretKey::from_seed(&[7; 32]).public_key());
    let auth = PaymentAuth::sign(&customer, payer, payee, 500, now() + 300, "note-c").unwrap();
    let t = transfer(payer, payee, 500, 1_500, 9);
    let z = Authorization::new(&t, &auth).for_note(Some([1; 32]));
    assert_eq!(
        reason(signer.sign_authorized(&t.txid(), &z).unwrap_err()),
        AuthzError::NoNotes
    );

    // Interactive signing (no presignature) carries no authorization: refused for a bound
    // key.
    let signers = vec![1u16, 2];
    let err = kmn
        .ecdsa_run(
            [5; 16],
            &signers,
            EcdsaJob::Sign {
                key_id: "acct-bob".into(),
                signers: signers.clone(),
                message: vec![0; 32],
            },
        )
        .unwrap_err();
    assert_eq!(reason(err), AuthzError::Missing);

    // A refused partial leaves the presignature unused: it signs with the authorization.
    let done = kmn
        .ecdsa_run(
            [6; 16],
            &signers,
            EcdsaJob::Presign {
                key_id: "acct-bob".into(),
                signers: signers.clone(),
            },
        )
        .unwrap();
    assert!(done.values().all(|d| matches!(d, EcdsaDone::Presig(_))));
    let payee = Encumbrance::ed25519(&SecretKey::from_seed(&[7; 32]).public_key());
    let good = transfer(payer, payee, 100, 0, 50);
    let txid = good.txid();
    let auth = PaymentAuth::sign(&customer, payer, payee, 100, now() + 300, "raw").unwrap();
    let wrong = PaymentAuth::sign(&customer, payer, payee, 99, now() + 300, "raw").unwrap();
    let ask = |p: u16, a: &PaymentAuth| {
        kmn.ask(
            p,
            Request::EcdsaPartialAuthorized {
                key_id: "acct-bob".into(),
                presig: [6; 16],
                message: txid.to_vec(),
                authz: Authorization::new(&good, a),
            },
        )
        .unwrap()
    };
    for &p in &signers {
        match ask(p, &wrong) {
            Response::Refused(r) => assert_eq!(r.unauthorized, Some(AuthzError::ForeignOutput(0))),
            other => panic!("node {p} answered {other:?}"),
        }
        match kmn
            .ask(
                p,
                Request::EcdsaPartial {
                    key_id: "acct-bob".into(),
                    presig: [6; 16],
                    message: txid.to_vec(),
                },
            )
            .unwrap()
        {
            Response::Refused(r) => assert_eq!(r.unauthorized, Some(AuthzError::Missing)),
            other => panic!("node {p} answered {other:?}"),
        }
        assert!(matches!(ask(p, &auth), Response::EcdsaPartial(_)));
    }
    // The administrator can neither export the customer's key nor derive one from it.
    let err = kmn.ecdsa_export("acct-bob").unwrap_err().to_string();
    assert!(err.contains("bound to a customer"), "{err}");
}

#[test]
fn a_used_payment_id_survives_a_node_restart() {
    let (_dir, layout, nodes, kmn) = network(false);
    let customer = SecretKey::from_seed(&[3; 32]);
    kmn.bind_customer("acct-carol", &customer.public_key())
        .unwrap();
    let group = kmn.dkg("acct-carol").unwrap();
    let payer = Encumbrance::ed25519(&group.public_key());
    let payee = Encumbrance::ed25519(&SecretKey::from_seed(&[7; 32]).public_key());
    let auth = PaymentAuth::sign(&customer, payer, payee, 10, now() + 300, "once").unwrap();
    let first = transfer(payer, payee, 10, 5, 1);
    kmn.signer("acct-carol")
        .unwrap()
        .sign_authorized(&first.txid(), &Authorization::new(&first, &auth))
        .unwrap();
    drop(nodes);
    let _nodes = layout.start_in_process().unwrap();
    let (net, me) = layout.load().unwrap();
    let kmn = Kmn::new(&net, me).unwrap();
    let signer = kmn.signer("acct-carol").unwrap();
    let second = transfer(payer, payee, 10, 5, 2);
    assert_eq!(
        reason(
            signer
                .sign_authorized(&second.txid(), &Authorization::new(&second, &auth))
                .unwrap_err()
        ),
        AuthzError::Reused("once".into())
    );
    // A retry of the first transaction signs, unless the signing set now includes a node that
    // was not in the first one and recorded the id for `second` just above (t of n sign; see
    // the closing note of this stop: the id is per node, not per network).
    match signer.sign_authorized(&first.txid(), &Authorization::new(&first, &auth)) {
        Ok(_) => {}
        Err(e) => assert_eq!(reason(e), AuthzError::Reused("once".into())),
    }
}

/// A node that lost its disk gets a bound key's share back by repair together with the key's
/// customer binding, from its helpers and not from the coordinator: it then refuses to sign
/// without the customer as the others do. Helpers naming different customers stop the repair;
/// a helper that lost its binding does not make the key unbound; the administrator cannot bind
/// a lost key to another customer; a node that kept its share but lost its binding gets the
/// binding back by repair.
#[test]
fn a_repaired_share_keeps_its_customer_binding() {
    let (_dir, layout, nodes, kmn) = network(false);
    let customer = SecretKey::from_seed(&[4; 32]);
    kmn.bind_customer("acct-dave", &customer.public_key())
        .unwrap();
    let group = kmn.dkg("acct-dave").unwrap();
    drop(nodes);
    std::thread::sleep(Duration::from_millis(200));
    let node = |p: u16| layout.node_dir(p);
    let binding = |p: u16| node(p).join("customers").join("acct-dave.customer");
    let restart = |nodes: Vec<RunningNode>| {
        drop(nodes);
        std::thread::sleep(Duration::from_millis(200));
        let nodes = layout.start_in_process().unwrap();
        let (net, me) = layout.load().unwrap();
        (nodes, Kmn::new(&net, me).unwrap())
    };
    // Node 3 loses its share and its binding; node 2's binding names someone else.
    std::fs::remove_file(node(3).join("shares").join("acct-dave.share")).unwrap();
    std::fs::remove_file(binding(3)).unwrap();
    let kept = std::fs::read(binding(2)).unwrap();
    let thief = SecretKey::from_seed(&[5; 32]).public_key();
    std::fs::write(binding(2), thief.to_address().as_bytes()).unwrap();
    let (nodes, kmn) = restart(Vec::new());
    let err = kmn.repair("acct-dave", 3).unwrap_err().to_string();
    assert!(err.contains("disagree"), "{err}");
    assert!(!binding(3).exists() && kmn.status()[2].keys.is_empty());
    // Nor may the administrator bind the lost key at node 3 to a customer of its choosing.
    let rebind = Request::BindCustomer {
        key_id: "acct-dave".into(),
        customer: thief.0,
    };
    assert!(matches!(kmn.ask(3, rebind).unwrap(), Response::Refused(_)));
    assert!(!binding(3).exists());

    // Node 2's binding is put back; node 1 loses its binding (not its share): node 1 states
    // "unbound", node 2 the customer, and the customer wins.
    std::fs::write(binding(2), &kept).unwrap();
    std::fs::remove_file(binding(1)).unwrap();
    let (_nodes, kmn) = restart(nodes);
    assert_eq!(kmn.repair("acct-dave", 3).unwrap(), vec![1, 2]);
    assert_eq!(std::fs::read(binding(3)).unwrap(), kept);
    // Node 1 kept its share: repairing it gives its binding back.
    assert!(!binding(1).exists());
    assert_eq!(kmn.repair("acct-dave", 1).unwrap(), vec![2, 3]);
    assert_eq!(std::fs::read(binding(1)).unwrap(), kept);

    // Node 3 refuses a share without the customer's authorization, and signs with it.
    let payer = Encumbrance::ed25519(&group.public_key());
    let payee = Encumbrance::ed25519(&SecretKey::from_seed(&[7; 32]).public_key());
    let good = transfer(payer, payee, 100, 0, 41);
    let auth = PaymentAuth::sign(&customer, payer, payee, 100, now() + 300, "r").unwrap();
    let (ids, package) = raw_package(&kmn, &[2, 3], &good.txid());
    let plain = Request::Sign {
        key_id: "acct-dave".into(),
        group: group.digest(),
        nonce: ids[&3],
        package: package.clone(),
    };
    match kmn.ask(3, plain).unwrap() {
        Response::Refused(r) => assert_eq!(r.unauthorized, Some(AuthzError::Missing)),
        other => panic!("node 3 answered {other:?}"),
    }
    let authorized = Request::SignAuthorized {
        key_id: "acct-dave".into(),
        group: group.digest(),
        nonce: ids[&3],
        package,
        authz: Authorization::new(&good, &auth),
    };
    assert!(matches!(
        kmn.ask(3, authorized).unwrap(),
        Response::Share(_)
    ));
}

#[test]
fn dkls23_nodes_check_the_authorization_before_their_first_message() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(2, &free_loopback_addrs(3).unwrap()).unwrap();
    layout.set_ecdsa(Some(EcdsaLevel::Dkls23)).unwrap();
    let _nodes = layout.start_in_process().unwrap();
    let (net, me) = layout.load().unwrap();
    let kmn = Kmn::new(&net, me).unwrap();
    let customer = SecretKey::from_seed(&[2; 32]);
    kmn.bind_customer("acct-dora", &customer.public_key())
        .unwrap();
    let pk = kmn
        .ecdsa_keygen_with("acct-dora", florin_node::custody::EcdsaEngine::Dkls23)
        .unwrap();
    let payer = Encumbrance::p256(&pk);
    let signer = kmn.ecdsa_signer("acct-dora", 0).unwrap();
    refusals(payer, &customer, &|msg, authz| {
        let sig = match authz {
            None => signer.sign_msg(msg)?,
            Some(a) => signer.sign_authorized(msg, a)?,
        };
        p256::verify(&P256Signer::public_key(&signer), msg, &sig).unwrap();
        Ok(())
    });
    // A run started by hand without the authorization: every signer refuses before its first
    // message, with the reason.
    let signers = vec![1u16, 3];
    let err = kmn
        .ecdsa_run(
            [7; 16],
            &signers,
            EcdsaJob::DklsSign {
                key_id: "acct-dora".into(),
                signers: signers.clone(),
                message: vec![0; 32],
                authz: None,
            },
        )
        .unwrap_err();
    assert_eq!(reason(err), AuthzError::Missing);
    // The administrator can neither export the customer's key nor derive one from it.
    let err = kmn.ecdsa_export("acct-dora").unwrap_err().to_string();
    assert!(err.contains("bound to a customer"), "{err}");

    // A key made ahead (pending, unbound) takes its first binding; after that, neither while
    // pending nor once committed does it take another.
    let (eve, mallory) = (
        SecretKey::from_seed(&[3; 32]),
        SecretKey::from_seed(&[4; 32]),
    );
    kmn.ecdsa_keygen_pending("pool-1", florin_node::custody::EcdsaEngine::Dkls23)
        .unwrap();
    assert!(
        kmn.ecdsa_signer("pool-1", 0).is_err(),
        "a pending key signs nothing"
    );
    kmn.bind_customer("pool-1", &eve.public_key()).unwrap();
    assert!(kmn.bind_customer("pool-1", &mallory.public_key()).is_err());
    kmn.bind_customer("pool-1", &eve.public_key()).unwrap();
    kmn.commit_pending("pool-1").unwrap();
    assert!(kmn.bind_customer("pool-1", &mallory.public_key()).is_err());
    let err = kmn
        .ecdsa_signer("pool-1", 0)
        .unwrap()
        .sign_msg(&[0; 32])
        .unwrap_err();
    assert_eq!(reason(err), AuthzError::Missing);
}

/// Filia's note keys: a DKLs23 key signs as `P + t·G` only for an input of the authorized
/// transaction under that key, its change may go to the note keys the request names, and the
/// signature verifies under the note key; a tweak for no input, change to an unnamed key, or
/// notes asked of a FROST key are refused before any message.
#[test]
fn dkls23_keys_sign_as_their_note_keys_only_for_the_authorized_inputs() {
    use florin_crypto::P256PublicKey;
    use florin_custody::dkls::{random_scalar, tweak_public};
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(&dir.path().join("kmn"));
    layout.create(2, &free_loopback_addrs(3).unwrap()).unwrap();
    layout.set_ecdsa(Some(EcdsaLevel::Dkls23)).unwrap();
    let _nodes = layout.start_in_process().unwrap();
    let (net, me) = layout.load().unwrap();
    let kmn = Kmn::new(&net, me).unwrap();
    let customer = SecretKey::from_seed(&[2; 32]);
    kmn.bind_customer("acct-nina", &customer.public_key())
        .unwrap();
    let pk = kmn
        .ecdsa_keygen_with("acct-nina", florin_node::custody::EcdsaEngine::Dkls23)
        .unwrap();
    let payer = Encumbrance::p256(&pk);
    let signer = kmn.ecdsa_signer("acct-nina", 0).unwrap();
    let note = |t: &[u8; 32]| P256PublicKey(tweak_public(&pk.0, t).unwrap());
    let t_in = random_scalar();
    let note_in = Encumbrance::p256(&note(&t_in));
    assert_ne!(note_in, payer);
    let payee = Encumbrance::ed25519(&SecretKey::from_seed(&[7; 32]).public_key());
    let auth = PaymentAuth::sign(&customer, payer, payee, 500, now() + 300, "note-1").unwrap();
    // The change note every party derives from the account key and the authorization.
    let t_change = florin_custody::authz::change_tweak(&pk.0, &auth);
    let note_change = Encumbrance::p256(&note(&t_change));
    // Spends a note under `t_in`, change to the payment's change note.
    let mut t = transfer(note_in, payee, 500, 1_500, 1);
    t.outputs[1].encumbrance = note_change;
    let txid = t.txid();
    let z = Authorization::new(&t, &auth).for_note(Some(*t_in));
    let sig = signer.sign_authorized(&txid, &z).unwrap();
    p256::verify(&note(&t_in), &txid, &sig).unwrap();
    assert!(
        p256::verify(&pk, &txid, &sig).is_err(),
        "it is the note key's signature, not the account key's"
    );
    // The account key itself signs no input of this transaction.
    let plain = Authorization::new(&t, &auth).for_note(None);
    assert_eq!(
        reason(signer.sign_authorized(&txid, &plain).unwrap_err()),
        AuthzError::NotAnInput
    );
    // A tweak whose note is no input: refused.
    let stray = Authorization::new(&t, &auth).for_note(Some(*random_scalar()));
    assert_eq!(
        reason(signer.sign_authorized(&txid, &stray).unwrap_err()),
        AuthzError::NotAnInput
    );
    // Change to any other note key of the account (one the provider picked): a foreign
    // output.
    let mut other = t.clone();
    other.outputs[1].encumbrance = Encumbrance::p256(&note(&random_scalar()));
    let z2 = Authorization::new(&other, &auth).for_note(Some(*t_in));
    assert_eq!(
        reason(signer.sign_authorized(&other.txid(), &z2).unwrap_err()),
        AuthzError::ForeignOutput(1)
    );
    // A tweak that is not a scalar.
    let junk = Authorization::new(&t, &auth).for_note(Some([0xff; 32]));
    assert_eq!(
        reason(signer.sign_authorized(&txid, &junk).unwrap_err()),
        AuthzError::BadTweak
    );
    // FROST keys have no note keys.
    let frost_customer = SecretKey::from_seed(&[5; 32]);
    kmn.bind_customer("acct-otto", &frost_customer.public_key())
        .unwrap();
    let group = kmn.dkg("acct-otto").unwrap();
    let fpayer = Encumbrance::ed25519(&group.public_key());
    let fauth = PaymentAuth::sign(&frost_customer, fpayer, payee, 500, now() + 300, "f-1").unwrap();
    let ft = transfer(fpayer, payee, 500, 1_500, 2);
    let fz = Authorization::new(&ft, &fauth).for_note(Some(*t_in));
    let fsigner = kmn.signer("acct-otto").unwrap();
    assert_eq!(
        reason(fsigner.sign_authorized(&ft.txid(), &fz).unwrap_err()),
        AuthzError::NoNotes
    );
    // A key bound to no customer has no note keys.
    kmn.ecdsa_keygen_with("plain", florin_node::custody::EcdsaEngine::Dkls23)
        .unwrap();
    let plain_signer = kmn.ecdsa_signer("plain", 0).unwrap();
    let err = plain_signer
        .sign_authorized(&txid, &z)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no note keys"), "{err}");
}
