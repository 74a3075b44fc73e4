//! `--inject FAULT@TARGET` whose target matches nothing is refused (exit 2) before anything runs,
//! naming the target and the nearest ops; it used to plant nothing and exit 0.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn run_refuses_a_target_that_matches_nothing() {
    let Some(model) = xray_core::testing::require_fixture("fixtures/build/whisper-rand-a") else {
        return;
    };
    let out = tempfile::tempdir().expect("tempdir");
    for spec in [
        "nan_one@no.such.checkpoint",
        "layernorm_eps@",
        "layernorm_eps@decoder.layer.0.self_attn",
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_xray"))
            .args(["run", "--model"])
            .arg(&model)
            .arg("--audio")
            .arg(repo().join("fixtures/audio/fox.wav"))
            .arg("--out")
            .arg(out.path().join("d"))
            .args(["--inject", spec])
            .output()
            .expect("run xray");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{spec}: {err}");
        assert!(
            err.contains(spec) && err.contains("nearest"),
            "{spec}: {err}"
        );
        assert!(!out.path().join("d").exists(), "{spec}: a dump was written");
    }
}
