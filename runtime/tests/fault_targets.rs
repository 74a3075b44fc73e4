//! `--inject FAULT@TARGET` never plants nothing silently: a target that matches no op or edge, an
//! empty target, or a target of the wrong op kind is refused before the run, naming the target
//! and the nearest names that would work; a fault that never fires during the run is an error.

mod whisper_support;

use xray_runtime::audio::load_wav;
use xray_runtime::faults::{catalogue, plant, FaultKind, FaultPlan};
use xray_runtime::models::{self, RunHooks, RunOptions};

fn plan_of(spec: &str, family: &str, config: &serde_json::Value) -> FaultPlan {
    FaultPlan {
        planted: vec![plant(spec, family, config).expect("catalogue fault")],
    }
}

/// whisper-rand-a loaded, its config.json and fox.wav, when the fixtures are there.
fn rand_a_on_fox() -> Option<(
    Box<dyn models::SpeechModel>,
    serde_json::Value,
    xray_runtime::audio::Audio,
)> {
    let dir = whisper_support::fixture("fixtures/build/whisper-rand-a")?;
    let wav = whisper_support::fixture("fixtures/audio/fox.wav")?;
    let model = models::load(&dir).expect("load");
    Some((model, config(&dir), load_wav(&wav, 16000).expect("wav")))
}

fn config(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
        .expect("config json")
}

/// Every catalogue fault of both families: the default target validates; a target that matches
/// nothing and an empty target are refused with the target named and a suggestion.
#[test]
fn every_fault_refuses_a_target_that_matches_nothing() {
    for (dir, family) in [
        ("fixtures/build/whisper-rand-a", "whisper"),
        ("fixtures/build/granite-nar-tiny", "granite_nar"),
    ] {
        let Some(dir) = whisper_support::fixture(dir) else {
            return;
        };
        let model = models::load(&dir).expect("load");
        let cfg = config(&dir);
        let mut n = 0;
        for e in catalogue().into_iter().filter(|e| e.family == family) {
            n += 1;
            plan_of(e.name, family, &cfg)
                .validate(model.graph())
                .unwrap_or_else(|err| panic!("{}: default target refused: {err}", e.name));
            let host = matches!(e.kind(&cfg).expect("kind"), FaultKind::Host(_));
            for target in ["no.such.layer.9", ""] {
                if host && target.is_empty() {
                    continue; // a host fault's target is empty by definition
                }
                let spec = format!("{}@{target}", e.name);
                let err = plan_of(&spec, family, &cfg)
                    .validate(model.graph())
                    .expect_err(&spec)
                    .to_string();
                assert!(err.contains(&spec), "{spec}: {err}");
                if !host {
                    assert!(err.contains("nearest"), "{spec}: {err}");
                }
            }
        }
        assert!(n >= 7, "{family}: only {n} catalogue faults");
    }
}

/// A target that names a real op of the wrong kind (a LayerNorm epsilon fault on an attention op)
/// and an output fault that cannot change the edge it names are refused.
#[test]
fn wrong_op_kind_is_refused() {
    let Some(dir) = whisper_support::fixture("fixtures/build/whisper-rand-a") else {
        return;
    };
    let model = models::load(&dir).expect("load");
    let cfg = config(&dir);
    // The one-line refusal of planting `spec` (`why` names the case if it is accepted).
    let refusal = |spec: &str, why: &str| {
        plan_of(spec, "whisper", &cfg)
            .validate(model.graph())
            .expect_err(why)
            .to_string()
    };
    let cases: [(&str, &str, &[&str]); 5] = [
        (
            "layernorm_eps@decoder.layer.0.self_attn",
            "wrong op kind",
            &["wrong op kind", "nearest ops that do"],
        ),
        // A head-major leak on a token-major edge changes nothing.
        (
            "cross_k_token_major@audio.decoder.layer.1.out",
            "layout leak on a token-major edge",
            &["head_major"],
        ),
        // A replacement kernel needs an op of its kind; a weight rewiring an op with that role.
        (
            "gelu_tanh@encoder.layer.1.fc1",
            "tanh gelu on a linear",
            &["none has a 'gelu' kernel", "encoder.layer.1.gelu"],
        ),
        (
            "cross_k_wrong_layer@decoder.layer.1.cross_attn",
            "weight rewiring of a weightless op",
            &["none has a weight role 'weight'"],
        ),
        // A host fault takes no target.
        (
            "stale_cross_cache@decoder.layer.0",
            "host fault with a target",
            &["takes no target"],
        ),
    ];
    for (spec, why, says) in cases {
        whisper_support::assert_says(&refusal(spec, why), says);
    }
}

