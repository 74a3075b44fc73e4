//! Loading fails closed and names what is wrong: a truncated weights file, a config that does not
//! match the weights, inconsistent geometry, a missing key; audio the frontend would get wrong.

mod whisper_support;

use std::path::Path;

use whisper_support::{assert_says, copy_dir, edit_json, fixture};
use xray_runtime::models::whisper::WhisperModel;
use xray_runtime::models::{RunHooks, RunOptions, SpeechModel};
use xray_runtime::RuntimeError;

const RAND_A: &str = "fixtures/build/whisper-rand-a";

/// A copy of the model `src`, its weights file and that file's bytes.
fn weights_of_a_copy(src: &Path) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
    let t = copy_dir(src);
    let p = t.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    (t, p, bytes)
}

/// A copy of the model `src` whose config.json `edit` changed.
fn with_config(src: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let t = copy_dir(src);
    edit_json(&t.path().join("config.json"), edit);
    t
}

fn load_err(dir: &Path) -> RuntimeError {
    match WhisperModel::load(dir) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn truncated_safetensors_is_refused_naming_the_file() {
    let Some(src) = fixture(RAND_A) else { return };
    let (t, p, bytes) = weights_of_a_copy(&src);
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(t.path());
    let msg = e.to_string();
    assert!(matches!(e, RuntimeError::File { .. }), "{e:?}");
    assert_says(&msg, &["model.safetensors", "truncated or corrupt"]);
}

#[test]
fn config_not_matching_the_weights_is_refused() {
    let Some(src) = fixture(RAND_A) else { return };
    // d_model changed: the first weight whose shape follows from it is reported with both shapes.
    let t = with_config(&src, |c| c["d_model"] = 128.into());
    let e = load_err(t.path());
    let msg = e.to_string();
    assert!(matches!(e, RuntimeError::WeightShape { .. }), "{e:?}");
    assert_says(
        &msg,
        &[
            "'model.encoder.conv1.weight'",
            "[128, 80, 3]",
            "[64, 80, 3]",
        ],
    );
    assert!(msg.contains("model.safetensors"), "{msg}");

    // One encoder layer more than the file has: the missing key and the file are named.
    let t = with_config(&src, |c| c["encoder_layers"] = 3.into());
    // Checked against the file's layers before the graph is built, naming key, file and prefix.
    let msg = load_err(t.path()).to_string();
    assert_says(
        &msg,
        &[
            "encoder_layers is 3",
            "model.safetensors holds 2 layers",
            "model.encoder.layers.",
        ],
    );

    // One decoder layer fewer than the file holds: refused the same way.
    let t = with_config(&src, |c| c["decoder_layers"] = 1.into());
    let e = load_err(t.path());
    assert!(matches!(e, RuntimeError::Config { .. }), "{e:?}");
    assert!(e.to_string().contains("decoder_layers is 1"), "{e}");

    // A config claiming a million layers is refused before a graph of that size is built (the
    // property test of config.json found this one spinning in the graph builder).
    let t = with_config(&src, |c| c["encoder_layers"] = 1_000_000.into());
    // Refused by core's bound on layer counts (the contract's), naming the key and the file.
    let msg = load_err(t.path()).to_string();
    assert_says(
        &msg,
        &[
            "'encoder_layers' is 1000000, above 1024",
            &t.path().join("config.json").display().to_string(),
        ],
    );
}

#[test]
fn a_key_missing_from_the_file_is_named_with_the_file() {
    let Some(src) = fixture(RAND_A) else { return };
    let (t, p, bytes) = weights_of_a_copy(&src);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let dropped = "model.decoder.layers.1.encoder_attn.v_proj.bias";
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != dropped)
        .collect();
    std::fs::write(&p, safetensors::serialize(kept, None).unwrap()).unwrap();
    let e = load_err(t.path());
    let msg = e.to_string();
    assert!(matches!(e, RuntimeError::MissingWeight { .. }), "{e:?}");
    assert_says(
        &msg,
        &[
            dropped,
            "decoder.layer.1.cross_v_proj",
            &p.display().to_string(),
        ],
    );
}

#[test]
fn inconsistent_geometry_fails_closed() {
    let Some(src) = fixture(RAND_A) else { return };
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "config.json",
            Box::new(|c| c["decoder_attention_heads"] = 5.into()),
            "* head_dim",
        ),
        (
            "config.json",
            Box::new(|c| c["max_source_positions"] = 0.into()),
            "max_source_positions must be positive",
        ),
        (
            "config.json",
            Box::new(|c| c["num_mel_bins"] = 128.into()),
            "feature_size 80 != config.json num_mel_bins 128",
        ),
        (
            "config.json",
            Box::new(|c| c["activation_function"] = "gelu_new".into()),
            "activation_function 'gelu_new'",
        ),
        (
            "config.json",
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("d_model");
            }),
            "missing field `d_model`",
        ),
        (
            "preprocessor_config.json",
            Box::new(|c| c["chunk_length"] = 10.into()),
            "n_samples 80000 != chunk_length 10",
        ),
        (
            "preprocessor_config.json",
            Box::new(|c| {
                c["chunk_length"] = 10.into();
                c["n_samples"] = 160000.into();
                c["nb_max_frames"] = 1000.into();
            }),
            "max_source_positions 250 needs 500",
        ),
        (
            "preprocessor_config.json",
            Box::new(|c| c["dither"] = 0.1.into()),
            "dither",
        ),
        (
            "generation_config.json",
            Box::new(|c| c["return_timestamps"] = true.into()),
            "timestamp",
        ),
        (
            "generation_config.json",
            Box::new(|c| c["suppress_tokens"] = serde_json::json!([1, 99999])),
            "99999",
        ),
    ];
    for (file, edit, want) in cases {
        let t = copy_dir(&src);
        edit_json(&t.path().join(file), |c| edit(c));
        let e = load_err(t.path());
        let msg = e.to_string();
        assert!(
            msg.contains(want) && msg.contains(file),
            "{file}: expected '{want}' in: {msg}"
        );
    }
}

#[test]
fn audio_the_frontend_would_get_wrong_is_refused() {
    let Some(dir) = fixture(RAND_A) else { return };
    let Some(long) = fixture("fixtures/build/audio/long-35s.wav") else {
        return;
    };
    let m = WhisperModel::load(&dir).unwrap();
    let audio = xray_runtime::audio::load_wav(&long, 16000).unwrap();
    let e = m
        .run(&audio, &RunOptions::default(), &mut RunHooks::default())
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, RuntimeError::Audio { .. }), "{e:?}");
    assert_says(
        &msg,
        &["35.00 s", "chunk_length = 5 s", "no silent truncation"],
    );

    let mut audio = audio;
    audio.samples.truncate(16000);
    audio.sample_rate = 8000;
    let msg = m
        .run(&audio, &RunOptions::default(), &mut RunHooks::default())
        .unwrap_err()
        .to_string();
    assert_says(&msg, &["sample rate 8000 Hz", "16000"]);
}

#[test]
fn load_dispatches_whisper_directories() {
    let Some(dir) = fixture(RAND_A) else { return };
    let m = xray_runtime::models::load(&dir).expect("load");
    assert_eq!(m.family(), "whisper");
    assert_eq!(m.contract().family, "whisper");
}
