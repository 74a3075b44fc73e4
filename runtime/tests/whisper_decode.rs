//! Formulas on one graph: capture neutrality, full window == incremental decode bit for bit,
//! teacher forcing, the cross-attention cache's invalidation (and the stale-cache fault flag).

mod whisper_support;

use std::collections::BTreeSet;

use whisper_support::fixture;
use xray_runtime::audio::{load_wav, Audio};
use xray_runtime::capture::Recorder;
use xray_runtime::faults::{FaultKind, FaultPlan, Planted};
use xray_runtime::graph::{RunCtx, Tensor};
use xray_runtime::models::whisper::{DecoderSession, WhisperModel};
use xray_runtime::models::{RunHooks, RunOptions, RunOutput, SpeechModel};
use xray_runtime::RuntimeError;

fn model(rel: &str) -> Option<WhisperModel> {
    let dir = fixture(rel)?;
    Some(WhisperModel::load(&dir).expect("load"))
}

fn clip(name: &str) -> Option<Audio> {
    let p = fixture(format!("fixtures/audio/{name}"))?;
    Some(load_wav(&p, 16000).expect("wav"))
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.iter().map(|v| v.to_bits()).collect()
}

/// A run with default options and no hooks.
fn run(m: &WhisperModel, a: &Audio) -> RunOutput {
    run_with(m, a, RunOptions::default()).expect("run")
}

/// A run with default options, every checkpoint recorded, and `faults` planted if any.
fn run_recorded(m: &WhisperModel, a: &Audio, faults: Option<&FaultPlan>) -> (RunOutput, Recorder) {
    let mut rec = Recorder::new();
    let hooks = &mut RunHooks {
        observer: Some(&mut rec),
        faults,
        ..Default::default()
    };
    let out = m.run(a, &RunOptions::default(), hooks).expect("run");
    (out, rec)
}

/// The host fault `stale_cross_cache` (the cross cache survives new encoder memory).
fn stale_cross_cache() -> FaultPlan {
    FaultPlan {
        planted: vec![Planted {
            name: "stale_cross_cache".into(),
            kind: FaultKind::Host("stale_cross_cache".into()),
            target: "*".into(),
            step: None,
            hits: Default::default(),
        }],
    }
}

/// The bits of a session's cross-attention K cache, per layer.
fn cross_k_bits(s: &DecoderSession) -> Vec<Vec<u32>> {
    s.cross_cache().iter().map(|(k, _)| bits(k)).collect()
}

/// A run with these options and no hooks.
fn run_with(m: &WhisperModel, a: &Audio, opts: RunOptions) -> Result<RunOutput, RuntimeError> {
    m.run(a, &opts, &mut RunHooks::default())
}

#[test]
fn capture_is_neutral() {
    let (Some(m), Some(a)) = (model("fixtures/build/whisper-rand-a"), clip("fox.wav")) else {
        return;
    };
    let off = run(&m, &a);
    let (on, rec) = run_recorded(&m, &a, None);
    assert_eq!(off.tokens, on.tokens);
    assert_eq!(off.outputs.len(), on.outputs.len());
    for (x, y) in off.outputs.iter().zip(&on.outputs) {
        assert_eq!(bits(x), bits(y), "logits differ with capture on");
    }
    // Every contract checkpoint at the steps the contract says, once each.
    let steps = on.outputs.len();
    let got: BTreeSet<(String, usize)> = rec
        .captured
        .iter()
        .map(|c| (c.name.clone(), c.step))
        .collect();
    assert_eq!(
        got.len(),
        rec.captured.len(),
        "a checkpoint was captured twice at one step"
    );
    for c in &m.contract().checkpoints {
        let want: Vec<usize> = match c.steps {
            xray_runtime::contract::Steps::Every => (0..steps).collect(),
            _ => vec![0],
        };
        for s in 0..steps {
            assert_eq!(
                got.contains(&(c.name.clone(), s)),
                want.contains(&s),
                "{}@step{s}",
                c.name
            );
        }
    }
    // The captured logits are the outputs.
    let l1 = rec
        .captured
        .iter()
        .find(|c| c.name == "audio.decoder.logits" && c.step == 1)
        .unwrap();
    assert_eq!(bits(&l1.data), bits(&on.outputs[1]));
    assert_eq!(
        on.outputs[0].shape(),
        [2, 51864],
        "step 0 logits cover the whole forced prefix"
    );
    assert_eq!(on.outputs[1].shape(), [1, 51864]);
}

