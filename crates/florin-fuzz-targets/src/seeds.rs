//! Seed inputs: valid encodings of every format, so that fuzzing starts deep instead of
//! guessing version bytes. `florin-fuzz-seed DIR` writes them as `DIR/<target>/seed-<n>`;
//! the replay test also runs them through their targets on every `cargo test`.

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_ledger::{Draft, Encumbrance, Output, Transaction, Utxo};
use florin_token::{Denomination, FraudProof, Payment, PaymentRequest, Token};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn signer(seed: u8) -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[seed; 32]))
}

/// A token minted by `authority` to wallet 1 and passed to wallet 2 (and to `last` if given).
fn token(authority: &LocalSigner, serial: u8, last: Option<&LocalSigner>) -> Option<Token> {
    let (w1, w2) = (signer(1), signer(2));
    let d = Denomination::from_cents(500)?;
    let t = Token::mint(
        authority,
        [serial; 8],
        d,
        [serial; 64],
        w1.public_key(),
        [1; 32],
    )
    .ok()?;
    let t = t.transfer(&w1, w2.public_key(), [2; 32]).ok()?;
    match last {
        Some(l) => t.transfer(&w2, l.public_key(), [3; 32]).ok(),
        None => Some(t),
    }
}

fn utxo(owner: &LocalSigner, value: u64, serial: u8) -> Utxo {
    Utxo {
        value,
        encumbrance: Encumbrance::ed25519(&owner.public_key()),
        serial: [serial; 32],
    }
}

/// A signed transfer of two coins of `owner` to `to`.
fn transfer(owner: &LocalSigner, to: &LocalSigner) -> Option<Transaction> {
    let inputs = vec![utxo(owner, 700, 1), utxo(owner, 300, 2)];
    let outputs = vec![
        Output {
            value: 600,
            encumbrance: Encumbrance::ed25519(&to.public_key()),
        },
        Output {
            value: 400,
            encumbrance: Encumbrance::ed25519(&owner.public_key()),
        },
    ];
    let draft = Draft::new(inputs, outputs).ok()?;
    draft.sign(&[owner, owner]).ok().map(Transaction::Transfer)
}

fn frames(txs: &[Transaction]) -> Vec<u8> {
    let mut out = vec![0u8];
    for t in txs {
        let b = t.encode();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
    }
    out
}

fn pc<T: serde::Serialize>(mode: u8, v: &T) -> Vec<u8> {
    let mut out = vec![mode];
    out.extend(postcard::to_allocvec(v).unwrap_or_default());
    out
}

