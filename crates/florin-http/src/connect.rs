//! The wallet's [`Connector`] over the node's HTTP/JSON API ([`NodeClient`]).
//!
//! The wallet's flows (`florin_wallet::flows`) only see domain values; this file translates
//! them to and from the API's wire types, and the client's errors into [`ConnectorError`]s
//! that tell a refusal by the node from a node that cannot be reached.

use florin_crypto::PublicKey;
use florin_ledger::{Transaction, UhsId, Utxo};
use florin_node::api::{DepositRequest, LedgerFaucet, WithdrawRequest};
use florin_token::{FraudProof, Token};
use florin_wallet::connector::{Mail, TxAnswer, TxVerdict, Withdrawal};
use florin_wallet::{Connector, ConnectorError, DepositItem};

use crate::client::{ClientError, NodeClient};

/// A client error in the wallet's terms.
fn classify(client: &NodeClient, e: ClientError) -> ConnectorError {
    match e {
        ClientError::Refused {
            status,
            code,
            message,
        } => ConnectorError::Refused {
            status: status.to_string(),
            code,
            message,
        },
        ClientError::Unreachable { node, source } => ConnectorError::Unreachable {
            node,
            source: Box::new(source),
        },
        ClientError::Transport(source) | ClientError::Setup(source) => {
            ConnectorError::Unreachable {
                node: client.base().to_string(),
                source: Box::new(source),
            }
        }
        ClientError::Tls(source) => ConnectorError::Unreachable {
            node: client.base().to_string(),
            source: Box::new(source),
        },
        ClientError::Unreadable(source) => {
            ConnectorError::unreadable_by("node sent an unreadable answer", source)
        }
    }
}

fn decode_token(h: &str) -> Result<Token, ConnectorError> {
    let bytes = hex::decode(h).map_err(|e| ConnectorError::unreadable_by("token is not hex", e))?;
    Token::decode(&bytes).map_err(ConnectorError::unreadable)
}

fn decode_utxo(h: &str) -> Result<Utxo, ConnectorError> {
    let bytes =
        hex::decode(h).map_err(|e| ConnectorError::unreadable_by("output is not hex", e))?;
    Utxo::decode(&bytes).map_err(ConnectorError::unreadable)
}

impl Connector for NodeClient {
    async fn authority(&self) -> Result<PublicKey, ConnectorError> {
        let info = self.info().await.map_err(|e| classify(self, e))?;
        PublicKey::parse(&info.authority).map_err(ConnectorError::unreadable)
    }

    async fn faucet(&self, owner: &PublicKey, cents: u64) -> Result<Vec<Utxo>, ConnectorError> {
        let req = LedgerFaucet {
            owner: owner.to_address(),
            amount_cents: cents,
        };
        let resp = self
            .ledger_faucet(&req)
            .await
            .map_err(|e| classify(self, e))?;
        resp.outputs.iter().map(|h| decode_utxo(h)).collect()
    }

    async fn submit(&self, tx: &Transaction) -> Result<TxAnswer, ConnectorError> {
        let s = NodeClient::submit(self, hex::encode(tx.encode()))
            .await
            .map_err(|e| classify(self, e))?;
        Ok(TxAnswer {
            verdict: TxVerdict::parse(&s.status),
            error: s.error,
        })
    }

    async fn unspent(&self, id: &UhsId) -> Result<bool, ConnectorError> {
        NodeClient::unspent(self, id)
            .await
            .map_err(|e| classify(self, e))
    }

    async fn mailbox_put(&self, to: &PublicKey, sealed: &[u8]) -> Result<u64, ConnectorError> {
        NodeClient::mailbox_put(self, &to.to_address(), sealed)
            .await
            .map_err(|e| classify(self, e))
    }

    async fn mailbox_get(
        &self,
        owner: &PublicKey,
        after: u64,
    ) -> Result<Vec<Mail>, ConnectorError> {
        let list = NodeClient::mailbox_get(self, &owner.to_address(), after)
            .await
            .map_err(|e| classify(self, e))?;
        Ok(list
            .messages
            .into_iter()
            .map(|m| Mail {
                seq: m.seq,
                // Not hex: noise, which the wallet skips (an empty message opens to nothing).
                message: hex::decode(&m.message).unwrap_or_default(),
            })
            .collect())
    }

    async fn withdraw(&self, req: &Withdrawal) -> Result<Vec<Token>, ConnectorError> {
        let req = WithdrawRequest {
            tx: req.tx.clone(),
            output: req.output,
            recipient: req.recipient.to_address(),
            handshake: req.handshake.clone(),
            key: Some(req.auth.key.clone()),
            signature: Some(req.auth.signature.clone()),
        };
        let resp = NodeClient::withdraw(self, &req)
            .await
            .map_err(|e| classify(self, e))?;
        resp.tokens.iter().map(|h| decode_token(h)).collect()
    }

    async fn deposit(
        &self,
        depositor: &PublicKey,
        tokens: &[Token],
        credit: bool,
    ) -> Result<Vec<DepositItem>, ConnectorError> {
        let req = DepositRequest {
            depositor: depositor.to_address(),
            tokens: tokens.iter().map(|t| hex::encode(t.encode())).collect(),
            credit,
        };
        let resp = NodeClient::deposit(self, &req)
            .await
            .map_err(|e| classify(self, e))?;
        let mut items = Vec::with_capacity(resp.results.len());
        for (r, sent) in resp.results.iter().zip(tokens) {
            let item = match r.outcome.as_str() {
                "reanchored" | "repeated" => {
                    let hexed = r
                        .token
                        .as_deref()
                        .ok_or_else(|| ConnectorError::unreadable("node sent no token"))?;
                    DepositItem::Reanchored(decode_token(hexed)?)
                }
                "double_spend" => {
                    let f = r
                        .fraud
                        .as_ref()
                        .ok_or_else(|| ConnectorError::unreadable("node sent no fraud proof"))?;
                    let bytes = hex::decode(&f.proof).map_err(ConnectorError::unreadable)?;
                    let proof = FraudProof::decode(&bytes).map_err(ConnectorError::unreadable)?;
                    // The wallet checks the proof against the token it sent before writing
                    // it off.
                    DepositItem::DoubleSpend {
                        serial: sent.serial,
                        proof: Box::new(proof),
                    }
                }
                "credited" | "already_credited" => DepositItem::Credited {
                    serial: sent.serial,
                },
                _ => DepositItem::Refused {
                    serial: sent.serial,
                    // The stable code first (`blacklisted: token … is blacklisted`).
                    reason: match &r.code {
                        Some(c) => format!("{c}: {}", r.error.clone().unwrap_or_default()),
                        None => r.error.clone().unwrap_or_default(),
                    },
                    retry: r.retry,
                },
            };
            items.push(item);
        }
        Ok(items)
    }
}