/// The last-position logits of each step of an incremental run equal the rows of one
/// full-window run over the same tokens, bit for bit.
fn full_window_equals_incremental(rel: &str, wav: &str) {
    let (Some(m), Some(a)) = (model(rel), clip(wav)) else {
        return;
    };
    let out = run(&m, &a);
    assert!(
        out.outputs.len() >= 3,
        "need a few decode steps, got {}",
        out.outputs.len()
    );
    let memory = m.encode(&a.samples, &mut RunCtx::default()).unwrap();
    let fed = &out.tokens[..out.tokens.len() - 1];
    let full = m.full_window(&memory, fed, &mut RunCtx::default()).unwrap();
    let prefix = m.plan().prefix.len();
    assert_eq!(full.shape(), [fed.len(), m.config().vocab_size]);
    let step0 = &out.outputs[0];
    for r in 0..prefix {
        assert_eq!(
            bits(&step0.row(r)),
            bits(&full.row(r)),
            "{rel}: prefix row {r}"
        );
    }
    for (k, step) in out.outputs.iter().enumerate().skip(1) {
        let row = prefix + k - 1;
        assert_eq!(
            bits(&step.row(0)),
            bits(&full.row(row)),
            "{rel}: decode step {k} vs full-window row {row}"
        );
    }
}

trait Row {
    fn row(&self, r: usize) -> Tensor;
}
impl Row for Tensor {
    fn row(&self, r: usize) -> Tensor {
        self.index_axis(ndarray::Axis(0), r).to_owned()
    }
}

#[test]
fn full_window_equals_incremental_rand_a() {
    full_window_equals_incremental("fixtures/build/whisper-rand-a", "fox.wav");
}

#[test]
fn full_window_equals_incremental_rand_b_128_mels() {
    full_window_equals_incremental("fixtures/build/whisper-rand-b", "stella.wav");
}

#[test]
fn full_window_equals_incremental_tiny_en() {
    full_window_equals_incremental("fixtures/whisper-tiny-en", "fox.wav");
}

/// Logits of every step and the tokens of a greedy run.
fn run_bits(m: &WhisperModel, a: &Audio) -> (Vec<i64>, Vec<Vec<u32>>) {
    let out = run(m, a);
    (out.tokens, out.outputs.iter().map(bits).collect())
}

/// whisper-rand-a with two clips, fox and stella (`None` when the fixtures are missing).
fn rand_a_fox_stella() -> Option<(WhisperModel, Audio, Audio)> {
    Some((
        model("fixtures/build/whisper-rand-a")?,
        clip("fox.wav")?,
        clip("stella.wav")?,
    ))
}

/// Two copies of a model and the fox clip (`None` when the fixtures are missing).
fn two_copies(rel: &str) -> Option<(WhisperModel, WhisperModel, Audio)> {
    Some((model(rel)?, model(rel)?, clip("fox.wav")?))
}

/// How many of `m`'s row-stable projection weights would get an f16 mirror, of how many.
fn mirrorable(m: &WhisperModel) -> (usize, usize) {
    let mut probe = m.weights().clone();
    m.graph().mirror_f16_weights(&mut probe)
}

