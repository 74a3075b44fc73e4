//! X-Ray's own runtime run into an in-memory dump: what `xray run` writes and `xray check`
//! compares (no Python here).

use std::collections::BTreeMap;
use std::path::Path;
use xray_core::Step;

use anyhow::anyhow;
use xray_core::capture::{Recorder, StatsRecorder, Substitute};
use xray_core::dump::{Dump, Manifest};
use xray_core::ops::PointSelect;
use xray_core::Tensor;
use xray_runtime::audio::{load_wav, Audio};
use xray_runtime::faults::FaultPlan;
use xray_runtime::models::{RunHooks, RunOptions, RunOutput, SpeechModel};

/// Substitutes reference tensors from a dump (isolated mode).
pub struct DumpSubstitute<'a>(pub &'a Dump);

impl Substitute for DumpSubstitute<'_> {
    fn substitute(&self, name: &str, step: Step) -> Option<Tensor> {
        self.0.get(name, step).cloned()
    }
}

pub(crate) fn manifest_for(
    model: &dyn SpeechModel,
    producer: &str,
    weights: &str,
    audio: &str,
) -> Manifest {
    Manifest {
        schema: xray_core::dump::SCHEMA.into(),
        version: xray_core::dump::VERSION,
        family: model.family().into(),
        model_id: model.model_dir().display().to_string(),
        producer: producer.into(),
        weights_sha256: weights.into(),
        audio_sha256: audio.into(),
        tools: BTreeMap::from([("runtime".to_string(), xray_runtime::version())]),
        tokens: vec![],
        transcript: String::new(),
        stats_only: false,
        checkpoints: vec![],
        extra: BTreeMap::new(),
        engine_weights: None,
    }
}

/// What a runtime run captures: every checkpoint (default) or those matching `only`'s globs, and
/// the op-level points `points` selects (none by default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Capture<'a> {
    /// Only names matching these globs (checkpoints and points alike).
    pub only: Option<&'a [String]>,
    /// Op-level points to capture.
    pub points: Option<&'a PointSelect>,
}

/// Run the runtime once with a recorder; returns the dump and the run output.
pub fn runtime_dump(
    model: &dyn SpeechModel,
    audio: &Path,
    opts: &RunOptions,
    faults: Option<&FaultPlan>,
    substitute: Option<&dyn Substitute>,
    capture: Capture<'_>,
) -> anyhow::Result<(Dump, RunOutput)> {
    let a = load_wav(audio, 16000)?;
    runtime_dump_audio(model, &a, opts, faults, substitute, capture)
}

/// [`runtime_dump`] on audio already decoded and converted (the samples the oracle is fed).
pub fn runtime_dump_audio(
    model: &dyn SpeechModel,
    a: &Audio,
    opts: &RunOptions,
    faults: Option<&FaultPlan>,
    substitute: Option<&dyn Substitute>,
    capture: Capture<'_>,
) -> anyhow::Result<(Dump, RunOutput)> {
    let mut rec = match capture.only {
        Some(g) => Recorder::only(g).map_err(|e| anyhow!("--only: {e}"))?,
        None => Recorder::new(),
    };
    let out = {
        let mut hooks = RunHooks {
            observer: Some(&mut rec),
            substitute,
            faults,
            points: capture.points,
            profile: None,
        };
        model.run(a, opts, &mut hooks)?
    };
    let m = run_manifest(model, a, &out);
    Ok((Dump::from_captured(m, rec.captured), out))
}

/// The runtime dump's manifest for one run on `a`: tokens, transcript, the run's extras and the
/// audio conversion.
fn run_manifest(model: &dyn SpeechModel, a: &Audio, out: &RunOutput) -> Manifest {
    let mut m = manifest_for(model, "runtime", model.weights().sha256(), &a.sha256);
    m.tokens = out.tokens.clone();
    m.transcript = out.transcript.clone();
    m.extra = out.extra.clone();
    m.extra.insert("audio".into(), a.conversion.to_json());
    m
}

/// [`runtime_dump_audio`] with stats-only capture: every checkpoint summarized as it is produced
/// ([`StatsRecorder`]) and dropped, so the dump (`stats_only`) holds no tensor.
pub fn runtime_stats_dump_audio(
    model: &dyn SpeechModel,
    a: &Audio,
    opts: &RunOptions,
    faults: Option<&FaultPlan>,
) -> anyhow::Result<(Dump, RunOutput)> {
    let mut rec = StatsRecorder::new(&[]).map_err(|e| anyhow!("stats recorder: {e}"))?;
    let out = {
        let mut hooks = RunHooks {
            observer: Some(&mut rec),
            substitute: None,
            faults,
            points: None,
            profile: None,
        };
        model.run(a, opts, &mut hooks)?
    };
    let mut m = run_manifest(model, a, &out);
    m.stats_only = true;
    m.checkpoints = rec.entries;
    Ok((Dump::stats_only(m), out))
}
