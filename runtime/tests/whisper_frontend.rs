//! The log-mel frontend against transformers' WhisperFeatureExtractor (committed references made
//! by tests/data/gen_mel_ref.py from fixtures/audio/fox.wav).

mod whisper_support;

use std::path::Path;

use xray_runtime::kernels::log_mel::{mel_filter_bank, LogMel};

fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn reference(bins: usize) -> (ndarray::ArrayD<f32>, serde_json::Value) {
    let p = data(&format!("mel_ref_fox_{bins}.npy"));
    let bytes = std::fs::read(&p).expect("committed reference");
    let (t, _) = xray_runtime::dump::parse_npy(&p, &bytes).expect("npy");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("mel_ref.json")).expect("meta"))
            .expect("json");
    (t, meta["bins"][bins.to_string()].clone())
}

#[test]
fn log_mel_matches_hf_feature_extractor() {
    let Some(wav) = whisper_support::fixture("fixtures/audio/fox.wav") else {
        return;
    };
    let audio = xray_runtime::audio::load_wav(&wav, 16000).expect("wav");
    for bins in [80usize, 128] {
        let (r, stats) = reference(bins);
        let frames = r.shape()[1];
        let lm = LogMel::new(400, 160, 480_000, bins, 16000).expect("geometry");
        assert_eq!(lm.frames(), 3000);
        let mel = lm.compute(&audio.samples).expect("mel");
        assert_eq!(mel.len(), bins * 3000);
        let mut worst = 0f32;
        for m in 0..bins {
            for t in 0..frames {
                worst = worst.max((mel[m * 3000 + t] - r[[m, t]]).abs());
            }
        }
        assert!(
            worst < 2e-6,
            "{bins} bins: max |runtime - HF| over the stored frames = {worst}"
        );
        let n = mel.len() as f64;
        let mean = mel.iter().map(|&v| v as f64).sum::<f64>() / n;
        let std = (mel.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        let min = mel.iter().copied().fold(f32::INFINITY, f32::min) as f64;
        let max = mel.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        for (what, ours, theirs) in [
            ("mean", mean, &stats["mean"]),
            ("std", std, &stats["std"]),
            ("min", min, &stats["min"]),
            ("max", max, &stats["max"]),
        ] {
            let theirs = theirs.as_f64().expect("stat");
            assert!(
                (ours - theirs).abs() < 1e-5,
                "{bins} bins: whole-window {what} {ours} vs HF {theirs}"
            );
        }
    }
}

#[test]
fn slaney_filters_match_hf() {
    for bins in [80usize, 128] {
        let (_, stats) = reference(bins);
        let fb = mel_filter_bank(201, bins, 16000);
        let want = stats["filter_sums"].as_array().expect("sums");
        assert_eq!(want.len(), bins);
        for (m, w) in want.iter().enumerate() {
            let s: f64 = fb.iter().map(|row| row[m]).sum();
            let w = w.as_f64().expect("sum");
            assert!(
                (s - w).abs() < 1e-12 * w.abs().max(1.0),
                "filter {m} of {bins}: sum {s} vs HF {w}"
            );
        }
    }
}

#[test]
fn audio_longer_than_the_window_is_refused() {
    let lm = LogMel::new(400, 160, 80_000, 80, 16000).expect("geometry");
    let e = lm.compute(&vec![0.0; 80_001]).unwrap_err();
    assert!(
        e.contains("80001 samples (5.00 s)") && e.contains("refusing to truncate"),
        "{e}"
    );
    // Exactly one window is fine, and silence gives the constant floor.
    let mel = lm.compute(&vec![0.0; 80_000]).expect("mel");
    assert!(mel.iter().all(|&v| v == mel[0]));
}