/// Exact f16 mirrors of the decoder projections change no bit: tiny.en (every weight is exact
/// f16, so the loader mirrors all 33 row-stable projections, the tied logits one included) run
/// with and without its mirrors.
#[test]
fn f16_mirrors_change_no_bit_tiny_en() {
    let Some((m, plain, a)) = two_copies("fixtures/whisper-tiny-en") else {
        return;
    };
    assert_eq!(mirrorable(&m), (33, 33));
    assert!(m
        .weights()
        .f16("model.decoder.embed_tokens.weight")
        .is_some());
    let plain = plain
        .with_weights(m.weights().clone().without_f16_mirrors())
        .unwrap();
    assert!(plain
        .weights()
        .f16("model.decoder.embed_tokens.weight")
        .is_none());
    assert_eq!(run_bits(&m, &a), run_bits(&plain, &a));
}

/// The same on a random model whose decoder weights are first rounded to f16 (random f32
/// weights get no mirror), so a mirrored and an unmirrored copy of one rounded table run.
#[test]
fn f16_mirrors_change_no_bit_rand_a() {
    let Some((m, m2, a)) = two_copies("fixtures/build/whisper-rand-a") else {
        return;
    };
    assert_eq!(mirrorable(&m).0, 0);
    let mut rounded = m.weights().clone();
    let keys: Vec<String> = rounded.keys().map(str::to_string).collect();
    for k in keys {
        let t = rounded
            .get(&k)
            .unwrap()
            .mapv(|v| half::f16::from_f32(v).to_f32());
        rounded.insert(&k, t);
    }
    let mut mirrored = rounded.clone();
    let (n, candidates) = m.graph().mirror_f16_weights(&mut mirrored);
    assert_eq!(n, candidates);
    assert!(n > 0);
    let with = m.with_weights(mirrored).unwrap();
    let without = m2.with_weights(rounded).unwrap();
    assert_eq!(run_bits(&with, &a), run_bits(&without, &a));
}

#[test]
fn teacher_forcing_feeds_the_teacher_and_predicts_its_own() {
    let (Some(m), Some(a)) = (model("fixtures/build/whisper-rand-a"), clip("weather.wav")) else {
        return;
    };
    let free = run(&m, &a);
    let prefix = m.plan().prefix.len();
    assert_eq!(&free.predicted[..], &free.tokens[prefix..]);
    // Forcing the free-running sequence reproduces it bit for bit.
    let teach = |tokens: Vec<i64>| RunOptions {
        teacher_tokens: Some(tokens),
        ..Default::default()
    };
    let forced = run_with(&m, &a, teach(free.tokens.clone())).unwrap();
    assert_eq!(forced.tokens, free.tokens);
    assert_eq!(forced.predicted, free.predicted);
    for (x, y) in forced.outputs.iter().zip(&free.outputs) {
        assert_eq!(bits(x), bits(y));
    }
    // Another sequence: tokens are the teacher's, predicted is the runtime's argmax per step.
    let mut teacher = m.plan().prefix.clone();
    teacher.extend([464, 2068, 7586, 21831, 50256]);
    let forced = run_with(&m, &a, teach(teacher.clone())).unwrap();
    assert_eq!(forced.tokens, teacher);
    assert_eq!(forced.predicted.len(), teacher.len() - prefix);
    assert_eq!(forced.outputs.len(), teacher.len() - prefix);
    assert_eq!(
        forced.predicted[0], free.predicted[0],
        "step 0 sees only the prefix"
    );
    // A teacher without this model's prefix is refused.
    assert!(run_with(&m, &a, teach(vec![1, 2, 3]))
        .unwrap_err()
        .to_string()
        .contains("forced prefix"));
    // max_new_tokens caps the free run.
    let opts = RunOptions {
        max_new_tokens: Some(3),
        ..Default::default()
    };
    let capped = run_with(&m, &a, opts).unwrap();
    assert!(capped.predicted.len() <= 3 && capped.tokens.len() <= prefix + 3);
}

