//! The oracle through pyo3 on the real fixtures: contract coverage, shapes, steps, layouts, the
//! tiny.en transcript, dump round trip, and input errors as one line (traceback kept).

use std::path::{Path, PathBuf};

use xray_core::contract::{CDim, Contract, Steps};
use xray_core::dump::Dump;
use xray_core::ops::{is_point, PointSelect};
use xray_oracle::{Oracle, OracleError, OracleRequest};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("config.json"))
        .expect("fixture config (run `make fixtures`)");
    serde_json::from_str(&text).expect("config parses")
}

/// The oracle, the fixture `model` (relative to the repository root), fox.wav and the model's
/// contract as a `family` model.
fn on_fox(model: &str, family: &str) -> (Oracle, PathBuf, PathBuf, Contract) {
    let dir = root().join(model);
    let audio = root().join("fixtures/audio/fox.wav");
    let oracle = Oracle::discover().expect("venv (make venv)");
    let c = Contract::for_family(family, &config(&dir)).unwrap();
    (oracle, dir, audio, c)
}

/// The oracle's run of the fixture `model` on fox.wav ([`on_fox`]), with the contract.
fn fox_run(model: &str, family: &str) -> (Contract, xray_oracle::OracleRun) {
    let (oracle, dir, audio, c) = on_fox(model, family);
    let run = oracle.run(&OracleRequest::new(&dir, &audio, &c)).unwrap();
    (c, run)
}

/// `run` written as whisper-rand-a's dump into a temporary folder and loaded back: the folder,
/// the dump's path and the dump.
fn reloaded(run: &xray_oracle::OracleRun) -> (tempfile::TempDir, PathBuf, Dump) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ref");
    run.to_dump("whisper", "whisper-rand-a")
        .write(&out)
        .unwrap();
    let d = Dump::load(&out).unwrap();
    (tmp, out, d)
}

/// Every contract checkpoint is captured at the steps the contract says, with its shape and layout.
fn check_against_contract(c: &Contract, run: &xray_oracle::OracleRun, steps: usize) {
    for spec in &c.checkpoints {
        let want_steps: Vec<usize> = match spec.steps {
            Steps::Once | Steps::Prefill => vec![0],
            Steps::Every => (0..steps).collect(),
        };
        for s in want_steps {
            let got = run
                .checkpoints
                .iter()
                .find(|x| x.name == spec.name && x.step == s)
                .unwrap_or_else(|| panic!("{}@step{s} not captured", spec.name));
            assert_eq!(got.layout, spec.layout, "{}", spec.name);
            assert_eq!(got.data.ndim(), spec.shape.len(), "{}", spec.name);
            for (d, &n) in spec.shape.iter().zip(got.data.shape()) {
                match d {
                    CDim::Fixed(f) => {
                        assert_eq!(*f, n, "{}@step{s} shape {:?}", spec.name, got.data.shape())
                    }
                    CDim::Sym(t) if t == "tokens" => {
                        assert_eq!(n, if s == 0 { 2 } else { 1 }, "{}@step{s}", spec.name)
                    }
                    CDim::Sym(_) => {}
                }
            }
        }
    }
    // Nothing outside the contract.
    for x in &run.checkpoints {
        assert!(
            c.get(&x.name).is_some(),
            "{} is not in the contract",
            x.name
        );
    }
}

#[test]
fn whisper_random_fixture_matches_contract_and_dump_roundtrips() {
    let (c, run) = fox_run("fixtures/build/whisper-rand-a", "whisper");
    let steps = run.tokens.len() - 2;
    assert!(steps >= 1);
    check_against_contract(&c, &run, steps);
    let (_tmp, _, d) = reloaded(&run);
    for x in &run.checkpoints {
        assert_eq!(
            d.get(&x.name, x.step).unwrap(),
            &x.data,
            "bit-exact reload of {}",
            x.name
        );
    }
}

#[test]
fn whisper_tiny_en_transcribes_real_speech() {
    let (c, run) = fox_run("fixtures/whisper-tiny-en", "whisper");
    let t = run.transcript.to_lowercase();
    assert!(
        t.contains("quick") && t.contains("lazy dog"),
        "transcript: {t}"
    );
    assert_eq!(&run.tokens[..2], &[50257, 50362]);
    assert_eq!(*run.tokens.last().unwrap(), 50256);
    check_against_contract(&c, &run, run.tokens.len() - 2);
    assert!(run.tools.contains_key("transformers") && run.tools.contains_key("torch"));
}

