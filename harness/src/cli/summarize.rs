//! `xray summarize DIR... [--out FILE] [--markdown FILE]`: merge corpus evidence directories
//! (e.g. the shards of a CI matrix, each written by `xray check --shard K/N --evidence-dir DIR`)
//! into one summary. Each clip's row is derived again from its evidence file, so a summary never
//! outlives the evidence it describes. Exit 0 when every clip passed, 1 when one diverged, 2 on an
//! input error or a clip that could not be checked.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use xray_compare::corpus::{ClipSummary, Summary};
use xray_compare::evidence::Evidence;

/// Arguments of `xray summarize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Corpus evidence directories (each with summary.json).
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,
    /// Write the merged summary JSON here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write the merged Markdown table here (printed on stdout otherwise).
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<PathBuf>,
}

/// A directory's summary.json, checked.
pub fn load_summary(dir: &Path) -> anyhow::Result<Summary> {
    let p = dir.join("summary.json");
    let text = std::fs::read_to_string(&p).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (not a corpus directory written by `xray check --evidence-dir`)",
            p.display()
        )
    })?;
    let s: Summary =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    if s.schema != xray_compare::corpus::SUMMARY_SCHEMA {
        anyhow::bail!(
            "{}: schema '{}' is not {}",
            p.display(),
            s.schema,
            xray_compare::corpus::SUMMARY_SCHEMA
        );
    }
    Ok(s)
}

/// Merges the directories' clips (rows derived again from each evidence file).
pub fn merge(dirs: &[PathBuf]) -> anyhow::Result<Summary> {
    let mut model: Option<String> = None;
    let mut rows: Vec<ClipSummary> = Vec::new();
    for d in dirs {
        let s = load_summary(d)?;
        match &model {
            Some(m) if *m != s.model => anyhow::bail!(
                "{}: a corpus of model {} cannot merge with one of {m}",
                d.display(),
                s.model
            ),
            _ => model = Some(s.model.clone()),
        }
        for c in s.clips {
            if rows.iter().any(|r| r.audio == c.audio) {
                anyhow::bail!(
                    "{}: clip {} is in two of the directories",
                    d.display(),
                    c.audio
                );
            }
            let row = if c.evidence.is_empty() {
                c
            } else {
                let path = d.join(&c.evidence);
                let e = Evidence::load(&path)?;
                ClipSummary::of(&c.audio, &path.display().to_string(), &e, c.seconds)
            };
            rows.push(row);
        }
    }
    Ok(Summary::new(&model.unwrap_or_default(), None, None, rows))
}

/// Merges and writes.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut outputs = super::Outputs::default();
    if let Some(p) = &a.out {
        outputs.file("out", p);
    }
    if let Some(p) = &a.markdown {
        outputs.file("markdown", p);
    }
    outputs.check()?;
    let s = merge(&a.dirs)?;
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
