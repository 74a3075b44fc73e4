//! `xray doctor`: where the oracle's Python environment and package were found and why, the
//! versions of python, numpy, torch and transformers it imports, and the libpython in use.
//! Exit 0 when the reference stack imports from the installation, 2 otherwise.

use std::process::ExitCode;

use xray_oracle::Oracle;

/// Arguments of `xray doctor` (none).
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Prints the environment report.
pub fn run(_a: Args) -> anyhow::Result<ExitCode> {
    let oracle = Oracle::discover()?;
    let mut text = format!("xray {}\n", env!("CARGO_PKG_VERSION"));
    if let Ok(exe) = std::env::current_exe() {
        text.push_str(&format!("executable: {}\n", exe.display()));
    }
    text.push_str(&format!(
        "oracle venv: {}\n  found: {}\n  site-packages: {}\n",
        oracle.venv.display(),
        oracle.venv_source,
        oracle.site_packages.display()
    ));
    text.push_str(&format!(
        "oracle package: {}\n  found: {}\n",
        oracle.package_root.join("xray_oracle").display(),
        oracle.package_source
    ));
    text.push_str(
        "  (the working directory is never searched: XRAY_VENV / XRAY_ORACLE_PATH override)\n",
    );
    let report = oracle.environment_report()?;
    for (k, v) in &report {
        text.push_str(&format!("{k}: {v}\n"));
    }
    // The package Python imported must be the one discovery chose.
    let imported = report
        .iter()
        .find(|(k, _)| k == "xray_oracle")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let want = oracle.package_root.join("xray_oracle");
    super::say(&text)?;
    if !std::path::Path::new(&imported).starts_with(&want) {
        anyhow::bail!(
            "Python imported xray_oracle from {imported}, not from {} (a PYTHONPATH entry shadows it?)",
            want.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
