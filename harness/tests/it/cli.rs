//! The `xray report` and `xray gate` subcommands end to end: outputs and exit codes.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{code, xray};

fn write(dir: &Path, name: &str, e: &xray_compare::evidence::Evidence) -> String {
    let p = dir.join(name);
    e.save(&p).expect("save");
    p.display().to_string()
}

#[test]
fn report_writes_html_and_markdown() {
    let dir = tempfile::tempdir().unwrap();
    let ev = write(dir.path(), "e.json", &common::whisper_evidence(true));
    let html = dir.path().join("r.html");
    let md = dir.path().join("r.md");
    let o = xray(&[
        "report",
        &ev,
        "--html",
        html.to_str().unwrap(),
        "--markdown",
        md.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let h = std::fs::read_to_string(&html).unwrap();
    assert!(
        h.starts_with("<!doctype html>") && h.contains("<svg") && h.contains("First divergence")
    );
    assert!(
        !h.contains("http://")
            || h.matches("http://").count()
                == h.matches("xmlns=\"http://www.w3.org/2000/svg\"").count(),
        "no network references besides the SVG namespace"
    );
    assert!(!h.contains("<script") && !h.contains("<link"));
    let m = std::fs::read_to_string(&md).unwrap();
    assert!(m.contains("audio.decoder.layer.1.cross_k@step0"));
    // Without output options, Markdown goes to stdout.
    let o = xray(&["report", &ev]);
    assert_eq!(code(&o), 0);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("## X-Ray"));
}

#[test]
fn input_errors_exit_2_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"schema\": \"something/else\"}").unwrap();
    for args in [
        vec!["report", "/nonexistent/evidence.json"],
        vec!["report", bad.to_str().unwrap()],
        vec![
            "gate",
            "--evidence",
            bad.to_str().unwrap(),
            "--baseline",
            bad.to_str().unwrap(),
        ],
        vec!["gate", "--evidence", "x"],
        vec!["no-such-command"],
    ] {
        let o = xray(&args);
        assert_eq!(
            code(&o),
            2,
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    }
    assert_eq!(code(&xray(&["--help"])), 0);
}

#[test]
fn gate_passes_on_same_evidence_and_fails_on_regression() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.json", &common::whisper_evidence(false));
    let bad = write(dir.path(), "bad.json", &common::whisper_evidence(true));
    let junit = dir.path().join("junit.xml");
    let junit_arg = junit.to_str().unwrap();
    // `xray gate --evidence NEW --baseline BASE EXTRA..`.
    let gate = |new: &str, base: &str, extra: &[&str]| {
        let mut args = vec!["gate", "--evidence", new, "--baseline", base];
        args.extend_from_slice(extra);
        xray(&args)
    };
    let o = gate(&good, &good, &["--junit", junit_arg]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stdout));
    assert!(!std::fs::read_to_string(&junit)
        .unwrap()
        .contains("<failure"));
    let o = gate(&bad, &good, &["--junit", junit_arg]);
    assert_eq!(code(&o), 1);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("FAIL verdict worsened: pass -> diverged"),
        "{out}"
    );
    assert!(out.contains("audio.decoder.layer.1.cross_k@step0: status worsened: pass -> origin"));
    let x = std::fs::read_to_string(&junit).unwrap();
    // One <failure> per failing case; its type lists the kinds of its findings.
    let status_failure = x.split("<failure ").skip(1).any(|f| {
        let ty = f.split("type=\"").nth(1).and_then(|t| t.split('"').next());
        ty.is_some_and(|t| t.split(',').any(|k| k == "status"))
    });
    assert!(status_failure, "{x}");
    let o = gate(&bad, &good, &["--factor", "0.5"]);
    assert_eq!(code(&o), 2, "a factor below 1 is a usage error");
}

#[test]
fn closed_stdout_is_not_a_panic() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let ev = write(dir.path(), "e.json", &common::whisper_evidence(true));
    let mut child = Command::new(env!("CARGO_BIN_EXE_xray"))
        .args(["report", &ev])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take()); // the reader goes away, as with `| head -0`
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}
