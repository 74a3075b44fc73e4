//! `xray summarize DIR... [--out FILE] [--markdown FILE]`: merge corpus evidence directories
//! (e.g. the shards of a CI matrix, each written by `xray check --shard K/N --evidence-dir DIR`)
//! into one summary. Each clip's row is derived again from its evidence file (whose verdict must
//! be its checkpoints'), so a summary never outlives the evidence it describes; the shards must
//! be of one model by content (family, weights and contract sha256), however its path is
//! spelled. With `--out`, evidence paths are stored relative to the summary file, so a folder
//! holding it reads back from anywhere. Exit 0 when every clip passed, 1 when one diverged, 2 on
//! an input error or a clip that could not be checked.

use std::path::PathBuf;
use std::process::ExitCode;

use xray_compare::corpus::{merge, Corpus};

/// Arguments of `xray summarize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Corpus evidence directories (each with summary.json).
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,
    /// Write the merged summary JSON here (evidence paths relative to its folder).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write the merged Markdown table here (printed on stdout otherwise).
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<PathBuf>,
}

/// Merges and writes.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut outputs = super::Outputs::default();
    outputs.file_if("out", a.out.as_deref());
    outputs.file_if("markdown", a.markdown.as_deref());
    for d in &a.dirs {
        outputs.input("corpus directory", d);
    }
    outputs.check()?;
    let corpora = a
        .dirs
        .iter()
        .map(|d| Corpus::load(d))
        .collect::<Result<Vec<_>, _>>()?;
    // The evidence files the summaries name may lie outside their directories.
    for c in &corpora {
        for f in c.files() {
            outputs.input("evidence", f);
        }
    }
    outputs.check()?;
    let s = merge(&corpora, a.out.as_deref())?;
    if let Some(p) = &a.out {
        outputs.write_file(
            "out",
            p,
            format!("{}\n", serde_json::to_string_pretty(&s)?).as_bytes(),
        );
    }
    match &a.markdown {
        Some(p) => {
            outputs.write_file("markdown", p, s.markdown().as_bytes());
        }
        None => super::say(&s.markdown())?,
    }
    super::note(&super::corpus_line(&s));
    outputs.finish()?;
    Ok(super::corpus_exit(&s))
}
