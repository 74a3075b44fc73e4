//! `xray run --model DIR --audio WAV --out DIR`: the runtime's dump (docs/dump-format.md).

use std::path::PathBuf;
use std::process::ExitCode;

use xray_runtime::models::{self, RunOptions};

/// Arguments of `xray run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// HF model directory.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// WAV file (any common rate, mono or stereo: converted once to 16 kHz mono for both engines).
    #[arg(long, value_name = "WAV")]
    pub audio: PathBuf,
    /// Dump directory to write (atomically): new or empty, or an existing X-Ray dump with --force.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Replace an existing X-Ray dump at --out (only a directory holding nothing but a dump).
    #[arg(long)]
    pub force: bool,
    /// Only checkpoints matching these globs (re-tap a range to bisect a large model).
    #[arg(long, value_name = "GLOB")]
    pub only: Vec<String>,
    /// Keep per-checkpoint statistics and a content hash instead of tensors.
    #[arg(long)]
    pub stats_only: bool,
    /// Cap on generated tokens (at least 1).
    #[arg(long, value_name = "N", value_parser = super::positive)]
    pub max_steps: Option<usize>,
    /// Teacher-force these token ids (comma separated).
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub teacher: Vec<i64>,
    /// Plant a deliberate fault (see `xray faults`). Repeatable.
    #[arg(long, value_name = "FAULT")]
    pub inject: Vec<String>,
    /// Also capture every op-level point (`{hf_module}:in` / `:out`, docs/dump-format.md).
    #[arg(long)]
    pub ops: bool,
}

/// Runs the runtime and writes its dump.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // Everything that can be checked before the run: the output directory and --only.
    let mut outputs = super::Outputs::default();
    outputs.dump("out", &a.out, a.force).check()?;
    if !a.only.is_empty() {
        let family = models::detect_family(&a.model)?;
        let config = super::read_config(&a.model)?;
        let contract = super::contract_for(family, &a.model, &config)?;
        super::check_only(&a.only, &contract, false)?;
    }
    let model = models::load(&a.model)?;
    let (faults, _) = super::faults::plan(&a.inject, &a.model)?;
    faults.validate(model.graph())?;
    let opts = RunOptions {
        max_new_tokens: a.max_steps,
        teacher_tokens: (!a.teacher.is_empty()).then(|| a.teacher.clone()),
    };
    let points = if a.ops {
        xray_core::ops::PointSelect::All
    } else {
        xray_core::ops::PointSelect::None
    };
    if a.stats_only {
        // Streamed: each checkpoint is summarized as it is produced and dropped.
        let audio = xray_runtime::audio::load_wav(&a.audio, 16000)?;
        let mut rec = xray_core::capture::StatsRecorder::new(&a.only)
            .map_err(|e| anyhow::anyhow!("--only: {e}"))?;
        let out = model.run(
            &audio,
            &opts,
            &mut xray_runtime::models::RunHooks {
                observer: Some(&mut rec),
                substitute: None,
                faults: Some(&faults),
                points: Some(&points),
                profile: None,
            },
        )?;
        faults.confirm_fired()?;
        let manifest = xray_core::dump::Manifest {
            schema: xray_core::dump::SCHEMA.into(),
            version: xray_core::dump::VERSION,
            family: model.family().into(),
            model_id: a.model.display().to_string(),
            producer: "runtime".into(),
            weights_sha256: model.weights().sha256().into(),
            audio_sha256: audio.sha256.clone(),
            tools: [("runtime".to_string(), xray_runtime::version())]
                .into_iter()
                .collect(),
            tokens: out.tokens.clone(),
            transcript: out.transcript.clone(),
            stats_only: true,
            checkpoints: rec.entries,
            extra: [("config".to_string(), super::read_config(&a.model)?)]
                .into_iter()
                .collect(),
            engine_weights: None,
        };
        let w = xray_core::dump::DumpWriter::new(manifest);
        outputs.write_dump("out", &a.out, &w, a.force);
        outputs.finish()?;
        super::note(&format!(
            "xray: {} checkpoint summaries -> {}",
            w.manifest.checkpoints.len(),
            a.out.display()
        ));
        super::say(&format!("{}\n", out.transcript))?;
        return Ok(ExitCode::SUCCESS);
    }
    let only = (!a.only.is_empty()).then_some(a.only.as_slice());
    let (dump, out) = xray_harness::runs::runtime_dump(
        model.as_ref(),
        &a.audio,
        &opts,
        Some(&faults),
        None,
        xray_harness::runs::Capture {
            only,
            points: Some(&points),
        },
    )?;
    faults.confirm_fired()?;
    let mut w = dump.to_writer();
    w.manifest
        .extra
        .insert("config".into(), super::read_config(&a.model)?);
    outputs.write_dump("out", &a.out, &w, a.force);
    outputs.finish()?;
    super::note(&format!(
        "xray: {} checkpoints -> {}",
        w.manifest.checkpoints.len(),
        a.out.display()
    ));
    super::say(&format!("{}\n", out.transcript))?;
    Ok(ExitCode::SUCCESS)
}
