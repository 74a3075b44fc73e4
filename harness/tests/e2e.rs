//! End to end through the CLI on the real fixtures: `xray check` (runtime + oracle in one
//! process), `xray compare` offline against the committed reference dump (no Python), the
//! refusal of tampered dumps, `xray list`, and exit codes.

mod common;
use common::{check, checkpoint, code, dump_to, root, stderr, xray};

use std::path::Path;

const RAND_A: &str = "fixtures/build/whisper-rand-a";
const FOX: &str = "fixtures/audio/fox.wav";

fn evidence(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn check_passes_on_real_tiny_en_with_equal_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("r.html");
    let report = ["--report", html.to_str().unwrap()];
    let e = check(
        "fixtures/whisper-tiny-en",
        "fixtures/audio/fox.wav",
        &report,
        0,
    );
    assert_eq!(e["verdict"], "pass");
    assert_eq!(e["capture_neutral"], true);
    assert_eq!(e["transcript"]["tokens_equal"], true);
    assert!(e["transcript"]["reference"]
        .as_str()
        .unwrap()
        .contains("lazy dog"));
    let n = e["checkpoints"].as_array().unwrap().len();
    assert!(n > 200, "{n} checkpoints");
    assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
}

#[test]
fn planted_fault_is_localized_with_isolation() {
    let fault = [
        "--inject",
        "layernorm_eps@encoder.layer.2.mlp_norm",
        "--isolate",
    ];
    let e = check(
        "fixtures/build/whisper-rand-b",
        "fixtures/audio/stella.wav",
        &fault,
        1,
    );
    assert_eq!(e["verdict"], "diverged");
    assert_eq!(
        e["first_divergence"]["checkpoint"],
        "audio.encoder.layer.2.out"
    );
    assert_eq!(e["run"]["isolated"], true);
    // Isolation: downstream checkpoints fed with the reference are locally clean.
    let later = checkpoint(&e, "audio.encoder.memory");
    assert_eq!(later["status"], "propagated");
    assert!(
        later["local_metrics"]["max_abs"].as_f64().unwrap() < 1e-4,
        "{}",
        later["local_metrics"]
    );
}

#[test]
fn offline_compare_against_committed_reference_dump() {
    let refdir = root().join("fixtures/dumps/whisper-rand-a.fox");
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let teacher = teacher(&refdir);
    let o = dump_to("run", RAND_A, FOX, &got, &["--teacher", &teacher]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let ev = dir.path().join("e.json");
    let o = xray(&[
        "compare",
        refdir.to_str().unwrap(),
        got.to_str().unwrap(),
        "--evidence",
        ev.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(evidence(&ev)["verdict"], "pass");

    // A flipped byte in a copy of the reference is refused, naming the file; then a truncated
    // file too.
    let bad = dir.path().join("bad");
    copy_dir(&refdir, &bad);
    let f = bad.join("audio.encoder.memory@step0.npy");
    let mut b = std::fs::read(&f).unwrap();
    let tampers: [fn(&mut Vec<u8>); 2] = [
        |b| {
            let i = b.len() - 3;
            b[i] ^= 0x40;
        },
        |b| b.truncate(b.len() - 8),
    ];
    for tamper in tampers {
        tamper(&mut b);
        std::fs::write(&f, &b).unwrap();
        let o = xray(&["compare", bad.to_str().unwrap(), got.to_str().unwrap()]);
        assert_eq!(code(&o), 2);
        assert!(
            stderr(&o).contains("audio.encoder.memory@step0.npy"),
            "{}",
            stderr(&o)
        );
    }
}

fn teacher(refdir: &Path) -> String {
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(refdir.join("manifest.json")).unwrap())
            .unwrap();
    m["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn bad_inputs_exit_2_with_a_clear_message() {
    let o = xray(&[
        "check",
        "--model",
        "fixtures/whisper-tiny-en",
        "--audio",
        "fixtures/build/audio/long-35s.wav",
    ]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("35.00 s"), "{}", stderr(&o));
    let o = xray(&[
        "check",
        "--model",
        "fixtures/nope",
        "--audio",
        "fixtures/audio/fox.wav",
    ]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("fixtures/nope"), "{}", stderr(&o));
}

#[test]
fn list_shows_producers_layouts_and_consumers() {
    let o = xray(&["list", "--model", "fixtures/build/whisper-rand-a"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s
        .lines()
        .find(|l| l.starts_with("audio.decoder.layer.1.cross_k "))
        .unwrap();
    assert!(
        line.contains("head_major") && line.contains("decoder.layer.1.cross_attn"),
        "{line}"
    );
}

#[test]
fn selftest_localizes_every_whisper_fault() {
    let o = xray(&["selftest", "--family", "whisper"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(code(&o), 0, "{out}\n{}", stderr(&o));
    assert!(out.contains(" 0 failed"), "{out}");
}

#[test]
fn granite_data_dependent_shape_divergence_and_teacher_forcing() {
    let dir = tempfile::tempdir().unwrap();
    let ev = dir.path().join("e.json");
    let base = [
        "check",
        "--model",
        "fixtures/build/granite-nar-tiny",
        "--audio",
        "fixtures/audio/fox.wav",
        "--inject",
        "bpe_head_sign_flip",
    ];
    let mut args = base.to_vec();
    args.extend(["--evidence", ev.to_str().unwrap()]);
    let o = xray(&args);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let e = evidence(&ev);
    assert_eq!(e["first_divergence"]["checkpoint"], "enc.ctc_bpe_logits");
    let status = |n: &str| checkpoint(&e, n)["status"].clone();
    assert_eq!(status("proj.out"), "pass");
    assert_eq!(status("dec.flat_embeds"), "alignment_fault");
    assert_eq!(status("dec.text_logits"), "alignment_fault");
    // Teacher forcing feeds the reference hypothesis: the decoder is compared again.
    args.push("--teacher-force");
    let o = xray(&args);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let e = evidence(&ev);
    let status = |n: &str| checkpoint(&e, n)["status"].clone();
    assert_eq!(e["first_divergence"]["checkpoint"], "enc.ctc_bpe_logits");
    assert_eq!(status("dec.text_logits"), "pass");
    assert_eq!(e["transcript"]["tokens_equal"], true);
}

#[test]
fn stats_only_dumps_bisect_without_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let run = |out: &Path, extra: &[&str]| {
        let o = dump_to(
            "run",
            RAND_A,
            FOX,
            out,
            &[&["--max-steps", "2", "--stats-only"], extra].concat(),
        );
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    };
    run(&a, &[]);
    run(&b, &["--inject", "layernorm_eps"]);
    // No tensors on disk, only the manifest.
    assert_eq!(std::fs::read_dir(&a).unwrap().count(), 1);
    let o = xray(&["compare", a.to_str().unwrap(), a.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = xray(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("first divergence: audio.encoder.layer.1.out@step0"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn calibrated_mode_gates_at_the_reference_noise_floor() {
    let calibrate = ["--max-steps", "3", "--calibrate"];
    let e = check(
        "fixtures/build/whisper-rand-a",
        "fixtures/audio/fox.wav",
        &calibrate,
        0,
    );
    for c in e["checkpoints"].as_array().unwrap() {
        assert_eq!(
            c["tolerance"]["source"], "calibrated:10x noise floor",
            "{}",
            c["name"]
        );
        assert!(c["tolerance"]["max_rel_l2"].as_f64().unwrap() > 0.0);
    }
}
