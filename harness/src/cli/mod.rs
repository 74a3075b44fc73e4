//! One module per subcommand, each with `Args` (clap) and `run(Args) -> anyhow::Result<ExitCode>`.

use std::process::ExitCode;

pub mod bench_compare;
pub mod gate;
pub mod report;

/// Exit code for a divergence or gate failure.
pub fn exit_fail() -> ExitCode {
    ExitCode::from(1)
}

/// Exit code for a usage or input error.
pub fn exit_usage() -> ExitCode {
    ExitCode::from(2)
}

/// Writes `text` to stdout; a closed pipe (`xray ... | head`) is not an error.
pub fn say(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|_| o.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Writes a line to stderr, ignoring failures (progress and diagnostics only).
pub fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

pub mod bench;
pub mod check;
pub mod compare;
pub mod doctor;
pub mod faults;
pub mod list;
pub mod oracle;
pub mod run;
pub mod selftest;

/// A model directory's config.json as JSON.
pub fn read_config(dir: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (run `make fixtures` for the bundled models)",
            p.display()
        )
    })?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

/// One-paragraph human summary of an evidence document (stderr).
pub fn summary(e: &xray_harness::evidence::Evidence) -> String {
    let n = e.checkpoints.len();
    let pass = e
        .checkpoints
        .iter()
        .filter(|c| c.status == xray_harness::localize::Status::Pass)
        .count();
    let mut s = format!(
        "xray: verdict {} ({pass}/{n} checkpoints pass",
        e.verdict.as_str()
    );
    if let Some(c) = e.capture_neutral {
        s.push_str(&format!(", capture neutral: {c}"));
    }
    s.push(')');
    if let Some(t) = &e.transcript {
        s.push_str(&format!(
            "\nxray: reference: {:?}\nxray: runtime:   {:?} (tokens equal: {})",
            t.reference, t.runtime, t.tokens_equal
        ));
    }
    if let Some(f) = &e.first_divergence {
        s.push_str(&format!(
            "\nxray: first divergence: {}@step{} (producer {})",
            f.checkpoint, f.step, f.producer
        ));
        if let Some(x) = &f.explanation {
            s.push_str(&format!(": {}", x.detail));
        }
    }
    s
}

/// clap value parser for counts that must be at least 1 (`--max-steps`, `--threads`).
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a positive integer: {e}")),
    }
}
