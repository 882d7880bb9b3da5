//! The operators' console at `/console`: a page, its script and its style, embedded in the
//! binary (no Node.js or network at run time). The page reads the node's own routes — the
//! audit, `/metrics`, fraud proofs, recent transactions — verifies fraud proofs in the browser
//! and signs operator requests there with a key it cannot export (`assets/console.js`).

use axum::routing::{get, MethodRouter};

use crate::openapi::asset;

const HTML: &str = include_str!("../assets/console.html");
const JS: &str = include_str!("../assets/console.js");
const CSS: &str = include_str!("../assets/console.css");

/// `GET /console` and its assets.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Vec<(&'static str, MethodRouter<S>)> {
    vec![
        (
            "/console",
            get(|| async { asset(HTML, "text/html; charset=utf-8") }),
        ),
        (
            "/console/console.js",
            get(|| async { asset(JS, "text/javascript; charset=utf-8") }),
        ),
        (
            "/console/console.css",
            get(|| async { asset(CSS, "text/css; charset=utf-8") }),
        ),
    ]
}
