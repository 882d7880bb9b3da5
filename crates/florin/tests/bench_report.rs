//! `florin bench report`: real suites run as children of the binary (`--quick` sizes), one
//! HTML page written; every plot of a suite that ran carries both Florin's series and the
//! source document's where the document's text gives numbers, and says so where it does not;
//! the same page again from the suites' JSON files (`--from DIR`).

#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::BIN;
use serde_json::Value;

/// Figures whose source text gives no numbers (the seeds' figures were lost with the PDF).
const NO_SEED_NUMBERS: &[&str] = &[
    "hamilton-fig6",
    "hamilton-fig7",
    "threshold-fig3-4",
    "thesis-fig7",
    "thesis-fig8",
];

/// The page's `<figure>` with this id, whole.
fn figure<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!("<figure id=\"{id}\""))
        .unwrap_or_else(|| panic!("{id} not in the page"));
    let end = at + html[at..].find("</figure>").unwrap();
    &html[at..end]
}

#[test]
fn a_quick_report_plots_florin_beside_every_seed_figure() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .args([
            "bench",
            "report",
            "--quick",
            "--suites",
            "offline,transfer",
            "--json",
            "--out",
        ])
        .arg(&page)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    // Self-contained: no script, nothing fetched.
    assert!(!html.contains("<script") && !html.contains("src=\"http"));
    let figures = v["figures"].as_array().unwrap();
    let ran = [
        "thesis-fig3",
        "thesis-fig4",
        "thesis-fig5",
        "thesis-fig6",
        "thesis-table1",
        "eurotoken-bounds",
    ];
    for id in ran {
        let f = figures
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing"));
        assert!(f["florin_points"].as_u64().unwrap() > 0, "{f}");
        assert!(f["seed_points"].as_u64().unwrap() > 0, "{f}");
        // The page's figure: an SVG whose legend names Florin's series and the seed's, and a
        // caption naming the run.
        let fig = figure(&html, id);
        let svg = &fig[fig.find("<svg").unwrap_or_else(|| panic!("{id}: no plot"))..];
        let svg = &svg[..svg.find("</svg>").unwrap()];
        assert!(svg.contains("Florin"), "{id}: no Florin series in the plot");
        assert!(
            svg.contains("seed (source document)")
                || svg.contains("thesis:")
                || svg.contains("draft")
                || svg.contains("derived"),
            "{id}: no seed series in the plot"
        );
        assert!(fig.contains("cores)"), "{id}: no machine");
    }
    // Suites that did not run: their figures say how to produce them, and draw nothing.
    for id in ["hamilton-fig4", "threshold-fig5"] {
        let f = figures.iter().find(|f| f["id"] == id).unwrap();
        assert_eq!(f["florin_points"], 0);
        let fig = figure(&html, id);
        assert!(
            fig.contains("Not yet measured") && !fig.contains("<svg"),
            "{id}"
        );
    }
    // The loss study ran (transfer): plotted, with no seed numbers to draw.
    for id in ["thesis-fig7", "thesis-fig8"] {
        let f = figures.iter().find(|f| f["id"] == id).unwrap();
        assert!(f["florin_points"].as_u64().unwrap() >= 4, "{f}");
    }
    for id in NO_SEED_NUMBERS {
        assert!(figure(&html, id).contains("gives no numbers"), "{id}");
    }

    // The same from saved JSON files, and a directory of nothing is an error.
    let saved = dir.path().join("runs");
    std::fs::create_dir(&saved).unwrap();
    let offline = Command::new(BIN)
        .args(["bench", "offline", "--quick", "--json"])
        .output()
        .unwrap();
    assert!(offline.status.success());
    std::fs::write(saved.join("offline.json"), &offline.stdout).unwrap();
    std::fs::write(saved.join("junk.json"), b"{not json").unwrap();
    let again = dir.path().join("again.html");
    let out = Command::new(BIN)
        .args(["bench", "report", "--from"])
        .arg(&saved)
        .arg("--out")
        .arg(&again)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again_html = std::fs::read_to_string(&again).unwrap();
    assert!(figure(&again_html, "thesis-table1").contains("<svg"));
    assert!(
        again_html.contains("--quick runs"),
        "the files' own --quick is said"
    );
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "report", "--from"])
        .arg(empty.path())
        .arg("--out")
        .arg(&again)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new(BIN)
        .args(["bench", "report", "--suites", "nope", "--out"])
        .arg(&again)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}
