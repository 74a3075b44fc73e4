//! `xray oracle --model DIR --audio WAV --out DIR`: the HF reference's dump.

use std::process::ExitCode;

use xray_oracle::{Oracle, OracleRequest};

/// Arguments of `xray oracle`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub dump: super::ClipDump,
    /// `float32` (the reference) or `float64` (noise-floor calibration).
    #[arg(long, default_value = "float32", value_parser = ["float32", "float64"])]
    pub dtype: String,
    #[command(flatten)]
    pub steps: super::MaxSteps,
    /// Only checkpoints matching these names.
    #[arg(long, value_name = "NAME")]
    pub only: Vec<String>,
    /// torch threads (default 1).
    #[arg(long, value_parser = super::positive)]
    pub threads: Option<usize>,
    /// A reference variant: the HF model with its weights on a named grid (`int8`: per-row
    /// symmetric int8 of every Linear and the token embedding, as CTranslate2 quantizes;
    /// `int8_conv`: also the convolutions; `int8_w8a8`: also each Linear's input per row; `f16`,
    /// `bf16`), for `xray compare --variant` (docs/bring-your-own-engine.md).
    #[arg(long, value_name = "SCHEME", value_parser = ["int8", "int8_conv", "int8_w8a8", "f16", "bf16"])]
    pub weights_variant: Option<String>,
}

/// Runs the reference and writes its dump.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let family = xray_runtime::models::detect_family(&a.dump.clip.model)?;
    let config = super::read_config(&a.dump.clip.model)?;
    let contract = super::contract_for(family, &a.dump.clip.model, &config)?;
    // Checked before the reference runs: the output directory and --only.
    let mut outputs = super::Outputs::default();
    outputs.dump("out", &a.dump.out, a.dump.force).check()?;
    super::check_only(&a.only, &contract, true)?;
    // Decoded and converted once by the runtime's reader (refused here, before Python starts,
    // if the runtime would refuse it); the reference is fed these samples.
    let audio = xray_runtime::audio::load_wav(&a.dump.clip.audio, 16000)?;
    let oracle = Oracle::discover()?;
    let mut req = OracleRequest::new(&a.dump.clip.model, &a.dump.clip.audio, &contract)
        .with_samples(&audio.samples, &audio.sha256, audio.conversion.to_json());
    req.dtype = a.dtype.clone();
    req.max_new_tokens = a.steps.max_steps;
    req.only = (!a.only.is_empty()).then(|| a.only.clone());
    req.threads = Some(a.threads.unwrap_or(1));
    if a.dump.ops {
        req = req.with_ops(xray_core::ops::PointSelect::All);
    }
    if a.weights_variant.is_some() && a.dtype != "float32" {
        return Err(anyhow::anyhow!(
            "--weights-variant is a float32 reference; drop --dtype {}",
            a.dtype
        ));
    }
    req.weights_variant = a.weights_variant.clone();
    let run = oracle.run(&req)?;
    let mut w = run.to_dump(family, &a.dump.clip.model.display().to_string());
    w.manifest.extra.insert("config".into(), config);
    // The logits processors' lists (`suppress_tokens`, ...), so `xray compare` can name and
    // honour an engine's processed logits without the model directory.
    let gp = a.dump.clip.model.join("generation_config.json");
    if let Ok(text) = std::fs::read_to_string(&gp) {
        let g: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", gp.display()))?;
        w.manifest.extra.insert("generation_config".into(), g);
    }
    w.manifest
        .extra
        .insert("dtype".into(), serde_json::json!(a.dtype));
    a.dump.write(outputs, &w, "checkpoints", &run.transcript)
}
