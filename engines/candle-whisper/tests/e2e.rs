//! candle-transformers' Whisper under X-Ray, end to end on the real tiny.en and a committed clip:
//! `xray oracle` (the HF reference), this engine (plain and with each isolation feed), `xray
//! compare` on each pair, and the finding asserted as measured (docs/engines/candle.md).
//!
//! The `xray` binary is the one `cargo test --workspace` / `make test` builds next to this test
//! (target/<profile>/xray); the oracle needs the project venv (`make venv fixtures`).

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use xray_core::dump::Dump;
use xray_core::testing::{
    evidence_checkpoint as checkpoint, repo as root, run_in_repo as run, stderr, strs, xray_bin,
    xray_compare as compare, xray_oracle,
};

const MODEL: &str = "fixtures/whisper-tiny-en";
const FOX: &str = "fixtures/audio/fox.wav";

/// Fixtures, venv and the xray binary present; otherwise skip, or fail under
/// XRAY_REQUIRE_FIXTURES (set by `make test`).
fn ready() -> bool {
    let need = [
        root().join(MODEL),
        root().join(FOX),
        root().join(".venv/bin/python"),
        xray_bin(),
    ];
    xray_core::testing::require_all(&need, "run `make test`, which builds xray and the fixtures")
}

fn engine(out: &Path, extra: &[&str]) -> Output {
    engine_on(MODEL, FOX, out, extra)
}

/// `xray-candle-whisper --model MODEL --audio AUDIO --out OUT EXTRA..`.
fn engine_on(model: &str, audio: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--model",
        model,
        "--audio",
        audio,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(Path::new(env!("CARGO_BIN_EXE_xray-candle-whisper")), &args)
}

fn metric(c: &Value, key: &str) -> f64 {
    c["metrics"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("{}: no metric {key}", c["name"]))
}

fn local(c: &Value, key: &str) -> f64 {
    c["local_metrics"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("{}@{}: no local metric {key}", c["name"], c["step"]))
}

