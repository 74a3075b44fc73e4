//! `xray check --model DIR --audio WAV`: runtime + oracle + compare in one process.

use std::path::PathBuf;
use std::process::ExitCode;

use xray_compare::evidence::Verdict;
use xray_compare::report;
use xray_compare::tolerance::Policy;
use xray_harness::check::{check, CheckOptions};

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
    /// Also write both dumps under this directory (reference/, runtime/; each new, empty, or an
    /// X-Ray dump replaced with --force).
    #[arg(long, value_name = "DIR")]
    pub dumps: Option<PathBuf>,
    /// Replace existing X-Ray dumps under --dumps.
    #[arg(long)]
    pub force: bool,
    /// torch threads for the oracle (default 1: deterministic and immune to oversubscription).
    #[arg(long, value_parser = super::positive)]
    pub threads: Option<usize>,
    /// Print the evidence JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs the check. Exit 0 pass, 1 divergence, 2 input error.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let evidence_path = a
        .evidence
        .clone()
        .unwrap_or_else(|| default_evidence_path(&a));
    // Every output location is checked before anything runs.
    let mut outputs = super::Outputs::default();
    outputs.file("evidence", &evidence_path);
    if let Some(p) = &a.report {
        outputs.file("report", p);
    }
    if let Some(p) = &a.markdown {
        outputs.file("markdown", p);
    }
    if let Some(d) = &a.dumps {
        if d.exists() && !d.is_dir() {
            anyhow::bail!("--dumps {}: exists and is not a directory", d.display());
        }
        outputs.dump("dumps", &d.join("reference"), a.force);
        outputs.dump("dumps", &d.join("runtime"), a.force);
    }
    outputs.check()?;
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
    // The evidence first, then the reports, then the dumps; a failed write does not stop the rest.
    outputs.write_evidence(&evidence_path, &ev.to_json()?);
    if let Some(p) = &a.report {
        outputs.write_file("report", p, report::html(ev).as_bytes());
    }
    if let Some(p) = &a.markdown {
        outputs.write_file("markdown", p, report::markdown(ev).as_bytes());
    }
    if let Some(d) = &a.dumps {
        outputs.write_dump(
            "dumps",
            &d.join("reference"),
            &out.reference.to_writer(),
            a.force,
        );
        outputs.write_dump(
            "dumps",
            &d.join("runtime"),
            &out.runtime.to_writer(),
            a.force,
        );
    }
    if a.json {
        super::say(&ev.to_json()?)?;
    }
    super::note(&super::summary(ev));
    super::note(&format!("xray: evidence {}", evidence_path.display()));
    if let Some(b) = super::bench::peak_rss_bytes() {
        // Both models and the oracle live in this process: the whole check's footprint.
        super::note(&format!(
            "xray: peak RSS {:.0} MB (getrusage ru_maxrss)",
            b as f64 / 1e6
        ));
    }
    if let Some(p) = &a.report {
        super::note(&format!("xray: report {}", p.display()));
    }
    outputs.finish()?;
    Ok(match ev.verdict {
        Verdict::Pass => ExitCode::SUCCESS,
        _ => super::exit_fail(),
    })
}

/// `reports/<model>.<audio>.evidence.json` (the `reports/` folder is created when writing).
fn default_evidence_path(a: &Args) -> PathBuf {
    let name = |p: Option<&std::ffi::OsStr>| {
        p.map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    PathBuf::from("reports").join(format!(
        "{}.{}.evidence.json",
        name(a.model.file_name()),
        name(a.audio.file_stem())
    ))
}
