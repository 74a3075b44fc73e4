//! Node recognition is asserted, not guessed: on the real whisper.cpp graphs of tiny.en it finds
//! every checkpoint, and with a config that does not match the model file it fails naming the
//! node. Capture is neutral (the same tokens with taps on and off), and whisper.cpp's
//! `whisper_get_logits` holds only the last row of a multi-token decode.

use std::path::{Path, PathBuf};

use xray_whispercpp::engine::{self, ModelDir, Plan};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn need(paths: &[PathBuf]) -> bool {
    xray_core::testing::require_all(paths, "run `make whispercpp-models`")
}

/// tiny.en's model directory, fox.wav's samples and the ggml file `fixtures/build/ggml/NAME`, or
/// `None` after the guard's skip ([`need`]).
fn tiny_on_fox(name: &str) -> Option<(ModelDir, Vec<f32>, PathBuf)> {
    let model = root().join("fixtures/whisper-tiny-en");
    let ggml = root().join("fixtures/build/ggml").join(name);
    let wav = root().join("fixtures/audio/fox.wav");
    if !need(&[model.clone(), ggml.clone(), wav.clone()]) {
        return None;
    }
    let md = ModelDir::open(&model).unwrap();
    let (samples, _) = engine::read_wav(&wav, 30).unwrap();
    Some((md, samples, ggml))
}

fn plan(ggml: &Path) -> Plan {
    Plan {
        ggml: ggml.to_path_buf(),
        flash: false,
        taps: true,
        ops: false,
        threads: 2,
        mel: None,
        tokens: None,
        max_new_tokens: Some(3),
        im2col_stub: false,
    }
}

#[test]
fn recognition_is_asserted_and_capture_neutral() {
    let Some((md, samples, ggml)) = tiny_on_fox("tiny-en-f16.bin") else {
        return;
    };

    // Taps on: every graph recognized; per decode step the 4 layers' checkpoints.
    let on = engine::run(&md, &samples, &plan(&ggml)).unwrap();
    let names: Vec<&str> = on
        .captured
        .iter()
        .filter(|c| c.step == 0)
        .map(|c| c.name.as_str())
        .collect();
    for n in [
        "audio.frontend.mel",
        "audio.encoder.conv1.out",
        "audio.encoder.conv2.out",
        "audio.encoder.layer.3.out",
        "audio.encoder.memory",
        "audio.decoder.layer.3.cross_k",
        "audio.decoder.layer.0.cross_v",
        "audio.decoder.input_ids",
        "audio.decoder.position_ids",
        "audio.decoder.layer.2.self_attention.probs",
        "audio.decoder.layer.1.cross_attention.output",
        "audio.decoder.logits",
    ] {
        assert_eq!(
            names.iter().filter(|&&x| x == n).count(),
            1,
            "{n} at step 0: {names:?}"
        );
    }
    // Taps off: the same tokens (capture neutrality) and the same logits bits.
    let off = engine::run(
        &md,
        &samples,
        &Plan {
            taps: false,
            ..plan(&ggml)
        },
    )
    .unwrap();
    assert_eq!(on.tokens, off.tokens);
    assert_eq!(on.prefill_last_row, off.prefill_last_row);
    assert!(off.captured.is_empty());

    // whisper_get_logits after the 2-token prefill: only the last row is filled (src/whisper.cpp
    // whisper_batch_prep_legacy flags the last token only). Row 0, what a reader of the first
    // n_vocab values gets (whisper-rs 0.16's WhisperState::get_logits), is not the logits of the
    // prompt's first position: it is left zero. The captured logits node holds both rows.
    let logits = on
        .captured
        .iter()
        .find(|c| c.name == "audio.decoder.logits" && c.step == 0)
        .unwrap();
    let vocab = md.dims.vocab as usize;
    assert_eq!(logits.data.len(), 2 * vocab);
    assert_eq!(&logits.data[vocab..], on.prefill_last_row.as_slice());
    assert!(on.prefill_first_row.iter().all(|&v| v == 0.0));
    assert!(logits.data[..vocab].iter().any(|&v| v != 0.0));

    // A config that does not match the model file: recognition fails naming the node.
    let mut wrong = md.clone();
    wrong.dims.enc_ffn += 1;
    let e = engine::run(&wrong, &samples, &plan(&ggml))
        .unwrap_err()
        .to_string();
    eprintln!("recognition error: {e}");
    assert!(e.contains("graph recognition"), "{e}");
    assert!(e.contains("node_") && e.contains("expected"), "{e}");
    assert!(e.contains("encoder.layer.3.fc1"), "{e}");
}

#[test]
fn an_f32_model_is_refused_before_whisper_cpp_aborts() {
    let Some((md, samples, ggml)) = tiny_on_fox("tiny-en-f32.bin") else {
        return;
    };
    let e = engine::run(&md, &samples, &plan(&ggml))
        .unwrap_err()
        .to_string();
    assert!(e.contains("IM2COL f16") && e.contains("f32 kernel"), "{e}");
    assert!(e.contains("ggml_compute_forward_im2col_f16"), "{e}");
    let ok = engine::run(
        &md,
        &samples,
        &Plan {
            im2col_stub: true,
            ..plan(&ggml)
        },
    )
    .unwrap();
    assert_eq!(ok.stubbed, 2, "conv1 and conv2");
}
