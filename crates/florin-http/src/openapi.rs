//! The API contract: an OpenAPI 3.1 document generated from the handlers' `#[utoipa::path]`
//! annotations and the bodies' `ToSchema` derives, so the routes served and the routes
//! documented are the same list (`utoipa_axum`'s router registers both at once). Served at
//! `/openapi.json` with a browsable view at `/docs`; committed as `docs/openapi.json` (the
//! node) and `docs/openapi-psp.json` (a payment provider), which a test compares with the code.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::openapi::{Content, OpenApi, Ref, RefOr, ResponseBuilder};
use utoipa_axum::router::UtoipaMethodRouter;

/// The name of the shared error answer in `components.responses`.
const ERROR: &str = "Error";

/// A route of the document with its method router wrapped (its body limit, its work gate).
pub fn wrap<S: Clone + Send + Sync + 'static>(
    (schemas, paths, route): UtoipaMethodRouter<S>,
    f: impl FnOnce(MethodRouter<S>) -> MethodRouter<S>,
) -> UtoipaMethodRouter<S> {
    (schemas, paths, f(route))
}

/// Which API a document describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// A node: the token authority, the ledger's sentinel, the devnet.
    Node,
    /// A payment service provider.
    Psp,
}

/// Completes a generated document: its title and version, the error answers every route can
/// give (in the `ApiError` envelope), and the credential schemes.
pub fn finish(mut doc: OpenApi, api: Api) -> OpenApi {
    let (title, about) = match api {
        Api::Node => (
            "Florin node API",
            "The token authority, the ledger's sentinel and the devnet: withdrawals, \
             deposits, ledger transactions, the supply audit, mailboxes and the operators' \
             routes. Every answer other than 2xx is an `ApiError` envelope; `docs/api.md` \
             explains the codes.",
        ),
        Api::Psp => (
            "Florin payment provider API",
            "A payment service provider's accounts, payments and cross-provider transfers. \
             Customers sign their requests (`florin-auth` header), peers sign theirs, the \
             provider's operator uses `Authorization: Florin-Operator …`. Every answer other \
             than 2xx is an `ApiError` envelope.",
        ),
    };
    doc.info.title = title.into();
    doc.info.version = env!("CARGO_PKG_VERSION").into();
    doc.info.description = Some(about.into());
    doc.info.license = Some(
        utoipa::openapi::LicenseBuilder::new()
            .name("Apache-2.0")
            .build(),
    );
    let components = doc
        .components
        .get_or_insert_with(utoipa::openapi::Components::new);
    components.responses.insert(
        ERROR.into(),
        RefOr::T(
            ResponseBuilder::new()
                .description("The request was refused or failed: a stable code and a message.")
                .content(
                    "application/json",
                    Content::new(Some(Ref::from_schema_name("ApiError"))),
                )
                .build(),
        ),
    );
    components.security_schemes.insert(
        "operator".into(),
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            "Authorization",
            "`Florin-Operator v1 KEY UNIX-SECONDS NONCE SIGNATURE`: an operator's Ed25519 \
             signature over the method, the path and query, the body, the time and the nonce \
             (`florin admin` makes it).",
        ))),
    );
    if api == Api::Psp {
        components.security_schemes.insert(
            "customer".into(),
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                florin_node::psp::auth::AUTH_HEADER,
                "The customer's signature over the method, the path and query, the body, the \
                 time and a nonce (`florin psp` makes it).",
            ))),
        );
        components.security_schemes.insert(
            "peer".into(),
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                florin_node::psp::auth::AUTH_HEADER,
                "A peer provider's signature (a key in this provider's peer list) over the \
                 method, the path and query, the body, the time and a nonce.",
            ))),
        );
    }
    for item in doc.paths.paths.values_mut() {
        for (is_post, op) in operations(item) {
            add_errors(op, is_post);
        }
    }
    doc
}

/// The operations of a path, each with whether it takes a body.
fn operations(item: &mut PathItem) -> Vec<(bool, &mut Operation)> {
    let mut ops = Vec::new();
    if let Some(op) = item.get.as_mut() {
        ops.push((false, op));
    }
    if let Some(op) = item.post.as_mut() {
        ops.push((true, op));
    }
    ops
}

/// The answers every route can give besides its own: a malformed request, an unknown object
/// (a path parameter naming nothing; on a node, also the authority or the ledger not running
/// there), too many requests, a failure, unavailable storage; for a body, too large and the
/// wrong media type.
fn add_errors(op: &mut Operation, takes_body: bool) {
    let mut codes = vec!["400", "404", "429", "500", "503"];
    if takes_body {
        codes.extend(["413", "415"]);
    }
    for code in codes {
        op.responses
            .responses
            .entry(code.to_string())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(ERROR)));
    }
}

/// `GET /openapi.json` and the browsable view of `doc` (`GET /docs` and its script and style).
pub fn routes<S: Clone + Send + Sync + 'static>(
    doc: &OpenApi,
) -> Vec<(&'static str, MethodRouter<S>)> {
    let json: axum::body::Bytes = match doc.to_pretty_json() {
        Ok(s) => s.into(),
        Err(e) => serde_json::to_string(&florin_node::api::ApiError::new(
            "internal",
            format!("the API document could not be written: {e}"),
        ))
        .unwrap_or_default()
        .into(),
    };
    vec![
        (
            "/openapi.json",
            get(move || async move {
                ([(header::CONTENT_TYPE, "application/json")], json).into_response()
            }),
        ),
        (
            "/docs",
            get(|| async { asset(DOCS_HTML, "text/html; charset=utf-8") }),
        ),
        (
            "/docs/docs.js",
            get(|| async { asset(DOCS_JS, "text/javascript; charset=utf-8") }),
        ),
        (
            "/docs/docs.css",
            get(|| async { asset(DOCS_CSS, "text/css; charset=utf-8") }),
        ),
    ]
}

/// The policy of every page Florin serves: its own script and style only, nothing framed,
/// nothing fetched but from the node.
pub const PAGE_POLICY: &str = "default-src 'self'; object-src 'none'; base-uri 'none'; \
                               frame-ancestors 'none'; form-action 'none'";

/// An embedded asset with its type and the page policy.
pub fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, PAGE_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

const DOCS_HTML: &str = include_str!("../assets/docs.html");
const DOCS_JS: &str = include_str!("../assets/docs.js");
const DOCS_CSS: &str = include_str!("../assets/docs.css");
