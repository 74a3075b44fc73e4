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
