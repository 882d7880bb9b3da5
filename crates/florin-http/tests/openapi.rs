//! The API contract: the OpenAPI documents generated from the handlers are the ones committed
//! in `docs/` (`FLORIN_BLESS=1 cargo test -p florin-http --test openapi` rewrites them after a
//! deliberate change), and they say what the routers do.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::Value;

fn docs(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name)
}

/// The committed document `name` equals `generated`, or (blessing) becomes it.
fn same_as_committed(name: &str, generated: &utoipa::openapi::OpenApi) {
    let text = generated.to_pretty_json().expect("serialize") + "\n";
    let path = docs(name);
    if std::env::var_os("FLORIN_BLESS").is_some() {
        std::fs::write(&path, &text).expect("write");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "docs/{name} differs from the API the code serves: run \
         `FLORIN_BLESS=1 cargo test -p florin-http --test openapi` and commit the result"
    );
}

#[test]
fn node_document_is_committed() {
    same_as_committed("openapi.json", &florin_http::node::openapi());
}

#[test]
fn psp_document_is_committed() {
    same_as_committed("openapi-psp.json", &florin_http::psp::openapi());
}

fn json(doc: &utoipa::openapi::OpenApi) -> Value {
    serde_json::to_value(doc).expect("to value")
}

#[test]
fn documents_are_openapi_3_1_with_every_error_in_the_envelope() {
    for doc in [
        json(&florin_http::node::openapi()),
        json(&florin_http::psp::openapi()),
    ] {
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().expect("paths");
        assert!(paths.len() >= 12, "{} paths", paths.len());
        for (path, item) in paths {
            for (method, op) in item.as_object().expect("item") {
                if !["get", "post"].contains(&method.as_str()) {
                    continue;
                }
                let responses = op["responses"].as_object().expect("responses");
                assert!(responses.contains_key("200"), "{method} {path}: no 200");
                for code in ["400", "404", "429", "500", "503"] {
                    assert!(responses.contains_key(code), "{method} {path}: no {code}");
                }
                if method == "post" {
                    assert!(responses.contains_key("413"), "{method} {path}: no 413");
                }
                assert!(op["operationId"].is_string(), "{method} {path}: no id");
                assert!(op["summary"].is_string(), "{method} {path}: no summary");
            }
        }
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        assert!(schemas.contains_key("ApiError"));
        // Every reference resolves.
        let text = doc.to_string();
        for (i, _) in text.match_indices("#/components/") {
            let rest = &text[i + 2..];
            let end = rest.find('"').expect("end of ref");
            let mut at = &doc;
            for part in rest[..end].split('/') {
                at = &at[part];
            }
            assert!(!at.is_null(), "dangling {}", &rest[..end]);
        }
    }
}

#[test]
fn operator_routes_need_the_operator_credential() {
    let doc = json(&florin_http::node::openapi());
    for (method, path) in florin_http::node::ADMIN_ROUTES {
        let op = &doc["paths"][path][method.to_lowercase()];
        assert_eq!(
            op["security"],
            serde_json::json!([{ "operator": [] }]),
            "{method} {path}"
        );
        assert!(op["responses"]["401"].is_object(), "{method} {path}");
    }
}

#[test]
fn peer_routes_are_where_providers_call_them() {
    let doc = json(&florin_http::psp::openapi());
    for path in [
        florin_node::psp::ANNOUNCE_PATH,
        florin_node::psp::RECEIVE_PATH,
    ] {
        assert!(doc["paths"][path]["post"].is_object(), "{path}");
    }
}

#[test]
fn supply_schema_has_the_fields_the_ledger_answers() {
    let doc = json(&florin_http::node::openapi());
    let mut documented: Vec<String> = doc["components"]["schemas"]["Supply"]["properties"]
        .as_object()
        .expect("Supply")
        .keys()
        .cloned()
        .collect();
    let mut served: Vec<String> = serde_json::to_value(florin_ledger::Supply::default())
        .expect("supply")
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served);
}

/// GET `path` on `router` (in process, from a loopback peer): status, headers, body.
async fn get(
    router: axum::Router,
    path: &str,
) -> (axum::http::StatusCode, axum::http::HeaderMap, Vec<u8>) {
    use tower::ServiceExt;
    let mut req = axum::http::Request::get(path)
        .body(axum::body::Body::empty())
        .expect("request");
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            40000,
        ))));
    let resp = router.oneshot(req).await.expect("answer");
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 24).await.expect("body");
    (parts.status, parts.headers, bytes.to_vec())
}

#[tokio::test]
async fn node_serves_its_document_the_browsable_view_and_the_console() {
    let router = || {
        florin_http::router(florin_http::AppState {
            authority: None,
            ledger: None,
            limits: florin_http::RateLimits::default(),
            cluster: None,
            custody: None,
        })
    };
    let (status, headers, body) = get(router(), "/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let served: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(served, json(&florin_http::node::openapi()));

    for (path, kind) in [
        ("/docs", "text/html"),
        ("/docs/docs.js", "text/javascript"),
        ("/docs/docs.css", "text/css"),
        ("/console", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let (status, headers, body) = get(router(), path).await;
        assert_eq!(status, 200, "{path}");
        let ct = headers["content-type"].to_str().expect("type");
        assert!(ct.starts_with(kind), "{path}: {ct}");
        let csp = headers["content-security-policy"].to_str().expect("csp");
        assert!(csp.starts_with("default-src 'self'"), "{path}: {csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert!(!body.is_empty());
    }
    // Each page loads only its own script and style, from this node.
    for (page, js, css) in [
        ("/docs", "/docs/docs.js", "/docs/docs.css"),
        ("/console", "/console/console.js", "/console/console.css"),
    ] {
        let (_, _, html) = get(router(), page).await;
        let html = String::from_utf8(html).expect("utf-8");
        assert!(html.contains(&format!("src=\"{js}\"")), "{page}");
        assert!(html.contains(&format!("href=\"{css}\"")), "{page}");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "{page}"
        );
    }
}
