//! Florin's HTTP/JSON surface: the node's axum router ([`node`]), the payment provider's
//! ([`psp`]), the reqwest links a provider uses to reach the ledger and other providers
//! ([`links`]), a typed client for the provider's API ([`psp_client`]), the one server loop
//! every listener runs ([`server`]), TLS material and trust ([`tls`]) and the API contract
//! generated from the handlers ([`openapi`]).
//!
//! The services live in `florin-node` and know nothing of HTTP (that crate depends on no
//! axum, hyper or reqwest). The rule here, as in cdk's `cdk-axum`: a handler only **parses**
//! the request into typed values, **calls** the service, and **maps** the answer (or the
//! error, to a status code and the JSON error envelope, `ApiError`). Service logic does not live here.

pub mod client;
mod connect;
pub mod console;
pub mod edge;
pub mod links;
pub mod node;
pub mod observe;
pub mod openapi;
pub mod psp;
pub mod psp_client;
pub mod server;
pub mod tls;

pub use client::NodeClient;
pub use edge::{ApiJson, EdgeError, RateLimits};
pub use links::HttpLinks;
pub use node::{router, serve, serve_with, AppState, HttpError, MAX_SUBMIT_BATCH};
pub use psp_client::{ClientError, PspClient};
pub use server::ServeOptions;
pub use tls::{ClientTls, LocalCa, ServerTls, TlsError};
