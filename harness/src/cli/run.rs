//! `xray run --model DIR --audio WAV --out DIR`: the runtime's dump (docs/dump-format.md).

use std::process::ExitCode;

use xray_runtime::models::{self, RunOptions};

/// Arguments of `xray run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub dump: super::ClipDump,
    /// Only checkpoints matching these globs (re-tap a range to bisect a large model).
    #[arg(long, value_name = "GLOB")]
    pub only: Vec<String>,
    /// Keep per-checkpoint statistics and a content hash instead of tensors.
    #[arg(long)]
    pub stats_only: bool,
    #[command(flatten)]
    pub steps: super::MaxSteps,
    /// Teacher-force these token ids (comma separated).
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub teacher: Vec<i64>,
    /// Plant a deliberate fault (see `xray faults`). Repeatable.
    #[arg(long, value_name = "FAULT")]
    pub inject: Vec<String>,
}

/// Runs the runtime and writes its dump.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    // Everything that can be checked before the run: the output directory and --only.
    let mut outputs = super::Outputs::default();
    outputs.dump("out", &a.dump.out, a.dump.force).check()?;
    if !a.only.is_empty() {
        let family = models::detect_family(&a.dump.clip.model)?;
        let config = super::read_config(&a.dump.clip.model)?;
        let contract = super::contract_for(family, &a.dump.clip.model, &config)?;
        super::check_only(&a.only, &contract, false)?;
    }
    let model = models::load(&a.dump.clip.model)?;
    let (faults, _) = super::faults::plan(&a.inject, &a.dump.clip.model)?;
    faults.validate(model.graph())?;
    let opts = RunOptions {
        max_new_tokens: a.steps.max_steps,
        teacher_tokens: (!a.teacher.is_empty()).then(|| a.teacher.clone()),
    };
    let points = if a.dump.ops {
        xray_core::ops::PointSelect::All
    } else {
        xray_core::ops::PointSelect::None
    };
    let audio = xray_runtime::audio::load_wav(&a.dump.clip.audio, 16000)?;
    if a.stats_only {
        // Streamed: each checkpoint is summarized as it is produced and dropped.
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
            model_id: a.dump.clip.model.display().to_string(),
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
            extra: [(
                "config".to_string(),
                super::read_config(&a.dump.clip.model)?,
            )]
            .into_iter()
            .collect(),
            engine_weights: None,
        };
        let w = xray_core::dump::DumpWriter::new(manifest);
        return a
            .dump
            .write(outputs, &w, "checkpoint summaries", &out.transcript);
    }
    let only = (!a.only.is_empty()).then_some(a.only.as_slice());
    let (dump, out) = xray_harness::runs::runtime_dump(
        model.as_ref(),
        &audio,
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
        .insert("config".into(), super::read_config(&a.dump.clip.model)?);
    a.dump.write(outputs, &w, "checkpoints", &out.transcript)
}