fn logits_steps(e: &Value) -> Vec<&Value> {
    e["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "audio.decoder.logits")
        .collect()
}

fn argmax_agreement(c: &Value) -> f64 {
    c["metrics"]["logits"]["argmax_agreement"].as_f64().unwrap()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect()
}

/// The encoder's ops between the log-mel and the memory, as the contract's graph names them.
const ENCODER_SUSPECTS: [&str; 7] = [
    "encoder.conv1",
    "encoder.conv2",
    "encoder.layer.0.residual_mlp",
    "encoder.layer.1.residual_mlp",
    "encoder.layer.2.residual_mlp",
    "encoder.layer.3.residual_mlp",
    "encoder.final_norm",
];

#[test]
fn candle_whisper_under_xray_on_real_tiny_en() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref");
    xray_oracle(MODEL, FOX, &reference, &[]);
    let ref_dump = Dump::load(&reference).unwrap();
    let ref_tokens = ref_dump.manifest.tokens.clone();
    let r = reference.to_str().unwrap();

    // candle as it is, and fed the reference's tensors stage by stage.
    let got = dir.path().join("candle");
    let o = engine(&got, &[]);
    assert!(o.status.success(), "engine: {}", stderr(&o));
    let iso_enc = dir.path().join("candle-mel-fed");
    let o = engine(&iso_enc, &["--mel-from", r]);
    assert!(o.status.success(), "engine --mel-from: {}", stderr(&o));
    let iso_dec = dir.path().join("candle-memory-fed");
    let o = engine(&iso_dec, &["--memory-from", r, "--tokens-from", r]);
    assert!(
        o.status.success(),
        "engine --memory-from --tokens-from: {}",
        stderr(&o)
    );
    let got_dump = Dump::load(&got).unwrap();
    let m = &got_dump.manifest;
    assert_eq!(m.producer, "candle");
    assert!(m.tools.contains_key("candle"));
    assert_eq!(m.weights_sha256, ref_dump.manifest.weights_sha256);
    assert_eq!(m.audio_sha256, ref_dump.manifest.audio_sha256);

    // 1. candle as it is, with the fed runs as its isolation: `make candle`'s comparison.
    let (mel_fed, mem_fed) = (iso_enc.to_str().unwrap(), iso_dec.to_str().unwrap());
    let e = compare(
        &reference,
        &got,
        dir.path(),
        "plain",
        &["--isolated", mel_fed, "--isolated", mem_fed],
    );
    assert_eq!(e["verdict"], "diverged");
    // The origin is candle's log-mel (a graph source: no region, its own producer the suspect).
    let fd = &e["first_divergence"];
    assert_eq!(fd["checkpoint"], "audio.frontend.mel");
    assert_eq!(fd["step"], 0);
    assert_eq!(fd["kind"], "values");
    assert!(fd.get("region").is_none(), "{fd}");
    assert_eq!(strings(&fd["suspects"]), ["frontend.log_mel"]);
    let mel = checkpoint(&e, "audio.frontend.mel", 0);
    assert_eq!(mel["status"], "origin");
    let mel_rel = metric(mel, "rel_l2");
    assert!((0.1..0.25).contains(&mel_rel), "mel rel_l2 {mel_rel}");
    // What the mel difference is: candle's spectrogram (whisper.cpp's) adds each mirrored FFT
    // bin's power (x2 on bins 1..n_fft/2-1), a log10(2)/4 offset after Whisper's scaling; its
    // frames are not centred (the rest of the difference).
    let (rm, gm) = (
        ref_dump.get("audio.frontend.mel", 0).unwrap(),
        got_dump.get("audio.frontend.mel", 0).unwrap(),
    );
    let mut d: Vec<f32> = gm.iter().zip(rm.iter()).map(|(g, r)| g - r).collect();
    d.sort_by(f32::total_cmp);
    let median = d[d.len() / 2] as f64;
    assert!(
        (median - 2f64.log10() / 4.0).abs() < 0.01,
        "median mel difference {median}"
    );
    // The memory inherits the mel's error end to end; fed the reference's log-mel, candle's
    // encoder alone is far below that but above f32 noise (tanh-approximate GELU, recomputed
    // sinusoidal positions): the stage's local error, from the mel-fed run.
    let mem = checkpoint(&e, "audio.encoder.memory", 0);
    assert_eq!(mem["status"], "propagated");
    let (mem_rel, mem_local) = (metric(mem, "rel_l2"), local(mem, "rel_l2"));
    let mem_tol = mem["tolerance"]["max_rel_l2"].as_f64().unwrap();
    assert!(
        mem_local < 0.01 && mem_local > mem_tol && mem_local < mem_rel / 5.0,
        "encoder local rel_l2 {mem_local}, end to end {mem_rel}"
    );
    // Partial coverage: only mel, memory, the fed ids/positions and logits are observed; the rest is
    // unobserved (neither pass nor fail), named compactly in the coverage block.
    let cov = &e["coverage"];
    for c in e["checkpoints"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let observed = [
            "audio.frontend.mel",
            "audio.encoder.memory",
            "audio.decoder.input_ids",
            "audio.decoder.position_ids",
            "audio.decoder.logits",
        ]
        .contains(&name);
        if !observed {
            // Unobserved, or not comparable at the steps after the token streams part.
            let st = c["status"].as_str().unwrap();
            let after = c["step"].as_u64().unwrap() > 3;
            assert!(
                st == "unobserved" || (after && st == "not_comparable"),
                "{name}@{}: {st}",
                c["step"]
            );
        }
    }
    // The fed ids and positions agree up to the step where the token streams part (candle
    // keeps the newest row of its re-run sequence: one id and one position per step after 0).
    for k in 0..=3u64 {
        for name in ["audio.decoder.input_ids", "audio.decoder.position_ids"] {
            let c = checkpoint(&e, name, k);
            assert_eq!(c["status"], "pass", "{name}@{k}: {c}");
        }
    }
    let names = strings(&cov["unobserved_names"]);
    assert!(names.contains(&"audio.encoder.layer.0..3.out"), "{names:?}");
    assert!(names.contains(&"audio.decoder.layer.0..3.*"), "{names:?}");
    // The tokens part at the fourth generated token (step 3): " roundfire" for " roundf|ark".
    assert_eq!(e["transcript"]["tokens_equal"], false);
    let part = ref_tokens
        .iter()
        .zip(&m.tokens)
        .position(|(a, b)| a != b)
        .expect("token streams part");
    assert_eq!(part, 2 + 3, "ref {ref_tokens:?} candle {:?}", m.tokens);
    let t = &e["tokens"];
    assert_eq!(t["teacher_forced"], false);
    assert_eq!(t["parted_at_step"], 3);
    assert_eq!(t["reference_token"], ref_tokens[part]);
    assert_eq!(t["candidate_token"], m.tokens[part]);
    assert_eq!(e["transcript"]["first_divergent_step"], 3);
    // Steps up to the parting step saw the same tokens and are compared: argmax agrees before
    // it, not at it; later steps ran on other tokens and are not comparable.
    let steps = logits_steps(&e);
    for s in &steps[..3] {
        assert_eq!(argmax_agreement(s), 1.0, "step {}", s["step"]);
    }
    assert_eq!(argmax_agreement(steps[3]), 0.0);
    assert!(steps[4..].iter().all(|s| s["status"] == "not_comparable"));
    let not_comparable = e["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "not_comparable")
        .count();
    assert!(not_comparable > 0);
    assert_eq!(cov["not_comparable"].as_u64(), Some(not_comparable as u64));
    assert_eq!(
        t["not_comparable_steps"],
        format!("4..{}", ref_tokens.len() - 3)
    );
    // The decoder's local error (memory fed, teacher-forced) keeps every compared argmax.
    for s in &steps[..4] {
        let rel = local(s, "rel_l2");
        assert!(
            rel < 0.03,
            "decoder local rel_l2 {rel} at step {}",
            s["step"]
        );
        assert_eq!(
            s["local_metrics"]["logits"]["argmax_agreement"].as_f64(),
            Some(1.0),
            "step {}",
            s["step"]
        );
    }
    let fed: Vec<&str> = strs(&e["fed"], "checkpoint");
    assert_eq!(
        fed,
        ["audio.frontend.mel", "audio.encoder.memory", "tokens"]
    );

    // 2. The mel-fed run on its own: candle's own log-mel is still recorded (the origin), but
    // its encoder saw the reference's, so the memory's failure is the encoder's own: an
    // independent divergence in the unobserved region after the fed log-mel.
    let e2 = compare(&reference, &iso_enc, dir.path(), "mel-fed", &[]);
    assert_eq!(e2["first_divergence"]["checkpoint"], "audio.frontend.mel");
    assert_eq!(checkpoint(&e2, "audio.encoder.memory", 0)["status"], "fail");
    assert_eq!(e2["transcript"]["tokens_equal"], true);
    let ind = &e2["independent"][0];
    assert_eq!(ind["checkpoint"], "audio.encoder.memory");
    assert_eq!(
        ind["region"]["summary"],
        "between audio.frontend.mel@0 (fed) and audio.encoder.memory@0 (fail)"
    );
    assert_eq!(strings(&ind["suspects"]), ENCODER_SUSPECTS);
    assert_eq!(
        strings(&ind["region"]["unobserved"]),
        [
            "audio.encoder.conv1.out",
            "audio.encoder.conv2.out",
            "audio.encoder.layer.0..3.out"
        ]
    );

    // 3. Teacher forcing alone: every reference step is compared (none not comparable); candle's
    // own choice parts at step 3, recorded per step, while its free-running tokens stay its own.
    let tf = dir.path().join("candle-teacher");
    let o = engine(&tf, &["--tokens-from", r]);
    assert!(o.status.success(), "engine --tokens-from: {}", stderr(&o));
    let tf_dump = Dump::load(&tf).unwrap();
    let own: Vec<i64> =
        serde_json::from_value(tf_dump.manifest.extra["step_argmax"].clone()).unwrap();
    assert_eq!(own.len(), ref_tokens.len() - 2);
    assert_eq!(own[..3], ref_tokens[2..5]);
    assert_ne!(own[3], ref_tokens[5]);
    assert_eq!(tf_dump.manifest.tokens, m.tokens);
    let e4 = compare(&reference, &tf, dir.path(), "teacher", &[]);
    assert_eq!(e4["tokens"]["teacher_forced"], true);
    assert_eq!(e4["tokens"]["parted_at_step"], 3);
    let steps = logits_steps(&e4);
    assert_eq!(steps.len(), ref_tokens.len() - 2);
    assert!(steps.iter().all(|s| s["status"] != "not_comparable"));
    assert!(e4["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap().contains("teacher-forced")));

    // 4. --require-all: absence is a failure again (conv1 is `missing`); the mel stays the origin.
    let e5 = compare(
        &reference,
        &got,
        dir.path(),
        "require-all",
        &["--require-all"],
    );
    assert_eq!(
        checkpoint(&e5, "audio.encoder.conv1.out", 0)["status"],
        "missing"
    );
    assert_eq!(e5["first_divergence"]["checkpoint"], "audio.frontend.mel");
}

#[test]
fn bad_input_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = engine_on("no/such/dir", FOX, &out, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no/such/dir"), "{}", stderr(&o));
    if !xray_core::testing::require_all(
        &[MODEL, "fixtures/build/audio/fox-stereo.wav"],
        xray_core::testing::MAKE_FIXTURES,
    ) {
        return;
    }
    for (wav, says) in [
        ("fixtures/build/audio/fox-stereo.wav", "channels"),
        ("fixtures/build/audio/fox-44k.wav", "sample rate"),
        ("fixtures/build/audio/long-35s.wav", "window"),
    ] {
        let o = engine_on(MODEL, wav, &out, &[]);
        assert_eq!(o.status.code(), Some(2), "{wav}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{wav}: {}", stderr(&o));
    }
    assert!(!out.exists(), "nothing written on refusal");
    // A reference dump of another clip is refused for feeding (its tensors would measure nothing).
    let other = dir.path().join("other");
    let o = engine_on(
        MODEL,
        "fixtures/audio/stella.wav",
        &other,
        &["--max-new-tokens", "1"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = engine_on(MODEL, FOX, &out, &["--mel-from", other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("other audio"), "{}", stderr(&o));
    assert!(!out.exists());
    // An existing dump is replaced only with --force (refused before the model is read, and the
    // refusal names the flag that exists).
    let manifest = std::fs::read(other.join("manifest.json")).unwrap();
    let again = ["--max-new-tokens", "1"];
    let o = engine_on(MODEL, "fixtures/audio/stella.wav", &other, &again);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(other.join("manifest.json")).unwrap(),
        manifest
    );
    let forced = ["--max-new-tokens", "1", "--force"];
    let o = engine_on(MODEL, "fixtures/audio/stella.wav", &other, &forced);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(other.join("manifest.json").is_file());
}

/// A copy of the dump `src` at `dst` with `edit` applied to its loaded form (rewritten with
/// X-Ray's writer: hashes follow the edited tensors).
fn edited_dump(src: &Path, dst: &Path, edit: impl FnOnce(&mut Dump)) {
    let mut d = Dump::load(src).unwrap();
    edit(&mut d);
    d.to_writer().write(dst).unwrap();
}

/// Issue 24 item 10: a `--tokens-from` dump holding token 999999999 was exit 1 with a 56-line
/// candle backtrace; a NaN mel or memory fed in was accepted (exit 0). Fed tensors must be finite
/// and fed tokens ids of the vocabulary: one line, exit 2, before anything is computed.
#[test]
fn fed_tokens_and_tensors_are_validated() {
    if xray_core::testing::require_fixture(MODEL).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // candle's own dump of the clip: the same weights and audio, the tensors a feed needs.
    let own = dir.path().join("own");
    let o = engine(&own, &["--max-new-tokens", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("out");
    let refused = |o: &Output, says: &[&str]| {
        let e = stderr(o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert_eq!(e.trim_end().lines().count(), 1, "not one line: {e}");
        for s in says {
            assert!(e.contains(s), "{s:?} not in {e}");
        }
    };
    let bad_tokens = dir.path().join("bad-tokens");
    edited_dump(&own, &bad_tokens, |d| {
        let n = d.manifest.tokens.len();
        d.manifest.tokens[n - 1] = 999_999_999;
    });
    let o = engine(&out, &["--tokens-from", bad_tokens.to_str().unwrap()]);
    refused(&o, &["token 999999999", "vocabulary", "bad-tokens"]);
    for (name, flag) in [
        ("audio.frontend.mel", "--mel-from"),
        ("audio.encoder.memory", "--memory-from"),
    ] {
        let nan = dir.path().join(format!("nan{flag}"));
        edited_dump(&own, &nan, |d| {
            let t = d.tensors.get_mut(&(name.to_string(), 0)).unwrap();
            t.as_slice_mut().unwrap()[7] = f32::NAN;
        });
        let o = engine(&out, &[flag, nan.to_str().unwrap()]);
        refused(&o, &[name, "non-finite value (NaN) at index 7"]);
    }
    assert!(!out.exists(), "nothing written on refusal");
}
