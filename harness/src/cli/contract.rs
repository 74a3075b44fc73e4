//! `xray contract --model DIR [--out FILE]`: the family's checkpoint contract resolved against the
//! model's config.json, as the JSON the oracle reads (`xray.contract.resolved/v1`). Python-free;
//! `python -m xray_oracle dump --contract FILE` takes its output.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `xray contract`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HF model directory (its config.json names the family and sets the geometry).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Write here (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Resolves and prints (or writes) the contract.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let family = xray_runtime::models::detect_family(&a.model)?;
    let config = super::read_config(&a.model)?;
    let contract = super::contract_for(family, &a.model, &config)?;
    let text = format!(
        "{}\n",
        serde_json::to_string_pretty(&contract.resolved_json())?
    );
    match &a.out {
        None => super::say(&text)?,
        Some(p) => {
            let mut outputs = super::Outputs::default();
            outputs.file("out", p).check()?;
            outputs.write_file("out", p, text.as_bytes());
            outputs.finish()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
