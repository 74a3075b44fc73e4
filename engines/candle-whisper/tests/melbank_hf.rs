//! The filter bank computed in Rust equals transformers' own `WhisperFeatureExtractor.mel_filters`
//! for the real checkpoint (the venv's transformers, read through a short Python call).

use std::path::{Path, PathBuf};
use std::process::Command;

use xray_candle_whisper::inputs::ModelDir;
use xray_candle_whisper::melbank;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn hf_bank_matches_transformers() {
    let model = root().join("fixtures/whisper-tiny-en");
    let py = root().join(".venv/bin/python");
    if !xray_core::testing::require_all(&[&model, &py], xray_core::testing::MAKE_FIXTURES) {
        return;
    }
    let code = "import sys, json\n\
from transformers import WhisperFeatureExtractor\n\
fe = WhisperFeatureExtractor.from_pretrained(sys.argv[1], local_files_only=True)\n\
print(json.dumps({'shape': list(fe.mel_filters.shape), 'values': [float(v) for v in fe.mel_filters.ravel()]}))\n";
    let o = Command::new(&py)
        .args(["-c", code, model.to_str().unwrap()])
        .output()
        .expect("run the venv's python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).unwrap();
    let hf: Vec<f64> = serde_json::from_value(v["values"].clone()).unwrap();
    let md = ModelDir::open(&model).unwrap();
    let p = &md.preprocessor;
    let bins = 1 + p.n_fft / 2;
    assert_eq!(shape, vec![bins, p.feature_size]);
    let ours = melbank::mel_filter_bank_f64(
        bins,
        p.feature_size,
        0.0,
        melbank::MAX_FREQUENCY,
        p.sampling_rate,
    )
    .unwrap();
    let max_abs = hf.iter().map(|v| v.abs()).fold(0.0, f64::max);
    let worst = ours
        .iter()
        .zip(&hf)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-12 * max_abs,
        "max |diff| {worst:e} (scale {max_abs:e})"
    );
    // In f32 (what both sides feed their spectrograms) the banks are bit-identical.
    let c = melbank::candle_filters(p.n_fft, p.feature_size, p.sampling_rate).unwrap();
    for f in 0..bins {
        for m in 0..p.feature_size {
            assert_eq!(
                c[m * bins + f],
                hf[f * p.feature_size + m] as f32,
                "bin {f} filter {m}"
            );
        }
    }
}