/// Seeds per target name.
pub fn seeds() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let authority = signer(9);
    let (alice, bob) = (signer(1), signer(2));
    let tok = token(&authority, 1, None);
    let to_authority = token(&authority, 2, Some(&authority));
    let tokens: Vec<Token> = tok.iter().cloned().collect();
    let request = PaymentRequest {
        amount_cents: 500,
        payee: bob.public_key(),
        handshake: [5; 32],
        max_hops: 16,
    };
    let payment = Payment {
        payee: bob.public_key(),
        handshake: [5; 32],
        tokens: tokens.clone(),
    };
    // A fork: wallet 2 passes the same token to two payees.
    let fraud = tok.as_ref().and_then(|t| {
        let a = t.transfer(&bob, alice.public_key(), [7; 32]).ok()?;
        let b = t.transfer(&bob, authority.public_key(), [8; 32]).ok()?;
        FraudProof::from_fork(t, &a.links, &b.links)
    });
    let tx = transfer(&alice, &bob);
    let txs: Vec<Transaction> = tx.iter().cloned().collect();

    let mut out: Vec<(&'static str, Vec<Vec<u8>>)> = Vec::new();
    out.push(("decode_token", tokens.iter().map(Token::encode).collect()));
    out.push(("decode_payment", vec![payment.encode(), request.encode()]));
    out.push((
        "decode_fraud_proof",
        fraud.iter().map(FraudProof::encode).collect(),
    ));
    let mut tx_seeds: Vec<Vec<u8>> = txs.iter().map(Transaction::encode).collect();
    tx_seeds.push(utxo(&alice, 5, 3).encode());
    out.push(("decode_tx", tx_seeds));
    let json = serde_json::json!({ "txs": txs.iter().map(|t| hex::encode(t.encode())).collect::<Vec<_>>() });
    let mut json_seed = vec![1u8];
    json_seed.extend(json.to_string().into_bytes());
    out.push((
        "decode_batch",
        vec![
            frames(&txs),
            frames(&[txs.clone(), txs.clone()].concat()),
            json_seed,
        ],
    ));
    let mut dep = alice.public_key().to_address().into_bytes();
    for t in to_authority.iter().chain(&tokens) {
        dep.push(b'\n');
        dep.extend(hex::encode(t.encode()).into_bytes());
    }
    out.push(("decode_deposit", vec![dep]));

    // Cluster.
    use florin_cluster::shard::{Fence, Fenced, Part, ShardCmd, ShardReply, ShardState, Vote};
    let compact: Vec<florin_ledger::CompactTx> =
        txs.iter().map(florin_ledger::CompactTx::from_tx).collect();
    let parts: Vec<Part> = compact
        .iter()
        .map(|c| Part {
            txid: c.txid,
            owns_txid: true,
            kind: c.kind,
            inputs: c.inputs.iter().copied().collect(),
            outputs: c.outputs.iter().copied().collect(),
            expires: c.expires,
        })
        .collect();
    let fenced = Fenced {
        by: Fence { group: 1, term: 3 },
        cmd: ShardCmd::Prepare {
            dtx: 77,
            parts: parts.clone(),
            now: 1_900_000_000,
        },
    };
    let mut state = ShardState::new();
    state.seed(&[([1; 32], 100), ([2; 32], 50)]);
    let mut snap = vec![3u8];
    state.snapshot_into(&mut snap);
    let mut shard_seeds = vec![
        pc(0, &fenced),
        pc(
            0,
            &Fenced {
                by: Fence::default(),
                cmd: ShardCmd::Commit {
                    dtx: 77,
                    commit: vec![true, false],
                },
            },
        ),
        pc(
            0,
            &Fenced {
                by: Fence::default(),
                cmd: ShardCmd::Apply {
                    dtx: 78,
                    parts,
                    now: 1_900_000_000,
                },
            },
        ),
        pc(
            1,
            &ShardReply::Prepared(vec![Vote::Ok, Vote::Missing, Vote::Busy]),
        ),
        pc(1, &ShardReply::Deposed(4)),
        snap,
    ];
    shard_seeds.extend(compact.iter().map(|c| pc(2, c)));
    out.push(("decode_shard_msg", shard_seeds));
    use florin_node::cluster::rpc::{Request as CReq, Response as CResp};
    let mut rpc = vec![
        pc(0, &CReq::Submit(compact.clone(), 1_900_000_000)),
        pc(0, &CReq::Unspent(vec![[1; 32], [2; 32]])),
        pc(0, &CReq::Fenced(fenced)),
        pc(0, &CReq::Status),
        pc(1, &CResp::Bools(vec![true, false])),
        pc(1, &CResp::NotLeader(Some("127.0.0.1:7000".into()))),
        pc(
            1,
            &CResp::Submitted(vec![florin_ledger::SwapOutcome::Confirmed]),
        ),
    ];
    if let Some(v) = florin_cluster::raft::encode_vote_request(5, 2) {
        rpc.push([vec![2u8], v.clone()].concat());
        rpc.push(pc(0, &CReq::Raft(v)));
    }
    out.push(("decode_cluster_rpc", rpc));

    // Custody.
    use florin_custody::envelope::Envelope;
    use florin_custody::wire::{Request as KReq, Response as KResp};
    let mut rng = StdRng::seed_from_u64(11);
    let sender = signer(21);
    let me = SecretKey::from_seed(&[22; 32]);
    let mut custody = vec![
        pc(0, &KReq::Status),
        pc(
            0,
            &KReq::DkgStart {
                session: [1; 16],
                key_id: "issuer".into(),
                t: 2,
                n: 3,
            },
        ),
        pc(0, &KReq::Commitments { count: 4 }),
        pc(1, &KResp::Key(vec![1, 2, 3])),
        vec![5u8, 0, b'h', b'i'],
        vec![5u8, 1, 1, 2, 3, 4],
    ];
    if let Ok(e) = Envelope::direct(
        &sender,
        [1; 16],
        1,
        1,
        2,
        &me.public_key(),
        b"share",
        &mut rng,
    ) {
        custody.push(pc(4, &e));
        custody.push(pc(
            0,
            &KReq::DkgRound2 {
                session: [1; 16],
                round1: vec![e],
            },
        ));
    }
    if let Ok((g, shares)) = florin_custody::frost::generate_with_dealer("k", 2, 3, &mut rng) {
        custody.push([vec![2u8], g.to_bytes()].concat());
        if let Some(s) = shares.first() {
            custody.push([vec![2u8], s.to_bytes().to_vec()].concat());
        }
    }
    out.push(("decode_custody_wire", custody));

    // Offline device channel, QR, sealed boxes, handoffs.
    use florin_net::{Msg, Receipt};
    out.push((
        "decode_peer_msg",
        vec![
            Msg::Ask { amount_cents: 500 }.encode(),
            Msg::Request(request.clone()).encode(),
            Msg::Deliver(payment.clone()).encode(),
            Msg::Receipt(Receipt {
                handshake: [5; 32],
                amount_cents: 500,
                payment: [6; 32],
            })
            .encode(),
            Msg::Refused("no".into()).encode(),
        ],
    ));
    let mut qr = Vec::new();
    if let Ok(parts) = florin_net::qr::split(florin_net::qr::Kind::Payment, &payment.encode()) {
        let mut framed = Vec::new();
        for p in &parts {
            // The target's framing: a bound in units of 8, the length, the part.
            framed.push(p.len().div_ceil(8) as u8);
            framed.extend_from_slice(&(p.len() as u16).to_le_bytes());
            framed.extend_from_slice(p);
        }
        qr.push(framed);
    }
    qr.push(request.encode());
    out.push(("decode_qr", qr));
    let mut sealed = Vec::new();
    if let Ok(b) = florin_crypto::sealed::seal(&me.public_key(), b"hello", &mut rng) {
        sealed.push(b);
    }
    sealed.push(vec![1u8; 80]);
    out.push(("decode_sealed", sealed));
    out.push((
        "decode_handoff",
        vec![florin_wallet::online::encode_handoff(&[
            utxo(&alice, 5, 1),
            utxo(&bob, 7, 2),
        ])],
    ));
    let file = crate::wallet_file::sample_wallet_file();
    out.push((
        "wallet_file",
        vec![[vec![0u8], file].concat(), vec![1, 0, 0, 10, 0, 65]],
    ));
    out.push((
        "cluster_model",
        vec![
            // Two shards, two-phase: submits, deliveries, a crash, ticks.
            vec![
                1, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9, 0, 1, 0, 3, 0, 4, 0, 0, 4, 0, 0, 4, 0, 0, 14, 1,
                12, 20,
            ],
            vec![
                2, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 2, 0, 5, 7, 0, 1, 0, 15, 15, 0, 1, 0, 255, 15,
            ],
        ],
    ));
    out.push((
        "noise_channel",
        vec![
            // Honest, AES-GCM: three messages (20 bytes, across a chunk, over two chunks).
            vec![0, 3, 0, 3, 20, 0, 7, 1, 2, 0, 9, 2, 5, 0, 1],
            // The same with ChaCha.
            vec![1, 3, 0, 3, 20, 0, 7, 1, 2, 0, 9, 2, 5, 0, 1],
            // The responder's handshake message with a flipped byte.
            vec![8, 2, 0, 0, 10, 0, 0, 4],
            // A lying signer; a wrong expected key.
            vec![2, 0],
            vec![4, 0],
            // Two messages, a flipped wire byte, a 40-byte limit.
            vec![96, 2, 0, 3, 50, 0, 1, 3, 10, 0, 2, 0, 0, 30, 0, 0, 1, 40, 0],
            // Raw bytes to the responder.
            vec![16, 0, 40, 1, 2, 3, 4, 5, 6, 7, 8],
        ],
    ));
    out.push((
        "payee",
        vec![
            // Ask for €6, pay it with exact change, repeat the delivery, ask again (refused).
            vec![
                0, 0, 0, 0, 7, 0, 4, 0, 0, 0, 18, 3, 0, 0, 0, 2, 0, 0, 0, 1, 5, 0,
            ],
            // A request issued in one session, paid by the other payer in the next.
            vec![
                1, 0, 0, 0, 7, 0, 1, 0, 0, 0, 18, 1, 0, 7, 0, 1, 0, 3, 1, 0, 0, 0, 0,
            ],
            // A payment with a flipped signature bit.
            vec![0, 0, 0, 0, 7, 0, 2, 0, 0, 0, 18, 3, 0, 0, 200, 0, 0, 5],
        ],
    ));
    out.push((
        "deposit",
        vec![vec![
            1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 2,
        ]],
    ));
    out
}
