//! `xray report EVIDENCE [--html FILE] [--markdown FILE]`.

use std::path::PathBuf;
use std::process::ExitCode;

use xray_compare::evidence::Evidence;
use xray_compare::report;

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

/// Renders the evidence. Exit 0 when written (whatever the verdict), 2 on input errors (evidence
/// whose recorded verdict its checkpoints do not support included, an output that is the
/// evidence itself) or when an output could not be written (each output is still attempted, and
/// the failure named).
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let md_file = a.markdown.as_ref().filter(|p| p.as_os_str() != "-");
    let mut outputs = super::Outputs::default();
    outputs.file_if("html", a.html.as_deref());
    outputs.file_if("markdown", md_file.map(|p| p.as_path()));
    outputs.input("evidence", &a.evidence);
    outputs.check()?;
    let e = Evidence::load(&a.evidence)?;
    if let Some(p) = &a.html {
        if outputs.write_file("html", p, report::html(&e).as_bytes()) {
            super::note(&format!("xray: wrote {}", p.display()));
        }
    }
    if let Some(p) = md_file {
        if outputs.write_file("markdown", p, report::markdown(&e).as_bytes()) {
            super::note(&format!("xray: wrote {}", p.display()));
        }
    } else if a.markdown.is_some() || a.html.is_none() {
        // `--markdown -`, or no output named: Markdown on stdout.
        super::say(&report::markdown(&e))?;
    }
    outputs.finish()?;
    Ok(ExitCode::SUCCESS)
}
