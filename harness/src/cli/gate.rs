//! `xray gate --evidence NEW --baseline OLD [--junit FILE] [--factor F]`. NEW and OLD are evidence
//! files, or both corpus evidence directories (`xray check --evidence-dir`), gated clip by clip.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use xray_compare::corpus::{gate_corpus, Corpus};
use xray_compare::evidence::Evidence;
use xray_compare::gate::{gate, junit_xml, GateOptions};

use super::exit_fail;

/// Arguments of `xray gate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// New evidence JSON.
    #[arg(long, value_name = "NEW")]
    pub evidence: PathBuf,
    /// Baseline evidence JSON.
    #[arg(long, value_name = "OLD")]
    pub baseline: PathBuf,
    /// Write JUnit XML here.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Allowed growth factor of rel_l2 and max_abs.
    #[arg(long, value_name = "F", default_value_t = GateOptions::default().factor)]
    pub factor: f64,
    /// rel_l2 at or below this never fails.
    #[arg(long, value_name = "X", default_value_t = GateOptions::default().rel_l2_floor)]
    pub rel_l2_floor: f64,
    /// max_abs at or below this never fails.
    #[arg(long, value_name = "X", default_value_t = GateOptions::default().max_abs_floor)]
    pub max_abs_floor: f64,
    /// Gate evidence of other weights or other audio against the baseline (reported as info);
    /// family and contract must still match.
    #[arg(long)]
    pub allow_different_input: bool,
}

/// Runs the gate: prints findings, writes JUnit, exit 0 pass / 1 failure / 2 input error
/// (including evidence that observed no checkpoint, or an empty corpus: an empty gate never
/// passes). The JUnit path is checked before anything is read.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if !(ok(a.factor) && a.factor >= 1.0 && ok(a.rel_l2_floor) && ok(a.max_abs_floor)) {
        bail!("--factor must be >= 1 and the floors finite and >= 0");
    }
    let mut outputs = super::Outputs::default();
    outputs.file_if("junit", a.junit.as_deref());
    outputs
        .input("evidence", &a.evidence)
        .input("baseline", &a.baseline);
    outputs.check()?;
    let opts = GateOptions {
        factor: a.factor,
        rel_l2_floor: a.rel_l2_floor,
        max_abs_floor: a.max_abs_floor,
        allow_different_input: a.allow_different_input,
    };
    let r = match (a.evidence.is_dir(), a.baseline.is_dir()) {
        (true, true) => {
            let new = Corpus::load(&a.evidence)?;
            let base = Corpus::load(&a.baseline)?;
            for f in new.files().chain(base.files()) {
                outputs.input("evidence", f);
            }
            outputs.check()?;
            gate_corpus(&new, &base, &opts)
        }
        (false, false) => {
            let new = Evidence::load(&a.evidence)?;
            let base = Evidence::load(&a.baseline)?;
            gate(&new, &base, &opts)
        }
        _ => bail!(
            "--evidence and --baseline must both be evidence files or both corpus directories"
        ),
    }
    .with_context(|| {
        format!(
            "gating {} against {}",
            a.evidence.display(),
            a.baseline.display()
        )
    })?;
    super::say(&r.text())?;
    if let Some(p) = &a.junit {
        let xml = junit_xml(&r).with_context(|| format!("writing JUnit XML {}", p.display()))?;
        outputs.write_file("junit", p, xml.as_bytes());
    }
    outputs.finish()?;
    Ok(if r.passed() {
        ExitCode::SUCCESS
    } else {
        exit_fail()
    })
}