/// A valid target whose step is never reached fires nothing: confirmed as an error after the run,
/// while the same fault at a reached step fires.
#[test]
fn a_fault_that_never_fires_is_an_error() {
    let Some((model, cfg, audio)) = rand_a_on_fox() else {
        return;
    };
    // nan_one is planted at step 2; a run capped at one new token never gets there.
    let plan = plan_of("nan_one", "whisper", &cfg);
    plan.validate(model.graph()).expect("valid target");
    let run = |max: usize| {
        plan.reset_hits();
        model
            .run(
                &audio,
                &RunOptions::capped(max),
                &mut RunHooks {
                    faults: Some(&plan),
                    ..Default::default()
                },
            )
            .expect("run");
        plan.confirm_fired()
    };
    let err = run(1).expect_err("step 2 never reached").to_string();
    assert!(
        err.contains("never fired") && err.contains("nan_one"),
        "{err}"
    );
    run(4).expect("step 2 reached: the fault fired");
}

/// The new whisper faults change what they claim, on the real graph: the wiring fault makes layer
/// 1's cross K exactly layer 0's (the executor reads the redirected key, f16 mirror included), the
/// decode temperature leaves step 0 bit-identical and changes layer 1's probabilities at step 1
/// only (layer 0 untouched), the mel floor raises the log-mel minimum to `max - 7/4`.
#[test]
fn new_whisper_faults_change_what_they_claim() {
    let Some((model, cfg, audio)) = rand_a_on_fox() else {
        return;
    };
    let record = |plan: Option<&FaultPlan>| {
        let mut rec = xray_runtime::capture::Recorder::new();
        model
            .run(
                &audio,
                &RunOptions::capped(2),
                &mut RunHooks {
                    observer: Some(&mut rec),
                    faults: plan,
                    ..Default::default()
                },
            )
            .expect("run");
        if let Some(p) = plan {
            p.confirm_fired().expect("fired");
        }
        move |name: &str, step: usize| -> Vec<u32> {
            rec.captured
                .iter()
                .find(|c| c.name == name && c.step == step)
                .unwrap_or_else(|| panic!("{name}@{step} not captured"))
                .data
                .iter()
                .map(|v| v.to_bits())
                .collect()
        }
    };
    let clean = record(None);
    let (k0, k1) = (
        "audio.decoder.layer.0.cross_k",
        "audio.decoder.layer.1.cross_k",
    );
    assert_ne!(clean(k0, 0), clean(k1, 0));
    let wired = record(Some(&plan_of("cross_k_wrong_layer", "whisper", &cfg)));
    assert_eq!(
        wired(k1, 0),
        clean(k0, 0),
        "layer 1 reads layer 0's K weight"
    );
    assert_eq!(wired(k0, 0), clean(k0, 0));

    let hot = record(Some(&plan_of("decode_temperature", "whisper", &cfg)));
    let (p0, p1) = (
        "audio.decoder.layer.0.self_attention.probs",
        "audio.decoder.layer.1.self_attention.probs",
    );
    assert_eq!(hot(p1, 0), clean(p1, 0), "step 0 untouched");
    assert_eq!(hot(p0, 1), clean(p0, 1), "layer 0 untouched at step 1");
    assert_ne!(hot(p1, 1), clean(p1, 1), "layer 1 scaled at step 1");

    let floored = record(Some(&plan_of("mel_clamp_floor", "whisper", &cfg)));
    let mel = |bits: Vec<u32>| -> Vec<f32> { bits.into_iter().map(f32::from_bits).collect() };
    let (c, f) = (
        mel(clean("audio.frontend.mel", 0)),
        mel(floored("audio.frontend.mel", 0)),
    );
    let max = c.iter().fold(f32::MIN, |a, &v| a.max(v));
    let floor = max - 1.75;
    assert!(
        c.iter().any(|&v| v < floor),
        "the clean mel reaches below the new floor"
    );
    for (&x, &y) in c.iter().zip(&f) {
        assert_eq!(y, x.max(floor));
    }
}