#[test]
fn granite_nar_fixture_matches_contract() {
    let (c, run) = fox_run("fixtures/build/granite-nar-tiny", "granite_nar");
    for spec in &c.checkpoints {
        let got = run
            .checkpoints
            .iter()
            .find(|x| x.name == spec.name)
            .unwrap_or_else(|| panic!("{} missing", spec.name));
        assert_eq!(got.layout, spec.layout, "{}", spec.name);
        for (d, &n) in spec.shape.iter().zip(got.data.shape()) {
            if let CDim::Fixed(f) = d {
                assert_eq!(*f, n, "{}", spec.name);
            }
        }
    }
    assert!(run.extra.contains_key("hypothesis"));
}

#[test]
fn input_errors_are_one_line_and_keep_the_traceback() {
    let oracle = Oracle::discover().unwrap();
    let cfg = serde_json::json!({
        "num_mel_bins": 80, "max_source_positions": 1500, "d_model": 384,
        "decoder_attention_heads": 6, "vocab_size": 51864, "encoder_layers": 4, "decoder_layers": 4
    });
    let c = Contract::for_family("whisper", &cfg).unwrap();
    let missing = root().join("fixtures/no-such-model");
    let e = oracle
        .run(&OracleRequest::new(
            &missing,
            &root().join("fixtures/audio/fox.wav"),
            &c,
        ))
        .unwrap_err();
    match &e {
        OracleError::Input { message, traceback } => {
            assert!(message.contains("no-such-model"), "{message}");
            assert!(!message.contains('\n'), "{message}");
            assert!(traceback.contains("Traceback"), "{traceback}");
            assert_eq!(e.to_string(), *message);
        }
        other => panic!("expected an input error, got {other}"),
    }
}

#[test]
fn op_level_points_follow_the_checkpoints_and_change_nothing_else() {
    let (oracle, dir, audio, c) = on_fox("fixtures/build/whisper-rand-a", "whisper");
    let plain = oracle.run(&OracleRequest::new(&dir, &audio, &c)).unwrap();
    let all = oracle
        .run(&OracleRequest::new(&dir, &audio, &c).with_ops(PointSelect::All))
        .unwrap();
    assert_eq!(all.tokens, plain.tokens);
    assert!(plain.checkpoints.iter().all(|x| !is_point(&x.name)));
    // The contract's checkpoints first, bit-identical; then only points, steps non-decreasing.
    let n = plain.checkpoints.len();
    for (a, b) in plain.checkpoints.iter().zip(&all.checkpoints[..n]) {
        assert_eq!((&a.name, a.step, &a.data), (&b.name, b.step, &b.data));
    }
    let points = &all.checkpoints[n..];
    assert!(points.iter().all(|x| is_point(&x.name)));
    assert!(points.windows(2).all(|w| w[0].step <= w[1].step));
    let steps = plain.tokens.len() - 2;
    let q: Vec<_> = points
        .iter()
        .filter(|x| x.name == "model.decoder.layers.0.self_attn.q_proj:out")
        .collect();
    assert_eq!(q.len(), steps);
    assert!(q.iter().skip(1).all(|x| x.data.shape()[0] == 1));
    // A dump with ':' in names round-trips through the Rust loader.
    let (_tmp, out, d) = reloaded(&all);
    let fc2 = d.get("model.encoder.layers.0.fc2:out", 0).unwrap();
    assert_eq!(fc2.shape(), &[250, 64]);
    assert!(out
        .join("model.encoder.layers.0.fc2:out@step0.npy")
        .is_file());
    // Only: exactly the named points; an unknown module is an input error naming it.
    let only: std::collections::BTreeSet<String> = [
        "model.encoder.layers.1.fc1:out".to_string(),
        "proj_out:in".to_string(),
    ]
    .into();
    let some = oracle
        .run(&OracleRequest::new(&dir, &audio, &c).with_ops(PointSelect::Only(only.clone())))
        .unwrap();
    let got: std::collections::BTreeSet<String> = some.checkpoints[n..]
        .iter()
        .map(|x| x.name.clone())
        .collect();
    assert_eq!(got, only);
    assert_eq!(some.checkpoints.len(), n + 1 + steps);
    let bad: std::collections::BTreeSet<String> =
        ["model.encoder.layers.9.fc1:out".to_string()].into();
    match oracle
        .run(&OracleRequest::new(&dir, &audio, &c).with_ops(PointSelect::Only(bad)))
        .unwrap_err()
    {
        OracleError::Input { message, .. } => {
            assert!(message.contains("model.encoder.layers.9.fc1"), "{message}")
        }
        other => panic!("expected an input error, got {other}"),
    }
}
