//! The Grafana dashboard in `docs/grafana/florin.json` and the metrics stay in step: every
//! metric a panel queries exists, every family is on some panel, and the file is a dashboard
//! Grafana imports (unique panel ids, every query on the `DS_PROMETHEUS` input).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use serde_json::Value;

fn dashboard() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana/florin.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every `florin_…` name in a query.
fn names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("florin_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_queried_metric_exists_and_every_family_is_shown() {
    let d = dashboard();
    let metrics = florin_obs::metrics::global();
    let mut samples = BTreeSet::new();
    for (name, kind) in metrics.families() {
        samples.extend(kind.samples(name));
    }
    let mut queried = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "panel ids are unique"
        );
        if p["type"] == "row" {
            continue;
        }
        assert!(!p["title"].as_str().unwrap().is_empty());
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} queries something", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}");
            let expr = t["expr"].as_str().unwrap();
            for n in names_in(expr) {
                assert!(
                    samples.contains(&n),
                    "panel {:?} queries {n}, which no family of florin_obs makes",
                    p["title"]
                );
                queried.insert(n);
            }
        }
    }
    for (name, kind) in metrics.families() {
        assert!(
            kind.samples(name).iter().any(|s| queried.contains(s)),
            "{name} is on no panel of the dashboard"
        );
    }
    assert_eq!(d["__inputs"][0]["name"], "DS_PROMETHEUS");
}
