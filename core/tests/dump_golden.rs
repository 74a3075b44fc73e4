//! One dump, pinned byte for byte: the Rust writer (`DumpWriter`) must produce exactly the files in
//! `core/tests/golden/dump/`, and so must the Python writer (`xray_oracle.dump.DumpWriter`,
//! `oracle/tests/test_dump_golden.py`) from the same recipe, so the two writers are one format.
//! The recipe covers what a writer can get wrong: shapes of rank 0 to 3 and an empty one, every
//! layout, -0.0, NaN, infinities and f32::MIN, the entry declarations (`token_positions`,
//! `logits_processed`), `engine_weights`, and a manifest whose strings need escaping and whose
//! `extra` holds floats serde_json writes in each of its forms (`0.02`, `0.00001`, `1e16`,
//! `1.5e300`).
//!
//! `XRAY_BLESS=1 cargo test -p xray-core --test dump_golden` rewrites the golden files (then the
//! Python test must still pass on them).

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use serde_json::json;
use xray_core::dump::{
    DumpWriter, EngineWeights, LogitsProcessed, Manifest, TokenPositions, SCHEMA, VERSION,
};
use xray_core::Layout;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/dump")
}

/// `((i * 37) % 101) / 8 - 6` over the C-order index: exact in f32, not symmetric.
fn ramp(shape: &[usize]) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    ArrayD::from_shape_vec(
        IxDyn(shape),
        (0..n)
            .map(|i| ((i * 37) % 101) as f32 / 8.0 - 6.0)
            .collect(),
    )
    .unwrap()
}

fn recipe() -> DumpWriter {
    let sha = |c: char| c.to_string().repeat(64);
    let mut w = DumpWriter::new(Manifest {
        schema: SCHEMA.into(),
        version: VERSION,
        family: "whisper".into(),
        model_id: "golden/model".into(),
        producer: "golden-engine".into(),
        weights_sha256: sha('a'),
        audio_sha256: sha('b'),
        tools: [
            ("zeta".to_string(), "2".to_string()),
            ("golden-engine".to_string(), "1.0.0".to_string()),
        ]
        .into(),
        tokens: vec![50257, 50362, 440, 50256],
        transcript: " The \"quoted\"\n\t\\ \u{e9}\u{1}".into(),
        stats_only: false,
        checkpoints: vec![],
        extra: [
            (
                "fed".to_string(),
                json!({"tokens": {"from": "ref", "into": "generate"}}),
            ),
            (
                "config".to_string(),
                json!({"d_model": 384, "init_std": 0.02, "eps": 1e-5, "small": 1.234e-5,
                       "tiny": 3e-7, "big": 1e16, "huge": 1.5e300, "neg": -0.5, "whole": 3.0,
                       "list": [1, 2.0, null, true, false, "x"], "empty": {}, "none": []}),
            ),
        ]
        .into(),
        engine_weights: Some(EngineWeights {
            format: "ctranslate2".into(),
            sha256: sha('c'),
            file: Some("model.bin".into()),
            source: Some("golden/model".into()),
            conversion: Some("exact f16 -> f32 widening".into()),
            config: Some(json!({"layer_norm_epsilon": null, "suppress_ids": [220]})),
        }),
    });
    let mut special = ramp(&[2, 4]);
    for (i, v) in [-0.0f32, f32::NAN, f32::INFINITY, f32::MIN]
        .into_iter()
        .enumerate()
    {
        special[[0, i]] = v;
    }
    w.add(
        "audio.frontend.mel",
        0,
        Layout::ChannelMajor,
        &ramp(&[3, 5]),
    );
    w.add(
        "audio.decoder.layer.0.cross_attention.output",
        1,
        Layout::HeadMajor,
        &ramp(&[2, 1, 4]),
    );
    w.add("audio.encoder.memory", 0, Layout::TokenMajor, &special);
    w.add("scalar", 0, Layout::Plain, &ramp(&[]));
    w.add("empty", 0, Layout::Plain, &ramp(&[0, 3]));
    w.add_declared(
        "audio.decoder.logits",
        0,
        Layout::TokenMajor,
        &ramp(&[1, 7]),
        Some(TokenPositions::Last),
        Some(LogitsProcessed::Suppression),
    );
    w
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().to_string(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn rust_writer_writes_the_golden_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dump");
    recipe().write(&out).unwrap();
    let golden = golden_dir();
    if std::env::var_os("XRAY_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&golden);
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        recipe().write(&golden).unwrap();
    }
    let (got, want) = (files(&out), files(&golden));
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want), "file set");
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        assert!(
            g == w,
            "{name}: the Rust writer's bytes differ from core/tests/golden/dump/{name}:\n{}\n---\n{}",
            String::from_utf8_lossy(g),
            String::from_utf8_lossy(w)
        );
    }
    // The golden dump loads, and its declarations read back.
    let d = xray_core::dump::Dump::load(&golden).unwrap();
    let e = d.entry("audio.decoder.logits", 0).unwrap();
    assert_eq!(e.token_positions, Some(TokenPositions::Last));
    assert_eq!(e.logits_processed, Some(LogitsProcessed::Suppression));
    assert_eq!(
        d.manifest.engine_weights.as_ref().unwrap().format,
        "ctranslate2"
    );
}

/// An unknown declaration value is refused when the manifest loads (fail closed), naming it.
#[test]
fn unknown_declaration_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dump");
    recipe().write(&out).unwrap();
    let mp = out.join("manifest.json");
    let text = std::fs::read_to_string(&mp).unwrap();
    std::fs::write(
        &mp,
        text.replace(
            "\"token_positions\": \"last\"",
            "\"token_positions\": \"first\"",
        ),
    )
    .unwrap();
    let e = xray_core::dump::Dump::load(&out).unwrap_err().to_string();
    assert!(e.contains("first") && e.contains("manifest"), "{e}");
}
