//! X-Ray's own runtime run into an in-memory dump: what `xray run` writes and `xray check`
//! compares (no Python here). [`runtime_side`] is a check's runtime stage: the runs with and
//! without capture, the free run for its transcript, isolated mode.

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
use xray_runtime::models::{Alignment, RunHooks, RunOptions, RunOutput, SpeechModel};

use crate::check::CheckOptions;

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

/// Run the runtime once with a recorder on audio already decoded and converted (the samples the
/// oracle is fed); returns the dump and the run output.
pub fn runtime_dump(
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

/// [`runtime_dump`] with stats-only capture: every checkpoint summarized as it is produced
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

/// The runtime stage of a check ([`crate::check::check_against`]): the runtime run against a
/// reference, and what its evidence reports of it.
pub struct RuntimeSide {
    /// The run with capture on, teacher-forced on the reference's tokens.
    pub dump: Dump,
    /// Its outputs are bit-identical with capture off.
    pub capture_neutral: bool,
    /// The runtime's own tokens (free-running when its teacher-forced choices departed).
    pub tokens: Vec<i64>,
    /// Its own transcript.
    pub transcript: String,
    /// The reference's tokens over the steps the runtime generated.
    pub reference_tokens: Vec<i64>,
    /// The isolated-mode run (reference substituted at every checkpoint edge), when asked for.
    pub isolated: Option<Dump>,
    /// The run options a re-run of the runtime (the drill-down) uses.
    pub run_opts: RunOptions,
}

/// The runtime's side of a check on `a` against the reference `reference` (the family's
/// `align`ment policy): an optional warm-up input first, the run with capture (its planted
/// faults must fire), again with capture off (neutrality), a free run for its transcript when its
/// greedy choices departed from the reference's, and the isolated-mode run.
pub fn runtime_side(
    model: &dyn SpeechModel,
    reference: &Dump,
    align: Alignment,
    opts: &CheckOptions,
    a: &Audio,
    progress: &dyn Fn(&str),
) -> anyhow::Result<RuntimeSide> {
    let ref_m = &reference.manifest;
    let generative = align == Alignment::ReferenceTokens;
    let teacher_force = opts.recorded.teacher_force || (opts.isolate && !generative);
    let mut run_opts = RunOptions {
        max_new_tokens: opts.recorded.max_steps,
        teacher_tokens: teacher_for(align, ref_m, teacher_force)?,
    };
    if let Some(w) = &opts.warmup_audio {
        warm_up(model, w, progress)?;
    }
    let (dump, out_on, capture_neutral) = capture_run(model, a, &run_opts, opts, progress)?;
    // The runtime's own transcript: free-running unless its teacher-forced choices already equal
    // the reference's (then the free run is the same computation).
    let prefix = ref_m.tokens.len().saturating_sub(out_on.predicted.len());
    let (tokens, transcript) = match align {
        Alignment::ReferenceTokens if ref_m.tokens.get(prefix..) != Some(&out_on.predicted[..]) => {
            progress("runtime departs from the reference tokens: free-running for its transcript");
            run_opts.teacher_tokens = None;
            let free = model.run(
                a,
                &run_opts,
                &mut RunHooks {
                    faults: Some(&opts.faults),
                    ..Default::default()
                },
            )?;
            (free.predicted.clone(), free.transcript)
        }
        _ => (out_on.predicted.clone(), out_on.transcript.clone()),
    };
    let reference_tokens = match align {
        Alignment::ReferenceTokens => ref_m.tokens[prefix..].to_vec(),
        _ => ref_m.tokens.clone(),
    };
    // Isolated mode: the runtime with the reference's tensor substituted at every checkpoint
    // edge, teacher-forced, so each checkpoint's error is its own.
    let isolated = if opts.isolate {
        progress("isolated mode: reference substituted at every checkpoint edge");
        let sub = DumpSubstitute(reference);
        let ro = RunOptions {
            max_new_tokens: opts.recorded.max_steps,
            teacher_tokens: teacher_for(align, ref_m, true)?,
        };
        let capture = Capture::default();
        Some(runtime_dump(model, a, &ro, Some(&opts.faults), Some(&sub), capture)?.0)
    } else {
        None
    };
    Ok(RuntimeSide {
        dump,
        capture_neutral,
        tokens,
        transcript,
        reference_tokens,
        isolated,
        run_opts,
    })
}

/// Teacher tokens for the runtime from the reference run, by the family's alignment policy. A
/// policy naming reference ids the run does not carry is an error, never a free run.
fn teacher_for(
    align: Alignment,
    reference: &Manifest,
    teacher_force: bool,
) -> anyhow::Result<Option<Vec<i64>>> {
    match align {
        Alignment::ReferenceTokens => Ok(Some(reference.tokens.clone())),
        Alignment::OnRequest { extra_key } if teacher_force => reference
            .extra
            .get(extra_key)
            .and_then(|v| serde_json::from_value::<Vec<i64>>(v.clone()).ok())
            .map(Some)
            .ok_or_else(|| {
                anyhow!("teacher forcing needs the reference's '{extra_key}' ids, which its run does not carry")
            }),
        Alignment::OnRequest { .. } => Ok(None),
    }
}

/// A second input run first, clean: stale-cache bugs show only when a second input reuses state
/// from the first (a correct model served input A, then B arrives).
fn warm_up(model: &dyn SpeechModel, w: &Path, progress: &dyn Fn(&str)) -> anyhow::Result<()> {
    progress(&format!("warm-up input {}", w.display()));
    model.run(
        &load_wav(w, 16000)?,
        &RunOptions {
            max_new_tokens: Some(2),
            teacher_tokens: None,
        },
        &mut RunHooks::default(),
    )?;
    Ok(())
}

/// The runtime with capture (stats-only or full, every op-level point with `--ops`), faulted;
/// the faults must have fired. Then again with capture off: whether its outputs are the same,
/// bit for bit.
fn capture_run(
    model: &dyn SpeechModel,
    a: &Audio,
    run_opts: &RunOptions,
    opts: &CheckOptions,
    progress: &dyn Fn(&str),
) -> anyhow::Result<(Dump, RunOutput, bool)> {
    opts.faults.reset_hits();
    let all_points = PointSelect::All;
    let capture = Capture {
        only: None,
        points: opts.recorded.ops.then_some(&all_points),
    };
    progress(if opts.stats_only {
        "running the runtime with stats-only capture (teacher-forced on the reference tokens)"
    } else {
        "running the runtime with capture (teacher-forced on the reference tokens)"
    });
    let (dump, out_on) = if opts.stats_only {
        runtime_stats_dump_audio(model, a, run_opts, Some(&opts.faults))?
    } else {
        runtime_dump(model, a, run_opts, Some(&opts.faults), None, capture)?
    };
    // The evidence says these faults were planted: they must have changed something.
    opts.faults.confirm_fired()?;
    progress("running the runtime with capture off (neutrality)");
    let out_off = model.run(
        a,
        run_opts,
        &mut RunHooks {
            faults: Some(&opts.faults),
            ..Default::default()
        },
    )?;
    let neutral = bits_equal(&out_on.outputs, &out_off.outputs);
    Ok((dump, out_on, neutral))
}

fn bits_equal(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.shape() == y.shape()
                && x.iter()
                    .zip(y.iter())
                    .all(|(p, q)| p.to_bits() == q.to_bits())
        })
}
