//! `xray report EVIDENCE [--html FILE] [--markdown FILE]`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use xray_harness::evidence::{write_atomic, Evidence};
use xray_harness::report;

/// Arguments of `xray report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Evidence JSON written by `xray check` or `xray compare`.
    pub evidence: PathBuf,
    /// Write the self-contained HTML report here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Write Markdown (for a pull-request comment) here; `-` for stdout. Without --html and
    /// --markdown, Markdown goes to stdout.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
}

/// Renders the evidence. Exit 0 when written (whatever the verdict), 2 on input errors.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let e = Evidence::load(&a.evidence)?;
    if let Some(p) = &a.html {
        write_atomic(p, report::html(&e).as_bytes())
            .with_context(|| format!("writing HTML report {}", p.display()))?;
        super::note(&format!("xray: wrote {}", p.display()));
    }
    match &a.markdown {
        Some(p) if p.as_os_str() != "-" => {
            write_atomic(p, report::markdown(&e).as_bytes())
                .with_context(|| format!("writing Markdown {}", p.display()))?;
            super::note(&format!("xray: wrote {}", p.display()));
        }
        Some(_) => super::say(&report::markdown(&e))?,
        None if a.html.is_none() => super::say(&report::markdown(&e))?,
        None => {}
    }
    Ok(ExitCode::SUCCESS)
}
