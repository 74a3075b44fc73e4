//! `xray selftest`: every catalogue fault on the bundled fixtures; the reported origin must be
//! where the fault was planted. Prints the table; exit 1 if any row fails.

use std::path::PathBuf;
use std::process::ExitCode;

use xray_compare::tolerance::Policy;
use xray_harness::selftest::{bundled, selftest, table};

/// Arguments of `xray selftest`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Repository root holding fixtures/ (default: current directory).
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Only these faults.
    #[arg(long, value_name = "FAULT")]
    pub only: Vec<String>,
    /// Only this family.
    #[arg(long)]
    pub family: Option<String>,
    /// Tolerance policy.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Print the rows as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the self-test.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let policy = match &a.policy {
        Some(p) => Policy::load(p)?,
        None => Policy::default(),
    };
    let mut fx = bundled(&a.root)?;
    if let Some(f) = &a.family {
        fx.retain(|x| {
            xray_runtime::models::detect_family(&x.model)
                .map(|y| y == f)
                .unwrap_or(false)
        });
    }
    let rows = selftest(&fx, &policy, &a.only, &|m| {
        super::note(&format!("xray selftest: {m}"))
    })?;
    if a.json {
        super::say(&format!("{}\n", serde_json::to_string_pretty(&rows)?))?;
    } else {
        super::say(&table(&rows))?;
    }
    Ok(if rows.iter().all(|r| r.pass) {
        ExitCode::SUCCESS
    } else {
        super::exit_fail()
    })
}
