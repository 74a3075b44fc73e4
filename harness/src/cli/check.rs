//! `xray check --model DIR --audio WAV`: runtime + oracle + compare in one process.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use xray_harness::check::{check, CheckOptions};
use xray_harness::evidence::{write_atomic, Verdict};
use xray_harness::report;
use xray_harness::tolerance::Policy;

/// Arguments of `xray check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HF model directory (config.json, model.safetensors, tokenizer.json, ...).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// WAV file (any common rate, mono or stereo: converted once to 16 kHz mono for both engines).
    #[arg(long, value_name = "WAV")]
    pub audio: PathBuf,
    /// Write the evidence JSON here (default: reports/<model>.<audio>.evidence.json).
    #[arg(long, value_name = "FILE")]
    pub evidence: Option<PathBuf>,
    /// Write the self-contained HTML report here.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Write the Markdown summary here.
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<PathBuf>,
    /// Tolerance policy (JSON; docs/tolerances.md).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Cap on generated tokens (at least 1).
    #[arg(long, value_name = "N", value_parser = super::positive)]
    pub max_steps: Option<usize>,
    /// Also measure each checkpoint's local error with the reference substituted upstream.
    #[arg(long)]
    pub isolate: bool,
    /// Gate at a multiple of each checkpoint's noise floor (oracle f32 vs f64).
    #[arg(long)]
    pub calibrate: bool,
    /// Feed the reference's CTC hypothesis to the runtime (non-autoregressive families).
    #[arg(long)]
    pub teacher_force: bool,
    /// Plant a deliberate fault (see `xray faults`): NAME or NAME@TARGET. Repeatable.
    #[arg(long, value_name = "FAULT")]
    pub inject: Vec<String>,
    /// Also write both dumps under this directory (reference/, runtime/).
    #[arg(long, value_name = "DIR")]
    pub dumps: Option<PathBuf>,
    /// torch threads for the oracle (default 1: deterministic and immune to oversubscription).
    #[arg(long, value_parser = super::positive)]
    pub threads: Option<usize>,
    /// Print the evidence JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs the check. Exit 0 pass, 1 divergence, 2 input error.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let policy = match &a.policy {
        Some(p) => Policy::load(p)?,
        None => Policy::default(),
    };
    let (faults, fault_names) = super::faults::plan(&a.inject, &a.model)?;
    let opts = CheckOptions {
        model: a.model.clone(),
        audio: a.audio.clone(),
        policy,
        max_steps: a.max_steps,
        isolate: a.isolate,
        calibrate: a.calibrate,
        teacher_force: a.teacher_force,
        faults,
        fault_names,
        threads: Some(a.threads.unwrap_or(1)),
        warmup_audio: None,
    };
    let t0 = std::time::Instant::now();
    let out = check(&opts, &|m| {
        super::note(&format!("xray: {m} [{:.1}s]", t0.elapsed().as_secs_f64()))
    })?;
    let ev = &out.evidence;
    let evidence_path = a.evidence.clone().unwrap_or_else(|| {
        let stem = |p: &PathBuf| {
            p.file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default()
        };
        PathBuf::from("reports").join(format!(
            "{}.{}.evidence.json",
            a.model
                .file_name()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default(),
            stem(&a.audio)
        ))
    });
    ev.save(&evidence_path)
        .with_context(|| format!("writing {}", evidence_path.display()))?;
    if let Some(d) = &a.dumps {
        out.reference.to_writer().write(&d.join("reference"))?;
        out.runtime.to_writer().write(&d.join("runtime"))?;
    }
    if let Some(p) = &a.report {
        write_atomic(p, report::html(ev).as_bytes())?;
    }
    if let Some(p) = &a.markdown {
        write_atomic(p, report::markdown(ev).as_bytes())?;
    }
    if a.json {
        super::say(&ev.to_json()?)?;
    }
    super::note(&super::summary(ev));
    super::note(&format!("xray: evidence {}", evidence_path.display()));
    if let Some(p) = &a.report {
        super::note(&format!("xray: report {}", p.display()));
    }
    Ok(match ev.verdict {
        Verdict::Pass => ExitCode::SUCCESS,
        _ => super::exit_fail(),
    })
}