#[test]
fn new_memory_invalidates_the_cross_cache() {
    let Some((m, a, b)) = rand_a_fox_stella() else {
        return;
    };
    let mut ctx = RunCtx::default();
    let mem_a = m.encode(&a.samples, &mut ctx).unwrap();
    let mem_b = m.encode(&b.samples, &mut ctx).unwrap();
    let prefix = m.plan().prefix.clone();
    let mut s = m.new_session();
    // No prefill yet: the cross cache is not valid.
    s.install_memory(mem_a.clone(), None);
    assert!(matches!(
        m.decode_step(&mut s, 383, &mut ctx),
        Err(RuntimeError::StaleCache(_))
    ));
    m.prefill(&mut s, &prefix, &mut ctx).unwrap();
    let cross_a = cross_k_bits(&s);
    m.decode_step(&mut s, 383, &mut ctx).unwrap();
    // New memory: decode refuses until prefill re-projects.
    s.install_memory(mem_b.clone(), None);
    let e = m.decode_step(&mut s, 383, &mut ctx).unwrap_err();
    assert!(
        matches!(e, RuntimeError::StaleCache(_)) && e.to_string().contains("prefill"),
        "{e}"
    );
    m.prefill(&mut s, &prefix, &mut ctx).unwrap();
    let cross_b = cross_k_bits(&s);
    assert_ne!(cross_a, cross_b);
    let mut fresh = m.new_session();
    fresh.install_memory(mem_b.clone(), None);
    m.prefill(&mut fresh, &prefix, &mut ctx).unwrap();
    assert_eq!(cross_b, cross_k_bits(&fresh));

    // The stale_cross_cache fault skips the invalidation: prefill computes (and its step-0
    // attention uses) the new projections, but the cache keeps the previous input's, which the
    // decode steps then read.
    let plan = stale_cross_cache();
    s.install_memory(mem_a.clone(), Some(&plan));
    assert!(s.cross_valid());
    m.prefill(&mut s, &prefix, &mut ctx).unwrap();
    assert_eq!(cross_b, cross_k_bits(&s), "stale cache kept");
}

#[test]
fn stale_cross_cache_fault_through_run() {
    let Some((m, a, b)) = rand_a_fox_stella() else {
        return;
    };
    let clean_b = run(&m, &b);
    let _ = run(&m, &a);
    let plan = stale_cross_cache();
    let (stale_b, rec) = run_recorded(&m, &b, Some(&plan));
    let (_, rec_clean) = run_recorded(&m, &b, None);
    let get = |r: &Recorder, name: &str, step: usize| {
        r.captured
            .iter()
            .find(|c| c.name == name && c.step == step)
            .map(|c| bits(&c.data))
            .expect("captured")
    };
    // Step 0 is clean (prefill projects the new memory and attends over it) ...
    for name in [
        "audio.decoder.layer.0.cross_k",
        "audio.decoder.layer.0.cross_attention.output",
        "audio.decoder.logits",
    ] {
        assert_eq!(get(&rec, name, 0), get(&rec_clean, name, 0), "{name}@step0");
    }
    assert_eq!(bits(&stale_b.outputs[0]), bits(&clean_b.outputs[0]));
    // ... the first decode step reads the previous input's cache: the cross-attention context of
    // layer 0 at step 1 is where it first shows (the catalogue's expected origin).
    assert_eq!(
        get(&rec, "audio.decoder.layer.0.self_attention.output", 1),
        get(&rec_clean, "audio.decoder.layer.0.self_attention.output", 1)
    );
    assert_ne!(
        get(&rec, "audio.decoder.layer.0.cross_attention.output", 1),
        get(
            &rec_clean,
            "audio.decoder.layer.0.cross_attention.output",
            1
        )
    );
    // Without the flag the next run is clean again.
    let again_b = run(&m, &b);
    assert_eq!(again_b.tokens, clean_b.tokens);
    for (x, y) in again_b.outputs.iter().zip(&clean_b.outputs) {
        assert_eq!(bits(x), bits(y));
    }
}
