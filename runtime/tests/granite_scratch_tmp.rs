// TEMPORARY ad-hoc dump for /tmp comparisons; deleted before handoff.
use std::path::Path;
use xray_runtime::capture::Recorder;
use xray_runtime::models::{granite_nar::GraniteNarModel, RunHooks, RunOptions, SpeechModel};

#[test]
#[ignore]
fn granite_dump() {
    let model_dir = std::env::var("M").unwrap_or("../fixtures/build/granite-nar-tiny".into());
    let wav = std::env::var("W").unwrap_or("../fixtures/audio/fox.wav".into());
    let out = std::env::var("O").unwrap_or("/tmp/gref/rust_fox".into());
    std::fs::create_dir_all(&out).unwrap();
    let m = GraniteNarModel::load(Path::new(&model_dir)).unwrap();
    let a = xray_runtime::audio::load_wav(Path::new(&wav), 16000).unwrap();
    let mut rec = Recorder::new();
    let t = std::time::Instant::now();
    let o = m
        .run(
            &a,
            &RunOptions::default(),
            &mut RunHooks {
                observer: Some(&mut rec),
                ..Default::default()
            },
        )
        .unwrap();
    eprintln!("run {:?}", t.elapsed());
    for c in &rec.captured {
        std::fs::write(
            format!("{out}/{}.npy", c.name),
            xray_runtime::dump::npy_bytes(&c.data),
        )
        .unwrap();
    }
    std::fs::write(
        format!("{out}/meta.json"),
        serde_json::json!({"tokens": o.tokens, "transcript": o.transcript, "extra": o.extra})
            .to_string(),
    )
    .unwrap();
    eprintln!("{:?} {:?} {:?}", o.tokens, o.transcript, o.extra);
}
