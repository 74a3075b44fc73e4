//! `xray faults`: the catalogue of deliberate faults, and `--inject` parsing for other commands.

use std::path::Path;
use std::process::ExitCode;

use xray_runtime::faults::{self, FaultPlan};

/// Arguments of `xray faults`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only the faults of this family (`whisper`, `granite_nar`).
    #[arg(long)]
    pub family: Option<String>,
}

/// Lists the catalogue.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut out = format!(
        "{:<24} {:<12} {:<56} description\n",
        "fault", "family", "default target"
    );
    for f in faults::catalogue() {
        if a.family.as_deref().is_some_and(|x| x != f.family) {
            continue;
        }
        out.push_str(&format!(
            "{:<24} {:<12} {:<56} {}\n",
            f.name, f.family, f.default_target, f.description
        ));
    }
    super::say(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// Build a fault plan from `--inject NAME[@TARGET]` specs for the model in `dir`.
pub fn plan(specs: &[String], dir: &Path) -> anyhow::Result<(FaultPlan, Vec<String>)> {
    if specs.is_empty() {
        return Ok((FaultPlan::none(), vec![]));
    }
    let family = xray_runtime::models::detect_family(dir)?;
    let config = super::read_config(dir)?;
    let mut plan = FaultPlan::none();
    for s in specs {
        plan.planted.push(faults::plant(s, family, &config)?);
    }
    Ok((plan, specs.to_vec()))
}
